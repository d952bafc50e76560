"""Where the project's plug-in folders live: cases, vendors and suites are found by folder, not by import."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from pathlib import Path

# Resolved once: case and monitor processes run with the project root as their working directory.
PROJECT_ROOT = Path(os.environ.get("FLAGPERF_HOME", Path(__file__).resolve().parents[1])).resolve()

# Set by `flagperf server` for its worker: the results folder it serves read-only over HTTP, and its address,
# so that a run's report is linked from the Prefect UI.
RESULTS_URL_ENV, RESULTS_ROOT_ENV = "FLAGPERF_RESULTS_URL", "FLAGPERF_RESULTS_ROOT"
RESULTS_DIR_ENV = "FLAGPERF_RESULTS_DIR"  # the folder runs started from a server write to (its site serves it)

MAX_NAME_LENGTH = 128  # a case's, suite's, host's or run's name; the history's columns hold this many
# \Z: "$" would let a trailing newline through
NAME_PATTERN = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME_LENGTH - 1}}}\Z")

# The names a results folder gives its own files, beside its run folders: the nightly history (a SQLite file and its
# journals), the trend table, each suite's latest verdict, and `flagperf server`'s logs folder (its default).
HISTORY_FILE = "history.sqlite"
SQLITE_JOURNALS = ("-journal", "-wal", "-shm")
TREND_FILE = "trends.csv"
VERDICT_FILE = re.compile(r"^nightly-.*\.json\Z", re.IGNORECASE)  # flagperf.config.night.verdict_file_name
SERVER_LOGS = "server"
RESULTS_FOLDER_FILES = frozenset({HISTORY_FILE, *(HISTORY_FILE + j for j in SQLITE_JOURNALS), TREND_FILE,
                                  SERVER_LOGS})


def run_id_problem(run_id: str) -> str | None:
    """Why ``run_id`` cannot name a run folder of a results folder (None: it can): one wording for `flagperf run
    --run-id`, a night's run_id and a plan's. A run folder is never a path out of the results folder, nor one of
    the names the folder gives its own files (compared without case: a case-insensitive disk holds one of both)."""
    if len(run_id) > MAX_NAME_LENGTH:
        return f"{run_id[:40]!r}... is too long: {len(run_id)} characters, at most {MAX_NAME_LENGTH}"
    if not NAME_PATTERN.match(run_id):
        return (f"{run_id!r} is not a valid name (letters, digits, '.', '_', '-'; not starting with '.', '_' or "
                f"'-'; at most {MAX_NAME_LENGTH} characters)")
    if run_id.casefold() in RESULTS_FOLDER_FILES or VERDICT_FILE.match(run_id):
        return (f"{run_id!r} is a name the results folder gives its own files ({HISTORY_FILE} and its journals, "
                f"{TREND_FILE}, nightly-<suite>.json, {SERVER_LOGS}/); choose another")
    return None


# What a source folder holds that is none of the code a round runs, by name: a dot-file or dot-folder (.git, a .venv,
# an editor's), Python's caches, and npm's installed packages (a web front end of a vendor's tools); by ending, a
# build output (.so, .o), compiled Python and an editor's backup or swap file.
SKIPPED_FOLDER_NAMES = frozenset({"__pycache__", "node_modules"})
SKIPPED_FILE_ENDINGS = (".pyc", ".pyo", ".so", ".o", "~", ".swp")
# A folder holding one of these is an installed Python environment, whatever its name (venv/, env/, a conda one):
# third-party packages and links to the host's Python, built per host, never the code. By its marker, not its name,
# so that a case or family that happens to be called venv still counts.
ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")


def skipped_in_source(part: str) -> bool:
    """Whether a file or folder named ``part`` (one part of a path below a source folder) is none of the code by its
    name: a dot-file or dot-folder, __pycache__ or node_modules. Part of the one rule (walk_source) for what the
    source digest skips (results.provenance) and what the link scan of a mounted vendor or case folder skips
    (hosts.local), so that a vendor repository's .venv, which counts for neither, does not get its folder refused
    for its links."""
    return part.startswith(".") or part in SKIPPED_FOLDER_NAMES


def skipped_folder(parent: str, name: str) -> bool:
    """Whether the folder ``name`` in ``parent`` is none of the code: by its name, or an installed Python
    environment (ENVIRONMENT_MARKERS: a venv's bin/python links to the host's Python by its absolute path)."""
    return skipped_in_source(name) or any(os.path.lexists(os.path.join(parent, name, marker))
                                          for marker in ENVIRONMENT_MARKERS)


def skipped_file(name: str) -> bool:
    return skipped_in_source(name) or name.endswith(SKIPPED_FILE_ENDINGS)


def _raise(error: OSError) -> None:
    if not isinstance(error, (FileNotFoundError, NotADirectoryError)):  # gone meanwhile: no files, as rglob's
        raise error


def walk_source(folder: str | Path, strict: bool = False, built: bool = False,
                onerror: Callable[[OSError], None] | None = None, skipped: list[str] | None = None,
                skipped_links: list[str] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk of a source folder without what is none of the code (skipped_folder, skipped_file), in name order:
    the one walk of the source digest and of the link scan of a folder a container gets, so that both skip the same
    folders. A linked folder is listed among the folders, never walked (it may loop). ``strict``: an unreadable
    folder raises OSError (the digest is then unknown) rather than being passed over; a missing one has no files.
    ``built``: keep the files skipped by their ending (SKIPPED_FILE_ENDINGS): the link scan's walk. The digest
    leaves a build output out (it is made from the code it counts), but a round loads it all the same (a case's
    foo.so), so a link by that name that leaves the folder dangles in a container as any other would.
    ``onerror``: where not ``strict``, told of each folder that cannot be listed (the link scan names it).
    ``skipped``: each folder the walk passes over by that rule is added to it (its path), as the walk lists it: vendor
    check says which it did not look into. ``skipped_links``: each file it passes over by its name that is a link
    (a dot-file), and each folder it passes over that is a link (os.walk lists a link to a folder among the folders:
    .data -> /datasets), is added to it (its path) rather than to ``skipped``: the link scan judges those too, for
    vendor check to name."""
    for top, folders, files in os.walk(folder, onerror=_raise if strict else onerror):
        passed = [name for name in folders if skipped_folder(top, name)]
        linked = [name for name in passed if skipped_links is not None and os.path.islink(os.path.join(top, name))]
        if skipped is not None:
            skipped += [os.path.join(top, name) for name in sorted(passed) if name not in linked]
        folders[:] = sorted(name for name in folders if name not in passed)
        if skipped_links is not None:
            skipped_links += [os.path.join(top, name) for name in sorted([*linked, *files]) if name in linked or (
                skipped_in_source(name) and os.path.islink(os.path.join(top, name)))]
        files[:] = sorted(name for name in files if not (skipped_in_source(name) if built else skipped_file(name)))
        yield top, folders, files


