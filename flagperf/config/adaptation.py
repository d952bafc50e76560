"""A vendor's adaptation of a case, after FlagPerf's vendor guide, in this project's layout.

    cases/<family>/<case>/vendor/<vendor>/     in the case (or, the same files, in the vendor's own folder:
                                               <vendor folder>/cases/<family>/<case>/; never in both)
      environment_variables.sh   ``export NAME=value`` / ``NAME=value`` lines, read (never run by a shell)
      requirements.txt           pip-installed before the case starts (into a cache per image and host)
      csrc/setup.py              operator sources, built and installed before the case starts (once per content)
      extern/hooks.py            named extension points of the standard case (EXTERN_HOOKS), nothing else
      config_<hw>x<n>x<p>.yaml   training scale settings (flagperf.config.cases)

What a vendor may not change (the guide's list): the model's structure and size, the optimizer type, the
data set and the initial checkpoint. The hooks are checked where a check can see them: statically here (what
extern/ calls), and at run time by the family's driver (parameter count and shapes, weights, optimizer class).
Everything here reads files; nothing a vendor wrote is executed by the reader.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import os
import re
import shlex
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagperf.config.files import (
    given_name,
    hash_file,
    inside,
    is_present,
    read_config_text,
    regular_file,
    resolved,
)
from flagperf.config.vendors import available_vendors
from flagperf.config.yamlio import MAX_KEY, MAX_TEXT
from flagperf.errors import ConfigError, gathered, nearest
from flagperf.paths import display_path, skipped_folder, skipped_in_source

ENV_FILE = "environment_variables.sh"
REQUIREMENTS_FILE = "requirements.txt"
CSRC_FOLDER = "csrc"
CSRC_SETUP = "setup.py"
EXTERN_FOLDER = "extern"
EXTERN_HOOKS_FILE = "hooks.py"
# What csrc/ and extern/ may hold: (files and folders, bytes of their files), links followed as the build's copy
# follows them. Both are walked at every plan and hashed at every round; csrc/ is copied and built on every host,
# extern/'s Python files are each parsed (at most flagperf.config.files.MAX_FILE_BYTES each). A vendor's operator
# sources, even with a vendored kernel library's headers (a few thousand files, tens of MiB), fit far below them;
# a tree above them would take minutes to hash and copy every round, or fill a host's disk.
# The files beside requirements.txt that it may name (wheels, archives, constraints, folders of them such as a
# --find-links wheelhouse) are hashed at every round for the install's cache key and read by pip on every host:
# a torch wheel is about 900 MiB, a vendor's stack (its torch, its vLLM fork, triton, flash-attn) 2 to 3 GiB, a
# wheelhouse a few hundred files. 4 GiB takes seconds to hash; a folder past it would fill a host's disk.
REQUIREMENTS_FILES = "requirements"
TREE_LIMITS: dict[str, tuple[int, int]] = {CSRC_FOLDER: (20_000, 1024 << 20), EXTERN_FOLDER: (2_000, 64 << 20),
                                           REQUIREMENTS_FILES: (2_000, 4096 << 20)}
# How an error names what holds too much, and why it matters.
_TREE_WORDS = {CSRC_FOLDER: ("the csrc folder", "csrc/ may hold", "it is hashed every round and copied to every host"),
               EXTERN_FOLDER: ("the extern folder", "extern/ may hold",
                               "it is hashed every round and copied to every host"),
               REQUIREMENTS_FILES: ("the vendor's case folder",
                                    "the wheels, archives and folders beside requirements.txt may hold",
                                    "they are hashed every round and installed on every host")}
_REQUIREMENT_SUFFIXES = (".whl", ".txt", ".tar.gz", ".tar.bz2", ".tgz", ".zip")

# The named extension points per family, and what each may do. A hook receives the standard case's own
# object and returns its replacement; the driver checks the replacement (see the family's driver).
EXTERN_HOOKS: dict[str, dict[str, str]] = {
    "training": {
        "wrap_model": "wrap_model(model, ctx) -> model: e.g. a fused-kernel module swap; same parameter count, "
                      "shapes and initial weights",
        "make_optimizer": "make_optimizer(cls, params, kwargs, ctx) -> optimizer: an instance of exactly cls (e.g. "
                          "a vendor's fused implementation chosen by kwargs)",
        "setup_distributed": "setup_distributed(device_type, backend) -> backend: the collective backend name "
                             "(e.g. the vendor's NCCL-compatible library)",
        "on_step": "on_step(ctx, step) -> None: called after every training step (e.g. a cache flush)",
    },
    "inference": {
        "model_forward": "model_forward(standard, model, inputs) -> outputs: around the case's eager forward",
        "engine_forward": "engine_forward(standard, engine, inputs) -> (outputs, seconds): around the case's "
                          "engine forward",
    },
}

# The arguments each hook is called with, in order (positionally: a hook may name them as it likes), as the
# family's driver calls it; EXTERN_HOOKS' descriptions show the same (tests/unit/test_adaptation.py holds them equal).
HOOK_PARAMETERS: dict[str, tuple[str, ...]] = {
    "wrap_model": ("model", "ctx"), "make_optimizer": ("cls", "params", "kwargs", "ctx"),
    "setup_distributed": ("device_type", "backend"), "on_step": ("ctx", "step"),
    "model_forward": ("standard", "model", "inputs"), "engine_forward": ("standard", "engine", "inputs"),
}

# What the family's driver checks of a hook's result each time a round calls it: reading the file cannot tell (the
# class a make_optimizer returns is known only once it has run), and nothing that checks a file runs it, so
# `flagperf vendor check` names these as not checked rather than passing them.
RUN_TIME_CHECKS: dict[str, str] = {
    "wrap_model": "the model it returns keeps the case's parameter count, shapes and initial weights",
    "make_optimizer": "the optimizer it returns is an instance of exactly the class the case asks for, holding "
                      "exactly the case's parameters",
}

# What extern/ code may not name: loading weights (the initial checkpoint) or building data (the data set).
FORBIDDEN_NAMES = {
    "load_state_dict": "loads weights: the initial checkpoint is not the vendor's to change",
    "load_checkpoint": "loads a checkpoint: the initial checkpoint is not the vendor's to change",
    "from_pretrained": "loads pretrained weights: the initial checkpoint is not the vendor's to change",
    "DataLoader": "builds a data loader: the data set is not the vendor's to change",
    "Dataset": "builds a data set: the data set is not the vendor's to change",
    "data_dir": "reads the data folder: the data set is not the vendor's to change",
}
FORBIDDEN_CALLS = {("torch", "load"): "torch.load loads weights: the initial checkpoint is not the vendor's to "
                                      "change"}

# The engine sets these for the case process; an environment file must not move them.
# PREFECT_*: a case's own flow runs report to the run's server with its key, which a vendor may not redirect.
RESERVED_ENV = re.compile(r"^(FLAGPERF_.*|PREFECT_.*|PYTHONPATH|PYTHONHOME|PYTHONUNBUFFERED)$")
MAX_ENV_NAMES = 512  # far above any vendor's; an environment of millions of names would not start a process
_SOURCED = re.compile(r"^(?:source|\.)\s+\S")  # `source /opt/sdk/set_env.sh`, `. ./env.sh`
_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
ENV_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_UNQUOTED_UNSAFE = set(" \t;&|<>()`\\'\"*?[]~#!")


@dataclass(frozen=True)
class Adaptation:
    """What a vendor's folder of one case holds, read and checked (not applied)."""

    case: str
    family: str
    vendor: str
    folder: Path
    env: dict[str, str] = field(default_factory=dict)  # NAME -> value as written (references kept)
    requirements: Path | None = None
    csrc: Path | None = None
    extern: Path | None = None
    hooks: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.env or self.requirements or self.csrc or self.extern)

    def summary(self) -> dict[str, object]:
        """What result.json's provenance records: a reviewer sees every adaptation point used."""
        return {"folder": display_path(self.folder), "env": dict(self.env),
                "requirements": display_path(self.requirements) if self.requirements else None,
                "csrc": display_path(self.csrc) if self.csrc else None,
                "extern": display_path(self.extern) if self.extern else None, "hooks": list(self.hooks)}


