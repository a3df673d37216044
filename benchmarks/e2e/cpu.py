"""CPU time by part of the stack, for the cost of a chunk of ingest.

On a machine the parts share, wall-clock rates move with whatever else runs; CPU seconds a
chunk are steadier, and they show which part a chunk's cost is in. The alternatives are read
the same way: PostgreSQL and this process for pgvector, this process for Chroma.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psutil

# `python -m <module>` of each service, as `memctl up` starts them; the supervisor counts with
# the API.
SERVICES = {
    "api_service": "api",
    "api_service.cli": "api",
    "embed_service": "embed",
    "index_service": "index",
}
BENCHMARK = "benchmark"  # this process: the load generator, or an embedded alternative
POSTGRES = "postgres"


def seconds(times: Any) -> float:
    """User plus system seconds of psutil's `cpu_times()`."""
    return float(times.user + times.system)


class CpuMeter:
    """Cumulative CPU seconds of each part, by `read()`: subtract two readings.

    The services are this process's descendants (the stack it started), PostgreSQL the
    embedded server on `pg_data`: its postmaster, live children and the children it reaped.
    """

    def __init__(self, pg_data: Path) -> None:
        self._pg_data = pg_data

    def read(self) -> dict[str, float]:
        me = psutil.Process()
        totals = dict.fromkeys([*sorted(set(SERVICES.values())), POSTGRES, BENCHMARK], 0.0)
        totals[BENCHMARK] = seconds(me.cpu_times())
        totals[POSTGRES] = self._postgres()
        for proc in me.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):  # exited since listed
                cmdline = proc.cmdline()
                if len(cmdline) >= 3 and cmdline[1] == "-m" and cmdline[2] in SERVICES:
                    totals[SERVICES[cmdline[2]]] += seconds(proc.cpu_times())
        return totals

    def _postgres(self) -> float:
        """A child reaped between reading the postmaster's reaped-children times and listing
        its live children would be in neither: read again until the first is unchanged."""
        pid = int((self._pg_data / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        while True:
            before = postmaster.cpu_times()
            live = 0.0
            for child in postmaster.children():
                with contextlib.suppress(psutil.NoSuchProcess):  # exited since listed
                    live += seconds(child.cpu_times())
            after = postmaster.cpu_times()
            if (before.children_user, before.children_system) == (
                after.children_user,
                after.children_system,
            ):
                return float(seconds(after) + after.children_user + after.children_system + live)


def per_chunk_ms(
    before: dict[str, float], after: dict[str, float], chunks: int
) -> dict[str, float]:
    """Milliseconds of CPU a chunk, by part, and their `total`."""
    if chunks <= 0:
        raise ValueError(f"no chunks to share the CPU among ({chunks})")
    out = {part: (after[part] - before[part]) * 1000 / chunks for part in after}
    out["total"] = sum(out.values())
    return out
