"""`flagperf vendor check FOLDER`: what FlagPerf's vendor guide asks of a first-time vendor, checked on one
folder, one line per finding.

  manifest       vendor.yaml loads (the same model `flagperf run` uses); every file it names that is missing, at once;
                 whether `--vendor <name>` finds this folder
  device         torch knows torch_device and, where the device is present, has what the cases call
  image          the Dockerfile, an install step (a RUN line or FlagPerf's <framework>_install.sh) and every file
                 the Dockerfile copies are there; so for every other <framework>/Dockerfile, with a note that only a
                 FlagPerf host.yaml naming its framework builds it
  monitors       each is run for a few seconds here, as a round runs it: a header, samples with a timestamp, a
                 vendor script's per-device figures in a `devices` list (utilisation and memory; power and
                 temperature recommended), a footer; a monitor whose tool is missing says why and is reported as
                 not checkable here
  peaks          the spec table: built here when the device is present (every figure with a source, every key one
                 a case reads), else not checkable here; a table of the wrong form is a problem wherever it is
                 built; datasheets.yaml entries (the convention of the shipped vendors) each with a source
  engines        the families whose cases need an engine folder of the vendor (inference, operation, generate)
  links          a link anywhere in the vendor folder (a monitor script, a file of cases/ or of an engine, ...)
                 whose target is an absolute path: a round's container has the folder at another path; and a
                 relative one that leads out of the folder, by the round's own link scan (hosts.local.describe_paths)
  adaptations    every case's files of this vendor, read as a run reads them: the overrides file, the training
                 scale files, the vendor/<vendor>/ folder (or the vendor folder's cases/<family>/<case>/) with the
                 forbidden-change checks (flagperf.config.adaptation); files a run would never read (FlagPerf's
                 config/ folder, a scale file of another <hw>, an overrides file of the wrong name, a folder of the
                 vendor's cases/ that is no case's, FlagPerf's docker_image/, <vendor>_monitor.py and
                 <model>-<framework>/ at the top of the vendor folder) are problems; what only a run checks (a hook's
                 result) a note
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from flagperf.config.adaptation import (
    CSRC_FOLDER,
    CSRC_SETUP,
    ENV_FILE,
    EXTERN_FOLDER,
    EXTERN_HOOKS_FILE,
    HOOK_PARAMETERS,
    REQUIREMENTS_FILE,
    RUN_TIME_CHECKS,
    VENDOR_CASES_FOLDER,
    absolute_links,
    adaptation_place,
    adaptation_places,
    adaptation_problems,
    decorated_hooks,
    read_adaptation,
    vendor_folder_links,
)
from flagperf.config.casecode import case_code_not_run
from flagperf.config.cases import CaseDef, available_cases, load_case, resolve_case_config
from flagperf.config.engines import ENGINE_MANIFEST, INFERENCE_ENGINES, engine_roots
from flagperf.config.files import given_name, is_present, read_config_text, regular_file
from flagperf.config.models import FACT_KEYS, load_model, pydantic_error_to_config_error
from flagperf.config.vendorlayout import (
    SCALE_FILE,
    adaptation_listing,
    flagperf_vendor_entry_problem,
    misnamed_overrides,
    overrides_name,
    read_top_entries,
    vendor_case_problem,
)
from flagperf.config.vendors import (
    MANIFEST,
    SEARCH_ORDER,
    TOOLKITS_FOLDER,
    Vendor,
    VendorManifest,
    available_vendors,
    import_file,
    load_vendor_manifest,
    peak_problem,
    shadowed_by,
    shadowed_message,
    vendor_folders,
)
from flagperf.config.yamlio import parse_yaml_text
from flagperf.errors import ConfigError, FlagperfError, finding_key, findings, left_out_line, one_line, unknown_name
from flagperf.hosts.buildsteps import (
    PACKAGES,
    RUN_FLAGS,
    BuildWrites,
    Instruction,
    Named,
    Shell,
    as_glob,
    copy_parts,
    dockerfile_instructions,
    heredocs,
    run_by_pattern,
    run_scripts,
    shell_lines,
    shell_words,
)
from flagperf.hosts.container_policy import PathFacts, is_under, leaving_link_words, vendor_container_problems
from flagperf.hosts.local import describe_paths
from flagperf.hosts.vendorscaffold import TODO
from flagperf.paths import PROJECT_ROOT, display_path, skipped_in_source
from flagperf.results.schema import SpecTable

MONITOR_SECONDS = 3.0
REQUIRED_FIELDS = ("util_percent", "mem_used_bytes")
RECOMMENDED_FIELDS = ("power_w", "temp_c")
# What each of those is, and the stem a vendor's own name for it starts with (mem_used_mb, temperature, power):
# such a field is read by no part of the analysis, so its figures would be silently missing from every report.
FIELD_MEANING = {"util_percent": ("util", "%, 0 to 100"), "mem_used_bytes": ("mem_used", "bytes"),
                 "power_w": ("power", "watts"), "temp_c": ("temp", "degrees Celsius")}
# What a round passes every monitor (flagperf.monitoring.monitor_arguments), and argparse's refusal of it.
MONITOR_ARGUMENTS = "--out FILE --interval S --max-seconds N --pid-file F --parent-pid P"
ARGPARSE_ERROR = re.compile(r"error: (the following arguments are required|unrecognized arguments|argument )")
MIN_DEVICE_MEMORY = 2**26  # 64 MiB: a mem_total_bytes below it is a count of MiB or MB, not of bytes
# The engine folders a family's cases choose from (the families' own constants: flagperf.inference.engines'
# INFERENCE_ENGINES, flagperf.operation.impls.IMPLEMENTATIONS_FOLDER, flagperf.generate.engines.ENGINES_FOLDER;
# tests/unit/test_vendor_check.py holds them equal).
ENGINE_FOLDERS = {"inference": INFERENCE_ENGINES, "operation": "operation", "generate": "generate"}


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    not_checkable: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seen: set[tuple[str, str | None, str]] = field(default_factory=set)  # the errors' findings added (finding_key)

    def problem(self, where: str, what: str) -> None:
        self.add_problem(f"{where}: {what}")

    def add_problem(self, line: str) -> None:
        """Once: the overrides file is read again with each of the case's scale files (its error with it)."""
        if line not in self.problems:
            self.problems.append(line)

    def add_error(self, error: FlagperfError) -> None:
        """Each finding an error gathered (every refused key of a file, not its first only), each once."""
        for finding in findings(error):
            if finding_key(finding) not in self.seen:  # by what it says: two long lines may be shortened alike
                self.seen.add(finding_key(finding))
                self.problems.append(str(finding))
        more = left_out_line(error)
        if more:
            source = getattr(error, "source", None)
            self.add_problem(more if source is None else one_line(more, lead=f"{source}:"))


def resolve_vendor_argument(given: Path) -> Path:
    """A folder as given; a bare name that is no folder here is the vendor --vendor would find by that name
    (vendor_images/, FLAGPERF_VENDOR_PATH), so `flagperf vendor check acme` checks what a run would use."""
    if is_present(given / MANIFEST) or len(given.parts) != 1:
        return given
    vendors = available_vendors()
    if given.name in vendors:
        return vendors[given.name]
    if not given.exists():
        raise ConfigError(str(given), None, "no such folder, nor a vendor of that name: "
                          + unknown_name("vendor", given.name, vendors, "flagperf list vendors"))
    return given