# A vendor kept in its own repository (`flagperf vendor new --into DIR`, found through FLAGPERF_VENDOR_PATH) keeps
# its adaptations there too: <vendor folder>/cases/<family>/<case>/ holds what cases/<family>/<case>/vendor/<vendor>/
# would, so that adapting a case never needs a change to the project (nor to a case repository's).
VENDOR_CASES_FOLDER = "cases"


@dataclass(frozen=True)
class Place:
    """Where a vendor's files of one case are: ``folder``, which may not lead out of ``root`` (``what`` in errors)."""

    folder: Path
    root: Path
    what: str

    @property
    def present(self) -> bool:
        """A folder, or a link (where it leads is checked when it is read); a file of that name is no folder."""
        return is_present(self.folder) and (self.folder.is_dir() or self.folder.is_symlink())

    def checked(self) -> Path:
        """The folder, refused when it (a link, or a link on the way to it) leads out of its root."""
        inside(self.root, self.folder.relative_to(self.root), given_name(self.folder), None, self.what)
        return self.folder

    def file(self, name: str) -> Path:
        """A file of the folder, refused when a link leads it out of the folder's root."""
        path = self.folder / name
        inside(self.root, path.relative_to(self.root), given_name(path), None, self.what)
        return path


def adaptation_places(case_folder: Path, vendor: str, vendor_folder: Path | None = None) -> list[Place]:
    """The two places a vendor's files of the case may be: the case's vendor/<vendor>/, and the vendor folder's
    cases/<family>/<case>/ (``vendor_folder``; by default the one `--vendor <vendor>` finds, as a run finds it)."""
    places = [Place(case_folder / "vendor" / vendor, case_folder, "the case folder")]
    home = vendor_folder if vendor_folder is not None else available_vendors().get(vendor)
    if home is not None:
        places.append(Place(home / VENDOR_CASES_FOLDER / case_folder.parent.name / case_folder.name, home,
                            "the vendor folder"))
    return places


def adaptation_place(case_folder: Path, vendor: str, vendor_folder: Path | None = None) -> Place:
    """The place a run reads the vendor's files of the case from: the one that is there (the case's when neither
    is). Both there is refused: the files of one would be silently ignored."""
    places = adaptation_places(case_folder, vendor, vendor_folder)
    present = [place for place in places if place.present]
    if len(present) > 1:
        raise ConfigError(given_name(present[1].folder), None, f"vendor {vendor}'s files of case {case_folder.name} "
                          f"are also in {given_name(present[0].folder)}: keep them in one of the two places (a run "
                          "reads one)")
    return present[0] if present else places[0]


def adaptation_folder(case_folder: Path, vendor: str, vendor_folder: Path | None = None) -> Path:
    """The folder of the vendor's files of the case a run reads (adaptation_place)."""
    return adaptation_place(case_folder, vendor, vendor_folder).folder


def absolute_links(vendor_folder: Path, case: Path | None = None, parts: Sequence[str] = (VENDOR_CASES_FOLDER,),
                   not_checked: list[str] | None = None) -> list[ConfigError]:
    """The links of the vendor folder's cases/ (``parts``: those of its folders, such as its engine folders) whose
    target is an absolute path, each one line naming it; with ``case`` (a folder of cases/<family>/), only those on
    the way to it and in it. Such a link works where it was made alone: a clone of the vendor's repository, a host's
    deployed copy and a round's container (which has the vendor folder under /flagperf-search/) have the folder at
    another path, so the run that reads it finds nothing there (a container round says so only once it starts). A
    relative link inside the folder travels, and the folders it leads to are looked through too (once each); a link
    out of the folder is read_adaptation's to refuse. What the run's link scan skips (a .venv, __pycache__, a folder
    holding a Python environment: _not_walked; a build output such as foo.so is looked at) is skipped. A walk cut
    short at LINK_WALK_LIMIT did not look at everything, so it is never clean: its line goes in ``not_checked``
    (vendor check's "not checkable here"), or, without one, is a finding of its own."""
    cut: list[str] = []
    found = [ConfigError(given_name(path), None, f"links to {target} by its absolute path: where the vendor folder is "
                         "at another path (a clone of it, a host's copy, a round's container) it leads nowhere; make "
                         "the link relative, to a file inside the vendor folder, or copy the file")
             for path, target, _ in walk_linked(vendor_folder, case, parts, cut) if target is not None
             and os.path.isabs(target)]
    for line in cut:
        first = _first_said(line)  # one check of several scans (validate of several files): said in full once
        if first is None:
            continue
        if not_checked is None:  # a later file's walk (of its engine, its case) was cut too: never clean
            walked = case if case is not None else vendor_folder / parts[0] if len(parts) == 1 else vendor_folder
            found.append(ConfigError(display_path(vendor_folder), None,
                                     line.removeprefix(f"{display_path(vendor_folder)}: ")) if first else
                         ConfigError(display_path(walked), None, _cut_again(vendor_folder)))
        elif first and line not in not_checked:
            not_checked.append(line)
    return found


def vendor_folder_links(vendor_folder: Path, not_checked: list[str] | None = None) -> list[ConfigError]:
    """absolute_links of the whole vendor folder (its monitor scripts, spec module, Dockerfile's files, toolkits, any
    file beside them, as well as cases/ and the engine folders): a round's container has all of it, at another
    path. What the run's link scan skips is skipped (a vendor repository's .venv links to its Python by its absolute
    path, and no round reads it); ``not_checked`` as absolute_links'."""
    try:
        names = sorted(os.listdir(vendor_folder))
    except OSError:  # not a folder to list: loading its vendor.yaml says so
        return []
    # cases/ first: a link reached through it is named as a case's file is, as a run of the case reaches it (and
    # as validate of that file names it), though the folder it lies in sorts before cases/.
    names.sort(key=lambda name: name != VENDOR_CASES_FOLDER)
    return absolute_links(vendor_folder, parts=[name for name in names if not _not_walked(vendor_folder, name)],
                          not_checked=not_checked)


