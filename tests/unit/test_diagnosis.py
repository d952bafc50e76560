"""Fleet diagnosis on hand-made figures, with exact answers: MAD and robust distance, rule verdicts per device
and host, baselines, monitor facts, the rules file's validation, and `flagperf diagnose`'s exit codes."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flagperf.config.diagnose import diagnose_run, load_rules
from flagperf.errors import ConfigError
from flagperf.results.diagnosis import (
    MAD_TO_SIGMA,
    Rules,
    diagnose,
    figure_checks,
    median_absolute_deviation,
    render_markdown,
    robust_z,
)
from flagperf.results.schema import Failure, Metric, RoundResult, round_dir, write_result
from flagperf.results.summary import summarize
from flows.cli import EXIT_HOST_FAILED, EXIT_NOT_JUDGED, app
from tests.unit.mounts import unenterable

T0 = datetime(2026, 1, 2, tzinfo=timezone.utc)
# Four hosts of two GPUs: h3's device 1 is 10 % slow. Device median 100; host medians 100.5, 99.5, 95, 100.
FLEET = {"h1": [100.0, 101.0], "h2": [99.0, 100.0], "h3": [100.0, 90.0], "h4": [102.0, 98.0]}
GEMM_RULE = {"name": "gemm", "metric": "gemm_*", "min_fleet_ratio": 0.95}


def put_round(run: Path, host: str, values: list[float], metric: str = "gemm_bf16", round_no: int = 1,
              monitor: list[dict] | None = None) -> None:
    metrics = [Metric(name=metric, value=v, unit="TFLOPS", device=i, window=[100.0, 110.0])
               for i, v in enumerate(values)]
    folder = round_dir(run, "computation-BF16", round_no, host)
    write_result(folder / "result.json", RoundResult(
        run_id=run.name, case="computation-BF16", family="base", round=round_no, host=host, node_rank=0,
        vendor="nvidia", status="success", started_at=T0, finished_at=T0, duration_s=1.0, measured_seconds=1.0,
        device="GPU", metrics=metrics, config={}))
    if monitor is not None:
        (folder / "monitor_nvml.jsonl").write_text("".join(json.dumps(line) + "\n" for line in monitor))


def fleet_run(tmp_path: Path, name: str = "run1", fleet: dict[str, list[float]] = FLEET) -> Path:
    run = tmp_path / name
    for host, values in fleet.items():
        put_round(run, host, values)
    return run


def rules(*items: dict, min_fleet: int = 3) -> Rules:
    return Rules.model_validate({"min_fleet": min_fleet, "rules": list(items)})


def test_median_absolute_deviation_and_robust_distance() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert median_absolute_deviation(values) == 1.0  # |x - 3| = 2, 1, 0, 1, 97
    assert robust_z(100.0, 3.0, 1.0) == pytest.approx(97 / MAD_TO_SIGMA)
    assert robust_z(5.0, 5.0, 0.0) is None


def test_a_figure_check_names_the_rule_the_figure_and_the_limit() -> None:
    rule = rules(GEMM_RULE, {"name": "z", "metric": "gemm_*", "max_robust_z": 3.0}).rules
    (check,) = figure_checks(rule[0], "gemm_bf16", 90.0, [90.0, 100.0, 100.0, 101.0], None, 3)
    assert (check.status, check.ratio, check.reference) == ("fail", 0.9, 100.0)
    assert check.line() == "gemm: gemm_bf16 90 = 0.900 of 100, needs >= 0.95 x fleet median: fail"
    # MAD of [90, 100, 100, 101] around 100 is 0.5: 90 is 10 / (1.4826 x 0.5) = 13.5 robust sd away.
    (z,) = figure_checks(rule[1], "gemm_bf16", 90.0, [90.0, 100.0, 100.0, 101.0], None, 3)
    assert z.status == "fail" and z.value == pytest.approx(-10 / (MAD_TO_SIGMA * 0.5))
    # Too few figures for a fleet: unknown, not a pass.
    (few,) = figure_checks(rule[0], "gemm_bf16", 90.0, [90.0, 100.0], None, 3)
    assert few.status == "unknown"


def test_the_slow_device_and_its_host_are_named(tmp_path: Path) -> None:
    run = fleet_run(tmp_path)
    found = diagnose(run, summarize(run).rows, rules(GEMM_RULE))
    status = {(v.host, v.device): v.status for v in found.devices}
    assert status == {("h1", 0): "pass", ("h1", 1): "pass", ("h2", 0): "pass", ("h2", 1): "pass",
                      ("h3", 0): "pass", ("h3", 1): "fail", ("h4", 0): "pass", ("h4", 1): "pass"}
    assert [h.host for h in found.failed_hosts] == ["h3"]
    (h3,) = found.failed_hosts
    # Its own median (95 of the hosts' 99.75) passes; the failing device is what fails it, by name.
    own = next(c for c in h3.checks if c.what.startswith("host median"))
    assert own.status == "pass" and own.ratio == pytest.approx(95 / 99.75)
    (why,) = h3.failed
    assert why.line() == ("gemm: h3 device 1: gemm_bf16 (computation-BF16, TFLOPS) 90 = 0.900 of 100, "
                          "needs >= 0.95 x fleet median: fail")
    fleet = found.fleet[0]
    assert (fleet["median"], fleet["mad"], fleet["host_median"], fleet["devices"]) == (100.0, 1.0, 99.75, 8)


def test_rounds_are_taken_by_their_median(tmp_path: Path) -> None:
    """A device's figure is the median of its rounds: one bad round of three does not fail a device."""
    run = fleet_run(tmp_path)
    put_round(run, "h1", [100.0, 100.0], round_no=2)
    put_round(run, "h1", [60.0, 100.0], round_no=3)
    found = diagnose(run, summarize(run).rows, rules(GEMM_RULE))
    assert [h.host for h in found.failed_hosts] == ["h3"]


