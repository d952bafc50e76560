"""Dense matrix multiply C = A @ B at one precision (FlagPerf's computation-<PRECISION> cases).

INT8 and FP8 run on the library's tensor-core path: A row-major [M, K], B column-major [K, N] (the
transpose of a contiguous [N, K]), which is the "TN" layout cuBLASLt's int8 and fp8 kernels require;
any other layout is either refused or copied, and a row-major int8 B cost 6.6x on an H100. INT8
accumulates in int32; FP8 is a scaled matmul (per-tensor scales of 1, BF16 out).

With ``sweep_budget_s`` > 0 the case also searches shapes (flagperf.basespec.shapesearch) and reports
the fastest one, re-measured with the case's own timing, as ``gemm_<precision>_max`` beside the fixed shape.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from flagperf.basespec.shapesearch import AXES, SearchOutcome, Shape, axis_values, search
from flagperf.config.memory import MemoryNeed
from flagperf.errors import CaseUserError, Unsupported
from flagperf.measure.casekit import CaseContext, EveryDevice, TimedCaseConfig
from flagperf.measure.timing import TimingPlan, measure
from flagperf.results.metrics import GEMM_CONVENTION, Chunk, gemm_ops, rate_stats
from flagperf.results.schema import Metric, ShapeSearch

# torch is imported where a kernel runs, not with the module: the planner and `flagperf validate` read Config
# here, on a controller that may have no torch (and would pay seconds for it).
if TYPE_CHECKING:
    import torch

Precision = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "int8", "fp8"]
DataPattern = Literal["normal", "uniform", "zeros"]
# torch's dtype of each precision, by name (torch.float8_e4m3fn ...); fp8 by its format.
DTYPE_NAMES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16",
               "int8": "int8"}
FP8_DTYPE_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "int8": 1, "fp8": 1}
# Operands the vendor libraries want as "TN": B column-major.
TENSOR_CORE_INTEGER = ("int8", "fp8")


class Config(TimedCaseConfig, EveryDevice):
    precision: Precision
    m: int = Field(gt=0, le=65536)
    n: int = Field(gt=0, le=65536)
    k: int = Field(gt=0, le=65536)
    data_pattern: DataPattern = Field(
        default="normal", description="operand values: normal (randn), uniform (whole range of the type for "
        "int8, [-1, 1) otherwise) or zeros; the bit patterns change the power a chip draws, so the figure with it")
    fp8_format: Literal["e4m3", "e5m2"] = Field(
        default="e4m3", description="fp8 only: e5m2 makes A e5m2 and keeps B e4m3 (the backward pass's mix; "
        "cuBLASLt has no e5m2 x e5m2 kernel)")
    fp8_fast_accum: bool = Field(default=False, description="fp8 only: cuBLASLt's fast (lower-precision) accumulate")
    sweep_budget_s: float = Field(default=0.0, ge=0, le=3600, description="seconds of shape search; 0: none")
    sweep_m: list[int] = Field(default=[1024, 16384], description="[low, high] of M searched")
    sweep_n: list[int] = Field(default=[1024, 16384], description="[low, high] of N searched")
    sweep_k: list[int] = Field(default=[1024, 16384], description="[low, high] of K searched")
    sweep_step: int = Field(default=256, gt=0, le=65536, description="the grid step of every axis")
    sweep_shape_s: float = Field(default=0.1, gt=0, le=60, description="timed seconds per shape in the search")

    @field_validator("sweep_m", "sweep_n", "sweep_k")
    @classmethod
    def _range(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or not 0 < value[0] <= value[1] <= 65536:
            raise ValueError("must be [low, high] with 0 < low <= high <= 65536")
        return value

    @model_validator(mode="after")
    def _grid(self) -> Config:
        if self.sweep_budget_s > 0:
            for axis in AXES:
                low, high = getattr(self, f"sweep_{axis}")
                axis_values(low, high, self.sweep_step)  # raises ValueError: no multiple of the step in range
        return self

    def memory_need(self) -> MemoryNeed:
        """The fixed shape's operands (a searched shape that does not fit is skipped, not refused)."""
        return MemoryNeed(_operand_bytes(self, self.m, self.n, self.k), f"m={self.m}, n={self.n}, k={self.k}",
                          ("m", "n", "k"))


@dataclass
class Operands:
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    scale_a: torch.Tensor | None = None
    scale_b: torch.Tensor | None = None
    fast_accum: bool = False


