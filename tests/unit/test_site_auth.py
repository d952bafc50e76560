"""The results site's throttle of wrong sign-ins, on an injected clock (no sleeping, no timing): free tries, then
a lockout that doubles up to its cap, per client, cleared by a right sign-in, in a table of bounded size."""

from __future__ import annotations

from flagperf.site.auth import SignInThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wrong_sign_ins_lock_the_client_out_for_longer_and_longer() -> None:
    clock = Clock()
    throttle = SignInThrottle(free=3, first_delay_s=2.0, max_delay_s=16.0, clock=clock)
    assert [throttle.failed("10.0.0.9") for _ in range(3)] == [0.0, 0.0, 0.0]  # typos cost nothing
    assert throttle.wait_s("10.0.0.9") == 0.0
    assert throttle.failed("10.0.0.9") == 2.0
    assert throttle.wait_s("10.0.0.9") == 2.0 and throttle.wait_s("10.0.0.8") == 0.0  # that client alone
    clock.now += 1.5
    assert throttle.wait_s("10.0.0.9") == 0.5
    clock.now += 0.5
    assert throttle.wait_s("10.0.0.9") == 0.0
    assert [throttle.failed("10.0.0.9") for _ in range(4)] == [4.0, 8.0, 16.0, 16.0]  # doubling, capped
    throttle.succeeded("10.0.0.9")
    assert throttle.wait_s("10.0.0.9") == 0.0 and throttle.failed("10.0.0.9") == 0.0  # the count starts again


def test_the_table_of_clients_stays_bounded() -> None:
    throttle = SignInThrottle(free=0, first_delay_s=60.0, max_clients=3, clock=Clock())
    for n in range(10):
        throttle.failed(f"10.0.0.{n}")
    locked = [n for n in range(10) if throttle.wait_s(f"10.0.0.{n}") > 0]
    assert locked == [7, 8, 9]
