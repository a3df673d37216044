"""Plans and the monthly request meter.

Every authenticated request to /mcp and /api/v1 counts for its org and UTC month, refused ones
too. Counting happens in memory and is flushed to PostgreSQL atomically (an upsert that adds)
every `flush_seconds`, so the meter adds no database round trip to a request. Admission is
exact within one process: the check and the count happen together on the event loop. With R
replicas, each admits against the total it last read, so between two flushes the org can be
over-admitted by at most what the other R - 1 replicas admit in one flush interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime

import asyncpg
from pydantic import BaseModel

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class PlanLimits(BaseModel):
    """What an org may use: requests per UTC month, stored bytes, conversations, messages."""

    monthly_requests: int = 1_000_000
    storage_bytes: int = 10 * 1024**3
    conversations: int = 100_000
    messages: int = 10_000_000


def utc_now() -> datetime:
    return datetime.now(UTC)


def month_start(moment: datetime) -> date:
    return date(moment.year, moment.month, 1)


def next_month_start(moment: datetime) -> datetime:
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    limit: int
    remaining: int
    reset_at: datetime

    def headers(self, now: datetime) -> dict[str, str]:
        headers = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(int(self.reset_at.timestamp())),
        }
        if not self.allowed:
            headers["Retry-After"] = str(max(1, int((self.reset_at - now).total_seconds())))
        return headers

    def message(self) -> str:
        return (
            f"Monthly request quota of {self.limit} reached; it resets at "
            f"{self.reset_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        )


@dataclass
class _Count:
    flushed_total: int  # the org's total in PostgreSQL as last read or written
    pending: int = 0  # counted here, not yet flushed

    @property
    def total(self) -> int:
        return self.flushed_total + self.pending


class Meter:
    """Counts requests per (org, month) in memory and admits them against the monthly quota."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock = utc_now, flush_seconds: float = 1.0):
        self._pool = pool
        self._clock = clock
        self._flush_seconds = flush_seconds
        self._counts: dict[tuple[str, date], _Count] = {}
        self._loading: dict[tuple[str, date], asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._flushing: asyncio.Future[None] | None = None  # the periodic flush under way

    def now(self) -> datetime:
        return self._clock()

    async def admit(self, org_id: str, monthly_limit: int) -> Admission:
        """Count one request and say whether it is within the quota."""
        now = self._clock()
        count = await self._count(org_id, now)
        used = count.total
        count.pending += 1  # no await between the check and the count: exact on one replica
        allowed = used < monthly_limit
        remaining = max(0, monthly_limit - used - 1) if allowed else 0
        return Admission(allowed, monthly_limit, remaining, next_month_start(now))

    async def used(self, org_id: str) -> int:
        """Requests counted this month, flushed or not."""
        return (await self._count(org_id, self._clock())).total

    async def _count(self, org_id: str, now: datetime) -> _Count:
        """The org's count for the month of `now`, read from PostgreSQL on first use."""
        key = (org_id, month_start(now))
        while (count := self._counts.get(key)) is None:  # a flush may drop a past month's
            await self._load(key)
        return count

    async def _load(self, key: tuple[str, date]) -> None:
        waiting = self._loading.get(key)
        if waiting is not None:
            await waiting
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            total = await self._pool.fetchval(
                "SELECT requests FROM usage WHERE org_id = $1 AND month = $2", *key
            )
            self._counts.setdefault(key, _Count(int(total or 0)))
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            del self._loading[key]

    async def flush(self) -> None:
        """Add pending counts to PostgreSQL and refresh the totals (other replicas' too)."""
        taken = {key: c.pending for key, c in self._counts.items() if c.pending}
        if taken:
            # Only orgs that still exist, each locked against deletion until the insert is
            # done: one org deleted meanwhile must not fail the write of every other's counts.
            rows = await self._pool.fetch(
                """INSERT INTO usage (org_id, month, requests)
                   SELECT o.org_id, u.month, u.requests
                     FROM unnest($1::text[], $2::date[], $3::bigint[]) AS u(org_id, month, requests)
                     JOIN orgs o ON o.org_id = u.org_id
                      FOR KEY SHARE OF o
                   ON CONFLICT (org_id, month)
                   DO UPDATE SET requests = usage.requests + excluded.requests
                   RETURNING org_id, month, requests""",
                [k[0] for k in taken],
                [k[1] for k in taken],
                list(taken.values()),
            )
            written = set()
            for row in rows:
                key = (row["org_id"], row["month"])
                self._counts[key].pending -= taken[key]
                self._counts[key].flushed_total = int(row["requests"])
                written.add(key)
            for key in taken.keys() - written:
                del self._counts[key]  # its org is gone, and its counts with it
        # Read after the write: the month may have turned meanwhile, and requests of the new
        # one been counted, which the next flush writes.
        current = month_start(self._clock())
        for key in [k for k, c in self._counts.items() if k[1] != current and not c.pending]:
            del self._counts[key]  # a past month with nothing left to write
        idle = [k[0] for k in self._counts if k[1] == current and k not in taken]
        if idle:
            rows = await self._pool.fetch(
                "SELECT org_id, requests FROM usage WHERE month = $1 AND org_id = ANY($2::text[])",
                current,
                idle,
            )
            for row in rows:
                if (count := self._counts.get((row["org_id"], current))) is not None:
                    count.flushed_total = int(row["requests"])

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="meter-flush")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._flushing is not None:
            with contextlib.suppress(Exception):  # its failure leaves its counts pending
                await self._flushing
        with contextlib.suppress(Exception):
            await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._flush_seconds)
            # Shielded: a write cancelled after PostgreSQL committed it would leave its counts
            # pending, and the last flush at stop would add them a second time.
            self._flushing = asyncio.ensure_future(self.flush())
            try:
                await asyncio.shield(self._flushing)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("meter flush failed (%s); counts kept for the next", type(exc).__name__)
            except Exception:  # a bug must not end the flushes unseen, nor fail the shutdown
                log.exception("meter flush failed; counts kept for the next")
