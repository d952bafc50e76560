"""Inventories: the native format, FlagPerf's host.yaml with FlagPerf's meaning, and their errors."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flagperf.config.files import MAX_FILE_BYTES
from flagperf.config.vendors import load_vendor
from flagperf.errors import ConfigError
from flagperf.hosts.container_policy import parse_container_options
from flagperf.hosts.docker import (
    build_args_digest,
    container_settings,
    context_digest,
    exit_code_of,
    image_digest,
    image_tag,
)
from flagperf.hosts.inventory import load_inventory
from flagperf.paths import display_path


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_native_inventory_merges_defaults_and_expands_paths(tmp_path: Path) -> None:
    key = write(tmp_path, "id_test", "not a real key")
    inv = load_inventory(write(tmp_path, "inv.yaml", """
vendor: cpu
master_port: 29600
defaults:
  user: bench
  key_file: id_test
  runtime: docker
  docker: {build_args: {BASE_IMAGE: local/base:1}}
hosts:
  - name: n1
    address: 10.0.0.1
  - name: n2
    address: 10.0.0.2
    port: 2222
    docker: {data_mounts: [/data]}
    agent: {}
  - name: here
    address: localhost
"""))
    n1, n2, here = inv.hosts
    assert (n1.transport, n1.user, n1.key_file, n1.runtime) == ("ssh", "bench", key.resolve(), "docker")
    assert n1.docker.engine == "ssh" and n1.docker.build_args == {"BASE_IMAGE": "local/base:1"}
    # A host's own docker block is merged into the defaults' one, not replacing it.
    assert n2.docker.build_args == {"BASE_IMAGE": "local/base:1"} and n2.docker.data_mounts == ["/data"]
    assert n2.port == 2222 and n2.queue == "host-n2" and n1.queue is None
    assert here.transport == "local" and here.docker.engine == "local"
    assert inv.vendor == "cpu" and inv.master_port == 29600
    assert inv.resolve_vendor(None) == "cpu"
    with pytest.raises(ConfigError, match="the inventory is for vendor 'cpu', the run asks for 'nvidia'"):
        inv.resolve_vendor("nvidia")


@pytest.mark.parametrize(("body", "key", "message"), [
    ("hosts: []", "hosts", "at least 1"),
    ("hosts: [{name: a, address: '-oProxyCommand=x'}]", "hosts.0.address", "not a host name"),
    ("hosts: [{name: 'a b'}]", "hosts.0.name", "host name"),
    ("hosts: [{name: a, address: h, password: x}]", "hosts.0.password", "unknown key"),
    ("hosts: [{name: a, address: h}, {name: a, address: g}]", "hosts", "unique"),
    ("hosts: [{name: a, address: h, key_file: /nonexistent/key}]", "hosts.0.key_file", "does not exist"),
    ("hosts: [{name: a, address: h, python: 'python3; rm -rf /'}]", "hosts.0.python", "not a program"),
    ("hosts: [{name: a, address: h, env: {'A B': x}}]", "hosts.0.env", "not valid"),
    ("hosts: [{name: a, address: localhost, docker: {engine: ssh}}]", "hosts.0", "needs an SSH host"),
    # A key written under defaults is named there, with the nearest accepted keys for a misspelling.
    ("defaults: {known_host: /k}\nhosts: [{name: a, address: h}]", "defaults.known_host",
     "unknown key (did you mean known_hosts?)"),
    ("defaults: {runtime: proces}\nhosts: [{name: a, address: h}]", "defaults.runtime", "'process' or 'docker'"),
    ("hosts: [{nmae: a, address: h}]", "hosts.0.nmae", "unknown key (did you mean name?)"),  # not "name: missing"
    ("defaults: {docker: {enigne: ssh}}\nhosts: [{name: a, address: h, docker: {build_args: {}}}]",
     "defaults.docker.enigne", "did you mean engine?"),
    ("defaults: {docker: {engine: ssh}}\nhosts: [{name: a, address: h, docker: {enigne: ssh}}]",
     "hosts.0.docker.enigne", "did you mean engine?"),
])
def test_bad_inventories_name_the_file_and_key(tmp_path: Path, body: str, key: str, message: str) -> None:
    path = write(tmp_path, "inv.yaml", body)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.key == key and message in info.value.message, str(info.value)
    assert "inv.yaml" in str(info.value)


@pytest.mark.parametrize("project_root", [
    "opt/flagperf", "~/flagperf", "/opt/../etc", "/opt/flagperf,/:/host", "/opt/flag:perf", "/opt/flag%jperf",
    "/opt/flagperf\n#SBATCH --uid=0", "/opt/flag\0perf", "/", "",
])
def test_project_root_is_one_folder_every_transport_can_use(tmp_path: Path, project_root: str) -> None:
    """project_root is the hosts' working folder, a container mount (Docker's, Slurm's --container-mounts list)
    and PYTHONPATH: an SSH/Docker host's is held to the same rule as a Slurm entry's, and as FlagPerf's
    FLAGPERF_PATH in a host.yaml, each error naming the key as written."""
    quoted = '"' + project_root.replace("\\", "\\\\").replace("\n", "\\n").replace("\0", "\\0") + '"'
    for body, key in ((f"hosts: [{{name: a, address: h, runtime: docker, project_root: {quoted}}}]",
                       "hosts.0.project_root"),
                      (f"defaults: {{project_root: {quoted}}}\nhosts: [{{name: a, address: h}}]",
                       "defaults.project_root"),
                      (f"VENDOR: cpu\nHOSTS: [h]\nCASES: {{computation-FP32: pytorch}}\nFLAGPERF_PATH: {quoted}",
                       "FLAGPERF_PATH")):
        if key == "FLAGPERF_PATH" and not project_root:
            continue  # an empty FLAGPERF_PATH is FlagPerf's "not set": the controller's project
        with pytest.raises(ConfigError) as info:
            load_inventory(write(tmp_path, "inv.yaml", body))
        assert info.value.key == key and "must be an absolute path without '..'" in info.value.message, str(info.value)
        assert "inv.yaml" in str(info.value) and "\n" not in str(info.value)


def test_project_root_is_kept_normalised(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "inv.yaml", "hosts: [{name: a, address: h, project_root: /opt//fp/./x/}]"))
    assert str(inv.hosts[0].project_root) == "/opt/fp/x"


@pytest.mark.parametrize("key", ["key_file", "known_hosts", "ssh_config"])
@pytest.mark.parametrize("kind", ["fifo", "folder", "huge"])
def test_the_files_paramiko_reads_are_regular_and_bounded(tmp_path: Path, key: str, kind: str) -> None:
    """An SSH host's key, known_hosts and client config are read when the host is reached: a FIFO there would
    block, /dev/zero or a huge file fill memory. Each is refused with the inventory, naming its key."""
    path = tmp_path / "file"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        with path.open("wb") as out:  # a hole: no disk used, never read
            out.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(ConfigError) as info:
        load_inventory(write(tmp_path, "inv.yaml", f"hosts: [{{name: a, address: h, {key}: {path}}}]"))
    why = {"fifo": "named pipe (FIFO)", "folder": "is a directory", "huge": f"at most {MAX_FILE_BYTES} bytes"}[kind]
    assert info.value.key == f"hosts.0.{key}" and why in info.value.message, str(info.value)


def test_the_ssh_client_config_is_read_bounded_when_the_host_is_reached(tmp_path: Path) -> None:
    config = write(tmp_path, "ssh_config", "Host gpu1\n  User bench\n  Port 2200\n  HostName 10.0.0.9\n")
    inv = load_inventory(write(tmp_path, "inv.yaml", f"hosts: [{{name: a, address: gpu1, ssh_config: {config}}}]"))
    spec = inv.hosts[0].with_ssh_config()
    assert (spec.user, spec.port, spec.address) == ("bench", 2200, "10.0.0.9")
    config.unlink()
    os.mkfifo(config)  # made a FIFO after the inventory was read: refused, not read (reading would block)
    with pytest.raises(ConfigError) as info:
        inv.hosts[0].with_ssh_config()
    assert info.value.key == "hosts.0.ssh_config" and "named pipe" in info.value.message


def test_the_key_the_ssh_client_config_names_is_regular_too(tmp_path: Path) -> None:
    """The IdentityFile of the client config is the key paramiko reads when the inventory names none: a FIFO there
    is refused in one line naming ssh_config, never read (reading would block the connection)."""
    key = tmp_path / "id_fifo"
    os.mkfifo(key)
    config = write(tmp_path, "ssh_config", f"Host gpu1\n  IdentityFile {key}\n")
    inv = load_inventory(write(tmp_path, "inv.yaml", f"hosts: [{{name: a, address: gpu1, ssh_config: {config}}}]"))
    with pytest.raises(ConfigError) as info:
        inv.hosts[0].with_ssh_config()
    assert info.value.key == "hosts.0.ssh_config" and f"IdentityFile {key}: " in info.value.message
    assert "named pipe" in info.value.message
    key.unlink()
    key.write_text("not read here\n")
    assert inv.hosts[0].with_ssh_config().key_file == key


def test_the_digest_key_file_is_never_read_unless_regular(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "digest.key"
    os.mkfifo(key_file)
    monkeypatch.setenv("FLAGPERF_DIGEST_KEY_FILE", str(key_file))
    with pytest.raises(ConfigError, match="named pipe"):
        build_args_digest({"BASE_IMAGE": "x"})


def test_the_context_digest_reads_files_in_pieces_with_the_same_digest(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "big.whl").write_bytes(os.urandom(3 << 20))
    whole = hashlib.sha256()
    for name in ("Dockerfile", "big.whl"):
        whole.update(name.encode() + b"\0" + (tmp_path / name).read_bytes() + b"\0")
    assert context_digest(tmp_path) == whole.hexdigest()


def test_flagperf_host_yaml_keeps_flagperf_meaning(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "host.yaml", """
FLAGPERF_PATH: /home/flagperf
FLAGPERF_LOG_PATH: result
VENDOR: cpu
FLAGPERF_LOG_LEVEL: info
HOSTS: ["192.168.1.2", "192.168.1.3"]
SSH_PORT: "22"
HOSTS_PORTS: ["2222"]
MASTER_PORT: "29501"
SHM_SIZE: "32G"
ACCE_CONTAINER_OPT: " --gpus all"
PIP_SOURCE: "https://mirror.baidu.com/pypi/simple"
CLEAR_CACHES: True
ACCE_VISIBLE_DEVICE_ENV_NAME: "CUDA_VISIBLE_DEVICES"
CASES:
  "computation-FP32": "pytorch_2.3"
  "main_memory-bandwidth:A100": "pytorch"
