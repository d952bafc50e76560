"""TensorRT: build from ONNX with the tensorrt Python API, save the engine file, reload it, run it.

Buffers are torch CUDA tensors (no pycuda): inputs are copied to the device inside the call, as FlagPerf
counts that copy in core time; outputs stay on the device and the pipeline moves them for evaluation.
"""

from __future__ import annotations

from pathlib import Path

import tensorrt as trt
import torch
from pydantic import Field

from flagperf.errors import CaseUserError
from flagperf.inference.config import InferenceConfig
from flagperf.inference.engines import EngineEnv, EngineOptions, InferenceEngine

# TensorRT tensor types -> torch dtypes (the engine decides each binding's type, e.g. FP32 I/O around FP16).
DTYPES = {
    trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16, trt.DataType.INT32: torch.int32,
    trt.DataType.INT64: torch.int64, trt.DataType.BOOL: torch.bool, trt.DataType.INT8: torch.int8,
    trt.DataType.BF16: torch.bfloat16,
}


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
        self.stream = torch.cuda.Stream(device=env.device)

    def _build(self, onnx_path: Path, config: InferenceConfig) -> bytes:
        builder = trt.Builder(self.logger)
        network = builder.create_network(0)  # explicit batch: the only mode TensorRT 10 has
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise CaseUserError(f"{onnx_path}: TensorRT's ONNX parser refused it: {errors}")
        build = builder.create_builder_config()
        build.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(self.options.trt_workspace_gib * 2**30))
        if config.fp16:
            build.set_flag(trt.BuilderFlag.FP16)
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
        with torch.cuda.stream(self.stream):
            device_inputs = []
            for name, x in zip(self.inputs, inputs, strict=True):
                t = x.to(self.env.device, DTYPES[self.engine.get_tensor_dtype(name)], non_blocking=True).contiguous()
                self.context.set_input_shape(name, tuple(t.shape))
                self.context.set_tensor_address(name, t.data_ptr())
                device_inputs.append(t)  # kept alive until the engine has run
            outputs = []
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                out = torch.empty(shape, dtype=DTYPES[self.engine.get_tensor_dtype(name)], device=self.env.device)
                self.context.set_tensor_address(name, out.data_ptr())
                outputs.append(out)
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed")
        self.stream.synchronize()
        return outputs, 0.0
