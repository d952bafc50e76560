"""Configuration models and FlagPerf's override rules, validated before anything runs.

Three layers make a case's configuration, each value remembering where it came from:
  1. the case's defaults (``configurations``) and fixed ``parameters`` (case.yaml);
  2. the vendor's file (``vendor/<vendor>.yaml`` in the case folder), under FlagPerf's rules:
     a new key warns, a changed key is logged, an override equal to the default is an error,
     and parameters cannot be overridden at all;
  3. run-level overrides (a suite's ``overrides`` and ``flagperf run --set``), recorded in provenance.
"""

from __future__ import annotations

import copy
import logging
import re
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flagperf.config.flagperf_keys import flagperf_key_hint
from flagperf.config.yamlio import load_yaml_mapping, parse_yaml_text
from flagperf.errors import LISTED_IN_FULL, ConfigError, gathered, nearest, unknown_name, validation_message
from flagperf.paths import NAME_PATTERN, display_path
from flagperf.results.schema import MAX_ROUNDS

log = logging.getLogger("flagperf.config.models")

BUILTIN_KERNEL_PREFIX = "flagperf.basespec."
# Families whose cases are configurations of one shared driver: case.yaml names it (or leaves entry out).
FAMILY_DRIVERS = {"generate": "flagperf.generate.driver", "operation": "flagperf.operation.driver"}
# Each driver's Config (module:class), where it is defined apart from the driver: a case's config is checked
# (`flagperf validate`, a run refused for bad input) without loading the driver's engines and torch.
FAMILY_CONFIGS = {"generate": "flagperf.generate.config:GenerateConfig",
                  "operation": "flagperf.operation.config:OperationConfig"}
# The type of a validator's error (pydantic_core.PydanticCustomError) whose value may be a secret: its line
# names the file and the key, never the value.
HIDDEN_INPUT = "hidden_input"
# The context key (PydanticCustomError's ctx) by which a model validator's error names the key it is about: a
# model validator's error has no location of its own, and its line would name neither the key nor its file.
KEY_OF_MODEL_ERROR = "key"
# The validation context's key for the case's folder (resolve_case_config, the round's entry): a family's config
# resolves paths a case names relative to it (a serving case's prompts file).
CASE_FOLDER = "case_folder"


def is_core_module(entry: str) -> bool:
    """A case entry that is a module of the core (a shared kernel or a family's driver), not a file."""
    return entry.startswith(BUILTIN_KERNEL_PREFIX) or entry in FAMILY_DRIVERS.values()


