from __future__ import annotations

import errno
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.config.job import JOB_FILE, Job
from flagperf.errors import InfrastructureFailure
from flagperf.hosts.local import Host
from flagperf.hosts.runtime import PID_FILE
from flagperf.measure.perflog import parse_text
from flagperf.results.bounded import read_bounded, read_end
from flagperf.results.prompt_positions import CONTROLLER_ENDED_FILE
from flagperf.results.schema import (
    KEPT_ON_HOST,
    RESULT_FILE,
    RESULTS_UNWRITABLE,
    Failure,
    RoundResult,
    read_result,
    write_result,
)
from flagperf.training.launch import where_it_stopped

ATTEMPT_DIR = re.compile(r"^attempt(\d+)$")
# Write errors that say the results folder itself cannot take more: every later round would fail the same way.
STORE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
# How much of a training rank's log is read to say where it stopped: its last PerfLog events are at the end.
RANK_LOG_END_BYTES = 16 * 1024 * 1024
MAX_MARKER_BYTES = 4096  # an ended marker is an exit code in JSON


def training_progress(folder: Path, max_bytes: int = RANK_LOG_END_BYTES) -> str | None:
    """How far the first training process of a round got, from the PerfLog at the end of its log (None if not
    training); a log longer than ``max_bytes`` is read from its end only, and the line says so."""
    logs = sorted(folder.glob("rank*.out.log"), key=lambda p: int(p.stem.removeprefix("rank").split(".")[0]))
    if not logs:
        return None
    text = read_end(logs[0], max_bytes)
    if text is None:
        return f"{logs[0].name}: cannot be read"
    size = logs[0].stat().st_size
    cut = f" (from its last {max_bytes} of {size} bytes)" if size > max_bytes else ""
    return f"{logs[0].name}: {where_it_stopped(parse_text(text))}{cut}"


def verify_copy(local: Path, sizes: dict[str, int]) -> None:
    """Read the copy back: every file the host listed is here, whole. Raises OSError otherwise."""
    for relative, size in sizes.items():
        copied = local / relative
        got = copied.stat().st_size if copied.is_file() else None
        if got != size:
            raise OSError(errno.EIO, f"copy of {relative} has {got} bytes, the host's has {size}", str(copied))


log = logging.getLogger(__name__)


def remove_ended_markers(host: Host, folder: Path) -> None:
    """Remove the controller's markers of the attempts under ``folder`` (Host.ended_path) once they were read: the
    round is stored (collected) or cleared already. Best effort, said at debug level only where it fails (an SSH link
    that dropped): a stale marker is harmless, since run_case removes an attempt's marker before it reuses its
    number, and the run's clean-up removes the run's."""
    try:
        markers = host.ended_path(folder)
        if markers is not None:
            host.remove_tree(markers)
    except Exception as exc:
        log.debug("%s: the controller's ended markers of %s were not removed: %s", host.name, folder,
                  " ".join(str(exc).split())[:200])


def bring_ended_markers(host: Host, stage_dir: Path, partial: Path, logger: Any) -> None:
    """The controller's markers of the round's attempts seen to end (kept on the host outside the round's folder:
    flagperf.hosts.local.Host.ended_marker) into the copy of each attempt's folder, as CONTROLLER_ENDED_FILE. A file
    of that name the case left anywhere in the round's folder is removed first, with a warning: only the controller's
    marker proves that an attempt ended (a forged one would let its prompts be counted as final while it may still be
    sending). One that cannot be read is left out: its attempt counts as not seen to end (its bound holds)."""
    for forged in sorted(partial.rglob(CONTROLLER_ENDED_FILE)):
        logger.warning("%s:%s was not written by the controller: removed from the round's copy, not trusted", host.name,
                       stage_dir / forged.relative_to(partial))
        if forged.is_dir() and not forged.is_symlink():
            shutil.rmtree(forged)
        else:
            forged.unlink()
    for attempt in partial.iterdir():
        marker = host.ended_marker(stage_dir / attempt.name)
        if not ATTEMPT_DIR.match(attempt.name) or not attempt.is_dir() or marker is None:
            continue
        try:
            text = host.read_text(marker, MAX_MARKER_BYTES)
        except (OSError, ValueError):  # none (not seen to end), or unreadable: not proven
            continue
        (attempt / CONTROLLER_ENDED_FILE).write_text(text, encoding="utf-8")


def stage_folder(work_root: Path, run_id: str, case: str, round_no: int, host: str, node_rank: int = 0) -> Path:
    """Where a round's files are on its host until the controller has stored them."""
    return work_root / run_id / case / f"round{round_no}" / f"{host}_noderank{node_rank}"


def holds_result(host: Host, stage: Path, attempts: int) -> bool:
    """A round folder on the host with a result of some attempt: measured (or its failure recorded) and not
    stored by the controller, since collecting removes the folder only once its copy was read back."""
    return host.exists(stage) and any(host.exists(stage / f"attempt{attempt}" / RESULT_FILE)
                                      for attempt in range(1, attempts + 1))


