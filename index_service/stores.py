"""FAISS index stores: exact flat search and calibrated IVF-Flat, behind one small interface.

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


class VectorStore(Protocol):
    """What OrgIndex needs from an index."""

    kind: str

    @property
    def ntotal(self) -> int: ...

    def add(self, labels: Labels, vectors: Matrix) -> None: ...

    def remove(self, labels: Labels) -> None: ...

    def search(self, query: Matrix, k: int, subset: Labels | None) -> tuple[Matrix, Labels]: ...

    def reconstruct(self, labels: Labels) -> Matrix: ...

    def export(self) -> tuple[Labels, Matrix]: ...

    def memory_bytes(self) -> int: ...


def _selector(subset: Labels) -> Any:
    return faiss.IDSelectorBatch(subset.size, faiss.swig_ptr(subset))


def exact_subset(
    store: VectorStore, query: Matrix, k: int, subset: Labels
) -> tuple[Matrix, Labels]:
    """Exact top-k among `subset` by scoring each of its vectors (used for small filters)."""
    vectors = store.reconstruct(subset)
    scores = vectors @ query[0]
    k = min(k, subset.size)
    top = np.argpartition(-scores, k - 1)[:k] if k < subset.size else np.arange(subset.size)
    # Ties broken by label so results are deterministic.
    order = np.lexsort((subset[top], -scores[top]))
    chosen = top[order]
    return scores[chosen][None, :].astype(np.float32), subset[chosen][None, :]


class FlatStore:
    """Exact inner-product search over every vector (IndexIDMap2 over IndexFlatIP)."""

    kind = "flat"

    def __init__(self, dim: int) -> None:
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._dim = dim

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    def add(self, labels: Labels, vectors: Matrix) -> None:
        self._index.add_with_ids(vectors, labels)

    def remove(self, labels: Labels) -> None:
        if labels.size:
            self._index.remove_ids(_selector(labels))

    def search(self, query: Matrix, k: int, subset: Labels | None) -> tuple[Matrix, Labels]:
        if subset is None:
            scores, labels = self._index.search(query, k)
        else:
            # The selector is applied while scanning, so the filter narrows candidates
            # before ranking; the result is exact.
            params = faiss.SearchParameters(sel=_selector(subset))
            scores, labels = self._index.search(query, k, params=params)
        return scores, labels

    def reconstruct(self, labels: Labels) -> Matrix:
        out = np.empty((labels.size, self._dim), dtype=np.float32)
        for row, label in enumerate(labels.tolist()):
            out[row] = self._index.reconstruct(label)
        return out

    def export(self) -> tuple[Labels, Matrix]:
        n = self.ntotal
        labels = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        flat = faiss.downcast_index(self._index.index)
        vectors = faiss.rev_swig_ptr(flat.get_xb(), n * self._dim).reshape(n, self._dim).copy()
        return labels, vectors

    def memory_bytes(self) -> int:
        # Vectors, the id map and the reverse hash map (about 32 bytes an entry).
        return self.ntotal * (self._dim * 4 + 8 + 32)


class IvfStore:
    """IVF-Flat over inner product with a hash-table direct map (so removals are cheap), its
    nprobe calibrated at build time to reach the target recall@10 on the org's own vectors."""

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

    def search(self, query: Matrix, k: int, subset: Labels | None) -> tuple[Matrix, Labels]:
        if subset is None:
            params = faiss.SearchParametersIVF(nprobe=self.nprobe)
        else:
            params = faiss.SearchParametersIVF(nprobe=self.nprobe, sel=_selector(subset))
        scores, labels = self._index.search(query, k, params=params)
        return scores, labels

    def reconstruct(self, labels: Labels) -> Matrix:
        out = np.empty((labels.size, self._dim), dtype=np.float32)
        for row, label in enumerate(labels.tolist()):
            out[row] = self._index.reconstruct(label)
        return out

    def export(self) -> tuple[Labels, Matrix]:
        invlists = self._index.invlists
        all_labels: list[Labels] = []
        all_vectors: list[Matrix] = []
        for list_no in range(self.nlist):
            size = invlists.list_size(list_no)
            if size == 0:
                continue
            ids = faiss.rev_swig_ptr(invlists.get_ids(list_no), size).copy()
            codes = faiss.rev_swig_ptr(invlists.get_codes(list_no), size * self._dim * 4)
            all_labels.append(ids.astype(np.int64))
            all_vectors.append(codes.view(np.float32).reshape(size, self._dim).copy())
        if not all_labels:
            return np.empty(0, np.int64), np.empty((0, self._dim), np.float32)
        return np.concatenate(all_labels), np.concatenate(all_vectors)

    def memory_bytes(self) -> int:
        # Codes and ids in the lists, the hash direct map, the coarse centroids.
        return self.ntotal * (self._dim * 4 + 8 + 32) + self.nlist * self._dim * 4


