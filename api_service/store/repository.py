"""Tenant data access: plain SQL with $n parameters; every query is scoped by org_id."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import asyncpg

from api_service.store.db import Conn
from api_service.store.records import (
    Charge,
    ChunkRow,
    Conversation,
    Message,
    NewMessage,
    QueuedChunks,
)

SortKey = Literal["created_at", "updated_at", "message_count"]
Order = Literal["asc", "desc"]

_CONVERSATION_COLUMNS = (
    "org_id, conversation_id, title, agent_id, tags, metadata, message_count, "
    "created_at, updated_at"
)
_MESSAGE_COLUMNS = (
    "conversation_id, message_id, sequence, role, content, tool_call_id, tool_name, metadata, "
    "created_at"
)


def _conversation(row: asyncpg.Record) -> Conversation:
    return Conversation(**dict(row))


def _message(row: asyncpg.Record) -> Message:
    return Message(**dict(row))


async def insert_conversation(
    conn: Conn,
    org_id: str,
    conversation_id: str,
    *,
    title: str | None,
    agent_id: str | None,
    tags: list[str],
    metadata: dict[str, Any],
    storage_bytes: int,
) -> None:
    await conn.execute(
        """INSERT INTO conversations
               (org_id, conversation_id, title, agent_id, tags, metadata, storage_bytes)
           VALUES ($1, $2, $3, $4, $5, $6, $7)""",
        org_id,
        conversation_id,
        title,
        agent_id,
        tags,
        metadata,
        storage_bytes,
    )


async def default_conversation_id(
    conn: Conn, org_id: str, new_id: str, title: str
) -> tuple[str, bool]:
    """The org's default memory, created on first use; True when created now. It is created
    with a size of 0: the append that creates it adds its title's bytes with its messages'.
    Either way its row stays locked until the caller's transaction ends, so a delete cannot
    take it away from the append under way."""
    while True:
        created = await conn.fetchval(
            """INSERT INTO conversations
                   (org_id, conversation_id, title, metadata, is_default, storage_bytes)
               VALUES ($1, $2, $3, '{"default": true}'::jsonb, true, 0)
               ON CONFLICT (org_id) WHERE is_default DO NOTHING
               RETURNING conversation_id""",
            org_id,
            new_id,
            title,
        )
        if created is not None:
            return str(created), True
        found = await conn.fetchval(
            "SELECT conversation_id FROM conversations WHERE org_id = $1 AND is_default "
            "FOR NO KEY UPDATE",
            org_id,
        )
        if found is not None:
            return str(found), False
        # The memory the INSERT met was deleted before this read: create it again.


async def get_conversation(conn: Conn, org_id: str, conversation_id: str) -> Conversation | None:
    row = await conn.fetchrow(
        f"SELECT {_CONVERSATION_COLUMNS} FROM conversations "
        "WHERE org_id = $1 AND conversation_id = $2",
        org_id,
        conversation_id,
    )
    return None if row is None else _conversation(row)


async def list_conversations(
    conn: Conn,
    org_id: str,
    *,
    limit: int,
    offset: int,
    agent_id: str | None,
    tags: list[str] | None,
    sort: SortKey,
    order: Order,
) -> tuple[list[Conversation], int]:
    """A page of conversations and the total that match the filters."""
    # sort and order are validated literals, never caller text, so they may be formatted in.
    direction = "ASC" if order == "asc" else "DESC"
    where = "org_id = $1 AND ($2::text IS NULL OR agent_id = $2) AND tags @> $3::text[]"
    args: list[Any] = [org_id, agent_id, tags or []]
    rows = await conn.fetch(
        f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE {where} "
        f"ORDER BY {sort} {direction}, conversation_id {direction} LIMIT $4 OFFSET $5",
        *args,
        limit,
        offset,
    )
    total: int = await conn.fetchval(f"SELECT count(*) FROM conversations WHERE {where}", *args)
    return [_conversation(r) for r in rows], total


async def delete_conversation(
    conn: Conn, org_id: str, conversation_id: str
) -> tuple[int, int] | None:
    """Delete the conversation (messages and chunks go with it, ON DELETE CASCADE); return the
    bytes and messages it held, or None if there was no such conversation."""
    row = await conn.fetchrow(
        "DELETE FROM conversations WHERE org_id = $1 AND conversation_id = $2 "
        "RETURNING storage_bytes, message_count",
        org_id,
        conversation_id,
    )
    return None if row is None else (int(row[0]), int(row[1]))


def _charge_sql(first: int) -> str:
    """The UPDATE that adds a Charge to org $1 unless a growing total would pass its limit;
    the Charge's parameters are ${first}..${first + 5}, in Charge.params order. It holds the
    org row's lock until commit: run it last in a write's transaction."""
    added, conversations, messages, max_bytes, max_conversations, max_messages = (
        f"${first + i}" for i in range(6)
    )
    return f"""UPDATE orgs SET storage_bytes = storage_bytes + {added},
                               conversation_count = conversation_count + {conversations},
                               message_count = message_count + {messages}
                WHERE org_id = $1
                  AND ({added} <= 0 OR storage_bytes + {added} <= {max_bytes})
                  AND ({conversations} <= 0
                       OR conversation_count + {conversations} <= {max_conversations})
                  AND ({messages} <= 0 OR message_count + {messages} <= {max_messages})
            RETURNING org_id"""


async def charge_org(conn: Conn, org_id: str, charge: Charge) -> bool:
    """Add `charge` to the org's totals; False if it would pass a limit (nothing is added).
    Run it last in a write's transaction: it holds the org row's lock until commit."""
    done = await conn.fetchval(_charge_sql(2), org_id, *charge.params())
    return done is not None


# A conversation's writers queue on its row lock: their times are read once they hold it
# (now() is when the transaction began, and one that began first may get the lock second), so
# messages are in the same order by time as by sequence, and updated_at never goes back.
_LOCKED_NOW = "greatest(updated_at, clock_timestamp())"

# Reserves $3 sequences of a conversation and adds $4 bytes to its size, under its row lock.
_RESERVE = f"""
    UPDATE conversations
       SET message_count = message_count + $3, storage_bytes = storage_bytes + $4,
           updated_at = {_LOCKED_NOW}
     WHERE org_id = $1 AND conversation_id = $2"""

# Inserts the messages of $5-$10 (unnest's arrays) from sequence {first}, for each of {rows},
# at the time _RESERVE set.
_INSERT_MESSAGES = """
    INSERT INTO messages (org_id, conversation_id, sequence, message_id, role, content,
                          tool_call_id, tool_name, metadata, created_at)
    SELECT $1, $2, {first} + m.i - 1, m.message_id, m.role, m.content, m.tool_call_id,
           m.tool_name, m.metadata::jsonb, {at}
      FROM {rows}unnest($5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[])
           WITH ORDINALITY AS m(message_id, role, content, tool_call_id, tool_name, metadata, i)"""

# The whole append, if the conversation's row is still the version this statement sees
# (xmin: the transaction that wrote it); else it changes nothing and returns no row. Then the
# $11 lines before the new messages, as that version saw them: read in a subquery of its own
# (the LIMIT keeps it one), which its plan bounds by sequence in the primary key. Joined
# directly, a generic plan made while the table was never analyzed read every message of the
# conversation and filtered them (tests/store/test_appends.py, 0014).
_APPEND_IF_UNCHANGED = f"""
    WITH seen AS (SELECT xmin FROM conversations WHERE org_id = $1 AND conversation_id = $2),
    reserved AS ({_RESERVE} AND xmin = (SELECT xmin FROM seen)
              RETURNING message_count - $3 + 1 AS first, updated_at AS at),
    inserted AS ({_INSERT_MESSAGES.format(first="r.first", rows="reserved r, ", at="r.at")})
    SELECT r.first + $3 - 1 AS count, m.sequence, m.role, m.content
      FROM reserved r LEFT JOIN LATERAL (
           SELECT sequence, role, content FROM messages
            WHERE org_id = $1 AND conversation_id = $2
              AND sequence >= r.first - $11 AND sequence < r.first
            LIMIT $11) m ON true"""

# The messages from sequence $3 on, at the time $11, once _RESERVE took the lock and set it;
# then the $4 lines before.
_INSERT_AND_READ = f"""
    WITH inserted AS ({_INSERT_MESSAGES.format(first="$3::int", rows="", at="$11::timestamptz")})
    SELECT sequence, role, content FROM messages
     WHERE org_id = $1 AND conversation_id = $2
       AND sequence >= $3 - $4::integer AND sequence < $3"""


async def append_messages(
    conn: Conn,
    org_id: str,
    conversation_id: str,
    message_ids: Sequence[str],
    messages: Sequence[NewMessage],
    storage_bytes: int,
    lines_before: int,
) -> tuple[int, dict[int, tuple[str, str]]] | None:
    """Give the messages the conversation's next sequences and insert them, under its row
    lock (concurrent appends queue on it, so sequences stay gapless). Returns the new message
    count and the lines (sequence -> (role, content)) of up to `lines_before` stored messages
    before them, which the windows they join also hold; None if there is no such conversation.

    One statement when no other writer changed the conversation since the statement began,
    which is the rule. Otherwise (the statement waited for the lock) its view of the earlier
    lines may be stale: it gives up, and the append takes two statements, the second of which
    reads after the lock. Every writer of a conversation's messages updates its row in the
    same transaction, so the row's version tells."""
    values = _message_values(message_ids, messages)
    n = len(messages)
    rows = await conn.fetch(
        _APPEND_IF_UNCHANGED, org_id, conversation_id, n, storage_bytes, *values, lines_before
    )
    if rows:
        return rows[0]["count"], _lines(rows)
    reserved = await conn.fetchrow(
        _RESERVE + " RETURNING message_count, updated_at", org_id, conversation_id, n, storage_bytes
    )
    if reserved is None:
        return None
    count: int = reserved["message_count"]
    rows = await conn.fetch(
        _INSERT_AND_READ,
        org_id,
        conversation_id,
        count - n + 1,
        lines_before,
        *values,
        reserved["updated_at"],
    )
    return count, _lines(rows)


