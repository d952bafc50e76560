"""FlagPerf training's test_conf.py and cluster_conf.py with FlagPerf's meaning, read without running them, and
a vendor's config_<hw>x<nnodes>x<nproc>.py scale file."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flagperf.config.plan import plan_run
from flagperf.config.pyliterals import read_literal_assignments
from flagperf.errors import ConfigError
from flagperf.hosts.flagperf_training import TRAINING_MODELS, load_training_conf, open_inventory
from flagperf.paths import PROJECT_ROOT
from flows.cli import app
from tests.unit.mounts import data_folder

FIXTURE = PROJECT_ROOT / "tests" / "fixtures" / "flagperf_format" / "training" / "run_benchmarks" / "config"
CLUSTER = 'HOSTS = ["10.1.2.2", "10.1.2.3"]\nSSH_PORT = "2222"\nMASTER_PORT = "29600"\n'


def write_confs(folder: Path, cases: str, *, test_extra: str = "", cluster: str = CLUSTER,
                vendor: str = "cpu") -> Path:
    """test_conf.py and cluster_conf.py side by side, as FlagPerf has them; returns test_conf.py."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cluster_conf.py").write_text(cluster, encoding="utf-8")
    test_conf = folder / "test_conf.py"
    test_conf.write_text(f'VENDOR = "{vendor}"\nFLAGPERF_PATH = "/opt/fp"\nFLAGPERF_LOG_PATH = FLAGPERF_PATH + '
                         f'"/result/"\n{test_extra}CASES = {cases}\n', encoding="utf-8")
    return test_conf


def test_flagperf_files_load_with_their_meaning() -> None:
    """The fixture is FlagPerf's own file shape (comments, a string between assignments, + of an earlier name)."""
    inv = load_training_conf(FIXTURE / "test_conf.py")  # cluster_conf.py found beside it, as FlagPerf does
    assert [(h.name, h.address, h.port, h.runtime) for h in inv.hosts] == [
        ("10.1.2.2", "10.1.2.2", 22, "docker"), ("10.1.2.3", "10.1.2.3", 22, "docker")]
    first = inv.hosts[0]
    assert inv.vendor == "nvidia" and inv.master_port == 29501
    assert first.docker.extra_options == " --gpus all --ipc host"  # "..." + \ "..." concatenated
    assert first.visible_devices_env == "CUDA_VISIBLE_DEVICES" and first.shm_size == "32g"
    assert str(first.project_root) == "/opt/flagperf-prefect"
    assert inv.results_dir == "/opt/flagperf-prefect/result/"  # FLAGPERF_PATH + "/result/"
    assert inv.cases == ["resnet50", "llama-pretrain"] and inv.rounds == 1
    assert inv.case_overrides == {
        "resnet50.nnodes": 1, "resnet50.nproc_per_node": 8, "resnet50.data_dir": "/raid/dataset/ImageNet_1k_2012/",
        "llama-pretrain.model": "llama-3-8b", "llama-pretrain.nnodes": 2, "llama-pretrain.nproc_per_node": 8}
    assert first.docker.data_mounts == ["/raid/dataset/ImageNet_1k_2012/", "/raid/dataset/llama3_8b_pretrain/"]
    notes = "\n".join(inv.notes)
    for said in ("cluster_conf.py:7: HOSTS_PORTS is not used", "test_conf.py:40: CLEAR_CACHES is not used",
                 "test_conf.py:24: PIP_SOURCE is not used", "framework megatron_core060 is not used",
                 "hardware A100: the scale file read is cases/training/resnet50/vendor/nvidia/config_nvidiax1x8",
                 "/raid/dataset/llama3_8b_pretrain/ is mounted, not read",
                 "a single-node case (resnet50) runs on every host"):
        assert said in notes, notes


