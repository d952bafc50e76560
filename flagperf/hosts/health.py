"""Healthcheck of one host, without Prefect: each check is a name, a verdict and a one-line detail."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flagperf.config.diagnose import load_rules
from flagperf.config.vendors import Vendor
from flagperf.errors import ConfigError, FlagperfError, InfrastructureFailure, printable
from flagperf.hosts.container_policy import PolicyError, parse_container_options
from flagperf.hosts.docker import engine_client
from flagperf.hosts.inventory import HostSpec, expected_devices_origin
from flagperf.hosts.local import Host
from flagperf.hosts.probe import probe_command
from flagperf.hosts.slurm import SlurmHost, check_cluster
from flagperf.hosts.ssh import SshError, SshHost
from flagperf.paths import VENDOR_MANIFEST, display_path
from flagperf.results.bounded import read_json_file
from flagperf.results.devicehealth import HEALTH_KEY, checked_reading, health_report_path, summary_line
from flagperf.results.diagnosis import health_findings
from flagperf.results.schema import write_json_atomic

log = logging.getLogger(__name__)
MIN_FREE_BYTES = 1 << 30
MAX_CLOCK_SKEW_S = 2.0
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # ok, yet worth a warning line (a device the diagnosis will name)


@dataclass(frozen=True)
class HealthReport:
    host: str
    checks: list[Check]
    probe: dict[str, Any] | None
    # The inventory's expected_devices against the probe's count: {"expected", "found"} (found: on the host, None
    # for a docker host, whose images add theirs under "images"); None where the inventory gives no count.
    device_count: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "checks": [c.__dict__ for c in self.checks], "probe": self.probe,
                **({DEVICE_COUNT: self.device_count} if self.device_count is not None else {})}

    def failures(self) -> list[str]:
        return [f"host {self.host}: {c.name}: {c.detail}" for c in self.checks if not c.ok]


def health_file(run_dir: Path, host: str) -> Path:
    return health_report_path(run_dir, host)


def with_image_probe(probe: dict[str, Any] | None, image_probe: dict[str, Any] | None) -> dict[str, Any] | None:
    """The probe a host's rounds record: the host's own facts from the healthcheck, and the device, peaks and
    libraries the cases will have, from the probe inside the host's image where its rounds run in one."""
    if image_probe is None:
        return probe
    return {**(probe or {}), **{k: v for k, v in image_probe.items() if k != "host"}}


IMAGE_PROBES = "image_probes"  # a health report's probes inside the host's images, by framework
DEVICE_COUNT = "device_count"  # a health report's expected and found devices (HealthReport.device_count)
# What a failed round's result takes from a probe (Job.failed_result), each of the type it must be.
PROBE_FIELDS: dict[str, type | tuple[type, ...]] = {"device": (str, type(None)), "python": str, "libraries": dict,
                                                    "host": dict}
_REPORT_LOCKS: dict[Path, threading.Lock] = {}
_REPORT_LOCKS_LOCK = threading.Lock()


def _probe_problem(name: str, probe: Any) -> str | None:
    if probe is None:
        return None
    if not isinstance(probe, dict):
        return f"{name}: not an object"
    wrong = [key for key, kind in PROBE_FIELDS.items() if key in probe and not isinstance(probe[key], kind)]
    return f"{name}.{wrong[0]}: not a{'n object' if PROBE_FIELDS[wrong[0]] is dict else ' string'}" if wrong else None


def round_probe(run_dir: Path, host: str, framework: str | None = None) -> dict[str, Any] | None:
    """What the run's healthcheck found on ``host``, with the probe inside its image of the round's ``framework``
    (see with_image_probe), read from its health report in the run folder; None where there is none. A round reads
    it there rather than taking it as a flow parameter: the UI would show the whole probe among the round's
    parameters, and a retried round reads it again all the same.

    A report that cannot be read (too large, not JSON, not what the healthcheck writes) is a warning and None: the
    probe is only what a failed round records of the host, and one bad file must not fail the round, nor the
    evaluation (which reads it again for a round that left no result)."""
    path = health_file(run_dir, host)
    if not path.is_file():
        return None
    try:
        report = read_json_file(path, what="a host's health report")
        if not isinstance(report, dict):
            raise ValueError(f"{display_path(path)}: not an object")
        images = report.get(IMAGE_PROBES, {})
        if not isinstance(images, dict):
            raise ValueError(f"{display_path(path)}: {IMAGE_PROBES}: not an object")
        probe, image_probe = report.get("probe"), images.get(framework) if framework is not None else None
        problem = (_probe_problem("probe", probe)
                   or _probe_problem(f"{IMAGE_PROBES}.{framework}", image_probe))
        if problem:
            raise ValueError(f"{display_path(path)}: {problem}")
    except (FlagperfError, ValueError) as exc:
        log.warning("host %s: its health report is unreadable (%s); its rounds record no probe of the host", host,
                    exc)
        return None
    return with_image_probe(probe, image_probe)