def test_against_a_baseline_run_each_device_meets_its_own_earlier_figure(tmp_path: Path) -> None:
    run = fleet_run(tmp_path)
    earlier = fleet_run(tmp_path, "run0", {**FLEET, "h1": [120.0, 101.0]})
    rule = {"name": "gemm-base", "metric": "gemm_bf16", "min_baseline_ratio": 0.95}
    found = diagnose(run, summarize(run).rows, rules(rule), baseline_rows=summarize(earlier).rows,
                     baseline_name="run0")
    failing = {(v.host, v.device) for v in found.devices if v.status == "fail"}
    assert failing == {("h1", 0)}  # 100 of 120; h3's device 1 was 90 before too
    check = next(c for v in found.devices if (v.host, v.device) == ("h1", 0) for c in v.checks)
    assert check.ratio == pytest.approx(100 / 120) and check.reference == 120.0
    assert [h.host for h in found.failed_hosts] == ["h1"]


def test_monitor_facts_fail_the_device_that_shows_them(tmp_path: Path) -> None:
    """An XID event on h2's device 1 and a hardware slowdown on h4's device 0, read from the vendor monitor."""
    def monitor(xid: list[int], bits: list[int]) -> list[dict]:
        header = {"type": "header", "monitor": "nvml", "interval_s": 1.0, "started_at": 99.0,
                  "devices": [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}],
                  "throttle_bits": {"8": "hw_slowdown", "1": "gpu_idle"}}
        return [header, *[{"type": "sample", "t": t, "devices": [
            {"index": i, "xid_events": xid[i], "clock_event_bits": bits[i], "sm_clock_mhz": 1800.0}
            for i in (0, 1)]} for t in (99.0, 103.0, 106.0, 111.0)]]

    run = tmp_path / "run1"
    put_round(run, "h1", FLEET["h1"], monitor=monitor([0, 0], [0, 0]))
    put_round(run, "h2", FLEET["h2"], monitor=monitor([0, 1], [0, 0]))
    put_round(run, "h4", FLEET["h4"], monitor=monitor([0, 0], [8, 0]))
    put_round(run, "h5", [100.0, 100.0])  # no vendor monitor: its facts are unknown, not passed
    found = diagnose(run, summarize(run).rows, rules(
        {"name": "no-xid", "monitor_field": "xid_events", "max": 0},
        {"name": "no-slowdown", "throttle": ["hw_slowdown"], "max_share": 0.05}))
    status = {(v.host, v.device): v.status for v in found.devices}
    assert status == {("h1", 0): "pass", ("h1", 1): "pass", ("h2", 0): "pass", ("h2", 1): "fail",
                      ("h4", 0): "fail", ("h4", 1): "pass", ("h5", 0): "unknown", ("h5", 1): "unknown"}
    h2 = next(v for v in found.devices if (v.host, v.device) == ("h2", 1))
    assert [c.line() for c in h2.failed] == ["no-xid: monitor xid_events 1, needs <= 0: fail"]
    assert h2.uuid == "GPU-1"
    h4 = next(v for v in found.devices if (v.host, v.device) == ("h4", 0))
    assert [(c.rule, c.value) for c in h4.failed] == [("no-slowdown", 1.0)]
    assert [h.host for h in found.failed_hosts] == ["h2", "h4"]