def check_vendor_folder(folder: Path, monitor_seconds: float = MONITOR_SECONDS) -> Findings:
    """Raises ConfigError when the folder is not a vendor folder at all (the user's error)."""
    if not is_present(folder / MANIFEST):  # a dangling link is the vendor's (vendor_search): loading it says so
        raise ConfigError(str(folder), None, f"not a vendor folder (no {MANIFEST})")
    found = Findings()
    try:
        manifest = load_vendor_manifest(folder / MANIFEST)
    except FlagperfError as exc:
        found.add_error(exc)
        found.problems.extend(_other_missing_files(folder, str(exc)))
        return found
    found.passed.append(f"manifest {display_path(folder / MANIFEST)}")
    vendor = Vendor(manifest=manifest, location=str(folder.resolve()))
    _check_found_by_name(vendor, found)
    _check_device(vendor, found)
    _check_container(vendor, found)
    _check_image(vendor, found)
    for entry in manifest.monitors:
        source = display_path(vendor.folder / entry.script) if entry.script is not None else str(entry.module)
        _check_monitor(vendor, f"{entry.name} ({source})", vendor.monitor_command(entry, sys.executable),
                       monitor_seconds, found, device_monitor=entry.script is not None)
    _check_peaks(vendor, found)
    _check_adaptations(vendor, found)
    # All of the folder is in a round's container, at another path.
    for link in vendor_folder_links(vendor.folder, found.not_checkable):
        found.add_error(link)
    skipped: list[str] = []
    for path, link in _leaving_links(vendor.folder, skipped=skipped):
        # the "(and 1+ more ...)" line (no link of its own) is never one another check named
        if path is None or not _named_as_outside(path, vendor.folder, found.problems):
            found.add_error(link)
    # __pycache__ is Python's own (a vendor's package gets one at every import): naming it in every check says
    # nothing a vendor can act on, so only the folders a vendor made are named
    made = [name for name in skipped if Path(name).name != "__pycache__"]
    folders = [name for name in made if not os.path.islink(vendor.folder / name)]
    if folders:
        found.notes.append(_skipped_note(vendor.folder, folders))
    links = [name for name in made if name not in folders]  # dot-files and -folders that are links out of it
    if links:
        found.notes.append(_skipped_links_note(vendor.folder, links))
    return found


# How many folders the note on those the link scan skips names (a vendor repository has a __pycache__ per package).
SKIPPED_NAMED = 10


def _skipped_note(folder: Path, skipped: list[str]) -> str:
    """The note on the folders the link scan passed over (paths.walk_source's rule: a dot-folder, __pycache__,
    node_modules, a Python environment), as a round's scan and the source digest pass them: not a problem for a run,
    but a link out of the vendor folder in one is never looked at, so the vendor is told which they are."""
    named = ", ".join(skipped[:SKIPPED_NAMED]) + (f" and {len(skipped) - SKIPPED_NAMED} more"
                                                  if len(skipped) > SKIPPED_NAMED else "")
    return (f"{display_path(folder)}: not scanned (skipped as in every round: {named}): links in "
            f"{'it' if len(skipped) == 1 else 'them'} are not checked")


def _skipped_links_note(folder: Path, links: list[str]) -> str:
    """The note on the dot-files (and dot-folders) that are links out of the vendor folder: the link scan passes
    over them, as a round's scan and the source digest do, so no round refuses such a link, but in a round's
    container it leads elsewhere: one by an absolute path to that path as the container has it, a relative one
    perhaps nowhere (the folder is at another path there). The vendor is told which, with where each leads."""
    shown = links[:SKIPPED_NAMED]
    named = ", ".join(f"{name} -> {_link_target(folder / name)}" for name in shown) + (
        f" and {len(links) - SKIPPED_NAMED} more" if len(links) > SKIPPED_NAMED else "")
    one = len(links) == 1
    absolute = [_link_target(folder / name) for name in shown if os.path.isabs(_link_target(folder / name))]
    relative = len(absolute) < len(shown)
    leads = f"it leads to {absolute[0]}" if one and absolute else "each by an absolute path leads to that path"
    container = f"in a round's container {leads} as the container has it" if absolute else ""
    nowhere = (f"in a round's container, where the folder is at another path, {'it' if one else 'each relative one'} "
               "may lead nowhere" if relative else "")
    return (f"{display_path(folder)}: {named} {'leads' if one else 'lead'} out of the vendor folder, "
            f"{'a dot-file or folder' if one else 'dot-files or folders'} every round's link scan passes over (no "
            f"round refuses {'it' if one else 'them'}): " + "; ".join(part for part in (container, nowhere) if part))


def _link_target(link: Path) -> str:
    try:
        return os.readlink(link)
    except OSError:  # gone since the scan
        return "?"


def _named_as_outside(link: Path, folder: Path, problems: list[str]) -> bool:
    """Whether a check that reads a file through ``link`` (the adaptation's files, vendor.yaml's, csrc/ and extern/)
    already named it as leading out of its folder (files.inside's words: "SOURCE: 'PATH' is outside ..."), the source
    being the link, a folder it lies in, or vendor.yaml: then the round's rule would name the same link twice."""
    named = dict.fromkeys([(link, ""), *((above, os.path.relpath(link, above)) for above in link.parents
                                         if above == folder or folder in above.parents),
                           (folder / MANIFEST, os.path.relpath(link, folder))])
    outside = [line for line in dict.fromkeys(problems) if "is outside" in line]  # each line once, looked at once
    return any(line.startswith(f"{given_name(source)}: ") and (not rel or f"'{rel}'" in line or f"'{rel}/" in line)
               for source, rel in named for line in outside)


# How many links out of the vendor folder vendor check and validate name, each its own line (a round names the
# first): far above a vendor's, and bounded, as a folder of thousands of them would be a data set's.
LINKS_NAMED = 100


def links_out_of_vendor_folder(folder: Path, under: str | None = None) -> list[ConfigError]:
    """Each link of the vendor folder that a round refuses before it starts, by the round's own scan of it
    (hosts.local.describe_paths, as the host runs it: the folder alone, or as part of the project where it lies in
    it, which a container has whole), whose target is relative: one line each naming the link and where it leads,
    the first LINKS_NAMED, then one line saying there are more. One by its absolute path is absolute_links' (every
    one, in the project too: a clone has the folder elsewhere). ``under``: only those below that part of the folder
    (an engine's, a case's) and on the way to it: the scan walks that part alone, so links elsewhere in the folder
    never use up the count."""
    return [error for _, error in _leaving_links(folder, under)]


# How many links out of the vendor folder the scan gathers: the named ones and one more, three times over (links by
# an absolute path count too, and absolute_links names them).
SCAN_LIMIT = 3 * (LINKS_NAMED + 1)


# A relative link out of the project may land in a round's data mount, which the round lets pass; the check has no
# inventory to know (docs/vendor-guide.md).
_UNLESS_MOUNTED = " unless an inventory mounts that place"


