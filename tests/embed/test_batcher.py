"""The dynamic batcher with a fake model: admission, cancellation, failures, batch shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from embed_service.batcher import Batcher, BatchLimits, _Item, _Request, plan_batches
from embed_service.errors import BatchFailed, NotReady, Overloaded
from tests.embed.fakes import FakeEmbedder


@pytest.fixture
async def fake() -> FakeEmbedder:
    return FakeEmbedder(asyncio.get_running_loop())


def _limits(**overrides: int) -> BatchLimits:
    values = {
        "max_queued_texts": 100,
        "batch_max_texts": 64,
        "batch_token_budget": 10_000,
        "batches_in_flight": 1,
        "tokenizer_threads": 1,
    }
    values.update(overrides)
    return BatchLimits(**values)


@pytest.fixture
async def make_batcher(fake: FakeEmbedder) -> AsyncIterator[Callable[..., Batcher]]:
    made: list[Batcher] = []

    def make(**overrides: int) -> Batcher:
        batcher = Batcher(fake, _limits(**overrides))
        batcher.start()
        made.append(batcher)
        return batcher

    yield make
    fake.gate.set()
    fake.release.set()
    for batcher in made:
        await batcher.close()


async def _until(predicate: Callable[[], bool]) -> None:
    """Yield to the event loop until `predicate` holds: a state change, not a timer."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def _block_model(fake: FakeEmbedder, batcher: Batcher) -> asyncio.Task[object]:
    """Start a one-text call and return once the model is busy with it behind a closed gate."""
    fake.gate.clear()
    fake.entered.clear()
    task = asyncio.create_task(batcher.embed(["blocker"]))
    await fake.entered.wait()
    return task


async def _round_waiting(batcher: Batcher, texts: list[str]) -> asyncio.Task[object]:
    """Start a call of more texts than go ahead as a small call's, and return once the worker
    has taken them into a round, where they wait for the model."""
    call = asyncio.create_task(batcher.embed(texts))
    await _until(lambda: batcher.waiting_texts == len(texts) and not batcher._state.pending)
    return call


async def test_vectors_come_back_in_request_order(make_batcher: Callable[..., Batcher]) -> None:
    batcher = make_batcher()
    texts = ["ccc", "a", "bbbbb", "dd"]
    vectors = await batcher.embed(texts)
    assert vectors[:, 0].tolist() == [3, 1, 5, 2]
    assert vectors[:, 1].tolist() == [ord("c"), ord("a"), ord("b"), ord("d")]