def test_a_ratio_that_rounds_to_its_limit_shows_the_digits_that_decide() -> None:
    """0.94998 of the median fails >= 0.95: its line must not read 0.950, which looks like a pass."""
    rule = rules(GEMM_RULE).rules[0]
    (check,) = figure_checks(rule, "gemm_bf16", 94.998, [94.998, 100.0, 100.0, 101.0], None, 3)
    assert check.status == "fail" and check.threshold == 0.95
    assert " = 0.94998 of 100, needs >= 0.95" in check.line()
    (clear,) = figure_checks(rule, "gemm_bf16", 90.0, [90.0, 100.0, 100.0, 101.0], None, 3)
    assert " = 0.900 of 100" in clear.line()


def test_a_failed_round_fails_its_host_and_passing_devices_pass_theirs(tmp_path: Path) -> None:
    """A host whose round failed (a lost connection) has no figure: it fails the diagnosis, naming the round and
    why, instead of reading "no rule applied"; the two that measured pass on their devices' verdicts, though two
    hosts are too few for a verdict on the hosts' own figures."""
    run = tmp_path / "run1"
    put_round(run, "h1", [100.0, 101.0])
    put_round(run, "h3", [99.0, 100.0])
    folder = round_dir(run, "computation-BF16", 1, "h2")
    write_result(folder / "result.json", RoundResult(
        run_id=run.name, case="computation-BF16", family="base", round=1, host="h2", node_rank=0, vendor="nvidia",
        status="failed", started_at=T0, finished_at=T0, duration_s=1.0, measured_seconds=0.0, device="GPU",
        metrics=[], config={}, failure=Failure(kind="infrastructure", message="SshError: host h2: connection lost")))
    found = diagnose(run, summarize(run).rows, rules(GEMM_RULE))
    assert {h.host: h.status for h in found.hosts} == {"h1": "pass", "h2": "fail", "h3": "pass"}
    (why,) = found.failed_hosts[0].failed
    assert why.line() == ("measured: computation-BF16 round 1 failed (SshError: host h2: connection lost), "
                          "needs every round measured: fail")
    assert CliRunner().invoke(app, ["diagnose", str(run)]).exit_code == EXIT_HOST_FAILED


