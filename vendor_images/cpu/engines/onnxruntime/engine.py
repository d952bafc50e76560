"""ONNX Runtime on the CPU: FlagPerf's InferModel contract over an InferenceSession."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from pydantic import Field

from flagperf.errors import CaseUserError
from flagperf.inference.config import InferenceConfig
from flagperf.inference.engines import EngineEnv, EngineOptions, InferenceEngine


class Options(EngineOptions):
    ort_intra_op_threads: int = Field(default=0, ge=0, description="0: ONNX Runtime's choice (one per core)")


class Engine(InferenceEngine):
    Options = Options

    def __init__(self, config: InferenceConfig, onnx_path: Path | None, model: torch.nn.Module | None,
                 env: EngineEnv, *, engine_path: Path | None = None) -> None:
        super().__init__(config, onnx_path, model, env, engine_path=engine_path)
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
        self.session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        env.log.info("onnxruntime %s: inputs %s, outputs %s", ort.__version__, self.input_names, self.output_names)

    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        if len(inputs) != len(self.input_names):
            raise CaseUserError(f"the engine takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                                f"the batch has {len(inputs)}")
        feed = {name: np.ascontiguousarray(x.numpy()) for name, x in zip(self.input_names, inputs, strict=True)}
        outputs = self.session.run(self.output_names, feed)
        return [torch.from_numpy(o) for o in outputs], 0.0
