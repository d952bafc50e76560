"""TorchInductor (torch.compile) as an inference engine, shared by every vendor whose torch has it.

The vendor folders point here (engines/inductor/engine.yaml: ``module: flagperf.inference.inductor``), so
the cpu and nvidia engines are one implementation. Options (keys of the case config, a vendor file may set
them):
  inductor_mode            torch.compile's mode (flagperf.measure.inductor_modes, the same key and values as the
                           operation family's): default, reduce-overhead (CUDA graphs), max-autotune (kernel
                           search + CUDA graphs), max-autotune-no-cudagraphs
  inductor_channels_last   channels-last memory format for a model with 2-D convolutions (null: on for such a
                           model on an accelerator); the input's layout change is compiled into the graph
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from flagperf.errors import CaseUserError
from flagperf.inference.config import InferenceConfig
from flagperf.inference.engines import EngineEnv, EngineOptions, InferenceEngine
from flagperf.measure.device import synchronize
from flagperf.measure.inductor_modes import INDUCTOR_MODE_HELP, InductorMode, uses_cuda_graphs


class Options(EngineOptions):
    inductor_mode: InductorMode = Field(default="default", description=INDUCTOR_MODE_HELP)
    inductor_channels_last: bool | None = Field(default=None, description="channels-last convolutions; null: "
                                                "on for a model with Conv2d layers on an accelerator")


def has_conv2d(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


class ChannelsLast(torch.nn.Module):
    """4-D inputs in channels-last order, inside the compiled graph: Inductor fuses the layout change into
    the first kernel instead of leaving a copy outside it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(*(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
                            for x in inputs))


class Engine(InferenceEngine):
    Options = Options

    def __init__(self, config: InferenceConfig, onnx_path: Path | None, model: torch.nn.Module | None,
                 env: EngineEnv, *, engine_path: Path | None = None) -> None:
        super().__init__(config, onnx_path, model, env, engine_path=engine_path)
        if model is None:
            raise CaseUserError("the inductor engine compiles the PyTorch model; no_validation: true creates none")
        # With its index: an input on another accelerator of the host is not "ready" for this one.
        self.device = env.device if env.device.type == "cpu" or env.device.index is not None else torch.device(
            env.device.type, torch.get_device_module(env.device.type).current_device())
        self.half = config.fp16
        channels_last = self.options.inductor_channels_last
        if channels_last is None:
            channels_last = env.device.type != "cpu" and has_conv2d(model)
        self.channels_last = channels_last
        if channels_last:
            model = ChannelsLast(model.to(memory_format=torch.channels_last))
        self.cuda_graphs = uses_cuda_graphs(self.options.inductor_mode, env.device.type)
        self.compiled = torch.compile(model, backend="inductor", mode=self.options.inductor_mode, dynamic=False)
        self.module = self.compiled
        self.compiled_shapes: set[tuple[Any, ...]] = set()  # (shape, dtype) of each input the model was run on
        self.signatures: dict[tuple[Any, ...], bool] = {}  # inputs' (shape, dtype, device) -> ready as they are
        env.log.info("inductor: mode %s, channels_last %s, CUDA graphs %s", self.options.inductor_mode,
                     channels_last, self.cuda_graphs)

    def _prepare(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        x = [t.to(self.device, non_blocking=True) for t in inputs]
        return [t.half() if self.half and t.is_floating_point() else t for t in x]

    def _ready(self, t: torch.Tensor) -> bool:
        """Whether an input is already where and what the compiled model takes (no copy, no cast)."""
        return t.device == self.device and not (self.half and t.is_floating_point() and t.dtype != torch.float16)

    def _run(self, x: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.cuda_graphs:
            # Each call is a new step: the graph's output buffers of the previous call may be reused.
            torch.compiler.cudagraph_mark_step_begin()
        out = self.compiled(*x)
        return list(out) if isinstance(out, tuple | list) else [out]

    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        # Inputs of a signature seen before go straight to the compiled model when they need no copy or cast
        # (the compute pass's resident batches): the wrapper adds a microsecond, not a copy's worth.
        signature = tuple((t.shape, t.dtype, t.device) for t in inputs)
        ready = self.signatures.get(signature)
        if ready is not None:
            return self._run(inputs if ready else self._prepare(inputs)), 0.0
        ready = all(self._ready(t) for t in inputs)
        x = inputs if ready else self._prepare(inputs)
        shapes = tuple((tuple(t.shape), t.dtype) for t in x)
        compile_s = 0.0
        if shapes not in self.compiled_shapes:
            # A new shape compiles: that call is not inference. Time it, then run the batch again for real.
            synchronize(self.device)
            started = time.perf_counter()
            self._run(x)
            synchronize(self.device)
            compile_s = time.perf_counter() - started
            self.compiled_shapes.add(shapes)
            self.env.log.info("inductor compiled for input shapes %s in %.1f s", [s for s, _ in shapes], compile_s)
        self.signatures[signature] = ready
        return self._run(x), compile_s
