"""Bad input that needs the hosts' probe (a size the hosts cannot hold): `flagperf run` exits 2 with one line and
no traceback, as for bad input found before the flow, no round runs and no results folder is left behind.
The hosts the controller runs as itself are probed before any server starts; hosts over SSH are judged by
the flow, with their healthcheck's probe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect.settings import PREFECT_API_URL
from prefect_api import run_evaluate

from flagperf.config.plan import PLAN_FILE, plan_run
from flagperf.hosts.inventory import load_inventory
from flagperf.paths import PROJECT_ROOT
from flagperf.results.schema import round_dir
from tests.testbed.bed import Testbed, deploy_project, make_testbed_fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
testbed = make_testbed_fixture(min_hosts=1)
TOO_BIG = "main_memory-bandwidth.size_mib=1048576"  # 2 TiB of copy buffers


def flagperf_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", "run", *args], cwd=PROJECT_ROOT,
                          env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
                          capture_output=True, text=True, timeout=600)


def assert_refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and all(word in errors[0] for word in words), output[-3000:]
    assert "Traceback" not in output


def test_a_size_this_machine_cannot_hold_is_refused_before_the_flow(flagperf_env: Path) -> None:
    done = flagperf_run("--cases", "digits-mlp", "--set", "nproc_per_node=48", "--results", str(flagperf_env))
    assert_refused(done, "nproc_per_node", "48 processes per node")
    assert "host(s) from" not in done.stdout  # the run's first line: nothing was started
    assert not flagperf_env.exists()  # no results folder: it is made only once the input is good


def test_the_flow_refuses_a_size_before_any_round(flagperf_env: Path) -> None:
    """The flow's own check (a deployment's run has no CLI before it): bad input, nothing measured."""
    state, run_dir = run_evaluate(flagperf_env, cases=["main_memory-bandwidth"], overrides=["size_mib=1048576"])
    assert state.is_failed() and state.message.startswith("bad input: --set: main_memory-bandwidth.size_mib: "), \
        state.message
    assert not (run_dir / "main_memory-bandwidth").exists()


def test_a_size_an_ssh_host_cannot_hold_leaves_no_run_folder(tmp_path: Path, testbed: Testbed) -> None:
    """An SSH host is probed by the flow's healthcheck, after the server started and the run folder was made:
    the refusal is still one line and exit 2, and the run folder (and the results folder made for it) go."""
    deployed = deploy_project(PROJECT_ROOT, testbed)
    host = testbed.hosts[0]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [{
        "name": host.name, "address": host.address, "port": host.port, "user": host.user,
        "key_file": host.key_file, "known_hosts": testbed.known_hosts, "python": host.python,
        "project_root": str(deployed), "connect_timeout_s": 30}]}), encoding="utf-8")
    results = tmp_path / "results" / "nested"
    done = flagperf_run("--inventory", str(inventory), "--cases", "main_memory-bandwidth", "--set", TOO_BIG,
                        "--results", str(results))
    assert_refused(done, "--set: main_memory-bandwidth.size_mib", f"on host {host.name}")
    assert "host(s) from" in done.stdout  # this one did start: the host could only be judged by the flow
    assert not (tmp_path / "results").exists()

    # A retry refused so (the same work, on a host that cannot hold it) leaves the run it retried as it was: its
    # completed rounds are not this invocation's to remove.
    run_dir = tmp_path / "results" / "earlier"
    planned = plan_run(cases=["main_memory-bandwidth"], sets=[TOO_BIG], results_dir=run_dir.parent, run_id=run_dir.name,
                       hosts=[spec.model_dump(mode="json") for spec in load_inventory(inventory).hosts])
    kept = round_dir(run_dir, "main_memory-bandwidth", 1, host.name) / "result.json"
    kept.parent.mkdir(parents=True)
    kept.write_text('{"an earlier attempt": "measured"}', encoding="utf-8")
    (run_dir / PLAN_FILE).write_text(planned.model_dump_json(), encoding="utf-8")
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    done = flagperf_run("--inventory", str(inventory), "--cases", "main_memory-bandwidth", "--set", TOO_BIG,
                        "--retry", str(run_dir))
    assert_refused(done, "--set: main_memory-bandwidth.size_mib", f"on host {host.name}")
    assert "host(s) from" in done.stdout  # refused by the flow, as above, not before it
    for path, data in before.items():  # the plan is written again by the retry (its flow run's), the same work
        assert path.is_file() and (path.name == PLAN_FILE or path.read_bytes() == data), path
