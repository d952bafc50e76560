"""One node's part of a round's Slurm job, run by its srun step (one task per node):

    python -m flagperf.hosts.slurm_node PLAN.json

PLAN (written by the controller on the shared folder) lists the round's nodes by rank: each one's job folder,
case entry and monitors. This node finds its rank (its own node name when the plan pins nodes, else
SLURM_NODEID), gives the case NODE_RANK, MASTER_ADDR (rank 0's NodeAddr, from `scontrol show hostnames
$SLURM_JOB_NODELIST` and `scontrol show node`) and MASTER_PORT (from SLURM_JOB_ID), starts the monitors, runs
the case entry with its output in case.log, stops the monitors, and writes its exit record last. A SIGTERM
(scancel, the time limit) stops the case and the monitors first. Standard library only: it starts before
anything else on the node is known to work.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

START_FILE = "slurm-node.started.json"
EXIT_FILE = "slurm-node.exit.json"
MONITOR_EXIT = "monitor_{name}.exit"
PARENT_PID_ENV = "FLAGPERF_PARENT_PID"  # as flagperf.hosts.local: the case checks who started it
MASTER_PORT_SPAN = 5000


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: the controller polls for these files on a shared file system."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
    tmp.replace(path)


def scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60, check=True).stdout


def node_address(node: str) -> str:
    """The address the other nodes reach ``node`` at: its NodeAddr (the name where Slurm gives none)."""
    try:
        found = re.search(r"(?:^|\s)NodeAddr=(\S+)", scontrol("show", "node", "-o", node))
    except (OSError, subprocess.SubprocessError):
        return node
    return found.group(1) if found else node


def my_rank(plan: dict[str, Any]) -> dict[str, Any]:
    ranks = plan["ranks"]
    if all(r.get("node") for r in ranks):  # pinned: by name (Slurm numbers nodes its own way)
        me = os.environ.get("SLURMD_NODENAME", "")
        for entry in ranks:
            if entry["node"] == me:
                return entry
        raise SystemExit(f"slurm_node: node {me!r} is not in the plan's nodes {[r['node'] for r in ranks]}")
    return ranks[int(os.environ.get("SLURM_NODEID", "0"))]


def master(plan: dict[str, Any]) -> tuple[str, int]:
    """Rank 0's address and the job's port: every node derives the same pair from Slurm's variables."""
    ranks = plan["ranks"]
    if all(r.get("node") for r in ranks):
        first = ranks[0]["node"]
    else:
        first = scontrol("show", "hostnames", os.environ["SLURM_JOB_NODELIST"]).split()[0]
    port = int(plan["master_port_base"]) + int(os.environ.get("SLURM_JOB_ID", "0")) % MASTER_PORT_SPAN
    return node_address(first), port


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m flagperf.hosts.slurm_node PLAN.json", file=sys.stderr)
        return 2
    plan = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    entry = my_rank(plan)
    job_dir, stage_dir = Path(entry["job_dir"]), Path(entry["stage_dir"])
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), "NODE_RANK": str(entry["rank"])}
    if len(plan["ranks"]) > 1:
        address, port = master(plan)
        env.update(MASTER_ADDR=address, MASTER_PORT=str(port))
        job_file = job_dir / "job.json"  # the case reads its rank's peers from the job
        job = json.loads(job_file.read_text(encoding="utf-8"))
        job.update(node_rank=entry["rank"], master_addr=address, master_port=port)
        write_json(job_file, job)
    write_json(job_dir / START_FILE, {"node": os.environ.get("SLURMD_NODENAME"), "job_id": os.environ.get(
        "SLURM_JOB_ID"), "rank": entry["rank"], "pid": os.getpid(), "time": time.time()})
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))

    monitors: list[tuple[str, subprocess.Popen[bytes]]] = []
    for monitor in entry["monitors"]:
        command = list(monitor["argv"])
        if "--parent-pid" in command:  # the monitors stop when this process goes
            command[command.index("--parent-pid") + 1] = str(os.getpid())
        with open(monitor["log"], "ab") as log:
            monitors.append((monitor["name"], subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                               stderr=subprocess.STDOUT)))
    code = run_case(entry["entry"], env, job_dir / "case.log", stage_dir / "case.pid", stopping)
    for name, proc in monitors:
        write_text(stage_dir / MONITOR_EXIT.format(name=name), f"{stop(proc, 5.0)}\n")
    write_json(job_dir / EXIT_FILE, {"exit_code": code, "signal": stopping[0] if stopping else None,
                                     "node": os.environ.get("SLURMD_NODENAME"), "time": time.time()})
    return code if code >= 0 else 128 - code


def run_case(argv: list[str], env: dict[str, str], log_path: Path, pid_file: Path, stopping: list[int]) -> int:
    """The case entry in its own process group, output appended to case.log; stopped (the whole group) when
    this process is told to stop."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        write_text(pid_file, str(proc.pid))
        while True:
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if stopping:
                    stop_group(proc, 5.0)


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> int | None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
