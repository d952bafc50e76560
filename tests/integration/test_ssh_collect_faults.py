"""Collecting from an SSH host when things go wrong: its files are read bounded (a huge file is refused unread, a
log's end is read without the rest, a FIFO is never waited on), and a link that drops mid-copy is an SshError (an
OSError, which the collection turns into "kept on the host" for a retry), never a paramiko error of its own."""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.ssh import SshError, SshHost
from flagperf.results.schema import KEPT_ON_HOST, read_result
from tests.testbed.bed import Testbed, deploy_project, host_shared_folder, make_testbed_fixture

pytestmark = pytest.mark.integration
testbed = make_testbed_fixture(min_hosts=1)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(testbed: Testbed) -> Iterator[SshHost]:
    bed_host = testbed.hosts[0]
    ssh = SshHost(HostSpec.model_validate({
        "name": bed_host.name, "address": bed_host.address, "port": bed_host.port, "user": bed_host.user,
        "key_file": Path(bed_host.key_file), "known_hosts": Path(testbed.known_hosts), "python": bed_host.python,
        "project_root": str(ROOT), "connect_timeout_s": 30}))
    try:
        yield ssh
    finally:
        ssh.close()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the test hosts' user can read."""
    with host_shared_folder("flagperf-ssh-faults-", 0o755) as folder:
        yield folder

def test_a_hosts_files_are_read_bounded_over_ssh(host: SshHost, shared: Path) -> None:
    huge = shared / "case.log"
    with huge.open("wb") as out:  # sparse: 1 GiB that takes no disk
        out.truncate(1 << 30)
        out.seek(1 << 30)
        out.write(b"\nlast words\n")
    huge.chmod(0o644)
    with pytest.raises(ValueError, match=rf"^{host.name}:{huge}: more than 1024 bytes; not read$"):
        host.read_text(huge, max_bytes=1024)
    assert host.read_end(huge, 64).endswith("last words\n")
    assert host.tail(huge, 1) == ["last words"]
    os.mkfifo(shared / "fifo.log", 0o644)
    assert host.tail(shared / "fifo.log", 1) == []  # refused from its metadata, never opened and waited on
    with pytest.raises(ValueError, match="not a regular file"):
        host.read_text(shared / "fifo.log")


def test_a_link_that_drops_mid_copy_is_an_ssh_error(host: SshHost, shared: Path, tmp_path: Path) -> None:
    """The copy writes into a FIFO the test reads: it is caught mid-file (the FIFO holds 64 KiB), the link's
    socket is shut then, and the copy of the folder after it cannot go on."""
    remote = shared / "round"
    (remote / "sub").mkdir(parents=True)
    (remote / "a.bin").write_bytes(os.urandom(8 << 20))
    (remote / "sub" / "b.txt").write_text("b", encoding="utf-8")
    for path in (remote, remote / "sub"):
        path.chmod(0o755)
    for path in (remote / "a.bin", remote / "sub" / "b.txt"):
        path.chmod(0o644)
    local = tmp_path / "copy"
    local.mkdir()
    os.mkfifo(local / "a.bin")
    raised: list[BaseException] = []

    def fetch() -> None:
        try:
            host.fetch_tree(remote, local)
        except BaseException as exc:  # handed to the test thread
            raised.append(exc)

    copier = threading.Thread(target=fetch, daemon=True)
    copier.start()
    with (local / "a.bin").open("rb") as pipe:  # returns once the copy has opened it to write
        assert pipe.read(4096)  # the copy is under way
        transport = host.client().get_transport()
        assert transport is not None
        transport.sock.shutdown(socket.SHUT_RDWR)  # as a dropped link ends it
        while pipe.read(1 << 16):  # let the copy go on until it notices
            pass
    copier.join(timeout=120)
    assert not copier.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], SshError), repr(raised)
    assert str(raised[0]).startswith(f"host {host.name}: ") and "\n" not in str(raised[0])