"""))
    assert [h.address for h in inv.hosts] == ["192.168.1.2", "192.168.1.3"]
    first = inv.hosts[0]
    assert (first.port, first.runtime, first.shm_size, str(first.project_root)) == (22, "docker", "32g",
                                                                                     "/home/flagperf")
    assert first.visible_devices_env == "CUDA_VISIBLE_DEVICES" and first.docker.extra_options == " --gpus all"
    assert inv.vendor == "cpu" and inv.master_port == 29501 and inv.results_dir == "result"
    assert inv.cases == ["computation-FP32", "main_memory-bandwidth"]
    assert inv.frameworks == {"computation-FP32": "pytorch", "main_memory-bandwidth": "pytorch"}
    # Keys used differently here are accepted and said, not silently dropped.
    assert any("CLEAR_CACHES is not used" in note for note in inv.notes)
    assert any("HOSTS_PORTS is not used" in note for note in inv.notes)
    # ACCE_CONTAINER_OPT's --gpus all becomes a device request, the visible-devices name the host's.
    settings = container_settings(load_vendor("cpu"), first.model_copy(update={"visible_devices": "0,1"}), "img:1")
    assert settings.device_requests == [{"driver": "nvidia", "capabilities": [["gpu"]], "count": -1}]
    assert settings.env["CUDA_VISIBLE_DEVICES"] == "0,1" and settings.shm_size == "32g"
    assert settings.privileged is False


def test_inference_style_cases_mount_their_data(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "host.yaml", """
VENDOR: cpu
HOSTS: ["10.1.2.155"]
CASES:
  "resnet50:pytorch_1.13": "/raid/dataset/ImageNet/imagenet/val"
