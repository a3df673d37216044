"""An IVF org's coarse quantizer in float32 and in float16: what a request's search and upsert
cost with each, with the CPU's caches warm and after other work has emptied them.

Every search and every request-sized add scores all of an IVF org's centroids first: at 1M
vectors 4,096 of them, 12.6 MB in float32. Between two calls of a client that waits for
each answer, other processes (PostgreSQL, the API) run on the same cores and evict them.

Builds the IVF store a shard builds at --size (build_ivf: its lists and calibrated nprobe) on
clustered unit vectors, then times on one thread, as the shard's request threads run, with
the store's float16 centroids (what it uses) and its float32 ones (what it used before):
- an append's upsert: one window replaced, one added (a removal and a 2-vector add),
- a search at the calibrated nprobe and at 16,
each back to back ("warm") and after writing a buffer of --evict-mb ("cold"), in alternated
rounds (the median of their p50 is kept), and the recall@10 of each against exact search.

Writes results/coarse-quantizer-<size>-<machine>.json and .png.

Usage:
  python benchmarks/index/coarse_quantizer.py --size 1000000 --machine "2-core AMD EPYC"
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_index import DIM, exact_top, mixture, p50_ms, progress, rounds_parser, save_result
from bench_index import recall as recall_of

from index_service.native import single_threaded_faiss, single_threaded_numpy_blas
from index_service.settings import IndexSettings
from index_service.stores import IvfStore, build_ivf

QUERIES = 300


def calls(store: IvfStore, queries: np.ndarray, fresh: np.ndarray) -> dict[str, Callable]:
    """The timed calls. Each upsert removes the label the one before added last and adds the
    next two, as an append rewrites its conversation's last window and adds one."""
    n = store.ntotal
    window = [n]  # labels the upserts own, growing as an append's windows do

    def upsert(i: int) -> None:
        old = np.array([window[-1]], dtype=np.int64)
        store.remove(old)
        labels = np.array([old[0] + 1, old[0] + 2], dtype=np.int64)
        store.add(labels, fresh[2 * (i % 500) : 2 * (i % 500) + 2])
        window.append(int(labels[-1]))

    store.add(np.array([n], dtype=np.int64), fresh[:1])
    return {
        "upsert": upsert,
        "search": lambda i: store.search(queries[i % QUERIES : i % QUERIES + 1], 10, None),
        "search_nprobe16": lambda i: store.search(
            queries[i % QUERIES : i % QUERIES + 1], 10, None, 16
        ),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if not single_threaded_numpy_blas():
        raise SystemExit("could not set numpy's BLAS to one thread, as the shard does")
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((1 + args.size // 2000, DIM)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    progress(f"drawing {args.size:,} clustered vectors")
    vectors = mixture(args.size, rng, centers, spread=1.0)
    queries = mixture(QUERIES, rng, centers, spread=1.4)
    fresh = mixture(1000, rng, centers, spread=1.0)
    progress("building the IVF store (as a shard's rebuild does, on all cores)")
    t0 = time.perf_counter()
    store = build_ivf(np.arange(args.size, dtype=np.int64), vectors, args.target_recall)
    build_s = time.perf_counter() - t0
    progress(f"built in {build_s:.0f} s: {store.nlist} lists, nprobe {store.nprobe}")
    truth = exact_top(vectors, queries, 10)
    del vectors
    single_threaded_faiss()
    quantizers = {"float16": store._quantizer, "float32": store._bulk_quantizer}
    index = store._index
    recall = {}
    for name, quantizer in quantizers.items():
        index.quantizer = quantizer
        _, found = store.search(queries, 10, None)
        recall[name] = round(recall_of(found.tolist(), truth), 4)
    evict = np.zeros(args.evict_mb << 18, dtype=np.float32)
    timed = calls(store, queries, fresh)
    rounds: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for name, quantizer in quantizers.items():
            index.quantizer = quantizer
            for call_name, call in timed.items():
                for cache, before in (("warm", None), ("cold", evict.fill)):
                    key = f"{call_name}_{name}_{cache}_p50_ms"
                    rounds.setdefault(key, []).append(p50_ms(call, args.calls, 20, before))
        progress(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{k} {v[-1]:.3f}" for k, v in rounds.items())
        )
    index.quantizer = store._quantizer
    result: dict[str, Any] = {
        "machine": args.machine,
        "size": args.size,
        "nlist": store.nlist,
        "nprobe": store.nprobe,
        "build_seconds": round(build_s, 1),
        "evict_mb": args.evict_mb,
        "recall_at_10_float16": recall["float16"],
        "recall_at_10_float32": recall["float32"],
    }
    result.update({k: round(statistics.median(v), 4) for k, v in rounds.items()})
    return result


def plot(result: dict[str, Any]) -> Any:
    """The figure of `result` (save_result picks the backend and writes it)."""
    import matplotlib.pyplot as plt

    calls_ = ["upsert", "search", "search_nprobe16"]
    labels = {
        "upsert": "upsert (1 removed, 2 added)",
        "search": f"search, nprobe {result['nprobe']}",
        "search_nprobe16": "search, nprobe 16",
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=False)
    for ax, cache in zip(axes, ("warm", "cold"), strict=True):
        x = np.arange(len(calls_))
        for offset, name in ((-0.2, "float32"), (0.2, "float16")):
            values = [result[f"{c}_{name}_{cache}_p50_ms"] for c in calls_]
            bars = ax.bar(x + offset, values, 0.4, label=f"{name} centroids")
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.set_xticks(x, [labels[c] for c in calls_], fontsize=8)
        ax.set_ylabel("ms, p50 (median of rounds)")
        title = "caches warm" if cache == "warm" else f"after writing {result['evict_mb']} MB"
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"IVF of {result['size']:,} vectors, {result['nlist']:,} lists, one thread; "
        f"{result['machine']}",
        fontsize=9,
    )
    return fig


def main() -> None:
    parser = rounds_parser(__doc__, rounds=3)
    parser.add_argument("--size", type=int, default=1_000_000, help="vectors in the org")
    parser.add_argument(
        "--target-recall",
        type=float,
        default=IndexSettings.model_fields["target_recall"].default,
        help="calibration's target (default: the shard's)",
    )
    parser.add_argument("--evict-mb", type=int, default=64, help="MB written before each cold call")
    args = parser.parse_args()
    save_result(measure(args), args.out, f"coarse-quantizer-{args.size}", plot)


if __name__ == "__main__":
    main()