class CuttingProxy:
    """A TCP relay to a host's sshd that cuts every connection through it once, when the bytes sent from the host
    pass ``cut_after``: the drop comes mid-copy of a file larger than that, by volume, not by timing."""

    def __init__(self, target: tuple[str, int], cut_after: int) -> None:
        self.target, self.cut_after, self.sent, self.cuts = target, cut_after, 0, 0
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.2", 0))  # 127.0.0.1 would be a local host
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_host: bool) -> None:
        try:
            while data := source.recv(65536):
                if from_host:
                    with self.lock:
                        self.sent += len(data)
                        if self.cuts == 0 and self.sent > self.cut_after:
                            self.cuts = 1
                            for sock in self.sockets:  # as a dropped link ends them all
                                with contextlib.suppress(OSError):
                                    sock.shutdown(socket.SHUT_RDWR)
                            return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.close()


def test_a_link_that_drops_while_a_round_is_collected_keeps_it_on_the_host_and_a_retry_collects_it(
        testbed: Testbed, shared: Path, tmp_path: Path) -> None:
    """The whole flow over a relay that drops every connection once 32 MiB came from the host: only the copy of
    the round's 64 MiB output sends that much. The round is kept on the host and the run says how to collect it;
    `--retry` then collects that very round (not run again), and the host's copy goes."""
    deployed = deploy_project(ROOT, testbed, target=shared / "deploy" / "flagperf")
    bed_host = testbed.hosts[0]
    proxy = CuttingProxy((bed_host.address, bed_host.port), cut_after=32 << 20)
    try:
        key = next(line.split()[1:3] for line in Path(testbed.known_hosts).read_text().splitlines()
                   if line.split()[0] == bed_host.address)
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.2]:{proxy.port} {' '.join(key)}\n", encoding="utf-8")
        work = shared / "work"  # the host's user's own folder, as a work root must be
        work.mkdir(mode=0o700)
        owner = pwd.getpwnam(bed_host.user)
        os.chown(work, owner.pw_uid, owner.pw_gid)
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(yaml.safe_dump({"hosts": [{
            "name": bed_host.name, "address": "127.0.0.2", "port": proxy.port, "user": bed_host.user,
            "key_file": bed_host.key_file, "known_hosts": str(known_hosts), "python": bed_host.python,
            "project_root": str(deployed), "connect_timeout_s": 30, "work_root": str(work),
            "env": {"FLAGPERF_CASE_PATH": str(deployed / "tests" / "fixtures" / "cases")}}]}), encoding="utf-8")
        results = tmp_path / "results"
        args = ["--inventory", str(inventory), "--cases", "waits", "--rounds", "1", "--set", "waits.hold_round=0",
                "--set", "waits.output_mib=64", "--results", str(results)]
        stopped = flagperf_run(args, tmp_path)

        assert stopped.returncode == 1 and proxy.cuts == 1, stopped.stdout[-3000:] + stopped.stderr[-3000:]
        assert "Traceback" not in stopped.stdout + stopped.stderr
        (run_dir,) = results.iterdir()
        stage = work / run_dir.name / "waits" / "round1" / f"{bed_host.name}_noderank0"
        measured = read_result(stage / "attempt1" / "result.json")  # kept on the host, whole
        assert measured.status == "success"
        assert not (run_dir / "waits" / "round1").exists() or not any((run_dir / "waits" / "round1").iterdir())
        assert [p for p in run_dir.rglob("*") if p.name.startswith(".")] == []  # no half copy
        assert f"{KEPT_ON_HOST} {bed_host.name}:{stage}" in (run_dir / "controller.log").read_text()
        assert "--retry" in stopped.stdout  # the console says how to go on

        retried = flagperf_run([*args, "--retry", str(run_dir)], tmp_path)
        assert retried.returncode == 0, retried.stdout[-3000:] + retried.stderr[-3000:]
        stored = read_result(run_dir / "waits" / "round1" / f"{bed_host.name}_noderank0" / "result.json")
        assert stored.model_dump(exclude={"provenance"}) == measured.model_dump(exclude={"provenance"})
        assert (run_dir / "waits" / "round1" / f"{bed_host.name}_noderank0" / "output.bin").stat().st_size == 64 << 20
        assert "collecting the round an earlier attempt measured" in (run_dir / "controller.log").read_text()
        assert not (work / run_dir.name).exists()
    finally:
        proxy.close()


def flagperf_run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(FLAGPERF_CASE_PATH=str(ROOT / "tests" / "fixtures" / "cases"), PREFECT_HOME=str(tmp_path / "ph"))
    return subprocess.run([sys.executable, "-m", "flows.cli", "run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
