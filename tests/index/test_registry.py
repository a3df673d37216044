"""The Registry's locking and thread pools, without gRPC."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from index_service import registry as registry_module
from index_service.errors import Unavailable
from index_service.main import EmptySource
from index_service.org_index import IVF_SCAN_WEIGHT, OrgIndex
from index_service.rebuild import OrgRows
from index_service.registry import Registry
from tests.index.helpers import DIM, clustered


def threads_running(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """The names of the threads that OrgIndex.<method> runs on from now, call by call."""
    threads: list[str] = []
    original = getattr(OrgIndex, method)

    def recording(self: OrgIndex, *args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(self, *args)

    monkeypatch.setattr(OrgIndex, method, recording)
    return threads


@pytest.fixture
def registry() -> Iterator[Registry]:
    work = ThreadPoolExecutor(2, thread_name_prefix="test-work")
    requests = ThreadPoolExecutor(2, thread_name_prefix="test-request")
    yield Registry(EmptySource(DIM), work, requests, flat_threshold=1000, target_recall=0.97)
    work.shutdown()
    requests.shutdown()


async def test_a_cancelled_write_keeps_its_org_locked_until_its_thread_returns(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gRPC deadline cancels the handler, not the FAISS call in its thread: until that call
    returns, no other call may touch the org."""
    vectors = clustered(3, seed=5)
    await registry.upsert("org_a", 1, ["c0"], ["conv"], vectors[:1])
    entered, release = threading.Event(), threading.Event()
    upsert = OrgIndex.upsert

    def slow_upsert(self: OrgIndex, *args: Any) -> int:
        entered.set()
        release.wait(10)
        return upsert(self, *args)

    monkeypatch.setattr(OrgIndex, "upsert", slow_upsert)
    monkeypatch.setattr(registry_module, "INLINE_WRITE", 0)  # a write on a request thread
    write = asyncio.create_task(registry.upsert("org_a", 1, ["c1"], ["conv"], vectors[1:2]))
    await asyncio.to_thread(entered.wait, 10)
    write.cancel()
    search = asyncio.create_task(registry.search("org_a", 1, vectors[1:2], 2, []))
    await asyncio.sleep(0.2)
    assert not search.done()  # a request thread was free: only the lock holds it back

    release.set()
    with pytest.raises(asyncio.CancelledError):
        await write
    # The write went through in its thread; the search ran after it.
    assert {hit.chunk_id for hit in await search} == {"c0", "c1"}