def _leaving_links(folder: Path, under: str | None = None, skipped: list[str] | None = None
                   ) -> list[tuple[Path | None, ConfigError]]:
    """links_out_of_vendor_folder's, each with the link's path (the line saying there are more: None); ``skipped``:
    the folders the scan passed over are added to it (links_leaving's)."""
    written = str(folder)
    # One more than named: that one says the list goes on, as the round's "(and N+ more)" does. The scan counts the
    # links by an absolute path too, which absolute_links names, so it looks further (three times as far) for "more"
    # to mean more named by neither; where those still fill it, a line says the scan stopped.
    facts = PathFacts.of(describe_paths([written], scan=[written], tree=str(PROJECT_ROOT), limit=SCAN_LIMIT,
                                        only=under, skipped=skipped)[written])
    relative = [link for link in facts.links_out if not os.path.isabs(link[1])]
    real_root = os.path.realpath(PROJECT_ROOT)
    project = (str(PROJECT_ROOT), real_root) if facts.path == real_root or facts.path.startswith(real_root + os.sep) \
        else None
    found: list[tuple[Path | None, ConfigError]]
    found = [(folder / below, ConfigError(given_name(folder / below), None, leaving_link_words(
        target, real, facts.path, below in facts.loops, project, what="the vendor folder",
        others=_UNLESS_MOUNTED if project is not None and target and below not in facts.loops
        and not is_under(real, project[1]) else "")))
        for below, target, real in relative[:LINKS_NAMED]]
    scanned = folder if under is None else folder / under
    if len(relative) > LINKS_NAMED:  # said beside the links (None: no link of its own, see check_vendor_folder)
        found.append((None, ConfigError(given_name(scanned), None, f"(and 1+ more links that leave the vendor "
                                        f"folder, not listed: only the first {LINKS_NAMED} are named; fix these "
                                        "and check again)")))
    elif len(facts.links_out) >= SCAN_LIMIT:  # links by an absolute path filled the scan: the rest unseen
        found.append((None, ConfigError(given_name(scanned), None, f"(the scan stopped at its first {SCAN_LIMIT} "
                                        "links that leave the vendor folder, many by an absolute path: more may "
                                        "follow; fix these and check again)")))
    return found


def _other_missing_files(folder: Path, first: str) -> list[str]:
    """Every file vendor.yaml names that is not there, not only the first: a new vendor fixes them in one go."""
    try:
        manifest = load_model(folder / MANIFEST, VendorManifest)
    except FlagperfError:
        return []
    named = [("spec_module", manifest.spec_module), ("container.dockerfile", manifest.container.dockerfile)]
    named += [(f"monitors.{i}.script", m.script) for i, m in enumerate(manifest.monitors) if m.script is not None]
    named += [("health_module", manifest.health_module)] if manifest.health_module is not None else []
    missing = []
    for key, rel in named:
        try:
            regular_file(folder, rel, display_path(folder / MANIFEST), key, "the vendor folder")
        except ConfigError as exc:
            if str(exc) != first:
                missing.append(str(exc))
    return missing


def _check_found_by_name(vendor: Vendor, found: Findings) -> None:
    """`--vendor <name>` finds vendor_images/<name> and FLAGPERF_VENDOR_PATH's folders, the first of a name; every
    other folder of the name is shadowed by it whole (its engines, toolkits and case files too)."""
    known = available_vendors().get(vendor.name)
    if known is None:
        found.notes.append(f"--vendor {vendor.name} does not find this folder: add {vendor.folder.parent} to "
                           "FLAGPERF_VENDOR_PATH (or put the folder under vendor_images/)")
        return
    winner = shadowed_by(vendor.folder, vendor.name)
    if winner is not None:
        # One line of at most MAX_LINE as every finding (four paths: a deep folder's would run past it)
        found.add_problem(one_line(shadowed_message(vendor.folder, winner, vendor.name),
                                   lead=f"{display_path(vendor.folder)}:"))
        return
    for other in vendor_folders(vendor.name)[1:]:  # what a vendor might think still counts
        found.notes.append(f"{display_path(other)} is shadowed by this folder: --vendor {vendor.name} reads this one "
                           f"({SEARCH_ORDER}), nothing of that one (its engines and case files neither)")
    for other in engine_roots(vendor.name):  # a folder of the name without a vendor.yaml adds engines
        if other.resolve() != vendor.folder.resolve():
            found.notes.append(f"{display_path(other)}: a folder of vendor {vendor.name} without a {MANIFEST}: its "
                               "engines join this folder's (where both have an engine of a name, the first on the "
                               "search path is used)")


