"""Launch one node's share of a training round, as torchrun would, and turn its PerfLog into a result.

nproc_per_node processes, each with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT), output in rank<R>.out.log.
If one process fails the others are stopped. The node's first process's FINISHED event is the result.
A crash after every process passed the final barrier (leave_process_group) does not fail the round: it is
reported beside the figures.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flagperf.config.job import JOB_FILE, Job
from flagperf.errors import EXIT_OK, EXIT_USER_ERROR
from flagperf.measure.perflog import PerfLog, parse_file
from flagperf.results.bounded import read_end
from flagperf.results.schema import Convergence, Metric, Peak

EXIT_WORKER_FAILED = 70
USER_ERROR_PREFIX = "flagperf user error: "  # how a process says its input was wrong (see user_error)
USER_ERROR_LOG_END_BYTES = 1 << 20
TEARDOWN_MARKER = "flagperf: every rank has finished; leaving the process group"
JOINING = "joining the process group at "  # the worker's line before it meets its peers (flagperf.training.worker)
JOINED = "joined the process group at "
TEARDOWN_GRACE_S = 30.0  # how long the others may take to leave the group once one has crashed in it
LOG_END_BYTES = 1024 * 1024  # of a rank's output read for its last lines or the teardown marker


def rank_log(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.out.log"


def socket_interface_env(master_addr: str, master_port: int) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME: the interface this node reaches the master through.

    Left alone, gloo and NCCL advertise the address the host name resolves to, which is often 127.0.0.1
    or a management network the other nodes cannot reach. Variables the user set win (they are merged
    under os.environ)."""
    import socket

    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, master_port))  # UDP: chooses the route, sends nothing
            local = probe.getsockname()[0]
    except OSError:
        return {}
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addresses):
            return {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}
    return {}


@dataclass(frozen=True)
class NodeExit:
    """How a node's processes ended: ``code`` (EXIT_OK, EXIT_USER_ERROR or EXIT_WORKER_FAILED) and, on EXIT_OK,
    each process that crashed after every process of the job had finished (``teardown_faults``)."""

    code: int
    teardown_faults: tuple[str, ...] = ()
    failure: str | None = None  # which process failed the node, and how


def leave_process_group(group: Any = None) -> None:
    """The end of a distributed process: wait for every rank, say so, then destroy the process group.

    After the barrier every rank has written what it measured, so a crash in what follows (gloo's and the
    store's sockets closing at different times on each rank) is the library's teardown, not a failed round:
    the launcher reports it beside the figures instead of failing the round."""
    import torch.distributed as dist

    dist.barrier(group=group)
    print(TEARDOWN_MARKER, flush=True)
    dist.destroy_process_group()


def finished_before_crash(log: Path) -> bool:
    """Whether a process's output says it passed the final barrier (leave_process_group)."""
    try:
        return TEARDOWN_MARKER in (read_end(log, LOG_END_BYTES) or "")  # printed last: its end holds it
    except OSError:
        return False


def never_joined(log: Path) -> str | None:
    """Where a process waited for its peers, when its output says it began to join the process group and never
    did (a node that did not start, or MASTER_ADDR:MASTER_PORT not reachable from every node); else None."""
    try:
        text = read_end(log, LOG_END_BYTES) or ""
    except OSError:
        return None
    if JOINING not in text or JOINED in text:
        return None
    where = text.rsplit(JOINING, 1)[1].split(" ", 1)[0]
    return (f"it never joined the process group at {where} (every node must start and reach that address and "
            "port: MASTER_PORT free on the first host, no firewall between the hosts)")


def output_tail(log: Path, lines: int = 40) -> str:
    """The last lines of a process's output, indented, for the node's own log."""
    try:
        end = read_end(log, LOG_END_BYTES)  # bounded: a rank's output may be of any size
        if end is None:
            raise OSError(0, "not a readable regular file")
        text = end.rstrip().splitlines()[-lines:]
    except OSError as exc:
        return f"    ({log.name} cannot be read: {exc.strerror})"
    return "\n".join(f"    {line}" for line in text) if text else f"    ({log.name} is empty)"


