"""Healthcheck of one host, without Prefect: each check is a name, a verdict and a one-line detail."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flagperf.hosts import Host

MIN_FREE_BYTES = 1 << 30
MAX_CLOCK_SKEW_S = 2.0
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    host: str
    checks: list[Check]
    probe: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[str]:
        return [f"host {self.host}: {c.name}: {c.detail}" for c in self.checks if not c.ok]


def check_host(host: Host, vendor: str, results_dir: Path, log_path: Path,
               min_free_bytes: int = MIN_FREE_BYTES) -> HealthReport:
    checks: list[Check] = []
    probe: dict[str, Any] | None = None
    before = time.time()
    result = host.run([host.python, "-m", "flagperf.probe", "--vendor", vendor], timeout=PROBE_TIMEOUT_S,
                      log_path=log_path)
    after = time.time()
    if result.exit_code is None:
        checks.append(Check("reachable", False, f"cannot start {host.python}"))
    elif result.timed_out:
        checks.append(Check("reachable", False, f"probe did not answer within {PROBE_TIMEOUT_S:.0f} s"))
    else:
        checks.append(Check("reachable", True, f"{host.python} runs"))
        log_tail = next(iter(host.tail(log_path, 1)), "")
        if result.exit_code != 0:
            checks.append(Check("deployed", False, f"flagperf.probe exited {result.exit_code}: {log_tail}"))
        else:
            try:
                probe = json.loads(log_tail)
            except json.JSONDecodeError:
                checks.append(Check("deployed", False, f"probe printed no JSON: {log_tail[:200]}"))
    if probe is not None:
        checks.append(Check("deployed", True, f"flagperf {probe['engine_version']} at {host.project_root}, "
                                              f"torch {probe['libraries'].get('torch')}"))
        checks.append(Check("accelerators", bool(probe["device_visible"]),
                            f"{probe['device_count']} x {probe['device']} ({probe['torch_device']})"
                            if probe["device_visible"] else f"no {probe['torch_device']} device visible to torch"))
        # The host's clock read lies between our two readings when the clocks agree.
        skew = max(0.0, before - probe["time"], probe["time"] - after)
        checks.append(Check("clock skew", skew <= MAX_CLOCK_SKEW_S,
                            f"{skew:.2f} s against the controller (limit {MAX_CLOCK_SKEW_S:.0f} s)"))
    for label, path in (("disk at work root", host.work_root), ("disk at results", results_dir)):
        free = host.disk_free(path)
        checks.append(Check(label, free >= min_free_bytes,
                            f"{free / 2**30:.1f} GiB free at {path} (need {min_free_bytes / 2**30:.1f})"))
    return HealthReport(host=host.name, checks=checks, probe=probe)
