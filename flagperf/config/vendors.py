"""Vendor plug-ins: one folder each under vendor_images/, described by vendor.yaml.

A vendor folder holds:
  vendor.yaml            this manifest (torch device, monitors, spec module, container options)
  spec.py                ``spec_table(settings: dict) -> SpecTable``: peaks with their sources
  <health>.py            optional ``device_health(settings: dict) -> dict``: each device's health at the healthcheck
                         (flagperf.results.devicehealth)
  <monitor>.py           monitor scripts (``--out FILE --interval S --pid-file F --max-seconds N``)
  <framework>/Dockerfile the image the cases run in, when a container engine is used
  cases/<family>/<case>/ the vendor's files of a case, when kept here (flagperf.config.adaptation)
Adding a vendor is adding a folder; nothing in the engine names a vendor.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flagperf.config.casecode import CodeNotRun, code_runs
from flagperf.config.files import given_name, inside, is_present, regular_file
from flagperf.config.models import (
    PEAK_UNITS,
    StrictModel,
    check_name,
    load_model,
    pydantic_error_to_config_error,
)
from flagperf.errors import ConfigError, FlagperfError, SpecSettingError, missing_extra, nearest, unknown_name
from flagperf.paths import PROJECT_ROOT, VENDOR_MANIFEST, display_path, vendor_roots
from flagperf.results.devicehealth import checked_reading, unavailable
from flagperf.results.schema import Peak, SpecTable

MANIFEST = VENDOR_MANIFEST
TOOLKITS_FOLDER = "toolkits"  # <vendor folder>/toolkits/<name>/toolkit.yaml (flagperf.basespec.toolkit)
SETTING_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
MAX_SETTING_TEXT = 200
MAX_SETTING_NUMBER = 1e12  # far above any clock, channel count or transfer rate; a typo's exponent is refused


class MonitorEntry(StrictModel):
    """A monitor is a core module (``module: flagperf.monitoring.system``, shared by vendors) or a
    script in the vendor folder (``script: monitor_nvml.py``); both take the same arguments."""

    name: str
    module: str | None = None
    script: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "monitor name")

    @field_validator("module")
    @classmethod
    def _module(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"flagperf\.monitoring\.[a-z_][a-z0-9_]*", value):
            raise ValueError("must be a module under flagperf.monitoring")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> MonitorEntry:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of module and script")
        return self


class DeviceRequestEntry(StrictModel):
    """docker's device request (what ``--gpus`` becomes), e.g. {driver: nvidia, count: -1, capabilities: [[gpu]]}."""

    driver: str = ""
    count: int = 0
    device_ids: list[str] | None = None
    capabilities: list[list[str]] | None = None
    options: dict[str, str] | None = None


class ContainerOptions(StrictModel):
    dockerfile: str = Field(description="the default framework's Dockerfile, e.g. pytorch/Dockerfile")
    python: str = Field(default="python3", description="the image's Python")
    privileged: bool = False
    privileged_reason: str | None = None
    shm_size: str = "1g"
    ipc: str | None = Field(default=None, description="docker ipc mode (host, private, shareable)")
    visible_devices_env: str | None = None
    device_requests: list[DeviceRequestEntry] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list, description="device files, e.g. /dev/davinci0")
    device_patterns: list[str] = Field(
        default_factory=list, description="device files this vendor's containers may get besides the built-in "
                                          "RDMA ones, e.g. /dev/nvidia*; * stays within a folder")
    ulimits: dict[str, int] = Field(default_factory=dict, description="e.g. memlock: -1 (RDMA registration), "
                                                                      "stack: 67108864; -1 is unlimited")

    @field_validator("device_patterns")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not re.fullmatch(r"/dev/[A-Za-z0-9_.*?\[\]-]+(/[A-Za-z0-9_.*?\[\]-]+)*", pattern) \
                    or ".." in pattern.split("/"):
                raise ValueError(f"device pattern {pattern!r} must name files under /dev (wildcards * ? [...])")
        return value

    @model_validator(mode="after")
    def _privileged_needs_reason(self) -> ContainerOptions:
        if self.privileged and not (self.privileged_reason or "").strip():
            raise ValueError("privileged: true needs privileged_reason saying why")
        return self


