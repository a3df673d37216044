"""Faults against real processes: embed_service and an index shard killed with SIGKILL while
the API works, and PostgreSQL restarted under a running API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import numpy as np
import pytest

from api_service import indexer
from api_service.clients import EmbedClient, IndexRouter
from api_service.settings import ApiSettings
from embed_service.hashing import HashingEmbedder
from index_service.routing import routing_epoch, shard_for
from memory_proto import embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc
from tests.api.harness import (
    COSINE_1,
    McpCaller,
    Service,
    eventually,
    outbox_drained,
    outbox_gauges,
    running_service,
    say,
    serve,
)

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


class Stack:
    """embed_service (hashing) and one index shard as real processes, restartable, plus the
    API settings that point at them."""

    def __init__(self, database_url: str, **api_overrides: object) -> None:
        self.embed_env = {"EMBED_BACKEND": "hashing", "EMBED_PORT": str(free_port())}
        self.index_env = {"INDEX_PORT": str(free_port()), "DATABASE_URL": database_url}
        self.embed_address = f"127.0.0.1:{self.embed_env['EMBED_PORT']}"
        self.index_address = f"127.0.0.1:{self.index_env['INDEX_PORT']}"
        self.settings = ApiSettings(
            database_url=database_url,
            embed_address=self.embed_address,
            index_shards=[self.index_address],
            **api_overrides,  # type: ignore[arg-type]
        )
        self.embed: subprocess.Popen[bytes] | None = None
        self.index: subprocess.Popen[bytes] | None = None

    async def start_embed(self) -> None:
        self.embed = start_process("embed_service", self.embed_env)
        await until_ready(self.embed_address, "embed")

    async def start_index(self) -> None:
        self.index = start_process("index_service", self.index_env)
        await until_ready(self.index_address, "index")

    def kill(self, proc: subprocess.Popen[bytes] | None) -> None:
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in (self.embed, self.index):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@contextlib.asynccontextmanager
async def stack(
    database_url: str, index_env: dict[str, str] | None = None, **api_overrides: object
) -> AsyncIterator[tuple[Stack, Service]]:
    """The processes (the shard's environment updated with `index_env`), and the API served
    in this test's loop against them."""
    running = Stack(database_url, **api_overrides)
    running.index_env.update(index_env or {})
    try:
        await running.start_embed()
        await running.start_index()
        async with serve(running.settings) as base_url:
            yield running, Service(base_url, database_url, running.settings)
    finally:
        running.close()


async def outbox_metrics(http: Any) -> dict[str, float]:
    """The outbox gauges /metrics shows now."""
    return outbox_gauges((await http.get("/metrics")).text)


async def a_job_failing(http: Any) -> bool:
    """Whether /metrics shows an outbox job that failed once at least, within 10 s."""

    async def failing() -> bool:
        return (await outbox_metrics(http))["memory_index_outbox_failing_jobs"] >= 1

    return await eventually(failing, seconds=10)


async def until_search_answers(mcp: McpCaller) -> None:
    """Wait for the API's channel to reconnect to a restarted shard (its backoff is 2 s)."""
    for _ in range(100):
        if not (await mcp.call("search", query="anything"))[0]:
            return
        await asyncio.sleep(0.1)


async def test_sigkill_embed_during_appends_loses_nothing(database_url: str) -> None:
    async with stack(database_url, append_index_wait_seconds=0.2) as (running, service):
        _, key = await service.org_with_key()
        async with service.rest(key) as http:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]

            async def append(i: int) -> int:
                return (await say(http, cid, f"kiwi {i}")).status_code

            first = await asyncio.gather(*(append(i) for i in range(20)))
            running.kill(running.embed)
            second = await asyncio.gather(*(append(i) for i in range(20, 40)))
            assert set(first) == set(second) == {200}  # appends succeed during the outage

            await running.start_embed()
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
                """SELECT c.start_sequence, v.embedding IS NOT NULL AS done
                     FROM chunks c
                     LEFT JOIN chunk_vectors v
                          USING (org_id, conversation_id, start_sequence, version)
                    WHERE c.conversation_id = $1 ORDER BY c.start_sequence""",
                cid,
            )
        finally:
            await conn.close()
        assert [c["start_sequence"] for c in chunks] == list(range(1, 41, 3))
        assert all(c["done"] for c in chunks)


