"""A new vendor's path through docs/vendor-guide.md: `flagperf vendor new` writes a folder that passes `vendor
check` and `validate` as written; the adaptations of a base, an inference and a training case are read as a run
reads them; and the mistakes a vendor coming from FlagPerf makes are each one problem line naming the file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagperf.config.adaptation import EXTERN_HOOKS
from flagperf.config.models import PEAK_UNITS
from flagperf.config.vendors import MANIFEST, load_vendor_manifest
from flagperf.errors import MAX_LINE, ConfigError, one_line
from flagperf.hosts.vendorcheck import ENGINE_FOLDERS, check_vendor_folder
from flagperf.hosts.vendorscaffold import PEAK_FIGURES, write_vendor_folder
from flagperf.paths import PROJECT_ROOT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NAIVE_MONITOR = """\
import argparse, json, time
p = argparse.ArgumentParser()
for flag in ("--out", "--pid-file"):
    p.add_argument(flag)
for flag in ("--interval", "--max-seconds", "--parent-pid"):
    p.add_argument(flag, type=float)
a = p.parse_args()
with open(a.out, "w") as f:
    f.write(json.dumps({"type": "header", "monitor": "acme"}) + "\\n")
    f.write(json.dumps({"type": "sample", "t": time.time(), "util_percent": 5.0, "mem_used_bytes": 1}) + "\\n")
    f.write(json.dumps({"type": "footer", "samples": 1}) + "\\n")
"""


@pytest.fixture
def walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scaffolded vendor `acme` (the host CPU as its device, an ONNX Runtime engine) on FLAGPERF_VENDOR_PATH,
    and a base, an inference and a training case of their own on FLAGPERF_CASE_PATH, not yet adapted."""
    vendor = write_vendor_folder(tmp_path / "vendors", "acme")
    shutil.copytree(PROJECT_ROOT / "vendor_images" / "cpu" / "engines" / "onnxruntime",
                    vendor / "engines" / "onnxruntime")
    cases = tmp_path / "cases"
    gemm = cases / "base" / "walk-gemm"
    gemm.mkdir(parents=True)
    text = (PROJECT_ROOT / "cases" / "base" / "computation-FP32" / "case.yaml").read_text()
    (gemm / "case.yaml").write_text(text.replace("name: computation-FP32", "name: walk-gemm"))
    shutil.copytree(PROJECT_ROOT / "cases" / "inference" / "digits-infer", cases / "inference" / "walk-infer",
                    ignore=shutil.ignore_patterns("vendor", "__pycache__"))
    mlp = cases / "training" / "walk-mlp"
    shutil.copytree(FIXTURES / "vendor_adaptation" / "cases" / "training" / "adapted-mlp", mlp,
                    ignore=shutil.ignore_patterns("vendor", "__pycache__"))
    (mlp / "case.yaml").write_text((mlp / "case.yaml").read_text().replace("name: adapted-mlp", "name: walk-mlp"))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(cases))
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def flagperf(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=PROJECT_ROOT, env={**os.environ, **(env or {})})


def test_the_scaffold_passes_vendor_check_and_validate_as_written(tmp_path: Path) -> None:
    made = flagperf("vendor", "new", "acme", "--into", str(tmp_path))
    assert made.returncode == 0, made.stderr
    # A folder outside the project is found once its parent is on FLAGPERF_VENDOR_PATH: the next step says so.
    assert f"put {tmp_path} on FLAGPERF_VENDOR_PATH so that --vendor acme finds it" in made.stdout, made.stdout
    folder = tmp_path / "acme"
    # The README says where each file of a case adaptation goes, with every extension point of each family.
    readme = (folder / "README.md").read_text()
    assert "cases/inference/<case>/vendor/acme_configurations.yaml" in readme
    assert "config_acmex<nnodes>x<nproc>.yaml" in readme and "extern/hooks.py" in readme
    assert all(hook in readme for points in EXTERN_HOOKS.values() for hook in points)
    found = check_vendor_folder(folder, monitor_seconds=1)
    assert found.problems == []
    assert any(line.startswith("image ") and "pytorch_install.sh" in line for line in found.passed)
    # Every key a case reads, each in its unit with which datasheet figure it is (a vendor never learnt of the
    # interconnect keys, whose cases then had no peak, nor that p2p is one direction).
    assert any(line.startswith(f"peaks: {len(PEAK_UNITS)} figures") for line in found.passed), found.passed
    spec = (folder / "spec.py").read_text()
    for key, unit in PEAK_UNITS.items():
        assert f'"{key}": (None, "{unit}"),' in spec and PEAK_FIGURES[key] in spec, key
    # The template monitor says what is left to do rather than writing made-up figures.
    assert any("read_devices() is still the template's" in line for line in found.not_checkable)
    checked = flagperf("validate", str(folder / MANIFEST))
    assert checked.returncode == 0 and "(vendor)" in checked.stdout, checked.stderr
    again = flagperf("vendor", "new", "acme", "--into", str(tmp_path))
    assert again.returncode == 2 and "already exists; nothing was written" in again.stderr
    # A name the project's vendor_images/ has: always found first there, so a folder of it elsewhere is never read
    # (it was written, and the next step said the search path would find it).
    taken = flagperf("vendor", "new", "cpu", "--into", str(tmp_path))
    assert taken.returncode == 2 and not (tmp_path / "cpu").exists(), taken.stdout + taken.stderr
    assert taken.stderr.strip() == ("error: vendor new: cpu is the project's vendor (vendor_images/cpu), which "
                                    "--vendor cpu always finds first: a folder of that name elsewhere would never be "
                                    "read; choose another name (nothing was written)"), taken.stderr


def test_a_base_an_inference_and_a_training_adaptation_are_read_as_a_run_reads_them(walk: Path) -> None:
    cases = walk / "cases"
    write(cases / "base" / "walk-gemm" / "vendor" / "acme.yaml", "m: 1024\nn: 1024\nk: 1024\n")
    write(cases / "inference" / "walk-infer" / "vendor" / "acme_configurations.yaml", "batch_size: 64\n")
    adapted = cases / "training" / "walk-mlp" / "vendor" / "acme"
    write(adapted / "config_acmex1x1.yaml", "lr: 0.08\n")
    write(adapted / "environment_variables.sh", "export ACME_LAUNCH_BLOCKING=0\n")
    found = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1)
    assert found.problems == []
    assert "adaptation of walk-gemm: overrides acme.yaml" in found.passed
    assert "adaptation of walk-infer: overrides acme_configurations.yaml" in found.passed
    assert "adaptation of walk-mlp: scale config_acmex1x1.yaml; environment file" in found.passed
    assert not any("no inference engines" in note for note in found.notes)


def test_each_typical_mistake_is_one_problem_line(walk: Path) -> None:
    vendor, cases = walk / "vendors" / "acme", walk / "cases"
    manifest = vendor / MANIFEST
    manifest.write_text(manifest.read_text().replace("shares_host_memory: true", "shares_host_memory: false"))
    (vendor / "monitor_acme.py").write_text(NAIVE_MONITOR)
    spec = vendor / "spec.py"
    spec.write_text(spec.read_text().replace('"fp64": (None, "TFLOPS")', '"fp64_tflops": (None, "TFLOPS")'))
    write(cases / "base" / "walk-gemm" / "vendor" / "acme.yaml", "M: 1024\n")
    write(cases / "inference" / "walk-infer" / "vendor" / "acme.yaml", "batch_size: 64\n")
    write(cases / "inference" / "walk-infer" / "vendor" / "acme_configurations.yaml", "hidden: 64\n")
    adapted = cases / "training" / "walk-mlp" / "vendor" / "acme"
    write(adapted / "config" / "environment_variables.sh", "export ACME_LAUNCH_BLOCKING=0\n")
    write(adapted / "config_AX1x1x1.yaml", "lr: 0.08\n")
    write(adapted / "acme.yaml", "lr: 0.08\n")  # read in the vendor folder's cases/, not in the case's vendor/acme/
    # FlagPerf's own layout of the vendor folder, copied as it was: each part was silently never read.
    write(vendor / "docker_image" / "pytorch" / "Dockerfile", "FROM python:3.11\nRUN bash pytorch_install.sh\n")
    write(vendor / "acme_monitor.py", "import argparse\n")
    write(vendor / "walk-mlp-pytorch" / "config" / "environment_variables.sh", "export ACME_LAUNCH_BLOCKING=0\n")
    found = check_vendor_folder(vendor, monitor_seconds=1)
    expected = [
        "acme/docker_image: never read: FlagPerf's docker_image/ folder is not used here: the image is built from "
        "<framework>/Dockerfile beside vendor.yaml (container.dockerfile: pytorch/Dockerfile)",
        "acme/acme_monitor.py: never run: FlagPerf's <vendor>_monitor.py is a monitor here only once vendor.yaml "
        "lists it (monitors: [{name: acme, script: acme_monitor.py}])",
        "acme/walk-mlp-pytorch: never read: FlagPerf's <model>-<framework>/ folder is not used here: a case's files "
        "go in cases/training/walk-mlp/ of this folder (environment_variables.sh and requirements.txt directly there, "
        "no config/",
        "vendor.yaml: shares_host_memory: false, but torch.cpu has no mem_get_info()",
        "monitor_acme.py): no sample has a devices list",
        "spec.py peaks.fp64_tflops: not a key any case reads",
        "walk-gemm/vendor/acme.yaml: M: unknown key (did you mean m?)",
        "walk-infer/vendor/acme.yaml: never read: the vendor overrides of inference cases are "
        "vendor/acme_configurations.yaml",
        "walk-infer/vendor/acme_configurations.yaml: hidden: is a case parameter",
        "walk-mlp/vendor/acme/config: never read: FlagPerf's config/ folder is not used here",
        "walk-mlp/vendor/acme/config_AX1x1x1.yaml: never read: <hw> 'AX1' is not vendor acme's hardware 'acme'",
        "walk-mlp/vendor/acme/acme.yaml: never read: the settings file of a case goes in its vendor/ folder, as "
        "vendor/acme.yaml",
    ]
    for line in expected:
        assert sum(line in problem for problem in found.problems) == 1, (line, found.problems)
    assert len(found.problems) == len(expected), found.problems
    assert all("\n" not in problem for problem in found.problems)



def test_a_working_vendor_folder_is_not_taken_for_flagperfs_layout(walk: Path) -> None:
    """What a run reads is never called FlagPerf's leftover layout: an image built from docker_image/pytorch/Dockerfile
    (container.dockerfile says so), a build folder whose context holds config/pip.conf, a folder a case's folder in
    cases/ links to relatively (FlagPerf's <model>-<framework>/config/ kept and linked in), a folder of the vendor's
    own of another name, and its monitor listed as ./acme_monitor.py: each was reported as never read (or run)."""
    vendor = walk / "vendors" / "acme"
    (vendor / "docker_image").mkdir()
    shutil.move(vendor / "pytorch", vendor / "docker_image" / "pytorch")
    write(vendor / "docker_image" / "pytorch" / "config" / "pip.conf", "[global]\n")
    shutil.copytree(vendor / "docker_image" / "pytorch", vendor / "paddle-gpu")  # another framework's build folder
    shutil.move(vendor / "monitor_acme.py", vendor / "acme_monitor.py")
    manifest = (vendor / MANIFEST).read_text()
    (vendor / MANIFEST).write_text(manifest.replace("dockerfile: pytorch/Dockerfile",
                                                    "dockerfile: docker_image/pytorch/Dockerfile")
                                   .replace("script: monitor_acme.py", "script: ./acme_monitor.py"))
    write(vendor / "walk-mlp-pytorch" / "config" / "environment_variables.sh", "export ACME_TUNING=fast\n")
    kept = vendor / "cases" / "training" / "walk-mlp"
    kept.parent.mkdir(parents=True)
    kept.symlink_to("../../walk-mlp-pytorch/config")
    write(vendor / "tools" / "config" / "settings.yaml", "threads: 4\n")  # the vendor's own
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert found.problems == [], found.problems
    assert "adaptation of walk-mlp: environment file" in found.passed, found.passed
    # FlagPerf's layout nothing reads is still named.
    write(vendor / "bert-pytorch" / "config" / "environment_variables.sh", "export ACME_TUNING=fast\n")
    assert [problem.split(": ")[:2] for problem in check_vendor_folder(vendor, monitor_seconds=1).problems] == [
        [str(vendor / "bert-pytorch"), "never read"]]