def test_a_rule_that_matches_no_figure_is_named(tmp_path: Path) -> None:
    """A misspelt metric in a rule would pass every host unnoticed: the diagnosis names the rule and the run's
    metrics; the devices' rows name their unknown checks by rule, not one sentence each."""
    run = fleet_run(tmp_path)
    typo = {"name": "typo", "metric": "gemm_bf61", "min_fleet_ratio": 0.9}
    xid = {"name": "no-xid", "monitor_field": "xid_events", "max": 0}
    found = diagnose(run, summarize(run).rows, rules(GEMM_RULE, typo, xid))
    assert found.notes == ["no figure of this run matches rule(s) typo (gemm_bf61); its metrics: gemm_bf16 "
                           "(computation-BF16)"]
    text = render_markdown(found)
    assert "| h1 | 0 | pass | gemm: gemm_bf16 (computation-BF16, TFLOPS) 100 = 1.000 of 100, needs >= 0.95 x fleet " \
           "median: pass; unknown (no figure, or nothing to compare it with): no-xid |" in text


def test_the_diagnosis_names_its_rules_file(tmp_path: Path) -> None:
    run = fleet_run(tmp_path)
    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  - {name: gemm, metric: gemm_*, min_fleet_ratio: 0.85}\n")
    assert CliRunner().invoke(app, ["diagnose", str(run), "--rules", str(mine)]).exit_code == 0
    assert json.loads((run / "diagnosis.json").read_text())["rules"] == str(mine)
    assert f"rules: {mine}; baseline: none" in (run / "diagnosis.md").read_text()


