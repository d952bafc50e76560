"""The arithmetic torch uses for fp32 matrix products, pinned to IEEE fp32 for an operation round.

torch lets a process (an environment, a library's import, an implementation's prepare) switch fp32 matrix products
to TF32 or bf16 arithmetic with one global setting (``torch.set_float32_matmul_precision``, ``allow_tf32``, since
torch 2.9 ``torch.backends.<backend>.matmul.fp32_precision``). Left as found, a native fp32 GEMM run in TF32 fails
its fp32 tolerance as a "wrong result", a device reference in float32 is computed in TF32, and an implementation
that switches it makes every later point's native call run in it too. So a round pins it to IEEE ("highest"),
says so in its record, fails an implementation that changes it (restoring it for the points after) and gives the
process its setting back at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

IEEE = "highest"  # torch.set_float32_matmul_precision's name for IEEE fp32 products
# cuBLAS reads this once at start: TF32 whatever the Python setting says (c10's allow_tf32 override)
CUBLAS_TF32_OVERRIDE = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def _backends() -> dict[str, Any]:
    """The backends whose matrix products have their own fp32_precision (torch 2.9 and later), by name."""
    found: dict[str, Any] = {}
    for name in ("cuda", "mkldnn"):
        matmul = getattr(getattr(torch.backends, name, None), "matmul", None)
        if matmul is not None and hasattr(matmul, "fp32_precision"):
            found[name] = matmul
    return found


def matmul_arithmetic() -> dict[str, str]:
    """The fp32 matrix-product setting per backend (``{"cuda": "ieee", "mkldnn": "ieee"}``), or torch's one global
    setting where this torch has no per-backend one (``{"float32_matmul_precision": "highest"}``)."""
    backends = _backends()
    if backends:
        return {name: str(matmul.fp32_precision) for name, matmul in backends.items()}
    return {"float32_matmul_precision": torch.get_float32_matmul_precision()}


def set_arithmetic(state: dict[str, str]) -> None:
    """Put back a setting matmul_arithmetic read."""
    backends = _backends()
    for name, value in state.items():
        if name in backends:
            backends[name].fp32_precision = value
        else:
            torch.set_float32_matmul_precision(value)


def describe(state: dict[str, str]) -> str:
    return ", ".join(f"{name} {value}" for name, value in state.items())


def cublas_override() -> bool:
    """The environment forces TF32 on cuBLAS's fp32 products whatever the setting (read by torch at start)."""
    return os.environ.get(CUBLAS_TF32_OVERRIDE, "").strip().lower() in ("1", "true", "yes", "on")


class PinnedArithmetic:
    """IEEE fp32 matrix products for the round (``pinned``), the process's own setting given back by ``restore``."""

    def __init__(self) -> None:
        self.before = matmul_arithmetic()
        torch.set_float32_matmul_precision(IEEE)
        self.pinned = matmul_arithmetic()

    def changed(self) -> str | None:
        """What the setting was changed to since it was pinned (put back to IEEE), or None."""
        now = matmul_arithmetic()
        if now == self.pinned:
            return None
        set_arithmetic(self.pinned)
        return describe(now)

    def statement(self) -> str:
        """The round's record of it."""
        text = (f"fp32 matrix products in IEEE fp32: torch's fp32 matmul precision pinned to '{IEEE}' for the round "
                f"({describe(self.pinned)}; the process had {describe(self.before)}), an implementation that changes "
                "it fails its point")
        if cublas_override():
            text += (f"; {CUBLAS_TF32_OVERRIDE} is set in the environment, so cuBLAS computes fp32 products in TF32 "
                     "whatever this setting: fp32 GEMM points fail their fp32 tolerance")
        return text

    def restore(self) -> None:
        set_arithmetic(self.before)


@contextmanager
def ieee_matmuls() -> Iterator[PinnedArithmetic]:
    pinned = PinnedArithmetic()
    try:
        yield pinned
    finally:
        pinned.restore()
