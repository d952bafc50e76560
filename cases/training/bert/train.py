"""bert: masked-language-model pretraining; tokens from a local .npy file, or synthetic (marked).

Shape: ``model`` names a preset (flagperf.training.shapes.BERT_PRESETS: bert-large, bert-base, tiny) and the
size keys replace its fields one by one."""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from torch.utils.data import TensorDataset
from transformers import BertConfig, BertForMaskedLM

from flagperf.training.config import LocalPath, TrainingConfig
from flagperf.training.data import counting_sequences, token_windows
from flagperf.training.driver import TrainingContext
from flagperf.training.shapes import BERT_PRESETS, BertShape, matmul_parameters, resolve_shape

IGNORE = -100  # positions the loss skips
SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads")


class Config(TrainingConfig):
    mask_probability: float = Field(gt=0, lt=1)
    model: str
    vocab_size: int | None = Field(default=None, ge=8)
    hidden_size: int | None = Field(default=None, ge=8)
    num_layers: int | None = Field(default=None, ge=1)
    num_heads: int | None = Field(default=None, ge=1)
    intermediate_size: int | None = Field(default=None, ge=8)
    seq_len: int = Field(ge=4)
    data_path: LocalPath = None
    checkpoint_path: LocalPath = None
    synthetic_sequences: int = Field(ge=8)
    batch_size: int = Field(ge=1, description="per process")
    lr: float = Field(gt=0)

    @model_validator(mode="after")
    def _shape(self) -> Config:
        shape = self.shape()
        if shape.hidden_size % shape.num_heads:
            raise ValueError(f"hidden_size {shape.hidden_size} is not a multiple of num_heads {shape.num_heads}")
        return self

    def shape(self) -> BertShape:
        return resolve_shape(BERT_PRESETS, self.model, {k: getattr(self, k) for k in SIZE_KEYS})


def mask(tokens: torch.Tensor, probability: float, mask_id: int, generator: torch.Generator
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs with masked positions replaced by mask_id, labels with IGNORE where not masked)."""
    chosen = torch.rand(tokens.shape, generator=generator, device=tokens.device) < probability
    return torch.where(chosen, torch.full_like(tokens, mask_id), tokens), torch.where(chosen, tokens, IGNORE)


@torch.no_grad()
def mlm_accuracy(model: torch.nn.Module, data: torch.Tensor, config: Config, ctx: TrainingContext) -> float:
    model.eval()
    inputs, labels = mask(data, config.mask_probability, config.shape().vocab_size - 1,
                          torch.Generator().manual_seed(1))
    correct = total = 0
    for x, y in zip(inputs.split(config.batch_size), labels.split(config.batch_size), strict=True):
        with ctx.autocast():
            predicted = model(input_ids=ctx.to_device(x)).logits.argmax(-1).cpu()
        chosen = y != IGNORE
        correct += int((predicted[chosen] == y[chosen]).sum())
        total += int(chosen.sum())
    model.train()
    return correct / total if total else 0.0


def run(config: Config, ctx: TrainingContext) -> None:
    shape = config.shape()
    if config.data_path:
        # The last id is [MASK]: the file's ids must stay below it.
        data, synthetic = token_windows(config.data_path, config.seq_len - 1, shape.vocab_size - 1), False
    else:
        data, synthetic = counting_sequences(config.synthetic_sequences, config.seq_len - 1,
                                             shape.vocab_size - 1, config.seed), True  # the last id is [MASK]
    n_eval = max(1, len(data) // 10)
    evaluation, train = data[:n_eval], data[n_eval:]
    loader = ctx.loader(TensorDataset(train), config.batch_size, drop_last=True)
    if config.checkpoint_path:
        model = BertForMaskedLM.from_pretrained(config.checkpoint_path, local_files_only=True)
    else:
        with ctx.device:
            model = BertForMaskedLM(BertConfig(
                vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
                num_attention_heads=shape.num_heads, intermediate_size=shape.intermediate_size,
                max_position_embeddings=config.seq_len, attn_implementation="sdpa"))
    ctx.language_model(matmul_parameters(model), tokens_per_sample=config.seq_len, synthetic=synthetic,
                       layers=model.config.num_hidden_layers, hidden=model.config.hidden_size)
    ctx.extra["model"] = config.model if not config.checkpoint_path else config.checkpoint_path
    model = ctx.wrap(model)
    optimizer = ctx.optimizer(torch.optim.AdamW, model.parameters(), lr=config.lr)
    generator = torch.Generator(device=ctx.device).manual_seed(config.seed + ctx.rank)
    ctx.init_done()
    for _epoch in ctx.epochs():
        for (batch,) in ctx.batches(loader):
            # Masked on the device: fresh host tensors would be copied from pageable memory, a sync per step.
            inputs, labels = mask(ctx.to_device(batch), config.mask_probability, shape.vocab_size - 1, generator)
            with ctx.autocast():
                loss = model(input_ids=inputs, labels=labels).loss
            ctx.backward(loss, optimizer)
            ctx.step(len(batch), loss=loss)
        ctx.evaluate(mlm_accuracy=mlm_accuracy(model, evaluation, config, ctx))
