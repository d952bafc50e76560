"""Evaluations across hosts with real parts: sshd in network namespaces (tests/testbed/up.sh), paramiko
with verified host keys, a real Docker engine with a locally built image, a real Prefect server."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect_api import all_task_runs, run_evaluate, task_logs

from flagperf.config.plan import read_plan
from flagperf.errors import InfrastructureFailure
from flagperf.results.schema import read_result
from tests.testbed.bed import Testbed, deploy_project, make_testbed_fixture
from tests.unit.mounts import data_folder

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
testbed = make_testbed_fixture(min_hosts=2)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def deployed(testbed: Testbed) -> Iterator[Path]:
    """The project as the test hosts run it: a deployed copy of this checkout (FLAGPERF_PATH), in a folder of its
    own (the shared one may be replaced by another session's checkout mid-run)."""
    folder = deploy_project(ROOT, testbed, f"flagperf-hosts-{os.getpid()}")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


FAST = ["min_duration_s=0.3", "warmup_iters=0", "min_iters=2"]


def host_entry(bed: Testbed, index: int, root: Path, **extra: Any) -> dict[str, Any]:
    host = bed.hosts[index]
    entry = {"name": host.name, "address": host.address, "port": host.port, "user": host.user,
             "key_file": host.key_file, "known_hosts": bed.known_hosts, "python": host.python,
             # generous: a loaded machine's sshd may take seconds to answer (a host down is given its own)
             "project_root": str(root), "connect_timeout_s": 30,
             # The fixture cases must be found on the host (and in its containers) too.
             "env": {"FLAGPERF_CASE_PATH": str(root / "tests" / "fixtures" / "cases")}}
    entry.update(extra)
    return entry


def docker_options(bed: Testbed, engine: str) -> dict[str, Any]:
    return {"runtime": "docker", "docker": {"engine": engine, "build_args": {"BASE_IMAGE": bed.base_image}}}


def write_inventory(tmp_path: Path, hosts: list[dict[str, Any]], **top: Any) -> str:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({**top, "hosts": hosts}))
    return str(path)


def master_port_on(bed: Testbed) -> int:
    """A port the OS of the master host (h1's network namespace) gave a moment ago: another session's round on
    the same test bed gets another, and with_master_port handles the rare one that took it meanwhile."""
    master = bed.hosts[0]
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    found = subprocess.run(bed.ssh_argv(master, shlex.join([master.python, "-c", code])), capture_output=True,
                           text=True, timeout=60, check=True)
    return int(found.stdout.strip())


def with_master_port(bed: Testbed, run: Callable[[int], tuple[Any, Path]]) -> tuple[Any, Path, int]:
    """``run(master_port)`` across hosts that must agree on the port before any binds it: run again on another
    port when the master's rank 0 found it taken (EADDRINUSE in its output) by the time it listened."""
    for _ in range(3):
        port = master_port_on(bed)
        state, run_dir = run(port)
        if state.is_completed() or not any("EADDRINUSE" in log.read_text(errors="replace")
                                           for log in run_dir.rglob("rank*.out.log")):
            break
    return state, run_dir, port


