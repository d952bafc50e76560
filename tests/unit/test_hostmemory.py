"""The host allocator of a measuring process: freed memory is reused, not faulted in again at every forward."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.measure.hostmemory import environment_allocator, host_allocator
from flagperf.results.schema import read_result

ROOT = Path(__file__).resolve().parents[2]
GLIBC = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator thresholds")

# The tiny ResNet of bench's CPU smoke run (the case's own model), forwards on one thread, page faults counted.
FORWARDS = """
import json, resource, sys
import torch
from flagperf.config.cases import load_case
from flagperf.config.plan import plan_run
from flagperf.measure.hostmemory import keep_freed_host_memory

said = keep_freed_host_memory() if sys.argv[1] == "keep" else None
torch.set_num_threads(1)
case = "resnet50-infer"
module = load_case(case).module
sets = ["fp16=false", "batch_size=4", "depths=[1, 1]", "hidden_sizes=[8, 16]", "flops=1.0e6"]
config = module.Config.model_validate(plan_run(cases=[case], vendor="cpu", sets=sets,
                                               results_dir="unused").cases[0].config)
model = module.create_model(config).eval()
x = torch.randn(4, 3, 224, 224)
with torch.inference_mode():
    for _ in range(3):
        model(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        model(x)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"said": said, "faults_per_forward": (after - before) / 10}))
"""


def glibc_defaults_env() -> dict[str, str]:
    """This environment without anything that chooses the allocator."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}


def forwards(tmp_path: Path, mode: str) -> dict[str, object]:
    script = tmp_path / "forwards.py"
    script.write_text(FORWARDS)
    out = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, cwd=ROOT,
                         env=glibc_defaults_env(), timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@GLIBC
def test_forwards_reuse_freed_host_memory(tmp_path: Path) -> None:
    """Runs on glibc hosts (skipped elsewhere). The kept setting is held against glibc's own thresholds measured
    in the same test, not against a fixed count: the machine's state (memory pressure, the kernel's reclaim)
    adds faults to both (a loaded CI machine once gave 309 per forward with the setting, against < 50 idle)."""
    kept = forwards(tmp_path, "keep")
    assert str(kept["said"]).startswith("glibc") and "M_TRIM_THRESHOLD 1 GiB" in str(kept["said"])
    # glibc's own thresholds: the activations are given back and faulted in again at every forward (6,240 page
    # faults per forward where this was found).
    unset = forwards(tmp_path, "none")
    if unset["faults_per_forward"] <= 1000:
        assert kept["faults_per_forward"] <= max(50.0, 2 * unset["faults_per_forward"]), (kept, unset)
        pytest.skip(f"glibc's own thresholds no longer fault at every forward here: {unset}")
    assert kept["faults_per_forward"] < unset["faults_per_forward"] / 5, (kept, unset)


@GLIBC
def test_a_case_process_sets_it_and_records_it(tmp_path: Path) -> None:
    plan = plan_run(cases=["digits-mlp"], sets=["max_epochs=1"], results_dir=tmp_path / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    (tmp_path / "job.json").write_text(job.model_dump_json())
    done = subprocess.run([sys.executable, "-m", "flagperf.entry", "--job", str(tmp_path / "job.json")],
                          capture_output=True, text=True, cwd=ROOT, env=glibc_defaults_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    allocator = read_result(tmp_path / "result.json").provenance.host["allocator"]
    assert allocator.startswith("glibc") and "freed memory kept for reuse" in allocator
    assert f"host allocator: {allocator}" in done.stdout
    # This test process only called run_job's neighbours: it keeps glibc's own thresholds.
    assert host_allocator().endswith("its own moving thresholds") or environment_allocator()


@pytest.mark.parametrize(("name", "value", "chosen"), [
    ("MALLOC_TRIM_THRESHOLD_", "0", True),
    ("LD_PRELOAD", "/usr/lib/libjemalloc.so.2", True),
    ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0", True),
    ("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=2000000", False),  # not the allocator's
])
def test_an_allocator_the_environment_chose_is_left_alone(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                          chosen: bool) -> None:
    for other in ("MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD", "GLIBC_TUNABLES"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, value)
    assert environment_allocator() == (f"{name}={value}" if chosen else None)
    assert (host_allocator() == f"as the environment sets it ({name}={value})") is chosen
