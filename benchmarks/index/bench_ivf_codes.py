"""IVF with float32 codes (IVF-Flat) against float16 codes (what the index service keeps).

Usage: python benchmarks/index/bench_ivf_codes.py [--n 1000000] [--nlist 1024]

Fills both kinds with the same unit vectors (768-d Gaussian) on the same trained lists, then
times single queries on one thread at several nprobe values, and compares their top 10:
the share of the float32 top 10 that float16 also returns, and the largest score difference.
Writes results/ivf-codes-<machine>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import faiss
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DIM = 768


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def unit(rows: np.ndarray) -> np.ndarray:
    out: np.ndarray = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="vectors")
    parser.add_argument("--nlist", type=int, default=1024, help="IVF lists")
    parser.add_argument(
        "--nprobe", type=int, nargs="+", default=[24, 96, 192], help="lists probed, each timed"
    )
    parser.add_argument("--queries", type=int, default=200, help="single queries timed")
    parser.add_argument("--machine", default="2-core x86_64 CPU", help="names it in the results")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results", help="results folder"
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    progress(f"making {args.n:,} vectors")
    vectors = unit(rng.standard_normal((args.n, DIM), dtype=np.float32))
    near = vectors[: args.queries] + 0.5 * rng.standard_normal((args.queries, DIM), np.float32)
    queries = unit(near).astype(np.float32)
    quantizer = faiss.IndexFlatIP(DIM)
    flat = faiss.IndexIVFFlat(quantizer, DIM, args.nlist, faiss.METRIC_INNER_PRODUCT)
    flat.cp.niter = 6
    progress("training the lists")
    flat.train(vectors[: args.nlist * 32])
    half = faiss.IndexIVFScalarQuantizer(
        quantizer, DIM, args.nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT, False
    )
    half.is_trained = True  # the same lists; float16 codes need no training
    labels = np.arange(args.n, dtype=np.int64)
    for name, index in (("float32", flat), ("float16", half)):
        progress(f"adding to the {name} index")
        index.add_with_ids(vectors, labels)
    faiss.omp_set_num_threads(1)
    points: list[dict[str, Any]] = []
    for nprobe in args.nprobe:
        params = faiss.SearchParametersIVF(nprobe=nprobe)
        found = {}
        for name, index in (("float32", flat), ("float16", half)):
            started = time.perf_counter()
            results = [index.search(q[None, :], 10, params=params) for q in queries]
            ms = (time.perf_counter() - started) * 1000 / len(queries)
            found[name] = results
            points.append({"codes": name, "nprobe": nprobe, "ms_per_query": ms})
            progress(f"  {name}, nprobe {nprobe}: {ms:.2f} ms a query")
        same = [
            len(set(a[1][0]) & set(b[1][0])) / 10
            for a, b in zip(found["float32"], found["float16"], strict=True)
        ]
        diff = max(
            float(np.abs(a[0] - b[0]).max())
            for a, b in zip(found["float32"], found["float16"], strict=True)
        )
        points[-1].update(same_top10=float(np.mean(same)), max_score_diff=diff)
    result = {
        "machine": args.machine,
        "vectors": args.n,
        "dim": DIM,
        "nlist": args.nlist,
        "queries": args.queries,
        "code_bytes_per_vector": {"float32": DIM * 4, "float16": DIM * 2},
        "points": points,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", args.machine.lower()).strip("-")
    path = args.out / f"ivf-codes-{slug}"
    path.with_suffix(".json").write_text(json.dumps(result, indent=2))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for codes in ("float32", "float16"):
        mine = [p for p in points if p["codes"] == codes]
        ax.plot([p["nprobe"] for p in mine], [p["ms_per_query"] for p in mine], "o-", label=codes)
    ax.set(xlabel="nprobe", ylabel="ms a query, one thread", xscale="log")
    ax.set_title(f"IVF codes, {args.n:,} vectors, {args.nlist} lists, {args.machine}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    progress(f"wrote {path}.json and .png")


if __name__ == "__main__":
    main()