"""))
    # FlagPerf's meaning: a data folder names an inference case (not the training resnet50), and is its data_dir.
    assert inv.cases == ["resnet50-infer"] and inv.frameworks == {"resnet50-infer": "pytorch"}
    assert inv.hosts[0].docker.data_mounts == ["/raid/dataset/ImageNet/imagenet/val"]
    assert inv.case_overrides == {"resnet50-infer.data_dir": "/raid/dataset/ImageNet/imagenet/val"}


@pytest.mark.parametrize(("body", "key", "message"), [
    ("VENDOR: cpu\nHOSTS: []\nCASES: {bert: pytorch}", "HOSTS", "non-empty list"),
    ("VENDOR: cpu\nHOSTS: [h]\nCASES: {bert: pytorch}\nSSH_PORT: abc", "SSH_PORT", "port number"),
    ("VENDOR: cpu\nHOSTS: [h]\nCASES: {bert: pytorch}\nACCE_CONTAINER_OPT: ' --privileged'", "ACCE_CONTAINER_OPT",
     "vendor file declares"),
    ("VENDOR: cpu\nHOSTS: [h]\nCASES: {bert: pytorch}\nACCE_CONTAINER_OPT: ' --cap-add ALL'", "ACCE_CONTAINER_OPT",
     "unsupported docker option"),
    ("VENDOR: cpu\nHOSTS: [h]\nCASES: {bert: pytorch}\nNO_SUCH_KEY: 1", "NO_SUCH_KEY", "unknown key"),
    ("VENDOR: cpu\nHOSTS: [h]\nCASES: {'a;b': pytorch}", "CASES.a;b", "case name"),
    ("VENDOR: cpu\nHOSTS: [h]\nCASES: {bert: pytorch}\nNPROC_PER_NODE: 0", "NPROC_PER_NODE", "whole number"),
    ("VENDOR: cpu\nHOSTS: [h]\nCASES: {bert: pytorch}\nNPROC_PER_NODE: '8'", "NPROC_PER_NODE", "whole number"),
])
def test_bad_host_yaml(tmp_path: Path, body: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_inventory(write(tmp_path, "host.yaml", body))
    assert info.value.key == key and message in info.value.message, str(info.value)


def test_container_options_are_parsed_never_passed_to_a_shell() -> None:
    extras = parse_container_options("--gpus=all --device /dev/davinci0 -e A=1 --env B='x y' -v /data/d:/d:ro "
                                     "--ipc host --group-add video")
    assert extras.gpus == "all" and extras.devices == ["/dev/davinci0"]
    assert extras.env == {"A": "1", "B": "x y"} and [m.volume() for m in extras.mounts] == ["/data/d:/d:ro"]
    assert extras.ipc == "host" and extras.group_add == ["video"]
    with pytest.raises(ValueError, match="needs a value"):
        parse_container_options("--device")


def test_image_tag_follows_the_build_context_and_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "config" / "digest.key"
    monkeypatch.setenv("FLAGPERF_DIGEST_KEY_FILE", str(key_file))
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM x\n")
    first = image_digest(context)
    assert first == context_digest(context) and image_digest(context) == first
    with_arg = image_digest(context, {"BASE_IMAGE": "y"})
    assert with_arg != first and image_digest(context, {"BASE_IMAGE": "y"}) == with_arg
    assert image_digest(context, {"BASE_IMAGE": "z"}) != with_arg
    (context / "Dockerfile").write_text("FROM z\n")
    assert context_digest(context) != first
    assert image_tag("cpu", "pytorch", first) == f"flagperf/cpu-pytorch:{first[:16]}"
    # The build args are hashed with this machine's key (made on first use, private), not plainly: a tag
    # made from a weak secret cannot be matched against the plain hashes of guesses.
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_bytes()) == 32
    weak = {"TOKEN": "hunter2"}
    keyed = image_digest(context, weak)
    plain = hashlib.sha256(f"{context_digest(context)}\0ARG TOKEN=hunter2\0".encode()).hexdigest()
    assert keyed != plain and build_args_digest(weak) != hashlib.sha256(b"ARG TOKEN=hunter2\0").hexdigest()
    key_file.write_bytes(os.urandom(32))  # another machine's key: another tag for the same args
    assert image_digest(context, weak) != keyed


def test_container_exit_status_reads_like_a_process_exit() -> None:
    assert exit_code_of(0) == 0 and exit_code_of(2) == 2
    assert exit_code_of(137) == -9 and exit_code_of(143) == -15


def test_single_node_cases_run_on_every_host_multi_node_on_the_first_n() -> None:
    from flows.evaluate import node_groups

    names = ["a", "b", "c"]
    assert node_groups({}, names) == [["a"], ["b"], ["c"]]
    assert node_groups({"nnodes": 2, "nproc_per_node": 4}, names) == [["a", "b"]]


def test_a_multi_node_round_is_kept_only_when_every_node_completed(tmp_path: Path) -> None:
    from flagperf.results.schema import Failure, RoundResult, round_dir, write_result
    from flows.evaluate import completed_round, set_aside

    def result(host: str, rank: int, status: str) -> None:
        folder = round_dir(tmp_path, "c", 1, host, rank)
        folder.mkdir(parents=True)
        write_result(folder / "result.json", RoundResult.model_validate({
            "run_id": "r", "case": "c", "family": "base", "round": 1, "host": host, "node_rank": rank,
            "vendor": "cpu", "status": status, "started_at": "2026-01-01T00:00:00Z",
            "finished_at": "2026-01-01T00:00:01Z", "duration_s": 1.0, "measured_seconds": 0.5,
            "failure": Failure(kind="infrastructure", message="x").model_dump() if status == "failed" else None,
            "config": {}, "provenance": {"engine_version": "0", "git_revision": None, "git_dirty": None,
                                         "python": "3.11", "libraries": {}, "host": {},
                                         "image": {}, "config_origins": {}, "run_overrides": {}}}))

    result("a", 0, "success")
    result("b", 1, "failed")
    assert completed_round(tmp_path, "c", 1, "a", 0) is not None
    assert completed_round(tmp_path, "c", 1, "b", 1) is None
    for rank, host in enumerate(("a", "b")):
        set_aside(tmp_path, round_dir(tmp_path, "c", 1, host, rank))
    assert not round_dir(tmp_path, "c", 1, "a", 0).exists()
    assert (tmp_path / "retries" / "attempt1" / "c" / "round1" / "a_noderank0" / "result.json").is_file()
    assert (tmp_path / "retries" / "attempt1" / "c" / "round1" / "b_noderank1" / "result.json").is_file()


def test_the_shipped_example_inventories_validate() -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    root = Path(__file__).resolve().parents[2] / "deployments" / "inventories"
    outcome = CliRunner().invoke(app, ["validate", str(root / "example.yaml"), str(root / "flagperf-host.yaml")])
    assert outcome.exit_code == 0, outcome.output
    assert "inventory, 3 host(s)" in outcome.output and "FlagPerf host.yaml, 2 host(s)" in outcome.output


def test_host_yaml_nproc_per_node_reaches_the_cases_that_start_processes(tmp_path: Path) -> None:
    """FlagPerf's base host.yaml NPROC_PER_NODE: every case with processes per node gets it (recorded with the
    file as its origin); a case without the key is left alone; --set still wins."""
    from flagperf.config.plan import plan_run

    path = write(tmp_path, "host.yaml", """
