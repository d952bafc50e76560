"""The conventions an operation round holds to and states, as the field's operator benchmarks do (Triton's do_bench,
TritonBench, FlagGems' benchmark, torch.utils.benchmark): fp32 matrix products in IEEE fp32 whatever the process
was set to, an implementation that switches them failing its point; the cache flush at least Triton's 256 MB on an
accelerator; the CPU's thread count in the record."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from flagperf.config.vendors import load_vendor
from flagperf.operation.config import plan_points
from flagperf.operation.driver import Implementations, PointRunner, run_operation
from flagperf.operation.impls import ImplEnv, OperatorImplementation
from flagperf.operation.precision import IEEE, PinnedArithmetic, ieee_matmuls, matmul_arithmetic, set_arithmetic
from flagperf.operation.timer import ACCELERATOR_FLUSH_FLOOR, CacheFlush, flush_bytes
from flagperf.results.schema import SpecTable
from tests.unit.test_operation import config

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_spec() -> SpecTable:
    return load_vendor("cpu").spec_table()


@pytest.fixture
def tf32_process() -> Iterator[dict[str, str]]:
    """The process set to TF32 products (as an environment or a library's import may leave it), put back after."""
    before = matmul_arithmetic()
    torch.set_float32_matmul_precision("high")
    try:
        yield matmul_arithmetic()
    finally:
        set_arithmetic(before)


class _Recorder(OperatorImplementation):
    """The native call, recording the fp32 matrix-product setting each call ran under."""

    seen: list[dict[str, str]]

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        def fn(*inputs: Any) -> Any:
            self.seen.append(matmul_arithmetic())
            return native(*inputs)
        return fn


class _Switcher(OperatorImplementation):
    """A library that turns on TF32 (and bf16 on the CPU) products when it prepares a point, and returns native's
    result: right, but its calls (and every later point's, left so) ran in another arithmetic than native's."""

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        torch.set_float32_matmul_precision("medium")
        return native


def test_the_round_pins_ieee_products_states_it_and_gives_the_process_its_setting_back(
        tf32_process: dict[str, str], cpu_spec: SpecTable) -> None:
    outcome = run_operation(config(operators=["mm"]), "cpu", cpu_spec, CPU)
    assert [p.status for p in outcome.report.points] == ["passed"]
    assert f"pinned to '{IEEE}' for the round" in outcome.report.timing
    assert f"the process had {', '.join(f'{k} {v}' for k, v in tf32_process.items())}" in outcome.report.timing
    assert matmul_arithmetic() == tf32_process  # given back


def test_an_implementation_that_switches_to_tf32_fails_and_the_next_runs_in_ieee(cpu_spec: SpecTable) -> None:
    env = ImplEnv(device=CPU, log=logging.getLogger("test"))
    recorder = _Recorder(env)
    recorder.seen = []
    cfg = config(operators=["mm", "add"])
    with ieee_matmuls() as pinned:
        runner = PointRunner(cfg, cpu_spec, CPU, Implementations(ready={"switcher": _Switcher(env), "rec": recorder}),
                             arithmetic=pinned)
        for point in plan_points(cfg):
            runner.run(point)
        ieee = pinned.pinned
    by = {(p.operator, p.implementation): p for p in runner.points}
    for op in ("mm", "add"):
        switched = by[(op, "switcher")]
        assert switched.status == "failed" and switched.metric is None and switched.latency_s is None
        assert switched.error.startswith("changed torch's fp32 matrix-product arithmetic to "), switched.error
        assert "(IEEE fp32 is pinned for the round; put back for the points after)" in switched.error
        assert by[(op, "rec")].status == "passed"
    # every call of the implementation after it, in both points, ran in IEEE products
    assert recorder.seen and all(state == ieee for state in recorder.seen)
    assert not [m for m in runner.metrics if m.name.endswith("@switcher")]


def test_an_unchanged_setting_is_no_finding() -> None:
    with ieee_matmuls() as pinned:
        assert isinstance(pinned, PinnedArithmetic) and pinned.changed() is None


@pytest.mark.parametrize(("cache", "accelerator", "expected"), [
    (50 * 2**20, True, ACCELERATOR_FLUSH_FLOOR),     # an H100's L2: twice it is under Triton's 256 MB
    (4 * 2**20, True, ACCELERATOR_FLUSH_FLOOR),      # an L2 behind a larger memory-side cache torch does not report
    (None, True, ACCELERATOR_FLUSH_FLOOR),           # a device that does not say
    (200 * 2**20, True, 400 * 2**20),                # twice a larger L2
    (32 * 2**20, False, 64 * 2**20),                 # the CPU: twice its last-level cache, no floor
])
def test_the_flush_is_twice_the_cache_and_on_an_accelerator_at_least_tritons(
        cache: int | None, accelerator: bool, expected: int) -> None:
    assert ACCELERATOR_FLUSH_FLOOR == 256 * 2**20
    assert flush_bytes(cache, accelerator) == expected


def test_the_cpu_flush_and_record_say_their_size_and_threads(cpu_spec: SpecTable) -> None:
    flush = CacheFlush(CPU)
    assert "256 MiB" not in flush.description and "twice the last-level cache" in flush.description
    outcome = run_operation(config(operators=["add"]), "cpu", cpu_spec, CPU)
    assert f"torch's intra-op threads: {torch.get_num_threads()} (of " in outcome.report.timing