def test_cases_become_the_plans_scale_rounds_and_data_dir(tmp_path: Path) -> None:
    """digits-mlp at 1x2 reads the cpu vendor's config_cpux1x2.yaml; repeat 3 is three rounds; a resnet50 data
    dir (a real folder under a data root: resnet50 checks it) is the case's data_dir."""
    with data_folder() as root:
        _plans_scale_rounds_and_data_dir(tmp_path, root / "imagenet")


def _plans_scale_rounds_and_data_dir(tmp_path: Path, data: Path) -> None:
    for split in ("train", "val"):
        (data / split / "n01440764").mkdir(parents=True)
    test_conf = write_confs(tmp_path / "config", f'{{"digits-mlp:pytorch:cpu:1:2:3": "/data/none",\n'
                                                 f'  "resnet50:pytorch_2.1:cpu:1:1:3": "{data}"}}')
    inv = load_training_conf(test_conf)
    assert inv.rounds == 3 and [(h.port) for h in inv.hosts] == [2222, 2222] and inv.master_port == 29600
    plan = plan_run(cases=inv.cases, vendor=inv.resolve_vendor(None), rounds=inv.rounds, results_dir=tmp_path / "r",
                    hosts=[h.model_dump(mode="json") for h in inv.hosts], inventory_overrides=inv.case_overrides,
                    inventory_source=inv.source)
    digits, resnet = plan.cases
    assert plan.rounds == 3
    assert (digits.config["nnodes"], digits.config["nproc_per_node"], digits.config["batch_size"]) == (1, 2, 48)
    assert digits.origins["batch_size"].endswith("vendor/cpu/config_cpux1x2.yaml")
    assert digits.origins["nproc_per_node"] == inv.source
    assert resnet.config["data_dir"] == str(data)
    assert any("/data/none is mounted, not read: digits-mlp reads no data dir" in n for n in inv.notes)
    test_conf = write_confs(tmp_path / "config", '{"llama-pretrain:pytorch:cpu:1:1:3": "/data/tokens"}')
    assert any("/data/tokens is mounted, not read: llama-pretrain reads a file (data_path), not a data dir"
               in n for n in load_training_conf(test_conf).notes)


SCALE_CASE = {"nnodes": 1, "nproc_per_node": 1, "batch_size": 8, "lr": 0.1, "timeout_s": 60, "max_retries": 0}
SCALE_BENCH = textwrap.dedent("""
    from flagperf.measure.casekit import CaseConfig


    class Config(CaseConfig):
        nnodes: int
        nproc_per_node: int
        batch_size: int
        lr: float


    def run(config, ctx):
        return []
    """)


def test_a_vendors_python_scale_file_is_read_not_run(tmp_path: Path, make_case) -> None:
    folder = make_case("pyscale", family="training", configurations=SCALE_CASE, bench=SCALE_BENCH,
                       manifest_extra={"family": "training", "mutable": ["nnodes", "nproc_per_node", "batch_size"]})
    scale = folder / "vendor" / "cpu" / "config_cpux1x2.py"
    scale.parent.mkdir(parents=True)
    scale.write_text("# FlagPerf's form: literal assignments\nbatch_size = 4 * 1 if False else 16\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config_cpux1x2\.py:2: batch_size: the expression .* only literals"):
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    scale.write_text("'''scale 1x2'''\nbatch_size = 16\n", encoding="utf-8")
    (case,) = plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path).cases
    assert case.config["batch_size"] == 16 and case.origins["batch_size"].endswith("config_cpux1x2.py")
    scale.write_text("lr = 0.5\n", encoding="utf-8")  # the mutable rule holds for the .py form too
    with pytest.raises(ConfigError, match="lr: is not in the case's mutable list"):
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    scale.with_suffix(".yaml").write_text("batch_size: 16\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config_cpux1x2\.py: config_cpux1x2\.yaml is there too"):
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)