def leftover_result(host: Host, stage_dir: Path, attempts: int) -> RoundResult | None:
    """A finished round an earlier attempt of this flow run measured but could not collect (the results
    disk was full, the controller lost the host ...): its last attempt's result, when it completed."""
    for attempt in range(attempts, 0, -1):
        path = stage_dir / f"attempt{attempt}" / RESULT_FILE
        try:
            if not host.exists(path):
                continue
            result = RoundResult.model_validate_json(host.read_text(path))
        except (OSError, ValueError):
            return None
        return result if result.status in ("success", "unsupported") else None
    return None


def _arrange(partial: Path, job: Job, failure: Failure | None, host_probe: dict[str, Any] | None,
             logger: Any) -> RoundResult:
    """FlagPerf's layout in the partial folder: the last attempt on top, earlier ones under attempts/, and
    a result.json in every case (a failed one written here when the case left none)."""
    attempts = sorted((int(m.group(1)), p) for p in partial.iterdir() if (m := ATTEMPT_DIR.match(p.name)))
    if attempts:
        *earlier, (_, last) = attempts
        for item in last.iterdir():
            item.replace(partial / item.name)
        last.rmdir()
        if earlier:
            (partial / "attempts").mkdir()
            for _, path in earlier:
                path.replace(partial / "attempts" / path.name)

    (partial / PID_FILE).unlink(missing_ok=True)  # meaningful only while the round ran
    result_path = partial / RESULT_FILE
    result: RoundResult | None = None
    if result_path.is_file():
        try:
            result = read_result(result_path)
        except ValueError as exc:
            logger.error("unreadable %s from %s: %s", RESULT_FILE, job.host, str(exc).splitlines()[0])
    if result is None or (failure is not None and result.status == "success"):
        failure = failure or Failure(kind="infrastructure", message="the case left no result")
        stopped = training_progress(partial)
        if stopped:  # a training run killed mid-way: say how far it got
            failure = failure.model_copy(update={"message": f"{failure.message}; {stopped}"})
        job_file = partial / JOB_FILE  # the last attempt's job: it knows which attempt failed
        try:  # bounded: the case may have left anything there
            last = Job.model_validate_json(read_bounded(job_file))
        except (OSError, ValueError):
            last = job
        result = last.failed_result(failure, host_probe)
        write_result(result_path, result)
    return result


@task(name="collect_logs", task_run_name="collect_logs[{job.case}/round{job.round}@{host.name}]", cache_policy=NONE)
def collect_logs(host: Host, stage_dir: Path, dest_dir: Path, job: Job, failure: Failure | None,
                 host_probe: dict[str, Any] | None) -> RoundResult:
    """Bring a round's files to the controller, in FlagPerf's layout, whatever the round's outcome.

    The last attempt's files go to the round folder; earlier attempts (retried crashes) are kept
    under attempts/. If the case left no result (a crash or a timeout), a failed result is written
    here, so every round has a result.json. The folder appears whole or not at all, and the host's copy
    is deleted only once the controller's copy has been written and read back: when the copy fails (a
    full results disk, a lost host) the round's result says so, in memory, and the host keeps its files.
    """
    logger = get_run_logger()
    partial = dest_dir.with_name(f".{dest_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    if not host.exists(stage_dir):
        raise InfrastructureFailure(f"host {host.name}: {stage_dir} does not exist; nothing to collect")
    if dest_dir.exists():
        raise FileExistsError(f"{dest_dir} already exists; results are never overwritten")
    try:
        verify_copy(partial, host.fetch_tree(stage_dir, partial))
        bring_ended_markers(host, stage_dir, partial, logger)
        result = _arrange(partial, job, failure, host_probe, logger)
        dest_dir.parent.mkdir(parents=True, exist_ok=True)
        partial.replace(dest_dir)
        read_result(dest_dir / RESULT_FILE)  # read back before the host's copy goes
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)  # give back the space a half copy took
        cause = exc.strerror or str(exc) or type(exc).__name__
        what = RESULTS_UNWRITABLE if exc.errno in STORE_ERRNOS else "the round's files could not be collected"
        message = f"{what} ({dest_dir.parent}: {cause}); {KEPT_ON_HOST} {host.name}:{stage_dir}"
        logger.error("%s round %d on %s: %s", job.case, job.round, host.name, message)
        return job.failed_result(Failure(kind="infrastructure", message=message), host_probe)
    except BaseException:  # anything else (a bug, an interrupt): no half copy stays in the run folder
        shutil.rmtree(partial, ignore_errors=True)
        raise
    host.remove_tree(stage_dir)
    remove_ended_markers(host, stage_dir)  # in the copy now
    logger.info("collected %s -> %s (%s)", stage_dir, dest_dir, result.status)
    return result