@dataclass
class _CutLines:
    """The walk-limit lines said so far in one check, each with the number of the file whose check said it."""

    said: dict[str, int] = field(default_factory=dict)
    file: int = 0


# The walk-limit lines said so far in one check (one_cut_line_per_check); None outside one.
_CUT_SAID: ContextVar[_CutLines | None] = ContextVar("flagperf_cut_said", default=None)


@contextmanager
def one_cut_line_per_check() -> Iterator[None]:
    """Within it, a folder's walk that stopped at LINK_WALK_LIMIT is said in full once (absolute_links' line),
    however many scans of the folder stop (`flagperf validate` of its vendor.yaml, an engine.yaml and a case's file
    each scan it): one fact about one folder, not one per file. A later file (next_checked_file) whose walk was cut
    too gets a short line pointing at it: its own walk (an engine's folder, a case's) was not whole either, so the file
    is never ok."""
    token = _CUT_SAID.set(_CutLines())
    try:
        yield
    finally:
        _CUT_SAID.reset(token)


def next_checked_file() -> None:
    """Within one_cut_line_per_check: what follows is the check of another file."""
    lines = _CUT_SAID.get()
    if lines is not None:
        lines.file += 1


def _first_said(line: str) -> bool | None:
    """Whether ``line`` (a walk-limit line) is said for the first time in this check (always, outside one): True;
    False where an earlier file's check said it; None where this file's check said it already."""
    lines = _CUT_SAID.get()
    if lines is None:
        return True
    if line in lines.said:
        return None if lines.said[line] == lines.file else False
    lines.said[line] = lines.file
    return True


def _cut_again(vendor_folder: Path) -> str:
    """absolute_links' short line for a walk cut again in a later file's check (its full line is said above)."""
    return (f"the walk of {display_path(vendor_folder)} was cut at {LINK_WALK_LIMIT:,} paths (see above): not checked "
            "whole")


def _cut_line(folder: Path) -> str:
    """What a walk of ``folder`` stopped at LINK_WALK_LIMIT says, as ``FOLDER: why``."""
    return (f"{display_path(folder)}: its links were looked through for the first {LINK_WALK_LIMIT} paths only, the "
            "rest not checked (a data set in the folder?); keep data out of it")


# How many paths walk_linked looks at before it stops: a vendor folder holding (or linking in) a data set would
# otherwise be walked file by file on every check.
LINK_WALK_LIMIT = 50_000


def _not_walked(parent: Path, name: str) -> bool:
    """What the link walk passes over: the one rule of the run's link scan (paths.walk_source with built=True:
    hosts.local.links_leaving), so that a link the run refuses (a build output, foo.so, that a round loads) is named
    by vendor check and validate too, and one it passes (a .venv's) by neither. os.path.isdir, not Path.is_dir: a
    folder that can be listed but not entered raises PermissionError on the latter."""
    return skipped_folder(str(parent), name) if os.path.isdir(parent / name) else skipped_in_source(name)


def _skipped_place(home: str, real: str) -> bool:
    """Whether ``real`` (a folder inside ``home``, reached by a relative link) lies where the run's link scan never
    goes: under a part it skips by name (tools/env -> ../.venv) or in a folder holding a Python environment. The
    run never walks a linked folder, so the links there are none of its findings; nor are they here."""
    parts = os.path.relpath(real, home).split(os.sep)
    if any(skipped_in_source(part) for part in parts):
        return True
    return any(skipped_folder(os.path.join(home, *parts[:depth]), parts[depth]) for depth in range(len(parts)))


def walk_linked(vendor_folder: Path, case: Path | None = None, parts: Sequence[str] = (VENDOR_CASES_FOLDER,),
                cut: list[str] | None = None, every: bool = False) -> Iterator[tuple[Path, str | None, str]]:
    """Each path below the vendor folder's ``parts`` as a run reaches it: (the path, its link's target as written or
    None, where it resolves), relative links inside the vendor folder followed (each place looked through once,
    none the run's link scan skips: _skipped_place); ``case``: only on the way to that folder of cases/<family>/
    and in it. Skips what the run's link scan skips (_not_walked), unless ``every`` (extern/'s Python files: a
    build copies all of the folder). Stops after LINK_WALK_LIMIT paths, said in ``cut`` (one line, once): a caller
    that gives none cannot tell a cut walk from a whole one."""
    home = os.path.realpath(vendor_folder)
    # The folder itself is walked by its parts: a link back to it (cases/x -> ../..) is named once, as itself, and
    # never walked again under a path made of it.
    seen: set[str] = {home}
    pending = [vendor_folder / part for part in reversed(parts)]
    walked = 0
    while pending:
        path = pending.pop()
        if case is not None and not (path == case or path in case.parents or case in path.parents):
            continue
        walked += 1
        if walked > LINK_WALK_LIMIT:
            line = _cut_line(vendor_folder)
            if cut is not None and line not in cut:
                cut.append(line)
            return
        try:
            target = os.readlink(path) if os.path.islink(path) else None
            real = os.path.realpath(path)
        except OSError:  # gone meanwhile
            continue
        yield path, target, real  # a link to a folder that cannot be listed (or no longer exists) is named as well
        if real in seen or not (real == home or real.startswith(home + os.sep)) or not os.path.isdir(path):
            continue
        seen.add(real)
        if target is not None and not every and _skipped_place(home, real):
            continue
        try:
            listing = sorted(os.listdir(path))
        except OSError:  # unreadable: reading the adaptation says so
            continue
        pending += [path / name for name in reversed(listing) if every or not _not_walked(path, name)]


def overrides_file(case_folder: Path, file_name: str, vendor: str, vendor_folder: Path | None = None) -> Path:
    """The vendor's settings file of the case a run reads (``file_name``: vendor/<vendor>.yaml's name, an inference
    case's <vendor>_configurations.yaml): the case's vendor/<file_name>, or the same name in the vendor folder's
    cases/<family>/<case>/ (adaptation_places), whichever is there; the case's when neither is. Both there is
    refused, as for the folder: a run would read one and silently drop the other's settings. Not read here."""
    places = adaptation_places(case_folder, vendor, vendor_folder)
    own = case_folder / "vendor" / file_name
    kept = places[1].folder / file_name if len(places) > 1 else None
    if kept is None or not is_present(kept):
        inside(case_folder, own.relative_to(case_folder), given_name(own), None, "the case folder")
        return own
    if is_present(own):
        raise ConfigError(given_name(kept), None, f"vendor {vendor}'s settings of case {case_folder.name} are also in "
                          f"{given_name(own)}: keep them in one of the two places (a run reads one)")
    places[1].file(file_name)  # no link out of the vendor folder
    return kept