class VendorManifest(StrictModel):
    name: str
    description: str
    torch_device: str = Field(description="torch device type the cases run on: cpu, cuda, xpu, ...")
    shares_host_memory: bool = Field(
        description="the device allocates from host memory (CPU, unified-memory parts): capacity runs are "
                    "bounded so the host never swaps, and there is no host-to-device link to measure")
    hardware: str | None = Field(default=None, description="the <hw> of training scale files "
                                 "(config_<hw>x<nnodes>x<nproc>.yaml); the vendor name when absent")
    spec_module: str = "spec.py"
    health_module: str | None = Field(
        default=None, description="a file of the vendor folder with device_health(settings) -> dict: each device's "
        "health (PCIe link, memory remapping, errors) read by the probe at the healthcheck, recorded in the host's "
        "health report and judged by the fleet diagnosis's health_field rules; None: the vendor reads none")
    spec_settings: dict[str, Any] = Field(default_factory=dict)
    logical_devices: int | None = Field(
        default=None, ge=1, le=1024, description="the host's CPUs split into this many logical devices, each "
        "process pinned to its share of the cores (a CPU setting that gives the every-device path N devices); "
        "None: the devices torch counts for torch_device")
    monitors: list[MonitorEntry] = Field(default_factory=list)
    container: ContainerOptions

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "vendor name")

    @model_validator(mode="after")
    def _default_hardware(self) -> VendorManifest:
        if self.hardware is None:
            object.__setattr__(self, "hardware", self.name)  # frozen model: set once, at validation
        else:
            check_name(self.hardware, "hardware")
        return self


def spec_setting_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be a spec setting (a scalar: a number, a short one-line text, true/false, or null for
    the vendor's default), or None. What a value means is the vendor's spec module's to check, on the host."""
    if not SETTING_NAME.fullmatch(key):
        return "is not a setting name (lower-case letters, digits and _)"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value) or abs(value) > MAX_SETTING_NUMBER:
            return f"{value!r} is not a finite number of at most {MAX_SETTING_NUMBER:g}"
        return None
    if isinstance(value, str):
        if len(value) > MAX_SETTING_TEXT or not value.isprintable():
            return f"must be one line of at most {MAX_SETTING_TEXT} characters"
        return None
    return f"must be a number, a text, true/false or null, not a {type(value).__name__}"


def spec_settings_problem(values: dict[str, Any]) -> tuple[str, str] | None:
    """(key, why) for the first value that cannot be a spec setting, or None."""
    for key, value in values.items():
        problem = spec_setting_problem(key, value)
        if problem:
            return key, problem
    return None


class HostSpecSettings(StrictModel):
    """A host's own spec_settings (its clock, its DIMM population), given by the inventory for that host and
    laid over the vendor's key by key; the vendor folder, and so the source digest, stays as it is."""

    values: dict[str, Any]
    source: str = Field(description="the inventory file that gave them")
    key: str = Field(description="their key in that file, e.g. hosts.0.spec_settings")

    @model_validator(mode="after")
    def _scalars(self) -> HostSpecSettings:
        problem = spec_settings_problem(self.values)
        if problem:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        return self


def check_host_spec_settings(manifest: VendorManifest, values: dict[str, Any], source: str, key: str) -> None:
    """The inventory's settings for a host name keys the vendor's vendor.yaml declares under spec_settings (a
    vendor declares every setting its spec module reads, null where the machine is read): checked on the
    controller without importing the vendor's code."""
    declared = manifest.spec_settings
    for name, value in values.items():
        problem = spec_setting_problem(name, value)
        if problem is None and name not in declared:
            problem = (unknown_name("spec setting", name, declared) + f" (the settings vendor {manifest.name}'s "
                       "vendor.yaml declares)") if declared else \
                f"vendor {manifest.name} reads no spec_settings (its vendor.yaml declares none)"
        if problem:
            raise ConfigError(source, f"{key}.{name}", problem)


