"""Model shapes as configuration: named presets at the published sizes, plus explicit sizes that override
a preset's fields one by one. A case's config carries ``model: <preset>`` and the size keys (null = the
preset's value); a vendor's scale file (vendor/<vendor>/config_<hw>x<nnodes>x<nproc>.yaml) picks what fits
its hardware at that scale.

Sizes are plain data here (no transformers import), so the bench and the tests can read them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import torch


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LlamaShape(Shape):
    vocab_size: int = Field(ge=8, le=1 << 18)
    hidden_size: int = Field(ge=8)
    intermediate_size: int = Field(ge=8)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    rope_theta: float = Field(gt=0)
    tie_embeddings: bool


class BertShape(Shape):
    vocab_size: int = Field(ge=8)
    hidden_size: int = Field(ge=8)
    intermediate_size: int = Field(ge=8)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)


class ResNetShape(Shape):
    embedding_size: int = Field(ge=1)
    depths: tuple[int, ...] = Field(min_length=1)
    hidden_sizes: tuple[int, ...] = Field(min_length=1)
    layer_type: str


# Meta's published configurations (config.json of meta-llama/Meta-Llama-3-8B and Llama-3.2-1B); the one table
# of Llama shapes: training's cases and the generate family's presets (flagperf.generate.models) read it.
LLAMA_PRESETS: dict[str, LlamaShape] = {
    "llama-3-8b": LlamaShape(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                             num_heads=32, num_kv_heads=8, rope_theta=500000.0, tie_embeddings=False),
    "llama-3.2-1b": LlamaShape(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                               num_heads=32, num_kv_heads=8, rope_theta=500000.0, tie_embeddings=True),
    # Seconds on a CPU: the tests and the CPU smoke runs.
    "tiny": LlamaShape(vocab_size=256, hidden_size=128, intermediate_size=344, num_layers=2, num_heads=4,
                       num_kv_heads=4, rope_theta=10000.0, tie_embeddings=False),
}

# google-research/bert's BERT-Large and BERT-Base (uncased vocabulary).
BERT_PRESETS: dict[str, BertShape] = {
    "bert-large": BertShape(vocab_size=30522, hidden_size=1024, intermediate_size=4096, num_layers=24, num_heads=16),
    "bert-base": BertShape(vocab_size=30522, hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12),
    "tiny": BertShape(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2),
}

# He et al.'s ResNet-50 (microsoft/resnet-50's configuration) and a two-stage toy for the CPU tests.
RESNET_PRESETS: dict[str, ResNetShape] = {
    "resnet50": ResNetShape(embedding_size=64, depths=(3, 4, 6, 3), hidden_sizes=(256, 512, 1024, 2048),
                            layer_type="bottleneck"),
    "tiny": ResNetShape(embedding_size=8, depths=(1, 1), hidden_sizes=(8, 16), layer_type="basic"),
}

S = TypeVar("S", bound=Shape)


def resolve_shape(presets: dict[str, S], name: str, explicit: dict[str, Any]) -> S:
    """The preset ``name`` with every explicit (not None) size put in its place."""
    if name not in presets:
        raise ValueError(f"unknown model preset {name!r} (known: {', '.join(sorted(presets))})")
    base = presets[name]
    changes = {k: v for k, v in explicit.items() if v is not None}
    unknown = sorted(set(changes) - set(type(base).model_fields))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a size of this model")
    return type(base).model_validate({**base.model_dump(), **changes})


def rope_kwargs(theta: float) -> dict[str, Any]:
    """A transformers config's RoPE base, for transformers 4 and 5 (5 moved rope_theta into rope_parameters).
    The installed version is read from its metadata: importing transformers takes seconds, and the presets are
    built where a case's config is only checked."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("transformers").split(".")[0])
    except PackageNotFoundError:  # as the import would say: the case's family names its extra (missing_extra)
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers") from None
    return ({"rope_parameters": {"rope_type": "default", "rope_theta": theta}} if major >= 5
            else {"rope_theta": theta})


def llama_config_kwargs(shape: LlamaShape, seq_len: int, *, use_cache: bool = False) -> dict[str, Any]:
    """transformers.LlamaConfig's arguments for a shape, with SDPA attention (flash on GPUs that have it) and
    ``seq_len`` positions; no key/value cache unless asked for (training keeps none, decoding needs one)."""
    return {"vocab_size": shape.vocab_size, "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size, "num_hidden_layers": shape.num_layers,
            "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads,
            "tie_word_embeddings": shape.tie_embeddings, "max_position_embeddings": seq_len,
            "attn_implementation": "sdpa", "use_cache": use_cache, **rope_kwargs(shape.rope_theta)}


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters that take part in matrix products: every parameter (shared ones once) except the input
    embedding tables, which are looked up, not multiplied; a table tied to the output head is counted, as
    the head multiplies by it. (torchtitan's and nanoGPT's convention for 6 x N.)"""
    import torch  # here: the shapes are read where torch is not loaded (a case's config checked)
    unique = {id(p): p.numel() for p in model.parameters()}
    total = sum(unique.values())
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = id(output.weight) if output is not None else None
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and id(module.weight) != tied:
            total -= module.weight.numel()
    return total
