"""Chunk rows under concurrent writers, on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest

from api_service import indexer
from api_service.auth import Principal
from api_service.clients import EmbedClient, IndexRouter
from api_service.core.ids import chunk_id
from api_service.core.memory import MemoryService
from api_service.settings import Limits
from api_service.store import admin
from api_service.store import repository as repo
from api_service.store.db import create_pool, write_transaction
from api_service.store.records import Charge, ChunkRow, NewMessage

WHO = Principal("org_plans", "key_plans", frozenset({"read", "write"}))
FREE = Charge(
    storage_bytes=0,
    conversations=0,
    messages=0,
    max_storage_bytes=0,
    max_conversations=0,
    max_messages=0,
)


def _window(conversation_id: str, text: str) -> ChunkRow:
    return ChunkRow(chunk_id(conversation_id, 1), conversation_id, 1, 3, text)


async def _org_with_conversation(conn: asyncpg.Connection, name: str, conversation_id: str) -> str:
    org = await admin.create_org(conn, f"org_{name}", name, None)
    await conn.execute(
        "INSERT INTO conversations (org_id, conversation_id) VALUES ($1, $2)",
        org.org_id,
        conversation_id,
    )
    return org.org_id


async def _org_with_window(conn: asyncpg.Connection, name: str, text: str) -> tuple[str, str]:
    """A new org whose one conversation, conv_NAME, has one window of `text`: (org, chunk)."""
    conversation_id = f"conv_{name}"
    org_id = await _org_with_conversation(conn, name, conversation_id)
    queued = await repo.upsert_chunks(
        conn, org_id, conversation_id, [_window(conversation_id, text)], FREE
    )
    assert queued is not None and queued.chunks[0][1] == 1
    return org_id, queued.chunks[0][0]


STORE_VECTOR = """
INSERT INTO chunk_vectors (org_id, conversation_id, start_sequence, version, embedding)
SELECT org_id, conversation_id, start_sequence, version, $3 FROM chunks
 WHERE org_id = $1 AND chunk_id = $2"""
CURRENT_VECTOR = """
SELECT c.version, v.embedding FROM chunks c
  LEFT JOIN chunk_vectors v USING (org_id, conversation_id, start_sequence, version)
 WHERE c.org_id = $1 AND c.chunk_id = $2"""


async def test_a_window_rebuilt_while_its_vector_is_stored_does_not_wait(
    database_url: str,
) -> None:
    """An append answers before its chunks' vectors are stored, so the next append to the
    conversation can rebuild a window while the indexer stores that window's vector. The
    rebuild goes ahead at once, and the stored vector, of the old text, no longer counts."""
    writer = await asyncpg.connect(database_url)
    indexer = await asyncpg.connect(database_url)
    try:
        org_id, chunk = await _org_with_window(writer, "race", "one")

        storing = indexer.transaction()
        await storing.start()
        await indexer.execute(STORE_VECTOR, org_id, chunk, b"\x00" * 3072)  # left uncommitted
        rebuild = repo.upsert_chunks(
            writer, org_id, "conv_race", [_window("conv_race", "one two")], FREE
        )
        rebuilt = await asyncio.wait_for(rebuild, 5)
        await storing.commit()
        assert rebuilt is not None and rebuilt.chunks[0][1] == 2
        assert tuple(await writer.fetchrow(CURRENT_VECTOR, org_id, chunk)) == (2, None)
        assert await writer.fetchval("SELECT version FROM chunk_vectors") == 1
    finally:
        await writer.close()
        await indexer.close()


async def test_a_vector_the_previous_release_stores_in_the_chunk_row_is_copied(
    database_url: str,
) -> None:
    """Pods of the release before 0010 store a vector by updating chunks.embedding; it lands
    in chunk_vectors too, with the row's version, and stays where those pods read it."""
    conn = await asyncpg.connect(database_url)
    try:
        org_id, chunk = await _org_with_window(conn, "legacy", "one")
        vector = b"\x01" * 3072
        await conn.execute(
            "UPDATE chunks c SET embedding = $3 WHERE org_id = $1 AND chunk_id = $2",
            org_id,
            chunk,
            vector,
        )
        assert tuple(await conn.fetchrow(CURRENT_VECTOR, org_id, chunk)) == (1, vector)
        legacy = await conn.fetchval("SELECT embedding FROM chunks WHERE org_id = $1", org_id)
        assert legacy == vector
    finally:
        await conn.close()


