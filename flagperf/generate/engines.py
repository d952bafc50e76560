"""Generate engines as plug-in folders: vendor_images/<vendor>/generate/<engine>/engine.yaml.

The contract: an engine is built once from the case config (it loads or builds the model itself), then
takes a batch of prompts (token ids) that arrive together and returns, per request, when it arrived, when
each output token came out, and the token ids. The batch is the level's concurrency: that many users wait
at once.

engine.yaml:
  name: hf
  description: ...
  module: flagperf.generate.hf     # a shared implementation in the core, or
  file: engine.py                  # a module in the engine folder; either defines ``Engine``, or
  server: {command: [...], ...}    # a serving engine: a server process the round starts and loads over
                                   # the OpenAI HTTP API (flagperf.generate.server, flagperf.generate.serve)
  requires: [{import: vllm, pip: vllm}]

Adding an engine is adding a folder; nothing in the core names one.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import model_validator

from flagperf.config.engines import EngineDef as BaseEngineDef
from flagperf.config.engines import EngineManifest as BaseEngineManifest
from flagperf.config.engines import (
    import_engine,
    load_engine_manifest,
)
from flagperf.generate.server import ServerSpec

if TYPE_CHECKING:  # a case's engine is checked where torch is not loaded
    import torch

ENGINES_FOLDER = "generate"  # vendor_images/<vendor>/generate/<engine>/


class EngineManifest(BaseEngineManifest):
    """engine.yaml of a generate engine: the shared keys, and ``server`` for a serving engine."""

    module_prefix: ClassVar[str] = "flagperf.generate."

    server: ServerSpec | None = None

    @model_validator(mode="after")
    def _one_of(self) -> EngineManifest:  # replaces the shared rule: a server engine has no module or file
        if sum(x is not None for x in (self.module, self.file, self.server)) != 1:
            raise ValueError("give exactly one of module, file and server")
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
        """The model's parameters in matrix products (flagperf.training.shapes.matmul_parameters: input
        embedding tables excluded unless tied to the output head), for the FLOPs of every family's MFU."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def generate(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[RequestTrace]:
        """Serve the prompts as simultaneous requests, greedily, exactly max_new_tokens each."""


@dataclass(frozen=True)
class EngineDef(BaseEngineDef):
    manifest: EngineManifest

    @property
    def server(self) -> ServerSpec | None:
        return self.manifest.server

    def engine_class(self) -> type[GenerateEngine]:
        """Import the engine; a missing library is one line naming the package to install."""
        if self.manifest.server is not None:
            raise TypeError(f"engine {self.manifest.name} is a server, not a batch engine class")
        return import_engine(self.manifest, self.folder, GenerateEngine, "generate")


def load_engine(vendor: str, name: str, source: str = "engine") -> EngineDef:
    manifest, folder = load_engine_manifest(vendor, name, ENGINES_FOLDER, EngineManifest, source, "engine")
    return EngineDef(manifest=manifest, folder=folder)
