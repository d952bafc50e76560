"""The training driver every case uses: PerfLog events in FlagPerf's format, the timers, convergence.

A case writes its loop with the driver's hooks and never times anything itself:

    def train(config, ctx):
        model = ctx.wrap(Net())                  # DDP when there are several processes
        for epoch in ctx.epochs():               # stops at max_epochs, or once the target is reached
            for x, y in loader:
                ...
                ctx.step(len(x), loss=loss.item())
            ctx.evaluate(accuracy=evaluate(model))

FINISHED always has the same keys, for every case (see FINISHED_KEYS).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import Field
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from flagperf.measure.casekit import CaseConfig
from flagperf.measure.perflog import format_line
from flagperf.results.metrics import model_flops_utilisation

FINISHED_KEYS = ("e2e_time", "training_throughput", "throughput_unit", "converged", "target_metric",
                 "target", "final_metric", "raw_train_time", "init_time", "epochs", "steps", "extra")


class TrainingConfig(CaseConfig):
    """Keys of every training case (values in case.yaml)."""

    nnodes: int = Field(ge=1, le=1024)
    nproc_per_node: int = Field(ge=1, le=64)
    max_epochs: int = Field(ge=1)
    log_freq: int = Field(ge=1, description="a STEP_END event every log_freq steps (and at step 1)")
    master_port: int = Field(ge=1024, le=65535)
    seed: int
    target_metric: str = Field(description="the evaluation metric convergence is judged on")
    target: float
    target_mode: Literal["max", "min"] = "max"
    precision: Literal["fp32", "bf16", "fp16"] = Field(default="fp32", description="the peak MFU is taken against")


class TrainingContext:
    def __init__(self, config: TrainingConfig, *, device: torch.device, stream: Any = None) -> None:
        self.config = config
        self.target_metric, self.target, self.mode = config.target_metric, config.target, config.target_mode
        self.device = device
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.stream = stream or sys.stdout
        self.started = time.perf_counter()
        self.init_time = 0.0
        self.raw_train_time = 0.0
        self.samples = 0  # this process's
        self.steps = 0
        self.epoch = 0
        self.converged = False
        self.final_metric: float | None = None
        self.extra: dict[str, Any] = {}
        self.tokens_per_sample: int | None = None
        self.flops_per_token: float | None = None
        self.peak: tuple[float | None, str] | None = None  # (peak, unit) of the precision used, for MFU
        self.log = logging.getLogger("flagperf.training")
        self._samplers: list[DistributedSampler[Any]] = []

    # -- PerfLog -------------------------------------------------------------------------------------
    def event(self, name: str, value: dict[str, Any] | str | None = None) -> None:
        caller = inspect.stack()[2] if len(inspect.stack()) > 2 else inspect.stack()[-1]
        line = format_line(name, value if value is not None else {}, file=os.path.basename(caller.filename),
                           lineno=caller.lineno, time_ms=int(time.time() * 1000), rank=self.rank)
        print(line, file=self.stream, flush=True)

    # -- hooks for the case ----------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        if self.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return model

    def loader(self, dataset: Dataset[Any], batch_size: int, *, num_workers: int = 0,
               drop_last: bool = False) -> DataLoader[Any]:
        """The training loader: this process's shard (DistributedSampler, reshuffled every epoch) when there
        are several processes, a seeded shuffle otherwise."""
        sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True,
                                     seed=self.config.seed) if self.world_size > 1 else None
        if sampler is not None:
            self._samplers.append(sampler)
        return DataLoader(dataset, batch_size=batch_size, shuffle=sampler is None, sampler=sampler,
                          num_workers=num_workers, drop_last=drop_last,
                          generator=torch.Generator().manual_seed(self.config.seed))

    def init_done(self) -> None:
        self.init_time = time.perf_counter() - self.started
        self.event("INIT_END", {"init_time": self.init_time})

    def epochs(self) -> Iterator[int]:
        if not self.init_time:
            self.init_done()
        self.event("TRAIN_START")
        for epoch in range(1, self.config.max_epochs + 1):
            self.epoch = epoch
            for sampler in self._samplers:
                sampler.set_epoch(epoch)
            self.event("EPOCH_BEGIN", {"epoch": epoch})
            self._epoch_started = time.perf_counter()
            self._in_epoch = True
            yield epoch
            if self._in_epoch:  # the case did not evaluate this epoch
                self._end_training_part()
            self.event("EPOCH_END", {"epoch": epoch})
            if self.converged:
                break
        self.event("TRAIN_END", {"epochs": self.epoch, "converged": self.converged})

    def step(self, batch_size: int, **values: float) -> None:
        self.steps += 1
        self.samples += batch_size
        if self.steps == 1 or self.steps % self.config.log_freq == 0:
            elapsed = self.raw_train_time + (time.perf_counter() - self._epoch_started)
            self.event("STEP_END", {"step": self.steps, "epoch": self.epoch,
                                    "samples_per_s": self.samples * self.world_size / elapsed if elapsed else None,
                                    **values})

    def _end_training_part(self) -> None:
        self.raw_train_time += time.perf_counter() - self._epoch_started
        self._in_epoch = False

    def evaluate(self, **metrics: float) -> bool:
        """Report evaluation metrics (the same on every rank); returns whether the target is reached."""
        if self._in_epoch:
            self._end_training_part()  # evaluation time is not training time
        value = float(metrics[self.target_metric])
        self.final_metric = value
        self.converged = value >= self.target if self.mode == "max" else value <= self.target
        self.event("EVALUATE", {"epoch": self.epoch, **metrics, "target": self.target, "converged": self.converged})
        return self.converged

    def language_model(self, parameters: int, tokens_per_sample: int, synthetic: bool) -> None:
        """Declare an LLM: tokens/s and MFU = 6 x parameters x tokens/s / peak join the result."""
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_token = 6.0 * parameters
        self.extra.update(parameters=parameters, synthetic_data=synthetic, precision=self.config.precision)

    def finish(self) -> dict[str, Any]:
        samples = torch.tensor([self.samples], dtype=torch.float64)
        if self.world_size > 1 and dist.is_initialized():
            dist.all_reduce(samples)
        throughput = float(samples.item()) / self.raw_train_time if self.raw_train_time else None
        if self.tokens_per_sample and throughput:
            tokens_per_s = throughput * self.tokens_per_sample
            self.extra["tokens_per_s"] = tokens_per_s
            if self.flops_per_token and self.peak:
                self.extra["mfu"] = model_flops_utilisation(tokens_per_s, self.flops_per_token, *self.peak)
        value = {"e2e_time": time.perf_counter() - self.started, "training_throughput": throughput,
                 "throughput_unit": "samples/s", "converged": self.converged, "target_metric": self.target_metric,
                 "target": self.target, "final_metric": self.final_metric, "raw_train_time": self.raw_train_time,
                 "init_time": self.init_time, "epochs": self.epoch, "steps": self.steps, "extra": self.extra}
        assert tuple(value) == FINISHED_KEYS
        self.event("FINISHED", value)
        return value
