"""One round of a generate case. A batch engine (hf, vllm): for each concurrency level, warm-up batches,
then timed batches of that many simultaneous requests (a request count or a duration), each request traced
per token by the engine; the level's metrics (flagperf.generate.metrics) and, where the prompts carry
references, ROUGE. A serving engine (engine.yaml ``server:``) or an endpoint: flagperf.generate.serve.

Cases (cases/generate/<model>/case.yaml) name this module as their entry; ``Config`` is their config model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from flagperf.errors import CaseUserError
from flagperf.generate.config import GenerateConfig
from flagperf.generate.continuous import ContinuousEngine, run_level_continuous
from flagperf.generate.engines import EngineEnv, GenerateEngine, RequestTrace, load_engine
from flagperf.generate.metrics import level_metrics, level_stats, rouge_metrics
from flagperf.generate.models import model_config
from flagperf.generate.prompts import (
    PromptSet,
    file_prompts,
    require_rouge,
    rouge_scores,
    synthetic_prompts,
    tokenizer_for,
)
from flagperf.results.metrics import TransformerFlops
from flagperf.results.prompt_positions import Reservation
from flagperf.results.schema import Failure, Metric, SpecTable

Config = GenerateConfig
MAX_SYNTHETIC = 4096

log = logging.getLogger("flagperf.case.generate")


@dataclass
class GenerateOutcome:
    metrics: list[Metric]
    measured_seconds: float
    prompts: str
    outputs: dict[int, list[str]]  # concurrency -> decoded outputs of the timed requests, in order
    failure: Failure | None = None  # a serving round that stopped part way (its finished points are kept)


def load_prompts(config: GenerateConfig) -> tuple[PromptSet, int]:
    """The prompts and the tokenizer's pad id; a bad file fails here, before any model is built."""
    hf_config = model_config(config.model, config.checkpoint_path)
    limit = getattr(hf_config, "max_position_embeddings", None)
    if isinstance(limit, int) and config.input_len + config.max_new_tokens > limit:
        raise CaseUserError(f"input_len + max_new_tokens = {config.input_len + config.max_new_tokens} exceeds the "
                            f"model's {limit} positions")
    tokenizer = tokenizer_for(config.checkpoint_path, int(hf_config.vocab_size))
    if config.prompts_path is not None:
        prompts = file_prompts(str(config.data_file("prompts_path")), tokenizer, config.input_len)
        if prompts.has_references:
            require_rouge()
        return prompts, tokenizer.pad_id
    count = min(MAX_SYNTHETIC, max(max(config.concurrency), config.requests or 0))
    return synthetic_prompts(count, config.input_len, int(hf_config.vocab_size), config.seed), tokenizer.pad_id


class Batches:
    """The prompts in order, round and round: each batch is the next ``size`` of them."""

    def __init__(self, prompts: PromptSet) -> None:
        self.prompts = prompts
        self.next = 0

    def take(self, size: int) -> list[int]:
        picked = [(self.next + i) % len(self.prompts.prompts) for i in range(size)]
        self.next = (self.next + size) % len(self.prompts.prompts)
        return picked


def run_level(engine: GenerateEngine, config: GenerateConfig, prompts: PromptSet, pad_id: int, concurrency: int
              ) -> tuple[list[RequestTrace], list[int], float, tuple[float, float]]:
    if isinstance(engine, ContinuousEngine):  # a closed loop: a new request the moment one ends
        return run_level_continuous(engine, config, [p.ids for p in prompts.prompts], concurrency)
    batches = Batches(prompts)

    def serve(indices: list[int]) -> list[RequestTrace]:
        traces = engine.generate([prompts.prompts[i].ids for i in indices], config.max_new_tokens, pad_id)
        if len(traces) != len(indices) or any(t.output_tokens != config.max_new_tokens for t in traces):
            counts = sorted({t.output_tokens for t in traces})
            raise RuntimeError(f"engine {config.engine} returned {len(traces)} request(s) with {counts} tokens for "
                               f"{len(indices)} request(s) of {config.max_new_tokens}: it broke the contract")
        return traces

    for _ in range(config.warmup_batches):
        serve(batches.take(concurrency))
    batches.next = 0  # every level serves the same prompts in the same order
    traces: list[RequestTrace] = []
    served: list[int] = []
    epoch, start = time.time(), time.perf_counter()
    while True:
        indices = batches.take(concurrency)
        traces += serve(indices)
        served += indices
        elapsed = time.perf_counter() - start
        if config.duration_s is not None and elapsed >= config.duration_s:
            break
        if config.requests is not None and len(traces) >= config.requests:
            break
    seconds = time.perf_counter() - start
    return traces, served, seconds, (epoch, epoch + seconds)