def parse_env_file(path: Path) -> dict[str, str]:
    """FlagPerf's environment_variables.sh, read as data: blank lines, ``#`` comments and ``[export ]NAME=value``
    with a value that is plain, 'single-quoted' or "double-quoted" (``$NAME`` / ``${NAME}`` references are kept
    and expanded when applied). Anything else (a command, a substitution, a function) is refused by line."""
    source = display_path(path)
    values: dict[str, str] = {}
    # Lines end at \n alone, as in the shell (str.splitlines also ends them at \r, \f, \x1c ...).
    for number, raw in enumerate(read_config_text(path).split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        control = next((c for c in line if (ord(c) < 32 and c != "\t") or ord(c) == 127), None)
        if control is not None:  # a NUL cannot be in an environment; an escape sequence would rewrite a log
            raise ConfigError(source, f"line {number}", f"holds the control character {control!r}")
        match = _ASSIGNMENT.match(line)
        if match is None and _SOURCED.match(line):  # FlagPerf sources the file, so its vendors' files often do this
            raise ConfigError(source, f"line {number}", "sources another script, which is never run here (the file "
                              "is read as data): put the toolkit's environment in the image (ENV lines of the "
                              "Dockerfile), or copy its `export NAME=value` lines into this file")
        if match is None:
            raise ConfigError(source, f"line {number}", "not an assignment (only `export NAME=value` or "
                                                        "`NAME=value` lines are read; the file is never run)")
        name, value = match.group(1), _value(match.group(2).strip(), source, number)
        if RESERVED_ENV.match(name):
            raise ConfigError(source, f"line {number}", f"{name} is set by the engine, not by a vendor")
        if len(name) > MAX_KEY or len(value) > MAX_TEXT:
            raise ConfigError(source, f"line {number}", f"a name of at most {MAX_KEY} characters and a value of at "
                                                        f"most {MAX_TEXT}")
        values[name] = value
        if len(values) > MAX_ENV_NAMES:
            raise ConfigError(source, f"line {number}", f"more than {MAX_ENV_NAMES} variables")
    return values


def _value(text: str, source: str, number: int) -> str:
    where = f"line {number}"
    if len(text) >= 2 and text[0] == text[-1] == "'":
        inner = text[1:-1]
        if "'" in inner:
            raise ConfigError(source, where, "a quote inside a single-quoted value")
        return inner.replace("$", "$$")  # literal: no reference is expanded
    if len(text) >= 2 and text[0] == text[-1] == '"':
        inner = text[1:-1]
        if any(c in inner for c in '"`\\') or "$(" in inner:
            raise ConfigError(source, where, "a double-quoted value may not hold quotes, backslashes, backticks "
                                             "or $(...) (nothing is run)")
        _check_references(inner, source, where)
        return inner
    bad = sorted({c for c in text if c in _UNQUOTED_UNSAFE})
    if bad or "$(" in text:
        shown = " ".join("space" if c == " " else "tab" if c == "\t" else c for c in bad) or "$("
        raise ConfigError(source, where, f"an unquoted value with shell syntax ({shown}): quote it, or set a plain "
                                         "value (the file is never run)")
    _check_references(text, source, where)
    return text


def _check_references(text: str, source: str, where: str) -> None:
    stripped = ENV_REFERENCE.sub("", text.replace("$$", ""))
    if "$" in stripped:
        raise ConfigError(source, where, "only $NAME and ${NAME} references are expanded (no ${NAME:-x}, $1, $?)")


def expand_env(values: Mapping[str, str], environment: Mapping[str, str]) -> dict[str, str]:
    """The file's values with $NAME references expanded, in file order, against the environment and the
    file's earlier lines (an unset name is empty, as in the shell)."""
    current = dict(environment)
    expanded: dict[str, str] = {}
    for name, value in values.items():
        parts = value.split("$$")
        result = "$".join(ENV_REFERENCE.sub(lambda m: current.get(m.group(1) or m.group(2), ""), part)
                          for part in parts)
        current[name] = expanded[name] = result
    return expanded


# requirements.txt: what pip reads there, limited to what installs from the index the host is configured with
# (pip.conf, PIP_INDEX_URL) or from files of the vendor's folder. Options that fetch from elsewhere (another
# index, a URL, a VCS checkout) or name files outside the folder are refused by line.
_REQUIREMENT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\s*(?:\[[A-Za-z0-9._,\s-]*\])?\s*"
                          r"(?:\(?\s*(?:(?:===|~=|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*,?\s*)+\)?)?")
_ARCHIVE = re.compile(r".*\.(whl|tar\.gz|tar\.bz2|zip|tgz)$")
_FILE_OPTIONS = {"-r": "requirement", "--requirement": "requirement", "-c": "constraint", "--constraint": "constraint",
                 "-f": "find-links", "--find-links": "find-links"}
_FLAG_OPTIONS = {"--no-index", "--pre", "--prefer-binary", "--require-hashes"}
_VALUE_OPTIONS = {"--only-binary", "--no-binary"}
_REMOTE = {"-i": "another index", "--index-url": "another index", "--extra-index-url": "another index",
           "--trusted-host": "a host without TLS checks", "-e": "an editable install from a checkout or a path",
           "--editable": "an editable install from a checkout or a path"}
MAX_REQUIREMENT_FILES = 16  # -r / -c nesting


def check_requirements(path: Path, folder: Path, seen: tuple[Path, ...] = ()) -> None:
    """requirements.txt read as pip reads it (comments, continued lines, options), every line checked: a
    requirement by name and version, a wheel or archive inside the vendor's folder, or one of the options
    that keep pip to the host's index and the folder (--no-index, --find-links DIR, -r/-c FILE inside);
    files named by -r/-c are checked the same way. Nothing is installed here."""
    source = display_path(path)
    if len(seen) >= MAX_REQUIREMENT_FILES:
        raise ConfigError(source, None, f"-r/-c nested more than {MAX_REQUIREMENT_FILES} files deep")
    seen = (*seen, path.resolve())
    text = read_config_text(path)
    start, pending = 1, ""
    for number, raw in enumerate(text.split("\n"), start=1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1]
            continue
        line, pending = re.sub(r"(^|\s)#.*$", "", pending + raw).strip(), ""
        if line:
            _check_requirement_line(line, f"line {start}", source, folder, seen)


