"""digits-infer: an MLP trained on scikit-learn's digits by the case itself, then inferred eagerly and
through the compiled engine; real top-1 accuracy on the held-out fifth."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field
from torch.utils.data import DataLoader, TensorDataset

from flagperf.inference.config import InferenceConfig
from flagperf.inference.data import loader, top1
from flagperf.inference.engines import InferenceEngine
from flagperf.training.config import LocalPath
from flagperf.training.data import digits_split

ACCURACY = "top1"


class Config(InferenceConfig):
    seed: int
    test_fraction: float = Field(gt=0, lt=1)
    hidden: int = Field(ge=1, le=4096)
    epochs: int = Field(ge=1, le=1000)
    lr: float = Field(gt=0)
    checkpoint_path: LocalPath = Field(description="saved state_dict (torch.save); null: train here")
    attention: Literal["not applicable"] = Field(description="a multilayer perceptron has no attention")


class DigitsData(TensorDataset):
    synthetic = False

    def __init__(self, x: torch.Tensor, y: torch.Tensor, what: str) -> None:
        super().__init__(x, y)
        self.description = f"scikit-learn digits, {what}: {len(x)} images of 8x8"


def split(config: Config) -> tuple[DigitsData, DigitsData]:
    train, test = digits_split(config.seed, config.test_fraction)
    return DigitsData(*train, "training split"), DigitsData(*test, "held-out split")


def build_dataloader(config: Config) -> DataLoader:
    return loader(split(config)[1], config.batch_size, config.num_workers)


def create_model(config: Config) -> torch.nn.Module:
    torch.manual_seed(config.seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, config.hidden), torch.nn.ReLU(), torch.nn.Linear(config.hidden, 10))
    if config.checkpoint_path is not None:
        model.load_state_dict(torch.load(Path(config.checkpoint_path), map_location="cpu", weights_only=True))
        return model
    # The case's own setup: about a second of SGD on the training split (untimed, step b).
    train = split(config)[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    batches = DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(config.seed))
    for _ in range(config.epochs):
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    return model


def evaluator(outputs: list[torch.Tensor], labels: torch.Tensor) -> float:
    return top1(outputs, labels)


def model_forward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(inputs[0])]


def export_model(model: torch.nn.Module, config: Config, path: Path) -> None:
    torch.onnx.export(model, (torch.zeros(config.batch_size, 64),), str(path), input_names=["pixels"],
                      output_names=["logits"], dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}},
                      dynamo=False)


def engine_forward(engine: InferenceEngine, inputs: list[torch.Tensor]) -> tuple[Any, float]:
    return engine(inputs)
