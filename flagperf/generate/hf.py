"""The `hf` engine: transformers' generate with a static KV cache (greedy), timed per token by a streamer.

generate hands the streamer each step's new tokens after copying them to the host, so the time taken in
``put`` is when that token existed: exact per-token timestamps at no extra synchronisation. With
``compile: true`` generate compiles its decoding step (static cache shapes make that possible); the first
batch of each new batch size pays the compile, which the driver's warm-up batches absorb.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from flagperf.generate.config import GenerateConfig
from flagperf.generate.engines import EngineEnv, GenerateEngine, RequestTrace
from flagperf.generate.models import build_model
from flagperf.training.shapes import matmul_parameters


def generation_config(max_new_tokens: int, pad_id: int, compile: bool) -> GenerationConfig:
    """Greedy, exactly max_new_tokens, static cache: shared with the bench's bare loop, so both do the same."""
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                            cache_implementation="static", pad_token_id=pad_id, eos_token_id=None,
                            disable_compile=not compile)


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-aligned prompts (decoder-only models continue at the right edge) and their attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


class TokenClock(BaseStreamer):
    """Records each step's host-side time and tokens. generate first puts the prompt (batch x length), then
    one token per request per step (a 1-D tensor): the prompt is told apart by its shape, not its order."""

    def __init__(self, traces: list[RequestTrace]) -> None:
        self.traces = traces
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if not self.prompt_seen and value.dim() == 2:
            self.prompt_seen = True
            return
        self.prompt_seen = True
        tokens = value.reshape(len(self.traces), -1)[:, -1].tolist()
        for trace, token in zip(self.traces, tokens, strict=True):
            trace.token_times.append(now)
            trace.output_ids.append(int(token))

    def end(self) -> None:
        pass


class Engine(GenerateEngine):
    config: GenerateConfig

    def __init__(self, config: GenerateConfig, env: EngineEnv) -> None:
        super().__init__(config, env)
        self.model: Any = build_model(config.model, config.checkpoint_path, config.precision, env.device,
                                      config.seed)
        self._parameters = matmul_parameters(self.model)

    @property
    def parameters(self) -> int:
        return self._parameters

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[RequestTrace]:
        ids, mask = left_pad(prompts, pad_id, self.env.device)
        arrival = time.perf_counter()
        traces = [RequestTrace(arrival=arrival, prompt_tokens=len(p)) for p in prompts]
        self.model.generate(input_ids=ids, attention_mask=mask, streamer=TokenClock(traces),
                            generation_config=generation_config(max_new_tokens, pad_id, self.config.compile))
        return traces
