"""Where a vendor's files of a case go, and what a misplaced one is told: files in the wrong place are never
read, so a vendor who copied FlagPerf's layout (``<model>-<framework>/config/...``) would otherwise see a run
that silently ignores them. Used by `flagperf vendor check` and `flagperf validate`; reads names only.

    cases/<family>/<case>/vendor/<vendor>.yaml                 overrides (base, training, operation, generate)
    cases/inference/<case>/vendor/<vendor>_configurations.yaml overrides (inference: FlagPerf's name)
    cases/<family>/<case>/vendor/<vendor>/                     the adaptation (flagperf.config.adaptation)
      config_<hw>x<nnodes>x<nproc>.yaml|.py                    training only; <hw> is vendor.yaml's hardware
    <vendor folder>/cases/<family>/<case>/                     the same files (the overrides by the same name
                                                               beside the adaptation's), kept in the vendor's own
                                                               folder (never one file in both places)
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Collection, Iterable
from pathlib import Path, PurePosixPath

from flagperf.config.adaptation import (
    CSRC_FOLDER,
    CSRC_SETUP,
    ENV_FILE,
    EXTERN_FOLDER,
    EXTERN_HOOKS_FILE,
    REQUIREMENTS_FILE,
    VENDOR_CASES_FOLDER,
    Place,
    adaptation_places,
    walk_linked,
)
from flagperf.config.cases import INFERENCE_FILES, CaseDef, resolve_case_config
from flagperf.config.cases import MANIFEST as CASE_MANIFEST
from flagperf.config.files import given_name
from flagperf.config.vendors import MANIFEST as VENDOR_MANIFEST
from flagperf.errors import ConfigError, FlagperfError, unknown_name
from flagperf.paths import display_path

SCALE_FILE = re.compile(r"config_([A-Za-z0-9_.-]+)x(\d+)x(\d+)\.(yaml|py)")
ADAPTATION_ENTRIES = (ENV_FILE, REQUIREMENTS_FILE, CSRC_FOLDER, EXTERN_FOLDER)
CASE_FILES = (CASE_MANIFEST, INFERENCE_FILES[0])  # what makes a folder a case
FLAGPERF_CONFIG_FOLDER = "config"  # FlagPerf's <vendor>/<model>-<framework>/config/: its files go one level up here


def overrides_name(family: str, vendor: str) -> str:
    """The vendor's overrides file of a case of ``family`` (flagperf.config.cases.CaseDef.vendor_file)."""
    return f"{vendor}_configurations.yaml" if family == "inference" else f"{vendor}.yaml"


def overrides_vendor(file_name: str) -> str:
    """The vendor an overrides file of vendor/ is for, by its name (acme.yaml, acme_configurations.yaml: acme)."""
    stem = file_name.rsplit(".", 1)[0] if file_name.endswith((".yaml", ".yml")) else file_name
    return stem.removesuffix("_configurations")


def misnamed_overrides(case_folder: Path, family: str, vendor: str, vendor_folder: Path | None = None
                       ) -> list[tuple[Path, str]]:
    """Files of the case's vendor/, or of the vendor folder's cases/<family>/<case>/ (``vendor_folder``; by default
    the one `--vendor <vendor>` finds), that look like this vendor's overrides but are not the name a run reads."""
    right = overrides_name(family, vendor)
    found = []
    places = adaptation_places(case_folder, vendor, vendor_folder)
    for folder, shown in ((case_folder / "vendor", f"vendor/{right}"),
                          *((place.folder, f"{right} in {given_name(place.folder)}") for place in places[1:])):
        for name in (f"{vendor}.yaml", f"{vendor}.yml", f"{vendor}_configurations.yaml",
                     f"{vendor}_configurations.yml"):
            path = folder / name
            if name != right and (path.is_file() or path.is_symlink()):
                found.append((path, f"never read: the vendor overrides of {family} cases are {shown}"))
    return found


