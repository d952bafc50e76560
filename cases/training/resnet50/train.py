"""resnet50: image classification on an ImageNet-style folder (a local path; nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import Field, field_validator
from torch.utils.data import DataLoader
from transformers import ResNetConfig, ResNetForImageClassification

from flagperf.errors import CaseUserError
from flagperf.training.data import ImageFolder
from flagperf.training.driver import TrainingConfig, TrainingContext

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Config(TrainingConfig):
    data_dir: str | None
    resize: int = Field(ge=8)
    crop: int = Field(ge=8)
    depths: list[int] = Field(min_length=1)
    hidden_sizes: list[int] = Field(min_length=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    momentum: float = Field(ge=0, lt=1)
    weight_decay: float = Field(ge=0)
    num_workers: int = Field(ge=0, le=64)

    @field_validator("data_dir")
    @classmethod
    def _folder(cls, value: str | None) -> str | None:
        if value is not None and (not (Path(value) / "train").is_dir() or not (Path(value) / "val").is_dir()):
            raise ValueError(f"{value} needs train/<class>/ and val/<class>/ folders")
        return value


@torch.no_grad()
def top1(model: torch.nn.Module, loader: DataLoader, device: torch.device) -> float:
    model.eval()
    correct = total = 0
    for x, y in loader:
        predicted = model(pixel_values=x.to(device)).logits.argmax(dim=1).cpu()
        correct += int((predicted == y).sum())
        total += len(y)
    model.train()
    return correct / total


def run(config: Config, ctx: TrainingContext) -> None:
    if config.data_dir is None:
        raise CaseUserError("set data_dir to an ImageNet-style folder with train/<class>/ and val/<class>/ "
                            "(a local path; nothing is downloaded)")
    train = ImageFolder(Path(config.data_dir) / "train", config.resize, config.crop, train=True, seed=config.seed)
    val = ImageFolder(Path(config.data_dir) / "val", config.resize, config.crop, train=False)
    if val.classes != train.classes:
        raise CaseUserError(f"{config.data_dir}: train/ and val/ have different classes")
    loader = ctx.loader(train, config.batch_size, num_workers=config.num_workers,
                        drop_last=len(train) >= config.batch_size * ctx.world_size)
    val_loader = DataLoader(val, batch_size=config.batch_size, num_workers=config.num_workers)
    model = ctx.wrap(ResNetForImageClassification(ResNetConfig(
        depths=config.depths, hidden_sizes=config.hidden_sizes, num_labels=len(train.classes))))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.max_epochs)
    loss_fn = torch.nn.CrossEntropyLoss()
    dtype = DTYPES[config.precision]
    ctx.init_done()
    for _epoch in ctx.epochs():
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_fn(model(pixel_values=x.to(ctx.device)).logits, y.to(ctx.device))
            loss.backward()
            optimizer.step()
            ctx.step(len(x), loss=float(loss))
        scheduler.step()
        ctx.evaluate(top1=top1(model, val_loader, ctx.device))
