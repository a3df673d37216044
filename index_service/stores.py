"""Vector stores behind one small interface: exact flat search, and IVF with nprobe
calibrated to a target recall. Both keep float16 codes in FAISS inverted lists.

Stores hold unit-norm vectors under int64 labels; the OrgIndex above them maps labels to chunk
and conversation ids. Every method runs with the org's lock held, so a store is never used by
two threads at once.
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
# Scores come from float16 codes, each component within 2**-11 of itself, so for unit vectors
# a score is within 2**-11 of the float32 inner product (Cauchy-Schwarz). Dense random
# vectors differ by 3e-5 at most; the hashing embedder's sparser ones by 1.1e-4.
SCORE_TOLERANCE = 2**-11


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


class Float16Lists:
    """Vectors as float16 codes in the inverted lists of a FAISS IVF index, found by label
    through a hash-table direct map (so removals cost O(removed), not O(n)).

    A search reads every vector of the lists it scans, so it is bound by memory: half the
    bytes of float32 scan 1.6x as fast (24.8 -> 15.3 ms a query at 1M vectors and nprobe 96
    of 1024, one core; benchmarks/index/bench_ivf_codes.py), in half the memory, with the
    same top 10 (99.95% of them, scores within 3e-5 on random vectors)."""

    kind = ""

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


def _float16_ivf(dim: int, nlist: int) -> Any:
    """An untrained IVF index over inner product whose lists hold float16 codes of the vectors
    themselves (not of their residuals to a centroid)."""
    return faiss.IndexIVFScalarQuantizer(
        faiss.IndexFlatIP(dim), dim, nlist, faiss.ScalarQuantizer.QT_fp16,
        faiss.METRIC_INNER_PRODUCT, False,
    )  # fmt: skip


class FlatStore(Float16Lists):
    """Exact search: every vector is scored, by FAISS's SIMD scan of a single list of float16
    codes; the ranking is exact up to SCORE_TOLERANCE. On one Zen 4 core the float32
    matrix-vector product (BLAS) it replaces took 2.4x as long at 10k-20k vectors (0.99 against
    0.42 ms at 10k), where the matrix outgrows the caches, and was 0.02-0.04 ms faster at
    1k-5k."""

    kind = "flat"

    def __init__(self, dim: int) -> None:
        index = _float16_ivf(dim, 1)
        index.quantizer.add(np.zeros((1, dim), np.float32))  # the one list every vector joins
        index.is_trained = True  # float16 codes need no training
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        super().__init__(index, nprobe=1, dim=dim)

    def search(
        self, query: Matrix, k: int, subset: Labels | None, nprobe: int = 0
    ) -> tuple[Matrix, Labels]:
        return super().search(query, k, subset, 1)


def top_k(scores: Matrix, labels: Labels, k: int) -> tuple[Matrix, Labels]:
    """The k best (score, label) pairs as (1, k') arrays, best first, ties by label."""
    k = min(k, scores.size)
    if k == 0:
        return np.empty((1, 0), np.float32), np.empty((1, 0), np.int64)
    top = np.argpartition(-scores, k - 1)[:k] if k < scores.size else np.arange(scores.size)
    chosen = top[np.lexsort((labels[top], -scores[top]))]
    return scores[chosen][None, :].astype(np.float32), labels[chosen][None, :]


def bulk_assign_rows(dim: int) -> int:
    """Adds of at least this many vectors find their lists with the float32 centroids, for
    FAISS then scores them by a BLAS matrix product; smaller adds, and every search, with
    float16 copies (IvfStore). FAISS switches to BLAS once rows x dim reach its threshold
    (128,000 in faiss-cpu 1.15: 167 rows of 768 dimensions, as timed)."""
    threshold: int = faiss.cvar.distance_compute_blas_threshold
    return max(1, math.ceil(threshold / dim))


class IvfStore(Float16Lists):
    """IVF over inner product, its nprobe calibrated at build time to reach the target
    recall@10 on the org's own vectors (build_ivf).

    Every search and every request's add first scores all the centroids: at 1M vectors 4,096
    of them, 12.6 MB in float32, which the CPU's caches seldom still hold when the next call
    comes. The index scores them in float16 (half the bytes; within 2**-11, as the codes), and
    keeps the float32 ones for bulk adds, which gain more from BLAS than they lose in bytes:
    with the float16 centroids alone, building 1M vectors took 111 s instead of 52."""

    kind = "ivf"

    def __init__(self, index: Any, nprobe: int, dim: int) -> None:
        super().__init__(index, nprobe, dim)
        self._bulk_quantizer = index.quantizer  # the float32 centroids it was trained with
        centroids = self._bulk_quantizer.reconstruct_n(0, index.nlist)
        self._quantizer = faiss.IndexScalarQuantizer(
            dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
        )
        self._quantizer.train(centroids)  # float16 codes need no training: this only marks it
        self._quantizer.add(centroids)
        index.quantizer = self._quantizer  # both stay referenced here, for FAISS holds neither
        self._bulk_rows = bulk_assign_rows(dim)

    def add(self, labels: Labels, vectors: Matrix) -> None:
        if labels.size < self._bulk_rows:
            super().add(labels, vectors)
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)  # read through raw pointers
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        _, lists = self._bulk_quantizer.search(vectors, 1)
        self._index.add_core(
            labels.size, faiss.swig_ptr(vectors), faiss.swig_ptr(labels), faiss.swig_ptr(lists)
        )

    def memory_bytes(self) -> int:
        return super().memory_bytes() + self.nlist * self._dim * 2


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
    index = _float16_ivf(dim, nlist)
    index.cp.spherical = True  # centroids on the unit sphere suit inner product
    index.cp.niter = TRAIN_ITERATIONS
    index.cp.seed = seed
    index.cp.min_points_per_centroid = 5  # small orgs have thin lists; that is fine
    rng = np.random.default_rng(seed)
    sample_size = min(n, nlist * TRAIN_POINTS_PER_LIST)
    sample = vectors if sample_size == n else vectors[np.sort(rng.choice(n, sample_size, False))]
    index.train(sample)
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    store = IvfStore(index, nlist, dim)
    store.add(labels, vectors)
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
    The stores' scores, from float16 codes, are within SCORE_TOLERANCE of exact."""
    hits = (scores >= kth_best - SCORE_TOLERANCE) & (found != MISSING)
    return float(hits.sum() / scores.size)