def test_garbage_from_a_monitor_a_spec_table_of_the_wrong_form_and_a_default_repeated(walk: Path) -> None:
    vendor = walk / "vendors" / "acme"
    (vendor / "monitor_acme.py").write_text("import sys\nopen(sys.argv[sys.argv.index('--out') + 1], 'w')"
                                           ".write('ACME-SMI v1.2\\nGPU0 34C 58W 1234MiB 0%\\n')\n")
    spec = vendor / "spec.py"
    spec.write_text(spec.read_text().replace('"value": value, "unit": unit,', '"value": value,'))
    write(walk / "cases" / "base" / "walk-gemm" / "vendor" / "acme.yaml", "m: 4096\n")
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert any("monitor_acme.py): line 1 of its --out file is not a JSON object ('ACME-SMI v1.2')" in p
               for p in problems)
    assert any("spec.py spec_table(): peaks.fp64.unit: required key is missing" in p for p in problems)
    assert any("walk-gemm/vendor/acme.yaml: m: overrides the default with the same value (4096)" in p
               for p in problems)
    assert len(problems) == 3, problems


def test_every_missing_file_of_the_manifest_is_named_at_once(walk: Path) -> None:
    vendor = walk / "vendors" / "acme"
    (vendor / "pytorch" / "Dockerfile").unlink()
    (vendor / "spec.py").unlink()
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert len(problems) == 2 and "spec_module: 'spec.py' does not exist" in problems[0]
    assert "container.dockerfile: 'pytorch/Dockerfile' does not exist" in problems[1]


def test_an_unknown_manifest_key_names_the_nearest_one(walk: Path) -> None:
    manifest = walk / "vendors" / "acme" / MANIFEST
    manifest.write_text(manifest.read_text().replace("  shm_size: 16g", "  shm_size: 16g\n  visible_devices: X"))
    with pytest.raises(ConfigError, match=r"container\.visible_devices: unknown key \(did you mean "
                                          r"visible_devices_env"):
        load_vendor_manifest(manifest)


def test_validate_refuses_a_file_a_run_would_never_read(walk: Path) -> None:
    cases = walk / "cases"
    adapted = cases / "training" / "walk-mlp" / "vendor" / "acme"
    files = [write(adapted / "config" / "environment_variables.sh", "export A=1\n"),
             write(adapted / "config_AX1x1x1.yaml", "lr: 0.08\n"),
             write(cases / "inference" / "walk-infer" / "vendor" / "acme.yaml", "batch_size: 64\n"),
             write(cases / "base" / "walk-gemm" / "vendor" / "acme_configurations.yaml", "m: 1024\n")]
    env = {"FLAGPERF_VENDOR_PATH": str(walk / "vendors"), "FLAGPERF_CASE_PATH": str(cases)}
    checked = flagperf("validate", *map(str, files), env=env)
    assert checked.returncode == 2
    errors = checked.stderr.splitlines()
    assert len(errors) == 4 and all("never read: " in line for line in errors), checked.stderr
    assert "a run reads vendor/acme/environment_variables.sh" in errors[0]
    assert "so a run reads config_acmex1x1.yaml" in errors[1]
    # A file of the vendor's folder of a case that vendor check names as never read is said to be by validate too,
    # in the same line (validate gave its generic "not a case.yaml, ..." line for the first three).
    strays = [write(adapted / "acme.yaml", "lr: 0.08\n"), write(adapted / "env.sh", "export A=1\n"),
              write(cases / "inference" / "walk-infer" / "vendor" / "acme" / "acme_configurations.yaml",
                    "batch_size: 64\n"),
              write(walk / "vendors" / "acme" / "cases" / "base" / "walk-gemm" / "env.sh", "export A=1\n")]
    problems = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1).problems
    checked = flagperf("validate", *map(str, strays), env=env)
    assert checked.returncode == 2, checked.stdout
    for path, error in zip(strays, checked.stderr.splitlines(), strict=True):
        line = error.removeprefix("error ")
        assert line.startswith(f"{path}: never read: ") and line in problems, (line, problems)


def test_the_engine_folders_are_the_families_own() -> None:
    from flagperf.generate.engines import ENGINES_FOLDER
    from flagperf.inference.engines import INFERENCE_ENGINES
    from flagperf.operation.impls import IMPLEMENTATIONS_FOLDER

    assert ENGINE_FOLDERS == {"inference": INFERENCE_ENGINES, "operation": IMPLEMENTATIONS_FOLDER,
                              "generate": ENGINES_FOLDER}


def test_an_inference_case_without_the_vendors_engine_names_the_vendors_own_folder(walk: Path) -> None:
    vendor = walk / "vendors" / "acme"
    shutil.rmtree(vendor / "engines")
    write(walk / "cases" / "inference" / "walk-infer" / "vendor" / "acme_configurations.yaml", "batch_size: 64\n")
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert any(f"unknown compiler 'onnxruntime' for vendor acme (engines in {vendor / 'engines'}/: none)" in p
               for p in found.problems), found.problems
    assert any(note.startswith("no inference engines") for note in found.notes)


def test_vendor_check_takes_a_vendors_name_as_run_finds_it(tmp_path: Path) -> None:
    """`flagperf vendor check acme` checks the folder `--vendor acme` would use (on FLAGPERF_VENDOR_PATH); a
    name that is neither a folder nor a vendor is one line with the nearest vendor."""
    assert flagperf("vendor", "new", "acme", "--into", str(tmp_path)).returncode == 0
    by_name = flagperf("vendor", "check", "acme", env={"FLAGPERF_VENDOR_PATH": str(tmp_path)})
    assert f"ok manifest {tmp_path / 'acme' / MANIFEST}" in by_name.stdout, by_name.stdout + by_name.stderr
    wrong = flagperf("vendor", "check", "acmee", env={"FLAGPERF_VENDOR_PATH": str(tmp_path)})
    assert wrong.returncode == 2 and "did you mean acme?" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_every_problem_of_a_case_adaptation_is_named_at_once_and_once(walk: Path) -> None:
    """A vendor fixes them in one go: the environment file's, requirements.txt's and hooks.py's problems together
    (a run stops at the first), and the overrides file's once though each scale file reads it again."""
    cases = walk / "cases"
    write(cases / "training" / "walk-mlp" / "vendor" / "acme.yaml", "hidden: 256\n")
    adapted = cases / "training" / "walk-mlp" / "vendor" / "acme"
    write(adapted / "config_acmex1x1.yaml", "lr: 0.08\n")
    write(adapted / "config_acmex1x2.yaml", "lr: 0.07\n")
    write(adapted / "environment_variables.sh", "export ACME_TUNING=fast\nsource /opt/acme/env.sh\n")
    write(adapted / "requirements.txt", "--extra-index-url https://pypi.acme.example/simple\nacme-ops\n")
    # Two hooks a round could not use: each named, not the first only.
    write(adapted / "extern" / "hooks.py", "from acme_ops import wrap_model\ndef on_step(ctx):\n    pass\n")
    problems = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1).problems
    expected = ["walk-mlp/vendor/acme.yaml: hidden: unknown key (a vendor may change: ",
                "acme/environment_variables.sh: line 2: sources another script",
                "acme/requirements.txt: line 1: --extra-index-url (another index) is not read here",
                "acme/extern/hooks.py: line 1: wrap_model: imported: a hook is a def at the top of hooks.py",
                "acme/extern/hooks.py: line 2: on_step: def on_step(ctx) takes 1 argument(s), but a round calls it "
                "as on_step(ctx, step)"]
    for line in expected:
        assert sum(line in problem for problem in problems) == 1, (line, problems)
    assert len(problems) == len(expected), problems


def test_a_new_vendor_is_told_where_case_files_go_and_which_peaks_are_missing(walk: Path) -> None:
    found = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1)
    assert any(note.startswith("no case is adapted for acme yet: a case's settings go in cases/<family>/<case>/vendor"
                               "/acme.yaml (inference: acme_configurations.yaml), a training scale's in vendor/acme/"
                               "config_acmex<nnodes>x<nproc>.yaml") and "extern/hooks.py" in note
               for note in found.notes), found.notes
    assert any("acme/spec.py: no value for fp64, fp32, tf32, bf16, fp16, fp8, int8, memory_bandwidth, "
               "memory_capacity, h2d_bandwidth, d2h_bandwidth, p2p_bandwidth, allreduce_bandwidth, "
               "internode_bandwidth: cases report no ratio or MFU against them" in note
               for note in found.notes), found.notes
    write(walk / "cases" / "inference" / "walk-infer" / "vendor" / "acme_configurations.yaml", "batch_size: 64\n")
    assert not any(note.startswith("no case is adapted") for note in
                   check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1).notes)


