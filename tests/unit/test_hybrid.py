"""Hybrid search fuses vector and full-text rankings: a keyword-only match surfaces even when the
vector index does not return it, a failing vector half leaves nothing running on the
connection, and no search holds a connection while the index answers (real PostgreSQL, fakes
at the semantic-index port)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import asyncpg
import pytest

from api_service.auth import Principal
from api_service.core.memory import MemoryService
from api_service.core.ports import SemanticIndex
from api_service.settings import Limits
from api_service.store import admin
from api_service.store.db import create_pool
from api_service.store.records import NewMessage

WHO = Principal("org_a", "key_a", frozenset({"read", "write"}))


class FakeIndex:
    """Embeds a query as its own text."""

    async def embed_query(self, query: str) -> str:
        return query


class NoVectorHits(FakeIndex):
    async def nearest(
        self, org_id: str, query: str, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        return []


class VectorHalfDown(FakeIndex):
    async def nearest(
        self, org_id: str, query: str, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        raise ConnectionError("index shard down")


class SlowIndex(FakeIndex):
    """Answers every chunk of the org once `answer` is set; `asked` is set while it waits."""

    def __init__(self, chunk_ids: list[str]) -> None:
        self.chunk_ids = chunk_ids
        self.asked, self.answer = asyncio.Event(), asyncio.Event()

    async def nearest(
        self, org_id: str, query: str, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        self.asked.set()
        await self.answer.wait()
        return [(chunk_id, 0.5) for chunk_id in self.chunk_ids]


class StaleFirst(FakeIndex):
    """Ranks `stale` chunk ids (deleted from PostgreSQL, still in the index) above `live`
    ones, and records the depths it was asked for."""

    def __init__(self, stale: list[str], live: list[str]) -> None:
        self.ranking = stale + live
        self.depths: list[int] = []
        self.embedded = 0

    async def embed_query(self, query: str) -> str:
        self.embedded += 1
        return query

    async def nearest(
        self, org_id: str, query: str, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        self.depths.append(k)
        return [(cid, 1.0 - i / 1000) for i, cid in enumerate(self.ranking[:k])]


@contextlib.asynccontextmanager
async def memory_of_org_a(
    database_url: str, semantic: SemanticIndex, connections: int
) -> AsyncIterator[tuple[MemoryService, asyncpg.Pool]]:
    """The service over a pool of `connections`, with org_a (WHO's org) created."""
    pool = await create_pool(database_url, 1, connections)
    try:
        async with pool.acquire() as conn:
            await admin.create_org(conn, WHO.org_id, "a", None)
        yield MemoryService(pool, Limits(), semantic), pool
    finally:
        await pool.close()


async def test_keyword_only_match_surfaces_in_hybrid_not_in_vector(database_url: str) -> None:
    async with memory_of_org_a(database_url, NoVectorHits(), 4) as (memory, _):
        cid = (await memory.create_conversation(WHO))["conversation_id"]
        await memory.append_messages(
            WHO,
            cid,
            [
                NewMessage("user", "The order number is ZX-99812, shipped Tuesday"),
                NewMessage("assistant", "Thanks, tracking it now"),
            ],
        )
        assert (await memory.search(WHO, "ZX-99812"))["results"] == []
        hybrid = await memory.search(WHO, "status of ZX-99812", hybrid=True)
        assert hybrid["total"] == 1
        assert "ZX-99812" in hybrid["results"][0]["chunk_text"]
        other = Principal("org_b", "key_b", frozenset({"read"}))
        assert (await memory.search(other, "ZX-99812", hybrid=True))["results"] == []


async def test_failed_vector_half_returns_the_connection_idle(database_url: str) -> None:
    """The full-text half finishes before its connection goes back to the pool: a query left
    running on it failed the next request that borrowed it (seen as a 503 on a listing)."""
    async with memory_of_org_a(database_url, VectorHalfDown(), 1) as (memory, pool):
        cid = (await memory.create_conversation(WHO))["conversation_id"]
        await memory.append_messages(WHO, cid, [NewMessage("user", "sailing boats at dawn")])
        for _ in range(20):
            with pytest.raises(ConnectionError, match="index shard down"):
                await memory.search(WHO, "boats", hybrid=True)
            assert await pool.fetchval("SELECT count(*) FROM conversations") == 1


@pytest.mark.parametrize("hybrid", [False, True])
async def test_a_search_holds_no_connection_while_the_index_answers(
    database_url: str, hybrid: bool
) -> None:
    """On a pool of one connection, the rest of the service is served while a search waits
    for its query's embedding and the shard: a slow index must not starve the pool."""
    index = SlowIndex([])
    async with memory_of_org_a(database_url, index, 1) as (memory, pool):
        cid = (await memory.create_conversation(WHO))["conversation_id"]
        await memory.append_messages(WHO, cid, [NewMessage("user", "sailing boats at dawn")])
        index.chunk_ids = [await pool.fetchval("SELECT chunk_id FROM chunks")]
        searching = asyncio.create_task(
            memory.search(WHO, "boats", conversation_id=cid, hybrid=hybrid)
        )
        try:
            await asyncio.wait_for(index.asked.wait(), 5)
            got = await asyncio.wait_for(
                memory.get_conversation(WHO, cid, message_limit=10, message_offset=0), 5
            )
            assert [m["content"] for m in got["messages"]] == ["sailing boats at dawn"]
            assert not searching.done()
        finally:
            index.answer.set()  # the search ends, and gives back what it holds, either way
        found = await asyncio.wait_for(searching, 5)
        assert [r["chunk_text"] for r in found["results"]] == ["[user]: sailing boats at dawn"]


@pytest.mark.parametrize("hybrid", [False, True])
async def test_hits_deleted_since_do_not_leave_a_search_short(
    database_url: str, hybrid: bool
) -> None:
    """A conversation is deleted while the index still holds its vectors (their removal
    waits in the outbox): a search whose first hits are all its chunks asks the index again,
    deeper, with the same embedding, and answers with the chunks that remain."""
    async with memory_of_org_a(database_url, NoVectorHits(), 2) as (memory, pool):
        kept = (await memory.create_conversation(WHO))["conversation_id"]
        await memory.append_messages(WHO, kept, [NewMessage("user", "kept about paris")])
        live = [await pool.fetchval("SELECT chunk_id FROM chunks")]
        stale = [f"chk_gone_{i}" for i in range(30)]  # no rows: their conversation is gone
        index = StaleFirst(stale, live)
        deeper = MemoryService(pool, Limits(), index)
        found = await deeper.search(WHO, "paris", limit=3, hybrid=hybrid)
        assert [r["chunk_text"] for r in found["results"]] == ["[user]: kept about paris"]
        assert index.depths == [6, 48] and index.embedded == 1
