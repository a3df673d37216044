"""Connection pool set-up."""

from __future__ import annotations

import json
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

# A connection taken from a pool or opened directly; the repository accepts either.
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"


async def _init_connection(conn: asyncpg.Connection) -> None:
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Nothing to reset on release: the service changes settings with SET LOCAL and takes
    advisory locks per transaction only, so a connection goes back as it came. asyncpg's
    default reset (RESET ALL, UNLISTEN, unlock) is a round trip on every release."""


async def create_pool(database_url: str, min_size: int = 2, max_size: int = 20) -> asyncpg.Pool:
    """A pool whose connections decode json/jsonb to Python objects."""
    pool = await asyncpg.create_pool(
        database_url,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        reset=_keep_session,
    )
    assert pool is not None
    return pool
