"""Batch engines that serve continuously: a closed loop at the level's concurrency instead of synchronous
batches. The level keeps C requests in flight and hands the engine a new prompt the moment one ends, as a
server under C users is loaded (vLLM's offline engine can; transformers' generate cannot, and keeps the
batch contract). The driver (flagperf.generate.driver.run_level) takes this path for an engine that is a
``ContinuousEngine``; the level's metrics are the same (flagperf.generate.metrics), each request timed from
the moment it was handed to the engine.

A level sends exactly ``requests`` requests (not rounded up to whole batches), or keeps handing out prompts
for ``duration_s`` and then waits for those in flight; the warm-up is ``warmup_batches`` x C requests served
the same way, untimed. Prompts are taken in order, round and round, from the first at every level.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from flagperf.generate.engines import GenerateEngine, RequestTrace

NextPrompt = Callable[[], "list[int] | None"]  # the next prompt's ids, or None: send no more


class ContinuousEngine(GenerateEngine):
    @abstractmethod
    def serve_continuously(self, next_prompt: NextPrompt, concurrency: int, max_new_tokens: int
                           ) -> list[RequestTrace]:
        """Keep ``concurrency`` requests in flight (greedy, exactly max_new_tokens each): take a prompt from
        ``next_prompt`` for each free slot, at the start and the moment a request ends, until it returns None;
        return when none is left in flight, the traces in the order the prompts were taken, each request's
        arrival the moment it was handed to the engine."""


class Feed:
    """The level's prompts in order, round and round, until ``requests`` were taken or ``duration_s`` has
    passed since ``start()``; ``taken`` lists the prompt indices handed out, in order."""

    def __init__(self, prompts: list[list[int]], requests: int | None, duration_s: float | None) -> None:
        if requests is None and duration_s is None:
            raise ValueError("a feed needs a request count or a duration")
        self.prompts = prompts
        self.requests = requests
        self.duration_s = duration_s
        self.taken: list[int] = []
        self.started = time.perf_counter()

    def start(self) -> float:
        self.started = time.perf_counter()
        return self.started

    def __call__(self) -> list[int] | None:
        if self.requests is not None and len(self.taken) >= self.requests:
            return None
        if self.duration_s is not None and time.perf_counter() - self.started >= self.duration_s:
            return None
        index = len(self.taken) % len(self.prompts)
        self.taken.append(index)
        return self.prompts[index]


def run_level_continuous(engine: ContinuousEngine, config: Any, prompt_ids: list[list[int]], concurrency: int
                         ) -> tuple[list[RequestTrace], list[int], float, tuple[float, float]]:
    """The level as the batch driver's run_level returns it: traces, the prompt index each served, the timed
    seconds and the epoch window."""
    def serve(feed: Feed) -> list[RequestTrace]:
        traces = engine.serve_continuously(feed, concurrency, config.max_new_tokens)
        if len(traces) != len(feed.taken) or any(t.output_tokens != config.max_new_tokens for t in traces):
            counts = sorted({t.output_tokens for t in traces})
            raise RuntimeError(f"engine {config.engine} returned {len(traces)} request(s) with {counts} tokens for "
                               f"{len(feed.taken)} request(s) of {config.max_new_tokens}: it broke the contract")
        return traces

    if config.warmup_batches:
        serve(Feed(prompt_ids, config.warmup_batches * concurrency, None))
    feed = Feed(prompt_ids, config.requests, config.duration_s)
    epoch = time.time()
    start = feed.start()
    traces = serve(feed)
    seconds = time.perf_counter() - start
    return traces, feed.taken, seconds, (epoch, epoch + seconds)
