"""ONNX Runtime as an inference engine, shared by the vendors whose onnxruntime build runs on their device:
the CPU execution provider (package onnxruntime), and CUDA / TensorRT execution providers on NVIDIA GPUs
(package onnxruntime-gpu, same import name).

Options (case config keys; a vendor file may set them):
  ort_intra_op_threads   CPU threads (0: ONNX Runtime's choice, one per core)
  ort_providers          execution providers in order of preference; null: the device's default
                         (CPUExecutionProvider on the CPU, CUDAExecutionProvider on CUDA)

On an accelerator, inputs and outputs are bound to torch tensors on the device (I/O binding): the copy
of a CPU batch is inside the call (FlagPerf's core; waited for before ORT reads it), and a batch already on
the device is not copied (compute). The CUDA and TensorRT providers are given torch's current stream
(user_compute_stream): the pipeline runs a round on a stream of its own, never the default one, whose handle
0 ORT reads as "none given" (it would then make a stream of its own). ORT synchronises its stream at the end
of every run (its default, kept), so the work is done when the call returns.

Saving the optimised graph as the engine file (optimized_model_filepath) is for providers that run ONNX
nodes (CPU, CUDA): ORT refuses to save a graph holding nodes a provider compiled (TensorRT's), so with
TensorRT's provider its engines are cached in the work folder instead (trt_engine_cache_path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from pydantic import Field

from flagperf.errors import CaseUserError
from flagperf.inference.config import InferenceConfig
from flagperf.inference.engines import EngineEnv, EngineOptions, InferenceEngine, precision_of
from flagperf.measure.device import current_stream, synchronize

DEFAULT_PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider"]}
NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
         torch.bool: np.bool_, torch.int8: np.int8, torch.uint8: np.uint8}
ORT_TYPES = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(int64)": torch.int64,
             "tensor(int32)": torch.int32, "tensor(bool)": torch.bool, "tensor(int8)": torch.int8,
             "tensor(uint8)": torch.uint8}


class Options(EngineOptions):
    ort_intra_op_threads: int = Field(default=0, ge=0, description="0: ONNX Runtime's choice (one per core)")
    ort_providers: list[str] | None = Field(default=None, description="execution providers in order; null: "
                                            "the device's default")


# Providers that compile subgraphs into their own engines: ORT cannot save such a graph as an ONNX file.
COMPILING_PROVIDERS = ("TensorrtExecutionProvider",)


def provider_options(name: str, device: torch.device, *, fp16: bool = False,
                     cache_dir: Path | None = None) -> dict[str, str]:
    if device.type != "cuda" or name not in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return {}
    options = {"device_id": str(device.index or 0)}
    stream = torch.cuda.current_stream(device).cuda_stream
    if stream:
        # The stream the caller made current (the pipeline's round stream): ORT's kernels go on it, in order
        # with torch's copies and the device's events. Handle 0 (the default stream) means "none given".
        options["user_compute_stream"] = str(stream)
    if name == "TensorrtExecutionProvider":
        options["trt_fp16_enable"] = "True" if fp16 else "False"
        if cache_dir is not None:
            options["trt_engine_cache_enable"] = "True"
            options["trt_engine_cache_path"] = str(cache_dir)
    return options


def _trt_cache_dir(env: EngineEnv, source: Path | None) -> Path:
    """TensorRT's provider keys its cache on the model's path and graph, not its weights: a folder per file
    (name, size, modification time), so a re-export to the same path never reuses a stale engine."""
    if source is None or not source.is_file():
        return env.work_dir / f"{env.case}_ort_trt_cache"
    stat = source.stat()
    return env.work_dir / f"{source.stem}_{stat.st_size}_{stat.st_mtime_ns}_ort_trt_cache"


class Engine(InferenceEngine):
    Options = Options

    def __init__(self, config: InferenceConfig, onnx_path: Path | None, model: torch.nn.Module | None,
                 env: EngineEnv, *, engine_path: Path | None = None) -> None:
        super().__init__(config, onnx_path, model, env, engine_path=engine_path)
        self.device = env.device
        providers = self.options.ort_providers or DEFAULT_PROVIDERS.get(env.device.type)
        if not providers:
            raise CaseUserError(f"the onnxruntime engine has no default execution provider for {env.device}; "
                                "set ort_providers")
        available = ort.get_available_providers()
        missing = [p for p in providers if p not in available]
        if missing:
            raise CaseUserError(f"onnxruntime {ort.__version__} has no {', '.join(missing)} (available: "
                                f"{', '.join(available)}); on an NVIDIA GPU install onnxruntime-gpu")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.options.ort_intra_op_threads
        compiling = [p for p in providers if p in COMPILING_PROVIDERS]
        cache_dir = _trt_cache_dir(env, onnx_path if engine_path is None else engine_path) if compiling else None
        if engine_path is not None:
            # Already optimised when it was saved; optimising again would change nothing but the load time.
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            source = engine_path
        else:
            if onnx_path is None:
                raise CaseUserError("the onnxruntime engine compiles an ONNX file; none was exported or given")
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if cache_dir is None:
                self.engine_file = env.work_dir / f"{onnx_path.stem}.ort.onnx"
                options.optimized_model_filepath = str(self.engine_file)
            else:
                cache_dir.mkdir(parents=True, exist_ok=True)
                env.log.info("onnxruntime: %s compile(s) the graph; engines cached in %s (no optimised ONNX "
                             "file is saved)", ", ".join(compiling), cache_dir)
            source = onnx_path
        self.session = ort.InferenceSession(
            str(source), options,
            providers=[(p, provider_options(p, env.device, fp16=config.fp16, cache_dir=cache_dir)) for p in providers])
        self.input_names = [i.name for i in self.session.get_inputs()]
        # Each input in the type the graph declares: an FP32 file given to an FP16 case (exist_onnx_path) gets
        # its batches cast, not refused; the cast is inside the call, as the copy is.
        self.input_dtypes = [ORT_TYPES.get(i.type) for i in self.session.get_inputs()]
        self.outputs = self.session.get_outputs()
        self.output_names = [o.name for o in self.outputs]
        self.precision = precision_of(t for t in [*self.input_dtypes, *(ORT_TYPES.get(o.type) for o in self.outputs)]
                                      if t is not None)
        self.bound = env.device.type == "cuda"
        env.log.info("onnxruntime %s on %s: inputs %s, outputs %s", ort.__version__,
                     self.session.get_providers(), self.input_names, self.output_names)

    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        if len(inputs) != len(self.input_names):
            raise CaseUserError(f"the engine takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                                f"the batch has {len(inputs)}")
        if self.bound:
            return self._run_bound(inputs), 0.0
        feed = {name: np.ascontiguousarray((x if dtype is None else x.to(dtype)).numpy())
                for name, x, dtype in zip(self.input_names, inputs, self.input_dtypes, strict=True)}
        outputs = self.session.run(self.output_names, feed)
        return [torch.from_numpy(o) for o in outputs], 0.0

    def _run_bound(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        binding = self.session.io_binding()
        index = self.device.index or 0
        keep: list[Any] = []
        for name, x, dtype in zip(self.input_names, inputs, self.input_dtypes, strict=True):
            t = x.to(self.device, dtype or x.dtype, non_blocking=True).contiguous()
            keep.append(t)
            binding.bind_input(name, "cuda", index, NUMPY[t.dtype], tuple(t.shape), t.data_ptr())
        batch = inputs[0].shape[0]
        outputs: list[torch.Tensor] = []
        for out in self.outputs:
            dims = list(out.shape)
            # The exports make the batch axis (and only it) symbolic; an output with other unknown sizes is
            # left to ORT to allocate and copied back.
            if not dims or any(not isinstance(d, int) for d in dims[1:]) or out.type not in ORT_TYPES:
                binding.bind_output(out.name, "cpu")
                continue
            shape = [batch if not isinstance(dims[0], int) else dims[0], *dims[1:]]
            t = torch.empty(shape, dtype=ORT_TYPES[out.type], device=self.device)
            binding.bind_output(out.name, "cuda", index, NUMPY[t.dtype], tuple(t.shape), t.data_ptr())
            outputs.append(t)
        # ORT's Run does not wait for the inputs (its IOBinding leaves that to the caller), and its kernels run
        # on its own stream: the asynchronous copy above, on torch's current stream (the round's own), must be done
        # before ORT reads it. Only that stream is waited for, not the whole device.
        synchronize(self.device, current_stream(self.device))
        self.session.run_with_iobinding(binding)
        if len(outputs) == len(self.outputs):
            return outputs
        return [torch.from_numpy(o) for o in binding.copy_outputs_to_cpu()]
