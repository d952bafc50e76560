"""Continuous serving by a batch engine (flagperf.generate.continuous): the driver's closed loop and the `vllm`
engine's own stepping code (flagperf.generate.vllm_engine.Engine, closed_loop), run here on the real tiny
Llama behind vLLM's stepping interface (add_request, step, has_unfinished_requests), since vLLM itself does
not install on this machine. What stays untested without vLLM: docs/serving-report.md."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from flagperf.generate.config import GenerateConfig
from flagperf.generate.driver import run_level
from flagperf.generate.engines import EngineEnv, GenerateEngine
from flagperf.generate.metrics import level_stats
from flagperf.generate.models import build_model
from flagperf.generate.prompts import synthetic_prompts
from flagperf.generate.vllm_engine import Engine as VllmEngine
from flagperf.inference.hf import kv_cache_name
from flagperf.training.shapes import matmul_parameters

NEW_TOKENS = 4


class StepperOnHf:
    """vLLM's LLMEngine stepping interface over a transformers model: each step decodes one greedy token for
    every request in flight (each with its own KV cache); outputs are cumulative, as vLLM's default. Logs
    every add and every step (with the number in flight) so a test can read the loop's order."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache_name = kv_cache_name(model)
        self.running: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, int]] = []

    def add_request(self, request_id: str, prompt: dict[str, list[int]], params: Any) -> None:
        self.running[request_id] = {"ids": prompt["prompt_token_ids"], "cache": None, "out": [],
                                    "max": params.max_tokens}
        self.log.append(("add", len(self.running)))

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    @torch.inference_mode()
    def step(self) -> list[SimpleNamespace]:
        self.log.append(("step", len(self.running)))
        outputs = []
        for request_id, r in list(self.running.items()):
            ids = r["ids"] if r["cache"] is None else [r["out"][-1]]
            out = self.model(input_ids=torch.tensor([ids]), **{self.cache_name: r["cache"]}, use_cache=True)
            r["cache"] = getattr(out, self.cache_name)
            r["out"].append(int(out.logits[0, -1].argmax()))
            finished = len(r["out"]) >= r["max"]
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished,
                                           outputs=[SimpleNamespace(token_ids=list(r["out"]))]))
            if finished:
                del self.running[request_id]
        return outputs


class VllmOnHf(VllmEngine):
    """The vllm engine's own serving code, its core the stepper above instead of vLLM's LLMEngine."""

    def __init__(self, config: GenerateConfig, env: EngineEnv, tokens_short: int = 0) -> None:
        GenerateEngine.__init__(self, config, env)
        self.model = build_model(config.model, None, config.precision, env.device, config.seed)
        self._parameters, self._vocab_size = matmul_parameters(self.model), int(self.model.config.vocab_size)
        self.core = StepperOnHf(self.model)
        self._ids = itertools.count()
        self.tokens_short = tokens_short

    def sampling(self, max_new_tokens: int) -> Any:
        return SimpleNamespace(max_tokens=max_new_tokens - self.tokens_short)


def config(**keys: Any) -> GenerateConfig:
    values = {"model": "tiny", "precision": "fp32", "engine": "vllm", "input_len": 8, "max_new_tokens": NEW_TOKENS,
              "concurrency": [3], "requests": 7, "warmup_batches": 1, "timeout_s": 600.0, "max_retries": 0,
              **keys}
    return GenerateConfig.model_validate(values)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> VllmOnHf:
    env = EngineEnv(device=torch.device("cpu"), work_dir=tmp_path_factory.mktemp("work"),
                    log=logging.getLogger("test"))
    return VllmOnHf(config(), env)


def prompts(vocab: int) -> Any:
    return synthetic_prompts(5, 8, vocab, 0)


def test_a_level_keeps_its_concurrency_in_flight_and_adds_a_request_the_moment_one_ends(engine: VllmOnHf) -> None:
    engine.core.log.clear()
    cfg = config()
    prompt_set = prompts(engine.vocab_size)
    traces, served, seconds, window = run_level(engine, cfg, prompt_set, 0, 3)
    # Warm-up (1 x 3 requests, untimed), then exactly 7 timed requests: 3 at once, 3 more the moment the first
    # three end (before the next step), the last one the moment those end; prompts round and round from the first.
    warmup = [("add", 1), ("add", 2), ("add", 3), *[("step", 3)] * NEW_TOKENS]
    timed = [("add", 1), ("add", 2), ("add", 3), *[("step", 3)] * NEW_TOKENS,
             ("add", 1), ("add", 2), ("add", 3), *[("step", 3)] * NEW_TOKENS,
             ("add", 1), *[("step", 1)] * NEW_TOKENS]
    assert engine.core.log == warmup + timed
    assert served == [0, 1, 2, 3, 4, 0, 1]
    assert len(traces) == 7 and all(t.output_tokens == NEW_TOKENS for t in traces)
    # A request's arrival is when it was added: after the step that ended the one it replaced.
    assert traces[3].arrival >= traces[0].token_times[-1] and traces[6].arrival >= traces[3].token_times[-1]
    assert traces[0].arrival <= traces[0].token_times[0]
    # The window is on the epoch clock (~1.8e9 s): its difference carries float rounding of ~1e-7 s.
    assert window[1] - window[0] == pytest.approx(seconds, abs=1e-6)
    assert seconds >= traces[-1].token_times[-1] - traces[0].arrival
    # The stepped tokens are the model's greedy ones (the same prompt through transformers' generate).
    first = torch.tensor([prompt_set.prompts[0].ids])
    greedy = engine.model.generate(input_ids=first, attention_mask=torch.ones_like(first), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
    assert traces[0].output_ids == greedy[0, first.shape[1]:].tolist() == traces[5].output_ids
    assert level_stats(3, traces, seconds).requests == 7


def test_a_timed_level_sends_until_its_duration_then_waits_for_those_in_flight(engine: VllmOnHf) -> None:
    cfg = config(requests=None, duration_s=0.3, warmup_batches=0)
    traces, served, seconds, _ = run_level(engine, cfg, prompts(engine.vocab_size), 0, 2)
    # The loop ends only after the feed refused a prompt, which it does once the duration has passed.
    assert seconds >= 0.3 and len(traces) == len(served) >= 2
    assert traces[-1].arrival - traces[0].arrival < 0.3  # nothing was sent after the duration
    assert all(t.output_tokens == NEW_TOKENS for t in traces)


def test_the_batch_contract_adds_all_prompts_at_once(engine: VllmOnHf) -> None:
    engine.core.log.clear()
    ids = [p.ids for p in prompts(engine.vocab_size).prompts[:2]]
    traces = engine.generate(ids, NEW_TOKENS, 0)
    assert engine.core.log == [("add", 1), ("add", 2), *[("step", 2)] * NEW_TOKENS]
    assert [t.output_tokens for t in traces] == [NEW_TOKENS, NEW_TOKENS]


def test_a_continuous_engine_that_returns_short_requests_breaks_the_contract(engine: VllmOnHf,
                                                                             tmp_path: Path) -> None:
    env = EngineEnv(device=torch.device("cpu"), work_dir=tmp_path, log=logging.getLogger("test"))
    short = VllmOnHf(config(), env, tokens_short=1)
    with pytest.raises(RuntimeError, match=r"returned 3 request\(s\) with \[3\] tokens for 3 request\(s\) of 4"):
        run_level(short, config(warmup_batches=0, requests=3), prompts(short.vocab_size), 0, 3)
