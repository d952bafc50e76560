"""An SSH host whose own disk fills: its work folder is a real, small tmpfs mounted in the host's mount namespace
only (tests/testbed/bed.py: tmpfs_on_host), filled to the last block as another job there would. A file the
controller writes there is whole or absent (no temporary file left), the error is one line naming the host, the
file and the cause."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.ssh import SshError, SshHost
from flagperf.results.schema import read_result
from flagperf.results.summary import REPORT_MD, SUMMARY_JSON
from tasks.container import HOST_DISK_FULL
from tests.testbed.bed import (
    Testbed,
    deploy_project,
    fill_on_host,
    host_shared_folder,
    in_host_namespace,
    make_testbed_fixture,
    tmpfs_on_host,
)

pytestmark = pytest.mark.integration
testbed = make_testbed_fixture(min_hosts=1)
ROOT = Path(__file__).resolve().parents[2]
FIXTURE_CASES = ROOT / "tests" / "fixtures" / "cases"


@pytest.fixture
def host_work(testbed: Testbed) -> Iterator[Path]:
    """h1's work folder: a 4 MiB tmpfs on the host (this machine sees an empty folder)."""
    parent = Path(tempfile.mkdtemp(prefix="flagperf-host-disk-", dir="/tmp"))
    parent.chmod(0o755)
    try:
        with tmpfs_on_host(testbed, testbed.hosts[0], parent / "work", "4m") as work:
            yield work
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def ssh_host(testbed: Testbed, work_root: Path) -> SshHost:
    bed_host = testbed.hosts[0]
    return SshHost(HostSpec.model_validate({
        "name": bed_host.name, "address": bed_host.address, "port": bed_host.port, "user": bed_host.user,
        "key_file": Path(bed_host.key_file), "known_hosts": Path(testbed.known_hosts), "python": bed_host.python,
        "project_root": str(ROOT), "connect_timeout_s": 30, "work_root": str(work_root)}))


def host_listing(testbed: Testbed, folder: Path) -> list[str]:
    """Every name under ``folder`` as the host sees it (hidden ones too)."""
    done = in_host_namespace(testbed, testbed.hosts[0], "find", str(folder), "-mindepth", "1")
    assert done.returncode == 0, done.stderr
    return sorted(line.removeprefix(f"{folder}/") for line in done.stdout.splitlines())