def check_name(value: str, what: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(
            f"{what} {value!r} must start with a letter or digit and use only letters, digits, '_', '.', '-'"
        )
    return value


def pydantic_error_to_config_error(exc: ValidationError, source: str, origins: dict[str, str] | None = None,
                                   model: type[BaseModel] | None = None) -> ConfigError:
    """Every validation error, each as one line naming the file the offending key came from: the first is the
    error, the others its ``more`` (`flagperf validate` prints them all). With ``model``, an unknown key names
    the accepted keys nearest to it (a misspelling)."""
    errors = exc.errors()
    extras = [e for e in errors if e["type"] == "extra_forbidden"]
    kept: list[dict[str, Any]] = []
    for err in errors:
        if err["type"] == "missing" and any(e["loc"][:-1] == err["loc"][:-1] for e in extras):
            continue  # a required key misspelt: the unknown key beside it is the one to name
        if any(_same_value_other_branch(err, earlier, model) for earlier in kept):
            continue  # one line for a value, not one per member of a union it matches none of
        kept.append(err)
    if not kept:  # only missing keys, each beside an unknown one: name the first as it is
        kept = errors[:1]
    return gathered(_error_line(err, source, origins, model) for err in kept)


def _same_value_other_branch(err: Any, earlier: Any, model: type[BaseModel] | None = None) -> bool:
    """``err`` is ``earlier``'s value failing another member of the same union (pydantic reports each member):
    both end in a union member's tag under the same path. Two keys side by side holding the same small int,
    None or bool hold one shared object too, so the last parts must be tags, never the model's keys."""
    loc, seen = err["loc"], earlier["loc"]
    return (len(loc) == len(seen) > 0 and tuple(loc[:-1]) == tuple(seen[:-1]) and loc[-1] != seen[-1]
            and _is_union_tag(loc, model) and _is_union_tag(seen, model)
            and err["type"] != earlier["type"] and "input" in err
            and err["input"] is earlier.get("input") and err["type"] not in ("extra_forbidden", "missing"))


# pydantic's tags for a union's members: a type's name (int, str ...), a schema's (list[int], constrained-int,
# literal['auto'], function-after[...]) or a model's class name.
_PLAIN_TAGS = frozenset({"int", "float", "str", "bool", "bytes", "none", "decimal", "date", "datetime", "time",
                         "timedelta", "uuid", "url", "any", "callable"})


def _is_union_tag(loc: tuple[int | str, ...], model: type[BaseModel] | None) -> bool:
    part = loc[-1]
    if not isinstance(part, str):
        return False
    if model is not None and part in _accepted_keys(model, loc):
        return False  # a key of the model there
    return part in _PLAIN_TAGS or "[" in part or part.startswith(("constrained-", "lax-or-strict")) \
        or bool(re.match(r"[A-Z][a-z0-9]", part))


def _error_line(err: Any, source: str, origins: dict[str, str] | None, model: type[BaseModel] | None
                ) -> ConfigError:
    named = (err.get("ctx") or {}).get(KEY_OF_MODEL_ERROR)  # a model validator's error about one key
    loc = err["loc"] or (tuple(str(named).split(".")) if named else ())
    key = ".".join(str(part) for part in loc) or None
    top = str(loc[0]) if loc else ""
    # The longest part of the key that has an origin: a dotted --set (slo.ttft_s) names its own.
    where = next((origins[k] for k in (".".join(str(p) for p in loc[:n]) for n in range(len(loc), 0, -1))
                  if k in (origins or {})), (origins or {}).get(top, source)) if origins else source
    message = validation_message(err)
    if err["type"] == "extra_forbidden":
        accepted = _accepted_keys(model, err["loc"]) if model and err["loc"] else []
        close = nearest(str(err["loc"][-1]), accepted)
        message = "unknown key" + (f" (did you mean {' or '.join(close)}?)" if close else
                                   f" (known: {', '.join(accepted)})" if 0 < len(accepted) <= LISTED_IN_FULL else "")
    elif err["type"] == "missing":
        message = "required key is missing"
    elif "input" in err and err["type"] != HIDDEN_INPUT:
        shown = short_repr(err["input"])
        if not (isinstance(err["input"], str) and shown in message):  # a validator that quoted it said it once
            message = f"{message} (got {shown})"
    return ConfigError(where, key, message)


def _accepted_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys accepted where ``loc`` ends, following nested models (a list's or an optional's too)."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list: the list's model was taken at its key
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        candidates = [field.annotation, *get_args(field.annotation)]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return []
        current = nested
    return list(current.model_fields)


_SHORT = reprlib.Repr()  # (keyword arguments need Python 3.12)
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxset = 2, 4, 4, 4, 4
_SHORT.maxstring = _SHORT.maxother = 60


def short_repr(value: object) -> str:
    """A value as an error line may show it: bounded, however large the value (reprlib stops early)."""
    return _SHORT.repr(value)


# The keys of a vendor's spec table a case may be measured against (every vendor's spec module uses them), each
# with the one unit the cases measure it in: a ratio or MFU is only formed against a peak in the figure's own unit,
# so a peak in another (GFLOPS, TB/s, GB for GiB) would silently give none (Vendor.spec_table refuses it).
PEAK_UNITS = {"fp64": "TFLOPS", "fp32": "TFLOPS", "tf32": "TFLOPS", "bf16": "TFLOPS", "fp16": "TFLOPS",
              "fp8": "TFLOPS", "int8": "TOPS", "memory_bandwidth": "GB/s", "memory_capacity": "GiB",
              "h2d_bandwidth": "GB/s", "d2h_bandwidth": "GB/s", "p2p_bandwidth": "GB/s", "allreduce_bandwidth": "GB/s",
              "internode_bandwidth": "GB/s", "memory_side_cache": "MiB"}
PEAK_KEYS = frozenset(PEAK_UNITS)
# Device facts beside the peaks: no ratio is formed against them, and null says the device has none
FACT_KEYS = frozenset({"memory_side_cache"})


class StrictModel(BaseModel):
    # strict: a value of the wrong type is an error, never converted ("3" is not a number, 1 is not true);
    # path fields opt out with Field(strict=False), since a path in YAML is a string.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CaseManifest(StrictModel):
    """case.yaml of a base-spec case."""

    name: str
    family: Literal["base", "training", "generate", "operation"]
    description: str
    entry: str = "bench.py"
    peak: str | None = Field(default=None, description="key of the vendor spec table this case is measured against")
    configurations: dict[str, Any]
    parameters: dict[str, Any] = Field(default_factory=dict)
    mutable: list[str] | None = Field(
        default=None, description="training: the only configurations a vendor may override (enforced)")

    @model_validator(mode="before")
    @classmethod
    def _family_driver(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("family") in FAMILY_DRIVERS:
            driver = FAMILY_DRIVERS[data["family"]]
            if data.setdefault("entry", driver) != driver:
                raise ValueError(f"a {data['family']} case's entry is {driver} (leave it out)")
        return data

    @model_validator(mode="after")
    def _mutable_are_configurations(self) -> CaseManifest:
        unknown = sorted(set(self.mutable or []) - set(self.configurations))
        if unknown:
            raise ValueError(f"mutable lists keys that are not configurations: {', '.join(unknown)}")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "case name")

    @field_validator("peak")
    @classmethod
    def _peak(cls, value: str | None) -> str | None:
        if value in FACT_KEYS:  # a device fact (a cache's size): a figure against it would be no roofline
            raise ValueError(f"'{value}' is a device fact of the spec table, not a peak a case is measured against")
        if value is not None and value not in PEAK_KEYS:
            raise ValueError(unknown_name("peak", value, PEAK_KEYS - FACT_KEYS).replace("known:", "spec-table keys:"))
        return value

    @field_validator("entry")
    @classmethod
    def _entry(cls, value: str) -> str:
        # A file in the case folder, or one of the core's shared kernels (several cases, one kernel).
        if value in FAMILY_DRIVERS.values():
            return value
        if value.startswith(BUILTIN_KERNEL_PREFIX):
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", value.removeprefix(BUILTIN_KERNEL_PREFIX)):
                raise ValueError(f"must be {BUILTIN_KERNEL_PREFIX}<kernel>")
            return value
        if "/" in value or "\\" in value or not value.endswith(".py"):
            raise ValueError(f"must be a .py file inside the case folder or {BUILTIN_KERNEL_PREFIX}<kernel>")
        return value


class SuiteFile(StrictModel):
    """deployments/suites/<name>.yaml: which cases, how many rounds, and run-level overrides."""

    name: str = Field(description="the suite's name: the file's name without .yaml (`--suite NAME` finds it)")
    description: str = ""
    cases: list[str] = Field(min_length=1)
    rounds: int = Field(default=1, ge=1, le=MAX_ROUNDS)
    overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="case name (or '*' for every case) -> {key: value}"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "suite name")

    @field_validator("cases")
    @classmethod
    def _cases(cls, value: list[str]) -> list[str]:
        for name in value:
            check_name(name, "case name")
        dupes = sorted({n for n in value if value.count(n) > 1})
        if dupes:
            raise ValueError(f"listed more than once: {', '.join(dupes)}")
        return value


