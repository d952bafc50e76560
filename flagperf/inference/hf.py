"""transformers models for the inference cases: random init from a config, or local weights; never a download."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from flagperf.inference.config import RANDOM_WEIGHTS


def build(model_class: type[PreTrainedModel], config: PretrainedConfig, checkpoint_path: str | None
          ) -> PreTrainedModel:
    """``model_class`` with random weights, or the weights in a local folder (save_pretrained's layout). The
    attention implementation ``config`` names holds for both (from_pretrained would pick its own default)."""
    if checkpoint_path is None:
        torch.manual_seed(0)
        model = model_class(config)
        setattr(model, RANDOM_WEIGHTS, True)  # the result says its accuracy is not the model's
        return model
    return model_class.from_pretrained(Path(checkpoint_path), local_files_only=True,
                                       attn_implementation=config._attn_implementation)


def kv_cache_name(model: PreTrainedModel) -> str:
    """The name of ``model``'s KV cache, as its forward's argument and in its output: transformers 5 renamed
    past_key_values to cache (the old name warns, and goes in 5.40); 4.x knows only past_key_values."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class Logits(torch.nn.Module):
    """A transformers model as tensors in, logits out: what ONNX export, engines and evaluators need."""

    def __init__(self, model: PreTrainedModel, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = dict(zip(self.input_names, inputs, strict=True))
        return self.model(**kwargs).logits


def export_image_classifier(model: torch.nn.Module, batch_size: int, crop: int, path: Path) -> None:
    """ONNX of a pixel_values -> logits model with a dynamic batch (resnet50-infer, vit-l-16-infer)."""
    torch.onnx.export(model, (torch.zeros(batch_size, 3, crop, crop),), str(path),
                      input_names=["pixel_values"], output_names=["logits"],
                      dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