def _check_requirement_line(line: str, where: str, source: str, folder: Path, seen: tuple[Path, ...]) -> None:
    if len(line) > MAX_TEXT:
        raise ConfigError(source, where, f"a line of {len(line)} characters; at most {MAX_TEXT}")
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in line):
        raise ConfigError(source, where, "holds a control character")
    if "$" in line:  # pip expands ${NAME} from its environment: a path or URL the file does not show
        raise ConfigError(source, where, "holds $: pip would expand ${NAME} from the host's environment")
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise ConfigError(source, where, f"cannot be split into words: {exc}") from None
    head = tokens[0]
    if head.startswith("-"):
        option, eq, attached = head.partition("=")
        if option in _REMOTE:
            raise ConfigError(source, where, f"{option} ({_REMOTE[option]}) is not read here: a vendor's "
                                             "requirements come from the host's configured index (pip.conf, "
                                             "PIP_INDEX_URL) or from files in its folder")
        values = ([attached] if eq else []) + tokens[1:]
        if option in _FLAG_OPTIONS and not values:
            return
        if option in _VALUE_OPTIONS and len(values) == 1 and re.fullmatch(r"[A-Za-z0-9._,:-]+", values[0]):
            return
        if option in _FILE_OPTIONS and len(values) == 1:
            target = _local_path(values[0], where, source, folder, option)
            if _FILE_OPTIONS[option] != "find-links":
                if target in seen:
                    raise ConfigError(source, where, f"{option} {values[0]}: includes a file that includes it")
                regular_file(folder, target.relative_to(folder.resolve()), source, where, "the vendor's case folder")
                check_requirements(target, folder, seen)
            return
        raise ConfigError(source, where, f"{head}: not an option read here (read: "
                                         f"{', '.join(sorted([*_FLAG_OPTIONS, *_VALUE_OPTIONS, *_FILE_OPTIONS]))})")
    after = re.search(r"\s--", line)  # pip's per-requirement options follow the requirement
    for option in line[after.start():].split() if after else []:
        if not option.startswith("--hash="):
            raise ConfigError(source, where, f"{option}: only --hash=... may follow a requirement")
    name_part = line[:after.start() if after else None].partition(";")[0].strip()  # before the markers
    if "://" in name_part or re.match(r"(git|hg|svn|bzr)\+", name_part) or "@" in name_part:
        raise ConfigError(source, where, f"{name_part}: a URL or VCS requirement installs from elsewhere: a "
                                         "vendor's requirements come from the host's configured index or from "
                                         "files in its folder")
    if "/" in name_part or name_part.startswith(".") or _ARCHIVE.match(name_part):
        _local_path(name_part, where, source, folder, "a file requirement")
        return
    if not _REQUIREMENT.fullmatch(name_part):
        raise ConfigError(source, where, f"{name_part!r} is not a requirement (name, extras and version "
                                         "specifiers), a wheel or archive in the folder, or an option read here")


def _local_path(value: str, where: str, source: str, folder: Path, what: str) -> Path:
    """A path pip reads (relative to the folder, where pip runs), inside the folder."""
    if "://" in value or value.startswith("file:"):
        raise ConfigError(source, where, f"{what} {value}: a URL: only files in the vendor's folder are read")
    if value.startswith("/"):
        raise ConfigError(source, where, f"{what} {value}: an absolute path: only files in the vendor's folder "
                                         "are read (a path relative to it)")
    return inside(folder, value, source, where, "the vendor's case folder")


def requirement_files(folder: Path) -> list[Path]:
    """What requirements.txt in ``folder`` may name beside it: wheels, archives, constraints and folders (a
    --find-links wheelhouse), csrc/ and extern/ aside. Hashed into its install's cache key; bounded by TREE_LIMITS."""
    return [p for p in sorted(folder.iterdir()) if p.name not in (CSRC_FOLDER, EXTERN_FOLDER)
            and (p.is_dir() or p.name.endswith(_REQUIREMENT_SUFFIXES))]


def _check_tree(folder: Path, root: Path, what: str, top: list[Path] | None = None) -> None:
    """A folder of the adaptation (csrc/, extern/; or ``top``, the entries of the vendor's folder that
    requirements.txt may name): a real folder inside the vendor's case folder, holding folders and regular files
    only, links only to those inside it, and no link to a folder that holds it (a build copies what links point
    to), within TREE_LIMITS: the walk stops at the first entry past a limit."""
    source = given_name(folder)
    inside(root, folder.relative_to(root), source, None, "the vendor's case folder")
    if not folder.is_dir():
        raise ConfigError(source, None, f"{what} must be a folder")
    max_entries, max_bytes = TREE_LIMITS[what]
    name, subject, why = _TREE_WORDS[what]
    chosen = None if top is None else {p.name for p in top}
    entries = total = 0
    real_folder = resolved(folder)  # inside() above followed it already: no loop here
    # A folder to list, where it resolves to, and the folders that hold it. Carrying each folder's resolved path
    # resolves a link from its own folder (one step) instead of from csrc/ down (a step per link above it: a tree of
    # links expanded to 2^15 paths took half a minute), with the same verdict and words as inside() (said by it).
    pending = [(folder, real_folder, (_identity(folder.stat()),))]
    while pending:
        current, real_current, holders = pending.pop()
        try:
            with os.scandir(current) as listing:
                for entry in listing:
                    if chosen is not None and current == folder and entry.name not in chosen:
                        continue
                    entries += 1
                    if entries > max_entries:
                        raise ConfigError(source, None, f"more than {max_entries} files and folders; {subject} at "
                                                        f"most {max_entries} ({why})")
                    path = Path(entry.path)
                    real = real_current / entry.name
                    if entry.is_symlink():
                        real = _link_inside(folder, real_folder, path, real, name)
                    try:
                        info = path.stat()  # links followed, as the build's copy follows them
                    except OSError as exc:
                        raise ConfigError(given_name(path), None, f"cannot read: {exc.strerror}") from None
                    if stat.S_ISDIR(info.st_mode):
                        if _identity(info) in holders:
                            raise ConfigError(given_name(path), None, f"a link to a folder that holds it (a loop): "
                                                                      f"a copy of {name} would never end")
                        pending.append((path, real, (*holders, _identity(info))))
                    elif stat.S_ISREG(info.st_mode):
                        total += info.st_size
                        if total > max_bytes:
                            raise ConfigError(source, None, f"its files hold more than {max_bytes >> 20} MiB (past it "
                                              f"at {given_name(path)}, {info.st_size} bytes); {subject} at most "
                                              f"{max_bytes >> 20} MiB ({why})")
                    else:
                        raise ConfigError(given_name(path), None, f"not a regular file or folder in {name}")
        except OSError as exc:
            raise ConfigError(given_name(current), None, f"cannot read: {exc.strerror}") from None