def _values(shape: tuple[int, int], pattern: str, dtype: torch.dtype, device: torch.device,
            generator: torch.Generator) -> torch.Tensor:
    """Operand values made on the device itself (a host-made 16k x 16k operand costs seconds to copy)."""
    import torch

    if pattern == "zeros":
        return torch.zeros(shape, dtype=dtype, device=device)
    if dtype == torch.int8:
        if pattern == "uniform":  # every bit toggles: the whole int8 range
            return torch.randint(-128, 128, shape, dtype=torch.int8, device=device, generator=generator)
        normal = torch.randn(shape, dtype=torch.float32, device=device, generator=generator)
        return (normal * 16).round_().clamp_(-128, 127).to(torch.int8)
    make = torch.float32 if dtype in (getattr(torch, name) for name in FP8_DTYPE_NAMES.values()) else dtype
    if pattern == "uniform":
        values = torch.rand(shape, dtype=make, device=device, generator=generator).mul_(2).sub_(1)
    else:
        values = torch.randn(shape, dtype=make, device=device, generator=generator)
    return values.to(dtype)


def _generator(device: torch.device) -> torch.Generator:
    import torch

    return torch.Generator(device=device).manual_seed(0)


def operands(config: Config, device: torch.device, shape: Shape | None = None) -> Operands:
    import torch

    m, n, k = (shape.m, shape.n, shape.k) if shape else (config.m, config.n, config.k)
    generator = _generator(device)
    pattern = config.data_pattern
    if config.precision == "fp8":
        a_type = getattr(torch, FP8_DTYPE_NAMES[config.fp8_format])
        a = _values((m, k), pattern, a_type, device, generator)
        b = _values((n, k), pattern, torch.float8_e4m3fn, device, generator).t()  # column-major [K, N]
        one = torch.ones((), dtype=torch.float32, device=device)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        return _tn(Operands(a, b, out, scale_a=one, scale_b=one.clone(), fast_accum=config.fp8_fast_accum))
    dtype = getattr(torch, DTYPE_NAMES[config.precision])
    a = _values((m, k), pattern, dtype, device, generator)
    if config.precision == "int8":
        b = _values((n, k), pattern, dtype, device, generator).t()  # column-major [K, N]
        return _tn(Operands(a, b, torch.empty(m, n, dtype=torch.int32, device=device)))
    else:
        b = _values((k, n), pattern, dtype, device, generator)
        out = torch.empty(m, n, dtype=dtype, device=device)
    return Operands(a, b, out)


def is_column_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(0) == 1 and t.stride(1) == t.shape[0]


def _tn(ops: Operands) -> Operands:
    """The layout the int8/fp8 kernels need, checked once: a row-major B would be refused or copied (6.6x)."""
    if not (ops.a.is_contiguous() and is_column_major(ops.b)):
        raise AssertionError(f"tensor-core GEMM operands must be A row-major and B column-major; got strides "
                             f"{ops.a.stride()} and {ops.b.stride()}")
    return ops


def multiply(ops: Operands) -> None:
    import torch  # loaded by then (the operands are its tensors): a lookup, not an import, in the timed loop

    if ops.a.dtype == torch.int8:
        torch._int_mm(ops.a, ops.b, out=ops.out)  # int8 x int8 -> int32
    elif ops.scale_a is not None:
        torch._scaled_mm(ops.a, ops.b, scale_a=ops.scale_a, scale_b=ops.scale_b, out_dtype=torch.bfloat16,
                         use_fast_accum=ops.fast_accum, out=ops.out)
    else:
        torch.mm(ops.a, ops.b, out=ops.out)


def _operand_bytes(config: Config, m: int, n: int, k: int) -> int:
    element = ELEMENT_BYTES[config.precision]
    out_element = {"int8": 4, "fp8": 2}.get(config.precision, element)
    return (m * k + k * n) * element + m * n * out_element


def _check_shape(config: Config, m: int, n: int, k: int) -> None:
    if config.precision == "int8" and (m <= 16 or k % 8 or n % 8):
        raise CaseUserError(f"int8 GEMM needs m > 16 and k, n multiples of 8 (torch._int_mm); got {m}x{n}x{k}")
    if config.precision == "fp8" and (m % 16 or n % 16 or k % 16):
        raise CaseUserError(f"fp8 GEMM needs m, n and k multiples of 16 (torch._scaled_mm); got {m}x{n}x{k}")


UNSUPPORTED_WORDS = ("not implemented", "not supported", "only supported", "unsupported")


def refusal(exc: BaseException) -> bool:
    """Whether a backend's error says the device cannot do the operation (rather than a crash)."""
    text = str(exc).lower()
    return isinstance(exc, NotImplementedError) or any(word in text for word in UNSUPPORTED_WORDS)


def _probe(config: Config, device: torch.device) -> None:
    """A tiny multiply first: an operation the backend lacks is 'unsupported', not a crash."""
    try:
        multiply(operands(config, device, Shape(32, 32, 32)))
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:  # e5m2 x e5m2: ValueError
        if not refusal(exc):
            raise
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        what = f"{config.precision} ({config.fp8_format})" if config.precision == "fp8" else config.precision
        raise Unsupported(f"{what} matrix multiply on {device}: {first_line}") from exc