def test_the_tutorials_monitor_passes_and_its_missing_recommended_fields_are_a_note(tmp_path: Path) -> None:
    """docs/tutorials/adding-a-vendor.md's monitor (psutil: utilisation and memory, no power or temperature):
    ok, and the recommended fields it does not report are said as a note, neither a fault nor unchecked."""
    tutorial = (PROJECT_ROOT / "docs" / "tutorials" / "adding-a-vendor.md").read_text(encoding="utf-8")
    code = tutorial.split("cat > vendor_images/labcpu/monitor_labcpu.py <<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    folder = write_vendor_folder(tmp_path, "labcpu")
    (folder / "monitor_labcpu.py").write_text(code + "\n")
    found = check_vendor_folder(folder, monitor_seconds=1)
    where = f"monitor labcpu ({folder / 'monitor_labcpu.py'})"
    assert any(line.startswith(where) and " samples in " in line for line in found.passed), found.passed
    assert not any(line.startswith(where) for line in [*found.problems, *found.not_checkable]), found
    assert f"{where}: recommended power_w, temp_c not reported here" in found.notes, found.notes


WRONG_UNITS_SPEC = '''\
def spec_table(settings):
    source = "XC-100 datasheet rev 1.2, table 3"
    return {"device": "XC-100", "peaks": {
        "fp32": {"value": 60.0, "unit": "TFLOPS", "source": source},
        "fp16": {"value": 960.0, "unit": "TFLOPS", "source": source + " (with sparsity)", "dense": False},
        "bf16": {"value": 480000.0, "unit": "GFLOPS", "source": source},
        "int8": {"value": 960.0, "unit": "TFLOPS", "source": source},
        "memory_bandwidth": {"value": 3.2, "unit": "TB/s", "source": source},
        "memory_capacity": {"value": 64.0, "unit": "GB", "source": source},
        "h2d_bandwidth": {"value": 0.0, "unit": "GB/s", "source": source},
        "d2h_bandwidth": {"value": 64.0, "unit": "GB/s", "source": " "},
        "fp8": {"value": None, "unit": "TFLOP/s", "source": "not in the datasheet"},
    }}
'''


def test_a_peak_in_another_unit_or_without_a_figure_is_refused_by_check_and_run(walk: Path) -> None:
    """A datasheet's GFLOPS, TB/s or GB copied as written gave no ratio or MFU at all, silently (a case forms one
    only against a peak in its own unit), and a zero or sourceless figure passed: vendor check names each, and a
    run (the spec table built on the host) stops at the first in one line naming the file and key. A sparse
    figure, which gives no ratio either, is a note."""
    from flagperf.config.vendors import load_vendor

    vendor = walk / "vendors" / "acme"
    (vendor / "spec.py").write_text(WRONG_UNITS_SPEC)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    where = f"{vendor / 'spec.py'} peaks."
    expected = {
        "bf16": "unit 'GFLOPS', but cases measure bf16 in TFLOPS (a ratio or MFU is formed in one unit only): give "
                "the figure in TFLOPS (480000 GFLOPS is 480 TFLOPS)",
        "int8": "unit 'TFLOPS', but cases measure int8 in TOPS",
        "memory_bandwidth": "give the figure in GB/s (3.2 TB/s is 3200 GB/s)",
        # A datasheet's "64 GB" of device memory is 64 GiB: converted as 10^9 bytes (59.6 GiB), the measured
        # capacity came out above 100% of the peak. The device's reported total is asked for, nothing converted.
        "memory_capacity": "unit 'GB', but cases measure memory_capacity in GiB (a ratio or MFU is formed in one "
                           "unit only): give the total the device reports, in GiB (its bytes / 2^30, e.g. from the "
                           "runtime's memory query); a datasheet's \"GB\" of device memory is usually GiB already",
        "h2d_bandwidth": "0 GB/s is no peak: a positive figure, or null where it is not known",
        "d2h_bandwidth": "64 GB/s without a source",
    }
    for key, text in expected.items():
        assert sum(p.startswith(f"{where}{key}: ") and text in p for p in found.problems) == 1, (key, found.problems)
    assert not any("59.6" in p for p in found.problems), found.problems
    # fp8's null figure gives no ratio whatever its unit: refusing it stopped a run for nothing.
    assert len(found.problems) == len(expected), found.problems
    assert not any(line.startswith("peaks:") for line in found.passed), found.passed
    # A sparse figure is honest, but no ratio is shown beside it: the vendor is told why, and what to give.
    assert f"{vendor / 'spec.py'}: fp16 is a sparse figure (dense: false): cases form no ratio or MFU against a " \
           "sparse peak (2:4 sparsity doubles it); give the dense figure, with its source, to have one" in found.notes
    with pytest.raises(ConfigError) as refused:
        load_vendor("acme").spec_table()
    assert str(refused.value).startswith(f"{vendor / 'spec.py'}: peaks.bf16: unit 'GFLOPS'"), str(refused.value)
    (vendor / "spec.py").write_text("def spec_table(settings):\n    return {'device': 'XC-100', 'peaks': "
                                    "{'fp32': {'value': 60.0, 'unit': 'TFLOPS'}}}\n")
    with pytest.raises(ConfigError, match=r"spec\.py spec_table\(\): peaks\.fp32\.source: "):
        load_vendor("acme").spec_table()
    # NaN passed `value <= 0`; the table's schema refuses it (and infinity) in one line naming the key.
    for text in ("nan", "inf"):
        (vendor / "spec.py").write_text("def spec_table(settings):\n    return {'device': 'XC-100', 'peaks': {'fp32': "
                                        f"{{'value': float('{text}'), 'unit': 'TFLOPS', 'source': 'sheet'}}}}}}\n")
        with pytest.raises(ConfigError, match=r"spec_table\(\): peaks\.fp32\.value: .*finite number"):
            load_vendor("acme").spec_table()


def misnamed_monitor(device: str) -> str:
    """A vendor's monitor on flagperf.monitoring's loop, its device entry as given."""
    return ("from flagperf.monitoring import monitor_arguments, run_sampler\n"
            "args = monitor_arguments('acme').parse_args()\n"
            "raise SystemExit(run_sampler('acme', args, {'devices': [{'index': 0}]}, "
            f"lambda: {{'devices': [{device}]}}))\n")


@pytest.mark.parametrize(("device", "problems", "note"), [
    # Its tool's names: the analysis reads none of them, so memory, power and temperature were missing from every
    # report with only "not reported here" said.
    ("{'index': 0, 'util_percent': 40.0, 'mem_used_mb': 1359, 'power': 120.5, 'temperature': 55}",
     ["no device sample has mem_used_bytes (required: timestamp, utilisation, memory); it writes mem_used_mb, "
      "which no part of the analysis reads: name the figure mem_used_bytes (in bytes)"],
     "recommended power_w, temp_c not reported here; it writes power, which no part of the analysis reads: name "
     "the figure power_w (in watts); it writes temperature, which no part of the analysis reads: name the figure "
     "temp_c (in degrees Celsius)"),
    # The right names, figures in other units: MiB for bytes, a share for a percentage summed over cores.
    ("{'index': 0, 'util_percent': 350.0, 'mem_used_bytes': 1359, 'mem_total_bytes': 24105, 'power_w': 120.5, "
     "'temp_c': 55}",
     ["util_percent 350 is outside 0 to 100 (a percentage of the device, not summed over its units)",
      "mem_total_bytes 24105 is under 64 MiB: a count of MiB or MB? the memory fields are in bytes"], None),
    ("{'index': 0, 'util_percent': 35.0, 'mem_used_bytes': 1359 * 2**30, 'mem_total_bytes': 24105 * 2**20, "
     "'power_w': 120.5, 'temp_c': 55}",
     ["mem_used_bytes above mem_total_bytes: the two in different units? both are bytes"], None),
    # Other figures in the analysis's units (AMD's HBM temperature, a power limit) are no misnaming of temp_c and
    # power_w: renaming them would report the wrong figure. A power in another unit still is one.
    ("{'index': 0, 'util_percent': 35.0, 'mem_used_bytes': 2**30, 'temp_mem_c': 60, 'power_limit_w': 300.0, "
     "'power_mw': 120500}", [],
     "recommended power_w, temp_c not reported here; it writes power_mw, which no part of the analysis reads: name "
     "the figure power_w (in watts)"),
])
def test_a_monitor_field_by_another_name_or_in_another_unit_is_named(
        tmp_path: Path, device: str, problems: list[str], note: str | None) -> None:
    folder = write_vendor_folder(tmp_path, "acme")
    (folder / "monitor_acme.py").write_text(misnamed_monitor(device))
    found = check_vendor_folder(folder, monitor_seconds=1)
    where = f"monitor acme ({folder / 'monitor_acme.py'}): "
    assert [p for p in found.problems if p.startswith(where)] == [where + p for p in problems], found.problems
    if note is not None:
        assert where + note in found.notes, found.notes


def test_a_figure_filled_in_under_the_templates_source_is_a_problem(tmp_path: Path) -> None:
    """The scaffold's FIGURES filled in, its DATASHEET and device name left as written: every report would show
    the figure with "TODO: the datasheet's title ..." as its source, and "TODO" as the device."""
    folder = write_vendor_folder(tmp_path, "acme")
    spec = folder / "spec.py"
    spec.write_text(spec.read_text().replace('"fp32": (None, "TFLOPS"),', '"fp32": (60.0, "TFLOPS"),'))
    found = check_vendor_folder(folder, monitor_seconds=1)
    assert found.problems == [f"{spec} peaks.fp32: 60 TFLOPS with the template's source (\"TODO: the datasheet's "
                              "title, revision and table (dense figur\"): name the datasheet"], found.problems
    assert f"{spec}: the device is still the template's ('TODO: the device name as the driver reports it'): every " \
           "report names it" in found.notes, found.notes


FLAGPERF_MONITOR = """\
import argparse
p = argparse.ArgumentParser()
p.add_argument("-o", "--operation", choices=["start", "stop", "restart", "status"], required=True)
p.add_argument("-l", "--log", default="./logs/")
p.parse_args()
"""


def test_a_monitor_kept_from_flagperf_is_told_the_contract_here(tmp_path: Path) -> None:
    """FlagPerf's vendor guide asks for <vendor>_monitor.py -o start|stop -l LOGDIR, and a vendor brings it along:
    argparse's "arguments are required: -o/--operation" alone did not say what a monitor takes here."""
    folder = write_vendor_folder(tmp_path, "acme")
    (folder / "monitor_acme.py").write_text(FLAGPERF_MONITOR)
    found = check_vendor_folder(folder, monitor_seconds=1)
    assert found.problems == [
        f"monitor acme ({folder / 'monitor_acme.py'}): exited 2 when run as `python {folder / 'monitor_acme.py'} "
        "--out FILE --interval 1 --max-seconds 1`: monitor_acme.py: error: the following arguments are required: "
        "-o/--operation; a monitor takes --out FILE --interval S --max-seconds N --pid-file F --parent-pid P and "
        "writes JSON lines, not FlagPerf's -o start|stop -l LOGDIR: flagperf.monitoring's monitor_arguments and "
        "run_sampler do both (the scaffold's monitor uses them; docs/vendor-guide.md, section 1)"], found.problems


def test_every_refused_line_of_an_overrides_or_scale_file_is_named_at_once(walk: Path) -> None:
    """A FlagPerf config_<hw>x1x1.py copied whole restates defaults and sets keys a vendor may not change: each
    was named only once the one before it was fixed (a check, a fix, a check ... per line)."""
    cases = walk / "cases"
    overrides = write(cases / "training" / "walk-mlp" / "vendor" / "acme.yaml", "hidden: 256\nseed: 1\n")
    scale = write(cases / "training" / "walk-mlp" / "vendor" / "acme" / "config_acmex1x1.py",
                  "lr = 0.05\nmax_epochs = 3\nnproc_per_node = 2\nbatch_size = 64\n")
    problems = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1).problems
    # A key the case does not have is unknown, named as such (not "not mutable", which sent a vendor looking for a
    # key to unlock); a key the case has is not mutable.
    expected = [f"{overrides}: hidden: unknown key (a vendor may change: batch_size, cpu_threads, log_freq, lr, ",
                f"{overrides}: seed: is a case parameter",
                f"{scale}: lr: sets the value it already has (0.05); remove the line",
                f"{scale}: max_epochs: is not in the case's mutable list",
                f"{scale}: nproc_per_node: 2 contradicts the file name (config_acmex1x1.py)"]
    for line in expected:
        assert sum(problem.startswith(line) for problem in problems) == 1, (line, problems)
    assert len(problems) == len(expected), problems
    write(overrides, "timeout_s: 120\n")
    checked = flagperf("validate", str(scale))
    assert checked.returncode == 2, checked
    errors = [line.removeprefix("error ") for line in checked.stderr.splitlines() if line.startswith("error ")]
    assert len(errors) == 3 and all(e.startswith(line) for e, line in zip(errors, expected[2:], strict=True)), errors


def test_a_scale_file_is_checked_against_the_overrides_file_keys_accepted(walk: Path) -> None:
    """One refused line in the overrides file had the scale file checked against the bare defaults, the valid
    lines dropped: a scale file's line setting lr back to the default after the overrides changed it was told
    "sets the value it already has; remove the line". The accepted lines stay merged."""
    adapted = walk / "cases" / "training" / "walk-mlp" / "vendor"
    overrides = write(adapted / "acme.yaml", "seed: 1\nlr: 0.1\nnproc_per_node: 2\n")
    scale = write(adapted / "acme" / "config_acmex1x2.yaml", "lr: 0.05\nbatch_size: 16\n")
    problems = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1).problems
    expected = [f"{overrides}: seed: is a case parameter",
                f"{scale}: batch_size: sets the value it already has (16); remove the line"]
    for line in expected:
        assert sum(problem.startswith(line) for problem in problems) == 1, (line, problems)
    assert len(problems) == len(expected), problems


def test_a_key_the_case_does_not_have_is_unknown_not_immutable(walk: Path, tmp_path: Path) -> None:
    """A vendor file's typo was told "not in the case's mutable list", which sent a vendor looking for a way to
    unlock a key that does not exist; the scale file said "unknown key" for the same. Both say unknown key with
    what was likely meant, and "not mutable" only for a key the case has."""
    from flagperf.config.plan import plan_run

    adapted = walk / "cases" / "training" / "walk-mlp" / "vendor"
    overrides = write(adapted / "acme.yaml", "lrr: 0.1\nmax_epochs: 2\n")
    scale = write(adapted / "acme" / "config_acmex1x1.yaml", "batch_sise: 8\n")
    expected = [f"{overrides}: lrr: unknown key (did you mean lr?)",
                f"{overrides}: max_epochs: is not in the case's mutable list",
                f"{scale}: batch_sise: unknown key (did you mean batch_size?)"]
    problems = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1).problems
    for line in expected:
        assert sum(problem.startswith(line) for problem in problems) == 1, (line, problems)
    assert len(problems) == len(expected), problems
    with pytest.raises(ConfigError) as refused:
        plan_run(cases=["walk-mlp"], vendor="acme", results_dir=tmp_path / "results")
    said = [str(refused.value), *map(str, refused.value.more)]
    assert [line for line in said if "unknown key" in line] == [expected[0], expected[2]], said


def test_a_misspelt_peak_key_is_refused_by_the_run_as_by_the_check(walk: Path) -> None:
    """vendor check named a key no case reads, but a run took the table: the case looked its own key up and found
    none, so its ratio was silently missing. Now both refuse it, in the same line."""
    from flagperf.config.vendors import load_vendor

    vendor = walk / "vendors" / "acme"
    (vendor / "spec.py").write_text(
        "def spec_table(settings):\n    source = 'XC-100 datasheet, table 2'\n"
        "    return {'device': 'XC-100', 'peaks': {'fp32': {'value': 60.0, 'unit': 'TFLOPS', 'source': source},\n"
        "                                          'bf_16': {'value': 120.0, 'unit': 'TFLOPS', 'source': source}}}\n")
    line = f"{vendor / 'spec.py'}: peaks.bf_16: not a key any case reads (did you mean bf16 or fp16? known: "
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert len(problems) == 1 and problems[0].replace(" peaks.", ": peaks.", 1).startswith(line), problems
    with pytest.raises(ConfigError) as refused:
        load_vendor("acme").spec_table()
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)


