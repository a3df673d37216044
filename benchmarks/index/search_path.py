"""Where a shard Search's time goes: the gRPC round trip, the shard's own path, the scan.

Starts a real shard (`python -m index_service`, no database) and times, one call at a time
from a blocking client: a Health call (the round trip and the server's handling of an empty
call), a Search of a 10-vector org (the round trip plus the Search path: decoding, the org
lock, the hop to a request thread, the reply) and a Search of a 10k-vector org (--vectors),
which is exact (a flat store). The same flat search is then timed in this process, on one
thread as the shard's request threads run it. Each is timed in several rounds,
alternated, and the median of the rounds' p50 is kept: on a shared 2-core machine one round
can be twice another.

Writes results/search-path-<machine>.json and .png.

Usage:
  python benchmarks/index/search_path.py --machine "2-core Intel Xeon"
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_index import DIM, Shard, p50_ms, progress, rounds_parser, save_result, upsert_all

from index_service.native import single_threaded_faiss, single_threaded_numpy_blas
from index_service.stores import FlatStore
from memory_proto import index_pb2


def unit_vectors(n: int, rng: np.random.Generator) -> np.ndarray:
    out = rng.standard_normal((n, DIM), dtype=np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def measure(args: argparse.Namespace) -> dict[str, float]:
    rng = np.random.default_rng(0)
    vectors = unit_vectors(args.vectors, rng)
    queries = [q.astype("<f4").tobytes() for q in unit_vectors(args.calls, rng)]
    query_rows = np.frombuffer(b"".join(queries), "<f4").reshape(len(queries), DIM)
    if not single_threaded_numpy_blas():
        raise SystemExit("could not set numpy's BLAS to one thread, as the shard does")
    single_threaded_faiss()
    store = FlatStore(DIM)
    store.add(np.arange(len(vectors), dtype=np.int64), vectors)

    def search(org: str) -> Callable[[int], object]:
        return lambda i: shard.stub.Search(
            index_pb2.SearchRequest(org_id=org, query=queries[i], dim=DIM, k=10)
        )

    # The org stays flat whatever its size, for the scan timed in this process is a flat one.
    shard = Shard(args.out / "search-path-shard.log", INDEX_FLAT_THRESHOLD=str(args.vectors))
    try:
        upsert_all(shard, "tiny", vectors[:10])
        upsert_all(shard, "flat", vectors)
        stats = shard.stub.Stats(index_pb2.StatsRequest(org_id="flat"))
        if stats.index_kind != "flat":
            raise SystemExit(f"the {args.vectors:,}-vector org is {stats.index_kind}, not flat")
        timings: dict[str, Callable[[int], object]] = {
            "health": lambda i: shard.stub.Health(index_pb2.IndexHealthRequest()),
            "search_10": search("tiny"),
            f"search_{args.vectors}": search("flat"),
            "scan_in_process": lambda i: store.search(query_rows[i : i + 1], 10, None),
        }
        rounds: dict[str, list[float]] = {name: [] for name in timings}
        for r in range(args.rounds):
            for name, call in timings.items():
                rounds[name].append(p50_ms(call, args.calls))
            progress(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{name} {ms[-1]:.3f} ms" for name, ms in rounds.items())
            )
    finally:
        shard.close()
    return {f"{name}_p50_ms": statistics.median(ms) for name, ms in rounds.items()}


def plot(result: dict[str, Any]) -> Any:
    """The figure of `result` (save_result picks the backend and writes it)."""
    import matplotlib.pyplot as plt

    n = result["vectors"]
    rtt = result["health_p50_ms"]
    path_ms = result["search_10_p50_ms"] - rtt
    scan = result["scan_in_process_p50_ms"]
    rest = result[f"search_{n}_p50_ms"] - rtt - path_ms - scan
    parts = [
        ("round trip (Health)", rtt),
        ("Search path", path_ms),
        ("scan", scan),
        ("other", rest),
    ]
    fig, ax = plt.subplots(figsize=(9, 3))
    left = 0.0
    for label, ms in parts:
        ax.barh([f"Search, {n:,} vectors"], [ms], left=left, label=f"{label} {ms:.2f} ms")
        left += ms
    ax.set_xlabel("ms, p50 (median of rounds)")
    ax.set_title(f"a shard Search's time, {result['machine']}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4)
    return fig


def main() -> None:
    parser = rounds_parser(__doc__, rounds=5)
    parser.add_argument("--vectors", type=int, default=10_000, help="vectors in the flat org")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)  # the shard's log goes there first
    result: dict[str, Any] = {"machine": args.machine, "vectors": args.vectors}
    result.update(measure(args))
    save_result(result, args.out, "search-path", plot)


if __name__ == "__main__":
    main()
