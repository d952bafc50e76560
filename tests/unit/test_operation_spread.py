"""The spread of an operation point's timed iterations: the timer's (p90 - p10) / (2 x median) and clock floor,
recorded on each point by the driver, shown in the report's operator tables and headline, and used by
`compare` so that a B/A inside the iteration noise is not a change while one outside it is, even where a few
preempted iterations make the standard deviation useless; the rounds' spread is kept where rounds > 1."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from flagperf.config.vendors import load_vendor
from flagperf.operation.config import OperationConfig, plan_points
from flagperf.operation.driver import Implementations, PointRunner, run_operation
from flagperf.operation.timer import Timed, TimingOptions, time_call
from flagperf.results.compare import compare_operations, compare_runs
from flagperf.results.operators import collect_points, operation_markdown, operator_cells, operator_summaries
from flagperf.results.schema import OperationReport, Peak, RoundResult, SpecTable, round_dir, write_result

CPU = torch.device("cpu")
SPEC = SpecTable(device="test", peaks={"memory_bandwidth": Peak(value=100.0, unit="GB/s", source="test")})
T0 = 1_800_000_000.0


def config(**changes: object) -> OperationConfig:
    values: dict[str, object] = dict(operators=["add"], dtypes=["fp32"], models=["tiny"], batch_sizes=[1],
                                     seq_lens=[16, 32], implementations=["native"], warmup_s=0.001, rep_s=0.001,
                                     min_iters=5, max_iters=5, flush_cache=False, cuda_graphs=False,
                                     reference_cpu_max_elements=1 << 22, timeout_s=600, max_retries=0)
    values.update(changes)
    return OperationConfig.model_validate(values)


def latencies(median: float, low: float, high: float, outliers: int = 0) -> list[float]:
    """20 iterations whose p10 and p90 are median * low and median * high, plus ``outliers`` iterations 30x
    longer (a preempted iteration on a host clock): they move the p90 little and the standard deviation much."""
    body = [median * low] * 3 + [median] * 14 + [median * high] * 3
    return sorted(body[:len(body) - outliers] + [median * 30] * outliers)


def write_run(run_dir: Path, rounds: list[dict[str, list[float]]]) -> None:
    """One op-elementwise round per entry of ``rounds`` (implementation -> iteration latencies, the same at
    every point), each point recorded by the driver's own record_timed."""
    planned = plan_points(config())
    now = datetime.now(timezone.utc)
    for number, timings in enumerate(rounds, start=1):
        runner = PointRunner(config(), SPEC, CPU, Implementations())
        for point in planned:
            for impl, times in timings.items():
                timed = Timed(latencies=times, window=(T0, T0 + sum(times)), graphs=False, warmup_calls=4 + number,
                              clock_floor=1e-8)
                runner.record_timed(point, impl, timed, {})
        write_result(round_dir(run_dir, "op-elementwise", number, "h1") / "result.json", RoundResult(
            run_id=run_dir.name, case="op-elementwise", family="operation", round=number, host="h1", node_rank=0,
            vendor="cpu", status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0,
            metrics=runner.metrics, config={},
            operation=OperationReport(timing="t", flush="f", graphs="g", counting={}, tolerances={},
                                      points=runner.points)))


def test_the_spread_is_the_iterations_p10_to_p90_and_outliers_do_not_inflate_it() -> None:
    timed = Timed(latencies=latencies(1e-3, 0.95, 1.05, outliers=1), window=(T0, T0 + 1), graphs=False)
    assert timed.p10 == pytest.approx(0.95e-3) and timed.median == pytest.approx(1e-3)
    assert timed.spread == pytest.approx((timed.p90 - timed.p10) / (2 * timed.median))
    assert timed.spread < 0.1  # one preempted iteration in 20: its cv would be over 100%


def test_a_call_within_the_clocks_floor_is_marked_and_a_measurable_one_is_not() -> None:
    """The floor is what the clock measures with nothing between its marks, taken in the same call: a call of
    nothing is within it, a call spinning 200 us (however loaded the machine) is far above it."""
    options = TimingOptions(0.001, 0.001, 30, 30, False, False)
    nothing = time_call(lambda: None, CPU, options, None)
    assert nothing.clock_floor > 0 and nothing.near_clock_floor and nothing.warmup_calls >= 1

    def spin() -> None:
        end = time.perf_counter() + 2e-4
        while time.perf_counter() < end:
            pass

    spun = time_call(spin, CPU, TimingOptions(0.001, 0.001, 5, 5, False, False), None)
    assert spun.median >= 2e-4 and not spun.near_clock_floor and spun.clock_floor < spun.median