def search_path_folders(env_var: str) -> list[Path]:
    """The extra folders ``env_var`` names (os.pathsep separated), in order. The controller makes a relative entry
    absolute once, from the folder it was started in (pin_search_paths), before anything reads it; one still
    relative here came from an inventory's ``env`` and is the host's project's, as its containers read it
    (container_policy.search_mounts), never the working folder's, which differs between steps."""
    return [(PROJECT_ROOT / p).resolve() for p in os.environ.get(env_var, "").split(os.pathsep) if p]


def _search_path(default: Path, env_var: str) -> list[Path]:
    """The project's own folder first, then extra folders from ``env_var``."""
    return [default, *search_path_folders(env_var)]


CASE_PATH_ENV = "FLAGPERF_CASE_PATH"  # case folders outside the project (a lab's own cases)


# The project's own case and vendor folders, first on their search paths (below the project root).
CASE_FOLDER, VENDOR_FOLDER = "cases", "vendor_images"
# The files that make a folder on a search path a vendor (<root>/<vendor>/), one of its engines
# (<root>/<vendor>/<family folder>/<engine>/) or a case (<root>/<family>/<case>/; FlagPerf's inference cases by their
# configurations.yaml): flagperf.config finds each by them, and the source digest counts the copy of a name a run
# finds so (flagperf.results.provenance), never one an earlier place on the search path hides.
VENDOR_MANIFEST, ENGINE_MANIFEST, CASE_MANIFEST = "vendor.yaml", "engine.yaml", "case.yaml"
INFERENCE_FAMILY, INFERENCE_CASE_FILE = "inference", "configurations.yaml"


def is_case_folder(folder: Path) -> bool:
    """Whether <root>/<family>/<case> is a case where case discovery looks for one (flagperf.config.cases)."""
    return os.path.lexists(folder / CASE_MANIFEST) or (
        folder.parent.name == INFERENCE_FAMILY and os.path.lexists(folder / INFERENCE_CASE_FILE))