def test_a_peak_key_no_case_reads_with_no_figure_does_not_stop_a_run(walk: Path) -> None:
    """A precision no case measures yet (fp4), listed without a figure, loses no ratio: it stopped every run of an
    external vendor once unknown keys were refused at run time. vendor check still names it (a misspelt key
    would silently lose its figure once filled in)."""
    from flagperf.config.vendors import load_vendor

    vendor = walk / "vendors" / "acme"
    (vendor / "spec.py").write_text(
        "def spec_table(settings):\n    source = 'XC-100 datasheet, table 2'\n"
        "    return {'device': 'XC-100', 'peaks': {'fp32': {'value': 60.0, 'unit': 'TFLOPS', 'source': source},\n"
        "                                          'fp4': {'value': None, 'unit': 'TFLOPS', 'source': ''}}}\n")
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert len(problems) == 1 and "peaks.fp4: not a key any case reads" in problems[0], problems
    assert "fp4" in load_vendor("acme").spec_table().peaks


def test_an_unknown_key_of_a_case_whose_keys_are_all_fixed_says_so() -> None:
    from flagperf.config.models import unknown_key_problem

    assert unknown_key_problem("zzz", ["lr", "seed"], mutable=[]) == \
        "unknown key (a vendor may change none of this case's keys)"
    assert unknown_key_problem("zzz", ["lr"], mutable=[f"key{i}" for i in range(40)]) == "unknown key"


def test_what_vendor_check_cannot_see_of_a_hook_is_a_note_not_an_ok(walk: Path) -> None:
    """make_optimizer returning another class than the case's was "ok" at vendor check and refused only when a
    round ran it: which class a hook returns is known only once it has run, and checking a file never runs it
    (the hook file below would leave a mark if it were imported)."""
    vendor = walk / "vendors" / "acme"
    mark = walk / "imported"
    write(walk / "cases" / "training" / "walk-mlp" / "vendor" / "acme" / "extern" / "hooks.py",
          f"import pathlib\nimport torch\npathlib.Path({str(mark)!r}).write_text('run')\n\n\n"
          "def make_optimizer(cls, params, kwargs, ctx):\n    return torch.optim.SGD(params, lr=0.1)\n\n\n"
          "@torch.no_grad()\ndef on_step(step):\n    pass\n")
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert found.problems == [] and not mark.exists()
    assert "adaptation of walk-mlp: extern make_optimizer,on_step (read, not run)" in found.passed, found.passed
    hooks = walk / "cases" / "training" / "walk-mlp" / "vendor" / "acme" / "extern" / "hooks.py"
    assert f"{hooks}: make_optimizer: checked when a round calls it, not here (checking a file never runs it): the " \
           "optimizer it returns is an instance of exactly the class the case asks for, holding exactly the case's " \
           "parameters" in found.notes, found.notes
    # A decorated hook's arguments are what the decorator returns takes: checked when a round loads it, said so.
    assert f"{hooks}: line 11: on_step: decorated, so whether a round can call what the decorator returns as " \
           "on_step(ctx, step) is checked when a round loads hooks.py, not here (checking a file never runs it)" in \
           found.notes, found.notes


def test_a_dockerfile_of_another_framework_is_checked_and_said_to_be_built_only_when_named(walk: Path) -> None:
    """FlagPerf allows a Dockerfile per framework; only the default one (container.dockerfile) was checked, and
    nothing said that another is built only for a case a FlagPerf host.yaml maps to its framework."""
    vendor = walk / "vendors" / "acme"
    write(vendor / "paddle" / "Dockerfile", "FROM python:3.11-slim\nCOPY paddle_install.sh /opt/\n")
    found = check_vendor_folder(vendor, monitor_seconds=1)
    dockerfile = vendor / "paddle" / "Dockerfile"
    assert found.problems == [f"{dockerfile}: no install step (a RUN line, or FlagPerf's <framework>_install.sh "
                              "beside it)", f"{dockerfile}: line 2: copies paddle_install.sh, which is not in "
                              f"{vendor / 'paddle'}"], found.problems
    assert f"{dockerfile}: built only for a case a FlagPerf host.yaml maps to framework paddle (CASES: {{<case>: " \
           "paddle}); every other run (an inventory, a test_conf.py) builds container.dockerfile " \
           "(pytorch/Dockerfile)" in found.notes, found.notes


def test_a_vendor_kept_outside_the_project_keeps_its_case_files_in_its_own_folder(walk: Path, tmp_path: Path
                                                                                  ) -> None:
    """`vendor new --into DIR` makes a vendor of its own repository, but its adaptations had to go into the case
    folders (a case's vendor/<vendor>/), so a vendor could not keep its work in one place. Its folder's
    cases/<family>/<case>/ holds the same files: vendor check, validate and the plan read them (a run's rounds read
    them through the same place, tests/integration/test_vendor_adaptation.py and test_vendor_hosts.py), and the
    source digest covers them; both places at once are refused in one line, and a folder of no case is named."""
    from flagperf.config.plan import plan_run
    from flagperf.results.provenance import source_digest

    vendor = walk / "vendors" / "acme"
    kept = vendor / "cases" / "training" / "walk-mlp"
    write(kept / "config_acmex1x1.yaml", "lr: 0.08\n")
    env = write(kept / "environment_variables.sh", "export ACME_TUNING=fast\n")
    hooks = write(kept / "extern" / "hooks.py", "def on_step(ctx, step):\n    pass\n")
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert found.problems == []
    assert "adaptation of walk-mlp: scale config_acmex1x1.yaml; environment file; extern on_step (read, not run)" \
        in found.passed, found.passed
    assert not any(note.startswith("no case is adapted") for note in found.notes), found.notes
    for path, kind in ((env, "vendor acme's adaptation of walk-mlp (in its folder)"),
                       (hooks, "vendor acme's adaptation of walk-mlp (in its folder)"),
                       (kept / "config_acmex1x1.yaml", "training scale overrides of walk-mlp (vendor acme's folder)")):
        checked = flagperf("validate", str(path))
        assert checked.returncode == 0 and kind in " ".join(checked.stdout.split()), checked.stdout + checked.stderr
    plan = plan_run(cases=["walk-mlp"], vendor="acme", results_dir=tmp_path / "results")
    assert plan.cases[0].config["lr"] == 0.08 and plan.cases[0].origins["lr"] == str(kept / "config_acmex1x1.yaml")
    assert plan.cases[0].vendor_folder == str(kept)
    before = source_digest(vendor="acme", cases=plan.case_folders)
    env.write_text("export ACME_TUNING=slow\n")
    assert source_digest(vendor="acme", cases=plan.case_folders) != before

    # A file read by a run is checked as a run reads it, here too.
    env.write_text("ulimit -n 65536\n")
    assert f"{env}: line 1: not an assignment" in "\n".join(check_vendor_folder(vendor, monitor_seconds=1).problems)
    case_yaml = walk / "cases" / "training" / "walk-mlp" / "case.yaml"
    refused = flagperf("validate", str(case_yaml))
    assert refused.returncode == 2 and f"{env}: line 1: not an assignment" in refused.stderr, refused.stderr
    env.write_text("export ACME_TUNING=fast\n")

    # Both places: a run would read one and silently drop the other's files.
    write(walk / "cases" / "training" / "walk-mlp" / "vendor" / "acme" / "config_acmex1x2.yaml", "lr: 0.07\n")
    both = (f"vendor acme's files of case walk-mlp are also in {walk}/cases/training/walk-mlp/vendor/acme: keep them "
            "in one")
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert problems == [f"{kept}: {both} of the two places (a run reads one)"], problems
    with pytest.raises(ConfigError, match=re.escape(both)):
        plan_run(cases=["walk-mlp"], vendor="acme", results_dir=tmp_path / "results")
    refused = flagperf("validate", str(env))
    assert refused.returncode == 2 and both in refused.stderr and len(refused.stderr.splitlines()) == 1
    shutil.rmtree(walk / "cases" / "training" / "walk-mlp" / "vendor")

    # A folder no run reads: a misspelt case, a case under another family.
    write(vendor / "cases" / "training" / "walk-mpl" / "environment_variables.sh", "export A=1\n")
    write(vendor / "cases" / "base" / "walk-mlp" / "environment_variables.sh", "export A=1\n")
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert any(problem.startswith(f"{vendor}/cases/training/walk-mpl: never read: unknown training case 'walk-mpl' "
                                  "(did you mean walk-mlp? known: ") for problem in problems), problems
    assert f"{vendor}/cases/base/walk-mlp: never read: walk-mlp is a training case: its folder here is " \
           "cases/training/walk-mlp/" in problems, problems
    assert len(problems) == 2, problems


def test_a_vendor_kept_outside_keeps_its_settings_files_in_its_own_folder_too(walk: Path, tmp_path: Path) -> None:
    """The settings files (vendor/<vendor>.yaml, an inference case's vendor/<vendor>_configurations.yaml) had to stay
    in the case's vendor/ folder while the rest of the case's files could be kept in the vendor's own repository:
    <vendor folder>/cases/<family>/<case>/ now holds them by the same name, read by vendor check, validate and the
    plan; one file in both places is refused in one line naming the two, and a misnamed one is named."""
    from flagperf.config.plan import plan_run

    vendor, cases = walk / "vendors" / "acme", walk / "cases"
    kept = vendor / "cases"
    gemm = write(kept / "base" / "walk-gemm" / "acme.yaml", "m: 1024\n")
    infer = write(kept / "inference" / "walk-infer" / "acme_configurations.yaml", "batch_size: 64\n")
    mlp = write(kept / "training" / "walk-mlp" / "acme.yaml", "timeout_s: 900\n")
    write(kept / "training" / "walk-mlp" / "config_acmex1x1.yaml", "lr: 0.08\n")
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert found.problems == [], found.problems
    for line in ("adaptation of walk-gemm: overrides acme.yaml", "adaptation of walk-infer: overrides "
                 "acme_configurations.yaml", "adaptation of walk-mlp: overrides acme.yaml; scale config_acmex1x1.yaml"):
        assert line in found.passed, found.passed
    plan = plan_run(cases=["walk-gemm", "walk-mlp"], vendor="acme", results_dir=tmp_path / "results")
    origins = {case.name: case.origins for case in plan.cases}
    assert origins["walk-gemm"]["m"] == str(gemm) and origins["walk-mlp"]["timeout_s"] == str(mlp), origins
    assert origins["walk-mlp"]["lr"] == str(kept / "training" / "walk-mlp" / "config_acmex1x1.yaml")
    checked = flagperf("validate", str(gemm), str(infer), str(mlp))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    said = " ".join(checked.stdout.split())
    for case in ("walk-gemm", "walk-infer", "walk-mlp"):
        assert f"(vendor overrides of {case} (vendor acme's folder))" in said, said

    # One file in both places: a run would read one and silently drop the other's settings.
    write(cases / "base" / "walk-gemm" / "vendor" / "acme.yaml", "m: 2048\n")
    both = (f"{gemm}: vendor acme's settings of case walk-gemm are also in {cases}/base/walk-gemm/vendor/acme.yaml: "
            "keep them in one of the two places (a run reads one)")
    assert check_vendor_folder(vendor, monitor_seconds=1).problems == [both]
    with pytest.raises(ConfigError, match=re.escape(both)):
        plan_run(cases=["walk-gemm"], vendor="acme", results_dir=tmp_path / "results")
    refused = flagperf("validate", str(gemm), str(cases / "base" / "walk-gemm" / "vendor" / "acme.yaml"))
    assert refused.returncode == 2 and refused.stderr.splitlines() == [f"error {both}"] * 2, refused.stderr
    (cases / "base" / "walk-gemm" / "vendor" / "acme.yaml").unlink()

    # The case's own vendor/acme/ folder as well as the vendor folder's cases/base/walk-gemm/: a run reads the vendor's
    # files of the case from one place, so the plan refuses both; validate of the settings file passed (only a
    # training scale file looked at the two places), now it says what the plan says, as vendor check does.
    own = write(cases / "base" / "walk-gemm" / "vendor" / "acme" / "environment_variables.sh", "export A=1\n").parent
    folders = (f"{gemm.parent}: vendor acme's files of case walk-gemm are also in {own}: keep them in one of the two "
               "places (a run reads one)")
    with pytest.raises(ConfigError, match=re.escape(folders)):
        plan_run(cases=["walk-gemm"], vendor="acme", results_dir=tmp_path / "results")
    assert check_vendor_folder(vendor, monitor_seconds=1).problems == [folders]
    refused = flagperf("validate", str(gemm))
    assert refused.returncode == 2 and refused.stderr.strip() == f"error {folders}", refused.stderr
    shutil.rmtree(own)

    # An inference case's settings by the training name: never read, named where it is.
    wrong = write(kept / "inference" / "walk-infer" / "acme.yaml", "batch_size: 32\n")
    expected = (f"{wrong}: never read: the vendor overrides of inference cases are acme_configurations.yaml in "
                f"{kept / 'inference' / 'walk-infer'}")
    assert check_vendor_folder(vendor, monitor_seconds=1).problems == [expected]
    refused = flagperf("validate", str(wrong))
    assert refused.returncode == 2 and refused.stderr.strip() == f"error {expected}", refused.stderr