@pytest.mark.parametrize(("line", "expected"), [
    ("train_batch_size = 16", "train_batch_size: unknown key (FlagPerf's name; this case's key is batch_size)"),
    ("dist_backend = 'nccl'", "dist_backend: unknown key (FlagPerf's setting has no counterpart here: the backend "
                              "follows the device"),
    ("no_such_setting = 1", "no_such_setting: unknown key"),
])
def test_flagperf_setting_names_in_a_scale_file_name_the_key_to_write(tmp_path: Path, make_case, line: str,
                                                                       expected: str) -> None:
    """A vendor's config_A100x1x8.py brought from FlagPerf uses the benchmark's names: each is refused as a key
    this case lacks (not as an immutable one), with the key to write where there is one."""
    folder = make_case("pyscale", family="training", configurations=SCALE_CASE, bench=SCALE_BENCH,
                       manifest_extra={"family": "training", "mutable": ["nnodes", "nproc_per_node", "batch_size"]})
    scale = folder / "vendor" / "cpu" / "config_cpux1x2.py"
    scale.parent.mkdir(parents=True)
    scale.write_text(f"{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    assert expected in str(caught.value) and "config_cpux1x2.py" in str(caught.value)
    assert "mutable" not in str(caught.value)


def _scale_folder(make_case) -> Path:
    """vendor/cpu/ of a training case whose mutable keys are nnodes, nproc_per_node and batch_size."""
    folder = make_case("pyscale", family="training", configurations=SCALE_CASE, bench=SCALE_BENCH,
                       manifest_extra={"family": "training", "mutable": ["nnodes", "nproc_per_node", "batch_size"]})
    (folder / "vendor" / "cpu").mkdir(parents=True)
    return folder / "vendor" / "cpu"


def test_config_common_beside_a_scale_file_is_read_first_and_overridden(tmp_path: Path, make_case) -> None:
    """FlagPerf's `from config_common import *`: config_common.py's names first, the scale file's own after them;
    a default restated in config_common.py is tolerated (shared by every scale), one in the scale file is not."""
    vendor = _scale_folder(make_case)
    (vendor / "config_common.py").write_text('"""shared"""\nbatch_size = 32\nnnodes = 1\n', encoding="utf-8")
    scale = vendor / "config_cpux1x2.py"
    scale.write_text("from config_common import *\n", encoding="utf-8")
    (case,) = plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path).cases
    assert case.config["batch_size"] == 32 and case.origins["batch_size"].endswith("vendor/cpu/config_common.py")
    assert case.vendor_changes == {"batch_size": [8, 32]}  # nnodes = 1, the default restated, changes nothing
    scale.write_text("from config_common import *\nbatch_size = 64\n", encoding="utf-8")
    (case,) = plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path).cases
    assert case.config["batch_size"] == 64 and case.origins["batch_size"].endswith("config_cpux1x2.py")
    assert case.vendor_changes["batch_size"] == [8, 64]
    scale.write_text("from config_common import *\nbatch_size = 32\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config_cpux1x2\.py: batch_size: sets the value it already has "
                                          r"\(config_common\.py gives it\) \(32\); remove the line"):
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    (vendor / "config_common.py").write_text("nproc_per_node = 4\n", encoding="utf-8")
    scale.write_text("from config_common import *\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config_common\.py:1: nproc_per_node: 4 contradicts the name of "
                                          r"config_cpux1x2\.py, which imports it"):
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    (vendor / "config_common.py").write_text("batch_size = 16\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(scale)])
    assert result.exit_code == 0 and "training scale overrides of pyscale" in " ".join(result.output.split())
    (vendor / "config_common.py").write_text("train_batch_size = 16\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(scale)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "config_common.py:1: train_batch_size: unknown key (FlagPerf's name; this case's key is batch_size)" in (
        " ".join(result.output.split()))
    result = CliRunner().invoke(app, ["validate", str(vendor / "config_common.py")])  # read through the scale files
    assert result.exit_code == 2 and "config_common.py:1: train_batch_size: unknown key" in result.output
    (vendor / "config_common.py").write_text("batch_size = 16\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(vendor / "config_common.py")])
    assert result.exit_code == 0 and "training scale overrides of pyscale, with config_common.py" in (
        " ".join(result.output.split())), result.output
    scale.unlink()
    result = CliRunner().invoke(app, ["validate", str(vendor / "config_common.py")])
    assert result.exit_code == 2 and "config_common.py: never read: no config_<hw>x<nnodes>x<nproc>.py beside it" in (
        " ".join(result.output.split())), result.output


@pytest.mark.parametrize(("scale_text", "common_text", "expected"), [
    ("from config_common import *\n", None,
     "config_cpux1x2.py:1: from config_common import *: config_common.py is not in"),
    ("from .config_common import *\n", "batch_size = 16\n", "config_cpux1x2.py:1: an import of * from .config_common:"),
    ("from config_common import batch_size\n", "batch_size = 16\n",
     "config_cpux1x2.py:1: an import of batch_size from config_common:"),
    ("import config_common\n", "batch_size = 16\n", "config_cpux1x2.py:1: an import of config_common:"),
    ("from config_other import *\n", "batch_size = 16\n", "config_cpux1x2.py:1: an import of * from config_other:"),
    ("batch_size = 16\nfrom config_common import *\n", "lr = 0.5\n",
     "config_cpux1x2.py:2: from config_common import * after assignments (batch_size), which it would replace"),
    ("from config_common import *\n", "from config_base import *\n",
     "config_common.py:1: a star import inside config_common.py (imported by config_cpux1x2.py): only one level"),
    ("from config_common import *\n", "lr = 0.5\n",
     "config_common.py:1: lr: is not in the case's mutable list"),
    ("from config_common import *\n", "dist_backend = 'nccl'\n",
     "config_common.py:1: dist_backend: unknown key (FlagPerf's setting has no counterpart here"),
    ("from config_common import *\n", "batch_size = 16\nimport os\n",
     "config_common.py:2: an import of os: only top-level NAME = literal assignments are read"),
    ("from config_common import *\n", "__all__ = ['batch_size']\n",
     "config_common.py:1: __all__: names batch_size, which the file does not assign"),
])
def test_config_common_problems_are_one_line_naming_the_file(tmp_path: Path, make_case, scale_text: str,
                                                             common_text: str | None, expected: str) -> None:
    vendor = _scale_folder(make_case)
    (vendor / "config_cpux1x2.py").write_text(scale_text, encoding="utf-8")
    if common_text is not None:
        (vendor / "config_common.py").write_text(common_text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    assert expected in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_config_common_is_read_from_the_scale_files_folder_only(tmp_path: Path, make_case) -> None:
    """A link to another folder's config_common.py is refused by name; one within the folder is read."""
    vendor = _scale_folder(make_case)
    (vendor / "config_cpux1x2.py").write_text("from config_common import *\n", encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config_common.py").write_text("batch_size = 16\n", encoding="utf-8")
    (vendor / "config_common.py").symlink_to(elsewhere / "config_common.py")
    with pytest.raises(ConfigError, match=r"config_cpux1x2\.py:1: 'config_common\.py' is outside the folder of "
                                          r"config_cpux1x2\.py \(a link to .*elsewhere/config_common\.py\)"):
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    (vendor / "config_common.py").unlink()
    (vendor / "shared.py").write_text("batch_size = 16\n", encoding="utf-8")
    (vendor / "config_common.py").symlink_to("shared.py")
    (case,) = plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path).cases
    assert case.config["batch_size"] == 16
    # What the import binds, as Python binds it: __all__ where given (lr, not a mutable key, is not brought in).
    (vendor / "shared.py").write_text("__all__ = ['batch_size']\nbatch_size = 24\nlr = 0.5\n", encoding="utf-8")
    (case,) = plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path).cases
    assert (case.config["batch_size"], case.config["lr"]) == (24, 0.1)


@pytest.mark.parametrize("common_text", [
    "batch_size = __import__('pathlib').Path({marker!r}).write_text('x')\n",
    "batch_size = 16\nopen({marker!r}, 'w').write('x')\n",
    "if True:\n    open({marker!r}, 'w').write('x')\n",
])
def test_config_common_is_never_run_nor_imported(tmp_path: Path, make_case, common_text: str) -> None:
    vendor = _scale_folder(make_case)
    marker = tmp_path / "executed"
    (vendor / "config_common.py").write_text(common_text.format(marker=str(marker)), encoding="utf-8")
    scale = vendor / "config_cpux1x2.py"
    scale.write_text("from config_common import *\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config_common\.py:\d+: .*(this file is never run)"):
        plan_run(cases=["pyscale"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    result = CliRunner().invoke(app, ["validate", str(scale)])
    assert result.exit_code == 2 and "config_common.py" in result.output
    assert not marker.exists() and "config_common" not in sys.modules
    assert not (vendor / "__pycache__").exists()  # nothing compiled or imported from the folder


@pytest.mark.parametrize(("body", "expected"), [
    ("import os\n", "conf.py:2: an import of os: only top-level NAME = literal assignments are read"),
    ("from os import path\n", "conf.py:2: an import of path from os:"),
    ("for i in range(3):\n    pass\n", "conf.py:2: a for loop:"),
    ("print('hi')\n", "conf.py:2: a call to print():"),
    ("HOSTS = __import__('os').getenv('H')\n", "conf.py:2: HOSTS: a call to __import__('os').getenv():"),
    ("PATH = f'{A}/x'\n", "conf.py:2: PATH: an f-string:"),
    ("PATH = B + '/x'\n", "conf.py:2: PATH: the name B, which no earlier line of the file assigns:"),
    ("X = [i for i in range(3)]\n", "conf.py:2: X: a comprehension (a loop):"),
    ("X = 1 + 'a'\n", "conf.py:2: X: 1 + 'a' adds values of types int and str:"),
    ("os.environ['X'] = '1'\n", "conf.py:2: os.environ['X']: only NAME = value is read"),
    ("def f():\n    pass\n", "conf.py:2: a function definition:"),
    ("X = (\n", "conf.py:2: not valid Python"),
])
def test_anything_but_a_literal_assignment_is_refused_by_name_and_line(tmp_path: Path, body: str,
                                                                       expected: str) -> None:
    path = tmp_path / "conf.py"
    marker = tmp_path / "ran"
    path.write_text(f"A = 'x'\n{body}open({str(marker)!r}, 'w')\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_literal_assignments(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists()


def test_literals_and_concatenation_are_read(tmp_path: Path) -> None:
    path = tmp_path / "conf.py"
    path.write_text(textwrap.dedent('''\
        """doc"""
        ROOT = "/opt/fp"
        LOG = ROOT + "/result/"
        HOSTS = ["10.0.0.1"] + ["10.0.0.2"]
        N: int = -3
        OPT = " --gpus all" + \\
            " --ipc host"
        CASES = {"a:b:c:1:1:1": ROOT + "/data", "x": (1, 2.5e3, None, True)}
        ROOT = "/other"
        '''), encoding="utf-8")
    assert read_literal_assignments(path) == {
        "ROOT": "/other", "LOG": "/opt/fp/result/", "HOSTS": ["10.0.0.1", "10.0.0.2"], "N": -3,
        "OPT": " --gpus all --ipc host", "CASES": {"a:b:c:1:1:1": "/opt/fp/data", "x": (1, 2500.0, None, True)}}


@pytest.mark.parametrize(("cases", "extra", "expected"), [
    ('{"glm:pytorch_1.8:A100:1:8:1": "/mnt"}', "",
     "test_conf.py:4: CASES.glm:pytorch_1.8:A100:1:8:1: no training case for model 'glm' (FlagPerf models mapped "
     "here: bert, llama3_8B, resnet50; training cases: bert, digits-mlp, llama-pretrain, resnet50)"),
    ('{"digits-mlp:pytorch:cpu:1:8": "/mnt"}', "", "expected model:framework:hardware:nnodes:nproc:repeat (5 fields"),
    ('{"digits-mlp:pytorch:cpu:3:1:1": "/mnt"}', "", "nnodes 3 is more than the 2 HOSTS"),
    ('{"digits-mlp:pytorch:cpu:1:0:1": "/mnt"}', "", "nproc must be a whole number from 1 to 1024, got '0'"),
    ('{"digits-mlp:pytorch:cpu:1:1:101": "/mnt"}', "", "repeat must be a whole number from 1 to 100"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "data"}', "", "the data dir must be an absolute path"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt", "digits-mlp:pytorch:cpu:1:2:1": "/mnt"}', "",
     "digits-mlp is listed twice"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt", "resnet50:pytorch:cpu:1:1:2": "/mnt"}', "",
     "every case runs the same number of rounds here (digits-mlp:pytorch:cpu:1:1:1 repeats 1, "
     "resnet50:pytorch:cpu:1:1:2 repeats 2)"),
    ('["BERT_PADDLE_DEMO_A100_1X8"]', "", "a list of case names is FlagPerf's first format"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', "HOSTS = ['h']\n",
     "test_conf.py:4: HOSTS: it belongs in the other file"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', "TEST_TYPE = 'default'\n", "test_conf.py:4: TEST_TYPE: unknown name"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', "ACCE_CONTAINER_OPT = ' --privileged'\n",
     "test_conf.py:4: ACCE_CONTAINER_OPT: --privileged is refused here"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', "ACCE_CONTAINER_OPT = ' -v /var/run/docker.sock:/s'\n",
     "ACCE_CONTAINER_OPT: -v host path '/var/run/docker.sock' is refused"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', "ACCE_VISIBLE_DEVICE_ENV_NAME = 'A B'\n", "is not a variable name"),
    # FLAGPERF_PATH is the hosts' project_root: mounted (a ',' or ':' splits a mount list) and on PYTHONPATH
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', "FLAGPERF_PATH = '/opt/fp,/:/host'\n",
     "test_conf.py:4: FLAGPERF_PATH: '/opt/fp,/:/host' must be an absolute path without '..', ',', ':'"),
    ('{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', "FLAGPERF_PATH = '/'\n", "FLAGPERF_PATH: '/' must be an absolute"),
])
def test_bad_training_confs_are_refused_in_one_line(tmp_path: Path, cases: str, extra: str, expected: str) -> None:
    test_conf = write_confs(tmp_path, cases, test_extra=extra)
    with pytest.raises(ConfigError) as caught:
        load_training_conf(test_conf)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("cluster", "expected"), [
    ("SSH_PORT = '22'\n", "cluster_conf.py: HOSTS: required: a non-empty list of addresses"),
    ("HOSTS = ['10.0.0.1', '-oProxyCommand=x']\n", "cluster_conf.py:1: HOSTS.1: '-oProxyCommand=x' is not a host"),
    ("HOSTS = ['h']\nSSH_PORT = 'ssh'\n", "cluster_conf.py:2: SSH_PORT: must be a port number, got 'ssh'"),
    ("HOSTS = ['h']\nMASTER_PORT = 70000\n", "MASTER_PORT: must be a port number"),
    ("HOSTS = ['h']\nVENDOR = 'cpu'\n", "cluster_conf.py:2: VENDOR: it belongs in the other file"),
])
def test_bad_cluster_confs_are_refused_in_one_line(tmp_path: Path, cluster: str, expected: str) -> None:
    test_conf = write_confs(tmp_path, '{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', cluster=cluster)
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        load_training_conf(test_conf)


def test_a_hardware_whose_scale_file_would_be_skipped_is_refused(tmp_path: Path, make_case) -> None:
    folder = make_case("hwcase", family="training", configurations=SCALE_CASE, bench=SCALE_BENCH,
                       manifest_extra={"family": "training"})
    (folder / "vendor" / "cpu").mkdir(parents=True)
    (folder / "vendor" / "cpu" / "config_A100x1x2.py").write_text("batch_size = 4\n", encoding="utf-8")
    test_conf = write_confs(tmp_path, '{"hwcase:pytorch:A100:1:2:1": "/mnt"}')
    with pytest.raises(ConfigError, match=r"config_A100x1x2\.py would not be read: vendor cpu's scale files are "
                                          r"config_cpux<nnodes>x<nproc>"):
        load_training_conf(test_conf)


def test_every_mapped_model_names_a_training_case() -> None:
    from flagperf.config.cases import available_cases, load_case

    known = available_cases()
    for model, mapped in TRAINING_MODELS.items():
        case = load_case(mapped.case, known)
        assert case.family == "training", model
        assert set(mapped.settings) <= set(case.manifest.configurations), model
        assert mapped.data_key is None or mapped.data_key in case.manifest.configurations, model
        assert mapped.data_key is not None or mapped.data_note, model


def test_open_inventory_picks_the_format(tmp_path: Path) -> None:
    test_conf = write_confs(tmp_path / "a", '{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}')
    other = tmp_path / "b" / "cluster.py"
    other.parent.mkdir()
    other.write_text("HOSTS = ['10.9.9.9']\n", encoding="utf-8")
    assert [h.address for h in open_inventory(str(test_conf)).hosts] == ["10.1.2.2", "10.1.2.3"]
    assert [h.address for h in open_inventory(str(test_conf), str(other)).hosts] == ["10.9.9.9"]
    assert open_inventory(None).hosts[0].transport == "local"
    (tmp_path / "a" / "cluster_conf.py").unlink()
    with pytest.raises(ConfigError, match=r"cluster_conf\.py: file not found .*give --cluster-conf"):
        open_inventory(str(test_conf))


@pytest.mark.parametrize(("body", "args", "expected"), [
    ("import subprocess\n", [], "test_conf.py:4: an import of subprocess:"),
    ("X = open('/etc/passwd').read()\n", [], "test_conf.py:4: X: a call to open('/etc/passwd').read():"),
    ("while True:\n    pass\n", [], "test_conf.py:4: a while loop:"),
    ("", ["--inventory", "x.yaml"], "give one of --inventory, --host-config and --test-conf"),
])
def test_cli_refuses_in_one_line_with_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str,
                                             args: list[str], expected: str) -> None:
    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # reaching the flow would be an ImportError
    test_conf = write_confs(tmp_path / "config", '{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}', test_extra=body)
    results = tmp_path / "results"
    result = CliRunner().invoke(app, ["run", "--test-conf", str(test_conf), "--results", str(results), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error") and expected in lines[0], result.output
    assert not results.exists()


def test_cli_cluster_conf_needs_a_test_conf(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--cluster-conf", str(tmp_path / "cluster_conf.py")])
    assert result.exit_code == 2 and "--cluster-conf goes with --test-conf" in result.output


def test_validate_reads_the_python_files_without_running_them(tmp_path: Path, make_case) -> None:
    test_conf = write_confs(tmp_path / "config", '{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}')
    result = CliRunner().invoke(app, ["validate", str(test_conf), str(test_conf.with_name("cluster_conf.py"))])
    assert result.exit_code == 0 and " ".join(result.output.split()).count("test_conf.py + cluster_conf.py") == 2
    assert not Path("/opt/fp/result").exists()  # FLAGPERF_LOG_PATH checked by writing there, nothing left
    with test_conf.open("a", encoding="utf-8") as extra:  # a FlagPerf key this engine does not use: said as run says it
        extra.write("CLEAR_CACHES = True\n")
    result = CliRunner().invoke(app, ["validate", str(test_conf)])
    assert result.exit_code == 0 and "CLEAR_CACHES is not used" in " ".join(result.output.split()), result.output
    folder = make_case("pyscale", family="training", configurations=SCALE_CASE, bench=SCALE_BENCH,
                       manifest_extra={"family": "training", "mutable": ["nnodes", "nproc_per_node", "batch_size"]})
    scale = folder / "vendor" / "cpu" / "config_cpux1x2.py"
    scale.parent.mkdir(parents=True)
    scale.write_text("batch_size = 16\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(scale)])
    assert result.exit_code == 0 and "training scale overrides of pyscale" in " ".join(result.output.split())
    scale.write_text("import os\nbatch_size = 16\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(scale)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "config_cpux1x2.py:1: an import of os" in lines[0]


def test_acce_visible_device_env_name_is_held_to_the_vendors_visible_devices_env(tmp_path: Path) -> None:
    """FlagPerf's ACCE_VISIBLE_DEVICE_ENV_NAME (test_conf.py, host.yaml) was carried into the hosts as the name a
    host's visible_devices sets, which neither file can set, while a round narrows each device by the vendor's
    container.visible_devices_env: a name that differed was silently not used. Now each reader says so in one line
    naming the file, the key and the vendor.yaml; the same name says nothing."""
    from flagperf.hosts.inventory import load_inventory

    cases = '{"digits-mlp:pytorch:cpu:1:1:1": "/mnt"}'
    same = write_confs(tmp_path / "same", cases, vendor="nvidia", test_extra="ACCE_VISIBLE_DEVICE_ENV_NAME = "
                                                                             "'CUDA_VISIBLE_DEVICES'\n")
    assert not [note for note in load_training_conf(same).notes if "ACCE_VISIBLE" in note]
    other = write_confs(tmp_path / "other", cases, vendor="nvidia", test_extra="ACCE_VISIBLE_DEVICE_ENV_NAME = "
                                                                               "'MLU_VISIBLE_DEVICES'\n")
    said = [note for note in load_training_conf(other).notes if "ACCE_VISIBLE" in note]
    assert said == [f"{other}:4: ACCE_VISIBLE_DEVICE_ENV_NAME: MLU_VISIBLE_DEVICES, but vendor nvidia's is "
                    f"CUDA_VISIBLE_DEVICES (vendor_images/nvidia/vendor.yaml: container.visible_devices_env): a round "
                    "narrows each device by CUDA_VISIBLE_DEVICES; give the same name in both"], said
    # A vendor with no visible-devices variable has no devices a round narrows (the host CPU): FlagPerf's name, as
    # the project's own example inventory keeps it, is nothing to advise on (it was told to add the CUDA name).
    host_yaml = tmp_path / "host.yaml"
    host_yaml.write_text("VENDOR: cpu\nHOSTS: [h]\nCASES: {computation-FP32: pytorch}\n"
                         "ACCE_VISIBLE_DEVICE_ENV_NAME: CUDA_VISIBLE_DEVICES\n", encoding="utf-8")
    assert not [note for note in load_inventory(host_yaml).notes if "ACCE_VISIBLE" in note]
    example = PROJECT_ROOT / "deployments" / "inventories" / "flagperf-host.yaml"
    assert not [note for note in load_inventory(example).notes if "ACCE_VISIBLE" in note]
    # A vendor whose devices are a chip's (torch_device xpu) and that names no variable: its rounds narrow nothing
    # by FlagPerf's name, so it is told to add it (the note was silenced for every vendor without one).
    from flagperf.hosts.vendorscaffold import write_vendor_folder

    vendor = write_vendor_folder(tmp_path / "vendors", "acme")
    manifest = vendor / "vendor.yaml"
    manifest.write_text(manifest.read_text().replace("torch_device: cpu", "torch_device: xpu"), encoding="utf-8")
    host_yaml.write_text("VENDOR: acme\nHOSTS: [h]\nCASES: {computation-FP32: pytorch}\n"
                         "ACCE_VISIBLE_DEVICE_ENV_NAME: XPU_VISIBLE_DEVICES\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
        said = [note for note in load_inventory(host_yaml).notes if "ACCE_VISIBLE" in note]
    assert len(said) == 1 and "vendor acme names no visible-devices variable" in said[0] \
        and "add `visible_devices_env: XPU_VISIBLE_DEVICES` under container: there" in said[0], said
