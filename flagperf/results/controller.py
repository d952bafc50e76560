"""Whether the controller running a run is still there: controller.lock in the run folder.

A run killed hard (SIGKILL, a power cut) leaves neither summary.json nor an interruption record, and read as "not
finished (yet)" forever. The controller now writes controller.lock as it starts (which machine, its pid, when, its
flow run) and holds an flock on it until the run's summary is written: the kernel lets go of the lock when the process
ends, however it ends, so a lock nobody holds is a controller gone (a pid alone could be another process's by then).
A reader on the same machine asks for the lock without waiting: where it gets it, the controller is gone. On another
machine (the run folder on a shared file system) a lock need not be seen across machines, so nothing is said.
A run folder without the record (written before it existed) reads as it did.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from flagperf.errors import FlagperfError, printable
from flagperf.results.schema import atomic_path

CONTROLLER_FILE = "controller.lock"
MAX_RECORD_BYTES = 4096  # a few short fields: anything larger is no record of this engine's
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))

log = logging.getLogger(__name__)


class RunHeld(FlagperfError):
    """Another controller, alive, is running this run folder: a second one would write over its files."""


def this_machine() -> dict[str, str]:
    """This machine as a record names it: its host name, and a tag of its machine id (a hash: the id itself is
    meant to stay private), '' where it has none (some containers)."""
    tag = ""
    for path in MACHINE_ID_FILES:
        with suppress(OSError, UnicodeDecodeError):
            machine_id = path.read_bytes()[:256].decode("ascii").strip()
            if machine_id:
                tag = hashlib.sha256(f"flagperf controller {machine_id}".encode()).hexdigest()[:32]
                break
    return {"host": socket.gethostname(), "machine": tag}


def read_record(handle: Any) -> dict[str, Any] | None:
    """The record in an open controller.lock, None where it is not one (cut short, too large, other fields)."""
    data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    pid = record.get("pid")
    if not (isinstance(record.get("host"), str) and isinstance(record.get("machine"), str)
            and isinstance(pid, int) and not isinstance(pid, bool) and pid > 0):
        return None
    return record


def controller_gone(run_dir: Path) -> str | None:
    """'its controller (pid N on HOST) is gone: killed, or its machine stopped' where the run folder's record says so:
    written on this machine, by another process, and its lock held by nobody. None where the controller may still be
    running, or nothing says: no record (an older run), one not readable, one of another machine, a lock held, a
    file system that takes no locks."""
    try:
        fd = os.open(run_dir / CONTROLLER_FILE, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:  # closing it lets go of the lock asked for below
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        record = read_record(handle)
        here = this_machine()
        if record is None or record["host"] != here["host"] or record["machine"] != here["machine"]:
            return None
        # This process runs it: a lock it holds on another open file of it would not stop it asking (on a file
        # system that emulates flock with record locks), and closing this one would let go of that one
        if record["pid"] == os.getpid():
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held by the controller (EWOULDBLOCK), or no locks here: it may be running
            return None
    return (f"its controller (pid {record['pid']} on {printable(record['host'])}) is gone: killed, or its machine "
            f"stopped")


@contextmanager
def controller_record(run_dir: Path, flow_run_id: str | None = None) -> Iterator[None]:
    """Hold controller.lock in ``run_dir`` while the run runs in this process. RunHeld where another controller on
    this machine holds it now (a retry of a run still running). The record is written whole under a temporary name,
    locked, then renamed into place, so that a reader never sees half of it and the lock is there as soon as it
    is. Where it cannot be written (a full disk) the run goes on without it, and an earlier attempt's record is
    removed (it would say this running one was killed)."""
    path = run_dir / CONTROLLER_FILE
    holder = held_by(path)
    if holder is not None:
        raise RunHeld(f"{run_dir}: another controller is running this run ({holder}); wait for it to end, or stop "
                      f"it, before retrying")
    record = {**this_machine(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "flow_run_id": flow_run_id}
    fd: int | None = None
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
            # read-write: a file system that emulates flock with record locks (NFS) needs it for an exclusive one
            fd = os.open(tmp, os.O_RDWR | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file nobody else has open: never waits
    except OSError as exc:
        if fd is not None:
            os.close(fd)
            fd = None
        with suppress(OSError):
            path.unlink(missing_ok=True)
        # Said in the run's log, not on the console: the disk that refused it refuses the plan next, in one line
        log.info("%s could not be written (%s): a run killed hard will read as not finished rather than as ended",
                 path, exc.strerror or exc)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # lets go of the lock; the record stays, saying which controller ran it last


def held_by(path: Path) -> str | None:
    """'pid N on HOST, since WHEN' where a controller holds ``path``'s lock now, else None (no record, nobody holds
    it as far as this machine sees, a file system that takes no locks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        record = read_record(handle)
        if record is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"pid {record['pid']} on {printable(record['host'])}, since {printable(str(record.get('started')))}"
        except OSError:  # no locks on this file system: nothing can be told
            return None
    return None
