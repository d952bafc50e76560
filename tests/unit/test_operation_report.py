"""A full `operation` suite run in the reports: every case of cases/operation planned by the driver (22
operators x dtypes x model shapes), each point recorded by the driver's own PointRunner and point_metric with
latencies of known ratios (compile 2x native, flaggems 1.25x; a planted wrong result and an exception fail some
points; fp8 is skipped), written as result.json files. The headline has one row per operator, every point is in
its operator's table, failed points are shown, the base figure's headline is as in a run of its own, the site
groups the same way, and `compare` gives one ratio per operator and implementation."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import torch
from typer.testing import CliRunner

from flagperf.config.yamlio import load_yaml_mapping
from flagperf.operation.config import OperationConfig
from flagperf.operation.driver import Implementations, PlannedPoint, PointRunner, plan_points, point_metric, roofline
from flagperf.operation.operators import FP8, OPERATORS, counted
from flagperf.paths import PROJECT_ROOT
from flagperf.results.compare import compare_runs, render_markdown
from flagperf.results.operators import CONVENTION
from flagperf.results.report import build_report
from flagperf.results.schema import Metric, OperationReport, Peak, RoundResult, SpecTable, round_dir, write_result
from flagperf.results.summary import OPERATORS_INTRO
from flows.cli import app
from flows.server import serve_site

CASES = sorted((PROJECT_ROOT / "cases" / "operation").glob("op-*/case.yaml"))
IMPLS = {"native": 1.0, "compile": 2.0, "flaggems": 1.25}  # speed-up against native
WRONG = ("softmax", "bf16", "flaggems")  # every shape: a planted wrong result
BROKEN = ("mm", "fp32", "compile")  # the first shape only: an exception
WRONG_ERROR = "wrong result: 3 of 4096 elements | off by 0.5 (expected 1.0)"
ABOVE_PEAK = "exp"  # native at its roofline: compile and flaggems above the peak (a wrong spec table)
T0 = 1_800_000_000.0


@dataclass
class Planned:
    case: str
    config: OperationConfig
    points: list[PlannedPoint]


def planned_cases() -> list[Planned]:
    found = []
    for path in CASES:
        case = load_yaml_mapping(path)
        config = OperationConfig.model_validate({**case["configurations"], "flush_cache": False})
        found.append(Planned(case["name"], config, plan_points(config)))
    return found


def record_passed(runner: PointRunner, point: PlannedPoint, impl: str, latency: float) -> None:
    """What PointRunner._run_one records for a point that passed, from latencies instead of timing."""
    latencies = [latency * 0.99, latency, latency * 1.01]
    name = f"{point.op.name}:{point.dtype}:{'x'.join(f'{k}{v}' for k, v in point.dims.items())}@{impl}"
    metric, _, unit = point_metric(name, point, runner.spec, latencies, latency, latencies[0], latencies[-1],
                                   (T0, T0 + sum(latencies)))
    flops, nbytes = counted(point.op, point.dims, point.dtype)
    share, basis = roofline(runner.spec, point.op, point.dtype, flops, nbytes, latency)
    runner.metrics.append(metric)
    runner._record(point, impl, "passed", metric=name, latency_s=latency, latency_p10_s=latencies[0],
                   latency_p90_s=latencies[-1], iterations=3, flops=flops, bytes=nbytes, value=metric.value,
                   unit=unit, roofline=share, roofline_basis=basis, max_abs_error=1e-6, reference="float64 on cpu")


def write_operation_run(run_dir: Path, spec: SpecTable, slower: str | None = None, newly_wrong: str | None = None,
                        ) -> dict[str, int]:
    """Every case of the suite, one round each, plus a base-spec figure; ``slower``: an operator whose
    flaggems takes twice as long; ``newly_wrong``: an operator whose flaggems fails its first point. Returns
    the counts of points, passed, failed and skipped (point x implementation)."""
    counts = {"points": 0, "passed": 0, "failed": 0, "skipped": 0}
    now = datetime.now(timezone.utc)
    for planned in planned_cases():
        runner = PointRunner(planned.config, spec, torch.device("cpu"), Implementations())
        first_of: set[tuple[str, str, str]] = set()
        for number, point in enumerate(planned.points):
            counts["points"] += 1
            flops, nbytes = counted(point.op, point.dims, point.dtype)
            at_roofline = roofline(spec, point.op, point.dtype, flops, nbytes, 1.0)[0] or 1e-4
            native = at_roofline * (1.01 if point.op.name == ABOVE_PEAK else 3 + number % 7)
            for impl, speed in IMPLS.items():
                key = (point.op.name, point.dtype, impl)
                first = key not in first_of
                first_of.add(key)
                if point.dtype == FP8:
                    runner._record(point, impl, "skipped", "fp8 on this device: not supported by the test")
                elif key == WRONG or (key == BROKEN and first) or (
                        key == (newly_wrong, "fp32", "flaggems") and first):
                    error = "RuntimeError: boom" if key == BROKEN else WRONG_ERROR
                    runner._record(point, impl, "failed", error, max_abs_error=0.5, reference="float64 on cpu")
                else:
                    slow = 2.0 if impl == "flaggems" and point.op.name == slower else 1.0
                    record_passed(runner, point, impl, native / speed * slow)
                counts[runner.points[-1].status] += 1
        operators = list(dict.fromkeys(p.op.name for p in planned.points))
        result = RoundResult(
            run_id=run_dir.name, case=planned.case, family="operation", round=1, host="h1", node_rank=0,
            vendor="cpu", status="success", started_at=now, finished_at=now, duration_s=1.0,
            measured_seconds=1.0, metrics=runner.metrics, config={},
            operation=OperationReport(timing="t", flush="f", graphs="g",
                                      counting={name: OPERATORS[name].formula() for name in operators},
                                      tolerances={}, points=runner.points))
        write_result(round_dir(run_dir, planned.case, 1, "h1") / "result.json", result)
    write_base_round(run_dir)
    return counts


def write_base_round(run_dir: Path) -> None:
    now = datetime.now(timezone.utc)
    metric = Metric(name="gemm_fp32", value=0.5, unit="TFLOPS", peak=Peak(value=1.0, unit="TFLOPS", source="test"),
                    ratio=0.5, window=[T0, T0 + 3], work=1.5, convention="2*M*N*K per GEMM")
    write_result(round_dir(run_dir, "computation-FP32", 1, "h1") / "result.json", RoundResult(
        run_id=run_dir.name, case="computation-FP32", family="base", round=1, host="h1", node_rank=0, vendor="cpu",
        status="success", started_at=now, finished_at=now, duration_s=5.0, measured_seconds=3.0, metrics=[metric],
        config={}))


def table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after ``marker``, header and rule left out."""
    lines = text[text.index(marker):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


@pytest.fixture(scope="module")
def spec() -> SpecTable:
    """A GPU's peaks (fp8 unsupported), so that every operator has a roofline."""
    peaks = {name: Peak(value=value, unit="TFLOPS", source="test datasheet")
             for name, value in (("fp32", 60.0), ("fp16", 900.0), ("bf16", 900.0))}
    peaks[FP8] = Peak(value=None, unit="TFLOPS", source="not on this test device", supported=False)
    peaks["memory_bandwidth"] = Peak(value=3000.0, unit="GB/s", source="test datasheet")
    return SpecTable(device="test GPU", peaks=peaks)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory, spec: SpecTable) -> tuple[Path, dict[str, int]]:
    run_dir = tmp_path_factory.mktemp("results") / "run-ops-a"
    counts = write_operation_run(run_dir, spec)
    build_report(run_dir)
    return run_dir, counts


