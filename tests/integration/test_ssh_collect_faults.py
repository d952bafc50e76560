"""Collecting from an SSH host when things go wrong: its files are read bounded (a huge file is refused unread, a
log's end is read without the rest, a FIFO is never waited on), and a link that drops mid-copy is an SshError (an
OSError, which the collection turns into "kept on the host" for a retry), never a paramiko error of its own."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.ssh import SshError, SshHost
from tests.testbed.bed import Testbed, make_testbed_fixture

pytestmark = pytest.mark.integration
testbed = make_testbed_fixture(min_hosts=1)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(testbed: Testbed) -> Iterator[SshHost]:
    bed_host = testbed.hosts[0]
    ssh = SshHost(HostSpec.model_validate({
        "name": bed_host.name, "address": bed_host.address, "port": bed_host.port, "user": bed_host.user,
        "key_file": Path(bed_host.key_file), "known_hosts": Path(testbed.known_hosts), "python": bed_host.python,
        "project_root": str(ROOT), "connect_timeout_s": 5}))
    try:
        yield ssh
    finally:
        ssh.close()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the test hosts' user can read (the hosts share this machine's file system)."""
    folder = Path(tempfile.mkdtemp(prefix="flagperf-ssh-faults-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
