"""The indexer: embeds pending chunks, stores their vectors in PostgreSQL, upserts them to the
org's index shard, then marks the outbox job done. Deletions reach the shards the same way.
The vectors are stored before the upsert: a shard that loads the org from PostgreSQL after it
(restarted, or taking the org over) then holds them too.

An append that waits for its chunks indexes them itself, in a task of its own, with the job
leased to it: no round trip through the outbox. It answers once the shard has the vectors;
the job's closing follows in the same task. The background worker drains
everything else: appends that do not wait, jobs whose first attempt failed, and those of a
replica that died. Jobs are leased (run_after moves forward) rather than locked for the whole
run, so a crashed worker's jobs come back after the lease, and several replicas can drain one
outbox. A service that does not answer one job of a batch is not called again in that batch:
the jobs that need it wait for their retry, and the other shards' jobs go on.

A second task keeps the term statistics of the orgs it indexed current for lexical search
(store/lexical.py); a recount of a large org takes seconds, so it never holds up the outbox.
A third moves new full text from the GIN index's pending list into the index each second
after jobs were finished here (lexical.flush_pending): an append then seldom has to, and a
search reads a short list.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import asyncpg
import grpc
import numpy as np

from api_service import timing
from api_service.clients import EmbedClient, IndexRouter, Vectors
from api_service.core.chunking import embedded_text
from api_service.store import lexical
from api_service.store.records import QueuedChunks

log = logging.getLogger(__name__)

LEASE_SECONDS = 60
MAX_BACKOFF_SECONDS = 60.0
POLL_SECONDS = 1.0
STATS_CHECK_SECONDS = 10.0
# Appends whose own indexing may be under way at once in a process. Past it (appends outpacing
# the model, on a CPU) a new append leaves its job to the outbox at once, for the background
# workers of every replica, rather than holding its texts in memory here behind the others.
OWN_INDEXING_LIMIT = 128
FLUSH_SECONDS = 1.0
DONE_REMEMBERED = 10_000
# Status codes of a call whose service did not answer: refused, or silent past the deadline.
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Status codes of a call its service refused as given: a retry fails the same way until the
# deployment changes (an embedding dimension the shards were not started with, a text limit
# set below the chunks' size).
REFUSED = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNIMPLEMENTED,
)
EMBEDDER = "embed_service"  # the name a batch's unreachable services know the embedder by
# Embeddings at a size that a deadline forced down, after which the size doubles again (up to
# the batch size): an overload passes, and one-text calls would otherwise stay for good.
GROW_AFTER_CALLS = 8


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    org_id: str
    kind: str
    conversation_id: str
    chunk_ids: list[str]
    attempts: int


# The outbox's jobs are counted up to this many: a scrape's count reads one index entry a job.
BACKLOG_COUNTED = 100_000


@dataclass(frozen=True, slots=True)
class Backlog:
    """The outbox as a whole: the jobs not done yet and how many of them have failed at least
    once (each counted up to BACKLOG_COUNTED), and the age in seconds of the oldest (0 when
    none waits)."""

    jobs: int
    failing: int
    oldest_seconds: float


async def outbox_backlog(pool: asyncpg.Pool) -> Backlog:
    """The outbox's backlog, across every org and replica."""
    row = await pool.fetchrow(
        """SELECT (SELECT count(*) FROM (SELECT FROM index_outbox LIMIT $1) AS j) AS jobs,
                  (SELECT count(*) FROM (SELECT FROM index_outbox
                                          WHERE last_error IS NOT NULL LIMIT $1) AS f) AS failing,
                  coalesce((SELECT extract(epoch FROM now() - created_at) FROM index_outbox
                             ORDER BY job_id LIMIT 1), 0) AS oldest""",
        BACKLOG_COUNTED,
    )
    assert row is not None
    return Backlog(row["jobs"], row["failing"], float(row["oldest"]))


class Unreachable(Exception):
    """A service the job needs did not answer an earlier job of its batch."""

    def __init__(self, service: str) -> None:
        super().__init__(f"{service} did not answer earlier in this batch")


@contextlib.contextmanager
def _reaching(service: str, down: set[str]) -> Iterator[None]:
    """Run a call to `service` unless the batch found it `down`; add it there if the call
    finds it unreachable."""
    if service in down:
        raise Unreachable(service)
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        if exc.code() in UNREACHABLE:
            down.add(service)
        raise


