"""Waiting, in a test, until a connection is blocked on a lock."""

from __future__ import annotations

import asyncio

import asyncpg


async def waits_for_a_lock(observer: asyncpg.Connection, pid: int) -> None:
    """Return once the server process `pid` waits for a lock (seen from `observer`)."""
    for _ in range(500):
        waiting = await observer.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"server process {pid} never waited for a lock")
