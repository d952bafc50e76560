"""The operator through torch.compile (TorchInductor by default): one compiled function per operator, so the
points of a round share its compiled code where the shapes allow; a compile happens in the correctness call.

In a graph mode (inductor_mode reduce-overhead or max-autotune, flagperf.measure.inductor_modes) on CUDA the
compiled code replays as a CUDA graph on static input buffers: each call first copies the point's inputs into
them, so its latency (and a memory-bound operator's GB/s) covers those copies and the kernels; the record's
implementation line says so. The inputs are not marked static (torch._dynamo.mark_static_address): a round
replaces a point's inputs after a call that wrote into them, and a graph bound to the old addresses would then
read freed memory or re-record."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from flagperf.measure.inductor_modes import graphs_phrase, uses_cuda_graphs
from flagperf.operation.impls import ImplEnv, OperatorImplementation
from flagperf.operation.operators import Operator

# Every point is a new shape or dtype, so a round recompiles its operators many times: dynamo's default limit
# (8) would silently fall back to eager, and the figure would be native's under this implementation's name.
RECOMPILE_LIMIT = 4096


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True  # never a silent fallback to eager


class Implementation(OperatorImplementation):
    """torch.compile (TorchInductor), static shapes, in the case's inductor_mode"""

    reads_inductor_mode = True

    def __init__(self, env: ImplEnv) -> None:
        super().__init__(env)
        _raise_recompile_limit()
        self.compiled: dict[Callable[..., Any], Callable[..., Any]] = {}

    def prepare(self, op: Operator, dtype: str, native: Callable[..., Any]) -> Callable[..., Any]:
        if native not in self.compiled:
            mode = None if self.env.inductor_mode == "default" else self.env.inductor_mode  # None: torch's default
            self.compiled[native] = torch.compile(native, dynamic=False, fullgraph=True, mode=mode)
        return self.compiled[native]

    def point_done(self) -> None:
        """A graph mode's CUDA graph trees hold each point's graphs and their memory pool until reset: without it the
        pool grows point by point (shapes never recur in a round). Where torch has no such reset, nothing."""
        if not uses_cuda_graphs(self.env.inductor_mode, self.env.device.type):
            return
        try:
            trees = importlib.import_module("torch._inductor.cudagraph_trees")
        except ImportError:
            return
        reset = getattr(trees, "reset_cudagraph_trees", None)
        if reset is not None:
            reset()

    def describe(self) -> str:
        return (f"torch.compile (TorchInductor, static shapes, fullgraph, mode {self.env.inductor_mode}"
                f"{graphs_phrase(self.env.inductor_mode, self.env.device.type)}), torch {torch.__version__}")
