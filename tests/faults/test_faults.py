"""Faults against real processes: embed_service and an index shard killed with SIGKILL while
the API works, and PostgreSQL restarted under a running API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import grpc
import pytest
import uvicorn

from api_service.main import create_app
from api_service.settings import ApiSettings
from memory_proto import embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc
from tests.api.harness import Service

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_process(module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def until_ready(address: str, kind: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    async with grpc.aio.insecure_channel(address) as channel:
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.aio.AioRpcError):
                if kind == "embed":
                    reply = await embed_pb2_grpc.EmbedServiceStub(channel).Health(
                        embed_pb2.HealthRequest(), timeout=1
                    )
                else:
                    reply = await index_pb2_grpc.IndexServiceStub(channel).Health(
                        index_pb2.IndexHealthRequest(), timeout=1
                    )
                if reply.ready:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{kind} at {address} not ready")


@contextlib.asynccontextmanager
async def api(settings: ApiSettings) -> AsyncIterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


async def outbox_drained(database_url: str, deadline_s: float = 60) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + deadline_s
        while await conn.fetchval("SELECT count(*) FROM index_outbox"):
            if time.monotonic() > deadline:
                raise TimeoutError("the outbox did not drain")
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def test_sigkill_embed_during_appends_loses_nothing(database_url: str) -> None:
    embed_port, index_port = free_port(), free_port()
    embed_env = {"EMBED_BACKEND": "hashing", "EMBED_PORT": str(embed_port)}
    with processes() as procs:
        procs.append(start_process("embed_service", embed_env))
        procs.append(
            start_process(
                "index_service", {"INDEX_PORT": str(index_port), "DATABASE_URL": database_url}
            )
        )
        await until_ready(f"127.0.0.1:{embed_port}", "embed")
        await until_ready(f"127.0.0.1:{index_port}", "index")
        settings = ApiSettings(
            database_url=database_url,
            embed_address=f"127.0.0.1:{embed_port}",
            index_shards=[f"127.0.0.1:{index_port}"],
            append_index_wait_seconds=0.2,
        )
        async with api(settings) as base_url:
            service = Service(base_url, database_url, settings, None, None)  # type: ignore[arg-type]
            _, key = await service.org_with_key()
            async with service.rest(key) as http:
                cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]

                async def append(i: int) -> int:
                    r = await http.post(
                        "/api/v1/messages",
                        json={
                            "conversation_id": cid,
                            "messages": [{"role": "user", "content": f"kiwi {i}"}],
                        },
                    )
                    return r.status_code

                first = await asyncio.gather(*(append(i) for i in range(20)))
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait()
                second = await asyncio.gather(*(append(i) for i in range(20, 40)))
                assert set(first) == set(second) == {200}  # appends succeed during the outage

                procs.append(start_process("embed_service", embed_env))
                await until_ready(f"127.0.0.1:{embed_port}", "embed")
                await outbox_drained(database_url)
                got = (
                    await http.get(f"/api/v1/conversations/{cid}", params={"message_limit": 500})
                ).json()
                assert [m["sequence"] for m in got["messages"]] == list(range(1, 41))
                assert sorted(m["content"] for m in got["messages"]) == sorted(
                    f"kiwi {i}" for i in range(40)
                )
        conn = await asyncpg.connect(database_url)
        try:
            chunks = await conn.fetch(
                "SELECT start_sequence, embedding IS NOT NULL AS done FROM chunks "
                "WHERE conversation_id = $1 ORDER BY start_sequence",
                cid,
            )
        finally:
            await conn.close()
        assert [c["start_sequence"] for c in chunks] == list(range(1, 41, 3))
        assert all(c["done"] for c in chunks)


async def test_sigkill_index_shard_gives_503_then_identical_results(database_url: str) -> None:
    embed_port, index_port = free_port(), free_port()
    index_env = {"INDEX_PORT": str(index_port), "DATABASE_URL": database_url}
    with processes() as procs:
        procs.append(
            start_process(
                "embed_service", {"EMBED_BACKEND": "hashing", "EMBED_PORT": str(embed_port)}
            )
        )
        procs.append(start_process("index_service", index_env))
        await until_ready(f"127.0.0.1:{embed_port}", "embed")
        await until_ready(f"127.0.0.1:{index_port}", "index")
        settings = ApiSettings(
            database_url=database_url,
            embed_address=f"127.0.0.1:{embed_port}",
            index_shards=[f"127.0.0.1:{index_port}"],
            grpc_timeout_seconds=2,
        )
        async with api(settings) as base_url:
            service = Service(base_url, database_url, settings, None, None)  # type: ignore[arg-type]
            _, key = await service.org_with_key()
            async with service.rest(key) as http, service.mcp(key) as mcp:
                for topic in ("sailing boats", "baking bread", "tax returns", "garden roses"):
                    cid = (await http.post("/api/v1/conversations", json={})).json()[
                        "conversation_id"
                    ]
                    await http.post(
                        "/api/v1/messages",
                        json={
                            "conversation_id": cid,
                            "messages": [
                                {"role": "user", "content": f"{topic} {'and more ' * i}"}
                                for i in range(9)
                            ],
                        },
                    )
                queries = ["boats and sailing", "bread", "roses in the garden"]
                before = [await mcp.ok("search", query=q, limit=6) for q in queries]

                procs[1].send_signal(signal.SIGKILL)
                procs[1].wait()
                r = await http.get("/api/v1/search", params={"q": "bread"})
                assert r.status_code == 503 and r.json()["code"] == "unavailable"
                assert "retry" in (await mcp.error("search", query="bread")).lower()
                listed = await http.get("/api/v1/conversations")  # the rest keeps working
                assert listed.status_code == 200 and listed.json()["total"] == 4

                procs.append(start_process("index_service", index_env))
                await until_ready(f"127.0.0.1:{index_port}", "index")
                for _ in range(100):  # the API's channel reconnects within its backoff (2 s)
                    if not (await mcp.call("search", query="bread"))[0]:
                        break
                    await asyncio.sleep(0.1)
                after = [await mcp.ok("search", query=q, limit=6) for q in queries]
        assert after == before


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[tuple[str, object]]:
    """A PostgreSQL of this test's own, so stopping it disturbs nothing else."""
    from api_service.store.embedded import start_embedded

    url, server = start_embedded(tmp_path / "pg")
    yield url, server
    server.cleanup()  # type: ignore[attr-defined]