# The keys that make a file a suite: its own, which no other file of the project has at its top (every engine.yaml,
# toolkit.yaml and mkdocs.yml has a name and a description, so those two tell nothing).
SUITE_MARKS = ("cases", "rounds", "overrides")


def looks_like_suite(data: dict[str, Any]) -> bool:
    """Whether a YAML mapping is meant as a suite: it has ``cases``, or (without an inventory's ``hosts`` or any
    of FlagPerf host.yaml's upper-case keys) ``rounds``, ``overrides`` or a key a typo away from one of the three
    (``case:``). Read as a suite, a file with a misspelt key says which key, not that it is no kind of file. The
    typo is a close one (a toolkit.yaml's ``provides`` is not ``overrides``)."""
    if "cases" in data:
        return True
    if "hosts" in data or any(str(key).isupper() for key in data):
        return False
    return any(nearest(str(key), SUITE_MARKS, cutoff=0.8) for key in data)


@dataclass
class MergedConfig:
    """A case configuration after all layers, with the origin of every value."""

    values: dict[str, Any]
    origins: dict[str, str]
    parameters: frozenset[str]
    vendor_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    vendor_new_keys: list[str] = field(default_factory=list)
    run_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)


def unknown_key_problem(key: str, configurations: Iterable[str], mutable: list[str] | None = None) -> str:
    """A vendor file's key the case does not have: most often a misspelling or FlagPerf's name of a key, so the
    line says what was likely meant (FlagPerf's name mapped, else the nearest keys), else what a vendor may set."""
    known = sorted(set(configurations))
    renamed = flagperf_key_hint(key, frozenset(known))
    if renamed:
        return f"unknown key ({renamed})"
    close = nearest(key, known)
    if close:
        return f"unknown key (did you mean {' or '.join(close)}?)"
    settable = known if mutable is None else sorted(mutable)
    if mutable is not None:
        if not settable:
            return "unknown key (a vendor may change none of this case's keys)"
        if len(settable) > LISTED_IN_FULL:
            return "unknown key"
        return f"unknown key (a vendor may change: {', '.join(settable)})"
    return f"unknown key (known: {', '.join(settable)})" if 0 < len(settable) <= LISTED_IN_FULL else "unknown key"


