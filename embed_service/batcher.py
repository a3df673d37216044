"""Dynamic batching of embedding requests.

- Admission is bounded by texts in the system (waiting or being embedded); past the bound a
  call is refused at once with `Overloaded` instead of queueing without limit.
- Tokenization runs on its own threads while the model threads compute earlier batches.
- The worker takes every text waiting (a round), sorts them by token length so that a batch
  carries little padding, and cuts batches under a text count and a padded-token budget. Texts
  that arrive during a round wait for the next one, so no text waits more than one round,
  except the texts of small calls (INTERACTIVE_TEXTS: a search's query, a short append's
  windows), which never join a round: they go ahead of its next batch, or run once its last
  batch has started, first come first served, in a batch of their own: on a CPU a round of
  indexing can take minutes, past a search's deadline, and a batch of windows many times a
  query's time.
- A caller that goes away takes its waiting texts with it; those the worker has already taken
  into a round are skipped when their batch is dispatched.
- A batch that raises fails every request with a text in it; the worker carries on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from embed_service.embedder import Embedder, TokenIds, Vectors
from embed_service.errors import BatchFailed, NotReady, Overloaded

log = logging.getLogger(__name__)


# A call of at most this many texts is waited on by someone: a search embeds one, an append
# of a few messages two or three windows. Between the batches of a round, those that arrived
# since it began run first, one batch at a time, so the round still moves on.
INTERACTIVE_TEXTS = 4


@dataclass(frozen=True)
class BatchLimits:
    """Bounds on admission and on each model batch."""

    max_queued_texts: int
    batch_max_texts: int
    batch_token_budget: int
    batches_in_flight: int = 1
    tokenizer_threads: int = 2


class _Request:
    """One caller's texts; the worker writes their vectors straight into `vectors`."""

    __slots__ = ("future", "remaining", "small", "vectors")

    def __init__(self, count: int, dim: int, future: asyncio.Future[Vectors]) -> None:
        self.vectors: Vectors = np.empty((count, dim), dtype=np.float32)
        self.remaining = count
        self.future = future
        self.small = count <= INTERACTIVE_TEXTS

    def deliver(self, index: int, vector: Vectors) -> None:
        if self.future.done():
            return
        self.vectors[index] = vector
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.vectors)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(eq=False)
class _Item:
    request: _Request
    index: int
    ids: TokenIds


@dataclass
class _State:
    pending: list[_Item] = field(default_factory=list)
    # The worker's current round, and how many of its texts are not yet handed to the model.
    round: list[_Item] = field(default_factory=list)
    round_left: int = 0
    admitted: int = 0
    closed: bool = False


