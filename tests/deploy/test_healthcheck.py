"""deploy/healthcheck.py against real servers: the embed and index gRPC services, and HTTP."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from embed_service.main import EmbedServer
from embed_service.main import start_server as start_embed
from embed_service.settings import EmbedSettings
from index_service.main import IndexServer
from index_service.main import start_server as start_index
from index_service.settings import IndexSettings

from .manifests import DEPLOY, REPO

SCRIPT = DEPLOY / "healthcheck.py"


async def healthcheck(*args: str) -> tuple[int, str]:
    """Run the script as the container runtime does: a separate process, exit status."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        *args,
        "--timeout",
        "2",
        cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.fixture
async def embed_server() -> AsyncIterator[EmbedServer]:
    server = await start_embed(EmbedSettings(backend="hashing", host="127.0.0.1", port=0))
    yield server
    await server.stop(grace=0.5)


@pytest.fixture
async def index_server() -> AsyncIterator[IndexServer]:
    server = await start_index(IndexSettings(host="127.0.0.1", port=0, database_url=None))
    await server.wait_ready()
    yield server
    await server.stop(grace=0.5)


async def test_embed_ready_then_not_ready(embed_server: EmbedServer) -> None:
    target = f"127.0.0.1:{embed_server.port}"
    assert await healthcheck("embed", target) == (0, "")
    embed_server.servicer.stop_serving()
    code, err = await healthcheck("embed", target)
    assert code == 1 and "not ready" in err
    assert (await healthcheck("embed", target, "--live"))[0] == 0


async def test_index_ready_then_loading(index_server: IndexServer) -> None:
    target = f"127.0.0.1:{index_server.port}"
    assert await healthcheck("index", target) == (0, "")
    index_server.servicer.ready = False
    code, err = await healthcheck("index", target)
    assert code == 1 and "not ready" in err
    assert (await healthcheck("index", target, "--live"))[0] == 0


async def test_wrong_service_or_nothing_listening_fails(index_server: IndexServer) -> None:
    # An embed check against an index shard: the method does not exist there.
    code, err = await healthcheck("embed", f"127.0.0.1:{index_server.port}")
    assert code == 1 and "UNIMPLEMENTED" in err
    code, err = await healthcheck("index", "127.0.0.1:1", "--live")
    assert code == 1 and "UNAVAILABLE" in err


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_base() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_http_status_decides(http_base: str) -> None:
    assert await healthcheck("http", f"{http_base}/healthz") == (0, "")
    code, err = await healthcheck("http", f"{http_base}/readyz")
    assert code == 1 and "HTTP 503" in err
