"""Races between writers over both interfaces: gapless sequences, PATCH against appends, delete
against appends (no orphan rows or vectors), an append's own indexing against the background
worker, and nothing secret in the logs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import grpc
import httpx
import pytest

from api_service import indexer
from api_service.clients import EmbedClient, IndexRouter, Vectors
from api_service.store import repository
from index_service.routing import routing_epoch
from memory_proto import index_pb2, index_pb2_grpc
from tests.api.harness import (
    COSINE_1,
    Service,
    eventually,
    outbox_drained,
    running_service,
    say,
)


async def _orphans(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        return {
            "messages": await conn.fetchval(
                "SELECT count(*) FROM messages m WHERE NOT EXISTS (SELECT 1 FROM conversations c"
                " WHERE c.org_id = m.org_id AND c.conversation_id = m.conversation_id)"
            ),
            "chunks": await conn.fetchval(
                "SELECT count(*) FROM chunks k WHERE NOT EXISTS (SELECT 1 FROM conversations c"
                " WHERE c.org_id = k.org_id AND c.conversation_id = k.conversation_id)"
            ),
        }
    finally:
        await conn.close()


async def test_gapless_sequences_from_both_interfaces(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]

        async def via_rest(i: int) -> None:
            r = await http.post(
                "/api/v1/messages",
                json={
                    "conversation_id": cid,
                    "messages": [{"role": "user", "content": f"r{i}-{j}"} for j in range(3)],
                },
            )
            assert r.status_code == 200

        async def via_mcp(i: int) -> None:
            await mcp.ok(
                "append_messages",
                conversation_id=cid,
                messages=[{"role": "assistant", "content": f"m{i}-{j}"} for j in range(2)],
            )

        await asyncio.gather(*(via_rest(i) for i in range(10)), *(via_mcp(i) for i in range(10)))
        got = (await http.get(f"/api/v1/conversations/{cid}", params={"message_limit": 500})).json()
    assert [m["sequence"] for m in got["messages"]] == list(range(1, 51))
    contents = [m["content"] for m in got["messages"]]
    for i in range(10):  # one call's messages are contiguous and in order
        start = contents.index(f"r{i}-0")
        assert contents[start : start + 3] == [f"r{i}-{j}" for j in range(3)]
        start = contents.index(f"m{i}-0")
        assert contents[start : start + 2] == [f"m{i}-{j}" for j in range(2)]


async def test_patch_racing_appends_keeps_every_edit_window_and_vector(
    service: Service, key: str
) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
        ids = (
            await http.post(
                "/api/v1/messages",
                json={
                    "conversation_id": cid,
                    "messages": [{"role": "user", "content": f"original {i}"} for i in range(10)],
                },
            )
        ).json()["message_ids"]

        async def edit(i: int) -> None:
            r = await http.patch(
                f"/api/v1/conversations/{cid}/messages/{ids[i]}", json={"content": f"edited {i}"}
            )
            assert r.status_code == 200

        async def append(i: int) -> None:
            await mcp.ok(
                "append_messages",
                conversation_id=cid,
                messages=[{"role": "user", "content": f"later {i}"}],
            )

        await asyncio.gather(*(edit(i) for i in range(10)), *(append(i) for i in range(10)))
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()["messages"]
    assert [m["content"] for m in got[:10]] == [f"edited {i}" for i in range(10)]
    assert len(got) == 20
    conn = await asyncpg.connect(service.database_url)
    try:
        rows = await conn.fetch(
            "SELECT start_sequence, end_sequence, text FROM chunks WHERE conversation_id = $1 "
            "ORDER BY start_sequence",
            cid,
        )
    finally:
        await conn.close()
    assert [(r["start_sequence"], r["end_sequence"]) for r in rows] == [
        (s, min(s + 4, 20)) for s in range(1, 21, 3)
    ]
    for row in rows:  # every window holds exactly the messages' current text
        expected = "\n".join(
            f"[user]: {m['content']}" for m in got[row["start_sequence"] - 1 : row["end_sequence"]]
        )
        assert row["text"] == expected
    # The shard holds every window's current version, though the requests that rebuilt a
    # window indexed it concurrently: a window's own text finds it with cosine 1, which the
    # vector of an older text would not.
    async with service.mcp(key) as mcp:
        for row in rows:
            found = await mcp.ok("search", query=row["text"], conversation_id=cid, limit=1)
            top = found["results"][0]
            assert (top["start_sequence"], top["score"]) == (row["start_sequence"], COSINE_1)


def slowed_embedding(
    monkeypatch: pytest.MonkeyPatch, seconds: float, marker: str = ""
) -> list[str]:
    """Make every embedding call take `seconds` longer (the model on a CPU); the list
    returned gathers the texts embedded that hold `marker`."""
    embedded: list[str] = []
    embed = EmbedClient.embed

    async def slow_embed(
        self: EmbedClient, texts: list[str], timeout: float | None = None
    ) -> Vectors:
        embedded.extend(t for t in texts if marker in t)
        await asyncio.sleep(seconds)
        return await embed(self, texts, timeout)

    monkeypatch.setattr(EmbedClient, "embed", slow_embed)
    return embedded


async def test_an_append_indexing_past_its_lease_is_not_indexed_twice(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model on a CPU can take longer than a job's lease: the background worker of the
    same process must leave an append's job to the append still indexing it."""
    monkeypatch.setattr(indexer, "LEASE_SECONDS", 0.2)
    monkeypatch.setattr(indexer.Indexer, "lease_seconds", 0.2)
    embedded = slowed_embedding(monkeypatch, 1.5)  # past the lease and the worker's next poll
    async with running_service(database_url, append_index_wait_seconds=0.3) as service:
        _, key = await service.org_with_key()
        async with service.rest(key) as http:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            assert (await say(http, cid, "slow to embed")).status_code == 200
            await outbox_drained(database_url)
    assert embedded == ["[user]: slow to embed"]


