"""The test bed that tests/testbed/up.sh builds (real sshd hosts, a real Docker engine, a local base
image), as seen from the tests: ``load_testbed()`` reads its testbed.json, ``make_testbed_fixture()`` makes a
pytest fixture that hands it to a test or, when it is missing, skips the test (fails it under CI=true,
so that CI cannot pass by silently skipping the real-parts tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DEFAULT_PATH = Path("/tmp/flagperf-testbed/testbed.json")
UP_COMMAND = "tests/testbed/up.sh"


def session_id(pid: int | None = None) -> str:
    """A test session (its pytest process: ``pid``, default this one) as '<pid>.<start>', its start time in clock
    ticks since boot (/proc/PID/stat field 22): what up.sh's leftovers check (sessions.sh) tells a gone session by,
    since the pid alone may be another process's by then. Containers carry it in their owner label, Slurm jobs and
    drain reasons as slurm_session's tag (sess<pid>t<start>)."""
    pid = os.getpid() if pid is None else pid
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    return f"{pid}.{stat.rpartition(') ')[2].split()[19]}"  # after the command's name, which may hold ') '


def slurm_session() -> str:
    """This session's tag in its Slurm jobs' names and its drain reasons: up.sh cancels a job, or resumes a node,
    of a session that is gone, never another live session's."""
    return "sess" + session_id().replace(".", "t")  # letters and digits: whole in any name it is part of


