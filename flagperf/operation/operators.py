"""The operators an operation case can measure: for each, its dimensions, how a model's shape gives them, its
inputs, the native torch call (the baseline every implementation is held against), and the counting formulas
(FLOPs for compute-bound operators, bytes for all: each input read once, each output written once).

The native functions (flagperf.operation.natives, named here) are module-level, one per operator, so that
torch.compile's caches (keyed on the code object) are shared across the points of a round. This table loads no
torch: a case's config is checked with it (`flagperf validate`, a run refused) without loading torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is loaded where a point runs (flagperf.operation.natives), not where a config is checked
    import torch

Dims = dict[str, int]
Inputs = list[Any]  # tensors, in the order the native function takes them

FP8 = "fp8"
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, FP8: 1}
INDEX_BYTES = 8  # int64 indices and targets
FLOATING = ("fp32", "fp16", "bf16")
MAX_DIM = 2**31 - 1  # one dimension of a shape; the memory a shape needs is checked against the hosts


def fp8_dtype() -> torch.dtype | None:
    """torch's e4m3 float8 type, or None where this torch has none (before 2.1)."""
    import torch

    return getattr(torch, "float8_e4m3fn", None)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a transformer that the operators' shapes are taken from."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Operator:
    name: str
    group: str
    dims: tuple[str, ...]
    bound: Literal["compute", "memory"]
    bytes_formula: str
    count_bytes: Callable[[Dims, int], int]  # (dims, element bytes) -> bytes of one call
    from_model: Callable[[ModelShape, int, int], Dims]  # (model, batch, seq) -> dims
    make_inputs: Callable[[Dims, torch.dtype, torch.device, torch.Generator], Inputs]
    native_name: str  # its native call, in flagperf.operation.natives
    flops_formula: str | None = None
    count_flops: Callable[[Dims], int] | None = None
    # The typical size of an output element (the inputs are standard normal), which scales the dtype's atol: an
    # element's rounding and summation errors grow with it. sqrt(K) for a sum of K products, 1/C for softmax's
    # probabilities (a row sums to 1), 1/sqrt(C) for a mean; 1 where outputs are about 1 (norms, activations).
    # An atol of 1 where outputs are 1/C would pass a softmax returning zeros.
    error_scale: Callable[[Dims], float] = field(default=lambda d: 1.0)
    dtypes: tuple[str, ...] = FLOATING
    description: str = ""
    # Bytes of its inputs and output as allocated, where the call is given more than it touches (embedding's
    # whole table, index_select's and gather's whole source, rotary's cos and sin tables); None: the bytes it
    # counts (count_bytes: an indexed read counts a row per index read, docs/operation.md).
    count_allocated: Callable[[Dims, int], int] | None = None

    def allocated_bytes(self, dims: Dims, element_bytes: int) -> int:
        """The inputs and output of one call as allocated: what a point needs in memory at least."""
        return (self.count_allocated or self.count_bytes)(dims, element_bytes)

    @property
    def native(self) -> Callable[..., Any]:
        """The native torch call (imported here: the table is read where torch is not loaded)."""
        from flagperf.operation import natives

        return getattr(natives, self.native_name)

    def formula(self) -> str:
        flops = f"FLOPs = {self.flops_formula}; " if self.flops_formula else "FLOPs not counted (memory-bound); "
        return f"{flops}bytes = {self.bytes_formula}"

    def check_dims(self, dims: dict[str, Any]) -> str | None:
        """Why ``dims`` is not a shape of this operator, or None."""
        missing = [d for d in self.dims if d not in dims]
        extra = [d for d in dims if d not in self.dims]
        if missing or extra:
            what = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(extra)}"
            return f"{what} (the dimensions of {self.name} are {', '.join(self.dims)})"
        bad = [d for d in self.dims if type(dims[d]) is not int or not 1 <= dims[d] <= MAX_DIM]
        if bad:
            return f"{bad[0]} must be a whole number from 1 to {MAX_DIM} (got {dims[bad[0]]!r})"
        return self.extra_check(dims)

    def extra_check(self, dims: Dims) -> str | None:
        if self.name == "rotary" and dims["D"] % 2:
            return "D (the head dimension) must be even: rotary pairs its halves"
        return None


