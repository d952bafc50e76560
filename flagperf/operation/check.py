"""Correctness before speed: an implementation's output against the operator computed in higher precision on the
same (rounded) inputs. An element passes when |out - ref| <= atol + rtol * |ref| (numpy's allclose), with the
dtype's rtol and an atol scaled for the shape (flagperf.operation.operators: Operator.error_scale); NaN or
infinity where the reference has a finite value fails, as does a wrong shape."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

REFERENCE_CPU = torch.device("cpu")

# The gap between a dtype's smallest (subnormal) numbers: an output rounded there is off by up to half of it
# whatever the kernel, so a scaled atol below it (fp16 softmax over rows of 32k and more) is raised to it.
# fp8 points output bf16.
SUBNORMAL_SPACING = {"fp32": 2.0**-149, "fp16": 2.0**-24, "bf16": 2.0**-133, "fp8": 2.0**-133}


def point_atol(atol: float, scale: float, dtype: str) -> float:
    """The dtype's atol for one point: scaled by the typical size of an output element (Operator.error_scale),
    not below the output dtype's subnormal spacing; 0 stays 0 (an exact match asked for)."""
    return max(atol * scale, SUBNORMAL_SPACING[dtype]) if atol > 0 else 0.0


@dataclass(frozen=True)
class Reference:
    outputs: list[torch.Tensor]
    description: str  # "float64 on cpu"


@dataclass(frozen=True)
class Verdict:
    error: str | None  # None: correct
    max_abs_error: float | None
    max_rel_error: float | None


def as_list(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in output):
        return list(output)
    raise TypeError(f"returned {type(output).__name__}, not a tensor or a tuple of tensors")


def reference_dtype(point_dtype: str, on_cpu: bool, device_has_fp64: bool) -> torch.dtype:
    """float64 on the host CPU for small points; on the device float64 for fp32 points where it has fp64,
    float32 otherwise."""
    if on_cpu or (point_dtype == "fp32" and device_has_fp64):
        return torch.float64
    return torch.float32


def compute_reference(fn: Callable[..., Any], inputs: Sequence[Any], dtype: torch.dtype, device: torch.device
                      ) -> Reference:
    """``fn`` on the inputs with every floating tensor upcast to ``dtype``, on ``device``."""
    upcast = [t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in inputs]
    with torch.no_grad():
        outputs = [o.detach() for o in as_list(fn(*upcast))]
    name = str(dtype).removeprefix("torch.")
    return Reference(outputs=outputs, description=f"{name} on {device.type}")


Locate = Callable[[int, tuple[int, ...]], list[int]]  # (output number, index in what was compared) -> index


def compare(output: Any, reference: Reference, rtol: float, atol: float, locate: Locate | None = None) -> Verdict:
    """``locate``: where an index of the compared tensors lies in the operator's output (a sample of it is
    compared), so that the worst element is named where it is."""
    try:
        outputs = as_list(output)
    except TypeError as exc:
        return Verdict(f"wrong result: {exc}", None, None)
    if len(outputs) != len(reference.outputs):
        return Verdict(f"wrong result: {len(outputs)} outputs, the reference has {len(reference.outputs)}", None, None)
    worst_abs = worst_rel = 0.0
    for i, (out, ref) in enumerate(zip(outputs, reference.outputs, strict=True)):
        which = f"output {i}: " if len(outputs) > 1 else ""
        if tuple(out.shape) != tuple(ref.shape):
            return Verdict(f"wrong result: {which}shape {tuple(out.shape)}, expected {tuple(ref.shape)}", None, None)
        got = out.detach().to(device=ref.device, dtype=ref.dtype)
        finite = torch.isfinite(ref)
        nonfinite = (~torch.isfinite(got)) & finite
        diff = (got - ref).abs()
        diff = torch.where(finite, diff, torch.zeros_like(diff))
        allowed = atol + rtol * ref.abs()
        bad = (diff > allowed) | nonfinite
        abs_err = float(diff.max()) if diff.numel() else 0.0
        rel_err = float((diff / ref.abs().clamp_min(atol or 1e-30)).max()) if diff.numel() else 0.0
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        count = int(bad.sum())
        if count:
            flat = int(torch.argmax((diff - allowed).masked_fill(nonfinite, float("inf")).flatten()))
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(ref.shape)))
            where = locate(i, index) if locate is not None else list(index)
            return Verdict(
                f"wrong result: {which}{count} of {ref.numel()} elements outside |out - ref| <= atol + rtol*|ref| "
                f"(rtol {rtol:.3g}, atol {atol:.3g}); worst at {where}: got {float(got.flatten()[flat]):.9g}, "
                f"expected {float(ref.flatten()[flat]):.9g} (|out - ref| {float(diff.flatten()[flat]):.3g}, "
                f"allowed {float(allowed.flatten()[flat]):.3g}; reference {reference.description})",
                worst_abs, worst_rel)
    return Verdict(None, worst_abs, worst_rel)
