"""Where the project's plug-in folders live: cases, vendors and suites are found by folder, not by import."""

from __future__ import annotations

import os
import re
from pathlib import Path

# Resolved once: case and monitor processes run with the project root as their working directory.
PROJECT_ROOT = Path(os.environ.get("FLAGPERF_HOME", Path(__file__).resolve().parents[1])).resolve()

# Set by `flagperf server` for its worker: the results folder it serves read-only over HTTP, and its address,
# so that a run's report is linked from the Prefect UI.
RESULTS_URL_ENV, RESULTS_ROOT_ENV = "FLAGPERF_RESULTS_URL", "FLAGPERF_RESULTS_ROOT"
RESULTS_DIR_ENV = "FLAGPERF_RESULTS_DIR"  # the folder runs started from a server write to (its site serves it)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # \Z: "$" would let a trailing newline through


def search_path_folders(env_var: str) -> list[Path]:
    """The extra folders ``env_var`` names (os.pathsep separated; a relative one from the working folder), in order."""
    return [Path(p).resolve() for p in os.environ.get(env_var, "").split(os.pathsep) if p]


def _search_path(default: Path, env_var: str) -> list[Path]:
    """The project's own folder first, then extra folders from ``env_var``."""
    return [default, *search_path_folders(env_var)]


CASE_PATH_ENV = "FLAGPERF_CASE_PATH"  # case folders outside the project (a lab's own cases)


def case_roots() -> list[Path]:
    return _search_path(PROJECT_ROOT / "cases", CASE_PATH_ENV)


VENDOR_PATH_ENV = "FLAGPERF_VENDOR_PATH"  # vendor folders outside the project (a vendor's own repository)


def vendor_roots() -> list[Path]:
    return _search_path(PROJECT_ROOT / "vendor_images", VENDOR_PATH_ENV)


def suite_roots() -> list[Path]:
    return _search_path(PROJECT_ROOT / "deployments" / "suites", "FLAGPERF_SUITE_PATH")


def display_path(path: Path) -> str:
    """A path relative to the project when it lies inside it: shorter error messages, same meaning."""
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT.resolve()))
    except ValueError:
        return str(path)