def test_two_ssh_hosts_run_their_rounds_in_containers(flagperf_env: Path, tmp_path: Path,
        testbed: Testbed, deployed: Path) -> None:
    inventory = write_inventory(tmp_path, [host_entry(testbed, i, deployed, **docker_options(testbed, "ssh"))
                                           for i in (0, 1)])
    state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32"], rounds=1, overrides=FAST,
                                  inventory=inventory)
    assert state.is_completed(), state.message
    tasks = {run.name: run for run in all_task_runs(state.state_details.flow_run_id)}
    names = set(tasks)
    for host in testbed.hosts[:2]:
        assert {f"healthcheck[{host.name}]", f"build_image[{host.name}]",
                f"run_case[computation-FP32/round1@{host.name}]"} <= names, sorted(names)
        # The SSH and Docker layers' own loggers land under the task run that used them.
        health_logs = task_logs(tasks[f"healthcheck[{host.name}]"].id)
        # Each line names its host: the default UI shows the flow run's log without the task of each line.
        assert any(line.startswith(f"ok   host {host.name}: ssh: reachable and authenticated")
                   for line in health_logs), health_logs
        case_logs = task_logs(tasks[f"run_case[computation-FP32/round1@{host.name}]"].id)
        assert any(line.startswith("container ") and line.endswith(f"started on {host.name}")
                   for line in case_logs), case_logs
        image_logs = task_logs(tasks[f"build_image[{host.name}]"].id)
        assert any(line.startswith(("built flagperf/cpu-pytorch:", "present flagperf/cpu-pytorch:"))
                   for line in image_logs), image_logs
        health = json.loads((run_dir / "hosts" / f"{host.name}.health.json").read_text())
        checks = {c["name"]: c for c in health["checks"]}
        assert health["ok"] and "host key verified" in checks["ssh"]["detail"]
        assert "over SSH" in checks["container engine"]["detail"] and checks["clock skew"]["ok"]
        # The accelerators are checked again where the cases run: in the image, with the rounds' options.
        assert checks["accelerators in image"]["ok"] and "in flagperf/cpu-pytorch:" in \
            checks["accelerators in image"]["detail"]
        assert f"probe_image[{host.name}]" in names
        result = read_result(run_dir / "computation-FP32" / "round1" / f"{host.name}_noderank0" / "result.json")
        assert result.status == "success" and result.metrics[0].name == "gemm_fp32" and result.metrics[0].value > 0
        image = result.provenance.image
        assert image["runtime"] == "docker" and image["tag"].startswith("flagperf/cpu-pytorch:")
        # Build args may carry tokens: what is written down is masked (a ${NAME} reference would stay).
        assert image["status"] in ("built", "present") and image["build_args"] == {"BASE_IMAGE": "<masked>"}
        # The case ran inside the image, not on the host: the result says which Python ran it.
        assert result.provenance.python.startswith("3.11")
        # The host agent detaches the monitors: they follow the connection's keepalive, sampling until the round is
        # over and they are stopped (they used to take one sample and quit, "parent-exited", before the case ran).
        monitor = [json.loads(line) for line in (run_dir / "computation-FP32" / "round1" / f"{host.name}_noderank0"
                                                 / "monitor_system.jsonl").read_text().splitlines()]
        samples = [record["t"] for record in monitor if record["type"] == "sample"]
        assert monitor[-1] == {**monitor[-1], "type": "footer", "reason": "signal", "samples": len(samples)}
        window = result.metrics[0].window
        assert len(samples) > 1 and samples[0] <= window[0] and samples[-1] >= window[1], (samples, window)
        label = f"computation-FP32/round1@{host.name}"
        assert any(line.startswith(f"{label}: monitor system stopped (exit ")
                   for line in task_logs(tasks[f"stop_monitors[{label}]"].id))
    # No container of this run is left behind, whatever happened (the engine is shared: another session's rounds
    # may be running; a round's job folder, its label, lies in the run's own scratch folder).
    import docker

    left = [c for c in docker.from_env().containers.list(all=True, filters={"label": "org.flagperf.job"})
            if f"/{run_dir.name}/" in c.labels.get("org.flagperf.job", "")]
    assert left == [], [c.labels for c in left]
    # The tag is the content hash of the Dockerfile folder and (keyed) its build args; with nothing changed,
    # asking for the image again builds nothing.
    from flagperf.config.vendors import load_vendor
    from flagperf.hosts.docker import ensure_image, image_context, image_digest, image_tag

    context = image_context(load_vendor("cpu"), "pytorch")
    build_args = {"BASE_IMAGE": testbed.base_image}
    tag = image_tag("cpu", "pytorch", image_digest(context, build_args))
    assert tag == image["tag"]
    build_lines: list[str] = []
    assert ensure_image(docker.from_env(), context, tag, build_args, build_lines.append) == "present"
    assert build_lines == []
    # The hosts' agent scans a case folder inside the deployment against the project, which a container has whole
    # (describe-paths --tree): a link in it out of the project is refused before any container starts, in one line.
    from flagperf.errors import ConfigError
    from flagperf.hosts.docker import container_settings
    from flagperf.hosts.fleet import checked_on_host
    from flagperf.hosts.inventory import load_inventory
    from flagperf.hosts.ssh import SshHost

    case = deployed / "tests" / "fixtures" / "cases" / "base" / "links-out"
    outside = deployed.with_name(f"{deployed.name}-outside.bin")
    spec = load_inventory(Path(inventory)).hosts[0]
    ssh = SshHost(spec)
    try:
        case.mkdir(mode=0o755)
        (case / "case.yaml").write_text("name: links-out\n")  # a case: a folder without one is none (not checked)
        (case / "case.yaml").chmod(0o644)
        (case / "same.py").symlink_to("../sleepy/bench.py")  # out of its folder, in the project: fine
        outside.write_bytes(b"outside")
        outside.chmod(0o644)
        # A venv's bin/python (a link to the host's Python) is none of the code; a link into a data mount leads
        # there in the container too (the agent is given the container's mount targets: --mounted).
        made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(case / "venv")],
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        with data_folder() as data:
            (case / "data").symlink_to(data)
            mounted = spec.model_copy(update={"docker": spec.docker.model_copy(update={"data_mounts": [str(data)]})})
            assert checked_on_host(container_settings(load_vendor("cpu"), mounted, "img:1", deployed,
                                                      ["base/links-out"]), ssh, mounted).search.all() == []
            with pytest.raises(ConfigError) as info:
                checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", deployed, ["base/links-out"]),
                                ssh, spec)
            assert f"{case}/data links outside the project (to {data})" in info.value.message, str(info.value)
            (case / "data").unlink()
        assert checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", deployed, ["base/links-out"]),
                               ssh, spec).search.all() == []
        (case / "ext.so").symlink_to(outside)  # a build output, which the digest leaves out: its link still counts
        with pytest.raises(ConfigError) as info:
            checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", deployed, ["base/links-out"]), ssh,
                            spec)
        assert info.value.key == "hosts.0.env.FLAGPERF_CASE_PATH" and "\n" not in str(info.value)
        assert f"on host {spec.name}: FLAGPERF_CASE_PATH case 'base/links-out': {case}/ext.so links outside the " \
            f"project (to {outside}); in a container it would dangle" in info.value.message, str(info.value)
    finally:
        ssh.close()
        shutil.rmtree(case, ignore_errors=True)
        outside.unlink(missing_ok=True)