def test_the_suite_is_full_size() -> None:
    planned = planned_cases()
    assert len(planned) == 10
    assert {p.op.name for case in planned for p in case.points} == set(OPERATORS)
    assert sum(len(case.points) for case in planned) >= 200  # several hundred point x implementation rows


def test_the_headline_has_one_row_per_operator(full_run: tuple[Path, dict[str, int]]) -> None:
    run_dir, counts = full_run
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    headline = report[:report.index("## Operators (operation)")]
    assert "@native" not in headline and "@flaggems" not in headline  # no row per point before the section
    operators = table_after(report, OPERATORS_INTRO)
    assert sorted(row[1] for row in operators) == sorted(OPERATORS)  # one row each
    by_name = {row[1]: row for row in operators}
    mm = by_name["mm"]
    assert mm[0] == "op-gemm" and mm[2] == "TFLOPS" and mm[3] == "native, compile, flaggems"
    # mm: fp32, fp16, bf16 (fp8 skipped) x 4 shapes; compile failed its first fp32 point.
    assert mm[4] == "16 (fp32, fp16, bf16, fp8)"
    assert mm[5] == "35 of 36; **1 FAILED**; 12 skipped"
    # A geomean says how many of the implementation's points it is over, and its failed ones (never a 1x).
    assert mm[6] == "compile 2x (11 of 12; **1 FAILED**), flaggems 1.25x (12 of 12)"
    softmax = by_name["softmax"]
    assert softmax[5] == "32 of 36; **4 FAILED**"
    assert softmax[6] == "compile 2x (12 of 12), flaggems 1.25x (8 of 12; **4 FAILED**)"
    # Every point's iterations at 0.99, 1 and 1.01 of its median: ±1% (the p10-p90 spread) everywhere.
    assert mm[8] == "float64 on cpu, whole output: 36"  # what the pairs that ran were checked against
    assert mm[9] == "±1.0% (max ±1.0%)"
    gelu = by_name["gelu"]
    assert gelu[5] == "36 of 36" and gelu[2] == "GB/s" and re.fullmatch(r"\d+\.\d% \(compile \w+ .+\)", gelu[7])
    summary_rows = sum(int(row[5].split(" of ")[0]) for row in operators)
    assert summary_rows == counts["passed"]
    # Power and memory: one row per operation case, not per point.
    monitor = table_after(report, "## Power, energy and memory")
    assert len(monitor) == 1 + 10 and monitor[0][0] == "computation-FP32"


