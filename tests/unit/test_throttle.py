import asyncio

from api_service.auth import FailedAuthThrottle


def test_window_slides() -> None:
    now = [0.0]
    throttle = FailedAuthThrottle(max_failures=2, window_seconds=10, clock=lambda: now[0])
    assert throttle.retry_after("a") == 0
    throttle.failed("a")
    now[0] = 4.0
    throttle.failed("a")
    assert throttle.retry_after("a") == 6.0  # until the first failure is 10 s old
    assert throttle.retry_after("b") == 0  # per client
    now[0] = 10.5
    assert throttle.retry_after("a") == 0


def test_known_keys_are_the_latest_that_authenticated() -> None:
    throttle = FailedAuthThrottle(max_known=2)
    for digest in (b"a", b"b", b"a", b"c"):  # "a" again: the latest but one
        throttle.vouch(digest)
    assert [throttle.knows(d) for d in (b"a", b"b", b"c")] == [True, False, True]


async def test_unknown_keys_being_looked_up_count_toward_the_limit() -> None:
    throttle = FailedAuthThrottle(max_failures=2, window_seconds=10, clock=lambda: 0.0)
    with throttle.looking_up("a", b"k1"):
        assert await throttle.turn("a", b"k2") == 0  # one lookup under way, one more allowed
        with throttle.looking_up("a", b"k2"):
            assert await throttle.turn("a", b"k1") == 0  # its own key is being looked up
            assert await throttle.turn("b", b"k3") == 0  # per client
            third = asyncio.create_task(throttle.turn("a", b"k3"))
            await asyncio.sleep(0.01)
            assert not third.done()  # the two lookups under way make up the limit
        assert await asyncio.wait_for(third, 1) == 0  # k2's lookup ended: it was a valid key
    throttle.failed("a")
    throttle.failed("a")
    assert await throttle.turn("a", b"k4") == 10.0  # two failures: the window


async def test_a_waiting_key_is_refused_once_the_lookups_before_it_failed() -> None:
    throttle = FailedAuthThrottle(max_failures=1, window_seconds=10, clock=lambda: 0.0)
    with throttle.looking_up("a", b"guess"):
        waiting = asyncio.create_task(throttle.turn("a", b"next"))
        await asyncio.sleep(0.01)
    throttle.failed("a")  # as the middleware records it: after the lookup, before it yields
    assert await asyncio.wait_for(waiting, 1) == 10.0
