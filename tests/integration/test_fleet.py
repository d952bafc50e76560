"""A fleet through the real flow over SSH (tests/testbed: sshd hosts in network namespaces): every host's every
device measured (a test vendor splits the CPU into two logical devices), one host made slow on purpose with a
CPU quota (a cgroup its device processes are moved into), and the fleet diagnosis naming that host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cpu_quota import cpu_quota
from prefect_api import run_evaluate
from test_hosts import host_entry, write_inventory

from flagperf.results.schema import read_result
from tests.testbed.bed import Testbed, deploy_project, make_testbed_fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
testbed = make_testbed_fixture(min_hosts=3)
ROOT = Path(__file__).resolve().parents[2]
QUOTA = 0.03  # of one core, shared by the slow host's two device processes while they measure (cpu_quota.py)
# A slow device gets 1.5 % of a core while both measure (at most 3 % if the other's figure is in first and it is
# moved out); a normal device gets its share of the machine's two cores among whatever runs (on this shared
# machine, measured at 8 % and more under a load of 10; about 50 % on a machine that runs only this test). 0.6 of
# the fleet median is far above the one and below the other.
RULES = "rules:\n  - {name: fp32-gemm, metric: gemm_fp32, min_fleet_ratio: 0.6}\n"


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
    with cpu_quota(f"/{slow}_noderank0/", QUOTA) as quota:
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
    assert sorted(set(quota.moved.values())) == [0, 1], f"the slow host's device processes put under the quota: {quota}"
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
