"""The one timing loop every case uses, so no case author writes a timer.

warm-up -> calibrate a chunk length -> timed chunks until both a minimum duration and a minimum
iteration count are reached. The device is synchronised at each chunk boundary (and only there, so
the synchronisation costs nothing measurable), and every chunk's time is kept for p50 and spread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flagperf.results.metrics import Chunk

# Aim for about this many chunks in the minimum duration: enough for percentiles, few enough that
# the per-chunk synchronisation is negligible.
TARGET_CHUNKS = 20


@dataclass(frozen=True)
class TimingPlan:
    warmup_iters: int
    min_duration_s: float
    min_iters: int
    max_duration_s: float | None = None  # a hard stop for very slow steps (still >= min_iters)


def measure(step: Callable[[], object], sync: Callable[[], None], plan: TimingPlan,
            clock: Callable[[], float] = time.perf_counter) -> list[Chunk]:
    for _ in range(plan.warmup_iters):
        step()
    sync()

    # Calibrate with one synchronised iteration (not counted).
    start = clock()
    step()
    sync()
    one = max(clock() - start, 1e-9)
    chunk_iters = max(1, int(plan.min_duration_s / TARGET_CHUNKS / one))

    chunks: list[Chunk] = []
    total_iters = 0
    total_seconds = 0.0
    while total_seconds < plan.min_duration_s or total_iters < plan.min_iters:
        if plan.max_duration_s is not None and total_seconds >= plan.max_duration_s and total_iters >= plan.min_iters:
            break
        iters = chunk_iters
        if total_seconds >= plan.min_duration_s:
            iters = max(1, min(iters, plan.min_iters - total_iters))
        sync()
        start = clock()
        for _ in range(iters):
            step()
        sync()
        elapsed = clock() - start
        chunks.append(Chunk(iterations=iters, seconds=elapsed, start=start))
        total_iters += iters
        total_seconds += elapsed
    return chunks
