"""Appending messages on the real PostgreSQL: one statement as a rule, and the lines the
windows need read after the lock when another writer changed the conversation meanwhile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from api_service.store import admin
from api_service.store import repository as repo
from api_service.store.records import NewMessage
from tests.store.locks import waits_for_a_lock

LINES_BEFORE = 4


class Writer:
    """A connection that appends in transactions of its own and counts its statements."""

    def __init__(self, conn: asyncpg.Connection, org_id: str, conversation_id: str) -> None:
        self.conn = conn
        self.org_id = org_id
        self.conversation_id = conversation_id
        self.queries: list[str] = []
        conn.add_query_logger(lambda record: self.queries.append(record.query))

    @property
    def statements(self) -> int:
        """Statements of the last append, its transaction's BEGIN and COMMIT left out."""
        return sum(q not in ("BEGIN;", "COMMIT;") for q in self.queries)

    async def append(
        self, *contents: str, conversation_id: str | None = None
    ) -> tuple[int, dict[int, tuple[str, str]]] | None:
        """Append user messages in a transaction; the statements it took are in `statements`."""
        self.queries.clear()
        async with self.conn.transaction():
            return await repo.append_messages(
                self.conn,
                self.org_id,
                conversation_id or self.conversation_id,
                [f"msg_{self.conversation_id}_{c}" for c in contents],
                [NewMessage("user", c) for c in contents],
                sum(len(c) for c in contents),
                LINES_BEFORE,
            )


@pytest.fixture
async def writers(database_url: str) -> AsyncIterator[tuple[Writer, Writer]]:
    """Two writers on one conversation that holds messages "1" to "6"."""
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    try:
        org = await admin.create_org(first, "org_appends", "appends", None)
        await first.execute(
            "INSERT INTO conversations (org_id, conversation_id) VALUES ($1, 'conv_a')",
            org.org_id,
        )
        ours, theirs = Writer(first, org.org_id, "conv_a"), Writer(second, org.org_id, "conv_a")
        assert await ours.append(*"123456") == (6, {})
        yield ours, theirs
    finally:
        await first.close()
        await second.close()


async def test_an_append_takes_one_statement_and_reads_the_lines_its_windows_need(
    writers: tuple[Writer, Writer],
) -> None:
    ours, _ = writers
    appended = await ours.append("7", "8")
    assert appended == (8, {s: ("user", str(s)) for s in range(3, 7)})
    assert ours.statements == 1
    stored = await ours.conn.fetch(
        "SELECT sequence, content FROM messages WHERE conversation_id = 'conv_a' ORDER BY 1"
    )
    assert [tuple(r) for r in stored] == [(s, str(s)) for s in range(1, 9)]
    assert await ours.conn.fetchval("SELECT message_count FROM conversations") == 8


async def test_an_append_that_waited_for_another_reads_its_messages(
    writers: tuple[Writer, Writer],
) -> None:
    """Its statement began before the other append committed, so it could not see that
    append's message: it gives up and reads after the lock."""
    ours, theirs = writers
    other = theirs.conn.transaction()
    await other.start()
    assert await repo.append_messages(
        theirs.conn, theirs.org_id, "conv_a", ["msg_x"], [NewMessage("user", "x")], 1, 4
    ) == (7, {s: ("user", str(s)) for s in range(3, 7)})
    waiting = asyncio.create_task(ours.append("8"))
    await waits_for_a_lock(theirs.conn, ours.conn.get_server_pid())
    await other.commit()
    assert await asyncio.wait_for(waiting, 10) == (
        8,
        {4: ("user", "4"), 5: ("user", "5"), 6: ("user", "6"), 7: ("user", "x")},
    )
    assert ours.statements == 3


async def test_an_append_that_waited_for_an_edit_reads_the_new_content(
    writers: tuple[Writer, Writer],
) -> None:
    ours, theirs = writers
    edit = theirs.conn.transaction()
    await edit.start()
    assert await repo.lock_conversation(theirs.conn, theirs.org_id, "conv_a") == 6
    message_id = "msg_conv_a_5"
    edited = await repo.replace_message_content(
        theirs.conn, theirs.org_id, "conv_a", message_id, "five, edited"
    )
    assert edited is not None
    # The change in bytes is from the old content, which the statement read as it began.
    assert (edited[0].content, edited[1]) == ("five, edited", len("five, edited") - len("5"))
    await repo.touch_conversation(theirs.conn, theirs.org_id, "conv_a", edited[1])
    waiting = asyncio.create_task(ours.append("7"))
    await waits_for_a_lock(theirs.conn, ours.conn.get_server_pid())
    await edit.commit()
    count, lines = await asyncio.wait_for(waiting, 10) or (0, {})
    assert (count, lines[5]) == (7, ("user", "five, edited"))
    assert ours.statements == 3


async def test_an_append_that_waited_for_a_lock_taken_in_vain_takes_one_statement(
    writers: tuple[Writer, Writer],
) -> None:
    """A writer that locked the row and rolled back changed nothing: the row's version is
    the one the statement began with."""
    ours, theirs = writers
    edit = theirs.conn.transaction()
    await edit.start()
    await repo.lock_conversation(theirs.conn, theirs.org_id, "conv_a")
    waiting = asyncio.create_task(ours.append("7"))
    await waits_for_a_lock(theirs.conn, ours.conn.get_server_pid())
    await edit.rollback()
    assert await asyncio.wait_for(waiting, 10) == (7, {s: ("user", str(s)) for s in range(3, 7)})
    assert ours.statements == 1


async def test_an_append_to_a_missing_conversation_inserts_nothing(
    writers: tuple[Writer, Writer],
) -> None:
    ours, _ = writers
    assert await ours.append("7", conversation_id="conv_missing") is None
    assert await ours.conn.fetchval("SELECT count(*) FROM messages") == 6


