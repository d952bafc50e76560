"""The files a configuration names: read only when they are regular files, and kept inside their folders.

A FIFO, a device or a folder given where a config file is expected is refused before it is opened
(opening a FIFO to read blocks until a writer comes; /dev/zero never ends); a path that resolves outside
the folder it must stay in (``../x``, an absolute path, a symbolic link pointing out) is refused by name.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT
from flagperf.results.bounded import MAX_FILE_BYTES as MAX_FILE_BYTES
from flagperf.results.bounded import read_config_text as read_config_text
from flagperf.results.bounded import regular_file_problem


def is_present(path: Path) -> bool:
    """An optional config file is there: anything at the path, a dangling link or a FIFO included (reading it
    then says what is wrong), never silently skipped as is_file() would."""
    return path.exists() or path.is_symlink()


def resolved(path: Path) -> Path:
    """``path`` with every link followed; OSError (ELOOP) for a link loop on every Python: before 3.13 resolve()
    raises RuntimeError, from 3.13 on it stops quietly at the loop and returns a path that is still a link."""
    try:
        target = path.resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, "a link loop", str(path)) from None
    try:
        still_a_link = target.is_symlink()
    except OSError:  # a name too long to look up (ENAMETOOLONG): no loop; the caller says where it leads
        still_a_link = False
    if still_a_link:
        raise OSError(errno.ELOOP, "a link loop", str(path))
    return target


def inside(folder: Path, relative: str | Path, source: str, key: str | None, what: str) -> Path:
    """``folder / relative`` resolved (links followed), refused when it leaves ``folder``; ``what`` names the
    folder in the error ("the case folder")."""
    try:
        target, root = resolved(folder / relative), resolved(folder)
    except OSError:  # a link loop
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


def _local(value: str | None) -> str | None:
    if value is not None and not Path(value).exists():
        raise ValueError(f"{value} does not exist (only local files are read)")
    return value


# A case's data or checkpoint path (flagperf.training.data re-exports it for case code): a local file or none.
LocalPath = Annotated[str | None, AfterValidator(lambda value: _local(value))]
