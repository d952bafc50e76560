"""Case plug-ins: one folder each, found by walking cases/<family>/<name>/case.yaml.

A base-spec case folder holds:
  case.yaml          name, family, description, peak key, ``configurations`` and ``parameters``
  bench.py           ``Config`` (a pydantic model, subclass of casekit.CaseConfig) and
                     ``run(config, ctx) -> list[Metric]``; timing is done by ``ctx``, never by the case.
                     Cases that differ only in parameters share a core kernel instead:
                     ``entry: flagperf.basespec.<kernel>`` (the six GEMM precisions do).
  vendor/<v>.yaml    the vendor's overrides of ``configurations`` (FlagPerf's rules apply)

An inference case folder (cases/inference/<model>/) keeps FlagPerf's files instead of case.yaml:
  configurations.yaml, parameters.yaml, vendor/<vendor>_configurations.yaml, README.md (first paragraph:
  the description), pytorch/__init__.py (``Config`` and the six functions, see flagperf.inference.pipeline)
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ValidationError, field_validator

from flagperf.config.adaptation import Place, adaptation_place, overrides_file
from flagperf.config.casecode import code_runs, read_case_module
from flagperf.config.engines import INFERENCE_ENGINES, EngineOptions, declared_options, unless_declared_by
from flagperf.config.files import given_name, inside, is_present, read_config_text, regular_file
from flagperf.config.inferencekeys import refuse_keys_not_read
from flagperf.config.models import (
    CASE_FOLDER,
    FAMILY_CONFIGS,
    FAMILY_DRIVERS,
    CaseConfig,
    CaseManifest,
    MergedConfig,
    apply_run_overrides,
    is_core_module,
    load_model,
    merge_vendor_overrides,
    pydantic_error_to_config_error,
    set_last,
    unknown_key_problem,
    vendor_key_problem,
)
from flagperf.config.pyliterals import read_literal_file
from flagperf.config.vendors import import_file
from flagperf.config.yamlio import load_yaml_mapping
from flagperf.errors import ConfigError, gathered, missing_extra, unknown_name
from flagperf.paths import CASE_MANIFEST, INFERENCE_CASE_FILE, INFERENCE_FAMILY, case_roots, display_path

MANIFEST = CASE_MANIFEST
INFERENCE_FILES = (INFERENCE_CASE_FILE, "parameters.yaml")
INFERENCE_ENTRY = "pytorch/__init__.py"
INFERENCE_FUNCTIONS = ("build_dataloader", "create_model", "evaluator", "model_forward", "export_model",
                       "engine_forward")


class InferenceManifest(CaseManifest):
    """An inference case's manifest, made from FlagPerf's files (there is no case.yaml to write, and a case.yaml
    cannot claim the inference family)."""

    family: Literal["inference"]  # type: ignore[assignment]

    @field_validator("entry")
    @classmethod
    def _entry(cls, value: str) -> str:
        if value != INFERENCE_ENTRY:
            raise ValueError(f"an inference case's code is {INFERENCE_ENTRY}")
        return value


@dataclass(frozen=True)
class CaseDef:
    manifest: CaseManifest
    folder: Path

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def family(self) -> str:
        return self.manifest.family

    @property
    def manifest_path(self) -> Path:
        return self.folder / (INFERENCE_FILES[0] if self.family == "inference" else MANIFEST)

    def vendor_file(self, vendor: str) -> Path:
        """The vendor's settings file in the case's own vendor/ folder (overrides_file: the one a run reads)."""
        if self.family == "inference":  # FlagPerf's name for an inference vendor's overrides
            return self.folder / "vendor" / f"{vendor}_configurations.yaml"
        return self.folder / "vendor" / f"{vendor}.yaml"

    def overrides_file(self, vendor: str, vendor_folder: Path | None = None) -> Path:
        """The vendor's settings file a run reads: vendor_file, or the same name in the vendor folder's
        cases/<family>/<case>/ (a vendor kept in its own repository); both there is refused."""
        return overrides_file(self.folder, self.vendor_file(vendor).name, vendor, vendor_folder)

    @cached_property
    def module(self) -> ModuleType:
        entry = self.manifest.entry
        if is_core_module(entry):
            try:
                module = importlib.import_module(entry)
            except ModuleNotFoundError as exc:
                missing = missing_extra(exc, self.family, f"case {self.name}")  # the kernel's package, not the kernel
                if missing is not None:
                    raise missing from None
                if exc.name and not (entry == exc.name or entry.startswith(f"{exc.name}.")):
                    # the kernel is there; a package it imports is not (torch missing or broken on this host)
                    raise ConfigError(display_path(self.manifest_path), "entry",
                                      f"{entry} needs {exc.name!r}, which this Python ({sys.executable}) "
                                      "cannot import") from None
                raise ConfigError(display_path(self.manifest_path), "entry", f"no kernel named {entry!r}") from None
        else:
            module = import_file(self.folder / entry, f"flagperf_case_{self.name.replace('-', '_').replace('.', '_')}",
                                 family=self.family)
        required = {"inference": INFERENCE_FUNCTIONS, "generate": (), "operation": ()}.get(self.family, ("run",))
        for attr in ("Config", *required):
            if not hasattr(module, attr):
                raise ConfigError(display_path(self.manifest_path), "entry", f"{entry} has no {attr!r}")
        if not (isinstance(module.Config, type) and issubclass(module.Config, CaseConfig)):
            raise ConfigError(display_path(self.manifest_path), "entry",
                              f"{entry}: Config must subclass flagperf.measure.casekit.CaseConfig")
        if self.family == "inference" and getattr(module.Config, "family", None) != "inference":
                raise ConfigError(display_path(self.folder / entry), "Config",
                                  "must subclass flagperf.inference.config.InferenceConfig")
        return module

    @cached_property
    def _config_read(self) -> type[BaseModel]:
        required = {"inference": INFERENCE_FUNCTIONS, "generate": (), "operation": ()}.get(self.family, ("run",))
        model = read_case_module(self.folder / self.manifest.entry, self.family, required,
                                 display_path(self.manifest_path), self.manifest.entry)
        if self.family == "inference" and getattr(model, "family", None) != "inference":
            raise ConfigError(display_path(self.folder / self.manifest.entry), "Config",
                              "must subclass flagperf.inference.config.InferenceConfig")
        return model

    @property
    def config_model(self) -> type[BaseModel]:
        """The case's Config: imported with the case's module, or, where case code is not run (`flagperf
        validate`), rebuilt from its source without running it (flagperf.config.casecode). A family driver's
        Config is taken from its own module (FAMILY_CONFIGS), without importing the driver."""
        if not code_runs() and not is_core_module(self.manifest.entry):
            return self._config_read
        if self.manifest.entry == FAMILY_DRIVERS.get(self.family) and self.family in FAMILY_CONFIGS:
            module, _, name = FAMILY_CONFIGS[self.family].partition(":")
            with contextlib.suppress(ModuleNotFoundError):  # then the driver's import says what is missing
                return getattr(importlib.import_module(module), name)
        return self.module.Config


def check_case_folder(folder: Path) -> None:
    """A case folder is <root>/<family>/<name>: a link (of the folder or its family) that leads out of the root
    is refused, so that no file outside the case roots is read or run as a case."""
    inside(folder.parent.parent, Path(folder.parent.name, folder.name), given_name(folder), None, "the case root")


def _case_file(case_folder: Path, name: str) -> Path:
    """A file of the case folder, which a link must not lead out of."""
    inside(case_folder, name, given_name(case_folder / name), None, "the case folder")
    return case_folder / name


def available_cases() -> dict[str, Path]:
    """Case name -> folder, over every case root; a name defined twice is an error."""
    found: dict[str, Path] = {}
    for root in case_roots():
        if not root.is_dir():
            continue
        for manifest in sorted(root.glob(f"*/*/{MANIFEST}")):
            name = manifest.parent.name
            if name in found:
                raise ConfigError(display_path(manifest), None,
                                  f"case {name!r} is also defined in {display_path(found[name])}")
            found[name] = manifest.parent
        for configurations in sorted(root.glob(f"{INFERENCE_FAMILY}/*/{INFERENCE_FILES[0]}")):
            name = configurations.parent.name
            if name in found:
                raise ConfigError(display_path(configurations), None,
                                  f"case {name!r} is also defined in {display_path(found[name])}")
            found[name] = configurations.parent
    return found


def load_inference_manifest(folder: Path) -> InferenceManifest:
    """FlagPerf's configurations.yaml and parameters.yaml, loaded unchanged, as a manifest."""
    check_case_folder(folder)
    configurations = load_yaml_mapping(_case_file(folder, INFERENCE_FILES[0]))
    parameters_path = _case_file(folder, INFERENCE_FILES[1])
    parameters = load_yaml_mapping(parameters_path) if is_present(parameters_path) else {}
    readme = _case_file(folder, "README.md")
    description = f"inference case {folder.name}"
    if is_present(readme):
        paragraphs = [p.strip() for p in read_config_text(readme).split("\n\n") if p.strip()]
        text = next((p for p in paragraphs if not p.startswith("#")), "")
        description = " ".join(text.split()) or description
    try:
        manifest = InferenceManifest(name=folder.name, family="inference", description=description,
                                     entry=INFERENCE_ENTRY, configurations=configurations, parameters=parameters)
    except ValidationError as exc:
        raise pydantic_error_to_config_error(exc, display_path(folder / INFERENCE_FILES[0])) from None
    if not is_present(folder / INFERENCE_ENTRY):
        raise ConfigError(display_path(folder), "entry", f"{INFERENCE_ENTRY} does not exist")
    regular_file(folder, INFERENCE_ENTRY, display_path(folder), "entry", "the case folder")
    return manifest


