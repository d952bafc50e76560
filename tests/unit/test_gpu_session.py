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
SHARED = ("serving", "operators")  # the plan's shared command; serving copies no plots there
PLOTS = {"serving_gpu_pareto.png", "serving_gpu_latency.png"}
# Each part dry-runs once: alone, or (serving and operators) as the plan's one command for both.
COMMANDS = [[part] for part in PARTS if part not in SHARED] + [[*SHARED, "--budget-s", "570"]]


def plan(seconds: int | None = None) -> list[str]:
    done = subprocess.run(["bash", "bench/gpu_session.sh", "plan", *([str(seconds)] if seconds else [])], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [line.split("#")[0].split("gpu_session.sh", 1)[1].split() for line in done.stdout.splitlines()
            if line.startswith("bash bench/gpu_session.sh")]


def test_the_session_plan_fits_half_an_hour_and_runs_what_is_pending_first() -> None:
    """A lent half hour: every command within a device command's 10 minutes, all of them and the machine's
    start within 30; the parts never measured on a GPU planned, those an H200 already measured left for later."""
    script = (ROOT / "bench" / "gpu_session.sh").read_text()
    start_up = int(re.search(r"^START_UP_S=(\d+)", script, re.M).group(1))
    commands = plan()
    budgets = [int(words[words.index("--budget-s") + 1]) for words in commands]
    assert all(b <= 570 for b in budgets) and start_up + sum(budgets) <= 1800, (commands, start_up)
    planned = [w for words in commands for w in words if not w.startswith("--") and not w.isdigit()]
    assert planned == ["base", "generate", "serving", "operators"], planned
    assert [w for words in plan(1200) for w in words if w in PARTS] == ["base", "generate"]  # less time, fewer


def test_a_shared_command_gives_each_part_its_share_and_refuses_too_little() -> None:
    # Too little for two parts: refused before anything runs, naming the part and what it needs.
    done = subprocess.run(["bash", "bench/gpu_session.sh", "serving", "operators", "--budget-s", "400"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "leaves serving" in done.stderr and "at least 240" in done.stderr, done.stderr
    for args in (["nope"], ["base", "--budget-s", "601"], ["base", "--budget-s", "x"], []):
        done = subprocess.run(["bash", "bench/gpu_session.sh", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)


def dry_run(folder: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(folder), "PYTHON": sys.executable}
    return subprocess.run(["bash", "bench/gpu_session.sh", *command, "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=2400, check=False)  # a hang guard


@pytest.fixture(scope="module")
def base_dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The base part's dry run, once for the tests of its part and of its record (each engine round and bare loop
    is a fresh process: seconds each on a CPU)."""
    folder = tmp_path_factory.mktemp("base")
    return folder, dry_run(folder, ["base"])


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "+".join(w for w in c if w in PARTS))
def test_each_part_of_the_gpu_session_dry_runs_here(tmp_path: Path, command: list[str],
                                                    request: pytest.FixtureRequest) -> None:
    if command == ["base"]:
        tmp_path, done = request.getfixturevalue("base_dry_run")
    else:
        done = dry_run(tmp_path, command)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    made = sorted(p.name for p in tmp_path.iterdir())
    parts = [w for w in command if w in PARTS]
    expected = [name for part in parts for name in PARTS[part] if len(parts) == 1 or name not in PLOTS]
    for name in expected:
        assert name in made, (name, made, done.stdout[-2000:])
    if len(parts) > 1:
        assert not PLOTS & set(made), made
    # The device tool returns at most 8 files a command, two folders down at most.
    assert len([p for p in tmp_path.iterdir() if p.is_file()]) <= 8, made
    # Every record names the code that made it, also without git (the source digest).
    assert re.search(r"code: .*source sha256:[0-9a-f]{16}", done.stdout), done.stdout[:500]
    if parts == ["models"]:  # one pair of every model was measured, on any machine
        for name in ("inference_gpu_quick.md", "training_gpu_quick.md"):
            text = (tmp_path / name).read_text()
            assert "1 of 1 pairs" in text and "0 of " not in text, text[:2000]
    for name in expected:
        if name.endswith(".json"):
            record = json.loads((tmp_path / name).read_text())
            assert "sha256:" in json.dumps(record), name


def test_the_base_record_has_every_pair_and_the_mamf_reference(
        base_dry_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """The interleaved table as the GPU run writes it: pairs adjacent, each side's median, the pair ratios."""
    folder, done = base_dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    record = json.loads((folder / "base_specs_cpu_quick.json").read_text())
    assert record["state"] == "finished"
    (row,) = [r for r in record["rows"] if r["metric"] == "memory_copy_bandwidth"]
    assert row["metric"] == "memory_copy_bandwidth" and row["pairs"] == 2 and len(row["pair_ratios"]) == 2
    pairs = record["pairs"]["main_memory-bandwidth / memory_copy_bandwidth"]
    # The bare side repeated the engine round's timed iterations, and both sides measured something.
    assert all(p["engine"] > 0 and p["bare"] > 0 and p["iterations"] >= 5 for p in pairs)
    assert row["ratio"] == pytest.approx(statistics.median(p["engine"] / p["bare"] for p in pairs))
    assert record["mamf"]["bf16"]["best"]["tflops"] > 0 and record["mamf"]["fp8"]["skipped"]
    # The best shape once more, back to back for an engine window: the clock the chip holds, beside its bursts.
    held = record["mamf"]["bf16"]["best_sustained"]
    assert held["tflops"] > 0 and held["seconds"] >= 0.5 and held["matmuls"] >= 10 and held["matmuls"] % 10 == 0
    md = (folder / "base_specs_cpu_quick.md").read_text()
    assert "memory_copy_bandwidth" in md and "MAMF-style" in md and "the best shape sustained" in md


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
    # Nor transformers' own libraries: the image's transformers checks their versions when it is imported.
    assert not {"transformers", "huggingface-hub", "tokenizers", "safetensors"} & set(pins)
    # What is carried goes ahead of the image's packages, so it must accept the image's transformers and hub 1.x.
    assert "resolve with the GPU image's transformers==5.17.* huggingface-hub==1.33.*" in done.stderr, done.stderr


def test_the_wheel_list_is_refused_where_it_conflicts_with_the_gpu_images_packages() -> None:
    """An image whose packages a carried pin does not accept (here an older pydantic than the carried one, as a
    carried package needing huggingface-hub 2 would be against the image's 1.x): refused, naming the image's pins."""
    env = {**os.environ, "GPU_IMAGE_PINS": "pydantic<2 huggingface-hub==1.33.*"}
    done = subprocess.run(["bash", "bench/gpu_wheels.sh", "--resolve-only"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 1 and done.stdout == "", done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == ("gpu_wheels.sh: the carried wheels conflict with the GPU image's "
                                                    "pydantic<2 huggingface-hub==1.33.* (above)"), done.stderr
    assert "pydantic" in done.stderr.split("gpu_wheels.sh:")[0]  # the resolver's reason comes first


def test_the_engines_max_is_split_into_shape_choice_and_power_state() -> None:
    """A gap between the engine's max-achievable and the MAMF-style best, read apart: against the best shape held
    back to back (shape choice and harness), and that held figure against its flushed bursts (power state)."""
    sys.path.insert(0, str(ROOT))
    from bench.base_specs_gpu import render, summarise

    pairs = [{"engine": e, "bare": b, "unit": "TFLOPS"} for e, b in ((690.0, 694.0), (698.0, 697.0), (695.0, 699.0))]
    record = {"device": "NVIDIA H200", "quick": False, "pairs": {"computation-BF16 / gemm_bf16_max": pairs},
              "mamf": {"bf16": {"best": {"m": 4096, "n": 16384, "k": 16384, "tflops": 742.0}, "median_tflops": 697.0,
                                "shapes": 75, "spent_s": 25.0, "method": "m",
                                "best_sustained": {"tflops": 701.0, "seconds": 5.0, "matmuls": 420, "method": "s"}}}}
    summarise(record)
    engine = statistics.median([690.0, 698.0, 695.0])
    assert record["bf16_max_of_mamf"] == pytest.approx(engine / 742.0)
    assert record["bf16_max_of_mamf_sustained"] == pytest.approx(engine / 701.0)
    (mamf_check,) = [ok for text, ok in record["checks"] if "MAMF-style best" in text]
    assert mamf_check is False  # 0.937 of the best: the issue's 0.95 is missed, whatever the split says
    note = record["notes"]["bf16_mamf_split"]
    assert f"{engine / 701.0:.3f}" in note and f"{701.0 / 742.0:.3f}" in note
    record.update({key: "-" for key in ("code", "when", "host", "torch", "command", "state", "pairs_asked", "idle_s",
                                        "seconds")}, wall_s=0.0, not_measured={})
    assert note in render(record)
