"""The native torch calls of the operators (flagperf.operation.operators names them): the baseline every
implementation is held against, and (upcast) the reference. Module-level, one per operator, so that
torch.compile's caches (keyed on the code object) are shared across the points of a round; apart from the
table so that a case's config is checked without loading torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def native_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b)


def native_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor
                     ) -> torch.Tensor:
    out = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    return out[0] if isinstance(out, tuple) else out  # torch 2.3-2.4 also returned the amax


def reference_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor
                        ) -> torch.Tensor:
    return torch.mm(a * scale_a, b * scale_b)


def native_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.bmm(a, b)


def native_addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.addmm(bias, a, b)


def native_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def native_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def native_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def native_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1)


def native_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


def native_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if hasattr(F, "rms_norm"):  # torch 2.4 and later
        return F.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def native_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def native_silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def native_exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


def native_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.add(a, b)


def native_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mul(a, b)


def native_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.sum(x, dim=-1)


def native_mean(x: torch.Tensor) -> torch.Tensor:
    return torch.mean(x, dim=-1)


def native_embedding(indices: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.embedding(indices, table)


def native_index_select(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.index_select(x, 0, index)


def native_gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, 1, index)


def native_cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cat((a, b), dim=0)


# cross_entropy's options, one dict for the native call, FlagGems' (flaggems.py) and the host's streamed float64 mean
# (sampled.py, which sums each block): its denominator is the count of targets not ignored, as the mean's is. Each is
# given, defaults included, so that a library changing a default cannot change what is measured; the names are
# those of torch's F.cross_entropy and FlagGems' cross_entropy_loss alike.
CROSS_ENTROPY_KWARGS: dict[str, int | float | str] = {"reduction": "mean", "ignore_index": -100,
                                                      "label_smoothing": 0.0}


def native_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target, **CROSS_ENTROPY_KWARGS)


def native_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, halves rotated (GPT-NeoX/Llama layout): q (T, H, D), k (T, KVH, D), cos and
    sin (S, D/2), positions (T); the signature of FlagGems' apply_rotary_pos_emb."""
    c = cos[positions].unsqueeze(-2)
    s = sin[positions].unsqueeze(-2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    return rotate(q), rotate(k)