def _lines(rows: list[asyncpg.Record]) -> dict[int, tuple[str, str]]:
    """sequence -> (role, content) of the rows that hold a message (the one-statement
    append's LEFT JOIN gives a row without one where there are no earlier lines)."""
    return {r["sequence"]: (r["role"], r["content"]) for r in rows if r["sequence"] is not None}


def _message_values(message_ids: Sequence[str], messages: Sequence[NewMessage]) -> list[Any]:
    """The arrays _INSERT_MESSAGES unnests."""
    return [
        list(message_ids),
        [m.role for m in messages],
        [m.content for m in messages],
        [m.tool_call_id for m in messages],
        [m.tool_name for m in messages],
        [None if m.metadata is None else json.dumps(m.metadata) for m in messages],
    ]


# A page of $3 messages after the first $4. Sequences run 1..message_count without gaps, so
# the page starts right after sequence $4, found in the primary key: OFFSET would read every
# message it skips.
_MESSAGE_PAGE = f"""
    SELECT {_MESSAGE_COLUMNS} FROM messages
     WHERE org_id = $1 AND conversation_id = $2 AND sequence > $4
     ORDER BY sequence LIMIT $3"""


async def get_messages(
    conn: Conn, org_id: str, conversation_id: str, *, limit: int, offset: int
) -> list[Message]:
    rows = await conn.fetch(_MESSAGE_PAGE, org_id, conversation_id, limit, offset)
    return [_message(r) for r in rows]


