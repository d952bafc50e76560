"""digits-mlp: an MLP trained to a target test accuracy on scikit-learn's bundled digits data set."""

from __future__ import annotations

import torch
from pydantic import Field
from torch.utils.data import TensorDataset

from flagperf.training.config import TrainingConfig
from flagperf.training.data import digits_split
from flagperf.training.driver import TrainingContext


class Config(TrainingConfig):
    test_fraction: float = Field(gt=0, lt=1)
    batch_size: int = Field(ge=1, le=4096, description="per process")
    lr: float = Field(gt=0)
    momentum: float = Field(ge=0, lt=1)
    hidden: int = Field(ge=1, le=4096)


def datasets(config: Config) -> tuple[TensorDataset, TensorDataset]:
    train, test = digits_split(config.seed, config.test_fraction)
    return TensorDataset(*train), TensorDataset(*test)


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: TensorDataset, device: torch.device) -> float:
    model.eval()
    x, y = data.tensors
    predicted = model(x.to(device)).argmax(dim=1).cpu()
    model.train()
    return float((predicted == y).float().mean())


def run(config: Config, ctx: TrainingContext) -> None:
    train, test = datasets(config)
    loader = ctx.loader(train, config.batch_size)
    model = ctx.wrap(torch.nn.Sequential(torch.nn.Linear(64, config.hidden), torch.nn.ReLU(),
                                         torch.nn.Linear(config.hidden, 10)))
    optimizer = ctx.optimizer(torch.optim.SGD, model.parameters(), lr=config.lr, momentum=config.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    ctx.init_done()
    for _epoch in ctx.epochs():
        for x, y in ctx.batches(loader):
            with ctx.autocast():
                loss = loss_fn(model(ctx.to_device(x)), ctx.to_device(y))
            ctx.backward(loss, optimizer)
            ctx.step(len(x), loss=loss)
        ctx.evaluate(accuracy=accuracy(model, test, ctx.device))
