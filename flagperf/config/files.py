"""The files a configuration names: read only when they are regular files, and kept inside their folders.

A FIFO, a device or a folder given where a config file is expected is refused before it is opened
(opening a FIFO to read blocks until a writer comes; /dev/zero never ends); a path that resolves outside
the folder it must stay in (``../x``, an absolute path, a symbolic link pointing out) is refused by name.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT, display_path

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


def is_present(path: Path) -> bool:
    """An optional config file is there: anything at the path, a dangling link or a FIFO included (reading it
    then says what is wrong), never silently skipped as is_file() would."""
    return path.exists() or path.is_symlink()


def inside(folder: Path, relative: str | Path, source: str, key: str | None, what: str) -> Path:
    """``folder / relative`` resolved (links followed), refused when it leaves ``folder``; ``what`` names the
    folder in the error ("the case folder")."""
    try:
        target, root = (folder / relative).resolve(), folder.resolve()
    except (RuntimeError, OSError):  # a link loop: RuntimeError before Python 3.13, OSError (ELOOP) after
        raise ConfigError(source, key, f"{str(relative)!r}: a link that leads back to itself (a loop)") from None
    if not target.is_relative_to(root):
        try:
            link = any(p.is_symlink() for p in _within(folder, relative))
        except OSError:  # a name too long to look up (ENAMETOOLONG): no link there, and outside all the same
            link = False
        how = f"a link to {target}" if link else f"resolves to {target}"
        raise ConfigError(source, key, f"{str(relative)!r} is outside {what} ({how}): it must stay inside {what}")
    return target


def _within(folder: Path, relative: str | Path) -> list[Path]:
    """The paths from folder down to folder/relative (each may be a link)."""
    path, found = folder, []
    for part in Path(relative).parts:
        path = path / part
        found.append(path)
    return found


def given_name(path: Path) -> str:
    """A path as given (links not followed), relative to the project when inside it: an error about a link
    names the link, not its target (display_path resolves)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def regular_file(folder: Path, relative: str | Path, source: str, key: str | None, what: str) -> Path:
    """``relative`` (a file a config names) resolved inside ``folder`` (called ``what`` in errors), and a regular
    file; anything else is one ConfigError line naming ``source`` and ``key``."""
    target = inside(folder, relative, source, key, what)
    problem = regular_file_problem(target)
    if problem == "file not found":
        raise ConfigError(source, key, f"{str(relative)!r} does not exist in {given_name(folder)}")
    if problem:
        raise ConfigError(source, key, f"{str(relative)!r}: {problem}")
    return target


def hash_file(digest: Any, path: Path) -> None:
    """``path``'s bytes into ``digest`` (a hashlib object), read in 1 MiB pieces: a tree hashed for a content key
    may hold large files (wheels, archives), never read whole into memory."""
    with path.open("rb") as handle:
        for piece in iter(lambda: handle.read(1 << 20), b""):
            digest.update(piece)