def record_image_probe(run_dir: Path, host: str, framework: str, check: Check, probe: dict[str, Any] | None,
                       count: Check | None = None) -> None:
    """Add the check of the probe inside ``host``'s image of ``framework`` to its health report, and the probe
    under that framework (the rounds of each framework read their own: round_probe); ``count``: its device count
    check (device_count_check), whose count goes under the report's device_count.images. The host's images are
    probed at once, each in a thread of this process: the report is read, changed and written again by one at a
    time, or one would write over what another had added."""
    path = health_file(run_dir, host)
    with _REPORT_LOCKS_LOCK:
        lock = _REPORT_LOCKS.setdefault(path, threading.Lock())
    with lock:
        report = read_json_file(path, what="a host's health report") if path.is_file() else {"host": host,
                                                                                            "checks": []}
        report["checks"] += [c.__dict__ for c in (check, count) if c is not None]
        report["ok"] = all(c["ok"] for c in report["checks"])
        report[IMAGE_PROBES] = {**(report.get(IMAGE_PROBES) or {}), framework: probe}
        if count is not None and isinstance(report.get(DEVICE_COUNT), dict):
            counted = report[DEVICE_COUNT]
            counted["images"] = {**(counted.get("images") or {}), framework: (probe or {}).get("device_count")}
        write_json_atomic(path, report)


