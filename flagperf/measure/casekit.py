"""What a case's code sees: its typed config base and a context that times, synchronises and compares
with the vendor's peaks. Cases import only this module (plus torch), never hosts or Prefect."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psutil
from pydantic import Field, model_validator

from flagperf.config.memory import USABLE_SHARE
from flagperf.config.models import CaseConfig
from flagperf.errors import CaseUserError, Unsupported
from flagperf.measure.timing import TimingPlan, measure
from flagperf.results.metrics import Chunk, model_flops_utilisation, rate_stats, ratio
from flagperf.results.schema import Metric, Peak, SpecTable

if TYPE_CHECKING:
    from flagperf.config.job import Job

# The case contract: a case imports its config bases and its context from here.
__all__ = ["CaseConfig", "CaseContext", "EveryDevice", "TimedCaseConfig", "comparable_ratio"]


class TimedCaseConfig(CaseConfig):
    """Keys of every case that times a repeated step (see flagperf.measure.timing)."""

    warmup_iters: int = Field(ge=0)
    min_duration_s: float = Field(gt=0)
    min_iters: int = Field(ge=1)
    max_duration_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _fits_in_timeout(self) -> TimedCaseConfig:
        if self.min_duration_s >= self.timeout_s:
            raise ValueError(f"min_duration_s ({self.min_duration_s:g}) must be well below timeout_s "
                             f"({self.timeout_s:g}), or every round times out")
        return self

    @property
    def timing(self) -> TimingPlan:
        return TimingPlan(self.warmup_iters, self.min_duration_s, self.min_iters, self.max_duration_s)


class EveryDevice(CaseConfig):
    """Keys of a case that measures one device and is run on every device of its host (flagperf.measure.fanout):
    one process per device, all at once or one after another."""

    devices: Literal["all", "one"] = Field(
        default="all", description="all: every device of the host, one process each (per-device figures and the "
        "host's min, median and max); one: the host's first device only")
    device_order: Literal["parallel", "sequential"] = Field(
        default="parallel", description="parallel: every device at once; sequential: one after another, where "
        "devices share a limit (power, host memory) that would mix their figures")


class CaseContext:
    def __init__(self, device_type: str, spec: SpecTable, timing: TimingPlan, log: logging.Logger, *,
                 shares_host_memory: bool, job: Job | None = None, out_dir: Path | None = None,
                 vendor_folder: Path | None = None) -> None:
        self.job = job  # the round (node rank, master address ...) for cases that start processes of their own
        self.vendor_folder = vendor_folder  # the vendor's folder, for cases that run its toolkits
        self.out_dir = out_dir
        self.device_type = device_type
        self.shares_host_memory = shares_host_memory
        # torch (and flagperf.measure.device, which needs it) where a case runs, not with the module: the configs
        # here are read by the planner and `flagperf validate`, on a controller that may have no torch.
        import torch

        from flagperf.measure.device import synchronize

        self._synchronize = synchronize
        self.device_module = torch.get_device_module(device_type)
        self.device = torch.device(device_type)
        self.spec = spec
        self.timing = timing
        self.log = log
        self.measured_seconds = 0.0
        self.windows: list[tuple[float, float]] = []  # (start, end) epoch seconds of each timed region

    @property
    def has_separate_memory(self) -> bool:
        """False where the device allocates from host memory (the CPU; unified-memory parts): the vendor says."""
        return not self.shares_host_memory

    def synchronize(self) -> None:
        self._synchronize(self.device)

    def require(self, peak_key: str) -> Peak | None:
        """The peak for ``peak_key``; raises Unsupported when the vendor says the device cannot do it."""
        peak = self.spec.peaks.get(peak_key)
        if peak is not None and not peak.supported:
            raise Unsupported(f"{peak_key} on {self.spec.device}: {peak.source}")
        return peak

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the memory the case allocates from."""
        if self.shares_host_memory:
            vm = psutil.virtual_memory()
            return vm.available, vm.total
        free, total = self.device_module.mem_get_info()
        return int(free), int(total)

    def check_fits(self, nbytes: int, what: str, share: float = USABLE_SHARE) -> None:
        """A user error (not a crash, not retried) when ``nbytes`` exceed ``share`` of the free memory."""
        free, _ = self.memory_info()
        if nbytes > share * free:
            raise CaseUserError(f"{what} needs {nbytes / 2**30:.2f} GiB, more than {share:.0%} of the "
                                f"{free / 2**30:.2f} GiB free on {self.device}")

    def time(self, step: Callable[[], Any], timing: TimingPlan | None = None) -> list[Chunk]:
        chunks = measure(step, self.synchronize, timing or self.timing)
        # Place the timed region on the wall clock, so monitor samples (power, utilisation) can be
        # attributed to the measurement and not to warm-up or set-up.
        end_counter, end_epoch = time.perf_counter(), time.time()
        self.windows.append((end_epoch - (end_counter - chunks[0].start), end_epoch))
        self.measured_seconds += sum(c.seconds for c in chunks)
        return chunks

    def record_external(self, chunks: list[Chunk], window: tuple[float, float]) -> None:
        """A timed region measured by a program of its own (a vendor toolkit): counted as ``time`` counts."""
        self.windows.append(window)
        self.measured_seconds += sum(c.seconds for c in chunks)

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
            statistic="rate",
        )


    def throughput_metric(self, name: str, chunks: list[Chunk], items_per_iteration: float, item: str,
                          flops_per_item: float | None = None, precision: str | None = None,
                          note: str | None = None, flops_scope: str | None = None) -> Metric:
        """items/s over the timed chunks; with flops per item and the precision used, MFU against that
        precision's peak in the vendor's spec table. ``flops_scope``: what an item's FLOPs cover (padded
        positions counted or not), said in the convention."""
        metric = self.rate_metric(name, chunks, items_per_iteration, f"{item}/s", 1.0, peak_key=None, note=note)
        if flops_per_item is None or precision is None:
            return metric
        peak = self.spec.peaks.get(precision)
        mfu = model_flops_utilisation(metric.value, flops_per_item, peak.value if peak else None,
                                      peak.unit if peak else "", dense=peak.dense if peak else True)
        per = item.removesuffix("s")  # "FLOP per image x images/s"
        scope = f" ({flops_scope})" if flops_scope else ""
        return metric.model_copy(update={"mfu": mfu, "mfu_peak_key": precision, "mfu_peak": peak,
                                         "convention": f"MFU = {flops_per_item:.4g} FLOP per {per}{scope} x "
                                                       f"{item}/s / {precision} peak"})


def comparable_ratio(value: float, unit: str, peak: Peak | None) -> float | None:
    # A sparse (2:4) datasheet figure is twice the dense one: a dense measurement is never divided by it.
    if peak is None or not peak.supported or peak.unit != unit or not peak.dense:
        return None
    return ratio(value, peak.value)