async def message_lines(
    conn: Conn, org_id: str, conversation_id: str, first: int, last: int
) -> dict[int, tuple[str, str]]:
    """sequence -> (role, content) for sequences in [first, last]."""
    rows = await conn.fetch(
        "SELECT sequence, role, content FROM messages "
        "WHERE org_id = $1 AND conversation_id = $2 AND sequence BETWEEN $3 AND $4",
        org_id,
        conversation_id,
        first,
        last,
    )
    return {r["sequence"]: (r["role"], r["content"]) for r in rows}


async def lock_conversation(conn: Conn, org_id: str, conversation_id: str) -> int | None:
    """Lock the conversation row (serializing with appends); return its message count."""
    count: int | None = await conn.fetchval(
        "SELECT message_count FROM conversations WHERE org_id = $1 AND conversation_id = $2 "
        "FOR UPDATE",
        org_id,
        conversation_id,
    )
    return count


# Replaces the content of message $3 and returns it with the change in bytes. The message is
# found by its id, and its old content read by sequence in a subquery, which sees the row as
# the statement began. The conversation is locked first (lock_conversation), so no other edit
# runs between. Written as a join of messages to itself, a generic plan made while the table
# was never analyzed read the conversation once for each of its messages: 1.35 s an edit in a
# conversation of 2,000 (tests/store/test_appends.py).
_REPLACE_CONTENT = f"""
    UPDATE messages m SET content = $4
     WHERE m.message_id = $3 AND m.org_id = $1 AND m.conversation_id = $2
 RETURNING {", ".join("m." + c.strip() for c in _MESSAGE_COLUMNS.split(","))},
           octet_length($4) - (SELECT octet_length(old.content) FROM messages old
                                WHERE old.org_id = m.org_id
                                  AND old.conversation_id = m.conversation_id
                                  AND old.sequence = m.sequence) AS delta"""


