"""OrgIndex without gRPC: approximate recall, exact filters, rebuild replay."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from index_service import org_index as org_index_module
from index_service.org_index import IVF_SCAN_WEIGHT, SNAPSHOT_SLACK, OrgIndex
from index_service.stores import (
    MIN_NPROBE,
    MISSING,
    NPROBE_STEPS,
    SCORE_TOLERANCE,
    FlatStore,
    VectorStore,
    build_ivf,
    bulk_assign_rows,
    calibration_queries,
    nlist_for,
    recall_by_score,
)
from tests.index.helpers import DIM, clustered


def _exact(vectors: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    scores = vectors @ query
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


def _org(n: int, threshold: int, seed: int = 1) -> tuple[OrgIndex, np.ndarray]:
    vectors = clustered(n, seed)
    org = OrgIndex.from_rows(
        [f"c{i}" for i in range(n)],
        [f"conv{i % 40}" for i in range(n)],
        vectors,
        flat_threshold=threshold,
        target_recall=0.97,
    )
    return org, vectors


def test_ivf_recall_at_10_against_exact() -> None:
    org, vectors = _org(12_000, threshold=1000)
    assert org.kind == "ivf"
    queries = clustered(100, seed=99)
    found = 0
    for q in queries:
        got = {h.chunk_id for h in org.search(q[None, :], 10, [])}
        found += len(got & {f"c{i}" for i in _exact(vectors, q, 10)})
    assert found / 1000 >= 0.95


def test_filter_is_exact_in_ivf_mode() -> None:
    org, vectors = _org(12_000, threshold=1000)
    query = clustered(1, seed=5)[0]
    # The conversation whose chunks rank lowest for this query.
    ranks = np.argsort(vectors @ query)
    worst = f"conv{int(ranks[0]) % 40}"
    members = [i for i in range(len(vectors)) if f"conv{i % 40}" == worst]
    hits = org.search(query[None, :], 25, [worst])
    assert len(hits) == 25
    assert all(h.conversation_id == worst for h in hits)
    expected = sorted(members, key=lambda i: -float(vectors[i] @ query))[:25]
    assert [h.chunk_id for h in hits] == [f"c{i}" for i in expected]


def test_a_filter_past_the_flat_threshold_is_still_ranked_exactly() -> None:
    """Up to EXACT_FILTER_CHUNKS a filter's chunks are scored alone, however low the flat
    threshold: an IVF index's nprobe is calibrated for org-wide searches, not a subset's."""
    org, vectors = _org(3000, threshold=100)  # 75 chunks a conversation
    assert org.kind == "ivf"
    chosen = ["conv3", "conv7"]  # 150 chunks, past the flat threshold
    members = np.array([i for i in range(3000) if f"conv{i % 40}" in chosen])
    for query in clustered(20, seed=8):
        hits = org.search(query[None, :], 10, chosen, nprobe=16)
        expected = members[np.argsort(-(vectors[members] @ query), kind="stable")[:10]]
        assert [h.chunk_id for h in hits] == [f"c{i}" for i in expected]


def test_scan_bound_counts_what_a_search_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    flat, _ = _org(400, threshold=1000)  # 40 conversations of 10 chunks
    assert flat.scan_bound([]) == 400
    assert flat.scan_bound(["conv1", "conv2", "conv2", "nobody"]) == 20
    monkeypatch.setattr(org_index_module, "EXACT_FILTER_CHUNKS", 100)
    ivf, _ = _org(3000, threshold=100)  # 75 chunks a conversation
    assert ivf.kind == "ivf"
    assert ivf.scan_bound(["conv1"]) == 75  # scored alone, exactly
    lists, probed = ivf.lists
    assert probed < lists
    # The centroids, then the probed lists at their mean length, weighted.
    scanned = IVF_SCAN_WEIGHT * math.ceil(probed * 3000 / lists)
    assert ivf.scan_bound([]) == lists + scanned
    assert ivf.scan_bound([], nprobe=lists) == lists + IVF_SCAN_WEIGHT * 3000  # every list
    # Through the IVF lists, and the filter's chunks, scored alone if the lists held too few.
    assert ivf.scan_bound(["conv1", "conv2"]) == lists + scanned + 150


def test_changes_during_a_rebuild_are_replayed() -> None:
    org, vectors = _org(3000, threshold=1000)
    snapshot = org.begin_rebuild()
    store = org.build(snapshot)
    fresh = clustered(1, seed=42)[0]
    org.upsert(["new"], ["convN"], fresh[None, :])
    org.upsert(["c5"], ["conv5"], fresh[None, :] * -1)
    org.delete(["c7"], [])
    org.finish_rebuild(store)
    assert org.size == 3000
    assert org.search(fresh[None, :], 1, [])[0].chunk_id == "new"
    assert "c7" not in {h.chunk_id for h in org.search(vectors[7][None, :], 5, [])}
    assert "c5" not in {h.chunk_id for h in org.search(vectors[5][None, :], 5, [])}


def test_a_snapshot_holds_every_vector_whatever_its_room() -> None:
    """Flat and IVF stores export every vector once: into the room made ahead of the writes
    that come before the lock while they fit its slack, else into room made then."""
    for n, threshold, extra in (
        (800, 1000, 5),
        (3000, 1000, SNAPSHOT_SLACK),
        (3000, 1000, SNAPSHOT_SLACK + 1),
    ):
        org, vectors = _org(n, threshold=threshold)
        room = org.snapshot_room()
        more = clustered(extra, seed=7)
        org.upsert([f"x{i}" for i in range(extra)], ["convX"] * extra, more)
        snapshot = org.begin_rebuild(room)
        assert np.shares_memory(snapshot.vectors, room.vectors) == (extra <= SNAPSHOT_SLACK)
        assert snapshot.labels.size == n + extra
        assert np.unique(snapshot.labels).size == n + extra
        order = np.argsort(snapshot.labels)
        expected = np.vstack([vectors, more])  # labels are given in upsert order
        # float16 codes: within one step of float16 (2**-14 for values under 2**-3)
        np.testing.assert_allclose(snapshot.vectors[order], expected, rtol=2**-10, atol=2**-14)
        org.finish_rebuild(org.build(snapshot))
        assert org.size == n + extra


def test_repeated_chunk_ids_keep_the_last_vector() -> None:
    vectors = clustered(3, seed=3)
    org = OrgIndex.from_rows(
        ["a", "a", "b"], ["x", "y", "x"], vectors, flat_threshold=10, target_recall=0.97
    )
    assert org.size == 2
    hit = org.search(vectors[1][None, :], 1, [])[0]
    assert (hit.chunk_id, hit.conversation_id) == ("a", "y")
    assert [h.chunk_id for h in org.search(vectors[1][None, :], 5, ["x"])] == ["b"]


def test_shrinking_below_half_the_threshold_wants_a_flat_index() -> None:
    org, _ = _org(1500, threshold=1000)
    assert org.kind == "ivf" and not org.needs_rebuild()
    org.delete([f"c{i}" for i in range(1100)], [])
    assert org.needs_rebuild()
    org.finish_rebuild(org.build(org.begin_rebuild()))
    assert org.kind == "flat" and org.size == 400
    assert org.search(np.ones((1, DIM), np.float32) / np.sqrt(DIM), 500, []).__len__() == 400


def test_growth_during_a_rebuild_triggers_the_next_one() -> None:
    org, _ = _org(1500, threshold=1000)
    snapshot = org.begin_rebuild()
    store = org.build(snapshot)
    more = clustered(2000, seed=8)
    org.upsert([f"m{i}" for i in range(2000)], ["convM"] * 2000, more)
    org.finish_rebuild(store)
    # Fitted to 1500 vectors, now holding 3500: its lists are too few, so rebuild again.
    assert org.size == 3500 and org.needs_rebuild()


def test_growth_rebuilds_only_when_the_list_count_grows() -> None:
    org, _ = _org(2100, threshold=1000)
    assert (org.kind, org._store.nlist) == ("ivf", nlist_for(2100)) == ("ivf", 256)
    more = clustered(6100, seed=9)
    org.upsert([f"m{i}" for i in range(2400)], ["convM"] * 2400, more[:2400])
    # Twice the size it was built at, still 256 lists' worth: the store is kept.
    assert org.size == 4500 and nlist_for(4500) == 256 and not org.needs_rebuild()
    org.upsert([f"m{i}" for i in range(2400, 6100)], ["convM"] * 3700, more[2400:])
    assert org.size == 8200 and nlist_for(8200) == 512 and org.needs_rebuild()
    org.finish_rebuild(org.build(org.begin_rebuild()))
    assert org._store.nlist == 512 and not org.needs_rebuild()


def test_an_ivf_store_finds_what_it_was_given_one_by_one_and_in_bulk() -> None:
    """A request's few vectors find their lists by the float16 centroids, a bulk add's by the
    float32 ones (BLAS); searches, reconstruction and removal find them either way."""
    store = build_ivf(np.arange(3000, dtype=np.int64), clustered(3000, seed=21), 0.97)
    new = clustered(200, seed=22)
    for row in range(10):
        store.add(np.array([3000 + row], dtype=np.int64), new[row : row + 1])
    bulk = np.arange(3010, 3200, dtype=np.int64)
    assert 1 < bulk_assign_rows(DIM) <= bulk.size  # one vector takes the other path
    store.add(bulk, new[10:])
    assert store.ntotal == 3200
    _, found = store.search(new, 1, None, MIN_NPROBE)
    assert found[:, 0].tolist() == list(range(3000, 3200))
    assert np.abs(store.reconstruct(np.array([3005, 3100])) - new[[5, 100]]).max() < 1e-3
    store.remove(np.array([3000, 3010], dtype=np.int64))
    _, found = store.search(new[[0, 10]], 5, None, MIN_NPROBE)
    assert 3000 not in found and 3010 not in found and store.ntotal == 3198


def test_duplicate_chunks_do_not_force_an_exhaustive_ivf() -> None:
    """Equal vectors tie, and any of them is a right answer: calibration must not count the
    others as misses and end up probing every list."""
    vectors = np.repeat(clustered(3_000, seed=3), 4, axis=0)
    store = build_ivf(np.arange(len(vectors), dtype=np.int64), vectors, target_recall=0.97)
    assert store.nprobe < store.nlist // 2
    queries = clustered(100, seed=98)
    scores, _ = store.search(queries, 10, None)
    best = np.sort(queries @ vectors.T, axis=1)[:, -10:][:, ::-1]
    assert ((scores >= best[:, -1:] - SCORE_TOLERANCE).sum() / scores.size) >= 0.95


def test_calibration_holds_the_target_for_each_kind_of_query() -> None:
    """The chosen nprobe is the first at which every kind of calibration query reaches the
    target on its own. On random vectors the answer queries lag the topic queries, and their
    average passes a step earlier: a rule on the average would stop there."""
    gaussian = np.random.default_rng(3).standard_normal((3_000, DIM))
    vectors = (gaussian / np.linalg.norm(gaussian, axis=1, keepdims=True)).astype(np.float32)
    target = 0.92
    store = build_ivf(np.arange(len(vectors), dtype=np.int64), vectors, target_recall=target)
    # The build's own draw: its generator, seeded 1234, draws no training sample at this size.
    kinds = calibration_queries(vectors, np.random.default_rng(1234))

    def recalls(nprobe: int) -> list[float]:
        return [
            recall_by_score(*store.search(q, 10, None, nprobe), kth) for q, kth in kinds.values()
        ]

    chosen = store.nprobe
    assert MIN_NPROBE < chosen < store.nlist
    assert min(recalls(chosen)) >= target
    earlier = recalls(max(s for s in NPROBE_STEPS if s < chosen))
    assert min(earlier) < target <= float(np.mean(earlier))


def _flat_store(labels: np.ndarray, vectors: np.ndarray) -> VectorStore:
    store = FlatStore(vectors.shape[1])
    store.add(labels, vectors)
    return store


def _ivf_store(labels: np.ndarray, vectors: np.ndarray) -> VectorStore:
    return build_ivf(labels, vectors, target_recall=0.97)


@pytest.mark.parametrize("build", [_flat_store, _ivf_store], ids=["flat", "ivf"])
def test_scores_from_float16_codes_are_close_to_exact(
    build: Callable[[np.ndarray, np.ndarray], VectorStore],
) -> None:
    """Both stores keep float16 codes (half the bytes a search reads): their scores stay
    within SCORE_TOLERANCE of float32 inner products, and their vectors within a float16
    step. The flat store finds the exact top 10, up to that tolerance."""
    vectors = clustered(3_000, seed=5)
    labels = np.arange(len(vectors), dtype=np.int64)
    store = build(labels, vectors)
    queries = clustered(50, seed=97)
    scores, found = store.search(queries, 10, None)
    exact = np.take_along_axis(queries @ vectors.T, found, axis=1)
    assert np.abs(scores - exact).max() <= SCORE_TOLERANCE
    assert 0 < np.abs(store.reconstruct(labels) - vectors).max() <= 2**-14
    assert store.memory_bytes() < vectors.nbytes * 0.7
    if store.kind == "flat":
        kth_best = np.sort(queries @ vectors.T, axis=1)[:, -10:-9]
        assert recall_by_score(scores, found, kth_best) == 1.0


def test_flat_store_removes_and_filters_by_label() -> None:
    """Removal takes the labels out, whatever their place in the list, and a search among a
    subset scores only its labels."""
    vectors = clustered(200, seed=11)
    store = _flat_store(np.arange(100, 300, dtype=np.int64), vectors)
    store.remove(np.array([100, 299, 150], dtype=np.int64))
    assert store.ntotal == 197
    _, found = store.search(vectors, 1, None)
    assert set(found[[0, 199, 50], 0].tolist()).isdisjoint({100, 299, 150})
    assert (found[1:50, 0] == np.arange(101, 150)).all()
    _, found = store.search(vectors[:1], 5, np.array([120, 121], dtype=np.int64))
    assert sorted(found[0, :2].tolist()) == [120, 121]
    assert (found[0, 2:] == MISSING).all()


def test_a_rebuild_catches_up_before_its_switch() -> None:
    """Writes made during the build reach the new store unlocked, in order; the switch replays
    only what came after."""
    org, vectors = _org(3000, threshold=1000)
    store = org.build(org.begin_rebuild())
    fresh = clustered(2, seed=43)
    org.upsert(["early"], ["convE"], fresh[:1])
    org.delete(["c9"], [])
    assert org.catch_up(store) == 2
    assert org.catch_up(store) == 0
    org.upsert(["early"], ["convE"], fresh[1:])  # replaces the caught-up vector
    org.finish_rebuild(store)
    assert org.size == 3000
    assert org.search(fresh[1:], 1, [])[0].chunk_id == "early"
    assert store.ntotal == 3000  # the replaced vector left no stale copy in the new store
    assert "c9" not in {h.chunk_id for h in org.search(vectors[9][None, :], 5, [])}
    assert not org.needs_rebuild()  # built for the 3000 it holds


def test_an_older_version_never_replaces_a_newer_one() -> None:
    vectors = clustered(3, seed=7)
    org = OrgIndex.from_rows(
        ["a", "a", "b"],
        ["conv", "conv", "conv"],
        vectors,
        [2, 1, 1],
        flat_threshold=100,
        target_recall=0.97,
    )
    assert org.size == 2
    # From the rows, the highest version of "a" is kept, not the last row.
    assert org.search(vectors[0][None, :], 1, [])[0].score > 0.999
    assert org.search(vectors[1][None, :], 1, [])[0].score < 0.999

    fresh = clustered(2, seed=8)
    assert org.upsert(["a"], ["conv"], fresh[:1], [1]) == 0  # late, older: skipped
    top = org.search(vectors[0][None, :], 1, [])[0]
    assert top.chunk_id == "a" and top.score > 0.999
    assert org.upsert(["a"], ["conv"], fresh[1:], [2]) == 1  # same version: a retry, applied
    top = org.search(fresh[1][None, :], 1, [])[0]
    assert top.chunk_id == "a" and top.score > 0.999
    # Within one call, the newest item of a chunk wins whatever its position.
    assert org.upsert(["b", "b"], ["conv", "conv"], fresh, [3, 2]) == 1
    top = org.search(fresh[0][None, :], 1, [])[0]
    assert top.chunk_id == "b" and top.score > 0.999

    # A deleted chunk's version goes with it: the chunk id can be written afresh.
    assert org.delete(["a"], []) == 1
    assert org.upsert(["a"], ["conv"], fresh[1:], [1]) == 1
    # A writer that gives no version (0) replaces, as before versions existed.
    assert org.upsert(["b"], ["conv"], fresh[1:], [0]) == 1
    top = org.search(fresh[1][None, :], 2, [])
    assert {h.chunk_id for h in top if h.score > 0.999} == {"a", "b"}
