"""Rounds on a real Slurm cluster (tests/testbed/up.sh: munged, slurmctld, one slurmd per host namespace), through
the evaluate flow: a single-node case on each node, a two-node case in one job across two nodes, a run stopped
mid-round (its job cancelled, nothing left in squeue), a drained node and a job that cannot start (one-line
failures naming what Slurm says), and a two-node job whose first step (shared folder, mounts) stops it on each
node."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from prefect_api import run_evaluate, task_logs, task_runs

from flagperf.config.plan import read_plan
from flagperf.errors import InfrastructureFailure
from flagperf.results.schema import read_result
from tests.testbed.bed import SlurmBed, Testbed, deploy_project, require_slurm, slurm_session
from tests.unit.childio import output_of

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
FAST = ["min_duration_s=0.3", "warmup_iters=0", "min_iters=2"]
# This session's own names on the shared cluster: its entries (and so its jobs, flagperf-<entry>-...) and its drain
# reason carry it, so that another test session on the same bed neither finds this one's jobs nor this one its, and
# up.sh cancels the jobs and resumes the nodes only of a session that is gone (sess<pid>t<start>: slurm_session).
SESSION = slurm_session()


def named(entry: str) -> str:
    """An inventory entry's name for this session: its jobs are named after it."""
    return f"{entry}-{SESSION}"


@pytest.fixture(scope="module")
def cluster() -> tuple[Testbed, SlurmBed]:
    return require_slurm(min_nodes=2)


@pytest.fixture(scope="module")
def deployed(cluster: tuple[Testbed, SlurmBed], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project as the nodes run it: a copy of this checkout of the module's own (the jobs run as this user;
    the bed's shared deploy path may be replaced by another checkout's test run meanwhile)."""
    return deploy_project(ROOT, cluster[0], tmp_path_factory.mktemp("slurm-deploy") / "flagperf")


def inventory(tmp_path: Path, bed: Testbed, root: Path, name: str, **slurm: Any) -> str:
    """One Slurm entry, named(name), on the test bed's partition; its shared folder is under tmp_path (every node
    sees it)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700, exist_ok=True)
    assert bed.slurm is not None
    entry = {"name": named(name), "python": bed.hosts[0].python, "project_root": str(root),
             "env": {"FLAGPERF_CASE_PATH": str(root / "tests" / "fixtures" / "cases")},
             "slurm": {"partition": bed.slurm.partition, "shared_dir": str(shared), "poll_s": 0.5, **slurm}}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"vendor": "cpu", "hosts": [entry]}))
    return str(path)