def test_a_write_to_a_full_host_disk_leaves_no_temporary_file_and_says_why(testbed: Testbed, host_work: Path) -> None:
    host = ssh_host(testbed, host_work)
    try:
        job = host_work / "run" / "attempt1" / "job.json"
        host.write_text(job, "{}\n")  # the folder exists on the host, as a round's does before its job is written
        ballast = fill_on_host(testbed, testbed.hosts[0], host_work)
        text = "x" * 200_000  # more than the host's last partial block
        with pytest.raises(SshError) as raised:
            host.write_text(job, text)
        message = str(raised.value)
        assert message.startswith(f"host {host.name}: cannot write {job}: No space left on device (")
        assert "\n" not in message and raised.value.errno == errno.ENOSPC
        # Nothing half-written: the old job is whole, and no temporary file stays on the host.
        assert host_listing(testbed, host_work) == ["ballast", "run", "run/attempt1", "run/attempt1/job.json"]
        assert host.read_text(job) == "{}\n"

        assert in_host_namespace(testbed, testbed.hosts[0], "rm", str(ballast)).returncode == 0  # space is back
        host.write_text(job, text)
        assert host.read_text(job) == text
        assert host_listing(testbed, host_work) == ["run", "run/attempt1", "run/attempt1/job.json"]
    finally:
        host.close()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the test hosts' user can write: the case's marker."""
    with host_shared_folder("flagperf-host-disk-", 0o777) as folder:
        yield folder

def flagperf_run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(FLAGPERF_CASE_PATH=str(FIXTURE_CASES), PREFECT_HOME=str(tmp_path / "prefect-home"))
    return subprocess.run([sys.executable, "-m", "flows.cli", "run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def test_a_host_disk_that_fills_stops_the_run_in_one_line_and_a_retry_finishes_it(
        testbed: Testbed, shared: Path, tmp_path: Path) -> None:
    """fills-disk fills h1's work folder (a 1100 MiB tmpfs on h1: above the healthcheck's 1 GiB) while round 1
    runs, so the case cannot write its result there. The round fails saying the host's disk is full, the run stops
    (round 2 would fail the same way) with one line saying where to free space and the command that goes on;
    that `--retry`, once space is back, runs round 1 again and round 2."""
    deployed = deploy_project(ROOT, testbed, target=shared / "deploy" / "flagperf")  # its parent is made 0755
    bed_host = testbed.hosts[0]
    with tmpfs_on_host(testbed, bed_host, shared / "work", "1100m") as work:
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(yaml.safe_dump({"hosts": [{
            "name": bed_host.name, "address": bed_host.address, "port": bed_host.port, "user": bed_host.user,
            "key_file": bed_host.key_file, "known_hosts": testbed.known_hosts, "python": bed_host.python,
            "project_root": str(deployed), "connect_timeout_s": 30, "work_root": str(work),
            "env": {"FLAGPERF_CASE_PATH": str(deployed / "tests" / "fixtures" / "cases")}}]}), encoding="utf-8")
        results = tmp_path / "results"
        stopped = flagperf_run(["--inventory", str(inventory), "--cases", "fills-disk", "--rounds", "2",
                                "--set", f"fills-disk.fill_dir={work}",
                                "--set", f"fills-disk.marker={shared / 'filled'}", "--results", str(results)], tmp_path)

        assert stopped.returncode == 1, stopped.stdout[-3000:] + stopped.stderr[-3000:]
        assert "Traceback" not in stopped.stderr
        (run_dir,) = results.iterdir()
        last = ([line for line in stopped.stderr.splitlines() if line.strip()] or [stopped.stdout[-3000:]])[-1]
        assert last.startswith(f"error: fills-disk round 1 on {bed_host.name}: {HOST_DISK_FULL} "
                               f"({bed_host.name}:{work}: "), last
        assert "; stopped after 1 round(s). Free space there, then `flagperf run " in last
        assert "Traceback" not in last and "case.log" not in last  # the cause, not the case's last words
        failed = read_result(run_dir / "fills-disk" / "round1" / f"{bed_host.name}_noderank0" / "result.json")
        assert failed.status == "failed" and failed.failure is not None and HOST_DISK_FULL in failed.failure.message
        assert not (run_dir / "fills-disk" / "round2").exists()  # not run on a full disk
        # Nothing half-written in the run folder, and the host keeps nothing of the run but the other job's file.
        assert [p for p in run_dir.rglob("*") if p.name.startswith(".")] == []
        for record in [*run_dir.rglob("*.json"), *run_dir.rglob("*.csv")]:
            assert record.stat().st_size > 0
        assert host_listing(testbed, work) == ["ballast"]

        retry_command = shlex.split(last.split("`")[1])
        assert retry_command[:2] == ["flagperf", "run"] and retry_command[-2:] == ["--retry", str(run_dir)]
        assert in_host_namespace(testbed, bed_host, "rm", str(work / "ballast")).returncode == 0  # space is back
        retried = flagperf_run(retry_command[2:], tmp_path)

        assert retried.returncode == 0, retried.stdout[-3000:] + retried.stderr[-3000:]
        for round_no in (1, 2):
            result = read_result(run_dir / "fills-disk" / f"round{round_no}" / f"{bed_host.name}_noderank0" /
                                 "result.json")
            assert result.status == "success", result.failure
        assert (run_dir / SUMMARY_JSON).is_file() and (run_dir / REPORT_MD).is_file()
        assert host_listing(testbed, work) == []
