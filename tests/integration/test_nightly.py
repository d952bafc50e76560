"""The nightly regression flow on a real server: history recorded, a seeded baseline far above this
machine's figure gives a regression verdict, a failed flow with a clear message, and a Prefect event;
the automation template in deployments/ is accepted by `prefect automation create`; a lab's week of real
nights (good ones, a failed one, one under a CPU quota) read as its owner would."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cpu_quota import cpu_quota
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter
from prefect_api import error_lines

from flagperf.config.vendors import load_vendor
from flagperf.results.history import figure_trend, history_engine, record_run
from flagperf.results.schema import Metric, RoundResult, write_result
from flagperf.results.summary import summarize
from flows.evaluate import BAD_INPUT, RESULTS_DIR_ENV
from flows.nightly import (
    EXIT_HELD,
    EXIT_NIGHT_FAILED,
    EXIT_REGRESSION,
    REGRESSED_STATE,
    REGRESSION_EVENT,
    exit_code,
    nightly_regression,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
ROOT = Path(__file__).resolve().parents[2]


def seed_history(url: str, folder: Path, value: float) -> None:
    device = load_vendor("cpu").spec_table().device
    engine = history_engine(url)
    start = datetime.now(timezone.utc) - timedelta(days=10)
    for night in range(5):
        run = folder / f"run-seed{night}"
        for rnd in (1, 2):
            result = RoundResult(
                run_id=run.name, case="computation-FP32", family="base", round=rnd, host="localhost", node_rank=0,
                vendor="cpu", status="success", started_at=start, finished_at=start, duration_s=1.0,
                measured_seconds=1.0, device=device, config={},
                metrics=[Metric(name="gemm_fp32", value=value * (1 + 0.002 * (night - rnd)), unit="TFLOPS")])
            write_result(run / "computation-FP32" / f"round{rnd}" / "localhost_noderank0" / "result.json", result)
        record_run(engine, run, recorded_at=start + timedelta(days=night))


def test_nightly_flags_a_regression_and_emits_an_event(flagperf_env: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The seeded baseline, 50 TFLOPS of FP32 GEMM, is beyond any 2-core CPU (2 cores x 5 GHz x 64 FLOP per
    cycle is 0.64 TFLOPS): the tiny suite's figure is a regression on every machine CI runs on."""
    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(ROOT / "tests" / "fixtures" / "suites"))
    monkeypatch.setenv(RESULTS_DIR_ENV, str(flagperf_env))  # as `flagperf server` sets it: the form's default
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    seed_history(url, tmp_path / "seed", value=50.0)  # 50 TFLOPS: no 2-core CPU gets near it
    started = datetime.now(timezone.utc)
    state = nightly_regression(suite="tiny", rounds=2, history_url=url, return_state=True)
    assert state.is_failed() and state.name == REGRESSED_STATE and exit_code(state) == EXIT_REGRESSION
    assert "1 regression(s)" in state.message and "computation-FP32 gemm_fp32" in state.message
    # The run's one ERROR line is that message (each verdict is a warning), with no traceback.
    assert error_lines(state.state_details.flow_run_id) == [state.message]
    (run_dir,) = flagperf_env.glob("run*")
    assert run_dir.name in state.message and (run_dir / "summary.json").is_file()
    with get_client(sync_client=True) as client:
        deadline = time.time() + 30
        events = []
        while not events and time.time() < deadline:
            page = client.read_events(filter=EventFilter(event=EventNameFilter(name=[REGRESSION_EVENT])), limit=50)
            events = [e for e in page.events if e.occurred >= started]
            time.sleep(1)
    assert events, "no regression event reached the server"
    assert events[0].payload["case"] == "computation-FP32" and events[0].payload["baseline"] == pytest.approx(
        50.0, rel=0.01)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("history_url", "not a url", "history_url: not a database URL"),
    ("run_id", "../elsewhere", "run_id: '../elsewhere' is not a valid name"),  # never a folder out of results
    ("run_id", "History.sqlite-wal", "run_id: 'History.sqlite-wal' is a name the results folder gives its own files"),
    ("run_id", "n" * 129, f"run_id: {'n' * 40!r}... is too long: 129 characters, at most 128"),
])
def test_a_bad_history_url_or_run_id_is_said_before_a_night_of_measuring(flagperf_env: Path, field: str, value: str,
                                                                         said: str) -> None:
    state = nightly_regression(suite="smoke", results_dir=str(flagperf_env), return_state=True, **{field: value})
    assert state.is_failed() and state.message.startswith(f"{BAD_INPUT}{said}"), state
    assert error_lines(state.state_details.flow_run_id) == [state.message]
    assert not flagperf_env.exists()  # nothing ran


