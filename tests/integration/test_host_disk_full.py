"""An SSH host whose own disk fills: its work folder is a real, small tmpfs mounted in the host's mount namespace
only (tests/testbed/bed.py: tmpfs_on_host), filled to the last block as another job there would. A file the
controller writes there is whole or absent (no temporary file left), the error is one line naming the host, the
file and the cause."""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.ssh import SshError, SshHost
from tests.testbed.bed import Testbed, fill_on_host, in_host_namespace, make_testbed_fixture, tmpfs_on_host

pytestmark = pytest.mark.integration
testbed = make_testbed_fixture(min_hosts=1)
ROOT = Path(__file__).resolve().parents[2]


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
        "project_root": str(ROOT), "connect_timeout_s": 5, "work_root": str(work_root)}))


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