class Batcher:
    """Collects texts from concurrent callers into model batches; see the module docstring."""

    def __init__(self, embedder: Embedder, limits: BatchLimits) -> None:
        self._embedder = embedder
        self._limits = limits
        self._state = _State()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(limits.batches_in_flight)
        self._tokenize_pool = ThreadPoolExecutor(limits.tokenizer_threads, "embed-tokenize")
        self._model_pool = ThreadPoolExecutor(limits.batches_in_flight, "embed-model")
        self._running: set[asyncio.Task[None]] = set()
        self._worker: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """True while the worker runs and the batcher accepts calls."""
        return self._worker is not None and not self._worker.done() and not self._state.closed

    @property
    def queued_texts(self) -> int:
        """Texts admitted and not yet answered (waiting, tokenizing or being embedded)."""
        return self._state.admitted

    @property
    def waiting_texts(self) -> int:
        """Texts tokenized and not yet handed to the model."""
        return len(self._state.pending) + self._state.round_left

    def start(self) -> None:
        """Start the worker on the running event loop."""
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="embed-batcher")
            self._worker.add_done_callback(self._on_worker_exit)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts`, in order. Raises Overloaded past the admission bound."""
        state = self._state
        if state.closed or self._worker is None:
            raise NotReady("embedding service is not accepting requests")
        count = len(texts)
        if count == 0:
            return np.empty((0, self._embedder.dim), dtype=np.float32)
        if state.admitted + count > self._limits.max_queued_texts:
            raise Overloaded(
                f"too many texts in flight ({state.admitted} + {count} > "
                f"{self._limits.max_queued_texts}); retry later"
            )
        state.admitted += count
        loop = asyncio.get_running_loop()
        request = _Request(count, self._embedder.dim, loop.create_future())
        try:
            ids = await loop.run_in_executor(self._tokenize_pool, self._embedder.tokenize, texts)
            if state.closed:
                raise NotReady("embedding service is shutting down")
            state.pending.extend(_Item(request, i, seq) for i, seq in enumerate(ids))
            self._wakeup.set()
            return await request.future
        finally:
            # Unanswered (cancelled, or failed by a batch that held some of its texts): the
            # request is marked done, so the worker skips what it took already, and the texts
            # still waiting go now, not when the worker reaches them. Admission counts only
            # live calls, so without this, callers that time out while the model is busy
            # would pile up texts past the bound.
            if request.future.cancel() or request.remaining:
                state.pending = [it for it in state.pending if it.request is not request]
            state.admitted -= count

    async def close(self) -> None:
        """Refuse new calls, fail the waiting ones, and stop the worker and threads."""
        self._state.closed = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        await asyncio.gather(*self._running, return_exceptions=True)
        self._fail_undispatched(NotReady("embedding service is shutting down"))
        await asyncio.to_thread(self._tokenize_pool.shutdown, wait=True)
        await asyncio.to_thread(self._model_pool.shutdown, wait=True)

    async def _work(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # Small calls stay waiting: _dispatch_round starts them ahead of the round's
            # batches, and after its last.
            state = self._state
            items = [it for it in state.pending if not it.request.small]
            state.pending = [it for it in state.pending if it.request.small]
            try:
                await self._dispatch_round(items)
            except Exception as exc:
                # A bug in planning must not strand callers or stop the worker.
                log.exception("batching round failed")
                for item in items:
                    item.request.fail(BatchFailed(f"batching failed: {exc}"))
            # Not in a `finally`: on cancellation `close` still needs the round's leftovers.
            self._state.round = []
            self._state.round_left = 0
            if state.pending:  # small calls past the one batch the round ended with (live:
                self._wakeup.set()  # _take_interactive dropped the rest)

    async def _dispatch_round(self, items: list[_Item]) -> None:
        live = sorted(
            (it for it in items if not it.request.future.done()), key=lambda it: len(it.ids)
        )
        self._state.round = live
        self._state.round_left = len(live)
        for planned in plan_batches(
            [len(it.ids) for it in live],
            self._limits.batch_max_texts,
            self._limits.batch_token_budget,
        ):
            await self._slots.acquire()
            interactive = self._take_interactive()
            if interactive:
                self._start_batch(interactive)
                await self._slots.acquire()
            self._state.round_left -= len(planned)
            # Checked again at dispatch: callers may have left while earlier batches ran.
            batch = [live[i] for i in planned if not live[i].request.future.done()]
            if not batch:
                self._slots.release()
                continue
            self._start_batch(batch)
        # Small calls that came while the last batch waited for its slot (or all the round
        # had): one batch of them before the next round, as before each of this one's.
        await self._slots.acquire()
        interactive = self._take_interactive()
        if interactive:
            self._start_batch(interactive)
        else:
            self._slots.release()

    def _take_interactive(self) -> list[_Item]:
        """One batch of the waiting texts of small calls (INTERACTIVE_TEXTS), taken out of
        `pending` in the order they came, as many as fit under the batch limits (a text over
        the token budget alone); empty if there are none. First come, because shortest first
        would keep a long window of a short append waiting while shorter queries kept coming.

        The texts of callers that went away are dropped here too: a caller's own cleanup runs
        when its task next runs, and until then the worker would find them waiting, wake
        itself for them and, with a slot free, never yield to the loop."""
        state = self._state
        state.pending = [it for it in state.pending if not it.request.future.done()]
        batch: list[_Item] = []
        longest = 0
        for item in state.pending:
            if not item.request.small:
                continue
            longest = max(longest, len(item.ids))
            count = len(batch) + 1
            if batch and (
                count > self._limits.batch_max_texts
                or count * longest > self._limits.batch_token_budget
            ):
                break
            batch.append(item)
        taken = {id(item) for item in batch}
        state.pending = [it for it in state.pending if id(it) not in taken]
        return batch

    def _start_batch(self, batch: list[_Item]) -> None:
        """Run `batch` on the model, in the slot its caller acquired."""
        task = asyncio.create_task(self._run_batch(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_batch(self, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        try:
            vectors = await loop.run_in_executor(
                self._model_pool, self._embedder.embed, [it.ids for it in batch]
            )
            if vectors.shape[0] != len(batch):
                raise RuntimeError(f"model returned {vectors.shape[0]} rows for {len(batch)}")
        except Exception as exc:
            log.exception("model batch of %d texts failed", len(batch))
            error = BatchFailed(f"embedding failed: {type(exc).__name__}")
            for item in batch:
                item.request.fail(error)
        else:
            for item, vector in zip(batch, vectors, strict=True):
                item.request.deliver(item.index, vector)
        finally:
            self._slots.release()

    def _on_worker_exit(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("embedding worker stopped", exc_info=task.exception())
            self._state.closed = True
            self._fail_undispatched(NotReady("embedding worker stopped"))

    def _fail_undispatched(self, error: NotReady) -> None:
        state = self._state
        undispatched = state.round[len(state.round) - state.round_left :]
        for item in (*undispatched, *state.pending):
            item.request.fail(error)
        self._state.round = []
        self._state.pending = []
        self._state.round_left = 0


def plan_batches(lengths: Sequence[int], max_texts: int, token_budget: int) -> Iterator[range]:
    """Cut texts sorted by ascending length into index ranges under both limits.

    A batch costs its text count times its longest text (padding included). A single text
    longer than the budget still forms a batch of its own.
    """
    start = 0
    for i, length in enumerate(lengths):
        count = i - start + 1
        if i > start and (count > max_texts or count * length > token_budget):
            yield range(start, i)
            start = i
    if start < len(lengths):
        yield range(start, len(lengths))