def test_a_run_id_that_is_taken_is_refused_naming_it_and_its_folder_is_never_removed(
        flagperf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run_id typed in the form whose folder exists: refused naming run_id (not results_dir), the folder as it
    was. Two nights given one run_id at the same time: the night that claims the folder first has it; the other,
    started while the first is between its claim and its evaluation, is refused as taken and leaves the folder
    alone (before, both passed the existence check and the refused one removed the other's folder). The first
    night, refused later for bad input, removes only what it made: its run folder and the results folder. No
    refused night leaves a history behind (it left an empty history.sqlite): the history is made when a night
    records."""
    import flows.nightly

    kept = flagperf_env / "mine" / "keep.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("another night's\n")
    state = nightly_regression(suite="smoke", results_dir=str(flagperf_env), run_id="mine", return_state=True)
    assert state.is_failed() and state.message == (
        f"{BAD_INPUT}run_id: 'mine' is taken: {flagperf_env / 'mine'} exists"), state.message
    assert error_lines(state.state_details.flow_run_id) == [state.message]
    assert kept.read_text() == "another night's\n" and list(kept.parent.iterdir()) == [kept]
    assert list(flagperf_env.iterdir()) == [kept.parent]  # and no history.sqlite beside it
    shutil.rmtree(flagperf_env)

    evaluate, second = flows.nightly.evaluate, []

    def and_a_second_night_meanwhile(**parameters: object) -> object:
        if not second:  # the first night, past its claim: the second starts with the same run_id
            second.append(nightly_regression(suite="smoke", results_dir=str(flagperf_env), run_id="same",
                                             return_state=True))
            assert (flagperf_env / "same").is_dir()  # the first night's folder: still there
        return evaluate(**parameters)

    monkeypatch.setattr(flows.nightly, "evaluate", and_a_second_night_meanwhile)
    first = nightly_regression(suite="smoke", results_dir=str(flagperf_env), run_id="same", overrides=["m=0"],
                               return_state=True)
    assert second[0].is_failed() and second[0].message == (
        f"{BAD_INPUT}run_id: 'same' is taken: {flagperf_env / 'same'} exists"), second[0].message
    assert first.is_failed() and first.message.startswith(f"{BAD_INPUT}overrides: m: "), first.message
    assert not flagperf_env.exists(), sorted(flagperf_env.rglob("*"))  # no night: nothing it made is left


def test_the_automation_template_is_accepted(tmp_path: Path) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.settings import PREFECT_API_URL

    block = CustomWebhookNotificationBlock(name="flagperf-test", url="http://127.0.0.1:9/never",
                                           json_data={"text": "{{body}}"})
    block_id = block.save("flagperf-test-alert", overwrite=True)
    template = (ROOT / "deployments" / "automations" / "regression-alert.yaml").read_text()
    filled = tmp_path / "alert.yaml"
    filled.write_text(template.replace("NOTIFICATION_BLOCK_ID", str(block_id)))
    created = subprocess.run([sys.executable, "-m", "prefect", "automation", "create", "--from-file", str(filled)],
                             env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}, capture_output=True,
                             text=True, timeout=120)
    assert created.returncode == 0, created.stdout + created.stderr
    with get_client(sync_client=True) as client:
        automations = client.read_automations_by_name("flagperf-regression-alert")
    assert automations and automations[0].trigger.expect == {REGRESSION_EVENT}


def test_a_night_interrupted_once_measured_is_recorded_with_its_figures(flagperf_env: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (delivered in this process) as the night's figures go into the history, after its evaluation
    measured and collected every round: the interrupt goes on, but the measurement is not lost. The night is in
    the history with its figures (a completed night, a baseline for the next), and its verdict file says
    Interrupted, measured, not judged. tests/unit/test_history.py has the handler's cases.

    Another night of the suite, started just after this one (a manual rerun beside the cron night), publishes a
    regression the moment this one publishes: `flagperf nightly` (the input it checked, the run id it chose)
    still says this night's outcome and exit code, not the other's exit 5, and the results folder's verdict
    file is the later night's."""
    import signal
    import threading

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    import flows.nightly
    from flagperf.config.night import night_start
    from flagperf.results.history import figures, runs
    from flows.nightly_cli import check_night, interrupted_outcome

    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(ROOT / "tests" / "fixtures" / "suites"))
    results = flagperf_env
    url = f"sqlite:///{results / 'history.sqlite'}"
    night = check_night(suite="tiny", vendor=None, rounds=1, overrides=[], inventory=None, results=results,
                        history_url=url, baseline_runs=5, sigma=3.0)
    other = f"run{night_start(night.run_id) + timedelta(seconds=1):%Y%m%d%H%M%S}-0123456789ab"
    write_night = flows.nightly._write_night

    def and_the_other_night(results_dir: str, suite: str, run_dir: Path, ending: dict, history: str | None) -> None:
        write_night(results_dir, suite, run_dir, ending, history)
        if run_dir.name == night.run_id:  # as the flow publishes the other night's regression
            (results / other).mkdir(exist_ok=True)
            write_night(results_dir, suite, results / other, {
                "state": REGRESSED_STATE, "exit_code": EXIT_REGRESSION, "message": f"1 regression(s) in {other}",
                "regressions": ["computation-FP32 gemm_fp32: regression"], "verdicts": []}, history)

    monkeypatch.setattr(flows.nightly, "_write_night", and_the_other_night)

    sent: list[int] = []

    def ctrl_c_as_figures_go_in(_conn, _cursor, statement: str, *_args) -> None:
        if statement.startswith("INSERT INTO figures") and not sent:  # once, as `flagperf nightly` takes one
            sent.append(signal.SIGINT)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # Python's own handler: a KeyboardInterrupt

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    event.listen(Engine, "before_cursor_execute", ctrl_c_as_figures_go_in)
    try:
        with pytest.raises(KeyboardInterrupt):  # called as `flagperf nightly` calls it (run_night)
            nightly_regression(suite="tiny", rounds=1, results_dir=str(results), history_url=url,
                               run_id=night.run_id)
    finally:
        event.remove(Engine, "before_cursor_execute", ctrl_c_as_figures_go_in)
        signal.signal(signal.SIGINT, handler)
    run_dir = results / night.run_id
    assert sorted(p.name for p in results.glob("run*")) == [night.run_id, other]
    with history_engine(url).connect() as conn:
        assert conn.execute(runs.select()).mappings().one()["outcome"] == "completed"
        assert len(conn.execute(figures.select().where(figures.c.run_id == run_dir.name)).all()) == 1
    verdict = json.loads((run_dir / "nightly-tiny.json").read_text())
    assert (verdict["run_id"], verdict["state"], verdict["exit_code"], verdict["measured"]) == (
        run_dir.name, "Interrupted", 130, True)
    assert verdict["message"].startswith("interrupted (SIGINT) once measured: its 1 figures are recorded"), verdict
    assert json.loads((results / "nightly-tiny.json").read_text())["run_id"] == other  # the later night's
    # This night's line and exit code (None: 128 + the signal), its own verdict file named
    assert interrupted_outcome(night) == (f"{verdict['message']}; verdict: {run_dir / 'nightly-tiny.json'}", None)
    assert [row["run_id"] for row in csv.DictReader((results / "trends.csv").open())] == [run_dir.name]


def test_a_week_of_nights_read_by_the_owner(flagperf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three good nights, a failed one, a slow one (a regression) and a good one after it, all real (another
    workload: tests/unit/test_history.py). Each measuring night runs under a CPU quota, so that its speed is
    the quota's and not the shared machine's load: 10 % of a core on a good night, 1 % on the slow one (a
    10x drop, far beyond the spread the good nights measured here, which the verdict's threshold is made of)."""
    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(ROOT / "tests" / "fixtures" / "suites"))
    results = flagperf_env
    url = f"sqlite:///{results / 'history.sqlite'}"
    verdict_file = results / "nightly-tiny.json"
    # A multiply of a few ms on a core, timed for 2 s: the quota holds for most of the timed window.
    small = ["m=512", "n=512", "k=512", "min_duration_s=2"]

    def night(*overrides: str, share: float | None = 0.10) -> tuple[object, dict]:
        with cpu_quota(str(results.parent), share) if share else contextlib.nullcontext(None) as quota:
            state = nightly_regression(suite="tiny", rounds=2, results_dir=str(results), history_url=url,
                                       overrides=[*small, *overrides], return_state=True)
        assert quota is None or quota.moved, "the night's device processes were put under the quota"
        return state, json.loads(verdict_file.read_text())

    good = []
    for _ in range(3):
        state, verdict = night()
        assert state.is_completed() and exit_code(state) == EXIT_HELD and verdict["exit_code"] == EXIT_HELD, state
        good.append(verdict["run_id"])
    # A night that cannot finish: 10^5 multiplies of 4096^3 (1.4e16 FLOP, hours on any CPU) in a 15 s limit.
    state, verdict = night("m=4096", "n=4096", "k=4096", "min_iters=100000", "timeout_s=15", "max_retries=0",
                           share=None)
    assert state.is_failed() and state.name != REGRESSED_STATE and exit_code(state) == EXIT_NIGHT_FAILED
    assert verdict["exit_code"] == EXIT_NIGHT_FAILED and verdict["regressions"] == []
    failed_night = verdict["run_id"]
    assert "recorded as a failed night" in state.message and error_lines(state.state_details.flow_run_id) == [
        state.message]

    state, verdict = night(share=0.01)
    assert state.is_failed() and state.name == REGRESSED_STATE and exit_code(state) == EXIT_REGRESSION, state
    (regressed,) = [v for v in verdict["verdicts"] if v["status"] == "regression"]
    # The baseline: the median of the three good nights (the failed one is none of it), the threshold from
    # their spread and this night's rounds, as measured here.
    device = summarize(results / verdict["run_id"]).context["device"]
    measured = {p.run_id: p.verdict.value for p in figure_trend(
        history_engine(url), "computation-FP32", "gemm_fp32", "cpu", device) if p.verdict}
    assert regressed["baseline_runs"] == list(reversed(good))
    assert regressed["baseline"] == pytest.approx(statistics.median(measured[r] for r in good))
    spread = statistics.stdev(math.log(measured[r]) for r in good)  # judged on the log scale
    assert regressed["threshold"] >= 3 * spread and regressed["value"] < regressed["low"]
    assert regressed["low"] == pytest.approx(regressed["baseline"] * math.exp(-regressed["threshold"]))
    assert regressed["changes"] == []  # same code, image, hosts: the quota is not something a run records
    assert verdict["regressions"] and verdict["regressions"][0] in state.message

    state, verdict = night()  # the quota gone: held, against the good nights and the regressed one, not the failed
    assert state.is_completed(), state
    (held,) = verdict["verdicts"]
    assert held["status"] in ("ok", "improvement") and held["baseline_runs"][1:] == list(reversed(good))

    # The course a lab reads without the UI: every night in order, the failed one as a failure.
    with (results / "trends.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["verdict"] for r in rows] == ["no-baseline", "no-baseline", "no-baseline", "failed", "regression",
                                            held["status"]]
    assert rows[3]["run_id"] == failed_night and rows[3]["changes"].startswith("the evaluation failed")
