"""The training driver every case uses: PerfLog events in FlagPerf's format, the timers, convergence, and
the accelerator settings (mixed precision, fused optimizers, DDP or FSDP2, torch.compile, activation
checkpointing), so that a case's loop is the same on a CPU and on eight GPUs.

A case writes its loop with the driver's hooks and never times anything itself:

    def run(config, ctx):
        model = ctx.wrap(Net())                        # device, DDP or FSDP2, compile, checkpointing
        optimizer = ctx.optimizer(torch.optim.AdamW, model.parameters(), lr=config.lr)  # fused on GPUs
        for epoch in ctx.epochs():                     # stops at max_epochs, or once the target is reached
            for x, y in ctx.batches(loader):           # stops at max_steps
                with ctx.autocast():                   # bf16 / fp16 autocast, or nothing for fp32
                    loss = loss_fn(model(x), y)
                ctx.backward(loss, optimizer)          # grad scaler for fp16, then step and zero_grad
                ctx.step(len(x), loss=loss)            # a tensor: read back only every log_freq steps
            ctx.evaluate(accuracy=evaluate(model))

Nothing in a step reads a value back to the host: the loss is read at STEP_END events (every log_freq steps)
and the clock is read after a device synchronisation at the ends of the timed region only.
FINISHED always has the same keys, for every case (see FINISHED_KEYS).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from flagperf.errors import CaseUserError
from flagperf.measure.device import device_module, synchronize
from flagperf.measure.perflog import format_line
from flagperf.results.metrics import TransformerFlops, model_flops_utilisation
from flagperf.training.config import TrainingConfig as TrainingConfig  # its old place: case code imports it here

FINISHED_KEYS = ("e2e_time", "training_throughput", "throughput_unit", "converged", "target_metric",
                 "target", "final_metric", "raw_train_time", "init_time", "epochs", "steps", "extra")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
T = TypeVar("T")


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): the device allocator's peak, or the process's peak RSS on a CPU."""
    module = device_module(device)
    if module is not None and hasattr(module, "max_memory_allocated"):
        return int(module.max_memory_allocated(device)), f"{device.type} allocator peak (max_memory_allocated)"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak RSS of the process"


def weights_fingerprint(model: torch.nn.Module) -> list[tuple[tuple[int, ...], tuple[float, float]]]:
    """Each parameter's shape and two sums of its values (in registration order): equal before and after a
    hook means the same structure, size and weights, whatever the hook renamed."""
    with torch.no_grad():
        return [(tuple(p.shape), (float(p.detach().double().sum()), float(p.detach().double().abs().sum())))
                for p in model.parameters()]


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the longest ModuleList of two or more modules of one class with the same
    parameter shapes (Llama's decoder layers, BERT's encoder layers); [] when there is none (ResNet's stages
    differ in shape)."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > max(1, len(best)):
            members = list(module)
            shapes = {(type(m), tuple(p.shape for p in m.parameters())) for m in members}
            if len(shapes) == 1 and any(True for _ in members[0].parameters()):
                best = members
    return best


