"""The memory operations. REST routes and MCP tools are thin adapters over these methods."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any, NoReturn, TypeVar

import asyncpg

from api_service import timing
from api_service.auth import Principal
from api_service.core import chunking, validation, views
from api_service.core.errors import (
    InvalidInput,
    NotFound,
    PaymentRequired,
    conversation_not_found,
)
from api_service.core.ids import chunk_id, new_id
from api_service.core.ports import Indexing, QueryVector, SemanticIndex
from api_service.core.redaction import Redactor
from api_service.settings import Limits
from api_service.store import admin, lexical
from api_service.store import repository as repo
from api_service.store.db import Conn, read_snapshot, write_transaction
from api_service.store.records import Charge, ChunkRow, NewMessage, QueuedChunks

log = logging.getLogger(__name__)

DEFAULT_MEMORY_TITLE = "Default memory"

# Largest pagination offset accepted (no conversation holds that many messages).
MAX_OFFSET = 1_000_000_000

# Reciprocal rank fusion constant (Cormack et al.); dampens the weight of top ranks.
RRF_K = 60
# A search whose hits were mostly deleted chunks asks the index again, this many times as
# deep: at most 800 hits (50 results, over-fetched twice), which the index service's largest
# k (INDEX_MAX_K) must allow.
DEEPER_SEARCH = 8
DEEPEST_SEARCH = 800
# Redaction of more than this (bytes of text, and of metadata as JSON) runs on a worker thread:
# RE2 lets go of the GIL while it matches, so the event loop serves other requests meanwhile
# (4 MiB made to be slow takes seconds). Below it the hop would cost more than it saves
# (ordinary text: about 18 µs a KB).
REDACT_INLINE_BYTES = 16_384


class MemoryService:
    """Conversation memory for one deployment; every method acts within the caller's org."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        limits: Limits,
        semantic: SemanticIndex,
        indexer: Indexing | None = None,
        append_wait_seconds: float = 0.0,
    ) -> None:
        self._pool = pool
        self._limits = limits
        self._semantic = semantic
        self._indexer = indexer
        self._append_wait = append_wait_seconds

    async def create_conversation(
        self,
        who: Principal,
        *,
        title: str | None = None,
        agent_id: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        who.require("write")
        limits = self._limits
        validation.text("title", title, limits.title_chars)
        validation.text("agent_id", agent_id, limits.agent_id_chars)
        clean_tags = validation.tags("tags", tags, limits)
        validation.metadata("metadata", metadata, limits)
        # The free text is redacted as messages are; ids and tags are kept as given, for
        # filters to find them.
        redactor = Redactor(pii=who.redact_pii)
        if title is not None:
            title = redactor.redact(title)[0]
        metadata = redactor.redact_value(metadata)
        conversation_id = new_id("conv")
        size = validation.stored_bytes(title, agent_id, metadata)
        async with self._pool.acquire() as conn, conn.transaction():
            await repo.insert_conversation(
                conn,
                who.org_id,
                conversation_id,
                title=title,
                agent_id=agent_id,
                tags=clean_tags,
                metadata=metadata or {},
                storage_bytes=size,
            )
            await self._charge(conn, who, _plan_charge(who, storage_bytes=size, conversations=1))
        return {"conversation_id": conversation_id}

    async def append_messages(
        self, who: Principal, conversation_id: str | None, messages: Sequence[NewMessage]
    ) -> dict[str, Any]:
        """Store messages with the next sequences, (re)build the windows they touch and queue
        them for indexing, all in one transaction. `conversation_id=None` means the org's
        default memory. Waits, bounded, for the chunks to be indexed."""
        who.require("write")
        if conversation_id is not None:
            _known_shape(conversation_id)
        validated = validation.messages(messages, self._limits)
        items = await _off_loop_if_large(
            functools.partial(_redacted, Redactor(pii=who.redact_pii), validated),
            sum(validation.stored_bytes(m.content, m.metadata) for m in validated),
        )
        added_bytes = sum(
            validation.stored_bytes(m.content, m.tool_call_id, m.tool_name, m.metadata)
            for m in items
        )
        message_ids = [new_id("msg") for _ in items]
        new_conversations = 0
        with timing.part("write"):
            async with (
                self._embedding_ahead() as ahead,
                self._pool.acquire() as conn,
                write_transaction(conn),
            ):
                if conversation_id is None:
                    conversation_id, created = await repo.default_conversation_id(
                        conn, who.org_id, new_id("conv"), DEFAULT_MEMORY_TITLE
                    )
                    if created:  # its title's bytes count in the conversation and the org
                        new_conversations = 1
                        added_bytes += validation.stored_bytes(DEFAULT_MEMORY_TITLE)
                appended = await repo.append_messages(
                    conn,
                    who.org_id,
                    conversation_id,
                    message_ids,
                    items,
                    added_bytes,
                    lines_before=chunking.WINDOW - 1,  # every window the first one joins
                )
                if appended is None:
                    raise conversation_not_found()
                count, lines = appended
                first = count - len(items) + 1
                starts = chunking.window_starts_touching(first, count, count)
                lines.update((first + i, (m.role, m.content)) for i, m in enumerate(items))
                charge = _plan_charge(
                    who,
                    storage_bytes=added_bytes,
                    conversations=new_conversations,
                    messages=len(items),
                )
                queued = await self._write_windows(
                    conn, who, conversation_id, starts, count, lines, ahead, charge
                )
        await self._await_indexing(queued, ahead)
        return {
            "appended": len(items),
            "message_ids": message_ids,
            "conversation_id": conversation_id,
        }

    async def update_message(
        self, who: Principal, conversation_id: str, message_id: str, content: str
    ) -> dict[str, Any]:
        """Replace a message's content in place and rebuild the windows that contain it."""
        who.require("write")
        _known_shape(conversation_id)
        if not validation.is_id(message_id):
            raise NotFound("Message not found")
        validation.text("content", content, self._limits.content_chars, required=True)
        redact = functools.partial(Redactor(pii=who.redact_pii).redact, content)
        content = (await _off_loop_if_large(redact, validation.stored_bytes(content)))[0]
        async with (
            self._embedding_ahead() as ahead,
            self._pool.acquire() as conn,
            write_transaction(conn),
        ):
            count = await repo.lock_conversation(conn, who.org_id, conversation_id)
            if count is None:
                raise conversation_not_found()
            updated = await repo.replace_message_content(
                conn, who.org_id, conversation_id, message_id, content
            )
            if updated is None:
                raise NotFound("Message not found")
            message, delta = updated
            await repo.touch_conversation(conn, who.org_id, conversation_id, delta)
            starts = chunking.window_starts_touching(message.sequence, message.sequence, count)
            lines = await repo.message_lines(
                conn, who.org_id, conversation_id, starts[0], chunking.window_end(starts[-1], count)
            )
            charge = _plan_charge(who, storage_bytes=delta, conversations=0)
            queued = await self._write_windows(
                conn, who, conversation_id, starts, count, lines, ahead, charge
            )
        await self._await_indexing(queued, ahead)
        return {"updated": True, "message": views.message(message)}

    async def get_conversation(
        self, who: Principal, conversation_id: str, *, message_limit: int, message_offset: int
    ) -> dict[str, Any]:
        who.require("read")
        _known_shape(conversation_id)
        _bounds("message_limit", message_limit, 1, 500)
        _bounds("message_offset", message_offset, 0, MAX_OFFSET)
        async with self._pool.acquire() as conn, read_snapshot(conn):
            conversation = await repo.get_conversation(conn, who.org_id, conversation_id)
            if conversation is None:
                raise conversation_not_found()
            messages = await repo.get_messages(
                conn, who.org_id, conversation_id, limit=message_limit, offset=message_offset
            )
        return {
            "conversation": views.conversation(conversation),
            "messages": [views.message(m) for m in messages],
        }

    async def list_conversations(
        self,
        who: Principal,
        *,
        limit: int,
        offset: int,
        agent_id: str | None,
        tags: Sequence[str] | None,
        sort: repo.SortKey,
        order: repo.Order,
    ) -> dict[str, Any]:
        who.require("read")
        _bounds("limit", limit, 1, 100)
        _bounds("offset", offset, 0, MAX_OFFSET)
        if sort not in ("created_at", "updated_at", "message_count"):
            raise InvalidInput("sort must be one of created_at, updated_at, message_count")
        if order not in ("asc", "desc"):
            raise InvalidInput("order must be asc or desc")
        clean_tags = validation.tags("tags", tags, self._limits)
        validation.text("agent_id", agent_id, self._limits.agent_id_chars)
        async with self._pool.acquire() as conn, read_snapshot(conn):
            rows, total = await repo.list_conversations(
                conn,
                who.org_id,
                limit=limit,
                offset=offset,
                agent_id=agent_id,
                tags=clean_tags,
                sort=sort,
                order=order,
            )
        return {"conversations": [views.conversation_summary(c) for c in rows], "total": total}

    async def delete_conversation(self, who: Principal, conversation_id: str) -> dict[str, Any]:
        """Delete the conversation, its messages and chunks; its vectors go through the outbox,
        so an index shard that is down converges when it is back."""
        who.require("write")
        _known_shape(conversation_id)
        async with self._pool.acquire() as conn, conn.transaction():
            await lexical.forget_conversation(conn, who.org_id, conversation_id)
            freed = await repo.delete_conversation(conn, who.org_id, conversation_id)
            if freed is None:
                raise conversation_not_found()
            await repo.enqueue_delete_job(conn, who.org_id, conversation_id)
            freed_bytes, freed_messages = freed
            charge = _plan_charge(
                who, storage_bytes=-freed_bytes, conversations=-1, messages=-freed_messages
            )
            await self._charge(conn, who, charge)
        if self._indexer is not None:
            self._indexer.notify()
        return {"deleted": True}

    async def search(
        self,
        who: Principal,
        query: str,
        *,
        limit: int = 5,
        conversation_id: str | None = None,
        tags: Sequence[str] | None = None,
        project: str | None = None,
        snippet_chars: int = 1500,
        hybrid: bool = False,
        query_name: str = "query",
    ) -> dict[str, Any]:
        """Chunks ranked by cosine similarity to `query`; with `hybrid`, fused by reciprocal
        rank with PostgreSQL full-text ranking. Filters narrow the candidates before ranking.
        `query_name`: what errors call the query (REST's parameter is `q`)."""
        who.require("read")
        validation.text(query_name, query, self._limits.query_chars, required=True)
        if not query.strip():
            raise InvalidInput(f"{query_name} must not be empty")
        _bounds("limit", limit, 1, 50)
        _bounds("snippet_chars", snippet_chars, len(chunking.TRUNCATION_SUFFIX) + 1, 5000)
        clean_tags = validation.tags("tags", tags, self._limits)
        validation.text("project", project, self._limits.title_chars)
        if conversation_id is not None:
            _known_shape(conversation_id)
        allowed: list[str] | None = None
        if conversation_id is not None or clean_tags or project is not None:
            async with self._pool.acquire() as conn:
                if (
                    conversation_id is not None
                    and await repo.get_conversation(conn, who.org_id, conversation_id) is None
                ):
                    raise conversation_not_found()
                allowed = await repo.conversation_ids_matching(
                    conn,
                    who.org_id,
                    conversation_id=conversation_id,
                    tags=clean_tags,
                    project=project,
                )
            if not allowed:
                return {"results": [], "total": 0}
        # No connection is held while the query is embedded and the shard searched: slow
        # calls there must not take the pool from appends and reads.
        depth = 2 * limit  # over-fetch: a hit whose chunk was deleted a moment ago is dropped

        async def vector_half() -> tuple[QueryVector, list[tuple[str, float]]]:
            vector = await self._semantic.embed_query(query)
            return vector, await self._semantic.nearest(who.org_id, vector, depth, allowed)

        lexical_ids: list[str] = []
        if hybrid:  # the two rankings run side by side
            vector_part, lexical_part = await asyncio.gather(
                vector_half(),
                self._lexical_search(who.org_id, query, depth, allowed),
                return_exceptions=True,
            )
            if isinstance(vector_part, BaseException):
                raise vector_part
            if isinstance(lexical_part, BaseException):
                raise lexical_part
            (vector, vector_hits), lexical_ids = vector_part, lexical_part
        else:
            vector, vector_hits = await vector_half()
        best = await self._best_rows(who.org_id, _ranked(vector_hits, lexical_ids, hybrid), limit)
        if len(best) < limit and len(vector_hits) == depth and depth < DEEPEST_SEARCH:
            # Too many hits were chunks deleted since (their conversation's vectors wait for
            # the indexer's delete job): ask the index for more, not the embedder.
            deeper = min(DEEPER_SEARCH * depth, DEEPEST_SEARCH)
            vector_hits = await self._semantic.nearest(who.org_id, vector, deeper, allowed)
            ranked = _ranked(vector_hits, lexical_ids, hybrid)
            best = await self._best_rows(who.org_id, ranked, limit)
        results = [_result(row, score, snippet_chars) for row, score in best]
        return {"results": results, "total": len(results)}

    async def _best_rows(
        self, org_id: str, ranked: list[tuple[str, float]], limit: int
    ) -> list[tuple[ChunkRow, float]]:
        async with self._pool.acquire() as conn:
            return await _best_rows(conn, org_id, ranked, limit)

    async def _lexical_search(
        self, org_id: str, query: str, depth: int, allowed: list[str] | None
    ) -> list[str]:
        """The full-text half of a hybrid search, on a connection of its own. Its time
        counts from the wait for the connection, as the vector half's does from its calls."""
        with timing.part("lexical"):
            async with self._pool.acquire() as conn:
                return await lexical.search(conn, org_id, query, depth, allowed)

    async def usage(self, who: Principal, requests: int, month: str) -> dict[str, Any]:
        """The org's use of its plan this month."""
        who.require("read")
        totals = await admin.org_totals(self._pool, who.org_id)
        return {
            "month": month,
            "requests": requests,
            "requests_limit": who.plan.monthly_requests,
            "storage_bytes": totals.storage_bytes,
            "storage_bytes_limit": who.plan.storage_bytes,
            "conversations": totals.conversations,
            "conversations_limit": who.plan.conversations,
            "messages": totals.messages,
            "messages_limit": who.plan.messages,
        }

    async def _charge(self, conn: Conn, who: Principal, charge: Charge) -> None:
        """Count a write against the org's plan, or refuse it whole (402): the caller's
        transaction rolls back, so nothing of the write is stored."""
        if not await repo.charge_org(conn, who.org_id, charge):
            await self._refuse(conn, who, charge)

    async def _refuse(self, conn: Conn, who: Principal, charge: Charge) -> NoReturn:
        """The 402 for a write whose charge would pass a limit of the org's plan."""
        plan = who.plan
        totals = await admin.org_totals(conn, who.org_id)
        if (
            charge.conversations > 0
            and totals.conversations + charge.conversations > plan.conversations
        ):
            raise PaymentRequired(
                f"Conversation limit of {plan.conversations} reached; delete conversations "
                "or move to a larger plan"
            )
        if charge.messages > 0 and totals.messages + charge.messages > plan.messages:
            raise PaymentRequired(
                f"Message limit of {plan.messages} reached ({totals.messages} stored, this "
                f"write adds {charge.messages}); delete conversations or move to a larger plan"
            )
        raise PaymentRequired(
            f"Storage limit of {plan.storage_bytes} bytes reached ({totals.storage_bytes} used, "
            f"this write needs {charge.storage_bytes} more); delete conversations or move to a "
            "larger plan"
        )

    @contextlib.asynccontextmanager
    async def _embedding_ahead(self) -> AsyncIterator[list[asyncio.Future[Any]]]:
        """Where a write's transaction leaves the embedding it started (`_write_windows`);
        cancelled if the transaction fails."""
        ahead: list[asyncio.Future[Any]] = []
        try:
            yield ahead
        except BaseException:
            for embedding in ahead:
                embedding.cancel()
            raise

    async def _write_windows(
        self,
        conn: Conn,
        who: Principal,
        conversation_id: str,
        starts: Sequence[int],
        count: int,
        lines: dict[int, tuple[str, str]],
        ahead: list[asyncio.Future[Any]],
        charge: Charge,
    ) -> QueuedChunks:
        """(Re)write the chunk rows of the windows at `starts` from their messages' `lines`;
        queue them for indexing, leased to this request when it is to wait for them, and add
        the write's `charge` to the org (402 if over a limit), in one statement: the last of
        the transaction. Their embedding starts at once, in `ahead`: it runs while the
        transaction writes the chunks and commits."""
        chunks = []
        for start in starts:
            end = chunking.window_end(start, count)
            chunks.append(
                ChunkRow(
                    chunk_id=chunk_id(conversation_id, start),
                    conversation_id=conversation_id,
                    start_sequence=start,
                    end_sequence=end,
                    text=chunking.chunk_text(lines[s] for s in range(start, end + 1)),
                )
            )
        # Indexed by this write itself, its job leased to it, unless it is not to wait or
        # the indexer is busy with other writes' (then the job is due for any worker at once).
        indexer = self._indexer
        if self._append_wait <= 0 or (indexer is not None and indexer.busy):
            indexer = None
        if indexer is not None:
            ahead.append(indexer.embed_ahead([c.text for c in chunks]))
        leased = indexer.lease_seconds if indexer is not None else 0.0
        queued = await repo.upsert_chunks(conn, who.org_id, conversation_id, chunks, charge, leased)
        if queued is None:
            await self._refuse(conn, who, charge)
        return queued

    async def _await_indexing(self, queued: QueuedChunks, ahead: list[asyncio.Future[Any]]) -> None:
        if self._indexer is None:
            return
        if not ahead:  # left to the background workers (`_write_windows`)
            self._indexer.notify()
        elif not await self._indexer.index_now(queued, self._append_wait, ahead[0]):
            # Committed all the same; the indexer finishes the job later.
            log.warning(
                "indexing not done within %.1fs; continuing in the background", self._append_wait
            )


T = TypeVar("T")


async def _off_loop_if_large(work: Callable[[], T], size: int) -> T:
    """`work()`, the redaction of `size` bytes, on a worker thread past REDACT_INLINE_BYTES."""
    if size > REDACT_INLINE_BYTES:
        return await asyncio.to_thread(work)
    return work()


def _redacted(redactor: Redactor, messages: Sequence[NewMessage]) -> list[NewMessage]:
    return [
        replace(
            m, content=redactor.redact(m.content)[0], metadata=redactor.redact_value(m.metadata)
        )
        for m in messages
    ]


def _plan_charge(
    who: Principal, *, storage_bytes: int, conversations: int, messages: int = 0
) -> Charge:
    """A write's addition to the caller's org, with the limits of its plan."""
    plan = who.plan
    return Charge(
        storage_bytes,
        conversations,
        messages,
        plan.storage_bytes,
        plan.conversations,
        plan.messages,
    )


def _known_shape(conversation_id: str) -> None:
    """An id this service could not have issued is not found, like any unknown id."""
    if not validation.is_id(conversation_id):
        raise conversation_not_found()


def _bounds(name: str, value: int, low: int, high: int | None) -> None:
    if value < low or (high is not None and value > high):
        allowed = f"between {low} and {high}" if high is not None else f">= {low}"
        raise InvalidInput(f"{name} must be {allowed}")


def _ranked(
    vector_hits: list[tuple[str, float]], lexical_ids: list[str], hybrid: bool
) -> list[tuple[str, float]]:
    """The search's ranking: fused with the full-text one when hybrid, else by score."""
    if hybrid:
        return _fuse(vector_hits, lexical_ids)
    return sorted(vector_hits, key=lambda hit: (-hit[1], hit[0]))  # ties: stable


def _fuse(vector_hits: list[tuple[str, float]], lexical_ids: list[str]) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of two rankings."""
    scores: dict[str, float] = {}
    for ranking in ([cid for cid, _ in vector_hits], lexical_ids):
        for rank, cid in enumerate(ranking, start=1):
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


async def _best_rows(
    conn: Conn, org_id: str, ranked: list[tuple[str, float]], limit: int
) -> list[tuple[ChunkRow, float]]:
    """The rows of the first `limit` ranked chunks that still exist, in rank order. The rest
    are read only when one of those is gone (deleted since it was ranked), in one more round
    trip; reading every ranked row read up to four times the pages a search shows."""
    best: list[tuple[ChunkRow, float]] = []
    with timing.part("rows"):
        for batch in (ranked[:limit], ranked[limit:]):
            if len(best) >= limit or not batch:
                break
            rows = await repo.chunks_by_id(conn, org_id, [cid for cid, _ in batch])
            best += [(rows[cid], score) for cid, score in batch if cid in rows]
    return best[:limit]


def _result(chunk: ChunkRow, score: float, snippet_chars: int) -> dict[str, Any]:
    return {
        "chunk_id": chunk.chunk_id,
        "conversation_id": chunk.conversation_id,
        "chunk_text": chunking.clip(chunk.text, snippet_chars),
        "score": round(float(score), 6),
        "start_sequence": chunk.start_sequence,
        "end_sequence": chunk.end_sequence,
    }
