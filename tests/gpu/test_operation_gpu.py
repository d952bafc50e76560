"""The operation family's graph path on a real CUDA device (skipped without one). With cuda_graphs each timed
call is a replay of a graph captured once, and the last replay's output is checked like the first call's: an
implementation whose captured work is not what it does eagerly fails its point, correct ones pass. An
implementation whose next call changes the memory of its last output (a reused output buffer; torch.compile's CUDA
graph trees overwrite theirs) passes: its last timed output is checked before the host loop calls it again. And
torch.compile's graph trees run through the timer (a replay overwrites the last one's output in place: torch 2.13
returns the same cached tensor, so a stale read is silent, and the timer's call order is what protects the check),
and the compile implementation's reduce-overhead mode loads and runs on CUDA.
cross_entropy past one host copy (2^24 logits) is held to its float64 mean computed on the host block by block.

    python -m pytest tests/gpu/test_operation_gpu.py -q
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from flagperf.config.vendors import load_vendor
from flagperf.operation.config import OperationConfig, plan_points
from flagperf.operation.driver import Implementations, PointRunner
from flagperf.operation.impls import ImplEnv, OperatorImplementation

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")]

CUDA = torch.device("cuda")
ENV = ImplEnv(device=CUDA, log=logging.getLogger("test"))


def config(**changes: Any) -> OperationConfig:
    values: dict[str, Any] = dict(operators=["add", "softmax"], dtypes=["fp32"], models=["tiny"], batch_sizes=[1],
                                  seq_lens=[16], implementations=["native"], warmup_s=0.01, rep_s=0.01,
                                  min_iters=4, max_iters=20, flush_cache=True, cuda_graphs=True,
                                  reference_cpu_max_elements=1 << 22, timeout_s=600, max_retries=0)
    values.update(changes)
    return OperationConfig.model_validate(values)


def run(cfg: OperationConfig, impls: dict[str, OperatorImplementation]) -> PointRunner:
    runner = PointRunner(cfg, load_vendor("nvidia").spec_table(), CUDA, Implementations(ready=impls))
    for point in plan_points(cfg):
        runner.run(point)
    return runner


class Eager(OperatorImplementation):
    """The native call as it is."""

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        return native


class CaptureDiffers(OperatorImplementation):
    """Right when called, wrong in what a graph captures of it: a path taken only under capture (here it zeroes
    the output's last row), so every replay differs from the call that was checked first."""

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        def fn(*inputs: Any) -> Any:
            out = native(*inputs)
            if torch.cuda.is_current_stream_capturing():
                out[-1].zero_()
            return out
        return fn


def test_a_replay_that_differs_from_the_checked_call_fails_and_a_right_one_passes() -> None:
    runner = run(config(), {"native": Eager(ENV), "capture_differs": CaptureDiffers(ENV)})
    by = {(p.operator, p.implementation): p for p in runner.points}
    for op in ("add", "softmax"):
        native = by[(op, "native")]
        assert native.status == "passed" and native.host_latency_s is not None, native.error
        wrong = by[(op, "capture_differs")]
        assert wrong.status == "failed" and wrong.error.startswith(
            "the last timed iteration's output (a device graph's replay) is wrong though the first call's was "
            "right: wrong result: "), wrong.error
        assert wrong.max_abs_error is not None and wrong.max_abs_error > native.max_abs_error
    assert sorted(m.name.rsplit("@", 1)[1] for m in runner.metrics) == ["native", "native"]


class Overwritten(OperatorImplementation):
    """Right on every call it returns, and its next call writes NaN over the memory of the output before (the
    device's stream, as a graph tree's next run writes where the last run's output lay): an output checked after
    another call reads NaN, whatever the torch version does with graph trees' stale outputs."""

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        previous: list[torch.Tensor] = []

        def fn(*inputs: Any) -> Any:
            for out in previous:
                out.fill_(float("nan"))
            previous[:] = [native(*inputs)]
            return previous[0]
        return fn


def test_the_last_timed_output_is_checked_before_the_host_loop_overwrites_it() -> None:
    """Checked after the host loop's calls, the last timed output held their NaN and a right implementation
    failed; checked between the timed phase and the host loop, it passes, with its host latency."""
    runner = run(config(operators=["add"], cuda_graphs=False), {"overwritten": Overwritten(ENV)})
    (point,) = runner.points
    assert point.status == "passed" and point.host_latency_s is not None, point.error


class GraphTrees(OperatorImplementation):
    """torch.compile's reduce-overhead mode: CUDA graph trees, whose next run overwrites the last run's outputs in
    place (torch 2.13 hands back the same cached tensor: a stale read is silent, not an error)."""

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        return torch.compile(native, mode="reduce-overhead", dynamic=False, fullgraph=True)


def test_graph_trees_run_through_the_timer() -> None:
    """The checks, the timed phase and the host loop with CUDA graph trees: the point passes with both latencies.
    (Same inputs: their next run writes the same values, so the check's order is what
    test_the_last_timed_output_is_checked_before_the_host_loop_overwrites_it tells apart.)"""
    pytest.importorskip("triton")
    runner = run(config(operators=["add"], cuda_graphs=False), {"graph_trees": GraphTrees(ENV)})
    (point,) = runner.points
    assert point.status == "passed" and point.host_latency_s is not None, point.error


def test_the_compile_implementation_in_reduce_overhead_loads_and_runs_on_cuda(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    """The case's inductor_mode through load_implementations to the shipped compile folder on CUDA: its line says the
    CUDA graphs and their input copies, every point passes, and the graph trees are reset after each point (so the
    pool does not grow point by point)."""
    pytest.importorskip("triton")
    import torch._inductor.cudagraph_trees as trees

    from flagperf.operation.driver import load_implementations

    resets: list[bool] = []
    real = trees.reset_cudagraph_trees
    monkeypatch.setattr(trees, "reset_cudagraph_trees", lambda: (resets.append(True), real())[1])
    cfg = config(implementations=["compile"], inductor_mode="reduce-overhead", cuda_graphs=False)
    impls = load_implementations(cfg, "nvidia", CUDA)
    assert "mode reduce-overhead; CUDA graphs: each call first copies its inputs" in impls.described["compile"]
    runner = PointRunner(cfg, load_vendor("nvidia").spec_table(), CUDA, impls)
    points = plan_points(cfg)
    for point in points:
        runner.run(point)
    assert [p.status for p in runner.points] == ["passed"] * len(points), [p.error for p in runner.points]
    assert all(p.host_latency_s is not None for p in runner.points)
    assert len(resets) == len(points)


def test_cross_entropy_past_one_host_copy_is_held_to_the_float64_mean_from_blocks_of_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """20.5M logits (160 tokens x a 128k vocabulary), over the 2^24 one host copy takes: the device's float32
    reference and the host's float64 mean from blocks of rows; native passes both. An implementation off by 1%
    whose bug the device's reference shares (driver.reference_for patched to make it too) passes the device's
    check: the host's float64 mean is what fails it."""
    from flagperf.operation import driver

    class OffByOnePercent(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            return lambda *inputs: native(*inputs) * 1.01

    cfg = config(operators=["cross_entropy"], models=[], shapes={"cross_entropy": [{"R": 160, "V": 128256}]},
                 reference_cpu_max_elements=0, cuda_graphs=False)
    real = driver.reference_for
    monkeypatch.setattr(driver, "reference_for", lambda o, d: (lambda *inputs: real(o, d)(*inputs) * 1.01))
    runner = run(cfg, {"shared": OffByOnePercent(ENV)})
    (point,) = runner.points
    assert point.reference_sample == ("float64 on cpu at 1 of 1 output elements (the mean over all 160 rows, "
                                      "from blocks of 130 rows copied off)")
    assert point.status == "failed" and "reference float64 on cpu at 1 of 1 output elements" in (point.error or ""), \
        point.error
    monkeypatch.setattr(driver, "reference_for", real)
    runner = run(cfg, {"native": Eager(ENV), "off": OffByOnePercent(ENV)})
    by = {p.implementation: p for p in runner.points}
    assert by["native"].status == "passed", by["native"].error
    assert by["off"].status == "failed", by["off"].error