def check_host(host: Host, spec: HostSpec, vendor: Vendor, log_path: Path,
               min_free_bytes: int = MIN_FREE_BYTES, cases: Sequence[str] = ()) -> HealthReport:
    """reachable + authenticated (SSH) -> deploy path present -> the probe runs (versions, accelerators
    visible, clock skew) -> free disk at the host's work root -> container engine reachable (docker hosts).
    A failed early check skips the ones that depend on it. ``cases``: the run's case folders (RunPlan.case_folders),
    whose folders a Slurm container image's jobs mount: a bad one fails here, once, not every round."""
    checks: list[Check] = []
    probe: dict[str, Any] | None = None
    if isinstance(host, SlurmHost):
        try:  # in a container image, the probe finds the vendor where the rounds will; the folders need no cluster
            search = host.search_mounts(vendor.name, cases)
        except ConfigError as exc:  # the inventory's to fix first, whatever the cluster's state
            checks.append(Check("container mounts", False, str(exc)))
            return HealthReport(host=host.name, checks=checks, probe=None)
        # The cluster next: a probe job on a drained node would only wait.
        checks += [Check(c.name, c.ok, c.detail) for c in check_cluster(host)]
        if not all(c.ok for c in checks):
            return HealthReport(host=host.name, checks=checks, probe=None)
        host = host.with_search(search)
    if isinstance(host, SshHost):
        try:
            host.client()
        except SshError as exc:
            checks.append(Check("ssh", False, str(exc).removeprefix(f"host {host.name}: ")))
            return HealthReport(host=host.name, checks=checks, probe=None)
        checks.append(Check("ssh", True, f"reachable and authenticated as {host.where()} (host key verified)"))
    try:
        deployed = host.exists(host.project_root / "flagperf" / "__init__.py")
    except OSError as exc:
        checks.append(Check("deployed", False, f"cannot look at {host.project_root}: {exc}"))
        return HealthReport(host=host.name, checks=checks, probe=None)
    if not deployed:
        checks.append(Check("deployed", False, f"deploy path {host.project_root} has no flagperf/ (copy or mount "
                                               "the project there, or set project_root)"))
        return HealthReport(host=host.name, checks=checks, probe=None)
    if isinstance(host, SshHost):
        try:
            problem = host.work_root_problem()
        except SshError as exc:
            problem = str(exc).removeprefix(f"host {host.name}: ")
        checks.append(Check("work root", problem is None, f"{host.work_root}: " + (
            f"not a private folder of {host.spec.ssh_user()} ({problem}); set the host's work_root" if problem
            else "private")))
        if problem:  # jobs must not pass through a folder someone else controls
            return HealthReport(host=host.name, checks=checks, probe=None)
    settings = spec.host_spec_settings()  # the host's own: a value its spec module refuses fails here, not each round
    result = host.run(probe_command(host.python, vendor.name, settings), timeout=PROBE_TIMEOUT_S, log_path=log_path)
    if result.exit_code is None and not result.timed_out:
        checks.append(Check("python", False, f"cannot start {host.python}"))
    elif result.timed_out:
        checks.append(Check("python", False, f"probe did not answer within {PROBE_TIMEOUT_S:.0f} s"))
    else:
        log_tail = next(iter(host.tail(log_path, 1)), "")
        if result.exit_code != 0:
            checks.append(Check("python", False, f"flagperf.hosts.probe exited {result.exit_code}: {log_tail}"))
        else:
            try:
                probe = json.loads(log_tail)
            except json.JSONDecodeError:
                checks.append(Check("python", False, f"probe printed no JSON: {log_tail[:200]}"))
    if probe is not None:
        checks.append(Check("deployed", True, f"flagperf {probe['engine_version']} at {host.project_root}, "
                                              f"{host.python} {probe['python']}, "
                                              f"torch {probe['libraries'].get('torch')}"))
        if probe.get("torch_missing") and spec.runtime == "docker":
            # Cases run in the vendor's image: that is where torch and the devices must be (probe_image).
            checks.append(Check("accelerators", True, f"no torch on the host ({probe['torch_missing']}): "
                                                      "checked in the vendor image before the first round"))
        elif probe.get("torch_missing"):
            checks.append(Check("accelerators", False, f"{host.python} cannot import torch "
                                                       f"({probe['torch_missing']}); cases run as plain processes "
                                                       "on this host need it"))
        else:
            checks.append(device_check("accelerators", probe, ""))
            # Counted where the cases run: a docker host's in its images (probe_image), not its own Python's
            if spec.expected_devices is not None and spec.runtime == "process" and probe["device_visible"]:
                checks.append(device_count_check(spec, vendor, probe, "on the host"))
        checks.append(device_health_check(probe, vendor))
        checks.append(check_clock(host))
    free = host.disk_free(host.work_root)
    checks.append(Check("disk", free >= min_free_bytes,
                        f"{free / 2**30:.1f} GiB free at {host.work_root} (need {min_free_bytes / 2**30:.1f})"))
    if spec.runtime == "docker":
        checks.append(check_engine(host, spec))
    count = None if spec.expected_devices is None else {
        "expected": spec.expected_devices,
        "found": probe.get("device_count") if probe is not None and spec.runtime == "process" else None}
    return HealthReport(host=host.name, checks=checks, probe=probe, device_count=count)


def device_count_check(spec: HostSpec, vendor: Vendor, probe: dict[str, Any], where: str) -> Check:
    """The inventory's expected_devices against the devices the probe found (``where``: "on the host", "in
    <image>"): a host that lost a device (off the bus, a driver that did not load) or whose settings hide some
    would otherwise measure on fewer, its figures wrong without a word. Another count names what narrowed it."""
    expected, found = spec.expected_devices, probe.get("device_count")
    source, key = expected_devices_origin(spec)
    variable = spec.visible_devices_env or vendor.manifest.container.visible_devices_env  # as the runtime sets it
    value = (probe.get("visible_devices") or {}).get(variable) if variable else None  # absent: an older probe
    if value is None and variable and spec.runtime == "docker" and spec.visible_devices is not None:
        value = spec.visible_devices  # a host's own variable name, which the vendor's probe does not read
    shown = f" with {variable}={printable(str(value))}" if value is not None else ""
    seen = f"{found} x {probe.get('device') or probe.get('torch_device')} {where}{shown}"
    given = f"expected_devices: {expected} ({source}: {key})"
    if found == expected:
        return Check("device count", True, f"{seen}, as {given} says")
    if isinstance(found, int) and found > expected:
        if spec.slurm is not None:
            narrow: str | None = "slurm.gres"
        elif spec.runtime == "docker" and variable:
            narrow = f"visible_devices (it sets {variable})"
        else:
            narrow = variable
        look = "more than expected: correct expected_devices" + (f", or narrow the devices with {narrow}" if narrow
                                                                   else "")
    else:
        narrowers = count_narrowers(spec, vendor, variable)
        look = ("fewer than expected: look at the host's devices with the vendor's tool (one off the bus, a driver "
                "that did not load)" + (f" and at {', '.join(narrowers)}" if narrowers else ""))
    return Check("device count", False, f"{given}, found {seen}: {look}")