class TrainingContext:
    def __init__(self, config: TrainingConfig, *, device: torch.device, stream: Any = None,
                 hooks: dict[str, Callable[..., Any]] | None = None) -> None:
        self.config = config
        # The vendor's extern hooks (flagperf.config.adaptation.EXTERN_HOOKS["training"]), checked where used.
        self.hooks = dict(hooks or {})
        self.hooks_used: list[str] = []
        self.target_metric, self.target, self.mode = config.target_metric, config.target, config.target_mode
        self.device = device
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.stream = stream or sys.stdout
        self.started = time.perf_counter()
        self.init_time = 0.0
        self.raw_train_time = 0.0
        self.train_cpu_time = 0.0  # this process's CPU seconds in the timed region (all its threads)
        self.samples = 0  # this process's, all steps
        self.timed_samples = 0  # this process's, in the timed region (after warmup_steps)
        self.steps = 0
        self.epoch = 0
        self.converged = False
        self.final_metric: float | None = None
        self.time_to_target: float | None = None
        # FINISHED's keys are FlagPerf's: the target metric's unit rides in extra
        self.extra: dict[str, Any] = {"target_unit": config.target_unit}
        self.tokens_per_sample: int | None = None
        self.flops_per_sample: float | None = None
        self.flops_convention: str | None = None
        self.peak: tuple[float | None, str] | None = None  # (peak, unit) of the precision used, for MFU
        self.log = logging.getLogger("flagperf.training")
        self.dtype = DTYPES[config.precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self._samplers: list[DistributedSampler[Any]] = []
        self._train_started = 0.0
        self._epoch_started = self._epoch_cpu = 0.0
        self._in_epoch = False
        self._timing = config.warmup_steps == 0

    # -- PerfLog -------------------------------------------------------------------------------------
    def event(self, name: str, value: dict[str, Any] | str | None = None) -> None:
        # The case's line that led here (two frames up): sys._getframe, as inspect.stack() reads every
        # frame's source file and costs milliseconds per event.
        try:
            caller = sys._getframe(2)
        except ValueError:
            caller = sys._getframe(1)
        line = format_line(name, value if value is not None else {}, file=os.path.basename(caller.f_code.co_filename),
                           lineno=caller.f_lineno, time_ms=int(time.time() * 1000), rank=self.rank)
        print(line, file=self.stream, flush=True)

    # -- hooks for the case ----------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module, *, channels_last: bool = False) -> torch.nn.Module:
        """Onto the device (channels-last for convolutional models), activation checkpointing, DDP or FSDP2
        across processes, then torch.compile, as the config says."""
        config = self.config
        if "wrap_model" in self.hooks:
            model = self._vendor_wrap(model)
        if config.activation_checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise CaseUserError(f"activation_checkpointing: {type(model).__name__} has no checkpointing hook")
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = model.to(self.device).train()  # whatever mode the model was built in
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        blocks = repeated_blocks(model)
        compiled = "off"
        if config.compile and blocks:
            # Regional compilation: the repeated block is compiled once and reused by every instance (seconds,
            # not minutes, for a 32-layer model), before DDP or FSDP2 wrap it, as torchtitan does.
            limit = getattr(torch._dynamo.config, "recompile_limit", 8)
            # Should a block recompile per instance, all of them stay compiled rather than the last falling back.
            torch._dynamo.config.recompile_limit = max(limit, len(blocks) + 8)
            for block in blocks:
                block.compile()
            compiled = f"each {type(blocks[0]).__name__} ({len(blocks)})"
        if self.world_size > 1 and config.parallel == "fsdp":
            model = self._fully_shard(model, blocks)
        elif self.world_size > 1:
            ids = [self.device.index] if self.device.type != "cpu" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if config.compile and not blocks:
            model = torch.compile(model)  # type: ignore[assignment]
            compiled = "whole model"
        self.extra.update(parallel=config.parallel if self.world_size > 1 else "none", compile=compiled,
                          activation_checkpointing=config.activation_checkpointing, channels_last=channels_last)
        return model

    def _use(self, hook: str) -> Callable[..., Any]:
        if hook not in self.hooks_used:
            self.hooks_used.append(hook)
            self.extra["vendor_hooks"] = list(self.hooks_used)
        return self.hooks[hook]

    def _vendor_wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The vendor's wrap_model hook, held to the guide: the model's structure and size (parameter count
        and shapes) and its initial weights (the checkpoint) come out as they went in."""
        before = weights_fingerprint(model)
        wrapped = self._use("wrap_model")(model, self)
        if not isinstance(wrapped, torch.nn.Module):
            raise CaseUserError(f"extern hook wrap_model returned {type(wrapped).__name__}, not a torch module")
        after = weights_fingerprint(wrapped)
        if [shape for shape, _ in after] != [shape for shape, _ in before]:
            count = sum(torch.Size(s).numel() for s, _ in after) - sum(torch.Size(s).numel() for s, _ in before)
            raise CaseUserError(f"extern hook wrap_model changed the model's parameters ({len(before)} -> "
                                f"{len(after)} tensors, {count:+d} values): the model's structure and size are "
                                "not the vendor's to change")
        if not all(torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-6, atol=1e-6)
                   for (_, a), (_, b) in zip(after, before, strict=True)):
            raise CaseUserError("extern hook wrap_model changed the model's weights: the initial checkpoint is not "
                                "the vendor's to change")
        return wrapped

    def _fully_shard(self, model: torch.nn.Module, blocks: list[torch.nn.Module]) -> torch.nn.Module:
        """FSDP2: each repeated block (else every direct child holding parameters) is its own shard group, then
        the root; parameters compute in the autocast dtype, gradients are reduced in fp32."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=self.dtype if self.dtype != torch.float32 else None,
                                      reduce_dtype=torch.float32)
        units = blocks or [m for m in model.children() if any(True for _ in m.parameters())]
        for unit in units:
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self.extra["fsdp_units"] = len(units)
        return model

    def optimizer(self, cls: Callable[..., torch.optim.Optimizer], params: Iterable[Any], **kwargs: Any
                  ) -> torch.optim.Optimizer:
        """``cls(params, **kwargs)``, fused (one kernel for all parameters) where torch has it for the device."""
        params = list(params)
        if "make_optimizer" in self.hooks:
            return self._vendor_optimizer(cls, params, kwargs)
        if self.device.type == "cuda" and cls in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
            kwargs.setdefault("fused", True)
        optimizer = cls(params, **kwargs)
        self.extra["optimizer"] = f"{cls.__name__}{' fused' if kwargs.get('fused') else ''}"
        return optimizer

    def _vendor_optimizer(self, cls: Callable[..., torch.optim.Optimizer], params: list[Any], kwargs: dict[str, Any]
                          ) -> torch.optim.Optimizer:
        """The vendor's make_optimizer hook: an instance of exactly the class the case asked for, over exactly
        the case's parameters (the optimizer type is not the vendor's to change)."""
        optimizer = self._use("make_optimizer")(cls, params, dict(kwargs), self)
        if type(optimizer) is not cls:
            raise CaseUserError(f"extern hook make_optimizer returned {type(optimizer).__name__}, the case asks for "
                                f"{getattr(cls, '__name__', cls)}: the optimizer type is not the vendor's to change")
        given = {id(p) for p in params if isinstance(p, torch.Tensor)}
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if given and held != given:
            raise CaseUserError("extern hook make_optimizer's optimizer does not hold exactly the case's parameters")
        self.extra["optimizer"] = f"{type(optimizer).__name__} (extern make_optimizer)"
        return optimizer

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward and the optimizer step (through the grad scaler for fp16), then the gradients are cleared."""
        if self.scaler.is_enabled():
            self.scaler.scale(loss).backward()
            self.scaler.step(optimizer)
            self.scaler.update()
        else:  # the plain calls: a disabled scaler still costs Python calls on every step
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=True)

    def loader(self, dataset: Dataset[Any], batch_size: int, *, num_workers: int = 0,
               drop_last: bool = False) -> DataLoader[Any]:
        """The training loader: this process's shard (DistributedSampler, reshuffled every epoch) when there
        are several processes, a seeded shuffle otherwise; pinned memory when the device is not the CPU."""
        sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True,
                                     seed=self.config.seed) if self.world_size > 1 else None
        if sampler is not None:
            self._samplers.append(sampler)
        return DataLoader(dataset, batch_size=batch_size, shuffle=sampler is None, sampler=sampler,
                          num_workers=num_workers, drop_last=drop_last, pin_memory=self.device.type == "cuda",
                          persistent_workers=num_workers > 0,
                          generator=torch.Generator().manual_seed(self.config.seed))

    def init_done(self) -> None:
        self.init_time = time.perf_counter() - self.started
        self.event("INIT_END", {"init_time": self.init_time})

    @property
    def done(self) -> bool:
        return self.config.max_steps is not None and self.steps >= self.config.max_steps

    def epochs(self) -> Iterator[int]:
        if not self.init_time:
            self.init_done()
        self.event("TRAIN_START")
        self._train_started = time.perf_counter()
        for epoch in range(1, self.config.max_epochs + 1):
            self.epoch = epoch
            for sampler in self._samplers:
                sampler.set_epoch(epoch)
            self.event("EPOCH_BEGIN", {"epoch": epoch})
            synchronize(self.device)
            self._epoch_started, self._epoch_cpu = time.perf_counter(), time.process_time()
            self._in_epoch = True
            yield epoch
            if self._in_epoch:  # the case did not evaluate this epoch
                self._end_training_part()
            self.event("EPOCH_END", {"epoch": epoch})
            if self.converged or self.done:
                break
        self.event("TRAIN_END", {"epochs": self.epoch, "converged": self.converged})

    def batches(self, loader: Iterable[T]) -> Iterator[T]:
        """The loader's batches, until max_steps steps have been taken. The training part of the epoch ends
        with the last batch: what the case does next (evaluation, whose metric is computed before
        ``evaluate`` is called) is not training time."""
        try:
            if self.done:
                return
            for batch in loader:
                yield batch
                if self.done:  # checked after the step, so the loader is not asked for a batch nobody trains on
                    return
        finally:
            if self._in_epoch:
                self._end_training_part()

    def step(self, batch_size: int, **values: float | torch.Tensor) -> None:
        self.steps += 1
        if "on_step" in self.hooks:
            self._use("on_step")(self, self.steps)
        self.samples += batch_size
        if self._timing:
            self.timed_samples += batch_size
        elif self.steps >= self.config.warmup_steps:  # warm-up over: the timed region starts after this step
            synchronize(self.device)
            self._epoch_started, self._epoch_cpu = time.perf_counter(), time.process_time()
            self._timing = True
        if self.steps == 1 or self.steps % self.config.log_freq == 0:
            read = {k: float(v.detach()) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
            elapsed = self.raw_train_time + (time.perf_counter() - self._epoch_started)
            rate = self.timed_samples * self.world_size / elapsed if self._timing and self.timed_samples else None
            self.event("STEP_END", {"step": self.steps, "epoch": self.epoch, "samples_per_s": rate, **read})

    def _end_training_part(self) -> None:
        synchronize(self.device)  # the steps queued on the device are part of training time
        if self._timing:
            self.raw_train_time += time.perf_counter() - self._epoch_started
            self.train_cpu_time += time.process_time() - self._epoch_cpu
        self._in_epoch = False

    def evaluate(self, **metrics: float) -> bool:
        """Report evaluation metrics (the same on every rank); returns whether the target is reached."""
        if self._in_epoch:
            self._end_training_part()  # evaluation time is not training time
        value = float(metrics[self.target_metric])
        self.final_metric = value
        self.converged = value >= self.target if self.mode == "max" else value <= self.target
        if self.converged and self.time_to_target is None:
            self.time_to_target = time.perf_counter() - self._train_started
        self.event("EVALUATE", {"epoch": self.epoch, **metrics, "target": self.target, "converged": self.converged})
        return self.converged

    def language_model(self, parameters: int, tokens_per_sample: int, synthetic: bool, *,
                       layers: int | None = None, hidden: int | None = None) -> None:
        """Declare an LLM: tokens/s and MFU join the result, FLOPs counted as every family counts them
        (flagperf.results.metrics.TransformerFlops: 6 x parameters + 12 x layers x hidden x tokens_per_sample per
        token; the attention term only when layers and hidden are given)."""
        self.tokens_per_sample = tokens_per_sample
        counted = TransformerFlops(parameters, layers, hidden)
        self.flops_per_sample = counted.training_per_token(tokens_per_sample) * tokens_per_sample
        self.flops_convention = counted.convention
        self.extra.update(parameters=parameters, synthetic_data=synthetic, precision=self.config.precision,
                          flops_per_token=self.flops_per_sample / tokens_per_sample)

    def flops(self, per_sample: float, convention: str) -> None:
        """Declare a model's training FLOPs per sample (forward and backward): MFU joins the result."""
        self.flops_per_sample, self.flops_convention = per_sample, convention
        self.extra.update(precision=self.config.precision, flops_per_sample=per_sample)

    def _gather(self, value: float) -> list[float]:
        if self.world_size > 1 and dist.is_initialized():
            out = [torch.zeros(1, dtype=torch.float64, device=self._collective_device()) for _ in
                   range(self.world_size)]
            dist.all_gather(out, torch.tensor([value], dtype=torch.float64, device=self._collective_device()))
            return [float(t.item()) for t in out]
        return [value]

    def _collective_device(self) -> torch.device:
        return torch.device("cpu") if dist.get_backend() == "gloo" else self.device

    def finish(self) -> dict[str, Any]:
        samples = sum(self._gather(float(self.timed_samples)))
        throughput = samples / self.raw_train_time if self.raw_train_time and samples else None
        peak_bytes, peak_what = peak_memory_bytes(self.device)
        # The timed work itself, so training_throughput = timed_samples / raw_train_time rebuilds from the log.
        self.extra.update(timed_samples=samples, timed_tokens=samples * self.tokens_per_sample
                          if self.tokens_per_sample else None)
        self.extra.update(peak_memory_bytes_per_device=self._gather(float(peak_bytes)), peak_memory_kind=peak_what,
                          world_size=self.world_size, warmup_steps=self.config.warmup_steps,
                          train_cpu_seconds=self.train_cpu_time,
                          time_to_target_s=self.time_to_target)
        if throughput:
            self.extra["samples_per_s_per_device"] = throughput / self.world_size
        if self.tokens_per_sample and throughput:
            tokens_per_s = throughput * self.tokens_per_sample
            self.extra["tokens_per_s"] = tokens_per_s
            self.extra["tokens_per_s_per_device"] = tokens_per_s / self.world_size
        if self.flops_per_sample and throughput and self.peak:
            # The peak is one device's: the model FLOP/s of one device (the mean) against it.
            self.extra["mfu"] = model_flops_utilisation(throughput / self.world_size, self.flops_per_sample,
                                                        *self.peak)
        if self.flops_convention:
            self.extra["flops_convention"] = self.flops_convention
        value = {"e2e_time": time.perf_counter() - self.started, "training_throughput": throughput,
                 "throughput_unit": "samples/s", "converged": self.converged, "target_metric": self.target_metric,
                 "target": self.target, "final_metric": self.final_metric, "raw_train_time": self.raw_train_time,
                 "init_time": self.init_time, "epochs": self.epoch, "steps": self.steps, "extra": self.extra}
        assert tuple(value) == FINISHED_KEYS
        self.event("FINISHED", value)
        return value