VENDOR: cpu
HOSTS: ["10.1.2.155"]
NPROC_PER_NODE: 2
CASES:
  "interconnect-MPI_intraserver": "pytorch_2.3"
  "computation-FP32": "pytorch_2.3"
""")
    inv = load_inventory(path)
    assert inv.case_overrides == {"nproc_per_node": 2} and not any("NPROC_PER_NODE" in n for n in inv.notes)
    plan = plan_run(cases=inv.cases, vendor="cpu", results_dir=tmp_path / "r",
                    inventory_overrides=inv.case_overrides, inventory_source=inv.source)
    mpi, gemm = plan.cases
    assert mpi.config["nproc_per_node"] == 2 and mpi.origins["nproc_per_node"] == inv.source
    assert "nproc_per_node" not in gemm.config
    plan = plan_run(cases=inv.cases, vendor="cpu", results_dir=tmp_path / "r", sets=["nproc_per_node=1"],
                    inventory_overrides=inv.case_overrides, inventory_source=inv.source)
    assert plan.cases[0].config["nproc_per_node"] == 1 and plan.cases[0].origins["nproc_per_node"] == "--set"


FLAGPERF_RESNET50_CONFIGURATIONS = """batch_size: 256
# 1 item(like 1 sequence, 1 image) flops
flops: 4.12e9
fp16: true
compiler: tensorrt
num_workers: 8
log_freq: 30
repeat: 5
no_validation: false
exist_onnx_path: null
exist_compiler_path: null
"""


def test_flagperf_inference_files_load_unchanged_with_data_from_the_host_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FlagPerf's own resnet50 configurations.yaml (its keys only) in a case folder, and FlagPerf's inference
    host.yaml naming it with a data folder: the case is the inference one, its data_dir is that folder."""
    import shutil

    from flagperf.config.plan import plan_run
    from flagperf.paths import PROJECT_ROOT

    root = tmp_path / "cases"
    shutil.copytree(PROJECT_ROOT / "cases/inference/resnet50-infer", root / "inference" / "fpresnet",
                    ignore=shutil.ignore_patterns("vendor", "__pycache__"))
    (root / "inference" / "fpresnet" / "configurations.yaml").write_text(FLAGPERF_RESNET50_CONFIGURATIONS)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(root))
    from flagperf.hosts import container_policy

    # The data folder is the test's own, in the shared temp dir: a data root for this test only (a host.yaml
    # has no key for data roots).
    monkeypatch.setattr(container_policy, "DATA_ROOTS", (*container_policy.DATA_ROOTS, str(tmp_path)))
    monkeypatch.setattr(container_policy, "SYSTEM_FOLDERS",
                        tuple(f for f in container_policy.SYSTEM_FOLDERS if f != "/tmp"))
    data = tmp_path / "imagenet" / "val"
    data.mkdir(parents=True)
    inv = load_inventory(write(tmp_path, "host.yaml", f"""
VENDOR: nvidia
HOSTS: ["10.1.2.155"]
CASES:
  "fpresnet:pytorch_1.13": "{data}"
"""))
    plan = plan_run(cases=inv.cases, vendor=inv.resolve_vendor(None), results_dir=tmp_path / "r",
                    hosts=[h.model_dump(mode="json") for h in inv.hosts], inventory_overrides=inv.case_overrides,
                    inventory_source=inv.source)
    case = plan.cases[0]
    assert case.family == "inference" and case.config["batch_size"] == 256 and case.config["flops"] == 4.12e9
    assert case.config["data_dir"] == str(data) and case.origins["data_dir"] == inv.source
    assert case.config["synthetic_images"] == 8192  # the case's own default, where FlagPerf's file is silent