def _link_inside(folder: Path, real_folder: Path, path: Path, unresolved: Path, name: str) -> Path:
    """Where the link ``path`` leads (``unresolved``: its resolved folder and its name), when that is inside
    ``folder`` (resolved: ``real_folder``); otherwise files.inside's refusal of it, in its words."""
    try:
        target = resolved(unresolved)
    except OSError:  # a loop: inside() says so
        target = None
    if target is None or not target.is_relative_to(real_folder):
        return inside(folder, path.relative_to(folder), given_name(path), None, name)
    return target


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _python_files(folder: Path, problems: list[ConfigError]) -> list[Path]:
    """extern/'s Python files, links followed as a round's import and the build's copy follow them (Path.rglob passes
    over a linked folder, so a file in one went unread): walk_linked's walk of it, every name (a build copies all of
    extern/), each folder once (a loop of links too), bounded at LINK_WALK_LIMIT paths. A link that leads out of
    extern/ is a problem in ``problems`` (files.inside's words, as _check_tree's), and not followed; so is a walk cut
    short (said once per check: one_cut_line_per_check). Each is named by its own name (the folder reached through a
    link named as it is: kernels/x.py, not fused/x.py), a file by its own name before a link to it, so that
    check_extern names each file's findings by that name."""
    root = os.path.realpath(folder)
    try:
        parts = sorted(os.listdir(folder))
    except OSError:  # unreadable: _check_tree says so
        return []
    found: dict[Path, None] = {}
    cut: list[str] = []
    for path, target, real in walk_linked(folder, parts=parts, cut=cut, every=True):
        # its own name: the walk names what is in a folder reached through a link by the link's path
        own = folder / os.path.relpath(os.path.realpath(path.parent), root) / path.name
        if target is not None and not (real == root or real.startswith(root + os.sep)):
            try:
                inside(folder, own.relative_to(folder), given_name(own), None, "the extern folder")
            except ConfigError as exc:
                problems.append(exc)
        elif path.name.endswith(".py") and os.path.isfile(path):
            found[own] = None
    for line in cut:
        first = _first_said(line)
        if first is not None:  # a later file's check: its walk was not whole either
            problems.append(ConfigError(display_path(folder), None,
                                        line.split(": ", 1)[1] if first else _cut_again(folder)))
    return sorted(found, key=lambda p: (_linked(p, folder, root), p))


def _linked(path: Path, folder: Path, root: str) -> bool:
    """Whether ``path`` (below ``folder``, which resolves to ``root``) is reached through a link."""
    return os.path.realpath(path) != os.path.join(root, *path.relative_to(folder).parts)


def check_extern(folder: Path, family: str) -> tuple[str, ...]:
    """extern/'s hooks (the public functions of hooks.py), checked without running anything: each is a named
    extension point of the family, bound last by a ``def`` at the top of hooks.py (nothing rebinds or deletes it
    after) that takes the arguments a round calls it with and returns a value (no async def, no generator), and no
    file of extern/ names what loads weights or builds data. Every finding at once. A decorated def's signature is
    the decorator's to make: checked when a round loads the hooks (load_hooks), not here."""
    known = EXTERN_HOOKS.get(family)
    if known is None:
        raise ConfigError(display_path(folder), None, f"the {family} family has no extension points "
                                                      f"(extern/ is for: {', '.join(sorted(EXTERN_HOOKS))})")
    hooks_file = regular_file(folder, EXTERN_HOOKS_FILE, display_path(folder), None, "the extern folder")
    # Every file's findings together, as the hooks' are: a vendor fixes extern/ in one go, not a name per check.
    problems: list[ConfigError] = []
    trees: dict[Path, ast.Module | None] = {}  # None: not Python (said among the problems)
    for path in _python_files(folder, problems):
        if path.resolve() in trees:  # a link to a file already read (hooks.py -> impl.py): its findings said once
            continue
        try:
            trees[path.resolve()] = tree = _parse(path)
        except ConfigError as exc:
            problems.append(exc)
            trees[path.resolve()] = None
            continue
        forbidden = {(getattr(node, "lineno", 0), problem) for node in ast.walk(tree)
                     if (problem := _forbidden(node)) is not None}
        problems += [ConfigError(display_path(path), f"line {line}" if line else None, problem)
                     for line, problem in sorted(forbidden)]
    if hooks_file.resolve() in trees and trees[hooks_file.resolve()] is None:
        raise gathered(problems)  # no hooks to read in it
    tree = trees.get(hooks_file.resolve()) or _parse(hooks_file)
    source = display_path(hooks_file)
    defined, found = _hook_defs(tree, known, family)
    for name, node in defined.items():
        why = None if node.decorator_list else _signature_problem(node)
        if why:
            found.append((node.lineno, f"{name}: {why}"))
    problems += [ConfigError(source, f"line {line}", message) for line, message in sorted(found)]
    if not defined and not found:
        problems.append(ConfigError(source, None, f"defines no hook (known: {', '.join(sorted(known))})"))
    if problems:
        raise gathered(problems)
    return tuple(defined)


def decorated_hooks(extern: Path, family: str) -> dict[str, int]:
    """The hooks of extern/hooks.py (checked: check_extern) bound by a decorated def, name -> its line: what a round
    calls is what the decorator returns, whose signature reading the file cannot know (load_hooks checks it)."""
    defined, _ = _hook_defs(_parse(extern / EXTERN_HOOKS_FILE), EXTERN_HOOKS.get(family, {}), family)
    return {name: node.lineno for name, node in defined.items() if node.decorator_list}


@dataclass(frozen=True)
class _Binding:
    """A name bound (or deleted) at hooks.py's module scope: how, and in which block at its top (None: at its top)."""

    name: str
    line: int
    how: str
    block: str | None
    node: ast.FunctionDef | ast.AsyncFunctionDef | None = None  # a def's


# try/except* (ast.TryStar) is Python 3.11's; a container's Python may be 3.10 (NGC 24.xx images).
_TRIES: tuple[type, ...] = (ast.Try, *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))
# The statements whose blocks run at module scope, as messages name them.
_BLOCKS: dict[type, str] = {ast.If: "if", ast.For: "for", ast.AsyncFor: "async for", ast.While: "while",
                            **dict.fromkeys(_TRIES, "try"), ast.With: "with", ast.AsyncWith: "async with",
                            ast.Match: "match"}
# Hooks whose generator is what the round wants: a decoding case's model_forward yields per token (the inference
# contract consumes a generator), and `yield from standard(...)` is how a hook keeps a context open while it decodes.
_MAY_YIELD = frozenset({"model_forward"})
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)  # bodies that bind no module name


