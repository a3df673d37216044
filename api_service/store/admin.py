"""Organizations, plans and API keys (the admin side; no tenant content here)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from api_service.limits import PlanLimits
from api_service.store.db import Conn
from api_service.store.records import ApiKey, Org

_KEY_COLUMNS = "org_id, key_id, prefix, scopes, created_at, expires_at, revoked_at"


async def create_org(conn: Conn, org_id: str, name: str, plan: str | None) -> Org:
    row = await conn.fetchrow(
        "INSERT INTO orgs (org_id, name, plan) VALUES ($1, $2, $3) "
        "RETURNING org_id, name, plan, created_at",
        org_id,
        name,
        plan,
    )
    assert row is not None
    return Org(**dict(row))


async def set_redact_pii(conn: Conn, name: str, enabled: bool) -> bool:
    """Turn redaction of emails and phone numbers on or off; False if no such org."""
    done = await conn.fetchval(
        "UPDATE orgs SET redact_pii = $2 WHERE name = $1 RETURNING org_id", name, enabled
    )
    return done is not None


@dataclass(frozen=True)
class DeletedOrg:
    org_id: str
    conversations: int
    messages: int


async def delete_org(conn: Conn, name: str) -> DeletedOrg | None:
    """Delete the organization named `name` and everything it holds, in one transaction: its
    conversations (their messages, chunks and stored vectors with them), keys, usage and
    term statistics. Each conversation's vectors leave the index shards through the outbox,
    as a deleted conversation's do. None if there is no such organization.

    The org's row is locked first: a write that committed before is deleted with the rest,
    and one under way is refused at its charge, which finds no org row. A write that already
    holds its conversation's row when the delete starts waits for the org row while the
    delete waits for the conversation: PostgreSQL then aborts one of the two, the write (503,
    errors.CONFLICT_ERRORS; its retry finds the org gone) or the delete (run it again)."""
    async with conn.transaction():
        row = await conn.fetchrow(
            "SELECT org_id, conversation_count, message_count FROM orgs WHERE name = $1 FOR UPDATE",
            name,
        )
        if row is None:
            return None
        await conn.execute(
            "INSERT INTO index_outbox (org_id, kind, conversation_id) "
            "SELECT org_id, 'delete', conversation_id FROM conversations WHERE org_id = $1",
            row["org_id"],
        )
        await conn.execute("DELETE FROM orgs WHERE org_id = $1", row["org_id"])
    return DeletedOrg(row["org_id"], row["conversation_count"], row["message_count"])


async def org_by_name(conn: Conn, name: str) -> Org | None:
    row = await conn.fetchrow(
        "SELECT org_id, name, plan, created_at FROM orgs WHERE name = $1", name
    )
    return None if row is None else Org(**dict(row))


async def insert_key(
    conn: Conn,
    *,
    org_id: str,
    key_id: str,
    key_hash: bytes,
    prefix: str,
    scopes: list[str],
    expires_at: datetime | None,
) -> ApiKey:
    row = await conn.fetchrow(
        f"""INSERT INTO api_keys (org_id, key_id, key_hash, prefix, scopes, expires_at)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING {_KEY_COLUMNS}""",
        org_id,
        key_id,
        key_hash,
        prefix,
        scopes,
        expires_at,
    )
    assert row is not None
    return ApiKey(**dict(row))


@dataclass(frozen=True, slots=True)
class KeyMatch:
    """A key found by its digest, with what a request needs of its org."""

    key: ApiKey
    key_hash: bytes
    redact_pii: bool
    # The org's plan limits; None where the org has no plan (the configured default applies).
    plan: PlanLimits | None


async def key_by_hash(conn: Conn | asyncpg.Pool, key_hash: bytes) -> KeyMatch | None:
    """The key with this sha256 digest and its org's settings, in one round trip."""
    row = await conn.fetchrow(
        f"""SELECT {", ".join("k." + c.strip() for c in _KEY_COLUMNS.split(","))},
                   k.key_hash, o.redact_pii, p.monthly_requests, p.storage_bytes,
                   p.max_conversations, p.max_messages
              FROM api_keys k
              JOIN orgs o USING (org_id)
              LEFT JOIN plans p ON p.name = o.plan
             WHERE k.key_hash = $1""",
        key_hash,
    )
    if row is None:
        return None
    values = dict(row)
    limits = [
        values.pop(column)
        for column in ("monthly_requests", "storage_bytes", "max_conversations", "max_messages")
    ]
    plan = None if limits[0] is None else _plan_limits(*limits)
    return KeyMatch(
        key_hash=values.pop("key_hash"),
        redact_pii=values.pop("redact_pii"),
        plan=plan,
        key=ApiKey(**values),
    )


