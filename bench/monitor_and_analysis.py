"""Monitor overhead and analysis speed, measured in one run on this machine.

(1) The system monitor at 1 Hz and 10 Hz: CPU time it uses per second of wall time (share of one core),
    measured from its own process counters after start-up (imports excluded, reported separately).
(2) Analysis speed: parsing and summarising a generated log of one million PerfLog lines, and the
    window analysis of a one-hour 10 Hz monitor file.

    python bench/monitor_and_analysis.py [--seconds 30] [--lines 1000000] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flagperf.measure.perflog import format_line, parse_file, summarize_steps  # noqa: E402
from flagperf.results.analysis import read_monitor, window_stats  # noqa: E402

SETTLE_S = 3.0  # let the monitor import and prime its counters before measuring


def monitor_overhead(interval: float, seconds: float, folder: Path) -> dict[str, float]:
    out = folder / f"monitor_{interval:g}.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "flagperf.monitoring.system", "--out", str(out),
                             "--interval", str(interval)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    ps = psutil.Process(proc.pid)
    time.sleep(SETTLE_S)
    start_cpu = sum(ps.cpu_times()[:2])
    start = time.perf_counter()
    time.sleep(seconds)
    cpu = sum(ps.cpu_times()[:2]) - start_cpu
    wall = time.perf_counter() - start
    proc.terminate()
    proc.wait(timeout=10)
    samples = sum(1 for line in out.read_text().splitlines() if '"type": "sample"' in line)
    return {"interval_s": interval, "wall_s": wall, "cpu_s": cpu, "core_share": cpu / wall,
            "startup_cpu_s": start_cpu, "samples": samples}


def perflog_speed(lines: int, folder: Path) -> dict[str, float]:
    path = folder / "perflog.txt"
    with path.open("w") as handle:
        handle.write(format_line("INIT_START", {}, file="run.py", lineno=1, time_ms=0, rank=0) + "\n")
        for i in range(lines - 2):
            handle.write(format_line("STEP_END", {"step": i, "loss": 2.0 - i * 1e-7, "samples_per_s": 500.0 + i % 7},
                                     file="run.py", lineno=42, time_ms=i, rank=i % 8) + "\n")
        handle.write(format_line("FINISHED", {"e2e_time": 3600.0}, file="run.py", lineno=9, time_ms=lines, rank=0)
                     + "\n")
    start = time.perf_counter()
    log = parse_file(path)
    summary = summarize_steps(log, "samples_per_s")
    seconds = time.perf_counter() - start
    assert summary["steps"] == lines - 2 and log.finished()[0]["e2e_time"] == 3600.0
    return {"lines": lines, "bytes": path.stat().st_size, "seconds": seconds, "lines_per_s": lines / seconds}


def monitor_analysis_speed(folder: Path, hours: float = 1.0, rate_hz: float = 10.0) -> dict[str, float]:
    path = folder / "monitor_long.jsonl"
    n = int(hours * 3600 * rate_hz)
    t0 = 1_800_000_000.0
    with path.open("w") as handle:
        handle.write(json.dumps({"type": "header", "monitor": "system"}) + "\n")
        for i in range(n):
            t = t0 + i / rate_hz
            handle.write(json.dumps({"type": "sample", "t": t, "cpu_percent": 50.0, "mem_used_bytes": 10**9,
                                     "power_w": 300.0, "energy_j": 300.0 * i / rate_hz}) + "\n")
    start = time.perf_counter()
    stats = window_stats([read_monitor(path)], (t0 + 60, t0 + hours * 3600 - 60))
    seconds = time.perf_counter() - start
    assert abs(stats.values["energy_j"] - 300.0 * (hours * 3600 - 120)) < 1e-3
    return {"samples": n, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        overhead = [monitor_overhead(i, args.seconds, folder) for i in (1.0, 0.1)]
        perflog = perflog_speed(args.lines, folder)
        analysis = monitor_analysis_speed(folder)
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join(["python", *sys.argv]), "cores": os.cpu_count(),
              "monitor_overhead": overhead, "perflog": perflog, "monitor_analysis": analysis}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "monitor_and_analysis.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# Monitor overhead and analysis speed", "",
             f"Recorded {report['date']} with `{report['command']}` on {report['cores']} cores.", "",
             "| monitor rate | samples | CPU s over wall s | share of one core | start-up CPU s (excluded) |",
             "|---|---|---|---|---|"]
    lines += [f"| {1 / o['interval_s']:g} Hz | {o['samples']} | {o['cpu_s']:.3f} / {o['wall_s']:.1f} | "
              f"{o['core_share']:.2%} | {o['startup_cpu_s']:.2f} |" for o in overhead]
    lines += ["", "Goal: under 1% of a core at 1 Hz.", "",
              f"PerfLog: {perflog['lines']:,} lines ({perflog['bytes'] / 1e6:.0f} MB) parsed and summarised in "
              f"**{perflog['seconds']:.2f} s** ({perflog['lines_per_s']:,.0f} lines/s). Goal: a few seconds.", "",
              f"Monitor analysis: {analysis['samples']:,} samples (one hour at 10 Hz) read and analysed over a "
              f"window in {analysis['seconds']:.2f} s.", ""]
    (args.out / "monitor_and_analysis.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
