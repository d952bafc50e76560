"""prefect.yaml for real: `prefect deploy --all` against a real server, the nightly schedule, and an
evaluate deployment run picked up by a real process worker, with the case's logs under its task run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId
from prefect.client.schemas.objects import FlowRun
from prefect_api import all_task_runs, error_lines, flow_run_tree
from server_ports import start_on_os_ports

from flagperf.results.schema import read_result
from flows.server import watched
from tests.unit.childio import output_of

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
ROOT = Path(__file__).resolve().parents[2]


def stop_workers(workers: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """SIGTERM every worker's process group, then SIGKILL the groups still there after ``grace_s``: a worker
    that ignores SIGTERM (or whose children do) must not outlive the test and write into the next run's server."""
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):  # the group's children too, even if the leader exited
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=60)

def prefect_cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def wait_final(flow_run_id: object, timeout_s: float = 420) -> FlowRun:
    deadline = time.time() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            if (flow_run.state and flow_run.state.is_final()) or time.time() > deadline:
                return flow_run
            time.sleep(1)


def test_deploy_all_then_run_through_a_worker(flagperf_env: Path, tmp_path: Path) -> None:
    """What a user of the server gets: the forms (descriptions, choices, the results folder the server serves),
    the internal deployments marked so, the nightly in this machine's time zone, and runs started from the
    evaluate form on a real worker ending in one line each: a failed round, bad input (naming the form's
    field), a good run with the case's log under its task run."""
    from prefect.settings import PREFECT_API_URL

    from flows.evaluate import BAD_INPUT, RESULTS_DIR_ENV
    from flows.schedule import machine_timezone

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PWD": str(ROOT),
           "FLAGPERF_SUITE_PATH": str(ROOT / "tests" / "fixtures" / "suites"), "PREFECT_WORKER_QUERY_SECONDS": "2",
           RESULTS_DIR_ENV: str(flagperf_env)}  # as `flagperf server` sets it for its worker
    created = prefect_cli("work-pool", "create", "flagperf", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = prefect_cli("deploy", "--all", env=env)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]

    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        evaluate = client.read_deployment_by_name("evaluate/evaluate")
        internal = [client.read_deployment_by_name(name) for name in ("host-round/host-round",
                                                                      "host-healthcheck/host-healthcheck")]
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == machine_timezone()
    assert schedule.active
    form = evaluate.parameter_openapi_schema["properties"]
    assert {"suite", "cases", "vendor", "rounds", "overrides", "inventory"} <= set(form)
    assert form["results_dir"]["default"] == "" and RESULTS_DIR_ENV in form["results_dir"]["description"]
    # The nightly's form is as finished as evaluate's: every field described, choices, no "x | None" fields.
    nightly_form = nightly.parameter_openapi_schema["properties"]
    assert all(field.get("description") for field in nightly_form.values()), nightly_form
    assert "tiny" in nightly_form["suite"]["enum"] and "cpu" in nightly_form["vendor"]["enum"]
    assert not [name for name, field in nightly_form.items() if "anyOf" in field], nightly_form
    assert nightly_form["results_dir"]["default"] == "" and "results_dir" not in (nightly.parameters or {})
    for deployment in internal:
        assert deployment.description.startswith("Internal") and "internal" in deployment.tags
    # host-round's form has no `probe`: the round reads it from the run folder (a run made before still passes it);
    # its other fields keep their types (host and image were untyped)
    round_form = internal[0].parameter_openapi_schema["properties"]
    assert "probe" not in round_form and round_form["host"].get("type") == "object", round_form

    worker = subprocess.Popen(watched([sys.executable, "-m", "prefect", "worker", "start", "--pool", "flagperf",
                                       "--limit", "1"]), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        from prefect.deployments import run_deployment

        # One run at a time (--limit 1): when a run starts, the one before has exited and its log is complete.
        failing = wait_final(run_deployment("evaluate/evaluate", timeout=0, parameters={
            "cases": ["user-error"]}).id)
        bad = wait_final(run_deployment("evaluate/evaluate", timeout=0, parameters={
            "cases": ["computation-FP32"], "overrides": ["m=-5"]}).id)
        flow_run = wait_final(run_deployment("evaluate/evaluate", timeout=0, parameters={
            "suite": "tiny", "rounds": 1}).id)
        assert flow_run.state.is_completed(), flow_run.state

        # A failed round: one ERROR line naming it and why, no engine traceback (the run's log is complete).
        assert failing.state.is_failed() and failing.state.message.startswith(
            "1 of 1 rounds failed: user-error round 1 on localhost: "), failing.state
        assert "user-error round 1 on localhost" not in failing.state.message.partition("localhost: ")[2]
        assert error_lines(failing.id) == [failing.state.message]
        # Bad input: the form's field, in one line.
        assert bad.state.is_failed() and bad.state.message.startswith(f"{BAD_INPUT}overrides: m: "), bad.state
        assert error_lines(bad.id) == [bad.state.message.removeprefix(BAD_INPUT)]

        with get_client(sync_client=True) as client:
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
        # Both runs that measured landed in the folder the server serves, without the form naming it.
        summaries = sorted(run.name for run in flagperf_env.glob("run*") if (run / "summary.json").is_file())
        assert len(summaries) == 2, list(flagperf_env.iterdir())
    finally:
        stop_workers([worker])


def test_hosts_with_a_worker_get_their_rounds_through_their_own_queue(flagperf_env: Path, tmp_path: Path) -> None:
    """Two hosts whose inventory entries say they run a worker: each host's healthcheck and round run on the
    worker of its own queue (host-<name>), as subflows of the evaluation, and land in the shared run folder."""
    from prefect.settings import PREFECT_API_URL

    from flows.evaluate import evaluate

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PWD": str(ROOT),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_LOGGING_EXTRA_LOGGERS": "flagperf"}
    created = prefect_cli("work-pool", "create", "flagperf", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = prefect_cli("deploy", "--all", env=env)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n"
        f"  - {{name: agent-a, address: localhost, agent: {{}}, work_root: {tmp_path / 'work-a'}}}\n"
        f"  - {{name: agent-b, address: localhost, agent: {{}}, work_root: {tmp_path / 'work-b'}}}\n")
    workers = [subprocess.Popen(watched([sys.executable, "-m", "prefect", "worker", "start", "--pool", "flagperf",
                                         "--work-queue", f"host-{name}"]), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True) for name in ("agent-a", "agent-b")]
    try:
        run_id = f"run-agents-{time.time_ns()}"
        state = evaluate(cases=["computation-FP32"], rounds=1, inventory=str(inventory), run_id=run_id,
                         results_dir=str(flagperf_env), overrides=["min_duration_s=0.3", "warmup_iters=0",
                                                                   "min_iters=2"], return_state=True)
        assert state.is_completed(), state.message
        evaluation = state.state_details.flow_run_id
        with get_client(sync_client=True) as client:
            subflows = [client.read_flow_run(i) for i in flow_run_tree(evaluation) if i != evaluation]
        by_name = {run.name: run for run in subflows}
        for host in ("agent-a", "agent-b"):
            round_run = by_name[f"computation-FP32/round1@{host}"]
            check_run = by_name[f"healthcheck@{host}"]
            for run in (round_run, check_run):
                # Nested under the evaluation, run by the host's own worker from its queue.
                assert run.parent_task_run_id is not None and run.work_queue_name == f"host-{host}"
                assert run.deployment_id is not None and run.state.is_completed()
            names = {t.name for t in all_task_runs(round_run.id)}
            assert {f"start_monitors[computation-FP32/round1@{host}]", f"run_case[computation-FP32/round1@{host}]",
                    f"collect_logs[computation-FP32/round1@{host}]"} <= names, names
            result = read_result(flagperf_env / run_id / "computation-FP32" / "round1" / f"{host}_noderank0"
                                 / "result.json")
            assert result.status == "success" and result.host == host
            assert (flagperf_env / run_id / "hosts" / f"{host}.health.json").is_file()
    finally:
        stop_workers(workers)


