"""The service's vector search timed query by query beside an alternative's.

On a shared 2-core machine both drift by a third or more within minutes: two runs at 100k on
one Zen 3 had the shard at 4.17 and 3.21 ms (nprobe 8) and Chroma at 2.89 and 3.92 ms
(ef_search 40), so searches timed in separate phases ranked them either way. Here the shard
answers a query at every nprobe just before the alternative answers its query: both see the
same drift, and the ratio of their times holds.

At each step the nprobe values ask different queries, each in turn over the whole run: the
same query at a smaller nprobe scans the first of the larger one's lists and leaves them in
the caches, which would flatter the larger. They also take turns at going first, the call
that finds least of the shard's memory in the caches after the alternative's query.

The shard is asked over a blocking gRPC client, from whatever process times the alternative
(Chroma's searches run in a process of their own). Its recall at each nprobe is that of the
service's own shard timing: the org and the queries are the same, and so are the results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType

import grpc
import numpy as np

from memory_proto import index_pb2, index_pb2_grpc

K = 10


@dataclass(frozen=True)
class ShardProbe:
    """Where the org lives and which nprobe values to time (0 alone: an exact org). Plain
    values, so it can be handed to a process of its own."""

    address: str
    org_id: str
    epoch: int
    nprobes: tuple[int, ...]


class ShardBeside:
    """Times the shard's Search at each of the probe's nprobe values, one step per query of
    the alternative's."""

    def __init__(self, probe: ShardProbe, queries: np.ndarray) -> None:
        self._probe = probe
        self._queries = [q.astype("<f4").tobytes() for q in queries]
        self._dim = queries.shape[1]
        # Queries the nprobe values ask at one step lie this far apart.
        self._stride = max(1, len(queries) // len(probe.nprobes))
        self._channel = grpc.insecure_channel(probe.address)
        self._stub = index_pb2_grpc.IndexServiceStub(self._channel)
        self._samples: dict[int, list[float]] = {n: [] for n in probe.nprobes}

    def __enter__(self) -> ShardBeside:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._channel.close()

    def search(self, step: int, timed: bool = True) -> None:
        """Step `step`: nprobe number j asks query step + j * stride, nprobe number `step`
        (modulo their count) first. `timed` False for warm-up steps."""
        nprobes = self._probe.nprobes
        for turn in range(len(nprobes)):
            j = (step + turn) % len(nprobes)
            request = index_pb2.SearchRequest(
                org_id=self._probe.org_id,
                query=self._queries[(step + j * self._stride) % len(self._queries)],
                dim=self._dim,
                k=K,
                routing_epoch=self._probe.epoch,
                nprobe=nprobes[j],
            )
            t0 = time.perf_counter()
            self._stub.Search(request, timeout=60)
            if timed:
                self._samples[nprobes[j]].append(time.perf_counter() - t0)

    def figures(self) -> dict[str, float]:
        """`beside_nprobe<n>_p50_ms` and `_p99_ms` for each nprobe timed."""
        out = {}
        for nprobe, samples in self._samples.items():
            ms = np.array(samples) * 1000
            out[f"beside_nprobe{nprobe}_p50_ms"] = float(np.percentile(ms, 50))
            out[f"beside_nprobe{nprobe}_p99_ms"] = float(np.percentile(ms, 99))
        return out
