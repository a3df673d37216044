"""`python -m index_service`: run one index shard (configured by environment variables)."""

from __future__ import annotations

import argparse

from index_service.settings import IndexSettings


def _env_help() -> str:
    lines = ["environment variables:"]
    for name, info in IndexSettings.model_fields.items():
        default = "" if info.default_factory is not None else f" (default: {info.default!r})"
        lines.append(f"  INDEX_{name.upper():<22} {info.description}{default}")
    lines.append(f"  {'INDEX_LOG_LEVEL':<28} Logging level (default: 'INFO').")
    return "\n".join(lines)


def run() -> None:
    """Parse the command line (only --help), then serve."""
    argparse.ArgumentParser(
        prog="python -m index_service",
        description="Serve per-organization vector indexes over gRPC (memory.v1.IndexService). "
        "Orgs are rebuilt from PostgreSQL on first use; SIGTERM or SIGINT stops gracefully.",
        epilog=_env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args()
    from index_service.main import main

    main()


if __name__ == "__main__":
    run()
