"""Forward-only schema migrations: numbered plain-SQL files applied in order, once each."""

from __future__ import annotations

import logging
from importlib import resources

import asyncpg

log = logging.getLogger(__name__)

# Any fixed number works; it serializes concurrent migrators (several replicas starting at once).
_LOCK_ID = 7_301_442_118


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every migration, in the order they apply."""
    folder = resources.files("api_service.store") / "migrations"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(name, (folder / name).read_text()) for name in names]


async def migrate(conn: asyncpg.Connection, through: str | None = None) -> list[str]:
    """Apply pending migrations; return the names applied now.

    `through`: stop after the migration of that name (applied now or before)."""
    files = migration_files()
    if through is not None and through not in {name for name, _ in files}:
        raise ValueError(f"no migration named {through!r}")
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_ID)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   name text PRIMARY KEY,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
        for name, sql in files:
            if name not in done:
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
                log.info("applied migration %s", name)
                applied_now.append(name)
            if name == through:
                break
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_ID)
    return applied_now


async def migrate_url(database_url: str) -> list[str]:
    """Connect to `database_url`, migrate, disconnect."""
    conn = await asyncpg.connect(database_url)
    try:
        return await migrate(conn)
    finally:
        await conn.close()