def _check_device(vendor: Vendor, found: Findings) -> None:
    """What the cases call on the device's torch module (flagperf.measure.device, casekit): checkable where the
    vendor's torch and device are present."""
    manifest = vendor.manifest
    where = f"{display_path(vendor.folder / MANIFEST)}: torch_device {manifest.torch_device}"
    try:
        import torch
    except ImportError:
        found.not_checkable.append(f"{where}: torch is not installed here")
        return
    try:
        module = torch.get_device_module(manifest.torch_device)
    except (RuntimeError, ValueError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        found.not_checkable.append(f"{where}: torch {torch.__version__} here does not know it (is the vendor's "
                                   f"torch plug-in installed?): {first[:200]}")
        return
    name = module.__name__
    if manifest.torch_device != "cpu":
        available = getattr(module, "is_available", None)
        if not callable(available) or not available():
            found.not_checkable.append(f"{where}: no device visible to {name} here")
            return
        missing = [f for f in ("device_count", "synchronize") if not callable(getattr(module, f, None))]
        if missing:
            found.problem(where, f"{name} has no {' or '.join(missing)}, which every case calls")
    if not manifest.shares_host_memory and not callable(getattr(module, "mem_get_info", None)):
        found.problem(f"{display_path(vendor.folder / MANIFEST)}: shares_host_memory",
                      f"false, but {name} has no mem_get_info(): cases size their buffers from the device's free "
                      "memory; set it true if the device allocates from host memory")
        return
    count = module.device_count() if callable(getattr(module, "device_count", None)) else 1
    found.passed.append(f"{where}: {count} device(s) visible to {name}")

def _check_container(vendor: Vendor, found: Findings) -> None:
    """The container options as docker and the host's policy will read them, before any host is involved."""
    options = vendor.manifest.container
    where = display_path(vendor.folder / MANIFEST)
    problems = vendor_container_problems(options.shm_size, options.ulimits, options.devices, options.device_patterns,
                                         options.ipc)
    for key, why in problems:
        found.problem(where, f"container.{key}: {why}")
    if not problems:
        found.passed.append(f"container options {where}" + (" (privileged: " + str(options.privileged_reason) + ")"
                                                            if options.privileged else ""))


def _check_image(vendor: Vendor, found: Findings) -> None:
    """The default framework's Dockerfile (container.dockerfile), and every other <framework>/Dockerfile: FlagPerf
    allows one per framework, but only a FlagPerf host.yaml's CASES (<case>: <framework>) chooses one; every other
    run builds the default, so another is said to be unused by them rather than silently never built."""
    default, *others = image_dockerfiles(vendor.folder, vendor.manifest.container.dockerfile)
    _check_dockerfile(default, found)
    for other in others:
        framework = other.parent.name
        found.notes.append(f"{display_path(other)}: built only for a case a FlagPerf host.yaml maps to framework "
                           f"{framework} (CASES: {{<case>: {framework}}}); every other run (an inventory, a "
                           f"test_conf.py) builds container.dockerfile ({vendor.manifest.container.dockerfile})")
        _check_dockerfile(other, found)


def image_dockerfiles(folder: Path, dockerfile: str) -> list[Path]:
    """The Dockerfiles vendor check checks: container.dockerfile's first, then every other <framework>/Dockerfile."""
    default = Path(os.path.normpath(folder / dockerfile))
    return [default] + [other for other in sorted(folder.glob("*/Dockerfile"))
                        if other != default and not skipped_in_source(other.parent.name)]


def _check_dockerfile(dockerfile: Path, found: Findings) -> None:
    errors = dockerfile_findings(dockerfile, found)
    for error in errors:
        found.add_error(error)
    if not errors:
        scripts = install_scripts(dockerfile.parent)
        found.passed.append(f"image {display_path(dockerfile)}" + (f" with {', '.join(scripts)}" if scripts else ""))


# The engine builds with docker-py's APIClient.build (hosts/docker.py), Docker's classic builder: BuildKit's
# Dockerfile syntax fails there, or is not what it reads.
CLASSIC_BUILDER = "the engine builds with Docker's classic builder (docker-py's build, not BuildKit)"
# Options of COPY and ADD that the classic builder refuses ("the --chmod option requires BuildKit").
BUILDKIT_COPY_OPTIONS = {"--chmod"}


def buildkit_only(step: Instruction) -> list[str]:
    """What a step uses that only BuildKit has: a RUN option (--mount=..., --network=..., --security=...), COPY's or
    ADD's --chmod, a heredoc (RUN <<EOF, COPY <<EOF /x); each said as Docker's classic builder refuses it."""
    first = step.text.partition("\n")[0]
    found = []
    flags = RUN_FLAGS.match(first) if step.keyword in ("RUN", "COPY", "ADD") else None
    for flag in flags.group(0).split() if flags else ():
        option = flag.partition("=")[0]
        if step.keyword != "RUN" and option not in BUILDKIT_COPY_OPTIONS:
            continue  # --from, --chown: the classic builder's too
        refused = f"{step.keyword} {flag}: \"the {option} option requires BuildKit\": {CLASSIC_BUILDER}"
        if option == "--network" and flag.partition("=")[2] == "host":
            found.append(f"{refused}; drop it: the engine builds with network_mode=\"host\" already, so it loses "
                         "nothing")
        elif option == "--mount":
            found.append(f"{refused}; drop it and COPY what it mounts")
        elif option == "--chmod":
            found.append(f"{refused}; drop it and RUN chmod the file after the {step.keyword}")
        else:
            found.append(f"{refused}; drop it")
    opened = heredocs(RUN_FLAGS.sub("", first)) if step.keyword in ("RUN", "COPY", "ADD") else []
    if opened:
        found.append(f"{step.keyword} ... {opened[0].group(0)}: {CLASSIC_BUILDER}, which has no heredocs: an "
                     "older Docker reads its lines as instructions (\"unknown instruction\"), a newer one runs the "
                     "first line alone and says nothing (RUN <<EOF runs nothing, cat <<EOF > f writes an empty file); "
                     "put what it holds in a file beside the Dockerfile and COPY it"
                     + (" (a script: then RUN bash it)" if step.keyword == "RUN" else ""))
    return found


def install_scripts(context: Path) -> list[str]:
    """The install scripts beside a Dockerfile (FlagPerf's <framework>_install.sh, or any *install*.sh)."""
    return sorted(p.name for p in context.glob("*install*.sh"))


def dockerfile_findings(dockerfile: Path, found: Findings) -> list[ConfigError]:
    """What vendor check says of one Dockerfile (`flagperf validate` of it, or of an install script beside it, says
    the same): a FROM line, an install step, every file it copies in its folder (the build context), every install
    script beside it run, and _packages_named's packages/ paths; its notes and what it could not check go to
    ``found``."""
    where = display_path(dockerfile)
    try:  # a regular file when the manifest was read; bounded and never blocking if it changed since
        text = read_config_text(dockerfile, what="a Dockerfile")
    except ConfigError as exc:
        return [ConfigError(where, None, exc.message)]
    errors: list[ConfigError] = []
    context = dockerfile.parent
    instructions = dockerfile_instructions(text)  # as Docker joins them: continuations, heredocs, RUN or run
    if not any(step.keyword == "FROM" for step in instructions):
        errors.append(ConfigError(where, None, "no FROM line: the build has no base image (the vendor's PyTorch "
                                  "image)"))
    scripts = install_scripts(context)
    if not any(step.keyword == "RUN" for step in instructions) and not scripts:
        errors.append(ConfigError(where, None, "no install step (a RUN line, or FlagPerf's <framework>_install.sh "
                                  "beside it)"))
    errors += [ConfigError(where, None, f"line {step.line}: {problem}") for step in instructions
               for problem in buildkit_only(step)]
    for step in instructions:
        parts = copy_parts(step) if step.keyword in ("COPY", "ADD") else None
        if parts is None or any(flag.startswith("--from") for flag in parts[0]):
            continue  # a copy from another stage or image is not the build context's
        for name in parts[1]:
            # a heredoc's file is the Dockerfile's own; ADD fetches a URL; a glob needs one match ($VAR: any)
            if name.startswith("<<") or re.match(r"[A-Za-z][A-Za-z0-9+.-]*://|git@", name):
                continue
            pattern = as_glob(name)
            if pattern is None:
                continue
            try:
                there = any(context.glob(pattern)) if re.search(r"[*?[]", pattern) else (context / pattern).exists()
            except (ValueError, OSError):
                continue  # a pattern pathlib refuses is not checkable here: said less, never more
            if not there:
                errors.append(ConfigError(where, None, f"line {step.line}: copies {name}, which is not in "
                                          f"{display_path(context)}"))
    runs = [step for step in instructions if step.keyword == "RUN"]  # a comment or a COPY of it runs nothing
    for script in scripts:
        if any(re.search(rf"(?<![\w.-]){re.escape(script)}(?![\w.-])", step.text) for step in runs):
            continue
        maybe = next(((step, word) for step in runs for text in run_scripts(step) for word in run_by_pattern(text)
                      if fnmatch.fnmatchcase(script, PurePosixPath(word).name)), None)
        if maybe is None:
            errors.append(ConfigError(where, None, unused_script_problem(script, context.name)))
        else:
            found.notes.append(f"{where}: line {maybe[0].line} runs {maybe[1]}, which may be {script} (this check "
                               f"cannot tell); if not, {unused_script_problem(script, context.name)}")
    return errors + _packages_named(dockerfile, instructions, scripts, found)


# Where FlagPerf has a Dockerfile's folder when it runs <framework>_install.sh (its utils/image_manager.py mounts it
# there); some of its install scripts name it (PKG_DIR="/workspace/docker_image/packages").
FLAGPERF_IMAGE_FOLDER = "/workspace/docker_image"


def unused_script_problem(script: str, framework: str) -> str:
    """The problem of an install script beside a Dockerfile that never runs it. FlagPerf runs <framework>_install.sh
    itself, in a container of the built image that it then commits; here the image is what the Dockerfile builds and
    nothing more, so a FlagPerf folder's script does nothing until the Dockerfile runs it: how is said. The whole
    folder is copied so that the script's relative paths (packages/...) are as the packages/ check reads them."""
    flagperf = ("FlagPerf runs it in a container of the built image and commits that, " if
                script == f"{framework}_install.sh" else "")
    return (f"{script} is beside the Dockerfile, which never runs it: {flagperf}here the image is the Dockerfile's "
            f"build alone; add `COPY . {FLAGPERF_IMAGE_FOLDER}/` and `RUN cd {FLAGPERF_IMAGE_FOLDER} && bash {script}` "
            "(FlagPerf's path, which its scripts name) to the Dockerfile, or remove the script")


# FlagPerf's guide keeps what <framework>_install.sh installs beyond the Dockerfile in packages/ beside it: a path
# there named by the install script or a RUN step (packages/x.run, ./packages/wheels/, packages/x-${VER}.whl, or
# x.run after cd packages: buildsteps.PACKAGE_PATH and BuildWrites.read).
PACKAGES_FOLDER = PACKAGES


def packages_findings(dockerfile: Path, found: Findings) -> list[ConfigError]:
    """_packages_named of a Dockerfile and the install scripts beside it (`flagperf validate` of a file of the
    packages/ folder beside it): its problems, its notes and what it could not check go to ``found``'s notes and
    not_checkable. The Dockerfile's own problems are vendor check's."""
    try:  # inside its folder: one that is a link out is never read (nor quoted)
        text = read_config_text(regular_file(dockerfile.parent, dockerfile.name, display_path(dockerfile), None,
                                             display_path(dockerfile.parent)), what="a Dockerfile")
    except ConfigError as exc:
        return [exc]
    return _packages_named(dockerfile, dockerfile_instructions(text), install_scripts(dockerfile.parent), found)


def _packages_named(dockerfile: Path, instructions: list[Instruction], scripts: list[str],
                    found: Findings) -> list[ConfigError]:
    """Each packages/ path the Dockerfile's RUN steps or its install scripts name is in the build context (the
    Dockerfile's folder) and stays in it: the build would fail on the host, after the image's base was pulled. A
    glob (packages/*.whl, or a name with a $VARIABLE in it, read as *) needs one match. A path the build itself
    writes (mkdir, wget -P, pip download -d, > ..., tar -C, cp's or a COPY's destination) is none of these, nor what
    lies under it; where the build downloads anything or writes where this reading cannot tell (COPY --from, ADD of
    a URL or an archive, tar x without -C, unzip without -d), a path not found is a note. Links out
    of packages/ are the vendor folder's link scans' (whole); a script that is a link is theirs too."""
    context = dockerfile.parent
    shown = display_path(context)
    errors: list[ConfigError] = []
    # Each shell the build runs, with its lines and the shell it starts as: a RUN step's command line, each heredoc a
    # shell runs as its script (in WORKDIR), an install script (a cd in one moves the rest of that shell only)
    writes = BuildWrites()  # the build as a whole: a step sees what another one wrote
    sources: list[tuple[str, list[tuple[int, str]], Shell]] = []
    for step in instructions:
        if step.keyword == "WORKDIR":
            writes.work(step)
        elif step.keyword in ("COPY", "ADD"):
            writes.copy(step)
        elif step.keyword == "RUN":
            sources += [(display_path(dockerfile), [(step.line, line) for _, line in shell_lines(script)],
                         writes.shell()) for script in run_scripts(step)]
    for script in scripts:
        path = context / script
        if path.is_symlink():  # read through a link, a file elsewhere would be quoted here
            continue
        try:
            text = read_config_text(regular_file(context, script, display_path(path), None, shown),
                                    what="an install script")
        except ConfigError as exc:
            found.not_checkable.append(f"{exc.source}: the {PACKAGES_FOLDER}/ paths it names are not checked "
                                       f"({exc.message})")
            continue
        sources.append((display_path(path), shell_lines(text), Shell(places=dict(writes.places))))
    named: list[tuple[str, int, Named]] = []  # where, line, the path as the line has it and in the context
    for where, lines, shell in sources:
        for number, line in lines:
            named += [(where, number, found) for found in writes.read(shell_words(line), shell)]
    for where, number, (shown_name, name, guarded) in dict.fromkeys(named):
        path = as_glob(name)
        if path is None or writes.made(path):  # the shell decides it (${X:-y}, $(...)), or the build writes it
            continue
        if not is_under(os.path.realpath(context / path), os.path.realpath(context)):
            errors.append(ConfigError(where, None, f"line {number}: names {shown_name}, which leads out of {shown} "
                                      "(the build sees only its own folder)"))
            continue
        try:
            there = any(context.glob(path)) if re.search(r"[*?\[]", path) else os.path.exists(context / path)
        except (ValueError, OSError) as exc:  # a glob pathlib refuses (** inside a name), a name too long
            found.not_checkable.append(f"{where}: line {number}: {shown_name} cannot be looked for ({exc})")
            continue
        if not there:
            if guarded:
                found.notes.append(f"{where}: line {number}: names {shown_name}, which is not in {shown}: the "
                                   "script tests for it first ([ -f ... ]), so the build goes on without it; if it "
                                   "should "
                                   f"be installed, FlagPerf's {PACKAGES_FOLDER}/ goes beside the Dockerfile")
            elif writes.downloads or writes.unknown_places:
                how = ("downloads files (wget, curl, pip download)" if writes.downloads else
                       "writes files where this check cannot tell (COPY --from, ADD of a URL or an archive, tar x "
                       "without -C, unzip without -d)")
                found.notes.append(f"{where}: line {number}: names {shown_name}, which is not in {shown}: the build "
                                   f"{how}, so it may be one of them; if not, FlagPerf's {PACKAGES_FOLDER}/ goes "
                                   "beside the Dockerfile")
            else:
                errors.append(ConfigError(where, None, f"line {number}: names {shown_name}, which is not in {shown} "
                                          f"(FlagPerf's {PACKAGES_FOLDER}/ goes beside the Dockerfile)"))
    return errors


def _check_monitor(vendor: Vendor, name: str, command: list[str], seconds: float, found: Findings, *,
                   device_monitor: bool = False) -> None:
    """name: the monitor's name and where it is, e.g. "acme (vendor_images/acme/monitor_acme.py)"."""
    where = f"monitor {name}"
    # As a round starts it: the project on PYTHONPATH (for flagperf.monitoring's helpers), in the project root.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH"))
                                                       if p)}
    with tempfile.TemporaryDirectory(prefix="flagperf-vendor-check-") as scratch:
        out = Path(scratch) / "monitor.jsonl"
        argv = [*command, "--out", str(out), "--interval", "1", "--max-seconds", str(seconds)]
        program = [display_path(Path(part)) if part.endswith(".py") else part for part in command[1:]]
        shown = " ".join(["python", *program, "--out FILE --interval 1 --max-seconds", f"{seconds:g}"])
        try:
            completed = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False,
                                       cwd=PROJECT_ROOT, env=env)
        except subprocess.TimeoutExpired:
            found.problem(where, f"did not stop within {seconds + 60:.0f} s of --max-seconds {seconds:g}")
            return
        if completed.returncode != 0:
            last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
            # argparse's usage error: most often FlagPerf's monitor contract (-o start|stop -l LOGDIR) brought along
            contract = (f"; a monitor takes {MONITOR_ARGUMENTS} and writes JSON lines, not FlagPerf's -o start|stop "
                        "-l LOGDIR: flagperf.monitoring's monitor_arguments and run_sampler do both (the scaffold's "
                        "monitor uses them; docs/vendor-guide.md, section 1)"
                        if completed.returncode == 2 and ARGPARSE_ERROR.search(last) else "")
            found.problem(where, f"exited {completed.returncode} when run as `{shown}`: {last[:300]}{contract}")
            return
        try:
            lines = out.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            found.problem(where, f"wrote nothing to --out when run as `{shown}`")
            return
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                found.problem(where, f"line {number} of its --out file is not a JSON object ({line.strip()[:60]!r}): "
                                     "each line is one, a header, samples, a footer (flagperf.monitoring)")
                return
            records.append(record)
    if not records or records[0].get("type") != "header":
        found.problem(where, 'the first line is not a header ({"type": "header", ...})')
        return
    sources = records[0].get("sources") or {}
    unavailable = [f"{k}: {v.get('reason')}" for k, v in sources.items() if isinstance(v, dict)
                   and v.get("available") is False]
    samples = [r for r in records if r.get("type") == "sample"]
    if not samples and unavailable:
        found.not_checkable.append(f"{where}: {'; '.join(unavailable)}")
        return
    if records[-1].get("type") != "footer":
        found.problem(where, "no footer line after --max-seconds (it must stop cleanly)")
    if not samples:
        found.problem(where, "wrote no samples")
        return
    if any(not isinstance(s.get("t"), int | float) for s in samples):
        found.problem(where, "a sample without its timestamp t")
    devices = [d for s in samples for d in (s.get("devices") or []) if isinstance(d, dict)]
    if device_monitor and not devices:
        top = [k for k in (*REQUIRED_FIELDS, *RECOMMENDED_FIELDS) if any(k in s for s in samples)]
        found.problem(where, "no sample has a devices list: a device's figures go in "
                             '{"devices": [{"index": 0, "util_percent": ..., "mem_used_bytes": ...}]}'
                      + (f"; {', '.join(top)} at a sample's top level are read as the host's" if top else ""))
    if any(not isinstance(d.get("index"), int) for d in devices):
        found.problem(where, "a device entry without its integer index (the analysis keeps devices apart by it)")
    if devices:
        for key in REQUIRED_FIELDS:
            if all(d.get(key) is None for d in devices):
                found.problem(where, f"no device sample has {key} (required: timestamp, utilisation, memory)"
                              + _misnamed(key, devices))
        missing = [k for k in RECOMMENDED_FIELDS if all(d.get(k) is None for d in devices)]
        if missing:
            found.notes.append(f"{where}: recommended {', '.join(missing)} not reported here"
                               + "".join(_misnamed(k, devices) for k in missing))
        for problem in _implausible(devices):
            found.problem(where, problem)
    if not any(p.startswith(where) for p in found.problems):
        found.passed.append(f"{where}: {len(samples)} samples in {seconds:g} s"
                            + (f" ({'; '.join(unavailable)})" if unavailable else ""))