def count_narrowers(spec: HostSpec, vendor: Vendor, variable: str | None) -> list[str]:
    """What narrows the devices a host's cases see, as what to look at: the inventory's keys that are set (a Slurm
    job's gres; a container's --gpus, else the vendor's device requests), and the visible-devices variable by the
    key that gives it where one does (as the runtime applies them: visible_devices over -e over env)."""
    if spec.slurm is not None:  # Slurm gives each job its gres's devices
        return [f"slurm.gres ({spec.slurm.gres or 'not given'})"]
    keys: list[str] = []
    given: str | None = None  # the key that gives the variable
    if spec.runtime == "docker":
        try:
            extras = parse_container_options(spec.docker.extra_options or "", spec.docker.allowed_roots())
        except PolicyError:  # refused when the inventory was loaded
            extras = None
        if extras is not None and extras.gpus is not None:
            keys.append(f"docker.extra_options (--gpus {extras.gpus})")
        elif vendor.manifest.container.device_requests:
            keys.append(f"container.device_requests ({display_path(vendor.folder / VENDOR_MANIFEST)})")
        if variable and spec.visible_devices is not None:
            given = f"visible_devices ({spec.visible_devices}, as {variable})"
        elif extras is not None and variable in extras.env:
            given = f"docker.extra_options (-e {variable})"
    if given is None and variable in spec.env:
        given = f"env.{variable}"
    return [given or variable, *keys] if variable else keys


def device_health_check(probe: dict[str, Any], vendor: Vendor, name: str = "device health") -> Check:
    """The vendor's health probe's reading (probe ``device_health``) in one line, naming each device that breaks a
    health rule of the default rules file. Always ok: a downgraded link or a pending remap is the fleet diagnosis's
    to name beside the host's figures (a host left out here would measure nothing to compare), so the run goes on
    and the line says what the diagnosis will find. ``name``: the check's (the image probe's says so)."""
    raw = probe.get(HEALTH_KEY)
    if raw is None and vendor.manifest.health_module is None:
        return Check(name, True, f"none: vendor {vendor.name} has no health probe (health_module in its vendor.yaml)")
    if raw is None:  # a probe from a deployed copy older than the reading
        return Check(name, True, "not read: the flagperf probe there reads no device health")
    try:
        reading = checked_reading(raw, "the probe's device_health")
    except ConfigError as exc:
        return Check(name, True, f"not read: {exc}")
    detail = summary_line(reading)
    if reading.available:
        try:
            findings = health_findings(reading, load_rules())
        except ConfigError as exc:  # the rules file is the diagnosis's to refuse, in one line, after the run
            findings = [f"not judged ({exc})"]
        detail += "; " + ("; ".join(findings[:8]) + (f"; and {len(findings) - 8} more" if len(findings) > 8 else "")
                          if findings else "no default health rule fails")
        return Check(name, True, detail, warn=bool(findings))
    return Check(name, True, detail)


def check_clock(host: Host) -> Check:
    """Clock skew from a cheap read (no torch import), so the uncertainty is one round trip, not seconds:
    when the clocks agree, the host's reading lies between the controller's two readings."""
    try:
        before = time.time()
        remote = host.clock()
        after = time.time()
    except (OSError, SshError, InfrastructureFailure, KeyError, ValueError) as exc:
        return Check("clock skew", False, f"cannot read the host's clock: {exc}")
    skew = max(0.0, before - remote, remote - after)
    return Check("clock skew", skew <= MAX_CLOCK_SKEW_S,
                 f"{skew:.2f} s against the controller (limit {MAX_CLOCK_SKEW_S:.0f} s, read within "
                 f"{after - before:.2f} s)")


