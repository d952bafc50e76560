"""ONNX Runtime as an inference engine, shared by the vendors whose onnxruntime build runs on their device:
the CPU execution provider (package onnxruntime), and CUDA / TensorRT execution providers on NVIDIA GPUs
(package onnxruntime-gpu, same import name).

Options (case config keys; a vendor file may set them):
  ort_intra_op_threads   CPU threads (0: ONNX Runtime's choice, one per core)
  ort_providers          execution providers in order of preference; null: the device's default
                         (CPUExecutionProvider on the CPU, CUDAExecutionProvider on CUDA)

On an accelerator, inputs and outputs are bound to torch tensors on the device (I/O binding): the copy
of a CPU batch is inside the call (FlagPerf's core; waited for before ORT reads it), and a batch already on
the device is not copied (compute). ORT synchronises its own stream at the end of every run (its default,
kept), so the work is done when the call returns and the caller's device events after it see it finished.
Its kernels do not run on torch's default stream, so turning that synchronisation off would let those
events (and torch's allocator) run ahead of ORT's work. Queuing ORT's runs back to back needs a stream of
its own ordered against torch's (wait_stream, record_stream): not done, as it cannot be checked without a
GPU.
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
from flagperf.inference.engines import EngineEnv, EngineOptions, InferenceEngine

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


def provider_options(name: str, device: torch.device) -> dict[str, str]:
    if device.type != "cuda" or name not in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return {}
    options = {"device_id": str(device.index or 0)}
    stream = torch.cuda.current_stream(device).cuda_stream
    if name == "CUDAExecutionProvider" and stream:
        # A stream torch's caller made current: ORT's kernels go on it. The default stream's handle is 0,
        # which ORT reads as "none given" (it then makes its own stream).
        options["user_compute_stream"] = str(stream)
    return options


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
        if engine_path is not None:
            # Already optimised when it was saved; optimising again would change nothing but the load time.
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            source = engine_path
        else:
            if onnx_path is None:
                raise CaseUserError("the onnxruntime engine compiles an ONNX file; none was exported or given")
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            self.engine_file = env.work_dir / f"{onnx_path.stem}.ort.onnx"
            options.optimized_model_filepath = str(self.engine_file)
            source = onnx_path
        self.session = ort.InferenceSession(str(source), options,
                                            providers=[(p, provider_options(p, env.device)) for p in providers])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.outputs = self.session.get_outputs()
        self.output_names = [o.name for o in self.outputs]
        self.bound = env.device.type == "cuda"
        env.log.info("onnxruntime %s on %s: inputs %s, outputs %s", ort.__version__,
                     self.session.get_providers(), self.input_names, self.output_names)

    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        if len(inputs) != len(self.input_names):
            raise CaseUserError(f"the engine takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                                f"the batch has {len(inputs)}")
        if self.bound:
            return self._run_bound(inputs), 0.0
        feed = {name: np.ascontiguousarray(x.numpy()) for name, x in zip(self.input_names, inputs, strict=True)}
        outputs = self.session.run(self.output_names, feed)
        return [torch.from_numpy(o) for o in outputs], 0.0

    def _run_bound(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        binding = self.session.io_binding()
        index = self.device.index or 0
        keep: list[Any] = []
        for name, x in zip(self.input_names, inputs, strict=True):
            t = x.to(self.device, non_blocking=True).contiguous()
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
        # on its own stream: the asynchronous copy above, on torch's stream, must be done before ORT reads it.
        torch.cuda.current_stream(self.device).synchronize()
        self.session.run_with_iobinding(binding)
        if len(outputs) == len(self.outputs):
            return outputs
        return [torch.from_numpy(o) for o in binding.copy_outputs_to_cpu()]