@pytest.mark.parametrize("text, key, message", [
    ("rules: []\n", "rules", "at least 1 item"),
    ("rules:\n  - name: a\n    metric: gemm_*\n", "rules.0", "a metric rule needs a limit"),
    ("rules:\n  - name: a\n    metric: x\n    min_fleet_ratio: 0.9\n    max: 0\n", "rules.0",
     "max goes with monitor_field or health_field"),
    ("rules:\n  - name: a\n    metric: x\n    min_fleet_ratio: -1\n", "rules.0.min_fleet_ratio", "greater than 0"),
    ("rules:\n  - name: a\n    throttle: [hw_slowdown]\n", "rules.0", "throttle and max_share go together"),
    ("min_fleet: 1\nrules:\n  - {name: a, monitor_field: x, max: 0}\n", "min_fleet", "greater than or equal to 2"),
    ("rules:\n  - {name: a, monitor_field: x, max: 0}\n  - {name: a, monitor_field: y, max: 0}\n", "rules",
     "rule 'a' is given twice"),
    ("rules:\n  - {name: a, monitor_field: x, max: 0, colour: red}\n", "rules.0.colour", "unknown key"),
    ("rules:\n  - {name: a, metric: x, min_fleet_ratio: 95}\n", "rules.0", "min_fleet_ratio 95 is above 1"),
    ("rules:\n  - {name: a, metric: x, max_fleet_ratio: 0.9}\n", "rules.0", "max_fleet_ratio 0.9 is below 1"),
])
def test_a_bad_rules_file_is_one_line_naming_the_file_and_key(tmp_path: Path, text: str, key: str,
                                                                message: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_rules(path)
    assert str(path) in str(err.value) and key in str(err.value) and message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_default_rules_file_loads() -> None:
    names = [r.name for r in load_rules().rules]
    assert {"gemm", "memory-copy", "h2d", "d2h", "allreduce-busbw", "no-hardware-slowdown", "no-uncorrected-ecc",
            "no-xid", "no-pending-retirement"} <= set(names)


def test_the_command_says_by_its_exit_code_whether_a_host_failed(tmp_path: Path) -> None:
    runner = CliRunner()
    run = fleet_run(tmp_path)
    failing = runner.invoke(app, ["diagnose", str(run)])
    assert failing.exit_code == EXIT_HOST_FAILED, failing.output
    assert "| h3 | **fail** | gemm: h3 device 1: gemm_bf16" in failing.output
    assert json.loads((run / "diagnosis.json").read_text())["failed_hosts"] == ["h3"]
    lenient = tmp_path / "lenient.yaml"
    lenient.write_text("rules:\n  - {name: gemm, metric: gemm_*, min_fleet_ratio: 0.85}\n")
    assert runner.invoke(app, ["diagnose", str(run), "--rules", str(lenient)]).exit_code == 0
    both = runner.invoke(app, ["diagnose", str(run), "--baseline", str(run), "--history"])
    assert both.exit_code == 2 and "--baseline or --history, not both" in both.output
    assert runner.invoke(app, ["diagnose", str(tmp_path / "none")]).exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: 3\n")
    assert runner.invoke(app, ["diagnose", str(run), "--rules", str(bad)]).exit_code == 2


def test_a_diagnosis_that_could_judge_no_host_says_so_and_does_not_exit_0(tmp_path: Path) -> None:
    """2 hosts of one device, below min_fleet 3: every verdict is unknown. That was "0 failing" and exit 0, as if
    every host had passed; a CI script must not read a check of nothing as green."""
    run = fleet_run(tmp_path, fleet={"h1": [100.0], "h2": [90.0]})
    done = CliRunner().invoke(app, ["diagnose", str(run)])
    assert done.exit_code == EXIT_NOT_JUDGED, done.output
    said = " ".join(done.output.split())
    assert ("- hosts: 2, 0 failing, 0 judged: **no host could be judged** (fewer than min_fleet = 3 hosts for a "
            "fleet verdict, and no baseline (--baseline RUN or --history))") in said
    assert ("| h1 | unknown | unknown (no figure, or nothing to compare it with): gemm vs fleet median, gemm vs "
            "baseline |") in said
    found = json.loads((run / "diagnosis.json").read_text())
    assert found["unjudged_hosts"] == ["h1", "h2"] and found["failed_hosts"] == [] and found["min_fleet"] == 3
    # Against a baseline the same two hosts are judged: the exit code is the verdict's again.
    rule = tmp_path / "baseline.yaml"
    rule.write_text("rules:\n  - {name: base, metric: gemm_bf16, min_baseline_ratio: 0.8}\n")
    judged = CliRunner().invoke(app, ["diagnose", str(run), "--rules", str(rule), "--baseline", str(run)])
    assert judged.exit_code == 0, judged.output
    assert "judged" not in judged.output.split("## Fleet")[0]
    # The console line of `flagperf report` says it too, not "no host failed a rule".
    report = CliRunner().invoke(app, ["report", str(run)])
    assert report.exit_code == 0, report.output
    assert "fleet diagnosis: no host of 2 could be judged (fewer than min_fleet = 3 hosts" in " ".join(
        report.output.split())


def test_the_report_of_a_fleet_run_carries_the_diagnosis(tmp_path: Path) -> None:
    from flagperf.config.diagnose import report_section
    from flagperf.results.report import build_report

    run = fleet_run(tmp_path)
    build_report(run, report_section)
    report = (run / "report.md").read_text()
    assert "## Fleet diagnosis" in report and "## Every device" in report and "**h3**" in report
    assert report.index("## Fleet diagnosis") < report.index("## Plots")  # not after a plot per host and round
    one = tmp_path / "one"
    put_round(one, "h1", [100.0])
    build_report(one, report_section)
    assert "Fleet diagnosis" not in (one / "report.md").read_text()


def test_diagnose_run_reads_the_history_baseline(tmp_path: Path) -> None:
    """--history: the median of earlier recorded runs of the same vendor and device, per case and metric."""
    from flagperf.results.history import history_engine, record_run

    engine = history_engine(f"sqlite:///{tmp_path / 'history.sqlite'}")
    for name, scale in (("run0a", 1.2), ("run0b", 1.25), ("run0c", 1.3)):
        record_run(engine, fleet_run(tmp_path, name, {h: [v * scale for v in vs] for h, vs in FLEET.items()}))
    run = fleet_run(tmp_path)
    rule = tmp_path / "rules.yaml"
    rule.write_text("rules:\n  - {name: base, metric: gemm_bf16, min_baseline_ratio: 0.9}\n")
    found = diagnose_run(run, rule, history=True, history_url=f"sqlite:///{tmp_path / 'history.sqlite'}")
    # The history's headline is the mean over devices: 98.75 x 1.25 = 123.44; every host is below 0.9 of it.
    assert sorted(h.host for h in found.failed_hosts) == ["h1", "h2", "h3", "h4"]
    check = found.hosts[0].checks[0]
    assert check.reference == pytest.approx(98.75 * 1.25)
    # A history that is not there is none to read: the diagnosis makes none (only a night that records does).
    nowhere = tmp_path / "nowhere"
    found = diagnose_run(run, rule, history=True, history_url=f"sqlite:///{nowhere / 'history.sqlite'}")
    assert found.failed_hosts == [] and not nowhere.exists()


def test_a_history_that_cannot_be_read_is_one_line_on_the_console_and_a_page_on_the_site(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A history file that is no database (or a server that refuses): `diagnose --history` says so in one line naming
    it, no traceback, and the site's trends page says so too (503), where both failed with SQLAlchemy's error."""
    from starlette.testclient import TestClient

    from flagperf.site.app import create_app

    monkeypatch.delenv("FLAGPERF_HISTORY_URL", raising=False)
    run = fleet_run(tmp_path)
    broken = tmp_path / "history.sqlite"  # the run folder's results folder's own
    broken.write_bytes(b"not a database, but a file of that name\n" * 100)
    done = CliRunner().invoke(app, ["diagnose", str(run), "--history"])
    said = " ".join(done.output.split())
    assert done.exit_code == 2 and f"the history sqlite:///{broken} cannot be read: file is not a database" in said, \
        done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)
    for path in ("/trends", "/trends/figure?case=x&metric=y"):
        page = TestClient(create_app(tmp_path, None), raise_server_exceptions=False).get(path)
        if path == "/trends":
            assert page.status_code == 503 and f"the history {broken} cannot be read: file is not a database" in \
                page.text, page.text
        else:
            assert page.status_code == 404, page.text

    # A link into a folder this user cannot enter: Path.is_file lets EACCES through (a traceback, the page a 500).
    locked = tmp_path / "locked"
    locked.mkdir()
    broken.unlink()
    broken.symlink_to(locked / "history.sqlite")
    with unenterable(locked, monkeypatch):
        done = CliRunner().invoke(app, ["diagnose", str(run), "--history"])
        said = " ".join(done.output.split())
        line = f"the history {broken} (a link to {locked / 'history.sqlite'}) cannot be read: Permission denied"
        assert done.exit_code == 2 and line in said and "Traceback" not in said, done.output
        page = TestClient(create_app(tmp_path, None), raise_server_exceptions=False).get("/trends")
        assert page.status_code == 503 and line in page.text, page.text


def test_a_cases_names_in_the_diagnosis_stay_text(tmp_path: Path) -> None:
    """A metric name and unit come from a case's code: in diagnosis.md (and the report's section) a '|' or a
    newline in them opens no table cell and breaks no row, and '<' starts no HTML."""
    run = tmp_path / "run1"
    for host, values in FLEET.items():
        put_round(run, host, values, metric="gemm_bf16|x\n<b>")
    text = render_markdown(diagnose(run, summarize(run).rows, rules(GEMM_RULE)))
    for section in text.split("\n## ")[1:]:  # each table's rows have its header's cells, and no row is cut
        rows = [line.replace("\\|", "") for line in section.splitlines()[1:] if line.strip()]
        assert rows and all(row.startswith("|") and row.count("|") == rows[0].count("|") for row in rows), section
    assert "<b>" not in text and "gemm\\_bf16" not in text and "gemm_bf16\\|x &lt;b>" in text


def test_the_console_names_the_failing_hosts(tmp_path: Path) -> None:
    """`flagperf run` and `flagperf report` end with the fleet's verdict in one line: the diagnosis is otherwise
    only at the end of report.md and in the controller's log."""
    run = fleet_run(tmp_path)
    done = CliRunner().invoke(app, ["report", str(run)])
    assert done.exit_code == 0, done.output
    assert "fleet diagnosis: 1 of 4 hosts fail (h3) by deployments/diagnosis/rules.yaml: diagnosis.md" in \
        " ".join(done.output.split())