def test_a_host_whose_worker_is_down_fails_healthcheck_in_bounded_time(flagperf_env: Path, tmp_path: Path) -> None:
    """The inventory says the host runs a worker, but none is polling its queue: the healthcheck fails after
    agent.start_timeout_s naming the host and the queue, the dispatched run is cancelled (it cannot start
    later, when someone starts the worker), and no round runs."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.settings import PREFECT_API_URL

    from flows.evaluate import evaluate

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PWD": str(ROOT)}
    created = prefect_cli("work-pool", "create", "flagperf", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = prefect_cli("deploy", "--all", env=env)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  - {name: no-worker, address: localhost, agent: {start_timeout_s: 4},"
                         f" work_root: {tmp_path / 'work'}}}\n")
    run_id = f"run-no-worker-{time.time_ns()}"
    state = evaluate(cases=["computation-FP32"], rounds=1, inventory=str(inventory), run_id=run_id,
                     results_dir=str(flagperf_env), return_state=True)
    assert state.is_failed()
    assert ("host no-worker: no worker on work queue host-no-worker picked up host-healthcheck/host-healthcheck "
            "within 4 s") in state.message
    assert not (flagperf_env / run_id / "computation-FP32").exists()  # nothing else started
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(
            any_=[state.state_details.flow_run_id])))
    dispatched = [run for run in children if run.name.startswith("healthcheck@") or run.deployment_id]
    assert dispatched and all(run.state.is_cancelled() for run in dispatched), [(r.name, r.state) for r in children]


def test_a_lasting_server_schedules_the_nightly(tmp_path: Path) -> None:
    """The scheduler runs only in a lasting server (`prefect server start`; `flagperf server` runs Prefect's same
    app with its services, behind its front, flows/team_app.py), not in the tests' temporary one: start one on
    SQLite and check the nightly's schedule produces runs."""
    from datetime import datetime, timezone
    from zoneinfo import ZoneInfo

    from prefect_api import assert_schedule_gets_runs, nightly_schedule

    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="false",
               PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}")

    def start_server(port: int, _unused: int) -> subprocess.Popen[str]:
        return subprocess.Popen(watched([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                         "--port", str(port)]), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    server, port, _ = start_on_os_ports(start_server, home, output_of)
    api = f"http://127.0.0.1:{port}/api"
    try:
        runs = assert_schedule_gets_runs(api)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        out, _ = server.communicate(timeout=60)
    # Upcoming nightly runs: in the future, at the cron's hour in the schedule's time zone.
    schedule = nightly_schedule()
    hour = int(schedule["cron"].split()[1])
    for run in runs:
        start = datetime.fromisoformat(run["expected_start_time"].replace("Z", "+00:00"))
        assert start > datetime.now(timezone.utc)
        assert start.astimezone(ZoneInfo(schedule["timezone"])).hour == hour, run["expected_start_time"]
    assert "bulk DML" not in out, out[-3000:]


def set_nightly_as_deployed(client: Any) -> None:
    """What `prefect deploy` does to the nightly first: prefect.yaml's schedule in place of the one set, resumed."""
    from prefect.client.schemas.schedules import CronSchedule
    from prefect_api import nightly_schedule

    nightly = client.read_deployment_by_name("nightly-regression/nightly")
    for schedule in nightly.schedules:
        client.delete_deployment_schedule(nightly.id, schedule.id)
    client.create_deployment_schedules(nightly.id, [(CronSchedule(**nightly_schedule()), True)])
    client.resume_deployment(nightly.id)


def test_what_users_set_on_the_nightly_in_the_ui_survives_a_restart_of_the_server(tmp_path: Path) -> None:
    """`flagperf server` makes the deployments on every start: a nightly moved to 03:30 Berlin with other
    parameters, one schedule switched off, the deployment paused (as the UI does them) stay so, and the banner's
    line says prefect.yaml's schedule was not applied. (`prefect deploy` alone would put 02:00 back, unpaused.)
    So also where a start was stopped by a signal while `prefect deploy` ran, after it had done that to the
    nightly: the deploy is stopped and what users set is put back before the server stops (the next start
    would take prefect.yaml's schedule for theirs). And where the start was killed outright then (SIGKILL): what
    users set was saved in its logs folder before the deploy began, and the next start puts it back from there.
    So also where that next start is itself cut while it puts them back (after its first change): what it puts
    back is made before what it replaces is deleted, so the nightly is never left without its schedules, and the
    start after that recognises the state and puts back the same. A server of another work pool on the same
    database is refused, naming --pool, and changes nothing; the deploy command it prints (`--no-deploy`, "by
    hand:") makes them on its own pool, and then a server of the first pool is refused in turn."""
    import threading

    from held_deploy import holding_env, running, wait_held
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.settings import PREFECT_API_URL

    from flagperf.errors import ConfigError
    from flows.server import (
        SAVED_SETTINGS,
        api_headers,
        create_deployments,
        deploy_command,
        deployments_in_project,
        read_saved_settings,
        restore_set_by_users,
        saved_for_this_start,
        set_by_users,
        with_saved_settings,
    )

    api = PREFECT_API_URL.value()
    database = "the session's test server"
    env = {**os.environ, "PREFECT_API_URL": api, "PWD": str(ROOT)}
    created = prefect_cli("work-pool", "create", "flagperf", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout + created.stderr

    def deploy() -> list[str]:
        _user, _internal, kept = create_deployments(api, env, tmp_path / "results", "flagperf", None, tmp_path,
                                                    database=database)
        return kept

    deploy()
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        (schedule,) = nightly.schedules
        client.update_deployment_schedule(nightly.id, schedule.id, schedule=CronSchedule(
            cron="30 3 * * *", timezone="Europe/Berlin"), parameters={"rounds": 5})
        client.create_deployment_schedules(nightly.id, [(CronSchedule(cron="0 12 * * 6", timezone="UTC"), False)])
        client.pause_deployment(nightly.id)
        set_in_ui = sorted((s.schedule.cron, s.schedule.timezone, s.active, s.parameters)
                           for s in client.read_deployment_schedules(nightly.id))
    assert len(set_in_ui) == 2

    held, marker = holding_env(tmp_path)
    stopping: list[int] = []
    returned = threading.Event()
    deploys: list[int] = []

    def as_the_deploy_did_then_ctrl_c() -> None:  # on the held deploy: what it does first to the nightly
        try:
            deploys.append(wait_held(marker, lambda: not returned.is_set()))
            with get_client(sync_client=True) as client:
                set_nightly_as_deployed(client)
                # and meanwhile a user gives evaluate a schedule in the UI: not prefect.yaml's, nor as before
                evaluate = client.read_deployment_by_name("evaluate/evaluate")
                client.create_deployment_schedules(evaluate.id, [(CronSchedule(cron="0 5 * * 1", timezone="UTC"),
                                                                  True)])
        finally:
            stopping.append(signal.SIGINT)  # as serve's handler notes it

    thread = threading.Thread(target=as_the_deploy_did_then_ctrl_c)
    thread.start()
    try:
        assert create_deployments(api, {**env, **held}, tmp_path / "results", "flagperf", None, tmp_path,
                                  stopping, database=database) is None
    finally:
        returned.set()
        thread.join(timeout=120)
    (deploy_pid,) = deploys
    assert not running(deploy_pid)
    saved = tmp_path / SAVED_SETTINGS
    assert not saved.exists()  # put back: nothing left for the next start
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        assert sorted((s.schedule.cron, s.schedule.timezone, s.active, s.parameters)
                      for s in nightly.schedules) == set_in_ui
        assert nightly.paused
        # what was set in the UI while the deploy ran is left as it was set (it used to be put back to before)
        evaluate = client.read_deployment_by_name("evaluate/evaluate")
        assert [(s.schedule.cron, s.active) for s in evaluate.schedules] == [("0 5 * * 1", True)]
        for schedule in evaluate.schedules:  # the shared server's evaluate, as it was
            client.delete_deployment_schedule(evaluate.id, schedule.id)

    # Killed outright while `prefect deploy` runs (held), after it gave the nightly prefect.yaml's schedule: the
    # start that makes the deployments (a process of its own here, signed in) can put nothing back.
    held, marker = holding_env(tmp_path / "killed")
    password = f"pw-{time.time_ns()}-not-in-the-file"
    starting = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\nfrom pathlib import Path\nfrom flagperf.site.auth import Credentials\n"
        "from flows.server import create_deployments\n"
        f"create_deployments({api!r}, dict(os.environ), Path({str(tmp_path / 'results')!r}), 'flagperf', "
        f"Credentials('lab:{password}', 'a test'), Path({str(tmp_path)!r}), database={database!r})\n")],
        cwd=ROOT, env={**env, **held})
    try:
        deploy_pid = wait_held(marker, lambda: starting.poll() is None)
        assert saved.is_file() and password not in saved.read_text()  # saved before the deploy began
        with get_client(sync_client=True) as client:
            set_nightly_as_deployed(client)
    finally:
        starting.kill()
        starting.wait(timeout=60)
    deadline = time.monotonic() + 120
    while running(deploy_pid):  # its watcher stops it once its owner is gone
        assert time.monotonic() < deadline, "the held deploy outlived the start that ran it"
        time.sleep(0.2)
    assert saved.is_file()

    # The next start, cut (as by a SIGKILL) just after its first change while it puts back what the file holds:
    # the nightly has the saved schedules beside prefect.yaml's (it had none: the old put-back deleted first).
    class Cut(Exception):
        pass

    class CutAfterTheFirstChange:
        def __init__(self, http: httpx.Client) -> None:
            self.http, self.changes = http, 0

        def get(self, *args: object, **kwargs: object) -> httpx.Response:
            return self.http.get(*args, **kwargs)

        def change(self, method: str, *args: object, **kwargs: object) -> httpx.Response:
            if self.changes:
                raise Cut
            self.changes += 1
            return getattr(self.http, method)(*args, **kwargs)

        def post(self, *args: object, **kwargs: object) -> httpx.Response:
            return self.change("post", *args, **kwargs)

        def patch(self, *args: object, **kwargs: object) -> httpx.Response:
            return self.change("patch", *args, **kwargs)

        def delete(self, *args: object, **kwargs: object) -> httpx.Response:
            return self.change("delete", *args, **kwargs)

    user_specs = [spec for spec in deployments_in_project("flagperf")["deployments"] if spec["name"] == "nightly"]
    with httpx.Client(base_url=api, headers=api_headers(api, None), timeout=30) as http:
        now = set_by_users(http, user_specs)
        before = with_saved_settings(now, saved_for_this_start(saved, read_saved_settings(saved), database, now))
        with pytest.raises(Cut):
            restore_set_by_users(CutAfterTheFirstChange(http), before)
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        cut = sorted((s.schedule.cron, s.schedule.timezone, s.active, s.parameters) for s in nightly.schedules)
    assert [s for s in cut if s in set_in_ui] == set_in_ui and len(cut) == len(set_in_ui) + 1, cut
    assert saved.is_file()

    kept = deploy()  # the next start
    assert not saved.exists()
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        after = sorted((s.schedule.cron, s.schedule.timezone, s.active, s.parameters) for s in nightly.schedules)
        assert after == set_in_ui
        assert nightly.paused
    (line,) = kept
    assert line.startswith("nightly: kept the schedule set in the UI (") and "30 3 * * * Europe/Berlin" in line
    assert "0 12 * * 6 UTC (off)" in line and "not prefect.yaml's (0 2 * * *" in line, line

    # A server of another pool on this database: refused before it changes anything (Prefect names deployments
    # per flow, so it would take these over).
    with pytest.raises(ConfigError) as refused:
        create_deployments(api, env, tmp_path / "results", "flagperf-other", None, tmp_path, database=database)
    assert str(refused.value).startswith("--pool flagperf-other: the deployments evaluate, host-round, "
                                         "host-healthcheck, nightly on this database are on work pool 'flagperf'"), \
        str(refused.value)
    assert "start it with --pool flagperf" in str(refused.value) and "prefect work-pool delete flagperf" in str(
        refused.value)
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        assert nightly.work_pool_name == "flagperf" and nightly.paused
        assert sorted((s.schedule.cron, s.schedule.timezone, s.active, s.parameters)
                      for s in nightly.schedules) == set_in_ui
        # The way the refusal offers where no server uses the pool any more: deleting it frees the deployments,
        # which keep what users set (the tests that follow make the pool again).
        client.delete_work_pool("flagperf")
    assert create_deployments(api, env, tmp_path / "results", "flagperf-other", None, tmp_path,
                              [signal.SIGINT], database=database) is None  # not refused; stopped before the deploy
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        assert sorted((s.schedule.cron, s.schedule.timezone, s.active, s.parameters)
                      for s in nightly.schedules) == set_in_ui
        client.resume_deployment(nightly.id)  # the shared server's nightly, as it was

    # The deploy a server of that pool prints to be run by hand makes them on its pool (`prefect deploy --all`
    # ignores --pool: they landed on 'flagperf', and the server's next start was refused, blaming a server that
    # did not exist), keeping what users set on the nightly as the server does (plain `prefect deploy` put
    # prefect.yaml's schedule back); a server of the first pool is then refused in turn.
    created = prefect_cli("work-pool", "create", "flagperf-other", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    by_hand = subprocess.run(["bash", "-c", deploy_command(api, tmp_path / "results", "flagperf-other",
                                                           log_dir=tmp_path / "by-hand", database=database)],
                             env=env, capture_output=True, text=True, timeout=600)
    assert by_hand.returncode == 0, by_hand.stdout[-3000:] + by_hand.stderr[-3000:]
    assert "nightly: kept the schedule set in the UI (" in by_hand.stdout, by_hand.stdout
    assert not (tmp_path / "by-hand" / SAVED_SETTINGS).exists()  # saved while it deployed, removed once put back
    with get_client(sync_client=True) as client:
        pools = {name: client.read_deployment_by_name(name).work_pool_name for name in (
            "evaluate/evaluate", "nightly-regression/nightly", "host-round/host-round",
            "host-healthcheck/host-healthcheck")}
    assert set(pools.values()) == {"flagperf-other"}, pools
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly-regression/nightly")
        assert sorted((s.schedule.cron, s.schedule.timezone, s.active, s.parameters)
                      for s in nightly.schedules) == set_in_ui
    # with the served results folder in the user-facing ones' job variables, as the server gives it (it was only
    # exported to the deploy, which no run sees), beside prefect.yaml's own
    with get_client(sync_client=True) as client:
        for name in ("evaluate/evaluate", "nightly-regression/nightly"):
            env_of_runs = client.read_deployment_by_name(name).job_variables["env"]
            assert env_of_runs["FLAGPERF_RESULTS_DIR"] == str(tmp_path / "results"), (name, env_of_runs)
            assert env_of_runs["PREFECT_LOGGING_EXTRA_LOGGERS"] == "flagperf", (name, env_of_runs)
    with pytest.raises(ConfigError) as refused:
        create_deployments(api, env, tmp_path / "results", "flagperf", None, tmp_path, database=database)
    assert "on work pool 'flagperf-other'" in str(refused.value) and "start it with --pool flagperf-other" in str(
        refused.value)
    with get_client(sync_client=True) as client:
        client.delete_work_pool("flagperf-other")  # the tests that follow make theirs


@pytest.mark.parametrize("picked_up", [None, "Pending", "Running"], ids=["waiting", "pending", "running"])
def test_an_interrupted_evaluation_cancels_the_host_rounds_it_dispatched(picked_up: str | None) -> None:
    """Ctrl-C (or a cancelled evaluation) while a host's worker has, or has not yet picked up, a run the evaluation
    dispatched: the thread waiting on it cancels it (Cancelled when still waiting, by the server itself; Cancelling
    once a worker took it, on which its worker ends it, and from which the server lets it go to no Running: a forced
    Cancelled let a Pending run's process go on Running) instead of leaving it to run, or start later, unobserved."""
    import threading

    from prefect import flow
    from prefect.states import Pending, Running, Scheduled

    from flagperf.hosts.inventory import HostSpec
    from flagperf.hosts.threads import HOST_THREADS, HostThreads, RoundsStopped
    from flows.evaluate import wait_for_agent

    @flow(name="dispatched-round")
    def dispatched_round() -> None: ...

    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {"start_timeout_s": 600}})
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(dispatched_round, state=Scheduled())
        if picked_up:
            client.set_flow_run_state(run.id, Pending() if picked_up == "Pending" else Running(), force=True)
    threads = HostThreads()
    outcome: list[BaseException | None] = []

    def round_thread() -> None:
        token = HOST_THREADS.set(threads)
        try:
            threads.run(["far"], lambda: wait_for_agent(spec, run.id, "host-round/host-round"))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            HOST_THREADS.reset(token)

    thread = threading.Thread(target=round_thread)
    thread.start()
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing assumption
    while not threads.busy() and thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    threads.stop()
    thread.join(120)
    assert not thread.is_alive() and isinstance(outcome[0], RoundsStopped), outcome
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    assert state is not None and state.type.value == ("CANCELLING" if picked_up else "CANCELLED"), state
    if picked_up:  # the server made a run no worker took Cancelled itself, with no message of the proposal's
        assert "interrupted" in (state.message or "")
    if picked_up == "Pending":  # its process, started late, is refused the run: it cannot go on unseen
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Running())
            state = client.read_flow_run(run.id).state
        assert state is not None and state.type.value == "CANCELLING", state


