"""What an operation point is checked against and what its figures cover, on this CPU: a large point's float64
host sample beside the device's own reference, the timed calls' output checked (not only the first call's),
the energy window holding the calls and nothing else, the bytes a call moves, the flaggems-core shape set, the
device plug-in's contract in place of device names, and bench/operation_gpu.py's host latency."""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from flagperf.config.models import pydantic_error_to_config_error
from flagperf.config.plan import plan_run
from flagperf.config.vendors import load_vendor
from flagperf.errors import ConfigError
from flagperf.hosts.capacity import check_capacity
from flagperf.operation import driver, sampled
from flagperf.operation.config import OperationConfig, plan_points
from flagperf.operation.driver import Implementations, PointRunner, load_implementations
from flagperf.operation.impls import ImplEnv, OperatorImplementation
from flagperf.operation.operators import OPERATORS, counted, make_inputs
from flagperf.operation.sampled import NoSample, host_sample
from flagperf.operation.shape_sets import SHAPE_SETS
from flagperf.operation.timer import CacheFlush, TimingOptions, time_call, time_host, time_iterations
from flagperf.results.schema import SpecTable

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def config(**changes: Any) -> OperationConfig:
    values: dict[str, Any] = dict(operators=["add"], dtypes=["fp32"], models=["tiny"], batch_sizes=[1],
                                  seq_lens=[16], implementations=["native"], warmup_s=0.001, rep_s=0.001,
                                  min_iters=2, max_iters=3, flush_cache=False, cuda_graphs=False,
                                  reference_cpu_max_elements=1 << 22, timeout_s=600, max_retries=0)
    values.update(changes)
    return OperationConfig.model_validate(values)


@pytest.fixture(scope="module")
def cpu_spec() -> SpecTable:
    return load_vendor("cpu").spec_table()