def test_a_shadowed_vendor_folder_is_said_to_be_and_lends_no_engine(walk: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two folders of one vendor (each with its vendor.yaml) on the search path: `--vendor acme` reads the first
    whole. Its engines were merged with the later one's (an engine the first lacked came from a copy of the vendor
    nothing else of the run read), and `flagperf validate` passed the later folder's files, which no run reads. Now
    the later copy lends no engine, the missing engine's line names it, and vendor check and validate say which
    folder shadows which. A folder of the name without a vendor.yaml still adds its engines (a lab's own library
    for a vendor, docs/operation.md), and vendor check says so."""
    from flagperf.config.engines import engine_folders

    later = walk / "vendors" / "acme"
    first = write_vendor_folder(tmp_path / "first", "acme")  # no engines/
    extension = tmp_path / "lab" / "acme" / "engines" / "onnxruntime"
    shutil.copytree(later / "engines" / "onnxruntime", extension)
    lab = str(tmp_path / "lab")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", os.pathsep.join([str(tmp_path / "first"), str(walk / "vendors"), lab]))
    assert engine_folders("acme", "engines") == {"onnxruntime": extension}
    assert f"{extension.parent.parent}: a folder of vendor acme without a vendor.yaml: its engines join this " \
           "folder's (where both have an engine of a name, the first on the search path is used)" in \
           check_vendor_folder(first, monitor_seconds=1).notes
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", os.pathsep.join([str(tmp_path / "first"), str(walk / "vendors")]))
    assert engine_folders("acme", "engines") == {}
    write(walk / "cases" / "inference" / "walk-infer" / "vendor" / "acme_configurations.yaml", "batch_size: 64\n")
    found = check_vendor_folder(first, monitor_seconds=1)
    order = "vendor_images/, then FLAGPERF_VENDOR_PATH in order"
    # The hint comes first and names each folder once: the line holds it whatever the temporary folder's length
    # (the line is cut at MAX_LINE; four full paths once cut the hint off under pytest's default basetemp). Expected
    # as every error shows it: one_line, which shortens the middles of long paths where the temporary folder is deep.
    configurations = walk / "cases" / "inference" / "walk-infer" / "configurations.yaml"
    expected = one_line(f"unknown compiler 'onnxruntime' for vendor acme: {later} has it (engines/onnxruntime/) but is "
                        f"never read: {first} comes first on the search path and shadows it (engines in its engines/: "
                        "none)", lead=f"{configurations}: compiler:")
    unknown = [problem for problem in found.problems if "unknown compiler 'onnxruntime'" in problem]
    assert unknown == [expected], (expected, found.problems)
    # the shadowed copy named (its path's end where the line is long) and the advice kept
    assert "/vendors/acme has it (engines/onnxruntime/) but is never read: " in unknown[0], unknown[0]
    assert len(unknown[0]) <= MAX_LINE
    assert f"{later} is shadowed by this folder: --vendor acme reads this one ({order}), nothing of that one (its " \
           "engines and case files neither)" in found.notes, found.notes
    shadowed = (f"shadowed by {first}: --vendor acme reads the first folder of the name ({order}), nothing of this "
                f"one; list {walk / 'vendors'} before {tmp_path / 'first'} on FLAGPERF_VENDOR_PATH, or rename this "
                "vendor")
    assert one_line(shadowed, lead=f"{later}:") in check_vendor_folder(later, monitor_seconds=1).problems
    kept = write(later / "cases" / "training" / "walk-mlp" / "environment_variables.sh", "export A=1\n")
    checked = flagperf("validate", str(later / MANIFEST), str(kept), str(first / MANIFEST))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    errors = checked.stderr.splitlines()
    assert len(errors) == 2, errors  # each one line (shortened to 500 characters where this test's paths are long)
    advice = shadowed[shadowed.index("; list "):]
    for path, error in zip((later / MANIFEST, kept), errors, strict=True):
        # A long line loses the middle of a path in its message, never the file it names nor the advice at its end.
        assert error.startswith(f"error {path}: never read: shadowed by ") and error.endswith(advice), error
        assert len(error) <= len("error ") + MAX_LINE, error
    assert f"ok    {first / MANIFEST} (vendor)" in checked.stdout, checked.stdout


def test_an_absolute_link_in_the_vendors_cases_is_refused_by_check_and_validate(walk: Path) -> None:
    """A link in the vendor folder's cases/ to a place in the folder by its absolute path stays inside the folder
    here, so nothing refused it until a round's container (which has the folder at another path) found it dangling.
    vendor check and validate now name the link in one line; a relative link inside the folder passes."""
    vendor = walk / "vendors" / "acme"
    shared = vendor / "adaptations" / "mlp"  # one adaptation the vendor links in as the case's
    env = write(shared / "environment_variables.sh", "export ACME_TUNING=fast\n")
    link = vendor / "cases" / "training" / "walk-mlp"
    link.parent.mkdir(parents=True)
    link.symlink_to(shared)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    line = (f"{link}: links to {shared} by its absolute path: where the vendor folder is at another path (a clone of "
            "it, a host's copy, a round's container) it leads nowhere; make the link relative, to a file inside the "
            "vendor folder, or copy the file")
    assert found.problems == [line], found.problems
    refused = flagperf("validate", str(link / env.name))
    assert refused.returncode == 2 and refused.stderr.strip() == f"error {line}", refused.stderr
    # Linked relatively, the folder is looked through: a file in it linked by its absolute path is named as well.
    link.unlink()
    link.symlink_to(os.path.relpath(shared, link.parent))
    scale = write(shared / "config_acmex1x2.yaml", "lr: 0.07\n")
    (shared / "config_acmex1x1.yaml").symlink_to(scale)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert found.problems == [f"{link / 'config_acmex1x1.yaml'}: links to {scale} by its absolute path: where the "
                              "vendor folder is at another path (a clone of it, a host's copy, a round's container) it "
                              "leads nowhere; make the link relative, to a file inside the vendor folder, or copy the "
                              "file"], found.problems
    (shared / "config_acmex1x1.yaml").unlink()
    (shared / "config_acmex1x1.yaml").symlink_to(scale.name)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert found.problems == [] and "adaptation of walk-mlp: scale config_acmex1x1.yaml; scale config_acmex1x2.yaml; " \
                                    "environment file" in found.passed, found.passed
    checked = flagperf("validate", str(link / env.name))
    assert checked.returncode == 0, checked.stderr


def test_an_absolute_link_in_an_engine_folder_of_the_vendor_is_named_by_check(walk: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A round reads the engines of the vendor's folder and of every folder of its name without a vendor.yaml (a
    lab's own engines, wherever on the search path): in a container each is at another path, so a link in them by an
    absolute path leads nowhere there. vendor check names such a link in each; the container policy refuses it only
    once a round starts (test_container_policy)."""
    vendor = walk / "vendors" / "acme"
    lab = walk / "lab" / "acme" / "engines" / "labrt"
    shutil.copytree(vendor / "engines" / "onnxruntime", lab)
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", os.pathsep.join([str(walk / "lab"), str(walk / "vendors")]))
    weights = write(walk / "weights" / "model.onnx", "onnx\n")
    for engine in (vendor / "engines" / "onnxruntime", lab):
        (engine / "model.onnx").symlink_to(weights)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    for engine in (vendor / "engines" / "onnxruntime", lab):
        assert f"{engine / 'model.onnx'}: links to {weights} by its absolute path: where the vendor folder is at " \
               "another path (a clone of it, a host's copy, a round's container) it leads nowhere; make the link " \
               "relative, to a file inside the vendor folder, or copy the file" in found.problems, found.problems
    assert len(found.problems) == 2, found.problems


def validate_lines(*paths: Path) -> tuple[int, list[str]]:
    """`flagperf validate` in this process (no interpreter started): its exit code and its lines, each joined."""
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["validate", *map(str, paths)])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, [" ".join(line.split()) for line in result.output.splitlines()]


def test_validate_of_a_case_yaml_reads_each_vendors_settings_file_where_a_run_reads_it(walk: Path) -> None:
    """validate of a case.yaml read each vendor's adaptation folder but not its settings file (vendor/<vendor>.yaml,
    or the same name in the vendor folder's cases/<family>/<case>/): a wrong key there passed until the run. Now each
    is read as a run of that vendor reads it, every finding one line naming the file and key, and never run."""
    cases, vendor = walk / "cases", walk / "vendors" / "acme"
    gemm = cases / "base" / "walk-gemm" / "case.yaml"
    own = write(gemm.parent / "vendor" / "acme.yaml", "M: 1024\n")
    other = write(gemm.parent / "vendor" / "other.yaml", "warmup_iter: -5\n")  # a vendor not installed here
    mlp = cases / "training" / "walk-mlp" / "case.yaml"
    kept = write(vendor / "cases" / "training" / "walk-mlp" / "acme.yaml", "timeout_s: 900\nlr: 0.1\nbogus: 1\n")
    scale = write(kept.parent / "config_acmex1x1.py", "batch_size = 8\nimport os\n")  # a run reads, never runs, it
    code, lines = validate_lines(gemm, mlp)
    assert code == 2, lines
    assert f"error {own}: M: unknown key (did you mean m?)" in lines, lines
    assert any(line.startswith(f"error {other}: warmup_iter: ") for line in lines), lines
    assert any(line.startswith(f"error {kept}: bogus: unknown key") for line in lines), lines
    assert f"error {scale}:2: an import of os: only top-level NAME = literal assignments are read (this file is " \
           "never run)" in lines, lines
    assert len(lines) == 4, lines
    own.write_text("m: 1024\n")
    other.unlink()
    kept.write_text("timeout_s: 900\n")
    scale.write_text("batch_size = 8\n")
    code, lines = validate_lines(gemm, mlp)
    assert code == 0 and lines == [f"ok {gemm} (case)", f"ok {mlp} (case)"], lines
    # A settings file by a name no run reads is said so too.
    wrong = write(gemm.parent / "vendor" / "acme_configurations.yaml", "m: 512\n")
    code, lines = validate_lines(gemm)
    assert code == 2 and lines == [f"error {wrong}: never read: the vendor overrides of base cases are "
                                   "vendor/acme.yaml"], lines


def test_an_absolute_link_anywhere_in_the_vendor_folder_is_named_by_check_and_validate(walk: Path) -> None:
    """Only the vendor folder's cases/ and engine folders were scanned for links by an absolute path: one elsewhere
    (a monitor script, a module the spec imports) passed vendor check and validate and dangled in a round's container,
    which has the whole folder at another path. Each is now named by both, in the same words; a relative link and a
    .venv's links (no round reads it) pass."""
    vendor = walk / "vendors" / "acme"
    monitor = vendor / "monitor_acme.py"
    real = vendor / "tools" / "monitor_acme.py"
    real.parent.mkdir()
    monitor.rename(real)
    monitor.symlink_to(real)  # inside the folder here, so vendor.yaml's own check of the script passes
    helper = write(walk / "acme-sdk" / "peaks.py", "PEAKS = {}\n")
    (vendor / "tools" / "peaks.py").symlink_to(helper)
    engine = vendor / "engines" / "onnxruntime"
    (engine / "model.onnx").symlink_to(helper)
    venv = vendor / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)

    def line(link: Path, target: Path) -> str:
        return (f"{link}: links to {target} by its absolute path: where the vendor folder is at another path (a clone "
                "of it, a host's copy, a round's container) it leads nowhere; make the link relative, to a file "
                "inside the vendor folder, or copy the file")

    expected = [line(engine / "model.onnx", helper), line(monitor, real), line(vendor / "tools" / "peaks.py", helper)]
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert sorted(found.problems) == sorted(expected), found.problems
    code, lines = validate_lines(vendor / MANIFEST, engine / "engine.yaml")
    assert code == 2 and lines == [f"error {text}" for text in [*expected, expected[0]]], lines
    monitor.unlink()
    monitor.symlink_to(os.path.relpath(real, monitor.parent))
    for copied in (vendor / "tools" / "peaks.py", engine / "model.onnx"):  # copied in instead
        copied.unlink()
        shutil.copy(helper, copied)
    assert check_vendor_folder(vendor, monitor_seconds=1).problems == []
    code, lines = validate_lines(vendor / MANIFEST, engine / "engine.yaml")
    assert code == 0, lines


