"""The `vllm` engine: vLLM's offline engine, stepped by hand so each request's tokens get their times.

It serves continuously (flagperf.generate.continuous): the level's concurrency is kept in flight, and the
moment a step finishes a request a new one is added, before the next step (a closed loop, as vLLM's engine
is meant to be fed). After each step every request's new tokens are stamped with the time that step
returned; a request's arrival is when it was added. ``generate`` (the batch contract) adds all of its
prompts at once. Random weights: vLLM's dummy loader on a folder holding only the preset's config.json (written
under the round's work folder); a checkpoint_path is loaded as it is. ``compile: false`` runs eagerly
(enforce_eager), ``true`` lets vLLM compile and capture CUDA graphs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from flagperf.generate.config import GenerateConfig
from flagperf.generate.continuous import ContinuousEngine, NextPrompt
from flagperf.generate.engines import EngineEnv, RequestTrace
from flagperf.generate.models import model_config
from flagperf.training.shapes import matmul_parameters

VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class Engine(ContinuousEngine):
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
        self.core: Any = self.llm.llm_engine  # add_request, step, has_unfinished_requests
        self._ids = itertools.count()

    @property
    def parameters(self) -> int:
        return self._parameters

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def sampling(self, max_new_tokens: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=max_new_tokens, min_tokens=max_new_tokens,
                              ignore_eos=True, detokenize=False)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[RequestTrace]:
        pending = iter(prompts)
        return self.serve_continuously(lambda: next(pending, None), len(prompts), max_new_tokens)

    def serve_continuously(self, next_prompt: NextPrompt, concurrency: int, max_new_tokens: int
                           ) -> list[RequestTrace]:
        return closed_loop(self.core, next_prompt, concurrency, self.sampling(max_new_tokens),
                           lambda: f"r{next(self._ids)}")


def closed_loop(core: Any, next_prompt: NextPrompt, concurrency: int, params: Any, new_id: Callable[[], str]
                ) -> list[RequestTrace]:
    """Keep ``concurrency`` requests in ``core`` (vLLM's LLMEngine: add_request, step, has_unfinished_requests)
    and step it; after each step, stamp the new tokens of every request with the time the step returned, and
    add one new request for each that finished, before the next step. The traces in the order added."""
    traces: dict[str, RequestTrace] = {}

    def add() -> bool:
        prompt = next_prompt()
        if prompt is None:
            return False
        request_id = new_id()
        traces[request_id] = RequestTrace(arrival=time.perf_counter(), prompt_tokens=len(prompt))
        core.add_request(request_id, {"prompt_token_ids": prompt}, params)
        return True

    in_flight = 0
    while in_flight < concurrency and add():
        in_flight += 1
    while core.has_unfinished_requests():
        outputs = core.step()
        now = time.perf_counter()
        finished = 0
        for output in outputs:
            trace = traces.get(output.request_id)
            if trace is None:
                continue
            if output.outputs:
                tokens = list(output.outputs[0].token_ids)
                # Cumulative outputs (the default): the tail past what we have are this step's tokens.
                for token in tokens[len(trace.output_ids):]:
                    trace.output_ids.append(int(token))
                    trace.token_times.append(now)
            finished += bool(output.finished)
        for _ in range(finished):
            if not add():
                in_flight -= 1
    return list(traces.values())
