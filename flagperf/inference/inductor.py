"""TorchInductor (torch.compile) as an inference engine, shared by every vendor whose torch has it.

The vendor folders point here (engines/inductor/engine.yaml: ``module: flagperf.inference.inductor``), so
the cpu and nvidia engines are one implementation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from flagperf.errors import CaseUserError
from flagperf.inference.config import InferenceConfig
from flagperf.inference.engines import EngineEnv, EngineOptions, InferenceEngine


class Options(EngineOptions):
    inductor_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        default="default", description="torch.compile's mode")


class Engine(InferenceEngine):
    Options = Options

    def __init__(self, config: InferenceConfig, onnx_path: Path | None, model: torch.nn.Module | None,
                 env: EngineEnv, *, engine_path: Path | None = None) -> None:
        super().__init__(config, onnx_path, model, env, engine_path=engine_path)
        if model is None:
            raise CaseUserError("the inductor engine compiles the PyTorch model; no_validation: true creates none")
        self.device = env.device
        self.half = config.fp16
        self.compiled = torch.compile(model, backend="inductor", mode=self.options.inductor_mode, dynamic=False)
        self.module = self.compiled
        self.seen: set[tuple[Any, ...]] = set()

    def _sync(self) -> None:
        if self.device.type != "cpu":
            torch.get_device_module(self.device.type).synchronize()

    def _run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        x = [t.to(self.device, non_blocking=True) for t in inputs]
        x = [t.half() if self.half and t.is_floating_point() else t for t in x]
        out = self.compiled(*x)
        return list(out) if isinstance(out, tuple | list) else [out]

    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        shapes = tuple((tuple(t.shape), t.dtype) for t in inputs)
        compile_s = 0.0
        if shapes not in self.seen:
            # A new shape compiles: that call is not inference. Time it, then run the batch again for real.
            self._sync()
            started = time.perf_counter()
            self._run(inputs)
            self._sync()
            compile_s = time.perf_counter() - started
            self.seen.add(shapes)
            self.env.log.info("inductor compiled for input shapes %s in %.1f s", [s for s, _ in shapes], compile_s)
        return self._run(inputs), compile_s
