"""Where a request's time went, for the `Server-Timing` header of REST responses.

GuardMiddleware starts a record per request; the calls to the other services and the stages
of a request add their time to it under a part's name (`auth`, `embed`, `index`, `write`,
`embed_wait`, `vectors`, `lexical`, `rows`; the README says what each covers), and the header gives
each part and the `total`, in milliseconds. A part that runs several times is summed; parts that
run side by side overlap, so they need not add up to the total. Outside a request nothing is
recorded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Tasks started during a request (an append's own indexing) copy the context, and with it this
# same dict: their time counts toward the request that started them.
_record: ContextVar[dict[str, float] | None] = ContextVar("server_timing", default=None)


def start() -> dict[str, float]:
    """A new, empty record for the current request."""
    record: dict[str, float] = {}
    _record.set(record)
    return record


@contextmanager
def part(name: str) -> Iterator[None]:
    """Add the time spent in the block to the current request's `name`."""
    record = _record.get()
    if record is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        record[name] = record.get(name, 0.0) + time.perf_counter() - started


def header(record: dict[str, float], total_seconds: float) -> bytes:
    """The `Server-Timing` value: each part, then the total, in milliseconds."""
    parts = [*record.items(), ("total", total_seconds)]
    return ", ".join(f"{name};dur={seconds * 1000:.2f}" for name, seconds in parts).encode()


def parse(value: str) -> dict[str, float]:
    """A `Server-Timing` value read back: each part's name and milliseconds, `total` included."""
    parts = (part.strip().split(";dur=") for part in value.split(","))
    return {name: float(ms) for name, ms in parts}
