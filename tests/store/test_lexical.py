"""Lexical search on the real PostgreSQL: BM25 order, scope, org isolation, the org-wide plan
of a large org (term statistics, matching on the rarest words, the GIN index), and the
indexer's flush of the GIN index's pending list."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from api_service import indexer
from api_service.auth import Principal
from api_service.clients import EmbedClient, IndexRouter
from api_service.core import chunking
from api_service.core.memory import MemoryService
from api_service.settings import Limits
from api_service.store import admin, lexical
from api_service.store.db import create_pool
from api_service.store.records import NewMessage
from tests.api.harness import eventually

FILLER = "we talked about the weather and the garden and the plans for the weekend"


async def _seed(conn: asyncpg.Connection, org_id: str, texts: dict[str, list[str]]) -> None:
    """Conversations of chunks, one chunk per text, with message counts that match."""
    if await conn.fetchval("SELECT 1 FROM orgs WHERE org_id = $1", org_id) is None:
        await admin.create_org(conn, org_id, org_id, None)
    await conn.copy_records_to_table(
        "conversations",
        records=[(org_id, cid, 3 * len(chunks)) for cid, chunks in texts.items()],
        columns=["org_id", "conversation_id", "message_count"],
    )
    await conn.copy_records_to_table(
        "chunks",
        records=[
            (org_id, cid, 1 + 3 * i, f"{cid}_w{i}", 3 + 3 * i, text)
            for cid, chunks in texts.items()
            for i, text in enumerate(chunks)
        ],
        columns=["org_id", "conversation_id", "start_sequence", "chunk_id", "end_sequence", "text"],
    )


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


async def test_bm25_ranks_the_rare_word_first_and_keeps_to_its_scope(
    conn: asyncpg.Connection,
) -> None:
    await _seed(
        conn,
        "org_a",
        {
            "conv_1": [
                f"{FILLER}; the invoice is INV-7731 for the plumber",
                f"{FILLER}; the plumber came on Monday",
                f"{FILLER}; the plumber came again, the plumber was late",
            ],
            "conv_2": [f"{FILLER}; my plumber said the invoice is coming"],
        },
    )
    await _seed(conn, "org_b", {"conv_b": [f"{FILLER}; invoice INV-7731 plumber plumber"]})

    found = await lexical.search(conn, "org_a", "plumber invoice INV-7731", 10, None)
    assert found[0] == "conv_1_w0"  # the only chunk with every word, and the rarest
    assert set(found) == {"conv_1_w0", "conv_1_w1", "conv_1_w2", "conv_2_w0"}

    scoped = await lexical.search(conn, "org_a", "plumber invoice", 10, ["conv_2"])
    assert scoped == ["conv_2_w0"]
    assert await lexical.search(conn, "org_a", "the and for", 10, None) == []  # stop words only
    assert await lexical.search(conn, "org_b", "plumber", 10, None) == ["conv_b_w0"]


async def test_the_exact_plan_weighs_a_word_by_its_chunks_in_scope(
    conn: asyncpg.Connection,
) -> None:
    """Document frequencies and N are counted in the scope the exact plan searches: the word
    one chunk in scope holds outranks one that five hold, three times in one of them, whether
    the org has no term statistics or has them and the same words weigh the other way there."""
    home = [f"{FILLER}; quokka quokka quokka"] + [f"{FILLER}; quokka {i}" for i in range(4)]
    home.append(f"{FILLER}; the kettle")
    await _seed(conn, "org_small", {"conv_home": home})
    assert await lexical.search(conn, "org_small", "quokka kettle", 1, None) == ["conv_home_w5"]

    elsewhere = [f"{FILLER}; note {i} on the kettle" for i in range(lexical.EXACT_BELOW)]
    await _seed(conn, "org_large", {"conv_home": home, "conv_elsewhere": elsewhere})
    await lexical.keep_stats(conn, "org_large")
    assert await lexical.stats_chunk_count(conn, "org_large") == len(home) + len(elsewhere)
    scoped = await lexical.search(conn, "org_large", "quokka kettle", 1, ["conv_home"])
    assert scoped == ["conv_home_w5"]


async def test_large_org_is_searched_org_wide_through_term_statistics(
    conn: asyncpg.Connection,
) -> None:
    size = lexical.EXACT_BELOW + 500
    chunks = [f"{FILLER}; note {i} about the garden hose" for i in range(size)]
    first, second = size // 4, 3 * size // 4
    chunks[first] = f"{FILLER}; the quokka photo from Rottnest"
    chunks[second] = f"{FILLER}; a second quokka, smiling"
    await _seed(conn, "org_big", {"conv_big": chunks})
    await _seed(conn, "org_other", {"conv_other": ["the quokka quokka quokka"]})

    assert await lexical.stats_chunk_count(conn, "org_big") is None
    await lexical.keep_stats(conn, "org_big")
    assert await lexical.stats_chunk_count(conn, "org_big") == size
    df = dict(await conn.fetch("SELECT lexeme, df FROM lexeme_df WHERE org_id = 'org_big'"))
    assert df["quokka"] == 2 and df["garden"] == size and df["rottnest"] == 1
    avg_length = await conn.fetchval(
        "SELECT avg(length(text_search)) FROM chunks WHERE org_id = 'org_big'"
    )
    assert await conn.fetchval(
        "SELECT avg_length FROM lexical_stats WHERE org_id = 'org_big'"
    ) == pytest.approx(float(avg_length))

    found = await lexical.search(conn, "org_big", "garden quokka from Rottnest", 5, None)
    assert found[:2] == [f"conv_big_w{first}", f"conv_big_w{second}"]
    # Only common words: the match budget bounds the work, and the results are still real.
    common = await lexical.search(conn, "org_big", "garden weekend", 5, None)
    assert len(common) == 5 and all(cid.startswith("conv_big_w") for cid in common)

    # Within the drift the statistics stay; an org that shrinks is searched exactly again.
    await conn.execute(
        "UPDATE conversations SET message_count = message_count + 30 WHERE org_id = 'org_big'"
    )
    await lexical.keep_stats(conn, "org_big")
    assert await lexical.stats_chunk_count(conn, "org_big") == size
    await conn.execute("UPDATE conversations SET message_count = 30 WHERE org_id = 'org_big'")
    await lexical.keep_stats(conn, "org_big")
    assert await lexical.stats_chunk_count(conn, "org_big") is None
    assert await conn.fetchval("SELECT count(*) FROM lexeme_df WHERE org_id = 'org_big'") == 0


async def test_the_chunk_count_from_message_counts_is_the_org_s_chunks(database_url: str) -> None:
    """BM25's N in both plans, and the statistics' drift, come from the conversations' message
    counts (a window starts at every third message), never from reading the chunks: they must
    be the chunks there are, through appends of every size, edits and deletes."""
    assert chunking.STRIDE == 3  # org_chunk_count's SQL (migration 0015)
    who = Principal("org_count", "key_count", frozenset({"read", "write"}))
    pool = await create_pool(database_url, 1, 1)
    try:
        async with pool.acquire() as conn:
            await admin.create_org(conn, who.org_id, "count", None)
        memory = MemoryService(pool, Limits(), semantic=None)  # type: ignore[arg-type]
        conversations = [
            (await memory.create_conversation(who))["conversation_id"] for _ in range(3)
        ]
        # Another org's conversation, named in a scope too: never counted.
        other = Principal("org_count_other", "key_count_other", frozenset({"read", "write"}))
        async with pool.acquire() as conn:
            await admin.create_org(conn, other.org_id, "other", None)
        theirs = (await memory.create_conversation(other))["conversation_id"]
        await memory.append_messages(other, theirs, [NewMessage("user", "x")] * 7)
        sizes = [1, 2, 3, 4, 5, 7, 11]
        for i, size in enumerate(sizes):
            notes = [NewMessage("user", f"note {i}.{j}") for j in range(size)]
            appended = await memory.append_messages(who, conversations[i % 3], notes)
        await memory.append_messages(who, None, [NewMessage("user", "to the default memory")])
        await memory.update_message(who, conversations[0], appended["message_ids"][0], "edited")

        async def counted() -> tuple[int, int]:
            async with pool.acquire() as conn:
                chunks = await conn.fetchval(
                    "SELECT count(*) FROM chunks WHERE org_id = $1", who.org_id
                )
                some = [conversations[0], theirs]
                assert await conn.fetchval(
                    "SELECT org_chunk_count($1, $2)", who.org_id, some
                ) == await conn.fetchval(
                    "SELECT count(*) FROM chunks WHERE org_id = $1 AND conversation_id = ANY($2)",
                    who.org_id,
                    some,
                )
                return await lexical.chunk_count(conn, who.org_id), chunks

        derived, chunks = await counted()
        assert derived == chunks > len(sizes)
        await memory.delete_conversation(who, conversations[1])
        derived, fewer = await counted()
        assert derived == fewer < chunks
    finally:
        await pool.close()


def _kettles_then_quokkas(size: int) -> tuple[list[str], range]:
    """`size` chunks holding a common word, the last five a rare one too; where those are."""
    chunks = [f"{FILLER}; note {i}, the kettle" for i in range(size)]
    rare = range(size - 5, size)
    for i in rare:
        chunks[i] = f"{FILLER}; the kettle and the quokka {i}"
    return chunks, rare


async def test_an_org_past_the_exact_cap_is_searched_on_its_term_statistics(
    conn: asyncpg.Connection,
) -> None:
    """The exact plan scores any EXACT_CAP of a scope's matches; an org with more chunks than
    that must not be searched by it, or a common word's first matches in table order would
    crowd out the chunks holding the rare one."""
    chunks, rare = _kettles_then_quokkas(3 * lexical.EXACT_CAP)
    await _seed(conn, "org_mid", {"conv_mid": chunks})
    await lexical.keep_stats(conn, "org_mid")

    found = await lexical.search(conn, "org_mid", "kettle quokka", 5, None)
    assert sorted(found) == sorted(f"conv_mid_w{i}" for i in rare)


async def test_a_large_scope_is_searched_on_the_org_s_term_statistics(
    conn: asyncpg.Connection,
) -> None:
    """Narrowed to conversations of more chunks than the exact plan scores, a search takes the
    org-wide plan within them: the rare word's chunks first, and where the org's rarest words
    are in none of the scope's chunks, any query word's."""
    kettles, rare = _kettles_then_quokkas(3 * lexical.EXACT_CAP)
    others = [f"{FILLER}; other note {i}, the kettle" for i in range(lexical.EXACT_CAP + 100)]
    await _seed(conn, "org_scoped", {"conv_kettles": kettles, "conv_others": others})
    await lexical.keep_stats(conn, "org_scoped")

    found = await lexical.search(conn, "org_scoped", "kettle quokka", 5, ["conv_kettles"])
    assert sorted(found) == sorted(f"conv_kettles_w{i}" for i in rare)
    elsewhere = await lexical.search(conn, "org_scoped", "kettle quokka", 5, ["conv_others"])
    assert len(elsewhere) == 5 and all(cid.startswith("conv_others_w") for cid in elsewhere)


async def test_a_scope_counts_a_word_by_its_share_of_the_org(conn: asyncpg.Connection) -> None:
    """In a scope of a sixth of the org, a word the org holds 1,000 times is expected in about
    170 of its chunks: within the budget, so it is matched with the rarer word the scope does
    not hold, and its chunks are found, though every chunk in scope holds a word more common
    still, whose first matches in table order a LIMIT would take."""
    budget = lexical.MATCH_BUDGET
    scope = [f"{FILLER}; note {i} on the kettle" for i in range(lexical.EXACT_CAP + 100)]
    walrus = range(len(scope) - 30, len(scope))
    for i in walrus:
        scope[i] = f"{FILLER}; note {i} on the kettle and the walrus"
    elsewhere = [f"{FILLER}; the walrus {i}" for i in range(1000 - len(walrus))]
    elsewhere += [f"{FILLER}; the quokka {i}" for i in range(budget // 2)]
    elsewhere += [f"{FILLER}; filler {i}, a kettle" for i in range(5 * len(scope) - len(elsewhere))]
    await _seed(conn, "org_share", {"conv_scope": scope, "conv_elsewhere": elsewhere})
    await lexical.keep_stats(conn, "org_share")

    found = await lexical.search(conn, "org_share", "kettle walrus quokka", 10, ["conv_scope"])
    assert len(found) == 10 and set(found) <= {f"conv_scope_w{i}" for i in walrus}


def test_term_statistics_are_recounted_once_the_org_doubles_or_halves() -> None:
    taken = 10_000
    assert not lexical.stats_drifted(taken, taken)
    assert not lexical.stats_drifted(2 * taken, taken)
    assert not lexical.stats_drifted(taken // 2, taken)
    assert lexical.stats_drifted(2 * taken + 1, taken)
    assert lexical.stats_drifted(taken // 2 - 1, taken)
    assert lexical.stats_drifted(1, 0)  # never counted


async def test_an_orgs_term_statistics_go_with_it(conn: asyncpg.Connection) -> None:
    await _seed(conn, "org_gone", {"conv": [f"{FILLER}; {i}" for i in range(100)]})
    assert await lexical.refresh_stats(conn, "org_gone")
    assert await conn.fetchval("SELECT count(*) FROM lexeme_df WHERE org_id = 'org_gone'") > 0
    await conn.execute("DELETE FROM orgs WHERE org_id = 'org_gone'")
    assert await conn.fetchval("SELECT count(*) FROM lexeme_df WHERE org_id = 'org_gone'") == 0


async def test_a_deleted_conversations_words_leave_the_term_statistics(database_url: str) -> None:
    """A delete takes its chunks out of the document frequencies: a word only it held is no
    longer stored, a shared one is counted down."""
    who = Principal("org_forget", "key_forget", frozenset({"read", "write"}))
    pool = await create_pool(database_url, 1, 2)
    try:
        async with pool.acquire() as conn:
            await _seed(
                conn,
                who.org_id,
                {
                    "conv_kept": [f"{FILLER}; kettle {i}" for i in range(lexical.EXACT_BELOW)],
                    "conv_gone": [f"{FILLER}; kettle and the zanzibar codeword"] * 3,
                },
            )
            await lexical.keep_stats(conn, who.org_id)
            df = dict(
                await conn.fetch("SELECT lexeme, df FROM lexeme_df WHERE org_id = $1", who.org_id)
            )
            assert (df["zanzibar"], df["codeword"], df["kettl"]) == (3, 3, lexical.EXACT_BELOW + 3)

        memory = MemoryService(pool, Limits(), semantic=None)  # type: ignore[arg-type]
        await memory.delete_conversation(who, "conv_gone")
        async with pool.acquire() as conn:
            df = dict(
                await conn.fetch("SELECT lexeme, df FROM lexeme_df WHERE org_id = $1", who.org_id)
            )
        assert "zanzibar" not in df and "codeword" not in df
        assert df["kettl"] == lexical.EXACT_BELOW and df["garden"] == lexical.EXACT_BELOW
    finally:
        await pool.close()


async def test_a_delete_and_a_recount_of_one_org_do_not_overlap(database_url: str) -> None:
    """A recount under way counted the conversation: its delete waits for it, then takes its
    chunks out; and while a delete is under way no recount starts."""
    recounting = await asyncpg.connect(database_url)
    deleting = await asyncpg.connect(database_url)
    try:
        chunks = [f"{FILLER}; {i}" for i in range(lexical.EXACT_BELOW)]
        await _seed(recounting, "org_overlap", {"conv": chunks})
        delete = deleting.transaction()
        async with recounting.transaction():
            assert await recounting.fetchval(
                "SELECT pg_try_advisory_xact_lock(hashtextextended('lexical_stats:' || $1, 0))",
                "org_overlap",
            )  # held as refresh_stats holds it
            await delete.start()
            forget = asyncio.create_task(
                lexical.forget_conversation(deleting, "org_overlap", "conv")
            )
            await asyncio.sleep(0.2)
            assert not forget.done()
        await asyncio.wait_for(forget, 5)  # the recount's transaction ended
        assert not await lexical.keep_stats(recounting, "org_overlap")  # due, and held
        await delete.commit()
        assert await lexical.keep_stats(recounting, "org_overlap")
        assert await lexical.stats_chunk_count(recounting, "org_overlap") == lexical.EXACT_BELOW
    finally:
        for conn in (recounting, deleting):
            await conn.close()


async def test_the_indexer_tries_again_a_recount_that_could_not_start(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = [False, True]
    kept: list[str] = []

    async def keep_stats(conn: asyncpg.Connection, org_id: str) -> bool:
        kept.append(org_id)
        return outcomes.pop(0) if outcomes else True

    monkeypatch.setattr(lexical, "keep_stats", keep_stats)
    monkeypatch.setattr(indexer, "STATS_CHECK_SECONDS", 0.01)
    async with _flushing_indexer(database_url) as (_, worker, _flush):
        worker._orgs_changed.add("org_held")
        task = asyncio.create_task(worker._keep_term_stats())

        async def tried_twice() -> bool:
            return len(kept) >= 2

        try:
            assert await eventually(tried_twice, seconds=5)
        finally:
            task.cancel()
    assert kept[:2] == ["org_held", "org_held"] and not worker._orgs_changed


async def test_org_wide_search_of_common_words_matches_chunks_holding_both_first(
    conn: asyncpg.Connection,
) -> None:
    """Even the query's rarest word is in more chunks than the match budget: the chunk that
    holds both of its rarest words must be found, though a LIMIT over one word's matches in
    table order would stop before it."""
    size = lexical.EXACT_BELOW + 500
    chunks = [f"{FILLER}; note {i} about the garden hose" for i in range(size)]
    budget = lexical.MATCH_BUDGET
    for i in range(budget + 50):
        chunks[i] = f"{FILLER}; the teapot number {i}"
        chunks[size - 1 - i] = f"{FILLER}; the kettle number {i}"
    chunks[size - 1] = f"{FILLER}; the teapot sat on the kettle"
    await _seed(conn, "org_tea", {"conv_tea": chunks})
    await lexical.keep_stats(conn, "org_tea")

    found = await lexical.search(conn, "org_tea", "kettle teapot", 5, None)
    assert found[0] == f"conv_tea_w{size - 1}"
    assert len(found) == 5  # too few hold both: the rarest word alone fills the rest


async def test_org_wide_matches_come_from_the_full_text_index(conn: asyncpg.Connection) -> None:
    """Planner statistics lag a growing org, and a LIMIT over matches makes reading the org's
    rows look cheap; the org-wide search must still take the rare word's postings."""
    texts = [f"note {i}: " + ("the garden hose" if i % 5 == 0 else "a kettle") for i in range(3000)]
    await _seed(conn, "org_d", {"conv_d": [f"other {i}" for i in range(20_000)]})
    await _seed(conn, "org_c", {"conv_c0": texts[:50]})
    await conn.execute("ANALYZE chunks")  # statistics from when org_c was small
    await _seed(conn, "org_c", {"conv_c1": texts[50:]})
    await lexical.refresh_stats(conn, "org_c")
    before = await _chunk_reads(conn)
    found = await lexical.search(conn, "org_c", "garden hose", 10, None, exact_below=1000)
    assert len(found) == 10
    reads = {name: count - before[name] for name, count in (await _chunk_reads(conn)).items()}
    assert reads["chunks_text_search"] > 0, reads
    assert reads["chunks_id"] == reads["chunks_pkey"] == reads["seq_scan"] == 0, reads


