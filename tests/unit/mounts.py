"""Real file systems for fault tests (a full disk, a read-only mount), shared by the unit tests."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


@contextmanager
def mounted_tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A real tmpfs at ``folder`` (e.g. "size=1m", "ro,size=1m"): real ENOSPC and EROFS, no faking.
    Skips where this process cannot mount (not root, or no mount permission)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def fill_to_the_last_block(folder: Path) -> Path:
    """Take every free block of ``folder``'s file system with one file (fallocate: nothing is written), as
    another job on the machine would; returns the file, whose removal gives the space back."""
    ballast = folder / "ballast"
    with ballast.open("ab") as handle:
        size, chunk = 0, 1 << 30
        while chunk >= 512:
            try:
                os.posix_fallocate(handle.fileno(), size, chunk)
                size += chunk
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    return ballast


@contextmanager
def data_folder() -> Iterator[Path]:
    """A real folder under a data root of the container policy (/mnt), as a host's dataset would be, removed after.
    tmp_path lies under /tmp, which the policy never mounts. Skips where /mnt is not writable (CI runs as root)."""
    import shutil
    import tempfile

    try:
        folder = Path(tempfile.mkdtemp(prefix="flagperf-test-", dir="/mnt"))
    except OSError as exc:
        if os.environ.get("CI", "").lower() in {"true", "1", "yes"}:
            pytest.fail(f"CI=true and /mnt is not writable ({exc.strerror}): a data root is needed", pytrace=False)
        pytest.skip(f"/mnt is not writable here ({exc.strerror}); a data folder must lie under a data root")
    folder.chmod(0o755)  # a test host's user reads it, as a dataset
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def unenterable(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``folder`` made a folder this user cannot enter (mode 0) for the block; root enters it all the same, so
    there the kernel's refusal (EACCES) is given by os.stat for every path behind it, links followed."""
    real_stat = os.stat

    def refused(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        followed = os.path.realpath(path) if kwargs.get("follow_symlinks", True) else os.fspath(path)
        if isinstance(followed, str) and followed.startswith(f"{folder}/"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_stat(path, *args, **kwargs)

    with monkeypatch.context() as patched:
        if os.geteuid() == 0:
            patched.setattr(os, "stat", refused)
        folder.chmod(0)
        try:
            yield folder
        finally:
            folder.chmod(0o755)
