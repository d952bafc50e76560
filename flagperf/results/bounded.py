"""Files read whole only when they are regular and small enough: a config file, or a record a run folder holds.

Opening a FIFO to read blocks until a writer comes, /dev/zero never ends, and a file of gigabytes fills memory:
each is refused in one line naming the file, before it is opened where the metadata tells, and again on the
opened file (the path may have changed since). In the results layer, the lowest that reads files, so that results,
config and the site read alike (flagperf.config.files re-exports the config-file reader).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from flagperf.errors import ConfigError
from flagperf.paths import display_path

# A config file is small (the project's largest is a few KiB): far above any real one, far below what would
# take minutes to parse or fill memory.
MAX_FILE_BYTES = 16 * 1024 * 1024

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory, expected a file"
    kind = next((name for test, name in _KINDS if test(mode)), "something else")
    return f"not a regular file but {kind}; not read"


def regular_file_problem(path: Path, max_bytes: int = MAX_FILE_BYTES, what: str = "a config file") -> str | None:
    """Why ``path`` cannot be read as a config file (``what``, at most ``max_bytes``), or None; nothing is opened."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return "file not found" if not path.is_symlink() else "a link to nothing (file not found)"
    except OSError as exc:
        return f"cannot read: {exc.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return _not_regular(info.st_mode)
    if info.st_size > max_bytes:
        return f"{info.st_size} bytes; {what} is at most {max_bytes} bytes; not read"
    return None


def read_config_text(path: Path, source: str | None = None, key: str | None = None, max_bytes: int = MAX_FILE_BYTES,
                     what: str = "a config file") -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; anything else is one ConfigError line naming
    ``source`` (default: the file) and ``key``. ``what`` names the kind of file in the error."""
    source = source or display_path(path)
    problem = regular_file_problem(path, max_bytes, what)
    if problem:
        raise ConfigError(source, key, problem)
    try:
        # Non-blocking and checked again on the open file: the path may have become a FIFO since the stat.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(source, key, f"cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(source, key, _not_regular(mode))
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ConfigError(source, key, f"more than {max_bytes} bytes; {what} is at most that; not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(source, key, "not UTF-8 text") from None


# A record the engine writes into a run folder (plan.json lists every host and case with its settings,
# summary.json every figure): larger than a config file may be, still far below what would fill memory.
MAX_RECORD_BYTES = 4 * MAX_FILE_BYTES


def read_json_file(path: Path, max_bytes: int = MAX_RECORD_BYTES, what: str = "a run's record",
                   source: str | None = None) -> Any:
    """The JSON value of a regular file of at most ``max_bytes``, read as read_config_text reads; a file that is
    too large, not regular or not valid JSON is one ConfigError line naming it (``source``, default the file)."""
    text = read_config_text(path, source, None, max_bytes, what)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(source or display_path(path), None, f"not valid JSON ({exc}); {what} is JSON") from None
    except RecursionError:  # nesting deeper than the parser goes
        raise ConfigError(source or display_path(path), None, f"JSON nested too deeply; {what} is not") from None



def open_regular(path: Path) -> BinaryIO | None:
    """``path`` opened to read, never waiting on a FIFO; None when missing, unreadable or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        return None
    return handle


def read_end(path: Path, max_bytes: int) -> str | None:
    """The last ``max_bytes`` of a regular file as text (undecodable bytes replaced), or None when it is missing,
    unreadable or not a regular file: the end of a log or of a JSON-lines file, however long it grew, without
    reading the rest."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - max_bytes))
        return handle.read(max_bytes).decode("utf-8", errors="replace")


def read_start(path: Path, max_bytes: int) -> str | None:
    """The first ``max_bytes`` of a regular file as text (undecodable bytes replaced), or None as read_end."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        return handle.read(max_bytes).decode("utf-8", errors="replace")


def read_bounded(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, for readers that tell a missing file (OSError, as
    open raises it) from one that is no record (ValueError, one line naming the file: not a regular file, or
    larger); a FIFO is never waited on."""
    handle = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)), "rb")
    with handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{display_path(path)}: {_not_regular(info.st_mode)}")
        if info.st_size > max_bytes:  # refused unread; and read no further than the limit if it grew since
            raise ValueError(f"{display_path(path)}: more than {max_bytes} bytes; not read")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{display_path(path)}: more than {max_bytes} bytes; not read")
    return data