def test_a_remote_host_without_project_root_needs_a_usable_default(tmp_path: Path) -> None:
    """A remote host left without project_root uses the controller's own project folder: a clone in a folder
    named with ':' (PYTHONPATH's separator) or ',' (a mount list's) is refused by the inventory, naming the key
    to set; a local host, or a remote one given project_root, is not concerned."""
    home = tmp_path / "flag:perf"
    home.mkdir()
    env = {**os.environ, "FLAGPERF_HOME": str(home)}
    code = ("import sys; from pathlib import Path; from flagperf.hosts.inventory import load_inventory; "
            "load_inventory(Path(sys.argv[1]))")

    def load(body: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, str(write(tmp_path, "inv.yaml", body))], env=env,
                              capture_output=True, text=True, timeout=120)

    refused = load("hosts: [{name: b, address: localhost}, {name: a, address: h}]")
    assert refused.returncode != 0
    # One line of at most MAX_LINE (a deep temporary folder shortens the folder's middle): the file, the key, the
    # folder's end with the ':' that refuses it, and the advice at the line's end are kept whole.
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith(f"flagperf.errors.ConfigError: {tmp_path / 'inv.yaml'}: hosts.1.project_root: not "
                           "given, and the default"), refused.stderr
    assert f"/{tmp_path.name}/{home.name}' must be an absolute path" in line, line
    assert line.endswith("; give project_root"), line
    for body in ("hosts: [{name: b, address: localhost}]",
                 "hosts: [{name: a, address: h, project_root: /opt/flagperf}]"):
        loaded = load(body)
        assert loaded.returncode == 0, loaded.stderr


