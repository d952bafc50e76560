"""A Slurm cluster as a place to run rounds, behind the same host contract as SSH and local hosts.

Each slot of a Slurm inventory entry (flagperf/hosts/slurm_spec.py) is a ``SlurmHost``: its files live on the
cluster's shared folder, which the controller sees too (so reading, writing and collecting are local file
operations), and everything that runs on a node runs inside a Slurm job submitted with sbatch:

* a round: ``SlurmRuntime.run_entry`` writes a plan and a batch script (every word quoted with shlex) and submits
  one job; its srun step runs flagperf.hosts.slurm_node on each node, which starts the round's monitors, runs the
  case entry and writes the node's exit record. The nodes of a multi-node round meet here first (one thread per
  node, as the evaluation runs them) and go in one job of nnodes nodes;
* anything else (the healthcheck's probe): ``SlurmHost.run``, a one-node job.

The controller then watches files on the shared folder (every ``poll_s``) and asks squeue now and then (every
``state_poll_s``): a job pending past ``pending_timeout_s`` is cancelled and the round fails naming squeue's
reason, and so is one whose nodes are still configuring (booting) past ``configuring_timeout_s``, a clock of its
own; a job that outlives the case's timeout, or a controller that is interrupted, cancels it (scancel), and
so does ``cancel_jobs`` at the end of every evaluation: nothing is left queued.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagperf.config.job import JOB_FILE
from flagperf.errors import ConfigError, FlagperfError, InfrastructureFailure
from flagperf.hosts.container_policy import PathFacts, PolicyError, SearchMounts, search_mounts
from flagperf.hosts.inventory import HostSpec, spec_origin
from flagperf.hosts.local import (
    BackgroundProcess,
    CommandResult,
    LineSink,
    LocalHost,
    allowed_environment,
    private_folder_problem,
)
from flagperf.hosts.runtime import Runtime
from flagperf.hosts.slurm_node import EXIT_FILE, MONITOR_EXIT, START_FILE
from flagperf.hosts.slurm_spec import SlurmSpec
from flagperf.paths import PROJECT_ROOT
from flagperf.results.bounded import open_regular, read_bounded, read_end, read_start
from flagperf.results.schema import ATTEMPT_FAILURE_FILE, CASE_LOG_FILE

logger = logging.getLogger("flagperf.hosts.slurm")
JOB_PREFIX = "flagperf"
PLAN_FILE = "slurm-job.json"
SCRIPT_FILE = "slurm-job.sh"
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}
NOT_STARTED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
END_WAIT_S = 60.0  # after the nodes wrote their exit records, how long the job may take to leave the queue
# squeue's reason for a pending job slurmctld's scheduler has not looked at yet (just submitted, or a busy controller):
# no reason at all. A job PENDING past pending_timeout_s with it is given up to REASON_WAIT_S more for a real one
# (Resources, Priority, ReqNodeNotAvail ...), squeue asked every state_poll_s meanwhile, so that the failure says why
# it waits, however fast the machine. A CONFIGURING job (its nodes allocated, booting) has no reason either, nor
# will it get one: it is not waited for. Its time configuring is not pending time: a power-saving cluster boots
# the nodes it allocated (minutes), which slurm.configuring_timeout_s bounds on a clock of its own.
NO_REASON = {"", "None"}
CONFIGURING = "CONFIGURING"
REASON_WAIT_S = 60.0
# What a path in pyxis' --container-mounts may not hold: ',' parts the mounts, ':' a mount's fields, and enroot
# writes each mount as one whitespace-separated fstab line.
PYXIS_UNSAFE = re.compile(r"[\s,:]")


class SlurmError(InfrastructureFailure):
    """A Slurm tool failed or a job ended without its nodes' records (retried like any crash)."""


class SlurmJobNeverStarted(FlagperfError):
    """The job was still pending at pending_timeout_s (not retried: it would wait the same way again)."""


def not_started_why(state: str, reason: str) -> str:
    """Why a job past slurm.pending_timeout_s (or, CONFIGURING, slurm.configuring_timeout_s) has not started, as
    squeue says, for its failure."""
    said = f"squeue reason: {reason}" if reason not in NO_REASON else "squeue reason: none"
    if state == CONFIGURING:
        return (f"its nodes are allocated and still configuring: booting (a power-saving cluster powers them up for "
                f"the job) or running a prolog; {said}; where nodes boot on demand, give slurm.configuring_timeout_s "
                "more than their boot takes")
    if state == "PENDING" and reason in NO_REASON:
        return f"{said}, also {REASON_WAIT_S:.0f} s later: slurmctld's scheduler has not looked at the job"
    return said


def batch_script(comment: str, commands: list[str]) -> str:
    """A job script: bash, one comment line, then ``commands`` (each already quoted with shlex). The comment is made
    of names and paths; anything but printable ASCII becomes '?', so no newline in one can end the comment and
    start a command or an #SBATCH directive (sbatch reads those up to the first command)."""
    return "\n".join(["#!/bin/bash", "# " + re.sub(r"[^\x20-\x7e]", "?", comment), *commands, ""])


def slurm_env() -> dict[str, str]:
    """The environment of the Slurm tools themselves (their SLURM_CONF): the controller's, without Slurm's job
    variables (the controller may itself run inside an allocation) or its S*_ option variables."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_")) or k == "SLURM_CONF"}


def slurm_tool(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
    """One Slurm command's output; SlurmError naming it and its first line of complaint."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env or slurm_env(),
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found on the controller's PATH (install Slurm's client tools)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(argv)} did not answer within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise SlurmError(f"{shlex.join(argv)} exited {done.returncode}: {why[0] if why else ''}")
    return done.stdout


# ------------------------------------------------------------------------------------------------- jobs

_live_jobs: set[SlurmJob] = set()
_live_lock = threading.Lock()


def cancel_jobs() -> list[str]:
    """scancel every job this process submitted that has not ended (the end of an evaluation, an interrupt):
    nothing is left queued or running, and every thread still waiting on one (or on a multi-node round's other
    nodes) stops waiting. Returns their ids."""
    with _live_lock:
        jobs = list(_live_jobs)
    for job in jobs:
        job.cancel("the evaluation ended")
        job.finish("cancelled: the evaluation ended")
    with _meetings_lock:
        meetings = list(_meetings.values())
        _meetings.clear()
    for meeting in meetings:
        with meeting.done:
            meeting.error = meeting.error or SlurmError("the evaluation ended")
            meeting.done.notify_all()
    return [job.job_id for job in jobs if job.job_id]


