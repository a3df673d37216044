"""Recall of real questions against the nprobe the index calibrates, on the e2e corpus at one size.

Usage: python benchmarks/e2e/recall_at_size.py [--size 530000] [--copies exact respelt]

Repeats the e2e benchmark's conversations (corpus.py) up to --size chunks, as exact copies or
respelt as the benchmark grows them, chunks them as the service does, embeds them with the
hashing embedder, and builds the IVF index a rebuild at that size builds. Then, for each
nprobe: recall@10 of the s150 questions against exact search (by score, as the e2e benchmark
counts it), beside that of a fresh draw of each kind of query calibration asks, and the time
of one question on one thread. The nprobe that calibration chose is marked. Writes
results/recall-at-size-<size>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import matplotlib
import numpy as np
from beside import K
from corpus import conversations

from api_service.core.chunking import chunk_text, window_end, window_starts_touching
from embed_service.embedder import Embedder
from embed_service.hashing import HashingEmbedder
from index_service.stores import NPROBE_STEPS, build_ivf, calibration_queries, recall_by_score

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "longmemeval"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def script_parser(doc: str) -> argparse.ArgumentParser:
    """A command line parser whose help is the script's docstring: its first paragraph, then
    what follows "Usage:"."""
    return argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def corpus_options(parser: argparse.ArgumentParser, size: int) -> None:
    """The options of every script here that builds an org of the e2e corpus at one size."""
    parser.add_argument("--size", type=int, default=size, help="chunks in the org")
    index_options(parser)


def index_options(parser: argparse.ArgumentParser) -> None:
    """The options of every script here that builds indexes of the e2e corpus."""
    parser.add_argument(
        "--target-recall", type=float, default=0.97, help="recall@10 the IVF is calibrated to"
    )
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument("--machine", default="2-core x86_64 CPU", help="names it in the results")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results", help="results folder"
    )


def save(result: dict[str, Any], path: Path, plot: Callable[[dict[str, Any], Path], None]) -> None:
    """`result` as path.json and its plot as path.png."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, path.with_suffix(".png"))
    progress(f"wrote {path}.json and .png")


def machine_slug(machine: str) -> str:
    """The machine's name as part of a file name."""
    return re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")


def chunk_texts(size: int, data: Path, respell: bool) -> list[str]:
    """The first `size` chunks of the corpus, as the service windows them."""
    texts: list[str] = []
    source = conversations(data, respell)
    while len(texts) < size:
        messages = next(source)
        lines = [(m["role"], m["content"]) for m in messages]
        count = len(lines)
        for start in window_starts_touching(1, count, count):
            texts.append(chunk_text(lines[start - 1 : window_end(start, count)]))
    return texts[:size]


def s150_question_texts(data: Path) -> list[str]:
    """The s150 questions' text."""
    lines = (data / "s150.questions.jsonl").read_text().splitlines()
    return [json.loads(q)["question"] for q in lines]


def s150_questions(data: Path) -> np.ndarray:
    """The s150 questions, embedded with the hashing embedder."""
    embedder = HashingEmbedder()
    vectors = embedder.embed(embedder.tokenize(s150_question_texts(data)))
    return vectors.astype(np.float32)


