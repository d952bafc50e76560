"""Data sets the inference cases share: local readers, and synthetic inputs that say they are synthetic."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from flagperf.training.data import ImageFolder


class SyntheticDataset(Dataset[tuple[torch.Tensor | tuple[torch.Tensor, ...], int]]):
    """Deterministic random inputs (no labels worth scoring): the pipeline reports throughput only."""

    synthetic = True

    def __init__(self, count: int, make: Callable[[torch.Generator], torch.Tensor | tuple[torch.Tensor, ...]],
                 description: str, seed: int = 0) -> None:
        self.count = count
        self.make = make
        self.seed = seed
        self.description = f"synthetic: {count} x {description} (no data set given)"

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], int]:
        return self.make(torch.Generator().manual_seed(self.seed * 1_000_003 + index)), -1


class ImageFolderDataset(ImageFolder):
    """An ImageNet-style folder (<root>/<class>/<image>), resized and center-cropped (the eval transform)."""

    synthetic = False

    def __init__(self, root: str | Path, resize: int, crop: int) -> None:
        super().__init__(root, resize, crop, train=False)
        self.description = f"{root}: {len(self.samples)} images in {len(self.classes)} classes"


def loader(dataset: Dataset, batch_size: int, num_workers: int) -> DataLoader:
    """FlagPerf's loader settings: no shuffling, the last partial batch dropped (every batch one shape)."""
    if len(dataset) < batch_size:  # type: ignore[arg-type]
        from flagperf.errors import CaseUserError

        raise CaseUserError(f"the data set has {len(dataset)} items, fewer than one batch of {batch_size}")  # type: ignore[arg-type]
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, drop_last=True, num_workers=num_workers,
                      persistent_workers=num_workers > 0)


def top1(outputs: list[torch.Tensor], labels: torch.Tensor) -> float:
    """Top-1 accuracy of a batch, on the CPU (FlagPerf's evaluator for classification)."""
    return float((outputs[0].float().argmax(dim=-1) == labels).float().mean())
