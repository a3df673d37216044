"""Recall of the s150 questions against that of calibration-like queries drawn at several
cosines, at each nprobe, on one IVF build of the e2e corpus at one size.

Usage: python benchmarks/e2e/calibration_variants.py SIZE > results/calibration-variants-SIZE.txt

The evidence behind index_service.stores.QUERY_COSINE and the per-kind rule of calibration
(docs/performance.md, "Calibration"): "answer" queries are a chunk moved to a cosine from
where it was, "topic" queries the centroid of a chunk's ten nearest, moved likewise. 200 of
each, drawn apart from the build's own. Prints the questions' best and 10th best score
quantiles, each variant's best-score quantiles, then one line of recalls per nprobe.
"""

from __future__ import annotations

import json
import sys

import faiss
import numpy as np
from beside import K
from recall_at_size import DATA, chunk_texts, embed

from embed_service.hashing import HashingEmbedder
from index_service.stores import _exact, _noisy, build_ivf, recall_by_score

QUANTILES = [0.1, 0.25, 0.5, 0.75, 0.9]


def main() -> None:
    size = int(sys.argv[1])
    embedder = HashingEmbedder()
    lines = (DATA / "s150.questions.jsonl").read_text().splitlines()
    texts = [json.loads(q)["question"] for q in lines]
    questions = embedder.embed(embedder.tokenize(texts)).astype(np.float32)
    vectors = embed(chunk_texts(size, DATA, True), embedder)
    store = build_ivf(np.arange(len(vectors), dtype=np.int64), vectors, 0.97)
    print(f"{len(vectors):,} chunks, nlist {store.nlist}, calibrated nprobe {store.nprobe}")
    best, _ = faiss.knn(questions, vectors, K, faiss.METRIC_INNER_PRODUCT)
    print("questions' best score quantiles", np.quantile(best[:, 0], QUANTILES).round(3))
    print("questions' 10th score quantiles", np.quantile(best[:, -1], QUANTILES).round(3))
    rng = np.random.default_rng(7)
    anchors = vectors[rng.choice(len(vectors), 200, replace=False)]
    _, neighbours = _exact(anchors, vectors, K)
    topical = vectors[neighbours].mean(axis=1)
    topical /= np.linalg.norm(topical, axis=1, keepdims=True)
    variants = {f"answer{c}": _noisy(anchors, c, rng) for c in (0.45, 0.35, 0.3, 0.25)}
    variants |= {f"topic{c}": _noisy(topical, c, rng) for c in (0.8, 0.6, 0.45)}
    kth = {name: _exact(q, vectors, K)[0][:, -1:] for name, q in variants.items()}
    for name, q in variants.items():
        top = _exact(q, vectors, 1)[0][:, 0]
        print(name, "best score quantiles", np.quantile(top, [0.1, 0.5, 0.9]).round(3))
    for nprobe in (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512):
        if nprobe > store.nlist:
            break
        found = store.search(questions, K, None, nprobe)
        row = {"questions": recall_by_score(*found, best[:, -1:])}
        for name, q in variants.items():
            row[name] = recall_by_score(*store.search(q, K, None, nprobe), kth[name])
        print(nprobe, {name: round(r, 3) for name, r in row.items()}, flush=True)


if __name__ == "__main__":
    main()
