"""The host allocator of a measuring process: freed memory is reused, not faulted in again at every forward."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from flagperf.measure.hostmemory import keep_freed_host_memory

ROOT = Path(__file__).resolve().parents[2]

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


def forwards(tmp_path: Path, mode: str) -> dict[str, object]:
    script = tmp_path / "forwards.py"
    script.write_text(FORWARDS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator thresholds")
def test_forwards_reuse_freed_host_memory(tmp_path: Path) -> None:
    # glibc's own thresholds: the forward's activations are given back and faulted in again each time (6,240
    # page faults per forward on the machine this was found on), which is what made the engine's figure lower
    # than a bare loop's in another process state.
    unset = forwards(tmp_path, "none")
    assert unset["faults_per_forward"] > 1000, f"glibc no longer trims here: {unset}"
    kept = forwards(tmp_path, "keep")
    assert str(kept["said"]).startswith("glibc") and "M_TRIM_THRESHOLD 1 GiB" in str(kept["said"])
    assert kept["faults_per_forward"] < 50, kept


@pytest.mark.parametrize(("name", "value"), [("MALLOC_TRIM_THRESHOLD_", "0"),
                                             ("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")])
def test_an_allocator_the_environment_chose_is_left_alone(monkeypatch: pytest.MonkeyPatch, name: str,
                                                          value: str) -> None:
    monkeypatch.setenv(name, value)
    assert keep_freed_host_memory() == f"as the environment sets it ({name}={value})"