def scale_file_problem(name: str, family: str, vendor: str, hardware: str | None) -> str | None:
    """What is wrong with a scale file's name in vendor/<vendor>/ (None: a run of this vendor reads it).
    ``hardware`` None: the vendor's <hw> is not known here (not installed), so any <hw> passes."""
    match = SCALE_FILE.fullmatch(name)
    if match is None:
        return None
    if family != "training":
        return (f"never read: only training cases read scale files; the settings of {family} cases go in "
                f"vendor/{overrides_name(family, vendor)}")
    if hardware is not None and match.group(1) != hardware:
        return (f"never read: <hw> {match.group(1)!r} is not vendor {vendor}'s hardware {hardware!r} (vendor.yaml "
                f"hardware, the vendor name when absent), so a run reads config_{hardware}x{match.group(2)}x"
                f"{match.group(3)}.{match.group(4)}")
    return None


def stray_entry_problem(entry: Path, family: str, vendor: str) -> str | None:
    """An entry of the vendor's folder of a case (vendor/<vendor>/, or the vendor folder's cases/<family>/<case>/)
    that no run reads, when it looks like one a vendor meant to be read."""
    home = given_name(entry.parent)
    if entry.name == FLAGPERF_CONFIG_FOLDER and entry.is_dir():
        return (f"never read: FlagPerf's config/ folder is not used here; {ENV_FILE}, {REQUIREMENTS_FILE} and "
                f"config_<hw>x<nnodes>x<nproc>.yaml go directly in {home}/")
    if entry.name in (f"{vendor}_requirements.txt", "requirements.sh", "env.sh", "environment_variables.txt"):
        return f"never read: the names read here are {ENV_FILE} and {REQUIREMENTS_FILE}"
    if entry.name in (CSRC_SETUP, EXTERN_HOOKS_FILE):
        sub = CSRC_FOLDER if entry.name == CSRC_SETUP else EXTERN_FOLDER
        return f"never read: {entry.name} goes in {home}/{sub}/"
    if entry.parent.parent.name == "vendor" and entry.name == overrides_name(family, vendor):
        # read in the vendor folder's cases/<family>/<case>/, but in the case the settings file is beside vendor/<v>/
        return f"never read: the settings file of a case goes in its vendor/ folder, as vendor/{entry.name}"
    return None


def adaptation_listing(case: CaseDef, vendor: str, hardware: str | None, place: Place,
                       vendor_folder: Path | None = None, check_vendor: bool = True
                       ) -> tuple[list[str], list[ConfigError]]:
    """The entries of the vendor's folder of the case (``place``: adaptation_place's) by the rules a run lists it
    with: an entry no run reads (a scale file of another <hw> or family, FlagPerf's config/, a misnamed file:
    scale_file_problem, stray_entry_problem) is a finding, and each scale file is read as a run of that scale reads
    it. Returns (the scale files read, every finding). The one listing of `vendor check` and of `flagperf validate`
    of a case.yaml, so that the two cannot disagree about a file. ``hardware`` None with ``check_vendor`` False: a
    vendor not installed here, whose <hw> is unknown: each scale file is read with its own <hw>, without the
    vendor's engines (resolve_case_config's check_vendor)."""
    read: list[str] = []
    problems: list[ConfigError] = []
    # A link as the folder is listed where it stays inside its root, as a run reads it (one leading out is
    # adaptation_problems' to name: nothing in it is read).
    try:
        if not (place.present and os.path.isdir(place.folder)):
            return read, problems
        place.checked()
    except ConfigError:
        return read, problems
    try:
        entries = sorted(place.folder.iterdir())
    except OSError as exc:  # unreadable: one line, naming the folder
        return read, [ConfigError(display_path(place.folder), None, f"cannot be listed: {exc.strerror or exc}")]
    for entry in entries:
        problem = (scale_file_problem(entry.name, case.family, vendor, hardware)
                   or stray_entry_problem(entry, case.family, vendor))
        if problem:
            problems.append(ConfigError(display_path(entry), None, problem))
            continue
        scale = SCALE_FILE.fullmatch(entry.name)
        if scale:
            sizes = {"nnodes": int(scale.group(2)), "nproc_per_node": int(scale.group(3))}
            try:
                resolve_case_config(case, vendor=vendor, run_overrides=[(str(entry), sizes)],
                                    hardware=hardware if hardware is not None else scale.group(1),
                                    vendor_folder=vendor_folder, check_vendor=check_vendor)
                read.append(entry.name)
            except ConfigError as exc:
                problems.append(exc)
            except FlagperfError as exc:  # not a file's finding: said as this file's
                problems.append(ConfigError(display_path(entry), None, str(exc)))
    return read, problems


