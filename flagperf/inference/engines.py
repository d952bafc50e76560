"""Compiler engines as plug-in folders: vendor_images/<vendor>/engines/<engine>/engine.yaml.

One contract for every engine (FlagPerf's InferModel): built once from (config, onnx_path, model), untimed;
then called once per batch with a list of CPU tensors, returning (outputs, non-inference seconds). An engine
that can save what it built writes it to ``engine_file`` and can be loaded back from such a file
(``exist_compiler_path``).

engine.yaml:
  name: onnxruntime
  description: ...
  module: flagperf.inference.inductor   # a shared implementation in the core (several vendors), or
  file: engine.py                       # a module in the engine folder; either defines ``Engine``
  requires: [{import: onnxruntime, pip: "onnxruntime (the inference extra)"}]
  needs_model: false    # needs the PyTorch model (so no_validation: true cannot be used)
  needs_onnx: true      # reads the ONNX file (false: step d is skipped, the engine compiles the model)
  onnx_precision: fp32  # fp32: exported in FP32, the engine lowers precision itself; case: exported in the
                        # case's precision (FP16 I/O and weights), for strongly typed builders (TensorRT 11)
  loads_engine_files: true
  options: [ort_intra_op_threads, ort_providers]  # the case-config keys its Options read (vendor file, --set)

Nothing in the engine names an engine: adding one is adding a folder.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from flagperf.config.engines import (
    INFERENCE_ENGINES,
    import_engine,
    load_engine_manifest,
)
from flagperf.config.engines import EngineDef as BaseEngineDef
from flagperf.config.engines import EngineManifest as BaseEngineManifest
from flagperf.errors import CaseUserError, ConfigError, validation_message

# torch where an engine runs: the inference config checks engines here (the planner, `flagperf validate`), on a
# controller that may have no torch.
if TYPE_CHECKING:
    import torch

ENGINES_FOLDER = INFERENCE_ENGINES  # vendor_images/<vendor>/engines/<compiler>/


class EngineConfig(Protocol):
    """What the engine contract reads of an inference case's config (flagperf.inference.config.InferenceConfig
    satisfies it); a protocol, so that the config module can check engines without an import loop."""

    compiler: str | None
    fp16: bool
    batch_size: int
    no_validation: bool
    exist_onnx_path: str | None
    exist_compiler_path: str | None

    @property
    def precision(self) -> str: ...

    def model_dump(self) -> dict[str, Any]: ...


class EngineManifest(BaseEngineManifest):
    """engine.yaml of an inference engine: the shared keys, and what the engine consumes."""

    module_prefix: ClassVar[str] = "flagperf.inference."

    needs_model: bool = False
    needs_onnx: bool = True
    onnx_precision: Literal["fp32", "case"] = "fp32"
    loads_engine_files: bool = False

    def input_dtype(self, config: EngineConfig) -> torch.dtype:
        """The dtype of the batches the engine takes: the case's precision, unless it reads an FP32 ONNX file."""
        import torch

        half = config.fp16 and (not self.needs_onnx or self.onnx_precision == "case")
        return torch.float16 if half else torch.float32