async def test_overload_is_refused_and_capacity_returns(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    batcher = make_batcher(max_queued_texts=3)
    blocker = await _block_model(fake, batcher)
    waiting = asyncio.create_task(batcher.embed(["x", "y"]))
    await _until(lambda: batcher.queued_texts == 3)
    with pytest.raises(Overloaded):
        await batcher.embed(["z"])
    fake.gate.set()
    await blocker
    await waiting
    assert batcher.queued_texts == 0
    assert (await batcher.embed(["a", "b", "c"])).shape == (3, 4)
    assert "z" not in fake.seen()


async def test_cancelled_caller_is_skipped(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    batcher = make_batcher()
    blocker = await _block_model(fake, batcher)
    gone = asyncio.create_task(batcher.embed(["gone"]))
    stays = asyncio.create_task(batcher.embed(["stays"]))
    await _until(lambda: batcher.waiting_texts == 2)
    gone.cancel()
    fake.gate.set()
    await blocker
    assert (await stays)[0, 0] == len("stays")
    assert gone.cancelled()
    assert "gone" not in fake.seen()
    assert batcher.queued_texts == 0


async def test_a_cancelled_callers_waiting_texts_leave_with_it(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    """Admission counts live calls only, so the texts of callers that gave up while a round
    waits for the model must not stay behind: they would pile up past the bound."""
    batcher = make_batcher(max_queued_texts=10)
    blocker = await _block_model(fake, batcher)
    holder = await _round_waiting(batcher, ["h1", "h2", "h3", "h4", "h5"])
    for size in (1, 3, 4, 1):  # each fills the bound, then times out
        gone = asyncio.create_task(batcher.embed([f"g{i}" for i in range(size)]))
        await _until(lambda n=5 + size: batcher.waiting_texts == n)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert batcher.waiting_texts == 5
        assert batcher.queued_texts == 6  # the blocker and the holder
    fake.gate.set()
    await asyncio.gather(blocker, holder)
    assert fake.seen() == ["blocker", "h1", "h2", "h3", "h4", "h5"]


async def test_failed_batch_fails_every_waiter_and_worker_lives(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    batcher = make_batcher()
    blocker = await _block_model(fake, batcher)
    # A call too large to go ahead, which the worker takes into a round where it waits for
    # the model: the two small calls after it then go ahead of it together, in whichever order
    # their tokenizing ends (without it the worker could take the first before the second came).
    holder = await _round_waiting(batcher, ["h1", "h2", "h3", "h4", "h5"])
    poisoned = asyncio.create_task(batcher.embed(["fine", "bad!"]))
    neighbour = asyncio.create_task(batcher.embed(["neighbour"]))
    await _until(lambda: batcher.waiting_texts == 8)
    fake.gate.set()
    await blocker
    assert (await holder)[:, 0].tolist() == [2] * 5
    results = await asyncio.gather(poisoned, neighbour, return_exceptions=True)
    assert all(isinstance(r, BatchFailed) for r in results)
    assert [sorted(batch) for batch in fake.batches[1:]] == [
        ["bad!", "fine", "neighbour"],
        ["h1", "h2", "h3", "h4", "h5"],
    ]
    assert batcher.alive
    after = await batcher.embed(["after"])
    assert after[0, 0] == len("after")


async def test_batches_are_sorted_by_length_under_the_token_budget(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    batcher = make_batcher(batch_token_budget=12, batch_max_texts=3)
    blocker = await _block_model(fake, batcher)
    texts = ["aaaaa", "b", "ccc", "dd", "eeee", "f"]
    call = asyncio.create_task(batcher.embed(texts))
    await _until(lambda: batcher.waiting_texts == len(texts))
    fake.gate.set()
    await blocker
    vectors = await call
    assert vectors[:, 0].tolist() == [5, 1, 3, 2, 4, 1]
    # Padded cost = texts x longest <= 12, at most 3 texts, shortest first.
    assert fake.batches[1:] == [["b", "f", "dd"], ["ccc", "eeee"], ["aaaaa"]]


async def test_a_small_call_goes_ahead_of_the_rest_of_a_round(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    """A search's one text, arriving while a round of indexing waits for the model, runs
    before that round's next batch, not after its last: on a CPU a round can take minutes."""
    batcher = make_batcher(batch_max_texts=2)
    blocker = await _block_model(fake, batcher)
    bulk = await _round_waiting(batcher, ["a1", "a2", "a3", "a4", "a5", "a6"])
    query = asyncio.create_task(batcher.embed(["q"]))
    await _until(lambda: batcher.waiting_texts == 7)
    fake.gate.set()
    await asyncio.gather(blocker, bulk, query)
    assert fake.batches == [["blocker"], ["q"], ["a1", "a2"], ["a3", "a4"], ["a5", "a6"]]
    assert (await query)[0].tolist() == [1, ord("q"), 0, 0]


async def test_a_small_call_goes_ahead_of_the_next_round(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    """A search's text arriving while a round's last batch waits for the model runs alone
    next, not in the next round's first batch beside the texts of larger calls."""
    batcher = make_batcher(batch_max_texts=5)
    fake.gate.clear()
    first = [f"a{i}" for i in range(10)]
    round_one = asyncio.create_task(batcher.embed(first))
    await fake.entered.wait()  # the round's first batch of two
    query_one = asyncio.create_task(batcher.embed(["q1"]))
    await _until(lambda: batcher.waiting_texts == 6)
    # q1 goes ahead of the round's last batch and stays with the model; meanwhile a larger
    # call and a second query come.
    fake.held = frozenset({"q1"})
    fake.release.clear()
    fake.gate.set()
    await _until(lambda: fake.seen()[-1:] == ["q1"])
    later = [f"b{i}" for i in range(5)]
    round_two = asyncio.create_task(batcher.embed(later))
    query_two = asyncio.create_task(batcher.embed(["q2"]))
    await _until(lambda: batcher.waiting_texts == 11)
    fake.release.set()
    await asyncio.gather(round_one, query_one, round_two, query_two)
    assert fake.batches == [first[:5], ["q1"], first[5:], ["q2"], later]


async def test_small_calls_alone_are_all_answered(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    """More small calls than one batch holds, with no round to go ahead of."""
    batcher = make_batcher(batch_max_texts=2)
    blocker = await _block_model(fake, batcher)
    calls = [asyncio.create_task(batcher.embed([f"s{i}"])) for i in range(5)]
    await _until(lambda: batcher.waiting_texts == 5)
    fake.gate.set()
    await blocker
    vectors = await asyncio.gather(*calls)
    assert [v[0, 0] for v in vectors] == [2] * 5
    assert sorted(len(batch) for batch in fake.batches[1:]) == [1, 2, 2]


async def test_small_calls_go_first_come(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    """A short append's long window is not overtaken by shorter queries that came after it:
    shortest first would keep it waiting for as long as they kept coming."""
    batcher = make_batcher(batch_token_budget=12)
    blocker = await _block_model(fake, batcher)
    window = asyncio.create_task(batcher.embed(["w" * 10]))
    await _until(lambda: batcher.waiting_texts == 1)
    queries = [asyncio.create_task(batcher.embed([f"q{i}"])) for i in range(3)]
    await _until(lambda: batcher.waiting_texts == 4)
    fake.gate.set()
    await asyncio.gather(blocker, window, *queries)
    assert fake.batches[1] == ["w" * 10]
    assert sorted(fake.batches[2]) == ["q0", "q1", "q2"]


@pytest.mark.timeout(10)
async def test_texts_of_a_caller_gone_before_its_cleanup_do_not_stall_the_worker(
    make_batcher: Callable[..., Batcher],
) -> None:
    """A caller's deadline can expire in the same pass of the loop as the worker wakes: its
    request is then done while its text still waits, until the caller's task runs again. The
    worker, with a slot free, must not go round for it without yielding (the loop would
    freeze: no call, health check or signal served)."""
    batcher = make_batcher()
    gone = _Request(1, 4, asyncio.get_running_loop().create_future())
    gone.future.cancel()
    batcher._state.pending.append(_Item(gone, 0, np.array([1], dtype=np.int64)))
    batcher._wakeup.set()
    vectors = await asyncio.wait_for(batcher.embed(["after"]), 5)
    assert vectors[0, 0] == len("after")
    assert not batcher._state.pending


async def test_close_fails_waiting_callers_and_refuses_new_ones(
    fake: FakeEmbedder, make_batcher: Callable[..., Batcher]
) -> None:
    batcher = make_batcher()
    blocker = await _block_model(fake, batcher)
    waiting = asyncio.create_task(batcher.embed(["late"]))
    await _until(lambda: batcher.waiting_texts == 1)
    closing = asyncio.create_task(batcher.close())
    await _until(lambda: not batcher.alive)
    with pytest.raises(NotReady):
        await batcher.embed(["new"])
    fake.gate.set()
    await closing
    # The batch already with the model finishes; the one still waiting is failed.
    assert (await blocker).shape == (1, 4)
    with pytest.raises(NotReady):
        await waiting


def test_plan_batches_respects_both_limits() -> None:
    assert [list(r) for r in plan_batches([1, 1, 2, 2, 3, 9], 3, 8)] == [
        [0, 1, 2],
        [3, 4],
        [5],
    ]
    # A text longer than the budget still gets a batch of its own.
    assert [list(r) for r in plan_batches([20], 4, 8)] == [[0]]
    assert list(plan_batches([], 4, 8)) == []
