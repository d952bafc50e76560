from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.errors import InfrastructureFailure
from flagperf.health import HealthReport, check_host
from flagperf.hosts import Host


@task(name="healthcheck", task_run_name="healthcheck[{host.name}]", cache_policy=NONE, retries=0)
def healthcheck(host: Host, vendor: str, results_dir: Path, run_id: str) -> HealthReport:
    logger = get_run_logger()
    report = check_host(host, vendor, results_dir, log_path=host.work_root / run_id / "healthcheck.log")
    for check in report.checks:
        (logger.info if check.ok else logger.error)("%s %s: %s", "ok  " if check.ok else "FAIL", check.name,
                                                    check.detail)
    if not report.ok:
        raise InfrastructureFailure("; ".join(report.failures()))
    return report
