"""memctl up: the whole stack on loopback for development, on the embedded default."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import grpc

from api_service import auth
from api_service.cli_support import CliError, database, with_conn
from api_service.core.errors import Forbidden, Unauthorized
from api_service.core.ids import new_id
from api_service.settings import ApiSettings
from api_service.store import admin
from api_service.store.db import Conn
from api_service.store.embedded import process_alive
from memory_proto import embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc

DEV_ORG = "dev"


def _dev_key(url: str, key_file: Path) -> tuple[str, bool]:
    """The dev org's read+write key: created on first start, kept in `key_file` (mode 600),
    and created again when the kept one no longer works (revoked, expired, or of another
    database)."""
    kept = key_file.read_text().strip() if key_file.exists() else None

    async def work(conn: Conn) -> str | None:
        org = await admin.org_by_name(conn, DEV_ORG)
        if org is not None and kept:
            with contextlib.suppress(Unauthorized, Forbidden):  # unknown, revoked, expired
                if (await auth.resolve(conn, auth.hash_key(kept))).org_id == org.org_id:
                    return None
        org_id = (
            org.org_id
            if org
            else (await admin.create_org(conn, new_id("org"), DEV_ORG, None)).org_id
        )
        secret, _ = await auth.issue_key(conn, org_id, ["read", "write"], None)
        return secret

    secret: str | None = asyncio.run(with_conn(url, work))
    if secret is None:
        assert kept is not None
        return kept, False
    key_file.parent.mkdir(parents=True, exist_ok=True)
    with _open_private(key_file, os.O_TRUNC, "w") as out:
        out.write(secret + "\n")
    return secret, True


def _open_private(path: Path, flags: int, mode: str) -> IO[str]:
    """`path` opened for writing with `flags` (O_TRUNC, O_APPEND), readable by its owner only,
    also when it existed before."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


def _in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _postgres_running(pgdata: Path) -> int | None:
    """The pid of the PostgreSQL server running on `pgdata`, from its postmaster.pid; None
    when there is none (no file, or one a server that crashed left behind)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if process_alive(pid) else None


def _wait_ready(
    name: str, check: Callable[[], bool], procs: list[subprocess.Popen[bytes]], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    print(f"  waiting for {name} ", end="", flush=True)
    while time.monotonic() < deadline:
        _raise_if_stopped()
        for p in procs:
            if p.poll() is not None:
                raise CliError(f"{name}: a service exited with status {p.returncode}; see above")
        with contextlib.suppress(Exception):
            if check():
                print(" ready", flush=True)
                return
        print(".", end="", flush=True)
        time.sleep(1.0)
    raise CliError(f"{name} was not ready within {timeout:.0f}s")


def _grpc_ready(address: str, kind: str) -> Callable[[], bool]:
    def check() -> bool:
        with grpc.insecure_channel(address) as channel:
            if kind == "embed":
                reply: Any = embed_pb2_grpc.EmbedServiceStub(channel).Health(
                    embed_pb2.HealthRequest(), timeout=2
                )
            else:
                reply = index_pb2_grpc.IndexServiceStub(channel).Health(
                    index_pb2.IndexHealthRequest(), timeout=2
                )
            return bool(reply.ready)

    return check


def _http_ready(url: str) -> Callable[[], bool]:
    import urllib.request

    def check() -> bool:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback URL)
            return bool(response.status == 200)

    return check


# Set by the first stopping signal. Its KeyboardInterrupt can be lost: Python ignores (and
# prints) an exception raised in an at-fork callback, where the handler runs when the signal
# lands while a process is forked. So while a service is started the handler only sets the
# flag, and the start checks it between its steps.
_stop_requested = False
_signals_held = False


def _stop_on_signal(signum: int, _: Any) -> None:
    """Ctrl-C, SIGTERM or SIGHUP (the terminal closed) before the services run, or SIGHUP
    after: unwind, so the services and the embedded PostgreSQL are stopped too."""
    global _stop_requested
    _stop_requested = True
    if not _signals_held:
        raise KeyboardInterrupt


def _raise_if_stopped() -> None:
    """Unwind if a stopping signal came whose KeyboardInterrupt was held or lost."""
    if _stop_requested:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _holding_signals() -> Iterator[None]:
    """A stopping signal during the block unwinds once the block is done (a service started
    in it is then in the list of those to stop), not inside a fork's callbacks."""
    global _signals_held
    _signals_held = True
    try:
        yield
    finally:
        _signals_held = False
    _raise_if_stopped()