def _implementation(wrap: Callable[[Any, int], Any]) -> OperatorImplementation:
    """An implementation returning ``wrap(native output, number of the call)``."""

    class Wrapped(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            calls = [0]

            def fn(*inputs: Any) -> Any:
                calls[0] += 1
                return wrap(native(*inputs), calls[0])
            return fn

    return Wrapped(ImplEnv(device=CPU, log=logging.getLogger("test")))


def _last_element_off(output: Any, _: int) -> Any:
    """Each output's last element off by one: where a kernel's tail block would be wrong."""
    outputs = output if isinstance(output, tuple) else (output,)
    wrong = []
    for o in outputs:
        o = o.clone()
        o.view(-1)[-1] += 1
        wrong.append(o)
    return tuple(wrong) if isinstance(output, tuple) else wrong[0]


def _run(cfg: OperationConfig, spec: SpecTable, impls: dict[str, OperatorImplementation],
         device_is_host: bool | None = None) -> PointRunner:
    """``device_is_host=False``: the CPU as an accelerator would be run, its large points' reference computed
    "on the device" (float32 for all but fp32) and held to a host sample (the CPU's own need none)."""
    runner = PointRunner(cfg, spec, CPU, Implementations(ready=impls), device_is_host)
    for point in plan_points(cfg):
        runner.run(point)
    return runner


# ------------------------------------------------------------------ a large point's float64 host sample


def test_a_bug_the_device_reference_shares_is_caught_by_the_host_float64_sample(
        monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable) -> None:
    """A large point's reference runs on the device's own kernels. Where those share the implementation's bug
    (here: the device reference returns the same wrong last element), the comparison with it passes; the
    float64 sample computed on the host from the inputs copied off the device does not, and the error names the
    wrong element where it lies in the output (its last: the sample always holds the last row and column)."""
    real = driver.reference_for

    def shared_bug(op: Any, dtype: str) -> Callable[..., Any]:
        native = real(op, dtype)
        return lambda *inputs: _last_element_off(native(*inputs), 0)

    monkeypatch.setattr(driver, "reference_for", shared_bug)
    operators = ["mm", "bmm", "softmax", "sum", "gelu", "cat", "embedding", "index_select", "gather", "rotary",
                 "scaled_dot_product_attention"]
    cfg = config(operators=operators, reference_cpu_max_elements=0)
    runner = _run(cfg, cpu_spec, {"shared": _implementation(_last_element_off)}, device_is_host=False)
    points = {p.operator: p for p in runner.points}
    assert set(points) == set(operators)
    for p in points.values():
        assert p.status == "failed", (p.operator, p.error)
        assert "reference float64 on cpu at " in p.error and p.reference_sample.startswith("float64 on cpu at "), \
            p.error
    # the worst element where it is in the output, not in the sample: mm's M16 x N344 output, its last element
    mm = points["mm"]
    assert "worst at [15, 343]:" in mm.error, mm.error
    assert mm.reference_sample == "float64 on cpu at 1024 of 5504 output elements (16 of 16 rows x 64 of 344 " \
                                  "columns)"
    assert "worst at [31, 127]:" in points["cat"].error  # the second input's rows lie below the first's
    rotary = points["rotary"]  # q's last element (T16 x H4 x D32) is wrong first
    assert "output 0: " in rotary.error and "worst at [15, 3, 31]:" in rotary.error, rotary.error

    # without the shared bug the same implementation fails against the reference itself, and native passes both
    monkeypatch.setattr(driver, "reference_for", real)
    runner = _run(cfg, cpu_spec, {"native": _implementation(lambda out, _: out),
                                  "shared": _implementation(_last_element_off)}, device_is_host=False)
    by = {(p.operator, p.implementation): p for p in runner.points}
    assert all(by[(op, "native")].status == "passed" for op in operators)
    assert "reference float64 on cpu)" in by[("mm", "shared")].error  # the whole reference's line


def test_a_small_point_has_the_whole_float64_host_reference_and_no_sample(cpu_spec: SpecTable) -> None:
    runner = _run(config(operators=["softmax"]), cpu_spec, {"native": _implementation(lambda out, _: out)})
    (point,) = runner.points
    assert point.status == "passed" and point.reference == "float64 on cpu" and point.reference_sample is None


def test_on_the_cpu_a_large_point_has_the_whole_float64_reference_and_no_redundant_sample(cpu_spec: SpecTable
                                                                                        ) -> None:
    """The CPU is the host: a large point's reference is float64 on the host already, so a sample of it
    computed on the host again checks nothing more; the record said 'float64 on cpu and a float64 host sample'
    where the schema says null."""
    runner = _run(config(operators=["softmax", "mm"], reference_cpu_max_elements=0), cpu_spec,
                  {"native": _implementation(lambda out, _: out)})
    assert [(p.status, p.reference, p.reference_sample) for p in runner.points] == \
        [("passed", "float64 on cpu", None)] * 2


def test_the_report_says_what_the_points_were_checked_against() -> None:
    from datetime import datetime, timezone

    from flagperf.results.operators import method_lines
    from flagperf.results.schema import OperationReport, OperatorPoint, RoundResult

    def point(reference: str, sample: str | None, status: str = "passed") -> OperatorPoint:
        return OperatorPoint(operator="mm", group="gemm", dtype="bf16", shape={"M": 1}, source="given",
                             implementation="native", status=status, reference=reference, reference_sample=sample)

    points = [point("float64 on cpu", None), point("float32 on cuda", "float64 on cpu at 4 of 9 output elements"),
              point("float32 on cuda", "float64 on cpu at 4 of 9 output elements", "failed"),
              point("float32 on cuda", "none: cross_entropy's output is one mean"),
              point("float32 on cuda", "float64 on cpu at 1 of 1 output elements", "skipped")]
    now = datetime.now(timezone.utc)
    result = RoundResult(run_id="r", case="op-gemm", family="operation", round=1, host="h", node_rank=0,
                         vendor="nvidia", status="success", started_at=now, finished_at=now, duration_s=1.0,
                         measured_seconds=1.0, metrics=[], config={},
                         operation=OperationReport(timing="t", flush="f", graphs="g", counting={}, tolerances={},
                                                   points=points))
    assert ("  - checked against: float64 on cpu (1 point-implementation pair); float32 on cuda and a float64 "
            "host sample of the output (2 point-implementation pairs); float32 on cuda, no host sample "
            "(cross_entropy's output is one mean) (1 point-implementation pair)") in method_lines([result])


def test_the_sample_takes_the_first_and_last_rows_and_windows_of_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = make_inputs(OPERATORS["mm"], {"M": 100, "N": 1000, "K": 8}, "fp32", CPU, seed=0)
    sample = host_sample(OPERATORS["mm"], "fp32", inputs, seed=3)
    rows, cols = sample.axes[0][0], sample.axes[0][1]
    assert len(rows) == sampled.ROWS and rows[0] == 0 and rows[-1] == 99 and rows == sorted(set(rows))
    assert cols[:sampled.WINDOW] == list(range(sampled.WINDOW)) and cols[-1] == 999
    assert len(cols) <= sampled.WINDOW * sampled.WINDOWS
    (ref,) = sample.reference().outputs
    assert ref.dtype == torch.float64 and ref.shape == (len(rows), len(cols))
    expected = (inputs[0].double() @ inputs[1].double())[rows][:, cols]
    assert torch.allclose(ref, expected, rtol=1e-12, atol=1e-12)
    assert sample.locate(0, (1, 2)) == [rows[1], cols[2]]
    # causal attention's sampled query rows see the keys up to their own position, as the whole call does
    dims = {"B": 1, "H": 2, "S": 40, "D": 8}
    q, k, v = make_inputs(OPERATORS["scaled_dot_product_attention"], dims, "fp32", CPU, seed=0)
    attention = host_sample(OPERATORS["scaled_dot_product_attention"], "fp32", [q, k, v], seed=0)
    whole = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    (got,) = attention.reference().outputs
    assert torch.allclose(got, attention.pick(whole)[0], rtol=1e-12, atol=1e-12)
    # cross_entropy's one mean is computed whole on the host where small enough, else said to have no sample
    logits = make_inputs(OPERATORS["cross_entropy"], {"R": 4, "V": 50}, "fp32", CPU, seed=0)
    assert host_sample(OPERATORS["cross_entropy"], "fp32", logits, 0).what == "1 of 1 output elements"
    monkeypatch.setattr(sampled, "MAX_ELEMENTS", 100)
    with pytest.raises(NoSample, match="one mean over all 4 rows"):
        host_sample(OPERATORS["cross_entropy"], "fp32", logits, 0)


def test_the_sample_of_a_huge_dimension_is_drawn_without_a_permutation_of_it(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    """A dimension goes up to 2^31 - 1: a permutation of it to draw 14 rows (torch.randperm) took 16 GiB of host
    memory. The draw takes memory for the rows alone, and the same seed draws the same rows."""

    def no_permutation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a permutation of {args[0]} drawn")

    monkeypatch.setattr(torch, "randperm", no_permutation)
    n = 2**31 - 1

    def draw(seed: int) -> list[int]:
        gen = torch.Generator()
        gen.manual_seed(seed)
        return sampled.spread(n, sampled.ROWS, gen)

    rows = draw(5)
    assert len(rows) == sampled.ROWS and rows == sorted(set(rows)) and rows[0] == 0 and rows[-1] == n - 1
    assert rows == draw(5) and rows != draw(6)
    gen = torch.Generator()
    assert sampled.spread(5, 16, gen) == [0, 1, 2, 3, 4] and sampled.spread(5, 2, gen) == [0, 4]


# ------------------------------------------------------------------ the timed calls' output is checked


def test_the_timed_calls_output_is_checked_not_only_the_first_calls(cpu_spec: SpecTable) -> None:
    """An implementation right on its first call and wrong after it (a graph replaying other work, a cache of
    another shape's kernel) passed: only the first call was checked. The last timed iteration's output is checked
    too: the call that was timed is the call that was checked."""
    def stale(output: Any, call: int) -> Any:
        return output if call == 1 else _last_element_off(output, call)

    cfg = config(operators=["add", "softmax"], flush_cache=True)
    runner = _run(cfg, cpu_spec, {"native": _implementation(lambda out, _: out), "stale": _implementation(stale)})
    by = {(p.operator, p.implementation): p for p in runner.points}
    for op in ("add", "softmax"):
        assert by[(op, "native")].status == "passed"
        point = by[(op, "stale")]
        assert point.status == "failed" and point.metric is None
        assert point.error.startswith("the last timed iteration's output is wrong though the first call's was "
                                      "right: wrong result: 1 of "), point.error
        # the errors beside `failed` are the wrong output's (its last element off by 1), not the first call's
        assert point.max_abs_error == pytest.approx(1.0, rel=1e-3), point.max_abs_error
        assert by[(op, "native")].max_abs_error < 1e-3
    assert not [m for m in runner.metrics if m.name.endswith("@stale")]


def test_the_timed_output_is_checked_before_the_host_loop_calls_again(cpu_spec: SpecTable) -> None:
    """An implementation whose next call writes over its previous output's memory (a reused output buffer, a
    CUDA graph tree's next run; a graph tree's stale output even raises when read) is right on every call it
    returns. Its last timed output was checked after the host loop's calls had overwritten it, which failed a
    correct implementation: it is checked before them."""

    class Overwritten(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            previous: list[torch.Tensor] = []

            def fn(*inputs: Any) -> Any:
                for out in previous:  # the memory the last output lies in, taken by this run
                    out.fill_(float("nan"))
                previous[:] = [native(*inputs)]
                return previous[0]
            return fn

    runner = _run(config(operators=["add"], min_iters=4, max_iters=4),
                  cpu_spec, {"overwritten": Overwritten(ImplEnv(device=CPU, log=logging.getLogger("test")))})
    (point,) = runner.points
    assert point.status == "passed" and point.host_latency_s is not None, point.error


def test_the_retry_without_the_rewarm_does_not_hold_the_outputs_that_did_not_fit(cpu_spec: SpecTable) -> None:
    """Out of memory with the CPU's rewarm: the point is timed again without it. The retry ran inside the except
    block, whose exception's traceback held the timer's frame and in it the rewarm's output: the memory that had
    not fitted stayed taken through the retry. No output of before is alive when the retry calls."""
    refs: list[weakref.ref[torch.Tensor]] = []
    alive_at_retry: list[int] = []

    class OutOfMemoryOnce(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            def fn(*inputs: Any) -> Any:
                number = len(refs) + 1  # 1: the check, 2: the first rewarm, 3: the call after it
                if number == 3:
                    refs.append(weakref.ref(torch.empty(0)))  # counted, never alive
                    raise RuntimeError("out of memory (allocating the timed call's output)")
                if number == 4:  # the retry's first call
                    alive_at_retry.append(sum(ref() is not None for ref in refs))
                out = native(*inputs)
                refs.append(weakref.ref(out))
                return out
            return fn

    runner = _run(config(operators=["add"], flush_cache=True), cpu_spec,
                  {"oom": OutOfMemoryOnce(ImplEnv(device=CPU, log=logging.getLogger("test")))})
    (point,) = runner.points
    assert point.status == "passed" and point.rewarmed is False, point.error
    assert alive_at_retry == [0]


def test_the_timer_hands_back_the_output_of_the_last_timed_iteration() -> None:
    """time_iterations hands back the last timed step's output (a graph's replay returns the output its capture
    allocated, so the same path hands back a replay's) and calls nothing after it; time_host's loop comes apart."""
    count = [0]
    last: list[Any] = []

    def call() -> int:
        count[0] += 1
        return count[0]

    options = TimingOptions(0.001, 10.0, 4, 4, False, True)
    timed = time_iterations(call, CPU, options, None, last_output=last)
    assert last == [timed.warmup_calls + 4] == count and timed.host_latency is None and timed.host_calls == 0
    hosted = time_host(call, CPU, options, timed)
    assert count[0] == timed.warmup_calls + 4 + hosted.host_calls and hosted.host_calls == 4
    assert hosted.latencies == timed.latencies and hosted.host_latency is not None


def test_the_timed_output_is_compared_outside_the_implementations_scope(cpu_spec: SpecTable) -> None:
    """A library that patches torch's operators does it in its scope (FlagGems' use_gems), which is around its
    calls, never around the comparison: there a wrong subtraction kernel of its own would hide its own wrong
    output. Here the scope's subtraction returns zeros: the wrong timed output is still found."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class ZeroSubtraction(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            return torch.zeros_like(out) if func is torch.ops.aten.sub.Tensor else out

    def stale(output: Any, call: int) -> Any:
        return output if call == 1 else _last_element_off(output, call)

    patched = _implementation(stale)
    patched.scope = ZeroSubtraction  # type: ignore[method-assign]
    runner = _run(config(operators=["mul"]), cpu_spec, {"patched": patched})
    (point,) = runner.points
    assert point.status == "failed" and point.error.startswith("the last timed iteration's output is wrong"), \
        point.error


# ------------------------------------------------------------------ energy: the calls and nothing else


def test_the_energy_window_holds_the_calls_and_no_flush(monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable
                                                        ) -> None:
    """Energy per work was the monitors' energy over the timed loop's window / its work, whose cache flushes (and on
    the CPU, the rewarm calls) took most of it and were charged to the calls. It is taken over the metric's
    energy_window, the host loop's (the calls back to back and nothing else) / energy_work, theirs; window and work
    stay the timed iterations' (what the figure, the chip's state and the timeline are of: rate = work /
    measured_seconds)."""
    flushed: list[float] = []
    real = CacheFlush.__call__

    def recorded(self: CacheFlush) -> None:
        real(self)
        flushed.append(time.time())

    monkeypatch.setattr(CacheFlush, "__call__", recorded)
    cfg = config(operators=["add"], flush_cache=True, min_iters=4, max_iters=4)
    runner = PointRunner(cfg, cpu_spec, CPU, load_implementations(cfg, "cpu", CPU))
    (planned,) = plan_points(cfg)
    runner.run(planned)
    (point,), (metric,) = runner.points, runner.metrics
    assert point.status == "passed" and len(flushed) >= 5
    assert metric.energy_window is not None
    start, end = metric.energy_window
    assert start < end and not [t for t in flushed if start <= t <= end], (metric.energy_window, flushed)
    timed_start, timed_end = metric.window
    assert len([t for t in flushed if timed_start <= t <= timed_end]) == 4 and timed_end <= start
    _, nbytes = counted(planned.op, planned.dims, planned.dtype)
    calls = max(1, min(4, math.ceil(cfg.rep_s / point.latency_s)))  # the host loop's count (timer.time_host)
    assert metric.energy_work == pytest.approx(nbytes * calls / 1e9)
    assert metric.work == pytest.approx(nbytes * 4 / 1e9) and metric.iterations == 4
    assert (f"window and work: the 4 timed iterations (cache flushes between them); energy per work over "
            f"energy_window, the {calls} calls of the host loop (back to back, no flush), / their work") in metric.note


def test_energy_per_work_is_over_the_energy_window_and_too_few_samples_in_it_are_said(tmp_path: Path) -> None:
    """The run summary: power and energy beside the figure over its window (the timed iterations), energy per
    work over energy_window / energy_work; each row gives the samples inside the window energy per work is over,
    and a round whose energy windows hold fewer than 2 says how many figures that is."""
    from datetime import datetime, timezone

    from flagperf.results.schema import Metric, RoundResult, write_result
    from flagperf.results.summary import summarize

    t0 = 1_800_000_000.0
    now = datetime.now(timezone.utc)
    # 100 W from t0 to t0 + 10, then 400 W: a counter sampled every second (a tenth of a second from t0 + 10)
    samples = [{"t": t0 + i, "energy_j": 100.0 * i} for i in range(11)]
    samples += [{"t": t0 + 10 + i / 10, "energy_j": 1000.0 + 40.0 * i} for i in range(1, 21)]
    metrics = [Metric(name="wide", value=1.0, unit="GB/s", window=[t0 + 1, t0 + 5], work=8.0,
                      energy_window=[t0 + 6, t0 + 8], energy_work=2.0),  # 200 J / 2 GB; 3 samples inside
               Metric(name="narrow", value=1.0, unit="GB/s", window=[t0 + 1, t0 + 5], work=8.0,
                      energy_window=[t0 + 2.25, t0 + 2.5], energy_work=0.5),  # 25 J, interpolated: 0 inside
               Metric(name="fast", value=1.0, unit="GB/s", window=[t0 + 1, t0 + 5], work=8.0,
                      energy_window=[t0 + 11, t0 + 11.5], energy_work=1.0),  # 200 J; 6 samples inside
               Metric(name="plain", value=1.0, unit="GB/s", window=[t0 + 1, t0 + 5], work=8.0)]
    folder = tmp_path / "run-e" / "op" / "round1" / "h1_noderank0"
    write_result(folder / "result.json", RoundResult(
        run_id="run-e", case="op", family="operation", round=1, host="h1", node_rank=0, vendor="cpu",
        status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0, metrics=metrics,
        config={}))
    (folder / "monitor_system.jsonl").write_text("\n".join(
        [json.dumps({"type": "header", "monitor": "system", "interval_s": 1.0})]
        + [json.dumps({"type": "sample", **s}) for s in samples]) + "\n")
    summary = summarize(tmp_path / "run-e")
    rows = {r["metric"]: r for r in summary.rows.to_dict("records")}
    assert {name: rows[name]["energy_j"] for name in rows} == pytest.approx({name: 400.0 for name in rows})
    assert rows["wide"]["energy_per_work"] == pytest.approx(100.0)  # 200 J / 2 GB, not 400 J / 8 GB
    assert rows["narrow"]["energy_per_work"] == pytest.approx(50.0)
    assert rows["fast"]["energy_per_work"] == pytest.approx(200.0)
    assert rows["plain"]["energy_per_work"] == pytest.approx(50.0)  # no energy_window: over window / work
    assert {name: rows[name]["energy_per_work_samples"] for name in rows} == \
        {"wide": 3, "narrow": 0, "fast": 6, "plain": 5}
    (note,) = [n for n in summary.monitor_notes if "energy window" in n]
    assert note.startswith("op round 1 on h1: energy per work of 1 of 3 figures (energy_per_work_samples under 2) "
                           "rests on fewer than 2 monitor samples inside its energy window (0.25 s at the shortest;"), \
        note


def test_the_host_window_encloses_the_host_loops_calls_and_no_flush() -> None:
    events: list[tuple[str, float]] = []

    def call() -> None:
        events.append(("call", time.time()))

    timed = time_call(call, CPU, TimingOptions(0.001, 10.0, 3, 3, True, False),
                      lambda: events.append(("flush", time.time())))
    assert timed.host_window is not None and timed.host_calls == 3
    start, end = timed.host_window
    inside = [kind for kind, t in events if start <= t <= end]
    assert inside == ["call"] * 3, events[-8:]


# ------------------------------------------------------------------ counting: the bytes a call moves


def test_rotary_counts_the_cos_and_sin_rows_its_tokens_read_not_the_whole_table() -> None:
    """A decode step's rotary reads one cos and one sin row (D/2 each) per token at its position; the whole
    table (S rows) was counted: at T 1, S 4096 the figure was mostly bytes no one moved. An indexed read counts a
    row per index, as embedding's and index_select's do; the whole table is what the point allocates."""
    rotary = OPERATORS["rotary"]
    dims = {"T": 1, "H": 32, "KVH": 8, "D": 128, "S": 4096}
    assert counted(rotary, dims, "bf16")[1] == 2 * 2 * 1 * 128 * (32 + 8) + 2 * 1 * 128 + 8 * 1
    assert rotary.allocated_bytes(dims, 2) == 2 * 2 * 1 * 128 * (32 + 8) + 2 * 4096 * 128 + 8 * 1
    embedding = counted(OPERATORS["embedding"], {"V": 4096, "C": 64, "T": 1}, "bf16")[1]
    assert embedding == 8 + 2 * 2 * 64  # the same convention: the rows the indices name, read once each
    # fp8 mm reads its two fp32 scales too
    assert counted(OPERATORS["mm"], {"M": 2, "N": 3, "K": 4}, "fp8")[1] == 8 + 12 + 2 * 6 + 8
    # rotary's positions repeat every S tokens (FlagGems' T = 4S): each index read counts its row, as the docs say
    dims = {"T": 512, "H": 8, "KVH": 1, "D": 64, "S": 128}
    assert counted(rotary, dims, "fp16")[1] == 2 * 2 * 512 * 64 * 9 + 2 * 512 * 64 + 8 * 512
    docs = " ".join((ROOT / "docs" / "operation.md").read_text(encoding="utf-8").split())
    assert "counts **one row (or element) per index read**" in docs and "counted so (FlagGems' RopeBenchmark" in docs
    for name, op in OPERATORS.items():  # every formula as the docs write it, operator by operator
        assert name in (ROOT / "docs" / "operation.md").read_text(encoding="utf-8")
        assert op.formula().startswith(("FLOPs = ", "FLOPs not counted"))


# ------------------------------------------------------------------ the flaggems-core shape set


def test_flaggems_core_has_valid_shapes_for_every_operator_from_flaggems_own_lists() -> None:
    core = SHAPE_SETS["flaggems-core"]
    assert set(core) == set(OPERATORS)
    for name, shapes in core.items():
        assert shapes, name
        for dims, source in shapes:
            assert OPERATORS[name].check_dims(dims) is None, (name, dims)
            assert tuple(dims) == OPERATORS[name].dims and source.startswith("flaggems-core "), (name, dims, source)
    def dims(name: str) -> list[dict[str, int]]:
        return [d for d, _ in core[name]]

    # BlasBenchmark's [B, M, N, K]: mm drops B (4 distinct shapes of 5), bmm keeps it
    assert dims("mm") == [{"M": 384, "N": 384, "K": 384}, {"M": 4096, "N": 4096, "K": 4096},
                          {"M": 1024, "N": 1024, "K": 1024}, {"M": 2048, "N": 2048, "K": 2048}]
    assert len(dims("bmm")) == 5 and dims("bmm")[0] == {"B": 2, "M": 384, "N": 384, "K": 384}
    assert dims("scaled_dot_product_attention")[-1] == {"B": 4, "H": 32, "S": 8192, "D": 128}
    # reductions over dimension 1 of [64, 512, 512]: 32768 rows of 512; a 1-D shape is one row
    assert {"R": 32768, "C": 512} in dims("softmax") and {"R": 1, "C": 1048576} in dims("sum")
    assert {"R": 20, "C": 6 * 65536} in dims("layer_norm")  # everything after dimension 0 normalised
    assert {"R": 1, "C": 1073741824} in dims("add")
    assert {"R": 64, "C": 512 * 512} in dims("cat") and all(d["R"] * d["C"] <= 2**29 for d in dims("cat"))
    assert {"R": 4096, "C": 4096, "T": 409} in dims("index_select") and {"R": 64, "C": 64, "G": 128} in dims("gather")
    assert dims("rotary")[0] == {"T": 4 * 128, "H": 8, "KVH": 1, "D": 64, "S": 128}


def test_a_case_selects_the_shape_set_and_a_wrong_name_is_one_line() -> None:
    cfg = config(operators=["mm", "add"], models=[], shape_sets=["flaggems-core"],
                 shapes={"mm": [{"M": 384, "N": 384, "K": 384}, {"M": 3, "N": 5, "K": 7}]})
    planned = [(p.op.name, p.source, p.shape_set) for p in plan_points(cfg)]
    # the set's first, the given 384s met again and measured once, then the given 3x5x7
    assert planned[0] == ("mm", "flaggems-core BlasBenchmark [2, 384, 384, 384]", "flaggems-core")
    assert [p for p in planned if p[0] == "mm"][-1] == ("mm", "given", None)
    assert len([p for p in planned if p[0] == "mm"]) == 5 and len([p for p in planned if p[0] == "add"]) == 5
    for value, message in ((["gems-core"], "unknown shape set 'gems-core' (known: flaggems-core)"),
                           (["flaggems-core", "flaggems-core"], "a shape set is listed twice")):
        with pytest.raises(ValidationError) as caught:
            config(shape_sets=value)
        error = pydantic_error_to_config_error(caught.value, "cases/operation/op-elementwise/case.yaml")
        line = str(error)
        assert "\n" not in line and message in line and error.key.startswith("shape_sets"), line
    with pytest.raises(ValidationError, match="a named shape set"):
        config(models=[], shapes={})


def test_the_shape_set_through_set_and_the_hosts_memory_check() -> None:
    """`--set shape_sets=[flaggems-core]` as a user gives it: planned, then held against each host's memory like
    every other size, the line naming the key (FlagGems' 2**30-element add takes 12 GiB in fp32)."""
    plan = plan_run(cases=["op-elementwise"], vendor="nvidia", results_dir="/nonexistent-results",
                    sets=["shape_sets=[flaggems-core]", "models=[]", "dtypes=[fp32]", "op-elementwise.operators=[add]"])
    (case,) = plan.cases
    assert case.config["shape_sets"] == ["flaggems-core"]
    probe = {"device_visible": True, "device_count": 8, "device": "NVIDIA H100 80GB HBM3"}
    with pytest.raises(ConfigError) as info:
        check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": 8 * 2**30}})
    assert str(info.value).startswith(
        "--set: op-elementwise.shape_sets: add R1xC1073741824 in fp32 (flaggems-core BinaryPointwiseBenchmark "
        "[1073741824]; its inputs and output alone) needs 12.00 GiB, more than 80% of the 8.00 GiB on host gpu1"), \
        info.value
    check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": 141 * 2**30}})
    with pytest.raises(ConfigError, match="unknown shape set 'core'"):
        plan_run(cases=["op-elementwise"], vendor="nvidia", results_dir="/nonexistent-results",
                 sets=["shape_sets=[core]"])


# ------------------------------------------------------------------ the device plug-in's contract


def test_the_operation_family_never_branches_on_a_device_name() -> None:
    """What a device can do is asked of its torch module (flagperf.measure.device: device_module, device_clock),
    never read off its name: a vendor's device type is a folder's value, not a word the core knows."""
    named = re.compile(r"\.type\s*[!=]=\s*['\"]|['\"](cpu|cuda|xpu|npu|musa|mlu)['\"]\s*[!=]=")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / "flagperf" / "operation").glob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if named.search(line)]
    assert not found, "\n".join(found)


# ------------------------------------------------------------------ bench/operation_gpu.py


def test_the_gpu_bench_records_the_host_latency_beside_the_device_clocks(tmp_path: Path) -> None:
    """The bench's --quick dry run on this CPU: every point has the host latency (FlagPerf's cputime, the engine's
    own timer), in the record and the table; the geometric mean of the host speed-ups beside the device clock's."""
    done = subprocess.run([sys.executable, "bench/operation_gpu.py", "--quick", "--operators", "add,rms_norm",
                           "--cuda-graphs", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "operation_gpu_quick.json").read_text())
    # --cuda-graphs asks the case key; the CPU has none, which the record says
    assert record["cuda_graphs"] is True and record["graphs"].startswith("the CPU has no device graphs")
    assert f"- graphs: {record['graphs']}" in (tmp_path / "operation_gpu_quick.md").read_text()
    native = [p for p in record["points"] if p["implementation"] == "native"]
    assert [p["operator"] for p in native] == ["add", "rms_norm"] and record["state"] == "finished"
    assert all(p["status"] == "passed" and p["host_latency_s"] > 0 for p in native)
    md = (tmp_path / "operation_gpu_quick.md").read_text()
    assert "| latency ms | host ms |" in md
    assert f"| {native[0]['latency_s'] * 1e3:.4g} | {native[0]['host_latency_s'] * 1e3:.4g} |" in md
    bad = subprocess.run([sys.executable, "bench/operation_gpu.py", "--quick", "--operators", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2 and "--operators: unknown nope" in bad.stderr

    sys.path.insert(0, str(ROOT))
    from bench.operation_gpu import geomeans, markdown

    def point(impl: str, shape: int, latency: float, host: float | None) -> dict[str, Any]:
        return {"operator": "add", "dtype": "bf16", "shape": {"R": shape}, "implementation": impl,
                "status": "passed", "latency_s": latency, "host_latency_s": host, "value": 1.0, "unit": "GB/s",
                "roofline": None, "error": None}

    points = [point("native", 1, 2e-3, 4e-3), point("flaggems", 1, 1e-3, 8e-3),
              point("native", 2, 2e-3, None), point("flaggems", 2, 4e-3, 1e-3)]
    (row,) = geomeans(points)
    assert row["geomean"] == pytest.approx(1.0) and row["points"] == 2
    assert row["host_geomean"] == pytest.approx(0.5) and row["host_points"] == 1  # native's second has none
    text = markdown({**record, "geomeans": [row], "points": points})
    assert "| bf16 | flaggems | 1.000 | 2 | 0.500 | 1 |" in text