def _randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    import torch

    return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _randint(high: int, shape: Sequence[int], device: torch.device, gen: torch.Generator) -> torch.Tensor:
    import torch

    return torch.randint(0, high, tuple(shape), generator=gen, device=device, dtype=torch.int64)


# ---- the table ----------------------------------------------------------------------------------------------


def _gemm_inputs(dims: Dims, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> Inputs:
    return [_randn((dims["M"], dims["K"]), dtype, device, gen), _randn((dims["K"], dims["N"]), dtype, device, gen)]


def _rows(dims: Dims, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> Inputs:
    return [_randn((dims["R"], dims["C"]), dtype, device, gen)]


def _two_rows(dims: Dims, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> Inputs:
    return [_randn((dims["R"], dims["C"]), dtype, device, gen), _randn((dims["R"], dims["C"]), dtype, device, gen)]


def _tokens(model: ModelShape, b: int, s: int, cols: int) -> Dims:
    return {"R": b * s, "C": cols}


def _rotary_inputs(dims: Dims, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> Inputs:
    import torch

    t, d, seq = dims["T"], dims["D"], dims["S"]
    positions = torch.arange(t, device=device, dtype=torch.int64) % seq
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32),
                         1.0 / 10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    return [_randn((t, dims["H"], d), dtype, device, gen), _randn((t, dims["KVH"], d), dtype, device, gen),
            angles.cos().to(dtype), angles.sin().to(dtype), positions]


GEMM_FLOPS = "2*M*N*K (a multiply-add is 2)"


def _sqrt(key: str) -> Callable[[Dims], float]:
    return lambda d: math.sqrt(d[key])


def _inverse(key: str) -> Callable[[Dims], float]:
    return lambda d: 1.0 / d[key]


def _inverse_sqrt(key: str) -> Callable[[Dims], float]:
    return lambda d: 1.0 / math.sqrt(d[key])


OPERATORS: dict[str, Operator] = {op.name: op for op in (
    Operator(
        "mm", "gemm", ("M", "N", "K"), "compute",
        "e*(M*K + K*N) + e_out*M*N (fp8: e 1, e_out 2 (bf16 out), + 8 for the two fp32 scales)",
        lambda d, e: e * (d["M"] * d["K"] + d["K"] * d["N"]) + (2 if e == 1 else e) * d["M"] * d["N"]
        + (2 * 4 if e == 1 else 0),
        lambda m, b, s: {"M": b * s, "N": m.intermediate, "K": m.hidden}, _gemm_inputs, "native_mm",
        GEMM_FLOPS, lambda d: 2 * d["M"] * d["N"] * d["K"], _sqrt("K"), (*FLOATING, FP8),
        "the MLP's up projection: (tokens x hidden) @ (hidden x intermediate); fp8 through torch._scaled_mm"),
    Operator(
        "bmm", "gemm", ("B", "M", "N", "K"), "compute", "e*B*(M*K + K*N + M*N)",
        lambda d, e: e * d["B"] * (d["M"] * d["K"] + d["K"] * d["N"] + d["M"] * d["N"]),
        lambda m, b, s: {"B": b * m.heads, "M": s, "N": s, "K": m.head_dim},
        lambda d, dt, dev, g: [_randn((d["B"], d["M"], d["K"]), dt, dev, g),
                               _randn((d["B"], d["K"], d["N"]), dt, dev, g)],
        "native_bmm", "2*B*M*N*K", lambda d: 2 * d["B"] * d["M"] * d["N"] * d["K"], _sqrt("K"),
        description="attention scores per head: (seq x head_dim) @ (head_dim x seq), batch x heads of them"),
    Operator(
        "addmm", "gemm", ("M", "N", "K"), "compute", "e*(N + M*K + K*N + M*N)",
        lambda d, e: e * (d["N"] + d["M"] * d["K"] + d["K"] * d["N"] + d["M"] * d["N"]),
        lambda m, b, s: {"M": b * s, "N": m.hidden, "K": m.hidden},
        lambda d, dt, dev, g: [_randn((d["N"],), dt, dev, g), *_gemm_inputs(d, dt, dev, g)],
        "native_addmm", "2*M*N*K + M*N (the bias add)", lambda d: 2 * d["M"] * d["N"] * d["K"] + d["M"] * d["N"],
        _sqrt("K"), description="a projection with bias: bias + (tokens x hidden) @ (hidden x hidden)"),
    Operator(
        "linear", "gemm", ("M", "N", "K"), "compute", "e*(M*K + N*K + M*N)",
        lambda d, e: e * (d["M"] * d["K"] + d["N"] * d["K"] + d["M"] * d["N"]),
        lambda m, b, s: {"M": b * s, "N": m.hidden, "K": m.intermediate},
        lambda d, dt, dev, g: [_randn((d["M"], d["K"]), dt, dev, g), _randn((d["N"], d["K"]), dt, dev, g)],
        "native_linear", GEMM_FLOPS, lambda d: 2 * d["M"] * d["N"] * d["K"], _sqrt("K"),
        description="the MLP's down projection, x @ W^T: (tokens x intermediate) -> hidden"),
    Operator(
        "scaled_dot_product_attention", "attention", ("B", "H", "S", "D"), "compute",
        "e*4*B*H*S*D (q, k, v read, out written)", lambda d, e: e * 4 * d["B"] * d["H"] * d["S"] * d["D"],
        lambda m, b, s: {"B": b, "H": m.heads, "S": s, "D": m.head_dim},
        lambda d, dt, dev, g: [_randn((d["B"], d["H"], d["S"], d["D"]), dt, dev, g) for _ in range(3)],
        "native_sdpa", "4*B*H*D*S*(S+1)/2 (QK^T and PV over the causal triangle; softmax not counted)",
        lambda d: 4 * d["B"] * d["H"] * d["D"] * d["S"] * (d["S"] + 1) // 2,
        description="causal self-attention, one head per key/value head (is_causal=True)"),
    Operator(
        "softmax", "reduction", ("R", "C"), "memory", "e*2*R*C", lambda d, e: e * 2 * d["R"] * d["C"],
        lambda m, b, s: {"R": b * m.heads * s, "C": s}, _rows, "native_softmax", error_scale=_inverse("C"),
        description="attention probabilities: a row of seq scores per query, batch x heads x seq rows"),
    Operator(
        "log_softmax", "reduction", ("R", "C"), "memory", "e*2*R*C", lambda d, e: e * 2 * d["R"] * d["C"],
        lambda m, b, s: {"R": b * m.heads * s, "C": s}, _rows, "native_log_softmax"),
    Operator(
        "sum", "reduction", ("R", "C"), "memory", "e*(R*C + R)", lambda d, e: e * (d["R"] * d["C"] + d["R"]),
        lambda m, b, s: _tokens(m, b, s, m.hidden), _rows, "native_sum", error_scale=_sqrt("C"),
        description="over the last dimension of (tokens x hidden)"),
    Operator(
        "mean", "reduction", ("R", "C"), "memory", "e*(R*C + R)", lambda d, e: e * (d["R"] * d["C"] + d["R"]),
        lambda m, b, s: _tokens(m, b, s, m.hidden), _rows, "native_mean", error_scale=_inverse_sqrt("C")),
    Operator(
        "layer_norm", "norm", ("R", "C"), "memory", "e*(2*R*C + 2*C)",
        lambda d, e: e * (2 * d["R"] * d["C"] + 2 * d["C"]),
        lambda m, b, s: _tokens(m, b, s, m.hidden),
        lambda d, dt, dev, g: [*_rows(d, dt, dev, g), _randn((d["C"],), dt, dev, g), _randn((d["C"],), dt, dev, g)],
        "native_layer_norm", description="over hidden, with weight and bias"),
    Operator(
        "rms_norm", "norm", ("R", "C"), "memory", "e*(2*R*C + C)", lambda d, e: e * (2 * d["R"] * d["C"] + d["C"]),
        lambda m, b, s: _tokens(m, b, s, m.hidden),
        lambda d, dt, dev, g: [*_rows(d, dt, dev, g), _randn((d["C"],), dt, dev, g)],
        "native_rms_norm", description="over hidden, with weight (Llama's norm)"),
    Operator(
        "gelu", "activation", ("R", "C"), "memory", "e*2*R*C", lambda d, e: e * 2 * d["R"] * d["C"],
        lambda m, b, s: _tokens(m, b, s, m.intermediate), _rows, "native_gelu",
        description="on (tokens x intermediate)"),
    Operator(
        "silu", "activation", ("R", "C"), "memory", "e*2*R*C", lambda d, e: e * 2 * d["R"] * d["C"],
        lambda m, b, s: _tokens(m, b, s, m.intermediate), _rows, "native_silu",
        description="on (tokens x intermediate)"),
    Operator(
        "exp", "elementwise", ("R", "C"), "memory", "e*2*R*C", lambda d, e: e * 2 * d["R"] * d["C"],
        lambda m, b, s: _tokens(m, b, s, m.hidden), _rows, "native_exp"),
    Operator(
        "add", "elementwise", ("R", "C"), "memory", "e*3*R*C", lambda d, e: e * 3 * d["R"] * d["C"],
        lambda m, b, s: _tokens(m, b, s, m.hidden), _two_rows, "native_add", description="the residual add"),
    Operator(
        "mul", "elementwise", ("R", "C"), "memory", "e*3*R*C", lambda d, e: e * 3 * d["R"] * d["C"],
        lambda m, b, s: _tokens(m, b, s, m.intermediate), _two_rows, "native_mul", description="SwiGLU's gate x up"),
    Operator(
        "embedding", "embedding-index", ("V", "C", "T"), "memory",
        "8*T + e*2*T*C (indices read, T rows read and written, one per index read; the rest of the table is not "
        "touched)",
        lambda d, e: INDEX_BYTES * d["T"] + e * 2 * d["T"] * d["C"],
        lambda m, b, s: {"V": m.vocab, "C": m.hidden, "T": b * s},
        lambda d, dt, dev, g: [_randint(d["V"], (d["T"],), dev, g), _randn((d["V"], d["C"]), dt, dev, g)],
        "native_embedding", description="token embedding lookup",
        count_allocated=lambda d, e: INDEX_BYTES * d["T"] + e * (d["V"] + d["T"]) * d["C"]),
    Operator(
        "index_select", "embedding-index", ("R", "C", "T"), "memory", "8*T + e*2*T*C",
        lambda d, e: INDEX_BYTES * d["T"] + e * 2 * d["T"] * d["C"],
        lambda m, b, s: {"R": b * s, "C": m.hidden, "T": b * s},
        lambda d, dt, dev, g: [_randn((d["R"], d["C"]), dt, dev, g), _randint(d["R"], (d["T"],), dev, g)],
        "native_index_select", description="T rows picked at random from (tokens x hidden)",
        count_allocated=lambda d, e: INDEX_BYTES * d["T"] + e * (d["R"] + d["T"]) * d["C"]),
    Operator(
        "gather", "embedding-index", ("R", "C", "G"), "memory", "8*R*G + e*2*R*G (gathered elements read, written)",
        lambda d, e: INDEX_BYTES * d["R"] * d["G"] + e * 2 * d["R"] * d["G"],
        lambda m, b, s: {"R": b * s, "C": m.hidden, "G": m.hidden},
        lambda d, dt, dev, g: [_randn((d["R"], d["C"]), dt, dev, g), _randint(d["C"], (d["R"], d["G"]), dev, g)],
        "native_gather", description="along the last dimension, G random columns per row",
        count_allocated=lambda d, e: INDEX_BYTES * d["R"] * d["G"] + e * d["R"] * (d["C"] + d["G"])),
    Operator(
        "cat", "memory", ("R", "C"), "memory", "e*4*R*C (two R x C read, 2R x C written)",
        lambda d, e: e * 4 * d["R"] * d["C"], lambda m, b, s: _tokens(m, b, s, m.hidden), _two_rows, "native_cat",
        description="two (tokens x hidden) along the first dimension"),
    Operator(
        "cross_entropy", "loss", ("R", "V"), "memory", "e*R*V + 8*R + e (logits and targets read, the mean written)",
        lambda d, e: e * d["R"] * d["V"] + INDEX_BYTES * d["R"] + e,
        lambda m, b, s: {"R": b * s, "V": m.vocab},
        lambda d, dt, dev, g: [_randn((d["R"], d["V"]), dt, dev, g), _randint(d["V"], (d["R"],), dev, g)],
        "native_cross_entropy", description="the language-model loss over the vocabulary, mean over tokens"),
    Operator(
        "rotary", "rotary", ("T", "H", "KVH", "D", "S"), "memory",
        "e*2*T*D*(H + KVH) + e*T*D + 8*T (q, k read and written; a cos and a sin row of D/2 read per token, at its "
        "position, one per index read: positions repeating every S tokens count again; positions)",
        lambda d, e: e * 2 * d["T"] * d["D"] * (d["H"] + d["KVH"]) + e * d["T"] * d["D"] + INDEX_BYTES * d["T"],
        lambda m, b, s: {"T": b * s, "H": m.heads, "KVH": m.kv_heads, "D": m.head_dim, "S": s},
        _rotary_inputs, "native_rotary", description="rotary position embedding on q and k (halves rotated)",
        count_allocated=lambda d, e: e * 2 * d["T"] * d["D"] * (d["H"] + d["KVH"]) + e * d["S"] * d["D"]
        + INDEX_BYTES * d["T"]),
)}


def native_for(op: Operator, dtype: str) -> Callable[..., Any]:
    """The native call of ``op`` in ``dtype`` (mm in fp8 is torch._scaled_mm)."""
    from flagperf.operation.natives import native_scaled_mm

    return native_scaled_mm if (op.name == "mm" and dtype == FP8) else op.native


def reference_for(op: Operator, dtype: str) -> Callable[..., Any]:
    """The call the reference is computed with, on inputs upcast to the reference dtype."""
    from flagperf.operation.natives import reference_scaled_mm

    return reference_scaled_mm if (op.name == "mm" and dtype == FP8) else op.native


def make_inputs(op: Operator, dims: Dims, dtype: str, device: torch.device, seed: int) -> Inputs:
    """The point's inputs, the same for every implementation (seeded on the device)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    if dtype != FP8:
        dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        return op.make_inputs(dims, dtypes[dtype], device, gen)
    fp8 = fp8_dtype()
    if fp8 is None:
        raise RuntimeError("this torch has no float8_e4m3fn")
    a, b = _gemm_inputs(dims, torch.float32, device, gen)
    one = torch.ones((), device=device, dtype=torch.float32)
    # _scaled_mm takes b in column-major order.
    return [a.to(fp8), b.t().contiguous().t().to(fp8), one, one.clone()]


def counted(op: Operator, dims: Dims, dtype: str) -> tuple[int | None, int]:
    """(FLOPs or None, bytes) of one call."""
    return (op.count_flops(dims) if op.count_flops else None), op.count_bytes(dims, ELEMENT_BYTES[dtype])


def shape_label(dims: Dims) -> str:
    return "x".join(f"{k}{v}" for k, v in dims.items())
