"""FlagGems (the Triton operator library of FlagOS, `flag-gems` on PyPI): torch's aten operators served by
FlagGems' kernels under ``flag_gems.use_gems()``, and FlagGems' own functions for the operators torch reaches
through kernels it does not dispatch (attention, the fused loss, rotary embedding).

A point whose native call dispatches no aten operator FlagGems registers is skipped with that reason: its
figure would be torch's under FlagGems' name.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flagperf.operation.impls import ImplEnv, OperatorImplementation
from flagperf.operation.natives import CROSS_ENTROPY_KWARGS
from flagperf.operation.operators import Operator


def _flag_gems() -> Any:
    """FlagGems, imported where it is used: the module loads (and is checked) on hosts without it, and the engine
    folder's `requires` names the package to install when it is missing."""
    return importlib.import_module("flag_gems")

def _takes(fn: Callable[..., Any], names: Iterable[str]) -> bool:
    """Whether ``fn`` accepts these keyword arguments (by name, or through **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass nothing it may refuse
        return False
    return any(p.kind is p.VAR_KEYWORD for p in params.values()) or all(n in params for n in names)


def _cross_entropy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FlagGems' loss with the native call's options (reduction, ignore_index, label_smoothing: each given, not left
    to FlagGems' defaults), where its signature takes them: the same mean over the targets not ignored as the native
    call and the host's reference."""
    if not _takes(fn, CROSS_ENTROPY_KWARGS):
        return fn
    return lambda logits, target: fn(logits, target, **CROSS_ENTROPY_KWARGS)


# Operators FlagGems has a function of its own for, called directly (with the native call's arguments).
DIRECT = {
    "scaled_dot_product_attention": ("flag_gems.ops", "scaled_dot_product_attention",
                                     lambda fn: lambda q, k, v: fn(q, k, v, is_causal=True)),
    "cross_entropy": ("flag_gems.fused", "cross_entropy_loss", _cross_entropy),
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