@dataclass(frozen=True, slots=True)
class _Chunk:
    chunk_id: str
    conversation_id: str
    version: int
    text: str
    embedding: bytes | None  # None: not embedded yet


class Indexer:
    """Indexes appends' chunks as they ask, and drains index_outbox in the background."""

    lease_seconds = float(LEASE_SECONDS)

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: EmbedClient,
        index: IndexRouter,
        batch_size: int = 64,
        embed_timeout: float | None = None,
        embed_concurrency: int = 4,
    ) -> None:
        self._pool = pool
        self._embedder = embedder
        self._embed_timeout = embed_timeout  # None: the client's deadline
        # Embedding calls under way at once; the others wait here, before their deadline starts.
        self._embed_slots = asyncio.Semaphore(embed_concurrency)
        self._leases = _Leases(pool)  # jobs being indexed here, leased again while they last
        self._index = index
        self._batch_size = batch_size
        self._embed_size = batch_size  # texts per embedding call; smaller after a deadline
        self._fitted = 0  # embeddings whose calls all fitted since the size last changed
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()  # set, then replaced, after each batch
        self._tasks: list[asyncio.Task[None]] = []
        self._own: dict[asyncio.Task[None], int] = {}  # appends' indexing under way: job ids
        self._orgs_changed: set[str] = set()
        self._chunks_indexed = False  # since the last flush of the full-text index
        self._done_here: set[int] = set()  # the last DONE_REMEMBERED jobs finished here
        self._done_order: collections.deque[int] = collections.deque()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name="indexer"),
            asyncio.create_task(self._keep_term_stats(), name="indexer-term-stats"),
            asyncio.create_task(self._keep_full_text_index(), name="indexer-full-text"),
            asyncio.create_task(self._leases.keep(), name="indexer-leases"),
        ]

    async def stop(self) -> None:
        held = self._leases.held()  # taken first: the cancelled tasks release their jobs
        for task in [*self._tasks, *self._own]:
            task.cancel()
        for task in [*self._tasks, *self._own]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # The appends' jobs and the background batch's, handed back now rather than when
        # their lease runs out.
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            await _lease_until(self._pool, held, 0.0)

    def notify(self) -> None:
        self._wake.set()

    @property
    def busy(self) -> bool:
        """Whether appends' own indexing is at OWN_INDEXING_LIMIT: a new append then leaves
        its job to the background workers."""
        return len(self._own) >= OWN_INDEXING_LIMIT

    def embed_ahead(self, texts: Sequence[str]) -> asyncio.Future[Vectors]:
        """Start embedding an append's chunk texts while its transaction commits."""
        return asyncio.ensure_future(self._embed(texts))

    async def _embed(self, texts: Sequence[str]) -> Vectors:
        """The texts' vectors, embedded at most `_embed_size` texts a call. A call that runs
        past its deadline is split in two and each half tried again, and later calls keep the
        smaller size: the model on a CPU can take longer over a full batch than the deadline
        allows, and retrying the whole batch would fail the same way for ever. A half that
        runs past its deadline too fails the embedding, to be retried later at the size now
        kept: an embed service that holds calls without answering costs two deadlines, not
        one for every text. After GROW_AFTER_CALLS embeddings whose calls all fit, the size
        doubles again."""
        texts = [embedded_text(text) for text in texts]
        size = self._embed_size
        parts = [
            await self._embed_call(texts[start : start + size])
            for start in range(0, len(texts), size)
        ]
        if self._embed_size == size < self._batch_size:  # none of its calls was split
            self._fitted += 1
            if self._fitted >= GROW_AFTER_CALLS:
                self._embed_size, self._fitted = min(self._batch_size, 2 * size), 0
        return np.vstack(parts)

    async def _embed_call(self, texts: Sequence[str], split: bool = True) -> Vectors:
        try:
            async with self._embed_slots:
                return await self._embedder.embed(texts, self._embed_timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or len(texts) == 1 or not split:
                raise
        half = len(texts) // 2
        if half < self._embed_size:
            self._embed_size, self._fitted = half, 0
            log.warning(
                "indexer: embedding %d texts ran past the deadline; now %d a call", len(texts), half
            )
        return np.vstack(
            [
                await self._embed_call(texts[:half], split=False),
                await self._embed_call(texts[half:], split=False),
            ]
        )

    async def index_now(
        self,
        queued: QueuedChunks,
        timeout: float,
        embedding: asyncio.Future[Vectors] | None = None,
    ) -> bool:
        """Index the chunks an append just queued, their job leased to the caller, with their
        `embedding` from `embed_ahead` if started. True once they are searchable, within
        `timeout` seconds; closing the job goes on after that, in the same task. If the
        indexing fails the job goes to the background worker, which retries it with backoff;
        past `timeout` it goes on regardless."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        searchable: asyncio.Future[bool] = loop.create_future()
        # Queued with attempts 0 and leased to this append; kept so while it is indexed here.
        self._leases.hold({queued.job_id: 0})
        task = asyncio.create_task(self._index_own(queued, searchable, embedding))
        self._own[task] = queued.job_id
        task.add_done_callback(self._own.pop)
        try:
            if await asyncio.wait_for(asyncio.shield(searchable), timeout):
                return True
        except TimeoutError:
            return False
        return await self.wait_done([queued.job_id], deadline - loop.time())

    async def wait_done(self, job_ids: Sequence[int], timeout: float) -> bool:
        """True once none of `job_ids` is left in the outbox (done here or by another replica),
        checked after each batch this worker finishes and at least every POLL_SECONDS; jobs
        this worker finished are known without asking the database."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._done_here.issuperset(job_ids):
                return True
            left = await self._pool.fetchval(
                "SELECT count(*) FROM index_outbox WHERE job_id = ANY($1::bigint[])",
                list(job_ids),
            )
            remaining = deadline - loop.time()
            if not left or remaining <= 0:
                return not left
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), min(POLL_SECONDS, remaining))

    async def _index_own(
        self,
        queued: QueuedChunks,
        searchable: asyncio.Future[bool],
        embedding: asyncio.Future[Vectors] | None,
    ) -> None:
        job = Job(
            queued.job_id,
            queued.org_id,
            "upsert",
            queued.conversation_id,
            [chunk_id for chunk_id, _, _ in queued.chunks],
            attempts=1,
        )
        chunks = [
            _Chunk(chunk_id, queued.conversation_id, version, text, None)
            for chunk_id, version, text in queued.chunks
        ]
        try:
            vectors = None
            if embedding is not None:
                # Only what is left of it after the commit holds up the answer.
                with timing.part("embed_wait"):
                    vectors = await embedding
            await self._embed_and_index(job.org_id, chunks, vectors)
            searchable.set_result(True)
            await self._leases.release([job.job_id])
            await self._finish([job])
        except Exception as exc:  # any failure: the worker takes the job over
            await self._leases.release([job.job_id])
            with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await self._retry_later(job, exc)  # else the lease runs out
            self.notify()
        finally:
            await self._leases.release([job.job_id])  # none stays leased for ever
            if not searchable.done():
                searchable.set_result(False)

    async def _run(self) -> None:
        while True:
            try:
                worked = await self.run_once()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("indexer: database unavailable (%s); retrying", type(exc).__name__)
                worked = False
            except Exception:  # a bug must not end the worker unseen while the outbox grows
                log.exception("indexer: a batch failed; retrying")
                worked = False
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)
                self._wake.clear()

    async def run_once(self) -> bool:
        """Lease and process one batch of due jobs; False when none was due.

        A batch, or one of its jobs, can outlast the lease (the model on a CPU embeds a window
        or two a second). While it runs, the jobs not yet closed are leased again every third
        of a lease, as long as no one else has taken them since, and every half lease the
        jobs done so far are closed: another replica neither takes them and embeds them
        twice nor waits for the whole batch."""
        jobs = await self._lease()
        if not jobs:
            return False
        self._leases.hold({job.job_id: job.attempts for job in jobs})
        try:
            loop = asyncio.get_running_loop()
            close_at = loop.time() + LEASE_SECONDS / 2
            done: list[Job] = []
            # Services that did not answer a job of this batch. The jobs after it that need
            # one are put off without calling it: otherwise one shard down, each call waiting
            # out its deadline, holds up every other shard's jobs behind its own.
            down: set[str] = set()
            for job in jobs:
                try:
                    if job.kind == "delete":
                        with _reaching(self._index.shard_of(job.org_id), down):
                            await self._index.delete_conversation(job.org_id, job.conversation_id)
                    else:
                        await self._index_chunks(job, down)
                except Exception as exc:  # any failure: keep the job, retry with backoff
                    await self._leases.release([job.job_id])
                    await self._retry_later(job, exc)
                else:
                    done.append(job)
                if done and loop.time() >= close_at:
                    await self._close(done)
                    done = []
                    close_at = loop.time() + LEASE_SECONDS / 2
            if done:
                await self._close(done)
        finally:  # whatever went wrong, none stays leased for ever
            await self._leases.release([job.job_id for job in jobs])
        return True

    async def _close(self, done: list[Job]) -> None:
        await self._leases.release([job.job_id for job in done])  # no renewal after the close
        await self._finish(done)
        self._announce_progress()

    def _announce_progress(self) -> None:
        """Wake `wait_done`'s waiters to look again."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def _keep_term_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_CHECK_SECONDS)
            orgs, self._orgs_changed = self._orgs_changed, set()
            for org_id in sorted(orgs):
                try:
                    async with self._pool.acquire() as conn:
                        if not await lexical.keep_stats(conn, org_id):
                            self._orgs_changed.add(org_id)  # held by a delete or a replica
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.warning("indexer: term statistics not refreshed (%s)", type(exc).__name__)
                    self._orgs_changed.add(org_id)
                except Exception:  # a bug must not end the task unseen
                    log.exception("indexer: term statistics not refreshed")
                    self._orgs_changed.add(org_id)

    async def _keep_full_text_index(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            if not self._chunks_indexed:
                continue
            self._chunks_indexed = False
            try:
                async with self._pool.acquire() as conn:
                    await lexical.flush_pending(conn)
            except (asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedTableError) as exc:
                log.warning(
                    "indexer: %s cannot be flushed (%s); inserts move its pending list into "
                    "it themselves. Make the service's role its owner (ALTER INDEX ... OWNER "
                    "TO) and restart to flush it in the background.",
                    lexical.FULL_TEXT_INDEX,
                    type(exc).__name__,
                )
                return
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("indexer: full-text index not flushed (%s)", type(exc).__name__)
                self._chunks_indexed = True
            except Exception:  # a bug must not end the task unseen, nor fail the shutdown
                log.exception("indexer: full-text index not flushed")

    async def _lease(self) -> list[Job]:
        # Jobs that appends here are still indexing themselves stay theirs past the lease: a
        # slow embedding (the model on a CPU) must not be done twice in one process.
        # Due deletes come first, up to a batch of them beside the batch of upserts: they
        # embed nothing, and a deleted conversation's vectors must not wait behind a backlog
        # of embeddings. An upsert leased after a delete of its conversation finds no chunks
        # and queues the removal again (_finish).
        rows = await self._pool.fetch(
            """WITH deletes AS (
                   SELECT job_id FROM index_outbox
                    WHERE kind = 'delete' AND run_after <= now() AND job_id <> ALL($3::bigint[])
                    ORDER BY job_id LIMIT $1 FOR UPDATE SKIP LOCKED),
               upserts AS (
                   SELECT job_id FROM index_outbox
                    WHERE kind = 'upsert' AND run_after <= now() AND job_id <> ALL($3::bigint[])
                    ORDER BY job_id LIMIT $1 FOR UPDATE SKIP LOCKED)
               UPDATE index_outbox SET run_after = now() + make_interval(secs => $2),
                                       attempts = attempts + 1
                WHERE job_id IN (SELECT job_id FROM deletes UNION ALL SELECT job_id FROM upserts)
            RETURNING job_id, org_id, kind, conversation_id, chunk_ids, attempts""",
            self._batch_size,
            LEASE_SECONDS,
            list(self._own.values()),
        )
        jobs = (Job(**dict(r)) for r in rows)
        return sorted(jobs, key=lambda j: (j.kind != "delete", j.job_id))

    async def _index_chunks(self, job: Job, down: set[str]) -> None:
        rows = await self._pool.fetch(
            """SELECT c.chunk_id, c.conversation_id, c.version, c.text, v.embedding
                 FROM chunks c
                 LEFT JOIN chunk_vectors v USING (org_id, conversation_id, start_sequence, version)
                WHERE c.org_id = $1 AND c.chunk_id = ANY($2::text[])""",
            job.org_id,
            job.chunk_ids,
        )
        await self._embed_and_index(job.org_id, [_Chunk(**dict(r)) for r in rows], down=down)

    async def _embed_and_index(
        self,
        org_id: str,
        chunks: list[_Chunk],
        vectors: Vectors | None = None,
        down: set[str] | None = None,
    ) -> None:
        """Embed the chunks that have no vector yet (or take their `vectors`, one per such
        chunk, in order), store the new vectors, and upsert every chunk's vector, with its
        version, to the org's shard: they are searchable on return. A chunk rebuilt meanwhile
        was queued again with a newer version, which its shard keeps over this one. `down`:
        the services a batch found unreachable (Unreachable if one is needed)."""
        down = set() if down is None else down
        # Already embedded (by an earlier attempt, or a later job): ready as stored, unless
        # the embed service now answers in other dimensions. A shard refuses such vectors, and
        # once the embedder was put right, resending the stored ones would fail for ever.
        size = None if self._embedder.dim is None else self._embedder.dim * 4

        def stored(chunk: _Chunk) -> bool:
            return chunk.embedding is not None and size in (None, len(chunk.embedding))

        ready = [c for c in chunks if stored(c)]
        pending = [c for c in chunks if not stored(c)]
        if pending:
            if vectors is None:
                with _reaching(EMBEDDER, down):
                    vectors = await self._embed([c.text for c in pending])
            blobs = [vector.astype("<f4").tobytes() for vector in vectors]
            with timing.part("vectors"):
                await self._store_vectors(org_id, pending, blobs)
            ready += [replace(c, embedding=b) for c, b in zip(pending, blobs, strict=True)]
        if ready:
            items = [(c.chunk_id, c.conversation_id, c.version, c.embedding or b"") for c in ready]
            with _reaching(self._index.shard_of(org_id), down):
                await self._index.upsert(org_id, items, len(items[0][3]) // 4)

    async def _store_vectors(
        self, org_id: str, chunks: Sequence[_Chunk], blobs: Sequence[bytes]
    ) -> None:
        """Store the chunks' new vectors, each with the version it was embedded from and only
        while that is the chunk's version: a chunk rebuilt meanwhile gets its vector from its
        own, later job. The chunks are share-locked, so a chunk whose delete commits meanwhile
        is skipped instead of failing the foreign key check. A vector of the same version
        replaces the stored one only where their sizes differ: embedded again because the
        embed service's dimensions changed (`_embed_and_index`).

        The commit does not wait for the WAL to reach the disk: the job's close, a later
        commit, waits for this one's WAL with its own, and if the server fails before, the
        job is still queued and is done again. One statement, its own transaction: the CTE
        turns synchronous commit off for it (`set_config` with is_local), where BEGIN, SET
        LOCAL, the insert and COMMIT took four round trips."""
        await self._pool.execute(
            """WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true))
               INSERT INTO chunk_vectors
                      (org_id, conversation_id, start_sequence, version, embedding)
               SELECT c.org_id, c.conversation_id, c.start_sequence, c.version, v.embedding
                 FROM unnest($2::text[], $3::int[], $4::bytea[])
                      AS v(chunk_id, version, embedding)
                 JOIN chunks c
                   ON c.org_id = $1 AND c.chunk_id = v.chunk_id AND c.version = v.version
                CROSS JOIN async_commit
                  FOR KEY SHARE OF c
               ON CONFLICT (org_id, conversation_id, start_sequence) DO UPDATE
                  SET version = excluded.version, embedding = excluded.embedding
                WHERE chunk_vectors.version < excluded.version
                   OR (chunk_vectors.version = excluded.version
                       AND octet_length(chunk_vectors.embedding)
                           <> octet_length(excluded.embedding))""",
            org_id,
            [c.chunk_id for c in chunks],
            [c.version for c in chunks],
            list(blobs),
        )

    async def _finish(self, jobs: Sequence[Job]) -> None:
        """Remove the done jobs from the outbox. A delete that committed while an upsert job
        ran, or between its attempts, may have cleared the shard before an upsert reached it:
        the removal is queued again, in the same statement."""
        ids = [job.job_id for job in jobs]
        checked = [job for job in jobs if job.kind == "upsert"]
        requeued = await self._pool.fetchval(
            """WITH done AS (DELETE FROM index_outbox WHERE job_id = ANY($1::bigint[])),
                    gone AS (
                        SELECT DISTINCT j.org_id, j.conversation_id
                          FROM unnest($2::text[], $3::text[]) AS j(org_id, conversation_id)
                         WHERE NOT EXISTS (
                               SELECT 1 FROM conversations c
                                WHERE c.org_id = j.org_id
                                  AND c.conversation_id = j.conversation_id)),
                    queued AS (
                        INSERT INTO index_outbox (org_id, kind, conversation_id)
                        SELECT org_id, 'delete', conversation_id FROM gone RETURNING 1)
               SELECT count(*) FROM queued""",
            ids,
            [job.org_id for job in checked],
            [job.conversation_id for job in checked],
        )
        self._done_here.update(ids)
        self._done_order.extend(ids)
        while len(self._done_order) > DONE_REMEMBERED:
            self._done_here.discard(self._done_order.popleft())
        self._orgs_changed.update(job.org_id for job in jobs)
        self._chunks_indexed = True
        if requeued:
            self.notify()

    async def _retry_later(self, job: Job, exc: Exception) -> None:
        delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** min(job.attempts, 10))
        refused = _refused(exc)
        # Nothing is dropped: the job waits, retried, until the deployment is put right.
        log.log(
            logging.ERROR if refused else logging.WARNING,
            "indexer: job %d (%s) failed on attempt %d: %s; retrying in %.1fs%s",
            job.job_id,
            job.kind,
            job.attempts,
            _reason(exc),
            delay,
            "; refused as sent, it fails the same way until its cause is put right (most"
            " often services whose settings disagree)"
            if refused
            else "",
        )
        # An append's own attempt is not counted when the job is queued: it is here, so that
        # the worker's first attempt is the second.
        await self._pool.execute(
            "UPDATE index_outbox SET run_after = now() + make_interval(secs => $2), "
            "last_error = $3, attempts = greatest(attempts, $4) WHERE job_id = $1",
            job.job_id,
            delay,
            f"{type(exc).__name__}: {exc}"[:500],
            job.attempts,
        )


def _reason(exc: Exception) -> str:
    """What failed, for the log: the exception's type, a gRPC call's status code and, for a
    call refused as sent, the service's reason (it names limits and fields, never content)."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return type(exc).__name__
    reason = f"{type(exc).__name__} {exc.code().name}"
    return f"{reason} ({(exc.details() or '')[:200]})" if _refused(exc) else reason