def test_a_deployment_older_than_the_controller_is_named_in_one_line(testbed: Testbed, deployed: Path,
                                                                     tmp_path: Path) -> None:
    """A host whose deployment predates an option of the host agent the controller now sends (describe-paths --tree,
    --mounted, --bind): argparse's "unrecognized arguments" becomes one line naming the host, its project_root, the
    options and what to do, rather than the agent's usage error."""
    import re

    from flagperf.hosts.inventory import load_inventory
    from flagperf.hosts.ssh import SshError, SshHost

    older = deployed.with_name(f"{deployed.name}-older")
    shutil.rmtree(older, ignore_errors=True)
    shutil.copytree(deployed / "flagperf", older / "flagperf")
    agent = older / "flagperf" / "hosts" / "agent.py"
    text = agent.read_text()
    before = re.sub(r'\n    described\.add_argument\("--(tree|mounted)".*?"\)(?=\n)', "", text, flags=re.S)
    before = before.replace("describe_paths(args.paths, args.scan, args.tree, args.mounted)",
                            "describe_paths(args.paths, args.scan)")  # as the agent was before either option
    assert 'add_argument("--tree"' not in before and 'add_argument("--mounted"' not in before, before
    assert "args.tree" not in before, before
    agent.write_text(before)
    for folder in (older, *[p for p in older.rglob("*") if p.is_dir()]):
        folder.chmod(0o755)
    spec = load_inventory(Path(write_inventory(tmp_path, [host_entry(testbed, 0, older)]))).hosts[0]
    ssh = SshHost(spec)
    try:
        assert ssh.describe_paths([str(older)])[str(older)]["kind"] == "folder"  # what it knows, it still answers
        with pytest.raises(SshError) as info:
            ssh.describe_paths([str(older)], [str(older)], str(older), ["/data/imagenet"])
        assert str(info.value) == (
            f"host {spec.name}: its deployment at project_root {older} is older than the controller's (its "
            f"flagperf.hosts.agent describe-paths does not know --tree, --mounted): update it, copying the "
            f"controller's version of the project to {older} on {spec.name} as it was deployed (docs/hosts.md, "
            "project_root)"), str(info.value)
        # An agent that knows --mounted but not --bind (nor refuses abbreviations): a data mount still goes to it
        # (--mounted=TARGET); a -v's SOURCE:TARGET, which it would take for one path, is refused by argparse.
        before_bind = re.sub(r'\n    described\.add_argument\("--bind".*?"\)(?=\n)', "", text, flags=re.S)
        before_bind = before_bind.replace(", allow_abbrev=False", "")
        assert 'add_argument("--bind"' not in before_bind and 'add_argument("--mounted"' in before_bind
        agent.write_text(before_bind)
        ssh.describe_paths([str(older)], [str(older)], str(older), ["/data/imagenet:/data/imagenet"])
        with pytest.raises(SshError) as info:
            ssh.describe_paths([str(older)], [str(older)], str(older), ["/data/coco:/datasets/coco"])
        assert "(its flagperf.hosts.agent describe-paths does not know --bind)" in str(info.value), str(info.value)
    finally:
        ssh.close()
        shutil.rmtree(older, ignore_errors=True)


