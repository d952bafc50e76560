"""llama-pretrain: a Llama-architecture causal LM trained for next-token prediction.

Data: a local token file (data_path: a .npy array of token ids, read with numpy's memmap) or, without
one, synthetic sequences with a learnable rule (each sequence counts up from a random start by a random
stride, modulo the vocabulary), so the loss really falls and convergence means something. The result
says which (synthetic_data). Weights: random init from the config, or a local checkpoint_path
(transformers' save_pretrained folder); nothing is downloaded.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch.utils.data import TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

from flagperf.training.data import LocalPath, counting_sequences, token_windows
from flagperf.training.driver import TrainingConfig, TrainingContext

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Config(TrainingConfig):
    vocab_size: int = Field(ge=8, le=1 << 18)
    hidden_size: int = Field(ge=8)
    intermediate_size: int = Field(ge=8)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    seq_len: int = Field(ge=4, le=1 << 16)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    synthetic_sequences: int = Field(ge=8)
    data_path: LocalPath = None
    checkpoint_path: LocalPath = None


def sequences(config: Config) -> tuple[torch.Tensor, bool]:
    """(sequences of seq_len + 1 token ids, synthetic?)."""
    if config.data_path:
        return token_windows(config.data_path, config.seq_len, config.vocab_size), False
    return counting_sequences(config.synthetic_sequences, config.seq_len, config.vocab_size, config.seed), True


def build_model(config: Config) -> LlamaForCausalLM:
    if config.checkpoint_path:
        return LlamaForCausalLM.from_pretrained(config.checkpoint_path, local_files_only=True)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads, max_position_embeddings=config.seq_len))


@torch.no_grad()
def eval_loss(model: torch.nn.Module, data: torch.Tensor, device: torch.device, dtype: torch.dtype) -> float:
    model.eval()
    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        out = model(input_ids=data[:, :-1].to(device), labels=data[:, :-1].to(device))
    model.train()
    return float(out.loss)


def run(config: Config, ctx: TrainingContext) -> None:
    data, synthetic = sequences(config)
    n_eval = max(1, len(data) // 10)
    evaluation, train = data[:n_eval], data[n_eval:]
    loader = ctx.loader(TensorDataset(train), config.batch_size, drop_last=True)
    model = build_model(config)
    parameters = sum(p.numel() for p in model.parameters())
    ctx.language_model(parameters, tokens_per_sample=config.seq_len, synthetic=synthetic)
    model = ctx.wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    dtype = DTYPES[config.precision]
    ctx.init_done()
    for _epoch in ctx.epochs():
        for (batch,) in loader:
            batch = batch.to(ctx.device)
            optimizer.zero_grad()
            with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
            loss.backward()
            optimizer.step()
            ctx.step(len(batch), loss=float(loss))
        ctx.evaluate(eval_loss=eval_loss(model, evaluation, ctx.device, dtype))
