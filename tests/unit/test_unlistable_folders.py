"""links_leaving's findings on folders it cannot list, without root: os.scandir (os.walk's listing) refuses chosen
folders with EACCES, as a folder of mode 000 does for a user without CAP_DAC_OVERRIDE. The same behaviour from a
real EACCES (root with setpriv only): tests/unit/test_container_policy.py."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flagperf.hosts.local import links_leaving
from flagperf.hosts.vendorcheck import links_out_of_vendor_folder

DENIED = "EACCES: Permission denied"


@pytest.fixture
def refuse(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """refuse(*folders, lstat=False): listing any of them fails with EACCES (lstat of them too, where asked: a
    folder whose parent is listed but not entered)."""
    def setup(*folders: Path, lstat: bool = False) -> None:
        closed = {os.fspath(folder) for folder in folders}
        scandir, real_lstat = os.scandir, os.lstat

        def refused(path: Any) -> None:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))

        monkeypatch.setattr(os, "scandir", lambda path=".": refused(path) if os.fspath(path) in closed
                            else scandir(path))
        if lstat:
            monkeypatch.setattr(os, "lstat", lambda path, **kw: refused(path) if os.fspath(path) in closed
                                else real_lstat(path, **kw))
    return setup


def test_no_more_unlistable_folders_than_the_limit(tmp_path: Path, refuse: Callable[..., None]) -> None:
    """15 folders it cannot list, limit 10: each was added past the limit (15 findings)."""
    case = tmp_path / "case"
    folders = [case / f"d{i:02}" for i in range(15)]
    for folder in folders:
        folder.mkdir(parents=True)
    refuse(*folders)
    assert links_leaving(str(case), limit=10) == [[f"d{i:02}", "", DENIED] for i in range(10)]


def test_an_unlistable_scanned_folder_is_named_as_itself(tmp_path: Path, refuse: Callable[..., None]) -> None:
    """The scanned folder itself unlistable: named '.', and vendor check's part filter (cases/y) keeps it, naming
    the folder (it was '<folder>/.', which the filter dropped)."""
    vendor = tmp_path / "acme"
    (vendor / "cases" / "y").mkdir(parents=True)
    refuse(vendor)
    assert links_leaving(str(vendor)) == [[".", "", DENIED]]
    lines = [str(error) for error in links_out_of_vendor_folder(vendor, "cases/y")]
    assert len(lines) == 1 and lines[0].startswith(f"{vendor}: ") and "cannot be looked at" in lines[0], lines


@pytest.mark.parametrize("lstat", [False, True], ids=["listed-not-entered", "not-looked-at"])
def test_an_unlistable_folder_on_the_way_to_only_is_named_once(tmp_path: Path, refuse: Callable[..., None],
                                                              lstat: bool) -> None:
    """``only=engines/onnxruntime`` with engines/ unlistable: what is on the way is unknown, so it is a finding,
    once (where its own lstat failed too, its parent's listing names it before the walk tries to enter it)."""
    vendor = tmp_path / "acme"
    (vendor / "engines" / "onnxruntime").mkdir(parents=True)
    (vendor / "cases").mkdir()
    refuse(vendor / "engines", vendor / "cases", lstat=lstat)  # cases/: not on the way, never entered
    assert links_leaving(str(vendor), only="engines/onnxruntime") == [["engines", "", DENIED]]
    lines = [str(error) for error in links_out_of_vendor_folder(vendor, "engines/onnxruntime")]
    assert len(lines) == 1 and lines[0].startswith(f"{vendor / 'engines'}: "), lines