def torchless_python(bed: Testbed, folder: Path) -> str:
    """A host interpreter that has the engine's packages but no torch (FlagPerf's hosts keep torch in their
    images): a venv over the same Python whose site folder links every package of the bed's except torch's."""
    import shutil
    import subprocess

    shutil.rmtree(folder, ignore_errors=True)
    executable = next(line.split("=", 1)[1].strip() for line in
                      (Path(bed.hosts[0].python).parent.parent / "pyvenv.cfg").read_text().splitlines()
                      if line.startswith("executable"))
    subprocess.run([executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    shared = Path((Path(bed.hosts[0].python).parent.parent / "lib" / "python3.11" / "site-packages"
                   / "flagperf-testbed.pth").read_text().strip())
    site = folder / "site"
    site.mkdir()
    for entry in shared.iterdir():
        if not entry.name.startswith(("torch", "functorch")):
            (site / entry.name).symlink_to(entry)
    (folder / "venv" / "lib" / "python3.11" / "site-packages" / "no-torch.pth").write_text(f"{site}\n")
    for path in (folder, *folder.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o055)  # the hosts' user reads and runs it
    return str(folder / "venv" / "bin" / "python3")


def test_a_docker_host_without_torch_is_checked_in_its_image(flagperf_env: Path, tmp_path: Path,
        testbed: Testbed, deployed: Path) -> None:
    """A host whose own Python has no torch: the host check defers to the image, the probe in the image finds
    the device with the host's spec_settings (the peaks its rounds use), and the round runs in the container."""
    python = torchless_python(testbed, Path("/tmp/flagperf-testbed/notorch-python"))
    inventory = write_inventory(tmp_path, [host_entry(testbed, 0, deployed, python=python,
                                                      spec_settings={"clock_ghz": 3.0},
                                                      **docker_options(testbed, "local"))])
    state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32"], rounds=1, overrides=FAST,
                                  inventory=inventory)
    assert state.is_completed(), state.message
    host = testbed.hosts[0]
    health = json.loads((run_dir / "hosts" / f"{host.name}.health.json").read_text())
    checks = {c["name"]: c for c in health["checks"]}
    assert checks["accelerators"]["ok"] and checks["accelerators"]["detail"].startswith("no torch on the host")
    assert health["probe"]["libraries"]["torch"] == "not installed"
    (image_probe,) = health["image_probes"].values()  # by framework: one here
    assert checks["accelerators in image"]["ok"] and image_probe["libraries"]["torch"].startswith("2.")
    # The host's probe stopped at the missing torch; the image's built the peaks, with the host's clock.
    assert health["probe"]["peaks"] == {}
    assert "3.000 GHz (spec_settings.clock_ghz)" in image_probe["peaks"]["fp32"]["source"]
    result = read_result(run_dir / "computation-FP32" / "round1" / f"{host.name}_noderank0" / "result.json")
    assert result.status == "success" and result.metrics[0].value > 0


@pytest.mark.parametrize(("case", "metric", "convention"), [
    ("interconnect-MPI_interserver", "allreduce", "2(n-1)/n with n = 2 ranks"),
    ("interconnect-P2P_interserver", "p2p", "busbw = algbw: one direction, rank 0 -> rank 1"),
])
def test_a_multi_node_collective_across_two_hosts(flagperf_env: Path, tmp_path: Path, testbed: Testbed,
                                                  deployed: Path, case: str, metric: str, convention: str) -> None:
    """gloo between two network namespaces: node 0 on h1 is the master, node 1 on h2 connects to it."""
    def run(master_port: int) -> tuple[Any, Path]:
        inventory = write_inventory(tmp_path, [host_entry(testbed, i, deployed) for i in (0, 1)],
                                    master_port=master_port)
        return run_evaluate(flagperf_env, cases=[case], rounds=1, inventory=inventory,
                            overrides=["size_mib=4", "min_duration_s=0.5", "warmup_iters=1", "min_iters=5",
                                       "timeout_s=120"])

    state, run_dir, master_port = with_master_port(testbed, run)
    assert state.is_completed(), state.message
    first, second = testbed.hosts[0], testbed.hosts[1]
    for rank, host in enumerate((first, second)):
        folder = run_dir / case / "round1" / f"{host.name}_noderank{rank}"
        result = read_result(folder / "result.json")
        assert result.status == "success" and result.node_rank == rank
        metrics = {m.name: m for m in result.metrics}
        algbw, busbw = metrics[f"{metric}_algbw"], metrics[f"{metric}_busbw"]
        assert busbw.value > 0 and algbw.value > 0 and convention in (busbw.convention or "")
        assert "2 node(s) x 1 ranks, gloo, 4 MiB" in (busbw.note or "")
        job = json.loads((folder / "job.json").read_text())
        assert (job["master_addr"], job["master_port"], job["nnodes"]) == (first.address, master_port, 2)


def test_a_host_down_at_healthcheck_stops_the_run_naming_it(flagperf_env: Path, tmp_path: Path,
                                                            testbed: Testbed, deployed: Path) -> None:
    down = host_entry(testbed, 0, deployed, name="gone", address="10.231.0.250", connect_timeout_s=5)
    inventory = write_inventory(tmp_path, [host_entry(testbed, 0, deployed), down])
    state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32"], rounds=1, overrides=FAST,
                                  inventory=inventory)
    assert state.is_failed()
    with pytest.raises(InfrastructureFailure) as info:
        state.result()
    message = str(info.value)
    assert "host gone: ssh: cannot connect to fpagent@10.231.0.250:22" in message or \
        "host gone: ssh: no answer from fpagent@10.231.0.250:22" in message, message
    assert "[Errno None]" not in message, message  # the system's reason, not paramiko's wrapper
    assert f"host {testbed.hosts[0].name}:" not in message
    names = {run.name for run in all_task_runs(state.state_details.flow_run_id)}
    assert not any(name.startswith(("run_case", "start_monitors", "build_image")) for name in names), names
    assert not (run_dir / "computation-FP32").exists()


def test_an_ssh_hosts_case_gets_the_inventorys_env_and_no_file_gets_its_values(
        flagperf_env: Path, tmp_path: Path, testbed: Testbed, deployed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process runtime on an SSH host: a literal value and a ${NAME} reference reach the case under names
    outside the agent's allow-list (as on a local or Docker host), and neither value is written to a file."""
    literal, referenced = f"literal-{uuid.uuid4().hex}", f"referenced-{uuid.uuid4().hex}"
    monkeypatch.setenv("SSH_ENV_TEST_REFERENCE", referenced)
    entry = host_entry(testbed, 0, deployed)
    entry["env"].update({"MY_VAR": literal, "REF_VALUE": "${SSH_ENV_TEST_REFERENCE}"})
    digests = ",".join(hashlib.sha256(value.encode()).hexdigest() for value in (literal, referenced))
    state, run_dir = run_evaluate(
        flagperf_env, cases=["env-check"], inventory=write_inventory(tmp_path, [entry]),
        overrides=[f"env-check.expect_sha256={digests}", "env-check.expect_name=MY_VAR,REF_VALUE",
                   "env-check.absent=SSH_ENV_TEST_REFERENCE"])
    assert state.is_completed(), state.message
    host = testbed.hosts[0].name
    result = read_result(run_dir / "env-check" / "round1" / f"{host}_noderank0" / "result.json")
    assert {m.name: m.value for m in result.metrics} == {"inventory_env_arrived": 1.0,
                                                         "controller_secrets_leaked": 0.0}
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "job.json" for p in files) and any(p.name == "case.log" for p in files)
    for path in files:
        data = path.read_bytes()
        assert literal.encode() not in data and referenced.encode() not in data, path
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["hosts"][0]["env"]["MY_VAR"] == "<masked>"
    assert plan["hosts"][0]["env"]["REF_VALUE"] == "${SSH_ENV_TEST_REFERENCE}"


