"""Container health check for the three services; exit status 0 when healthy, 1 otherwise.

    python healthcheck.py http  http://127.0.0.1:8080/healthz
    python healthcheck.py embed 127.0.0.1:50051 [--live]
    python healthcheck.py index 127.0.0.1:50061 [--live]

The gRPC services implement their own `Health` RPC (memory.v1), not grpc.health.v1, so the
Kubernetes grpc probe cannot be used. Without `--live` the check passes only when the service
reports ready (embed: model loaded and serving; index: owned orgs preloaded). With `--live` it
passes whenever the RPC answers at all: a liveness probe must not restart a shard that is still
loading its orgs.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

TIMEOUT_S = 3.0


def check_http(url: str, timeout: float = TIMEOUT_S) -> str | None:
    """None when GET `url` answers 200, else the reason."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"
    return None if status == 200 else f"{url}: HTTP {status}"


def check_grpc(kind: str, address: str, live: bool, timeout: float = TIMEOUT_S) -> str | None:
    """None when the service's Health RPC answers (and reports ready, unless `live`)."""
    import grpc

    from memory_proto import embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            if kind == "embed":
                ready = (
                    embed_pb2_grpc.EmbedServiceStub(channel)
                    .Health(embed_pb2.HealthRequest(), timeout=timeout)
                    .ready
                )
            else:
                ready = (
                    index_pb2_grpc.IndexServiceStub(channel)
                    .Health(index_pb2.IndexHealthRequest(), timeout=timeout)
                    .ready
                )
    except grpc.RpcError as exc:
        code = exc.code().name if isinstance(exc, grpc.Call) else type(exc).__name__
        return f"{kind} at {address}: {code}"
    if live or ready:
        return None
    return f"{kind} at {address}: not ready"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one check; print the reason for a failure on stderr."""
    parser = argparse.ArgumentParser(description="Health check for the memory services.")
    parser.add_argument("kind", choices=["http", "embed", "index"])
    parser.add_argument("target", help="URL (http) or host:port (embed, index)")
    parser.add_argument("--live", action="store_true", help="gRPC: answering is enough")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = parser.parse_args(argv)
    if args.kind == "http":
        problem = check_http(args.target, args.timeout)
    else:
        problem = check_grpc(args.kind, args.target, args.live, args.timeout)
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
