"""Whether the controller running a run is still there: controller.lock in the run folder.

A run killed hard (SIGKILL, a power cut) leaves neither summary.json nor an interruption record, and read as "not
finished (yet)" forever. The controller opens controller.lock as it starts, takes a write lock on it (an open file
description lock, fcntl F_OFD_SETLK: owned by that open file, not by the process) and writes its record there in
place: which machine and boot, its pid, when, its flow run. It holds the lock until it ends: the kernel lets go of it
when the process ends, however it ends. An attempt that ends on its own (an error, Ctrl-C) without writing the run's
summary says so in the record before it lets go ("ended", "how"), so that it never reads as killed.

A reader tests the lock (F_OFD_GETLK) without taking it, so that reading never stands in a controller's way, then
reads the record. A lock held: the run may still be going. Free, with a record saying the controller ended: it
ended before its summary. Free, with a running controller's record of this host and boot (the same boot id: the same
kernel, whose lock table it is) and no process of its pid: the controller is gone (killed). Of this machine (its
machine id) but an earlier boot: the machine restarted under it. Otherwise (another machine: locks need not be seen
across machines; no machine id to tell a restart; no record, as in a run folder written before it existed; a system
without open file description locks) nothing is said. A second controller of the same run is refused while the
first holds the lock: reliably on the same machine, or across machines on a shared file system with network locks
(NFS with lockd or v4); on one without, two machines' controllers are not kept apart.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flagperf.errors import FlagperfError, printable
from flagperf.paths import outermost_missing, remove_made

CONTROLLER_FILE = "controller.lock"
MAX_RECORD_BYTES = 4096  # a few short fields: anything larger is no record of this engine's
# Each record is written over the last in one write of this size (padded with spaces, which JSON skips): over blocks
# the file has, so the record an attempt writes as it ends rarely needs free space (on a copy-on-write file system it
# does; where it cannot be written the record is emptied, which says nothing)
RECORD_BYTES = 1024
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
# errnos of a lock refused because another open file holds it
HELD_ERRNOS = (errno.EAGAIN, errno.EACCES)
# Open file description locks: the kernel's numbers, the same on every Linux architecture, where Python lacks the names
# (built against glibc before 2.20); none elsewhere (macOS): then no lock is taken and readers say nothing
# (the struct below is 64-bit Linux's: a 32-bit build takes no lock rather than pass the kernel a wrong layout)
_LINUX = sys.platform.startswith("linux") and struct.calcsize("P") == 8
F_OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", 36) if _LINUX else None
F_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", 37) if _LINUX else None
# struct flock of 64-bit Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid (int), 32 bytes
FLOCK = struct.Struct("hh4xqqi4x")

log = logging.getLogger(__name__)

# The records this process holds, by open file: (device, inode). Read before any open (this process's own run is
# running), and closed in a child forked without exec (it must not keep the lock once this process is gone).
_held: dict[int, tuple[int, int]] = {}


def _forget_in_child() -> None:
    for fd in list(_held):
        with suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class RunHeld(FlagperfError):
    """Another controller, alive, is running this run folder: a second one would write over its files."""


def run_held(run_dir: Path, holder: str) -> RunHeld:
    """The one line refusing a second controller of ``run_dir``; ``holder`` as held_by says it."""
    return RunHeld(f"{run_dir}: another controller is running this run ({holder}); wait for it to end, or stop it, "
                   f"before retrying; if that machine is gone, remove {run_dir / CONTROLLER_FILE}")


@dataclass(frozen=True)
class ControllerGone:
    """The controller of a run without its summary is no longer there. ``killed``: it went without a word (SIGKILL,
    a power cut, its machine restarted); else it ended on its own before writing the summary (an error, Ctrl-C).
    ``text``: which controller and how, for a line about the run."""

    killed: bool
    text: str


def _whole_file(kind: int) -> bytes:
    return FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0)


def _take_lock(fd: int) -> bool:
    """The write lock on the whole file, without waiting: False where another open file holds a lock on it. OSError
    where the file system (or the system) takes none."""
    if F_OFD_SETLK is None:
        raise OSError(errno.ENOTSUP, "no open file description locks on this system")
    try:
        fcntl.fcntl(fd, F_OFD_SETLK, _whole_file(fcntl.F_WRLCK))
    except OSError as exc:
        if exc.errno in HELD_ERRNOS:
            return False
        raise
    return True


def _lock_held(fd: int) -> bool | None:
    """Whether another open file holds a write lock on ``fd``'s file (tested, never taken: a controller starting
    meanwhile is not refused for it); None where the file system (or the system) cannot tell."""
    if F_OFD_GETLK is None:
        return None
    try:
        answer = fcntl.fcntl(fd, F_OFD_GETLK, _whole_file(fcntl.F_RDLCK))
    except OSError:
        return None
    return FLOCK.unpack(answer)[0] != fcntl.F_UNLCK


def _first_line(path: Path) -> str:
    with suppress(OSError, UnicodeDecodeError):
        return path.read_bytes()[:256].decode("ascii").strip()
    return ""


def this_machine() -> dict[str, str]:
    """This machine as a record names it: its host name, a tag of its machine id (a hash: the id itself is meant to
    stay private), '' where it has none (some containers), and the id of its current boot ('' where unknown)."""
    tag = ""
    for path in MACHINE_ID_FILES:
        if machine_id := _first_line(path):
            tag = hashlib.sha256(f"flagperf controller {machine_id}".encode()).hexdigest()[:32]
            break
    return {"host": socket.gethostname(), "machine": tag, "boot": _first_line(BOOT_ID_FILE)}


def read_record(handle: Any) -> dict[str, Any] | None:
    """The record in an open controller.lock (read from its start), None where it is not one (cut short or being
    written, too large, other fields, a read error)."""
    try:
        handle.seek(0)
        data = handle.read(MAX_RECORD_BYTES + 1)
    except OSError:
        return None
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
            and isinstance(record.get("boot", ""), str) and isinstance(record.get("how", ""), str)
            and isinstance(pid, int) and not isinstance(pid, bool) and pid > 0):
        return None
    return record


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """Which file is at ``path`` (device, inode, size, time), None where none is: a summary written meanwhile is
    another."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _written_since(summary: Path, record: os.stat_result) -> bool:
    """Whether ``summary`` was written after the record last was: by the controller that wrote the record (an earlier
    attempt's summary is older than its retry's record). The same time counts as after: then nothing is said."""
    try:
        info = os.stat(summary, follow_symlinks=False)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_mtime_ns >= record.st_mtime_ns


