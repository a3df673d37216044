"""One organization's vectors: chunk and conversation bookkeeping over a flat or IVF store.

Not thread-safe: the registry serializes the calls for an org behind that org's lock (on
worker threads, or on its event loop for short ones). A rebuild's `snapshot_room`, `build`
and `catch_up` run without it, as their docstrings say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from index_service.stores import (
    MISSING,
    FlatStore,
    IvfStore,
    VectorStore,
    build_ivf,
    exact_subset,
    nlist_for,
)
from index_service.vectors import Labels, Matrix

# Vectors an org may gain between `snapshot_room` and `begin_rebuild`, which waits for the
# lock; past that, `begin_rebuild` makes room of its own under the lock.
SNAPSHOT_SLACK = 4096
# A filter's chunks (conversations, tags, a project) are scored alone, exactly, up to this many
# or the flat threshold if larger: an IVF index's nprobe is calibrated for org-wide searches,
# and a subset's 10th best lies deeper in the org's ranking than the org's own 10th. Past it
# the probed IVF lists are searched with the filter.
EXACT_FILTER_CHUNKS = 20_000
# Scanning IVF lists costs about twice a vector what a flat scan does (benchmarks/e2e/
# flat_or_ivf.py: 0.22-0.30 against 0.11-0.16 microseconds): scan_bound counts them so.
IVF_SCAN_WEIGHT = 2


@dataclass(frozen=True)
class Hit:
    """One search result."""

    chunk_id: str
    conversation_id: str
    score: float


@dataclass(frozen=True)
class Snapshot:
    """The vectors of an org at one moment, in no particular order, to build a new store from
    without the lock."""

    labels: Labels
    vectors: Matrix


# A change recorded while a background rebuild runs, replayed onto the new store before it
# replaces the old one: (labels removed, labels added, vectors added).
Change = tuple[Labels, Labels, Matrix]


def build_store(
    labels: Labels, vectors: Matrix, dim: int, flat_threshold: int, target_recall: float
) -> VectorStore:
    """A flat store up to `flat_threshold` vectors, a calibrated IVF store past it."""
    if labels.size > flat_threshold:
        return build_ivf(labels, vectors, target_recall)
    store = FlatStore(dim)
    if labels.size:
        store.add(labels, vectors)
    return store


class OrgIndex:
    """Vectors of one org keyed by chunk id, with per-conversation label sets for exact filters.

    Each chunk keeps the version it was written with (its row version in PostgreSQL): an
    upsert never replaces a newer version, so writers that race (two appends to one
    conversation, or two API replicas) cannot leave a stale vector. Version 0 is a writer that
    gives none: it always replaces, as before versions existed.
    """

    def __init__(self, dim: int, flat_threshold: int, target_recall: float) -> None:
        self.dim = dim
        self._flat_threshold = flat_threshold
        self._exact_filter = max(flat_threshold, EXACT_FILTER_CHUNKS)
        self._target_recall = target_recall
        self._labels: dict[str, int] = {}
        self._versions: dict[str, int] = {}
        self._owners: dict[int, tuple[str, str]] = {}
        self._by_conversation: dict[str, set[int]] = {}
        self._next_label = 0
        self._store: VectorStore = FlatStore(dim)
        self._changes: list[Change] | None = None  # recorded while a rebuild runs
        self._replayed = 0  # how many of them the rebuilt store has had

    @classmethod
    def from_rows(
        cls,
        chunk_ids: list[str],
        conversation_ids: list[str],
        vectors: Matrix,
        versions: list[int] | None = None,
        *,
        flat_threshold: int,
        target_recall: float,
    ) -> OrgIndex:
        """An index holding the given rows (unit-norm vectors), built in one pass."""
        org = cls(vectors.shape[1], flat_threshold, target_recall)
        versions = versions or [0] * len(chunk_ids)
        keep = _newest_rows(chunk_ids, versions)
        if len(keep) != len(chunk_ids):
            chunk_ids = [chunk_ids[r] for r in keep]
            conversation_ids = [conversation_ids[r] for r in keep]
            versions = [versions[r] for r in keep]
            vectors = np.ascontiguousarray(vectors[np.array(keep, dtype=np.int64)])
        labels = org._assign(chunk_ids, conversation_ids, versions)
        org._store = build_store(labels, vectors, org.dim, flat_threshold, target_recall)
        return org

    @property
    def size(self) -> int:
        return len(self._labels)

    @property
    def kind(self) -> str:
        return self._store.kind

    @property
    def lists(self) -> tuple[int, int]:
        """IVF lists and the calibrated number a search probes; (0, 0) for exact search."""
        if isinstance(self._store, IvfStore):
            return self._store.nlist, self._store.nprobe
        return 0, 0

    def memory_bytes(self) -> int:
        """Approximate bytes held: the store plus the id bookkeeping (about 250 bytes a chunk)."""
        return self._store.memory_bytes() + self.size * 250

    def upsert(
        self,
        chunk_ids: list[str],
        conversation_ids: list[str],
        vectors: Matrix,
        versions: list[int] | None = None,
    ) -> int:
        """Insert or replace chunks; the next search sees them. An item older than the
        chunk's current version is skipped (0: unversioned, never skipped). Returns the number
        written."""
        versions = versions or [0] * len(chunk_ids)
        keep = [
            r
            for r in _newest_rows(chunk_ids, versions)
            if versions[r] == 0 or versions[r] >= self._versions.get(chunk_ids[r], 0)
        ]
        if not keep:
            return 0
        rows = np.array(keep, dtype=np.int64)
        chunks = [chunk_ids[r] for r in keep]
        replaced = np.array([self._labels[c] for c in chunks if c in self._labels], dtype=np.int64)
        self._forget(replaced)
        labels = self._assign(
            chunks, [conversation_ids[r] for r in keep], [versions[r] for r in keep]
        )
        self._apply(replaced, labels, np.ascontiguousarray(vectors[rows]))
        return len(chunks)

    def delete(self, chunk_ids: list[str], conversation_ids: list[str]) -> int:
        """Remove the given chunks and every chunk of the given conversations."""
        doomed = {self._labels[c] for c in chunk_ids if c in self._labels}
        for conversation in conversation_ids:
            doomed |= self._by_conversation.get(conversation, set())
        labels = np.array(sorted(doomed), dtype=np.int64)
        self._forget(labels)
        self._apply(labels, np.empty(0, np.int64), np.empty((0, self.dim), np.float32))
        return int(labels.size)

    def scan_bound(self, conversation_ids: list[str], nprobe: int = 0) -> int:
        """About how many vectors a search with this filter scores, in flat-scan terms: the
        given conversations' chunks where `search` scores them alone; else a flat store's
        every vector, or an IVF store's centroids and its probed lists at their mean length
        (IVF_SCAN_WEIGHT times), plus the filter's chunks, which `search` scores exactly where
        those lists held too few of them."""
        chunks = 0
        if conversation_ids:
            chunks = sum(len(self._by_conversation.get(c, ())) for c in set(conversation_ids))
            if self._store.kind == "flat" or chunks <= self._exact_filter:
                return chunks
        if not isinstance(self._store, IvfStore):
            return self.size
        lists = self._store.nlist
        probed = min(nprobe or self._store.nprobe, lists)
        return lists + IVF_SCAN_WEIGHT * math.ceil(probed * self.size / lists) + chunks

    def write_bound(self, count: int) -> int:
        """About how many vectors an upsert of `count` scores: each new vector against every
        IVF list's centroid to find its list (a flat store's one list: none to choose)."""
        return count * max(self.lists[0], 1)

    def search(
        self, query: Matrix, k: int, conversation_ids: list[str], nprobe: int = 0
    ) -> list[Hit]:
        """Top-k by inner product; with `conversation_ids`, only their chunks are candidates.
        `nprobe`, when nonzero, replaces an IVF store's calibrated one."""
        if not self._labels:
            return []
        if not conversation_ids:
            scores, labels = self._store.search(query, k, None, nprobe)
            return self._hits(scores[0], labels[0])
        allowed: set[int] = set()
        for conversation in set(conversation_ids):
            allowed |= self._by_conversation.get(conversation, set())
        if not allowed:
            return []
        subset = np.array(sorted(allowed), dtype=np.int64)
        want = min(k, subset.size)
        if self._store.kind == "flat" or subset.size <= self._exact_filter:
            # Every allowed chunk is scored, so the ranking is exact.
            scores, labels = exact_subset(self._store, query, k, subset)
        else:
            scores, labels = self._store.search(query, k, subset, nprobe)
            if int((labels[0] != MISSING).sum()) < want:
                # The probed lists held too few allowed chunks: score the subset exactly
                # rather than answer short.
                scores, labels = exact_subset(self._store, query, k, subset)
        return self._hits(scores[0], labels[0])

    def needs_rebuild(self) -> bool:
        """Whether the store no longer fits the org's size and no rebuild is under way: a flat
        store past the threshold, an IVF store whose list count is too small for its size (it
        doubles with every 4x growth) or that shrank to half the threshold.

        Growth with the list count unchanged keeps the store: nprobe keeps probing the same
        share of the lists. In the end-to-end benchmark recall@10 was 0.960 at 100k on lists
        trained at 33k, and 0.928 at 1M on lists trained at 529k. Growing to 1M, rebuilding at
        every doubling built 1.26M vectors; this builds 0.71M."""
        if self._changes is not None:
            return False
        n = self.size
        if isinstance(self._store, IvfStore):
            return nlist_for(n) > self._store.nlist or n <= self._flat_threshold // 2
        return n > self._flat_threshold

    def snapshot_room(self) -> Snapshot:
        """Room for a snapshot of this org, with SNAPSHOT_SLACK rows to spare and every page
        already touched. Needs no lock (a size read mid-write only makes the room smaller):
        made before `begin_rebuild`, it leaves that call only the copy, 0.09 s at 524k vectors
        (benchmarks/index/bench_snapshot.py), where first touches of 1.6 GB took up to 3 s."""
        rows = self.size + SNAPSHOT_SLACK
        room = Snapshot(np.empty(rows, np.int64), np.empty((rows, self.dim), np.float32))
        room.labels.fill(0)  # fresh pages are mapped at their first write, not at allocation
        room.vectors.fill(0.0)
        return room

    def begin_rebuild(self, room: Snapshot | None = None) -> Snapshot:
        """Snapshot the vectors into `room` (see `snapshot_room`; made here if it is missing
        or too small) and start recording changes until `finish_rebuild`. The org waits while
        this runs, so it only copies: `build` puts the rows in order."""
        n = self._store.ntotal
        if room is None or room.labels.size < n:
            room = self.snapshot_room()
        self._store.export(room.labels, room.vectors)
        self._changes = []
        self._replayed = 0
        return Snapshot(room.labels[:n], room.vectors[:n])

    def build(self, snapshot: Snapshot) -> VectorStore:
        """Build the store that fits `snapshot`; thread-safe, needs no lock. Rows go in label
        order, so the same vectors always build the same store. The snapshot is sorted in
        place: a sorted copy would hold a second snapshot's memory through the build."""
        order = np.argsort(snapshot.labels)
        snapshot.labels[:] = snapshot.labels[order]
        snapshot.vectors[:] = snapshot.vectors[order]  # the gathered copy is freed here
        return build_store(
            snapshot.labels, snapshot.vectors, self.dim, self._flat_threshold, self._target_recall
        )

    def catch_up(self, store: VectorStore) -> int:
        """Replay onto the rebuilt `store` the changes recorded since the last replay; return
        how many. Needs no lock: `store` serves nothing yet, and the changes list only grows
        meanwhile. Catching up first leaves `finish_rebuild`, which holds the org's lock, only
        the last few: an org growing fast during a long build would otherwise stall there."""
        changes = self._changes or []
        upto = len(changes)
        for removed, added, vectors in changes[self._replayed : upto]:
            store.remove(removed)
            if added.size:
                store.add(added, vectors)
        count, self._replayed = upto - self._replayed, upto
        return count

    def finish_rebuild(self, store: VectorStore | None) -> None:
        """Replay the changes not yet caught up onto `store` and switch to it (None: abandon).
        The rebuild ends either way: a replay that fails abandons `store`, and the org keeps
        its current one, which every change reached."""
        try:
            if store is not None:
                self.catch_up(store)
                self._store = store
        finally:
            self._changes = None

    def _apply(self, removed: Labels, added: Labels, vectors: Matrix) -> None:
        self._store.remove(removed)
        if added.size:
            self._store.add(added, vectors)
        if self._changes is not None:
            self._changes.append((removed, added, vectors))

    def _assign(
        self, chunk_ids: list[str], conversation_ids: list[str], versions: list[int]
    ) -> Labels:
        labels = np.empty(len(chunk_ids), dtype=np.int64)
        rows = zip(chunk_ids, conversation_ids, versions, strict=True)
        for row, (chunk, conversation, version) in enumerate(rows):
            label = self._next_label
            self._next_label += 1
            self._labels[chunk] = label
            self._versions[chunk] = version
            self._owners[label] = (chunk, conversation)
            self._by_conversation.setdefault(conversation, set()).add(label)
            labels[row] = label
        return labels

    def _forget(self, labels: Labels) -> None:
        for label in labels.tolist():
            chunk, conversation = self._owners.pop(label)
            del self._labels[chunk]
            del self._versions[chunk]
            members = self._by_conversation[conversation]
            members.discard(label)
            if not members:
                del self._by_conversation[conversation]

    def _hits(self, scores: Matrix, labels: Labels) -> list[Hit]:
        hits = []
        for score, label in zip(scores.tolist(), labels.tolist(), strict=True):
            if label == MISSING:
                continue
            chunk, conversation = self._owners[label]
            hits.append(Hit(chunk, conversation, float(score)))
        return hits


def _newest_rows(chunk_ids: list[str], versions: list[int]) -> list[int]:
    """Row numbers, in order, of the one row kept per chunk id: its highest version, the last
    of equals (as a sequence of upserts would keep)."""
    best: dict[str, int] = {}
    for row, chunk in enumerate(chunk_ids):
        if chunk not in best or versions[row] >= versions[best[chunk]]:
            best[chunk] = row
    return sorted(best.values())
