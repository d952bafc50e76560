"""What a case's code sees: its typed config base and a context that times, synchronises and compares
with the vendor's peaks. Cases import only this module (plus torch), never hosts or Prefect."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch
from pydantic import BaseModel, ConfigDict, Field

from flagperf.errors import Unsupported
from flagperf.metrics import Chunk, rate_stats, ratio
from flagperf.results import Metric, Peak, SpecTable
from flagperf.timing import TimingPlan, measure


class CaseConfig(BaseModel):
    """Keys every case has; the values live in case.yaml, not here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(gt=0, description="the round is killed (and retried) after this long")
    max_retries: int = Field(ge=0, le=10, description="retries after an infrastructure failure")


class TimedCaseConfig(CaseConfig):
    """Keys of every case that times a repeated step (see flagperf.timing)."""

    warmup_iters: int = Field(ge=0)
    min_duration_s: float = Field(gt=0)
    min_iters: int = Field(ge=1)
    max_duration_s: float | None = Field(default=None, gt=0)

    @property
    def timing(self) -> TimingPlan:
        return TimingPlan(self.warmup_iters, self.min_duration_s, self.min_iters, self.max_duration_s)


class CaseContext:
    def __init__(self, device_type: str, spec: SpecTable, timing: TimingPlan, log: logging.Logger) -> None:
        self.device_type = device_type
        self.device = torch.device(device_type)
        self.spec = spec
        self.timing = timing
        self.log = log
        self.measured_seconds = 0.0
        self.windows: list[tuple[float, float]] = []  # (start, end) epoch seconds of each timed region

    @property
    def has_separate_memory(self) -> bool:
        """False on the CPU, where 'device memory' is host memory."""
        return self.device_type != "cpu"

    def synchronize(self) -> None:
        if self.device_type != "cpu":
            torch.get_device_module(self.device_type).synchronize()

    def require(self, peak_key: str) -> Peak | None:
        """The peak for ``peak_key``; raises Unsupported when the vendor says the device cannot do it."""
        peak = self.spec.peaks.get(peak_key)
        if peak is not None and not peak.supported:
            raise Unsupported(f"{peak_key} on {self.spec.device}: {peak.source}")
        return peak

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the memory the case allocates from."""
        if self.device_type == "cpu":
            vm = psutil.virtual_memory()
            return vm.available, vm.total
        free, total = torch.get_device_module(self.device_type).mem_get_info()
        return int(free), int(total)

    def time(self, step: Callable[[], Any], timing: TimingPlan | None = None) -> list[Chunk]:
        chunks = measure(step, self.synchronize, timing or self.timing)
        # Place the timed region on the wall clock, so monitor samples (power, utilisation) can be
        # attributed to the measurement and not to warm-up or set-up.
        end_counter, end_epoch = time.perf_counter(), time.time()
        self.windows.append((end_epoch - (end_counter - chunks[0].start), end_epoch))
        self.measured_seconds += sum(c.seconds for c in chunks)
        return chunks

    def rate_metric(self, name: str, chunks: list[Chunk], work_per_iteration: float, unit: str, scale: float,
                    peak_key: str | None, convention: str | None = None, note: str | None = None) -> Metric:
        stats = rate_stats(chunks, work_per_iteration, scale)
        peak = self.spec.peaks.get(peak_key) if peak_key else None
        return Metric(
            window=list(self.windows[-1]) if self.windows else None,
            work=work_per_iteration * stats.iterations / scale,
            name=name, value=stats.value, unit=unit, p50=stats.p50, p10=stats.p10, p90=stats.p90, cv=stats.cv,
            chunks=stats.chunks, iterations=stats.iterations, measured_seconds=stats.seconds,
            peak=peak, ratio=comparable_ratio(stats.value, unit, peak), convention=convention, note=note,
        )


def comparable_ratio(value: float, unit: str, peak: Peak | None) -> float | None:
    if peak is None or not peak.supported or peak.unit != unit:
        return None
    return ratio(value, peak.value)