def controller_gone(run_dir: Path, summary: Path) -> ControllerGone | None:
    """Whether the controller of the run in ``run_dir``, whose summary (``summary``) its callers found missing, is
    gone, as the run folder's record says it: its lock held by nobody, and either the record says its controller
    ended (an error, Ctrl-C: it said so) or it is one of this machine (killed, or this machine restarted since). None
    where the controller may still be running, or nothing says: no record (an older run), one not readable, one of
    another machine or of a machine with no id, a lock held, a file system that cannot tell, a summary written
    meanwhile."""
    path = run_dir / CONTROLLER_FILE
    try:
        info = os.stat(path, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    if (info.st_dev, info.st_ino) in _held.values():  # this process runs it
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or _lock_held(fd) is not False:
            return None
        # Read once the lock is seen free: a controller writes its last record before it lets go
        record = read_record(handle)
        # A retry that took the lock meanwhile (the record read may be its own), or the summary written meanwhile
        if record is None or _lock_held(fd) is not False or _written_since(summary, os.fstat(fd)):
            return None
    who = f"its controller (pid {record['pid']} on {printable(record['host'])})"
    if "ended" in record:  # it said so itself, as it ended: whichever machine it ran on
        how = record.get("how") or "returned"
        return ControllerGone(False, f"{who} ended without writing it" if how == "returned" else
                              f"{who} stopped by {printable(how)} before writing it")
    here = this_machine()
    boot = record.get("boot", "")
    if record["host"] != here["host"] or not boot or not here["boot"]:
        return None  # another machine's lock need not be seen from here
    if boot == here["boot"]:  # the same kernel, whose lock table said free
        return None if _process_there(record["pid"]) else ControllerGone(True, f"{who} is gone: killed, or its "
                                                                              f"machine stopped")
    if here["machine"] and record["machine"] == here["machine"]:  # with no machine id, no machine is known
        return ControllerGone(True, f"{who} is gone: its machine restarted since")
    return None


def _process_there(pid: int) -> bool:
    """Whether a process of ``pid`` runs on this machine: a run folder copied while its controller ran holds its
    record but not its lock."""
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's
        return True
    except (OSError, OverflowError):
        return False
    return True


def held_by(path: Path) -> str | None:
    """'pid N on HOST, since WHEN' where a controller holds ``path``'s lock now, else None (no record, nobody holds
    it as far as this machine sees, a file system that cannot tell)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not _lock_held(fd):
            return None
        return _holder(read_record(handle))


def _holder(record: dict[str, Any] | None) -> str:
    if record is None:  # being written this moment, not this engine's, or a read error
        return "its record not readable"
    return f"pid {record['pid']} on {printable(record['host'])}, since {printable(str(record.get('started')))}"


def _write_record(fd: int, record: dict[str, Any]) -> None:
    """``record`` over the one in ``fd``, in one write from its start, flushed."""
    data = json.dumps(record).encode()
    data += b" " * (RECORD_BYTES - 1 - len(data)) + b"\n"
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(errno.ENOSPC, "record written in part")
    os.ftruncate(fd, len(data))  # a longer one written before (not by this engine): its tail is no part of it
    os.fsync(fd)


def _open_held(path: Path) -> int | None:
    """controller.lock opened and locked by this process: its fd. RunHeld where another controller holds it; None
    (said in the log) where it cannot be (a full disk, a file system without locks, something else at its name)."""
    replaced = False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except PermissionError:
            # Another user's record (a retry by someone else): replaced where nobody holds it, else it would say
            # this running attempt was killed
            holder = held_by(path)
            if holder is not None:
                raise run_held(path.parent, holder) from None
            if not replaced:
                replaced = True
                with suppress(OSError):
                    path.unlink()
                continue
            log.info("%s could not be made: a run killed hard will read as not finished", path)
            return None
        except OSError as exc:
            log.info("%s could not be made (%s): a run killed hard will read as not finished rather than as "
                     "ended", path, exc.strerror or exc)
            return None
        try:
            _held[fd] = (-1, -1)  # at once: a child forked meanwhile (another thread) closes it too
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                _close(fd)
                log.info("%s is not a file: a run killed hard will read as not finished", path)
                return None
            if not _take_lock(fd):
                holder = _holder(None)
                with suppress(OSError), open(fd, "rb", closefd=False) as handle:
                    holder = _holder(read_record(handle))
                _close(fd)
                raise run_held(path.parent, holder)
            # The file locked is the one at the name (not one removed or replaced since it was opened): else again
            named = _identity(path)
            if named is None or named[:2] != (info.st_dev, info.st_ino):
                _close(fd)
                continue
        except RunHeld:
            raise
        except OSError as exc:  # a file system without locks: readers cannot tell either
            # emptied: an earlier attempt's record there would say this running one was killed
            _close(fd, empty=True)
            log.info("%s could not be locked (%s): a run killed hard will read as not finished", path,
                     exc.strerror or exc)
            return None
        except BaseException:  # an interrupt meanwhile: the lock goes with the file
            _close(fd)
            raise
        _held[fd] = (info.st_dev, info.st_ino)
        return fd


def _close(fd: int, empty: bool = False) -> None:
    """Close ``fd`` (of _open_held), which lets go of its lock; ``empty``: first empty the file, which then says
    nothing."""
    try:
        if empty:
            with suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        _held.pop(fd, None)
        os.close(fd)


def _how(exc: BaseException | None) -> str:
    """How an attempt ended, in a record's words: "returned", the signal that stopped it, or its exception's type."""
    if exc is None:
        return "returned"
    signum = getattr(exc, "signal", None)  # Prefect's TerminationSignal carries the signal
    with suppress(ValueError, TypeError):
        return signal.Signals(signum).name
    return type(exc).__name__[:100]


@contextmanager
def controller_record(run_dir: Path, summary: Path, flow_run_id: str | None = None) -> Iterator[None]:
    """Hold controller.lock in ``run_dir`` while the run runs in this process. RunHeld where another controller holds
    it now (a retry of a run still running), as far as this machine can see. Where this attempt ends without
    writing ``summary`` (the run's summary.json), its record says so, with how it ended, before it lets go. Where the
    record cannot be written (a full disk) the run goes on without it: holding the lock, nothing it reads says
    killed. ``run_dir`` is made where missing (a run started from a server's UI or a deployment); where this attempt
    made it and it holds nothing else as the attempt ends (a run refused as bad input), it goes with its record."""
    path = run_dir / CONTROLLER_FILE
    before = _identity(summary)
    made = outermost_missing(run_dir)
    if made is not None:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError:  # said where the record cannot be made
            remove_made(run_dir, made)
        except BaseException:
            remove_made(run_dir, made)
            raise
    try:
        fd = _open_held(path)
    except BaseException:
        remove_made(run_dir, made)
        raise
    record = {**this_machine(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "flow_run_id": flow_run_id}
    if fd is not None:
        try:
            _write_record(fd, record)
        except OSError as exc:  # held all the same: read as a run going on, never as killed
            log.info("%s could not be written (%s)", path, exc.strerror or exc)
        except BaseException:
            _end(fd, run_dir, made)
            raise
    ended: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        ended = exc
        raise
    finally:
        if fd is None:
            if made is not None and _only_record(run_dir):  # a record opened, never locked (emptied)
                with suppress(OSError):
                    path.unlink()
            remove_made(run_dir, made)  # only what is empty
        else:
            written = _identity(summary)
            _end(fd, run_dir, made, None if written is not None and written != before else
                 {**record, "ended": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "how": _how(ended)})


def _end(fd: int, run_dir: Path, made: Path | None, last: dict[str, Any] | None = None) -> None:
    """The attempt holding ``fd`` ends: a run folder it made holding nothing but its record goes (the record removed
    while its lock is held: no retry took it meanwhile), else ``last`` is written over the record (_let_go)."""
    if made is not None and _only_record(run_dir):
        with suppress(OSError):
            (run_dir / CONTROLLER_FILE).unlink()
        _let_go(fd)
        remove_made(run_dir, made)
    else:
        _let_go(fd, last)


def _only_record(run_dir: Path) -> bool:
    try:
        with os.scandir(run_dir) as entries:
            return [entry.name for entry in entries] == [CONTROLLER_FILE]
    except OSError:
        return False


def _let_go(fd: int, last: dict[str, Any] | None = None) -> None:
    """Close ``fd``, which lets go of its lock; first write ``last`` over the record where given (the attempt ended
    without its summary). Where that cannot be written, the record is emptied: it then says nothing, never that a
    controller that ended was killed."""
    try:
        if last is not None:
            try:
                _write_record(fd, last)
            except OSError:
                with suppress(OSError):
                    os.ftruncate(fd, 0)
    finally:
        _close(fd)
