"""The nightly regression flow on a real server: history recorded, a seeded baseline far above this
machine's figure gives a regression verdict, a failed flow with a clear message, and a Prefect event;
the automation template in deployments/ is accepted by `prefect automation create`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter
from prefect_api import error_lines

from flagperf.config.vendors import load_vendor
from flagperf.results.history import history_engine, record_run
from flagperf.results.schema import Metric, RoundResult, write_result
from flows.evaluate import BAD_INPUT, RESULTS_DIR_ENV
from flows.nightly import REGRESSION_EVENT, nightly_regression

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
    assert state.is_failed()
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


def test_a_bad_history_url_is_said_before_a_night_of_measuring(flagperf_env: Path) -> None:
    state = nightly_regression(suite="smoke", history_url="not a url", results_dir=str(flagperf_env),
                               return_state=True)
    assert state.is_failed() and state.message.startswith(f"{BAD_INPUT}history_url: not a database URL"), state
    assert error_lines(state.state_details.flow_run_id) == [state.message]
    assert not flagperf_env.exists()  # nothing ran


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
