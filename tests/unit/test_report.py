"""Report files (Markdown, HTML, plots) and run comparison, on synthetic runs with known values."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flagperf.results.compare import compare_runs
from flagperf.results.report import build_report
from flagperf.results.schema import Metric, Peak, RoundResult, write_result
from flows.cli import app

T0 = 1_800_000_000.0


def make_run(root: Path, name: str, values: list[float], case: str = "computation-FP32", unit: str = "TFLOPS",
             metric_name: str = "gemm_fp32") -> Path:
    run = root / name
    for rnd, value in enumerate(values, start=1):
        now = datetime.now(timezone.utc)
        peak = Peak(value=1.0, unit="TFLOPS", source="test datasheet")
        metric = Metric(name=metric_name, value=value, unit=unit, peak=peak, ratio=value,
                        window=[T0 + 1, T0 + 4], work=value * 3)
        result = RoundResult(run_id=name, case=case, family="base", round=rnd, host="h1", node_rank=0,
                             vendor="cpu", status="success", started_at=now, finished_at=now, duration_s=5.0,
                             measured_seconds=3.0, metrics=[metric], config={})
        folder = run / case / f"round{rnd}" / "h1_noderank0"
        write_result(folder / "result.json", result)
        samples = [{"type": "sample", "t": T0 + i, "cpu_percent": 90.0, "power_w": 200.0} for i in range(6)]
        (folder / "monitor_system.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    return run


def test_build_report_writes_every_file(tmp_path: Path) -> None:
    run = make_run(tmp_path, "run-a", [0.50, 0.52, 0.51])
    summary, paths = build_report(run)
    plots = sorted(p.name for p in (run / "plots").iterdir())
    assert plots == ["measured_vs_peak.png", "throughput_per_round.png",
                     *[f"timeline_computation-FP32_round{i}_h1_noderank0.png" for i in (1, 2, 3)]]
    for png in (run / "plots").iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths["html"].read_text()
    assert "<table>" in page and 'src="plots/measured_vs_peak.png"' in page
    md = paths["markdown"].read_text()
    assert "![Measured vs peak](plots/measured_vs_peak.png)" in md
    assert "| computation-FP32 | gemm_fp32 | 0.51 | TFLOPS |" in md
    assert summary.headline[0]["power_avg_w"] == pytest.approx(200.0)
    # Rebuilding gives the same report (generated from files, nothing accumulates).
    build_report(run)
    assert paths["markdown"].read_text() == md


def test_compare_flags_differences_beyond_the_spread(tmp_path: Path) -> None:
    base = make_run(tmp_path, "run-a", [1.00, 1.01, 0.99])  # CV 1%
    noise = make_run(tmp_path, "run-b", [1.005, 0.995, 1.0])
    drop = make_run(tmp_path, "run-c", [0.95, 0.951, 0.949])  # a real 5% drop
    (same,), _ = compare_runs(base, noise)
    assert not same.flagged and same.ratio == pytest.approx(1.0)
    (worse,), _ = compare_runs(base, drop)
    assert worse.flagged and worse.ratio == pytest.approx(0.95)
    assert worse.spread == pytest.approx(0.01, rel=0.01)


def test_a_unit_stated_by_one_run_only_is_the_same_figure(tmp_path: Path) -> None:
    """A release that states a figure's unit where it gave none (training's final_accuracy: '' then 'fraction')
    keeps B/A, saying the unit is now stated (it showed ' vs fraction' and no ratio); two stated units that differ
    are two quantities: no ratio."""
    before = make_run(tmp_path, "run-a", [1.00, 1.01, 0.99], unit="")
    after = make_run(tmp_path, "run-b", [0.95, 0.951, 0.949], unit="fraction")
    (row,), _ = compare_runs(before, after)
    assert row.unit == "fraction" and row.ratio == pytest.approx(0.95) and row.flagged
    assert row.cells()[-1] == "DIFFERENT; unit now stated (A gave none)"
    (back,), _ = compare_runs(after, before)
    assert back.ratio == pytest.approx(1 / 0.95) and back.cells()[-1].endswith("unit stated in A only (B gives none)")
    other = make_run(tmp_path, "run-c", [0.95, 0.951, 0.949], unit="percent")
    (two,), _ = compare_runs(after, other)
    assert two.unit == "fraction vs percent" and two.ratio is None


def test_cli_report_and_compare(tmp_path: Path) -> None:
    a = make_run(tmp_path, "run-a", [1.00, 1.01, 0.99])
    c = make_run(tmp_path, "run-c", [0.95, 0.951, 0.949])
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(a)])
    assert result.exit_code == 0, result.output
    assert (a / "report.html").is_file() and "gemm_fp32" in result.output
    out = tmp_path / "cmp.md"
    result = runner.invoke(app, ["compare", str(a), str(c), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 of 1 figures differ" in result.output
    assert "DIFFERENT" in out.read_text()
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not a run folder" in result.output and "Traceback" not in result.output
    # the newest finished one by name (c has no report yet, a has)
    assert f"a folder of runs; give one of them, e.g. {a}" in " ".join(result.output.split())
    result = runner.invoke(app, ["report", str(a / "computation-FP32")])  # a case folder: no run below it either
    assert result.exit_code == 2 and "no <case>/round<N>" in result.output


def test_compare_refuses_an_out_folder_that_is_not_there_before_printing(tmp_path: Path) -> None:
    a, b = make_run(tmp_path, "run-a", [1.0, 1.01]), make_run(tmp_path, "run-b", [0.9, 0.91])
    missing = tmp_path / "nodir" / "x.md"
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(a), str(b), "--out", str(missing)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: --out {missing}: folder {missing.parent} does not exist", result.output
    result = runner.invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path)])
    assert result.exit_code == 2 and result.output.strip() == f"error: --out {tmp_path}: is a folder; give the file " \
                                                             "to write", result.output
    assert not missing.parent.exists()


def test_the_console_says_what_the_planned_rounds_of_a_multi_host_run_count(tmp_path: Path) -> None:
    run = make_run(tmp_path, "run-a", [1.0, 1.01])  # 2 rounds on h1; h2's were not stored
    plan = {"rounds": 2, "hosts": [{"name": "h1"}, {"name": "h2"}], "cases": [{"name": "computation-FP32"}]}
    (run / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "2 rounds of 4 planned (2 rounds × 2 hosts): 2 succeeded, 0 unsupported, 0 failed" in result.output
    assert "- rounds: 2 of 4 planned (2 rounds × 2 hosts; 2 succeeded" in (run / "report.md").read_text()


def test_compare_never_writes_into_a_run_folder(tmp_path: Path) -> None:
    """--out inside a run folder (one compared, or any with a plan.json) would write over that run's record
    (summary.json, report.md) or add to it: refused in one line, before anything is compared, nothing written."""
    a, b = make_run(tmp_path, "run-a", [1.0, 1.01]), make_run(tmp_path, "run-b", [0.9, 0.91])
    other = tmp_path / "run-c"
    (other / "plots").mkdir(parents=True)
    (other / "plan.json").write_text("{}", encoding="utf-8")
    (a / "summary.json").write_text("{}", encoding="utf-8")
    runner = CliRunner()
    for out, run in [(a / "summary.json", a), (b / "report.md", b), (b / "computation-FP32" / "x.md", b),
                     (other / "plots" / "cmp.md", other)]:
        result = runner.invoke(app, ["compare", str(a), str(b), "--out", str(out)])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert " ".join(result.output.split()) == (f"error: --out {out}: is inside run folder {run}, whose files are "
                                                   "that run's record; write it elsewhere"), result.output
    assert (a / "summary.json").read_text() == "{}" and not (b / "report.md").exists()
    assert sorted(p.name for p in other.rglob("*")) == ["plan.json", "plots"]


def test_a_folder_of_runs_is_answered_with_its_newest_finished_run(tmp_path: Path) -> None:
    older = make_run(tmp_path, "run20250101000000-aaaa", [1.0])
    newer = make_run(tmp_path, "run20250102000000-bbbb", [1.0])  # still running: no summary.json yet
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(tmp_path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and said.endswith(f"e.g. {newer} (unfinished: no summary.json yet)"), said
    (older / "summary.json").write_text("{}", encoding="utf-8")
    result = runner.invoke(app, ["report", str(tmp_path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and said.endswith(f"give one of them, e.g. {older}"), said


def test_report_html_shows_messages_as_text(tmp_path: Path) -> None:
    run = make_run(tmp_path, "run-x", [0.5])
    now = datetime.now(timezone.utc)
    bad = RoundResult(run_id="run-x", case="evil", family="base", round=1, host="h1", node_rank=0, vendor="cpu",
                      status="failed", started_at=now, finished_at=now, duration_s=0.0, measured_seconds=0.0,
                      config={}, failure={"kind": "user", "message": "<img src=x onerror=alert(1)> <class 'X'>"})
    write_result(run / "evil" / "round1" / "h1_noderank0" / "result.json", bad)
    (run / "evil" / "round1" / ".h1_noderank0.partial").mkdir()  # a collection in progress is not a round
    write_result(run / "evil" / "round1" / ".h1_noderank0.partial" / "result.json", bad)
    summary, paths = build_report(run)
    page = paths["html"].read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page and "&lt;class 'X'&gt;" in page
    assert summary.counts["rounds"] == 2


HOSTILE_LINKS = ["[a](javascript:alert(1))", "[b](JaVaScRiPt:alert(2))", "[c]( java\tscript:alert(3) )",
                 "[d](&#106;avascript:alert(4))", "[e](data:text/html;base64,PHNjcmlwdD4=)", "[f](vbscript:msgbox(6))",
                 "![g](javascript:alert(7))", "[h][r]\n\n[r]: javascript:alert(8)", "[i](//evil.example/)",
                 '<a href="javascript:alert(9)">j</a>']


@pytest.mark.parametrize("link", HOSTILE_LINKS)
def test_links_in_case_text_are_inert_in_the_report_and_its_artifact(tmp_path: Path, link: str) -> None:
    """A failure message, a warning, a metric name and the device's name (a probe's, or a case's) are text the
    run does not control: whatever link syntax they hold is shown as text in report.md (and so in the Prefect
    artifact made from it) and is no live link in report.html."""
    import markdown

    from flagperf.results.markup import markdown_to_html, md_text
    from flagperf.results.summary import render_markdown

    run = make_run(tmp_path, "run-x", [0.5])
    now = datetime.now(timezone.utc)
    bad = RoundResult(run_id="run-x", case="evil", family="base", round=1, host="h1", node_rank=0, vendor="cpu",
                      status="failed", started_at=now, finished_at=now, duration_s=0.0, measured_seconds=0.0,
                      config={}, failure={"kind": "user", "message": f"see {link} for details"}, device=f"X1 {link}")
    write_result(run / "evil" / "round1" / "h1_noderank0" / "result.json", bad)
    summary, paths = build_report(run)
    page = paths["html"].read_text()
    targets = re.findall(r'<(?:a|img)\b[^>]*?(?:href|src)="([^"]*)"', page)
    assert targets and all(t.startswith("plots/") for t in targets), targets  # the report's own plots only
    # The Markdown itself holds no link syntax from the case: any renderer (Prefect's UI too) shows text.
    artifact = render_markdown(summary, monitor_table=False)
    assert md_text(" ".join(link.splitlines())) in artifact
    assert f"device {md_text('X1 ' + ' '.join(link.splitlines()))}, hosts h1" in artifact
    assert "<a " not in markdown.markdown(artifact.split("## Plots")[0], extensions=["tables"])
    # The renderer keeps what a report needs: http(s) links and relative images.
    assert markdown_to_html("[ok](https://example.org/x) ![p](plots/a.png)") == (
        '<p><a href="https://example.org/x">ok</a> <img alt="p" src="plots/a.png" /></p>')


def test_case_text_makes_no_emphasis_and_a_metric_name_reads_as_written() -> None:
    """Text a case or a probe controls (a device named __init__, a message with _this_ or *that*) shows as written in
    report.md and the artifact (it came out in italics or bold, its underscores gone); a name with '_' between
    letters (tokens_per_s), which no renderer takes for emphasis, is left unescaped, so report.md reads as written."""
    import markdown

    from flagperf.results.markup import md_text

    text = "__init__ on _dev_ says *that* and **this**, a__b_ x_ at tokens_per_s"
    html = markdown.markdown(md_text(text))
    assert html == f"<p>{text}</p>" and "<em>" not in html and "<strong>" not in html, html
    assert md_text("tokens_per_s") == "tokens_per_s" and md_text("snake_case_name") == "snake_case_name"


def test_case_text_is_escaped_in_markdown_only(tmp_path: Path) -> None:
    """md_text's escapes are for Markdown: the run page of the results site (which HTML-escapes) and the CLI's
    table (no Markdown renders there) show a metric named _softmax as written, report.md escapes it."""
    from starlette.testclient import TestClient

    from flagperf.results.markup import plain
    from flagperf.results.operators import operator_cells
    from flagperf.site.app import create_app

    run = make_run(tmp_path / "results", "run-a", [0.50, 0.52], unit="[x]", metric_name="_softmax")
    _, paths = build_report(run)
    assert "| \\_softmax | " in paths["markdown"].read_text()
    page = TestClient(create_app(tmp_path / "results", None)).get("/runs/run-a/")
    headline = page.text.split('<table id="headline">')[1].split("</table>")[0]
    assert "<td>_softmax</td>" in headline and ">[x]</td>" in headline and "\\" not in headline, headline
    shown = CliRunner().invoke(app, ["report", str(run)], terminal_width=400)
    assert shown.exit_code == 0, shown.output
    assert " _softmax " in shown.output and " [x] " in shown.output and "\\" not in shown.output, shown.output
    entry = {"case": "op_x", "operator": "_softmax", "unit": None, "implementations": ["_fast"], "shapes": 1,
             "dtypes": ["fp32"], "passed": 1, "failed": 0, "skipped": 0, "speedups": {}, "best_roofline": None}
    assert operator_cells(entry, plain)[1:4] == ["_softmax", "-", "_fast"]
    assert operator_cells(entry)[1:4] == ["\\_softmax", "-", "\\_fast"]


def test_a_host_without_matplotlib_gets_its_report_without_plots(tmp_path: Path) -> None:
    """A lean GPU image may lack matplotlib: the figures and the report are still written, and the report says
    why it has no plots. Run in a fresh interpreter in which `import matplotlib` fails."""
    import subprocess
    import sys

    run = make_run(tmp_path, "run-lean", [0.50, 0.52])
    script = ("import sys; sys.modules['matplotlib'] = None\n"  # a None entry makes the import raise ImportError
              "from flagperf.results.report import build_report\n"
              f"build_report(__import__('pathlib').Path({str(run)!r}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    md = (run / "report.md").read_text()
    assert "| computation-FP32 | gemm_fp32 |" in md
    assert "plots not drawn: matplotlib is not installed" in md
    assert not (run / "plots").exists()
    assert (run / "report.html").is_file()


def test_a_result_of_a_newer_release_is_said_to_be_one(tmp_path: Path) -> None:
    """A result.json with fields this release does not know (result models forbid extra ones) was most likely
    written by a newer release: said so, naming the fields, by compare and diagnose; not "repair or remove it"."""
    a, b = make_run(tmp_path, "run-a", [1.0, 1.01]), make_run(tmp_path, "run-b", [0.9, 0.91])
    path = b / "computation-FP32" / "round1" / "h1_noderank0" / "result.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["energy_budget"], data["metrics"][0]["p999"] = 1.0, 2.0
    path.write_text(json.dumps(data), encoding="utf-8")
    for args in (["compare", str(a), str(b)], ["diagnose", str(b)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        line = " ".join(result.output.split())
        assert ("computation-FP32/round1/h1_noderank0/result.json: unreadable result (written by a newer flagperf? "
                "fields energy_budget, metrics.0.p999 not known to this one); read it with the release that wrote "
                "it") in line, line
        assert "repair" not in line
    data["metrics"][0]["value"] = "fast"  # a fault besides the extra fields: not taken for a newer release
    path.write_text(json.dumps(data), encoding="utf-8")
    result = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert result.exit_code == 2 and "newer flagperf" not in result.output and "repair or remove it" in result.output


def test_compare_and_diagnose_say_which_host_rounds_their_figures_leave_out(tmp_path: Path) -> None:
    """A host round with no result.json (nothing collected), one planned that never got its folder, and one that
    failed are in neither mean: compare and diagnose say which, in a line, instead of averaging the others as though
    they were all."""
    a, b = make_run(tmp_path, "run-a", [1.0, 1.01]), make_run(tmp_path, "run-b", [0.9, 0.91])
    for run in (a, b):  # finished runs (a run's last step writes its summary.json)
        (run / "summary.json").write_text("{}", encoding="utf-8")
    (b / "computation-FP32" / "round1" / "h2_noderank0").mkdir()
    (b / "computation-FP32" / "round1" / "h2_noderank0" / "case.log").write_text("started\n", encoding="utf-8")
    out = tmp_path / "cmp.md"
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    said = "B: 1 host round left out of the figures: h2_noderank0 (computation-FP32 round1: no result.json)"
    assert said in " ".join(result.output.split()) and said in out.read_text(encoding="utf-8")
    _, context = compare_runs(b, a)
    assert context["left_out"] == [said.replace("B:", "A:")]
    result = CliRunner().invoke(app, ["diagnose", str(b), "--baseline", str(a)])
    assert "run run-b: 1 host round left out of the figures: h2_noderank0 (computation-FP32 round1: no " \
           "result.json)" in " ".join(result.output.split()), result.output

    # Rounds the plan gave a host that never got a folder (the glob saw only folders that are there): named too,
    # from plan.json; a plan.json's names that are no folder's (a path out of the run, a whole number or true/false,
    # which would not join a path) are never looked up.
    plan = {"rounds": 2, "hosts": [{"name": "h1"}, {"name": "h2"}, {"name": "../../h3"}, {"name": 7}, {"name": False}],
            "cases": [{"name": "computation-FP32"}, {"name": "../outside"}, {"name": 5}, {"name": True}]}
    (b / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    result = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert ("B: 2 host rounds left out of the figures: h2_noderank0 (computation-FP32 round1: no result.json), "
            "h2_noderank0 (computation-FP32 round2: no folder, never run there)") in " ".join(result.output.split())
    assert "outside" not in result.output and "h3" not in result.output
    assert not any(word in result.output for word in ("7_noderank", "5 round", "True", "False"))
    result = CliRunner().invoke(app, ["diagnose", str(b), "--baseline", str(a)])
    assert isinstance(result.exception, SystemExit | None), result.exception  # its verdict's exit, no traceback
    assert "computation-FP32 round2: no folder" in " ".join(result.output.split()), result.output
    (a / "plan.json").write_text(json.dumps({"rounds": 2, "cases": [{"name": "computation-FP32"}]}),
                                 encoding="utf-8")  # no hosts named: which folders it would make is not known
    assert compare_runs(a, a)[1]["left_out"] == []

    # A run not finished (no summary.json, no interruption): its rounds with no result may yet get one
    (b / "summary.json").unlink()
    assert compare_runs(a, b)[1]["left_out"] == [
        "B: 2 host rounds left out of the figures: h2_noderank0 (computation-FP32 round1: no result.json (yet): the "
        "run is not finished (no summary.json)), h2_noderank0 (computation-FP32 round2: not run (yet): the run is not "
        "finished (no summary.json))"]
    # An interrupted run: each round as the report says it (measured and kept on its host, stopped while running,
    # not started), never "never run there"; a folder the stop left without a result has no result.json
    plan["rounds"] = 4
    (b / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    (b / "summary.json").write_text("{}", encoding="utf-8")  # an interrupted run's report is written too
    (b / "interrupted.json").write_text(json.dumps({
        "reason": "SIGINT", "at": "now", "running": ["computation-FP32", 3],
        "measured_on_host": [["computation-FP32", 2, "h2", 0]], "retry": "flagperf run --resume"}), encoding="utf-8")
    (line,) = compare_runs(a, b)[1]["left_out"]
    assert line == (
        "B: 6 host rounds left out of the figures: h2_noderank0 (computation-FP32 round1: no result.json), "
        "h2_noderank0 (computation-FP32 round2: measured, kept on the host: a retry collects it), h1_noderank0 "
        "(computation-FP32 round3: stopped while running (the run was interrupted)), h2_noderank0 (computation-FP32 "
        "round3: stopped while running (the run was interrupted)), h1_noderank0 (computation-FP32 round4: not started "
        "(the run was interrupted)) and 1 more"), line
    result = CliRunner().invoke(app, ["diagnose", str(b), "--baseline", str(a)])
    said = " ".join(result.output.split())
    assert "round2: measured, kept on the host: a retry collects it" in said and "never run" not in said, said


def test_compare_refuses_an_out_that_is_no_regular_file(tmp_path: Path) -> None:
    """--out is written by renaming over it: a FIFO (or a device) there would become a file of ours. Refused."""
    import os
    import stat

    a, b = make_run(tmp_path, "run-a", [1.0, 1.01]), make_run(tmp_path, "run-b", [0.9, 0.91])
    fifo = tmp_path / "out.md"
    os.mkfifo(fifo)
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(fifo)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith(f"error: --out {fifo}: not a regular file"), result.output
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