def load_case_manifest(path: Path) -> CaseManifest:
    check_case_folder(path.parent)
    source = display_path(_case_file(path.parent, path.name))
    manifest = load_model(path, CaseManifest)
    if manifest.name != path.parent.name:
        raise ConfigError(source, "name", f"must match the folder name ({path.parent.name!r})")
    if manifest.family != path.parent.parent.name:
        raise ConfigError(source, "family", f"must match the parent folder ({path.parent.parent.name!r})")
    if not is_core_module(manifest.entry):  # inside the folder, also through links: it is the code run
        regular_file(path.parent, manifest.entry, source, "entry", "the case folder")
    return manifest


def load_case(name: str, cases: dict[str, Path] | None = None) -> CaseDef:
    cases = available_cases() if cases is None else cases
    if name not in cases:
        raise ConfigError("cases", None, unknown_name("case", name, cases, "flagperf list cases"))
    folder = cases[name]
    if not is_present(folder / MANIFEST) and is_present(folder / INFERENCE_FILES[0]):
        return CaseDef(manifest=load_inference_manifest(folder), folder=folder)
    return CaseDef(manifest=load_case_manifest(folder / MANIFEST), folder=folder)


# FlagPerf's vendor scale files begin with ``from config_common import *``: the settings of every scale of the
# case, in config_common.py beside them; read (never run) from the scale file's own folder.
SCALE_COMMON = "config_common"