def test_a_rounds_output_is_streamed_over_ssh_not_held(tmp_path: Path, testbed: Testbed, deployed: Path) -> None:
    """Tens of MB printed on an SSH host: every line reaches the controller's line sink and the round's log
    file on the host, while what the controller's Python allocates stays a small part of that output (the
    transport kept all of it before)."""
    import tracemalloc

    from flagperf.hosts.inventory import HostSpec
    from flagperf.hosts.ssh import SshHost

    entry = host_entry(testbed, 0, deployed)
    host = SshHost(HostSpec.model_validate({**entry, "key_file": Path(entry["key_file"]),
                                            "known_hosts": Path(entry["known_hosts"]), "project_root": deployed}))
    lines, line_bytes = 300_000, 100  # 30 MB
    program = f"import sys\nline = 'x' * {line_bytes - 1} + '\\n'\nfor _ in range({lines}): sys.stdout.write(line)\n"
    log = host.work_root / f"stream-{uuid.uuid4().hex}" / "case.log"
    received = [0, 0]

    def sink(line: str) -> None:
        received[0] += 1
        received[1] += len(line) + 1

    try:
        host.client()  # connected before measuring: the connection's own buffers are not the output's
        tracemalloc.start()
        result = host.run([testbed.hosts[0].python, "-c", program], timeout=300, log_path=log, on_line=sink)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert result.exit_code == 0 and not result.timed_out
        assert received == [lines, lines * line_bytes]
        code, out, _ = host.execute(["stat", "-c", "%s", str(log)])
        assert code == 0 and int(out) == lines * line_bytes  # the round's log file on the host has all of it
        assert peak < lines * line_bytes / 10, f"controller allocated {peak} bytes for {lines * line_bytes}"
        # A folder's names, as a half round's attempt folders are found (tasks.container.attempt_records)
        assert host.list_folder(log.parent) == ["case.log"]
        with pytest.raises(FileNotFoundError):
            host.list_folder(log.parent / "missing")
    finally:
        tracemalloc.stop()
        host.remove_tree(log.parent)
        host.close()


def test_a_session_that_ends_mid_command_says_the_connection_dropped(testbed: Testbed, deployed: Path) -> None:
    """The SSH session carrying a round ends (its sshd process killed, which is how a host going down or a dropped
    link looks to the controller): the error says so, not "agent exited -1 without a status", and the host's
    agent stops the command."""
    import os
    import signal

    from flagperf.hosts.inventory import HostSpec
    from flagperf.hosts.ssh import SshError, SshHost

    entry = host_entry(testbed, 1, deployed)
    host = SshHost(HostSpec.model_validate({**entry, "key_file": Path(entry["key_file"]),
                                            "known_hosts": Path(entry["known_hosts"]), "project_root": deployed}))
    marker = f"dropped-{uuid.uuid4().hex}"

    def pids_with(text: str) -> list[int]:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue  # gone meanwhile
        return found

    def end_session(line: str) -> None:
        if line != "ready":
            return
        pid = pids_with(marker)[0]  # the agent, or the command under it (both name it)
        while not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd:"):  # up to the session's sshd
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(pid, signal.SIGTERM)

    program = f"import time\nprint('ready', flush=True)\ntime.sleep(300)  # {marker}"
    log = host.work_root / marker / "case.log"
    try:
        with pytest.raises(SshError, match=rf"host {host.name}: the SSH session ended before .* with no exit status "
                                           r"\(the connection dropped, or the host or its sshd went down\)"):
            host.run([testbed.hosts[1].python, "-c", program], timeout=300, log_path=log, on_line=end_session)
        deadline = time.monotonic() + 120
        while pids_with(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pids_with(marker), "the command outlived its session"
    finally:
        host.remove_tree(log.parent)
        host.close()


def test_a_host_closed_mid_command_ends_it_and_never_reconnects(testbed: Testbed, deployed: Path) -> None:
    """What an interrupted controller does to an SSH host whose round still runs in another thread: close() ends the
    command on the host, and the thread's next call is a clear SshError, not a silent new connection."""
    import threading

    from flagperf.hosts.inventory import HostSpec
    from flagperf.hosts.ssh import SshError, SshHost

    entry = host_entry(testbed, 1, deployed)
    host = SshHost(HostSpec.model_validate({**entry, "key_file": Path(entry["key_file"]),
                                            "known_hosts": Path(entry["known_hosts"]), "project_root": deployed}))
    marker = f"closed-{uuid.uuid4().hex}"
    ready = threading.Event()
    outcome: list[BaseException | None] = []

    def round_thread() -> None:
        try:
            program = f"import time\nprint('ready', flush=True)\ntime.sleep(300)  # {marker}"
            host.run([testbed.hosts[1].python, "-c", program], timeout=300,
                     log_path=host.work_root / marker / "case.log",
                     on_line=lambda line: ready.set() if line == "ready" else None)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=round_thread)
    thread.start()
    try:
        assert ready.wait(300), "the command never started"
        host.close()
        thread.join(300)
        assert not thread.is_alive() and outcome and isinstance(outcome[0], SshError), outcome
        with pytest.raises(SshError, match=rf"host {host.name}: its connection was closed .* not connecting again"):
            host.exists(host.work_root)
        again = SshHost(host.spec)  # a new host object (open_host's after close_hosts) connects as usual
        deadline = time.monotonic() + 120
        while marker in again.execute(["ps", "-eo", "args"])[1] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker not in again.execute(["ps", "-eo", "args"])[1], "the command outlived its closed connection"
        again.remove_tree(host.work_root / marker)
        again.close()
    finally:
        host.close()
        thread.join(10)