def vendor_engines(folder: Path) -> set[str]:
    """The engines a vendor folder holds, each <family folder>/<engine> (a folder with engine.yaml): a vendor's
    engines are looked up in every place on the search path that has a folder of its name, not only its own."""
    return {f"{manifest.parent.parent.name}/{manifest.parent.name}"
            for manifest in folder.glob(f"*/*/{ENGINE_MANIFEST}")}


def case_roots() -> list[Path]:
    return _search_path(PROJECT_ROOT / CASE_FOLDER, CASE_PATH_ENV)


VENDOR_PATH_ENV = "FLAGPERF_VENDOR_PATH"  # vendor folders outside the project (a vendor's own repository)


def vendor_roots() -> list[Path]:
    return _search_path(PROJECT_ROOT / VENDOR_FOLDER, VENDOR_PATH_ENV)


SUITE_PATH_ENV = "FLAGPERF_SUITE_PATH"  # suite files outside the project


def suite_roots() -> list[Path]:
    return _search_path(PROJECT_ROOT / "deployments" / "suites", SUITE_PATH_ENV)


SEARCH_PATH_VARIABLES = (VENDOR_PATH_ENV, CASE_PATH_ENV, SUITE_PATH_ENV)


def absolute_search_paths(environ: Mapping[str, str], start: Path) -> dict[str, str]:
    """The search path variables of ``environ`` that hold a relative entry, with each such entry made absolute from
    ``start`` (every link in it resolved, as a read of it then would); the others' entries, and empty ones, as
    written. What a user means by a relative entry of a PATH-like variable: from where the command started."""
    pinned = {}
    for variable in SEARCH_PATH_VARIABLES:
        entries = environ.get(variable, "").split(os.pathsep)
        if any(entry and not os.path.isabs(entry) for entry in entries):
            pinned[variable] = os.pathsep.join(entry if not entry or os.path.isabs(entry) else
                                               str((start / entry).resolve()) for entry in entries)
    return pinned


class StartFolderGone(Exception):
    """A relative search path entry, and no working folder to read it from (pin_search_paths). Its text is the
    user's one line, ``variable``: ``message``; the plan raises it as a ConfigError, the CLI prints it (errors.py is
    no import of this module)."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable, self.message = variable, message


def pin_search_paths() -> dict[str, str]:
    """Make the controller's search path variables absolute, once, where it starts (the CLI, a plan): every later
    step (a round's process, which starts in the project, a Slurm job, the source digest, a container's mounts)
    inherits them so and reads the same folders, whatever its working folder. Returns what it changed. A relative
    entry while the working folder is gone (removed after the command was started there) is an error naming
    it (StartFolderGone): it means nothing then (read from the project, it would name the project's own folders a
    second time)."""
    try:
        start = Path.cwd()
    except OSError:  # the working folder was removed: nothing a relative entry can be relative to
        for variable in SEARCH_PATH_VARIABLES:
            for entry in os.environ.get(variable, "").split(os.pathsep):
                if entry and not os.path.isabs(entry):
                    raise StartFolderGone(variable, f"entry {entry!r} is relative, and the folder this command "
                                                    "started in no longer exists") from None
        return {}
    pinned = absolute_search_paths(os.environ, start)
    os.environ.update(pinned)
    return pinned


def display_path(path: Path) -> str:
    """A path relative to the project when it lies inside it: shorter error messages, same meaning."""
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT.resolve()))
    except ValueError:
        return str(path)


def outermost_missing(folder: Path) -> Path | None:
    """The outermost of ``folder`` and its parents that is not there (None: ``folder`` is): what making it makes,
    so that a command refused on bad input removes only what it made (``remove_made``)."""
    missing = None
    with suppress(OSError, ValueError):  # ValueError: a NUL in the path (folder_problem says so)
        for candidate in (folder.absolute(), *folder.absolute().parents):
            if candidate.exists() or candidate.is_symlink():
                break
            missing = candidate
    return missing


def remove_made(folder: Path, made: Path | None) -> None:
    """Remove ``folder`` and its parents up to ``made`` (outermost_missing's, before they were made), innermost
    first, while they are empty."""
    if made is None:
        return
    for candidate in (folder.absolute(), *folder.absolute().parents):
        try:
            candidate.rmdir()
        except (OSError, ValueError):  # ValueError: a NUL in the path (folder_problem said so)
            return
        if candidate == made:
            return
