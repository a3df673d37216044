"""The meter with an injected clock against the real PostgreSQL: exact admission, flushes that
add, month rollover, and counts that survive a restart."""

from __future__ import annotations

from datetime import UTC, date, datetime

from api_service.limits import Meter, next_month_start
from api_service.store import admin
from api_service.store.db import create_pool


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def test_rollover_flush_and_restart(database_url: str) -> None:
    pool = await create_pool(database_url, 1, 2)
    try:
        async with pool.acquire() as conn:
            await admin.create_org(conn, "org_m", "m", None)
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
    finally:
        await pool.close()


def test_next_month_start_wraps_the_year() -> None:
    assert next_month_start(datetime(2026, 12, 15, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)