def launch(job: Job, out_dir: Path, nnodes: int, nproc: int, master_port: int,
           module: str = "flagperf.training.worker") -> NodeExit:
    """Start this node's processes (``python -m <module> --job job.json``) and wait for them. Several nodes meet
    at ``master_port`` on the master; the processes of a single node at a store this launcher holds.

    A process that fails before any process of the node passed the final barrier fails the node: the others
    are stopped (they would wait for it in a collective) and its last lines are printed. A failure after that
    is a teardown fault: the figures are complete; the others get TEARDOWN_GRACE_S to end, then are stopped."""
    world = nnodes * nproc
    first_rank = job.node_rank * nproc
    procs: list[subprocess.Popen[bytes]] = []
    network = socket_interface_env(job.master_addr, master_port) if nnodes > 1 else {}
    master = {"MASTER_ADDR": job.master_addr, "MASTER_PORT": str(master_port)}
    store = None
    if nnodes == 1 and nproc > 1:
        # One node: the processes meet at a store held here, on a port the OS gives as it binds (as torchrun
        # --standalone does), not at master_port, which another round or program on this host may hold.
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", 0, world_size=world, is_master=True, wait_for_workers=False)
        master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    for local_rank in range(nproc):
        rank = first_rank + local_rank
        env = {**network, **os.environ, "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(nproc), "NODE_RANK": str(job.node_rank), "GROUP_RANK": str(job.node_rank),
               **master}
        with rank_log(out_dir, rank).open("wb") as log:
            # -X faulthandler: a process killed by a signal (SIGABRT from a C++ library) leaves every thread's
            # Python stack in its log.
            procs.append(subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", module, "--job",
                                           str(out_dir / JOB_FILE)], env=env, stdout=log, stderr=subprocess.STDOUT))
    logs = [rank_log(out_dir, first_rank + local_rank) for local_rank in range(nproc)]
    codes: dict[int, int] = {}  # local rank -> exit code, of the processes that have ended
    complete_since: float | None = None  # a process failed after the node's figures were complete, at this time
    failing: dict[int, int] = {}
    while len(codes) < nproc:
        ended = {i: code for i in range(nproc) if i not in codes and (code := procs[i].poll()) is not None}
        codes.update(ended)
        if any(ended.values()):
            # Once one process has passed the final barrier, every process has written its figures: a failure
            # from then on (its own crash, or a peer's closed socket) is the library's teardown.
            if any(finished_before_crash(log) for log in logs):
                complete_since = complete_since or time.monotonic()
            else:
                failing = {i: code for i, code in ended.items() if code}
                break
        if complete_since is not None and time.monotonic() - complete_since > TEARDOWN_GRACE_S:
            break  # NCCL's destroy can hang when a peer died in it: the others are stopped below
        if len(codes) < nproc:
            time.sleep(0.2)
    still_running = [i for i in range(nproc) if i not in codes]
    _stop([procs[i] for i in still_running])  # one rank died: the others would wait for it in a collective
    del store  # the processes have ended: the store's port is closed
    if failing:
        # The one killed by a signal is the cause (a peer it left exits 1, "connection closed", a moment later),
        # then one that says its input was wrong.
        blamed = min(failing, key=lambda i: (failing[i] >= 0, failing[i] != EXIT_USER_ERROR, i))
        rank, code = first_rank + blamed, failing[blamed]
        others = "".join(f"; rank {first_rank + i} exited {c}" for i, c in sorted(failing.items()) if i != blamed)
        waited = never_joined(logs[blamed])
        failure = (f"rank {rank} exited {code} before the final barrier (see {logs[blamed].name})"
                   f"{f': {waited}' if waited else ''}{others}")
        print(f"a process of this node failed: rank {rank} exited {code}; the end of {logs[blamed].name}:\n"
              f"{output_tail(logs[blamed])}", flush=True)
        return NodeExit(EXIT_USER_ERROR if code == EXIT_USER_ERROR else EXIT_WORKER_FAILED, failure=failure)
    how = {i: f"exited {code} while" for i, code in codes.items() if code}
    how |= {i: f"was stopped after {TEARDOWN_GRACE_S:.0f} s still" for i in still_running}
    teardown = []
    for i in sorted(how):
        fault = (f"rank {first_rank + i} {how[i]} leaving the process group, after every rank had finished "
                 f"(see {logs[i].name})")
        print(f"warning: {fault}; the end of its output:\n{output_tail(logs[i])}", flush=True)
        teardown.append(fault)
    return NodeExit(EXIT_OK, tuple(teardown))


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def with_teardown_note(metric: Metric, faults: tuple[str, ...]) -> Metric:
    """The metric, its note naming the processes that crashed after the measurement was complete."""
    if not faults:
        return metric
    said = "; ".join(faults) + " (the figures were complete: every rank had passed the final barrier)"
    return metric.model_copy(update={"note": f"{metric.note}; {said}" if metric.note else said})


def user_error(out_dir: Path) -> str | None:
    """The first user error a training process reported, if any."""
    for path in sorted(out_dir.glob("rank*.out.log")):
        # the process printed it as it stopped: at its log's end, read without the rest (never a FIFO waited on)
        for line in (read_end(path, USER_ERROR_LOG_END_BYTES) or "").splitlines():
            if line.startswith(USER_ERROR_PREFIX):
                return line.removeprefix(USER_ERROR_PREFIX)
    return None


def where_it_stopped(log: PerfLog) -> str:
    """A line saying how far a training process got, from its last PerfLog events."""
    if log.events.empty:
        return f"no PerfLog event was written (it stopped during start-up){log.read_from_end_note()}"
    last = log.events.iloc[-1]
    value = last["value"] if isinstance(last["value"], dict) else {}
    epochs = log.events[log.events["event"] == "EPOCH_BEGIN"]
    steps = log.events[log.events["event"] == "STEP_END"]
    epoch = epochs["value"].iloc[-1].get("epoch") if len(epochs) else None
    step = steps["value"].iloc[-1].get("step") if len(steps) else None
    return (f"last PerfLog event {last['event']} (epoch {value.get('epoch', epoch)}, step {value.get('step', step)}"
            f"; {len(epochs)} epoch(s) begun, last logged step {step}){log.read_from_end_note()}")