@dataclass
class Rank:
    """One node's part of a job: where its start and exit records appear, and who follows its output."""

    rank: int
    node: str | None
    job_dir: Path
    stage_dir: Path
    entry: list[str]
    monitors: list[dict[str, Any]]
    log: Path | None = None  # its case.log


@dataclass(eq=False)
class SlurmJob:
    """A submitted job and what the controller knows of it; one thread watches it (``watch``) while the others
    (the other nodes of a multi-node round) wait for their own node's record or the job's end."""

    spec: SlurmSpec
    name: str
    ranks: list[Rank]
    output: Path
    timeout_s: float
    job_id: str = ""
    submitted: float = 0.0
    started: float | None = None
    # Since when squeue says CONFIGURING (None: it does not), and how long it did so before (a job requeued after
    # a boot that failed is PENDING again): time configuring is no pending time.
    configuring_since: float | None = None
    configured_s: float = 0.0
    ended: threading.Event = field(default_factory=threading.Event)
    end: str | None = None  # why it ended without every node's record
    never_started: bool = False
    timed_out: bool = False
    cancelled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, script: Path, env: dict[str, str], chdir: Path, nodelist: list[str] | None) -> None:
        spec = self.spec
        minutes = max(1, math.ceil((self.timeout_s + spec.time_slack_s) / 60))
        # --no-requeue: a node failure must not rerun the case from the same job.json (its prompts would reach an
        # endpoint again, and the controller already counts the attempt lost and retries it itself)
        argv = ["sbatch", "--parsable", "--no-requeue", f"--job-name={self.name}", f"--nodes={len(self.ranks)}",
                "--ntasks-per-node=1", f"--time={minutes}", f"--output={self.output}", f"--chdir={chdir}",
                "--export=ALL"]
        for option, value in (("partition", spec.partition), ("account", spec.account), ("qos", spec.qos),
                              ("gres", spec.gres), ("constraint", spec.constraint)):
            if value:
                argv.append(f"--{option}={value}")
        if nodelist:
            argv.append(f"--nodelist={','.join(nodelist)}")
        if spec.exclusive:
            argv.append("--exclusive")
        argv.append(str(script))
        with _live_lock:
            _live_jobs.add(self)
        try:
            out = slurm_tool(argv, spec.command_timeout_s, env={**env, **_slurm_conf()})
        except BaseException:
            with _live_lock:
                _live_jobs.discard(self)
            raise
        self.job_id = out.strip().split(";")[0]
        self.submitted = time.monotonic()
        logger.info("submitted Slurm job %s (%s, %d node(s))", self.job_id, self.name, len(self.ranks))

    def state(self) -> tuple[str | None, str]:
        """squeue's state and reason for the job; (None, "") once Slurm has forgotten it."""
        try:
            out = slurm_tool(["squeue", "-h", "-j", self.job_id, "--states=all", "-o", "%T|%r"],
                             self.spec.command_timeout_s)
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None, ""
            raise
        line = out.strip().splitlines()[0] if out.strip() else ""
        if not line:
            return None, ""
        state, _, reason = line.partition("|")
        return state.strip(), reason.strip()

    def cancel(self, why: str) -> None:
        with self._lock:
            if self.cancelled or not self.job_id:
                self._forget()
                return
            self.cancelled = True
        try:
            slurm_tool(["scancel", self.job_id], self.spec.command_timeout_s)
            logger.warning("cancelled Slurm job %s (%s): %s", self.job_id, self.name, why)
        except SlurmError as exc:
            logger.error("could not cancel Slurm job %s: %s", self.job_id, exc)
        finally:
            self._forget()

    def _forget(self) -> None:
        with _live_lock:
            _live_jobs.discard(self)

    def finish(self, end: str | None = None) -> None:
        if end and self.end is None:
            self.end = end
        self._forget()
        self.ended.set()

    def details(self) -> tuple[str, str | None]:
        """How Slurm says the job ended, for a failure message (best effort), and the node its batch script ran on
        (None: it never ran on one, or Slurm no longer knows)."""
        try:
            text = slurm_tool(["scontrol", "show", "job", "-o", self.job_id], self.spec.command_timeout_s)
        except SlurmError:
            return "Slurm no longer knows the job", None
        found = dict(re.findall(r"(JobState|Reason|ExitCode)=(\S+)", text))
        batch = re.search(r"(?:^|\s)BatchHost=(\S+)", text)
        return ", ".join(f"{k} {v}" for k, v in found.items()) or "no state", batch.group(1) if batch else None

    def output_note(self, batch_host: str | None) -> str:
        """What the failure quotes of the job's output; where there is none although a node ran the batch script,
        what that most likely means: the node cannot write to the shared folder the controller reads (it lacks
        the folder or sees another one at its path), which Slurm reports only as a launch failure."""
        if batch_host is None or self.output.exists():
            return output_summary(self.output)
        return (f"no {self.output.name} in {self.output.parent}, where node {batch_host} (which ran the job's batch "
                f"script) was to write it: does {batch_host} see slurm.shared_dir {self.spec.shared_dir} as the "
                "controller does?")

    def watch(self, own: Rank, on_line: LineSink | None, readers: dict[Path, int]) -> None:
        """The watching thread's loop: files every poll_s, squeue every state_poll_s, until every node wrote its
        exit record or the job ended without one; then until the job left the queue."""
        spec = self.spec
        next_state = 0.0
        awaiting_reason = False
        while not self.ended.is_set():
            now = time.monotonic()
            follow(own.log, on_line, readers)
            follow(self.output, on_line, readers, prefix="slurm: ")
            if self.started is None and any((r.job_dir / START_FILE).exists() for r in self.ranks):
                self.started = now
            if all((r.job_dir / EXIT_FILE).exists() for r in self.ranks):
                self._wait_gone()
                self.finish()
                break
            if self.started is not None and now - self.started > self.timeout_s:
                self.timed_out = True
                self.cancel(f"still running after timeout_s = {self.timeout_s:.0f} s")
                self.finish(f"timed out after {self.timeout_s:.0f} s (timeout_s); Slurm job {self.job_id} cancelled")
                break
            too_long = self.started is None and self.waited_too_long(now)
            # squeue at once when a not-started job's timeout passes (the verdict is due), else every state_poll_s,
            # also while a reason is awaited (its wait's end is a poll of its own).
            if (too_long and not awaiting_reason) or now >= next_state:
                next_state = now + spec.state_poll_s  # the files say more, sooner; squeue is the safety net
                state, reason = self.state()
                if state in NOT_STARTED:
                    self.count_configuring(state == CONFIGURING, now)
                    timeout, limit = (("configuring_timeout_s", spec.configuring_timeout_s) if state == CONFIGURING
                                      else ("pending_timeout_s", spec.pending_timeout_s))
                    too_long = self.waited_too_long(now)
                    reason_due = self.submitted + self.configured_s + spec.pending_timeout_s + REASON_WAIT_S
                    # Only a PENDING job without a reason waits for one: slurmctld's scheduler has not looked at it
                    # yet. A CONFIGURING one has its nodes (they boot): squeue gives it no reason, nor will it.
                    if too_long and state == "PENDING" and reason in NO_REASON and now < reason_due:
                        next_state = min(next_state, reason_due)
                        if not awaiting_reason:
                            awaiting_reason = True
                            logger.info("Slurm job %s still %s after %.0f s (slurm.pending_timeout_s) with no reason "
                                        "from squeue yet: waiting up to %.0f s more for one before it is cancelled",
                                        self.job_id, state, spec.pending_timeout_s, REASON_WAIT_S)
                    elif too_long:
                        self.never_started = True
                        self.cancel(f"{state} past slurm.{timeout}")
                        self.finish(f"Slurm job {self.job_id} still {state} after {limit:.0f} s "
                                    f"(slurm.{timeout}; {not_started_why(state, reason)}); cancelled")
                        break
                elif state in ACTIVE:
                    if self.started is None:
                        self.started = now  # running (a container may take a while before the nodes start)
                elif not all((r.job_dir / EXIT_FILE).exists() for r in self.ranks):
                    follow(self.output, on_line, readers, prefix="slurm: ")
                    missing = [str(r.rank) for r in self.ranks if not (r.job_dir / EXIT_FILE).exists()]
                    details, batch_host = self.details()
                    self.finish(f"Slurm job {self.job_id} ended ({details}) before node(s) "
                                f"{', '.join(missing)} wrote their exit record; {self.output_note(batch_host)}")
                    break
            self.ended.wait(spec.poll_s)

    def waited_too_long(self, now: float) -> bool:
        """Whether a job that has not started is past its timeout: slurm.configuring_timeout_s of configuring in all
        (every time squeue said CONFIGURING: a requeue after a boot that failed does not start it again), or else
        slurm.pending_timeout_s of waiting for nodes since it was submitted (its time configuring left out)."""
        if self.configuring_since is not None:
            return self.configured_s + now - self.configuring_since > self.spec.configuring_timeout_s
        return now - self.submitted - self.configured_s > self.spec.pending_timeout_s

    def count_configuring(self, configuring: bool, now: float) -> None:
        """What squeue said of a not-started job: CONFIGURING starts its configuring clock, anything else (requeued
        after a boot that failed) stops it, and the time goes to configured_s."""
        if configuring and self.configuring_since is None:
            self.configuring_since = now
        elif not configuring and self.configuring_since is not None:
            self.configured_s += now - self.configuring_since
            self.configuring_since = None

    def _wait_gone(self) -> None:
        """The nodes are done: let the job leave the queue (its output complete, its nodes free for the next
        round); cancel it if it lingers."""
        deadline = time.monotonic() + END_WAIT_S
        while time.monotonic() < deadline:
            state, _ = self.state()
            if state not in ACTIVE:
                self._forget()
                return
            time.sleep(self.spec.poll_s)
        self.cancel(f"still {state} {END_WAIT_S:.0f} s after its nodes finished")

    def wait_rank(self, own: Rank, on_line: LineSink | None, readers: dict[Path, int]) -> dict[str, Any] | None:
        """A non-watching node's wait: its own exit record, or the job's end."""
        while True:
            follow(own.log, on_line, readers)
            record = read_record(own.job_dir / EXIT_FILE)
            if record is not None:
                return record
            if self.ended.wait(self.spec.poll_s):
                return read_record(own.job_dir / EXIT_FILE)