def test_every_point_is_in_its_operators_table_and_failures_show(full_run: tuple[Path, dict[str, int]]) -> None:
    run_dir, counts = full_run
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert report.count(CONVENTION) == 1  # the convention is said once
    sections = re.findall(r"^### (op-[\w-]+) / (\w+) \((TFLOPS|GB/s)\)$", report, flags=re.M)
    assert sorted(name for _, name, _ in sections) == sorted(OPERATORS)
    rows = 0
    failed_cells = 0
    for case, name, unit in sections:
        table = table_after(report, f"### {case} / {name} ({unit})")
        rows += len(table)
        for row in table:
            # dtype, shape, checked against, native, compile and its speed-up, flaggems and its
            assert len(row) == 3 + 1 + 2 * 2
            assert row[2] == ("-" if row[0] == FP8 else "float64 on cpu, whole output")  # fp8: skipped, none
            failed_cells += row.count("**FAILED**")
            if row[0] != FP8 and "**FAILED**" not in row:
                assert "% roofline" in row[3] and f" {unit} · " in row[3]
                # fp32 TFLOPS against the same run's measured GEMM (the base round's gemm_fp32)
                assert ("% of measured" in row[3]) == (unit == "TFLOPS" and row[0] == "fp32")
                assert row[5] == "2x" and row[7] == "1.25x"
    assert rows == counts["points"]
    assert failed_cells == counts["failed"] == 1 + 4
    assert "- **FAILED** fp32 M" in report and "@compile: RuntimeError: boom" in report
    assert report.count("@flaggems: wrong result: 3 of 4096 elements \\| off by 0.5") == 4  # '|' cannot split
    assert "- @native: fp8 on this device: not supported by the test (4 points)" in report
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<strong>FAILED</strong>" in html and html.count("<h3>op-") == len(OPERATORS)


def test_the_speedup_plot_says_which_points_it_leaves_out(full_run: tuple[Path, dict[str, int]]) -> None:
    """A failed point has no speed-up: the plot (and its caption in the report) says how many it left out and
    where they are listed, instead of a plot that reads as if every point had been measured."""
    run_dir, _ = full_run
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    caption = re.search(r"^### Operators: speed-up against native \((.*)\)$", report, flags=re.M)
    assert caption is not None, "the plot's caption names nothing left out"
    assert caption[1].startswith("left out: 5 failed points (compile 1, flaggems 4); ")
    assert "; 8 skipped (not run); " in caption[1]  # fp8 mm's 4 shapes x compile and flaggems (native: no bar)
    assert caption[1].endswith("each is listed in the report's Operators section")
    assert (run_dir / "plots" / "operator_speedups.png").read_bytes()[:4] == b"\x89PNG"


def test_other_families_keep_their_headline(full_run: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    run_dir, _ = full_run
    alone = tmp_path / "run-base"
    write_base_round(alone)
    build_report(alone)

    def headline(report: str) -> list[str]:
        lines = report.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("| case | metric |"))
        return lines[start:lines.index("", start)]

    base_report = (alone / "report.md").read_text(encoding="utf-8")
    mixed = (run_dir / "report.md").read_text(encoding="utf-8")
    assert len(headline(base_report)) == 3 and headline(mixed) == headline(base_report)
    made = mixed[mixed.index("## How these numbers were made"):mixed.index("## Plots")]
    assert "- computation-FP32 / gemm_fp32: 2\\*M\\*N\\*K per GEMM" in made and "@native" not in made
    assert OPERATORS_INTRO not in base_report and "## Operators" not in base_report