def _misnamed(key: str, devices: list[dict[str, Any]]) -> str:
    """The device fields of the vendor's own naming that look like ``key`` (its stem), said beside its absence:
    the analysis reads ``key`` only, so `temperature` or `mem_used_mb` would be dropped from every report."""
    stem, meaning = FIELD_MEANING[key]
    known = {*REQUIRED_FIELDS, *RECOMMENDED_FIELDS}
    # A field already in one of the analysis's units is another figure, named on purpose (AMD's temp_mem_c, the
    # HBM's temperature beside the hotspot's; power_limit_w): renaming it to ``key`` would report the wrong figure.
    suffixes = tuple("_" + field.rsplit("_", 1)[1] for field in known)
    named = sorted({f for d in devices for f in d if f.startswith(stem) and f not in known
                    and not f.endswith(suffixes)})
    return (f"; it writes {', '.join(named)}, which no part of the analysis reads: name the figure {key} "
            f"(in {meaning})") if named else ""


def _implausible(devices: list[dict[str, Any]]) -> list[str]:
    """Figures in another unit than their field's: a share 0..1 or above 100 for a percentage, a memory in MiB."""
    problems = []
    utils = [d["util_percent"] for d in devices if isinstance(d.get("util_percent"), int | float)]
    if any(u < 0 or u > 100 for u in utils):
        problems.append(f"util_percent {max(utils, key=lambda u: abs(u - 50)):g} is outside 0 to 100 (a percentage "
                        "of the device, not summed over its units)")
    totals = [d["mem_total_bytes"] for d in devices if isinstance(d.get("mem_total_bytes"), int | float)]
    if any(0 < total < MIN_DEVICE_MEMORY for total in totals):
        problems.append(f"mem_total_bytes {min(totals):g} is under 64 MiB: a count of MiB or MB? the "
                        "memory fields are in bytes")
    elif any(isinstance(d.get("mem_used_bytes"), int | float) and isinstance(d.get("mem_total_bytes"), int | float)
             and d["mem_used_bytes"] > d["mem_total_bytes"] > 0 for d in devices):
        problems.append("mem_used_bytes above mem_total_bytes: the two in different units? both are bytes")
    return problems