# --- a host's own spec_settings ---------------------------------------------------------------------------------


def test_a_host_s_spec_settings_reach_its_spec_table_and_provenance(tmp_path: Path) -> None:
    """The inventory gives one host its clock and memory (merged over the defaults key by key); a real round on
    that host builds its spec table with them and records which came from the inventory; the other host and the
    vendor folder keep the vendor's."""
    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from flagperf.entry import run_job
    from flagperf.results.provenance import source_digest
    from flagperf.results.schema import read_result

    digest = source_digest()
    lab = write(tmp_path, "lab.yaml", """
vendor: cpu
defaults:
  spec_settings: {memory_channels: 2, memory_mt_per_s: 3200}
hosts:
  - name: here
    address: localhost
    spec_settings: {clock_ghz: 3.0, memory_channels: 4}
  - name: other
    address: localhost
""")
    inv = load_inventory(lab)
    here, other = inv.hosts
    assert here.spec_settings == {"memory_channels": 4, "memory_mt_per_s": 3200, "clock_ghz": 3.0}
    assert other.spec_settings == {"memory_channels": 2, "memory_mt_per_s": 3200}
    plan = plan_run(cases=["computation-FP32"], sets=["m=64", "n=64", "k=64", "warmup_iters=0",
                                                      "min_duration_s=0.05", "min_iters=2", "devices=one"],
                    results_dir=tmp_path / "results", hosts=[h.model_dump(mode="json") for h in inv.hosts])
    assert plan.hosts[0]["spec_settings"]["clock_ghz"] == 3.0  # the plan records the settings as used
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host=here.name, vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={},
              spec_settings=here.host_spec_settings())
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text(job.model_dump_json())  # as the host reads it
    assert run_job(Job.model_validate_json((out / "job.json").read_text()), out) == 0
    result = read_result(out / "result.json")
    peak = result.metrics[0].peak
    assert peak is not None and "3.000 GHz (spec_settings.clock_ghz)" in peak.source and peak.bound == "exact"
    assert result.provenance is not None
    assert result.provenance.spec_settings == {"fma_units_per_core": 2, "clock_ghz": 3.0, "memory_channels": 4,
                                               "memory_mt_per_s": 3200}
    assert result.provenance.spec_settings_origins == {
        "fma_units_per_core": "vendor_images/cpu/vendor.yaml",
        "clock_ghz": f"{display_path(lab)}: hosts.0.spec_settings.clock_ghz",
        "memory_channels": f"{display_path(lab)}: hosts.0.spec_settings.memory_channels",
        "memory_mt_per_s": f"{display_path(lab)}: hosts.0.spec_settings.memory_mt_per_s"}
    assert source_digest() == digest  # the vendor folder is not edited: the code that ran is the same


