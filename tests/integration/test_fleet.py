"""A fleet through the real flow over SSH (tests/testbed: sshd hosts in network namespaces): every host's every
device measured (a test vendor splits the CPU into two logical devices), one host made slow on purpose with a
CPU quota (a cgroup its device processes are moved into), and the fleet diagnosis naming that host."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect_api import run_evaluate
from test_hosts import host_entry, write_inventory

from flagperf.results.schema import read_result
from tests.testbed.bed import Testbed, deploy_project, make_testbed_fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
testbed = make_testbed_fixture(min_hosts=3)
ROOT = Path(__file__).resolve().parents[2]
QUOTA = 0.03  # of one core, shared by the slow host's two device processes once they start measuring
# A slow device gets at most 1.5 % of a core while it measures; a normal device gets its share of the machine's
# two cores among whatever runs (on this shared machine, measured at 8 % and more under a load of 10; about 50 %
# on a machine that runs only this test). 0.6 of the fleet median is far above the one and below the other.
RULES = "rules:\n  - {name: fp32-gemm, metric: gemm_fp32, min_fleet_ratio: 0.6}\n"
READY = "host allocator"  # the device process's last line before its case starts (flagperf.entry.run_job)


def quota_group(prefix: str, share: float) -> Path:
    """A new cgroup limited to ``share`` of one core (skips the test where no writable cpu controller is)."""
    found = cgroup_cpu_root()
    if found is None:
        pytest.skip("no writable cgroup with the cpu controller (v1 cpu, or v2 with cpu in subtree_control)")
    root, kind = found
    group = root / f"{prefix}-{os.getpid()}"
    group.mkdir()
    period = 100_000
    if kind == "v1":
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(share * period)))
    else:
        (group / "cpu.max").write_text(f"{int(share * period)} {period}")
    return group


def cgroup_cpu_root() -> tuple[Path, str] | None:
    """Where a CPU-quota cgroup can be made here (v1's cpu controller, or v2 with cpu enabled), and its kind."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, "v1"
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split() and os.access(v2, os.W_OK):
        return v2, "v2"
    return None


def device_processes(marker: str) -> Iterator[tuple[int, Path, int]]:
    """(pid, job file, device index) of every device process (flagperf.entry --device-slot) of a round whose
    job path contains ``marker``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
            if "--device-slot" in args and any(marker in a for a in args):
                yield (int(proc.name), Path(args[args.index("--job") + 1]),
                       int(json.loads(args[args.index("--device-slot") + 1])["index"]))
        except (OSError, ValueError, IndexError, KeyError):
            continue  # gone meanwhile, or not ours


@contextlib.contextmanager
def cpu_quota(marker: str, share: float) -> Iterator[None]:
    """A cgroup limited to ``share`` of one core, into which every device process of the rounds whose job path
    contains ``marker`` is moved once it says it is ready to measure (its line in the round's case.log): its
    interpreter and imports run at full speed, its measurement under the quota. Only those processes are
    slowed, not the host's sshd or another session's rounds."""
    group = quota_group("flagperf-slow", share)
    stop = threading.Event()
    moved: dict[int, int] = {}  # pid -> device index (a fork of a device process, e.g. for a subprocess, too)

    def mover() -> None:
        while not stop.is_set():
            for pid, job, index in device_processes(marker):
                if pid in moved:
                    continue
                with contextlib.suppress(OSError):
                    log = (job.parent / "case.log").read_text(errors="replace")
                    if any(line.startswith(f"[device {index}] ") and READY in line for line in log.splitlines()):
                        (group / "cgroup.procs").write_text(str(pid))
                        moved[pid] = index
            stop.wait(0.02)

    thread = threading.Thread(target=mover, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for pid in (group / "cgroup.procs").read_text().split():  # none should be left; move them back if so
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            group.rmdir()
    assert sorted(set(moved.values())) == [0, 1], f"the slow host's device processes moved into the quota: {moved}"


def flow_artifact(flow_run_id: Any, key: str) -> str:
    """The text of the flow run's artifact ``key`` (its latest version)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert found, f"no artifact {key} on flow run {flow_run_id}"
    return str(found[-1].data)


def test_the_slow_host_of_a_fleet_is_named(flagperf_env: Path, tmp_path: Path, testbed: Testbed,
                                           monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    # A deploy folder of its own: the shared one may be replaced by another session's checkout meanwhile.
    deployed = deploy_project(ROOT, testbed, f"flagperf-fleet-{os.getpid()}")
    request.addfinalizer(lambda: shutil.rmtree(deployed, ignore_errors=True))
    vendors = "tests/fixtures/vendors"
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(ROOT / vendors))
    slow = testbed.hosts[2].name
    with cpu_quota(f"/{slow}_noderank0/", QUOTA):
        hosts = []
        for i in range(3):
            entry = host_entry(testbed, i, deployed)
            entry["env"]["FLAGPERF_VENDOR_PATH"] = str(deployed / vendors)
            hosts.append(entry)
        inventory = write_inventory(tmp_path, hosts)
        started = time.monotonic()
        state, run_dir = run_evaluate(flagperf_env, cases=["computation-FP32"], vendor="cpu-split", rounds=1,
                                      inventory=inventory,
                                      overrides=["m=128", "n=128", "k=128", "min_duration_s=2", "warmup_iters=20",
                                                 "min_iters=3", "timeout_s=300"])
        print(f"evaluation: {time.monotonic() - started:.0f} s")
    assert state.is_completed(), state.message
    figures: dict[str, list[float]] = {}
    for host in testbed.hosts[:3]:
        result = read_result(run_dir / "computation-FP32" / "round1" / f"{host.name}_noderank0" / "result.json")
        assert [(d.index, d.status) for d in result.devices] == [(0, "success"), (1, "success")]
        figures[host.name] = sorted(m.value for m in result.metrics)
        (spread,) = result.device_spread
        assert (spread.devices, spread.min, spread.max) == (2, figures[host.name][0], figures[host.name][1])
    print(f"figures: {figures}")
    # The quota is what made the host slow: its devices are the fleet's two lowest.
    assert max(figures[slow]) < min(v for name, values in figures.items() if name != slow for v in values), figures
    # The flow's own diagnosis (default rules), in the run folder and the report.
    diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    assert slow in diagnosis["failed_hosts"], diagnosis
    assert "## Fleet diagnosis" in (run_dir / "report.md").read_text()
    assert slow in flow_artifact(state.state_details.flow_run_id, "flagperf-diagnosis")
    assert (run_dir / "summary.csv").read_text().count(",gemm_fp32,") == 6  # a row per device
    # The command, with rules for this bed: exit 4, the slow host named with the rule and each device's figure.
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "diagnose", str(run_dir), "--rules", str(rules)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 4, done.stdout + done.stderr
    found = json.loads((run_dir / "diagnosis.json").read_text())
    assert slow in found["failed_hosts"]
    slow_devices = [d for d in found["devices"] if d["host"] == slow]
    assert [d["status"] for d in slow_devices] == ["fail", "fail"]
    assert all(c["rule"] == "fp32-gemm" and c["value"] in figures[slow] for d in slow_devices for c in d["checks"])
    assert f"| {slow} | **fail** | fp32-gemm: " in done.stdout and f"{slow} device 0: gemm_fp32" in done.stdout
