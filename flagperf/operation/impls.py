"""Operator implementations as plug-in folders: vendor_images/<vendor>/operation/<name>/engine.yaml, the keys of
every engine.yaml (flagperf.config.engines): ``module:`` a shared implementation under flagperf.operation, or
``file:`` a module in the folder; either defines ``Implementation``, a subclass of ``OperatorImplementation``.
``requires:`` names the packages it imports (a host without them skips its points, saying which).

The contract, per point (operator x dtype x shape): ``prepare`` returns the callable that computes the operator
from the native call's inputs (untimed: a compile happens on its first call, in the correctness check);
``scope`` is entered around every call of it (a library that patches torch's operators does it there, and
not around the reference or the comparison). The callable returns what the native call returns.

Adding a vendor's library is adding a folder; nothing in the core names one.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from flagperf.config.engines import EngineDef, engine_folders, import_engine, load_engine_manifest
from flagperf.operation.manifest import IMPLEMENTATIONS_FOLDER, ImplementationManifest
from flagperf.operation.operators import Operator

BASELINE = "native"  # speed-ups are against this implementation


@dataclass(frozen=True)
class ImplEnv:
    device: torch.device
    log: logging.Logger
    inductor_mode: str = "default"  # the case's inductor_mode: torch.compile's mode, for the one that compiles


class OperatorImplementation(ABC):
    # Whether it reads the case's inductor_mode (ImplEnv.inductor_mode): a mode other than default with no loaded
    # implementation that reads it would change nothing, and is refused (driver.load_implementations).
    reads_inductor_mode: ClassVar[bool] = False

    def __init__(self, env: ImplEnv) -> None:
        self.env = env

    def unavailable(self, op: Operator, dtype: str, aten_ops: list[str]) -> str | None:
        """Why this implementation has no form of ``op`` in ``dtype`` (the point is skipped, saying so);
        ``aten_ops`` are the aten operators the native call dispatches (``mm``, ``add.Tensor``)."""
        return None

    @abstractmethod
    def prepare(self, op: Operator, dtype: str, native: Callable[..., Any]) -> Callable[..., Any]:
        """The callable computing ``op`` from ``native``'s inputs."""

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Entered around the point's calls (correctness call, warm-up, timed iterations)."""
        yield

    def point_done(self) -> None:
        """Called once a point's calls are all made and its inputs and outputs released: state kept per point (a
        compiled function's CUDA graphs) can go, so that a round's memory does not grow point by point."""
        return None

    def describe(self) -> str:
        """A line for the report: what this implementation is, with its library's version."""
        return type(self).__doc__.strip().splitlines()[0] if type(self).__doc__ else type(self).__name__


@dataclass(frozen=True)
class ImplementationDef(EngineDef):
    manifest: ImplementationManifest

    def implementation_class(self) -> type[OperatorImplementation]:
        """Import it; a missing library is one line naming the package to install."""
        return import_engine(self.manifest, self.folder, OperatorImplementation, "operation",
                             attribute="Implementation")


def load_implementation(vendor: str, name: str, source: str = "implementations") -> ImplementationDef:
    manifest, folder = load_engine_manifest(vendor, name, IMPLEMENTATIONS_FOLDER, ImplementationManifest, source,
                                            "implementations")
    return ImplementationDef(manifest=manifest, folder=folder)


def vendor_implementations(vendor: str) -> list[str]:
    """The vendor's implementation folders, native first."""
    names = sorted(engine_folders(vendor, IMPLEMENTATIONS_FOLDER))
    return sorted(names, key=lambda n: n != BASELINE)