async def _messages_scans(conn: asyncpg.Connection, name: str, sql: str) -> list[dict[str, Any]]:
    """The scans of `messages` in the generic plan of `sql`, prepared as `name`."""
    params = len((await conn.prepare(sql)).get_parameters())
    await conn.execute(f"PREPARE {name} AS {sql}")
    nulls = ", ".join(["NULL"] * params)
    (plan,) = json.loads(await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({nulls})"))

    def scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if node.get("Relation Name") == "messages" and "Scan" in node["Node Type"]:
            yield node
        for child in node.get("Plans", []):
            yield from scans(child)

    return list(scans(plan["Plan"]))


async def test_statements_read_messages_by_key_on_a_table_never_analyzed(
    database_url: str,
) -> None:
    """Writes run on generic plans, which a connection keeps until the table is analyzed: on a
    new database (this test's, as on a new deployment until autovacuum first analyzes it) every
    read of messages goes to its rows by key: by sequence in the primary key, or by id in
    messages_id. The index on message ids once led with the org, and these plans read every
    message of the org through it at every append (0014); an edit once joined messages to
    itself, planned as a loop that read the conversation once for each of its messages. A page
    of messages starts at its first sequence in the key: by OFFSET it read every message
    before the page."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        statements = {
            "append_if_unchanged": repo._APPEND_IF_UNCHANGED,
            "insert_and_read": repo._INSERT_AND_READ,
            "upsert_chunks": repo._UPSERT_CHUNKS,
            "replace_content": repo._REPLACE_CONTENT,
            "message_page": repo._MESSAGE_PAGE,
        }
        keys = {"messages_pkey": "sequence", "messages_id": "message_id"}
        for name, sql in statements.items():
            scans = await _messages_scans(conn, name, sql)
            assert scans, name
            for scan in scans:
                index = scan.get("Index Name")
                assert scan["Node Type"] == "Index Scan" and index in keys, (name, scan)
                assert keys[index] in scan["Index Cond"], (name, scan)
    finally:
        await conn.close()


class _DeletesAfterInsert:
    """A connection on which the default memory is deleted, by `other`, just after the
    first INSERT: between its INSERT, which met the memory, and the read of its id."""

    def __init__(self, conn: asyncpg.Connection, other: asyncpg.Connection) -> None:
        self._conn = conn
        self._other = other
        self.deleted = False

    async def fetchval(self, sql: str, *args: Any) -> Any:
        value = await self._conn.fetchval(sql, *args)
        if sql.lstrip().startswith("INSERT") and not self.deleted:
            self.deleted = True
            await self._other.execute("DELETE FROM conversations WHERE is_default")
        return value


async def test_the_default_memory_deleted_while_it_is_found_is_made_again(
    database_url: str,
) -> None:
    conn, other = await asyncpg.connect(database_url), await asyncpg.connect(database_url)
    try:
        org = await admin.create_org(conn, "org_default", "default", None)
        assert await repo.default_conversation_id(conn, org.org_id, "conv_first", "Memory") == (
            "conv_first",
            True,
        )
        racing = _DeletesAfterInsert(conn, other)
        found = await repo.default_conversation_id(racing, org.org_id, "conv_second", "Memory")  # type: ignore[arg-type]
        assert racing.deleted
        assert found == ("conv_second", True)
        assert await conn.fetchval("SELECT conversation_id FROM conversations") == "conv_second"
    finally:
        await conn.close()
        await other.close()


async def test_the_default_memory_found_stays_until_the_append_ends(database_url: str) -> None:
    """A delete of the default memory waits for the append that found it to commit."""
    conn, other = await asyncpg.connect(database_url), await asyncpg.connect(database_url)
    try:
        org = await admin.create_org(conn, "org_kept", "kept", None)
        await repo.default_conversation_id(conn, org.org_id, "conv_kept", "Memory")
        append = conn.transaction()
        await append.start()
        assert await repo.default_conversation_id(conn, org.org_id, "conv_new", "Memory") == (
            "conv_kept",
            False,
        )
        deleting = asyncio.ensure_future(
            other.execute("DELETE FROM conversations WHERE conversation_id = 'conv_kept'")
        )
        await waits_for_a_lock(conn, other.get_server_pid())
        assert await repo.append_messages(
            conn, org.org_id, "conv_kept", ["msg_1"], [NewMessage("user", "x")], 1, 4
        ) == (1, {})
        await append.commit()
        assert await deleting == "DELETE 1"
    finally:
        await conn.close()
        await other.close()


async def test_times_follow_the_order_the_lock_gave(writers: tuple[Writer, Writer]) -> None:
    """A transaction that began first but appended second: its messages come after the
    other's in time as in sequence, and the conversation's updated_at does not go back."""
    ours, theirs = writers
    early = ours.conn.transaction()
    await early.start()
    await asyncio.sleep(0.05)
    assert await theirs.append("x")
    later = await ours.conn.fetchval("SELECT updated_at FROM conversations")
    assert await repo.append_messages(
        ours.conn, ours.org_id, "conv_a", ["msg_y"], [NewMessage("user", "y")], 1, 4
    )
    await early.commit()
    stored = await ours.conn.fetch(
        "SELECT content, created_at FROM messages WHERE conversation_id = 'conv_a'"
        " AND sequence > 6 ORDER BY sequence"
    )
    assert [r["content"] for r in stored] == ["x", "y"]
    assert stored[0]["created_at"] < stored[1]["created_at"]
    updated = await ours.conn.fetchval("SELECT updated_at FROM conversations")
    assert updated == stored[1]["created_at"] > later