def _module_bindings(tree: ast.Module) -> list[_Binding]:
    """Every binding of a name at hooks.py's module scope, in source order: in its statements and in the statement
    lists of the blocks they hold (if, for, while, try, try/except*, with, match, async for and with), never in a
    class's or a function's body (a def there binds an attribute or a local, not a name of the module)."""
    found: list[_Binding] = []

    def targets(node: ast.AST | None, how: str, line: int, block: str | None) -> None:
        found.extend(_Binding(name.id, line, how, block) for name in _walk_scope(node) if isinstance(name, ast.Name)
                     and isinstance(name.ctx, ast.Store | ast.Del))

    def walrus(nodes: list[Any], block: str | None) -> None:
        for node in nodes:
            found.extend(_Binding(inner.target.id, inner.lineno, "assigned by :=", block)
                         for inner in _walk_scope(node) if isinstance(inner, ast.NamedExpr))

    def body(statements: list[ast.stmt], block: str | None) -> None:
        for node in statements:
            statement(node, block)

    def statement(node: ast.stmt, block: str | None) -> None:
        inner = block or _BLOCKS.get(type(node))  # the block at the top of hooks.py it lies in
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            walrus([*node.decorator_list, *node.args.defaults, *node.args.kw_defaults], block)
            found.append(_Binding(node.name, node.lineno, "defined", block, node))
        elif isinstance(node, ast.ClassDef):
            walrus([*node.decorator_list, *node.bases], block)
            found.append(_Binding(node.name, node.lineno, "a class", block))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.extend(_Binding(alias.asname or alias.name.partition(".")[0], node.lineno, "imported", block)
                         for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            walrus([node.value], block)
            if not isinstance(node, ast.AnnAssign) or node.value is not None:  # `x: int` alone binds nothing
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    targets(target, "assigned", node.lineno, block)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                targets(target, "deleted", node.lineno, block)
        elif isinstance(node, ast.For | ast.AsyncFor):
            walrus([node.iter], block)
            targets(node.target, "a for loop's variable", node.lineno, inner)
            body(node.body, inner)
            body(node.orelse, inner)
        elif isinstance(node, ast.If | ast.While):
            walrus([node.test], block)
            body(node.body, inner)
            body(node.orelse, inner)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                walrus([item.context_expr], block)
                targets(item.optional_vars, "bound by `with ... as`", node.lineno, inner)
            body(node.body, inner)
        elif isinstance(node, _TRIES):
            body(node.body, inner)
            for handler in node.handlers:
                walrus([handler.type], inner)
                if handler.name:
                    found.append(_Binding(handler.name, handler.lineno, "bound by `except ... as`", inner))
                body(handler.body, inner)
            body(node.orelse, inner)
            body(node.finalbody, inner)
        elif isinstance(node, ast.Match):
            walrus([node.subject], block)
            for case in node.cases:
                found.extend(_Binding(name, case.pattern.lineno, "a case pattern's capture", inner)
                             for name in _captures(case.pattern))
                walrus([case.guard], inner)
                body(case.body, inner)
        else:  # an expression, a return, raise, assert, global ...: only a := in it binds
            walrus([node], block)

    body(tree.body, None)
    return found


def _walk_scope(node: ast.AST | None) -> Iterator[ast.AST]:
    """``node`` and what lies in it, not inside a nested scope (a lambda's body binds no name of the module)."""
    pending = [node] if node is not None else []
    while pending:
        current = pending.pop()
        yield current
        if not isinstance(current, _SCOPES):
            pending.extend(ast.iter_child_nodes(current))


def _captures(pattern: ast.pattern) -> list[str]:
    """The names a match statement's case pattern binds."""
    names = []
    for node in ast.walk(pattern):
        name = (node.name if isinstance(node, ast.MatchAs | ast.MatchStar) else
                node.rest if isinstance(node, ast.MatchMapping) else None)
        if name:
            names.append(name)
    return names


def _hook_defs(tree: ast.Module, known: Mapping[str, str], family: str) -> tuple[
        dict[str, ast.FunctionDef | ast.AsyncFunctionDef], list[tuple[int, str]]]:
    """hooks.py's hooks, name -> the def a round takes (the extension points bound last by a def at the file's top,
    in file order), and why each other binding of a hook, and each public def that is no hook, is one a round
    could not use: (line, message naming it). A run takes only the top-level defs as hooks (the file is read, never
    run, to know them): a hook bound otherwise (imported, assigned, a class, a def inside an if or try) would
    silently never be called, and one rebound or deleted after its def would be another object, or none (a
    traceback as the round loads the hooks)."""
    bindings = _module_bindings(tree)
    last = {binding.name: binding for binding in bindings}  # what a run of the file leaves bound
    found: list[tuple[int, str]] = []
    named: set[str] = set()
    for binding in bindings:
        if binding.node is not None and binding.block is None and binding.name not in known \
                and not binding.name.startswith("_") and binding.name not in named:
            named.add(binding.name)
            close = nearest(binding.name, known)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            found.append((binding.line, f"{binding.name} is not an extension point of the {family} family ({hint}"
                                        f"known: {', '.join(sorted(known))}; a helper's name starts with _)"))
    defined: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for name, binding in last.items():
        if name not in known:
            continue
        if binding.node is not None and binding.block is None:
            defined[name] = binding.node
            continue
        how = binding.how if binding.block is None else \
            f"{binding.how} inside {'an' if binding.block[0] in 'aeiou' else 'a'} `{binding.block}` block"
        before = next((b for b in reversed(bindings) if b.name == name and b.node is not None and b.block is None
                       and b.line < binding.line), None)
        if before is not None and binding.how == "deleted":
            why = (f"{how} after its def at line {before.line}: once hooks.py has run there is no {name}, so a round "
                   "would fail as it loads the hooks; keep the def, drop the del")
        elif before is not None:
            why = (f"{how} after its def at line {before.line}: a round would call what the name is bound to last, "
                   "not that def; bind it by the def alone")
        else:
            why = (f"{how}: a hook is a def at the top of hooks.py (a run reads the file, never runs it, to find its "
                   f"hooks), so this one would never be called; write `def {name}({', '.join(HOOK_PARAMETERS[name])}):`"
                   " there (it may call what it imports)")
        found.append((binding.line, f"{name}: {why}"))
    return defined, found


def _signature_problem(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """Why a round's call of the hook (HOOK_PARAMETERS' arguments, positionally) would fail or misuse it, or None."""
    expected = HOOK_PARAMETERS[node.name]
    call = f"a round calls it as {node.name}({', '.join(expected)}), with {len(expected)} argument(s)"
    if isinstance(node, ast.AsyncFunctionDef):
        return f"async def: {call} and uses what it returns, which would be a coroutine"
    if node.name not in _MAY_YIELD and any(isinstance(inner, ast.Yield | ast.YieldFrom)
                                           for statement in node.body for inner in _walk_scope(statement)):
        return f"a generator (it yields): {call} and uses what it returns, which would be a generator"
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    written = ast.unparse(args)
    if required > len(expected):
        return f"def {node.name}({written}) needs {required} argument(s), but {call}"
    if len(positional) < len(expected) and args.vararg is None:
        return f"def {node.name}({written}) takes {len(positional)} argument(s), but {call}"
    keyword_only = [arg.arg for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                    if default is None]
    if keyword_only:
        return (f"def {node.name}({written}) needs the keyword argument(s) {', '.join(keyword_only)}, but {call} "
                "and no keyword")
    return None


def _parse(path: Path) -> ast.Module:
    """A file of extern/, parsed (never imported); input the parser cannot take is one line too."""
    source = display_path(path)
    try:
        return ast.parse(read_config_text(path), filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(source, f"line {exc.lineno}" if exc.lineno else None, f"invalid Python: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ConfigError(source, None, "cannot be parsed as Python (nested too deeply)") from None


def _forbidden(node: ast.AST) -> str | None:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if isinstance(node, ast.alias):
        name = node.asname or node.name.rpartition(".")[2]
    if name in FORBIDDEN_NAMES:
        return f"{name}: {FORBIDDEN_NAMES[name]}"
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return FORBIDDEN_CALLS.get((node.value.id, node.attr))
    return None


def read_adaptation(case_folder: Path, case: str, family: str, vendor: str, vendor_folder: Path | None = None
                    ) -> Adaptation | None:
    """The vendor's adaptation of the case, checked; None when the vendor has none. Raises at the first
    problem (adaptation_problems names all of them). ``vendor_folder``: the vendor's (adaptation_places)."""
    place = adaptation_place(case_folder, vendor, vendor_folder)
    if not place.present:
        return None  # no folder (vendor/<vendor>.yaml is the vendor's overrides file, not an adaptation)
    folder = place.checked()
    env, requirements, csrc, extern = _read_env(folder), _read_requirements(folder), _read_csrc(folder), \
        _read_extern(folder)
    if not (env or is_present(folder / ENV_FILE) or requirements or csrc or is_present(folder / EXTERN_FOLDER)):
        return None  # a folder of scale files alone (config_<hw>x<n>x<p>.yaml) adapts nothing
    hooks = check_extern(extern, family) if extern is not None else ()
    return Adaptation(case=case, family=family, vendor=vendor, folder=folder, env=env, requirements=requirements,
                      csrc=csrc, extern=extern, hooks=hooks)


def adaptation_problems(case_folder: Path, family: str, vendor: str, vendor_folder: Path | None = None
                        ) -> list[ConfigError]:
    """Every problem of the vendor's adaptation of the case, each part checked on its own (read_adaptation
    stops at the first): `flagperf vendor check` names them all in one go."""
    try:
        place = adaptation_place(case_folder, vendor, vendor_folder)
        if not place.present:
            return []
        folder = place.checked()
    except ConfigError as exc:
        return [exc]  # in two places, or a folder leading out: nothing in it is read
    problems = []
    for part in _PARTS:
        try:
            found = part(folder)
            if part is _read_extern and found is not None:
                check_extern(found, family)  # its files parsed only once the folder's size is known
        except ConfigError as exc:
            problems.append(exc)
    return problems


def _read_env(folder: Path) -> dict[str, str]:
    if not is_present(folder / ENV_FILE):
        return {}
    return parse_env_file(regular_file(folder, ENV_FILE, given_name(folder), None, "the vendor's case folder"))


def _read_requirements(folder: Path) -> Path | None:
    requirements = folder / REQUIREMENTS_FILE
    if not is_present(requirements):
        return None
    check_requirements(regular_file(folder, REQUIREMENTS_FILE, given_name(folder), None, "the vendor's case folder"),
                       folder)
    for local in sorted(folder.iterdir()):  # what requirements.txt may name: hashed into its cache key
        if local.is_symlink():
            inside(folder, local.name, given_name(local), None, "the vendor's case folder")
    _check_tree(folder, folder, REQUIREMENTS_FILES, requirement_files(folder))
    return requirements


def _read_csrc(folder: Path) -> Path | None:
    csrc = folder / CSRC_FOLDER
    if not is_present(csrc):
        return None
    _check_tree(csrc, folder, "csrc")
    regular_file(csrc, CSRC_SETUP, given_name(csrc), None, "the csrc folder")
    return csrc


def _read_extern(folder: Path) -> Path | None:
    extern = folder / EXTERN_FOLDER
    if not is_present(extern):
        return None
    _check_tree(extern, folder, "extern")
    return extern


# In the order a run reads them (read_adaptation raises at the first problem in this order).
_PARTS: tuple[Callable[[Path], Any], ...] = (_read_env, _read_requirements, _read_csrc, _read_extern)


def tree_digest(*parts: Path | str) -> str:
    """sha256 over files (a folder's regular files by relative path, links not followed) and strings: the
    cache key of an install or a build, so that the same content is built once."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            digest.update(b"S" + part.encode() + b"\0")
            continue
        files = [part] if part.is_file() else sorted(p for p in part.rglob("*") if p.is_file() and not p.is_symlink())
        for path in files:
            rel = path.name if path == part else path.relative_to(part).as_posix()
            digest.update(b"F" + rel.encode() + b"\0")
            hash_file(digest, path)  # in pieces: a wheel beside requirements.txt may be large
            digest.update(b"\0")
    return digest.hexdigest()


def load_hooks(adaptation: Adaptation | None) -> dict[str, Callable[..., Any]]:
    """extern/hooks.py imported (where the case runs, never by `flagperf validate`): hook name -> function.
    extern/ is put on sys.path first, so that hooks.py can import its sibling modules."""
    if adaptation is None or adaptation.extern is None:
        return {}
    from flagperf.config.vendors import import_file

    folder = str(adaptation.extern)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = import_file(adaptation.extern / EXTERN_HOOKS_FILE,
                         f"flagperf_extern_{adaptation.vendor}_{adaptation.case}".replace("-", "_").replace(".", "_"),
                         family=adaptation.family)
    hooks: dict[str, Callable[..., Any]] = {}
    for name in adaptation.hooks:  # what running the file left bound, which reading it cannot see (a decorator's)
        hook = vars(module).get(name, _UNBOUND)
        problem = _loaded_hook_problem(name, hook)
        if problem:
            raise ConfigError(display_path(adaptation.extern / EXTERN_HOOKS_FILE), None, f"{name}: {problem}")
        hooks[name] = hook
    return hooks


_UNBOUND = object()


def _loaded_hook_problem(name: str, hook: Any) -> str | None:
    """Why a round could not call the hook hooks.py left bound once it ran (None: it can): gone, not a function, a
    coroutine or generator function, or a signature that does not take the round's call (a decorator's own, as it
    is: the function it wraps is not what the round calls)."""
    call = f"a round calls it as {name}({', '.join(HOOK_PARAMETERS[name])})"
    if hook is _UNBOUND:
        return f"not defined once hooks.py has run (it deleted the name as it ran): {call}"
    if not callable(hook):
        return f"bound to a {type(hook).__name__}, not a function, once hooks.py has run: {call}"
    if inspect.iscoroutinefunction(hook) or inspect.isasyncgenfunction(hook):
        return f"async once hooks.py has run: {call} and uses what it returns, which would be a coroutine"
    if inspect.isgeneratorfunction(hook) and name not in _MAY_YIELD:
        return f"a generator once hooks.py has run: {call} and uses what it returns, which would be a generator"
    try:
        inspect.signature(hook, follow_wrapped=False).bind(*HOOK_PARAMETERS[name])
    except ValueError:  # no signature to read (a builtin's): the call itself says
        return None
    except TypeError as exc:
        return f"its signature once hooks.py has run, {name}{inspect.signature(hook, follow_wrapped=False)}, does " \
               f"not take the call ({exc}): {call}"
    return None
