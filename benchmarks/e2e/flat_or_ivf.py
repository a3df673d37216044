"""How an exact flat store and the calibrated IVF store compare by org size: what
INDEX_FLAT_THRESHOLD trades (exactness below it, scan time past it).

Usage: python benchmarks/e2e/flat_or_ivf.py [--sizes 1000 2000 ...] [--threshold 4096]
       [--embedder transformer]

On the e2e corpus (respelt copies, the hashing embedder or with --embedder transformer the
real model, as embed_service loads it; the s150 questions), at each size: the
flat store the shard keeps under its threshold (float16 codes, every vector scored), and the
IVF store the shard holds at that size past --threshold: built (lists and calibrated nprobe)
where the org crossed the threshold or last grew into more lists (nlist_for), then grown by
adds to the size. A size up to the threshold gets the IVF store a build at that size makes,
as a lower threshold would hold. Each is searched one question at a time on one thread, as
the shard's request threads search; the two take turns, question by question, for several
rounds; each round keeps its p50 and the median of the rounds is reported, with the IVF
store's recall@10 against exact search (by score, as the e2e benchmark counts it). A shard
Search adds its gRPC call to either (0.6-1 ms on these machines;
benchmarks/index/search_path.py). Writes results/flat-or-ivf-[transformer-]<machine>.json and .png.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Any

import faiss
import matplotlib
import numpy as np
from beside import K
from recall_at_size import (
    chunk_texts,
    embed,
    index_options,
    machine_slug,
    progress,
    s150_question_texts,
    s150_questions,
    save,
    script_parser,
)

from embed_service.hashing import HashingEmbedder
from index_service.native import single_threaded_faiss
from index_service.stores import FlatStore, VectorStore, build_ivf, nlist_for, recall_by_score

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SIZES = (1_000, 2_000, 4_000, 6_000, 8_000, 12_000, 16_000, 32_000)
MODEL_BATCH = 32


def embed_with_model(texts: list[str], questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """`texts` and `questions` embedded by the real model as embed_service loads it, in
    batches of MODEL_BATCH."""
    from embed_service.backends import load_embedder
    from embed_service.settings import EmbedSettings

    model = load_embedder(EmbedSettings(backend="transformer"))
    return embed(texts, model, MODEL_BATCH), embed(questions, model, MODEL_BATCH)


def built_at(n: int, threshold: int) -> int:
    """The size at which the shard last built the IVF index an org of `n` vectors holds:
    where it crossed the threshold, or later where its list count grew; `n` itself up to the
    threshold."""
    if n <= threshold:
        return n
    built = threshold + 1
    for size in range(threshold + 2, n + 1):
        if nlist_for(size) > nlist_for(size - 1):
            built = size
    return built


def timed_p50s(stores: dict[str, VectorStore], questions: np.ndarray, rounds: int) -> dict:
    """Each store's p50 in ms a round, the stores taking turns question by question."""
    p50s: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(rounds):
        samples: dict[str, list[float]] = {name: [] for name in stores}
        for q in questions:
            for name, store in stores.items():
                t0 = time.perf_counter()
                store.search(q[None, :], K, None)
                samples[name].append(time.perf_counter() - t0)
        for name in stores:
            p50s[name].append(float(np.percentile(samples[name], 50)) * 1000)
    return p50s