def _scale_key_problem(case: CaseDef, merged: MergedConfig, key: str) -> str | None:
    """Why a scale file (or the config_common.py it imports) may not set ``key``; None: it may."""
    if key not in merged.values:  # before the mutable rule: a key the case lacks is not an immutable one
        return unknown_key_problem(key, case.manifest.configurations, case.manifest.mutable)
    return vendor_key_problem(key, case.manifest.configurations, merged.parameters, case.manifest.mutable)


def _set_by_vendor(merged: MergedConfig, key: str, value: Any, source: str) -> None:
    default = merged.vendor_changes[key][0] if key in merged.vendor_changes else merged.values[key]
    merged.vendor_changes[key] = (default, value)
    merged.values[key] = value
    merged.origins[key] = source


def _apply_scale_file(case: CaseDef, merged: MergedConfig, place: Place, hardware: str,
                      run_overrides: list[tuple[str, dict[str, Any]]]) -> None:
    """Training: vendor/<vendor>/config_<hw>x<nnodes>x<nproc>.yaml (or FlagPerf's .py form of it, literal
    assignments only, with the config_common.py it may import) for the scale this run uses, between the vendor's
    general file and the run overrides; the same mutable-only rule applies."""
    final = dict(merged.values)
    for _, overrides in run_overrides:
        final.update(overrides)
    nnodes, nproc = final.get("nnodes"), final.get("nproc_per_node")
    if not isinstance(nnodes, int) or not isinstance(nproc, int):
        return
    path = place.folder / f"config_{hardware}x{nnodes}x{nproc}.yaml"
    python_form = path.with_suffix(".py")  # FlagPerf's own form of the file, read without running it
    if is_present(python_form):
        if is_present(path):
            raise ConfigError(display_path(python_form), None, f"{path.name} is there too: keep one of the two")
        path = python_form
    elif not is_present(path):
        return
    place.file(path.name)
    source = display_path(path)
    common: dict[str, Any] = {}
    if path.suffix == ".py":
        read = read_literal_file(path, star_import=SCALE_COMMON)
        values = {key: value for key, value in read.values.items() if key not in read.from_common}
        if read.common is not None:
            common = {key: read.common.values[key] for key in read.common.exported()}
            for key in common:  # its own keys, checked as the scale file's are and named with its file
                problem = _scale_key_problem(case, merged, key)
                if problem:
                    raise ConfigError(read.common.where(key), key, problem)
            for key in common.keys() - values.keys():  # those the scale file does not set again
                if key in ("nnodes", "nproc_per_node") and common[key] != final[key]:
                    raise ConfigError(read.common.where(key), key, f"{common[key]!r} contradicts the name of "
                                                                  f"{path.name}, which imports it")
                # Tolerated where a scale file's line is refused: FlagPerf's config_common.py commonly restates the
                # benchmark's defaults, and being shared by every scale it cannot drop a line for one of them; such
                # a value changes nothing and is not recorded as the vendor's change.
                if type(merged.values[key]) is type(common[key]) and merged.values[key] == common[key]:
                    continue
                _set_by_vendor(merged, key, common[key], read.common.source)
    else:
        values = load_yaml_mapping(path)
    refused: list[ConfigError] = []  # every line refused, not the first only: a vendor fixes the file in one go
    for key, value in values.items():
        if key in ("nnodes", "nproc_per_node") and value != final[key]:
            refused.append(ConfigError(source, key, f"{value!r} contradicts the file name ({path.name})"))
            continue
        problem = _scale_key_problem(case, merged, key)
        if problem:
            refused.append(ConfigError(source, key, problem))
            continue
        current = common.get(key, merged.values[key])  # what the key has once config_common.py is read
        if type(current) is type(value) and current == value:
            given = f" ({SCALE_COMMON}.py gives it)" if key in common else ""
            refused.append(ConfigError(source, key, f"sets the value it already has{given} ({value!r}); remove "
                                                    "the line"))
            continue
        _set_by_vendor(merged, key, value, source)
    if refused:
        raise gathered(refused)