async def _chunk_reads(conn: asyncpg.Connection) -> dict[str, int]:
    """How many times this database has read the chunks table by each index, and by a
    sequential scan, counting this connection's last statements."""
    await conn.execute("SELECT pg_stat_force_next_flush()")  # counted once the statement ends
    rows = await conn.fetch(
        """SELECT indexrelname AS name, idx_scan AS reads FROM pg_stat_user_indexes
            WHERE relname = 'chunks'
           UNION ALL
           SELECT 'seq_scan', seq_scan FROM pg_stat_user_tables WHERE relname = 'chunks'"""
    )
    return {r["name"]: r["reads"] for r in rows}


async def test_new_full_text_waits_in_the_pending_list_until_flushed(
    conn: asyncpg.Connection,
) -> None:
    await _seed(conn, "org_a", {"conv_1": [f"{FILLER}; the plumber {i}" for i in range(50)]})
    assert await lexical.flush_pending(conn) > 0  # the pages the new entries took
    assert await lexical.flush_pending(conn) == 0
    assert len(await lexical.search(conn, "org_a", "plumber", 60, None)) == 50


async def test_the_indexer_flushes_the_pending_list_after_it_finished_jobs(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[int] = []
    flush = lexical.flush_pending
    called = asyncio.Event()

    async def watched_flush(conn: asyncpg.Connection) -> int:
        flushed.append(await flush(conn))
        called.set()
        return flushed[-1]

    monkeypatch.setattr(lexical, "flush_pending", watched_flush)
    monkeypatch.setattr(indexer, "FLUSH_SECONDS", 0.05)
    async with _flushing_indexer(database_url) as (pool, worker, task):
        async with pool.acquire() as conn:
            await _seed(
                conn, "org_a", {"conv_1": [f"{FILLER}; the plumber {i}" for i in range(50)]}
            )
            await asyncio.sleep(0.3)
            assert flushed == []  # nothing finished here yet: left alone
            await worker._finish([])  # as after a batch of jobs
            await asyncio.wait_for(called.wait(), 5)
            assert flushed[0] > 0
            assert await flush(conn) == 0
        assert not task.done()


async def test_the_flush_stops_for_good_where_the_role_does_not_own_the_index(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def refused(conn: asyncpg.Connection) -> int:
        raise asyncpg.InsufficientPrivilegeError("must be owner of index chunks_text_search")

    monkeypatch.setattr(lexical, "flush_pending", refused)
    monkeypatch.setattr(indexer, "FLUSH_SECONDS", 0.05)
    async with _flushing_indexer(database_url) as (_, worker, task):
        await worker._finish([])
        await asyncio.wait_for(task, 5)  # ends, without raising
    assert "OWNER TO" in caplog.text


@contextlib.asynccontextmanager
async def _flushing_indexer(
    database_url: str,
) -> AsyncIterator[tuple[asyncpg.Pool, indexer.Indexer, asyncio.Task[None]]]:
    """A pool, an Indexer whose clients are never called, and its flush task, running."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    worker = indexer.Indexer(
        pool, EmbedClient("127.0.0.1:9", 1.0), IndexRouter(["127.0.0.1:9"], 1.0)
    )
    task = asyncio.create_task(worker._keep_full_text_index())
    try:
        yield pool, worker, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await pool.close()
