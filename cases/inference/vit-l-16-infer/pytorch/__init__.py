"""vit-l-16-infer: ViT-L/16 top-1 on an ImageNet-style folder, or synthetic images (throughput only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch.utils.data import DataLoader
from transformers import ViTConfig, ViTForImageClassification

from flagperf.inference.config import InferenceConfig
from flagperf.inference.data import ImageFolderDataset, SyntheticDataset, loader, top1
from flagperf.inference.engines import InferenceEngine
from flagperf.inference.hf import Logits, build, export_image_classifier
from flagperf.training.config import LocalPath

ACCURACY = "top1"


class Config(InferenceConfig):
    item_name: ClassVar[str] = "images"
    artifact_neutral_keys: ClassVar[frozenset[str]] = frozenset({"data_dir", "synthetic_images"})
    # Defaults for the keys FlagPerf's configurations.yaml does not have, so FlagPerf's file loads unchanged.
    data_dir: LocalPath = Field(default=None, description="ImageNet-style folder: <class>/<image>, classes in "
                                                          "sorted order")
    checkpoint_path: LocalPath = Field(default=None, description="a save_pretrained folder; null: random "
                                                                 "weights")
    synthetic_images: int = Field(default=2048, ge=1)
    hidden_size: int = Field(default=1024, ge=1)
    num_hidden_layers: int = Field(default=24, ge=1)
    num_attention_heads: int = Field(default=16, ge=1)
    intermediate_size: int = Field(default=4096, ge=1)
    patch_size: int = Field(ge=1)
    resize: int = Field(ge=8)
    crop: int = Field(ge=8)
    num_labels: int = Field(ge=2)
    attention: Literal["sdpa", "eager"] = Field(default="sdpa", description="transformers' attn_implementation "
                                                                            "of the model")


def build_dataloader(config: Config) -> DataLoader:
    if config.data_dir is not None:
        dataset: Any = ImageFolderDataset(config.data_dir, config.resize, config.crop)
    else:
        dataset = SyntheticDataset(config.synthetic_images, lambda g: torch.randn(3, config.crop, config.crop,
                                                                                  generator=g),
                                   f"3x{config.crop}x{config.crop} normal noise")
    return loader(dataset, config.batch_size, config.num_workers)


def create_model(config: Config) -> torch.nn.Module:
    hf = ViTConfig(hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                   num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
                   image_size=config.crop, patch_size=config.patch_size, num_labels=config.num_labels,
                   attn_implementation=config.attention)
    return Logits(build(ViTForImageClassification, hf, config.checkpoint_path), ("pixel_values",))


def evaluator(outputs: list[torch.Tensor], labels: torch.Tensor) -> float:
    return top1(outputs, labels)


def model_forward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(*inputs)]


def export_model(model: torch.nn.Module, config: Config, path: Path) -> None:
    export_image_classifier(model, config.batch_size, config.crop, path)


def engine_forward(engine: InferenceEngine, inputs: list[torch.Tensor]) -> tuple[Any, float]:
    return engine(inputs)
