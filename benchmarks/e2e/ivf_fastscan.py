"""Float16 IVF (what the shard keeps) against 4-bit PQ fast-scan re-ranked on float16 vectors,
on the e2e corpus at one size: recall of real questions against the time of a query.

Usage: python benchmarks/e2e/ivf_fastscan.py [--size 100000] [--m 192 384] [--rerank 100 300 1000]

Builds the IVF index a shard builds at that size (build_ivf: its lists and calibrated nprobe),
then, on the same lists, an IVF-PQ fast-scan index with --m sub-quantizers of 4 bits each.
A fast-scan search asks for the --rerank best by its codes and scores those on float16
codes of the vectors (FAISS's IndexRefine), as a store holding both would. For each nprobe
up to four times the calibrated one: recall@10 of the s150 questions against exact search
(by score, as the e2e benchmark counts it) and the time of one question on one thread, for
the float16 IVF and for each fast-scan variant.
Writes results/ivf-fastscan-<size>-<machine>.json and .png.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import matplotlib
import numpy as np
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
from index_service.stores import NPROBE_STEPS, build_ivf, recall_by_score

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Search = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def fastscan(store_index: Any, vectors: np.ndarray, m: int) -> Any:
    """An IVF-PQ fast-scan index on the float16 index's own lists (a copy of its quantizer),
    its codes from the vectors themselves, not from their residuals, as the float16 codes."""
    quantizer = faiss.clone_index(faiss.downcast_index(store_index.quantizer))
    dim = vectors.shape[1]
    index = faiss.IndexIVFPQFastScan(
        quantizer, dim, store_index.nlist, m, 4, faiss.METRIC_INNER_PRODUCT
    )
    index.by_residual = False
    rng = np.random.default_rng(0)
    sample = vectors[np.sort(rng.choice(len(vectors), min(len(vectors), 65_536), False))]
    index.train(sample)  # the lists are trained already: this trains the PQ codebooks
    index.add_with_ids(vectors, np.arange(len(vectors), dtype=np.int64))
    return index


def reranked(index: Any, halves: Any, depth: int) -> Search:
    """Search by fast-scan codes for `depth` candidates, then score them on float16 codes
    (FAISS's IndexRefine, in C++: gathering and converting them in numpy cost more than the
    scan saved)."""
    refine = faiss.IndexRefine(index, halves)
    params = {
        nprobe: faiss.IndexRefineSearchParameters(
            k_factor=depth / K, base_index_params=faiss.SearchParametersIVF(nprobe=nprobe)
        )
        for nprobe in (*NPROBE_STEPS, index.nlist)
    }

    def search(query: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
        scores, labels = refine.search(query, K, params=params[nprobe])
        return scores, labels

    return search


def timed_curve(
    search: Search, questions: np.ndarray, kth_best: np.ndarray, nprobes: list[int]
) -> list[dict[str, float]]:
    curve = []
    for nprobe in nprobes:
        for q in questions[:10]:  # warm-up
            search(q[None, :], nprobe)
        started = time.perf_counter()
        found = [search(q[None, :], nprobe) for q in questions]
        ms = (time.perf_counter() - started) * 1000 / len(questions)
        scores = np.full((len(found), K), -np.inf, dtype=np.float32)
        labels = np.full((len(found), K), -1, dtype=np.int64)
        for row, (s, lab) in enumerate(found):
            scores[row, : s.shape[1]], labels[row, : lab.shape[1]] = s[0], lab[0]
        recall = recall_by_score(scores, labels, kth_best)
        curve.append({"nprobe": nprobe, "recall_at_10": recall, "ms_per_query": ms})
        progress(f"    nprobe {nprobe}: recall@10 {recall:.3f}, {ms:.2f} ms a query")
    return curve


def measure(args: argparse.Namespace, questions: np.ndarray) -> dict[str, Any]:
    progress(f"chunking and embedding {args.size:,} chunks (respelt copies)")
    vectors = embed(chunk_texts(args.size, args.data, True), HashingEmbedder())
    labels = np.arange(len(vectors), dtype=np.int64)
    progress("building the shard's IVF index")
    store = build_ivf(labels, vectors, args.target_recall)
    best, _ = faiss.knn(questions, vectors, K, faiss.METRIC_INNER_PRODUCT)
    kth_best = best[:, -1:]
    nprobes = [s for s in (*NPROBE_STEPS, store.nlist) if s <= min(store.nlist, store.nprobe * 4)]
    # Float16 codes of every vector by label (labels are row numbers here), to re-rank on.
    halves = faiss.IndexScalarQuantizer(
        vectors.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
    )
    halves.add(vectors)
    variants: dict[str, Search] = {
        "float16 IVF": lambda q, nprobe: store.search(q, K, None, nprobe)
    }
    for m in args.m:
        progress(f"building the fast-scan index, {m} sub-quantizers")
        index = fastscan(store._index, vectors, m)  # the benchmark reaches into the store
        for depth in args.rerank:
            variants[f"PQ{m}x4 fast-scan, rerank {depth}"] = reranked(index, halves, depth)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # one thread, as the shard's request threads search
    curves = {}
    for name, search in variants.items():
        progress(f"  {name}")
        curves[name] = timed_curve(search, questions, kth_best, nprobes)
    faiss.omp_set_num_threads(threads)
    return {
        "chunks": len(vectors),
        "nlist": store.nlist,
        "calibrated_nprobe": store.nprobe,
        "curves": curves,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, curve in result["curves"].items():
        style = "o-" if name.startswith("float16") else ".--"
        ax.plot(
            [p["ms_per_query"] for p in curve],
            [p["recall_at_10"] for p in curve],
            style,
            label=name,
        )
    ax.set(xlabel="ms a question, one thread", ylabel="recall@10 (s150 questions)", xscale="log")
    ax.set_title(
        f"{result['chunks']:,} chunks of the e2e corpus, nlist {result['nlist']}, "
        f"calibrated nprobe {result['calibrated_nprobe']}\n{result['machine']}",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = script_parser(__doc__)
    corpus_options(parser, 100_000)
    parser.add_argument("--m", type=int, nargs="+", default=[192, 384], help="sub-quantizers")
    parser.add_argument(
        "--rerank",
        type=int,
        nargs="+",
        default=[100, 300, 1000],
        help="candidates re-scored on float16 codes",
    )
    args = parser.parse_args()
    questions = s150_questions(args.data)
    result: dict[str, Any] = {"size": args.size, "machine": args.machine}
    result.update(questions=len(questions), **measure(args, questions))
    save(result, args.out / f"ivf-fastscan-{args.size}-{machine_slug(args.machine)}", plot)


if __name__ == "__main__":
    main()
