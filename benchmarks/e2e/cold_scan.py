"""A query's scan back to back and after a gap: what the shard's stores cost when their vectors
are no longer in the CPU's caches, as between the calls of a client that waits for each answer.

Usage: python benchmarks/e2e/cold_scan.py [--size 100000] [--flat 10000] [--gaps 0 0.5 1 2 5]

On the e2e corpus (hashing embedder, the s150 questions), on one thread, as the shard's
request threads search:
- exact search over the first --flat chunks: on float32 vectors, one matrix-vector product
  (BLAS), and on float16 codes (FAISS's scalar quantizer: half the bytes, scores within
  2**-11),
- the float16 IVF the shard builds at --size (build_ivf) at nprobe 8 (a working set of a few
  MB, which the caches could hold) and 64,
- IVF-PQ fast-scan (384 sub-quantizers of 4 bits) on the same lists at nprobe 96, its best
  1,000 re-scored on float16 codes: at 100k it finds as much as the float16 IVF at 64
  (ivf_fastscan.py), from an eighth of the bytes a scanned vector.
Each question is timed after a gap: the thread sleeps (its CPU may idle), or spins on the
clock (the CPU stays busy but touches no memory). If the sleeping and the spinning gaps slow
the scan alike, it is the caches, emptied by other work, not the CPU waking up.
Writes results/cold-scan-<size>-<machine>.json and .png.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import matplotlib
import numpy as np
from ivf_fastscan import fastscan, reranked
from recall_at_size import (
    K,
    chunk_texts,
    corpus_options,
    embed,
    machine_slug,
    progress,
    s150_questions,
    save,
    script_parser,
)

from embed_service.hashing import HashingEmbedder
from index_service.native import single_threaded_numpy_blas
from index_service.stores import build_ivf, recall_by_score, top_k

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Search = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
ROUNDS = 3  # each (variant, gap) is timed this many times, alternated; the median is kept


def wait(seconds: float, spin: bool) -> None:
    if spin:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    elif seconds:
        time.sleep(seconds)


def p50_after_gap(search: Search, questions: np.ndarray, gap_ms: float, spin: bool) -> float:
    samples = []
    for q in questions:
        wait(gap_ms / 1000, spin)
        t0 = time.perf_counter()
        search(q[None, :])
        samples.append(time.perf_counter() - t0)
    return float(np.percentile(samples, 50) * 1000)


def kth_best(questions: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each question's exact K-th best score among `vectors`, as a column."""
    best, _ = faiss.knn(questions, vectors, K, faiss.METRIC_INNER_PRODUCT)
    return best[:, -1:]


def recall(search: Search, questions: np.ndarray, kth: np.ndarray) -> float:
    found = [search(q[None, :]) for q in questions]
    scores = np.vstack([s[0, :K] for s, _ in found])
    labels = np.vstack([lab[0, :K] for _, lab in found])
    return recall_by_score(scores, labels, kth)


def variants(args: argparse.Namespace) -> tuple[dict[str, Search], np.ndarray]:
    progress(f"chunking and embedding {args.size:,} chunks (respelt copies)")
    vectors = embed(chunk_texts(args.size, args.data, True), HashingEmbedder())
    labels = np.arange(len(vectors), dtype=np.int64)
    flat, flat_labels = np.ascontiguousarray(vectors[: args.flat]), labels[: args.flat]
    progress("building the shard's IVF index and the fast-scan one on its lists")
    store = build_ivf(labels, vectors, args.target_recall)
    halves = faiss.IndexScalarQuantizer(
        vectors.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
    )
    halves.add(vectors)
    fast = reranked(fastscan(store._index, vectors, 384), halves, 1000)
    flat_halves = faiss.IndexScalarQuantizer(
        vectors.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
    )
    flat_halves.add(vectors[: args.flat])
    found: dict[str, Search] = {
        f"exact float32 (BLAS), {args.flat:,} chunks": lambda q: top_k(flat @ q[0], flat_labels, K),
        f"exact float16 (FAISS), {args.flat:,} chunks": lambda q: flat_halves.search(q, K),
        "float16 IVF, nprobe 8": lambda q: store.search(q, K, None, 8),
        "float16 IVF, nprobe 64": lambda q: store.search(q, K, None, 64),
        "PQ384x4 fast-scan, nprobe 96, rerank 1000": lambda q: fast(q, 96),
    }
    return found, vectors


def measure(args: argparse.Namespace, questions: np.ndarray) -> dict[str, Any]:
    searches, vectors = variants(args)
    if not single_threaded_numpy_blas():
        raise SystemExit("could not set numpy's BLAS to one thread, as the shard does")
    faiss.omp_set_num_threads(1)
    result: dict[str, Any] = {"chunks": len(vectors), "variants": {}}
    # The exact searches cover the first --flat chunks, the others all of them.
    kth = {n: kth_best(questions, vectors[:n]) for n in {args.flat, len(vectors)}}
    for name, search in searches.items():
        n = args.flat if name.startswith("exact") else len(vectors)
        result["variants"][name] = {"recall_at_10": recall(search, questions, kth[n])}
    for spin in (False, True):
        gap_kind = "busy" if spin else "sleep"
        runs: dict[tuple[str, float], list[float]] = {}
        for round_ in range(ROUNDS):
            progress(f"  gaps that {'spin' if spin else 'sleep'}, round {round_ + 1}/{ROUNDS}")
            for gap in args.gaps:
                for name, search in searches.items():
                    runs.setdefault((name, gap), []).append(
                        p50_after_gap(search, questions, gap, spin)
                    )
        for (name, gap), p50s in runs.items():
            variant = result["variants"][name]
            variant.setdefault(f"{gap_kind}_gap_p50_ms", {})[str(gap)] = statistics.median(p50s)
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, variant) in enumerate(result["variants"].items()):
        color = f"C{i}"
        for kind, style in (("sleep", "o-"), ("busy", "s--")):
            points = variant[f"{kind}_gap_p50_ms"]
            label = f"{name} (recall {variant['recall_at_10']:.3f}), {kind} gap"
            ax.plot(
                [float(g) for g in points], list(points.values()), style, color=color, label=label
            )
    ax.set(xlabel="gap before each query, ms", ylabel="query p50 ms, one thread")
    ax.set_title(
        f"a query's scan after a gap, {result['chunks']:,} chunks of the e2e corpus\n"
        f"{result['machine']}",
        fontsize=10,
    )
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = script_parser(__doc__)
    corpus_options(parser, 100_000)
    parser.add_argument("--flat", type=int, default=10_000, help="chunks in the exact org")
    parser.add_argument(
        "--gaps", type=float, nargs="+", default=[0, 0.5, 1, 2, 5], help="ms before each query"
    )
    args = parser.parse_args()
    questions = s150_questions(args.data)
    result: dict[str, Any] = {"size": args.size, "machine": args.machine, "gaps_ms": args.gaps}
    result.update(questions=len(questions), **measure(args, questions))
    save(result, args.out / f"cold-scan-{args.size}-{machine_slug(args.machine)}", plot)


if __name__ == "__main__":
    main()