def training_result(out_dir: Path, first_rank: int) -> tuple[list[Metric], Convergence | None, str | None]:
    """Metrics and convergence from the node's first process's FINISHED event, or why there is none."""
    path = rank_log(out_dir, first_rank)
    if not path.is_file():
        return [], None, f"{path.name} is missing"
    try:
        log = parse_file(path)  # its end only, however long it grew
    except (OSError, ValueError) as exc:
        return [], None, f"{path.name}: {getattr(exc, 'strerror', None) or exc}"
    finished = log.finished().get(first_rank)
    if finished is None:
        waited = never_joined(path)
        return [], None, f"no FINISHED event in {path.name}: {waited or where_it_stopped(log)}"
    metrics = [
        Metric(name="training_throughput", value=finished["training_throughput"] or 0.0,
               unit=finished["throughput_unit"], measured_seconds=finished["raw_train_time"],
               work=(finished.get("extra") or {}).get("timed_samples"),
               convention="samples of all processes / time in training steps (evaluation excluded)",
               statistic="rate"),
        Metric(name="e2e_time", value=finished["e2e_time"], unit="s", statistic="single"),
        Metric(name="raw_train_time", value=finished["raw_train_time"], unit="s", statistic="single"),
        Metric(name="init_time", value=finished["init_time"], unit="s", statistic="single"),
    ]
    if finished["final_metric"] is not None and not math.isfinite(finished["final_metric"]):
        finished = {**finished, "final_metric": None, "converged": False}  # diverged: no number to report
    extra = finished.get("extra") or {}
    if finished["final_metric"] is not None:
        unit = extra.get("target_unit") if isinstance(extra.get("target_unit"), str) else ""
        metrics.append(Metric(name=f"final_{finished['target_metric']}", value=finished["final_metric"], unit=unit,
                              statistic="single"))
    world = extra.get("world_size") or 1
    if extra.get("cpu_oversubscribed"):
        metrics[0] = metrics[0].model_copy(update={"note": extra["cpu_oversubscribed"]})
    if extra.get("samples_per_s_per_device") is not None:
        metrics.append(Metric(name="samples_per_s_per_device", value=extra["samples_per_s_per_device"],
                              unit=finished["throughput_unit"], measured_seconds=finished["raw_train_time"],
                              work=extra["timed_samples"] / world if extra.get("timed_samples") else None,
                              convention=f"training_throughput / {world} processes", statistic="rate"))
    synthetic = " (synthetic data)" if extra.get("synthetic_data") else ""
    flops = extra.get("flops_convention")
    mfu_peak = Peak.model_validate(extra["mfu_peak"]) if extra.get("mfu") is not None and extra.get("mfu_peak") \
        else None
    if extra.get("tokens_per_s") is not None:
        metrics.append(Metric(name="tokens_per_s", value=extra["tokens_per_s"], unit="tokens/s",
                              measured_seconds=finished["raw_train_time"], mfu=extra.get("mfu"),
                              work=extra.get("timed_tokens"),
                              mfu_peak_key=extra.get("precision"), mfu_peak=mfu_peak,
                              convention=f"MFU = FLOPs per token x tokens/s per device / one device's peak; "
                                         f"FLOPs: {flops}; {extra.get('parameters')} parameters{synthetic}",
                              statistic="rate"))
        metrics.append(Metric(name="tokens_per_s_per_device", value=extra["tokens_per_s_per_device"],
                              unit="tokens/s", measured_seconds=finished["raw_train_time"],
                              work=extra["timed_tokens"] / world if extra.get("timed_tokens") else None,
                              convention=f"tokens_per_s / {world} processes", statistic="rate"))
    elif extra.get("mfu") is not None:  # a model that declared FLOPs per sample (convolutional ones)
        metrics[0] = metrics[0].model_copy(update={
            "mfu": extra["mfu"], "mfu_peak_key": extra.get("precision"), "mfu_peak": mfu_peak,
            "convention": f"{metrics[0].convention}; MFU = FLOPs per sample x samples/s per device / one "
                          f"device's peak; FLOPs: {flops}{synthetic}"})
    peaks = extra.get("peak_memory_bytes_per_device")
    if peaks:
        metrics.append(Metric(name="peak_memory", value=max(peaks) / 2**30, unit="GiB", statistic="single",
                              convention=f"the largest over {len(peaks)} processes of the "
                                         f"{extra.get('peak_memory_kind')}; per process (GiB): "
                                         + ", ".join(f"{p / 2**30:.3g}" for p in peaks)))
    if extra.get("time_to_target_s") is not None:
        metrics.append(Metric(name="time_to_target", value=extra["time_to_target_s"], unit="s", statistic="single",
                              convention="from the first training step to the evaluation that reached the target "
                                         "(evaluations included)"))
    convergence = Convergence(metric=finished["target_metric"], target=finished["target"],
                              reached=finished["final_metric"], converged=bool(finished["converged"]),
                              epochs=finished["epochs"], steps=finished["steps"])
    return metrics, convergence, None
