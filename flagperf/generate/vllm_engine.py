"""The `vllm` engine: vLLM's offline engine, stepped by hand so each request's tokens get their times.

All of a batch's requests are added at once (they arrive together, as the level's users), then the engine is
stepped until none is left; after each step every request's new tokens are stamped with the time that step
returned. Random weights: vLLM's dummy loader on a folder holding only the preset's config.json (written
under the round's work folder); a checkpoint_path is loaded as it is. ``compile: false`` runs eagerly
(enforce_eager), ``true`` lets vLLM compile and capture CUDA graphs.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from flagperf.generate.config import GenerateConfig
from flagperf.generate.engines import EngineEnv, GenerateEngine, RequestTrace
from flagperf.generate.models import model_config
from flagperf.training.shapes import matmul_parameters

VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class Engine(GenerateEngine):
    config: GenerateConfig

    def __init__(self, config: GenerateConfig, env: EngineEnv) -> None:
        super().__init__(config, env)
        from vllm import LLM

        hf_config = model_config(config.model, config.checkpoint_path)
        with torch.device("meta"):  # the parameter count (and the model class) without allocating the weights
            skeleton = AutoModelForCausalLM.from_config(hf_config)
        self._parameters = matmul_parameters(skeleton)
        if not hf_config.architectures:  # vLLM picks its model class by this name; a preset's config has none
            hf_config.architectures = [type(skeleton).__name__]
        self._vocab_size = int(hf_config.vocab_size)
        if config.checkpoint_path is not None:
            folder, load_format = config.checkpoint_path, "auto"
        else:
            folder = str(env.work_dir / "vllm-model")
            hf_config.save_pretrained(folder)
            load_format = "dummy"
        self.llm: Any = LLM(model=folder, skip_tokenizer_init=True, load_format=load_format,
                            dtype=VLLM_DTYPE[config.precision], seed=config.seed,
                            max_model_len=config.input_len + config.max_new_tokens,
                            max_num_seqs=max(config.concurrency), enforce_eager=not config.compile,
                            # Levels replay the same prompts: a prefix cache would serve their prefill from
                            # memory and TTFT would no longer measure it.
                            enable_prefix_caching=False)
        self._ids = itertools.count()

    @property
    def parameters(self) -> int:
        return self._parameters

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def generate(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[RequestTrace]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, min_tokens=max_new_tokens,
                                ignore_eos=True, detokenize=False)
        engine = self.llm.llm_engine
        traces: dict[str, RequestTrace] = {}
        arrival = time.perf_counter()
        for prompt in prompts:
            request_id = f"r{next(self._ids)}"
            traces[request_id] = RequestTrace(arrival=arrival, prompt_tokens=len(prompt))
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter()
            for output in outputs:
                trace = traces.get(output.request_id)
                if trace is None or not output.outputs:
                    continue
                tokens = list(output.outputs[0].token_ids)
                # Cumulative outputs (the default): the tail past what we have are this step's tokens.
                for token in tokens[len(trace.output_ids):]:
                    trace.output_ids.append(int(token))
                    trace.token_times.append(now)
        return list(traces.values())