def embed(texts: list[str], embedder: Embedder, batch: int = 10_000) -> np.ndarray:
    """`texts` embedded `batch` at a time, with progress every tenth of them at most."""
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    every = max(batch, len(texts) // 10 // batch * batch)
    for start in range(0, len(texts), batch):
        part = texts[start : start + batch]
        out[start : start + len(part)] = embedder.embed(embedder.tokenize(part))
        if start % every == 0:
            progress(f"  embedded {start + len(part):,}/{len(texts):,}")
    return out


def measure(copies: str, args: argparse.Namespace, questions: np.ndarray) -> dict[str, Any]:
    embedder = HashingEmbedder()
    progress(f"{copies} copies: chunking and embedding {args.size:,} chunks")
    vectors = embed(chunk_texts(args.size, args.data, copies == "respelt"), embedder)
    distinct = np.unique(vectors, axis=0).shape[0]
    progress(f"  {distinct:,} distinct vectors; building the IVF index")
    started = time.perf_counter()
    store = build_ivf(np.arange(len(vectors), dtype=np.int64), vectors, args.target_recall)
    build_s = time.perf_counter() - started
    calibrated = store.nprobe
    best, _ = faiss.knn(questions, vectors, K, faiss.METRIC_INNER_PRODUCT)
    kth_best = best[:, -1:]
    # A fresh draw of the kind of queries calibration asks, for their recall beside the
    # questions' at each nprobe.
    synthetic = calibration_queries(vectors, np.random.default_rng(7), K)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # a search on one thread, as the shard's request threads run
    steps = [s for s in (*NPROBE_STEPS, store.nlist) if s <= min(store.nlist, calibrated * 4)]
    curve = []
    for nprobe in sorted(set(steps) | {calibrated}):
        started = time.perf_counter()
        found = [store.search(q[None, :], K, None, nprobe) for q in questions]
        ms = (time.perf_counter() - started) * 1000 / len(questions)
        scores = np.vstack([s for s, _ in found])
        labels = np.vstack([lab for _, lab in found])
        recall = recall_by_score(scores, labels, kth_best)
        calibration = {
            kind: recall_by_score(*store.search(q, K, None, nprobe), kth)
            for kind, (q, kth) in synthetic.items()
        }
        curve.append(
            {
                "nprobe": nprobe,
                "recall_at_10": recall,
                "calibration_recall_at_10": calibration,
                "ms_per_query": ms,
            }
        )
        kinds = ", ".join(f"{kind} {r:.3f}" for kind, r in calibration.items())
        progress(
            f"  nprobe {nprobe}: recall@10 {recall:.3f} (calibration's queries: {kinds}), "
            f"{ms:.2f} ms a query"
        )
    faiss.omp_set_num_threads(threads)
    return {
        "copies": copies,
        "chunks": len(vectors),
        "distinct_vectors": distinct,
        "nlist": store.nlist,
        "calibrated_nprobe": calibrated,
        "build_s": build_s,
        "curve": curve,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run in result["runs"]:
        nprobe = [p["nprobe"] for p in run["curve"]]
        label = f"{run['copies']} copies ({run['distinct_vectors']:,} distinct)"
        (line,) = ax1.plot(nprobe, [p["recall_at_10"] for p in run["curve"]], "o-", label=label)
        kinds = run["curve"][0].get("calibration_recall_at_10", {})  # older results lack it
        for kind, style in zip(kinds, (":", "-."), strict=False):
            synthetic = [p["calibration_recall_at_10"][kind] for p in run["curve"]]
            color = line.get_color()
            ax1.plot(nprobe, synthetic, style, color=color, label=f"  calibration's {kind} queries")
        ax2.plot(nprobe, [p["ms_per_query"] for p in run["curve"]], "o-", label=label)
        chosen = next(p for p in run["curve"] if p["nprobe"] == run["calibrated_nprobe"])
        ax1.plot([chosen["nprobe"]], [chosen["recall_at_10"]], "*", ms=16, color=line.get_color())
    ax1.axhline(result["target_recall"], ls="--", color="grey", label="calibration target")
    ax1.set(xscale="log", xlabel="nprobe", ylabel="recall@10", ylim=(0, 1.02))
    ax1.set_title("★ the nprobe calibration chose")
    ax2.set(xscale="log", yscale="log", xlabel="nprobe", ylabel="ms a query, one thread")
    ax1.legend(fontsize=8)
    fig.suptitle(f"IVF on the e2e corpus at {result['size']:,} chunks, {result['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = script_parser(__doc__)
    corpus_options(parser, 530_000)
    parser.add_argument(
        "--copies",
        nargs="+",
        choices=["exact", "respelt"],
        default=["exact", "respelt"],
        help="how the corpus repeats its conversations: exact copies, respelt ones, or both",
    )
    args = parser.parse_args()
    questions = s150_questions(args.data)
    result: dict[str, Any] = {
        "size": args.size,
        "machine": args.machine,
        "target_recall": args.target_recall,
        "questions": len(questions),
        "runs": [measure(c, args, questions) for c in args.copies],
    }
    save(result, args.out / f"recall-at-size-{args.size}", plot)


if __name__ == "__main__":
    main()
