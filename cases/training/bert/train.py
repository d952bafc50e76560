"""bert: masked-language-model pretraining; tokens from a local .npy file, or synthetic (marked)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch.utils.data import TensorDataset
from transformers import BertConfig, BertForMaskedLM

from flagperf.training.data import LocalPath, counting_sequences, token_windows
from flagperf.training.driver import TrainingConfig, TrainingContext

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
IGNORE = -100  # positions the loss skips


class Config(TrainingConfig):
    mask_probability: float = Field(gt=0, lt=1)
    vocab_size: int = Field(ge=8)
    hidden_size: int = Field(ge=8)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=8)
    seq_len: int = Field(ge=4)
    data_path: LocalPath = None
    checkpoint_path: LocalPath = None
    synthetic_sequences: int = Field(ge=8)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)


def mask(tokens: torch.Tensor, probability: float, mask_id: int, generator: torch.Generator
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs with masked positions replaced by mask_id, labels with IGNORE where not masked)."""
    chosen = torch.rand(tokens.shape, generator=generator) < probability
    return torch.where(chosen, torch.full_like(tokens, mask_id), tokens), torch.where(chosen, tokens, IGNORE)


@torch.no_grad()
def mlm_accuracy(model: torch.nn.Module, data: torch.Tensor, config: Config, device: torch.device) -> float:
    model.eval()
    inputs, labels = mask(data, config.mask_probability, config.vocab_size - 1, torch.Generator().manual_seed(1))
    logits = model(input_ids=inputs.to(device)).logits.cpu()
    model.train()
    chosen = labels != IGNORE
    return float((logits.argmax(-1)[chosen] == labels[chosen]).float().mean())


def run(config: Config, ctx: TrainingContext) -> None:
    if config.data_path:
        # The last id is [MASK]: the file's ids must stay below it.
        data, synthetic = token_windows(config.data_path, config.seq_len - 1, config.vocab_size - 1), False
    else:
        data, synthetic = counting_sequences(config.synthetic_sequences, config.seq_len - 1,
                                             config.vocab_size - 1, config.seed), True  # the last id is [MASK]
    n_eval = max(1, len(data) // 10)
    evaluation, train = data[:n_eval], data[n_eval:]
    loader = ctx.loader(TensorDataset(train), config.batch_size, drop_last=True)
    if config.checkpoint_path:
        model = BertForMaskedLM.from_pretrained(config.checkpoint_path, local_files_only=True)
    else:
        model = BertForMaskedLM(BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size,
            max_position_embeddings=config.seq_len))
    ctx.language_model(sum(p.numel() for p in model.parameters()), tokens_per_sample=config.seq_len,
                       synthetic=synthetic)
    model = ctx.wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(config.seed + ctx.rank)
    dtype = DTYPES[config.precision]
    ctx.init_done()
    for _epoch in ctx.epochs():
        for (batch,) in loader:
            inputs, labels = mask(batch, config.mask_probability, config.vocab_size - 1, generator)
            optimizer.zero_grad()
            with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(input_ids=inputs.to(ctx.device), labels=labels.to(ctx.device)).loss
            loss.backward()
            optimizer.step()
            ctx.step(len(batch), loss=float(loss))
        ctx.evaluate(mlm_accuracy=mlm_accuracy(model, evaluation, config, ctx.device))
