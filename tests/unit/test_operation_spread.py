"""The spread of an operation point's timed iterations: the timer's (p90 - p10) / (2 x median) and clock floor,
recorded on each point by the driver, shown in the report's operator tables and headline and in summary.json
beside its figure; the uncertainty of a median (its order-statistic interval, and the rounds' t-interval), which
the report's '(within ±x%)' and `compare` test a speed-up or a B/A against, not one iteration's noise; a
speed-up over the rounds both implementations passed; the host's time per call back to back beside the device
clock's."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from flagperf.config.vendors import load_vendor
from flagperf.operation.config import OperationConfig, plan_points
from flagperf.operation.driver import Implementations, PointRunner, run_operation
from flagperf.operation.timer import Timed, TimingOptions, median_interval, median_ranks, time_call
from flagperf.results.compare import compare_operations, compare_runs
from flagperf.results.history import figures, history_engine, record_run
from flagperf.results.operators import (
    MIN_HALFWIDTH,
    collect_points,
    operation_markdown,
    operator_cells,
    operator_summaries,
    point_index,
    speedup,
    speedup_uncertainty,
)
from flagperf.results.schema import OperationReport, Peak, RoundResult, SpecTable, round_dir, write_result
from flagperf.results.summary import summarize, write_summary

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


def scattered(median: float, width: float, n: int = 20) -> list[float]:
    """n iterations evenly from median x (1 - width) to median x (1 + width): a median known only to within
    about width x 9/19 (n = 20: its 95% interval is the 6th to the 15th value)."""
    return [median * (1 - width + 2 * width * i / (n - 1)) for i in range(n)]


def write_run(run_dir: Path, rounds: list[dict[str, list[float] | None]], host: dict[str, float] | None = None
              ) -> None:
    """One op-elementwise round per entry of ``rounds`` (implementation -> iteration latencies, the same at
    every point; None: skipped in that round), each point recorded by the driver's own record_timed;
    ``host``: implementation -> its host time per call."""
    planned = plan_points(config())
    now = datetime.now(timezone.utc)
    for number, timings in enumerate(rounds, start=1):
        runner = PointRunner(config(), SPEC, CPU, Implementations())
        for point in planned:
            for impl, times in timings.items():
                if times is None:
                    runner._record(point, impl, "skipped", "does not fit in memory: test")
                    continue
                timed = Timed(latencies=times, window=(T0, T0 + sum(times)), graphs=False, warmup_calls=4 + number,
                              clock_floor=1e-8, host_latency=(host or {}).get(impl))
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
    # 5 iterations: too few for a 95% interval of the median (the smallest and largest cover it 94%): none
    assert point.latency_ci_low_s is None and point.latency_ci_high_s is None
    six = run_operation(config(seq_lens=[16], min_iters=6, max_iters=6), "cpu", load_vendor("cpu").spec_table(),
                        CPU).report.points[0]
    assert six.latency_ci_low_s is not None and six.latency_ci_high_s is not None
    assert six.latency_ci_low_s <= six.latency_s <= six.latency_ci_high_s  # type: ignore[operator]
    assert point.host_latency_s is not None and point.host_latency_s > 0
    assert "(p90 - p10) / (2 x median)" in outcome.report.timing and "clock" in outcome.report.timing
    assert "back to back" in outcome.report.timing and "order statistics" in outcome.report.timing
    (metric,) = outcome.metrics
    assert f"after {point.warmup_calls} warm-up calls" in (metric.note or "")
    assert f"host {point.host_latency_s * 1e3:.4g} ms per call back to back" in (metric.note or "")
    logged = [r.getMessage() for r in caplog.records if "add fp32" in r.getMessage()]
    assert any(f"±{100 * point.latency_spread:.1f}%" in line and "warm-up calls" in line and "host" in line
               for line in logged)


def test_the_report_shows_each_points_spread_the_rounds_and_the_clock_floor(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-a"
    write_run(run_dir, [{"native": latencies(2e-3, 0.95, 1.05), "fast": latencies(1e-3, 0.98, 1.02)}])
    text = "\n".join(operation_markdown(run_dir))
    # A share under 0.05 % keeps its digits (it printed as 0.0%, read as nothing).
    assert "| fp32 | R16xC128 (tiny b1 s16) | - | 0.01229 GB/s · 2 ms ±5.0% · 0.012% roofline | " \
           "0.02458 GB/s · 1 ms ±2.0% · 0.025% roofline | 2x |" in text
    assert "- **op-elementwise**: timing: t; cache flush: f; device graphs: g; timed iterations per point: 20; " \
           "warm-up calls per point: 5\n" in text
    (entry,) = operator_summaries(collect_points(run_dir))
    assert operator_cells(entry)[-1] == "±3.5% (max ±5.0%)"  # the median and the largest over the points
    # A speed-up inside the uncertainty of its two medians says so (2x above is far outside it): each known to
    # within ±10% x 9/19 here, together sqrt(2) x that.
    close = tmp_path / "run-close"
    write_run(close, [{"native": scattered(1.03e-3, 0.1), "fast": scattered(1e-3, 0.1)}])
    assert "| 1.03x (within ±6.7%) |" in "\n".join(operation_markdown(close))
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


def test_the_medians_interval_is_its_order_statistics() -> None:
    """The distribution-free 95% interval of a median: the j-th and (n + 1 - j)-th of n sorted values, j from
    the binomial tables (n = 10: 2nd and 9th; 20: 6th and 15th; 100: 40th and 61st), the smallest and largest
    below 6 values; deterministic, whatever the order the iterations came in."""
    assert [median_ranks(n) for n in (1, 5, 6, 10, 20, 100)] == [1, 1, 1, 2, 6, 40]
    for n in (10, 20, 100, 1000):  # the interval covers the median at least 95%, one rank more would not
        j = median_ranks(n)
        miss = [2 * sum(math.comb(n, k) for k in range(r)) / 2**n for r in (j, j + 1)]
        assert miss[0] <= 0.05 < miss[1]
    values = [float(v) for v in range(20, 0, -1)]
    assert median_interval(values) == (6.0, 15.0)
    # under 6 no pair of order statistics covers the median 95% (2 values: 50%, 1: never): no interval
    assert [median_interval(values[:n]) for n in (1, 2, 5)] == [None, None, None]
    assert median_interval(values[:6]) == (15.0, 20.0)
    timed = Timed(latencies=values, window=(T0, T0 + 1), graphs=False)
    assert timed.median_interval == (6.0, 15.0)


def test_a_speedup_is_within_the_noise_of_its_medians_not_of_one_iteration(tmp_path: Path) -> None:
    """Iterations spread ±5% whose median is sharp (14 of 20 on it): a 3% speed-up is a change, not 'within
    ±5%' (the old label held it against one iteration's noise); a 0.4x is not within anything."""
    run_dir = tmp_path / "run"
    write_run(run_dir, [{"native": latencies(1.03e-3, 0.95, 1.05), "fast": latencies(1e-3, 0.95, 1.05)}])
    text = "\n".join(operation_markdown(run_dir))
    assert "| 1.03x |" in text and "within" not in text.split("| dtype | shape")[1]
    (point,) = [p for p in collect_points(run_dir) if p.implementation == "fast" and p.shape == "R16xC128"]
    assert point.uncertainty == MIN_HALFWIDTH and point.iteration_spread == pytest.approx(0.05)


def test_iterations_the_clock_ties_leave_the_median_known_to_its_floor_not_exactly(tmp_path: Path) -> None:
    """A clock that ticks coarsely (CUDA events: ~0.5 us) times a short call identically every iteration: the
    median's interval has width 0, which is the clock's resolution, not a median known exactly. Each round's
    half-width is at least the clock's floor over the median and MIN_HALFWIDTH, so a 0.2% change between two
    runs of tied iterations is no difference (the uncertainty was 0 and any B/A != 1 was DIFFERENT)."""
    a, b, floor = tmp_path / "a", tmp_path / "b", tmp_path / "floor"
    write_run(a, [{"native": [1e-3] * 20, "fast": [5e-4] * 20}])
    write_run(b, [{"native": [1.002e-3] * 20, "fast": [5e-4] * 20}])
    (point,) = [p for p in collect_points(a) if p.implementation == "native" and p.shape == "R16xC128"]
    assert point.uncertainty == MIN_HALFWIDTH
    rows = {r.metric.split(":")[0]: r for r in compare_operations(collect_points(a), collect_points(b))}
    assert rows["add @native"].ratio == pytest.approx(1 / 1.002) and not rows["add @native"].flagged
    assert rows["add @native"].cells()[-1] == "within spread" and rows["add @native"].spread == \
        pytest.approx(math.hypot(MIN_HALFWIDTH, MIN_HALFWIDTH))
    assert "2x |" in "\n".join(operation_markdown(a)) and "2x (within" not in "\n".join(operation_markdown(a))
    # 50 ns tied, the clock's floor 10 ns (write_run's): the median is known to 20%, its floor over it
    write_run(floor, [{"native": [5e-8] * 20}])
    assert [p.uncertainty for p in collect_points(floor)] == [pytest.approx(0.2)] * 2


def test_a_record_without_the_medians_intervals_still_says_within_by_its_spread(tmp_path: Path) -> None:
    """5 iterations have no 95% interval of the median (recorded null), as records from before the intervals:
    the report's '(within ±x%)' falls back, as compare does, to the two points' spreads in quadrature (it was
    left out, so a 1.03x inside the iterations' ±8% read as a change)."""
    run_dir = tmp_path / "run"
    write_run(run_dir, [{"native": scattered(1.03e-3, 0.1, 5), "fast": scattered(1e-3, 0.1, 5)}])
    points = collect_points(run_dir)
    index = point_index(points)
    (fast,) = [p for p in points if p.implementation == "fast" and p.shape == "R16xC128"]
    (native,) = [p for p in points if p.implementation == "native" and p.shape == "R16xC128"]
    assert fast.uncertainty is None and speedup_uncertainty(fast, index) is None
    within = math.hypot(fast.spread, native.spread)  # type: ignore[arg-type]
    assert f"| 1.03x (within ±{100 * within:.1f}%) |" in "\n".join(operation_markdown(run_dir))


def test_compare_of_single_rounds_holds_a_change_against_the_iterations_spread_too(tmp_path: Path) -> None:
    """Single rounds. A native 20% slower in B is flagged although a preempted iteration per point makes the
    iterations' coefficient of variation over 100%; a `fast` 3% faster whose medians are each known to ±4.7%
    only is not. One round's median interval says how well that round knew its median, not where the next
    run's lands: `sharp` (1000 iterations spread ±2%, so its median known to ±0.1%) 1.5% faster in B is ordinary
    run-to-run drift, within spread (held against the medians' intervals, and those divided over the points in
    quadrature, it was DIFFERENT), and 6% faster is not."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_run(a, [{"native": latencies(1e-3, 0.99, 1.01, outliers=1), "fast": scattered(1e-3, 0.1),
                   "sharp": scattered(1e-3, 0.02, 1000)}])
    write_run(b, [{"native": latencies(1.2e-3, 0.99, 1.01, outliers=1), "fast": scattered(0.97e-3, 0.1),
                   "sharp": scattered(0.985e-3, 0.02, 1000)}])
    write_run(c, [{"sharp": scattered(0.94e-3, 0.02, 1000)}])
    points_a, points_b = collect_points(a), collect_points(b)
    rows = {r.metric.split(":")[0]: r for r in compare_operations(points_a, points_b)}
    native, fast, sharp = rows["add @native"], rows["add @fast"], rows["add @sharp"]
    assert native.ratio == pytest.approx(1 / 1.2) and native.flagged
    assert native.spread_over == "single round: the larger of the medians' 95% CI and the iterations' spread; " \
                                 "mean over 2 points"
    assert fast.ratio == pytest.approx(1 / 0.97) and not fast.flagged and fast.cells()[-1] == "within spread"
    # each point: its iterations' spread (over its median's interval) in A and in B in quadrature; the mean over
    # the points, which share each run's state, not divided by sqrt(2)
    (pa,) = [p for p in points_a if p.implementation == "sharp" and p.shape == "R16xC128"]
    (pb,) = [p for p in points_b if p.implementation == "sharp" and p.shape == "R16xC128"]
    assert pa.uncertainty == MIN_HALFWIDTH and pa.iteration_spread is not None  # its interval alone: ±0.13%
    assert sharp.spread == pytest.approx(math.hypot(pa.iteration_spread, pb.iteration_spread))  # type: ignore[arg-type]
    assert sharp.ratio == pytest.approx(1 / 0.985) and not sharp.flagged and sharp.cells()[-1] == "within spread"
    (moved,) = [r for r in compare_operations(points_a, collect_points(c)) if r.metric.startswith("add @sharp")]
    assert moved.ratio == pytest.approx(1 / 0.94) and moved.flagged and moved.cells()[-1] == "DIFFERENT"


def test_compare_takes_the_rounds_t_interval_where_there_are_several_rounds(tmp_path: Path) -> None:
    """Two rounds each, their medians sharp: the rounds' own difference (1%) is the noise, as a t-interval of
    the mean of two (t = 12.7 at one degree of freedom), so a 4% change is within it and a 30% one is not."""
    a, b, c = tmp_path / "run-a", tmp_path / "run-b", tmp_path / "run-c"
    write_run(a, [{"native": latencies(1e-3, 0.95, 1.05)}, {"native": latencies(1.01e-3, 0.95, 1.05)}])
    write_run(b, [{"native": latencies(1.04e-3, 0.95, 1.05)}, {"native": latencies(1.05e-3, 0.95, 1.05)}])
    write_run(c, [{"native": latencies(1.3e-3, 0.95, 1.05)}, {"native": latencies(1.31e-3, 0.95, 1.05)}])
    rows, _ = compare_runs(a, b)
    (native,) = [r for r in rows if r.per_operator]
    assert not native.flagged and native.spread_over == "medians' 95% CI and rounds; mean over 2 points"
    one_round = 12.706 * 0.01 / 1.005 / math.sqrt(2) / math.sqrt(2)  # t x cv / sqrt(rounds), cv = 0.01/sqrt(2)/mean
    # the two points alike: their mean is each one's (a run's points move together: not divided by sqrt(2))
    assert native.spread == pytest.approx(math.hypot(one_round, one_round * 1.005 / 1.045), rel=1e-3)
    rows, _ = compare_runs(a, c)
    (native,) = [r for r in rows if r.per_operator]
    assert native.flagged


def test_a_speedup_takes_only_the_rounds_both_implementations_passed(tmp_path: Path) -> None:
    """Native skipped in round 2 (out of memory, say), `fast` measured in both and slower in round 2: the
    speed-up is round 1's, 2x, not native's round 1 over fast's mean of both (1.33x)."""
    run_dir = tmp_path / "run"
    write_run(run_dir, [{"native": latencies(2e-3, 0.95, 1.05), "fast": latencies(1e-3, 0.95, 1.05)},
                        {"native": None, "fast": latencies(2e-3, 0.95, 1.05)}])
    points = collect_points(run_dir)
    index = point_index(points)
    for point in [p for p in points if p.implementation == "fast"]:
        assert point.status == "passed" and point.latency == pytest.approx(1.5e-3)  # its own figure: both rounds
        assert speedup(point, index) == pytest.approx(2.0) and speedup_uncertainty(point, index) == \
            pytest.approx(math.hypot(MIN_HALFWIDTH, MIN_HALFWIDTH))
    text = "\n".join(operation_markdown(run_dir))
    assert text.count(" | 2x |") == 2 and "1.33x" not in text
    (entry,) = operator_summaries(points)
    assert entry["speedups"]["fast"]["geomean"] == pytest.approx(2.0)


def test_the_host_time_is_reported_beside_the_device_clocks_with_both_speedups(tmp_path: Path) -> None:
    """A point's host time per call (back to back, dispatch included) is in its report cell and summary.json
    beside the device clock's latency, with both speed-ups: here `fast`'s kernel is 2x native's but its host
    time 1.25x native's (a wrapper that costs as much as the kernel saves)."""
    run_dir = tmp_path / "run"
    write_run(run_dir, [{"native": latencies(2e-3, 0.95, 1.05), "fast": latencies(1e-3, 0.95, 1.05)}],
              host={"native": 2.5e-3, "fast": 2e-3})
    write_summary(run_dir, summarize(run_dir))
    text = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "0.01229 GB/s · 2 ms ±5.0% · host 2.5 ms · 0.012% roofline | " \
           "0.02458 GB/s · 1 ms ±5.0% · host 2 ms · 0.025% roofline | 2x; host 1.25x (single sample) |" in text
    assert "| fp32 | fast | 2 | 2 | 2 | 2 | 1.25 | 2 | 0 | 0 |" in text  # the geomean table: device, then host
    assert "the host clock's wall time per call of as many calls back to back" in text  # the convention
    summary = json.loads((run_dir / "summary.json").read_text())
    (entry,) = summary["operators"]
    assert entry["speedups"]["fast"]["host_geomean"] == pytest.approx(1.25)
    assert "back to back" in entry["conventions"]["host_latency_s"]
    fast = [p for p in entry["points"] if p["implementation"] == "fast"]
    assert [(p["latency_s"], p["host_latency_s"], p["speedup"], p["host_speedup"]) for p in fast] == \
        [(pytest.approx(1e-3), pytest.approx(2e-3), pytest.approx(2.0), pytest.approx(1.25))] * 2
    assert operator_cells(entry)[6] == "fast 2x, host 1.25x (2 of 2)"


def test_summary_json_gives_an_operator_point_the_spread_its_report_cell_gives(tmp_path: Path) -> None:
    """One round: an operator point's headline spread in summary.json is its iterations' (p90 - p10) /
    (2 x median), labelled so, as in the report, not their coefficient of variation (over 100% with one
    preempted iteration in 20) labelled 'chunks'."""
    run_dir = tmp_path / "run"
    write_run(run_dir, [{"native": latencies(1e-3, 0.95, 1.05, outliers=1)}])
    write_summary(run_dir, summarize(run_dir))
    headline = json.loads((run_dir / "summary.json").read_text())["headline"]
    (point,) = [p for p in collect_points(run_dir) if p.shape == "R16xC128"]
    (entry,) = [e for e in headline if e["metric"] == "add:fp32:R16xC128@native"]
    assert entry["spread_cv"] == pytest.approx(point.iteration_spread) and entry["spread_cv"] < 0.1
    assert entry["spread_over"] == "iterations p10-p90"
    assert "±" + f"{100 * point.iteration_spread:.1f}%" in (run_dir / "report.md").read_text(encoding="utf-8")
    # The nightly history keeps a run's spread across rounds only: one iteration's noise is not run-to-run noise.
    engine = history_engine(f"sqlite:///{tmp_path / 'history.sqlite'}")
    record_run(engine, run_dir)
    with engine.connect() as conn:
        spreads = [row.spread_cv for row in conn.execute(select(figures.c.spread_cv))]
    assert len(spreads) == 2 and spreads == [None, None]