def test_each_point_records_its_spread_warmup_and_clock_floor(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="flagperf.case.operation")
    outcome = run_operation(config(seq_lens=[16]), "cpu", load_vendor("cpu").spec_table(), CPU)
    (point,) = outcome.report.points
    assert point.status == "passed" and point.latency_s and point.latency_p10_s and point.latency_p90_s
    assert point.latency_spread == pytest.approx((point.latency_p90_s - point.latency_p10_s) / (2 * point.latency_s))
    assert point.warmup_calls >= 1 and point.clock_floor_s is not None and point.clock_floor_s >= 0
    assert point.iterations == 5
    assert "(p90 - p10) / (2 x median)" in outcome.report.timing and "clock" in outcome.report.timing
    (metric,) = outcome.metrics
    assert f"after {point.warmup_calls} warm-up calls" in (metric.note or "")
    logged = [r.getMessage() for r in caplog.records if "add fp32" in r.getMessage()]
    assert any(f"±{100 * point.latency_spread:.1f}%" in line and "warm-up calls" in line for line in logged)


def test_the_report_shows_each_points_spread_the_rounds_and_the_clock_floor(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-a"
    write_run(run_dir, [{"native": latencies(2e-3, 0.95, 1.05), "fast": latencies(1e-3, 0.98, 1.02)}])
    text = "\n".join(operation_markdown(run_dir))
    # A share under 0.05 % keeps its digits (it printed as 0.0%, read as nothing).
    assert "| fp32 | R16xC128 (tiny b1 s16) | 0.01229 GB/s · 2 ms ±5.0% · 0.012% roofline | " \
           "0.02458 GB/s · 1 ms ±2.0% · 0.025% roofline | 2x |" in text
    assert "- **op-elementwise**: timing: t; cache flush: f; device graphs: g; timed iterations per point: 20; " \
           "warm-up calls per point: 5\n" in text
    (entry,) = operator_summaries(collect_points(run_dir))
    assert operator_cells(entry)[-1] == "±3.5% (max ±5.0%)"  # the median and the largest over the points
    # A speed-up inside the larger spread of its two points says so (2x above is far outside it).
    close = tmp_path / "run-close"
    write_run(close, [{"native": latencies(1.03e-3, 0.95, 1.05), "fast": latencies(1e-3, 0.98, 1.02)}])
    assert "| 1.03x (within ±5.0%) |" in "\n".join(operation_markdown(close))
    # Two rounds: the rounds' coefficient of variation beside the iterations' spread.
    two = tmp_path / "run-two"
    write_run(two, [{"native": latencies(2e-3, 0.95, 1.05)}, {"native": latencies(2.02e-3, 0.95, 1.05)}])
    text = "\n".join(operation_markdown(two))
    assert "2.01 ms ±5.0% (rounds ±0.7%)" in text and "warm-up calls per point: 5 to 6" in text
    # A latency within 10x of the clock's floor is marked in its cell and counted in the headline.
    floor = tmp_path / "run-floor"
    write_run(floor, [{"native": latencies(5e-8, 0.95, 1.05)}])
    text = "\n".join(operation_markdown(floor))
    assert text.count("**near the clock's floor** (0.01 us, 20.0% of it)") == 2
    (entry,) = operator_summaries(collect_points(floor))
    assert operator_cells(entry)[-1] == "±5.0% (max ±5.0%); **2 near the clock's floor**"


def test_compare_flags_a_change_beyond_the_iterations_spread_and_not_one_within(tmp_path: Path) -> None:
    """Single rounds: the points' p10-p90 spread is the noise. A native 20% slower in B than in A is flagged
    although a preempted iteration per point makes their coefficient of variation over 100% (which hid it);
    a 3% faster `fast` inside its ±5% iterations is not."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, [{"native": latencies(1e-3, 0.99, 1.01, outliers=1), "fast": latencies(1e-3, 0.95, 1.05)}])
    write_run(b, [{"native": latencies(1.2e-3, 0.99, 1.01, outliers=1), "fast": latencies(0.97e-3, 0.95, 1.05)}])
    rows = {r.metric.split(":")[0]: r for r in compare_operations(collect_points(a), collect_points(b))}
    native, fast = rows["add @native"], rows["add @fast"]
    assert native.ratio == pytest.approx(1 / 1.2) and native.flagged
    assert native.spread == pytest.approx(0.01) and native.spread_over == "iterations p10-p90; median over points"
    assert fast.ratio == pytest.approx(1 / 0.97) and not fast.flagged and fast.spread == pytest.approx(0.05)
    assert fast.cells()[-1] == "within spread"


def test_compare_keeps_the_rounds_spread_where_there_are_several_rounds(tmp_path: Path) -> None:
    """Two rounds each: the rounds agree within 1%, so a 4% change is flagged even inside the iterations' ±5%
    (the spread of a median over rounds, not of one iteration)."""
    a, b = tmp_path / "run-a", tmp_path / "run-b"
    write_run(a, [{"native": latencies(1e-3, 0.95, 1.05)}, {"native": latencies(1.01e-3, 0.95, 1.05)}])
    write_run(b, [{"native": latencies(1.04e-3, 0.95, 1.05)}, {"native": latencies(1.05e-3, 0.95, 1.05)}])
    rows, _ = compare_runs(a, b)
    (native,) = [r for r in rows if r.per_operator]
    assert native.flagged and native.spread is not None and native.spread < 0.01
    assert native.spread_over == "rounds; median over points"