async def test_request_sized_upserts_run_on_request_threads_and_bulk_ones_on_work(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = threads_running(monkeypatch, "upsert")
    vectors = clustered(300, seed=6).astype(np.float32)
    ids = [f"c{i}" for i in range(300)]
    await registry.upsert("org_a", 1, ids[:17], ["conv"] * 17, vectors[:17])
    await registry.upsert("org_a", 1, ids, ["conv"] * 300, vectors)
    assert [name.split("_")[0] for name in threads] == ["test-request", "test-work"]


async def test_a_rebuild_that_deletes_made_unneeded_is_dropped_before_its_snapshot(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The room for a snapshot is made before the org's lock is taken; if deletes bring the
    org back under the flat threshold meanwhile, nothing is built."""
    entered, release = threading.Event(), threading.Event()
    built: list[int] = []
    snapshot_room, build = OrgIndex.snapshot_room, OrgIndex.build

    def slow_room(self: OrgIndex) -> Any:
        entered.set()
        release.wait(10)
        return snapshot_room(self)

    def recording_build(self: OrgIndex, snapshot: Any) -> Any:
        built.append(snapshot.labels.size)
        return build(self, snapshot)

    monkeypatch.setattr(OrgIndex, "snapshot_room", slow_room)
    monkeypatch.setattr(OrgIndex, "build", recording_build)
    vectors = clustered(1001, seed=8)
    ids = [f"c{i}" for i in range(1001)]
    await registry.upsert("org_a", 1, ids, ["conv"] * 1001, vectors)  # past the threshold
    await asyncio.to_thread(entered.wait, 10)
    await registry.delete("org_a", 1, ids[:1], [])
    release.set()
    await registry.settle()
    assert built == []
    stats = await registry.stats("org_a", 1)
    assert (stats.vectors, stats.index_kind, stats.building) == (1000, "flat", False)


async def test_a_small_orgs_rebuild_runs_on_one_faiss_thread_and_a_large_ones_on_every_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Up to SOLO_REBUILD_VECTORS a background rebuild builds, replays and switches on one
    FAISS thread; past it on the work thread's own setting. Either way that thread's setting is
    as before afterwards, for the bulk upserts and loads that run there."""
    import faiss

    def three_faiss_threads() -> None:  # whatever this machine's cores, a setting to tell apart
        faiss.omp_set_num_threads(3)

    calls: list[tuple[str, int, int]] = []  # (step, the org's size, FAISS threads)
    for step in ("build", "catch_up", "finish_rebuild"):
        original = getattr(OrgIndex, step)

        def recording(
            self: OrgIndex, *args: Any, _original: Any = original, _step: str = step
        ) -> Any:
            calls.append((_step, self.size, faiss.omp_get_max_threads()))
            return _original(self, *args)

        monkeypatch.setattr(OrgIndex, step, recording)
    work = ThreadPoolExecutor(1, initializer=three_faiss_threads)  # one thread: the one sampled
    requests = ThreadPoolExecutor(2)
    registry = Registry(EmptySource(DIM), work, requests, flat_threshold=1000, target_recall=0.97)
    try:
        vectors = clustered(1201, seed=9)
        await registry.upsert("small", 1, [f"c{i}" for i in range(1001)], ["v"] * 1001, vectors)
        await registry.settle()
        monkeypatch.setattr(registry_module, "SOLO_REBUILD_VECTORS", 1100)
        await registry.upsert("large", 1, [f"c{i}" for i in range(1201)], ["v"] * 1201, vectors)
        await registry.settle()
        after = await asyncio.get_running_loop().run_in_executor(work, faiss.omp_get_max_threads)
        steps = {"build", "catch_up", "finish_rebuild"}
        for size, threads in ((1001, 1), (1201, 3)):
            assert {step for step, n, _ in calls if n == size} == steps
            assert {t for _, n, t in calls if n == size} == {threads}
        assert after == 3
        for org in ("small", "large"):
            assert (await registry.stats(org, 1)).index_kind == "ivf"
    finally:
        await registry.close()
        work.shutdown()
        requests.shutdown()


async def test_small_searches_run_on_the_event_loop_and_long_ones_on_request_threads(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small scans skip the hop to a request thread; a long one would hold up the shard."""
    threads = threads_running(monkeypatch, "search")
    monkeypatch.setattr(registry_module, "INLINE_VECTORS", 100)
    vectors = clustered(300, seed=7).astype(np.float32)
    ids = [f"c{i}" for i in range(300)]
    conversations = ["small"] * 50 + ["large"] * 250
    await registry.upsert("org_a", 1, ids, conversations, vectors)

    in_small = await registry.search("org_a", 1, vectors[3:4], 5, ["small"])
    org_wide = await registry.search("org_a", 1, vectors[3:4], 5, [])
    assert in_small[0].chunk_id == org_wide[0].chunk_id == "c3"
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("test-request")


async def test_an_ivf_search_runs_on_the_event_loop_where_its_probed_lists_are_short(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An IVF search scores the centroids and the lists it probes, not the whole org: with few
    lists probed it skips the hop to a request thread, with every list probed it takes it."""
    vectors = clustered(3000, seed=11).astype(np.float32)
    ids = [f"c{i}" for i in range(3000)]
    await registry.upsert("org_a", 1, ids, ["conv"] * 3000, vectors)
    await registry.settle()
    ivf = await registry.stats("org_a", 1)
    assert ivf.index_kind == "ivf"
    assert ivf.nlist + IVF_SCAN_WEIGHT * math.ceil(8 * 3000 / ivf.nlist) < 1000
    threads = threads_running(monkeypatch, "search")
    monkeypatch.setattr(registry_module, "INLINE_VECTORS", 1000)  # a third of the org

    few = await registry.search("org_a", 1, vectors[5:6], 1, [], nprobe=8)
    every = await registry.search("org_a", 1, vectors[5:6], 1, [], nprobe=ivf.nlist)
    assert few[0].chunk_id == every[0].chunk_id == "c5"
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("test-request")


async def test_an_appends_upsert_runs_on_the_event_loop_where_its_lists_are_few(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few vectors into a flat org, or into an IVF org with few enough centroids to score,
    skip the hop to a request thread; into one with more lists they take it."""
    vectors = clustered(1002, seed=9).astype(np.float32)
    ids = [f"c{i}" for i in range(1002)]
    await registry.upsert("org_a", 1, ids[:1001], ["conv"] * 1001, vectors[:1001])
    await registry.settle()  # past the flat threshold: rebuilt as IVF
    ivf = await registry.stats("org_a", 1)
    assert ivf.index_kind == "ivf"
    threads = threads_running(monkeypatch, "upsert")
    monkeypatch.setattr(registry_module, "INLINE_VECTORS", ivf.nlist)

    await registry.upsert("org_b", 1, ["b0", "b1"], ["conv"] * 2, vectors[:2])  # flat
    await registry.upsert("org_a", 1, ids[1001:], ["conv"], vectors[1001:])  # nlist centroids
    await registry.upsert("org_a", 1, ["c0", "c1"], ["conv"] * 2, vectors[:2])  # twice as many
    await registry.upsert("org_b", 1, ids[2:7], ["conv"] * 5, vectors[2:7])  # past INLINE_WRITE
    loop = threading.current_thread().name
    assert threads[:2] == [loop, loop]
    assert threads[2].startswith("test-request") and threads[3].startswith("test-request")
    hits = await registry.search("org_a", 1, vectors[1001:1002], 1, [])
    assert hits[0].chunk_id == "c1001"


async def test_a_failed_rebuild_waits_before_the_next_and_the_org_keeps_serving(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild that fails (here its replay of the writes made meanwhile) leaves the org on
    its index, recording no more changes for a rebuild that ended; the next rebuild waits
    REBUILD_RETRY_SECONDS instead of starting over at once, for ever."""
    attempts: list[int] = []
    catch_up = OrgIndex.catch_up

    def failing_catch_up(self: OrgIndex, store: Any) -> int:
        attempts.append(1)
        raise MemoryError("no room to replay")

    monkeypatch.setattr(OrgIndex, "catch_up", failing_catch_up)
    vectors = clustered(1010, seed=9)
    ids = [f"c{i}" for i in range(1010)]
    await registry.upsert("org_a", 1, ids[:1001], ["conv"] * 1001, vectors[:1001])
    await asyncio.wait_for(registry.settle(), 30)
    failed = len(attempts)
    await registry.upsert("org_a", 1, ids[1001:1005], ["conv"] * 4, vectors[1001:1005])
    await asyncio.wait_for(registry.settle(), 30)
    assert len(attempts) == failed > 0  # one rebuild, not retried by the write after it
    stats = await registry.stats("org_a", 1)
    assert (stats.vectors, stats.index_kind, stats.building) == (1005, "flat", False)
    hits = await registry.search("org_a", 1, vectors[1004:1005], 1, [])
    assert hits[0].chunk_id == "c1004"

    monkeypatch.setattr(OrgIndex, "catch_up", catch_up)
    monkeypatch.setattr(registry_module, "REBUILD_RETRY_SECONDS", 0.0)
    for org in registry._orgs.values():
        org.rebuild_after = 0.0  # the wait is over
    await registry.upsert("org_a", 1, ids[1005:], ["conv"] * 5, vectors[1005:])
    await asyncio.wait_for(registry.settle(), 30)
    stats = await registry.stats("org_a", 1)
    assert (stats.vectors, stats.index_kind) == (1010, "ivf")


async def _rebuild_with_writes_meanwhile(
    registry: Registry, monkeypatch: pytest.MonkeyPatch, catch_up: Any
) -> asyncio.Task[None]:
    """org_a past the flat threshold, its rebuild held in `build` until four more vectors
    were written (changes to replay), with `catch_up` in place of OrgIndex.catch_up; the
    rebuild's task once those writes are done."""
    entered, release = threading.Event(), threading.Event()
    build = OrgIndex.build

    def held_build(self: OrgIndex, snapshot: Any) -> Any:
        entered.set()
        release.wait(10)
        return build(self, snapshot)

    monkeypatch.setattr(OrgIndex, "build", held_build)
    monkeypatch.setattr(OrgIndex, "catch_up", catch_up)
    vectors = clustered(1005, seed=11)
    ids = [f"c{i}" for i in range(1005)]
    await registry.upsert("org_a", 1, ids[:1001], ["conv"] * 1001, vectors[:1001])
    await asyncio.to_thread(entered.wait, 10)
    for i in range(1001, 1005):  # one change each
        await registry.upsert("org_a", 1, ids[i : i + 1], ["conv"], vectors[i : i + 1])
    release.set()
    rebuild = registry._orgs["org_a"].rebuild
    assert rebuild is not None
    return rebuild


async def test_a_replay_that_fails_part_way_abandons_the_rebuilt_store(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second replay would add the first one's changes again (a label stored twice, one
    copy left behind by a delete): the org keeps the store every change reached."""
    catch_up = OrgIndex.catch_up
    calls: list[int] = []

    def fails_after_one_change(self: OrgIndex, store: Any) -> int:
        calls.append(1)
        if len(calls) > 1:
            return catch_up(self, store)
        removed, added, vectors = self._changes[0]  # type: ignore[index]
        store.remove(removed)
        store.add(added, vectors)
        raise MemoryError("no room for the second change")

    rebuild = await _rebuild_with_writes_meanwhile(registry, monkeypatch, fails_after_one_change)
    await asyncio.wait_for(asyncio.gather(rebuild, return_exceptions=True), 30)
    assert calls == [1]  # not replayed a second time
    stats = await registry.stats("org_a", 1)
    assert (stats.vectors, stats.index_kind, stats.building) == (1005, "flat", False)
    query = clustered(1005, seed=11)[1001:1002]
    assert [hit.chunk_id for hit in await registry.search("org_a", 1, query, 1, [])] == ["c1001"]


async def test_a_cancelled_replay_ends_before_the_rebuild_does(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling a rebuild (its org dropped or reloaded) does not stop its replay's thread:
    the rebuild ends only after it, and never replays onto the same store beside it."""
    catch_up = OrgIndex.catch_up
    entered, release = threading.Event(), threading.Event()
    events: list[str] = []

    def slow_catch_up(self: OrgIndex, store: Any) -> int:
        events.append("replay")
        entered.set()
        release.wait(10)
        replayed = catch_up(self, store)
        events.append("replayed")
        return replayed

    finish = OrgIndex.finish_rebuild

    def recording_finish(self: OrgIndex, store: Any) -> None:
        events.append("finish" if store is None else "finish with store")
        finish(self, store)

    monkeypatch.setattr(OrgIndex, "finish_rebuild", recording_finish)
    rebuild = await _rebuild_with_writes_meanwhile(registry, monkeypatch, slow_catch_up)
    await asyncio.to_thread(entered.wait, 10)
    rebuild.cancel()
    await asyncio.sleep(0.2)
    assert events == ["replay"] and not rebuild.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(rebuild, 10)
    assert events == ["replay", "replayed", "finish"]


async def test_callers_on_another_shard_list_do_not_reload_the_org_back_and_forth() -> None:
    """While api pods on an old and a new shard list overlap, both call the shard: the org is
    reloaded once for a caller on the shard's own list, then served to both as it is."""
    own, other = 11, 22
    work, requests = ThreadPoolExecutor(2), ThreadPoolExecutor(2)
    registry = Registry(
        EmptySource(DIM), work, requests, flat_threshold=1000, target_recall=0.97, own_epoch=own
    )
    try:
        query = clustered(1, seed=12)
        await registry.search("org_a", other, query, 1, [])
        assert registry.loads == 1  # not held: loaded for any caller
        await registry.search("org_a", own, query, 1, [])
        assert registry.loads == 2  # held under the other list: reloaded once
        for epoch in (other, own, other, own, 0):
            await registry.search("org_a", epoch, query, 1, [])
        assert registry.loads == 2

        without_a_list = Registry(
            EmptySource(DIM), work, requests, flat_threshold=1000, target_recall=0.97
        )
        for epoch in (other, own, other):
            await without_a_list.search("org_a", epoch, query, 1, [])
        assert without_a_list.loads == 3  # every change of routing reloads
    finally:
        work.shutdown()
        requests.shutdown()


async def test_a_write_during_a_reload_reaches_the_copy_that_replaces_the_held_one() -> None:
    """A caller on the shard's own list reloads an org held under another list; meanwhile an
    api pod on that other list writes, after the reload read its rows. The write must not go
    to the held copy, which the reloaded one replaces: it waits for the reload and lands in
    the new copy (a delete alike). Searches are served from the held copy meanwhile."""
    own, other = 11, 22
    vectors = clustered(3, seed=15)
    reading, release = asyncio.Event(), asyncio.Event()

    class Rows(EmptySource):
        """The org's stored rows: one chunk, each load read at its start (a snapshot), the
        second then held until released."""

        loads = 0

        async def load(self, org_id: str) -> Any:
            Rows.loads += 1
            snapshot = OrgRows(["c0", "c_gone"], ["conv", "conv_gone"], vectors[:2], [1, 1])
            if Rows.loads == 2:
                reading.set()
                await release.wait()
            return snapshot

    work, requests = ThreadPoolExecutor(2), ThreadPoolExecutor(2)
    registry = Registry(
        Rows(DIM), work, requests, flat_threshold=1000, target_recall=0.97, own_epoch=own
    )
    try:
        await registry.search("org_a", other, vectors[:1], 3, [])  # held under the other list
        reload = asyncio.create_task(registry.search("org_a", own, vectors[:1], 3, []))
        await asyncio.wait_for(reading.wait(), 10)
        write = asyncio.create_task(
            registry.upsert("org_a", other, ["c_new"], ["conv"], vectors[2:3])
        )
        delete = asyncio.create_task(registry.delete("org_a", other, [], ["conv_gone"]))
        held = await registry.search("org_a", other, vectors[:1], 3, [])
        assert {hit.chunk_id for hit in held} == {"c0", "c_gone"}
        await asyncio.sleep(0.1)
        assert not write.done() and not delete.done()  # they wait for the reload

        release.set()
        await asyncio.wait_for(asyncio.gather(reload, write, delete), 10)
        found = await registry.search("org_a", own, vectors[:1], 3, [])
        assert {hit.chunk_id for hit in found} == {"c0", "c_new"}
        assert registry.loads == 2
    finally:
        work.shutdown()
        requests.shutdown()


async def test_a_write_that_fails_part_way_drops_the_org_to_be_loaded_afresh(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replaced vector removed from the store and its new one never added: the org's ids
    and store disagree, so the org goes, and the next request loads it from the source."""
    vectors = clustered(3, seed=13)
    await registry.upsert("org_a", 1, ["c0", "c1"], ["conv"] * 2, vectors[:2])
    store = registry._orgs["org_a"].index._store

    def full(*args: Any) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(store, "add", full)
    with pytest.raises(Unavailable):
        await registry.upsert("org_a", 1, ["c0"], ["conv"], vectors[2:3], [2])
    assert "org_a" not in registry._orgs
    loads = registry.loads
    await registry.search("org_a", 1, vectors[:1], 1, [])
    assert registry.loads == loads + 1


async def test_a_write_failing_after_its_caller_was_cancelled_still_drops_the_org(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadline that fires while a write's thread runs: the thread fails part-way after it,
    and the org it left half done still goes."""
    vectors = clustered(2, seed=13)
    await registry.upsert("org_a", 1, ["c0", "c1"], ["conv"] * 2, vectors)
    store = registry._orgs["org_a"].index._store
    started, go = threading.Event(), threading.Event()

    def failing(labels: Any) -> None:
        started.set()
        go.wait(10)
        raise MemoryError("no room")

    monkeypatch.setattr(store, "remove", failing)
    delete = asyncio.create_task(registry.delete("org_a", 1, ["c0"], []))
    await asyncio.to_thread(started.wait, 10)
    delete.cancel()
    await asyncio.sleep(0)  # the caller, cancelled, waits for the thread
    go.set()
    with pytest.raises(Unavailable):
        await delete
    assert "org_a" not in registry._orgs


async def test_one_org_failing_to_preload_keeps_no_other_from_loading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read fine, its index not built (FAISS refusing, memory running out): the org is left
    to load on its first request, and the next one preloads."""
    from_rows = OrgIndex.from_rows

    def refusing(chunk_ids: list[str], *args: Any, **kwargs: Any) -> OrgIndex:
        if chunk_ids == ["c_broken"]:
            raise MemoryError("no room for this org")
        return from_rows(chunk_ids, *args, **kwargs)

    class Rows(EmptySource):
        async def load(self, org_id: str) -> Any:
            ids = ["c_broken"] if org_id == "org_broken" else ["c_fine"]
            return OrgRows(ids, ["conv"], clustered(1, seed=14), [1])

    monkeypatch.setattr(OrgIndex, "from_rows", refusing)
    work, requests = ThreadPoolExecutor(2), ThreadPoolExecutor(2)
    registry = Registry(Rows(DIM), work, requests, flat_threshold=1000, target_recall=0.97)
    try:
        await registry.preload(["org_broken", "org_fine"], 1)
        assert list(registry._orgs) == ["org_fine"]
    finally:
        work.shutdown()
        requests.shutdown()