def test_an_interrupt_does_not_cancel_a_dispatched_run_that_ended() -> None:
    """A dispatched run that ended between the waiting thread's last look and the interrupt keeps its final state
    (a forced Cancelling would turn a completed round into a cancelling one that no worker ever ends)."""
    from prefect import flow
    from prefect.states import Completed, Scheduled

    from flows.evaluate import settle_dispatched

    @flow(name="dispatched-round")
    def dispatched_round() -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(dispatched_round, state=Scheduled())
        client.set_flow_run_state(run.id, Completed(message="measured"), force=True)
        assert settle_dispatched(client, run.id, "interrupted").state.is_completed()  # type: ignore[union-attr]
        state = client.read_flow_run(run.id).state
    assert state is not None and state.is_completed() and state.message == "measured", state


def test_an_interrupt_does_not_cancel_a_dispatched_run_that_ended_after_it_was_read() -> None:
    """The run ends between settle_dispatched's read (running) and its Cancelling: the server refuses the
    transition, and the run keeps its final state."""
    from prefect import flow
    from prefect.states import Completed, Running, Scheduled

    from flows.evaluate import settle_dispatched

    @flow(name="dispatched-round")
    def dispatched_round() -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(dispatched_round, state=Scheduled())
        client.set_flow_run_state(run.id, Running(), force=True)
        seen = client.read_flow_run(run.id)  # what settle_dispatched reads: still running
        client.set_flow_run_state(run.id, Completed(message="measured"), force=True)  # then it ends

        class ReadBeforeTheEnd:
            def __getattr__(self, name: str) -> object:
                return getattr(client, name)

            reads = 0

            def read_flow_run(self, flow_run_id: object) -> object:  # the first read, before the end
                self.reads += 1
                return seen if self.reads == 1 else client.read_flow_run(flow_run_id)

        ended = settle_dispatched(ReadBeforeTheEnd(), run.id, "interrupted")  # type: ignore[arg-type]
        assert ended is not None and ended.state is not None and ended.state.is_completed(), ended  # not cancelled
        state = client.read_flow_run(run.id).state
    assert state is not None and state.is_completed() and state.message == "measured", state