def check_engine(host: Host, spec: HostSpec) -> Check:
    try:
        client = engine_client(host, spec, timeout=spec.connect_timeout_s + 20)
        version = client.version()
    except Exception as exc:  # the SDK raises several types for an unreachable engine; all mean the same here
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Check("container engine", False, detail.removeprefix(f"host {host.name}: "))
    where = "the controller's engine" if spec.docker.engine == "local" else "its engine over SSH"
    return Check("container engine", True, f"docker {version.get('Version')} (API {version.get('ApiVersion')}), "
                                           f"{where}")


def check_results_disk(results_dir: Path, min_free_bytes: int = MIN_FREE_BYTES) -> None:
    """The controller's results folder (collected rounds land there): checked once, before any round."""
    probe = results_dir.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < min_free_bytes:
        raise InfrastructureFailure(f"controller: {free / 2**30:.1f} GiB free at {results_dir} (need "
                                    f"{min_free_bytes / 2**30:.1f})")


def image_probe_check(result_lines: list[str], exit_code: int | None, timed_out: bool, image: str,
                      dockerfile: str = "the vendor's Dockerfile", link: str | None = None
                      ) -> tuple[Check, dict[str, Any] | None]:
    """The probe's answer from inside the vendor image: the accelerators the cases will see there. A failure
    names the Dockerfile the image was built from (``dockerfile``): that is what the vendor fixes; one the link to
    the engine caused (``link``: the runtime's word, CommandResult.link) names that instead."""
    last = next((line for line in reversed(result_lines) if line.strip()), "")
    built = f"{image} (built from {dockerfile})"
    if timed_out:
        return Check("accelerators in image", False, f"the probe in {built} did not answer within "
                                                     f"{PROBE_TIMEOUT_S:.0f} s"), None
    if exit_code is None and link:  # no answer of the engine's: neither the image nor the options are at fault
        return Check("accelerators in image", False, f"the probe in {built} was lost: {link}"), None
    if exit_code is None:  # the engine refused the container: its options, not the image, are at fault
        hint = ("; the engine could not apply the vendor's container.ulimits (raising a limit needs "
                "CAP_SYS_RESOURCE where the engine runs)") if "rlimit" in last else ""
        return Check("accelerators in image", False, f"the container for the probe in {built} did not start: "
                                                     f"{last[:300]}{hint}"), None
    if exit_code != 0:
        return Check("accelerators in image", False, f"the probe in {built} exited {exit_code}: {last[:300]}"), None
    try:
        probe = json.loads(last)
    except json.JSONDecodeError:
        return Check("accelerators in image", False, f"the probe in {built} printed no JSON: {last[:200]}"), None
    if probe.get("torch_missing"):
        python = probe.get("python_executable") or "python"
        return Check("accelerators in image", False, f"{built} has no torch: its {python} cannot import torch "
                                                     f"({probe['torch_missing']}); install the vendor's torch in "
                                                     f"{dockerfile} (its BASE_IMAGE or a RUN line)"), probe
    return device_check("accelerators in image", probe, f" in {image}"), probe


def device_check(name: str, probe: dict[str, Any], where: str) -> Check:
    """The probe's device verdict: how many of which device torch sees (``where``: e.g. " in <image>")."""
    if not probe["device_visible"]:
        return Check(name, False, f"no {probe['torch_device']} device visible to torch{where}")
    return Check(name, True, f"{probe['device_count']} x {probe['device']} ({probe['torch_device']}), torch "
                             f"{probe['libraries'].get('torch')}{where}")


def log_check(log: Any, host: str, check: Check) -> None:
    """One line per check in the task's log: ok, or FAIL at error level. The line names the host, as a failure's
    message does: the default Prefect UI shows a flow run's log without the task of each line, so the checks of
    several hosts would read alike there."""
    level, word = (log.error, "FAIL") if not check.ok else (log.warning, "WARN") if check.warn else (log.info, "ok  ")
    level("%s host %s: %s: %s", word, host, check.name, check.detail)
