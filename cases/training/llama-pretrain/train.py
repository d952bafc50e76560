"""llama-pretrain: a Llama-architecture causal LM trained for next-token prediction.

Shape: ``model`` names a preset (flagperf.training.shapes.LLAMA_PRESETS: llama-3-8b, llama-3.2-1b, tiny) and
the size keys replace its fields one by one. Data: a local token file (data_path: a .npy array of token ids,
read with numpy's memmap) or, without one, synthetic sequences with a learnable rule (each sequence counts up
from a random start by a random stride, modulo the vocabulary), so the loss really falls and convergence
means something. The result says which (synthetic_data). Weights: random init, built on the device, or a
local checkpoint_path (transformers' save_pretrained folder); nothing is downloaded.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from torch.utils.data import TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

from flagperf.training.config import LocalPath, TrainingConfig
from flagperf.training.data import counting_sequences, token_windows
from flagperf.training.driver import TrainingContext
from flagperf.training.shapes import (
    LLAMA_PRESETS,
    LlamaShape,
    llama_config_kwargs,
    matmul_parameters,
    resolve_shape,
)

SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")


class Config(TrainingConfig):
    model: str
    vocab_size: int | None = Field(default=None, ge=8, le=1 << 18)
    hidden_size: int | None = Field(default=None, ge=8)
    intermediate_size: int | None = Field(default=None, ge=8)
    num_layers: int | None = Field(default=None, ge=1)
    num_heads: int | None = Field(default=None, ge=1)
    num_kv_heads: int | None = Field(default=None, ge=1)
    seq_len: int = Field(ge=4, le=1 << 17)
    batch_size: int = Field(ge=1, description="per process")
    lr: float = Field(gt=0)
    synthetic_sequences: int = Field(ge=8)
    data_path: LocalPath = None
    checkpoint_path: LocalPath = None

    @model_validator(mode="after")
    def _shape(self) -> Config:
        shape = self.shape()  # an unknown preset or a bad size fails here, before anything runs
        if shape.hidden_size % shape.num_heads or shape.num_heads % shape.num_kv_heads:
            raise ValueError(f"hidden_size {shape.hidden_size}, num_heads {shape.num_heads} and num_kv_heads "
                             f"{shape.num_kv_heads} must divide evenly")
        return self

    def shape(self) -> LlamaShape:
        return resolve_shape(LLAMA_PRESETS, self.model, {k: getattr(self, k) for k in SIZE_KEYS})


def sequences(config: Config) -> tuple[torch.Tensor, bool]:
    """(sequences of seq_len + 1 token ids, synthetic?)."""
    vocab = config.shape().vocab_size
    if config.data_path:
        return token_windows(config.data_path, config.seq_len, vocab), False
    return counting_sequences(config.synthetic_sequences, config.seq_len, vocab, config.seed), True


def hf_config(shape: LlamaShape, seq_len: int) -> LlamaConfig:
    return LlamaConfig(**llama_config_kwargs(shape, seq_len))


def build_model(config: Config, device: torch.device) -> LlamaForCausalLM:
    if config.checkpoint_path:
        return LlamaForCausalLM.from_pretrained(config.checkpoint_path, local_files_only=True)
    with device:  # initialised where it trains: a 1B model's random init on a CPU takes longer than training
        return LlamaForCausalLM(hf_config(config.shape(), config.seq_len))


@torch.no_grad()
def eval_loss(model: torch.nn.Module, data: torch.Tensor, ctx: TrainingContext, batch_size: int) -> float:
    model.eval()
    total = torch.zeros((), device=ctx.device)
    for chunk in data.split(batch_size):
        batch = ctx.to_device(chunk)[:, :-1]
        with ctx.autocast():
            total += model(input_ids=batch, labels=batch, use_cache=False).loss.float() * len(chunk)
    model.train()
    return float(total) / len(data)


def run(config: Config, ctx: TrainingContext) -> None:
    data, synthetic = sequences(config)
    n_eval = max(1, len(data) // 10)
    evaluation, train = data[:n_eval], data[n_eval:]
    loader = ctx.loader(TensorDataset(train), config.batch_size, drop_last=True)
    model = build_model(config, ctx.device)
    shape = model.config
    ctx.language_model(matmul_parameters(model), tokens_per_sample=config.seq_len, synthetic=synthetic,
                       layers=shape.num_hidden_layers, hidden=shape.hidden_size)
    ctx.extra["model"] = config.model if not config.checkpoint_path else config.checkpoint_path
    ctx.extra["parameters_total"] = sum(p.numel() for p in model.parameters())
    model = ctx.wrap(model)
    optimizer = ctx.optimizer(torch.optim.AdamW, model.parameters(), lr=config.lr)
    ctx.init_done()
    for _epoch in ctx.epochs():
        for (batch,) in ctx.batches(loader):
            # Whole (pinned, contiguous) batch to the device, sliced there: a strided host tensor would be
            # copied through pageable memory, which waits for the device every step.
            batch = ctx.to_device(batch)[:, :-1]
            with ctx.autocast():
                loss = model(input_ids=batch, labels=batch, use_cache=False).loss  # labels shift inside the model
            ctx.backward(loss, optimizer)
            ctx.step(len(batch), loss=loss)
        ctx.evaluate(eval_loss=eval_loss(model, evaluation, ctx, config.batch_size))

