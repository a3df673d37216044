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