def test_a_docker_round_over_a_closed_ssh_host_has_its_container_removed_by_the_clean_up(testbed: Testbed,
        deployed: Path) -> None:
    """An interrupt closes the SSH host whose engine runs a round's container: the round's thread can no longer
    reach the engine and ends, leaving the container running. The clean-up (stop_host_threads with the run's
    stop_idle) removes it over a fresh connection before the host counts as cleanable; the old code's host was
    cleaned with the container still writing into its folder."""
    import docker

    from flagperf.hosts.docker import LABEL, ContainerSettings, DockerRuntime, engine_client
    from flagperf.hosts.fleet import close_hosts, host_user, open_host, stop_runs
    from flagperf.hosts.inventory import HostSpec
    from flagperf.hosts.threads import HostThreads
    from flows.evaluate import stop_host_threads

    entry = host_entry(testbed, 1, deployed, **docker_options(testbed, "ssh"))
    spec = HostSpec.model_validate({**entry, "key_file": Path(entry["key_file"]),
                                    "known_hosts": Path(entry["known_hosts"]), "project_root": deployed})
    run_id = f"run-closed-{uuid.uuid4().hex[:12]}"  # this session's: the engine is shared with other sessions
    host = open_host(spec)
    settings = ContainerSettings(image=testbed.base_image, python="python3", shm_size="64m", privileged=False, env={},
                                 device_requests=[], devices=[], data_mounts=[], extra_mounts=[], ipc_mode=None,
                                 group_add=[], ulimits={})
    runtime = DockerRuntime(settings, client_factory=partial(engine_client, host, spec), user=host_user(host),
                            scratch_root=host.work_root / run_id)
    engine = docker.from_env()
    ours = {"label": [f"{LABEL}.run={run_id}"]}
    threads = HostThreads()
    outcome: list[Any] = []
    ready = threading.Event()
    program = "import time\nprint('ready', flush=True)\ntime.sleep(600)"
    # its line comes through the log stream _run starts once the container started and was reloaded: the round's
    # thread is then in its wait (a link closed before, in start or reload, raises out of _run instead: the
    # evaluation counts that round as stopped, but this test is about the wait's end and the clean-up)
    thread = threading.Thread(target=lambda: outcome.append(threads.run([spec.name], lambda: runtime._run(
        host, ["python3", "-c", program], f"flagperf-{run_id}", {}, 600,
        lambda line: ready.set() if line == "ready" else None))))
    thread.start()
    try:
        assert ready.wait(300), "the round's container never started"
        fresh: dict[str, Any] = {}
        running_at_stop: list[Any] = []

        def stop_idle(idle: set[str]) -> dict[str, str]:
            running_at_stop.extend(engine.containers.list(filters=ours))  # its round's thread could not remove it
            fresh.update({name: open_host(spec) for name in idle})
            return stop_runs(fresh, {spec.name: spec}, run_id)

        left = stop_host_threads(threads, grace_s=300, stop_idle=stop_idle, hosts=[spec.name])
        thread.join(300)
        assert not thread.is_alive() and outcome, "the round's thread did not end when its host was closed"
        assert outcome[0][0].exit_code is None and "could not be removed" in (outcome[0][0].link or ""), outcome
        assert running_at_stop, "the round's thread removed its container over a closed host"
        assert fresh and left == set(), left  # the host is cleanable: nothing of the run runs there any more
        assert engine.containers.list(filters=ours) == []  # killed: its removal may still be under way (vfs)
        deadline = time.monotonic() + 300
        while engine.containers.list(all=True, filters=ours) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert engine.containers.list(all=True, filters=ours) == []  # and removed, as stop_run asked
    finally:
        for container in engine.containers.list(all=True, filters=ours):
            with contextlib.suppress(docker.errors.APIError):  # gone meanwhile, or its removal under way
                container.remove(force=True)
        close_hosts()
        thread.join(10)


