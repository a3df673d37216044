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


def test_unknown_keys_being_looked_up_count_as_failures() -> None:
    throttle = FailedAuthThrottle(max_failures=2, window_seconds=10, clock=lambda: 0.0)
    with throttle.looking_up("a", b"k1"), throttle.looking_up("a", b"k1"):
        assert throttle.retry_after("a") == 0  # one key, however many requests carry it
        with throttle.looking_up("a", b"k2"):
            assert throttle.retry_after("a") == 1.0  # two guesses in flight: the limit
            assert throttle.retry_after("b") == 0
        assert throttle.retry_after("a") == 0
    throttle.failed("a")
    with throttle.looking_up("a", b"k3"):
        assert throttle.retry_after("a") == 10.0  # the failure's window
    assert throttle.retry_after("a") == 0
