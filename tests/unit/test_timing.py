"""flagperf.measure.timing.measure, driven by a fake clock that advances only when a step runs."""

from __future__ import annotations

import pytest

from flagperf.measure.timing import TARGET_CHUNKS, TimingPlan, measure


class FakeDevice:
    """Each step takes ``step_s`` of fake time; every call is logged in order."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.now = 0.0
        self.events: list[str] = []

    def clock(self) -> float:
        self.events.append("clock")
        return self.now

    def step(self) -> None:
        self.events.append("step")
        self.now += self.step_s

    def sync(self) -> None:
        self.events.append("sync")

    def run(self, plan: TimingPlan):
        return measure(self.step, self.sync, plan, clock=self.clock)


def test_warmup_steps_come_first_and_are_not_timed() -> None:
    dev = FakeDevice(0.25)
    dev.run(TimingPlan(warmup_iters=7, min_duration_s=10, min_iters=1))
    assert dev.events[:8] == ["step"] * 7 + ["sync"]
    # then one calibration step, timed and synchronised, before the first chunk
    assert dev.events[8:13] == ["clock", "step", "sync", "clock", "sync"]


def test_no_warmup() -> None:
    dev = FakeDevice(0.25)
    dev.run(TimingPlan(warmup_iters=0, min_duration_s=10, min_iters=1))
    assert dev.events[:2] == ["sync", "clock"]


def test_min_duration_reached_in_calibrated_chunks() -> None:
    dev = FakeDevice(0.25)
    chunks = dev.run(TimingPlan(warmup_iters=3, min_duration_s=10, min_iters=1))
    # calibration: one step of 0.25 s -> 10 / TARGET_CHUNKS / 0.25 = 2 steps per chunk
    assert TARGET_CHUNKS == 20
    assert [c.iterations for c in chunks] == [2] * 20
    assert all(c.seconds == 0.5 for c in chunks)
    assert sum(c.seconds for c in chunks) == 10.0
    assert dev.events.count("step") == 3 + 1 + 40


def test_min_iters_tops_up_exactly() -> None:
    dev = FakeDevice(0.25)
    chunks = dev.run(TimingPlan(warmup_iters=0, min_duration_s=10, min_iters=45))
    # 40 steps reach 10 s; then chunks are trimmed so exactly 45 steps are timed.
    assert [c.iterations for c in chunks] == [2] * 20 + [2, 2, 1]
    assert sum(c.iterations for c in chunks) == 45
    assert sum(c.seconds for c in chunks) == pytest.approx(45 * 0.25)


def test_both_minimums_satisfied_for_slow_steps() -> None:
    dev = FakeDevice(1.0)
    chunks = dev.run(TimingPlan(warmup_iters=0, min_duration_s=2, min_iters=5))
    assert [c.iterations for c in chunks] == [1] * 5
    assert sum(c.seconds for c in chunks) == 5.0


@pytest.mark.parametrize(("step_s", "min_duration_s", "min_iters"), [(0.001, 0.5, 3), (0.3, 1.0, 7), (2.0, 1.0, 1),
                                                                     (0.0625, 4.0, 100)])
def test_both_minimums_always_hold(step_s: float, min_duration_s: float, min_iters: int) -> None:
    dev = FakeDevice(step_s)
    chunks = dev.run(TimingPlan(0, min_duration_s, min_iters))
    total_iters = sum(c.iterations for c in chunks)
    total_seconds = sum(c.seconds for c in chunks)
    assert total_iters >= min_iters
    assert total_seconds >= min_duration_s - 1e-9
    assert total_seconds == pytest.approx(total_iters * step_s)
    # it stops as soon as both hold: without the last chunk one of them would not
    last = chunks[-1]
    assert total_iters - last.iterations < min_iters or total_seconds - last.seconds < min_duration_s


def test_max_duration_stops_early() -> None:
    plan = dict(warmup_iters=0, min_duration_s=30, min_iters=2)
    unbounded = FakeDevice(10.0).run(TimingPlan(**plan))
    assert len(unbounded) == 3  # 30 s of 10 s steps
    dev = FakeDevice(10.0)
    chunks = dev.run(TimingPlan(**plan, max_duration_s=15))
    assert [c.iterations for c in chunks] == [1, 1]
    assert sum(c.seconds for c in chunks) == 20.0


def test_max_duration_not_reached_changes_nothing() -> None:
    a = FakeDevice(0.25).run(TimingPlan(0, 10, 1))
    b = FakeDevice(0.25).run(TimingPlan(0, 10, 1, max_duration_s=100))
    assert a == b


def test_max_duration_still_honours_min_iters() -> None:
    chunks = FakeDevice(10.0).run(TimingPlan(warmup_iters=0, min_duration_s=30, min_iters=5, max_duration_s=15))
    assert sum(c.iterations for c in chunks) >= 5


def test_sync_at_every_chunk_boundary_and_only_there() -> None:
    dev = FakeDevice(0.25)
    chunks = dev.run(TimingPlan(warmup_iters=2, min_duration_s=10, min_iters=45))
    assert dev.events.count("sync") == 2 + 2 * len(chunks)
    timed = dev.events[dev.events.index("sync", 3) + 1:]  # after warm-up and calibration
    timed = timed[1:]  # the calibration's closing clock read
    expected: list[str] = []
    for c in chunks:
        expected += ["sync", "clock", *["step"] * c.iterations, "sync", "clock"]
    assert timed == expected


def test_real_clock_default() -> None:
    calls = []
    chunks = measure(lambda: calls.append(1), lambda: None, TimingPlan(1, 0.01, 3))
    assert sum(c.iterations for c in chunks) >= 3
    assert sum(c.seconds for c in chunks) >= 0.01
    assert len(calls) == 1 + 1 + sum(c.iterations for c in chunks)
