"""resnet50: image classification on an ImageNet-style folder (a local path; nothing is downloaded), or on
synthetic images for a throughput-only run (marked in the result).

Shape: ``model`` names a preset (flagperf.training.shapes.RESNET_PRESETS: resnet50, tiny) and the size keys
replace its fields one by one."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, field_validator, model_validator
from torch.utils.data import DataLoader, Dataset
from torch.utils.flop_counter import FlopCounterMode
from transformers import ResNetConfig, ResNetForImageClassification

from flagperf.errors import CaseUserError
from flagperf.training.config import TrainingConfig
from flagperf.training.data import ImageFolder
from flagperf.training.driver import TrainingContext
from flagperf.training.shapes import RESNET_PRESETS, ResNetShape, resolve_shape

SYNTHETIC_CLASSES = 1000
FLOPS_CONVENTION = ("3 x the forward pass's FLOPs (backward counted as twice the forward), forward counted by "
                    "torch.utils.flop_counter at crop x crop: convolutions and matrix products, 2 per multiply-add")


class Config(TrainingConfig):
    data_dir: str | None
    synthetic_images: int | None = Field(default=None, ge=2)
    resize: int = Field(ge=8)
    crop: int = Field(ge=8)
    model: str
    depths: list[int] | None = Field(default=None, min_length=1)
    hidden_sizes: list[int] | None = Field(default=None, min_length=1)
    embedding_size: int | None = Field(default=None, ge=1)
    channels_last: bool
    batch_size: int = Field(ge=1, description="per process")
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

    @model_validator(mode="after")
    def _shape(self) -> Config:
        shape = self.shape()
        if len(shape.depths) != len(shape.hidden_sizes):
            raise ValueError(f"depths {list(shape.depths)} and hidden_sizes {list(shape.hidden_sizes)} need one "
                             "entry per stage each")
        return self

    def shape(self) -> ResNetShape:
        sizes = {"depths": self.depths, "hidden_sizes": self.hidden_sizes, "embedding_size": self.embedding_size}
        return resolve_shape(RESNET_PRESETS, self.model, sizes)


def hf_config(shape: ResNetShape, classes: int) -> ResNetConfig:
    return ResNetConfig(embedding_size=shape.embedding_size, depths=list(shape.depths),
                        hidden_sizes=list(shape.hidden_sizes), layer_type=shape.layer_type, num_labels=classes)


def training_flops_per_image(shape: ResNetShape, classes: int, crop: int) -> float:
    """Counted on the meta device: shapes only, no memory and no arithmetic."""
    with torch.device("meta"):
        model = ResNetForImageClassification(hf_config(shape, classes))
        image = torch.empty(1, 3, crop, crop)
    with FlopCounterMode(display=False) as counter:
        model(pixel_values=image)
    return 3.0 * counter.get_total_flops()


@torch.no_grad()
def top1(model: torch.nn.Module, loader: Iterable[Any], ctx: TrainingContext, channels_last: bool) -> float:
    model.eval()
    correct = total = 0
    for x, y in loader:
        x = ctx.to_device(x)
        with ctx.autocast():
            logits = model(pixel_values=x.contiguous(memory_format=torch.channels_last) if channels_last else x).logits
        correct += int((logits.argmax(dim=1) == ctx.to_device(y)).sum())  # synthetic labels live on the device
        total += len(y)
    model.train()
    return correct / total


def synthetic_batches(config: Config, ctx: TrainingContext) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                                                                       list[tuple[torch.Tensor, torch.Tensor]]]:
    """Random images and labels made on the device, in whole batches (train, val): a throughput run measures
    the model, not an input pipeline (there is none to measure). Each process draws its own; at most four
    distinct batches, cycled, so that memory does not grow with synthetic_images."""
    assert config.synthetic_images is not None
    g = torch.Generator(device=ctx.device).manual_seed(config.seed + ctx.rank)
    size, crop = config.batch_size, config.crop
    count = max(1, config.synthetic_images // size)
    distinct = [(torch.randn(size, 3, crop, crop, generator=g, device=ctx.device),
                 torch.randint(0, SYNTHETIC_CLASSES, (size,), generator=g, device=ctx.device))
                for _ in range(min(count, 4))]
    return [distinct[i % len(distinct)] for i in range(count)], distinct[:1]


def datasets(config: Config) -> tuple[Dataset, Dataset, int]:
    train = ImageFolder(Path(config.data_dir) / "train", config.resize, config.crop, train=True, seed=config.seed)
    val = ImageFolder(Path(config.data_dir) / "val", config.resize, config.crop, train=False)
    if val.classes != train.classes:
        raise CaseUserError(f"{config.data_dir}: train/ and val/ have different classes")
    return train, val, len(train.classes)


def run(config: Config, ctx: TrainingContext) -> None:
    loader: Iterable[Any]
    val_loader: Iterable[Any]
    if config.data_dir is not None:
        train, val, classes = datasets(config)
        loader = ctx.loader(train, config.batch_size, num_workers=config.num_workers,
                            drop_last=len(train) >= config.batch_size * ctx.world_size)
        val_loader = DataLoader(val, batch_size=config.batch_size, num_workers=config.num_workers)
    elif config.synthetic_images is not None:
        (loader, val_loader), classes = synthetic_batches(config, ctx), SYNTHETIC_CLASSES
    else:
        raise CaseUserError("set data_dir to an ImageNet-style folder with train/<class>/ and val/<class>/ "
                            "(a local path; nothing is downloaded), or synthetic_images for a throughput run")
    synthetic = config.data_dir is None
    shape = config.shape()
    with ctx.device:
        model = ResNetForImageClassification(hf_config(shape, classes))
    ctx.flops(training_flops_per_image(shape, classes, config.crop), FLOPS_CONVENTION)
    ctx.extra.update(model=config.model, synthetic_data=synthetic)
    model = ctx.wrap(model, channels_last=config.channels_last)
    optimizer = ctx.optimizer(torch.optim.SGD, model.parameters(), lr=config.lr, momentum=config.momentum,
                              weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.max_epochs)
    loss_fn = torch.nn.CrossEntropyLoss()
    ctx.init_done()
    for _epoch in ctx.epochs():
        for x, y in ctx.batches(loader):
            x = ctx.to_device(x)
            if config.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with ctx.autocast():
                loss = loss_fn(model(pixel_values=x).logits, ctx.to_device(y))
            ctx.backward(loss, optimizer)
            ctx.step(len(x), loss=loss)
        scheduler.step()
        ctx.evaluate(top1=top1(model, val_loader, ctx, config.channels_last))
