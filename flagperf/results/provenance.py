"""How a number was made: engine and library versions, the git revision, the source's digest, and the
machine."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from flagperf import __version__
from flagperf.paths import (
    CASE_FOLDER,
    CASE_PATH_ENV,
    PROJECT_ROOT,
    VENDOR_FOLDER,
    VENDOR_MANIFEST,
    VENDOR_PATH_ENV,
    is_case_folder,
    search_path_folders,
    vendor_engines,
    walk_source,
)

CASE_LIBRARIES = ("torch", "numpy", "pydantic", "PyYAML", "psutil")
# Environment variables that change what a number means (threads, visible devices, math modes).
RELEVANT_ENVIRONMENT = (
    "CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
)


def git_revision() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the deployed project, or (None, None) outside a git checkout."""
    try:
        rev = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        # Untracked files count: a new case or kernel not yet committed changes what ran.
        status = subprocess.run(["git", "-C", str(PROJECT_ROOT), "status", "--porcelain"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return rev or None, bool(status.strip())


# What decides a figure: the engine, its flows and the tasks they run (every package pyproject.toml installs), the
# cases and the vendor plug-ins (not docs, tests or bench).
SOURCE_FOLDERS = ("flagperf", "flows", "tasks", "cases", "vendor_images")


def source_digest(root: Path = PROJECT_ROOT, vendor: str | None = None, cases: Sequence[str] | None = None,
                  code: Sequence[Code] | None = None) -> str | None:
    """sha256 of the code that ran, first 16 hex digits: every file of SOURCE_FOLDERS, and of the vendor and case
    folders FLAGPERF_VENDOR_PATH / FLAGPERF_CASE_PATH name beyond them (path and bytes, in path order); None if a
    file cannot be read (the figure is never lost over its label). ``vendor`` and ``cases`` (<family>/<case>): a
    run's, whose folders alone count of those search path folders (a container gets no others), and of each name
    only the copy the run uses (search_path_code: a copy an earlier place on the search path hides is never read);
    without them, those of every vendor and case a run could name, each by the same rule (source_code lists
    them). A search path folder's files are labelled by the variable
    and their path below its folder, never by where it lies, so a process on the host and a container that has the
    folder elsewhere (/flagperf-search/...) digest the same code alike. A copy deployed without git (a host's copy,
    an unpacked tree) is identified by it too, and two trees with the same commit but different local changes are
    told apart: compute it in a checkout with
    ``python -c "from flagperf.results.provenance import source_digest; print(source_digest())"``
    (a run whose vendor or cases lie on those variables: ``source_digest(vendor='acme', cases=['base/x'])``).
    What is none of the code is left out (paths.walk_source): build outputs (.so, .o), Python's caches, dot-files and
    dot-folders, node_modules and an installed Python environment (a venv, whatever its name: its packages are
    third-party, built per host, and counted by library_versions instead).
    ``code``: search_path_code's answer for the same arguments, where the caller has it (source_code reports the
    same scan, so the two never disagree)."""
    folders: list[Code] = [Code(root / folder, folder) for folder in SOURCE_FOLDERS]
    if root == PROJECT_ROOT:
        folders += search_path_code(root, vendor, None if cases is None else list(cases)) if code is None else code
    return folders_digest(tuple(folders))


class Code(NamedTuple):
    """A folder the digest counts, its files labelled <label>/<path below it>; ``skip``: folders below it (paths
    relative to it) that it does not count, since the run finds them in an earlier place on the search path."""

    folder: Path
    label: str
    skip: frozenset[str] = frozenset()


def search_path_code(root: Path, vendor: str | None, cases: list[str] | None) -> list[Code]:
    """The code the search path variables add to the project's: of a run, its vendor's and cases' folders in each
    of their folders, in search order, as the run finds them; without a run, the same for every vendor and case a
    run could name (the union of what any run reads: a copy no run reads counts in neither). A folder that
    resolves within SOURCE_FOLDERS is counted with them already (a container's search_mounts names such a folder in
    the project, never mounts it elsewhere: container_policy decides inside/outside from the resolved folder too),
    but still hides what a later one has. Of a case, the first place holding it counts (a case found twice is refused
    anyway); of a vendor, the first place holding its vendor.yaml counts whole, less an engine an earlier place has,
    and each other place without a vendor.yaml only for the engines it holds that no earlier place has (engines are
    looked up in the vendor's own folder and every folder of its name without a vendor.yaml, the first one of a name
    wins: flagperf.config.engines.engine_roots); a later copy with its own vendor.yaml is never read."""
    vendor_places = [root / VENDOR_FOLDER, *search_path_folders(VENDOR_PATH_ENV)]
    vendors = [vendor] if vendor is not None else sorted(
        {folder.name for place in vendor_places for folder in _listed(place, "*")})
    found = [code for name in vendors for code in vendor_code(root, name)]
    if cases is None:
        cases = sorted({folder.relative_to(place).as_posix() for place in search_path_folders(CASE_PATH_ENV)
                        for folder in _listed(place, "*/*") if is_case_folder(folder)})
    return found + case_code(root, cases)


def _listed(place: Path, pattern: str) -> list[Path]:
    """The folders ``pattern`` finds in ``place``; none where it cannot be listed (not a folder, another user's):
    no run finds a vendor or case there either."""
    try:
        return [path for path in place.glob(pattern) if path.is_dir()]
    except OSError:
        return []


def source_code(root: Path = PROJECT_ROOT, vendor: str | None = None, cases: Sequence[str] | None = None,
                code: Sequence[Code] | None = None) -> dict[str, dict[str, Any]]:
    """What the source digest of the same arguments counts beyond SOURCE_FOLDERS: label (as its files are labelled
    in the digest) -> {"folder": the folder counted, "skip": the engines below it an earlier place has, left out}.
    A plan records it, so a lab sees which copy of each vendor, engine and case on its search paths a run's digest
    stands for. ``code``: as source_digest's."""
    if root != PROJECT_ROOT:
        return {}
    if code is None:
        code = search_path_code(root, vendor, None if cases is None else list(cases))
    return {each.label: {"folder": str(each.folder), "skip": sorted(each.skip)} for each in code}


def counted_already(root: Path, place: Path) -> bool:
    """Whether a search path folder lies within SOURCE_FOLDERS, which the digest counts whole anyway."""
    return any(place.is_relative_to((root / folder).resolve()) for folder in SOURCE_FOLDERS)


def vendor_code(root: Path, vendor: str) -> list[Code]:
    """search_path_code's of a run's vendor."""
    places = [root / VENDOR_FOLDER, *search_path_folders(VENDOR_PATH_ENV)]
    home = next((i for i, place in enumerate(places) if os.path.lexists(place / vendor / VENDOR_MANIFEST)), None)
    if home is None:
        return []  # no vendor of the name: no run reads its engines either (a run needs its vendor.yaml)
    label = f"{VENDOR_PATH_ENV}/{vendor}"
    found: list[Code] = []
    seen: set[str] = set()  # the engines an earlier place has
    for index, place in enumerate(places):
        folder = place / vendor
        if index != home and os.path.lexists(folder / VENDOR_MANIFEST):
            continue  # another copy of the vendor, shadowed whole: none of it is read (config.engines.engine_roots)
        engines = vendor_engines(folder)
        if index and folder.is_dir() and not counted_already(root, place):
            if index == home:
                found.append(Code(folder, label, frozenset(engines & seen)))
            else:
                found += [Code(folder / engine, f"{label}/{engine}") for engine in sorted(engines - seen)]
        seen |= engines
    return found


def case_code(root: Path, cases: list[str]) -> list[Code]:
    """search_path_code's of a run's cases (<family>/<case>)."""
    places = [root / CASE_FOLDER, *search_path_folders(CASE_PATH_ENV)]
    home = {name: next((i for i, place in enumerate(places) if is_case_folder(place / name)), None) for name in cases}
    return [Code(place / name, f"{CASE_PATH_ENV}/{name}") for index, place in enumerate(places)
            if index and not counted_already(root, place)
            for name in cases if home[name] == index]


def folders_digest(folders: tuple[tuple[Path, str] | Code, ...]) -> str | None:
    """The digest of (folder, label) pairs (or Code, with folders it skips): each folder's files labelled
    <label>/<path below the folder>. The folders are listed (and each file's size and ctime read) every time, so an
    edit between two calls in one process (a flow's retry) is seen; the bytes are read again only when a listing
    changed."""
    listing: list[tuple[str, Path | None, int, int]] = []
    try:
        for entry in folders:
            folder, label, skip = Code(*entry)
            listing.append((label, None, 0, 0))  # where one folder ends: two folders are not one
            # What the link scan of a container's folders skips too (paths.walk_source): caches, build outputs, an
            # installed environment.
            found: list[Path] = []
            for top, subfolders, names in walk_source(folder, strict=True):
                if skip:  # pruned in place: the walk does not go there
                    subfolders[:] = [name for name in subfolders
                                     if Path(top, name).relative_to(folder).as_posix() not in skip]
                found += (path for path in (Path(top, name) for name in names) if path.is_file())
            for path in sorted(found):
                stat = path.stat()
                # ctime: any write, and a chmod that makes an unreadable file readable, changes it
                listing.append((f"{label}/{path.relative_to(folder).as_posix()}", path, stat.st_size,
                                stat.st_ctime_ns))
    except OSError:
        return None
    return listing_digest(tuple(listing))


@functools.lru_cache(maxsize=16)
def listing_digest(listing: tuple[tuple[str, Path | None, int, int], ...]) -> str | None:
    """folders_digest's bytes: (label, file or None for a folder's start, size, ctime) in order."""
    digest = hashlib.sha256()
    try:
        for label, path, _, _ in listing:
            if path is None:
                digest.update(f"{label}\0\0".encode())
                continue
            digest.update(label.encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    except OSError:
        return None
    return f"sha256:{digest.hexdigest()[:16]}"


def code_identity(paths: bool = False) -> str:
    """The code that ran, in one phrase for a record: its commit (and whether it was modified) and its
    source digest, which also names a copy without git, with the labels of the search path folders it counts
    (FLAGPERF_VENDOR_PATH/acme). ``paths``: where each lies too; off by default, since a record may be committed
    and a lab's paths are none of its readers' business."""
    revision, dirty = git_revision()
    git = f"git {revision[:12]}{' (modified)' if dirty else ''}" if revision else "no git checkout"
    code = search_path_code(PROJECT_ROOT, None, None)
    counted = source_code(code=code)
    where = "; ".join(label + (f" from {each['folder']}" if paths else "")
                      + (f" less {', '.join(each['skip'])}" if each["skip"] else "")
                      for label, each in counted.items())
    return f"{git}, source {source_digest(code=code) or 'unreadable'}{f' (with {where})' if where else ''}"


def library_versions(names: tuple[str, ...] = CASE_LIBRARIES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "logical_cpus": psutil.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else psutil.cpu_count(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "python_executable": platform.python_implementation() + " " + platform.python_version(),
        "environment": {name: os.environ[name] for name in RELEVANT_ENVIRONMENT if name in os.environ},
    }


def engine_info(vendor: str | None = None, cases: Sequence[str] | None = None) -> dict[str, Any]:
    """The engine's version and code; ``vendor``, ``cases``: the run's, for source_digest."""
    revision, dirty = git_revision()
    return {"engine_version": __version__, "git_revision": revision, "git_dirty": dirty,
            "source_digest": source_digest(vendor=vendor, cases=cases)}
