"""The arithmetic torch uses for fp32 matrix products, pinned to IEEE fp32 for an operation round.

torch lets a process (an environment, a library's import, an implementation's prepare) switch fp32 matrix products
to TF32 or bf16 arithmetic with one global setting (``torch.set_float32_matmul_precision``, ``allow_tf32``, since
torch 2.9 ``torch.backends.<backend>.matmul.fp32_precision``). Left as found, a native fp32 GEMM run in TF32 fails
its fp32 tolerance as a "wrong result", a device reference in float32 is computed in TF32, and an implementation
that switches it makes every later point's native call run in it too. So a round pins it to IEEE ("highest"),
checks that every backend's products then resolve to IEEE (a process-wide ``torch.backends.fp32_precision`` may
still reach a backend the pin left deferring to it), says so in its record, fails an implementation that changes it
(restoring it for the points after) and gives the process its setting back at the end."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from flagperf.errors import CaseUserError

log = logging.getLogger(__name__)
IEEE = "highest"  # torch.set_float32_matmul_precision's name for IEEE fp32 products
LEGACY = "float32_matmul_precision"  # torch's one global setting, the name it has in a state
LEGACY_VALUES = ("highest", "high", "medium")
# a per-backend fp32_precision that defers to the setting above it (the backend's own, then torch.backends'):
# "none" since torch 2.9, "default" in some versions
DEFERS = ("none", "default")
IEEE_VALUES = ("ieee", "highest")
MIXED = "mixed"  # a setting torch refuses to read: the global one and a per-backend one were set apart and disagree
# "1" starts torch with TF32 cuBLAS products (NVIDIA's NGC PyTorch images are reported to set it). Since torch 2.0
# (pytorch#85859) it is the setting's initial value only, which the round's pin replaces like any other; torch reads
# it with check_env, which takes "1" and "0" alone (anything else: a warning, and not set)
CUBLAS_TF32_OVERRIDE = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def _backends() -> dict[str, Any]:
    """The backends whose matrix products have their own fp32_precision (torch 2.9 and later), by name."""
    found: dict[str, Any] = {}
    for name in ("cuda", "mkldnn"):
        matmul = getattr(getattr(torch.backends, name, None), "matmul", None)
        if matmul is not None and hasattr(matmul, "fp32_precision"):
            found[name] = matmul
    return found


def _read(getter: Callable[[], Any]) -> str:
    """A setting as text, MIXED where torch refuses the read (the legacy and the per-backend settings disagree)."""
    try:
        return str(getter())
    except RuntimeError:
        return MIXED


def matmul_arithmetic() -> dict[str, str]:
    """The fp32 matrix-product setting per backend and torch's global one (``{"cuda": "ieee", "mkldnn": "ieee",
    "float32_matmul_precision": "highest"}``; MIXED for one torch will not read). Since torch 2.9 it keeps both: the
    legacy global setting (set_float32_matmul_precision, cuda's allow_tf32) and the per-backend fp32_precision; a
    per-backend write leaves the global one as it was, and reads raise where the two disagree."""
    state = {name: str(matmul.fp32_precision) for name, matmul in _backends().items()}
    state[LEGACY] = _read(torch.get_float32_matmul_precision)
    return state


def _observed() -> tuple[dict[str, str], str]:
    """What can be read of the setting: matmul_arithmetic and cuBLAS's allow_tf32 (readable on a CPU build too),
    which tells a legacy setting matmul_arithmetic reads as MIXED apart."""
    return matmul_arithmetic(), _read(lambda: torch.backends.cuda.matmul.allow_tf32)


def resolve(chain: list[str]) -> str:
    """The setting a backend's products run in: the first of its chain (its matmul's fp32_precision, its own, then
    torch.backends') that does not defer; "none" where all do (torch's default, the legacy global setting's)."""
    return next((value for value in chain if value not in DEFERS), "none")


def _chains() -> dict[str, list[str]]:
    """Each backend's chain of fp32_precision settings, its matmul's first (resolve)."""
    generic = str(getattr(torch.backends, "fp32_precision", "none"))
    return {name: [str(matmul.fp32_precision), str(getattr(getattr(torch.backends, name), "fp32_precision", "none")),
                   generic] for name, matmul in _backends().items()}


def not_ieee(chains: dict[str, list[str]], legacy: str) -> dict[str, str]:
    """The backends whose products do not resolve to IEEE, with what they resolve to (``legacy``: the global
    setting, which a chain deferring throughout runs in)."""
    found = {name: resolve(chain) for name, chain in chains.items()}
    found = {name: legacy if value in DEFERS else value for name, value in found.items()}
    return {name: value for name, value in found.items() if value not in IEEE_VALUES}


def _set_backends(state: dict[str, str]) -> None:
    for name, matmul in _backends().items():
        if name in state and str(matmul.fp32_precision) != state[name]:
            matmul.fp32_precision = state[name]


def set_arithmetic(state: dict[str, str], observed: tuple[dict[str, str], str] | None = None) -> str | None:
    """Put back a setting matmul_arithmetic read (``observed``: _observed's reading with it, which a MIXED global
    setting is found again by): the global setting first, which writes the per-backend ones too, then a per-backend
    one set apart from it. A global one read as MIXED is the one of LEGACY_VALUES that reads back as observed; where
    none does, the setting is left at IEEE (never at the last one tried), and a line saying so is returned."""
    legacy = state.get(LEGACY, MIXED)
    for candidate in (legacy,) if legacy != MIXED else LEGACY_VALUES:
        torch.set_float32_matmul_precision(candidate)
        _set_backends(state)
        if observed is None or _observed() == observed:
            return None
    torch.set_float32_matmul_precision(IEEE)  # a known, readable setting, not a mix that reads as none found
    return (f"the process's setting ({describe(state)}) could not be given back as found: no global setting reads "
            f"back as it did, so it was left at '{IEEE}' (IEEE fp32) throughout")


def describe(state: dict[str, str]) -> str:
    return ", ".join(f"{name} {value}" for name, value in state.items())


def cublas_override(environ: Mapping[str, str] | None = None) -> bool:
    """The environment started torch with TF32 cuBLAS products (CUBLAS_TF32_OVERRIDE "1", the one value torch
    takes as set)."""
    return (os.environ if environ is None else environ).get(CUBLAS_TF32_OVERRIDE) == "1"


class PinnedArithmetic:
    """IEEE fp32 matrix products for the round (``pinned``), the process's own setting given back by ``restore``."""

    def __init__(self) -> None:
        self.before_observed = _observed()
        self.before = self.before_observed[0]
        self.not_restored: str | None = None
        torch.set_float32_matmul_precision(IEEE)  # the global setting and every backend's: none left to disagree
        self.pinned = matmul_arithmetic()
        chains = _chains()
        unpinned = not_ieee(chains, _read(torch.get_float32_matmul_precision))
        if unpinned:
            self.restore()
            raise CaseUserError(
                f"fp32 matrix products are not IEEE fp32 after set_float32_matmul_precision('{IEEE}'): "
                + ", ".join(f"{name} runs in {value} ({name}.matmul, {name}, torch.backends fp32_precision: "
                            f"{' / '.join(chains[name])})" for name, value in unpinned.items())
                + "; leave torch.backends.fp32_precision unset (or 'ieee') in the environment the round runs in")

    def changed(self) -> str | None:
        """What the setting was changed to since it was pinned (put back to IEEE), or None."""
        now = matmul_arithmetic()
        if now == self.pinned:
            return None
        torch.set_float32_matmul_precision(IEEE)
        return describe(now)

    def statement(self) -> str:
        """The round's record of it."""
        text = (f"fp32 matrix products in IEEE fp32: torch's fp32 matmul precision pinned to '{IEEE}' for the round "
                f"({describe(self.pinned)}; the process had {describe(self.before)}), an implementation that changes "
                "it fails its point")
        return text + self.started_by + (f"; {self.not_restored}" if self.not_restored else "")

    @property
    def started_by(self) -> str:
        """Why the process had TF32 products at start, where the environment says: "" where not."""
        if not cublas_override():
            return ""
        return (f"; {CUBLAS_TF32_OVERRIDE}=1 in the environment started it in TF32 (torch's initial setting only, "
                "pinned like any other)")

    def restore(self) -> None:
        """Gives the process its setting back; where it cannot be found again, the statement (taken after) and the
        log say so."""
        self.not_restored = set_arithmetic(self.before, self.before_observed)
        if self.not_restored:
            log.warning("fp32 matrix products: %s", self.not_restored)


@contextmanager
def ieee_matmuls() -> Iterator[PinnedArithmetic]:
    pinned = PinnedArithmetic()
    try:
        yield pinned
    finally:
        pinned.restore()