DATASHEETS = "datasheets.yaml"


def datasheet_findings(folder: Path) -> list[ConfigError]:
    """What is wrong with a vendor folder's datasheets.yaml (the shipped vendors' convention, read by their spec.py:
    a list of entries, each with the source of its figures), read as every config file is (inside the folder,
    regular, bounded, nesting bounded) and never executed; none where the folder has no such file, one where the
    file lists nothing."""
    sheets = folder / DATASHEETS
    if not is_present(sheets):
        return []
    try:
        path = regular_file(folder, sheets.name, display_path(folder), None, "the vendor folder")
        entries = parse_yaml_text(read_config_text(path), display_path(sheets))
    except ConfigError as exc:
        return [exc]
    if entries is None or entries == []:
        # Present, so the vendor's spec.py reads it (an absent one is no finding: the convention is optional), and
        # it lists nothing: the shipped spec.py stops on it, and a vendor's would find no figure of any device.
        return [ConfigError(display_path(sheets), None, "lists no datasheet entries (empty, or comments only): a list "
                            "of entries, each with its source; or remove the file if the vendor's spec.py reads none")]
    if not isinstance(entries, list):
        return [ConfigError(display_path(sheets), None, f"top level must be a list of datasheet entries, got "
                                                        f"{type(entries).__name__}")]
    return [ConfigError(display_path(sheets), None, f"entry {i}: no source (where each figure comes from)")
            for i, entry in enumerate(entries)
            if not isinstance(entry, dict) or not str(entry.get("source") or "").strip()]


def _check_peaks(vendor: Vendor, found: Findings) -> None:
    for error in datasheet_findings(vendor.folder):
        found.add_error(error)
    spec = vendor.folder / vendor.manifest.spec_module
    where = display_path(spec)
    try:
        module = import_file(spec, f"flagperf_vendor_check_{vendor.name.replace('-', '_').replace('.', '_')}")
    except ConfigError as exc:
        if isinstance(exc.__context__, ImportError):  # the vendor's library is not installed here
            found.not_checkable.append(f"peaks: {exc}")  # the error names the file
        else:
            found.add_error(exc)
        return
    builder = getattr(module, "spec_table", None)
    if not callable(builder):
        found.problem(where, "has no spec_table(settings) function")
        return
    try:
        raw = builder(dict(vendor.manifest.spec_settings))
    except Exception as exc:  # the vendor's code on a machine without its device: say so, do not fail
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        found.not_checkable.append(f"peaks: {where} cannot build a table here: {detail}")
        return
    try:
        table = SpecTable.model_validate(raw)
    except ValidationError as exc:
        error = pydantic_error_to_config_error(exc, f"{where} spec_table()")
        found.problems.append(f"{error} (a table is {{'device': str, 'peaks': {{key: {{'value', 'unit', "
                              "'source'}}}}}})")
        return
    wrong = 0
    for key, peak in table.peaks.items():
        problem = peak_problem(key, peak)  # what a run refuses, each said here at once
        if problem is None and peak.value is not None and peak.source.lstrip().startswith(TODO):
            # The scaffold's DATASHEET left as written: the figure would be published with a placeholder source.
            problem = (f"{peak.value:g} {peak.unit} with the template's source ({peak.source[:60]!r}): name the "
                       "datasheet")
        if problem:
            found.problem(f"{where} peaks.{key}", problem)
            wrong += 1
    if not wrong:
        found.passed.append(f"peaks: {len(table.peaks)} figures for {table.device} ({where})")
    if table.device.lstrip().startswith(TODO):  # every report's heading names the device
        found.notes.append(f"{where}: the device is still the template's ({table.device!r}): every report names it")
    sparse = [key for key, peak in table.peaks.items() if peak.value is not None and peak.supported and not peak.dense]
    if sparse:  # honest, but the report shows the figure with no ratio beside it: say why here
        found.notes.append(f"{where}: {', '.join(sparse)} {'is a sparse figure' if len(sparse) == 1 else 'are sparse'}"
                           " (dense: false): cases form no ratio or MFU against a sparse peak (2:4 sparsity doubles"
                           " it); give the dense figure, with its source, to have one")
    unknown = [key for key, peak in table.peaks.items()
               if peak.value is None and peak.supported and key not in FACT_KEYS]
    if unknown:
        found.notes.append(f"{where}: no value for {', '.join(unknown)}: cases report no ratio or MFU against "
                           "them (each one's source says what is missing)")