def test_a_bad_spec_setting_value_fails_the_round_in_one_line_naming_the_inventory(tmp_path: Path) -> None:
    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from flagperf.entry import run_job
    from flagperf.results.schema import read_result

    lab = write(tmp_path, "lab.yaml", "hosts: [{name: here, address: localhost, spec_settings: {clock_ghz: 3500}}]")
    inv = load_inventory(lab)
    plan = plan_run(cases=["computation-FP32"], sets=["devices=one"], results_dir=tmp_path / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="here", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={},
              spec_settings=inv.hosts[0].host_spec_settings())
    assert run_job(job, tmp_path) == 2
    failure = read_result(tmp_path / "result.json").failure
    assert failure is not None and failure.kind == "user"
    assert failure.message == f"{display_path(lab)}: hosts.0.spec_settings.clock_ghz: 3500 is outside 0.1 to 10 GHz"


@pytest.mark.parametrize(("body", "key", "message"), [
    ("vendor: cpu\nhosts: [{name: a, address: h, spec_settings: {clock_ghzz: 3}}]", "hosts.0.spec_settings.clock_ghzz",
     "unknown spec setting 'clock_ghzz' (did you mean clock_ghz?"),
    ("vendor: nvidia\nhosts: [{name: a, address: h, spec_settings: {clock_ghz: 3}}]", "hosts.0.spec_settings.clock_ghz",
     "vendor nvidia reads no spec_settings"),
    ("hosts: [{name: a, address: h, spec_settings: {clock_ghz: [3, 4]}}]", "hosts.0.spec_settings.clock_ghz",
     "must be a number, a text, true/false or null, not a list"),
    ("hosts: [{name: a, address: h, spec_settings: {clock_ghz: .inf}}]", "hosts.0.spec_settings.clock_ghz",
     "is not a finite number"),
    ("defaults: {spec_settings: {memory_channels: {a: 1}}}\nhosts: [{name: a, address: h}]",
     "defaults.spec_settings.memory_channels", "not a dict"),
    ("hosts: [{name: a, address: h, spec_settings: {'Clock GHz': 3}}]", "hosts.0.spec_settings.Clock GHz",
     "is not a setting name"),
    ("hosts: [{name: a, address: h, spec_settings: [clock_ghz]}]", "hosts.0.spec_settings", "valid dictionary"),
])
def test_bad_spec_settings_name_the_inventory_and_key(tmp_path: Path, body: str, key: str, message: str) -> None:
    path = write(tmp_path, "inv.yaml", body)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.key == key and message in info.value.message, str(info.value)
    assert str(info.value).startswith(f"{display_path(path)}: {key}: ")
    assert "\n" not in str(info.value)


def test_the_run_vendor_checks_spec_settings_an_inventory_without_vendor_gave(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "inv.yaml", "hosts: [{name: a, address: h, spec_settings: {clock_ghz: 3}}]"))
    assert inv.resolve_vendor("cpu") == "cpu"
    with pytest.raises(ConfigError, match=r"inv.yaml: hosts.0.spec_settings.clock_ghz: vendor nvidia reads no "):
        inv.resolve_vendor("nvidia")