def vendor_key_problem(key: str, configurations: Iterable[str], parameters: Iterable[str],
                       mutable: list[str] | None) -> str | None:
    """Why a vendor file may not set ``key`` (None: it may): one wording for a case's settings file and its
    training scale files. A key the case does not have is unknown (named as such, not as immutable) where the
    case lists what a vendor may change; without the list a new key is the case's Config's to judge."""
    if key in parameters:
        return "is a case parameter; parameters are not vendor-overridable"
    if mutable is not None and key not in configurations:
        return unknown_key_problem(key, configurations, mutable)
    if mutable is not None and key not in mutable:
        return f"is not in the case's mutable list ({', '.join(mutable)}); a vendor may change only those"
    return None


def merge_vendor_overrides(
    configurations: dict[str, Any],
    parameters: dict[str, Any],
    overrides: dict[str, Any],
    *,
    defaults_source: str,
    vendor_source: str,
    mutable: list[str] | None = None,
    refused_into: list[ConfigError] | None = None,
) -> MergedConfig:
    """Apply a vendor file to a case's defaults under FlagPerf's rules (see the module docstring). The keys
    refused are raised together, or, given ``refused_into``, put there and the config merged from the keys
    accepted returned (so that what is read after the vendor file is checked against what it does set)."""
    clash = sorted(set(configurations) & set(parameters))
    if clash:
        raise ConfigError(defaults_source, clash[0], "defined both as a configuration and as a parameter")
    values = {**configurations, **parameters}
    origins = dict.fromkeys(values, defaults_source)
    merged = MergedConfig(values=values, origins=origins, parameters=frozenset(parameters))
    refused: list[ConfigError] = []  # every key refused, not the first only: a vendor fixes the file in one go
    for key, value in overrides.items():
        problem = vendor_key_problem(key, configurations, parameters, mutable)
        if problem:
            refused.append(ConfigError(vendor_source, key, problem))
            continue
        if key not in configurations:
            close = nearest(key, configurations)
            log.warning("%s: %s: new key not in the case defaults (%s)%s", vendor_source, key, defaults_source,
                        f"; did you mean {' or '.join(close)}?" if close else "")
            merged.vendor_new_keys.append(key)
        elif _same_value(configurations[key], value):
            refused.append(ConfigError(
                vendor_source, key, f"overrides the default with the same value ({value!r}); remove the line"))
            continue
        else:
            # One per changed key: DEBUG; the plan logs one summary line, and plan.json keeps each change.
            log.debug("%s: %s: %r -> %r", vendor_source, key, configurations[key], value)
            merged.vendor_changes[key] = (configurations[key], value)
        values[key] = value
        origins[key] = vendor_source
    if refused_into is not None:
        refused_into += refused
    elif refused:
        raise gathered(refused)
    return merged