async def test_a_deleted_conversation_takes_its_vectors_along(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        org_id, chunk = await _org_with_window(conn, "gone", "one")
        await conn.execute(STORE_VECTOR, org_id, chunk, b"\x00" * 3072)
        count = "SELECT count(*) FROM chunk_vectors WHERE org_id = $1"
        assert await conn.fetchval(count, org_id) == 1
        await conn.execute("DELETE FROM conversations WHERE org_id = $1", org_id)
        assert await conn.fetchval(count, org_id) == 0
    finally:
        await conn.close()


async def test_the_indexer_stores_a_vector_in_one_statement_that_does_not_wait_for_the_wal(
    database_url: str,
) -> None:
    """The indexer stores vectors with synchronous commit off, turned off from inside its one
    statement: its WAL is not flushed at the commit (the WAL writer does it, within 200 ms).
    Another backend's commit can flush it first, so one store in five is enough to show it."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    worker = indexer.Indexer(
        pool, EmbedClient("127.0.0.1:9", 1.0), IndexRouter(["127.0.0.1:9"], 1.0)
    )
    lags = []
    try:
        async with pool.acquire() as conn:
            org_id, chunk = await _org_with_window(conn, "async_commit", "one")
        for version in range(1, 6):
            if version > 1:  # a new version of the window, for the next vector
                async with pool.acquire() as conn:
                    await repo.upsert_chunks(
                        conn,
                        org_id,
                        "conv_async_commit",
                        [_window("conv_async_commit", str(version))],
                        FREE,
                    )
            blob = bytes([version]) * 3072
            stored = indexer._Chunk(chunk, "conv_async_commit", version, "", None)
            await worker._store_vectors(org_id, [stored], [blob])
            lags.append(
                await pool.fetchval(
                    "SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()"
                )
            )
            assert tuple(await pool.fetchrow(CURRENT_VECTOR, org_id, chunk)) == (version, blob)
    finally:
        await pool.close()
    assert any(lags)


async def test_a_vector_is_stored_as_it_is_in_its_row(database_url: str) -> None:
    """A model's vectors never compress, so PostgreSQL's try at each was wasted (0012). A
    vector that would compress well (zeros; the hashing embedder's are sparse) shows that no
    try is made, and the row keeps it: no TOAST value."""
    conn = await asyncpg.connect(database_url)
    try:
        org_id, chunk = await _org_with_window(conn, "stored_whole", "one")
        await conn.execute(STORE_VECTOR, org_id, chunk, b"\x00" * 3072)
        stored = await conn.fetchrow(
            "SELECT pg_column_compression(embedding) AS compression, "
            "       pg_column_size(embedding) AS size "
            "FROM chunk_vectors WHERE org_id = $1",
            org_id,
        )
        toast = await conn.fetchval(
            "SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'chunk_vectors'"
        )
        toasted = await conn.fetchval(f"SELECT count(*) FROM {toast}")
    finally:
        await conn.close()
    assert stored["compression"] is None
    assert stored["size"] == 3072 + 4  # the bytes and a 4-byte header, in the row
    assert toasted == 0


async def test_a_large_window_puts_only_its_text_out_of_line(database_url: str) -> None:
    """Org-wide lexical search reads each match's full text and id with its row (0010): with
    the full text out of line it read the TOAST index and pages too, twice the time from disk
    at 1M chunks; with the id out of line, grouping the matches by chunk went through TOAST."""
    conn = await asyncpg.connect(database_url)
    try:
        toast = await conn.fetchval(
            "SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'chunks'"
        )
        values = f"SELECT count(DISTINCT chunk_id) FROM {toast}"  # TOAST values, not chunks
        before = await conn.fetchval(values)
        words = " ".join(f"w{i:04d}" for i in range(400))  # a 4 KB full text
        org_id, _ = await _org_with_window(conn, "toast", words)
        sizes = await conn.fetchrow(
            "SELECT pg_column_size(text_search) AS full_text, pg_column_size(c.*) AS row "
            "FROM chunks c WHERE org_id = $1",
            org_id,
        )
        assert sizes["full_text"] > 2048 and sizes["row"] > sizes["full_text"]
        assert await conn.fetchval(values) == before + 1  # the text alone
    finally:
        await conn.close()


async def test_chunks_have_one_unique_index_the_one_upserts_name(database_url: str) -> None:
    """ON CONFLICT settles conflicts on the index it names only. With chunks_id unique too, a
    rebuild racing the indexer's store of the same row's vector once failed with a unique
    violation on chunks_id (a 500, at 370k chunks in the e2e benchmark, PostgreSQL 18)."""
    conn = await asyncpg.connect(database_url)
    try:
        unique = await conn.fetch(
            "SELECT indexrelid::regclass::text AS name, "
            "       pg_get_indexdef(indexrelid) AS definition "
            "FROM pg_index WHERE indrelid = 'chunks'::regclass AND indisunique"
        )
    finally:
        await conn.close()
    assert [r["name"] for r in unique] == ["chunks_pkey"]
    assert "(org_id, conversation_id, start_sequence)" in unique[0]["definition"]
    assert "ON CONFLICT (org_id, conversation_id, start_sequence)" in repo._UPSERT_CHUNKS


async def test_a_writer_that_gives_no_full_text_gets_the_text_parsed(database_url: str) -> None:
    """upsert_chunks gives each window its messages' full text; a writer that gives none (a
    bulk load) gets the text parsed, on insert or on an update that sets the full text NULL.
    An update that gives a full text keeps it, as upsert_chunks' rebuilds may (0011)."""
    conn = await asyncpg.connect(database_url)
    try:
        org_id = await _org_with_conversation(conn, "fts", "conv_fts")
        await conn.execute(
            "INSERT INTO chunks (org_id, conversation_id, start_sequence, chunk_id, end_sequence,"
            " text) VALUES ($1, 'conv_fts', 1, 'chk_fts', 1, '[user]: quokkas smiling')",
            org_id,
        )
        words = "SELECT tsvector_to_array(text_search) FROM chunks WHERE chunk_id = 'chk_fts'"
        assert await conn.fetchval(words) == ["quokka", "smile", "user"]
        await conn.execute(
            "UPDATE chunks SET text = '[user]: wombats digging', text_search = NULL "
            "WHERE chunk_id = 'chk_fts'"
        )
        assert await conn.fetchval(words) == ["dig", "user", "wombat"]
        await conn.execute(
            "UPDATE chunks SET text = '[user]: wombats digging deep' WHERE chunk_id = 'chk_fts'"
        )
        assert await conn.fetchval(words) == ["dig", "user", "wombat"]
    finally:
        await conn.close()


LZ4_COLUMNS = [
    ("conversations", "metadata"),
    ("messages", "content"),
    ("messages", "metadata"),
    ("chunks", "text"),
    ("chunk_vectors", "embedding"),
]


async def test_conversation_text_is_compressed_with_lz4_where_the_server_has_it(
    database_url: str,
) -> None:
    """lz4 compresses in a fraction of pglz's time (0013); a server built without it (the
    embedded one) keeps pglz, and the migration still applies. The chunks' full text is left
    to the default, which stores it as it is (lexical search reads it for every match)."""
    conn = await asyncpg.connect(database_url)
    try:
        offered = await conn.fetchval(
            "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        methods = {
            (r["table"], r["column"]): r["method"]
            for r in await conn.fetch(
                "SELECT attrelid::regclass::text AS table, attname AS column, "
                "       attcompression::text AS method "
                "FROM pg_attribute WHERE attrelid = ANY ($1::regclass[]) AND attnum > 0",
                ["conversations", "messages", "chunks", "chunk_vectors"],
            )
        }
        text = " ".join(["a window that repeats itself"] * 200)  # 5.8 KB, compressible
        org_id, _ = await _org_with_window(conn, "lz4", text)
        await conn.execute(
            "INSERT INTO messages (org_id, conversation_id, sequence, message_id, role, content)"
            " VALUES ($1, 'conv_lz4', 1, 'msg_lz4', 'user', $2)",
            org_id,
            text,
        )
        used = await conn.fetchrow(
            "SELECT (SELECT pg_column_compression(text) FROM chunks WHERE org_id = $1) AS chunk,"
            "       (SELECT pg_column_compression(content) FROM messages WHERE org_id = $1)"
            "           AS message",
            org_id,
        )
    finally:
        await conn.close()
    lz4 = "lz4" in offered
    assert {column: methods[column] for column in LZ4_COLUMNS} == dict.fromkeys(
        LZ4_COLUMNS, "l" if lz4 else ""
    )
    assert methods[("chunks", "text_search")] == ""  # the server's default: pglz
    expected = "lz4" if lz4 else "pglz"
    assert (used["chunk"], used["message"]) == (expected, expected)


async def window_upsert_plans(conn: asyncpg.Connection | asyncpg.Pool) -> asyncpg.Record:
    """(generic_plans, custom_plans) of the window upsert prepared on the connection."""
    return await conn.fetchrow(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
        repo._UPSERT_CHUNKS,
    )


async def test_a_write_transaction_plans_the_window_upsert_once(database_url: str) -> None:
    """In a write transaction the window upsert runs on its generic plan: PostgreSQL, left to
    choose, planned it anew at every call (0.37 ms a write)."""
    conn = await asyncpg.connect(database_url)
    try:
        org_id, _ = await _org_with_window(conn, "plans", "v1")
        before = await window_upsert_plans(conn)
        for version in range(2, 10):
            async with write_transaction(conn):
                await repo.upsert_chunks(
                    conn, org_id, "conv_plans", [_window("conv_plans", f"v{version}")], FREE
                )
        after = await window_upsert_plans(conn)
        assert (after["generic_plans"] - before["generic_plans"], after["custom_plans"]) == (
            8,
            before["custom_plans"],
        )
        # The setting ends with the transaction.
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
    finally:
        await conn.close()


async def test_appends_and_edits_write_on_generic_plans(database_url: str) -> None:
    """The service's appends and message edits go through write_transaction: on its one
    connection the window upsert never had a custom plan."""
    pool = await create_pool(database_url, 1, 1)
    try:
        async with pool.acquire() as conn:
            await admin.create_org(conn, WHO.org_id, "a", None)
        # Appends and edits ask no semantic index.
        memory = MemoryService(pool, Limits(), semantic=None)  # type: ignore[arg-type]
        cid = (await memory.create_conversation(WHO))["conversation_id"]
        for i in range(7):
            appended = await memory.append_messages(WHO, cid, [NewMessage("user", f"note {i}")])
        await memory.update_message(WHO, cid, appended["message_ids"][0], "note six, edited")
        plans = await window_upsert_plans(pool)
        assert tuple(plans) == (8, 0)
    finally:
        await pool.close()


async def test_a_write_transaction_refuses_to_nest_and_to_commit_a_failed_statement(
    database_url: str,
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            with pytest.raises(asyncpg.InterfaceError, match="inside another transaction"):
                async with write_transaction(conn):
                    pass
        with pytest.raises(asyncpg.InterfaceError, match="rolled back"):
            async with write_transaction(conn):
                with contextlib.suppress(asyncpg.UndefinedTableError):
                    await conn.execute("SELECT * FROM no_such_table")
        assert not conn.is_in_transaction()
    finally:
        await conn.close()


async def test_a_write_transaction_commits_what_completes_and_rolls_back_what_raises(
    database_url: str,
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        org_id, _ = await _org_with_window(conn, "rollback", "kept")
        with pytest.raises(RuntimeError):
            async with write_transaction(conn):
                await repo.upsert_chunks(
                    conn, org_id, "conv_rollback", [_window("conv_rollback", "lost")], FREE
                )
                raise RuntimeError("the write fails")
        assert not conn.is_in_transaction()
        text = "SELECT text FROM chunks WHERE org_id = $1"
        assert await conn.fetchval(text, org_id) == "kept"
        async with write_transaction(conn):
            await repo.upsert_chunks(
                conn, org_id, "conv_rollback", [_window("conv_rollback", "new")], FREE
            )
        assert await conn.fetchval(text, org_id) == "new"
    finally:
        await conn.close()
