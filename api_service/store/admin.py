"""Organizations, plans and API keys (the admin side; no tenant content here)."""

from __future__ import annotations

from datetime import datetime

import asyncpg

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


async def key_by_hash(
    conn: Conn | asyncpg.Pool, key_hash: bytes
) -> tuple[ApiKey, bytes, bool] | None:
    """The key with this sha256 digest, the stored digest (for a constant-time check), and
    whether its org redacts personal data."""
    row = await conn.fetchrow(
        f"""SELECT {", ".join("k." + c.strip() for c in _KEY_COLUMNS.split(","))},
                   k.key_hash, o.redact_pii
              FROM api_keys k JOIN orgs o USING (org_id)
             WHERE k.key_hash = $1""",
        key_hash,
    )
    if row is None:
        return None
    values = dict(row)
    stored: bytes = values.pop("key_hash")
    redact_pii: bool = values.pop("redact_pii")
    return ApiKey(**values), stored, redact_pii


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
