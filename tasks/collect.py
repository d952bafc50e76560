from __future__ import annotations

import re
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.hosts import Host
from flagperf.job import JOB_FILE, Job
from flagperf.provenance import engine_info, library_versions
from flagperf.results import RESULT_FILE, Failure, Provenance, RoundResult, read_result, write_result
from flagperf.runtime import PID_FILE

ATTEMPT_DIR = re.compile(r"^attempt(\d+)$")


@task(name="collect_logs", task_run_name="collect_logs[{job.case}/round{job.round}@{host.name}]", cache_policy=NONE)
def collect_logs(host: Host, stage_dir: Path, dest_dir: Path, job: Job, family: str,
                 failure: Failure | None, host_probe: dict[str, Any] | None) -> RoundResult:
    """Bring a round's files to the controller, in FlagPerf's layout, whatever the round's outcome.

    The last attempt's files go to the round folder; earlier attempts (retried crashes) are kept
    under attempts/. If the case left no result (a crash or a timeout), a failed result is written
    here, so every round has a result.json. The folder appears whole or not at all.
    """
    logger = get_run_logger()
    partial = dest_dir.with_name(f".{dest_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
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
        result = _failed_result(job, family, failure or Failure(kind="infrastructure", message="no result"),
                                host_probe, partial)
        write_result(result_path, result)
    if dest_dir.exists():
        raise FileExistsError(f"{dest_dir} already exists; results are never overwritten")
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(dest_dir)
    host.remove_tree(stage_dir)
    logger.info("collected %s -> %s (%s)", stage_dir, dest_dir, result.status)
    return result


def _failed_result(job: Job, family: str, failure: Failure, host_probe: dict[str, Any] | None,
                   folder: Path) -> RoundResult:
    now = datetime.now(UTC)
    job_file = folder / JOB_FILE
    attempt = Job.model_validate_json(job_file.read_text()).attempt if job_file.is_file() else job.attempt
    probe = host_probe or {}
    return RoundResult(
        run_id=job.run_id, case=job.case, family=family, round=job.round, host=job.host, node_rank=job.node_rank,
        vendor=job.vendor, status="failed", failure=failure, started_at=now, finished_at=now, duration_s=0.0,
        measured_seconds=0.0, device=probe.get("device"), config=job.config,
        provenance=Provenance(
            **engine_info(), command=job.command, python=probe.get("python", sys.version.split()[0]),
            libraries={**job.controller_libraries, **probe.get("libraries", library_versions())},
            host=probe.get("host", {}), image=job.image, config_origins=job.config_origins,
            run_overrides=job.run_overrides, attempt=attempt,
        ),
    )
