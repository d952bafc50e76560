"""bert-large-infer: masked-LM inference; masked-token accuracy on a local token file, or synthetic tokens.

The model runs the attention the config names (``attention``: SDPA by default, what a lab deploys) with the
padding mask its data implies: synthetic sequences have lengths spread between a minimum and ``seq_len``, with
[PAD] after the real tokens and ``attention_mask`` 0 there; a token file's windows are full (mask all ones)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForMaskedLM

from flagperf.inference.config import InferenceConfig
from flagperf.inference.data import SyntheticDataset, loader
from flagperf.inference.engines import InferenceEngine
from flagperf.inference.hf import Logits, build
from flagperf.training.config import LocalPath
from flagperf.training.data import token_windows

ACCURACY = "mlm_accuracy"
MASK_ID = 103  # [MASK] in BERT's vocabulary
PAD_ID = 0  # [PAD]


class Config(InferenceConfig):
    item_name: ClassVar[str] = "sequences"
    artifact_neutral_keys: ClassVar[frozenset[str]] = frozenset({
        "data_path", "synthetic_sequences", "synthetic_min_length_fraction", "mask_fraction"})
    data_path: LocalPath = Field(description="1-D .npy of token ids; null: synthetic tokens")
    checkpoint_path: LocalPath = Field(description="a save_pretrained folder; null: random weights")
    synthetic_sequences: int = Field(ge=1)
    seq_len: int = Field(ge=8, le=512)
    synthetic_min_length_fraction: float = Field(gt=0, le=1, description=(
        "synthetic sequences: each one's real tokens are drawn uniformly between ceil(fraction x seq_len) and "
        "seq_len (deterministically, from seed), [PAD] after them with attention_mask 0; 1: no padding"))
    attention: Literal["sdpa", "eager"] = Field(description="transformers' attn_implementation of the model")
    vocab_size: int = Field(ge=MASK_ID + 1)
    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    mask_fraction: float = Field(gt=0, lt=1)
    seed: int

    def min_length(self) -> int:
        """The fewest real tokens a synthetic sequence has."""
        return max(1, math.ceil(self.synthetic_min_length_fraction * self.seq_len))

    def flops_scope(self) -> str:
        padding = ("padded positions included: they are computed (masked out of attention), not skipped"
                   if self.data_path is None and self.min_length() < self.seq_len else "no padding in the data")
        return f"all {self.seq_len} positions of a sequence, {padding}"


class MaskedTokens(Dataset[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]):
    """Windows of a token file with a fixed 15 % of positions masked; labels are the hidden tokens (-100
    elsewhere, not scored)."""

    synthetic = False

    def __init__(self, config: Config) -> None:
        assert config.data_path is not None
        self.windows = token_windows(config.data_path, config.seq_len - 1, config.vocab_size)
        self.fraction, self.seed = config.mask_fraction, config.seed
        self.description = f"{config.data_path}: {len(self.windows)} sequences of {config.seq_len} tokens"

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        tokens = self.windows[index]
        masked = torch.rand(len(tokens), generator=torch.Generator().manual_seed(self.seed + index)) < self.fraction
        labels = torch.where(masked, tokens, torch.full_like(tokens, -100))
        return (torch.where(masked, torch.full_like(tokens, MASK_ID), tokens), torch.ones_like(tokens)), labels


def padded_sequence(config: Config, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of one synthetic sequence: a length drawn uniformly between the minimum and
    seq_len, that many random tokens, then [PAD] with mask 0."""
    length = int(torch.randint(config.min_length(), config.seq_len + 1, (1,), generator=g))
    ids = torch.full((config.seq_len,), PAD_ID, dtype=torch.long)
    ids[:length] = torch.randint(0, config.vocab_size, (length,), generator=g)
    return ids, (torch.arange(config.seq_len) < length).long()


def build_dataloader(config: Config) -> DataLoader:
    if config.data_path is not None:
        dataset: Any = MaskedTokens(config)
    else:
        lengths = f"{config.min_length()} to {config.seq_len}"
        dataset = SyntheticDataset(config.synthetic_sequences, lambda g: padded_sequence(config, g),
                                   f"{config.seq_len} token ids ({lengths} real, uniformly; [PAD] after them, "
                                   "attention_mask 0)", seed=config.seed)
    return loader(dataset, config.batch_size, config.num_workers)


def create_model(config: Config) -> torch.nn.Module:
    hf = BertConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                    num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                    intermediate_size=config.intermediate_size, max_position_embeddings=max(512, config.seq_len),
                    attn_implementation=config.attention)
    return Logits(build(BertForMaskedLM, hf, config.checkpoint_path), ("input_ids", "attention_mask"))


def evaluator(outputs: list[torch.Tensor], labels: torch.Tensor) -> float:
    scored = labels != -100
    if not scored.any():
        return 0.0
    return float((outputs[0].argmax(dim=-1)[scored] == labels[scored]).float().mean())


def model_forward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(*inputs)]


def export_model(model: torch.nn.Module, config: Config, path: Path) -> None:
    # SDPA exports as MatMul/Softmax with the mask added; tracing keeps the mask (transformers drops an all-ones
    # mask only when not tracing), and an example with padding keeps it either way.
    example = torch.zeros(config.batch_size, config.seq_len, dtype=torch.long)
    mask = torch.ones_like(example)
    mask[:, config.seq_len // 2:] = 0
    torch.onnx.export(model, (example, mask), str(path),
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"},
                                    "logits": {0: "batch"}}, dynamo=False)


def engine_forward(engine: InferenceEngine, inputs: list[torch.Tensor]) -> tuple[Any, float]:
    return engine(inputs)