async def replace_message_content(
    conn: Conn, org_id: str, conversation_id: str, message_id: str, content: str
) -> tuple[Message, int] | None:
    """Replace a message's content; return the updated message and the change in bytes. Run
    it under the conversation's lock (lock_conversation)."""
    row = await conn.fetchrow(_REPLACE_CONTENT, org_id, conversation_id, message_id, content)
    if row is None:
        return None
    values = dict(row)
    delta: int = values.pop("delta")
    return Message(**values), delta


async def touch_conversation(
    conn: Conn, org_id: str, conversation_id: str, storage_delta: int
) -> None:
    await conn.execute(
        f"UPDATE conversations SET updated_at = {_LOCKED_NOW}, "
        "storage_bytes = storage_bytes + $3 WHERE org_id = $1 AND conversation_id = $2",
        org_id,
        conversation_id,
        storage_delta,
    )


# A tsvector holds at most 1 MB of lexemes and positions, and five messages' full text joined
# can pass that (five 100k-character messages of distinct CJK words do): the append would
# fail. A window's full text takes at most about 5 bytes a byte of text (a hyphenated word is
# indexed whole and by its parts: `a-b ` makes 20 bytes of tsvector), so a window of up to
# 100 KB joins its messages' full text outright. A larger one joins it while the messages'
# stored full text adds up to under the limit (joining only merges; a value compressed before
# 0008 made it uncompressed does not tell its size and counts as over), and otherwise has its
# first 64k characters parsed (at most about 8 bytes of tsvector a character), its words past
# them left out. (The chunk trigger parses the same 64k characters for a writer that gives
# no full text: migration 0011.)
_JOINED_FULL_TEXT_BYTES = 100_000
_TSVECTOR_BYTES = 1_048_575
_CAPPED_FULL_TEXT_CHARS = 64_000


# Inserts or rebuilds the windows of conversation $2 ($3-$6: unnest's arrays), queues them for
# indexing ($7: seconds leased to the caller) and charges the org ($8-$13); see upsert_chunks.
_UPSERT_CHUNKS = f"""
    WITH written AS (
        INSERT INTO chunks (org_id, conversation_id, start_sequence, chunk_id,
                            end_sequence, text, text_search)
        SELECT $1, $2, c.start_sequence, c.chunk_id, c.end_sequence, c.text,
               CASE WHEN octet_length(c.text) <= {_JOINED_FULL_TEXT_BYTES}
                      OR (SELECT CASE WHEN bool_and(
                                         pg_column_compression(m.text_search) IS NULL)
                                      THEN sum(pg_column_size(m.text_search)) END
                            FROM messages m
                           WHERE m.org_id = $1 AND m.conversation_id = $2
                             AND m.sequence BETWEEN c.start_sequence
                                                AND c.end_sequence)
                         <= {_TSVECTOR_BYTES}
               THEN (SELECT tsvector_agg(m.text_search ORDER BY m.sequence)
                       FROM messages m
                      WHERE m.org_id = $1 AND m.conversation_id = $2
                        AND m.sequence BETWEEN c.start_sequence AND c.end_sequence)
               ELSE to_tsvector('english', left(c.text, {_CAPPED_FULL_TEXT_CHARS}))
               END
          FROM unnest($3::int[], $4::text[], $5::int[], $6::text[])
               AS c(start_sequence, chunk_id, end_sequence, text)
        ON CONFLICT (org_id, conversation_id, start_sequence) DO UPDATE
           SET end_sequence = excluded.end_sequence, text = excluded.text,
               text_search = excluded.text_search, version = chunks.version + 1,
               embedding = NULL, -- for the previous release's pods (0010)
               updated_at = now()
        RETURNING chunk_id, version),
    job AS (
        INSERT INTO index_outbox (org_id, kind, conversation_id, chunk_ids, run_after)
        VALUES ($1, 'upsert', $2, $4::text[], now() + make_interval(secs => $7))
        RETURNING job_id),
    charged AS ({_charge_sql(8)})
    SELECT job.job_id, array_agg(written.chunk_id) AS chunk_ids,
           array_agg(written.version) AS versions,
           EXISTS (SELECT 1 FROM charged) AS charged
      FROM job, written GROUP BY job.job_id"""


