"""Turn what the user asked for (suite or cases, vendor, rounds, --set) into a validated run plan.

Everything is checked here, before a server starts or a host is touched: unknown names, bad files,
override rules, value types. The plan is plain data, so the flow and the CLI build the same one.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flagperf.config.adaptation import adaptation_place, read_adaptation
from flagperf.config.cases import (
    MANIFEST,
    CaseDef,
    available_cases,
    engine_option_keys,
    load_case,
    resolve_case_config,
    settable_keys,
)
from flagperf.config.engines import unless_declared_by
from flagperf.config.files import is_present, read_config_text
from flagperf.config.inferencekeys import not_read_message
from flagperf.config.models import SetOverride, load_suite, parse_set_override, set_last
from flagperf.config.vendors import Vendor, load_vendor
from flagperf.errors import ConfigError, gathered, nearest, unknown_name, validation_message
from flagperf.paths import (
    CASE_PATH_ENV,
    NAME_PATTERN,
    PROJECT_ROOT,
    VENDOR_PATH_ENV,
    StartFolderGone,
    case_roots,
    display_path,
    pin_search_paths,
    run_id_problem,
    search_path_folders,
    suite_roots,
)
from flagperf.results.bounded import MAX_RECORD_BYTES
from flagperf.results.controller import CONTROLLER_FILE
from flagperf.results.provenance import git_revision, search_path_code, source_code, source_digest
from flagperf.results.schema import MAX_ROUNDS

DEFAULT_SUITE = "smoke"
PLAN_FILE = "plan.json"
log = logging.getLogger("flagperf.config.plan")
# atomic_path's temporary name of a controller.lock (written so before the record was written in place)
RECORD_TEMPORARY = re.compile(rf"\.{re.escape(CONTROLLER_FILE)}\.[0-9a-f]{{12}}\.tmp")


class CasePlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    family: str
    description: str
    config: dict[str, Any]
    origins: dict[str, str]
    run_overrides: dict[str, dict[str, Any]]
    vendor_changes: dict[str, list[Any]] = Field(description="key -> [default, vendor value]")
    vendor_new_keys: list[str]
    timeout_s: float
    max_retries: int
    vendor_folder: str | None = Field(
        default=None, description="the folder of the vendor's files of the case that was read (scale files, the "
                                  "adaptation): the case's vendor/<vendor>/ or the vendor folder's cases/<family>/"
                                  "<case>/; None when the vendor has none")


class RunPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    suite: str | None
    vendor: Vendor = Field(description="resolved once here; tasks receive this object, never a name")
    rounds: int
    cases: list[CasePlan]
    results_dir: str
    set_overrides: list[str]
    flow_run_id: str | None = Field(default=None, description="the Prefect flow run that owns this run folder")
    git_revision: str | None = Field(default=None, description="the engine's commit; a retry must run the same code")
    source_digest: str | None = Field(default=None, description="sha256 of the engine's code (also without git); "
                                      "a retry must run the same")
    # dict[str, str]: a plan of an older version (the folder, with the engines skipped said in words)
    source_code: dict[str, dict[str, Any] | str] = Field(
        default_factory=dict, description="what source_digest counts beyond the project's code folders: each "
        "vendor, engine and case folder found on FLAGPERF_VENDOR_PATH / FLAGPERF_CASE_PATH, by its label in the digest "
        "(the variable and its name), with the copy counted (the one the run reads, never a shadowed one): "
        "{folder, skip: the engines below it an earlier place has, left out}")
    hosts: list[dict[str, Any]] = Field(default_factory=list, description="the inventory's hosts, as used")
    search_paths: dict[str, list[str]] = Field(
        default_factory=dict, description="the controller's FLAGPERF_VENDOR_PATH / FLAGPERF_CASE_PATH folders the "
        "run's vendor and cases were looked for in, absolute (a relative entry: from where the run was started)")

    @property
    def run_dir(self) -> Path:
        return Path(self.results_dir) / self.run_id

    @property
    def case_folders(self) -> list[str]:
        """The run's cases as folders of a case root, <family>/<case>: what a host's containers get of the case
        folders outside its project."""
        return [f"{case.family}/{case.name}" for case in self.cases]


def new_run_id(suffix: str | None = None) -> str:
    return f"run{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{suffix or secrets.token_hex(2)}"


def run_id_for_flow_run(results_dir: str | Path, flow_run_id: str) -> str:
    """The run folder of a flow run: the one it made on an earlier attempt, else a new name ending in the
    flow run's id, so that `prefect flow-run retry` finds its own results again."""
    suffix = flow_run_id.replace("-", "")[-12:]  # UUIDv7: the head is a timestamp, the tail is random
    earlier = sorted(Path(results_dir).glob(f"run*-{suffix}"))
    return earlier[-1].name if earlier else new_run_id(suffix)


