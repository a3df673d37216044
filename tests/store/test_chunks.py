"""Chunk rows under concurrent writers, on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import inspect

import asyncpg

from api_service.core.ids import chunk_id
from api_service.store import admin
from api_service.store import repository as repo
from api_service.store.records import Charge, ChunkRow

FREE = Charge(storage_bytes=0, conversations=0, max_storage_bytes=0, max_conversations=0)


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


async def test_a_window_rebuilt_while_its_vector_is_stored_is_rewritten(database_url: str) -> None:
    """An append answers before its chunks' vectors are stored, so the next append to the
    conversation can rebuild a window while the indexer's UPDATE of that row is in flight.
    The rebuild waits for the row, then rewrites it with the next version and no vector."""
    writer = await asyncpg.connect(database_url)
    indexer = await asyncpg.connect(database_url)
    try:
        org_id = await _org_with_conversation(writer, "race", "conv_race")
        first = await repo.upsert_chunks(
            writer, org_id, "conv_race", [_window("conv_race", "one")], FREE
        )
        assert first is not None and first.chunks[0][1] == 1

        storing = indexer.transaction()
        await storing.start()
        await indexer.execute(  # as Indexer._finish stores a vector, left uncommitted
            "UPDATE chunks SET embedding = $3 WHERE org_id = $1 AND chunk_id = $2",
            org_id,
            first.chunks[0][0],
            b"\x00" * 3072,
        )
        rebuild = asyncio.create_task(
            repo.upsert_chunks(writer, org_id, "conv_race", [_window("conv_race", "one two")], FREE)
        )
        await asyncio.sleep(0.3)  # the rebuild now waits on the indexer's row lock
        assert not rebuild.done()
        await storing.commit()
        rebuilt = await asyncio.wait_for(rebuild, 10)
        assert rebuilt is not None and rebuilt.chunks[0][1] == 2
        row = await writer.fetchrow(
            "SELECT text, version, embedding FROM chunks WHERE org_id = $1", org_id
        )
        assert (row["text"], row["version"], row["embedding"]) == ("one two", 2, None)
    finally:
        await writer.close()
        await indexer.close()


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
    assert "ON CONFLICT (org_id, conversation_id, start_sequence)" in inspect.getsource(
        repo.upsert_chunks
    )


async def test_a_writer_that_gives_no_full_text_gets_the_text_parsed(database_url: str) -> None:
    """upsert_chunks gives each window its messages' full text; any other writer (a replica
    from before 0008, a bulk load) gets its text parsed on insert and on a change of text."""
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
            "UPDATE chunks SET text = '[user]: wombats digging' WHERE chunk_id = 'chk_fts'"
        )
        assert await conn.fetchval(words) == ["dig", "user", "wombat"]
        await conn.execute("UPDATE chunks SET embedding = '\\x00' WHERE chunk_id = 'chk_fts'")
        assert await conn.fetchval(words) == ["dig", "user", "wombat"]
    finally:
        await conn.close()
