"""Generate engines as plug-in folders: vendor_images/<vendor>/generate/<engine>/engine.yaml.

The contract: an engine is built once from the case config (it loads or builds the model itself), then
takes a batch of prompts (token ids) that arrive together and returns, per request, when it arrived, when
each output token came out, and the token ids. The batch is the level's concurrency: that many users wait
at once.

engine.yaml:
  name: hf
  description: ...
  module: flagperf.generate.hf     # a shared implementation in the core, or
  file: engine.py                  # a module in the engine folder; either defines ``Engine``
  requires: [{import: vllm, pip: vllm}]

Adding an engine is adding a folder; nothing in the core names one.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ConfigDict, Field, field_validator, model_validator

from flagperf.config.models import StrictModel, check_name, load_model
from flagperf.config.vendors import import_file
from flagperf.errors import CaseUserError, ConfigError, MissingExtra, extra_for
from flagperf.paths import display_path, vendor_roots

ENGINE_MANIFEST = "engine.yaml"
ENGINES_FOLDER = "generate"
ENGINE_PREFIX = "flagperf.generate."


class Requirement(StrictModel):
    import_name: str = Field(alias="import")
    pip: str

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class EngineManifest(StrictModel):
    name: str
    description: str
    module: str | None = None
    file: str | None = None
    requires: list[Requirement] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "engine name")

    @field_validator("module")
    @classmethod
    def _module(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(ENGINE_PREFIX):
            raise ValueError(f"must be a shared engine under {ENGINE_PREFIX}")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> EngineManifest:
        if (self.module is None) == (self.file is None):
            raise ValueError("give exactly one of module and file")
        return self


@dataclass
class RequestTrace:
    """One request, timed on time.perf_counter(): arrival, then one time per output token (when it was on
    the host, i.e. after the device finished the step that made it)."""

    arrival: float
    prompt_tokens: int
    token_times: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)


@dataclass(frozen=True)
class EngineEnv:
    device: torch.device
    work_dir: Path
    log: logging.Logger


class GenerateEngine(ABC):
    def __init__(self, config: Any, env: EngineEnv) -> None:
        """Build or load the model (untimed) from the case config (a flagperf.generate.config.GenerateConfig;
        not imported here, which imports this module to check engines)."""
        self.config = config
        self.env = env

    @property
    @abstractmethod
    def parameters(self) -> int:
        """The model's parameter count (MFU counts 2 FLOP per parameter per token)."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def generate(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[RequestTrace]:
        """Serve the prompts as simultaneous requests, greedily, exactly max_new_tokens each."""


@dataclass(frozen=True)
class EngineDef:
    manifest: EngineManifest
    folder: Path

    @property
    def source(self) -> str:
        return display_path(self.folder / ENGINE_MANIFEST)

    def engine_class(self) -> type[GenerateEngine]:
        """Import the engine; a missing library is one line naming the package to install."""
        missing = [r for r in self.manifest.requires if importlib.util.find_spec(r.import_name) is None]
        for requirement in missing:  # a package one of this project's extras installs: name the extra
            found = extra_for(requirement.import_name, "generate")
            if found:
                raise MissingExtra(*found, f"engine {self.manifest.name} ({self.source})")
        if missing:
            raise CaseUserError(f"engine {self.manifest.name} ({self.source}) needs the Python package(s) "
                                f"{', '.join(r.pip for r in missing)}: not installed on this host")
        if self.manifest.module is not None:
            module = importlib.import_module(self.manifest.module)
        else:
            module = import_file(self.folder / str(self.manifest.file),
                                 f"flagperf_generate_{self.folder.parent.parent.name}_{self.manifest.name}")
        cls = getattr(module, "Engine", None)
        if not (isinstance(cls, type) and issubclass(cls, GenerateEngine)):
            raise ConfigError(self.source, "file" if self.manifest.file else "module",
                              "must define Engine, a subclass of flagperf.generate.engines.GenerateEngine")
        return cls


def engine_folders(vendor: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in vendor_roots():
        for manifest in sorted((root / vendor / ENGINES_FOLDER).glob(f"*/{ENGINE_MANIFEST}")):
            found.setdefault(manifest.parent.name, manifest.parent)
    return found


def load_engine(vendor: str, name: str, source: str = "engine") -> EngineDef:
    engines = engine_folders(vendor)
    if name not in engines:
        known = ", ".join(sorted(engines)) or "none"
        raise ConfigError(source, "engine", f"unknown engine {name!r} for vendor {vendor} "
                                            f"(vendor_images/{vendor}/{ENGINES_FOLDER}/: {known})")
    folder = engines[name]
    manifest = load_model(folder / ENGINE_MANIFEST, EngineManifest)
    if manifest.name != name:
        raise ConfigError(display_path(folder / ENGINE_MANIFEST), "name", f"must match the folder name ({name!r})")
    if manifest.file is not None and not (folder / manifest.file).is_file():
        raise ConfigError(display_path(folder / ENGINE_MANIFEST), "file", f"{manifest.file!r} does not exist")
    return EngineDef(manifest=manifest, folder=folder)
