from __future__ import annotations

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
from flagperf.measure.perflog import parse_file
from flagperf.results.schema import RESULT_FILE, Failure, RoundResult, read_result, write_result
from flagperf.training.launch import where_it_stopped

ATTEMPT_DIR = re.compile(r"^attempt(\d+)$")


def training_progress(folder: Path) -> str | None:
    """How far the first training process of a round got, from its PerfLog (None if not training)."""
    logs = sorted(folder.glob("rank*.out.log"), key=lambda p: int(p.stem.removeprefix("rank").split(".")[0]))
    return f"{logs[0].name}: {where_it_stopped(parse_file(logs[0]))}" if logs else None


@task(name="collect_logs", task_run_name="collect_logs[{job.case}/round{job.round}@{host.name}]", cache_policy=NONE)
def collect_logs(host: Host, stage_dir: Path, dest_dir: Path, job: Job, failure: Failure | None,
                 host_probe: dict[str, Any] | None) -> RoundResult:
    """Bring a round's files to the controller, in FlagPerf's layout, whatever the round's outcome.

    The last attempt's files go to the round folder; earlier attempts (retried crashes) are kept
    under attempts/. If the case left no result (a crash or a timeout), a failed result is written
    here, so every round has a result.json. The folder appears whole or not at all.
    """
    logger = get_run_logger()
    partial = dest_dir.with_name(f".{dest_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    if not host.exists(stage_dir):
        raise InfrastructureFailure(f"host {host.name}: {stage_dir} does not exist; nothing to collect")
    host.fetch_tree(stage_dir, partial)
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
            logger.error("unreadable %s from %s: %s", RESULT_FILE, host.name, str(exc).splitlines()[0])
    if result is None or (failure is not None and result.status == "success"):
        failure = failure or Failure(kind="infrastructure", message="the case left no result")
        stopped = training_progress(partial)
        if stopped:  # a training run killed mid-way: say how far it got
            failure = failure.model_copy(update={"message": f"{failure.message}; {stopped}"})
        job_file = partial / JOB_FILE  # the last attempt's job: it knows which attempt failed
        last = Job.model_validate_json(job_file.read_text()) if job_file.is_file() else job
        result = last.failed_result(failure, host_probe)
        write_result(result_path, result)
    if dest_dir.exists():
        raise FileExistsError(f"{dest_dir} already exists; results are never overwritten")
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(dest_dir)
    host.remove_tree(stage_dir)
    logger.info("collected %s -> %s (%s)", stage_dir, dest_dir, result.status)
    return result