def _fill_model_defaults(case: CaseDef, merged: MergedConfig) -> None:
    """FlagPerf's configurations.yaml holds FlagPerf's keys only: the case's own keys (data_dir ...) keep the
    defaults its Config gives them, and stay settable (a host.yaml's data folder, --set)."""
    source = f"{display_path(case.folder / INFERENCE_ENTRY)} (Config default)"
    for name, field in case.config_model.model_fields.items():
        if name not in merged.values and not field.is_required():
            merged.values[name] = field.get_default(call_default_factory=True)
            merged.origins[name] = source


def engine_option_keys(case: CaseDef, vendor: str) -> EngineOptions:
    """The keys each of the vendor's engines reads from an inference case's config (engine.yaml options)."""
    return declared_options(vendor, INFERENCE_ENGINES) if case.family == "inference" else EngineOptions({}, {})


def settable_keys(case: CaseDef, options: EngineOptions) -> set[str]:
    """What a run override may set for this case: its configurations, and its engines' options (``options``, its
    engine_option_keys: those whose engine.yaml can say them; may_declare for a key none of them has)."""
    return set(case.manifest.configurations).union(options.keys())


def _apply_run_overrides(case: CaseDef, options: EngineOptions, merged: MergedConfig,
                         run_overrides: list[tuple[str, dict[str, Any]]]) -> list[ConfigError]:
    """Run overrides in order. An engine's option (inductor_mode ...) that is not already a key of the case is
    set once the compiler is known, and only if that compiler reads it (``options``: engine_option_keys). Returns
    the keys refused (unknown, or a parameter): the others are set, so that the case's Config can say what else is
    wrong, all at once. A broken engine.yaml of the vendor is said where it matters alone: the case's compiler's, or
    one that may declare a key that is otherwise unknown."""
    by_engine = options.by_engine
    engine_keys = options.keys() - set(merged.values)
    deferred: list[tuple[str, str, Any]] = []
    refused: list[ConfigError] = []
    unreadable = unless_declared_by(options.broken)
    for source, overrides in run_overrides:
        for key in overrides:
            top = key.split(".", 1)[0]
            if top not in merged.values:  # first, then the key's own finding (a typo is not hidden behind them)
                refused[:0] = [error for error in options.may_declare(top) if error not in refused]
        try:
            apply_run_overrides(merged, {k: v for k, v in overrides.items() if k not in engine_keys}, source,
                                unknown_unless=unreadable)
        except ConfigError as exc:
            refused.append(exc)
        deferred += [(source, k, v) for k, v in overrides.items() if k in engine_keys]
    compiler = merged.values.get("compiler")
    if case.family == "inference":
        try:
            options.of_engine(None if compiler is None else str(compiler))  # its engine.yaml broken: said here
        except ConfigError as exc:
            raise gathered([exc, *refused]) from None
    for source, key, value in deferred:
        if key not in options.of_engine(str(compiler)):
            readers = ", ".join(sorted(name for name, keys in by_engine.items() if key in keys))
            raise ConfigError(source, key, f"an option of engine {readers}, not read by compiler {compiler}")
        merged.values[key] = value
        merged.origins[key] = source
        set_last(merged.run_overrides.setdefault(source, {}), key, value)  # as apply_run_overrides keeps them
    return refused