@contextmanager
def _held_warnings() -> Iterator[list[str]]:
    """The core's warnings while the case files are read (a vendor file's new key ...): notes of the check."""
    held: list[str] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record.getMessage())

    logger, handler = logging.getLogger("flagperf"), Hold(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield held
    finally:
        logger.removeHandler(handler)


def _check_adaptations(vendor: Vendor, found: Findings) -> None:
    try:
        cases = available_cases()
    except FlagperfError as exc:
        found.add_error(exc)
        return
    families: set[str] = set()
    adapted = False
    with case_code_not_run(), _held_warnings() as warnings:  # the vendor's case files are read, never run
        for name in sorted(cases):
            try:
                case = load_case(name, cases)
            except FlagperfError as exc:
                found.add_error(exc)
                continue
            families.add(case.family)
            adapted = adapted or has_vendor_files(case, vendor.name, vendor.folder)
            used = _check_case(vendor, case, found)
            if used:
                found.passed.append(f"adaptation of {name}: {'; '.join(used)}")
    _check_vendor_cases(vendor, cases, found)
    if not adapted:  # where a new vendor's case files go, said once (docs/vendor-guide.md, section 2)
        found.notes.append(f"no case is adapted for {vendor.name} yet: a case's settings go in cases/<family>/<case>/"
                           f"vendor/{overrides_name('training', vendor.name)} (inference: "
                           f"{overrides_name('inference', vendor.name)}), a training scale's in vendor/{vendor.name}/"
                           f"config_{vendor.manifest.hardware}x<nnodes>x<nproc>.yaml, and {ENV_FILE}, "
                           f"{REQUIREMENTS_FILE}, {CSRC_FOLDER}/{CSRC_SETUP}, {EXTERN_FOLDER}/{EXTERN_HOOKS_FILE} "
                           f"in vendor/{vendor.name}/, or all of them (the settings file by the same name) in this "
                           f"folder's {VENDOR_CASES_FOLDER}/<family>/<case>/ (docs/vendor-guide.md, section 2)")
    for note in dict.fromkeys(warnings):  # a new key's warning, when that key is also a problem, is said once
        file_and_key = ": ".join(note.split(": ")[:2]) + ":"
        if not any(problem.startswith(file_and_key) for problem in found.problems):
            found.notes.append(note)
    _check_engine_links(vendor, found)
    for family, sub in sorted(ENGINE_FOLDERS.items()):
        if family in families and not any((vendor.folder / sub).glob(f"*/{ENGINE_MANIFEST}")):
            found.notes.append(f"no {family} engines ({display_path(vendor.folder / sub)}/<engine>/{ENGINE_MANIFEST}):"
                               f" {family} cases cannot run with this vendor (start from vendor_images/cpu/{sub}/)")


def _check_engine_links(vendor: Vendor, found: Findings) -> None:
    """A link by an absolute path in the engine folders a round of the vendor reads from each folder of the name
    without a vendor.yaml (engine_roots); a round's container has each at another path. The vendor's own folder is
    scanned whole (vendor_folder_links). A folder `--vendor` does not use (shadowed, or not on the search path) lends
    nothing to the others: its own alone, never the engine folders of the folder a run uses."""
    own = vendor.folder.resolve()
    roots = engine_roots(vendor.name)
    if not any(root.resolve() == own for root in roots):
        return
    for root in roots:
        if root.resolve() != own:
            for link in absolute_links(root, parts=sorted(set(ENGINE_FOLDERS.values())),
                                       not_checked=found.not_checkable):
                found.add_error(link)


def _check_vendor_cases(vendor: Vendor, cases: dict[str, Path], found: Findings) -> None:
    """The vendor folder's cases/<family>/<case>/ folders that no run reads: one of a case that does not exist, or
    under another family than the case's (a misspelt name would otherwise leave the case silently unadapted); and
    the entries of the vendor folder laid out as FlagPerf's, which no run reads either."""
    monitors = {str(entry.script) for entry in vendor.manifest.monitors if entry.script is not None}
    dockerfile = vendor.manifest.container.dockerfile
    read = read_top_entries(vendor.folder, dockerfile, (*ENGINE_FOLDERS.values(), TOOLKITS_FOLDER),
                            found.not_checkable)  # a cut walk: the line vendor_folder_links says too, once
    for entry in sorted(vendor.folder.iterdir()):  # FlagPerf's layout of the vendor folder, copied as it was
        if not skipped_in_source(entry.name):
            problem = flagperf_vendor_entry_problem(entry, vendor.name, dockerfile, monitors, cases, read)
            if problem:
                found.problem(given_name(entry), problem)
    root = vendor.folder / VENDOR_CASES_FOLDER
    if not is_present(root):
        return
    if not root.is_dir():
        found.problem(display_path(root), f"never read: {VENDOR_CASES_FOLDER}/ is a folder of <family>/<case>/ "
                                          "folders (the vendor's files of each case)")
        return
    for family in sorted(root.iterdir()):
        if skipped_in_source(family.name) or (family.is_file() and family.name.startswith("README")):
            continue
        if not family.is_dir():
            found.problem(given_name(family), f"never read: {VENDOR_CASES_FOLDER}/ holds <family>/<case>/ folders")
            continue
        for folder in sorted(family.iterdir()):
            if skipped_in_source(folder.name) or (folder.is_file() and folder.name.startswith("README")):
                continue
            problem = (vendor_case_problem(family.name, folder.name, cases) if folder.is_dir() else
                       f"never read: {VENDOR_CASES_FOLDER}/{family.name}/ holds a folder per case")
            if problem:
                found.problem(given_name(folder), problem)


def has_vendor_files(case: CaseDef, vendor: str, vendor_folder: Path | None = None) -> bool:
    """Whether the case has a file or folder of this vendor under vendor/, or the vendor folder has the case's
    (read or not: a misnamed one counts)."""
    return (is_present(case.vendor_file(vendor))
            or any(is_present(place.folder) for place in adaptation_places(case.folder, vendor, vendor_folder))
            or bool(misnamed_overrides(case.folder, case.family, vendor, vendor_folder)))


def _check_case(vendor: Vendor, case: CaseDef, found: Findings) -> list[str]:
    """This vendor's files of one case, each read as a run of the vendor reads it; what was read."""
    used: list[str] = []
    for path, message in misnamed_overrides(case.folder, case.family, vendor.name, vendor.folder):
        found.problem(display_path(path), message)
    name = case.vendor_file(vendor.name).name
    # a folder --vendor does not find (not installed, shadowed): its own engines judge its cases, not the installed
    known = available_vendors().get(vendor.name)
    installed = known is not None and known.resolve() == vendor.folder.resolve()
    kept = adaptation_places(case.folder, vendor.name, vendor.folder)[1:]  # the vendor folder's, by the same name
    if is_present(case.vendor_file(vendor.name)) or any(is_present(place.folder / name) for place in kept):
        try:
            resolve_case_config(case, vendor=vendor.name, run_overrides=[], hardware=vendor.manifest.hardware,
                                vendor_folder=vendor.folder, check_vendor=installed)
            used.append(f"overrides {name}")
        except FlagperfError as exc:
            found.add_error(exc)
    try:
        place = adaptation_place(case.folder, vendor.name, vendor.folder)
    except ConfigError as exc:  # in both places: neither is read
        found.add_error(exc)
        return used
    scales, problems = adaptation_listing(case, vendor.name, str(vendor.manifest.hardware), place, vendor.folder,
                                          check_vendor=installed)
    for error in problems:
        found.add_error(error)
    used += [f"scale {name}" for name in scales]
    _note_missing_scales(case.family, place.folder, str(vendor.manifest.hardware), scales, problems, found)
    if place.present and case.family == "training":  # the one family that reads scale files
        for error in readme_scale_findings(place.folder, str(vendor.manifest.hardware), found):
            found.add_error(error)
    problems = adaptation_problems(case.folder, case.family, vendor.name, vendor.folder)
    for problem in problems:  # every part's, not only the first a run would stop at; each part's findings
        found.add_error(problem)
    if problems:
        return used
    adaptation = read_adaptation(case.folder, case.name, case.family, vendor.name, vendor.folder)
    if adaptation is not None and not adaptation.empty:
        extern = f"extern {','.join(adaptation.hooks)} (read, not run)"
        used += [p for p, present in (("environment file", adaptation.env), ("requirements", adaptation.requirements),
                                      ("csrc", adaptation.csrc), (extern, adaptation.extern)) if present]
    if adaptation is not None and adaptation.extern is not None:
        hooks_file = display_path(adaptation.extern / EXTERN_HOOKS_FILE)
        for hook in adaptation.hooks:
            if hook in RUN_TIME_CHECKS:  # what only a run can see: said, not passed
                found.notes.append(f"{hooks_file}: {hook}: checked when a round calls it, not here (checking a file "
                                   f"never runs it): {RUN_TIME_CHECKS[hook]}")
        for hook, line in decorated_hooks(adaptation.extern, case.family).items():
            found.notes.append(f"{hooks_file}: line {line}: {hook}: decorated, so whether a round can call what the "
                               f"decorator returns as {hook}({', '.join(HOOK_PARAMETERS[hook])}) is checked when a "
                               "round loads hooks.py, not here (checking a file never runs it)")
    return used


# A scale file's name in a case adaptation's README (FlagPerf's guide: a README per case with its 1x1, 1x8 and 2x8
# results, "consistent with the code"), as FlagPerf (.py) or this project (.yaml) names it: bare, or under ./ or
# config/ (FlagPerf's folder of them); one in a URL or another path is a file elsewhere. ASCII bounds: a name in
# Chinese prose (为config_H800x2x8.py中) is still one.
README_SCALE = re.compile(r"(?<![A-Za-z0-9_./:-])(?:\./|config/)?(config_[A-Za-z0-9_.-]+?x[0-9]+x[0-9]+\.(?:yaml|py))"
                          r"(?![A-Za-z0-9_])")
# README, README.md, README_CN.md, README.zh.md, README-en.rst ...: the READMEs, not any file whose name starts so.
README_NAME = re.compile(r"README(?:[._-][A-Za-z]{2}(?:[_-][A-Za-z]{2})?)?(?:\.(?:md|txt|rst))?", re.IGNORECASE)


def readme_scale_findings(folder: Path, hardware: str, found: Findings,
                          only: Path | None = None) -> list[ConfigError]:
    """Each scale file of the vendor's hardware a README of the vendor's folder of the case names is there (as .yaml
    or .py: a README brought from FlagPerf names config_<hw>x1x8.py): results it reports at a scale the folder has no
    file for were not taken with the settings it ships. Another hardware's file (a comparison with NVIDIA's) is not
    this folder's. Only names are compared; the README is read as text, bounded; one that is a link is left to the
    link scans, and one not readable as text is not checkable here (``found``'s not_checkable). ``only``: that
    README alone (`flagperf validate` of it)."""
    errors: list[ConfigError] = []
    try:
        readmes = sorted(p for p in folder.iterdir()
                         if README_NAME.fullmatch(p.name) and (only is None or p.name == only.name))
    except OSError:  # a link to no folder: the adaptation's own checks say so
        return errors
    for readme in readmes:
        if readme.is_symlink():  # read through a link, a file elsewhere would be quoted here
            if only is not None:  # validate of it: said, not passed as ok
                found.not_checkable.append(f"{display_path(readme)}: a link, not read (the vendor folder's link "
                                           "scans say where it leads); the scale files it names are not checked")
            continue
        try:
            text = read_config_text(regular_file(folder, readme.name, display_path(readme), None, display_path(folder)),
                                    what="a README")
        except ConfigError as exc:
            found.not_checkable.append(f"{exc.source}: the scale files it names are not checked ({exc.message})")
            continue
        for name in dict.fromkeys(README_SCALE.findall(text)):
            match = SCALE_FILE.fullmatch(name)
            if match is None or match.group(1) != hardware:
                continue
            stem = name.rsplit(".", 1)[0]
            if not any(is_present(folder / f"{stem}.{suffix}") for suffix in ("yaml", "py")):
                errors.append(ConfigError(display_path(readme), None, f"names {name}, which {display_path(folder)} "
                                          f"does not have ({stem}.yaml or .py): the results it reports at that scale "
                                          "are not reproducible from the folder; add the file or correct the README"))
    return errors


def _note_missing_scales(family: str, folder: Path, hardware: str, read: list[str], refused: list[ConfigError],
                         found: Findings) -> None:
    """One note for a training case (the one family that reads scale files: another's is refused, and said so)
    whose folder has the 1x1 scale file of the vendor's <hw> but no multi-device one on one node (1xN, N>1) or no
    two-node one (2xN, N>1), the shapes of FlagPerf's 1x1, 1x8 and 2x8 runs, whatever a node holds: not an error (a
    run at that scale reads the case's and the vendor's settings alone), but a vendor porting FlagPerf's three runs
    would otherwise find out at the run. A scale file there but refused (adaptation_listing's finding) counts as
    there: its problem is said already."""
    if family != "training":
        return
    names = [*read, *(Path(error.source).name for error in refused if isinstance(error, ConfigError))]
    sizes = {(int(match.group(2)), int(match.group(3))) for match in map(SCALE_FILE.fullmatch, names)
             if match and match.group(1) == hardware}
    if (1, 1) not in sizes:
        return
    lacking = [shape for nodes, shape in ((1, "1xN"), (2, "2xN"))
               if not any(nnodes == nodes and nproc > 1 for nnodes, nproc in sizes)]
    if lacking:
        found.notes.append(f"{display_path(folder)}: has config_{hardware}x1x1 but no {' or '.join(lacking)} (N>1) "
                           f"scale file (config_{hardware}x<nnodes>x<nproc>.yaml or .py): FlagPerf's guide asks for "
                           "1x1, 1x8 and 2x8 runs, and a run at a scale without its file reads the case's and the "
                           "vendor's settings alone (docs/vendor-guide.md, section 2)")


def summary_lines(found: Findings) -> list[tuple[str, str]]:
    return ([("ok", line) for line in found.passed] + [("not checkable here", line) for line in found.not_checkable]
            + [("note", line) for line in found.notes] + [("problem", line) for line in found.problems])


def as_json(found: Findings) -> dict[str, Any]:
    return {"problems": found.problems, "not_checkable": found.not_checkable, "notes": found.notes, "ok": found.passed}