def cmd_up(settings: ApiSettings, args: argparse.Namespace) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # A signal it was started ignoring (SIGHUP under nohup, SIGINT under &) stays
        # ignored, for the services too.
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _stop_on_signal)
    if settings.database_url and not args.use_database_url:
        raise CliError(
            "DATABASE_URL (or MEMORY_DATABASE_URL) is set: memctl up would migrate that "
            "database, add an organization 'dev' with a key to it, and index its outbox into a "
            "shard on this machine. Unset it to use the embedded PostgreSQL under "
            "MEMORY_DATA_DIR, or pass --use-database-url if it is a development database"
        )
    data_dir = settings.data_dir.resolve()
    embed_address = f"127.0.0.1:{args.embed_port}"
    index_address = f"127.0.0.1:{args.index_port}"
    base_url = f"http://127.0.0.1:{args.port}"
    busy = [port for port in (args.port, args.embed_port, args.index_port) if _in_use(port)]
    if busy:
        raise CliError(
            f"port {', '.join(map(str, busy))} is already in use on 127.0.0.1: stop what runs "
            "there (another memctl up?) or choose --port, --embed-port and --index-port"
        )
    print(f"memctl up: data in {data_dir}")
    with database(settings) as url:
        key, created = _dev_key(url, data_dir / "dev-api-key")
        env = {
            **os.environ,
            # Each service's own variable too: one left in the environment would win.
            "DATABASE_URL": url,
            "MEMORY_DATABASE_URL": url,
            "INDEX_DATABASE_URL": url,
            "EMBED_HOST": "127.0.0.1",
            "EMBED_PORT": str(args.embed_port),
            "EMBED_BACKEND": args.embedder,
            "EMBED_MODEL_CACHE_DIR": str(data_dir / "models"),
            "INDEX_HOST": "127.0.0.1",
            "INDEX_PORT": str(args.index_port),
            "INDEX_SHARDS": index_address,
            "INDEX_SHARD_NAME": index_address,
            "MEMORY_HOST": "127.0.0.1",
            "MEMORY_PORT": str(args.port),
            "MEMORY_EMBED_ADDRESS": embed_address,
            "MEMORY_INDEX_SHARDS": index_address,
            "MEMORY_DATA_DIR": str(data_dir),
        }
        procs: list[subprocess.Popen[bytes]] = []
        exited: str | None = None
        try:
            for module in ("embed_service", "index_service"):
                _start(module, env, procs)
            _wait_ready(
                "embed_service (loads the model)",
                _grpc_ready(embed_address, "embed"),
                procs,
                args.timeout,
            )
            _wait_ready("index_service", _grpc_ready(index_address, "index"), procs, args.timeout)
            _start("api_service", env, procs)
            _wait_ready("api_service", _http_ready(f"{base_url}/readyz"), procs, args.timeout)
            _raise_if_stopped()
            _print_welcome(base_url, key, created, data_dir)
            exited = _supervise(procs)
        finally:
            _stop_all(procs)
    if exited is not None:
        raise CliError(f"{exited}; its log is above, and the other services were stopped")
    print("stopped")


def _print_welcome(base_url: str, key: str, created: bool, data_dir: Path) -> None:
    snippet = {
        "mcpServers": {
            "memory": {
                "type": "http",
                "url": f"{base_url}/mcp",
                "headers": {"Authorization": f"Bearer {key}"},
            }
        }
    }
    origin = "created for org 'dev'" if created else f"org 'dev', kept in {data_dir}/dev-api-key"
    print(
        f"""
The conversation memory service is up.
  REST:    {base_url}/api/v1
  MCP:     {base_url}/mcp
  API key: {key}   ({origin})

Try it:
  curl -s -X POST {base_url}/api/v1/conversations -H "Authorization: Bearer {key}" \\
       -H "Content-Type: application/json" -d '{{"title": "hello"}}'

MCP client configuration:
{json.dumps(snippet, indent=2)}

Press Ctrl-C to stop.""",
        flush=True,
    )


