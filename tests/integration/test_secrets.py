"""Secrets planted in the controller's environment and in an inventory reach no file of the run, no Prefect
parameter and no log: the case gets the inventory's variables, and none of the controller's credentials."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect_api import flow_run_tree, run_evaluate

from flagperf.results.schema import read_result
from tests.testbed.bed import Testbed, make_testbed_fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


def test_planted_secrets_are_used_but_never_written_down(flagperf_env: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {name: f"planted-{name.lower()}-{uuid.uuid4().hex}" for name in
               ("LITERAL", "REFERENCED", "PGPASSWORD", "MY_SERVICE_TOKEN", "BUILD_ARG")}
    monkeypatch.setenv("PGPASSWORD", secrets["PGPASSWORD"])
    monkeypatch.setenv("MY_SERVICE_TOKEN", secrets["MY_SERVICE_TOKEN"])
    monkeypatch.setenv("SERVICE_SECRET_REF", secrets["REFERENCED"])
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [{
        "name": "localhost", "transport": "local",
        "env": {"LITERAL_TOKEN": secrets["LITERAL"], "REF_TOKEN": "${SERVICE_SECRET_REF}"},
        "docker": {"build_args": {"TOKEN": secrets["BUILD_ARG"]}, "extra_options": f"-e X={secrets['LITERAL']}"},
    }]}))
    digest = hashlib.sha256(secrets["LITERAL"].encode()).hexdigest()
    state, run_dir = run_evaluate(
        flagperf_env, cases=["env-check", "digits-infer"], inventory=str(inventory),
        overrides=[f"env-check.expect_sha256={digest}", "env-check.expect_name=LITERAL_TOKEN",
                   "env-check.absent=PGPASSWORD,MY_SERVICE_TOKEN,SERVICE_SECRET_REF"])
    assert state.is_completed(), state.message

    result = read_result(run_dir / "env-check" / "round1" / "localhost_noderank0" / "result.json")
    verdicts = {m.name: m.value for m in result.metrics}
    assert verdicts == {"inventory_env_arrived": 1.0, "controller_secrets_leaked": 0.0}
    assert (run_dir / "digits-infer" / "round1" / "localhost_noderank0" / "job.json").is_file()

    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 10
    for path in files:
        data = path.read_bytes()
        for name, secret in secrets.items():
            assert secret.encode() not in data, f"{name} found in {path}"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["hosts"][0]["env"] == {"LITERAL_TOKEN": "<masked>", "REF_TOKEN": "${SERVICE_SECRET_REF}"}

    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        tree = flow_run_tree(flow_run_id)
        stored = [json.dumps(client.read_flow_run(run_id).parameters, default=str) for run_id in tree]
        logs = [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=tree)))]
    assert len(tree) >= 3 and logs  # the evaluation, its host rounds and the inference steps
    for text in stored + logs:
        for name, secret in secrets.items():
            assert secret not in text, f"{name} found in a stored parameter or log line"


testbed = make_testbed_fixture(min_hosts=0)


def test_a_weak_build_arg_secret_cannot_be_read_back_from_tags_records_or_logs(
        flagperf_env: Path, tmp_path: Path, testbed: Testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A guessable build-arg value: not in any file of the run, its tag or its logs, plainly or as the plain hash
    a guess could be checked against offline; the tag still follows the build args, through this machine's key
    (kept outside the project and the run)."""
    from flagperf.config.vendors import load_vendor
    from flagperf.hosts.docker import build_args_key_file, context_digest, image_context

    # A key of the test's own (fixed: the image built with it is found again by the next test session).
    key_file = tmp_path / "config" / "digest.key"
    key_file.parent.mkdir()
    key_file.write_bytes(hashlib.sha256(b"flagperf test digest key").digest())
    monkeypatch.setenv("FLAGPERF_DIGEST_KEY_FILE", str(key_file))
    weak = "hunter2"
    build_args = {"BASE_IMAGE": testbed.base_image, "TOKEN": weak}
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [{
        "name": "localhost", "transport": "local", "runtime": "docker",
        "docker": {"engine": "local", "build_args": build_args}}]}))
    state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32"], inventory=str(inventory),
                                  overrides=["min_duration_s=0.3", "warmup_iters=0", "min_iters=2"])
    assert state.is_completed(), state.message

    context = image_context(load_vendor("cpu"), "pytorch")
    files_digest = context_digest(context)
    # What the old tag was made of: a plain hash of the context and the args, checkable against guesses.
    plain = hashlib.sha256()
    plain.update(b"".join(p.relative_to(context).as_posix().encode() + b"\0" + p.read_bytes() + b"\0"
                          for p in sorted(q for q in context.rglob("*") if q.is_file())))
    for key, value in sorted(build_args.items()):
        plain.update(f"ARG {key}={value}\0".encode())
    guessable = {weak, plain.hexdigest()[:16], hashlib.sha256(weak.encode()).hexdigest()[:16]}

    result = read_result(run_dir / "computation-FP32" / "round1" / "localhost_noderank0" / "result.json")
    image = result.provenance.image
    tag = image["tag"]
    assert image["context_sha256"] == files_digest and image["build_args"] == {"BASE_IMAGE": "<masked>",
                                                                                  "TOKEN": "<masked>"}
    assert tag.startswith("flagperf/cpu-pytorch:") and tag.rsplit(":", 1)[1] != files_digest[:16]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "job.json" for p in files) and any(p.name == "result.json" for p in files)
    with get_client(sync_client=True) as client:
        tree = flow_run_tree(state.state_details.flow_run_id)
        logs = [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=tree)))]
    assert any(tag in line for line in logs)
    for text, where in ([(p.read_bytes().decode("utf-8", "replace"), str(p)) for p in files]
                        + [(line, "a log line") for line in logs] + [(tag, "the tag")]):
        for secret in guessable:
            assert secret not in text, f"{secret} in {where}"
    assert not build_args_key_file().is_relative_to(run_dir)