def _time_shape(config: Config, ctx: CaseContext, shape: Shape | None) -> list[Chunk]:
    ops = operands(config, ctx.device, shape)
    return ctx.time(lambda: multiply(ops))


def describe(config: Config, m: int, n: int, k: int) -> str:
    layout = ", B column-major" if config.precision in TENSOR_CORE_INTEGER else ""
    fp8 = f", {config.fp8_format}{' fast accumulate' if config.fp8_fast_accum else ''}" \
        if config.precision == "fp8" else ""
    return f"{m}x{k} @ {k}x{n}{layout}{fp8}, {config.data_pattern} data"


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    ctx.require(config.precision)
    _check_shape(config, config.m, config.n, config.k)
    need = config.memory_need()
    ctx.check_fits(need.bytes, need.what)

    import torch

    # FP32 must not silently use TF32 (or BF16) arithmetic, and TF32 must be allowed to.
    torch.set_float32_matmul_precision("high" if config.precision == "tf32" else "highest")
    _probe(config, ctx.device)
    chunks = _time_shape(config, ctx, None)  # operands freed on return, before any search
    unit = "TOPS" if config.precision == "int8" else "TFLOPS"
    name = f"gemm_{config.precision}"
    metrics = [ctx.rate_metric(name, chunks, gemm_ops(config.m, config.n, config.k), unit, 1e12,
                               peak_key=config.precision, convention=GEMM_CONVENTION,
                               note=describe(config, config.m, config.n, config.k))]
    if config.sweep_budget_s > 0:
        metrics.append(max_achievable(config, ctx, name, unit))
    return metrics


def max_achievable(config: Config, ctx: CaseContext, name: str, unit: str) -> Metric:
    """Search shapes within the budget, then measure the best one as the fixed shape was measured."""
    grid = {a: axis_values(*getattr(config, f"sweep_{a}"), config.sweep_step) for a in AXES}
    per_shape = TimingPlan(warmup_iters=2, min_duration_s=config.sweep_shape_s, min_iters=2)
    began = time.perf_counter()
    fastest_ops_per_s = 0.0  # to skip a shape whose one measurement would overrun the budget

    def rate(shape: Shape) -> float | None:
        nonlocal fastest_ops_per_s
        work = gemm_ops(shape.m, shape.n, shape.k)
        left = config.sweep_budget_s - (time.perf_counter() - began)
        if fastest_ops_per_s and work * (per_shape.warmup_iters + 2) / fastest_ops_per_s > max(left, 0.0):
            return None
        try:
            _check_shape(config, shape.m, shape.n, shape.k)
            ctx.check_fits(_operand_bytes(config, shape.m, shape.n, shape.k), str(shape))
        except CaseUserError:
            return None
        ops = operands(config, ctx.device, shape)
        stats = rate_stats(measure(lambda: multiply(ops), ctx.synchronize, per_shape), work, 1e12)
        fastest_ops_per_s = max(fastest_ops_per_s, stats.value * 1e12)
        return stats.value

    outcome = search(grid, rate, config.sweep_budget_s, start=Shape(config.m, config.n, config.k))
    if outcome.best is None or outcome.best_rate is None:
        raise CaseUserError(f"the shape search measured no shape in {config.sweep_budget_s:g} s: every shape of "
                            "the grid was too big for the memory or the budget (sweep_* keys)")
    best = outcome.best
    chunks = _time_shape(config, ctx, best)
    note = (f"best of {sum(r is not None for _, r in outcome.tried)} shapes searched in {outcome.spent_s:.0f} s: "
            f"{describe(config, best.m, best.n, best.k)}")
    metric = ctx.rate_metric(f"{name}_max", chunks, gemm_ops(best.m, best.n, best.k), unit, 1e12,
                             peak_key=config.precision, convention=GEMM_CONVENTION, note=note)
    return metric.model_copy(update={"search": search_report(config, outcome)})


def search_report(config: Config, outcome: SearchOutcome) -> ShapeSearch:
    assert outcome.best is not None and outcome.best_rate is not None
    return ShapeSearch(
        shape=outcome.best.as_dict(), search_value=outcome.best_rate,
        shapes_tried=sum(r is not None for _, r in outcome.tried), budget_s=config.sweep_budget_s,
        spent_s=outcome.spent_s, stopped=outcome.stopped,
        ranges={a: list(getattr(config, f"sweep_{a}")) for a in AXES}, step=config.sweep_step,
        top=[{**s.as_dict(), "value": r} for s, r in outcome.top() if math.isfinite(r)],
    )
