"""CPU time by part of the stack, for the cost of a chunk of ingest.

On a machine the parts share, wall-clock rates move with whatever else runs; CPU seconds a
chunk are steadier, and they show which part a chunk's cost is in. The alternatives are read
the same way: PostgreSQL and this process for pgvector, this process for Chroma.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

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


def _seconds(times: psutil._common.pcputimes) -> float:
    return float(times.user + times.system)


class CpuMeter:
    """Cumulative CPU seconds of each part, by `read()`: subtract two readings."""

    def __init__(self, pg_data: Path) -> None:
        self._pg_data = pg_data

    def read(self) -> dict[str, float]:
        totals = dict.fromkeys([*sorted(set(SERVICES.values())), POSTGRES, BENCHMARK], 0.0)
        totals[BENCHMARK] = _seconds(psutil.Process().cpu_times())
        totals[POSTGRES] = self._postgres()
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if len(cmdline) >= 3 and cmdline[1] == "-m" and cmdline[2] in SERVICES:
                with contextlib.suppress(psutil.NoSuchProcess):  # exited since listed
                    totals[SERVICES[cmdline[2]]] += _seconds(proc.cpu_times())
        return totals

    def _postgres(self) -> float:
        """The postmaster, its live children, and the children it has reaped (backends and
        autovacuum workers that exited, counted in its children's times)."""
        pid = int((self._pg_data / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        times = postmaster.cpu_times()
        total = _seconds(times) + times.children_user + times.children_system
        for child in postmaster.children():
            with contextlib.suppress(psutil.NoSuchProcess):  # exited since listed
                total += _seconds(child.cpu_times())
        return float(total)


def per_chunk_ms(
    before: dict[str, float], after: dict[str, float], chunks: int
) -> dict[str, float]:
    """Milliseconds of CPU a chunk, by part, and their `total`."""
    out = {part: (after[part] - before[part]) * 1000 / max(chunks, 1) for part in after}
    out["total"] = sum(out.values())
    return out