def measure_size(
    vectors: np.ndarray, questions: np.ndarray, args: argparse.Namespace
) -> dict[str, Any]:
    n = len(vectors)
    labels = np.arange(n, dtype=np.int64)
    flat = FlatStore(vectors.shape[1])
    flat.add(labels, vectors)
    built = built_at(n, args.threshold)
    started = time.perf_counter()
    ivf = build_ivf(labels[:built], vectors[:built], args.target_recall)
    build_s = time.perf_counter() - started
    ivf.add(labels[built:], vectors[built:])
    best, _ = faiss.knn(questions, vectors, K, faiss.METRIC_INNER_PRODUCT)
    found = [ivf.search(q[None, :], K, None) for q in questions]
    recall = recall_by_score(
        np.vstack([s for s, _ in found]), np.vstack([lab for _, lab in found]), best[:, -1:]
    )
    p50s = timed_p50s({"flat": flat, "ivf": ivf}, questions, args.rounds)
    row = {
        "vectors": n,
        "ivf_built_at": built,
        "ivf_nlist": ivf.nlist,
        "ivf_nprobe": ivf.nprobe,
        "ivf_recall_at_10": recall,
        "ivf_build_s": build_s,
        "flat_p50_ms": statistics.median(p50s["flat"]),
        "ivf_p50_ms": statistics.median(p50s["ivf"]),
        "rounds_p50_ms": p50s,
    }
    progress(
        f"{n:,} vectors: flat {row['flat_p50_ms']:.3f} ms, IVF {row['ivf_p50_ms']:.3f} ms "
        f"(nprobe {ivf.nprobe} of {ivf.nlist}, recall@10 {recall:.3f}; built at {built:,} "
        f"in {build_s:.2f} s)"
    )
    return row


def plot(result: dict[str, Any], path: Any) -> None:
    rows = result["rows"]
    sizes = [row["vectors"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(sizes, [row["flat_p50_ms"] for row in rows], marker="o", label="flat (exact)")
    left.plot(sizes, [row["ivf_p50_ms"] for row in rows], marker="o", label="IVF, calibrated")
    left.axvline(result["threshold"], color="grey", linestyle=":", label="flat threshold")
    left.set_xscale("log")
    left.set_xlabel("vectors in the org")
    left.set_ylabel("a question's search, one thread, ms p50")
    left.set_ylim(bottom=0)
    left.legend()
    right.plot(sizes, [row["ivf_recall_at_10"] for row in rows], marker="o", color="C1")
    for row in rows:
        right.annotate(
            f"{row['ivf_nprobe']}/{row['ivf_nlist']}",
            (row["vectors"], row["ivf_recall_at_10"]),
            fontsize=8,
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
        )
    right.set_xscale("log")
    right.set_xlabel("vectors in the org")
    right.set_ylabel("IVF recall@10 of the questions (nprobe / lists)")
    right.axvline(result["threshold"], color="grey", linestyle=":")
    embedder = result.get("embedder", "hashing")
    fig.suptitle(f"flat or IVF by org size, e2e corpus ({embedder} embedder), {result['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="org sizes")
    parser.add_argument(
        "--threshold", type=int, default=4096, help="the flat threshold the IVF stores follow"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median p50 is kept")
    parser.add_argument(
        "--embedder",
        choices=("hashing", "transformer"),
        default="hashing",
        help="transformer: the real model (EMBED_* settings; about 7 chunks/s on 2 cores)",
    )
    index_options(parser)
    args = parser.parse_args()
    texts = chunk_texts(max(args.sizes), args.data, True)
    progress(f"embedding {len(texts):,} chunks (respelt copies) with the {args.embedder} embedder")
    if args.embedder == "hashing":
        vectors = embed(texts, HashingEmbedder())
        questions = s150_questions(args.data)
    else:
        vectors, questions = embed_with_model(texts, s150_question_texts(args.data))
    single_threaded_faiss()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result: dict[str, Any] = {
        "machine": args.machine,
        "commit": commit,
        "embedder": args.embedder,
        "threshold": args.threshold,
        "target_recall": args.target_recall,
        "rounds": args.rounds,
        "rows": [],
    }
    for n in sorted(args.sizes):
        result["rows"].append(measure_size(np.ascontiguousarray(vectors[:n]), questions, args))
    model = "" if args.embedder == "hashing" else "transformer-"
    save(result, args.out / f"flat-or-ivf-{model}{machine_slug(args.machine)}", plot)


if __name__ == "__main__":
    main()
