"""The orgs a shard holds: lazy loading from PostgreSQL, routing epochs, per-org locking and
background rebuilds of indexes that outgrew their kind."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from index_service.errors import ServiceError, Unavailable
from index_service.native import faiss_threads, release_free_memory
from index_service.org_index import Hit, OrgIndex, Snapshot
from index_service.rebuild import OrgRows
from index_service.vectors import Matrix

log = logging.getLogger(__name__)

T = TypeVar("T")

# A rebuild replays the writes made during its build without the org's lock, in rounds, until
# a round finds at most CAUGHT_UP of them; the rest are replayed under the lock at the switch.
CATCH_UP_ROUNDS = 5
CAUGHT_UP = 16
# Upserts of up to this many vectors (an indexer job's windows) run on a request thread, unless
# short enough for the event loop (below); larger ones (an indexer batch of many appends'
# jobs, a bulk load) on the multi-threaded pool.
REQUEST_SIZED_WRITE = 256
# Calls that score at most this many vectors run on the event loop: a search of a small org, of
# a few conversations or of an IVF org's centroids and few probed lists, an append's upsert into
# a flat org or one with few IVF lists (each new vector is scored against every list's
# centroid: up to 1,024 lists for two vectors). Scoring 2,048 float16 vectors takes about
# 0.2-0.4 ms on a 2-core Zen 3, as long as the hop to a request thread and back, which it saves
# (docs/performance.md).
INLINE_VECTORS = 2048
# Upserts run on the event loop only up to this many vectors (an append's windows: two for
# one message, three for three), for their bookkeeping in Python costs microseconds a vector.
INLINE_WRITE = 4
# Background rebuilds of up to this many vectors (the org's rebuilds at 4,097, 8,193 and
# 32,769 as it grows) build and replay on one FAISS thread. The org serves meanwhile, so
# their length matters little, and on a busy machine a second thread mostly waits for a core,
# spinning. With another process busy on one of two Zen 4 cores, the builds at 4,097, 8,193
# and 32,769 vectors took 0.49, 1.00 and 5.9 s on two threads, for 0.56, 1.21 and 7.4 s of
# CPU, against 0.34, 0.86 and 5.7 s on one; idle, two threads took 53-66% of the time for
# 2-32% more CPU (benchmarks/e2e/rebuild_threads.py). Larger rebuilds (131k, 524k...) use
# every core, as loads do, whose requests wait for them.
SOLO_REBUILD_VECTORS = 40_000
# After a rebuild fails, the org's next one waits this long (the org keeps its index): the
# same snapshot would most likely fail the same way, at the cost of a whole build each time.
REBUILD_RETRY_SECONDS = 60.0


class Source(Protocol):
    """Where orgs are rebuilt from (PostgreSQL in production)."""

    async def load(self, org_id: str) -> OrgRows: ...


@dataclass
class _Org:
    index: OrgIndex
    epoch: int
    routings: int  # the shard's count of routing changes when the copy was loaded
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    rebuild: asyncio.Task[None] | None = None
    rebuild_after: float = 0.0  # loop time before which no rebuild starts (one failed)


@dataclass(frozen=True)
class Stats:
    """Sizes for one org or for the whole shard."""

    vectors: int
    orgs: int
    index_kind: str
    memory_bytes: int
    building: bool
    nlist: int = 0
    nprobe: int = 0


class Registry:
    """Holds each org's index; every operation on an org runs with that org's lock held, so
    searches see every write that finished before them.

    A request's own calls (searches, deletes, upserts of a few vectors) run on `requests`, with
    single-threaded FAISS, or, the shortest searches and upserts, on the event loop
    (INLINE_VECTORS); loads, rebuilds and bulk upserts on `work`, with multi-threaded FAISS,
    so a long rebuild never takes a request thread (requests to its org wait only while it is
    snapshotted and switched). A few vectors gain nothing from OpenMP threads:
    one-vector upserts into a 40k-vector IVF org took 0.21 ms (p50) on two and 0.15 ms on one;
    the process used 0.27 and 0.22 ms of CPU an upsert (2 cores).
    """

    def __init__(
        self,
        source: Source,
        work: Executor,
        requests: Executor,
        *,
        flat_threshold: int,
        target_recall: float,
        own_epoch: int = 0,
    ) -> None:
        """`own_epoch`: the routing epoch of this shard's own list (INDEX_SHARDS), 0 if it
        has none."""
        self._own_epoch = own_epoch
        self._source = source
        self._work = work
        self._requests = requests
        self._flat_threshold = flat_threshold
        self._target_recall = target_recall
        self._orgs: dict[str, _Org] = {}
        self._loading: dict[str, tuple[int, asyncio.Task[_Org]]] = {}
        # Changes of the routing epoch callers send, counted as requests come (_serves).
        self._last_epoch = 0
        self._routings = 0
        self.loads = 0  # completed loads from the source, for observability

    @property
    def org_count(self) -> int:
        return len(self._orgs)

    async def upsert(
        self,
        org_id: str,
        epoch: int,
        chunk_ids: list[str],
        conversation_ids: list[str],
        vectors: Matrix,
        versions: list[int] | None = None,
    ) -> int:
        """Insert or replace chunks (never by an older version), loading the org first if this
        shard does not hold it."""
        org = await self._ensure(org_id, epoch, write=True)
        size = len(chunk_ids)
        with self._dropped_if_broken(org_id, org):
            if size <= INLINE_WRITE and org.index.write_bound(size) <= INLINE_VECTORS:
                async with org.lock:
                    count = org.index.upsert(chunk_ids, conversation_ids, vectors, versions)
            else:
                pool = self._requests if size <= REQUEST_SIZED_WRITE else self._work
                count = await self._locked(
                    org,
                    org.index.upsert,
                    chunk_ids,
                    conversation_ids,
                    vectors,
                    versions,
                    executor=pool,
                )
        self._maybe_rebuild(org_id, org)
        return count

    async def delete(
        self, org_id: str, epoch: int, chunk_ids: list[str], conversation_ids: list[str]
    ) -> int:
        """Remove chunks by id and by conversation."""
        org = await self._ensure(org_id, epoch, write=True)
        with self._dropped_if_broken(org_id, org):
            count = await self._locked(
                org, org.index.delete, chunk_ids, conversation_ids, executor=self._requests
            )
        self._maybe_rebuild(org_id, org)
        return count

    @contextlib.contextmanager
    def _dropped_if_broken(self, org_id: str, org: _Org) -> Iterator[None]:
        """A write that fails part-way (FAISS out of memory, say) may leave the org's ids and
        its store out of step; the org is dropped, and loaded afresh from PostgreSQL, which
        holds every write, by the next request, while the caller retries (Unavailable)."""
        try:
            yield
        except Exception as exc:
            if self._orgs.get(org_id) is org:
                del self._orgs[org_id]
                if org.rebuild is not None:
                    org.rebuild.cancel()
                log.exception("a write to org %s failed; it reloads on its next request", org_id)
            if isinstance(exc, ServiceError):
                raise
            raise Unavailable(f"a write to org {org_id} failed ({type(exc).__name__})") from exc

    async def search(
        self,
        org_id: str,
        epoch: int,
        query: Matrix,
        k: int,
        conversation_ids: list[str],
        nprobe: int = 0,
    ) -> list[Hit]:
        """Top-k hits of `query` (one unit-norm row), restricted to `conversation_ids` if any;
        `nprobe` overrides the calibrated one when nonzero.

        A search that scores at most INLINE_VECTORS runs on the event loop: the hop to a
        request thread and back costs more than such a scan. Longer ones go to the request
        threads, so that they neither hold up the shard's other calls nor queue behind each
        other on one core."""
        org = await self._ensure(org_id, epoch)
        if org.index.scan_bound(conversation_ids, nprobe) <= INLINE_VECTORS:
            async with org.lock:
                return org.index.search(query, k, conversation_ids, nprobe)
        return await self._locked(
            org, org.index.search, query, k, conversation_ids, nprobe, executor=self._requests
        )

    async def drop(self, org_id: str) -> int:
        """Forget an org's index (not its rows: PostgreSQL is not written here)."""
        pending = self._loading.get(org_id)
        if pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(pending[1])
        org = self._orgs.pop(org_id, None)
        if org is None:
            return 0
        if org.rebuild is not None:
            org.rebuild.cancel()
        size = org.index.size
        del org
        await self._run(release_free_memory)
        return size

    async def stats(self, org_id: str, epoch: int) -> Stats:
        """One org's figures (loading it if needed), or the shard's totals when org_id is ''."""
        if org_id:
            org = await self._ensure(org_id, epoch)
            return Stats(
                org.index.size,
                1,
                org.index.kind,
                org.index.memory_bytes(),
                org.rebuild is not None,
                *org.index.lists,
            )
        orgs = list(self._orgs.values())
        return Stats(
            sum(o.index.size for o in orgs),
            len(orgs),
            "",
            sum(o.index.memory_bytes() for o in orgs),
            any(o.rebuild is not None for o in orgs),
        )

    async def preload(self, org_ids: list[str], epoch: int) -> None:
        """Load the given orgs one after another (at start, for the orgs this shard owns)."""
        for org_id in org_ids:
            try:
                await self._ensure(org_id, epoch)
            except Exception:  # one org's failure must not keep the others from loading
                log.exception("preloading org %s failed; it will load on first request", org_id)

    async def settle(self) -> None:
        """Wait until no load or background rebuild is running."""
        while True:
            tasks: list[asyncio.Future[Any]] = [t for _, t in self._loading.values()]
            tasks += [o.rebuild for o in self._orgs.values() if o.rebuild is not None]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel loads and rebuilds and wait for them to end."""
        tasks: list[asyncio.Future[Any]] = [t for _, t in self._loading.values()]
        tasks += [o.rebuild for o in self._orgs.values() if o.rebuild is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _ensure(self, org_id: str, epoch: int, *, write: bool = False) -> _Org:
        """The org's current copy, loaded (once, however many callers wait) when this shard
        does not hold it or holds one that does not serve `epoch` (`_serves`). A `write`
        waits for a load under way even where the held copy serves it: the loaded copy
        replaces the held one and may have read its rows before the write was stored."""
        if epoch and epoch != self._last_epoch:
            self._last_epoch = epoch
            self._routings += 1
        while True:
            held = self._orgs.get(org_id)
            pending = self._loading.get(org_id)
            if held is not None and self._serves(held, epoch) and not (write and pending):
                return held
            if pending is None:
                pending = (epoch, asyncio.create_task(self._load(org_id, epoch)))
                self._loading[org_id] = pending
            load_epoch, task = pending
            org = await asyncio.shield(task)
            # A load started for another epoch does not count unless it serves ours: go round
            # and start ours. Ours, once done, is returned even if a later epoch has started
            # another since.
            if load_epoch == epoch or self._serves(org, epoch):
                return org

    def _serves(self, held: _Org, epoch: int) -> bool:
        """Whether a copy loaded under `held.epoch` answers a request sent under `epoch`.
        One loaded under another routing may have missed writes sent elsewhere meanwhile, so
        it is reloaded for a caller on this shard's own list (or on any list, where the
        shard has none). A caller on another list, an api pod the rollout of a new list has
        not reached yet, is served what is held: callers on two lists, alternating, would
        otherwise reload the org at every change of caller.

        A shard without a list cannot tell whose routing a caller's is, so its copy serves
        only while callers keep to the routing it was loaded under: one that changed and came
        back (a shard added, then removed) may have sent the org's writes elsewhere
        meanwhile, under the same epoch as before."""
        if epoch == 0:
            return True
        if self._own_epoch == 0:
            return held.epoch == epoch and held.routings == self._routings
        return held.epoch == epoch or epoch != self._own_epoch

    async def _load(self, org_id: str, epoch: int) -> _Org:
        routings = self._routings  # a change while the rows are read makes the copy stale
        try:
            try:
                rows = await self._source.load(org_id)
            except Exception as exc:  # any failure to read the source: retryable
                raise Unavailable(f"cannot load org {org_id}: {exc}") from exc
            try:
                index = await self._run(
                    OrgIndex.from_rows,
                    rows.chunk_ids,
                    rows.conversation_ids,
                    rows.vectors,
                    rows.versions,
                    flat_threshold=self._flat_threshold,
                    target_recall=self._target_recall,
                )
            except Exception as exc:  # memory running out, FAISS refusing: retryable too
                raise Unavailable(f"cannot build org {org_id}: {type(exc).__name__}") from exc
            old = self._orgs.get(org_id)
            if old is not None and old.rebuild is not None:
                old.rebuild.cancel()
            org = _Org(index, epoch, routings)
            self._orgs[org_id] = org
            self.loads += 1
            await self._run(release_free_memory)
            log.info("loaded org %s: %d vectors (%s)", org_id, index.size, index.kind)
            return org
        finally:
            self._loading.pop(org_id, None)

    def _maybe_rebuild(self, org_id: str, org: _Org) -> None:
        if (
            org.rebuild is None
            and self._orgs.get(org_id) is org
            and asyncio.get_running_loop().time() >= org.rebuild_after
            and org.index.needs_rebuild()
        ):
            org.rebuild = asyncio.create_task(self._rebuild(org_id, org))

    async def _rebuild(self, org_id: str, org: _Org) -> None:
        """Build a fitting index from a snapshot without holding the lock, so the org keeps
        serving; the changes made meanwhile are replayed before the switch."""
        try:
            room = await self._run(org.index.snapshot_room)

            def begin(room: Snapshot) -> Snapshot | None:  # unneeded if deletes came meanwhile
                return org.index.begin_rebuild(room) if org.index.needs_rebuild() else None

            snapshot = await self._locked(org, begin, room)
            del room  # the snapshot views it: both go when the snapshot is deleted below
            if snapshot is None:
                return  # the writes that follow check again, as they always do
            store = None
            caught_up = False
            solo = len(snapshot.labels) <= SOLO_REBUILD_VECTORS
            build, catch_up, finish = org.index.build, org.index.catch_up, org.index.finish_rebuild
            if solo:
                build, catch_up = _on_one_faiss_thread(build), _on_one_faiss_thread(catch_up)
                finish = _on_one_faiss_thread(finish)
            try:
                store = await self._run(build, snapshot)
                # Writes made during the build are replayed unlocked until few are left.
                for _ in range(CATCH_UP_ROUNDS):
                    # Cancelled, it still waits for its replay's thread before the switch.
                    if await _to_its_end(self._run(catch_up, store)) <= CAUGHT_UP:
                        break
                caught_up = True
            finally:
                # A replay that failed or was cancelled part-way left `store` with some of
                # the changes, which a second replay would add again: abandon it.
                await self._locked(org, finish, store if caught_up else None)
                del store, snapshot
                await self._run(release_free_memory)
            log.info("rebuilt org %s: %d vectors (%s)", org_id, org.index.size, org.index.kind)
        except asyncio.CancelledError:
            raise
        except Exception:
            org.rebuild_after = asyncio.get_running_loop().time() + REBUILD_RETRY_SECONDS
            log.exception(
                "rebuilding org %s failed; it keeps its current index and tries again after %.0f s",
                org_id,
                REBUILD_RETRY_SECONDS,
            )
        finally:
            org.rebuild = None
        self._maybe_rebuild(org_id, org)

    async def _locked(
        self, org: _Org, fn: Callable[..., T], *args: object, executor: Executor | None = None
    ) -> T:
        """`fn` with the org's lock held until it returns, even when the caller is cancelled
        (a gRPC deadline): its thread runs on regardless, and an OrgIndex is not thread-safe."""
        async with org.lock:
            return await _to_its_end(self._run(fn, *args, executor=executor))

    def _run(
        self,
        fn: Callable[..., T],
        *args: object,
        executor: Executor | None = None,
        **kwargs: object,
    ) -> asyncio.Future[T]:
        """`fn` on a worker thread (`work` unless told), as a future to await."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(executor or self._work, lambda: fn(*args, **kwargs))


def _on_one_faiss_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` with its FAISS calls on one thread."""

    def solo(*args: Any) -> T:
        with faiss_threads(1):
            return fn(*args)

    return solo


async def _to_its_end(call: asyncio.Future[T]) -> T:
    """The result of `call`, a worker thread's future; if the caller is cancelled meanwhile,
    the thread runs on regardless, so the cancellation waits for it to end. A thread that
    failed meanwhile raises its failure, not the cancellation: a write's caller drops an org
    that a failed write left half done (Registry._dropped_if_broken), and a cancellation would
    hide it. The executor's own future, not a task around it: a task costs a loop iteration
    more on every search."""
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        failure = call.exception()
        if failure is not None:
            raise failure from None
        raise
