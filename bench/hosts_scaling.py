"""One evaluation over N simulated hosts against the same work on one host, in one run.

The hosts are the test bed's network namespaces, each with its own sshd (tests/testbed/up.sh N), driven
over SSH with the plain-process runtime. The case (tests/fixtures/cases/base/hold) holds for a fixed
time inside its timed region and does no arithmetic, so the wall time is what orchestration and the
per-round process cost, not what the shared CPU can compute.

    bash tests/testbed/up.sh 32
    PREFECT_API_URL=http://127.0.0.1:4300/api python bench/hosts_scaling.py --hosts 32 [--rounds 2] [--hold 5]

With PREFECT_API_URL it uses that server (the recorded run: `prefect server start` on PostgreSQL); without,
a temporary SQLite one, which answers 503s under 32 concurrent writers.

Where the time goes comes from the Prefect API: for each stage (healthcheck, start_monitors, run_case,
stop_monitors, collect_logs) the summed task time and the stage's span on the wall clock; per round, the
case process's start-up (interpreter + torch import) from its result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
FIXTURE_CASES = ROOT / "tests" / "fixtures" / "cases"
os.environ["FLAGPERF_CASE_PATH"] = str(FIXTURE_CASES)

from flagperf.results.schema import read_result  # noqa: E402
from tests.testbed.bed import deploy_project, load_testbed  # noqa: E402

STAGES = ("healthcheck", "start_monitors", "run_case", "stop_monitors", "collect_logs", "analyze")


def inventory(path: Path, count: int) -> str:
    bed = load_testbed()
    if bed is None or len(bed.hosts) < count:
        raise SystemExit(f"the test bed has {len(bed.hosts) if bed else 0} hosts; run tests/testbed/up.sh {count}")
    root = deploy_project(ROOT, bed)  # the hosts run a deployed copy, as real hosts do
    hosts = [{"name": h.name, "address": h.address, "port": h.port, "user": h.user, "key_file": h.key_file,
              "known_hosts": bed.known_hosts, "python": h.python, "project_root": str(root),
              "env": {"FLAGPERF_CASE_PATH": str(root / "tests" / "fixtures" / "cases")}} for h in bed.hosts[:count]]
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return str(path)


def stage_times(flow_run_id: Any) -> dict[str, dict[str, float]]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from prefect_api import all_task_runs

    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run in all_task_runs(flow_run_id):
        stage = run.name.split("[", 1)[0]
        if run.start_time and run.end_time:
            spans[stage].append((run.start_time.timestamp(), run.end_time.timestamp()))
    return {stage: {"tasks": len(s), "summed_s": sum(b - a for a, b in s),
                    "span_s": max(b for _, b in s) - min(a for a, _ in s)}
            for stage, s in spans.items() if stage in STAGES}


def evaluate_on(inventory_file: str, results: Path, rounds: int, hold: float, tag: str) -> dict[str, Any]:
    from flows.evaluate import evaluate

    run_id = f"bench-hosts-{tag}-{time.time_ns()}"
    import psutil

    controller = psutil.Process()
    cpu_before = sum(controller.cpu_times()[:2])
    machine_before = psutil.cpu_times()
    start = time.perf_counter()
    state = evaluate(cases=["hold"], rounds=rounds, overrides=[f"hold_s={hold}"], inventory=inventory_file,
                     results_dir=str(results), run_id=run_id, return_state=True, command="bench/hosts_scaling.py")
    wall = time.perf_counter() - start
    controller_cpu = sum(controller.cpu_times()[:2]) - cpu_before  # this process: flow, tasks, SSH, API calls
    machine_after = psutil.cpu_times()
    # Every process on the machine (the simulated hosts' cases, monitors, agents, sshd; the server; us).
    busy = sum(getattr(machine_after, f) - getattr(machine_before, f) for f in
               ("user", "nice", "system", "irq", "softirq", "steal") if hasattr(machine_after, f))
    if not state.is_completed():
        raise SystemExit(f"evaluation failed: {state.message}")
    rounds_done = [read_result(p) for p in sorted((results / run_id).glob("*/round*/*/result.json"))]
    return {"run_id": run_id, "wall_s": wall, "rounds": len(rounds_done), "controller_cpu_s": controller_cpu,
            "machine_busy_cpu_s": busy, "machine_cores": psutil.cpu_count(),
            "case_process_s_median": statistics.median(r.duration_s for r in rounds_done),
            "startup_s_median": statistics.median(r.startup_s or 0.0 for r in rounds_done),
            "stages": stage_times(state.state_details.flow_run_id)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    import contextlib

    from prefect.testing.utilities import prefect_test_harness

    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"flagperf-bench-hosts-{os.getpid()}"
    scratch.mkdir(parents=True)
    one, many = inventory(scratch / "one.yaml", 1), inventory(scratch / f"{args.hosts}.yaml", args.hosts)
    # N concurrent host-round subflows are N writers: on a team server (PostgreSQL, PREFECT_API_URL) as the
    # README advises for more than one person or a few hosts; SQLite (the test harness) answers 503s.
    server = contextlib.nullcontext() if os.environ.get("PREFECT_API_URL") else prefect_test_harness(
        server_startup_timeout=180)
    with server:
        evaluate_on(one, scratch / "results", 1, 1.0, "warmup")  # imports, first SSH connections
        single = evaluate_on(one, scratch / "results", args.rounds, args.hold, "1")
        fleet = evaluate_on(many, scratch / "results", args.rounds, args.hold, str(args.hosts))
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "hosts": args.hosts, "rounds": args.rounds, "hold_s": args.hold,
        "prefect_api": "PREFECT_API_URL (" + os.environ["PREFECT_API_URL"] + ")" if os.environ.get("PREFECT_API_URL")
        else "temporary server (SQLite)",
        "one_host": single, "many_hosts": fleet,
        "wall_ratio": fleet["wall_s"] / single["wall_s"],
        "work_ratio": args.hosts,  # N times the rounds in the N-host run
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hosts_scaling.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: record[k] for k in ("hosts", "wall_ratio")} | {
        "one_wall_s": single["wall_s"], "many_wall_s": fleet["wall_s"]}, indent=2))


if __name__ == "__main__":
    main()