def resolve_case_config(case: CaseDef, vendor: str, run_overrides: list[tuple[str, dict[str, Any]]],
                        hardware: str | None = None, files_are_local: bool = True,
                        vendor_folder: Path | None = None, check_vendor: bool = True,
                        engine_options: EngineOptions | None = None) -> MergedConfig:
    """Defaults -> vendor file -> (training) the vendor's file for this scale -> run overrides, then
    validated by the case's own Config model. files_are_local: the cases run on this machine, so the files
    a config names (exist_onnx_path ...) can be checked here; on remote hosts the case checks them there.
    vendor_folder: the vendor's folder, whose cases/<family>/<case>/ may hold its settings and scale files (by default
    the one `--vendor <vendor>` finds). check_vendor=False: the vendor's files are read, but what only the vendor's
    installed folder can say (its engines, its implementations) is not looked up (a vendor not installed here).
    engine_options: the case's engine_option_keys where the caller has read them already (the plan), else read here."""
    vendor_path = case.overrides_file(vendor, vendor_folder) if vendor else case.vendor_file(vendor)
    # The place of the vendor's files of the case, as the plan takes it for every family: files in both places are
    # refused here too, so that validate and vendor check of a settings file say what the run will say.
    place = adaptation_place(case.folder, vendor, vendor_folder) if vendor else None
    present = bool(vendor) and is_present(vendor_path)
    vendor_overrides = load_yaml_mapping(vendor_path) if present else {}

    vendor_refused: list[ConfigError] = []  # the vendor's two files' findings together, fixed in one go
    # The keys refused are set aside, the others merged: the scale file is read against what the vendor file
    # does set (its nproc_per_node picks the scale file; a key it adds is known there), not bare defaults.
    merged = merge_vendor_overrides(case.manifest.configurations, case.manifest.parameters, vendor_overrides,
                                    defaults_source=display_path(case.manifest_path),
                                    vendor_source=display_path(vendor_path), mutable=case.manifest.mutable,
                                    refused_into=vendor_refused)
    if case.family == "training" and place is not None:
        try:
            _apply_scale_file(case, merged, place, hardware or vendor, run_overrides)
        except ConfigError as exc:
            vendor_refused.append(exc)
    if vendor_refused:
        raise gathered(vendor_refused)
    if case.family == "inference":  # parameters come from their own file
        parameters_source = display_path(case.folder / INFERENCE_FILES[1])
        merged.origins.update(dict.fromkeys(case.manifest.parameters, parameters_source))
        _fill_model_defaults(case, merged)
        refuse_keys_not_read(merged.values, merged.origins, display_path(case.manifest_path))
    options = engine_option_keys(case, vendor) if engine_options is None else engine_options
    refused = _apply_run_overrides(case, options, merged, run_overrides)
    config_model = case.config_model
    try:
        model = config_model.model_validate(merged.values, context={CASE_FOLDER: case.folder})
    except ValidationError as exc:
        raise _keyed_in_manifest(case, gathered([*refused, pydantic_error_to_config_error(
            exc, display_path(case.manifest_path), merged.origins, model=config_model)])) from None
    if refused:
        raise gathered(refused)
    try:
        model.check_for_vendor(_origins_in_order(merged, display_path(vendor_path)), display_path(case.manifest_path),
                               (vendor or None) if check_vendor else None, files_are_local,
                               # a vendor not installed here: its engines are its own folder's, if one is known
                               None if check_vendor or not vendor else [vendor_folder] if vendor_folder else [])
    except ConfigError as exc:
        raise _keyed_in_manifest(case, exc) from None
    merged.values = model.model_dump(mode="json")
    return merged