@dataclass(frozen=True)
class TestbedHost:
    __test__ = False  # not a pytest test class

    name: str
    address: str
    port: int
    user: str
    key_file: str
    netns: str
    python: str  # an interpreter on the host with the project's pinned torch, numpy, pydantic, ...

    def ssh_argv(self, known_hosts: str, *remote: str) -> list[str]:
        """``ssh`` as the test bed expects it: this key only, host keys checked strictly, no prompts."""
        return ["ssh", "-F", "/dev/null", "-i", self.key_file, "-p", str(self.port),
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", f"{self.user}@{self.address}", *remote]


@dataclass(frozen=True)
class SlurmBed:
    """The test bed's Slurm cluster: slurmctld on this machine, one slurmd per node in a host's namespace."""

    __test__ = False

    partition: str
    shared_dir: str  # a folder every node sees (they share this machine's filesystem)
    conf: str  # slurm.conf, where every Slurm tool finds it
    nodes: tuple[tuple[str, str], ...]  # (node name, NodeAddr)

    @property
    def node_names(self) -> list[str]:
        return [name for name, _ in self.nodes]


@dataclass(frozen=True)
class Testbed:
    __test__ = False

    hosts: tuple[TestbedHost, ...]
    known_hosts: str
    base_image: str
    docker_host: str
    bridge_address: str
    slurm: SlurmBed | None = None
    # The label value (org.flagperf.owner) of this bed's containers: up.sh removes the leftovers carrying it, and only
    # those; "" for a bed written before it had one.
    container_owner: str = ""

    def ssh_argv(self, host: TestbedHost, *remote: str) -> list[str]:
        return host.ssh_argv(self.known_hosts, *remote)


def testbed_path() -> Path:
    """FLAGPERF_TESTBED (a testbed.json), else the one up.sh writes."""
    return Path(os.environ.get("FLAGPERF_TESTBED") or DEFAULT_PATH)


def load_testbed(path: Path | None = None) -> Testbed | None:
    """The test bed described by ``path`` (default: ``testbed_path()``); None when there is none.
    A file that is there but malformed raises ValueError: a broken bed is not a missing one."""
    path = path or testbed_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        doc: dict[str, Any] = json.loads(text)
        hosts = tuple(TestbedHost(**{**h, "port": int(h["port"])}) for h in doc["hosts"])
        slurm = doc.get("slurm")
        return Testbed(hosts=hosts, known_hosts=doc["known_hosts"], base_image=doc["base_image"],
                       docker_host=doc["docker_host"], bridge_address=doc["bridge_address"],
                       slurm=SlurmBed(partition=slurm["partition"], shared_dir=slurm["shared_dir"], conf=slurm["conf"],
                                      nodes=tuple((n["name"], n["address"]) for n in slurm["nodes"]))
                       if slurm else None, container_owner=str(doc.get("container_owner", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a test bed description ({exc!r}); rerun {UP_COMMAND} as root") from exc


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require_testbed(min_hosts: int = 1) -> Testbed:
    """The test bed, or the current test skipped (failed under CI=true) saying how to make one."""
    import pytest

    bed = load_testbed()
    if bed is not None and len(bed.hosts) >= min_hosts:
        return bed
    command = UP_COMMAND if min_hosts <= 3 else f"{UP_COMMAND} {min_hosts}"
    found = "no test bed" if bed is None else f"a test bed of {len(bed.hosts)} hosts, {min_hosts} needed,"
    reason = f"{found} at {testbed_path()}: run {command} as root"
    if in_ci():
        pytest.fail(f"CI=true and {reason} (CI must not skip the real-parts tests)", pytrace=False)
    pytest.skip(reason)


def require_slurm(min_nodes: int = 2) -> tuple[Testbed, SlurmBed]:
    """The test bed with its Slurm cluster, or the current test skipped (failed under CI=true)."""
    import pytest

    bed = require_testbed(1)
    if bed.slurm is not None and len(bed.slurm.nodes) >= min_nodes:
        return bed, bed.slurm
    found = "no Slurm cluster" if bed.slurm is None else f"{len(bed.slurm.nodes)} Slurm nodes, {min_nodes} needed,"
    reason = f"{found} in the test bed at {testbed_path()}: run {UP_COMMAND} as root"
    if in_ci():
        pytest.fail(f"CI=true and {reason} (CI must not skip the real-parts tests)", pytrace=False)
    pytest.skip(reason)


def make_testbed_fixture(min_hosts: int = 1, *,
                    scope: Literal["session", "package", "module", "class", "function"] = "session",
                    name: str | None = None) -> Callable[..., Testbed]:
    """A pytest fixture giving the test bed, for a conftest.py:

        from tests.testbed import make_testbed_fixture
        testbed = make_testbed_fixture(min_hosts=3)
    """
    import pytest

    def _testbed() -> Testbed:
        return require_testbed(min_hosts)

    return pytest.fixture(scope=scope, name=name)(_testbed)


# Folders of a checkout that are not part of the project a host runs.
# At the project root only (flagperf/results is code, results/ is run output), and caches anywhere.
NOT_DEPLOYED_AT_ROOT = {".git", ".venv", "results", "result", "build", ".whl", ".pydeps"}
NOT_DEPLOYED = {"__pycache__", ".pytest_cache", ".ruff_cache"}


@contextmanager
def host_shared_folder(prefix: str, mode: int) -> Iterator[Path]:
    """A folder under /tmp with ``mode`` for the test hosts' user (the hosts share this machine's file system),
    removed afterwards."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    folder.chmod(mode)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def deploy_project(source: Path, bed: Testbed, name: str = "flagperf", target: Path | None = None) -> Path:
    """Copy the project to the test hosts' deploy path (FlagPerf's FLAGPERF_PATH), readable by their user,
    and return it. The hosts run this copy, not the checkout under test: the checkout may sit where the
    hosts' user cannot read (a CI clone under /root), and a real host has its own deployment too. The
    copy is replaced whole (a new folder, then a rename), so a host never sees half of it. name, or target: a
    deploy folder of its own, for a test whose rounds must run this checkout while other sessions deploy theirs."""
    import shutil

    target = target or Path(bed.known_hosts).parent / "deploy" / name
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, symlinks=True,
                    ignore=lambda folder, names: [
                        n for n in names if n in NOT_DEPLOYED or n.endswith(".egg-info")
                        or (n in NOT_DEPLOYED_AT_ROOT and Path(folder) == source)])
    for folder in (staging, *[p for p in staging.rglob("*") if p.is_dir()]):
        folder.chmod(0o755)
    for item in staging.rglob("*"):
        if item.is_file() and not item.is_symlink():
            item.chmod(item.stat().st_mode | 0o444)
    staging.parent.chmod(0o755)
    old = target.with_name(f".{target.name}.old.{os.getpid()}")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def sshd_pid(bed: Testbed, host: TestbedHost) -> int:
    """The pid of a host's sshd (up.sh starts it with `ip netns exec`, in a mount namespace of its own that every
    session it opens inherits: the host's processes and its SFTP see that namespace's mounts)."""
    return int((Path(bed.known_hosts).parent / "hosts" / host.name / "sshd.pid").read_text().strip())


def in_host_namespace(bed: Testbed, host: TestbedHost, *argv: str) -> subprocess.CompletedProcess[str]:
    """argv run as root in the host's mount namespace (its network namespace is not needed for files)."""
    return subprocess.run(["nsenter", "-t", str(sshd_pid(bed, host)), "-m", "--", *argv], capture_output=True,
                          text=True, timeout=120)


@contextmanager
def tmpfs_on_host(bed: Testbed, host: TestbedHost, folder: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``folder`` as the host sees it (mounted in its sshd's mount namespace only:
    this machine sees the empty folder beneath), owned by the host's user, mode 0700 as a work root must be.
    Real ENOSPC on the host, nothing faked; unmounted after. Skips where this process cannot (not root, no
    nsenter); fails under CI=true instead."""
    import pwd

    import pytest

    problem = "mounting on a test host needs root" if os.geteuid() != 0 else None
    if problem is None:
        user = pwd.getpwnam(host.user)
        folder.mkdir(parents=True, exist_ok=True)
        done = in_host_namespace(bed, host, "mount", "-t", "tmpfs", "-o",
                                 f"size={size},uid={user.pw_uid},gid={user.pw_gid},mode=0700", "tmpfs", str(folder))
        problem = done.stderr.strip() if done.returncode else None
    if problem:
        if in_ci():
            pytest.fail(f"CI=true and cannot mount a tmpfs on host {host.name}: {problem}", pytrace=False)
        pytest.skip(f"cannot mount a tmpfs on host {host.name}: {problem}")
    try:
        yield folder
    finally:
        in_host_namespace(bed, host, "umount", "--lazy", str(folder))  # a session may still have a file open


def fill_on_host(bed: Testbed, host: TestbedHost, folder: Path) -> Path:
    """Every free block of ``folder``'s file system on the host taken by one file (``ballast``), as another job
    there would; removing it (``in_host_namespace(..., "rm", path)``) gives the space back."""
    code = "import sys; from pathlib import Path; from tests.unit.mounts import fill_to_the_last_block; " \
           "print(fill_to_the_last_block(Path(sys.argv[1])))"
    done = in_host_namespace(bed, host, "env", f"PYTHONPATH={Path(__file__).resolve().parents[2]}", sys.executable,
                             "-c", code, str(folder))
    if done.returncode:
        raise RuntimeError(f"filling {folder} on {host.name} failed: {done.stderr.strip()}")
    return Path(done.stdout.strip())
