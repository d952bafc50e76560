"""The vendor's monitors around a bench's work, started as a host round starts them (pid file, interval, parent),
for every bench that records what the chip did meanwhile (generate_gpu, serving_gpu, operation_gpu)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.hosts.runtime import PID_FILE  # noqa: E402
from flagperf.results.analysis import read_monitor  # noqa: E402


class VendorMonitors:
    """The vendor's monitors sampling every ``interval_s`` into ``folder``. Made without processes; ``start`` starts
    them, so that a failed start inside the caller's try is still stopped by its ``stop``. ``max_seconds`` None:
    they keep their own long limit, as a round's do; the parent's exit, the pid file and ``stop`` end them."""

    def __init__(self, vendor: str, folder: Path, interval_s: float, max_seconds: float | None = None) -> None:
        self.loaded = load_vendor(vendor)
        self.folder, self.interval_s, self.max_seconds = folder, interval_s, max_seconds
        self.paths = {m.name: folder / f"monitor_{m.name}.jsonl" for m in self.loaded.manifest.monitors}
        self.logs = {m.name: folder / f"monitor_{m.name}.log" for m in self.loaded.manifest.monitors}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        (self.folder / PID_FILE).write_text(str(os.getpid()), encoding="utf-8")
        # The project importable by the monitors as by the bench, from wherever it was started.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        limit = [] if self.max_seconds is None else ["--max-seconds", f"{self.max_seconds:g}"]
        for m in self.loaded.manifest.monitors:
            with self.logs[m.name].open("wb") as errors:
                self.procs[m.name] = subprocess.Popen(
                    [*self.loaded.monitor_command(m, sys.executable), "--out", str(self.paths[m.name]), "--interval",
                     str(self.interval_s), "--pid-file", str(self.folder / PID_FILE), *limit, "--parent-pid",
                     str(os.getpid())],
                    stdout=subprocess.DEVNULL, stderr=errors, cwd=ROOT, env=env)

    def failed(self) -> list[str]:
        """Each monitor that exited non-zero without a sample: its exit code and the tail of its log."""
        out = []
        for name, proc in self.procs.items():
            code = proc.poll()
            if code and not samples(self.paths[name]):
                out.append(f"monitor {name} exited {code} with 0 samples ({self._log_tail(name)})")
        return out

    def _log_tail(self, name: str) -> str:
        log = self.logs[name].read_text(encoding="utf-8", errors="replace") if self.logs[name].exists() else ""
        return " ".join(log.strip().splitlines()[-3:])[-300:] or "no output"

    def wait_sampling(self, timeout_s: float = 60.0) -> None:
        """Until every monitor has written a sample (or exited): their start-up never overlaps the bench's work."""
        deadline = time.monotonic() + timeout_s
        pending = dict(self.paths)
        while pending and time.monotonic() < deadline:
            for name, path in list(pending.items()):
                if self.procs[name].poll() is not None or samples(path):
                    del pending[name]
            time.sleep(0.05)

    def wait_past(self, t: float, timeout_s: float = 30.0) -> None:
        """Until every running monitor has a sample after epoch ``t``: a window its samples do not yet reach would
        read as one the monitors do not cover."""
        deadline = time.monotonic() + timeout_s
        pending = dict(self.paths)
        while pending and time.monotonic() < deadline:
            for name, path in list(pending.items()):
                proc = self.procs.get(name)
                if proc is None or proc.poll() is not None or last_sample_t(path) > t:
                    del pending[name]
            time.sleep(0.05)

    def stop(self) -> dict[str, Any]:
        """Each monitor's exit code and samples written, and the tail of its log where it wrote none: one that
        could not run (a missing NVML library) is recorded, not fatal."""
        out: dict[str, Any] = {}
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code: int | None = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            out[name] = {"exit": code, "samples": samples(self.paths[name])}
            if not out[name]["samples"]:
                out[name]["error"] = self._log_tail(name)
        return out


def samples(path: Path) -> int:
    """The samples a monitor's file holds, read as a run's analysis reads them (any JSON spacing a vendor's monitor
    writes; a line being written is no sample)."""
    return len(read_monitor(path).samples)


def last_sample_t(path: Path) -> float:
    """The epoch time of a monitor file's last sample line (0 where none is written yet)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0.0
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written
        if row.get("type") == "sample" and isinstance(row.get("t"), int | float):
            return float(row["t"])
    return 0.0