async def test_a_batch_longer_than_its_lease_is_not_taken_by_another_replica(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background batch whose every job outlasts the lease (the model on a CPU) keeps its
    jobs leased as it goes: another replica's worker takes none of them, and no chunk is
    embedded twice."""
    monkeypatch.setattr(indexer, "LEASE_SECONDS", 0.6)
    async with running_service(database_url, indexer_enabled=False) as writer:
        _, key = await writer.org_with_key()
        async with writer.rest(key) as http:
            for n in range(4):  # four jobs, queued for the background workers
                cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
                assert (await say(http, cid, f"renewed lease {n}")).status_code == 200
    embedded = slowed_embedding(monkeypatch, 0.8, "renewed lease")  # each job past the lease
    async with (
        running_service(database_url, append_index_wait_seconds=0),
        running_service(database_url, append_index_wait_seconds=0),
    ):
        await outbox_drained(database_url, deadline_s=30)
    assert sorted(embedded) == [f"[user]: renewed lease {n}" for n in range(4)]


async def test_appends_past_the_own_indexing_limit_leave_their_jobs_to_the_workers(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its appends' own indexing at the limit, the process indexes a new append's
    chunks in the background, from the outbox, and the append answers at once."""
    monkeypatch.setattr(indexer, "OWN_INDEXING_LIMIT", 0)
    own: list[int] = []
    index_now = indexer.Indexer.index_now

    async def counted(self: indexer.Indexer, queued: Any, *args: Any) -> bool:
        own.append(queued.job_id)
        return await index_now(self, queued, *args)

    monkeypatch.setattr(indexer.Indexer, "index_now", counted)
    async with running_service(database_url) as service:
        _, key = await service.org_with_key()
        async with service.rest(key) as http:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            for n in range(3):
                assert (await say(http, cid, f"left to the outbox {n}")).status_code == 200
            await outbox_drained(database_url)
            found = (await http.get("/api/v1/search", params={"q": "left to the outbox"})).json()
    assert own == [] and found["total"] == 1


async def test_a_stopping_worker_hands_back_the_jobs_it_was_indexing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that stops mid-batch makes its jobs due at once, for another worker, rather
    than a lease later."""
    async with running_service(database_url, indexer_enabled=False) as writer:
        _, key = await writer.org_with_key()
        async with writer.rest(key) as http:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            assert (await say(http, cid, "handed back")).status_code == 200
    slowed_embedding(monkeypatch, 30.0)
    conn = await asyncpg.connect(database_url)

    async def leased() -> bool:  # by the background worker, which starts on it
        return bool(
            await conn.fetchval(
                "SELECT bool_and(run_after > now() + interval '30 seconds') FROM index_outbox"
            )
        )

    try:
        async with running_service(database_url, append_index_wait_seconds=0):
            assert await eventually(leased, seconds=10), "the job was never leased"
        assert await conn.fetchval("SELECT bool_and(run_after <= now()) FROM index_outbox")
    finally:
        await conn.close()


async def test_an_append_indexing_past_its_lease_keeps_it_from_another_replica(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append's own indexing that outlasts its job's lease (the model on a CPU) leases
    the job again as it goes: another replica's background worker does not take it and
    embed it a second time."""
    monkeypatch.setattr(indexer, "LEASE_SECONDS", 0.6)
    monkeypatch.setattr(indexer.Indexer, "lease_seconds", 0.6)
    # Past the lease, and past the other worker's next poll.
    embedded = slowed_embedding(monkeypatch, 2.0, "own lease")
    async with (
        running_service(database_url, append_index_wait_seconds=0.2) as first,
        running_service(database_url, append_index_wait_seconds=0.2),
    ):
        _, key = await first.org_with_key()
        async with first.rest(key) as http:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            assert (await say(http, cid, "own lease")).status_code == 200
        await outbox_drained(database_url, deadline_s=30)
    assert embedded == ["[user]: own lease"]


async def test_indexing_has_at_most_its_limit_of_embedding_calls_under_way(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends that outpace the model (on a CPU) queue their embedding in the api process,
    a few calls in flight at a time, so no call waits out its deadline in embed_service's
    queue; every chunk is still indexed."""
    in_flight, most = 0, 0
    embed = EmbedClient.embed

    async def slow_embed(
        self: EmbedClient, texts: list[str], timeout: float | None = None
    ) -> Vectors:
        nonlocal in_flight, most
        if not any("outpaced" in t for t in texts):  # another test's leftover job, say
            return await embed(self, texts, timeout)
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.2)
            return await embed(self, texts, timeout)
        finally:
            in_flight -= 1

    monkeypatch.setattr(EmbedClient, "embed", slow_embed)
    async with running_service(
        database_url, embed_index_concurrency=2, append_index_wait_seconds=0.05
    ) as service:
        _, key = await service.org_with_key()
        async with service.rest(key) as http:

            async def append(n: int) -> None:
                cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
                assert (await say(http, cid, f"outpaced {n}")).status_code == 200

            await asyncio.gather(*(append(n) for n in range(8)))
            await outbox_drained(database_url, deadline_s=30)
    conn = await asyncpg.connect(database_url)
    try:
        indexed = await conn.fetchval(
            "SELECT count(*) FROM chunks c JOIN chunk_vectors v "
            "USING (org_id, conversation_id, start_sequence, version) "
            "WHERE c.text LIKE '[user]: outpaced %'"
        )
    finally:
        await conn.close()
    assert most == 2
    assert indexed == 8


async def test_an_append_answers_once_searchable_and_its_job_closes_after(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append answers once its vectors are stored and the shard holds them; closing the job
    follows. When that fails, the worker takes the job over and closes it."""
    finish = indexer.Indexer._finish
    release = asyncio.Event()
    attempts = 0

    async def held_then_failing_once(self: indexer.Indexer, *args: Any) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            await release.wait()
            raise OSError("connection lost")
        await finish(self, *args)

    monkeypatch.setattr(indexer.Indexer, "_finish", held_then_failing_once)
    async with running_service(database_url) as service:
        org_id, key = await service.org_with_key()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            answered = await asyncio.wait_for(say(http, cid, "answered before its job closes"), 10)
            assert answered.status_code == 200
            conn = await asyncpg.connect(database_url)
            try:
                stored_vector = """SELECT v.embedding FROM chunks c
                    LEFT JOIN chunk_vectors v
                         USING (org_id, conversation_id, start_sequence, version)
                    WHERE c.org_id = $1 AND c.conversation_id = $2"""
                assert await conn.fetchval(stored_vector, org_id, cid) is not None
                open_jobs = "SELECT count(*) FROM index_outbox WHERE org_id = $1"
                assert await conn.fetchval(open_jobs, org_id) == 1  # not closed yet
                text = await conn.fetchval(
                    "SELECT text FROM chunks WHERE org_id = $1 AND conversation_id = $2",
                    org_id,
                    cid,
                )
                found = await mcp.ok("search", query=text, conversation_id=cid, limit=1)
                assert found["results"][0]["score"] == COSINE_1  # and in the shard
                release.set()
                await outbox_drained(database_url)
                stored = await conn.fetchval(stored_vector, org_id, cid)
            finally:
                await conn.close()
    assert attempts == 2 and stored is not None and len(stored) == 4 * 768


async def test_an_append_embeds_while_it_commits_and_a_refused_one_cancels(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append's chunks are embedded while its transaction commits, not after; when the
    transaction is refused (402 past the storage limit), that embedding is cancelled."""
    embed = EmbedClient.embed
    write = repository.upsert_chunks
    started: list[str] = []  # texts whose embedding has begun
    started_before_commit: dict[str, bool] = {}  # by chunk text, as its transaction wrote it
    cancelled: list[str] = []

    async def watched_embed(
        self: EmbedClient, texts: list[str], timeout: float | None = None
    ) -> Vectors:
        if "embedded ahead" not in texts[0]:  # another test's leftover job, say
            return await embed(self, texts, timeout)
        started.append(texts[0])
        try:
            await asyncio.sleep(0.3)  # longer than the rest of the transaction
        except asyncio.CancelledError:
            cancelled.extend(texts)
            raise
        return await embed(self, texts, timeout)

    async def watched_write(*args: Any, **kwargs: Any) -> Any:
        # The transaction's last statement: whatever runs when it returns began before commit.
        queued = await write(*args, **kwargs)
        chunk = args[3][0]
        started_before_commit.setdefault(chunk.text, chunk.text in started)
        return queued

    monkeypatch.setattr(repository, "upsert_chunks", watched_write)
    monkeypatch.setattr(EmbedClient, "embed", watched_embed)
    async with running_service(database_url) as service:
        org_id, key = await service.org_with_key()
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "INSERT INTO plans (name, monthly_requests, storage_bytes, max_conversations) "
                "VALUES ($1, 1000, 400, 10)",
                f"plan_{org_id}",
            )
            await conn.execute(
                "UPDATE orgs SET plan = $2 WHERE org_id = $1", org_id, f"plan_{org_id}"
            )
        finally:
            await conn.close()
        async with service.rest(key) as http, service.mcp(key) as mcp:
            cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            assert (await say(http, cid, "embedded ahead")).status_code == 200
            found = await mcp.ok("search", query="[user]: embedded ahead", limit=1)
            assert found["results"][0]["score"] == COSINE_1
            refused = await say(http, cid, "x" * 500)
            assert refused.status_code == 402, refused.text
    refused_text = "[user]: embedded ahead\n[user]: " + "x" * 500
    assert started_before_commit == {"[user]: embedded ahead": True, refused_text: True}
    assert cancelled == [refused_text]


def _offline_indexer(pool: asyncpg.Pool, **options: Any) -> indexer.Indexer:
    """An Indexer whose clients are never called (they point at the discard port): for the
    parts of it that use PostgreSQL alone."""
    return indexer.Indexer(
        pool, EmbedClient("127.0.0.1:9", 1.0), IndexRouter(["127.0.0.1:9"], 1.0), **options
    )


async def test_an_upsert_job_whose_conversation_is_gone_queues_its_removal_again(
    database_url: str,
) -> None:
    """An upsert attempt may reach the shard after the conversation's delete job cleared it
    (a timed-out call the shard still applied); a later attempt finds no chunks, and must
    still have the removal done again."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    worker = _offline_indexer(pool)  # the job's chunks are gone, so nothing is embedded
    try:
        await pool.execute(
            "INSERT INTO index_outbox (org_id, kind, conversation_id, chunk_ids) "
            "VALUES ('org_gone', 'upsert', 'conv_gone', '{chk_gone}')"
        )
        while await worker.run_once():  # other tests' leftovers, if any, go by too
            pass
        jobs = await pool.fetch(
            "SELECT kind FROM index_outbox WHERE org_id = 'org_gone' AND conversation_id = "
            "'conv_gone'"
        )
        assert [j["kind"] for j in jobs] == ["delete"]
    finally:
        await pool.execute("DELETE FROM index_outbox WHERE org_id = 'org_gone'")
        await pool.close()


async def test_due_deletes_are_leased_before_older_upserts(database_url: str) -> None:
    """A conversation's delete queued behind a backlog of upserts is leased with the next
    batch, ahead of them, so its vectors leave the shards without waiting for embeddings."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    worker = _offline_indexer(pool, batch_size=2)
    try:
        await pool.execute(
            "INSERT INTO index_outbox (org_id, kind, conversation_id) "
            "SELECT 'org_a', 'upsert', 'conv_' || i FROM generate_series(1, 5) AS i"
        )
        await pool.execute(
            "INSERT INTO index_outbox (org_id, kind, conversation_id) "
            "VALUES ('org_a', 'delete', 'conv_gone')"
        )
        leased = await worker._lease()
        assert [(job.kind, job.conversation_id) for job in leased] == [
            ("delete", "conv_gone"),
            ("upsert", "conv_1"),
            ("upsert", "conv_2"),
        ]
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def _indexer_over_one_chunk(
    database_url: str, org_id: str
) -> AsyncIterator[tuple[asyncpg.Pool, indexer.Indexer]]:
    """A pool, an Indexer whose clients are never called (only `_store_vectors` and `_finish`,
    which write PostgreSQL alone, are used), and `org_id` with one conversation (conv_1)
    holding one chunk (chk_1, version 1); the org goes afterwards."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    worker = _offline_indexer(pool)
    try:
        await pool.execute("INSERT INTO orgs (org_id, name) VALUES ($1, $1)", org_id)
        await pool.execute(
            "INSERT INTO conversations (org_id, conversation_id) VALUES ($1, 'conv_1')", org_id
        )
        await pool.execute(
            "INSERT INTO chunks (org_id, conversation_id, start_sequence, chunk_id, "
            "end_sequence, text) VALUES ($1, 'conv_1', 1, 'chk_1', 1, 'x')",
            org_id,
        )
        yield pool, worker
    finally:
        await pool.execute("DELETE FROM index_outbox WHERE org_id = $1", org_id)
        await pool.execute("DELETE FROM orgs WHERE org_id = $1", org_id)
        await pool.close()


async def test_a_delete_racing_the_store_of_its_vectors_skips_them(database_url: str) -> None:
    """The indexer stores an append's vectors in a transaction of its own, after the append's,
    so a conversation delete can commit while that statement runs. Its vectors are skipped,
    and the job still closes (the delete's own job clears the shard)."""
    deleter = await asyncpg.connect(database_url)
    try:
        async with _indexer_over_one_chunk(database_url, "org_race") as (pool, worker):
            job_id = await pool.fetchval(
                "INSERT INTO index_outbox (org_id, kind, conversation_id, chunk_ids) "
                "VALUES ('org_race', 'upsert', 'conv_1', '{chk_1}') RETURNING job_id"
            )
            job = indexer.Job(job_id, "org_race", "upsert", "conv_1", ["chk_1"], 1)
            deleting = deleter.transaction()
            await deleting.start()
            await deleter.execute("DELETE FROM conversations WHERE org_id = 'org_race'")
            store = asyncio.create_task(
                worker._store_vectors("org_race", [_chunk(version=1)], [b"\x00" * 3072])
            )
            await asyncio.sleep(0.3)  # the store now waits on the deleted chunk row
            await deleting.commit()
            await asyncio.wait_for(store, 10)
            await worker._finish([job])
            left = "SELECT count(*) FROM index_outbox WHERE job_id = $1"
            assert await pool.fetchval(left, job_id) == 0
            assert await pool.fetchval("SELECT count(*) FROM chunk_vectors") == 0
    finally:
        await deleter.close()


async def test_a_rebuilt_windows_new_vector_is_stored_over_the_old(database_url: str) -> None:
    async with _indexer_over_one_chunk(database_url, "org_new") as (pool, worker):
        for version, vector in [(1, b"\x01" * 3072), (2, b"\x02" * 3072)]:
            await pool.execute("UPDATE chunks SET version = $1 WHERE org_id = 'org_new'", version)
            await worker._store_vectors("org_new", [_chunk(version)], [vector])
        # A late store of the old version, as a slow retry would make, changes nothing.
        await worker._store_vectors("org_new", [_chunk(version=1)], [b"\x01" * 3072])
        stored = await pool.fetchrow(
            "SELECT version, embedding FROM chunk_vectors WHERE org_id = 'org_new'"
        )
        assert tuple(stored) == (2, b"\x02" * 3072)


def _chunk(version: int) -> indexer._Chunk:
    """The one chunk of _indexer_over_one_chunk's conversation, at `version`, not embedded."""
    return indexer._Chunk("chk_1", "conv_1", version, "x", None)


async def test_a_read_sees_one_moment(
    service: Service, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation and its messages, and a list page and its total, are read in one
    snapshot: a write that commits between the two statements shows in neither."""
    async with service.rest(key) as http, service.rest(key) as writer:
        cid = (await writer.post("/api/v1/conversations", json={})).json()["conversation_id"]
        read_conversation = repository.get_conversation

        async def read_then_append(conn: Any, org_id: str, conversation_id: str) -> Any:
            row = await read_conversation(conn, org_id, conversation_id)
            r = await writer.post(
                "/api/v1/messages",
                json={"conversation_id": cid, "messages": [{"role": "user", "content": "x"}]},
            )
            assert r.status_code == 200, r.text
            return row

        monkeypatch.setattr(repository, "get_conversation", read_then_append)
        for appended in (1, 2):
            got = (await http.get(f"/api/v1/conversations/{cid}")).json()
            assert got["conversation"]["message_count"] == len(got["messages"]) == appended - 1
        monkeypatch.undo()

        count = asyncpg.Connection.fetchval

        async def create_then_count(conn: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            if query.startswith("SELECT count(*) FROM conversations"):
                r = await writer.post("/api/v1/conversations", json={})
                assert r.status_code == 201, r.text
            return await count(conn, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.Connection, "fetchval", create_then_count)
        for created in (1, 2):
            page = (await http.get("/api/v1/conversations", params={"limit": 100})).json()
            assert page["total"] == len(page["conversations"]) == created
        monkeypatch.undo()
        assert (await http.get("/api/v1/conversations")).json()["total"] == 3


async def test_delete_racing_appends_leaves_no_orphans(service: Service) -> None:
    org_id, key = await service.org_with_key()
    async with service.rest(key) as http:
        cids = [
            (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
            for _ in range(4)
        ]

        async def append(cid: str, i: int) -> int:
            return (await say(http, cid, f"race {i} on {cid}")).status_code

        async def delete(cid: str) -> int:
            await asyncio.sleep(0)
            return (await http.delete(f"/api/v1/conversations/{cid}")).status_code

        results = await asyncio.gather(
            *(append(cid, i) for cid in cids for i in range(8)), *(delete(cid) for cid in cids)
        )
        assert set(results) <= {200, 404}  # an append after the delete finds nothing
        assert results[-4:] == [200] * 4
        await outbox_drained(service.database_url)  # vector removal goes through the outbox
        found = (await http.get("/api/v1/search", params={"q": "race on", "limit": 50})).json()
    assert found == {"results": [], "total": 0}
    assert await _orphans(service.database_url) == {"messages": 0, "chunks": 0}
    shards = service.settings.index_shards
    async with grpc.aio.insecure_channel(shards[0]) as channel:  # nor any vector in the shard
        stats = await index_pb2_grpc.IndexServiceStub(channel).Stats(
            index_pb2.StatsRequest(org_id=org_id, routing_epoch=routing_epoch(shards))
        )
    assert stats.vectors == 0


async def test_logs_hold_no_key_and_no_content(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    _, key = await service.org_with_key()
    secret_text = "the vault combination is 31-17-44"
    caplog.set_level(logging.DEBUG)
    async with service.rest(key) as http, service.mcp(key) as mcp:
        cid = (await http.post("/api/v1/conversations", json={"title": secret_text})).json()[
            "conversation_id"
        ]
        await say(http, cid, secret_text)
        await mcp.ok("search", query=secret_text)
        await mcp.error("search", query=secret_text, limit=999)
        await http.get("/api/v1/search", params={"q": secret_text, "limit": 999})
        await http.post(
            "/api/v1/messages",
            json={"conversation_id": cid, "messages": [{"role": "robot", "content": secret_text}]},
        )
    async with httpx.AsyncClient(base_url=service.base_url) as anonymous:
        await anonymous.get("/api/v1/conversations", headers={"Authorization": f"Bearer {key}x"})
    server_side = (
        "api_service",
        "embed_service",
        "index_service",
        "mcp.server",
        "uvicorn",
        "asyncpg",
        "grpc",
        "starlette",
        "fastapi",
    )
    records = [r for r in caplog.records if r.name.startswith(server_side)]
    logged = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in records)
    assert records  # the service did log (e.g. the refused arguments, by field name)
    assert key not in logged and key[:20] not in logged
    assert "vault combination" not in logged


async def test_cors_is_off_by_default(service: Service) -> None:
    async with httpx.AsyncClient(base_url=service.base_url) as http:
        r = await http.options(
            "/api/v1/conversations",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
        )
        assert "access-control-allow-origin" not in r.headers
        r = await http.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
