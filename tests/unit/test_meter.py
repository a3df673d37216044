"""The meter with an injected clock against the real PostgreSQL: exact admission, flushes that
add, month rollover (a request counted while a flush writes the month before is kept), and
counts that survive a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime
from typing import Any

import asyncpg
import pytest

from api_service.limits import Meter, next_month_start
from api_service.store import admin
from api_service.store.db import create_pool


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database with the org org_m."""
    pool = await create_pool(database_url, 1, 2)
    try:
        async with pool.acquire() as conn:
            await admin.create_org(conn, "org_m", "m", None)
        yield pool
    finally:
        await pool.close()


async def test_rollover_flush_and_restart(pool: asyncpg.Pool) -> None:
    clock = Clock(datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC))
    meter = Meter(pool, clock)
    verdicts = [(await meter.admit("org_m", 3)).allowed for _ in range(5)]
    assert verdicts == [True, True, True, False, False]
    refused = await meter.admit("org_m", 3)
    assert refused.reset_at == datetime(2026, 12, 1, tzinfo=UTC)
    assert "2026-12-01T00:00:00Z" in refused.message()

    clock.now = datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC)  # a new month: a new quota
    fresh = await meter.admit("org_m", 3)
    assert fresh.allowed and fresh.remaining == 2
    await meter.flush()
    rows = dict(await pool.fetch("SELECT month, requests FROM usage WHERE org_id = 'org_m'"))
    assert rows == {date(2026, 11, 1): 6, date(2026, 12, 1): 1}

    restarted = Meter(pool, clock)  # another process, or this one after a restart
    assert await restarted.used("org_m") == 1
    assert [(await restarted.admit("org_m", 3)).allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]
    await restarted.flush()
    await meter.flush()  # the first process sees the second's counts after a flush
    assert await meter.used("org_m") == 4


class AroundWrites:
    """The pool, with `write` in place of each of the meter's writes (its INSERT)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def fetchval(self, *args: Any) -> Any:
        return await self.pool.fetchval(*args)

    async def fetch(self, query: str, *args: Any) -> Any:
        if query.lstrip().startswith("INSERT"):
            return await self.write(query, *args)
        return await self.pool.fetch(query, *args)

    async def write(self, query: str, *args: Any) -> Any:
        return await self.pool.fetch(query, *args)


class MonthTurnsDuringTheWrite(AroundWrites):
    """The pool, but the month turns while the flush's write is on its way, and a request of
    the new month is counted meanwhile."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock, org_id: str) -> None:
        super().__init__(pool)
        self.clock, self.org_id = clock, org_id
        self.meter: Meter | None = None

    async def write(self, query: str, *args: Any) -> Any:
        if self.meter is not None:
            meter, self.meter = self.meter, None
            self.clock.now = datetime(2026, 12, 1, tzinfo=UTC)
            assert (await meter.admit(self.org_id, 10)).allowed
        return await super().write(query, *args)


async def test_a_request_counted_as_the_month_turns_is_kept(pool: asyncpg.Pool) -> None:
    clock = Clock(datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC))
    turning = MonthTurnsDuringTheWrite(pool, clock, "org_m")
    meter = Meter(turning, clock)  # type: ignore[arg-type]
    await meter.admit("org_m", 10)
    turning.meter = meter
    await meter.flush()  # writes November's request; December's arrives meanwhile
    assert await meter.used("org_m") == 1
    await meter.flush()
    rows = dict(await pool.fetch("SELECT month, requests FROM usage WHERE org_id = 'org_m'"))
    assert rows == {date(2026, 11, 1): 1, date(2026, 12, 1): 1}


class SlowAnswers(AroundWrites):
    """The pool, but each write's answer comes `delay` seconds after PostgreSQL committed it."""

    def __init__(self, pool: asyncpg.Pool, delay: float) -> None:
        super().__init__(pool)
        self.delay = delay
        self.written = asyncio.Event()

    async def write(self, query: str, *args: Any) -> Any:
        rows = await super().write(query, *args)
        self.written.set()
        await asyncio.sleep(self.delay)
        return rows


async def test_stopping_during_a_flush_counts_each_request_once(pool: asyncpg.Pool) -> None:
    """Stop comes while the periodic flush's write is committed but not yet answered."""
    slow = SlowAnswers(pool, delay=0.2)
    meter = Meter(slow, flush_seconds=0.01)  # type: ignore[arg-type]
    for _ in range(3):
        await meter.admit("org_m", 10)
    meter.start()
    await asyncio.wait_for(slow.written.wait(), 10)
    await meter.stop()
    assert await pool.fetchval("SELECT requests FROM usage WHERE org_id = 'org_m'") == 3


def test_next_month_start_wraps_the_year() -> None:
    assert next_month_start(datetime(2026, 12, 15, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)


class FailsOnce(AroundWrites):
    """The pool, but the first write fails with an error no flush expects."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self.failed = asyncio.Event()

    async def write(self, query: str, *args: Any) -> Any:
        if not self.failed.is_set():
            self.failed.set()
            raise RuntimeError("unexpected")
        return await super().write(query, *args)


async def test_an_unexpected_flush_error_keeps_the_counts(pool: asyncpg.Pool) -> None:
    """The periodic flush goes on after it, and stop still writes what is pending."""
    failing = FailsOnce(pool)
    meter = Meter(failing, flush_seconds=0.01)  # type: ignore[arg-type]
    await meter.admit("org_m", 10)
    meter.start()
    await asyncio.wait_for(failing.failed.wait(), 10)
    await meter.admit("org_m", 10)
    await meter.stop()
    assert await pool.fetchval("SELECT requests FROM usage WHERE org_id = 'org_m'") == 2


async def test_an_org_deleted_before_the_flush_holds_up_no_other(pool: asyncpg.Pool) -> None:
    """The counts of an org that was deleted meanwhile are dropped; every other org's are
    written as before."""
    async with pool.acquire() as conn:
        await admin.create_org(conn, "org_m_gone", "gone", None)
    clock = Clock(datetime(2026, 11, 15, tzinfo=UTC))
    meter = Meter(pool, clock)
    for org in ("org_m", "org_m_gone", "org_m"):
        assert (await meter.admit(org, 10)).allowed
    await pool.execute("DELETE FROM orgs WHERE org_id = 'org_m_gone'")
    await meter.flush()
    rows = dict(await pool.fetch("SELECT org_id, requests FROM usage WHERE org_id LIKE 'org_m%'"))
    assert rows == {"org_m": 2}
    assert (await meter.admit("org_m", 10)).remaining == 7
    await meter.flush()
    assert await pool.fetchval("SELECT requests FROM usage WHERE org_id = 'org_m'") == 3