def _same_value(a: Any, b: Any) -> bool:
    # 1 == 1.0 == True in Python; a vendor writing `true` for a default of 1 did change something.
    return type(a) is type(b) and a == b


def set_last(mapping: dict[str, Any], key: str, value: Any) -> None:
    """``mapping[key] = value`` as its last key, a key set again moved there: a check of two keys names the one set
    last by this order (a run source's layer, --set's general keys)."""
    mapping.pop(key, None)
    mapping[key] = value


def apply_run_overrides(merged: MergedConfig, overrides: dict[str, Any], source: str, unknown_unless: str = "") -> None:
    """Run-level overrides (suite or --set): only existing configuration keys, never parameters. A dotted key
    (``slo.ttft_s``, from --set) sets one key inside a mapping; the case's Config then checks that key.
    ``unknown_unless``: what else an unknown key may be, said in its line (an engine whose engine.yaml cannot say
    its options)."""
    refused: list[ConfigError] = []  # every key refused, not the first only (a suite's findings are all said)
    for key, value in overrides.items():
        top = key.split(".", 1)[0]
        if top in merged.parameters:
            refused.append(ConfigError(source, key, "is a case parameter and cannot be overridden"))
            continue
        if top not in merged.values:
            known = sorted(k for k in merged.values if k not in merged.parameters)
            close = nearest(top, known)  # a typo is the usual cause: the nearest keys say more than all of them
            hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(known)}"
            refused.append(ConfigError(source, key, f"unknown key{f' {top!r}' if top != key else ''} ({hint})"
                                       + unknown_unless))
            continue
        if top != key:
            merged.values[top] = _with_path_set(merged.values[top], key, value, source)
        else:
            merged.values[key] = value
        merged.origins[key] = source
        set_last(merged.run_overrides.setdefault(source, {}), key, value)
    if refused:
        raise gathered(refused)


def _with_path_set(mapping: Any, path: str, value: Any, source: str) -> dict[str, Any]:
    """A copy of ``mapping`` (the value of the path's first part) with the rest of the dotted path set to value;
    every part but the last must name a mapping that is there."""
    parts = path.split(".")
    if not isinstance(mapping, dict):
        raise ConfigError(source, path, f"{parts[0]} is not a mapping (it is {short_repr(mapping)}), so it has no "
                                        f"key {parts[1]!r}")
    changed = copy.deepcopy(mapping)
    node = changed
    for depth, part in enumerate(parts[1:-1], start=1):
        inner = node.get(part)
        if not isinstance(inner, dict):
            where = ".".join(parts[:depth + 1])
            raise ConfigError(source, path, f"{where} is not a mapping" + (
                f" (it is {short_repr(inner)})" if part in node else
                f" of {'.'.join(parts[:depth])} (its keys: {', '.join(map(str, node)) or 'none'})"))
        node = inner
    node[parts[-1]] = value
    return changed


# --set takes scalars and lists of them; a key inside a mapping (a serving case's slo) is set by its dotted path.
MAPPINGS_IN_SUITES = ("set one key of a mapping by its dotted path (--set slo.ttft_s=0.5), or a whole mapping (such "
                      "as an operation case's shapes) in a suite file's overrides (--suite FILE): "
                      "{CASE: {slo: {ttft_s: 0.5, tpot_s: 0.03}}}")


@dataclass(frozen=True)
class SetOverride:
    """One ``--set [CASE.]KEY=VALUE``; ``case`` None means every selected case that has the key. KEY may be a
    dotted path into a mapping (``slo.ttft_s``)."""

    case: str | None
    key: str
    value: Any
    text: str


def _key_part(part: str) -> bool:
    return bool(part) and part.replace("_", "a").isalnum()


SET_YAML_INVALID = ("invalid YAML (the parser's words are not shown: they quote the value, which may be a secret); "
                    "a value starting with *, &, !, [, { or a quote is read as YAML: quote it whole, as in "
                    "--set 'key=\"*text\"'")


