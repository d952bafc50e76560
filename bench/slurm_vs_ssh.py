"""One evaluation over 1, 2 and all of the test bed's Slurm nodes against the same work over SSH.

The same nodes both ways: the test bed's hosts h1..hN are network namespaces that each run an sshd and a slurmd
(tests/testbed/up.sh). Over SSH the controller starts the monitors and the case on the host itself; through Slurm
each round is a job (sbatch, srun step, flagperf.hosts.slurm_node on the node) and the controller watches its
files on the shared folder and asks squeue now and then. The case (tests/fixtures/cases/base/hold) holds for a
fixed time and does no arithmetic, so what differs is orchestration.

    sudo bash tests/testbed/up.sh
    python bench/slurm_vs_ssh.py [--rounds 2] [--hold 5] [--poll 1.0]

Per evaluation: its wall time, the controller's CPU (this process and the Slurm/ssh tools it waited for) per
round, and the summed time of the run_case tasks (submission to collected, per round) from the Prefect API.
Writes bench/results/slurm_vs_ssh.json; the Markdown beside it is written by hand from it.
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["FLAGPERF_CASE_PATH"] = str(ROOT / "tests" / "fixtures" / "cases")

from bench.hosts_scaling import stage_times  # noqa: E402
from flagperf.results.schema import read_result  # noqa: E402
from tests.testbed.bed import Testbed, deploy_project, load_testbed  # noqa: E402


def inventories(folder: Path, bed: Testbed, root: Path, count: int, poll_s: float) -> dict[str, str]:
    """The first ``count`` nodes, as SSH hosts and as one Slurm entry."""
    assert bed.slurm is not None
    env = {"FLAGPERF_CASE_PATH": str(root / "tests" / "fixtures" / "cases")}
    ssh = [{"name": h.name, "address": h.address, "port": h.port, "user": h.user, "key_file": h.key_file,
            "known_hosts": bed.known_hosts, "python": h.python, "project_root": str(root), "env": env}
           for h in bed.hosts[:count]]
    shared = folder / "shared"
    shared.mkdir(mode=0o700, exist_ok=True)  # the Slurm jobs run as this user
    slurm = [{"name": "bed", "python": bed.hosts[0].python, "project_root": str(root), "env": env,
              "slurm": {"partition": bed.slurm.partition, "nodelist": bed.slurm.node_names[:count],
                        "shared_dir": str(shared), "poll_s": poll_s}}]
    paths = {}
    for kind, hosts in (("ssh", ssh), ("slurm", slurm)):
        path = folder / f"{kind}-{count}.yaml"
        path.write_text(yaml.safe_dump({"vendor": "cpu", "hosts": hosts}))
        paths[kind] = str(path)
    return paths


def evaluate_on(inventory: str, results: Path, rounds: int, hold: float, tag: str) -> dict[str, Any]:
    import psutil

    from flows.evaluate import evaluate

    run_id = f"bench-slurm-ssh-{tag}-{time.time_ns()}"
    me = psutil.Process()

    def cpu() -> float:
        t = me.cpu_times()
        return t.user + t.system + t.children_user + t.children_system  # the Slurm tools and ssh it waited for

    before = cpu()
    start = time.perf_counter()
    state = evaluate(cases=["hold"], rounds=rounds, overrides=[f"hold_s={hold}"], inventory=inventory,
                     results_dir=str(results), run_id=run_id, return_state=True, command="bench/slurm_vs_ssh.py")
    wall = time.perf_counter() - start
    controller_cpu = cpu() - before
    if not state.is_completed():
        raise SystemExit(f"evaluation {tag} failed: {state.message}")
    done = [read_result(p) for p in sorted((results / run_id).glob("*/round*/*/result.json"))]
    stages = stage_times(state.state_details.flow_run_id)
    return {"run_id": run_id, "wall_s": wall, "rounds": len(done), "controller_cpu_s": controller_cpu,
            "controller_cpu_per_round_s": controller_cpu / len(done),
            "run_case_s_median": stages["run_case"]["summed_s"] / stages["run_case"]["tasks"],
            "case_process_s_median": statistics.median(r.duration_s for r in done), "stages": stages}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--poll", type=float, default=1.0, help="slurm.poll_s")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    bed = load_testbed()
    if bed is None or bed.slurm is None:
        raise SystemExit("no test bed with a Slurm cluster: run tests/testbed/up.sh as root")
    sizes = sorted({1, min(2, len(bed.slurm.nodes)), len(bed.slurm.nodes)})
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"flagperf-bench-slurm-{os.getpid()}"
    scratch.mkdir(mode=0o755, parents=True)  # the SSH hosts' user reads the deployed copy in it
    root = deploy_project(ROOT, bed, scratch / "deploy" / "flagperf")  # its own: no other checkout replaces it
    measured: dict[str, dict[str, Any]] = {}
    with prefect_test_harness(server_startup_timeout=180):
        warm = inventories(scratch, bed, root, 1, args.poll)
        for kind in ("ssh", "slurm"):  # imports, first connections, first jobs
            evaluate_on(warm[kind], scratch / "results", 1, 1.0, f"warmup-{kind}")
        for count in sizes:
            paths = inventories(scratch, bed, root, count, args.poll)
            for kind in ("ssh", "slurm"):  # interleaved: a drift in the machine's load hits both
                measured[f"{kind}-{count}"] = evaluate_on(paths[kind], scratch / "results", args.rounds, args.hold,
                                                          f"{kind}-{count}")
                print(kind, count, json.dumps({k: round(v, 2) for k, v in measured[f"{kind}-{count}"].items()
                                               if isinstance(v, float)}), flush=True)
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "rounds": args.rounds, "hold_s": args.hold, "slurm_poll_s": args.poll, "sizes": sizes,
        "runs": measured,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slurm_vs_ssh.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