def test_a_round_the_interrupt_stopped_ends_cancelled_and_is_not_retried(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A round in a host's thread whose SSH channel the interrupt closed (its command fails with an SshError once the
    stop is set): its host-round subflow and its run_case task end Cancelled (grey in the UI), not Failed (red); the
    task is not retried (max_retries=2), no result is written, and run_node reads the RoundsStopped back from the
    subflow's state. On the session's server, whose task-run states arrive as events recorded in the background:
    read until final, never right after the flow returns."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flagperf.config.plan import PLAN_FILE, plan_run
    from flagperf.hosts.ssh import SshError
    from flagperf.hosts.threads import HOST_THREADS, HostThreads, RoundsStopped
    from flagperf.results.schema import RESULT_FILE, round_dir
    from flows import host_round as host_round_module
    from tests.unit.rounds import closed_by_interrupt

    threads = HostThreads()
    calls: list[list[str]] = []
    spec, host = closed_by_interrupt(tmp_path, threads, calls)
    monkeypatch.setattr(host_round_module, "open_host", lambda spec, on_host=False: host)
    plan = plan_run(cases=["computation-FP32"], sets=["max_retries=2"], results_dir=tmp_path / "results",
                    run_id="run-a")
    case = plan.cases[0]
    assert case.max_retries == 2
    plan.run_dir.mkdir(parents=True)
    (plan.run_dir / PLAN_FILE).write_text(plan.model_dump_json())  # as the evaluation writes it
    token = HOST_THREADS.set(threads)
    try:
        state = host_round_module.host_round(run_dir=str(plan.run_dir), case=case.name, round_no=1,
                                             host=spec.model_dump(mode="json"), image={}, return_state=True)
    finally:
        HOST_THREADS.reset(token)
    assert state.is_cancelled(), state
    stopped = state.result(raise_on_failure=False)  # what run_node reads back
    assert isinstance(stopped, RoundsStopped) and isinstance(stopped.__cause__, SshError), stopped
    assert "round1@a: stopped (SshError: fp-h1: the SSH connection was closed)" in (state.message or ""), state
    flow_run_id = state.state_details.flow_run_id
    assert wait_final(flow_run_id).state.is_cancelled()  # type: ignore[union-attr]
    deadline = time.monotonic() + 300  # a guard against a hang: the server records the task's states meanwhile
    with get_client(sync_client=True) as client:
        while True:
            task_runs = [run for run in client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[flow_run_id]))) if run.name.startswith("run_case[")]
            if task_runs and all(run.state is not None and run.state.is_final() for run in task_runs):
                break
            assert time.monotonic() < deadline, task_runs
            time.sleep(0.5)
    (task_run,) = task_runs
    assert task_run.state is not None and task_run.state.is_cancelled(), task_run.state
    assert task_run.run_count == 1 and len(calls) == 1  # not retried
    assert not (round_dir(plan.run_dir, case.name, 1, "a", 0) / RESULT_FILE).exists()