async def upsert_chunks(
    conn: Conn,
    org_id: str,
    conversation_id: str,
    chunks: Sequence[ChunkRow],
    charge: Charge,
    leased_seconds: float = 0.0,
) -> QueuedChunks | None:
    """Insert or rebuild windows (a rebuilt window gets the next version, which its stored
    vector no longer matches), queue them for indexing and add the write's `charge` to the
    org, in one statement; None if the charge would pass a limit (the caller's transaction
    must then roll back). A window's full text is its stored messages' concatenated: its
    `text` must be their lines (0008_message_text_search.sql). `leased_seconds` > 0 keeps the
    job from the background indexer that long: the caller indexes the chunks itself. The org
    row stays locked until commit: run it last."""
    (row,) = await conn.fetch(  # one job, one row
        _UPSERT_CHUNKS,
        org_id,
        conversation_id,
        [c.start_sequence for c in chunks],
        [c.chunk_id for c in chunks],
        [c.end_sequence for c in chunks],
        [c.text for c in chunks],
        leased_seconds,
        *charge.params(),
    )
    if not row["charged"]:
        return None
    versions = dict(zip(row["chunk_ids"], row["versions"], strict=True))
    return QueuedChunks(
        job_id=row["job_id"],
        org_id=org_id,
        conversation_id=conversation_id,
        chunks=[(c.chunk_id, versions[c.chunk_id], c.text) for c in chunks],
    )


async def enqueue_delete_job(conn: Conn, org_id: str, conversation_id: str) -> int:
    """Queue the removal of a deleted conversation's vectors from the index (upsert jobs are
    queued by `upsert_chunks`, in the statement that writes the chunks)."""
    job_id: int = await conn.fetchval(
        "INSERT INTO index_outbox (org_id, kind, conversation_id) "
        "VALUES ($1, 'delete', $2) RETURNING job_id",
        org_id,
        conversation_id,
    )
    return job_id


async def conversation_ids_matching(
    conn: Conn,
    org_id: str,
    *,
    conversation_id: str | None,
    tags: list[str] | None,
    project: str | None,
) -> list[str]:
    """Ids of the org's conversations that pass every given filter."""
    rows = await conn.fetch(
        """SELECT conversation_id FROM conversations
            WHERE org_id = $1
              AND ($2::text IS NULL OR conversation_id = $2)
              AND tags @> $3::text[]
              AND ($4::text IS NULL OR metadata ->> 'project' = $4)""",
        org_id,
        conversation_id,
        tags or [],
        project,
    )
    return [r["conversation_id"] for r in rows]


async def chunks_by_id(conn: Conn, org_id: str, chunk_ids: Sequence[str]) -> dict[str, ChunkRow]:
    rows = await conn.fetch(
        "SELECT chunk_id, conversation_id, start_sequence, end_sequence, text FROM chunks "
        "WHERE org_id = $1 AND chunk_id = ANY($2::text[])",
        org_id,
        list(chunk_ids),
    )
    return {r["chunk_id"]: ChunkRow(**dict(r)) for r in rows}
