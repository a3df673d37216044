import asyncio

import asyncpg
import numpy as np
import pytest

from api_service.store.migrate import migrate, migration_files
from tests.store.locks import waits_for_a_lock


async def test_migrations_apply_once_and_name_every_file(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert await migrate(conn) == []  # the template already holds every migration
        applied = [
            r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations ORDER BY name")
        ]
        assert applied == [name for name, _ in migration_files()]
        assert applied[0] == "0001_initial.sql"
    finally:
        await conn.close()


async def test_migrate_stops_at_the_named_migration(empty_database_url: str) -> None:
    names = [name for name, _ in migration_files()]
    conn = await asyncpg.connect(empty_database_url)
    try:
        with pytest.raises(ValueError, match="no migration named"):
            await migrate(conn, through="0999_missing.sql")
        assert await migrate(conn, through=names[2]) == names[:3]
        assert await migrate(conn, through=names[1]) == []  # already past it
        assert await migrate(conn) == names[3:]
    finally:
        await conn.close()


async def test_0010_moves_the_stored_vectors_of_a_populated_database(
    empty_database_url: str,
) -> None:
    """Chunks stored before 0010 keep their vectors, each at its chunk's version; a chunk
    still waiting for its vector gets none."""
    conn = await asyncpg.connect(empty_database_url)
    try:
        await migrate(conn, through="0009_chunk_fillfactor.sql")
        await conn.execute("INSERT INTO orgs (org_id, name) VALUES ('org_a', 'a')")
        await conn.execute(
            "INSERT INTO conversations (org_id, conversation_id) VALUES ('org_a', 'conv_1')"
        )
        vector = np.arange(768, dtype="<f4").tobytes()
        await conn.executemany(
            """INSERT INTO chunks (org_id, conversation_id, start_sequence, chunk_id,
                                   end_sequence, text, version, embedding)
               VALUES ('org_a', 'conv_1', $1, $2, $1, $3, $4, $5)""",
            [
                (1, "chk_embedded", "the first window", 3, vector),
                (2, "chk_pending", "the second window", 1, None),
            ],
        )

        assert await migrate(conn, through="0010_chunk_vectors.sql") == ["0010_chunk_vectors.sql"]

        rows = await conn.fetch(
            """SELECT c.chunk_id, v.version, v.embedding
                 FROM chunk_vectors v
                 JOIN chunks c USING (org_id, conversation_id, start_sequence)"""
        )
        assert [(r["chunk_id"], r["version"], r["embedding"]) for r in rows] == [
            ("chk_embedded", 3, vector)
        ]
        # The ids and the full text are stored in the row ('m': compressed first, out of line
        # only as a last resort).
        storage = {
            r["attname"]: r["attstorage"]
            for r in await conn.fetch(
                """SELECT attname, attstorage::text FROM pg_attribute
                    WHERE attrelid = 'chunks'::regclass
                      AND attname IN ('org_id', 'conversation_id', 'chunk_id', 'text_search')"""
            )
        }
        assert storage == dict.fromkeys(
            ["org_id", "conversation_id", "chunk_id", "text_search"], "m"
        )
    finally:
        await conn.close()


async def test_0018_gives_a_default_memory_its_size(empty_database_url: str) -> None:
    """A default memory created before 0018 counted its title twice; 0018 takes one off, and
    gives back to an org what the delete of such a memory took from its total. Other
    conversations keep their sizes."""
    conn = await asyncpg.connect(empty_database_url)
    try:
        await migrate(conn, through="0017_lexical_one_ranking.sql")
        await conn.execute(
            """INSERT INTO orgs (org_id, name, storage_bytes)
               VALUES ('org_a', 'a', 14 + 5 + 14 + 7), ('org_b', 'b', 9 - 14),
                      ('org_c', 'c', -14)"""
        )
        await conn.execute(
            """INSERT INTO conversations
                      (org_id, conversation_id, title, is_default, storage_bytes)
               VALUES ('org_a', 'conv_default', 'Default memory', true, 2 * 14 + 5),
                      ('org_a', 'conv_titled', 'Default memory', false, 14 + 7),
                      ('org_b', 'conv_kept', NULL, false, 9)"""
        )

        assert await migrate(conn, through="0018_default_memory_size.sql") == [
            "0018_default_memory_size.sql"
        ]

        sizes = dict(await conn.fetch("SELECT conversation_id, storage_bytes FROM conversations"))
        assert sizes == {"conv_default": 14 + 5, "conv_titled": 14 + 7, "conv_kept": 9}
        totals = dict(await conn.fetch("SELECT org_id, storage_bytes FROM orgs"))
        assert totals == {"org_a": 14 + 5 + 14 + 7, "org_b": 9, "org_c": 0}
    finally:
        await conn.close()


async def test_0018_counts_a_write_that_commits_while_it_waits(empty_database_url: str) -> None:
    """A write under way when 0018 runs, its org already charged: the recount waits for it
    and counts its bytes. Before the recount locked the org rows, it waited on the written
    org's row with a snapshot taken before the write committed, and left the write out."""
    conn, writer = await asyncio.gather(
        asyncpg.connect(empty_database_url), asyncpg.connect(empty_database_url)
    )
    try:
        await migrate(conn, through="0017_lexical_one_ranking.sql")
        await conn.execute(
            "INSERT INTO orgs (org_id, name, storage_bytes) VALUES ('org_a', 'a', 5)"
        )
        await conn.execute(
            """INSERT INTO conversations (org_id, conversation_id, title, storage_bytes)
               VALUES ('org_a', 'conv_a', NULL, 5)"""
        )
        write = writer.transaction()
        await write.start()
        await writer.execute(  # an append: its conversation, then its org, last
            "UPDATE conversations SET storage_bytes = storage_bytes + 7 WHERE org_id = 'org_a'"
        )
        await writer.execute("UPDATE orgs SET storage_bytes = storage_bytes + 7")

        migrating = asyncio.ensure_future(migrate(conn, through="0018_default_memory_size.sql"))
        await waits_for_a_lock(writer, conn.get_server_pid())
        await write.commit()
        assert await migrating == ["0018_default_memory_size.sql"]

        assert await conn.fetchval("SELECT storage_bytes FROM orgs") == 5 + 7
    finally:
        await asyncio.gather(conn.close(), writer.close())


async def test_0019_counts_each_org_s_messages(empty_database_url: str) -> None:
    """Orgs start with the messages their conversations hold; plans made before 0019 get the
    default message limit."""
    conn = await asyncpg.connect(empty_database_url)
    try:
        await migrate(conn, through="0018_default_memory_size.sql")
        await conn.execute(
            """INSERT INTO plans (name, monthly_requests, storage_bytes, max_conversations)
               VALUES ('team', 10, 10, 10)"""
        )
        await conn.execute("INSERT INTO orgs (org_id, name) VALUES ('org_a', 'a'), ('org_b', 'b')")
        await conn.execute(
            """INSERT INTO conversations (org_id, conversation_id, message_count)
               VALUES ('org_a', 'conv_1', 3), ('org_a', 'conv_2', 4)"""
        )

        assert await migrate(conn, through="0019_message_limit.sql") == ["0019_message_limit.sql"]

        counts = dict(await conn.fetch("SELECT org_id, message_count FROM orgs"))
        assert counts == {"org_a": 7, "org_b": 0}
        assert await conn.fetchval("SELECT max_messages FROM plans") == 10_000_000
    finally:
        await conn.close()