def parse_set_override(text: str, case_names: list[str]) -> SetOverride:
    """Parse ``KEY=VALUE`` or ``CASE.KEY=VALUE``; the value is read as YAML (``2048`` is an int). KEY may be a
    dotted path (``slo.ttft_s``): the part before the first dot is a case only where it names a case of the run
    (the longest such name: case names may hold dots), else it is the key of a mapping."""
    if "=" not in text:
        raise ConfigError("--set", text, "expected KEY=VALUE or CASE.KEY=VALUE")
    lhs, raw = text.split("=", 1)
    lhs = lhs.strip()
    case: str | None = None
    key = lhs
    for name in sorted(case_names, key=len, reverse=True):
        if lhs.startswith(name + "."):
            case, key = name, lhs[len(name) + 1:]
            break
    if not all(_key_part(part) for part in key.split(".")):
        if case is None and "." in lhs and not _key_part(lhs.split(".", 1)[0]):
            raise ConfigError("--set", lhs, f"no selected case is named {lhs.rsplit('.', 1)[0]!r} "
                                            f"(selected: {', '.join(case_names)})")
        raise ConfigError("--set", lhs, "the key must be a configuration name such as min_duration_s, or a dotted "
                                        "path into a mapping such as slo.ttft_s")
    if any("\udc80" <= char <= "\udcff" for char in raw):  # bytes of no UTF-8, as Python reads an argv
        raise ConfigError("--set", lhs, "the value is not UTF-8 text")
    try:
        value = parse_yaml_text(raw, "--set") if raw.strip() else ""
    except ConfigError as exc:  # the key it was given for, not "line 1" of a one-line value
        # The parser's problem quotes the value (an alias' name, a tag), and a value (server_env.*) may be a secret
        message = SET_YAML_INVALID if exc.message.startswith("invalid YAML") else exc.message
        raise ConfigError("--set", lhs, message) from None
    if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict | list) for v in value)):
        raise ConfigError("--set", lhs, f"the value must be a scalar or a list of scalars; {MAPPINGS_IN_SUITES}")
    return SetOverride(case=case, key=key, value=value, text=text)


ModelT = TypeVar("ModelT", bound=BaseModel)


def load_model(path: Path, model: type[ModelT]) -> ModelT:
    """A YAML file validated by a pydantic model; any error is one line naming the file and key."""
    data = load_yaml_mapping(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise pydantic_error_to_config_error(exc, display_path(path), model=model) from None


def load_suite(path: Path) -> SuiteFile:
    data = load_yaml_mapping(path)
    try:
        suite = SuiteFile.model_validate(data)
    except ValidationError as exc:
        error = pydantic_error_to_config_error(exc, display_path(path), model=SuiteFile)
        if "cases" not in data and ("hosts" in data or "HOSTS" in data) and error.message.startswith("unknown key"):
            # an inventory given where a suite goes: said instead of the suite's keys
            error = gathered([ConfigError(error.source, error.key, "unknown key (this looks like an inventory; "
                                          "--suite takes a suite: name, cases, rounds, overrides)"), *error.more])
        raise error from None
    if suite.name != path.stem:
        raise ConfigError(display_path(path), "name", f"must match the file name ({path.stem!r}), got {suite.name!r}")
    return suite


class CaseConfig(BaseModel):
    """Keys every case has; the values live in case.yaml, not here. A family's config base may add checks
    that need the vendor (``check_for_vendor``), so the plan validates every family without knowing it."""

    # strict: `true` is not 1 and 1 is not `true`; no inf or nan from `--set timeout_s=.inf`.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    timeout_s: float = Field(gt=0, description="the round is killed (and retried) after this long")
    max_retries: int = Field(ge=0, le=10, description="retries after an infrastructure failure")

    def check_for_vendor(self, origins: dict[str, str], source: str, vendor: str | None,
                         files_are_local: bool, engine_roots: list[Path] | None = None) -> None:
        """Checks beyond the fields, made by the plan before anything runs; vendor is None when
        `flagperf validate` checks a case's defaults, or a vendor's files where that vendor is not installed here:
        then ``engine_roots`` lists the folders its engines may be read from (its own folder, or none known), where
        None (a case's defaults) means every installed vendor's. Nothing to check here; families override it."""
        return None
