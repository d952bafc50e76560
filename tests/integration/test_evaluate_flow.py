"""The evaluate flow for real: a real Prefect server, real case processes, real monitors.

Everything is checked through the Prefect API (task runs, retries, logs, artifacts) and the result files.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
)
from prefect_api import (
    all_task_runs,
    error_lines,
    flow_run_logs,
    flow_run_tree,
    run_evaluate,
    task_log_records,
    task_logs,
    task_runs,
)

from flagperf.paths import RESULTS_ROOT_ENV, RESULTS_URL_ENV
from flagperf.results.schema import read_result
from flows.evaluate import BAD_INPUT

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

FAST = ["min_duration_s=0.3", "warmup_iters=0", "min_iters=2"]


def monitor_processes(run_dir_name: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "flagperf.monitoring" in cmdline and run_dir_name in cmdline:
            found.append(proc)
    return found


def test_smoke_suite_runs_through_the_real_flow(flagperf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The results folder as `flagperf server` serves it: the log names the report's address on the site.
    monkeypatch.setenv(RESULTS_URL_ENV, "http://perf-lab:4201/runs")
    monkeypatch.setenv(RESULTS_ROOT_ENV, str(flagperf_env))
    state, run_dir = run_evaluate(flagperf_env, suite="smoke", overrides=[*FAST, "max_gib=0.25"])
    assert state.is_completed(), state.message
    flow_run_id = state.state_details.flow_run_id

    runs = task_runs(flow_run_id)
    smoke = ["computation-FP32", "computation-FP64", "main_memory-bandwidth", "main_memory-capacity"]
    expected = {"healthcheck[localhost]", "build_image[localhost]", "analyze[" + run_dir.name + "]"}
    expected |= {f"run_case[{case}/round1@localhost]" for case in smoke}
    expected |= {f"collect_logs[{case}/round1@localhost]" for case in smoke}
    assert expected <= set(runs), sorted(set(runs))
    starts = [name for name in runs if name.startswith("start_monitors[")]
    stops = [name for name in runs if name.startswith("stop_monitors")]
    assert len(starts) == len(stops) == len(smoke)
    assert all(run.state.is_completed() for run in runs.values())

    # The case's own output is in its task run's logs.
    logs = task_logs(runs["run_case[computation-FP32/round1@localhost]"].id)
    assert any("gemm_fp32:" in line and "TFLOPS" in line for line in logs), logs
    # The cpu vendor's changes to the cases' defaults: one line in the run's log, not one per key.
    lines = [message for _, message in flow_run_logs(flow_run_id)]
    assert len([m for m in lines if m.startswith("vendor cpu changes ")]) == 1, lines
    assert not [m for m in lines if "vendor/cpu.yaml: " in m], lines
    assert f"report on the results site: http://perf-lab:4201/runs/{run_dir.name}/report.html" in lines, lines

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    by_key = {a.key: a for a in artifacts}
    assert by_key["flagperf-summary"].type == "table"
    assert by_key["flagperf-report"].type == "markdown"
    table = json.loads(by_key["flagperf-summary"].data) if isinstance(by_key["flagperf-summary"].data, str) \
        else by_key["flagperf-summary"].data
    assert {row["case"] for row in table} == set(smoke)
    assert "measured/peak" in by_key["flagperf-report"].data

    # Files: FlagPerf's layout, one result per round, summary files generated from them.
    for case in smoke:
        folder = run_dir / case / "round1" / "localhost_noderank0"
        result = read_result(folder / "result.json")
        assert result.status == "success" and result.metrics and result.metrics[0].value > 0
        assert result.provenance is not None and result.provenance.libraries["prefect"] == "3.8.8"
        assert result.provenance.image["status"] == "skipped"
        assert result.provenance.run_overrides["--set"]
        samples = [json.loads(line) for line in (folder / "monitor_system.jsonl").read_text().splitlines()]
        assert samples[0]["type"] == "header" and samples[-1]["type"] == "footer"
        assert any(s["type"] == "sample" for s in samples)
    fp32 = read_result(run_dir / "computation-FP32" / "round1" / "localhost_noderank0" / "result.json")
    assert fp32.metrics[0].peak is not None and fp32.metrics[0].ratio is not None
    assert fp32.config["min_duration_s"] == 0.3
    assert fp32.provenance.config_origins["min_duration_s"] == "--set"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"] == {"rounds": 4, "success": 4, "unsupported": 0, "failed": 0}
    assert (run_dir / "summary.csv").read_text().startswith("case,family,round,host")
    assert "| computation-FP32 | gemm_fp32 |" in (run_dir / "report.md").read_text()
    assert not monitor_processes(run_dir.name)


def test_failures_are_retried_only_when_the_infrastructure_failed(flagperf_env: Path, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    state, run_dir = run_evaluate(
        flagperf_env, cases=["crash-once", "user-error", "sleepy", "no-such-dtype"],
        overrides=[f"crash-once.marker={marker}"])
    assert state.is_failed()
    # One line names each failed round (once) and why; it is the run's only ERROR line, with no traceback.
    assert state.message.startswith("2 of 4 rounds failed: user-error round 1 on localhost: "), state.message
    assert "; sleepy round 1 on localhost: timed out after 3 s" in state.message
    assert state.message.count(" round 1 on localhost") == 2
    assert error_lines(state.state_details.flow_run_id) == [state.message]
    runs = task_runs(state.state_details.flow_run_id)

    # A crash is retried and the second attempt's numbers are kept, with the crashed attempt's files.
    crash = runs["run_case[crash-once/round1@localhost]"]
    assert crash.state.is_completed() and crash.run_count == 2
    folder = run_dir / "crash-once" / "round1" / "localhost_noderank0"
    result = read_result(folder / "result.json")
    assert result.status == "success" and result.provenance.attempt == 2
    assert "crashing on purpose" in (folder / "attempts" / "attempt1" / "case.log").read_text()

    # A user error fails once, not max_retries + 1 times.
    user = runs["run_case[user-error/round1@localhost]"]
    assert user.state.is_failed() and user.run_count == 1
    result = read_result(run_dir / "user-error" / "round1" / "localhost_noderank0" / "result.json")
    assert result.status == "failed" and result.failure.kind == "user"
    assert "not a power of two" in result.failure.message

    # A hang is killed at timeout_s and retried (max_retries: 1); the failure is written by the controller.
    sleepy = runs["run_case[sleepy/round1@localhost]"]
    assert sleepy.state.is_failed() and sleepy.run_count == 2
    folder = run_dir / "sleepy" / "round1" / "localhost_noderank0"
    result = read_result(folder / "result.json")
    assert result.status == "failed" and result.failure.kind == "infrastructure"
    assert "timed out after 3 s" in result.failure.message
    # It records what the healthcheck found on the host, which the round read from the run folder: the round's
    # parameters (its Parameters tab in the UI) carry only what names the round, not that whole probe.
    probe = json.loads((run_dir / "hosts" / "localhost.health.json").read_text())["probe"]
    assert result.device == probe["device"] and result.provenance.host == probe["host"]
    with get_client(sync_client=True) as client:
        rounds = [client.read_flow_run(i) for i in flow_run_tree(state.state_details.flow_run_id)]
    (sleepy_round,) = [r for r in rounds if r.name == "sleepy/round1@localhost"]
    assert set(sleepy_round.parameters) == {"run_dir", "case", "round_no", "host", "node_rank", "nnodes",
                                            "master_addr", "master_port", "image", "monitor_interval_s", "command",
                                            "on_host"}, sleepy_round.parameters
    # where it hung: the case log's last line is in the message, not only in case.log ("sleeping", unless a loaded
    # machine took the case's whole 3 s to start it: the verdict must not depend on the machine's speed)
    logged = [line.strip() for line in (folder / "case.log").read_text().splitlines() if line.strip()]
    assert result.failure.message.endswith(f"; last line of case.log: {logged[-1] if logged else '(empty)'}"), \
        result.failure.message
    assert (folder / "attempts" / "attempt1" / "case.log").is_file()

    # Unsupported is a result, not a failure, and is not retried.
    unsupported = runs["run_case[no-such-dtype/round1@localhost]"]
    assert unsupported.state.is_completed() and unsupported.run_count == 1
    result = read_result(run_dir / "no-such-dtype" / "round1" / "localhost_noderank0" / "result.json")
    assert result.status == "unsupported" and "TF32" in result.failure.message
    # The case's warning is a warning in the round's log (the dashboard's level filter finds it), with the case's
    # own time and without its level; its other lines stay INFO.
    records = task_log_records(unsupported.id)
    assert [level for level, m in records if m.endswith(f" unsupported: {result.failure.message}")] == [30], records
    assert not [m for _, m in records if " INFO " in m[:30] or " WARNING " in m[:30]], records

    # Monitors were stopped after every round, failed ones included.
    assert all(run.state.is_completed() for name, run in runs.items() if name.startswith("stop_monitors"))
    assert len([n for n in runs if n.startswith("stop_monitors")]) == 4
    assert not monitor_processes(run_dir.name)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"] == {"rounds": 4, "success": 1, "unsupported": 1, "failed": 2}

    # A host-round run made before its `probe` parameter was dropped stores it; retried from the UI, a worker runs
    # it with those parameters (here in this process, as a worker's engine does: Prefect refused any parameter the
    # flow lacked). And the host's health report has become unreadable: the round reads no probe, with a warning,
    # rather than failing before it starts (outside its catch-all), and the evaluation with it. The case still
    # fails as it does, with its result recorded.
    from prefect.flow_engine import run_flow

    from flows.host_round import host_round

    (user_round,) = [r for r in rounds if r.name == "user-error/round1@localhost"]
    (run_dir / "hosts" / "localhost.health.json").write_text('["not a report"]')
    with get_client(sync_client=True) as client:
        before_the_change = client.create_flow_run(host_round, name="user-error/round2@localhost", parameters={
            **user_round.parameters, "round_no": 2, "probe": probe})
    retried = run_flow(host_round, flow_run=before_the_change, return_type="state")
    assert retried.is_failed() and "not a power of two" in retried.message, retried
    result = read_result(run_dir / "user-error" / "round2" / "localhost_noderank0" / "result.json")
    assert result.status == "failed" and result.failure.kind == "user"
    warnings = [m for level, m in flow_run_logs(before_the_change.id) if level == 30]
    assert [m for m in warnings if m.startswith("host localhost: its health report is unreadable (")], warnings


def test_bad_config_fails_before_any_task(flagperf_env: Path) -> None:
    state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32"], overrides=["m=-5"])
    assert state.is_failed()
    assert state.message.startswith(f"{BAD_INPUT}--set: m:")  # the form names its field: test_deployments.py
    assert error_lines(state.state_details.flow_run_id) == [state.message.removeprefix(BAD_INPUT)]
    assert task_runs(state.state_details.flow_run_id) == {}
    assert not run_dir.exists()


def test_retrying_a_failed_evaluation_reruns_only_the_failed_rounds(flagperf_env: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    marker = tmp_path / "fixed"
    state, run_dir = run_evaluate(
        flagperf_env, cases=["computation-FP64", "fails-until-fixed"], rounds=2,
        overrides=[*FAST, f"fails-until-fixed.marker={marker}"])
    assert state.is_failed() and "2 of 4 rounds failed" in state.message
    # Each failed round's host-round subflow is Failed (red in the UI), the others Completed.
    evaluation = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        rounds = {run.name: run.state for run in (client.read_flow_run(i) for i in flow_run_tree(evaluation))
                  if run.id != evaluation}
    assert {name: s.type.value for name, s in rounds.items()} == {
        "computation-FP64/round1@localhost": "COMPLETED", "computation-FP64/round2@localhost": "COMPLETED",
        "fails-until-fixed/round1@localhost": "FAILED", "fails-until-fixed/round2@localhost": "FAILED"}
    assert "input not ready" in rounds["fails-until-fixed/round1@localhost"].message
    kept = run_dir / "computation-FP64" / "round1" / "localhost_noderank0" / "result.json"
    before = kept.read_bytes()
    first_artifacts = run_artifacts(state.state_details.flow_run_id)
    assert sorted(a.key for a in first_artifacts) == ["flagperf-report", "flagperf-summary"]

    marker.write_text("fixed\n")  # the user fixes the input, then retries the flow run
    flow_run_id = str(state.state_details.flow_run_id)
    root = Path(__file__).resolve().parents[2]
    retry = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", flow_run_id, "--entrypoint",
         "flows/evaluate.py:evaluate"],
        cwd=root, env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True, text=True, timeout=600)
    assert retry.returncode == 0, retry.stdout[-3000:] + retry.stderr[-3000:]

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
    assert flow_run.state.is_completed(), flow_run.state
    names = [run.name for run in all_task_runs(state.state_details.flow_run_id)]
    # The completed FP64 rounds ran once (first attempt); the fixed case's rounds ran in both attempts.
    assert sum(n.startswith("run_case[computation-FP64/") for n in names) == 2
    assert sum(n.startswith("run_case[fails-until-fixed/") for n in names) == 4
    assert names.count("healthcheck[localhost]") == 2
    assert kept.read_bytes() == before
    fixed = read_result(run_dir / "fails-until-fixed" / "round1" / "localhost_noderank0" / "result.json")
    assert fixed.status == "success"
    earlier = read_result(run_dir / "retries" / "attempt1" / "fails-until-fixed" / "round1" / "localhost_noderank0"
                          / "result.json")
    assert earlier.status == "failed" and "input not ready" in earlier.failure.message
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"] == {"rounds": 4, "success": 4, "unsupported": 0, "failed": 0}
    # The report says which rounds a retry ran again and what they were before.
    assert [(e["case"], e["round"], e["was"], e["now"]) for e in summary["retried"]] == [
        ("fails-until-fixed", 1, "failed", "success"), ("fails-until-fixed", 2, "failed", "success")]
    assert "run again by a retry of the flow run" in (run_dir / "report.md").read_text(encoding="utf-8")
    # The retry's log: each round kept, and each round run again with what its earlier attempt ended as.
    lines = [message for _, message in flow_run_logs(state.state_details.flow_run_id)]
    assert "computation-FP64 round 1 on localhost: kept (success) from an earlier attempt of this flow run" in lines
    again = [m for m in lines if m.startswith("fails-until-fixed round 1 on localhost: runs again (")]
    assert again == [f"fails-until-fixed round 1 on localhost: runs again (the earlier attempt: failed: "
                     f"{earlier.failure.message}; kept in retries/attempt1/fails-until-fixed/round1/"
                     f"localhost_noderank0)"], lines
    # The retry's artifacts replace the first attempt's: one set, the latest.
    artifacts = run_artifacts(state.state_details.flow_run_id)
    assert sorted(a.key for a in artifacts) == ["flagperf-report", "flagperf-summary"]
    assert not {a.id for a in artifacts} & {a.id for a in first_artifacts}
    report = next(a for a in artifacts if a.key == "flagperf-report")
    assert "run again by a retry of the flow run" in report.data


def test_a_run_that_measured_nothing_is_not_a_plain_success(flagperf_env: Path) -> None:
    """Every round unsupported: `flagperf run` exits 3, and the flow run it made ends in a Completed state named
    Unsupported (not plain Completed) whose message says why."""
    import os
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    from flagperf.config.plan import PLAN_FILE, RunPlan
    from flows.evaluate import UNSUPPORTED_STATE

    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--cases", "no-such-dtype", "--results",
                           str(flagperf_env)], cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = flagperf_env.iterdir()
    # The console ends with what to open and what to do next, naming this run's folder.
    assert f"next: open {run_dir / 'report.html'}; " in done.stdout, done.stdout[-2000:]
    assert f"`flagperf compare {run_dir} <new run>`" in done.stdout
    plan = RunPlan.model_validate_json((run_dir / PLAN_FILE).read_text())
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(plan.flow_run_id)
    assert flow_run.state.is_completed() and flow_run.state.name == UNSUPPORTED_STATE
    assert flow_run.state.message.startswith(
        "nothing measured: all 1 rounds were unsupported: no-such-dtype round 1 on localhost: "), flow_run.state
    assert "TF32" in flow_run.state.message


def run_artifacts(flow_run_id: object) -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def test_training_killed_mid_way_says_where_it_stopped(flagperf_env: Path) -> None:
    # Never converges (tiny learning rate, endless epochs): the round's timeout kills it mid-training.
    state, run_dir = run_evaluate(
        flagperf_env, cases=["digits-mlp"],
        overrides=["lr=0.000001", "momentum=0.0", "max_epochs=100000", "timeout_s=30", "max_retries=0"])
    assert state.is_failed()
    folder = run_dir / "digits-mlp" / "round1" / "localhost_noderank0"
    result = read_result(folder / "result.json")
    assert result.status == "failed" and result.failure.kind == "infrastructure"
    assert "timed out after 30 s" in result.failure.message
    assert "rank0.out.log: last PerfLog event" in result.failure.message and "epoch(s) begun" in result.failure.message
    assert (folder / "rank0.out.log").is_file()
    assert not monitor_processes(run_dir.name)
    # this run's workers (their job file lies in its scratch folder): the unit tests beside it train too
    training = [p for p in psutil.process_iter(["cmdline"])
                if "flagperf.training.worker" in " ".join(p.info["cmdline"] or [])
                and f"/{run_dir.name}/" in " ".join(p.info["cmdline"] or [])]
    assert not training, "a training process outlived its round"