def test_validate_reads_a_vendor_not_installed_here_without_its_engines(walk: Path) -> None:
    """A generate case's settings for a vendor not installed here (vendor/kunlunxin.yaml) failed validate of the
    case.yaml: the engine the case names was looked up among that vendor's engines (none here) and blamed on
    case.yaml: configurations.engine. Its file is now read as strictly as ever, its engines not looked up, and a note
    says so."""
    gen = walk / "cases" / "generate" / "walk-gen"
    shutil.copytree(PROJECT_ROOT / "cases" / "generate" / "tiny-llama-generate", gen,
                    ignore=shutil.ignore_patterns("vendor", "__pycache__"))
    manifest = gen / "case.yaml"
    manifest.write_text(manifest.read_text().replace("name: tiny-llama-generate", "name: walk-gen"))
    absent = write(gen / "vendor" / "kunlunxin.yaml", "requests: 4\n")
    code, lines = validate_lines(manifest)
    assert code == 0 and f"ok {manifest} (case)" in lines, lines
    assert f"note {manifest}: vendor kunlunxin is not installed here (flagperf list vendors): its settings file and " \
           "every scale file of its folder of the case are read, each scale file with its own <hw> (its " \
           "vendor.yaml's hardware is not known here); not checked: what needs its vendor folder (its engines, " \
           "implementations and toolkits)" in lines, lines
    absent.write_text("requests: 4\nbogus: 1\n")  # still read strictly
    code, lines = validate_lines(manifest)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error {absent}: bogus: unknown key"), lines