async def test_sigkill_index_shard_gives_503_then_identical_results(database_url: str) -> None:
    async with stack(database_url, grpc_timeout_seconds=2) as (running, service):
        _, key = await service.org_with_key()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            for topic in ("sailing boats", "baking bread", "tax returns", "garden roses"):
                cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
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

            running.kill(running.index)
            r = await http.get("/api/v1/search", params={"q": "bread"})
            assert r.status_code == 503 and r.json()["code"] == "unavailable"
            assert "retry" in (await mcp.error("search", query="bread")).lower()
            listed = await http.get("/api/v1/conversations")  # the rest keeps working
            assert listed.status_code == 200 and listed.json()["total"] == 4

            await running.start_index()
            await until_search_answers(mcp)
            after = [await mcp.ok("search", query=q, limit=6) for q in queries]
        assert after == before


async def test_a_shard_restarted_once_an_append_answered_loads_its_vector(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append's vectors are stored before the shard gets them: a shard that restarts after
    the append answered, its job still open, loads them from PostgreSQL with the org."""
    finish = indexer.Indexer._finish
    release = asyncio.Event()

    async def held(self: indexer.Indexer, *args: Any) -> None:
        await release.wait()
        await finish(self, *args)

    monkeypatch.setattr(indexer.Indexer, "_finish", held)
    async with stack(database_url, grpc_timeout_seconds=2) as (running, service):
        org_id, key = await service.org_with_key()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            assert (await say(http, cid, "a kiwi before the restart")).status_code == 200
            running.kill(running.index)
            await running.start_index()
            await until_search_answers(mcp)
            conn = await asyncpg.connect(database_url)
            try:
                text = await conn.fetchval(
                    "SELECT text FROM chunks WHERE org_id = $1 AND conversation_id = $2",
                    org_id,
                    cid,
                )
                open_jobs = "SELECT count(*) FROM index_outbox WHERE org_id = $1"
                assert await conn.fetchval(open_jobs, org_id) == 1  # not closed: not redone
                found = await mcp.ok("search", query=text, conversation_id=cid, limit=1)
                release.set()
            finally:
                await conn.close()
    assert [r["score"] for r in found["results"]] == [COSINE_1]


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A PostgreSQL of this test's own, so stopping it disturbs nothing else."""
    from api_service.store.embedded import start_embedded

    url, server = start_embedded(tmp_path / "pg")
    yield url, server
    server.cleanup()


async def test_postgres_restart_gives_503_then_recovers(
    private_postgres: tuple[str, Any],
) -> None:
    url, server = private_postgres
    async with stack(url, append_index_wait_seconds=2) as (_, service):
        _, key = await service.org_with_key()
        async with service.rest(key) as http:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            await say(http, cid, "before")

            await asyncio.to_thread(server.stop)
            during = [
                await say(http, cid, "during"),
                await http.get(f"/api/v1/conversations/{cid}"),
                await http.post("/api/v1/conversations", json={}),
            ]
            for r in during:
                assert r.status_code == 503, r.text
                assert r.json() == {
                    "error": "The database is unavailable; retry shortly",
                    "code": "unavailable",
                }

            await asyncio.to_thread(server.start)
            recovered = None
            for _ in range(100):  # the pool reconnects on its own; no API restart
                recovered = await say(http, cid, "after")
                if recovered.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert recovered is not None and recovered.status_code == 200, recovered.text
            got = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert [m["content"] for m in got["messages"]] == ["before", "after"]
        assert got["conversation"]["message_count"] == 2  # nothing half-written


async def test_delete_while_the_shard_is_down_converges(database_url: str) -> None:
    async with stack(database_url, grpc_timeout_seconds=2) as (running, service):
        org_id, key = await service.org_with_key()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            keep = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            drop = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            for cid, word in ((keep, "walrus"), (drop, "walrus tusk")):
                await say(http, cid, word)
            assert (await mcp.ok("search", query="walrus tusk"))["total"] == 2

            running.kill(running.index)
            assert (await http.delete(f"/api/v1/conversations/{drop}")).json() == {"deleted": True}
            # The waiting removal shows on /metrics, as failing once its first attempt has.
            assert await a_job_failing(http)
            backlog = await outbox_metrics(http)
            assert backlog["memory_index_outbox_failing_jobs"] == 1
            assert backlog["memory_index_outbox_jobs"] == 1
            assert backlog["memory_index_outbox_oldest_job_seconds"] > 0
            await running.start_index()
            await outbox_drained(database_url)
            assert set((await outbox_metrics(http)).values()) == {0.0}
            await until_search_answers(mcp)
            found = await mcp.ok("search", query="walrus tusk")
        assert [r["conversation_id"] for r in found["results"]] == [keep]
        async with grpc.aio.insecure_channel(running.index_address) as channel:
            stats = await index_pb2_grpc.IndexServiceStub(channel).Stats(
                index_pb2.StatsRequest(
                    org_id=org_id, routing_epoch=routing_epoch([running.index_address])
                )
            )
        assert stats.vectors == 1


async def test_a_job_the_shard_refuses_waits_logged_as_an_error_until_it_is_put_right(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A shard started with other dimensions than the model's refuses every upsert: the append
    still succeeds, its job waits and is retried, the log says it was refused as sent and
    /metrics counts it; once the shard is restarted as it should be, the job is done."""
    async with stack(database_url, {"INDEX_DIM": "384"}, append_index_wait_seconds=1) as (
        running,
        service,
    ):
        _, key = await service.org_with_key()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            await say(http, cid, "narwhal")
            assert await a_job_failing(http)
            assert (await outbox_metrics(http))["memory_index_outbox_failing_jobs"] == 1

            def refused() -> list[logging.LogRecord]:
                return [
                    r
                    for r in caplog.records
                    if r.name == "api_service.indexer" and "refused as sent" in r.getMessage()
                ]

            async def retried() -> bool:  # the append's own attempt, the worker's after 1 s
                return len(refused()) >= 2

            assert await eventually(retried, seconds=5)
            assert {r.levelname for r in refused()} == {"ERROR"}
            assert "INVALID_ARGUMENT (dim is 768" in refused()[0].getMessage()
            # The append's own attempt counts: the worker's first is the second.
            logged = [int(r.getMessage().split("attempt ")[1].split(":")[0]) for r in refused()]
            assert logged[:2] == [1, 2]

            running.kill(running.index)
            running.index_env["INDEX_DIM"] = "768"
            await running.start_index()
            await outbox_drained(database_url)
            await until_search_answers(mcp)
            found = await mcp.ok("search", query="narwhal")
    assert [r["conversation_id"] for r in found["results"]] == [cid]


async def test_a_stored_vector_the_embedder_no_longer_makes_is_embedded_again(
    database_url: str,
) -> None:
    """A vector stored while the embed service answered in other dimensions (384 here, as a
    smaller model would) is refused by the shard. Once the embed service is put right, the
    job's retry embeds the chunk again rather than resend the stored vector for ever."""
    async with stack(database_url) as (_, service):
        org_id, key = await service.org_with_key()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            await say(http, cid, "narwhal")
            await outbox_drained(database_url)
            conn = await asyncpg.connect(database_url)
            try:
                chunk_id = await conn.fetchval(
                    "SELECT chunk_id FROM chunks WHERE org_id = $1", org_id
                )
                wrong = np.full(384, 384**-0.5, dtype="<f4").tobytes()
                await conn.execute(
                    "UPDATE chunk_vectors SET embedding = $2 WHERE org_id = $1", org_id, wrong
                )
                await conn.execute(
                    "INSERT INTO index_outbox (org_id, kind, conversation_id, chunk_ids)"
                    " VALUES ($1, 'upsert', $2, $3)",
                    org_id,
                    cid,
                    [chunk_id],
                )
                await outbox_drained(database_url, deadline_s=20)
                stored = await conn.fetchval(
                    "SELECT octet_length(embedding) FROM chunk_vectors WHERE org_id = $1",
                    org_id,
                )
            finally:
                await conn.close()
            assert stored == 768 * 4
            await until_search_answers(mcp)
            found = await mcp.ok("search", query="narwhal")
    assert [r["conversation_id"] for r in found["results"]] == [cid]


async def test_an_embedding_call_past_its_deadline_is_split(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The model on a CPU can take longer over a full batch than the indexing deadline allows;
    retried whole, such a job would fail for ever. The indexer splits a call that ran past
    its deadline and keeps the smaller size, so the chunks get indexed."""
    embed = HashingEmbedder.embed

    def slow_embed(self: HashingEmbedder, batch: Any) -> Any:
        time.sleep(0.15 * len(batch))  # 10 windows: 1.5 s, past the 1 s deadline
        return embed(self, batch)

    monkeypatch.setattr(HashingEmbedder, "embed", slow_embed)
    async with running_service(
        database_url, embed_index_timeout_seconds=1.0, append_index_wait_seconds=0
    ) as service:
        _, key = await service.org_with_key()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            turns = [{"role": "user", "content": f"turn {i} of the long talk"} for i in range(30)]
            r = await http.post(
                "/api/v1/messages", json={"conversation_id": cid, "messages": turns}
            )
            assert r.status_code == 200, r.text
            await outbox_drained(database_url, deadline_s=30)
            conversation = (await http.get(f"/api/v1/conversations/{cid}")).json()
            assert conversation["conversation"]["message_count"] == 30
            found = await mcp.ok("search", query="[user]: turn 27 of the long talk", limit=3)
            assert found["results"] and found["results"][0]["conversation_id"] == cid
    assert any("ran past the deadline" in r.getMessage() for r in caplog.records)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """An address that accepts connections and never answers: a shard whose host hangs."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_shard_that_does_not_answer_holds_up_no_other_shards_jobs(
    database_url: str,
) -> None:
    """Jobs run one after another in a batch. Once a call to a shard times out, the batch's
    other jobs for that shard are put off without calling it, so the other shards' jobs
    behind them are done at once rather than after one deadline a job."""
    running = Stack(database_url)
    async with silent_server() as silent:
        try:
            await running.start_index()
            shards = [silent, running.index_address]
            org_on = {shard_for(f"org_{i}", shards): f"org_{i}" for i in range(50)}
            stuck, served = org_on[silent], org_on[running.index_address]
            pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
            assert pool is not None
            jobs: dict[str, list[int]] = {stuck: [], served: []}
            vector = np.full(768, 768**-0.5, dtype="<f4").tobytes()
            for org_id, count in ((stuck, 4), (served, 2)):  # the stuck org's jobs come first
                await pool.execute("INSERT INTO orgs (org_id, name) VALUES ($1, $1)", org_id)
                for n in range(count):
                    cid = f"conv_{n}"
                    await pool.execute(
                        "INSERT INTO conversations (org_id, conversation_id) VALUES ($1, $2)",
                        org_id,
                        cid,
                    )
                    await pool.execute(
                        "INSERT INTO chunks (org_id, conversation_id, start_sequence, chunk_id, "
                        "end_sequence, text) VALUES ($1, $2, 1, $3, 1, 'x')",
                        org_id,
                        cid,
                        f"chk_{org_id}_{n}",
                    )
                    await pool.execute(  # embedded before: the embedder is not called
                        "INSERT INTO chunk_vectors (org_id, conversation_id, start_sequence, "
                        "version, embedding) VALUES ($1, $2, 1, 1, $3)",
                        org_id,
                        cid,
                        vector,
                    )
                    jobs[org_id].append(
                        await pool.fetchval(
                            "INSERT INTO index_outbox (org_id, kind, conversation_id, chunk_ids) "
                            "VALUES ($1, 'upsert', $2, ARRAY[$3]) RETURNING job_id",
                            org_id,
                            cid,
                            f"chk_{org_id}_{n}",
                        )
                    )
            worker = indexer.Indexer(
                pool, EmbedClient("127.0.0.1:9", 1.0), IndexRouter(shards, 1.0), batch_size=64
            )
            started = time.monotonic()
            assert await worker.run_once()
            took = time.monotonic() - started
            left = {
                r["job_id"]: r["last_error"]
                for r in await pool.fetch(
                    "SELECT job_id, last_error FROM index_outbox WHERE run_after > now()"
                )
            }
            assert set(left) == set(jobs[stuck])  # the served org's jobs are closed
            assert sum("did not answer" in error for error in left.values()) == 3
            assert took < 3.0  # one deadline (1 s), not four
            await pool.close()
        finally:
            running.close()