def _origins_in_order(merged: MergedConfig, vendor_source: str) -> dict[str, str]:
    """The origins in the order their layers set them (the defaults, the vendor file, its scale file, each run
    override in turn): a check of two keys names the one set last, the change that made them disagree. Two keys of
    one run source (--set, a suite) are in the order it set them: a case's own --set (overrides.<case>) after the
    general one (overrides.*), its layer coming later."""
    runs = list(merged.run_overrides)

    def layer(item: tuple[str, str]) -> tuple[int, int]:
        key, origin = item
        if key in merged.run_overrides.get(origin, {}):
            return 3 + runs.index(origin), list(merged.run_overrides[origin]).index(key)
        if key in merged.vendor_changes or key in merged.vendor_new_keys:
            return (1 if origin == vendor_source else 2), 0
        return 0, 0

    return dict(sorted(merged.origins.items(), key=layer))  # stable: a layer's keys keep their order


def _keyed_in_manifest(case: CaseDef, error: ConfigError) -> ConfigError:
    """Findings about a case.yaml's own values named by their path in that file (``configurations.m``,
    ``parameters.precision``), as a suite's are (``overrides.<case>.<key>``): the Config's keys sit under those
    two sections there. FlagPerf's inference files hold their keys at the top, and other files' findings are
    keyed as their own files nest them."""
    if case.manifest_path.name != MANIFEST:
        return error
    source = display_path(case.manifest_path)
    keyed = []
    for finding in (error, *error.more):
        if finding.source == source and finding.key and not finding.key.startswith(("configurations.",
                                                                                     "parameters.")):
            top = finding.key.split(".", 1)[0]
            section = "parameters" if top in case.manifest.parameters else "configurations"
            finding = ConfigError(finding.source, f"{section}.{finding.key}", finding.message)
        keyed.append(finding)
    rekeyed = gathered(keyed)
    rekeyed.left_out = error.left_out
    return rekeyed
