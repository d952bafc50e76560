"""Healthcheck verdicts that do not need remote hosts (the SSH ones are in tests/integration/test_hosts.py)."""

from __future__ import annotations

import time

from flagperf.hosts.health import MAX_CLOCK_SKEW_S, check_clock
from flagperf.hosts.local import LocalHost


class _SkewedHost(LocalHost):
    """This machine with its clock moved: skew is a property of the reading, whatever the transport."""

    def __init__(self, offset_s: float) -> None:
        super().__init__("skewed")
        self.offset_s = offset_s

    def clock(self) -> float:
        return time.time() + self.offset_s


def test_clock_skew_is_judged_on_a_cheap_read() -> None:
    assert check_clock(LocalHost()).ok
    for offset in (-(MAX_CLOCK_SKEW_S + 1.0), MAX_CLOCK_SKEW_S + 1.0):  # behind and ahead both count
        check = check_clock(_SkewedHost(offset))
        assert not check.ok and check.detail.startswith(f"{abs(offset):.2f} s against the controller")
    assert check_clock(_SkewedHost(MAX_CLOCK_SKEW_S / 2)).ok


def test_an_unreadable_clock_is_a_failed_check_not_a_crash() -> None:
    class _Broken(LocalHost):
        def clock(self) -> float:
            raise OSError("connection reset")

    check = check_clock(_Broken())
    assert not check.ok and check.detail == "cannot read the host's clock: connection reset"
