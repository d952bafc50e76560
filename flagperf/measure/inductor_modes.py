"""torch.compile's modes as the project names them: one key (``inductor_mode``) and one value set for every family
that compiles with TorchInductor (inference's inductor engine, operation's compile implementation)."""

from __future__ import annotations

from typing import Literal, get_args

InductorMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
INDUCTOR_MODES: tuple[str, ...] = get_args(InductorMode)  # the same values, to list or iterate
# The modes whose compiled function runs as a CUDA graph where the device is CUDA (torch._inductor.list_mode_options:
# triton.cudagraphs). A graph replays on static input buffers: each call first copies its inputs into them, so a
# timed call includes those copies.
CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")
INDUCTOR_MODE_HELP = ("torch.compile's mode: default, reduce-overhead (CUDA graphs), max-autotune (kernel search + "
                      "CUDA graphs), max-autotune-no-cudagraphs (kernel search alone)")
# Inductor's CUDA graphs (cudagraph trees) are for this device type alone: elsewhere a graph mode compiles without
# them (a fact of torch._inductor, not a choice of the project's).
CUDA_GRAPH_DEVICE_TYPE = "cuda"


def uses_cuda_graphs(mode: str, device_type: str) -> bool:
    """Whether torch.compile in ``mode`` runs its compiled code as CUDA graphs on a device of ``device_type``."""
    return mode in CUDA_GRAPH_MODES and device_type == CUDA_GRAPH_DEVICE_TYPE


def graphs_phrase(mode: str, device_type: str) -> str:
    """What a graph mode does on this device, to follow the mode's name in a record line ("" for a mode without
    graphs)."""
    if mode not in CUDA_GRAPH_MODES:
        return ""
    if uses_cuda_graphs(mode, device_type):
        return ("; CUDA graphs: each call first copies its inputs into the graph's static buffers, so a timed call "
                "includes those copies")
    return f" (no CUDA graphs on {device_type})"