async def test_postgres_restart_gives_503_then_recovers(
    private_postgres: tuple[str, object],
) -> None:
    url, server = private_postgres
    embed_port, index_port = free_port(), free_port()
    with processes() as procs:
        procs.append(
            start_process(
                "embed_service", {"EMBED_BACKEND": "hashing", "EMBED_PORT": str(embed_port)}
            )
        )
        procs.append(
            start_process("index_service", {"INDEX_PORT": str(index_port), "DATABASE_URL": url})
        )
        await until_ready(f"127.0.0.1:{embed_port}", "embed")
        settings = ApiSettings(
            database_url=url,
            embed_address=f"127.0.0.1:{embed_port}",
            index_shards=[f"127.0.0.1:{index_port}"],
            append_index_wait_seconds=2,
        )
        async with api(settings) as base_url:
            service = Service(base_url, url, settings, None, None)  # type: ignore[arg-type]
            _, key = await service.org_with_key()
            async with service.rest(key) as http:
                cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
                await http.post(
                    "/api/v1/messages",
                    json={
                        "conversation_id": cid,
                        "messages": [{"role": "user", "content": "before"}],
                    },
                )

                await asyncio.to_thread(server.stop)  # type: ignore[attr-defined]
                during = [
                    await http.post(
                        "/api/v1/messages",
                        json={
                            "conversation_id": cid,
                            "messages": [{"role": "user", "content": "during"}],
                        },
                    ),
                    await http.get(f"/api/v1/conversations/{cid}"),
                    await http.post("/api/v1/conversations", json={}),
                ]
                for r in during:
                    assert r.status_code == 503, r.text
                    assert r.json() == {
                        "error": "The database is unavailable; retry shortly",
                        "code": "unavailable",
                    }

                await asyncio.to_thread(server.start)  # type: ignore[attr-defined]
                recovered = None
                for _ in range(100):  # the pool reconnects on its own; no API restart
                    recovered = await http.post(
                        "/api/v1/messages",
                        json={
                            "conversation_id": cid,
                            "messages": [{"role": "user", "content": "after"}],
                        },
                    )
                    if recovered.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                assert recovered is not None and recovered.status_code == 200, recovered.text
                got = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert [m["content"] for m in got["messages"]] == ["before", "after"]
        assert got["conversation"]["message_count"] == 2  # nothing half-written