class Vendor(BaseModel):
    """A vendor resolved once (in the plan) and handed to every task: its manifest and its folder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest: VendorManifest
    location: str = Field(description="the vendor folder, relative to the project root when it lies inside it, "
                                      "so that a host with its own deployed copy finds its own folder")
    host_settings: HostSpecSettings | None = Field(
        default=None, description="the inventory's spec_settings for the host this runs on (set on the host, from "
                                  "its job: with_host_settings), laid over the manifest's")

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def folder(self) -> Path:
        path = Path(self.location)
        return path if path.is_absolute() else PROJECT_ROOT / path

    def monitor_command(self, entry: MonitorEntry, python: str) -> list[str]:
        """The command that starts a monitor (arguments of flagperf.monitoring.monitor_arguments follow)."""
        if entry.module:
            return [python, "-m", entry.module]
        return [python, str(self.folder / str(entry.script))]

    @cached_property
    def _spec_module(self) -> ModuleType:
        return import_file(self.folder / self.manifest.spec_module, f"flagperf_vendor_{self.name}_spec")

    def device_health(self) -> dict[str, Any] | None:
        """Each device's health on the machine this runs on (call it on the host), in the form of
        flagperf.results.devicehealth.HealthReading, as JSON values; None for a vendor without a health module (no
        reading: the diagnosis's health rules say nothing of its hosts). Never raises: a reading that cannot be made
        (the vendor's library or driver missing, the module's own error, even its sys.exit) is an answer saying
        why, so that a healthcheck records it and goes on, and the diagnosis's rules say "unknown" rather than pass.
        """
        if self.manifest.health_module is None:
            return None
        where = display_path(self.folder / self.manifest.health_module)
        try:
            module = import_file(self.folder / self.manifest.health_module, f"flagperf_vendor_{self.name}_health")
            answer = module.device_health(self.spec_settings()[0])
            reading = checked_reading(answer, f"{where} device_health()").model_dump(mode="json")
            json.dumps(reading, allow_nan=False)  # what the probe prints: a value it cannot write fails here
            return reading
        except KeyboardInterrupt:
            raise
        except FlagperfError as exc:  # a missing extra, a module that does not import, an answer of the wrong form
            return unavailable(str(exc))
        except BaseException as exc:  # the vendor module's own bug (a SystemExit too): one line, the probe goes on
            return unavailable(f"{where} device_health() raised {type(exc).__name__}: {str(exc)[:300]}")

    def with_host_settings(self, settings: HostSpecSettings | None) -> Vendor:
        """This vendor as one host sees it: the inventory's spec_settings for the host over the manifest's."""
        return self if settings is None else Vendor(manifest=self.manifest, location=self.location,
                                                    host_settings=settings)

    def spec_settings(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(the settings the spec module gets, key -> where its value came from)."""
        manifest_file = display_path(self.folder / MANIFEST)
        settings = dict(self.manifest.spec_settings)
        origins = dict.fromkeys(settings, manifest_file)
        if self.host_settings is not None:
            settings.update(self.host_settings.values)
            origins.update({name: f"{self.host_settings.source}: {self.host_settings.key}.{name}"
                            for name in self.host_settings.values})
        return settings, origins

    def spec_table(self) -> SpecTable:
        """Peaks for the machine this runs on (call it on the host, not on the controller). A setting the spec
        module refuses is one line naming the file and key that gave it."""
        settings, _ = self.spec_settings()
        try:
            table = self._spec_module.spec_table(settings)
        except SpecSettingError as exc:
            given = self.host_settings
            if given is not None and exc.key in given.values:
                raise ConfigError(given.source, f"{given.key}.{exc.key}", exc.message) from None
            raise ConfigError(display_path(self.folder / MANIFEST), f"spec_settings.{exc.key}", exc.message) from None
        where = display_path(self.folder / self.manifest.spec_module)
        try:
            checked = SpecTable.model_validate(table)
        except ValidationError as exc:  # the vendor's module returned a table of the wrong form: its file, its key
            raise pydantic_error_to_config_error(exc, f"{where} spec_table()") from None
        for key, peak in checked.peaks.items():
            if peak.value is None and key not in PEAK_UNITS:
                continue  # a placeholder (a precision no case measures yet) costs a run no figure; check names it
            problem = peak_problem(key, peak)
            if problem:
                raise ConfigError(where, f"peaks.{key}", problem)
        return checked


# Units a vendor may write a peak in instead of the one its key is measured in: their size in one base unit of
# their kind, so that the refusal can say what the figure is in the right unit (integer and floating-point
# operations are counted alike: INT8's TOPS are TFLOPS' scale).
_UNIT_SCALES = (
    {"FLOPS": 1.0, "GFLOPS": 1e9, "TFLOPS": 1e12, "PFLOPS": 1e15, "OPS": 1.0, "GOPS": 1e9, "TOPS": 1e12,
     "POPS": 1e15},
    {"MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12, "MiB/s": 2.0**20, "GiB/s": 2.0**30, "TiB/s": 2.0**40},
)
# Sizes are not converted: a datasheet's "GB" of device memory (HBM, GDDR) is a binary size (an H100 "80GB"
# exposes about 79 GiB, an H200 "141 GB" about 139), so 80 GB taken as 10^9 bytes, 74.5 GiB, would put the
# measured capacity at 106% of the peak. The device's own total is the figure.
_SIZE_UNITS = ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")
SIZE_ADVICE = ("give the total the device reports, in GiB (its bytes / 2^30, e.g. from the runtime's memory "
               "query); a datasheet's \"GB\" of device memory is usually GiB already")


def peak_problem(key: str, peak: Peak) -> str | None:
    """Why a spec table's figure for ``key`` would give a wrong or silently missing ratio, or None: a unit other
    than the one the cases measure ``key`` in (no ratio or MFU is formed across units), a value that is no
    positive figure, a value without its source, a key no case reads (a misspelt key's figure would
    silently give no ratio: the case looks its own key up). A null value gives no ratio whatever its unit, so
    only a value's unit is checked."""
    unit = PEAK_UNITS.get(key)
    if unit is None:
        close = nearest(key, PEAK_UNITS)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        return f"not a key any case reads ({hint}known: {', '.join(sorted(PEAK_UNITS))})"
    value = peak.value
    if value is None:
        return None
    if peak.unit != unit:
        advice = f"give the figure in {unit}"
        if peak.unit in _SIZE_UNITS and unit in _SIZE_UNITS:
            advice = SIZE_ADVICE
        for scales in _UNIT_SCALES:
            if peak.unit in scales and unit in scales:
                advice += f" ({value:g} {peak.unit} is {value * scales[peak.unit] / scales[unit]:.6g} {unit})"
        return (f"unit {peak.unit!r}, but cases measure {key} in {unit} (a ratio or MFU is formed in one unit only): "
                f"{advice}")
    if value <= 0:  # NaN and infinity the schema refuses (allow_inf_nan=False) before this
        return f"{value:g} {unit} is no peak: a positive figure, or null where it is not known"
    if not peak.source.strip():
        return f"{value:g} {unit} without a source (the datasheet and table, or how it was derived)"
    return None


def import_file(path: Path, module_name: str, family: str | None = None) -> ModuleType:
    """Import a plug-in's file. A package of one of the project's extras that is missing is one line naming
    the extra (for a case, its family's: training or inference). Refused while `flagperf validate` checks
    files (flagperf.config.casecode): checking a file never runs it."""
    if not code_runs():
        raise CodeNotRun(f"{display_path(path)} is not imported: flagperf validate runs no plug-in code")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(display_path(path), None, "cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a plug-in's own bug: one line naming the file, not a traceback
        sys.modules.pop(module_name, None)
        missing = missing_extra(exc, family, display_path(path)) if isinstance(exc, ImportError) else None
        if missing is not None:
            raise missing from None
        line = f" line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        detail = str(exc).splitlines()[0] if str(exc) else ""
        message = f"cannot be imported:{line} {type(exc).__name__}: {detail}"
        raise ConfigError(display_path(path), None, message) from None
    return module


def load_vendor_manifest(path: Path) -> VendorManifest:
    folder = path.parent
    # vendor_images/<vendor>/vendor.yaml: no link out of the vendor root, nor out of the vendor's folder.
    inside(folder.parent, folder.name, given_name(folder), None, "the vendor root")
    inside(folder, path.name, given_name(path), None, "the vendor folder")
    source = display_path(path)
    manifest = load_model(path, VendorManifest)
    if manifest.name != folder.name:
        raise ConfigError(source, "name", f"must match the folder name ({folder.name!r})")
    for key, rel in [("spec_module", manifest.spec_module), ("container.dockerfile", manifest.container.dockerfile),
                     ("health_module", manifest.health_module)]:
        if rel is not None:
            _check_inside(folder, rel, source, key)
    for i, monitor in enumerate(manifest.monitors):
        if monitor.script is not None:
            _check_inside(folder, monitor.script, source, f"monitors.{i}.script")
        elif importlib.util.find_spec(str(monitor.module)) is None:
            raise ConfigError(source, f"monitors.{i}.module", f"no module named {monitor.module!r}")
    return manifest


def _check_inside(folder: Path, rel: str, source: str, key: str) -> None:
    regular_file(folder, rel, source, key, "the vendor folder")


def vendor_search(name: str | None = None) -> dict[str, list[tuple[Path, bool]]]:
    """Every folder on the vendor search path (of vendor ``name`` alone, when given), by its name, in search order,
    each with whether it holds a vendor.yaml: a dangling link counts (loading the folder then says what is wrong;
    skipping it would silently hand the name to a later copy). The one rule of which folder is which (``--vendor``'s,
    a shadowed copy, a folder that only adds engines) that available_vendors, vendor_folders, shadowed_by and
    engine_roots all go by. A folder listed twice (by two spellings of its path) is one, at its first place."""
    found: dict[str, list[tuple[Path, bool]]] = {}
    seen: set[Path] = set()
    for root in vendor_roots():
        if name is not None:
            children = [root / name]
        else:
            try:
                children = sorted(root.iterdir())
            except OSError:  # not a folder, or one this user cannot list (another user's): no vendor of ours in it
                continue
        for folder in children:
            if not folder.is_dir():
                continue
            real = folder.resolve()
            if real in seen:
                continue
            seen.add(real)
            found.setdefault(folder.name, []).append((folder, is_present(folder / MANIFEST)))
    return found


def first_with_manifest(folders: list[tuple[Path, bool]]) -> Path | None:
    """Of a name's folders (vendor_search), the one `--vendor <name>` uses."""
    return next((folder for folder, manifest in folders if manifest), None)


def vendor_folders(name: str) -> list[Path]:
    """Every folder of vendor ``name`` with a vendor.yaml on the search path, in its order (vendor_search): the first
    is the one `--vendor <name>` uses (everything of the vendor comes from it: manifest, engines, toolkits, case
    files); the others are shadowed by it, never read."""
    return [folder for folder, manifest in vendor_search(name).get(name, []) if manifest]


def available_vendors() -> dict[str, Path]:
    """Vendor name -> the folder `--vendor <name>` uses: the first of that name with a vendor.yaml (vendor_search)."""
    found = {name: first_with_manifest(folders) for name, folders in vendor_search().items()}
    return {name: folder for name, folder in sorted(found.items()) if folder is not None}


SEARCH_ORDER = "vendor_images/, then FLAGPERF_VENDOR_PATH in order"


def shadowed_by(folder: Path, name: str | None = None) -> Path | None:
    """The folder `--vendor <name>` uses instead of ``folder`` (a vendor folder, ``name`` its vendor's, by default
    its folder's name), or None when it uses ``folder`` or finds no vendor of the name."""
    folders = vendor_folders(name or folder.name)
    known = folders[0] if folders else None
    if known is None or known.resolve() == folder.resolve():
        return None
    return known


def shadowed_message(folder: Path, winner: Path, name: str) -> str:
    """What `vendor check` and `validate` say of a vendor folder ``winner`` shadows: which, why, and what to do."""
    if winner.parent.resolve() == vendor_roots()[0].resolve():
        fix = "rename this vendor: the project's vendor_images/ always comes first"
    else:
        fix = f"list {folder.parent} before {winner.parent} on FLAGPERF_VENDOR_PATH, or rename this vendor"
    return (f"shadowed by {display_path(winner)}: --vendor {name} reads the first folder of the name "
            f"({SEARCH_ORDER}), nothing of this one; {fix}")


def load_vendor(name: str) -> Vendor:
    vendors = available_vendors()
    if name not in vendors:
        raise ConfigError("--vendor", None, unknown_name("vendor", name, vendors, "flagperf list vendors"))
    folder = vendors[name]
    return Vendor(manifest=load_vendor_manifest(folder / MANIFEST), location=display_path(folder))
