"""Vector stores behind one small interface: exact dense flat search, and FAISS IVF over
float16 codes with nprobe calibrated to a target recall.

Stores hold unit-norm vectors under int64 labels; the OrgIndex above them maps labels to chunk
and conversation ids. Every method runs on a worker thread with the org's lock held, so a store
is never used by two threads at once.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

import faiss as _faiss
import numpy as np

from index_service.vectors import Labels, Matrix

log = logging.getLogger(__name__)

# FAISS's bundled type hints lack the SWIG keyword constructors and attributes used here.
faiss: Any = _faiss

# Labels of results that are not there (fewer candidates than k).
MISSING = -1
# An IVF store's scores come from float16 codes, each component within 2**-11 of itself, so
# for unit vectors a score is within 2**-11 of the float32 inner product (Cauchy-Schwarz).
# Dense random vectors differ by 3e-5 at most; the hashing embedder's sparser ones by 1.1e-4.
IVF_SCORE_TOLERANCE = 2**-11


class VectorStore(Protocol):
    """What OrgIndex needs from an index."""

    kind: str

    @property
    def ntotal(self) -> int: ...

    def add(self, labels: Labels, vectors: Matrix) -> None: ...

    def remove(self, labels: Labels) -> None: ...

    def search(
        self, query: Matrix, k: int, subset: Labels | None, nprobe: int = 0
    ) -> tuple[Matrix, Labels]:
        """Top-k of each query row, among `subset` when given. `nprobe`: IVF lists to probe
        (0: the calibrated number); exact stores ignore it."""
        ...

    def reconstruct(self, labels: Labels) -> Matrix: ...

    def export(self, labels: Labels, vectors: Matrix) -> None:
        """Copy every label and vector into the first ntotal rows of `labels`, `vectors`."""

    def memory_bytes(self) -> int: ...


def _selector(subset: Labels) -> Any:
    return faiss.IDSelectorBatch(subset.size, faiss.swig_ptr(subset))


def exact_subset(
    store: VectorStore, query: Matrix, k: int, subset: Labels
) -> tuple[Matrix, Labels]:
    """Exact top-k among `subset` by scoring each of its vectors (used for small filters)."""
    return top_k(store.reconstruct(subset) @ query[0], subset, k)


class FlatStore:
    """Exact search over every vector: a dense matrix scored with one matrix-vector product.

    BLAS scores a query several times faster than FAISS's flat scan for a single query, and
    removal moves the last row into the hole, so deletes cost O(removed) rather than O(n).
    """

    kind = "flat"

    def __init__(self, dim: int) -> None:
        self._dim = dim
        self._vectors = np.empty((0, dim), dtype=np.float32)
        self._labels = np.empty(0, dtype=np.int64)
        self._rows: dict[int, int] = {}
        self._n = 0

    @property
    def ntotal(self) -> int:
        return self._n

    def add(self, labels: Labels, vectors: Matrix) -> None:
        end = self._n + labels.size
        if end > len(self._labels):
            self._grow(end)
        self._vectors[self._n : end] = vectors
        self._labels[self._n : end] = labels
        for row, label in enumerate(labels.tolist(), start=self._n):
            self._rows[label] = row
        self._n = end

    def remove(self, labels: Labels) -> None:
        for label in labels.tolist():
            row = self._rows.pop(label)
            last = self._n - 1
            if row != last:
                moved = int(self._labels[last])
                self._vectors[row] = self._vectors[last]
                self._labels[row] = moved
                self._rows[moved] = row
            self._n = last

    def search(
        self, query: Matrix, k: int, subset: Labels | None, nprobe: int = 0
    ) -> tuple[Matrix, Labels]:
        if subset is None:
            scores = self._vectors[: self._n] @ query[0]
            labels = self._labels[: self._n]
        else:
            # Only the subset is scored: the filter narrows candidates before ranking.
            labels = subset
            scores = self._vectors[self._row_numbers(subset)] @ query[0]
        return top_k(scores, labels, k)

    def reconstruct(self, labels: Labels) -> Matrix:
        out: Matrix = self._vectors[self._row_numbers(labels)]
        return out

    def export(self, labels: Labels, vectors: Matrix) -> None:
        labels[: self._n] = self._labels[: self._n]
        vectors[: self._n] = self._vectors[: self._n]

    def memory_bytes(self) -> int:
        # The matrix (with its growth headroom), labels, and the label -> row dict.
        return int(self._vectors.nbytes + self._labels.nbytes + self._n * 100)

    def _row_numbers(self, labels: Labels) -> Labels:
        rows = self._rows
        return np.fromiter((rows[label] for label in labels.tolist()), np.int64, labels.size)

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 1024, len(self._labels) * 3 // 2)
        vectors = np.empty((capacity, self._dim), dtype=np.float32)
        vectors[: self._n] = self._vectors[: self._n]
        labels = np.empty(capacity, dtype=np.int64)
        labels[: self._n] = self._labels[: self._n]
        self._vectors, self._labels = vectors, labels


def top_k(scores: Matrix, labels: Labels, k: int) -> tuple[Matrix, Labels]:
    """The k best (score, label) pairs as (1, k') arrays, best first, ties by label."""
    k = min(k, scores.size)
    if k == 0:
        return np.empty((1, 0), np.float32), np.empty((1, 0), np.int64)
    top = np.argpartition(-scores, k - 1)[:k] if k < scores.size else np.arange(scores.size)
    chosen = top[np.lexsort((labels[top], -scores[top]))]
    return scores[chosen][None, :].astype(np.float32), labels[chosen][None, :]


class IvfStore:
    """IVF over inner product with a hash-table direct map (so removals are cheap), its nprobe
    calibrated at build time to reach the target recall@10 on the org's own vectors.

    Vectors are kept as float16 codes, not float32. A search is bound by the memory it reads
    (the probed lists' vectors: 290 MB for 94k vectors of 768 floats), so half the bytes scan
    1.6x as fast (24.8 -> 15.3 ms a query at 1M vectors and nprobe 96 of 1024, one core;
    benchmarks/index/bench_ivf_codes.py), in half the memory, with the same top 10 (99.95% of
    them, scores within 3e-5 on random vectors)."""

    kind = "ivf"

    def __init__(self, index: Any, nprobe: int, dim: int) -> None:
        self._index = index
        self.nprobe = nprobe
        self._dim = dim

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    @property
    def nlist(self) -> int:
        return int(self._index.nlist)

    def add(self, labels: Labels, vectors: Matrix) -> None:
        self._index.add_with_ids(vectors, labels)

    def remove(self, labels: Labels) -> None:
        if labels.size:
            # The hash-table direct map removes only by an explicit id array.
            self._index.remove_ids(faiss.IDSelectorArray(labels.size, faiss.swig_ptr(labels)))

    def search(
        self, query: Matrix, k: int, subset: Labels | None, nprobe: int = 0
    ) -> tuple[Matrix, Labels]:
        probes = nprobe or self.nprobe  # FAISS probes at most nlist
        if subset is None:
            params = faiss.SearchParametersIVF(nprobe=probes)
        else:
            params = faiss.SearchParametersIVF(nprobe=probes, sel=_selector(subset))
        scores, labels = self._index.search(query, k, params=params)
        return scores, labels

    def reconstruct(self, labels: Labels) -> Matrix:
        out: Matrix = self._index.reconstruct_batch(labels)
        return out

    def export(self, labels: Labels, vectors: Matrix) -> None:
        invlists = self._index.invlists
        row = 0
        for list_no in range(self.nlist):
            size = invlists.list_size(list_no)
            if size == 0:
                continue
            ids = faiss.rev_swig_ptr(invlists.get_ids(list_no), size)
            codes = faiss.rev_swig_ptr(invlists.get_codes(list_no), size * self._dim * 2)
            labels[row : row + size] = ids
            vectors[row : row + size] = codes.view(np.float16).reshape(size, self._dim)
            row += size

    def memory_bytes(self) -> int:
        # Codes and ids in the lists, the hash direct map, the coarse centroids.
        return self.ntotal * (self._dim * 2 + 8 + 32) + self.nlist * self._dim * 4


def nlist_for(n: int) -> int:
    """Number of IVF lists: a power of two near 4*sqrt(n), at least 16."""
    return int(max(16, 2 ** round(math.log2(4 * math.sqrt(max(n, 1))))))


# k-means training of the coarse quantizer: sample points per list, and iterations. Fewer
# points a list made calibration settle on a smaller nprobe with lower recall of LongMemEval
# questions (0.934-0.937 against 0.96, at 27k chunks, in two seeds of three); 6 iterations
# instead of 10 found the same nprobe and recall, with 40% less training.
TRAIN_POINTS_PER_LIST = 32
TRAIN_ITERATIONS = 6
# nprobe values tried in calibration, about 1.5x apart; at least MIN_NPROBE lists are probed.
NPROBE_STEPS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MIN_NPROBE = 8
# Similarity of calibration's answer queries to the chunk they were drawn near: the hard
# tail of questions, not their median (see calibration_queries).
QUERY_COSINE = 0.3


def build_ivf(labels: Labels, vectors: Matrix, target_recall: float, seed: int = 1234) -> IvfStore:
    """Train and fill an IVF index, then pick the smallest nprobe whose recall@10 against
    exact search reaches `target_recall` on queries drawn near the org's own vectors.

    Deterministic for the same (labels, vectors) in the same order.
    """
    n, dim = vectors.shape
    nlist = nlist_for(n)
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFScalarQuantizer(
        quantizer, dim, nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT, False
    )  # False: codes of the vectors themselves, not of their residuals to the centroid
    index.cp.spherical = True  # centroids on the unit sphere suit inner product
    index.cp.niter = TRAIN_ITERATIONS
    index.cp.seed = seed
    index.cp.min_points_per_centroid = 5  # small orgs have thin lists; that is fine
    rng = np.random.default_rng(seed)
    sample_size = min(n, nlist * TRAIN_POINTS_PER_LIST)
    sample = vectors if sample_size == n else vectors[np.sort(rng.choice(n, sample_size, False))]
    index.train(sample)
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    index.add_with_ids(vectors, labels)
    store = IvfStore(index, nlist, dim)
    store.nprobe = _calibrate(store, vectors, target_recall, rng)
    log.info("built IVF index: %d vectors, nlist %d, nprobe %d", n, nlist, store.nprobe)
    return store


def _calibrate(
    store: IvfStore, vectors: Matrix, target: float, rng: np.random.Generator, k: int = 10
) -> int:
    """Smallest nprobe at which every kind of calibration_queries reaches `target` recall@k.

    Each kind on its own: averaged, the easy topic queries carried the harder answer queries,
    and questions got less than the target (0.949 at the nprobe whose average was 0.974, on
    100k chunks of the e2e corpus; benchmarks/e2e/calibration_variants.py)."""
    kinds = calibration_queries(vectors, rng, k).values()
    for step in (*(s for s in NPROBE_STEPS if s < store.nlist), store.nlist):
        nprobe = max(MIN_NPROBE, step)
        recalls = (recall_by_score(*store.search(q, k, None, nprobe), kth) for q, kth in kinds)
        if all(recall >= target for recall in recalls):
            break
    return nprobe


def calibration_queries(
    vectors: Matrix, rng: np.random.Generator, k: int = 10
) -> dict[str, tuple[Matrix, Matrix]]:
    """Queries built from the org's vectors, by kind, with their exact k-th best scores:
    "answer", 200 near one chunk each (a question to its answer), and "topic", 100 near the
    centroid of a chunk's neighbourhood (a question about a topic).

    Questions are short and score only about 0.45 against their best chunk (median measured
    on LongMemEval questions and chunks, benchmarks/index/recall_text.py), some far less, and
    a question's top 10 is flat: the hard ones are where recall is lost. Answer queries at
    that median found 0.98 at the nprobe where the questions found 0.939 (1M chunks of the
    e2e corpus, hashing embedder); at 0.3, about the questions' 10th percentile, they found
    within 0.011 of the questions, on either side, from nprobe 96 up at 100k and 1M chunks
    (docs/performance.md, "Calibration").
    """
    n = vectors.shape[0]
    anchors = vectors[rng.choice(n, min(200, n), replace=False)]
    _, neighbours = _exact(anchors[:100], vectors, k)
    topical = vectors[neighbours].mean(axis=1)
    topical /= np.linalg.norm(topical, axis=1, keepdims=True)
    kinds = {"answer": _noisy(anchors, QUERY_COSINE, rng), "topic": _noisy(topical, 0.8, rng)}
    return {kind: (q, _exact(q, vectors, k)[0][:, -1:]) for kind, q in kinds.items()}


def _exact(queries: Matrix, vectors: Matrix, k: int) -> tuple[Matrix, Labels]:
    """Exact top-k inner products, scored on `vectors` where they lie: a flat index would
    copy them first (3 GB at 1M vectors, beside the index being built)."""
    scores, rows = faiss.knn(queries, vectors, k, faiss.METRIC_INNER_PRODUCT)
    return scores, rows


def _noisy(rows: Matrix, cosine: float, rng: np.random.Generator) -> Matrix:
    """Rows moved to about `cosine` similarity of where they were, in a random direction."""
    noise = rng.standard_normal(rows.shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    out = rows * cosine + noise * math.sqrt(1 - cosine**2)
    result: Matrix = (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)
    return result


def recall_by_score(scores: Matrix, found: Labels, kth_best: Matrix) -> float:
    """Recall@k against exact search, by score: a hit scores at least the exact k-th best, so
    of several equal vectors (duplicate chunks) any one counts, as any one is a right answer.
    The IVF store's scores, from float16 codes, are within IVF_SCORE_TOLERANCE of exact."""
    hits = (scores >= kth_best - IVF_SCORE_TOLERANCE) & (found != MISSING)
    return float(hits.sum() / scores.size)
