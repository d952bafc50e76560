"""prefect.yaml for real: `prefect deploy --all` against a real server, the nightly schedule, and an
evaluate deployment run picked up by a real process worker, with the case's logs under its task run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId
from prefect_api import all_task_runs

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
ROOT = Path(__file__).resolve().parents[2]


def prefect_cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_deploy_all_then_run_through_a_worker(flagperf_env: Path, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PWD": str(ROOT),
           "FLAGPERF_SUITE_PATH": str(ROOT / "tests" / "fixtures" / "suites")}
    created = prefect_cli("work-pool", "create", "flagperf", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = prefect_cli("deploy", "--all", env=env)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]

    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        evaluate = client.read_deployment_by_name("evaluate/evaluate")
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == "Asia/Shanghai"
    assert schedule.active
    assert {"suite", "cases", "vendor", "rounds", "overrides"} <= set(evaluate.parameter_openapi_schema["properties"])

    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", "flagperf",
                               "--limit", "1"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        from prefect.deployments import run_deployment

        flow_run = run_deployment("evaluate/evaluate", timeout=0, parameters={
            "suite": "tiny", "rounds": 1, "results_dir": str(flagperf_env)})
        deadline = time.time() + 420
        with get_client(sync_client=True) as client:
            while time.time() < deadline:
                flow_run = client.read_flow_run(flow_run.id)
                if flow_run.state and flow_run.state.is_final():
                    break
                time.sleep(2)
            assert flow_run.state.is_completed(), flow_run.state
            case_task = next(t for t in all_task_runs(flow_run.id)
                             if t.name.startswith("run_case[computation-FP32/round1"))
            # Logs are shipped in batches; give the last batch of the finished process time to land.
            messages: list[str] = []
            deadline = time.time() + 30
            while time.time() < deadline and not any("gemm_fp32:" in m for m in messages):
                logs = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[case_task.id])))
                messages = [log.message for log in logs]
                time.sleep(1)
        assert any("gemm_fp32:" in m for m in messages), messages
        # The core's own logger, routed to the task run by PREFECT_LOGGING_EXTRA_LOGGERS from prefect.yaml.
        assert any(m.startswith("starting ") and "flagperf.entry" in m for m in messages), messages
        run_dirs = list(flagperf_env.glob("run*"))
        assert len(run_dirs) == 1 and (run_dirs[0] / "summary.json").is_file()
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
