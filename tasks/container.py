from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.client.schemas.objects import TaskRun
from prefect.runtime import task_run as current_task_run
from prefect.states import Cancelled, State

from flagperf.config.job import JOB_FILE, Job
from flagperf.errors import EXIT_OK, EXIT_UNSUPPORTED, EXIT_USER_ERROR, InfrastructureFailure, RoundUserFailure
from flagperf.hosts.local import CommandResult, Host
from flagperf.hosts.runtime import PID_FILE, Runtime
from flagperf.hosts.threads import CaseStopped, RoundsStopped, stop_requested
from flagperf.inference.subflows import portable_context
from flagperf.results.prompt_positions import (
    MAX_POSITIONS_BYTES,
    PROMPT_POSITIONS,
    Reach,
    merged,
    passed_over,
    reach_of,
    taken_end,
)
from flagperf.results.schema import ATTEMPT_FAILURE_FILE, CASE_LOG_FILE, RESULT_FILE, RoundResult, case_log_line
from tasks.collect import ATTEMPT_DIR

LOG_TAIL_LINES = 15
# A round that failed where the host's work folder has less than this free failed for want of space: said so
# first, and the run stops (every later round there would fail the same way) until space is freed and it is retried.
HOST_DISK_FULL = "the host's work folder is full"
HOST_DISK_FULL_BYTES = 1 << 20
THEN = "; then: "  # between that cause and what the round itself reported
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colour codes some libraries print (ONNX Runtime's warnings)


def is_infrastructure_failure(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry crashes and timeouts; a user error (bad config, bad input) fails the same way every time. Never once
    the evaluation is stopping (an interrupt): what broke is the interrupt's doing, and nothing more starts."""
    if stop_requested():
        return False
    try:
        state.result(raise_on_failure=True)
    except InfrastructureFailure:
        return True
    except BaseException:
        return False
    return False


@task(name="run_case", task_run_name="run_case[{job.case}/round{job.round}@{host.name}]", cache_policy=NONE,
      retry_condition_fn=is_infrastructure_failure, retry_delay_seconds=2)
def run_case(host: Host, runtime: Runtime, job: Job, stage_dir: Path, timeout_s: float
             ) -> RoundResult | State[Any]:
    """Run one case round on the host and read back its result; raise on failure (see the exit codes). Ended by
    the evaluation's stop (an interrupt), or by what the stop broke under it (a closed SSH channel): Cancelled
    (stopped_state), not Failed, and so never retried."""
    try:
        return _run_case(host, runtime, job, stage_dir, timeout_s)
    except Exception as exc:
        if isinstance(exc, RoundsStopped) or stop_requested():
            return stopped_state(exc, f"{job.case}/round{job.round}@{host.name}")
        raise


def stopped_state(exc: BaseException, label: str) -> State[Any]:
    """The final state of a round's task or flow that the evaluation's stop ended: Cancelled (grey in the UI, where
    Failed is red; Prefect retries neither flows nor tasks that end Cancelled). Its data is the RoundsStopped, which
    the caller reads back (state.result(raise_on_failure=False)) as it read a Failed state's exception."""
    stopped = exc
    if isinstance(exc, CaseStopped):  # every line went to the task's log as it came: the state keeps the end
        exc.keep_tail()
    if not isinstance(exc, RoundsStopped):
        stopped = RoundsStopped(f"{label}: stopped ({type(exc).__name__}: {exc})")
        stopped.__cause__ = exc
    return Cancelled(message=str(stopped), data=stopped)


def _run_case(host: Host, runtime: Runtime, job: Job, stage_dir: Path, timeout_s: float) -> RoundResult:
    logger = get_run_logger()
    attempt = current_task_run.run_count or 1
    job = job.model_copy(update={"attempt": attempt,
                                 "prompt_positions": attempt_positions(host, stage_dir, attempt, job.prompt_positions),
                                 "prefect_context": portable_context() if job.family == "inference" else None})
    job_dir = stage_dir / f"attempt{attempt}"
    # Whatever an earlier attempt under this name left (its ended marker, its record of prompt positions) is not this
    # attempt's: an old marker would make this one's record count as final while it may still be sending
    if (marker := host.ended_path(job_dir)) is not None:
        host.remove_tree(marker)
    host.remove_tree(job_dir)
    host.write_text(job_dir / JOB_FILE, job.model_dump_json(indent=2))
    logger.info("attempt %d: %s runtime, timeout %.0f s", attempt, runtime.name, timeout_s)
    try:
        outcome = runtime.run_entry(host, job_dir, timeout_s, on_line=lambda line: relay(logger, line),
                                    pid_file=stage_dir / PID_FILE)
    except BaseException as exc:  # interrupted: a case process killed and seen to end has ended all the same
        code = host.ended_when_interrupted(job_dir / CASE_LOG_FILE)
        if code is None and isinstance(exc, CaseStopped):  # a container the stop killed, its end seen by its runtime
            code = exc.exit_code
        if code is not None:
            seen_ended(host, job_dir, code)
        raise
    if outcome.exit_code is not None and not outcome.link:
        seen_ended(host, job_dir, outcome.exit_code)
    try:
        return verdict(host, job, job_dir, outcome, timeout_s)
    except InfrastructureFailure as exc:  # retried: the attempt's folder says why (the report reads it)
        with contextlib.suppress(Exception):  # best effort: the failure itself is what matters here
            host.write_text(job_dir / ATTEMPT_FAILURE_FILE, f"{exc}\n")
        raise


def seen_ended(host: Host, job_dir: Path, exit_code: int) -> None:
    """The attempt's runtime saw its case process end (an exit code, and no word of a lost link): what its record of
    prompt positions says it took is final. Kept where the case cannot write (flagperf.hosts.local.Host.ended_path),
    never in the attempt's folder (an ENDED_FILE there, an older version's or a case's, proves nothing); collection
    brings it in as CONTROLLER_ENDED_FILE. Never written where the link was lost, a container could not be removed, or
    a remote case was interrupted: it may still be sending."""
    with contextlib.suppress(Exception):  # best effort: without it, later rounds start after its bound
        marker = host.ended_marker(job_dir)
        if marker is None:  # this host keeps none: the attempt counts as not seen to end (its bound holds)
            return
        host.write_text(marker, json.dumps({"exit_code": exit_code}) + "\n")


def attempt_positions(host: Host, stage_dir: Path, attempt: int, positions: dict[str, int]) -> dict[str, int]:
    """The run's prompt positions at endpoints (Job.prompt_positions) with those this round's earlier attempts took
    on the host (their prompt_positions.json: an attempt killed mid-point left what it reserved), so that attempt K
    sends none of the prompts attempts 1 to K-1 sent: of an attempt whose runtime did not see it end (it may still be
    sending), after its own share of the round's bound (its record's attempt_bound). A record that cannot be read is
    passed over, with a warning
    (flagperf.results.prompt_positions.passed_over: its prompts may be sent again)."""
    found = attempt_records(host, stage_dir, attempt)
    return merged(positions, found.records, found.ended)


@dataclass
class AttemptRecords:
    """The prompt_positions.json of a round's attempts on its host: (where, text) of each one read, and where one
    could not be (the folder's listing, or an attempt's record: passed over, with a warning). An attempt without a
    record sent nothing at an endpoint (its record is written before its first request)."""

    records: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)  # the attempt folders looked in
    ended: set[str] = field(default_factory=set)  # the records (where) of attempts whose runtime saw them end
    ended_attempts: set[int] = field(default_factory=set)  # the attempts with the controller's marker, record or not
    recorded: set[int] = field(default_factory=set)  # the attempt folders with a record read

    def reach(self) -> Reach | None:
        """The round's reach from these records (flagperf.results.prompt_positions.reach_of): what attempts known to
        have ended took, the bound of the others."""
        reach = reach_of((text, where in self.ended) for where, text in self.records)
        if reach is not None and set(self.attempts) - self.recorded - self.ended_attempts:
            # an attempt with neither a record nor an end seen: its record may not have been written yet when read
            # (or lost with its folder), and it may be sending: nothing is known to be final below the bound
            return reach.model_copy(update={"taken": reach.end})
        return reach

    @property
    def unread(self) -> list[str]:
        """Where what an attempt took is not known: skipped, or read and not a record."""
        return [*self.skipped, *(where for where, text in self.records if taken_end(text) is None)]

    @property
    def complete(self) -> bool:
        """Every attempt's record read, and each one a record: what they took is known."""
        return not self.unread

    @property
    def all_ended(self) -> bool:
        """Every attempt folder found has the controller's ended marker (and none was passed over): none may still be
        sending, so what their records say they took is final and the round's reservation may close. A stage folder with
        no attempt folder sent nothing (a case runs only from the job.json run_case writes into its attempt folder)."""
        return not self.skipped and set(self.attempts) <= self.ended_attempts


def attempt_records(host: Host, stage_dir: Path, before: int | None = None) -> AttemptRecords:
    """The records of this round's attempts on the host: those before attempt ``before``; None: of every
    ``attempt<N>`` folder there (a half round's, whatever numbers its attempts reached). One that cannot be read is
    passed over, with a warning, and said in ``skipped``."""
    found = AttemptRecords()
    if before is None:
        try:
            names = host.list_folder(stage_dir)
        except FileNotFoundError:  # no folder: no attempt ran
            return found
        except Exception as exc:  # OSError, or a link to the host that dropped: nothing is known of its attempts
            where = f"{host.name}:{stage_dir}"
            passed_over(where, f"cannot be listed: {' '.join(str(exc).split())[:200]}")
            found.skipped.append(where)
            return found
        found.attempts = sorted(int(m.group(1)) for name in names if (m := ATTEMPT_DIR.match(name)))
    else:
        found.attempts = list(range(1, before))
    for number in found.attempts:
        path = stage_dir / f"attempt{number}" / PROMPT_POSITIONS
        where = f"{host.name}:{path}"
        try:
            marker = host.ended_marker(path.parent)
        except Exception:  # where the host keeps its markers is not known: the attempt is not seen to end
            marker = None
        try:
            if marker is not None and host.exists(marker):
                found.ended_attempts.add(number)
            if host.exists(path):
                found.records.append((where, host.read_text(path, MAX_POSITIONS_BYTES)))
                found.recorded.add(number)
                if number in found.ended_attempts:
                    found.ended.add(where)
        except (OSError, ValueError) as exc:
            passed_over(where, f"cannot be read: {exc}")
            found.skipped.append(where)
    return found


def relay(logger: Any, line: str) -> None:
    """A line of the case's output into the task's log at the level the case logged it (so its warnings are
    warnings in the dashboard's level filter, and its time is not shown twice)."""
    level, message = case_log_line(ANSI_ESCAPE.sub("", line))
    logger.log(level, "%s", message)


def verdict(host: Host, job: Job, job_dir: Path, outcome: CommandResult, timeout_s: float) -> RoundResult:
    """The attempt's result, or the failure it was: infrastructure (retried) or user (not)."""
    label = f"{job.case} round {job.round} on {host.name}"
    rank = f"node rank {job.node_rank} of {job.nnodes} " if job.nnodes > 1 else ""
    if outcome.timed_out:  # the log's last lines say where it hung
        raise InfrastructureFailure(f"{label}: {rank}timed out after {timeout_s:.0f} s "
                                    f"(timeout_s); the process group was killed; {log_tail(host, job_dir, lines=1)}")
    if outcome.exit_code in (EXIT_OK, EXIT_UNSUPPORTED, EXIT_USER_ERROR):
        try:
            # read on the host: its files are not the controller's (a test bed's hosts only share them)
            result = RoundResult.model_validate_json(host.read_text(job_dir / RESULT_FILE))
        except (OSError, ValueError) as exc:
            raise InfrastructureFailure(f"{label}: {rank}exit {outcome.exit_code} "
                                        f"but no readable {RESULT_FILE}: {str(exc).splitlines()[0]}") from None
        if outcome.exit_code == EXIT_USER_ERROR:
            raise RoundUserFailure(f"{label}: {rank}"
                                   f"{result.failure.message if result.failure else 'user error'}")
        return result
    if outcome.exit_code is None and outcome.link:  # no exit of its own: the link lost it (retried)
        # the runtime ends the log with the lost line itself: not said twice
        tail = log_tail(host, job_dir, unless=outcome.link)
        raise InfrastructureFailure(f"{label}: {rank}lost, not failed: {outcome.link}{f'; {tail}' if tail else ''}")
    tail = log_tail(host, job_dir)
    how = "could not start" if outcome.exit_code is None else (
        f"killed by signal {-outcome.exit_code}" if outcome.exit_code < 0 else f"exited {outcome.exit_code}")
    # the case's own end leads; what the link did meanwhile is context after it
    raise InfrastructureFailure(f"{label}: {rank}{how}; {tail}" + (f"; meanwhile {outcome.link}" if outcome.link
                                                                  else ""))


def log_tail(host: Host, job_dir: Path, lines: int = LOG_TAIL_LINES, unless: str | None = None) -> str:
    """The case log's last lines, in one line for a failure message. ``unless``: what the failure says already (a
    lost link's line, which the runtime wrote last into the log as "[flagperf] ..."): its line is left out, and
    where nothing else is left, the tail ('')."""
    kept = host.tail(job_dir / CASE_LOG_FILE, lines + (unless is not None))
    if unless is not None:
        if kept and kept[-1].startswith("[flagperf] ") and unless.startswith(kept[-1].removeprefix("[flagperf] ")):
            kept = kept[:-1]
            if not kept:
                return ""
        kept = kept[-lines:]
    last = " | ".join(kept) or "(empty)"
    return f"last {'line' if lines == 1 else 'lines'} of {CASE_LOG_FILE}: {last}"


def host_disk_full(host: Host, folder: Path) -> str | None:
    """"the host's work folder is full (HOST:WORK_ROOT: N bytes free)" when the file system of ``folder`` on the
    host is out of space, else None (also when the host cannot say: the round's own failure stands then)."""
    try:
        free = host.disk_free(folder)
    except Exception:  # a host that went away: not a question of space
        return None
    if free >= HOST_DISK_FULL_BYTES:
        return None
    return f"{HOST_DISK_FULL} ({host.name}:{host.work_root}: {free} bytes free)"