def nlist_for(n: int) -> int:
    """Number of IVF lists: a power of two near 4*sqrt(n), at least 16."""
    return int(max(16, 2 ** round(math.log2(4 * math.sqrt(max(n, 1))))))


# nprobe values tried in calibration, about 1.5x apart; at least MIN_NPROBE lists are probed.
NPROBE_STEPS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MIN_NPROBE = 8


def build_ivf(labels: Labels, vectors: Matrix, target_recall: float, seed: int = 1234) -> IvfStore:
    """Train and fill an IVF-Flat index, then pick the smallest nprobe whose recall@10 against
    exact search reaches `target_recall` on queries drawn near the org's own vectors.

    Deterministic for the same (labels, vectors) in the same order.
    """
    n, dim = vectors.shape
    nlist = nlist_for(n)
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.spherical = True  # centroids on the unit sphere suit inner product
    index.cp.niter = 10
    index.cp.seed = seed
    rng = np.random.default_rng(seed)
    sample_size = min(n, nlist * 32)
    sample = vectors if sample_size == n else vectors[np.sort(rng.choice(n, sample_size, False))]
    index.train(sample)
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    index.add_with_ids(vectors, labels)
    store = IvfStore(index, nlist, dim)
    store.nprobe = _calibrate(store, labels, vectors, target_recall, rng)
    log.info("built IVF index: %d vectors, nlist %d, nprobe %d", n, nlist, store.nprobe)
    return store


def _calibrate(
    store: IvfStore,
    labels: Labels,
    vectors: Matrix,
    target: float,
    rng: np.random.Generator,
    k: int = 10,
) -> int:
    """Smallest nprobe reaching `target` recall@k on two kinds of queries built from the
    org's vectors: near one chunk (cosine 0.6, a question to its answer) and near the centroid
    of a chunk's neighbourhood (a question about a topic)."""
    n, dim = vectors.shape
    exact = faiss.IndexFlatIP(dim)
    exact.add(vectors)
    anchors = vectors[rng.choice(n, min(100, n), replace=False)]
    _, neighbours = exact.search(anchors, k)
    topical = vectors[neighbours].mean(axis=1)
    topical /= np.linalg.norm(topical, axis=1, keepdims=True)
    queries = np.concatenate([_noisy(anchors, 0.6, rng), _noisy(topical, 0.8, rng)])
    _, positions = exact.search(queries, k)
    truth = labels[positions]
    for nprobe in (*(s for s in NPROBE_STEPS if s < store.nlist), store.nlist):
        store.nprobe = max(MIN_NPROBE, nprobe)
        _, found = store.search(queries, k, None)
        if _recall(found, truth) >= target:
            break
    return store.nprobe


def _noisy(rows: Matrix, cosine: float, rng: np.random.Generator) -> Matrix:
    """Rows moved to about `cosine` similarity of where they were, in a random direction."""
    noise = rng.standard_normal(rows.shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    out = rows * cosine + noise * math.sqrt(1 - cosine**2)
    result: Matrix = (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)
    return result


def _recall(found: Any, truth: Any) -> float:
    hits = sum(len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True))
    return float(hits / truth.size)
