"""Dense matrix multiply C = A @ B at one precision (FlagPerf's computation-<PRECISION> cases)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from flagperf.errors import CaseUserError, Unsupported
from flagperf.measure.casekit import CaseContext, TimedCaseConfig
from flagperf.results.metrics import GEMM_CONVENTION, gemm_ops
from flagperf.results.schema import Metric

Precision = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "int8"]
DTYPES: dict[str, torch.dtype] = {
    "fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
    "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8,
}


class Config(TimedCaseConfig):
    precision: Precision
    m: int = Field(gt=0, le=65536)
    n: int = Field(gt=0, le=65536)
    k: int = Field(gt=0, le=65536)


def _operands(config: Config, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = DTYPES[config.precision]
    generator = torch.Generator(device="cpu").manual_seed(0)
    if dtype == torch.int8:
        a = torch.randint(-8, 8, (config.m, config.k), dtype=torch.int8, generator=generator)
        b = torch.randint(-8, 8, (config.k, config.n), dtype=torch.int8, generator=generator)
        out = torch.empty(config.m, config.n, dtype=torch.int32)
    else:
        a = torch.randn(config.m, config.k, dtype=dtype, generator=generator)
        b = torch.randn(config.k, config.n, dtype=dtype, generator=generator)
        out = torch.empty(config.m, config.n, dtype=dtype)
    return a.to(device), b.to(device), out.to(device)


def _multiply(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    if a.dtype == torch.int8:
        torch._int_mm(a, b, out=out)  # int8 x int8 -> int32, the tensor-core path on GPUs
    else:
        torch.mm(a, b, out=out)


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    ctx.require(config.precision)
    if config.precision == "int8" and (config.m <= 16 or config.k % 8 or config.n % 8):
        raise CaseUserError("int8 GEMM needs m > 16 and k, n multiples of 8 (torch._int_mm)")
    element = torch.empty((), dtype=DTYPES[config.precision]).element_size()
    out_element = 4 if config.precision == "int8" else element
    need = (config.m * config.k + config.k * config.n) * element + config.m * config.n * out_element
    ctx.check_fits(need, f"m={config.m}, n={config.n}, k={config.k}")

    # FP32 must not silently use TF32 (or BF16) arithmetic, and TF32 must be allowed to.
    torch.set_float32_matmul_precision("high" if config.precision == "tf32" else "highest")
    try:  # a tiny probe first: an operation the backend lacks is 'unsupported', not a crash
        probe = _operands(Config.model_validate({**config.model_dump(), "m": 32, "n": 32, "k": 32}), ctx.device)
        _multiply(*probe)
    except (RuntimeError, NotImplementedError) as exc:
        if "not implemented" in str(exc).lower() or isinstance(exc, NotImplementedError):
            first_line = str(exc).splitlines()[0]
            raise Unsupported(f"{config.precision} matrix multiply on {ctx.device}: {first_line}") from exc
        raise
    a, b, out = _operands(config, ctx.device)
    chunks = ctx.time(lambda: _multiply(a, b, out))
    unit = "TOPS" if config.precision == "int8" else "TFLOPS"
    return [ctx.rate_metric(
        f"gemm_{config.precision}", chunks, gemm_ops(config.m, config.n, config.k), unit, 1e12,
        peak_key=config.precision, convention=GEMM_CONVENTION,
        note=f"{config.m}x{config.k} @ {config.k}x{config.n}",
    )]
