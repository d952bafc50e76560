"""The GPU session's parts, dry-run on this CPU (`bench/gpu_session.sh PART --quick`), and the wheel list it carries
resolved for the GPU host's Python: a lent GPU half hour must not be the first time these scripts run.

These prove that the scripts, their records and their time limits work end to end on any Linux machine; the
figures of a --quick run are a loaded CPU's and are not judged. The wheel test needs PyPI (as CI's install does).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What each part must leave in its output folder: its logs and the records its benches write as they go.
PARTS = {
    "base": ["base_specs.log", "base_specs_cpu_quick.json", "base_specs_cpu_quick.md"],
    "models": ["inference.log", "training.log", "inference_gpu_quick.json", "training_gpu_quick.json"],
    "generate": ["tests_gpu.log", "generate.log", "generate_gpu_quick.json"],
    "serving": ["serving.log", "serving_gpu_quick.json", "serving_gpu_quick.md", "serving_gpu_pareto.png",
                "serving_gpu_latency.png", "serving_gpu_server.log"],
    "install": ["install.log"],
    "operators": ["operators.log", "operation_gpu_quick.json", "operation_gpu_quick.md"],
}


@pytest.mark.parametrize("part", list(PARTS))
def test_each_part_of_the_gpu_session_dry_runs_here(tmp_path: Path, part: str) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", "bench/gpu_session.sh", part, "--quick"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800, check=False)  # a hang guard
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    made = sorted(p.name for p in tmp_path.iterdir())
    for name in PARTS[part]:
        assert name in made, (name, made, done.stdout[-2000:])
    # The device tool returns at most 8 files a command, two folders down at most.
    assert len([p for p in tmp_path.iterdir() if p.is_file()]) <= 8, made
    # Every record names the code that made it, also without git (the source digest).
    assert re.search(r"code: .*source sha256:[0-9a-f]{16}", done.stdout), done.stdout[:500]
    if part == "models":  # one pair of every model was measured, on any machine
        for name in ("inference_gpu_quick.md", "training_gpu_quick.md"):
            text = (tmp_path / name).read_text()
            assert "1 of 1 pairs" in text and "0 of " not in text, text[:2000]
    for name in PARTS[part]:
        if name.endswith(".json"):
            record = json.loads((tmp_path / name).read_text())
            assert "sha256:" in json.dumps(record), name


def test_the_base_record_has_every_pair_and_the_mamf_reference(tmp_path: Path) -> None:
    """The interleaved table as the GPU run writes it: pairs adjacent, each side's median, the pair ratios."""
    done = subprocess.run([sys.executable, "bench/base_specs_gpu.py", "--quick", "--pairs", "2", "--cases",
                           "main_memory-bandwidth", "--out", str(tmp_path), "--results", str(tmp_path / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "base_specs_cpu_quick.json").read_text())
    assert record["state"] == "finished"
    (row,) = record["rows"]
    assert row["metric"] == "memory_copy_bandwidth" and row["pairs"] == 2 and len(row["pair_ratios"]) == 2
    pairs = record["pairs"]["main_memory-bandwidth / memory_copy_bandwidth"]
    # The bare side repeated the engine round's timed iterations, and both sides measured something.
    assert all(p["engine"] > 0 and p["bare"] > 0 and p["iterations"] >= 5 for p in pairs)
    assert row["ratio"] == pytest.approx(statistics.median(p["engine"] / p["bare"] for p in pairs))
    assert record["mamf"]["bf16"]["best"]["tflops"] > 0 and record["mamf"]["fp8"]["skipped"]
    md = (tmp_path / "base_specs_cpu_quick.md").read_text()
    assert "memory_copy_bandwidth" in md and "MAMF-style" in md


def test_the_wheel_list_resolves_for_the_gpu_hosts_python() -> None:
    """bench/gpu_wheels.sh's resolution for CPython 3.12 on x86_64 Linux, within the lock: what a GPU host gets
    carried. Needs PyPI (uv resolves against it)."""
    done = subprocess.run(["bash", "bench/gpu_wheels.sh", "--resolve-only"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    pins = dict(line.split("==", 1) for line in done.stdout.split() if "==" in line)
    lock = dict(line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().split()
                if "==" in line and not line.startswith("#"))
    assert pins.get("flag-gems") == "5.0.2"  # the operators part's FlagGems, carried without its pinned deps
    for name in ("prefect", "pydantic", "nvidia-ml-py", "pytest"):
        assert name in pins, (name, sorted(pins))
        assert pins[name] == lock.get(name, pins[name]).split(";")[0], name
    # The image's own heavy packages are never carried (they would not fit the 64 MiB a command takes).
    assert not {"torch", "numpy", "triton", "matplotlib"} & set(pins)