def _die_with_parent() -> None:
    """In the child: get SIGTERM when memctl dies, however it dies (Linux)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _service(module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    # In a session of its own: the terminal's signals (Ctrl-C, SIGHUP when it closes) reach
    # memctl alone, which stops each service with SIGTERM and waits for its graceful stop,
    # where a SIGHUP would have killed them on the spot (the API's pending meter counts with
    # them).
    return subprocess.Popen(  # noqa: S603 (our own modules, fixed arguments)
        [sys.executable, "-m", module],
        env=env,
        preexec_fn=_die_with_parent,
        start_new_session=True,
    )


def _start(module: str, env: dict[str, str], procs: list[subprocess.Popen[bytes]]) -> None:
    """Start a service and add it to `procs`, those to stop; a stopping signal meanwhile
    unwinds once it is there."""
    print(f"  starting {module}")
    with _holding_signals():
        procs.append(_service(module, env))


def _supervise(procs: list[subprocess.Popen[bytes]]) -> str | None:
    """Block until Ctrl-C / SIGTERM (None) or until a service exits (which one, and how)."""
    stop = False

    def on_signal(signum: int, _: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (nohup, &)
    try:
        while not stop and not _stop_requested:
            for p in procs:
                if p.poll() is not None:
                    exited = f"{_module(p)} exited with status {p.returncode}"
                    print(f"{exited}; stopping the rest")
                    return exited
            time.sleep(0.5)
        print("\nstopping...")
        return None
    finally:  # a second Ctrl-C or SIGTERM forces
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _stop_on_signal)


def _module(proc: subprocess.Popen[bytes]) -> str:
    """The service a process of `_service` runs (its command's last word)."""
    args = proc.args
    return str(args[-1]) if isinstance(args, list) else "a service"


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every service and wait for each; a second Ctrl-C, or 15 s, kills them."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    try:
        for p in reversed(procs):
            p.wait(timeout=15)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()


def add_embedder_option(parser: argparse.ArgumentParser) -> None:
    """--embedder for a benchmark that starts the stack: hashing by default, so that its
    figures are the service's own."""
    parser.add_argument(
        "--embedder",
        choices=["hashing", "transformer"],
        default="hashing",
        help="hashing: the service's own figures (default); transformer: the real model",
    )


@contextlib.contextmanager
def stack_in_subprocess(
    data_dir: Path,
    port: int,
    embedder: str = "transformer",
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> Iterator[tuple[str, str]]:
    """`memctl up` in a child process on its own data folder, for benchmarks and load tests;
    `fresh` empties the folder first.

    Yields (base_url, api key) once every service is ready; the services' output goes to
    `data_dir/stack.log`. Uses the embedded PostgreSQL (DATABASE_URL is not passed on)."""
    if _in_use(port):
        # Checked before the folder is emptied: it may be that of the stack on the port.
        raise CliError(f"port {port} is already in use on 127.0.0.1; choose another")
    if fresh:
        running = _postgres_running(data_dir / "postgres")
        if running is not None:
            raise CliError(
                f"a PostgreSQL server (pid {running}) runs on {data_dir / 'postgres'}: stop the "
                "stack that uses it, or choose another data folder"
            )
        shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, "MEMORY_DATA_DIR": str(data_dir), **(env or {})}
    child_env.pop("DATABASE_URL", None)
    log_path = data_dir / "stack.log"  # it holds the dev key, as memctl up prints it
    with _open_private(log_path, os.O_APPEND, "a") as log:
        proc = subprocess.Popen(  # noqa: S603 (our own CLI, fixed arguments)
            [
                sys.executable,
                "-m",
                "api_service.cli",
                "up",
                "--port",
                str(port),
                "--embed-port",
                str(port + 1),
                "--index-port",
                str(port + 2),
                "--embedder",
                embedder,
            ],
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            # A benchmark killed (SIGTERM's default, SIGKILL) runs no `finally`: memctl then
            # stops its services and PostgreSQL itself, instead of holding the ports.
            preexec_fn=_die_with_parent,
        )
    try:
        _wait_ready("the stack", _http_ready(f"http://127.0.0.1:{port}/readyz"), [proc], 900)
        yield f"http://127.0.0.1:{port}", (data_dir / "dev-api-key").read_text().strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()  # its services get SIGTERM through their parent-death signal
            proc.wait()