async def revoke_key(conn: Conn, key_id: str) -> ApiKey | None:
    row = await conn.fetchrow(
        f"""UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
             WHERE key_id = $1 RETURNING {_KEY_COLUMNS}""",
        key_id,
    )
    return None if row is None else ApiKey(**dict(row))


async def list_keys(conn: Conn, org_id: str) -> list[ApiKey]:
    rows = await conn.fetch(
        f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE org_id = $1 ORDER BY created_at, key_id",
        org_id,
    )
    return [ApiKey(**dict(r)) for r in rows]


async def upsert_plan(
    conn: Conn,
    name: str,
    *,
    monthly_requests: int,
    storage_bytes: int,
    conversations: int,
    messages: int | None,
) -> PlanLimits:
    """Create or update the plan; `messages=None` keeps an existing plan's message limit (a
    new plan gets the default). Returns the plan as stored."""
    row = await conn.fetchrow(
        """INSERT INTO plans
               (name, monthly_requests, storage_bytes, max_conversations, max_messages)
           VALUES ($1, $2, $3, $4, coalesce($5::bigint, $6::bigint))
           ON CONFLICT (name) DO UPDATE SET monthly_requests = excluded.monthly_requests,
               storage_bytes = excluded.storage_bytes,
               max_conversations = excluded.max_conversations,
               max_messages = coalesce($5::bigint, plans.max_messages)
           RETURNING monthly_requests, storage_bytes, max_conversations, max_messages""",
        name,
        monthly_requests,
        storage_bytes,
        conversations,
        messages,
        PlanLimits().messages,
    )
    assert row is not None  # an INSERT ... ON CONFLICT DO UPDATE returns its row
    return _plan_limits(*row)


async def set_org_plan(conn: Conn, org_name: str, plan: str | None) -> bool:
    """Put the org on `plan` (None: the configured default); False if no such org."""
    done = await conn.fetchval(
        "UPDATE orgs SET plan = $2 WHERE name = $1 RETURNING org_id", org_name, plan
    )
    return done is not None


async def plan_exists(conn: Conn, name: str) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM plans WHERE name = $1", name))


@dataclass(frozen=True, slots=True)
class OrgTotals:
    """What an org holds, as its plan's limits count it."""

    storage_bytes: int = 0
    conversations: int = 0
    messages: int = 0


async def org_totals(conn: Conn | asyncpg.Pool, org_id: str) -> OrgTotals:
    row = await conn.fetchrow(
        "SELECT storage_bytes, conversation_count, message_count FROM orgs WHERE org_id = $1",
        org_id,
    )
    return OrgTotals() if row is None else OrgTotals(*(int(value) for value in row))


async def plan_of(conn: Conn, org_id: str) -> PlanLimits | None:
    """The org's plan, or None when it has none (the configured default applies)."""
    row = await conn.fetchrow(
        """SELECT p.monthly_requests, p.storage_bytes, p.max_conversations, p.max_messages
             FROM orgs o JOIN plans p ON p.name = o.plan WHERE o.org_id = $1""",
        org_id,
    )
    return None if row is None else _plan_limits(*row)


def _plan_limits(requests: int, storage: int, conversations: int, messages: int) -> PlanLimits:
    return PlanLimits(
        monthly_requests=requests,
        storage_bytes=storage,
        conversations=conversations,
        messages=messages,
    )


async def recount_totals(conn: Conn) -> int:
    """Set every org's totals to its conversations' sums; the number of orgs that changed.

    A write charges its org last in its transaction. Holding writers off the org rows until
    this commits makes the sums count every write that has charged its org, and a write
    still under way adds its own after them; without the lock, a write that committed while
    the recount waited on its org row would be left out (its snapshot predates the write)."""
    async with conn.transaction():
        await conn.execute("LOCK TABLE orgs IN SHARE ROW EXCLUSIVE MODE")
        changed: int = await conn.fetchval(
            """WITH sums AS (
                   SELECT o.org_id, coalesce(sum(c.storage_bytes), 0) AS bytes,
                          count(c.conversation_id) AS conversations,
                          coalesce(sum(c.message_count), 0) AS messages
                     FROM orgs o LEFT JOIN conversations c USING (org_id)
                    GROUP BY o.org_id),
               updated AS (
                   UPDATE orgs o
                      SET storage_bytes = s.bytes, conversation_count = s.conversations,
                          message_count = s.messages
                     FROM sums s
                    WHERE s.org_id = o.org_id
                      AND (o.storage_bytes, o.conversation_count, o.message_count)
                          IS DISTINCT FROM (s.bytes, s.conversations, s.messages)
                   RETURNING 1)
               SELECT count(*) FROM updated"""
        )
    return changed
