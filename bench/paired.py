"""What the GPU benches that compare the engine with bare loops share: paired statistics, the time budget, the
machine and code a record names, and records written as they grow (bench/inference_gpu.py, training_gpu.py).

A comparison is made of interleaved pairs (engine, then bare loop, again and again) measured the same way; each
side's rates are summarised by their median and spread (min-max), and the comparison by the median of the pair
ratios, which cancels a drift of the machine that both sides of a pair share. A ratio above SUSPICIOUS is not a
win: the engine adds work to the same forwards or steps, so it means the two sides were not measured alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARITY = 0.97  # every engine figure against its bare loop (issue 25)
MIN_PAIRS = 3  # fewer (a budget cut the series short) are recorded, and said to be fewer
SUSPICIOUS = 1.03  # an engine figure this far above its bare loop is flagged, not celebrated


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Median, min and max of one side's rates (None when there are none)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def compare(engine: list[float], bare: list[float], target: float | None, judged: bool = True) -> dict[str, Any]:
    """Pair i's engine rate against pair i's bare rate: both sides' spreads, the ratios and their median,
    pass/fail against ``target`` (None: reported only) and whether the median ratio is suspicious. Not
    ``judged`` (a CPU smoke run: both paths ran, the ratios say nothing): neither pass/fail nor suspicion."""
    ratios = [e / b for e, b in zip(engine, bare, strict=True) if b]
    median = statistics.median(ratios) if ratios else None
    return {"engine": spread(engine), "bare": spread(bare), "ratios": ratios, "ratio_median": median,
            "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
            "target": target, "judged": judged,
            "passed": None if target is None or median is None or not judged else median >= target,
            "suspicious": judged and median is not None and median > SUSPICIOUS}


def verdict(c: dict[str, Any]) -> str:
    """A comparison's Markdown verdict cell."""
    if c["ratio_median"] is None:
        return "no pairs"
    if not c.get("judged", True):
        return "not judged (CPU smoke run)"
    words = [] if c["target"] is None else ["pass" if c["passed"] else f"**MISSED** (< {c['target']})"]
    if c["suspicious"]:
        words.append(f"**SUSPICIOUS** (> {SUSPICIOUS}: the sides were not measured alike)")
    return ", ".join(words) or "-"


def outcome_lines(rec: dict[str, Any]) -> list[str]:
    """The Markdown's verdict: each target missed, or that none was (so far, or on fewer pairs than asked)."""
    if rec["missed"]:
        return [f"**Missed**: {x}" for x in rec["missed"]]
    if not rec["finished"]:
        return ["No target missed so far."]
    return ["All targets met, on fewer pairs than asked." if rec.get("too_few_pairs") else "All targets met."]


def rate_cell(s: dict[str, Any]) -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median']:.5g} ({s['min']:.5g}-{s['max']:.5g})"


def ratio_cell(c: dict[str, Any]) -> str:
    if c["ratio_median"] is None:
        return "-"
    return f"{c['ratio_median']:.3f} ({c['ratio_min']:.3f}-{c['ratio_max']:.3f})"


def process_started() -> float:
    """When this process started, on the perf_counter clock: a budget counts Python's start and imports too."""
    import psutil

    return time.perf_counter() - max(0.0, time.time() - psutil.Process().create_time())


@dataclass
class Budget:
    """Seconds this bench may run (from its process's start); a unit of work starts only if its estimate fits,
    with ``margin_s`` left for writing the records and leaving."""

    limit_s: float | None
    margin_s: float = 5.0
    started: float = field(default_factory=process_started)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float | None:
        return None if self.limit_s is None else self.limit_s - self.elapsed()

    def fits(self, estimate_s: float) -> bool:
        left = self.left()
        return left is None or estimate_s <= left - self.margin_s


def too_few(name: str, done: int, asked: int) -> str | None:
    """A series that ended with fewer pairs than MIN_PAIRS, in words (None when it has enough)."""
    if done >= min(MIN_PAIRS, asked):
        return None
    return f"{name}: {done} pair{'s' if done != 1 else ''} (fewer than {min(MIN_PAIRS, asked)}): its medians are weak"


def budget_phrase(limit_s: float | None) -> str:
    return f"{limit_s:g} s" if limit_s is not None else "none"


def file_digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def bench_identity(*scripts: Path) -> dict[str, str]:
    """The bench's own files (outside the engine's source digest), by digest."""
    return {path.name: file_digest(path) for path in scripts}


def gpu_driver() -> str | None:
    """The NVIDIA driver's version (NVML, else nvidia-smi), None when neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no pynvml, or NVML refused: nvidia-smi may still answer
        pass
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def machine(device_type: str) -> dict[str, Any]:
    """The machine a record was made on: the device's name, the driver, torch and its CUDA, the host."""
    import torch

    from flagperf.results.provenance import cpu_model

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "host": platform.node(), "cpu": cpu_model(), "logical_cpus": os.cpu_count()}
    if device_type == "cuda" and torch.cuda.is_available():
        info.update(device=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                    driver=gpu_driver() or "unknown (no NVML, no nvidia-smi)")
    else:
        info["device"] = f"CPU ({info['cpu']})"
    return info


def write_atomic(path: Path, text: str) -> None:
    """The whole file or the previous one: a run killed mid-write leaves no half record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_record(folder: Path, name: str, record: dict[str, Any], markdown: str) -> None:
    write_atomic(folder / f"{name}.json", json.dumps(record, indent=2, default=str) + "\n")
    write_atomic(folder / f"{name}.md", markdown)


def command_line() -> str:
    import shlex

    return shlex.join(["python", *sys.argv])