def _refused(exc: Exception) -> bool:
    """Whether `exc` is a gRPC call its service refused as sent (REFUSED)."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in REFUSED


class _Leases:
    """Outbox jobs a worker is indexing (job id: the attempt that leased them), leased again
    every third of a lease while `keep` runs. A job another worker has leased since has a
    later attempt: it is left to that worker. Release a job before closing it or handing it
    back: the lock keeps a renewal from landing after (on a deleted row, harmless; over a
    retry's earlier run_after, a delay)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._held: dict[int, int] = {}
        self._lock = asyncio.Lock()

    def hold(self, attempts: dict[int, int]) -> None:
        self._held.update(attempts)

    def held(self) -> dict[int, int]:
        """The jobs held now: job id -> the attempt that leased it."""
        return dict(self._held)

    async def release(self, job_ids: list[int]) -> None:
        async with self._lock:
            for job_id in job_ids:
                self._held.pop(job_id, None)

    async def keep(self) -> None:
        while True:
            await asyncio.sleep(LEASE_SECONDS / 3)
            async with self._lock:
                if self._held:
                    await self._renew()

    async def _renew(self) -> None:
        ids = list(self._held)
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            kept = await _lease_until(self._pool, self._held, LEASE_SECONDS)
            for job_id in ids:
                if job_id not in kept:
                    self._held.pop(job_id, None)


async def _lease_until(pool: asyncpg.Pool, held: dict[int, int], seconds: float) -> set[int]:
    """Make the `held` jobs (job id -> the attempt that leased them) due `seconds` from now;
    a job another worker has leased since (a later attempt) is left to it. The ids of the
    jobs still held."""
    if not held:
        return set()
    rows = await pool.fetch(
        """UPDATE index_outbox o SET run_after = now() + make_interval(secs => $3)
             FROM unnest($1::bigint[], $2::int[]) AS h(job_id, attempts)
            WHERE o.job_id = h.job_id AND o.attempts = h.attempts
        RETURNING o.job_id""",
        list(held),
        list(held.values()),
        seconds,
    )
    return {row["job_id"] for row in rows}
