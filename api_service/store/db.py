"""Connection pool set-up."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from asyncpg.transaction import Transaction

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


@contextlib.asynccontextmanager
async def write_transaction(conn: Conn) -> AsyncIterator[None]:
    """A transaction whose statements run on generic plans: committed if the block completes,
    rolled back if it raises.

    The writes of messages and windows take their rows as arrays, which give a custom plan
    nothing to choose by, yet PostgreSQL kept planning the window upsert anew at every call
    (0.37 ms of a 2 ms write): it guesses 100 rows for an array parameter, so the generic plan
    looks dearer than any custom one. The setting is made in BEGIN's round trip and ends with
    the transaction. It cannot be nested in another transaction, nor hold `conn.transaction()`.
    """
    if conn.is_in_transaction():
        # BEGIN would only warn, and the COMMIT below would end the outer transaction.
        raise asyncpg.InterfaceError("write_transaction cannot run inside another transaction")
    await conn.execute("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan")
    try:
        yield
    except BaseException:
        # A connection that failed is closed or reset by the pool: the first error is the one
        # to see.
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            await conn.execute("ROLLBACK")
        raise
    # A statement that failed inside the block, its error caught there, left the transaction
    # aborted: COMMIT then rolls back and only says so in its status.
    if await conn.execute("COMMIT") != "COMMIT":
        raise asyncpg.InterfaceError("the transaction was rolled back: a statement in it failed")


def read_snapshot(conn: Conn) -> Transaction:
    """A read-only transaction whose statements all see the database at one moment: a
    conversation and its messages, a page and its total, agree though writes commit between
    them."""
    return conn.transaction(isolation="repeatable_read", readonly=True)
