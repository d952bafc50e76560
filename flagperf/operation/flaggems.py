"""FlagGems (the Triton operator library of FlagOS, `flag-gems` on PyPI): torch's aten operators served by
FlagGems' kernels under ``flag_gems.use_gems()``, and FlagGems' own functions for the operators torch reaches
through kernels it does not dispatch (attention, the fused loss, rotary embedding).

A point whose native call dispatches no aten operator FlagGems registers is skipped with that reason: its
figure would be torch's under FlagGems' name.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

from flagperf.operation.impls import ImplEnv, OperatorImplementation
from flagperf.operation.operators import Operator


def _flag_gems() -> Any:
    """FlagGems, imported where it is used: the module loads (and is checked) on hosts without it, and the engine
    folder's `requires` names the package to install when it is missing."""
    return importlib.import_module("flag_gems")

# Operators FlagGems has a function of its own for, called directly (with the native call's arguments).
DIRECT = {
    "scaled_dot_product_attention": ("flag_gems.ops", "scaled_dot_product_attention",
                                     lambda fn: lambda q, k, v: fn(q, k, v, is_causal=True)),
    "cross_entropy": ("flag_gems.fused", "cross_entropy_loss", lambda fn: fn),
    "rotary": ("flag_gems.fused", "apply_rotary_pos_emb", lambda fn: fn),
}


def registered_names() -> set[str] | None:
    """The aten operator names (``mm``, ``add.Tensor``) FlagGems registers, or None where this version does
    not list them where we look."""
    config = getattr(_flag_gems(), "_FULL_CONFIG", None)
    if not config:
        return None
    return {str(item[0]) for item in config if item}


class Implementation(OperatorImplementation):
    """FlagGems (Triton kernels) under flag_gems.use_gems()"""

    def __init__(self, env: ImplEnv) -> None:
        super().__init__(env)
        self.registered = registered_names()

    def unavailable(self, op: Operator, dtype: str, aten_ops: list[str]) -> str | None:
        if op.name in DIRECT:
            return None
        if self.registered is None or not aten_ops:  # not listed where we look: nothing to check against
            return None
        if not set(aten_ops) & self.registered:
            return f"FlagGems {_flag_gems().__version__} registers none of {', '.join(aten_ops)} ({op.name}, {dtype})"
        return None

    def prepare(self, op: Operator, dtype: str, native: Callable[..., Any]) -> Callable[..., Any]:
        if op.name in DIRECT:
            module, attr, adapt = DIRECT[op.name]
            return adapt(getattr(importlib.import_module(module), attr))
        return native

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with _flag_gems().use_gems():
            yield

    def describe(self) -> str:
        version = getattr(_flag_gems(), "__version__", "?")
        return f"FlagGems {version} (flag_gems.use_gems(); direct: {', '.join(DIRECT)})"
