"""Engine plug-ins, for every family that has them (inference compilers, generate engines): one folder each,
vendor_images/<vendor>/<family folder>/<engine>/ (engine_roots: which folders of the vendor), holding engine.yaml (the
manifest below, which a family may extend with its own keys) and the engine's code: a ``file:`` inside the folder,
or a shared ``module:`` of the family. The family owns its contract class; this module finds, checks and imports
engines."""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from flagperf.config.casecode import CodeNotRun, code_runs
from flagperf.config.files import given_name, inside, is_present, regular_file
from flagperf.config.models import StrictModel, check_name, load_model
from flagperf.config.vendors import first_with_manifest, import_file, vendor_folders, vendor_search
from flagperf.errors import CaseUserError, ConfigError, MissingExtra, extra_for
from flagperf.paths import ENGINE_MANIFEST, display_path

INFERENCE_ENGINES = "engines"  # vendor_images/<vendor>/engines/<compiler>/: the inference family's compilers


class Requirement(StrictModel):
    import_name: str = Field(alias="import")
    pip: str

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class EngineManifest(StrictModel):
    """The keys of every engine.yaml; a family's subclass sets module_prefix (where its shared engines live)."""

    module_prefix: ClassVar[str] = "flagperf."

    name: str
    description: str
    module: str | None = None
    file: str | None = None
    requires: list[Requirement] = Field(default_factory=list)
    # The case-config keys the engine reads (its Options): a vendor file or a run override (--set) may give
    # them for a case that runs this engine.
    options: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "engine name")

    @field_validator("module")
    @classmethod
    def _module(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(cls.module_prefix):
            raise ValueError(f"must be a shared engine under {cls.module_prefix}")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> EngineManifest:
        if (self.module is None) == (self.file is None):
            raise ValueError("give exactly one of module and file")
        return self


ManifestT = TypeVar("ManifestT", bound=EngineManifest)
ContractT = TypeVar("ContractT", bound=type)


def engine_roots(vendor: str) -> list[Path]:
    """The folders whose engines are the vendor's, in search order: its own (the first folder of the name with a
    vendor.yaml, the one `--vendor` uses), and each folder of the name without a vendor.yaml, which only adds
    engines (a lab's own operation library for a shipped vendor, docs/operation.md). A folder of the name further on
    with a vendor.yaml of its own is another copy of the vendor, shadowed whole as everything else of it is: its
    engines are not the vendor's (`vendor check` and a missing engine's line name it)."""
    folders = vendor_search(vendor).get(vendor, [])
    home = first_with_manifest(folders)
    return [folder for folder, manifest in folders if folder == home or not manifest]


def root_engines(root: Path, family_folder: str) -> dict[str, Path]:
    """Engine name -> folder, of one vendor folder ``root`` (its <family folder>/<name>/engine.yaml), by name."""
    return {m.parent.name: m.parent for m in sorted((root / family_folder).glob(f"*/{ENGINE_MANIFEST}"))}


def engine_folders(vendor: str, family_folder: str) -> dict[str, Path]:
    """Engine name -> folder, over engine_roots (the first of a name wins)."""
    found: dict[str, Path] = {}
    for root in engine_roots(vendor):
        for name, folder in root_engines(root, family_folder).items():
            found.setdefault(name, folder)
    return found


class DeclaredOptions(StrictModel):
    """The one key of an engine.yaml read before its engine loads: ``options``, by EngineManifest's own rule (a list
    of strings, strict), its other keys left to the family's model when the engine loads."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    options: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class EngineOptions:
    """Each of a vendor's engines' ``options`` (declared_options), and the engines whose engine.yaml cannot say them
    (``broken``: the error of each). A broken engine the case does not run stops nothing: its error is raised only
    where it matters, for the case's own engine (of_engine) or for a key no sound engine reads, which may be the
    broken one's (may_declare)."""

    by_engine: dict[str, set[str]]
    broken: dict[str, ConfigError]

    def keys(self) -> set[str]:
        return set().union(*self.by_engine.values())

    def of_engine(self, name: str | None) -> set[str]:
        """The options of engine ``name``; its error where its engine.yaml is broken."""
        if name is not None and name in self.broken:
            raise self.broken[name]
        return self.by_engine.get(str(name), set())

    def may_declare(self, key: str) -> list[ConfigError]:
        """Where ``key`` would be refused as unknown: the broken engines' errors, as it may be one of theirs (said
        beside the unknown key's own finding, which a typo needs: fixing the engine.yaml alone would not do)."""
        return list(self.broken.values()) if key not in self.keys() else []


def unless_declared_by(broken: dict[str, ConfigError]) -> str:
    """What an unknown key's line adds where engines cannot say their options ('' where none): the key may be one of
    theirs, or a typo; their errors are said beside it."""
    if not broken:
        return ""
    names = ", ".join(sorted(broken))
    if len(broken) == 1:
        return f", unless engine {names} reads it: its engine.yaml cannot be read (said beside this)"
    return f", unless engines {names} read it: their engine.yaml files cannot be read (said beside this)"


def declared_options(vendor: str, family_folder: str) -> EngineOptions:
    """Each of the vendor's engines' ``options`` (engine.yaml), read without importing the engine (its
    library may not be installed on the controller) and as strictly as the manifest is read when the engine loads
    (load_model: one line naming the file and ``options``), not loosely (a bad ``options`` silently taken for none
    would make a vendor file's engine key unknown, or a run's provenance miss it); the rest of the manifest is
    checked when the engine loads. An engine whose engine.yaml cannot be read so is kept with its error (one broken
    engine folder must not stop every case of the vendor that runs another)."""
    found: dict[str, set[str]] = {}
    broken: dict[str, ConfigError] = {}
    for name, folder in engine_folders(vendor, family_folder).items():
        try:
            _check_engine_folder(folder)
            found[name] = set(load_model(folder / ENGINE_MANIFEST, DeclaredOptions).options)
        except ConfigError as exc:
            broken[name] = exc
    return EngineOptions(found, broken)


def load_engine_manifest(vendor: str, name: str, family_folder: str, model: type[ManifestT], source: str,
                         key: str) -> tuple[ManifestT, Path]:
    """The engine ``name`` of ``vendor``, its manifest checked: the folder's name, a ``file:`` that stays
    inside the folder and exists, a ``module:`` that can be found. ``key`` names the config key that chose it."""
    engines = engine_folders(vendor, family_folder)
    if name not in engines:
        known = ", ".join(sorted(engines)) or "none"
        folders = vendor_folders(vendor)
        where = display_path(folders[0] / family_folder) if folders else f"vendor_images/{vendor}/{family_folder}"
        shadowed = next((folder for folder in folders[1:]
                         if is_present(folder / family_folder / name / ENGINE_MANIFEST)), None)
        if shadowed is None:
            raise ConfigError(source, key, f"unknown {key} {name!r} for vendor {vendor} (engines in {where}/: {known})")
        # The hint first, each path once: a line is cut at MAX_LINE, and the source, the shadowed copy and the
        # vendor's folder are each a long path where a vendor keeps its folder outside the project.
        raise ConfigError(source, key, f"unknown {key} {name!r} for vendor {vendor}: {display_path(shadowed)} has it "
                                       f"({family_folder}/{name}/) but is never read: {display_path(folders[0])} comes "
                                       f"first on the search path and shadows it (engines in its {family_folder}/: "
                                       f"{known})")
    folder = engines[name]
    return checked_engine_manifest(folder, model), folder


def checked_engine_manifest(folder: Path, model: type[ManifestT]) -> ManifestT:
    """An engine folder's engine.yaml as a run and `flagperf validate` check it, without importing or running
    anything: every key by ``model`` (ConfigError with every finding, each naming the file and key), the name the
    folder's, a ``file:`` that stays inside the folder and is a regular file, a ``module:`` that is a module of the
    project (found by its file, not imported: its package may need a library this machine lacks)."""
    _check_engine_folder(folder)
    manifest_source = display_path(folder / ENGINE_MANIFEST)
    manifest = load_model(folder / ENGINE_MANIFEST, model)
    if manifest.name != folder.name:
        raise ConfigError(manifest_source, "name", f"must match the folder name ({folder.name!r})")
    if manifest.file is not None:  # '../x.py', an absolute path, a link out of the folder: refused
        regular_file(folder, manifest.file, manifest_source, "file", "the engine's folder")
    if manifest.module is not None and project_module_file(manifest.module) is None:
        raise ConfigError(manifest_source, "module", f"no module named {manifest.module!r}")
    return manifest


MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def project_module_file(name: str) -> Path | None:
    """The file of the project's module ``name`` (flagperf.<...>: a shared engine's module_prefix keeps it so),
    found in the package's folder without importing anything; None where there is none."""
    if not MODULE_NAME.match(name) or name.split(".")[0] != "flagperf":
        return None
    import flagperf  # already imported: this module is part of it

    path = Path(flagperf.__file__).parent.joinpath(*name.split(".")[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _check_engine_folder(folder: Path) -> None:
    """<vendor root>/<vendor>/<family folder>/<engine>/engine.yaml: no link leads out of the vendor root."""
    root = folder.parents[2]
    inside(root, folder.relative_to(root), given_name(folder), None, "the vendor root")
    inside(folder, ENGINE_MANIFEST, given_name(folder / ENGINE_MANIFEST), None, "the engine's folder")


def missing_requirements(manifest: EngineManifest) -> list[Requirement]:
    return [r for r in manifest.requires if importlib.util.find_spec(r.import_name) is None]


@dataclass(frozen=True)
class EngineDef:
    """A found engine: its checked manifest and folder; a family's subclass adds ``engine_class``."""

    manifest: EngineManifest
    folder: Path

    @property
    def source(self) -> str:
        return display_path(self.folder / ENGINE_MANIFEST)

    def missing_packages(self) -> list[Requirement]:
        return missing_requirements(self.manifest)


def import_engine(manifest: EngineManifest, folder: Path, contract: ContractT, extra: str,
                  attribute: str = "Engine") -> ContractT:
    """The engine's class (``attribute``, ``Engine`` unless the family names it otherwise), a subclass of the
    family's ``contract``; a missing library is one line naming the package (and the project's extra that
    installs it, where one does)."""
    source = display_path(folder / ENGINE_MANIFEST)
    missing = missing_requirements(manifest)
    for requirement in missing:
        found = extra_for(requirement.import_name, extra)
        if found:
            raise MissingExtra(*found, f"engine {manifest.name} ({source})")
    if missing:
        raise CaseUserError(f"engine {manifest.name} ({source}) needs the Python package(s) "
                            f"{', '.join(r.pip for r in missing)}: not installed on this host "
                            f"(import {', '.join(r.import_name for r in missing)} fails)")
    if manifest.file is not None and not code_runs():
        raise CodeNotRun(f"engine {manifest.name} ({source}) is not imported: flagperf validate runs no plug-in code")
    if manifest.module is not None:
        module = importlib.import_module(manifest.module)
    else:
        module = import_file(folder / str(manifest.file),
                             f"flagperf_{extra}_engine_{folder.parent.parent.name}_{manifest.name}")
    cls = getattr(module, attribute, None)
    if not (isinstance(cls, type) and issubclass(cls, contract)):
        raise ConfigError(source, "file" if manifest.file else "module",
                          f"must define {attribute}, a subclass of {contract.__module__}.{contract.__qualname__}")
    return cls
