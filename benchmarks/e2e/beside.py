"""The service's vector search timed query by query beside an alternative's.

On a shared 2-core machine both drift by a third or more within minutes: two runs at 100k on
one Zen 3 had the shard at 4.17 and 3.21 ms (nprobe 8) and Chroma at 2.89 and 3.92 ms
(ef_search 40), so searches timed in separate phases ranked them either way. Here the two take
turns, one query each, each answering first every other query, so both see the same drift,
and each is timed half the time right after the other's call, with the caches and the work
left running it left, and half the time after its own. (In runs up to 7e31552 the shard
always went first, so what its server did after answering overlapped only the alternative's
timed calls.)

The shard is timed at one nprobe for each alternative setting: the smallest that finds at
least as much as that setting (ShardProbe.matching), by the recall the service's own shard
timing measured on the same org and queries. The alternative's recall is counted in a pass
over the queries before the timed one, which also warms it as the earlier timing warmed the
shard. (Until 8cc4959 the shard answered at every nprobe before each of the alternative's
queries, and the fastest that found as much was taken: the alternative then always came after
several scans of the shard, and a minimum over noisy times leaned to the shard.)

The shard is asked over a blocking gRPC client, from whatever process times the alternative
(Chroma's searches run in a process of their own).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

import grpc
import numpy as np

from memory_proto import index_pb2, index_pb2_grpc

K = 10  # every system returns the ids of its best 10, as the shard's Search does
WARMUP = 10  # untimed turns of both before the timed ones


@dataclass(frozen=True)
class ShardProbe:
    """Where the org lives, and the recall@10 of its vector search at each nprobe the service's
    own timing measured ((0, recall) alone: an exact org). Plain values, so it can be handed to
    a process of its own."""

    address: str
    org_id: str
    epoch: int
    recalls: tuple[tuple[int, float], ...]

    def matching(self, recall: float) -> int | None:
        """The smallest nprobe that finds at least `recall`; None where none does."""
        return min((n for n, found in self.recalls if found >= recall), default=None)


class ShardBeside:
    """Times the shard's Search at one nprobe, one query a step, for `figures()`."""

    def __init__(self, probe: ShardProbe, queries: np.ndarray, nprobe: int) -> None:
        self._probe = probe
        self._nprobe = nprobe
        self._queries = [q.astype("<f4").tobytes() for q in queries]
        self._dim = queries.shape[1]
        self._channel = grpc.insecure_channel(probe.address)
        self._stub = index_pb2_grpc.IndexServiceStub(self._channel)
        self._samples: list[float] = []

    def __enter__(self) -> ShardBeside:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._channel.close()

    def search(self, step: int, timed: bool = True) -> None:
        """Ask query number `step`; `timed` False for warm-up steps."""
        request = index_pb2.SearchRequest(
            org_id=self._probe.org_id,
            query=self._queries[step % len(self._queries)],
            dim=self._dim,
            k=K,
            routing_epoch=self._probe.epoch,
            nprobe=self._nprobe,
        )
        t0 = time.perf_counter()
        self._stub.Search(request, timeout=60)
        if timed:
            self._samples.append(time.perf_counter() - t0)

    def figures(self) -> dict[str, float]:
        """`beside_nprobe<n>_p50_ms` and `_p99_ms` of the nprobe timed."""
        ms = np.array(self._samples) * 1000
        return {
            f"beside_nprobe{self._nprobe}_p50_ms": float(np.percentile(ms, 50)),
            f"beside_nprobe{self._nprobe}_p99_ms": float(np.percentile(ms, 99)),
        }


async def alternate(
    probe: ShardProbe,
    queries: np.ndarray,
    recall: Callable[[list[list[str]]], float],
    ask: Callable[[np.ndarray], Awaitable[list[str]]],
) -> tuple[list[float], float, dict[str, float]]:
    """Time `ask`, an alternative's search (the ids it finds for a query vector), on each query,
    taking turns with the shard at the nprobe that finds as much. An untimed pass over the
    queries first counts the alternative's `recall` (and warms it), then WARMUP turns of both go
    untimed. Returns the alternative's latencies in seconds, its recall@10, and the shard's
    figures. Where no nprobe finds as much the shard is timed at its largest, and the ratio
    (report.equal_recall_ratios) says so."""
    found_share = recall([await ask(q) for q in queries])
    nprobe = probe.matching(found_share)
    if nprobe is None:
        nprobe = max(n for n, _ in probe.recalls)
    samples = []
    with ShardBeside(probe, queries, nprobe) as shard:  # blocking: nothing else runs meanwhile
        for step in range(WARMUP):
            shard.search(step, timed=False)
            await ask(queries[step])
        for step, query in enumerate(queries):
            # Each goes first every other query: what one leaves running after its answer
            # (a server's bookkeeping) slows the other's call or its own next one alike.
            if step % 2:
                shard.search(step)
            t0 = time.perf_counter()
            await ask(query)
            samples.append(time.perf_counter() - t0)
            if not step % 2:
                shard.search(step)
    return samples, found_share, shard.figures()