def _slurm_conf() -> dict[str, str]:
    return {"SLURM_CONF": os.environ["SLURM_CONF"]} if "SLURM_CONF" in os.environ else {}


# What the controller reads of a file a job on a node writes, at most: a record (an exit status), a piece of a
# log followed (a line longer than that goes on in pieces), the end of a log a tail is taken from.
MAX_JOB_RECORD_BYTES = 64 * 1024
FOLLOW_CHUNK_BYTES = 1 << 20
TAIL_BYTES = 64 * 1024


def read_record(path: Path) -> dict[str, Any] | None:
    """A small JSON record a job wrote (its exit status); None when missing, not regular, too large or not JSON."""
    try:
        record = json.loads(read_bounded(path, MAX_JOB_RECORD_BYTES))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def follow(path: Path | None, on_line: LineSink | None, readers: dict[Path, int], prefix: str = "",
           final: bool = False) -> None:
    """Hand the lines added to ``path`` since the last call to ``on_line``: whole lines only, unless ``final`` (the
    writer has ended: its last line needs no newline); FOLLOW_CHUNK_BYTES read at a time, a longer line in pieces."""
    if path is None or on_line is None:
        return
    while True:
        offset = readers.get(path, 0)
        handle = open_regular(path)  # never waits on a FIFO
        if handle is None:
            return
        with handle:
            handle.seek(offset)
            data = handle.read(FOLLOW_CHUNK_BYTES)
        full = len(data) == FOLLOW_CHUNK_BYTES
        if data.endswith(b"\n"):
            lines, used = data[:-1], len(data)
        elif (cut := data.rfind(b"\n")) >= 0:  # the rest: a line still being written, or read next time round
            lines, used = data[:cut], cut + 1
        elif full or (final and data):  # a line longer than a chunk, or the last line of an ended writer
            lines, used = data, len(data)
        else:
            return
        readers[path] = offset + used
        for line in lines.decode("utf-8", errors="replace").split("\n"):
            on_line(prefix + line)
        if not (full or final):
            return


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` non-empty lines of a log, from its last TAIL_BYTES only."""
    text = read_end(path, TAIL_BYTES) or ""
    return [line.strip() for line in text.splitlines() if line.strip()][-lines:]


SUMMARY_LINES = 8  # of a job's output, in a failure message
# A line the job script's own checks wrote about why the job stopped (a node's mount check): a marker of its own, not
# "flagperf: ", which a job's command (SlurmHost.run's) and the training worker ("flagperf: rank ...") print too.
NOTE_PREFIX = "flagperf-job: "


def output_summary(path: Path) -> str:
    """What a failure message quotes of a job's output: the job script's own notes where it wrote any (every
    failing node of a multi-node job names itself; srun's "task N: Exited" lines would crowd them out of a
    plain tail), else its last lines."""
    lines = tail(path, 10_000)
    notes = list(dict.fromkeys(line for line in lines if line.startswith(NOTE_PREFIX)))
    if notes:
        more = f" | (and {len(notes) - SUMMARY_LINES} more)" if len(notes) > SUMMARY_LINES else ""
        return f"its notes in {path.name}: {' | '.join(notes[:SUMMARY_LINES])}{more}"
    return f"last lines of {path.name}: {' | '.join(lines[-SUMMARY_LINES:]) or '(empty)'}"


# ------------------------------------------------------------------------------------------------ hosts

@dataclass
class DeferredProcess:
    """A monitor asked for before the round's job exists: it starts inside the job on the node."""

    name: str
    argv: list[str]
    log: Path


_SAID_NO_MARKERS: set[str] = set()  # hosts whose lack of a marker folder was said (once per host and process)
_SAID_LOCK = threading.Lock()


def _no_markers(host: str, why: str) -> None:
    with _SAID_LOCK:
        if host in _SAID_NO_MARKERS:
            return
        _SAID_NO_MARKERS.add(host)
    logger.warning("host %s: the controller keeps no record of which attempts ended there: %s; meanwhile every "
                   "attempt there counts as not seen to end (later rounds at an endpoint start after its bound, not "
                   "after what it took)", host, why)


class SlurmHost(LocalHost):
    """One slot of a Slurm entry. Files: the shared folder, seen by the controller and the nodes alike.
    Processes: Slurm jobs (monitors are started by the round's job, beside the case)."""

    def __init__(self, spec: HostSpec) -> None:
        assert spec.slurm is not None
        super().__init__(name=spec.name, work_root=spec.slurm.shared_dir, env=spec.runtime_env())
        self.spec = spec
        self.slurm = spec.slurm
        self.project_root = spec.project_root or PROJECT_ROOT
        self.python = spec.python or "python3"
        self.work_root = spec.slurm.shared_dir
        self._monitors: dict[Path, list[DeferredProcess]] = {}
        # What run()'s container gets of the search paths (with_search): the healthcheck's probe needs the vendor.
        self.search: SearchMounts | None = None

    def __repr__(self) -> str:
        return f"SlurmHost({self.name!r})"

    @property
    def ended_root(self) -> Path | None:
        """The shared folder is mounted whole into a container image's jobs (and written by the nodes): the
        controller's markers of attempts seen to end are kept in its own state folder instead (XDG_STATE_HOME, else
        ~/.local/state), one per shared folder; None (no marker: every attempt counts as not seen to end) where
        that lies in the shared folder or a container mount, or no home folder can be found; said once per host in
        a warning naming the folder and what to set."""
        given = os.environ.get("XDG_STATE_HOME", "")
        digest = hashlib.sha256(str(self.work_root).encode()).hexdigest()[:16]
        source, prefix = spec_origin(self.spec)
        try:
            # A relative XDG_STATE_HOME is invalid and ignored (the XDG Base Directory spec)
            state = Path(given) if os.path.isabs(given) else Path.home() / ".local" / "state"
            root = (state / "flagperf" / "ended" / digest).resolve()
            mounted = [(self.work_root, f"{prefix}slurm.shared_dir"),
                       *((Path(m.split(":")[0]), f"{prefix}slurm.container_mounts.{i}")
                         for i, m in enumerate(self.slurm.container_mounts))]
            inside = next((key for folder, key in mounted if root.is_relative_to(folder.resolve())), None)
        except (RuntimeError, OSError) as exc:  # no home folder to be found (no HOME, no passwd entry), a loop of links
            _no_markers(self.name, f"its state folder cannot be found ({exc}): set XDG_STATE_HOME to an absolute "
                                   "folder the jobs do not mount")
            return None
        if inside is not None:
            _no_markers(self.name, f"its state folder for them, {root}, lies in what the jobs can write ({source}: "
                                   f"{inside}): set XDG_STATE_HOME to a folder outside it")
            return None
        return root

    def job_environment(self) -> dict[str, str]:
        """What sbatch gets (--export=ALL of this): the allow-listed environment, without the entry's env. Slurm
        keeps a batch job's environment (slurmctld's state; slurmdbd's too, where AccountingStoreFlags=job_env,
        and ``sacct --env-vars`` shows it): the entry's values come by inventory_env_lines' file instead."""
        env = self.environment()
        controller = allowed_environment(os.environ)
        for name in self.extra_env:
            if name in controller:
                env[name] = controller[name]
            else:
                env.pop(name, None)
        return env

    def inventory_env_lines(self, folder: Path, search: SearchMounts | None = None) -> list[str]:
        """Job-script lines that set the entry's env from a file (mode 0600, in ``folder`` of the private shared
        folder) and remove it; srun's steps inherit them. A job that cannot read it fails at once. ``search``: the
        container's search path mounts, whose variables (as the container reads them) replace the host's."""
        values = {**self.extra_env, **dict(search.env if search else ())}
        if not values:
            return []
        path = folder / "inventory-env.sh"
        self.write_text(path, "".join(f"export {name}={shlex.quote(value)}\n"
                                      for name, value in values.items()), mode=0o600)
        return [f". {shlex.quote(str(path))} || exit 97", shlex.join(["rm", "-f", "--", str(path)])]

    def container_options(self, search: SearchMounts | None = None) -> list[str]:
        """srun's pyxis options (none without slurm.container_image): the shared folder, the project (read-only),
        the inventory's container_mounts and ``search``'s folders (read-only, under /flagperf-search); never the
        user's home."""
        spec = self.slurm
        if not spec.container_image:
            return []
        mounts = [f"{spec.shared_dir}:{spec.shared_dir}", f"{self.project_root}:{self.project_root}:ro",
                  *spec.container_mounts, *(f"{m.source}:{m.target}:ro" for m in (search.all() if search else []))]
        # Never the user's home (enroot's ENROOT_MOUNT_HOME=y mounts it read-write by default on many sites): the
        # controller's ended markers are kept under it by default (ended_root), where no job may write them
        return [f"--container-image={spec.container_image}", f"--container-mounts={','.join(mounts)}",
                f"--container-workdir={self.project_root}", "--no-container-mount-home"]

    def search_mounts(self, vendor: str, cases: Sequence[str] = ()) -> SearchMounts | None:
        """What the container (slurm.container_image) gets of the FLAGPERF_VENDOR_PATH / FLAGPERF_CASE_PATH folders
        its jobs see (the inventory's env, else the controller's) outside the project: the run's vendor and cases,
        mounted and named as on a docker host (container_policy.search_mounts), resolved here (the controller sees
        the shared folders as the nodes do). None without a container image. ConfigError naming the inventory's
        hosts.N.env.<variable>, or the controller's environment where the entry does not set the variable, or
        hosts.N.project_root for the project's own vendor and case folders (a link in them out of the project)."""
        if not self.slurm.container_image:
            return None
        try:
            # A link in a vendor or case folder may lead into the container's other mounts (SOURCE:TARGET).
            mounted = [str(self.slurm.shared_dir), *(":".join(m.split(":")[:2]) for m in self.slurm.container_mounts)]
            written = search_mounts(self.environment(), vendor, cases, str(self.project_root), mounted)
            found = self.describe_paths(written.host_paths(), written.scan_paths(), written.tree(), written.mounted)
            search = written.resolved({path: PathFacts.of(fact) for path, fact in found.items()})
            for entry in search.outside:  # a node-only folder would be left out without a word
                if search.names_of(entry.path) and found[entry.folder]["kind"] != "folder":
                    raise PolicyError(f"{entry.path.variable} folder {entry.folder!r} is not a folder on the "
                                      "controller, which resolves what a container image's jobs mount (one only "
                                      "the nodes have is never mounted)", f"env.{entry.path.variable}")
            for kind, mount in search.mounts:
                if PYXIS_UNSAFE.search(mount.source):
                    raise PolicyError(f"{kind.what} {mount.source!r} cannot be mounted by pyxis: its path holds a "
                                      "',', ':' or whitespace", f"env.{kind.variable}")
        except PolicyError as exc:
            key = exc.key or ""
            variable = key.removeprefix("env.")
            if key.startswith("env.") and variable not in self.extra_env:  # the controller's own, which jobs inherit
                raise ConfigError("the controller's environment", variable,
                                  f"on host {self.name} (its inventory entry sets no env.{variable}): {exc}") from None
            source, prefix = spec_origin(self.spec)
            raise ConfigError(source, f"{prefix}{exc.key}", f"on host {self.name}: {exc}") from None
        return search

    @staticmethod
    def mount_check_lines(search: SearchMounts | None, failed: str = "exit 96") -> list[str]:
        """Job-script lines, before srun, that stop the job (``failed``: exit 96, or a step's failed=96; one line in
        its output naming the node and the folder) where a mount's source is not, on the node, the folder the
        controller resolved: missing there, or a link to elsewhere (a node-local folder such as /opt/vendors may
        differ from the controller's), which pyxis would mount unchecked. They run where the batch script runs, the
        job's first node: a multi-node job runs them on every node instead (node_check_step)."""
        lines = []
        for kind, mount in search.mounts if search else ():
            source = shlex.quote(mount.source)
            message = shlex.quote(f"{NOTE_PREFIX}{kind.variable}'s {kind.what} {mount.source} is missing or a link "
                                  "elsewhere on node")
            lines.append(f'[ "$(realpath -e -- {source} 2>/dev/null)" = {source} ] || {{ printf \'%s %s, unlike on '
                         f'the controller: not mounted, the job stops\\n\' {message} "${{SLURMD_NODENAME:-?}}" '
                         f'>&2; {failed}; }}')
        return lines

    def shared_check_line(self, plan: Path, token: str, failed: str) -> str:
        """A job-script line for every node of a multi-node job (node_check_step): the node sees slurm.shared_dir as
        the controller does, that is, the round's ``plan`` there holds the ``token`` the controller wrote into it.
        A node that lacks the folder, or has another one at its path (a node-local folder, another mount), would
        write its records where the controller never reads them: ``failed``, with one line naming the node and
        shared_dir (and the folder it resolves to on the controller, where that differs). A one-node job has no such
        line: its note would go to the job's output, on that same folder; where the node cannot write there, Slurm
        fails the job's launch, and SlurmJob.output_note names the node."""
        shared = self.slurm.shared_dir
        real = os.path.realpath(shared)
        via = f" (on the controller: {real})" if real != str(shared) else ""
        note = shlex.quote(f"{NOTE_PREFIX}node")
        rest = shlex.quote(f"does not see slurm.shared_dir {shared}{via} as the controller does (the job's plan "
                           f"{plan}, which the controller wrote there, is missing or another file): its records would "
                           "be lost, the job stops")
        return (f"grep -qsF -e {shlex.quote(token)} -- {shlex.quote(str(plan))} || {{ printf '%s %s %s\\n' {note} "
                f'"${{SLURMD_NODENAME:-?}}" {rest} >&2; {failed}; }}')

    @staticmethod
    def node_check_step(nodes: int, lines: list[str]) -> list[str]:
        """A job-script line for a job of ``nodes`` nodes: ``lines`` (shared_check_line, mount_check_lines, each
        setting failed=96 where it fails) as a step of its own on every node (a task per node), before the round's
        step; a node where any fails prints every failing line and stops the job with exit 96. Not inside the
        round's step: pyxis runs its task in the container, where the mounts are already made."""
        if not lines:
            return []
        # --kill-on-bad-exit=0: where the cluster sets KillOnBadExit=1, the first node's exit 96 would kill the other
        # nodes' checks (srun then exits 128 + a signal), and a failing node among them would go unnamed.
        step = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                "/bin/bash", "-c", "\n".join(["failed=0", *lines, 'exit "$failed"'])]
        return [f'{shlex.join(step)} || exit "$?"']  # srun exits with its tasks' highest code: 96

    def with_search(self, search: SearchMounts | None) -> SlurmHost:
        """This slot, its run() containers given ``search`` (the healthcheck's probe: the run's vendor)."""
        host = copy.copy(self)
        host.search = search
        return host

    def job_name(self, what: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{JOB_PREFIX}-{what}")[:120]

    def run(self, argv: list[str], *, timeout: float, log_path: Path | None = None,
            on_line: LineSink | None = None, pid_file: Path | None = None) -> CommandResult:
        """``argv`` as a one-node job on this slot's node (inside the container where there is one); its output
        goes to ``log_path`` and ``on_line`` once it ended."""
        start = time.monotonic()
        folder = self.work_root / ".jobs" / uuid.uuid4().hex
        self._private_work_root()
        folder.mkdir(parents=True)
        try:
            exit_file = folder / EXIT_FILE
            step = ["srun", "--nodes=1", "--ntasks=1", *self.container_options(self.search), *argv]
            script = batch_script(f"flagperf: {shlex.join(argv)[:200]} on {self.name}", [
                *self.inventory_env_lines(folder, self.search),
                *self.mount_check_lines(self.search),
                shlex.join(["touch", str(folder / START_FILE)]),
                shlex.join(step),
                "code=$?",
                f"printf '{{\"exit_code\": %d}}\\n' \"$code\" > {shlex.quote(str(folder / '.exit.tmp'))}",
                shlex.join(["mv", str(folder / ".exit.tmp"), str(exit_file)]),
                "exit \"$code\""])
            (folder / SCRIPT_FILE).write_text(script, encoding="utf-8")
            rank = Rank(0, self.slurm.node, folder, folder, argv, [])
            job = SlurmJob(self.slurm, self.job_name(f"{self.name}-{Path(argv[-1]).name}"), [rank],
                           folder / "output.log", timeout)
            try:
                job.submit(folder / SCRIPT_FILE, self.job_environment(), self.project_root,
                           [self.slurm.node] if self.slurm.node else None)
                job.watch(rank, None, {})
            except BaseException:
                job.cancel("interrupted")
                raise
            with contextlib.ExitStack() as stack:
                log = None
                if log_path is not None:
                    log_path.parent.mkdir(parents=True, exist_ok=True)
                    log = stack.enter_context(log_path.open("a", encoding="utf-8"))

                def hand_on(line: str) -> None:
                    if log is not None:
                        log.write(f"{line}\n")
                    if on_line:
                        on_line(line)

                # a chunk at a time, whatever the job printed
                follow(folder / "output.log", hand_on, {}, final=True)
                if log is not None and job.end:
                    log.write(f"{job.end}\n")
            if job.never_started:
                raise SlurmJobNeverStarted(f"host {self.name}: {job.end}")
            record = read_record(exit_file)
            return CommandResult(argv, record["exit_code"] if record else None, job.timed_out,
                                 time.monotonic() - start)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _private_work_root(self) -> None:
        problem = private_folder_problem(self.work_root, strict=False)
        if problem:
            raise SlurmError(f"host {self.name}: slurm.shared_dir {self.work_root} is not a folder of this user's "
                             f"that only it can write to ({problem})")

    def spawn(self, argv: list[str], *, log_path: Path) -> BackgroundProcess:
        """A monitor: recorded, and started by the round's job on the node (stage folder = the log's folder)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        name = log_path.stem.removeprefix("monitor_")
        deferred = DeferredProcess(name, list(argv), log_path)
        self._monitors.setdefault(log_path.parent, []).append(deferred)
        return BackgroundProcess(argv=argv, pid=0, handle=deferred)

    def deferred_monitors(self, stage_dir: Path) -> list[DeferredProcess]:
        return list(self._monitors.get(stage_dir, []))

    def terminate(self, proc: BackgroundProcess, grace_s: float = 10.0) -> int | None:
        """The monitor stopped with its job; its exit code as the node recorded it (None: it never ran)."""
        deferred: DeferredProcess = proc.handle
        self._monitors.pop(deferred.log.parent, None)
        try:
            return int((read_start(deferred.log.parent / MONITOR_EXIT.format(name=deferred.name), 64) or "").strip())
        except ValueError:
            return None

    def is_running(self, proc: BackgroundProcess) -> bool:
        return False


# ---------------------------------------------------------------------------------------------- rounds

@dataclass
class _Meeting:
    """The nodes of one multi-node round, gathering before their one job is submitted."""

    size: int
    ranks: dict[int, tuple[Rank, SlurmHost]] = field(default_factory=dict)
    job: SlurmJob | None = None
    error: BaseException | None = None
    done: threading.Condition = field(default_factory=threading.Condition)


_meetings: dict[tuple[Any, ...], _Meeting] = {}
_meetings_lock = threading.Lock()


class SlurmRuntime(Runtime):
    """Rounds as Slurm jobs: one job per round and node group (flagperf.hosts.slurm_node on each node).
    ``search``: what a container image's jobs get of the search paths (SlurmHost.search_mounts, resolved once)."""

    name = "slurm"

    def __init__(self, search: SearchMounts | None = None) -> None:
        self.search = search

    def run_entry(self, host: Any, job_dir: Path, timeout_s: float, on_line: LineSink | None,
                  pid_file: Path) -> CommandResult:
        assert isinstance(host, SlurmHost)
        start = time.monotonic()
        job = json.loads(read_bounded(job_dir / JOB_FILE))
        stage_dir = pid_file.parent
        entry = [host.python, "-m", "flagperf.entry", "--job", str(job_dir / JOB_FILE)]
        monitors = [{"name": m.name, "argv": m.argv, "log": str(m.log)} for m in host.deferred_monitors(stage_dir)]
        own = Rank(int(job["node_rank"]), host.slurm.node, job_dir, stage_dir, entry, monitors,
                   log=job_dir / CASE_LOG_FILE)
        label = f"{job['run_id']}-{job['case']}-r{job['round']}-a{job['attempt']}"
        nnodes = int(job["nnodes"])
        if nnodes == 1:
            slurm_job = self._submit(host, [(own, host)], label, timeout_s)
        else:
            key = (host.slurm.group, job["run_id"], job["case"], job["round"], job["attempt"])
            slurm_job = self._meet(key, nnodes, own, host, label, timeout_s)
        readers: dict[Path, int] = {}
        try:
            if slurm_job.ranks[0].rank == own.rank and slurm_job.ranks[0].job_dir == own.job_dir:
                slurm_job.watch(own, on_line, readers)
                record = read_record(own.job_dir / EXIT_FILE)
            else:
                record = slurm_job.wait_rank(own, on_line, readers)
            follow(own.log, on_line, readers)
        except BaseException:
            slurm_job.cancel("the controller was interrupted")
            slurm_job.finish("cancelled: the controller was interrupted")
            raise
        failure: FlagperfError | None = None
        if slurm_job.never_started:
            failure = SlurmJobNeverStarted(f"{job['case']} round {job['round']} on {host.name}: {slurm_job.end}")
        elif record is None and not slurm_job.timed_out:
            failure = SlurmError(f"{job['case']} round {job['round']} on {host.name}: "
                                 f"{slurm_job.end or 'the node wrote no exit record'}")
        if failure is not None:
            with contextlib.suppress(OSError):  # the attempt's folder says why (the report reads it)
                host.write_text(job_dir / ATTEMPT_FAILURE_FILE, f"{failure}\n")
            raise failure
        if record is None:
            return CommandResult(entry, None, True, time.monotonic() - start)
        return CommandResult(entry, int(record["exit_code"]), slurm_job.timed_out, time.monotonic() - start)

    def _meet(self, key: tuple[Any, ...], nnodes: int, own: Rank, host: SlurmHost, label: str,
              timeout_s: float) -> SlurmJob:
        """Wait for the round's other nodes (threads of this evaluation); the last to come submits the job."""
        with _meetings_lock:
            meeting = _meetings.setdefault(key, _Meeting(nnodes))
        with meeting.done:
            meeting.ranks[own.rank] = (own, host)
            if len(meeting.ranks) == nnodes:
                with _meetings_lock:
                    _meetings.pop(key, None)
                try:
                    members = [meeting.ranks[rank] for rank in sorted(meeting.ranks)]
                    meeting.job = self._submit(members[0][1], members, label, timeout_s)
                except BaseException as exc:
                    meeting.error = exc
                    raise
                finally:
                    meeting.done.notify_all()
                return meeting.job
            deadline = time.monotonic() + host.slurm.pending_timeout_s
            while meeting.job is None and meeting.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    with _meetings_lock:
                        _meetings.pop(key, None)
                    raise SlurmError(f"host {host.name}: node {own.rank} of a {nnodes}-node round waited "
                                     f"{host.slurm.pending_timeout_s:.0f} s for the others (all nodes of a multi-node "
                                     f"case must be slots of one Slurm entry, attempt by attempt)")
                meeting.done.wait(left)
            if meeting.error is not None:
                raise SlurmError(f"host {host.name}: the round's job was not submitted: {meeting.error}")
            assert meeting.job is not None
            return meeting.job

    def write_job(self, host: SlurmHost, members: list[tuple[Rank, SlurmHost]], label: str) -> list[Rank]:
        """The round's plan and batch script (SCRIPT_FILE), written into rank 0's job folder; the ranks."""
        ranks = [rank for rank, _ in members]
        if [r.rank for r in ranks] != list(range(len(ranks))):
            raise SlurmError(f"host {host.name}: a round's nodes must be ranks 0..{len(ranks) - 1}, got "
                             f"{[r.rank for r in ranks]}")
        host._private_work_root()
        folder = ranks[0].job_dir
        token = uuid.uuid4().hex  # the nodes' first step finds it in the plan: they see the folder it was written to
        plan = {"ranks": [{"rank": r.rank, "node": r.node, "job_dir": str(r.job_dir), "stage_dir": str(r.stage_dir),
                           "entry": r.entry, "monitors": r.monitors} for r in ranks],
                "master_port_base": host.slurm.master_port_base, "token": token}
        host.write_text(folder / PLAN_FILE, json.dumps(plan, indent=2))
        step = ["srun", f"--nodes={len(ranks)}", f"--ntasks={len(ranks)}", "--ntasks-per-node=1",
                *host.container_options(self.search), host.python, "-m", "flagperf.hosts.slurm_node",
                str(folder / PLAN_FILE)]
        names = ", ".join(f"{h.name} (node {r.rank})" for r, h in members)
        secrets = host.work_root / ".jobs" / uuid.uuid4().hex  # not the job folder: that one is collected
        checks = (host.mount_check_lines(self.search) if len(ranks) == 1 else host.node_check_step(len(ranks), [
            host.shared_check_line(folder / PLAN_FILE, token, "failed=96"),
            *host.mount_check_lines(self.search, "failed=96")]))
        host.write_text(folder / SCRIPT_FILE, batch_script(f"flagperf: {label} on {names}; written by the controller",
                                                           [*host.inventory_env_lines(secrets, self.search),
                                                            *checks, shlex.join(step)]))
        return ranks

    def _submit(self, host: SlurmHost, members: list[tuple[Rank, SlurmHost]], label: str,
                timeout_s: float) -> SlurmJob:
        """Write the plan and the batch script into rank 0's job folder and submit them."""
        ranks = self.write_job(host, members, label)
        folder = ranks[0].job_dir
        nodes = [r.node for r in ranks]
        job = SlurmJob(host.slurm, host.job_name(f"{host.name}-{label}"), ranks,
                       folder / "slurm-%j.out", timeout_s)
        job.submit(folder / SCRIPT_FILE, host.job_environment(), host.project_root,
                   [n for n in nodes if n] if any(nodes) else None)
        job.output = folder / f"slurm-{job.job_id}.out"
        return job


# ------------------------------------------------------------------------------------------- healthcheck

@dataclass(frozen=True)
class SlurmCheck:
    name: str
    ok: bool
    detail: str


BAD_NODE_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "REBOOT", "INVAL",
                   "MAINT", "FUTURE", "UNKNOWN")


def parse_gres(text: str) -> dict[tuple[str, str | None], int]:
    """Gres as Slurm writes it (gpu:h100:8(S:0-1),gpu:2) or as asked (gpu:8): {(name, type): count}."""
    found: dict[tuple[str, str | None], int] = {}
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        parts = [p for p in item.strip().split(":") if p]
        if not parts or parts[0] == "(null)":
            continue
        count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
        kind = parts[1] if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()) else None
        found[(parts[0], kind)] = found.get((parts[0], kind), 0) + count
    return found


def gres_missing(asked: str, has: str) -> str | None:
    """What of ``asked`` the node's gres ``has`` lacks, or None."""
    offered = parse_gres(has)
    for (name, kind), count in parse_gres(asked).items():
        got = sum(n for (o_name, o_kind), n in offered.items() if o_name == name and (kind is None or o_kind == kind))
        if got < count:
            return f"{name}{':' + kind if kind else ''}:{count} asked, the node has {got}"
    return None


def node_facts(node_text: str) -> dict[str, str]:
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", node_text))


def _partitions_known(timeout: float) -> str:
    """The cluster's partitions, for a message about one it does not have (a misspelt slurm.partition)."""
    try:
        names = slurm_tool(["sinfo", "-h", "-o", "%P"], timeout).split()
    except SlurmError:
        return ""
    return f" (the cluster's partitions: {', '.join(dict.fromkeys(n.rstrip('*') for n in names))})" if names else ""


def check_cluster(host: SlurmHost) -> list[SlurmCheck]:
    """The cluster as this slot needs it, from sinfo/scontrol: the controller answers, the partition is up,
    the node (or enough nodes of the partition) is not drained or down and has the gres asked for, pyxis is
    there when an image is asked for, and the shared folder is this user's."""
    spec = host.slurm
    timeout = spec.command_timeout_s
    checks: list[SlurmCheck] = []
    try:
        ping = slurm_tool(["scontrol", "ping"], timeout).strip()
    except SlurmError as exc:
        return [SlurmCheck("slurm", False, str(exc))]
    if "UP" not in ping:
        return [SlurmCheck("slurm", False, f"scontrol ping: {ping.splitlines()[0] if ping else 'no answer'}")]
    checks.append(SlurmCheck("slurm", True, ping.splitlines()[0]))
    partition = spec.partition
    try:
        if partition is None:
            default = [p for p in slurm_tool(["sinfo", "-h", "-o", "%P"], timeout).split() if p.endswith("*")]
            if not default:
                return [*checks, SlurmCheck("partition", False, "no partition given and the cluster has no default")]
            partition = default[0].rstrip("*")
        facts = node_facts(slurm_tool(["scontrol", "show", "partition", "-o", partition], timeout))
    except SlurmError as exc:
        return [*checks, SlurmCheck("partition", False, f"{exc}{_partitions_known(timeout)}")]
    up = facts.get("State") == "UP"
    checks.append(SlurmCheck("partition", up, f"{partition}: State={facts.get('State')}, "
                                              f"Nodes={facts.get('Nodes')}"))
    if not up:
        return checks
    try:
        if spec.node:
            nodes = [spec.node]
        else:
            nodes = slurm_tool(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"], timeout).split()
        states = {}
        for node in dict.fromkeys(nodes):
            states[node] = node_facts(slurm_tool(["scontrol", "show", "node", "-o", node], timeout))
    except SlurmError as exc:
        return [*checks, SlurmCheck("nodes", False, str(exc))]
    usable = [n for n, f in states.items() if not any(bad in f.get("State", "") for bad in BAD_NODE_STATES)]
    if spec.node:
        f = states[spec.node]
        if spec.node not in usable:
            checks.append(SlurmCheck("node", False, f"{spec.node} is {f.get('State')} (Reason: "
                                     f"{f.get('Reason') or 'none'}); resume it (scontrol update NodeName={spec.node} "
                                     f"State=RESUME) or leave it out of slurm.nodelist"))
            return checks
        checks.append(SlurmCheck("node", True, f"{spec.node} is {f.get('State')}, in partition {partition}"))
    else:
        ok = bool(usable)
        checks.append(SlurmCheck("nodes", ok, f"{len(usable)} of {len(states)} nodes of {partition} usable"
                                              + ("" if ok else ": " + "; ".join(
                                                  f"{n} {f.get('State')}" for n, f in states.items()
                                                  if n not in usable))))
        if not ok:
            return checks
    if spec.gres:
        lacking = {n: gres_missing(spec.gres, states[n].get("Gres", "")) for n in usable}
        having = [n for n, why in lacking.items() if why is None]
        ok = bool(having)
        checks.append(SlurmCheck("gres", ok, f"{spec.gres} on {', '.join(having) or 'no usable node'}" if ok else
                                 "; ".join(f"{n}: {why}" for n, why in lacking.items() if why)))
        if not ok:
            return checks
    if spec.container_image:
        try:
            helped = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=timeout,
                                    env=slurm_env()).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            helped = str(exc)
        ok = "--container-image" in helped
        checks.append(SlurmCheck("pyxis", ok, f"srun knows --container-image ({spec.container_image})" if ok else
                                 "srun has no --container-image: install pyxis/enroot, or leave slurm.container_image "
                                 "unset to use the nodes' own python"))
        if not ok:
            return checks
    problem = private_folder_problem(host.work_root, strict=False)
    checks.append(SlurmCheck("shared folder", problem is None, f"{host.work_root}: " + (
        f"not a folder only this user can write to ({problem})" if problem else
        "this user's; the probe job below writes into it from the node")))
    return checks