def queued(prefix: str) -> list[str]:
    """Jobs squeue lists by default (pending, running, completing) whose name starts with ``prefix``."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [line for line in out.splitlines() if line.split()[1].startswith(prefix)]


def test_a_case_on_each_node_and_a_two_node_case_in_one_job(flagperf_env: Path, tmp_path: Path,
                                                             prefect_server: None, cluster: tuple[Testbed, SlurmBed],
                                                             deployed: Path) -> None:
    """One evaluation on a two-node entry: computation-FP32 as a job on each node, then digits-mlp at 2x1 as one
    job across both (DDP over gloo between two slurmds' namespaces; rank, master address and port from Slurm's
    variables inside the job)."""
    bed, slurm = cluster
    nodes = slurm.node_names[:2]
    state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32", "digits-mlp"], rounds=1,
                                  overrides=[*(f"computation-FP32.{o}" for o in FAST), "digits-mlp.nnodes=2",
                                             "digits-mlp.nproc_per_node=1", "digits-mlp.timeout_s=300"],
                                  inventory=inventory(tmp_path, bed, deployed, "pair", nodelist=nodes))
    assert state.is_completed(), state.message
    runs = task_runs(state.state_details.flow_run_id)
    digest = read_plan(run_dir).source_digest
    for node in nodes:
        slot = f"{named('pair')}-{node}"
        folder = run_dir / "computation-FP32" / "round1" / f"{slot}_noderank0"
        result = read_result(folder / "result.json")
        assert result.status == "success" and result.metrics[0].value > 0
        # A process on the node, in the deployed copy, ran the plan's code (its cases by name, wherever they lie).
        assert digest and result.provenance is not None and result.provenance.source_digest == digest
        started = json.loads((folder / "slurm-node.started.json").read_text())
        assert started["node"] == node  # the job ran on the slot's own node
        # The monitors ran inside the job, on the node, beside the case.
        footer = json.loads((folder / "monitor_system.jsonl").read_text().splitlines()[-1])
        assert footer["type"] == "footer" and footer["samples"] >= 1 and footer["reason"] == "signal"
        health = json.loads((run_dir / "hosts" / f"{slot}.health.json").read_text())
        checks = {c["name"]: c for c in health["checks"]}
        assert health["ok"] and checks["node"]["detail"].startswith(f"{node} is ")
        assert checks["partition"]["detail"].startswith(f"{slurm.partition}: State=UP")
        # The job's output is the round's task log, line by line.
        logs = task_logs(runs[f"run_case[computation-FP32/round1@{slot}]"].id)
        assert any("gemm_fp32: " in line for line in logs), logs[-10:]

    job_ids = set()
    for rank, node in enumerate(nodes):
        folder = run_dir / "digits-mlp" / "round1" / f"{named('pair')}-{node}_noderank{rank}"
        result = read_result(folder / "result.json")
        assert result.status == "success" and result.node_rank == rank
        assert result.convergence is not None and result.convergence.converged
        started = json.loads((folder / "slurm-node.started.json").read_text())
        assert (started["node"], started["rank"]) == (node, rank)
        job_ids.add(started["job_id"])
        job = json.loads((folder / "job.json").read_text())
        assert job["master_addr"] == dict(slurm.nodes)[nodes[0]] and job["nnodes"] == 2
        assert job["master_port"] == 20000 + int(started["job_id"]) % 5000
        assert (folder / f"rank{rank}.out.log").is_file()
    assert len(job_ids) == 1  # one job, not one per node
    assert queued(f"flagperf-{named('pair')}-") == []
    assert not (tmp_path / "shared" / run_dir.name).exists()  # collected, then cleaned from the shared folder


def test_a_drained_node_fails_the_healthcheck_naming_it(flagperf_env: Path, tmp_path: Path, prefect_server: None,
                                                        cluster: tuple[Testbed, SlurmBed], deployed: Path) -> None:
    bed, slurm = cluster
    node = slurm.node_names[1]
    reason = f"flagperf_test_drain_{SESSION}"
    try:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
                       check=True, timeout=60)
        state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32"], rounds=1, overrides=FAST,
                                      inventory=inventory(tmp_path, bed, deployed, "drained",
                                                          nodelist=slurm.node_names[:2]))
    finally:  # the node back to the cluster, unless it is no longer this session's drain (another's since)
        if f"Reason={reason}" in subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True,
                                                text=True, timeout=60).stdout:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=True, timeout=60)
    assert state.is_failed()
    with pytest.raises(InfrastructureFailure) as info:
        state.result()
    message = str(info.value)
    assert "\n" not in message
    assert f"host {named('drained')}-{node}: node: {node} is " in message and "DRAIN" in message, message
    assert reason in message and "State=RESUME" in message, message
    assert f"host {named('drained')}-{slurm.node_names[0]}:" not in message
    assert not (run_dir / "computation-FP32").exists()
    assert queued(f"flagperf-{named('drained')}-") == []


@pytest.fixture
def node_taken(cluster: tuple[Testbed, SlurmBed]) -> Iterator[str]:
    """The last node held by a job of its own (exclusive) for the length of a test."""
    _, slurm = cluster
    node = slurm.node_names[-1]
    job = subprocess.run(["sbatch", "--parsable", "--exclusive", f"--nodelist={node}",
                          f"--job-name=flagperf-blocker-{SESSION}", f"--partition={slurm.partition}",
                          "--output=/dev/null", "--wrap", "sleep 600"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    try:
        deadline = time.monotonic() + 120
        while "RUNNING" not in subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                              text=True, timeout=60).stdout:
            assert time.monotonic() < deadline, "the blocking job never ran"
            time.sleep(0.2)
        yield node
    finally:
        subprocess.run(["scancel", job], timeout=60)


def test_a_job_that_cannot_start_fails_naming_squeues_reason(flagperf_env: Path, tmp_path: Path,
                                                             prefect_server: None, cluster: tuple[Testbed, SlurmBed],
                                                             deployed: Path, node_taken: str) -> None:
    bed, _ = cluster
    state, _ = run_evaluate(flagperf_env, cases=["computation-FP32"], rounds=1, overrides=FAST,
                            inventory=inventory(tmp_path, bed, deployed, "waits", nodelist=[node_taken],
                                                pending_timeout_s=3))
    assert state.is_failed()
    with pytest.raises(InfrastructureFailure) as info:
        state.result()
    message = str(info.value)
    # The node is held by another job: Resources, or Priority where jobs of others wait ahead of this one on the
    # shared cluster. Never None: the controller waits for slurmctld's scheduler to give the job a reason, however
    # long after 3 s that takes on a loaded machine (tests/unit/test_slurm_spec.py makes the late reason happen).
    found = re.search(r"still PENDING after 3 s \(slurm\.pending_timeout_s; squeue reason: (\w+)\); cancelled", message)
    assert found and found.group(1) in ("Resources", "Priority"), message
    assert queued(f"flagperf-{named('waits')}-") == []


def test_a_run_stopped_mid_round_cancels_its_job(tmp_path: Path, cluster: tuple[Testbed, SlurmBed],
                                                 deployed: Path) -> None:
    """SIGTERM to `flagperf run` while the round's job runs: the job is cancelled (gone from squeue), nothing of
    it is left running on the node, and the run exits 128 + 15 with a report."""
    bed, slurm = cluster
    path = inventory(tmp_path, bed, deployed, "stopped", nodelist=slurm.node_names[:1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(FLAGPERF_WORK_ROOT=str(tmp_path / "work"), PREFECT_HOME=str(tmp_path / "prefect-home"),
               FLAGPERF_CASE_PATH=str(deployed / "tests" / "fixtures" / "cases"))
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "--inventory", path, "--cases",
                             "computation-FP32", "--set", "min_duration_s=300", "--set", "warmup_iters=0",
                             "--results", str(results)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        started: list[Path] = []
        while not started:  # the case runs on the node: its job wrote the node's start record
            assert proc.poll() is None, output_of(proc)
            assert time.monotonic() < deadline, "the round's job never started"
            started = list((tmp_path / "shared").glob("run*/computation-FP32/round1/*/attempt1/slurm-node.started"
                                                      ".json"))
            time.sleep(0.5)
        job_id = json.loads(started[0].read_text())["job_id"]
        assert [line.split()[0] for line in queued(f"flagperf-{named('stopped')}-")] == [job_id]
        # The node writes its start record before it starts the case: wait for the case's process too.
        on_node: list[psutil.Process] = []
        while not any("flagperf.entry" in " ".join(_cmdline(p)) for p in on_node):
            assert proc.poll() is None, output_of(proc)
            assert time.monotonic() < deadline, "the round's case never started on the node"
            on_node = [p for p in psutil.process_iter() if str(tmp_path / "shared") in " ".join(_cmdline(p))]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out
    # The run cancelled its job (scancel) before it exited; Slurm lists the job as COMPLETING until the node has
    # stopped its processes, which may take longer than the run's own clean-up: wait for that, on a condition.
    deadline = time.monotonic() + 120  # Slurm's KillWait (30 s) and more: a guard, not a timing assumption
    while (state := subprocess.run(["squeue", "-h", "-j", job_id, "--states=all", "-o", "%T"], capture_output=True,
                                   text=True, timeout=60).stdout.strip()) not in ("CANCELLED", ""):
        assert state == "COMPLETING" and time.monotonic() < deadline, (state, out)
        time.sleep(0.5)
    assert queued(f"flagperf-{named('stopped')}-") == [], out
    _, alive = psutil.wait_procs(on_node, timeout=60)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == [], "the job's processes outlived it"
    (run_dir,) = results.iterdir()
    assert "**interrupted** (SIGTERM)" in (run_dir / "report.md").read_text(encoding="utf-8")


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def test_hostile_words_reach_no_sbatch_directive_and_a_refused_entry_submits_nothing(
        tmp_path: Path, cluster: tuple[Testbed, SlurmBed]) -> None:
    """A newline and '#SBATCH --error=FILE' in the words of a job (its script's comment line quotes them): the
    real sbatch reads no directive from them (no FILE appears) and the job runs them as one word. An entry whose
    partition holds such text is refused before anything is submitted."""
    from flagperf.hosts.inventory import load_inventory
    from flagperf.hosts.slurm import SlurmHost

    bed, slurm = cluster
    injected = tmp_path / "injected.err"  # created by slurmd at the job's start if the directive were read
    path = Path(inventory(tmp_path, bed, ROOT, "inert", nodelist=slurm.node_names[:1]))
    (spec,) = load_inventory(path).hosts
    result = SlurmHost(spec).run(["true", f"x\n#SBATCH --error={injected}\n"], timeout=120)
    assert not injected.exists()
    assert (result.exit_code, result.timed_out) == (0, False)
    assert queued(f"flagperf-{named('inert')}-") == []

    entry = yaml.safe_load(path.read_text())
    entry["hosts"][0]["slurm"]["partition"] = f"{slurm.partition}\n#SBATCH --error={injected}"
    path.write_text(yaml.safe_dump(entry))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL="http://127.0.0.1:1/api")
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--inventory", str(path), "--cases",
                           "computation-FP32", "--results", str(tmp_path / "results")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "hosts.0.slurm.partition: " in done.stderr, done.stderr
    assert queued(f"flagperf-{named('inert')}-") == [] and not injected.exists() and not (tmp_path / "results").exists()


def test_a_partition_the_cluster_lacks_is_named_with_those_it_has(tmp_path: Path,
                                                                   cluster: tuple[Testbed, SlurmBed]) -> None:
    """A misspelt slurm.partition passes the inventory's checks (any Slurm name may be a partition): the
    healthcheck's line says which partitions the cluster has, not only that this one is not found."""
    from flagperf.hosts.inventory import load_inventory
    from flagperf.hosts.slurm import SlurmHost, check_cluster

    bed, slurm = cluster
    path = Path(inventory(tmp_path, bed, ROOT, "typo", nodelist=slurm.node_names[:1], partition="no-such-part"))
    (spec,) = load_inventory(path).hosts
    partition = next(c for c in check_cluster(SlurmHost(spec)) if c.name == "partition")
    assert not partition.ok, partition
    assert "no-such-part" in partition.detail and f"(the cluster's partitions: {slurm.partition})" in \
        partition.detail, partition


def test_a_two_node_jobs_mount_check_runs_on_each_node_and_names_it(tmp_path: Path,
                                                                    cluster: tuple[Testbed, SlurmBed]) -> None:
    """A two-node round with a container image whose vendor folder is gone once the controller resolved it, and
    whose nodes see another shared folder than the controller's (on every node: the test bed's nodes share one file
    system, so a folder missing on one node only cannot be made here, nor another shared folder, which the round's
    plan then stands for, as the nodes would find it there, not holding the controller's token;
    tests/unit/test_slurm_spec.py makes both on one node). The job's first step checks shared_dir and the folders
    on each node, outside the container (the bed has no pyxis: the round's step, which asks for the image, is never
    reached), and stops the job with exit 96; the round's failure, on each node's slot, names both nodes, shared_dir
    and the folder. The folder's name holds a quote and $(...): real srun and bash run it as one word."""
    import threading

    from flagperf.config.job import JOB_FILE
    from flagperf.hosts.inventory import load_inventory
    from flagperf.hosts.slurm import PLAN_FILE, Rank, SlurmError, SlurmHost, SlurmRuntime
    from flagperf.results.schema import ATTEMPT_FAILURE_FILE

    class OtherSharedFolder(SlurmRuntime):
        """The round's plan as nodes with another folder at shared_dir's path would find it: another file."""

        def write_job(self, host: SlurmHost, members: list[tuple[Rank, SlurmHost]], label: str) -> list[Rank]:
            ranks = super().write_job(host, members, label)
            plan = ranks[0].job_dir / PLAN_FILE
            plan.write_text(json.dumps({**json.loads(plan.read_text()), "token": "another folder's"}))
            return ranks

    bed, slurm = cluster
    nodes = slurm.node_names[:2]
    vendors = tmp_path / "ven'dors$(touch${IFS}marker)"
    (vendors / "cpu").mkdir(parents=True)
    path = Path(inventory(tmp_path, bed, ROOT, "mounts", nodelist=nodes, state_poll_s=0.5,
                          container_image="nvcr.io#nvidia/pytorch:24.05-py3"))
    entry = yaml.safe_load(path.read_text())
    entry["hosts"][0]["env"]["FLAGPERF_VENDOR_PATH"] = str(vendors)
    path.write_text(yaml.safe_dump(entry))
    hosts = [SlurmHost(spec) for spec in load_inventory(path).hosts]
    search = hosts[0].search_mounts("cpu")
    assert search is not None and [m.source for m in search.all()] == [str(vendors / "cpu")]
    (vendors / "cpu").rmdir()  # after the controller resolved it, before the job runs
    runtime = OtherSharedFolder(search)
    failures: dict[int, BaseException] = {}

    def node(rank: int) -> None:
        job_dir = tmp_path / "shared" / "run1" / f"noderank{rank}"
        job_dir.mkdir(parents=True)
        (job_dir / JOB_FILE).write_text(json.dumps({"node_rank": rank, "nnodes": 2, "run_id": "run1",
                                                    "case": "digits-mlp", "round": 1, "attempt": 1}))
        try:
            runtime.run_entry(hosts[rank], job_dir, 120, None, job_dir / "stage" / "pid")
        except BaseException as exc:  # the test reads what each node's thread raised
            failures[rank] = exc

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(failures) == [0, 1], failures
    for rank, failure in failures.items():
        message = str(failure)
        assert isinstance(failure, SlurmError) and "\n" not in message, message
        assert message.startswith(f"digits-mlp round 1 on {named('mounts')}-{nodes[rank]}: Slurm job "), message
        assert "ExitCode 96:0" in message, message
        for name in nodes:
            assert (f"flagperf-job: FLAGPERF_VENDOR_PATH's vendor folder {vendors}/cpu is missing or a link elsewhere "
                    f"on node {name}, unlike on the controller: not mounted, the job stops") in message, message
            assert (f"flagperf-job: node {name} does not see slurm.shared_dir {tmp_path / 'shared'}") in message, \
                message
        assert f"the job's plan {tmp_path / 'shared' / 'run1' / 'noderank0' / PLAN_FILE}, which the controller " \
            "wrote there, is missing or another file): its records would be lost, the job stops" in message, message
        assert (tmp_path / "shared" / "run1" / f"noderank{rank}" / ATTEMPT_FAILURE_FILE).read_text() == f"{message}\n"
    assert not list(tmp_path.rglob("marker")) and not (ROOT / "marker").exists()
    assert queued(f"flagperf-{named('mounts')}-") == []
