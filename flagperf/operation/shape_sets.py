"""Named shape sets an operation case can select (``shape_sets: [flaggems-core]``): another suite's shapes per
operator, so that a figure here is the figure of the shape that suite reports.

``flaggems-core`` is FlagGems' core benchmark level (its ``benchmark/core_shapes.yaml``, the shapes its
``pytest benchmark`` runs without ``--level comprehensive``), taken per operator from the benchmark class that
FlagGems measures the operator with, and written in this family's dimensions:

- a matrix product's [B, M, N, K] (BlasBenchmark): mm, addmm and linear take M, N, K (FlagGems drops B there),
  bmm all four;
- attention's [B, H, S, D] (AttentionBenchmark) as they are;
- a row operator's R x C: a FlagGems shape's last dimension is C and the others multiply into R (a 1-D shape
  is one row); FlagGems' reductions (UnaryReductionBenchmark: softmax, sum, mean) reduce dimension 1 of a 3-D
  shape, so there C is that dimension and R the other two (the same count of the same reductions, contiguous
  here); layer_norm normalises everything after dimension 0 (NormBenchmark: R = dimension 0, C = the rest);
- cat: FlagGems joins three tensors along dimension 0 and leaves out those over 2**29 elements; here two, of
  the shapes it keeps;
- embedding's [V, C] (EmbeddingBenchmark) looks up V indices; index_select's [R, C] (TensorSelectBenchmark)
  picks floor(R / 10) rows; gather's [R, C] gathers 2C columns per row;
- rotary's sequence lengths (RopeBenchmark) at FlagGems' batch 4, 8 query heads, 1 key head, head dim 64.

Each point's source names the FlagGems class and shape it came from (``flaggems-core BlasBenchmark
[2, 384, 384, 384]``). Loads no torch: a config is checked with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Dims = dict[str, int]
ShapeSet = dict[str, list[tuple[Dims, str]]]  # operator -> (dims, where the shape came from)

# FlagGems' benchmark/core_shapes.yaml (flagos-ai/FlagGems at 6610bfa6, 2026): the core level's shapes of the
# benchmark classes that measure this family's operators.
BLAS = [(2, 384, 384, 384), (2, 4096, 4096, 4096), (16, 1024, 1024, 1024), (16, 2048, 2048, 2048),
        (16, 4096, 4096, 4096)]  # B, M, N, K
ATTENTION = [(4, 32, 1024, 64), (4, 32, 1024, 128), (4, 32, 2048, 128), (4, 32, 4096, 128), (4, 32, 8192, 128)]
UNARY_REDUCTION = [(1048576,), (64, 64), (4096, 4096), (64, 512, 512), (1024, 1024, 1024)]
POINTWISE = [(1073741824,), (64, 64), (4096, 4096), (64, 512, 512), (1024, 1024, 1024)]  # and "Benchmark"
TWO_D = [(64, 64), (256, 256), (1024, 1024), (4096, 4096), (1024, 65536)]  # GenericBenchmark2DOnly
TENSOR_SELECT = [(64, 64), (256, 256), (1024, 1024), (4096, 4096), (1024, 65536)]
NORM = [(4, 16, 64, 4), (16, 16, 8, 48), (16, 16, 8, 88), (16, 16, 128), (20, 6, 65536)]  # N, C, *
EMBEDDING = [(4, 4), (16, 16), (128, 128), (256, 256), (1024, 1024)]  # num_embeddings, embedding_dim
ROPE = [128, 192, 256, 384, 512]  # sequence lengths
ROPE_BATCH, ROPE_HEADS, ROPE_KV_HEADS, ROPE_HEAD_DIM = 4, 8, 1, 64
CAT_MAX_ELEMENTS = 2**29  # FlagGems' CatBenchmark leaves out larger shapes


def _rows(shape: tuple[int, ...]) -> Dims:
    return {"R": math.prod(shape[:-1]), "C": shape[-1]}


def _reduced(shape: tuple[int, ...]) -> Dims:
    """FlagGems' reduction over dimension 1 (over all of a 1-D shape), as rows of that length."""
    if len(shape) == 1:
        return {"R": 1, "C": shape[0]}
    return {"R": math.prod(shape) // shape[1], "C": shape[1]}


def _set(source: str, shapes: list[tuple[int, ...]], dims: Callable[[tuple[int, ...]], Dims]
         ) -> list[tuple[Dims, str]]:
    """Each shape's dims, once (mm takes M, N, K of shapes that differ only in B)."""
    found: list[tuple[Dims, str]] = []
    for shape in shapes:
        made = dims(shape)
        if all(made != d for d, _ in found):
            found.append((made, f"flaggems-core {source} {list(shape)}"))
    return found


def _flaggems_core() -> ShapeSet:
    mnk = lambda s: {"M": s[1], "N": s[2], "K": s[3]}  # noqa: E731
    return {
        "mm": _set("BlasBenchmark", BLAS, mnk),
        "addmm": _set("BlasBenchmark", BLAS, mnk),
        "linear": _set("BlasBenchmark", BLAS, mnk),
        "bmm": _set("BlasBenchmark", BLAS, lambda s: {"B": s[0], "M": s[1], "N": s[2], "K": s[3]}),
        "scaled_dot_product_attention": _set("AttentionBenchmark", ATTENTION,
                                             lambda s: {"B": s[0], "H": s[1], "S": s[2], "D": s[3]}),
        **{name: _set("UnaryReductionBenchmark", UNARY_REDUCTION, _reduced) for name in ("softmax", "sum", "mean")},
        **{name: _set("GenericBenchmark2DOnly", TWO_D, _rows) for name in ("log_softmax", "rms_norm")},
        "layer_norm": _set("NormBenchmark", NORM, lambda s: {"R": s[0], "C": math.prod(s[1:])}),
        **{name: _set("UnaryPointwiseBenchmark", POINTWISE, _rows) for name in ("gelu", "silu", "exp")},
        **{name: _set("BinaryPointwiseBenchmark", POINTWISE, _rows) for name in ("add", "mul")},
        "cat": _set("CatBenchmark", [s for s in POINTWISE if math.prod(s) <= CAT_MAX_ELEMENTS],
                    lambda s: {"R": s[0], "C": math.prod(s[1:])}),
        "embedding": _set("EmbeddingBenchmark", EMBEDDING, lambda s: {"V": s[0], "C": s[1], "T": s[0]}),
        "index_select": _set("TensorSelectBenchmark", TENSOR_SELECT,
                             lambda s: {"R": s[0], "C": s[1], "T": max(1, s[0] // 10)}),
        "gather": _set("TensorSelectBenchmark", TENSOR_SELECT, lambda s: {"R": s[0], "C": s[1], "G": 2 * s[1]}),
        "cross_entropy": _set("GenericBenchmark2DOnly", TWO_D, lambda s: {"R": s[0], "V": s[1]}),
        "rotary": _set("RopeBenchmark", [(s,) for s in ROPE],
                       lambda s: {"T": ROPE_BATCH * s[0], "H": ROPE_HEADS, "KVH": ROPE_KV_HEADS, "D": ROPE_HEAD_DIM,
                                  "S": s[0]}),
    }


SHAPE_SETS: dict[str, ShapeSet] = {"flaggems-core": _flaggems_core()}