def test_figures_above_their_peak_are_one_fault_per_operator(full_run: tuple[Path, dict[str, int]]) -> None:
    run_dir, _ = full_run
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    faults = report[report.index("## Faults and bounds"):]
    faults = [line for line in faults[:faults.index("\n## ", 1)].splitlines()[1:] if line]
    assert len(faults) == 1, faults  # compile and flaggems of exp, every dtype and shape
    assert faults[0].startswith(f"- op-elementwise / {ABOVE_PEAK}: 24 figures above the peak, up to 198.0% (")


def test_the_site_groups_the_same_way(full_run: tuple[Path, dict[str, int]]) -> None:
    run_dir, _ = full_run
    server = serve_site(run_dir.parent, "127.0.0.1", 0, None)  # the OS gives the port as it binds
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as http:
            page = http.get(f"/runs/{run_dir.name}/")
            runs = http.get("/")
    finally:
        server.stop()
    assert page.status_code == 200
    headline = page.text[page.text.index('id="headline"'):page.text.index('id="operators"')]
    assert headline.count("<tr>") == 2 and "gemm_fp32" in headline  # the header and the base figure
    operators = page.text[page.text.index('id="operators"'):]
    operators = operators[:operators.index("</table>")]
    assert operators.count("<tr") == 1 + len(OPERATORS)
    assert operators.count('<tr class="bad">') == 2  # mm and softmax have failed points
    # The report's Markdown bold is bold on the page, not asterisks (and the rest of a cell stays escaped).
    assert "<strong>1 FAILED</strong>" in operators and "**" not in operators
    assert "computation-FP32 gemm_fp32: 0.5 TFLOPS" in runs.text and "op-activation gelu: compile 2x" in runs.text


def test_compare_gives_one_ratio_per_operator_and_implementation(full_run: tuple[Path, dict[str, int]],
                                                                 spec: SpecTable) -> None:
    run_a, _ = full_run
    run_b = run_a.parent / "run-ops-b"
    write_operation_run(run_b, spec, slower="gelu", newly_wrong="rotary")
    rows, _ = compare_runs(run_a, run_b)
    assert len(rows) == 1 + len(OPERATORS) * len(IMPLS)  # the base figure, then an operator x implementation each
    by_key = {(r.metric.split(":")[0], r.case): r for r in rows if r.per_operator}
    gelu = by_key[("gelu @flaggems", "op-activation")]
    assert gelu.ratio == pytest.approx(0.5) and gelu.flagged and gelu.cells()[-1] == "DIFFERENT"
    assert gelu.metric == "gelu @flaggems: geomean over 12 of 12 points" and gelu.unit == "GB/s"
    rotary = by_key[("rotary @flaggems", "op-rotary")]
    assert rotary.flagged and rotary.ratio == pytest.approx(1.0)
    assert rotary.cells()[-1] == "DIFFERENT; 1 point failing only in B"
    softmax = by_key[("softmax @flaggems", "op-reduction")]  # fails in both runs: no change
    assert not softmax.flagged and softmax.metric.endswith("geomean over 8 of 12 points")
    assert softmax.cells()[-1] == "within spread; 4 points failing in both"  # not in the geomean, said
    unchanged = [r for r in rows if r.per_operator and r not in (gelu, rotary)]
    assert unchanged and all(not r.flagged and r.ratio == pytest.approx(1.0) for r in unchanged)
    text = render_markdown(run_a, run_b, rows)
    assert text.count("\n| ") == len(rows) + 1 and "Operation cases: one row per operator" in text


def test_compare_says_which_run_measured_an_operator_the_other_did_not(full_run: tuple[Path, dict[str, int]]
                                                                       ) -> None:
    run_a, _ = full_run
    run_b = run_a.parent / "run-ops-no-rotary"
    shutil.copytree(run_a, run_b)
    shutil.rmtree(run_b / "op-rotary")
    for first, second, only in ((run_a, run_b, "only in A"), (run_b, run_a, "only in B")):
        rows, _ = compare_runs(first, second)
        rotary = [r for r in rows if r.per_operator and r.case == "op-rotary"]
        assert len(rotary) == len(IMPLS) and all(r.cells()[-1] == only and not r.flagged for r in rotary), rotary


def test_the_cli_prints_a_row_per_operator(full_run: tuple[Path, dict[str, int]]) -> None:
    run_dir, _ = full_run
    shown = CliRunner().invoke(app, ["report", str(run_dir)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert "@native" not in shown.output and "gemm_fp32" in shown.output
    rows = [line for line in shown.output.splitlines() if re.match(r"^│ op-", line)]
    # mm and softmax: FAILED in their correct column and beside the implementation's geomean
    assert len(rows) == len(OPERATORS) and shown.output.count("FAILED") == 4 and "**" not in shown.output
    assert "±1.0% (max" in shown.output  # the iterations' spread is on the console too (rich wraps the cell)
