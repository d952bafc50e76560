"""TensorRT: build from ONNX with the tensorrt Python API (10.x and 11.x), save the engine file, reload it,
run it with explicit tensor addresses (set_tensor_address + execute_async_v3) on torch's current stream (the
pipeline's round stream, never the legacy default stream, on which TensorRT synchronises after each enqueue).

Precision is strongly typed, as TensorRT 11 requires (it has no FP16 builder flag): the ONNX file is exported
in the case's precision (engine.yaml: onnx_precision: case), and the network takes its types from it; the
same build runs on TensorRT 10 (STRONGLY_TYPED network flag). Buffers are torch CUDA tensors (no pycuda):
a CPU batch is copied to the device inside the call, as FlagPerf counts that copy in core time; a batch
already on the device is used in place (compute); outputs stay on the device.
"""

from __future__ import annotations

from pathlib import Path

import tensorrt as trt
import torch
from pydantic import Field

from flagperf.errors import CaseUserError
from flagperf.inference.config import InferenceConfig
from flagperf.inference.engines import EngineEnv, EngineOptions, InferenceEngine, precision_of

# TensorRT tensor types -> torch dtypes (the engine decides each binding's type, e.g. FP32 I/O around FP16).
DTYPES = {
    trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16, trt.DataType.INT32: torch.int32,
    trt.DataType.INT64: torch.int64, trt.DataType.BOOL: torch.bool, trt.DataType.INT8: torch.int8,
    trt.DataType.BF16: torch.bfloat16,
}


def network_flags() -> int:
    """Strongly typed: a flag on TensorRT 10, the only mode (and maybe no flag) on 11."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 1 << int(flag) if flag is not None else 0


class Options(EngineOptions):
    trt_workspace_gib: float = Field(default=8.0, gt=0, description="builder workspace memory pool")
    trt_min_batch: int = Field(default=1, ge=1, description="smallest batch of the optimisation profile")


class Engine(InferenceEngine):
    Options = Options

    def __init__(self, config: InferenceConfig, onnx_path: Path | None, model: torch.nn.Module | None,
                 env: EngineEnv, *, engine_path: Path | None = None) -> None:
        super().__init__(config, onnx_path, model, env, engine_path=engine_path)
        if env.device.type != "cuda":
            raise CaseUserError(f"the tensorrt engine runs on CUDA devices, not {env.device}")
        self.logger = trt.Logger(trt.Logger.WARNING)
        trt.init_libnvinfer_plugins(self.logger, "")
        if engine_path is None:
            if onnx_path is None:
                raise CaseUserError("the tensorrt engine builds from an ONNX file; none was exported or given")
            engine_path = env.work_dir / f"{env.case}_bs{config.batch_size}_{config.precision}.plan"
            engine_path.write_bytes(self._build(onnx_path, config))
            self.engine_file = engine_path
            env.log.info("tensorrt %s: built %s (%.1f MiB)", trt.__version__, engine_path,
                         engine_path.stat().st_size / 2**20)
        # The saved file is what runs, also right after a build: the file on disk is the engine measured.
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if self.engine is None:
            raise CaseUserError(f"{engine_path}: TensorRT could not deserialize it (corrupt, or built by another "
                                f"TensorRT version or GPU than {trt.__version__})")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: DTYPES[self.engine.get_tensor_dtype(n)] for n in names}
        self.precision = precision_of(self.dtypes.values())

    def _build(self, onnx_path: Path, config: InferenceConfig) -> bytes:
        builder = trt.Builder(self.logger)
        network = builder.create_network(network_flags())  # explicit batch: the only mode since TensorRT 10
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise CaseUserError(f"{onnx_path}: TensorRT's ONNX parser refused it: {errors}")
        build = builder.create_builder_config()
        build.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(self.options.trt_workspace_gib * 2**30))
        # No FP16 flag: the network is strongly typed, its precision is the ONNX file's (TensorRT 11 removed
        # the flag; on 10 it is refused for a strongly typed network).
        profile = builder.create_optimization_profile()
        dynamic = False
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape = list(tensor.shape)
            if any(d < 0 for d in shape):
                # Only the batch axis may be dynamic here: min trt_min_batch, opt and max batch_size.
                if any(d < 0 for d in shape[1:]):
                    raise CaseUserError(f"{onnx_path}: input {tensor.name} has dynamic axes besides the batch "
                                        f"{shape}; export it with fixed sizes")
                dynamic = True
                rest = shape[1:]
                lo = min(self.options.trt_min_batch, config.batch_size)
                profile.set_shape(tensor.name, [lo, *rest], [config.batch_size, *rest], [config.batch_size, *rest])
        if dynamic:
            build.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, build)
        if serialized is None:
            raise CaseUserError(f"{onnx_path}: TensorRT failed to build an engine (see the log above)")
        return bytes(serialized)

    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        if len(inputs) != len(self.inputs):
            raise CaseUserError(f"the engine takes {len(self.inputs)} inputs, the batch has {len(inputs)}")
        stream = torch.cuda.current_stream(self.env.device)
        device_inputs = []
        for name, x in zip(self.inputs, inputs, strict=True):
            # A no-op for a batch already on the device in the engine's type; otherwise the copy FlagPerf
            # counts in core, asynchronous from pinned memory.
            t = x.to(self.env.device, self.dtypes[name], non_blocking=True).contiguous()
            if not self.context.set_input_shape(name, tuple(t.shape)):
                raise CaseUserError(f"TensorRT refused input {name} of shape {tuple(t.shape)}: outside the "
                                    "engine's optimisation profile (built for another batch size?)")
            self.context.set_tensor_address(name, t.data_ptr())
            device_inputs.append(t)  # alive until the engine has run (stream-ordered reuse by torch)
        outputs = []
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            out = torch.empty(shape, dtype=self.dtypes[name], device=self.env.device)
            self.context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        # Queued on torch's stream, not a private one: the caller's synchronisation and device events see it.
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        return outputs, 0.0