def test_an_unknown_host_key_is_refused(flagperf_env: Path, tmp_path: Path,
        testbed: Testbed, deployed: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inventory = write_inventory(tmp_path, [host_entry(testbed, 0, deployed, known_hosts=str(empty))])
    state, _ = run_evaluate(flagperf_env, cases=["computation-FP32"], rounds=1, overrides=FAST, inventory=inventory)
    assert state.is_failed()
    with pytest.raises(InfrastructureFailure, match=r"host h1: ssh: unknown host key for 10\.231\.0\.11 "
                                                    r"\(ssh-ed25519 SHA256:.*not in .*known_hosts"):
        state.result()
    assert empty.read_text() == ""  # nothing was trusted behind the user's back


def test_accept_new_host_key_records_it_and_a_changed_key_is_always_refused(tmp_path: Path,
        testbed: Testbed, deployed: Path) -> None:
    """accept_new_host_key trusts a first-seen key and writes it to known_hosts (OpenSSH's accept-new); a key
    that differs from the recorded one is refused even then, naming both fingerprints."""
    import subprocess

    from flagperf.hosts.inventory import load_inventory
    from flagperf.hosts.ssh import SshError, SshHost

    def host_with(known_hosts: Path, accept_new: bool) -> SshHost:
        path = write_inventory(tmp_path, [host_entry(testbed, 0, deployed, known_hosts=str(known_hosts),
                                                     accept_new_host_key=accept_new)])
        return SshHost(load_inventory(Path(path)).hosts[0])

    fresh = tmp_path / "fresh_known_hosts"
    first = host_with(fresh, accept_new=True)
    try:
        assert first.clock() > 0  # connected and ran the host agent
    finally:
        first.close()
    recorded = fresh.read_text().split()
    assert recorded[0] == testbed.hosts[0].address and recorded[1] == "ssh-ed25519"
    again = host_with(fresh, accept_new=False)  # now known: the strict default connects
    try:
        assert again.clock() > 0
    finally:
        again.close()

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")], check=True)
    impostor = (tmp_path / "impostor.pub").read_text().split()
    changed = tmp_path / "changed_known_hosts"
    changed.write_text(f"{testbed.hosts[0].address} {impostor[0]} {impostor[1]}\n")
    for accept_new in (False, True):
        with pytest.raises(SshError, match=r"host h1: host key CHANGED for .*refusing to connect"):
            host_with(changed, accept_new=accept_new).client()
    assert changed.read_text().split()[2] == impostor[1]  # the recorded key is left as it was


def test_a_container_killed_mid_round_is_retried_and_the_others_kept(flagperf_env: Path, tmp_path: Path,
        testbed: Testbed, deployed: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also: the killed case is a lab's own, in a case folder outside the host's deployment (its
    FLAGPERF_CASE_PATH): its containers get that case's folder as a read-only mount of its own, under
    /flagperf-search, and every round records the plan's source digest (the case counts by its name, not by
    where the container had it). Its containers carry the controller's FLAGPERF_CONTAINER_OWNER as a label."""
    import docker

    from flagperf.hosts.docker import LABEL, OWNER_ENV

    engine = docker.from_env()
    run_id = f"run-kill-{uuid.uuid4().hex[:12]}"  # this session's: the engine is shared with other sessions
    host = testbed.hosts[0]
    marker = f"/tmp/flagperf-work-{host.user}/{run_id}/killed-once.marker"
    lab_cases = deployed.with_name(f"{deployed.name}-lab-cases")
    shutil.rmtree(lab_cases, ignore_errors=True)
    request.addfinalizer(lambda: shutil.rmtree(lab_cases, ignore_errors=True))
    shutil.copytree(ROOT / "tests" / "fixtures" / "cases" / "base" / "killed-once", lab_cases / "base" / "killed-once")
    for path in (lab_cases, *lab_cases.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the hosts' user reads it
    inventory = write_inventory(tmp_path, [host_entry(testbed, 0, deployed, env={"FLAGPERF_CASE_PATH": str(lab_cases)},
                                                      **docker_options(testbed, "local"))])
    killed: list[str] = []
    owners: list[str | None] = []
    # The bed's own (up.sh removes that owner's leftovers), else this run's: every container carries it.
    owner = os.environ.get(OWNER_ENV) or run_id
    monkeypatch.setenv(OWNER_ENV, owner)

    finished = threading.Event()

    def kill_first_container() -> None:
        while not finished.is_set() and not killed:  # until the run ends: a loaded machine starts it late
            # This run's round alone (its job folder, the label, holds the run id): another session on the same
            # engine may run this test at the same time, and its container is not ours to kill.
            for container in engine.containers.list(filters={"label": "org.flagperf.job"}):
                if f"/{run_id}/killed-once/" in container.labels.get("org.flagperf.job", "") and \
                        b"waiting to be killed" in container.logs():
                    container.kill()
                    killed.append(container.name)
                    owners.append(container.labels.get(f"{LABEL}.owner"))
            time.sleep(0.5)

    killer = threading.Thread(target=kill_first_container, daemon=True)
    killer.start()
    from flows.evaluate import evaluate

    try:
        state = evaluate(results_dir=str(flagperf_env), run_id=run_id, return_state=True, inventory=inventory,
                         cases=["killed-once", "computation-FP32"], rounds=1, overrides=[
                             f"killed-once.marker={marker}", *(f"computation-FP32.{o}" for o in FAST)])
    finally:
        finished.set()
        killer.join(timeout=60)
    assert killed, "the first attempt's container never showed up"
    assert owners == [owner], owners
    assert state.is_completed(), state.message
    run_dir = flagperf_env / run_id
    folder = run_dir / "killed-once" / "round1" / f"{host.name}_noderank0"
    result = read_result(folder / "result.json")
    assert result.status == "success" and result.provenance.attempt == 2
    first_log = (folder / "attempts" / "attempt1" / "case.log").read_text()
    assert first_log.strip().endswith("waiting to be killed")
    assert "case folder: /flagperf-search/case/0/base/killed-once\n" in first_log, first_log
    runs = {run.name: run for run in all_task_runs(state.state_details.flow_run_id)}
    run_case = runs[f"run_case[killed-once/round1@{host.name}]"]
    assert run_case.run_count == 2
    assert any("killed by signal 9" in line for line in task_logs(run_case.id))
    other = read_result(run_dir / "computation-FP32" / "round1" / f"{host.name}_noderank0" / "result.json")
    assert other.status == "success" and other.provenance.attempt == 1
    digest = read_plan(run_dir).source_digest
    assert digest and result.provenance.source_digest == digest and other.provenance.source_digest == digest
    assert runs[f"run_case[computation-FP32/round1@{host.name}]"].run_count == 1  # not run again


@pytest.mark.parametrize(("nproc", "batch_size"), [(1, 48), (2, 24)])
def test_training_across_two_hosts_converges(flagperf_env: Path, tmp_path: Path, testbed: Testbed,
                                             deployed: Path, nproc: int, batch_size: int) -> None:
    """digits-mlp at 2x1 and 2x2 (config_cpux2x<N>.yaml): DDP across two network namespaces over gloo, real
    data; every rank writes its PerfLog and the job's throughput counts all 2 x nproc processes."""
    def run(master_port: int) -> tuple[Any, Path]:
        inventory = write_inventory(tmp_path, [host_entry(testbed, i, deployed) for i in (0, 1)],
                                    master_port=master_port)
        return run_evaluate(flagperf_env, cases=["digits-mlp"], rounds=1, inventory=inventory,
                            overrides=["nnodes=2", f"nproc_per_node={nproc}", "timeout_s=300"])

    state, run_dir, _ = with_master_port(testbed, run)
    assert state.is_completed(), state.message
    for node, host in enumerate(testbed.hosts[:2]):
        folder = run_dir / "digits-mlp" / "round1" / f"{host.name}_noderank{node}"
        result = read_result(folder / "result.json")
        assert result.status == "success" and result.node_rank == node
        assert result.config["batch_size"] == batch_size  # the 2x<nproc> scale file applied
        assert result.convergence is not None and result.convergence.converged
        for rank in range(node * nproc, (node + 1) * nproc):  # global ranks of this node
            assert (folder / f"rank{rank}.out.log").is_file(), sorted(p.name for p in folder.iterdir())


def test_llama_sharded_across_two_hosts(flagperf_env: Path, tmp_path: Path, testbed: Testbed,
                                       deployed: Path) -> None:
    """llama-pretrain's tiny preset at 2x1 with FSDP2 (fully_shard over gloo): parameters sharded across two
    network namespaces; both nodes finish, evaluate the same sharded model and report per-device figures."""
    import math

    from flagperf.measure.perflog import parse_file

    def run(master_port: int) -> tuple[Any, Path]:
        inventory = write_inventory(tmp_path, [host_entry(testbed, i, deployed) for i in (0, 1)],
                                    master_port=master_port)
        return run_evaluate(flagperf_env, cases=["llama-pretrain"], rounds=1, inventory=inventory,
                            overrides=["nnodes=2", "parallel=fsdp", "batch_size=8", "synthetic_sequences=128",
                                       "max_steps=6", "max_epochs=2", "cpu_threads=1", "timeout_s=600"])

    state, run_dir, _ = with_master_port(testbed, run)
    assert state.is_completed(), state.message
    finals = []
    for node, host in enumerate(testbed.hosts[:2]):
        folder = run_dir / "llama-pretrain" / "round1" / f"{host.name}_noderank{node}"
        result = read_result(folder / "result.json")
        assert result.status == "success" and result.node_rank == node
        extra = parse_file(folder / f"rank{node}.out.log").finished()[node]["extra"]
        assert extra["parallel"] == "fsdp" and extra["world_size"] == 2 and extra["fsdp_units"] == 2
        metrics = {m.name: m for m in result.metrics}
        assert metrics["tokens_per_s_per_device"].value == pytest.approx(metrics["tokens_per_s"].value / 2)
        finals.append(result.convergence.reached)
    assert finals[0] == pytest.approx(finals[1], rel=1e-5) and finals[0] < math.log(256) - 0.3


def test_flagperf_host_yaml_runs_through_the_cli(tmp_path: Path, testbed: Testbed, deployed: Path) -> None:
    """`flagperf run --host-config host.yaml` with FlagPerf's own keys: two hosts over SSH (user and key from
    ~/.ssh/config, as FlagPerf's users have them), containers built from the vendor's Dockerfile."""
    import os
    import shutil
    import subprocess
    import sys

    import docker
    from prefect.settings import PREFECT_API_URL

    # No registry here: the test bed's base stands in for the Dockerfile's default base image.
    docker.from_env().images.get(testbed.base_image).tag("python", "3.11-slim-bookworm")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(testbed.known_hosts, home / ".ssh" / "known_hosts")
    first, second = testbed.hosts[0], testbed.hosts[1]
    (home / ".ssh" / "config").write_text(f"Host 10.231.0.*\n  User {first.user}\n  IdentityFile {first.key_file}\n")
    host_yaml = tmp_path / "host.yaml"
    host_yaml.write_text(yaml.safe_dump({
        "FLAGPERF_PATH": str(deployed), "FLAGPERF_LOG_PATH": "result", "VENDOR": "cpu",
        "FLAGPERF_LOG_LEVEL": "INFO",
        "HOSTS": [first.address, second.address], "SSH_PORT": "22", "HOSTS_PORTS": ["2222"],
        # MASTER_PORT is never bound: computation-FP32 is a single-node case.
        "MASTER_PORT": "29613", "SHM_SIZE": "1G", "ACCE_CONTAINER_OPT": "", "CLEAR_CACHES": True,
        "ACCE_VISIBLE_DEVICE_ENV_NAME": "CUDA_VISIBLE_DEVICES", "CASES": {"computation-FP32": "pytorch"}}))
    env = {**os.environ, "HOME": str(home), "PREFECT_API_URL": PREFECT_API_URL.value()}
    run = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--host-config", str(host_yaml), "--set",
                          "min_duration_s=0.3", "--set", "warmup_iters=0", "--set", "min_iters=2"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "CLEAR_CACHES is not used" in run.stderr and "2 host(s)" in run.stdout
    (run_dir,) = (tmp_path / "result").glob("run*")  # FLAGPERF_LOG_PATH, relative to where it was started
    for address in (first.address, second.address):
        result = read_result(run_dir / "computation-FP32" / "round1" / f"{address}_noderank0" / "result.json")
        assert result.status == "success" and result.provenance.image["runtime"] == "docker"
        assert result.provenance.image["tag"].startswith("flagperf/cpu-pytorch:")