def _command_lines_holding(secret: str) -> list[str]:
    """Every process on this machine (the test bed's hosts share its process table) whose command line holds
    ``secret``: what anyone on the host can read with ``ps``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if secret.encode() in line:
            found.append(line.replace(b"\0", b" ").decode(errors="replace")[:200])
    return found


def test_an_ssh_hosts_inventory_secrets_reach_the_case_by_the_channel_not_a_command_line(
        testbed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values of an SSH host's inventory env (an HF token, an endpoint key) reach the case, and are in no
    command the controller has sshd run (a shell's command line: ``ps`` shows it to every user of the host), for
    a round (agent run), a monitor (agent spawn) and the agent's small commands alike."""
    import threading

    import paramiko

    from flagperf.hosts.inventory import HostSpec
    from flagperf.hosts.ssh import SshHost
    from tests.testbed.bed import deploy_project

    if not testbed.hosts:
        pytest.skip("the test bed has no SSH hosts")
    root = deploy_project(Path(__file__).resolve().parents[2], testbed, name="secrets-ssh")  # this checkout's own
    bed_host = testbed.hosts[0]
    secrets = {"HF_TOKEN": f"hf-{uuid.uuid4().hex}", "VLLM_API_KEY": f"key-{uuid.uuid4().hex}"}
    host = SshHost(HostSpec(name=bed_host.name, address=bed_host.address, port=bed_host.port, user=bed_host.user,
                            key_file=Path(bed_host.key_file), known_hosts=Path(testbed.known_hosts),
                            python=bed_host.python, project_root=root, env=secrets))
    sent: list[str] = []
    real_exec = paramiko.Channel.exec_command

    def recording_exec(channel: paramiko.Channel, command: str) -> None:
        sent.append(command)
        real_exec(channel, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", recording_exec)
    seen: list[str] = []
    done = threading.Event()

    def watch_ps() -> None:  # a second witness, of what the host's users see
        while not done.is_set():
            seen.extend(_command_lines_holding(secrets["HF_TOKEN"]))

    watcher = threading.Thread(target=watch_ps, daemon=True)
    watcher.start()
    code = ("import hashlib, os; print(*(hashlib.sha256(os.environ.get(n, '').encode()).hexdigest() "
            "for n in ('HF_TOKEN', 'VLLM_API_KEY')))")
    lines: list[str] = []
    try:
        host.info()
        host.controller_pid()
        result = host.run([bed_host.python, "-c", code], timeout=60, log_path=host.work_root / "secrets-run.log",
                          on_line=lines.append)
        spawned = host.spawn([bed_host.python, "-c", code], log_path=host.work_root / "secrets-spawn.log")
        deadline = time.monotonic() + 60
        while host.is_running(spawned) and time.monotonic() < deadline:  # it ends by itself, at once
            pass
        spawn_log = host.read_text(host.work_root / "secrets-spawn.log")
    finally:
        done.set()
        watcher.join()
        host.close()
    expected = " ".join(hashlib.sha256(v.encode()).hexdigest() for v in secrets.values())
    assert result.exit_code == 0 and lines[-1] == expected, lines
    assert expected in spawn_log
    assert len(sent) >= 5
    for command in sent:
        for name, secret in secrets.items():
            assert secret not in command, f"{name} on the command line {command[:120]}"
    assert not seen, seen


def test_a_containers_inventory_secrets_reach_the_case_by_a_private_file_not_its_config(
        testbed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inventory's variables of a Docker host (env, and -e in docker.extra_options) reach the case, and are
    neither in the container's config (``docker inspect`` shows it to every user of the engine) nor on its
    command line: they come by a file of the host's, mode 0600 and removed with the container."""
    import os
    import stat

    import docker
    from docker.models.containers import Container

    from flagperf.config.vendors import load_vendor
    from flagperf.hosts.docker import ENV_FILE_IN_CONTAINER, DockerRuntime, container_settings
    from flagperf.hosts.inventory import HostSpec
    from flagperf.hosts.local import LocalHost

    secrets = {"HF_TOKEN": f"hf-{uuid.uuid4().hex}", "VLLM_API_KEY": f"key-{uuid.uuid4().hex}"}
    spec = HostSpec(name="localhost", transport="local", runtime="docker", env={"HF_TOKEN": secrets["HF_TOKEN"]},
                    docker={"engine": "local", "extra_options": f"-e VLLM_API_KEY={secrets['VLLM_API_KEY']}"})
    settings = container_settings(load_vendor("cpu"), spec, testbed.base_image)
    host = LocalHost(work_root=tmp_path / "work")
    client = docker.DockerClient(base_url=testbed.docker_host)
    runtime = DockerRuntime(settings, client_factory=lambda: client, user=f"{os.getuid()}:{os.getgid()}",
                            scratch_root=host.work_root / "run-secrets")
    inspected: list[dict] = []
    env_files: list[tuple[Path, int]] = []
    real_reload = Container.reload

    def inspecting_reload(container: Container) -> None:  # what `docker inspect` shows of the running container
        real_reload(container)
        inspected.append(container.attrs)
        for mount in container.attrs["Mounts"]:
            if mount["Destination"] == ENV_FILE_IN_CONTAINER:
                env_files.append((Path(mount["Source"]), stat.S_IMODE(os.stat(mount["Source"]).st_mode)))

    monkeypatch.setattr(Container, "reload", inspecting_reload)
    code = ("import hashlib, os; print(*(hashlib.sha256(os.environ.get(n, '').encode()).hexdigest() "
            "for n in ('HF_TOKEN', 'VLLM_API_KEY')))")
    try:
        result, lines = runtime._run(host, ["python3", "-c", code], f"flagperf-secrets-{uuid.uuid4().hex[:12]}",
                                     {}, 300, None)
    finally:
        client.close()
    expected = " ".join(hashlib.sha256(v.encode()).hexdigest() for v in secrets.values())
    assert result.exit_code == 0 and lines[-1:] == [expected], lines
    assert inspected
    config = json.dumps(inspected)
    for name, secret in secrets.items():
        assert secret not in config, f"{name} in the container's config (docker inspect)"
    assert len(env_files) == 1 and env_files[0][1] == 0o600, env_files
    assert not env_files[0][0].exists()


def test_a_slurm_entrys_inventory_secrets_reach_the_job_by_a_private_file_not_sbatchs_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Slurm entry's env (an HF token) reaches the job's step, and is neither in the environment sbatch is given
    (Slurm keeps a batch job's environment: slurmctld's state, and ``sacct --env-vars`` where the accounting keeps
    job environments) nor in the job script: it comes by a 0600 file the script reads and removes."""
    import os
    import stat

    from flagperf.hosts import slurm
    from flagperf.hosts.inventory import HostSpec
    from tests.testbed.bed import require_slurm, slurm_session

    bed, cluster = require_slurm(min_nodes=1)
    secret = f"hf-{uuid.uuid4().hex}"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    # the session's tag in its job's name: a killed session's job is cancelled by up.sh, a live one's is not
    spec = HostSpec(name=f"slurmsecrets-{slurm_session()}", python=bed.hosts[0].python, project_root=tmp_path,
                    env={"HF_TOKEN": secret},
                    slurm={"partition": cluster.partition, "shared_dir": str(shared), "poll_s": 0.2})
    submitted: list[tuple[str, str, list[int]]] = []
    real_tool = slurm.slurm_tool

    def recording_tool(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
        if argv[0] == "sbatch":
            script = Path(argv[-1]).read_text()
            files = [stat.S_IMODE(p.stat().st_mode) for p in shared.rglob("inventory-env.sh")]
            submitted.append((json.dumps(env) + " ".join(argv), script, files))
        return real_tool(argv, timeout_s, env)

    monkeypatch.setattr(slurm, "slurm_tool", recording_tool)
    host = slurm.SlurmHost(spec)
    code = "import hashlib, os; print(hashlib.sha256(os.environ.get('HF_TOKEN', '').encode()).hexdigest())"
    lines: list[str] = []
    result = host.run([bed.hosts[0].python, "-c", code], timeout=120, on_line=lines.append)
    assert result.exit_code == 0 and lines[-1:] == [hashlib.sha256(secret.encode()).hexdigest()], lines
    assert len(submitted) == 1
    sbatch_given, script, modes = submitted[0]
    assert secret not in sbatch_given and secret not in script
    assert modes == [0o600]
    assert not any(secret.encode() in p.read_bytes() for p in shared.rglob("*") if p.is_file())
    assert os.environ.get("HF_TOKEN") != secret
