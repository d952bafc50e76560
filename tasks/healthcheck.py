from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.config.vendors import Vendor
from flagperf.errors import InfrastructureFailure
from flagperf.hosts.health import HealthReport, check_host, health_file, log_check
from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.local import Host
from flagperf.results.schema import write_json_atomic


@task(name="healthcheck", task_run_name="healthcheck[{host.name}]", cache_policy=NONE, retries=0)
def healthcheck(host: Host, spec: HostSpec, vendor: Vendor, run_dir: Path, cases: Sequence[str] = ()) -> HealthReport:
    """Every check of one host, logged one per line and recorded in the run folder (hosts/<name>.health.json);
    raises naming the host and each failed check. ``cases``: the run's case folders (check_host)."""
    logger = get_run_logger()
    report = check_host(host, spec, vendor, log_path=host.work_root / run_dir.name / "healthcheck.log",
                        cases=cases)
    write_json_atomic(health_file(run_dir, host.name), report.as_dict())
    for check in report.checks:
        log_check(logger, host.name, check)
    if not report.ok:
        raise InfrastructureFailure("; ".join(report.failures()))
    return report