def run_generate(config: GenerateConfig, vendor: str, spec: SpecTable, device: torch.device, work_dir: Path,
                 round_number: int = 1, attempt: int = 1, positions: dict[str, int] | None = None,
                 earlier_attempts: int = 0, reservations: Sequence[Reservation] = ()) -> GenerateOutcome:
    """The round: a serving engine's (at an endpoint its prompts start at ``positions``, after every prompt the run's
    earlier rounds and attempts sent there, and after what the ``reservations`` of uncollected rounds may have sent),
    or a batch engine's levels."""
    engine_def = load_engine(vendor, config.engine)
    config.check_engine(engine_def.manifest, {}, engine_def.source)
    if engine_def.server is not None:
        from flagperf.generate.serve import run_serving

        served = run_serving(config, engine_def, device, work_dir, round_number, attempt, positions, earlier_attempts,
                             reservations)
        return GenerateOutcome(metrics=served.metrics, measured_seconds=served.measured_seconds,
                               prompts=served.prompts, outputs={}, failure=served.failure)
    engine_cls = engine_def.engine_class()  # a missing package fails here, before any work
    prompts, pad_id = load_prompts(config)
    log.info("engine %s (%s), model %s%s, %s, %s; %d new tokens; levels %s", config.engine, engine_def.source,
             config.model, f" from {config.checkpoint_path}" if config.checkpoint_path else " (random weights)",
             config.precision, prompts.description, config.max_new_tokens, config.concurrency)
    engine = engine_cls(config, EngineEnv(device=device, work_dir=work_dir, log=log))
    peak = spec.peaks.get(config.precision)
    peak = peak if peak is not None and peak.supported else None
    shape = model_config(config.model, config.checkpoint_path)
    flops = TransformerFlops(engine.parameters, getattr(shape, "num_hidden_layers", None),
                             getattr(shape, "hidden_size", None))
    tokenizer = tokenizer_for(config.checkpoint_path, engine.vocab_size)
    metrics: list[Metric] = []
    outputs: dict[int, list[str]] = {}
    measured = 0.0
    for concurrency in config.concurrency:
        traces, served, seconds, window = run_level(engine, config, prompts, pad_id, concurrency)
        measured += seconds
        stats = level_stats(concurrency, traces, seconds)
        metrics += level_metrics(stats, window, flops, config.precision, peak)
        texts = [tokenizer.decode(t.output_ids) for t in traces]
        outputs[concurrency] = texts
        scored = [(text, prompts.prompts[i].reference) for text, i in zip(texts, served, strict=True)
                  if prompts.prompts[i].reference is not None]
        if scored:
            scores = rouge_scores([t for t, _ in scored], [r for _, r in scored if r is not None])
            metrics += rouge_metrics(concurrency, scores, len(scored))
        tpot = f"{stats.tpot.p50 * 1e3:.2f} ms" if stats.tpot else "-"
        log.info("concurrency %d: %d requests in %.2f s, %.1f output tokens/s (%.1f per user), TTFT p50 %.1f ms, "
                 "TPOT p50 %s", concurrency, stats.requests, seconds, stats.tokens_per_s, stats.per_user.mean,
                 stats.ttft.p50 * 1e3, tpot)
    return GenerateOutcome(metrics=metrics, measured_seconds=measured, prompts=prompts.description, outputs=outputs)