FLAGPERF_IMAGE_FOLDER = "docker_image"  # FlagPerf's <vendor>/docker_image/<framework>/: here <vendor>/<framework>/
FLAGPERF_CASE_PARTS = (FLAGPERF_CONFIG_FOLDER, CSRC_FOLDER, EXTERN_FOLDER)  # what its <model>-<framework>/ holds
# FlagPerf's <model>-<framework> (glm-pytorch, llama2_7b-megatron): a folder of another name is the vendor's own.
FLAGPERF_CASE_FOLDER = re.compile(r".+-[A-Za-z][A-Za-z0-9_]*")
DOCKERFILE = "Dockerfile"


def read_top_entries(folder: Path, dockerfile: str, also: Iterable[str] = (), cut: list[str] | None = None
                     ) -> set[str]:
    """The names at the top of a vendor folder that a run reads, which no rule of FlagPerf's layout may call never
    read: container.dockerfile's folder (docker_image/ where it is docker_image/pytorch/Dockerfile), every
    <folder>/Dockerfile's (the build context of another framework's image, config/ and all), cases/ and every
    folder a relative link in cases/ leads into (a case's files kept in a folder of their own), and ``also`` (the
    engine and toolkit folders, by the families' names). ``cut``: walk_linked's, where the walk of cases/ stopped
    short (a folder a link there leads into may then be missing from the names)."""
    read = {VENDOR_CASES_FOLDER, *also}
    top = PurePosixPath(posixpath.normpath(dockerfile)).parts
    if len(top) > 1:
        read.add(top[0])
    read |= {path.parent.name for path in folder.glob(f"*/{DOCKERFILE}")}
    home = os.path.realpath(folder)
    read |= {os.path.relpath(real, home).split(os.sep)[0] for _, _, real in walk_linked(folder, cut=cut)
             if real.startswith(home + os.sep)}
    return read