class EngineOptions(BaseModel):
    """An engine's own keys, read from the case config (a vendor file may add them); others are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


@dataclass(frozen=True)
class EngineEnv:
    """Where the engine runs and may write (its engine file goes under work_dir)."""

    device: torch.device
    work_dir: Path
    case: str
    log: logging.Logger


class InferenceEngine(ABC):
    """The compiler contract. Subclasses set ``Options`` to the typed keys they read."""

    Options: ClassVar[type[EngineOptions]] = EngineOptions

    def __init__(self, config: EngineConfig, onnx_path: Path | None, model: torch.nn.Module | None,
                 env: EngineEnv, *, engine_path: Path | None = None) -> None:
        """Build from ``onnx_path``/``model``, or load ``engine_path`` (exist_compiler_path) when given."""
        self.config = config
        try:
            self.options = self.Options.model_validate(config.model_dump())
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            raise CaseUserError(f"engine {config.compiler}: {key}: {validation_message(err)} "
                                f"(got {err.get('input')!r})") from None
        self.env = env
        self.engine_file: Path | None = None  # what this engine saved, if it saves anything
        # Engines that compile the PyTorch model set this to the compiled module, so a case can call it with
        # inputs of its own (llama-decode-infer: a KV cache); the case accounts for first-call compiles.
        self.module: torch.nn.Module | None = None
        # The precision the built engine really runs in ("fp16", "fp32"), where its file says so (its tensors'
        # types): it wins over the manifest's guess (an FP32 ONNX file given to an FP16 case, for example).
        self.precision: str | None = None

    @abstractmethod
    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        """Outputs for one batch, and the seconds of that call that were not inference (a JIT compile, for
        example; FlagPerf reviews any engine where this is not 0). Inputs come as CPU tensors (the engine's
        copy to the device is part of core, as in FlagPerf) or already on the engine's device (compute);
        outputs may stay on the device. Work is queued on the device's current stream, so that the caller's
        synchronisation and timing events see it."""


def precision_of(dtypes: Iterable[torch.dtype]) -> str | None:
    """An engine's precision from its input and output tensors' types: FP16 if any is, else FP32 if any is,
    else unknown (integer tensors only)."""
    import torch

    seen = set(dtypes)
    if torch.float16 in seen:
        return "fp16"
    return "fp32" if torch.float32 in seen else None


@dataclass(frozen=True)
class EngineDef(BaseEngineDef):
    manifest: EngineManifest

    def engine_class(self) -> type[InferenceEngine]:
        """Import the engine; a missing library is a clear error naming the package to install."""
        return import_engine(self.manifest, self.folder, InferenceEngine, "inference")


def load_engine(vendor: str, name: str, source: str = "compiler") -> EngineDef:
    manifest, folder = load_engine_manifest(vendor, name, ENGINES_FOLDER, EngineManifest, source, "compiler")
    return EngineDef(manifest=manifest, folder=folder)


def check_engine_toggles(config: EngineConfig, vendor: str, origins: dict[str, str], default_source: str,
                         check_files: bool = True) -> EngineDef | None:
    """What the chosen engine needs, against the toggles and the files they name (before anything runs)."""
    if config.compiler is None:
        return None

    def where(key: str) -> str:
        return origins.get(key, default_source)

    engine = load_engine(vendor, config.compiler, where("compiler"))
    m = engine.manifest
    if m.needs_model and config.no_validation:
        raise ConfigError(where("no_validation"), "no_validation",
                          f"engine {m.name} compiles the PyTorch model, and no_validation: true creates none")
    if config.exist_compiler_path is not None:
        if not m.loads_engine_files:
            raise ConfigError(where("exist_compiler_path"), "exist_compiler_path",
                              f"engine {m.name} cannot load an engine file")
        if check_files and not Path(config.exist_compiler_path).is_file():
            raise ConfigError(where("exist_compiler_path"), "exist_compiler_path",
                              f"{config.exist_compiler_path} is not a file")
    elif (check_files and m.needs_onnx and config.exist_onnx_path is not None
          and not Path(config.exist_onnx_path).is_file()):
        raise ConfigError(where("exist_onnx_path"), "exist_onnx_path",
                          f"{config.exist_onnx_path} is not a file (engine {m.name} compiles it)")
    _check_options(engine, config, where)
    return engine


def _check_options(engine: EngineDef, config: EngineConfig, where: Callable[[str], str]) -> None:
    """The engine's own keys (inductor_mode ...), checked by its Options where the engine can be imported;
    where its library is missing (TensorRT on a controller) the engine checks them on the host."""
    try:
        options = engine.engine_class().Options
    except CaseUserError:
        return
    try:
        options.model_validate(config.model_dump())
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise ConfigError(where(key.split(".")[0]), key,
                          f"engine {engine.manifest.name}: {validation_message(err)} "
                          f"(got {err.get('input')!r})") from None