@pytest.mark.parametrize(("body", "key", "message"), [
    ("hosts: [{name: a, address: h, expected_devices: 0}]", "hosts.0.expected_devices",
     "must be a whole number of devices, 1 to 1024 (e.g. 8) (got 0)"),
    ("hosts: [{name: a, address: h, expected_devices: 1025}]", "hosts.0.expected_devices",
     "must be a whole number of devices, 1 to 1024 (e.g. 8) (got 1025)"),
    ("hosts: [{name: a, address: h, expected_devices: '8'}]", "hosts.0.expected_devices",
     "must be a whole number of devices, 1 to 1024 (e.g. 8) (got '8')"),
    ("defaults: {expected_devices: true}\nhosts: [{name: a, address: h}]", "defaults.expected_devices",
     "must be a whole number of devices, 1 to 1024 (e.g. 8) (got True)"),
    ("defaults: {runtime: docker}\nhosts: [{name: a, address: h, agent: {}, expected_devices: 8}]",
     "hosts.0.expected_devices", "host a is an agent host, whose images are built and run by its own worker, where "
     "no probe counts the devices its cases see"),
    # From the defaults: the agent host it reaches is named (the others keep it; null in its entry leaves it out)
    ("defaults: {runtime: docker, expected_devices: 2}\nhosts: [{name: a, address: h}, {name: b, address: g, "
     "agent: {}}, {name: c, address: f, agent: {}, expected_devices: null}]", "defaults.expected_devices",
     "host b is an agent host, whose images are built and run by its own worker, where no probe counts the devices "
     "its cases see: leave expected_devices out for it (`expected_devices: null` in its entry, where defaults give "
     "one), or give it runtime: process"),
])
def test_bad_expected_devices_name_the_inventory_and_key(tmp_path: Path, body: str, key: str, message: str) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    path = write(tmp_path, "inv.yaml", body)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.key == key and message in info.value.message, str(info.value)
    assert str(info.value).startswith(f"{display_path(path)}: {key}: ") and "\n" not in str(info.value)
    outcome = CliRunner().invoke(app, ["validate", str(path)])  # `flagperf validate` says the same, in one line
    assert outcome.exit_code != 0 and f"{key}: {message}" in outcome.output and "Traceback" not in outcome.output


def test_expected_devices_is_per_node_of_a_slurm_entry_and_refused_where_the_vendor_fixes_the_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Slurm entry's count is each node's (each slot's probe job counts its own node's); a vendor that splits the
    CPU into logical_devices has no count a probe could find: refused, by `flagperf validate` when the inventory
    names the vendor, else when the run's vendor is known."""
    shared = tmp_path / "shared"
    inv = load_inventory(write(tmp_path, "slurm.yaml", "hosts: [{name: c, expected_devices: 8, project_root: /srv/fp, "
                                                       f"slurm: {{nodes: 2, gres: 'gpu:8', shared_dir: {shared}}}}}]"))
    assert [(h.name, h.expected_devices) for h in inv.hosts] == [("c-1", 8), ("c-2", 8)]
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(Path(__file__).resolve().parents[1] / "fixtures" / "vendors"))
    without = load_inventory(write(tmp_path, "split.yaml", "hosts: [{name: a, address: h, expected_devices: 2}]"))
    assert without.resolve_vendor("cpu") == "cpu"
    for inventory, key in ((without, "hosts.0.expected_devices"), (load_inventory(write(
            tmp_path, "other.yaml", "hosts: [{name: a, address: h}, {name: b, address: g, expected_devices: 2}]")),
            "hosts.1.expected_devices"), (load_inventory(write(
            tmp_path, "defaults.yaml", "defaults: {expected_devices: 2}\nhosts: [{name: d, address: h}]")),
            "defaults.expected_devices")):
        with pytest.raises(ConfigError) as info:
            inventory.resolve_vendor("cpu-split")
        assert info.value.key == key and "vendor cpu-split splits the host's CPU into logical_devices: 2" in \
            info.value.message, str(info.value)
    with pytest.raises(ConfigError, match=r"split-named.yaml: hosts.0.expected_devices: vendor cpu-split splits"):
        load_inventory(write(tmp_path, "split-named.yaml",
                             "vendor: cpu-split\nhosts: [{name: a, address: h, expected_devices: 2}]"))