def test_validate_passes_over_hidden_entries_of_vendor_and_names_one_that_is_no_vendor(
        walk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry of a case's vendor/ was taken for a vendor: an editor's lock link (.#acme.yaml), macOS's
    ._acme.yaml, a notebook's .ipynb_checkpoints/ each made an error of their own. They are passed over, as the
    source digest passes them; a name that is no vendor's is said never read; an unreadable vendor/ is one line."""
    gemm = walk / "cases" / "base" / "walk-gemm"
    vendor = gemm / "vendor"
    write(vendor / "acme.yaml", "m: 1024\n")
    (vendor / ".#acme.yaml").symlink_to("root@host.4242:1700000000")  # emacs's lock: a link to nowhere
    write(vendor / "._acme.yaml", "\x00\x05\x16\x07")  # AppleDouble: not text
    write(vendor / ".ipynb_checkpoints" / "acme-checkpoint.yaml", "m: 3\n")
    code, lines = validate_lines(gemm / "case.yaml")
    assert code == 0 and lines == [f"ok {gemm / 'case.yaml'} (case)"], lines
    odd = write(vendor / "my vendor.yaml", "m: 1\n")
    code, lines = validate_lines(gemm / "case.yaml")
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error {odd}: never read: not a vendor name"), lines
    odd.unlink()
    real_iterdir = Path.iterdir

    def unreadable(self: Path) -> Iterator[Path]:  # as a folder without read permission (the tests run as root)
        if self == vendor:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", unreadable)
    code, lines = validate_lines(gemm / "case.yaml")
    assert code == 2 and lines == [f"error {vendor}: cannot be listed: Permission denied"], lines


def test_validate_of_a_case_yaml_lists_the_vendors_folder_as_vendor_check_does(walk: Path) -> None:
    """validate of a case.yaml read the default scale file alone and passed a scale file of another <hw> or FlagPerf's
    config/ folder, which vendor check names never read; a non-default scale file's wrong key passed validate too.
    Both now list the folder by one function: the same lines."""
    mlp = walk / "cases" / "training" / "walk-mlp"
    folder = mlp / "vendor" / "acme"
    other_hw = write(folder / "config_a100x1x1.yaml", "lr: 0.1\n")
    flagperf_config = write(folder / "config" / "config_acmex1x1.py", "lr = 0.1\n").parent
    scale = write(folder / "config_acmex1x2.yaml", "lr: 0.1\nbogus: 1\n")
    found = check_vendor_folder(walk / "vendors" / "acme", monitor_seconds=1)
    code, lines = validate_lines(mlp / "case.yaml")
    assert code == 2, lines
    errors = [line.removeprefix("error ") for line in lines]
    for path in (other_hw, flagperf_config, scale):
        said = [problem for problem in found.problems if problem.startswith(f"{path}: ")]
        assert said and all(" ".join(line.split()) in errors for line in said), (path, found.problems, errors)
    assert sorted(errors) == sorted(" ".join(problem.split()) for problem in found.problems), (errors, found.problems)


def test_a_build_output_linked_by_its_absolute_path_is_named_as_the_run_refuses_it(walk: Path) -> None:
    """vendor check and validate passed over foo.so (as the source digest does), while the run's link scan of the
    mounted folder checks build outputs (a round loads them) and refused the round. One rule now: the .so link is
    named by both, before the round; a .venv's links by neither."""
    from flagperf.hosts.local import links_leaving

    vendor = walk / "vendors" / "acme"
    lib = write(walk / "acme-sdk" / "libacme.so", "ELF\n")
    engine = vendor / "engines" / "onnxruntime"
    (engine / "libacme.so").symlink_to(lib)
    venv = vendor / ".venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "libpython.so").symlink_to(lib)
    line = (f"{engine / 'libacme.so'}: links to {lib} by its absolute path: where the vendor folder is at another "
            "path (a clone of it, a host's copy, a round's container) it leads nowhere; make the link relative, to a "
            "file inside the vendor folder, or copy the file")
    assert check_vendor_folder(vendor, monitor_seconds=1).problems == [line]
    code, lines = validate_lines(engine / "engine.yaml")
    assert code == 2 and lines == [f"error {line}"], lines
    assert [leaving[0] for leaving in links_leaving(str(vendor))] == ["engines/onnxruntime/libacme.so"]


def test_a_link_to_an_unlistable_folder_and_one_back_to_the_vendor_folder_are_each_named_once(
        walk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An absolute link to a folder that could not be listed (unreadable, a stale mount) was never named: the walk
    read the link and listed its folder in one step and passed over both on the error. A relative link back to the
    vendor folder walked it again, naming each link in it a second time under a path made of the link."""
    import flagperf.config.adaptation as adaptation

    vendor = walk / "vendors" / "acme"
    locked = walk / "locked-sdk"
    locked.mkdir()
    (vendor / "sdk").symlink_to(locked)
    real_listdir = os.listdir

    def unreadable(path: str | os.PathLike[str] = ".") -> list[str]:  # as a folder without read permission (root)
        if os.path.realpath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(adaptation.os, "listdir", unreadable)
    loop = vendor / "cases" / "training" / "back"
    loop.parent.mkdir(parents=True)
    loop.symlink_to(os.path.join("..", ".."))
    helper = write(walk / "acme-sdk" / "peaks.py", "PEAKS = {}\n")
    (vendor / "tools").mkdir()
    (vendor / "tools" / "peaks.py").symlink_to(helper)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    linked = [problem for problem in found.problems if "by its absolute path" in problem]
    assert linked == [f"{link}: links to {target} by its absolute path: where the vendor folder is at another path (a "
                      "clone of it, a host's copy, a round's container) it leads nowhere; make the link relative, to a "
                      "file inside the vendor folder, or copy the file"
                      for link, target in ((vendor / "sdk", locked), (vendor / "tools" / "peaks.py", helper))
                      ], found.problems


def test_vendor_check_of_a_shadowed_folder_names_its_own_links_alone(walk: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """vendor check of a folder `--vendor` does not use scanned the engine folders of the one it does use and named
    that folder's links as this one's problems."""
    later = walk / "vendors" / "acme"
    first = write_vendor_folder(tmp_path / "first", "acme")
    shutil.copytree(later / "engines" / "onnxruntime", first / "engines" / "onnxruntime")
    weights = write(walk / "weights" / "model.onnx", "onnx\n")
    (first / "engines" / "onnxruntime" / "model.onnx").symlink_to(weights)
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", os.pathsep.join([str(tmp_path / "first"), str(walk / "vendors")]))
    assert not [problem for problem in check_vendor_folder(later, monitor_seconds=1).problems
                if "by its absolute path" in problem]
    assert [problem for problem in check_vendor_folder(first, monitor_seconds=1).problems
            if "by its absolute path" in problem] == [
        f"{first / 'engines' / 'onnxruntime' / 'model.onnx'}: links to {weights} by its absolute path: where the "
        "vendor folder is at another path (a clone of it, a host's copy, a round's container) it leads nowhere; make "
        "the link relative, to a file inside the vendor folder, or copy the file"]


def test_the_link_walk_stops_at_its_bound_and_never_says_clean(walk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data set kept in (or linked into) the vendor folder was walked file by file on every check. The walk stops
    after LINK_WALK_LIMIT paths; it then said so in a note of vendor check alone, and validate of vendor.yaml said
    "ok" though a link past the bound was never looked at. A cut walk is now never clean: vendor check says it is
    not checkable here, validate fails with it as a finding, read_top_entries says it too."""
    import flagperf.config.adaptation as adaptation
    from flagperf.config.vendorlayout import read_top_entries

    vendor = walk / "vendors" / "acme"
    for index in range(20):
        write(vendor / "data" / f"part-{index:02}.bin", "x")
    (vendor / "data" / "zz.so").symlink_to("/etc/hostname")  # past the bound: not seen
    monkeypatch.setattr(adaptation, "LINK_WALK_LIMIT", 10)
    cut = (f"{vendor}: its links were looked through for the first 10 paths only, the rest not checked (a data set "
           "in the folder?); keep data out of it")
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert found.not_checkable.count(cut) == 1, found.not_checkable
    code, lines = validate_lines(vendor / MANIFEST)
    assert code == 2 and f"error {cut}" in lines, lines
    # One check, several scans of the folder (vendor.yaml's, the engine's, each stopped by the data in the engine):
    # the line is said once, by the first file, not once per file.
    for index in range(12):
        write(vendor / "engines" / "onnxruntime" / "data" / f"part-{index:02}.bin", "x")
    engine = vendor / "engines" / "onnxruntime"
    code, lines = validate_lines(vendor / MANIFEST, engine / "engine.yaml")
    assert code == 2 and lines.count(f"error {cut}") == 1, lines
    # The engine's own walk was cut too (a walk of its folder alone): never ok, pointed at the line above.
    assert not [line for line in lines if line.startswith("ok")], lines
    assert f"error {engine}: the walk of {vendor} was cut at 10 paths (see above): not checked whole" in lines, lines
    write(vendor / "cases" / "base" / "x" / "data" / "a.bin", "x")
    for index in range(12):
        write(vendor / "cases" / "base" / "x" / f"part-{index:02}.bin", "x")
    said: list[str] = []
    read_top_entries(vendor, "Dockerfile", cut=said)
    assert said == [cut], said


def test_validate_lists_the_folder_of_a_vendor_not_installed_here_and_suggests_an_installed_name(walk: Path) -> None:
    """validate of a case.yaml listed a vendor's folder of the case only where the vendor is installed, so a training
    scale file of a vendor not installed here passed unread (a wrong key in it, FlagPerf's config/ beside it), though
    the note said its files were read. Each scale file is now read with its own <hw>, its engines not looked up; a
    name close to an installed vendor's is suggested."""
    mlp = walk / "cases" / "training" / "walk-mlp"
    folder = mlp / "vendor" / "kunlunxin"
    scale = write(folder / "config_R300x1x1.yaml", "lr: 0.1\nbogus: 1\n")
    config = write(folder / "config" / "config_R300x1x1.py", "lr = 0.1\n").parent
    code, lines = validate_lines(mlp / "case.yaml")
    assert code == 2, lines
    assert len(lines) == 2 and any("bogus: unknown key" in line for line in lines), lines  # paths cut in the middle
    assert any(line.startswith(f"error {config}: never read: FlagPerf's config/") for line in lines), lines
    scale.write_text("lr: 0.1\n")
    shutil.rmtree(config)
    write(mlp / "vendor" / "acmee.yaml", "lr: 0.1\n")
    code, lines = validate_lines(mlp / "case.yaml")
    assert code == 0, lines
    assert any(line.startswith(f"note {mlp / 'case.yaml'}: vendor acmee is not installed here")
               and line.endswith("; did you mean acme?") for line in lines), lines


def _unenterable(monkeypatch: pytest.MonkeyPatch, folder: Path, listable: bool) -> None:
    """``folder`` as its mode makes it for a user other than root (the tests run as root, whom no mode stops, and the
    interpreter is not reachable as another user): 644, listed but not entered (nothing in it can be looked up), or
    000 (not listed either)."""
    def refused(call: str, path: object) -> bool:
        name = os.path.abspath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
        below = name.startswith(str(folder) + os.sep)  # nothing in it can be looked up, listed or read
        return below or (call in ("listdir", "scandir") and not listable and name == str(folder))

    for call in ("stat", "lstat", "listdir", "scandir"):
        real = getattr(os, call)

        def guarded(path: object = ".", *args: object, _real: object = real, _call: str = call, **kwargs: object
                    ) -> object:
            if refused(_call, path):
                raise PermissionError(13, "Permission denied", os.fsdecode(path))  # type: ignore[arg-type]
            return _real(path, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(os, call, guarded)


@pytest.mark.parametrize("listable", [True, False], ids=["mode-644", "mode-000"])
def test_a_case_vendor_folder_that_cannot_be_entered_is_one_line(walk: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 listable: bool) -> None:
    """A case's vendor/ of mode 644 (listed, not entered) or 000 made validate of its case.yaml end in a traceback
    (Path.is_dir of an entry, misnamed_overrides' Path.is_file): now one line naming the path."""
    mlp = walk / "cases" / "training" / "walk-mlp"
    vendor = mlp / "vendor"
    write(vendor / "acme.yaml", "lr: 0.1\n")
    write(walk / "vendors" / "acme" / "cases" / "training" / "walk-mlp" / "config_acmex1x4.yaml", "lr: 0.1\n")
    _unenterable(monkeypatch, vendor, listable)
    code, lines = validate_lines(mlp / "case.yaml")
    assert code == 2 and len(lines) == 1, lines
    assert re.fullmatch(rf"error {re.escape(str(vendor))}(/acme\.yml)?: cannot be (listed|read): Permission denied",
                        lines[0]), lines


def test_the_link_walk_passes_a_folder_it_cannot_enter_and_a_link_into_a_skipped_one(walk: Path,
                                                                                      monkeypatch: pytest.MonkeyPatch
                                                                                      ) -> None:
    """The link walk raised on a folder that can be listed but not entered (Path.is_dir of its entries), and
    followed tools/env -> ../.venv into the venv, naming its python's absolute link, which the run's link scan (it
    never walks a linked folder, nor a .venv) passes: two rules. Now neither. The folders the scans skip were never
    said, so a link out of the vendor folder in one went unseen without a word: a note names them."""
    from flagperf.hosts.local import links_leaving

    vendor = walk / "vendors" / "acme"
    for venv in (vendor / ".venv", vendor / "env3"):
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    write(vendor / "env3" / "pyvenv.cfg", "home = /usr/bin\n")
    write(vendor / "tools" / "x.py", "x = 1\n")
    (vendor / "tools" / "env").symlink_to(os.path.join("..", ".venv"))
    (vendor / "tools" / "env3").symlink_to(os.path.join("..", "env3", "bin"))
    assert links_leaving(str(vendor)) == []
    (vendor / "engines" / "onnxruntime" / "__pycache__").mkdir(exist_ok=True)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert not [line for line in found.problems if "absolute path" in line], found.problems
    # but the vendor is told which folders no scan looked into (a link out there goes unchecked), in one note
    assert [line for line in found.notes if "not scanned" in line] == [
        f"{vendor}: not scanned (skipped as in every round: .venv, env3): links in them are not checked"], found.notes
    code, lines = validate_lines(vendor / MANIFEST)
    assert code == 0, lines
    locked = write(vendor / "locked" / "a.py", "a = 1\n").parent
    _unenterable(monkeypatch, locked, listable=True)
    found = check_vendor_folder(vendor, monitor_seconds=1)
    assert not [line for line in found.problems if "absolute path" in line], found.problems


def test_a_relative_link_out_of_the_vendor_folder_is_named_by_check_and_validate_as_the_run_refuses_it(
        walk: Path) -> None:
    """A relative link that leads out of the vendor folder from a file neither cases/ nor vendor.yaml names (a helper
    module, an engine's file, a stray note beside a case's files) passed vendor check and validate: only a round's own
    link scan of the folder (hosts.local.describe_paths) refused it. The check now runs that scan: one line per link,
    naming it and where it leads; a link the adaptation's reading already named is not named again."""
    from flagperf.hosts.local import links_leaving

    vendor = walk / "vendors" / "acme"
    sdk = walk / "acme-sdk"
    helper = write(sdk / "peaks.py", "PEAKS = {}\n")
    env = write(sdk / "env.sh", "export ACME_TUNING=fast\n")
    (vendor / "tools").mkdir()
    tool = vendor / "tools" / "peaks.py"
    tool.symlink_to(os.path.relpath(helper, tool.parent))
    engine = vendor / "engines" / "onnxruntime"
    model = engine / "model.onnx"
    model.symlink_to(os.path.relpath(helper, engine))
    case = vendor / "cases" / "training" / "walk-mlp"
    case.mkdir(parents=True)
    (case / "environment_variables.sh").symlink_to(os.path.relpath(env, case))  # read: the adaptation names it
    (case / "notes.txt").symlink_to(os.path.relpath(env, case))  # read by nothing, refused by the round all the same
    (vendor / "loop-a").symlink_to("loop-b")
    (vendor / "loop-b").symlink_to("loop-a")

    def out(link: Path, real: Path) -> str:
        return (f"{link}: links outside the vendor folder (to {real}); in a container it would dangle: copy the file "
                "into the vendor folder, or make the link relative and inside it")

    def loop(link: Path, target: str) -> str:
        return (f"{link}: is a loop of links (to {target}; or a chain of more than the 40 links Linux follows): it "
                "opens nowhere, here or in a container: make it lead to the file")

    assert sorted(below for below, _, _ in links_leaving(str(vendor), limit=100)) == [
        "cases/training/walk-mlp/environment_variables.sh", "cases/training/walk-mlp/notes.txt",
        "engines/onnxruntime/model.onnx", "loop-a", "loop-b", "tools/peaks.py"]
    found = check_vendor_folder(vendor, monitor_seconds=1)
    leaving = [out(case / "notes.txt", env), out(model, helper), loop(vendor / "loop-a", "loop-b"),
               loop(vendor / "loop-b", "loop-a"), out(tool, helper)]
    assert sorted(line for line in found.problems if "is outside" not in line) == sorted(leaving), found.problems
    assert [line for line in found.problems if "is outside" in line] == [
        f"{case}: 'environment_variables.sh' is outside the vendor's case folder (a link to {env}): it must stay "
        "inside the vendor's case folder"], found.problems
    code, lines = validate_lines(vendor / MANIFEST, engine / "engine.yaml")
    assert code == 2, lines
    assert sorted(lines) == sorted(f"error {line}" for line in [
        *leaving, out(case / "environment_variables.sh", env), out(model, helper)]), lines
    for link in (tool, model, case / "notes.txt", case / "environment_variables.sh", vendor / "loop-a",
                 vendor / "loop-b"):
        link.unlink()
    shutil.copy(helper, tool)
    (case / "notes.txt").symlink_to(os.path.relpath(tool, case))  # relative and inside: it travels
    assert check_vendor_folder(vendor, monitor_seconds=1).problems == []
    code, lines = validate_lines(vendor / MANIFEST, engine / "engine.yaml")
    assert code == 0, lines


def test_an_engines_link_out_is_named_past_a_hundred_others_and_the_rest_is_said_to_go_on(walk: Path) -> None:
    """validate of an engine.yaml scanned the whole vendor folder for the first LINKS_NAMED links out of it and kept
    the engine's: with as many earlier in walk order (aaa/), the engine's own link out was never seen and validate said
    ok while the round refused it; vendor check dropped the rest without a word. The engine's folder alone is scanned
    now, and a line says when there are more than named."""
    from flagperf.hosts.vendorcheck import LINKS_NAMED

    vendor = walk / "vendors" / "acme"
    helper = write(walk / "acme-sdk" / "peaks.py", "PEAKS = {}\n")
    many = vendor / "aaa"
    many.mkdir()
    for index in range(LINKS_NAMED + 1):
        (many / f"l{index:03}.py").symlink_to(os.path.relpath(helper, many))
    engine = vendor / "engines" / "onnxruntime"
    (engine / "model.onnx").symlink_to(os.path.relpath(helper, engine))
    line = (f"{engine / 'model.onnx'}: links outside the vendor folder (to {helper}); in a container it would dangle: "
            "copy the file into the vendor folder, or make the link relative and inside it")
    code, lines = validate_lines(engine / "engine.yaml")
    assert code == 2 and lines == [f"error {line}"], lines
    more = (f"{vendor}: (and 1+ more links that leave the vendor folder, not listed: only the first {LINKS_NAMED} are "
            "named; fix these and check again)")
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert more in problems and len([p for p in problems if "links outside" in p]) == LINKS_NAMED, problems


def test_the_line_that_more_links_leave_is_said_beside_another_finding_on_the_folder(
        walk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "(and 1+ more ...)" line went through the dedupe of links another check named, as if it were a link at the
    vendor folder's own path: any other check's "<folder>: ... is outside" line hid it."""
    from flagperf.hosts import vendorcheck

    vendor = walk / "vendors" / "acme"
    helper = write(walk / "acme-sdk" / "peaks.py", "PEAKS = {}\n")
    for index in range(vendorcheck.LINKS_NAMED + 1):
        (vendor / f"l{index:03}.py").symlink_to(os.path.relpath(helper, vendor))
    words = "'acme' is outside the vendor root (a link to elsewhere): it must stay inside the vendor root"
    outside = f"{vendor}: {words}"
    # another check's finding on the folder itself (files.inside's words), as the adaptations' check could make one
    monkeypatch.setattr(vendorcheck, "_check_adaptations",
                        lambda _vendor, found: found.add_error(ConfigError(str(vendor), None, words)))
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert outside in problems, problems
    assert any(p.startswith(f"{vendor}: (and 1+ more links that leave the vendor folder") for p in problems), problems


def test_validate_of_a_case_file_kept_in_the_vendor_folder_names_a_relative_link_out_of_it(walk: Path) -> None:
    """validate of a file of the vendor folder's cases/<family>/<case>/ looked for links by an absolute path only: a
    relative one beside it that leads out of the vendor folder (notes.txt -> ../../../../sdk/env.sh), which the
    round's scan refuses, let it say ok. The round's scan of the case's folder now runs too."""
    vendor = walk / "vendors" / "acme"
    case = vendor / "cases" / "training" / "walk-mlp"
    settings = write(case / "acme.yaml", "lr: 0.1\n")
    env = write(walk / "vendors" / "sdk" / "env.sh", "export ACME_TUNING=fast\n")
    code, lines = validate_lines(settings)
    assert code == 0, lines
    (case / "notes.txt").symlink_to(os.path.relpath(env, case))
    code, lines = validate_lines(settings)
    assert code == 2 and lines == [
        f"error {case / 'notes.txt'}: links outside the vendor folder (to {env}); in a container it would dangle: copy "
        "the file into the vendor folder, or make the link relative and inside it"], lines


def test_a_relative_link_out_of_the_project_says_an_inventory_may_mount_its_place(
        walk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check, which has no inventory, refuses a relative link out of the project that a round whose inventory
    mounts the place (a data mount) lets pass: its line said it would dangle, no more. It now says when it would not;
    a link out of a vendor folder outside the project (mounted alone, never at a data mount's path) says nothing of
    the kind."""
    import flagperf.hosts.vendorcheck as vendorcheck

    vendor = walk / "vendors" / "acme"
    data = walk.parent / f"{walk.name}-datasets" / "x"
    data.mkdir(parents=True)
    (vendor / "data").symlink_to(os.path.relpath(data, vendor))
    alone = vendorcheck.links_out_of_vendor_folder(vendor)
    assert [error.message for error in alone] == [
        f"links outside the vendor folder (to {data}); in a container it would dangle: copy the file into the vendor "
        "folder, or make the link relative and inside it"]
    monkeypatch.setattr(vendorcheck, "PROJECT_ROOT", walk)  # the vendor folder as one inside the project
    assert [error.message for error in vendorcheck.links_out_of_vendor_folder(vendor)] == [
        f"links outside the project (to {data}); in a container it would dangle unless an inventory mounts that "
        "place: copy the file into the project, or make the link relative and inside it"]


@pytest.mark.parametrize("options", ["acme_threads", "[acme_threads, 4]", "null"],
                         ids=["a-string", "a-number-in-it", "null"])
def test_a_bad_options_of_an_inference_engine_is_one_line_naming_it_where_it_matters(
        walk: Path, tmp_path: Path, options: str) -> None:
    """An inference engine's engine.yaml was read loosely for its options (to know the keys a run may set, before
    any engine loads): a string or null taken for no options, a number taken as its text, silently; a --set of the
    engine's key was then refused as an unknown key of the case. The read became as strict as the manifest's own, and
    then one broken engine.yaml failed every inference case of the vendor, those running another engine too. Its
    error (one line naming the engine.yaml and options) is now said where it matters: a case whose compiler it is, a
    key no sound engine has, and validate of the engine.yaml itself."""
    from flagperf.config.plan import plan_run

    engines = walk / "vendors" / "acme" / "engines"
    shutil.copytree(engines / "onnxruntime", engines / "acmert")
    engine = engines / "acmert" / "engine.yaml"
    text = engine.read_text().replace("name: onnxruntime", "name: acmert")
    engine.write_text(re.sub(r"(?m)^options:.*$", "options: [acme_threads]", text))
    settings = write(walk / "cases" / "inference" / "walk-infer" / "vendor" / "acme_configurations.yaml",
                     "batch_size: 2\n")
    with pytest.raises(ConfigError, match="an option of engine acmert, not read by compiler onnxruntime"):
        plan_run(cases=["walk-infer"], vendor="acme", sets=["acme_threads=2"], results_dir=tmp_path / "results")
    engine.write_text(re.sub(r"(?m)^options:.*$", f"options: {options}", text))
    code, lines = validate_lines(settings)  # the case runs onnxruntime: acmert's folder is none of its concern
    assert code == 0, lines
    plan = plan_run(cases=["walk-infer"], vendor="acme", results_dir=tmp_path / "results")
    assert [case.name for case in plan.cases] == ["walk-infer"]
    broken = f"{engine}: options"
    for sets in (["acme_threads=2"], ["compiler=acmert"]):  # a key only acmert may have; acmert itself
        with pytest.raises(ConfigError) as raised:
            plan_run(cases=["walk-infer"], vendor="acme", sets=sets, results_dir=tmp_path / "results")
        assert str(raised.value).startswith(broken), (sets, str(raised.value))
    # A typo of the case's own key was hidden behind the broken engine.yaml (which "may declare it"): fixing that
    # file alone, the user met the typo on the next try. Both are said, the key's line naming the unread engine.
    unless = ", unless engine acmert reads it: its engine.yaml cannot be read (said beside this)"
    for sets, typo in ((["batch_sze=2"], "--set: batch_sze: no selected case has this key (did you mean batch_size?"),
                       (["walk-infer.batch_sze=2"], "--set: batch_sze: unknown key (did you mean batch_size?)")):
        with pytest.raises(ConfigError) as raised:
            plan_run(cases=["walk-infer"], vendor="acme", sets=sets, results_dir=tmp_path / "results")
        lines = [str(finding) for finding in (raised.value, *raised.value.more)]
        assert len(lines) == 2 and lines[0].startswith(broken) and lines[1].startswith(typo) \
            and lines[1].endswith(unless), (sets, lines)
    # flagperf run printed the first finding alone (the engine.yaml's), so the typo stayed hidden on the console.
    if options == "null":  # one variant is enough: the command's printing, not the finding, is under test
        from typer.testing import CliRunner

        from flows.cli import app

        said = CliRunner().invoke(app, ["run", "--cases", "walk-infer", "--vendor", "acme", "--set", "batch_sze=2",
                                        "--results", str(tmp_path / "results")])
        errors = [" ".join(line.split()) for line in said.output.split("error:")[1:]]
        assert said.exit_code == 2 and len(errors) == 2 and errors[0].startswith(broken) \
            and errors[1].startswith("--set: batch_sze: no selected case has this key") \
            and errors[1].endswith(unless), said.output
    settings.write_text("compiler: acmert\n")
    code, lines = validate_lines(settings)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error {broken}"), lines
    code, lines = validate_lines(engine)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error {broken}"), lines


def test_an_unknown_key_names_each_engine_that_cannot_say_its_options_in_number() -> None:
    """Two broken engines read "unless engine acmert, acmert2 reads it: their engine.yaml cannot be read"."""
    from flagperf.config.engines import unless_declared_by

    error = ConfigError("engine.yaml", "options", "must be a list")
    assert unless_declared_by({}) == ""
    assert unless_declared_by({"acmert": error}) == (", unless engine acmert reads it: its engine.yaml cannot be read "
                                                     "(said beside this)")
    assert unless_declared_by({"acmert2": error, "acmert": error}) == (
        ", unless engines acmert, acmert2 read it: their engine.yaml files cannot be read (said beside this)")


def test_vendor_check_notes_the_scales_the_guide_asks_for_that_a_case_lacks(walk: Path) -> None:
    """The vendor guide asks for 1x1, 1x8 and 2x8 runs; a case with its 1x1 scale file and no other passed vendor check
    without a word, and its 1x8 run read the case's and the vendor's settings alone. One note per training case now
    says which shape it lacks (a node of other than 8 devices counts: 1x4 and 2x4 are the guide's runs there); none
    once both are there, and none for a case of another family, whose scale file is refused (said beside it)."""
    folder = walk / "vendors" / "acme" / "cases" / "training" / "walk-mlp"
    vendor = walk / "vendors" / "acme"
    write(folder / "config_acmex1x1.yaml", "lr: 0.1\n")
    infer = write(vendor / "cases" / "inference" / "walk-infer" / "config_acmex1x1.yaml", "batch_size: 2\n")

    def noted() -> list[str]:
        notes = check_vendor_folder(vendor, monitor_seconds=1).notes
        return [note for note in notes if "guide asks" in note]

    tail = (" (N>1) scale file (config_acmex<nnodes>x<nproc>.yaml or .py): FlagPerf's guide asks for 1x1, 1x8 and 2x8 "
            "runs, and a run at a scale without its file reads the case's and the vendor's settings alone "
            "(docs/vendor-guide.md, section 2)")
    assert noted() == [f"{folder}: has config_acmex1x1 but no 1xN or 2xN{tail}"]
    assert any(str(infer) in problem for problem in check_vendor_folder(vendor, monitor_seconds=1).problems)
    write(folder / "config_acmex1x4.yaml", "lr: 0.1\nbogus: 1\n")  # there, if refused: its problem is said
    assert noted() == [f"{folder}: has config_acmex1x1 but no 2xN{tail}"]
    write(folder / "config_acmex2x4.yaml", "lr: 0.1\n")
    assert noted() == []


@pytest.mark.parametrize("linked", ["family-folder", "part"], ids=["engines-linked", "engine-linked"])
def test_a_part_reached_through_a_link_inside_the_vendor_folder_is_scanned_where_it_lies(walk: Path,
                                                                                         linked: str) -> None:
    """The scan of one engine's (or case's) part of the vendor folder followed its path step by step, and a step that
    is a link inside the folder (engines -> real_engines) was judged as a link and never entered, while the round's
    scan of the whole folder walks the real folder and refuses a link out in it: validate of the engine.yaml (or a
    case's file) said ok, and the round refused. The part is now scanned at its real place, named as the whole
    folder's scan names it; a part given with '..' or by an absolute path is refused, not scanned as nothing."""
    from flagperf.hosts.local import links_leaving

    vendor = walk / "vendors" / "acme"
    helper = write(walk / "acme-sdk" / "model.onnx", "model\n")
    case = vendor / "cases" / "training" / "walk-mlp"
    settings = write(case / "acme.yaml", "lr: 0.1\n")
    if linked == "family-folder":  # engines -> real_engines, cases -> real_cases
        for family in ("engines", "cases"):
            (vendor / family).rename(vendor / f"real_{family}")
            (vendor / family).symlink_to(f"real_{family}")
        engine_real = vendor / "real_engines" / "onnxruntime"
        case_real = vendor / "real_cases" / "training" / "walk-mlp"
    else:  # engines/onnxruntime -> ../ort, cases/training/walk-mlp -> ../../mlp
        (vendor / "engines" / "onnxruntime").rename(vendor / "ort")
        (vendor / "engines" / "onnxruntime").symlink_to(os.path.join("..", "ort"))
        case.rename(vendor / "mlp")
        case.symlink_to(os.path.join("..", "..", "mlp"))
        engine_real, case_real = vendor / "ort", vendor / "mlp"
    engine, settings = vendor / "engines" / "onnxruntime", case / "acme.yaml"
    code, lines = validate_lines(engine / "engine.yaml", settings)
    assert code == 0, lines
    for real in (engine_real, case_real):
        (real / "model.onnx").symlink_to(os.path.relpath(helper, real))
    whole = sorted(below for below, _, _ in links_leaving(str(vendor), limit=100))
    assert whole == sorted(os.path.relpath(real / "model.onnx", vendor) for real in (engine_real, case_real))
    for part, real in (("engines/onnxruntime", engine_real), ("cases/training/walk-mlp", case_real)):
        assert [below for below, _, _ in links_leaving(str(vendor), only=part)] == \
            [os.path.relpath(real / "model.onnx", vendor)], part
    code, lines = validate_lines(engine / "engine.yaml", settings)
    assert code == 2 and sorted(lines) == sorted(
        f"error {real / 'model.onnx'}: links outside the vendor folder (to {helper}); in a container it would dangle: "
        "copy the file into the vendor folder, or make the link relative and inside it"
        for real in (engine_real, case_real)), lines
    for part in ("engines/../..", "/etc", "../acme"):
        with pytest.raises(ValueError, match="not a part below the folder"):
            links_leaving(str(vendor), only=part)


def test_links_by_an_absolute_path_in_the_scan_make_no_more_line(walk: Path) -> None:
    """The link scan stops at one more than vendor check names, to say the list goes on; links by an absolute path
    count there too, though absolute_links names them: a hundred relative links out and one absolute made vendor check
    say "1+ more ... not listed" where every one was named. Only a relative one past the hundred says it now."""
    from flagperf.hosts.vendorcheck import LINKS_NAMED

    vendor = walk / "vendors" / "acme"
    helper = write(walk / "acme-sdk" / "peaks.py", "PEAKS = {}\n")
    many = vendor / "aaa"
    many.mkdir()
    (many / "a-absolute.py").symlink_to(helper)
    for index in range(LINKS_NAMED):
        (many / f"l{index:03}.py").symlink_to(os.path.relpath(helper, many))
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert [p for p in problems if "more" in p] == [], problems
    assert len([p for p in problems if "links outside" in p]) == LINKS_NAMED, problems
    assert [p for p in problems if "by its absolute path" in p] == [
        f"{many / 'a-absolute.py'}: links to {helper} by its absolute path: where the vendor folder is at another "
        "path (a clone of it, a host's copy, a round's container) it leads nowhere; make the link relative, to a file "
        "inside the vendor folder, or copy the file"], problems
    (many / f"l{LINKS_NAMED:03}.py").symlink_to(os.path.relpath(helper, many))  # a hundred and first: said to go on
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert [p for p in problems if "more" in p] == [
        f"{vendor}: (and 1+ more links that leave the vendor folder, not listed: only the first {LINKS_NAMED} are "
        "named; fix these and check again)"], problems


def test_a_scan_filled_by_absolute_links_says_it_stopped(tmp_path: Path) -> None:
    """Links by an absolute path (absolute_links names each) fill the scan for relative ones: it looks three times as
    far as it names, and where they fill it still, a line says the scan stopped. The check compared the
    count with the limit the loop had raised after the last scan, so the line never came and a relative link out
    behind 400 absolute ones went unsaid."""
    from flagperf.hosts.vendorcheck import links_out_of_vendor_folder

    vendor = tmp_path / "acme"
    (vendor / "a").mkdir(parents=True)
    for i in range(400):
        (vendor / "a" / f"l{i:04d}").symlink_to("/etc")
    (vendor / "z").mkdir()
    (vendor / "z" / "rel").symlink_to("../../elsewhere")
    said = [str(error) for error in links_out_of_vendor_folder(vendor)]
    assert len(said) == 1 and "the scan stopped at its first 303 links" in said[0], said


def test_validate_of_a_plugin_manifest_by_a_path_with_dotdot_is_one_line(tmp_path: Path) -> None:
    """toolkits/../toolkit.yaml reached the link scan as only='toolkits/..', which it refuses with a ValueError: a
    traceback for a path a user typed. Such a path is refused in one line (its folder names are what it is checked
    by)."""
    vendor = tmp_path / "acme"
    (vendor / "toolkits").mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "vendor_images" / "cpu" / "vendor.yaml", vendor / "vendor.yaml")
    (vendor / "toolkit.yaml").write_text("name: x\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "flows.cli", "validate", f"{vendor}/toolkits/../toolkit.yaml"],
                            capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "give its path without '..'" in result.stderr
