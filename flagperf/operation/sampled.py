"""A float64 reference on the host for a sample of a large point's output. A large point's reference is
computed on the device (flagperf.operation.check.reference_dtype), by the device's own kernels in float32
(float64 for fp32 points): a bug those kernels share with the implementation under test, or with torch's
native call that is the baseline, would pass. So a few rows (and, where columns are independent, a few windows
of columns) of the output are computed again on the host CPU in float64, from the inputs those elements
depend on, copied off the device as they are (views and copies, no device arithmetic: a gather's indices are
read on the host and its rows copied one by one).

Each operator's sample says which inputs and which elements of its output: the first and last row and
column are always in it (a kernel's tail block is where a bound is wrong), the others drawn with the point's
seed. An operator whose output depends on all of its input at once (cross_entropy's mean) is computed whole
on the host: from one copy where it has at most MAX_ELEMENTS elements, else from blocks of rows copied off one at
a time (computed when the sample is made: the sample keeps the host's value, not the device's inputs), up to
STREAM_MAX_ELEMENTS and while one row fits a copy; past either it has no sample, which the point says.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from flagperf.operation import natives
from flagperf.operation.check import REFERENCE_CPU, Reference, as_list, compute_reference
from flagperf.operation.operators import FP8, Operator, reference_for
from flagperf.results.schema import NO_SAMPLE_SEPARATOR, NONE_DEFINED, ROW_OVER_HOST_COPY, TOO_MANY_LOGITS

ROWS = 16  # sampled rows (or batches x heads x rows): the first, the last and others drawn with the seed
WINDOW = 16  # sampled columns come in windows of contiguous ones: the first, the last and two drawn
WINDOWS = 4
HEADS = 2  # of a batch or head dimension: the first and the last
MAX_ELEMENTS = 1 << 24  # of one input copied to the host (a float64 copy of 128 MiB at most)
# cross_entropy's logits the host reads block by block for its one mean (a float64 pass of a few seconds at most)
STREAM_MAX_ELEMENTS = 1 << 30

Axes = dict[int, list[int]]  # dimension -> the indices taken of it (in order; repeats allowed)


@dataclass(frozen=True)
class Sample:
    inputs: list[torch.Tensor]  # on the host, floating ones in float64
    fn: Callable[..., Any]  # computes the sampled outputs from ``inputs``
    axes: list[Axes]  # per output: the indices of it the sample covers
    sizes: list[tuple[int, ...]]  # per output: its full shape
    what: str  # "1024 of 29360128 output elements (16 of 2048 rows x 64 of 14336 columns)"

    def reference(self) -> Reference:
        computed = compute_reference(self.fn, self.inputs, torch.float64, REFERENCE_CPU)
        return Reference(outputs=computed.outputs, description=f"float64 on cpu at {self.what}")

    def pick(self, output: Any) -> list[torch.Tensor]:
        """The same elements of an implementation's output, on the host."""
        outputs = as_list(output)
        if len(outputs) != len(self.axes):
            return outputs  # the comparison says the count is wrong
        picked = []
        for out, axes, size in zip(outputs, self.axes, self.sizes, strict=True):
            if tuple(out.shape) != size:
                picked.append(out)  # the comparison says the shape is wrong
            else:
                picked.append(host(out, axes))
        return picked

    def locate(self, number: int, index: tuple[int, ...]) -> list[int]:
        axes = self.axes[number]
        return [axes[d][i] if d in axes else i for d, i in enumerate(index)]


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """(start, length) of the consecutive stretches of ``indices``, in order."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def host(t: torch.Tensor, axes: Axes) -> torch.Tensor:
    """The elements of ``t`` at ``axes`` (a dimension not named: all of it), copied to the host; floating ones in
    float64 (which holds every narrower format exactly). Only views are taken on the device (narrow), each
    copied off as it is: no device kernel computes anything the reference then relies on."""

    def take(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
        if not dims:
            copied = x.to(REFERENCE_CPU, copy=True)
            return copied.to(torch.float64) if copied.is_floating_point() else copied
        d, rest = dims[0], dims[1:]
        return torch.cat([take(x.narrow(d, start, length), rest) for start, length in _runs(axes[d])], dim=d)

    return take(t.detach(), sorted(axes))


def spread(n: int, k: int, gen: torch.Generator) -> list[int]:
    """Up to ``k`` of range(n), sorted: the first, the last and the others drawn."""
    if n <= k:
        return list(range(n))
    if k <= 2:
        return [0, n - 1][:k]
    # k - 2 distinct draws of the middle in O(k) memory (random.sample indexes the range; a permutation of n, as
    # torch.randperm makes, would take 8n bytes at dimensions up to 2^31), seeded from ``gen``
    rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return sorted({0, n - 1, *rng.sample(range(1, n - 1), k - 2)})


def windows(n: int, gen: torch.Generator) -> list[int]:
    """Columns in WINDOWS windows of WINDOW: the first, the last and others drawn (all of them when few)."""
    if n <= WINDOW * WINDOWS:
        return list(range(n))
    starts = {0, n - WINDOW, *torch.randint(0, n - WINDOW + 1, (WINDOWS - 2,), generator=gen).tolist()}
    return sorted({c for s in starts for c in range(s, s + WINDOW)})


def _rows_for(n: int, row_elements: int, gen: torch.Generator) -> list[int]:
    """Rows whose copies stay within MAX_ELEMENTS (at least one)."""
    return spread(n, max(1, min(ROWS, MAX_ELEMENTS // max(1, row_elements))), gen)


def _values(t: torch.Tensor, rows: list[int]) -> list[int]:
    """Index values at ``rows`` of a 1-D index tensor, read on the host."""
    return [int(v) for v in host(t, {0: rows}).tolist()]


def _describe(axes: Axes, size: tuple[int, ...], names: dict[int, str]) -> str:
    taken = 1
    parts = []
    for d, n in enumerate(size):
        k = len(axes[d]) if d in axes else n
        taken *= k
        if d in axes:
            parts.append(f"{k} of {n} {names.get(d, f'dim-{d} entries')}")
    total = 1
    for n in size:
        total *= n
    return f"{taken} of {total} output elements" + (f" ({' x '.join(parts)})" if parts else "")


def _sample(op: Operator, dtype: str, inputs: list[torch.Tensor], gen: torch.Generator
            ) -> tuple[list[torch.Tensor], Callable[..., Any], list[Axes], list[tuple[int, ...]], dict[int, str]]:
    """(host inputs, the function, per-output axes, per-output sizes, dimension names) of ``op``'s sample."""
    name = op.name
    rows_cols = {0: "rows", 1: "columns"}
    if name in ("mm", "addmm", "linear"):
        if name == "addmm":
            bias, a, b = inputs[0], inputs[1], inputs[2]
        else:
            a, b = inputs[0], inputs[1]
        m, k = a.shape
        n = b.shape[0] if name == "linear" else b.shape[1]
        rows, cols = _rows_for(m, k, gen), windows(n, gen)
        a_s = host(a, {0: rows})
        if name == "linear":
            return [a_s, host(b, {0: cols})], op.native, [{0: rows, 1: cols}], [(m, n)], rows_cols
        b_s = host(b, {1: cols})
        if name == "addmm":
            return [host(bias, {0: cols}), a_s, b_s], op.native, [{0: rows, 1: cols}], [(m, n)], rows_cols
        rest = [host(t, {}) for t in inputs[2:]]  # fp8's scales
        return [a_s, b_s, *rest], reference_for(op, dtype), [{0: rows, 1: cols}], [(m, n)], rows_cols
    if name == "bmm":
        a, b = inputs
        batches, m, k = a.shape
        n = b.shape[2]
        picked, rows, cols = spread(batches, HEADS, gen), _rows_for(m, k, gen), windows(n, gen)
        return ([host(a, {0: picked, 1: rows}), host(b, {0: picked, 2: cols})], op.native,
                [{0: picked, 1: rows, 2: cols}], [(batches, m, n)], {0: "batches", 1: "rows", 2: "columns"})
    if name == "scaled_dot_product_attention":
        q, k, v = inputs
        batch, heads, seq, dim = q.shape
        bs, hs = spread(batch, HEADS, gen), spread(heads, HEADS, gen)
        if len(bs) * len(hs) * seq * dim > MAX_ELEMENTS:  # each head's whole key and value are copied
            bs, hs = bs[:1], hs[:1]
        rows = _rows_for(seq, dim, gen)
        positions = torch.tensor(rows, dtype=torch.int64)

        def causal_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # the causal mask of the sampled query rows: row i sees the keys up to its own position
            allowed = torch.arange(k.shape[-2]).unsqueeze(0) <= positions.unsqueeze(1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

        whole = {0: bs, 1: hs}
        return ([host(q, {0: bs, 1: hs, 2: rows}), host(k, whole), host(v, whole)], causal_rows,
                [{0: bs, 1: hs, 2: rows}], [tuple(q.shape)], {0: "batches", 1: "heads", 2: "query rows"})
    if name in ("softmax", "log_softmax", "sum", "mean", "layer_norm", "rms_norm"):
        x, *params = inputs
        r, c = x.shape
        rows = _rows_for(r, c, gen)
        size = (r,) if name in ("sum", "mean") else (r, c)
        return ([host(x, {0: rows}), *[host(p, {}) for p in params]], op.native, [{0: rows}], [size],
                rows_cols)
    if name in ("gelu", "silu", "exp", "add", "mul"):
        r, c = inputs[0].shape
        axes = {0: spread(r, ROWS, gen), 1: windows(c, gen)}
        return [host(t, axes) for t in inputs], op.native, [axes], [(r, c)], rows_cols
    if name == "cat":
        a, b = inputs
        r, c = a.shape
        axes = {0: spread(r, ROWS, gen), 1: windows(c, gen)}
        # the output's rows: the sampled ones of a, then the same of b (r rows further down)
        out_axes = {0: axes[0] + [r + i for i in axes[0]], 1: axes[1]}
        return [host(a, axes), host(b, axes)], op.native, [out_axes], [(2 * r, c)], rows_cols
    if name in ("embedding", "index_select"):
        index, table = (inputs[0], inputs[1]) if name == "embedding" else (inputs[1], inputs[0])
        t, c = index.shape[0], table.shape[1]
        rows, cols = _rows_for(t, c, gen), windows(c, gen)
        # the rows the sampled indices name, copied one by one; indexed here by their position
        gathered = host(table, {0: _values(index, rows), 1: cols})
        local = torch.arange(len(rows), dtype=torch.int64)
        host_inputs = [local, gathered] if name == "embedding" else [gathered, local]
        return host_inputs, op.native, [{0: rows, 1: cols}], [(t, c)], rows_cols
    if name == "gather":
        x, index = inputs
        r, c = x.shape
        g = index.shape[1]
        rows, cols = _rows_for(r, c + g, gen), windows(g, gen)
        return ([host(x, {0: rows}), host(index, {0: rows, 1: cols})], op.native, [{0: rows, 1: cols}],
                [(r, g)], rows_cols)
    if name == "rotary":
        q, k, cos, sin, positions = inputs
        t = q.shape[0]
        rows = _rows_for(t, q[0].numel() + k[0].numel(), gen)
        at = _values(positions, rows)
        return ([host(q, {0: rows}), host(k, {0: rows}), host(cos, {0: at}), host(sin, {0: at}),
                 torch.arange(len(rows), dtype=torch.int64)], natives.native_rotary, [{0: rows}, {0: rows}],
                [tuple(q.shape), tuple(k.shape)], {0: "tokens"})
    if name == "cross_entropy":
        logits, target = inputs
        if logits.numel() <= MAX_ELEMENTS:
            return [host(t, {}) for t in inputs], natives.native_cross_entropy, [{}], [()], {}
        mean = _streamed_cross_entropy(logits, target)  # now: a closure would hold the device's inputs

        def streamed() -> torch.Tensor:
            return mean

        return [], streamed, [{}], [()], {}
    raise NoSample(f"{NONE_DEFINED}{name}", f"no host sample is defined for {name}")


def _block_rows(rows: int, vocab: int) -> int:
    """cross_entropy's rows per block the host copies off (within MAX_ELEMENTS); NoSample where even one row of
    logits is over it, or all of them over STREAM_MAX_ELEMENTS, saying which."""
    why = (f"cross_entropy's output is one mean over all {rows} rows, which depends on every one of its "
           f"{rows * vocab} logits (a sample of rows would check no part of it), and ")
    if rows * vocab > STREAM_MAX_ELEMENTS:
        raise NoSample(TOO_MANY_LOGITS,
                       f"{why}those are over the {STREAM_MAX_ELEMENTS} the host computes in float64 block by block "
                       "(the point's reference is the device's own kernels alone)")
    if vocab > MAX_ELEMENTS:
        raise NoSample(ROW_OVER_HOST_COPY,
                       f"{why}one row of them ({vocab}) is over the {MAX_ELEMENTS} logits of one host copy, the "
                       "blocks being whole rows (the point's reference is the device's own kernels alone)")
    return max(1, MAX_ELEMENTS // vocab)


def _streamed_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """cross_entropy's one mean over every row, computed on the host in float64 from blocks of rows copied off the
    device one at a time (each within MAX_ELEMENTS): its value depends on every logit, so no sample of rows can
    check it, and the whole of them in one host copy would pass MAX_ELEMENTS. The sum of each block's losses over
    the count of its targets not ignored, with the native call's options (natives.CROSS_ENTROPY_KWARGS)."""
    rows, vocab = logits.shape
    block = _block_rows(rows, vocab)
    ignore_index = int(natives.CROSS_ENTROPY_KWARGS["ignore_index"])
    by_block = {**natives.CROSS_ENTROPY_KWARGS, "reduction": "sum"}  # each block's sum; the mean is taken below
    total = torch.zeros((), dtype=torch.float64)
    counted = 0
    for start in range(0, rows, block):
        length = min(block, rows - start)
        targets = host(target.narrow(0, start, length), {})
        total += F.cross_entropy(host(logits.narrow(0, start, length), {}), targets, **by_block)
        counted += int((targets != ignore_index).sum())
    return total / counted  # no target counted: NaN, as the native mean


class NoSample(Exception):
    """The operator (or this size of it) has no host sample: why, in a few words the same for every shape
    (``reason``: what the operator's headline counts) and then in full, with the shape's sizes."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}{NO_SAMPLE_SEPARATOR}{detail}")


def host_sample(op: Operator, dtype: str, inputs: list[torch.Tensor], seed: int) -> Sample:
    """The host sample of a point (raises NoSample, saying why there is none)."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    host_inputs, fn, axes, sizes, names = _sample(op, dtype, inputs, gen)
    what = "; ".join(_describe(a, s, names) for a, s in zip(axes, sizes, strict=True))
    if op.name == "cross_entropy" and inputs[0].numel() > MAX_ELEMENTS:  # streamed: how, as a sample says which
        rows, vocab = inputs[0].shape
        what += f" (the mean over all {rows} rows, from blocks of {_block_rows(rows, vocab)} rows copied off)"
    if dtype == FP8:
        what += " (dequantised)"
    return Sample(inputs=host_inputs, fn=fn, axes=axes, sizes=sizes, what=what)