def flagperf_vendor_entry_problem(entry: Path, vendor: str, dockerfile: str, monitor_scripts: set[str],
                                  cases: dict[str, Path], read: Collection[str]) -> str | None:
    """Why an entry at the top of a vendor folder, laid out as FlagPerf's training/<vendor>/ is, is never read here
    (None: nothing to say): its docker_image/<framework>/ (the image is built from <framework>/Dockerfile), its
    <vendor>_monitor.py (a monitor runs only when vendor.yaml's monitors lists it, and takes other arguments; paths in
    ``monitor_scripts`` normalised), its <model>-<framework>/ folders of config/, csrc/ and extern/ (a case's files go
    in cases/<family>/<case>/). A vendor who copied its FlagPerf folder would otherwise see each silently ignored.
    ``cases``: name -> folder; ``read``: the names a run reads (read_top_entries), never reported."""
    if entry.name in read:
        return None
    if entry.name == FLAGPERF_IMAGE_FOLDER and entry.is_dir():
        return (f"never read: FlagPerf's {FLAGPERF_IMAGE_FOLDER}/ folder is not used here: the image is built from "
                f"<framework>/Dockerfile beside vendor.yaml (container.dockerfile: {dockerfile}); move "
                f"{FLAGPERF_IMAGE_FOLDER}/<framework>/ up one level")
    if entry.name == f"{vendor}_monitor.py" and entry.name not in {posixpath.normpath(script)
                                                                   for script in monitor_scripts}:
        return ("never run: FlagPerf's <vendor>_monitor.py is a monitor here only once vendor.yaml lists it "
                f"(monitors: [{{name: {vendor}, script: {entry.name}}}]), and a monitor here takes --out FILE "
                "--interval S --max-seconds N --pid-file F --parent-pid P, not -o start|stop and -l (the monitor "
                f"`flagperf vendor new` writes, monitor_{vendor}.py, is the template)")
    if FLAGPERF_CASE_FOLDER.fullmatch(entry.name) and entry.is_dir() \
            and any((entry / part).is_dir() for part in FLAGPERF_CASE_PARTS):
        model = entry.name.rsplit("-", 1)[0]  # FlagPerf's <model>-<framework>
        home = cases.get(model)
        where = (f"{VENDOR_CASES_FOLDER}/{home.parent.name}/{model}/" if home is not None
                 else f"{VENDOR_CASES_FOLDER}/<family>/<case>/")
        return (f"never read: FlagPerf's <model>-<framework>/ folder is not used here: a case's files go in {where} "
                f"of this folder ({ENV_FILE} and {REQUIREMENTS_FILE} directly there, no {FLAGPERF_CONFIG_FOLDER}/; "
                f"{CSRC_FOLDER}/ and {EXTERN_FOLDER}/ beside them)")
    return None


def misplaced_adaptation_file(path: Path, adaptation: Path, shown_from: Path | None = None) -> str | None:
    """A file `flagperf validate` was given inside a vendor's case folder, but not where a run reads it.
    ``shown_from``: the folder the message names the right place from (the case's, by default)."""
    expected = {ENV_FILE: adaptation / ENV_FILE, REQUIREMENTS_FILE: adaptation / REQUIREMENTS_FILE,
                CSRC_SETUP: adaptation / CSRC_FOLDER / CSRC_SETUP,
                EXTERN_HOOKS_FILE: adaptation / EXTERN_FOLDER / EXTERN_HOOKS_FILE}.get(path.name)
    if expected is None or path.parent.resolve() == expected.parent.resolve():
        return None
    where = expected.relative_to(shown_from or adaptation.parent.parent)
    return f"never read: a run reads {where} (FlagPerf's config/ folder is not used here)"


def vendor_cases_entry(path: Path) -> tuple[Path, str, str] | None:
    """(vendor folder, family, case) when ``path`` is a vendor folder's cases/<family>/<case>/ (the folder beside
    cases/ holds vendor.yaml), else None: the place a vendor kept outside the project keeps its files of a case."""
    vendor = path.parent.parent.parent
    if path.parent.parent.name != VENDOR_CASES_FOLDER or not (vendor / VENDOR_MANIFEST).is_file() \
            or any((path / name).exists() for name in CASE_FILES):  # a case folder itself is not one
        return None
    return vendor, path.parent.name, path.name


def vendor_case_problem(family: str, name: str, cases: dict[str, Path]) -> str | None:
    """Why a vendor folder's cases/<family>/<name>/ is never read (None: it is the case ``name``'s, of ``family``):
    no case has the name (the nearest named), or the case is of another family. ``cases``: name -> case folder."""
    home = cases.get(name)
    if home is None:
        same = [case for case, folder in cases.items() if folder.parent.name == family]
        return "never read: " + unknown_name(f"{family} case", name, same or cases, "flagperf list cases")
    if home.parent.name != family:
        return (f"never read: {name} is a {home.parent.name} case: its folder here is {VENDOR_CASES_FOLDER}/"
                f"{home.parent.name}/{name}/")
    return None