def available_suites() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in suite_roots():
        if root.is_dir():
            for path in sorted(root.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return found


def find_suite(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and is_present(path):  # read as a file, which says if it is not one
        return path
    suites = available_suites()
    if name_or_path not in suites:
        raise ConfigError("--suite", None, unknown_name("suite", name_or_path, suites, "flagperf list suites"))
    return suites[name_or_path]


def _spread(overrides: dict[str, Any], source: str, key_prefix: str, selected: dict[str, set[str]],
            broken: Mapping[str, ConfigError] | None = None) -> tuple[dict[str, dict[str, Any]], list[ConfigError]]:
    """An override for every case: applied where the key exists; a finding if no selected case has it. Every
    key is looked at (the refused ones are returned, the others spread), so one typo hides no other finding.
    ``broken``: engine name -> the error of its engine.yaml, which could not say its options: a key no case has may
    be one of theirs, so those are said first, and the key's own line (a typo's) after them, not instead."""
    broken = broken or {}
    per_case: dict[str, dict[str, Any]] = {}
    refused: list[ConfigError] = []
    for key, value in overrides.items():
        top = key.split(".", 1)[0]  # a dotted key (slo.ttft_s) goes where its mapping's key is
        targets = [case for case, keys in selected.items() if top in keys]
        if not targets and not_read_message(top):
            refused.append(ConfigError(source, f"{key_prefix}{key}", str(not_read_message(top))))
            continue
        if not targets:
            refused[:0] = [error for error in broken.values() if error not in refused]
            keys = sorted(set().union(*selected.values()))
            close = nearest(top, keys)
            neither = (f"no selected case is named {top!r} (selected: {', '.join(selected)}), and "
                       if top != key else "")
            refused.append(ConfigError(source, f"{key_prefix}{key}", neither + "no selected case has this key ("
                                       + (f"did you mean {' or '.join(close)}? " if close else "")
                                       + f"the selected cases have: {', '.join(keys)})"
                                       + unless_declared_by(dict(broken))))
            continue
        for case in targets:
            per_case.setdefault(case, {})[key] = value
    return per_case, refused


def plan_run(*, suite: str | None = None, cases: list[str] | None = None, vendor: str = "cpu",
             rounds: int | None = None, sets: list[str] | None = None, results_dir: str | Path = "results",
             run_id: str | None = None, flow_run_id: str | None = None,
             hosts: list[dict[str, Any]] | None = None, inventory_overrides: dict[str, Any] | None = None,
             inventory_source: str = "inventory", resume: bool = False,
             inventory_endpoints: dict[str, dict[str, Any]] | None = None) -> RunPlan:
    """inventory_overrides: settings an inventory gives every case that has the key (FlagPerf's host.yaml
    NPROC_PER_NODE); below --set, and no error when no case has the key. inventory_endpoints: the running
    servers the inventory names; a case's ``endpoint: NAME`` becomes that entry here, once. resume: continue
    the run folder
    ``run_id`` of another flow run (`flagperf run --retry`), which must have planned the same work."""
    if suite and cases:
        raise ConfigError("flagperf run", None, "give --suite or --cases, not both")
    try:
        pin_search_paths()  # where the controller starts: its rounds, checks and digests read these folders
    except StartFolderGone as exc:
        raise ConfigError(exc.variable, None, exc.message) from None
    sets = list(sets or [])
    resolved_vendor = load_vendor(vendor)  # the one lookup of the run: fails early on an unknown or malformed vendor
    hardware = resolved_vendor.manifest.hardware
    known = available_cases()
    if run_id and (resume or flow_run_id):  # a retry's cases are the run's: one the search path lost, said so
        _run_cases_found(Path(results_dir) / run_id, known)

    suite_name: str | None = None
    suite_overrides: dict[str, dict[str, Any]] = {}
    suite_source = ""
    problems: list[ConfigError] = []  # a suite's findings, gathered: `flagperf validate` prints each
    if cases:
        names = list(cases)
        for name in names:
            if not NAME_PATTERN.match(name):
                raise ConfigError("--cases", name, "not a valid case name")
            if name not in known:
                raise ConfigError("--cases", None, unknown_name("case", name, known, "flagperf list cases"))
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError("--cases", dupes[0], "listed more than once")
        suite_rounds = 1
    else:
        path = find_suite(suite or DEFAULT_SUITE)
        suite_file = load_suite(path)
        suite_name, names, suite_rounds = suite_file.name, list(suite_file.cases), suite_file.rounds
        suite_overrides = dict(suite_file.overrides)
        suite_source = display_path(path)
        problems += [ConfigError(suite_source, f"overrides.{case_name}", "is not one of the suite's cases")
                     for case_name in suite_overrides if case_name != "*" and case_name not in names]

    if rounds is not None and not 1 <= rounds <= MAX_ROUNDS:
        raise ConfigError("--rounds", None, f"must be between 1 and {MAX_ROUNDS}, got {rounds}")
    defs: dict[str, CaseDef] = {}
    for name in names:
        if suite_name and name not in known:
            problems.append(ConfigError(suite_source, "cases",
                                        unknown_name("case", name, known, "flagperf list cases")))
            continue
        try:
            defs[name] = load_case(name, known)
            # the vendor's adaptation of the case, read (never run) before anything starts
            read_adaptation(defs[name].folder, name, defs[name].family, resolved_vendor.name, resolved_vendor.folder)
        except ConfigError as exc:
            problems.append(exc)
            defs.pop(name, None)
    if len(defs) < len(names):  # the steps below need every case: stop here with what was found
        raise gathered(problems)

    options = {name: engine_option_keys(d, vendor) for name, d in defs.items()}  # read once, handed on
    configurable = {name: settable_keys(d, options[name]) for name, d in defs.items()}
    # a selected inference case's vendor engine whose engine.yaml is broken: said only for a key no case has
    broken = {name: error for found in options.values() for name, error in found.broken.items()}
    parsed: list[SetOverride] = [parse_set_override(text, names) for text in sets]

    layers: dict[str, list[tuple[str, dict[str, Any]]]] = {name: [] for name in names}
    if suite_overrides:
        spread, refused = _spread(suite_overrides.get("*", {}), suite_source, "overrides.*.", configurable,
                                 broken)
        problems += refused
        for case_name, values in spread.items():
            layers[case_name].append((suite_source, values))
        for case_name, values in suite_overrides.items():
            if case_name in layers:  # one not of the suite's cases is a finding above
                layers[case_name].append((suite_source, values))
    for key, value in (inventory_overrides or {}).items():
        only, _, bare = key.rpartition(".")  # "KEY": every case that has it; "CASE.KEY": that case
        for case_name in names:
            if only == case_name or (not only and bare in defs[case_name].manifest.configurations):
                layers[case_name].append((inventory_source, {bare: value}))
    general: dict[str, Any] = {}
    for override in parsed:
        if override.case is None:  # a key given again takes its last place (a check of two keys names the later)
            set_last(general, override.key, override.value)
    spread, refused = _spread(general, "--set", "", configurable, broken)
    if refused:
        raise gathered([*problems, *refused])
    for case_name, values in spread.items():
        layers[case_name].append(("--set", values))
    for override in parsed:
        if override.case is not None:
            layers[override.case].append(("--set", {override.key: override.value}))

    # Files a config names are read where the case runs: checkable here only when every host is this machine.
    files_are_local = all((h.get("transport") or "local") == "local" for h in hosts or [])
    plans = []
    for name in names:
        try:
            _name_endpoint(name, defs[name], layers[name], inventory_endpoints or {}, inventory_source)
            merged = resolve_case_config(defs[name], vendor, layers[name], hardware, files_are_local=files_are_local,
                                         vendor_folder=resolved_vendor.folder, engine_options=options[name])
            place = adaptation_place(defs[name].folder, vendor, resolved_vendor.folder)
        except ConfigError as exc:  # each case's findings, every case: a suite's problems are all said at once
            problems += [_where_in_suite(finding, suite_source, name, suite_overrides) for finding in [exc, *exc.more]]
            continue
        plans.append(CasePlan(
            name=name, family=defs[name].family, description=defs[name].manifest.description,
            config=merged.values, origins=merged.origins, run_overrides=merged.run_overrides,
            vendor_changes={k: list(v) for k, v in merged.vendor_changes.items()},
            vendor_new_keys=merged.vendor_new_keys,
            timeout_s=float(merged.values["timeout_s"]), max_retries=int(merged.values["max_retries"]),
            vendor_folder=display_path(place.folder) if place.present else None,
        ))
    problems += _endpoints_on_hosts(plans, hosts or [], inventory_source, suite_source, suite_overrides)
    if problems:
        raise gathered(problems)

    log_vendor_changes(resolved_vendor.name, plans)
    run_id = run_id or new_run_id()
    if problem := run_id_problem(run_id):
        raise ConfigError("--run-id", None, problem)
    run_dir = Path(results_dir) / run_id
    revision, dirty = git_revision()
    # The code the run's rounds will record: the project's, and its vendor's and cases' on the search paths.
    folders = [f"{p.family}/{p.name}" for p in plans]
    code = search_path_code(PROJECT_ROOT, resolved_vendor.name, folders)  # one scan for the digest and its list
    digest = source_digest(vendor=resolved_vendor.name, cases=folders, code=code)
    plan = RunPlan(run_id=run_id, suite=suite_name, vendor=resolved_vendor, rounds=rounds or suite_rounds, cases=plans,
                   results_dir=str(results_dir), set_overrides=sets, flow_run_id=flow_run_id,
                   git_revision=f"{revision}{'+modified' if dirty else ''}" if revision else None,
                   source_digest=digest, source_code=source_code(code=code),
                   hosts=list(hosts or []), search_paths=searched())
    # An empty folder holds nothing to overwrite: the nightly claims its run folder (mkdir) before its evaluation.
    if run_dir.exists() and not _is_empty_folder(run_dir) and not _is_resumable(run_dir, plan, resume):
        raise ConfigError("--results", None, f"{run_dir} already exists; results are never overwritten")
    return plan


def _run_cases_found(run_dir: Path, known: dict[str, Path]) -> None:
    """A retry of ``run_dir`` finds every case the run planned, or says which it does not: which run, which case,
    the folders looked in, and those the run found it in (its plan records them). Retried from another folder, a
    relative FLAGPERF_CASE_PATH entry names other folders; 'unknown case' alone would not say so."""
    if not is_present(run_dir / PLAN_FILE):
        return
    try:
        earlier = read_plan(run_dir)
    except ConfigError as exc:
        if exc.message.startswith(NOT_A_PLAN):  # not a retry (_is_resumable): a new run, checked as one
            return
        raise
    lost = [case for case in earlier.cases if case.name not in known]
    if not lost:
        return
    looked = ", ".join(str(root) for root in case_roots())
    then = os.pathsep.join(earlier.search_paths.get(CASE_PATH_ENV, [])) or "unset"
    names = ", ".join(f"{case.family}/{case.name}" for case in lost)
    raise ConfigError(display_path(run_dir / PLAN_FILE), "cases",
                      f"run {earlier.run_id}'s case{'s' if len(lost) > 1 else ''} {names} not found: looked in "
                      f"{looked}; the run's {CASE_PATH_ENV} was {then}: retry with that, or from the folder the "
                      "run was started in")


def searched() -> dict[str, list[str]]:
    """The controller's vendor and case search path folders, as a plan records them."""
    return {variable: [str(folder) for folder in folders] for variable in (VENDOR_PATH_ENV, CASE_PATH_ENV)
            if (folders := search_path_folders(variable))}


def moved_search_paths(earlier: RunPlan, plan: RunPlan) -> str:
    """What a retry's search path folders change from its run's ('' if nothing, or if the run's plan is older than
    the record): a retry started from another folder reads a relative entry from there."""
    if "search_paths" not in earlier.model_fields_set:
        return ""
    moved = [f"{variable} was {os.pathsep.join(earlier.search_paths.get(variable, [])) or 'unset'}, the retry's is "
             f"{os.pathsep.join(plan.search_paths.get(variable, [])) or 'unset'}"
             for variable in (VENDOR_PATH_ENV, CASE_PATH_ENV)
             if earlier.search_paths.get(variable, []) != plan.search_paths.get(variable, [])]
    return f"the run's {'; '.join(moved)}; a relative entry is from where the command started" if moved else ""


def _where_in_suite(error: ConfigError, suite_source: str, case_name: str,
                    suite_overrides: dict[str, dict[str, Any]]) -> ConfigError:
    """A finding about a value the suite file set, keyed by its path in that file
    (overrides.<case>.<key>, or overrides.*.<key>), as the file's other findings are."""
    if error.source != suite_source or not error.key:
        return error
    top = error.key.split(".", 1)[0]
    for section in (case_name, "*"):
        if any(key == error.key or key.split(".", 1)[0] == top for key in suite_overrides.get(section, {})):
            return ConfigError(error.source, f"overrides.{section}.{error.key}", error.message)
    return error


# The keys of a named endpoint (the inventory's) that a case's settings may set: where its load is sent from, and the
# accelerators behind it.
NAMED_ENDPOINT_KEYS = ("client_host", "devices")


def _name_endpoint(case_name: str, case: Any, layers: list[tuple[str, dict[str, Any]]],
                   endpoints: dict[str, dict[str, Any]], inventory_source: str) -> None:
    """A case's ``endpoint: NAME`` (the last layer that sets it, else its default) names a running server of the
    inventory: that entry is its value from there on, with the inventory as its origin. A dotted key set after the
    name (``--set endpoint.client_host=h2``, also in the same layer as the name) is set in that entry, checked as the
    entry's own keys are."""
    source, value = display_path(case.manifest_path), case.manifest.configurations.get("endpoint")
    at = -1  # the layer that names it; -1: the case's own default
    for index, (layer_source, values) in enumerate(layers):
        if "endpoint" in values:
            source, value, at = layer_source, values["endpoint"], index
    if not isinstance(value, str):
        return
    if value not in endpoints:
        known = ", ".join(sorted(endpoints)) or "none"
        key = "endpoint"
        if source == "--set":
            key = f"{case_name}.endpoint"
        elif source == display_path(case.manifest_path) and case.manifest_path.name == MANIFEST:
            key = "configurations.endpoint"  # by its path in case.yaml, as the case's other keys there
        raise ConfigError(source, key, f"{value!r} names no endpoint of the inventory ({inventory_source}: {known})")
    entry = (f"{inventory_source} endpoints.{value}", {"endpoint": dict(endpoints[value])})
    # Dotted endpoint keys of --set (for every case or this one, before or after the name: order does not matter) and
    # of the naming layer set the entry's keys: those before it go right after it. Only its client_host and devices
    # may be set so (where the load is sent from, what is behind it): its base_url, model or key set elsewhere would
    # repoint the inventory's endpoint while its origin still names the inventory.
    moved: list[tuple[str, dict[str, Any]]] = []
    for index, (layer_source, values) in enumerate(layers):
        if layer_source != "--set" and index != at:
            continue
        dotted = {key: v for key, v in values.items() if key.startswith("endpoint.")}
        for key in dotted:
            if key.removeprefix("endpoint.") not in NAMED_ENDPOINT_KEYS:
                raise ConfigError(layer_source, f"{case_name}.{key}" if layer_source == "--set" else key,
                                  f"endpoint {value!r} is the inventory's ({inventory_source} endpoints.{value}): only "
                                  f"its {' and '.join(NAMED_ENDPOINT_KEYS)} may be set here; change it there, or give "
                                  "the case an endpoint of its own")
        if dotted and index <= at:  # before the entry: moved after it (those after it already set its keys)
            layers[index] = (layer_source, {key: v for key, v in values.items() if key not in dotted})
            moved.append((layer_source, dotted))
    layers[at + 1:at + 1] = [entry, *moved]


def _endpoints_on_hosts(plans: list[CasePlan], hosts: list[dict[str, Any]], inventory_source: str,
                        suite_source: str = "", suite_overrides: dict[str, dict[str, Any]] | None = None
                        ) -> list[ConfigError]:
    """A case that loads an endpoint runs on one host: its endpoint's ``client_host``, which must name a host of the
    inventory; without one, only on an inventory of one host. A single-node case runs on every host at once
    (flagperf.results.schema.node_groups), and one endpoint loaded by every host at once is measured under all their
    loads: a point labelled 4 in flight has 4 per host there, its latencies are of that load, and each host's prompts
    meet the others' in the endpoint's prefix cache. Positions kept apart per host would keep the prompts apart, not
    the loads; the endpoint's own measurement is one host's. Each error names where ``client_host`` is to be written,
    or where the one it names was: the inventory's endpoint entry, the suite file's overrides, --set, or the case's own
    ``endpoint`` settings."""
    names = [str(h.get("name")) for h in hosts]
    problems = []
    for plan in plans:
        endpoint = plan.config.get("endpoint")
        if not isinstance(endpoint, dict):
            continue
        client = endpoint.get("client_host")
        # A name given is where that key was set (a dotted --set of it has an origin of its own); none, where the
        # endpoint's settings were written.
        origin = (plan.origins.get("endpoint.client_host") if client is not None else None) or \
            plan.origins.get("endpoint", plan.name)
        if origin.startswith(f"{inventory_source} endpoints."):  # the inventory's entry, by its name
            source, key = inventory_source, f"{origin.removeprefix(f'{inventory_source} ')}.client_host"
        elif origin == "--set":
            source, key = origin, f"{plan.name}.endpoint.client_host"
        elif origin.endswith(f"/{MANIFEST}") or origin == MANIFEST:
            source, key = origin, "configurations.endpoint.client_host"
        else:  # the suite file (routed to its overrides below), or another layer keyed as it is written
            source, key = origin, "endpoint.client_host"
        listed = f"{len(names)} host{'s' if len(names) != 1 else ''} ({', '.join(names)})"
        found: ConfigError | None = None
        if client is not None and names and client not in names:
            found = ConfigError(source, key, f"{client!r} names no host of the inventory ({inventory_source}: "
                                             f"{listed}); case {plan.name} loads the endpoint from it")
        elif client is None and len(names) > 1:
            found = ConfigError(source, key, f"not given, and the inventory ({inventory_source}) has {listed}: case "
                                             f"{plan.name} would load its endpoint from every one at once, each point "
                                             "measured under every host's requests, not the load its label says; name "
                                             f"the one host that sends the load (client_host: {names[0]})")
        if found is not None:
            problems.append(_where_in_suite(found, suite_source, plan.name, suite_overrides or {}))
    return problems


def log_vendor_changes(vendor: str, plans: list[CasePlan]) -> None:
    """One INFO line for every default the vendor's files change (each change: DEBUG where it is made, and in
    plan.json's vendor_changes and origins)."""
    changed = {p.name: len(p.vendor_changes) for p in plans if p.vendor_changes}
    if changed:
        log.info("vendor %s changes %d case default(s) in %d case(s) (%s); each change is in plan.json", vendor,
                 sum(changed.values()), len(changed), ", ".join(f"{name}: {n}" for name, n in changed.items()))


NOT_A_PLAN = "not a run's plan"


def read_plan(run_dir: Path) -> RunPlan:
    """The run folder's plan.json, read as a config file is (a FIFO or a device there is refused, never read) and
    at most MAX_RECORD_BYTES (a plan lists every host and case with its settings, so it may be larger than a config
    file); too large, not regular, not JSON or not a plan: one ConfigError line naming the file."""
    path = run_dir / PLAN_FILE
    text = read_config_text(path, max_bytes=MAX_RECORD_BYTES, what="a run's plan")
    try:
        return RunPlan.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(display_path(path), None, f"{NOT_A_PLAN} ({exc.error_count()} problem(s); first: "
                          f"{where + ': ' if where else ''}{validation_message(first)})") from None


def _is_empty_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding nothing of a run: nothing, or only a controller's record (and the
    temporary files an earlier version wrote it through): a controller stopped before its plan leaves only that. A
    controller still holding it refuses the run where it starts (controller_record)."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        with os.scandir(path) as entries:
            return all(entry.name == CONTROLLER_FILE or RECORD_TEMPORARY.fullmatch(entry.name) for entry in entries)
    except OSError:
        return False


def _is_resumable(run_dir: Path, plan: RunPlan, resume: bool = False) -> bool:
    """A retried flow run may continue its own run folder, if it asks for exactly the same work."""
    if plan.flow_run_id is None and not resume:
        return False
    path = run_dir / PLAN_FILE
    if not is_present(path):
        return False
    try:
        earlier = read_plan(run_dir)
    except ConfigError as exc:
        if exc.message.startswith(NOT_A_PLAN):  # an earlier version's plan, or a torn one: a new run, not a retry
            return False
        raise
    if earlier.git_revision != plan.git_revision:
        raise ConfigError(str(run_dir / PLAN_FILE), "git_revision",
                          f"this run folder was made by {earlier.git_revision}, the retry runs {plan.git_revision}: "
                          "kept rounds and new ones would come from different code; start a new run")
    # The vendor counts: an external vendor copied from another plans the same cases and settings, not the same work.
    same_work = (earlier.vendor.name == plan.vendor.name and earlier.cases == plan.cases
                 and earlier.rounds == plan.rounds
                 and [h.get("name") for h in earlier.hosts] == [h.get("name") for h in plan.hosts])
    moved = moved_search_paths(earlier, plan)  # the folders a case's settings came from count as its work
    # The same commit with other local changes, or a copy without git: the code's own digest tells. It covers the
    # run's vendor and cases (those on FLAGPERF_VENDOR_PATH / FLAGPERF_CASE_PATH): compared for the same work only,
    # other work is refused as such below.
    if earlier.source_digest and plan.source_digest and earlier.source_digest != plan.source_digest and same_work:
        raise ConfigError(str(run_dir / PLAN_FILE), "source_digest",
                          f"this run folder was made by code {earlier.source_digest}, the retry runs "
                          f"{plan.source_digest}{f' ({moved})' if moved else ''}: kept rounds and new ones would "
                          "come from different code; start a new run")
    if resume and not same_work:
        other = (f"vendor {earlier.vendor.name}, the retry asks for {plan.vendor.name}"
                 if earlier.vendor.name != plan.vendor.name else moved or "cases, rounds, settings or hosts")
        raise ConfigError(str(run_dir / PLAN_FILE), None, f"this run folder planned other work ({other}): retry "
                          f"with the options it was started with{', from where it was started' if moved else ''}")
    return (resume or earlier.flow_run_id == plan.flow_run_id) and same_work
