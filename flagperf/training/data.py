"""Data readers the training cases share: local files only (nothing is downloaded), and synthetic data
only when no path is given, in which case the result says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from flagperf.config.files import LocalPath as LocalPath  # the cases' data paths; defined without torch
from flagperf.errors import CaseUserError

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png", ".bmp", ".webp"}
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def token_windows(path: str, seq_len: int, vocab_size: int) -> torch.Tensor:
    """Consecutive windows of seq_len + 1 token ids from a 1-D .npy array (read through a memory map)."""
    tokens = np.load(path, mmap_mode="r")
    if tokens.ndim != 1 or tokens.max(initial=0) >= vocab_size or tokens.min(initial=0) < 0:
        raise CaseUserError(f"{path}: expected a 1-D array of token ids in [0, {vocab_size})")
    n = (len(tokens) - 1) // seq_len
    if n < 2:
        raise CaseUserError(f"{path}: fewer than two sequences of {seq_len} tokens")
    data = torch.from_numpy(np.array(tokens[: n * seq_len + 1], dtype=np.int64))  # a copy, not the map
    return torch.stack([data[i * seq_len: (i + 1) * seq_len + 1] for i in range(n)])


def counting_sequences(count: int, seq_len: int, vocab_size: int, seed: int) -> torch.Tensor:
    """Synthetic sequences with a learnable rule: from a random start, a random stride, modulo the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab_size, (count, 1), generator=g)
    stride = torch.randint(1, 5, (count, 1), generator=g)
    return (start + stride * torch.arange(seq_len + 1).unsqueeze(0)) % vocab_size


class ImageFolder(torch.utils.data.Dataset):
    """<root>/<class>/<image>, classes in sorted order (the ImageNet layout), resized and center-cropped."""

    def __init__(self, root: str | Path, resize: int, crop: int, train: bool, seed: int = 0) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise CaseUserError(f"{self.root}: not a folder of class folders")
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.samples = [(f, i) for i, c in enumerate(self.classes) for f in sorted((self.root / c).iterdir())
                        if f.suffix.lower() in IMAGE_SUFFIXES]
        if not self.samples:
            raise CaseUserError(f"{self.root}: no images in class folders")
        self.resize, self.crop, self.train = resize, crop, train
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image  # only image cases need Pillow; digits and token cases must not

        path, label = self.samples[index]
        with Image.open(path) as image:
            image = image.convert("RGB")
            w, h = image.size
            scale = self.resize / min(w, h)
            image = image.resize((max(self.crop, round(w * scale)), max(self.crop, round(h * scale))),
                                 Image.Resampling.BILINEAR)
            w, h = image.size
            if self.train:  # random crop and flip, as training does
                left = int(torch.randint(0, w - self.crop + 1, (1,), generator=self.generator))
                top = int(torch.randint(0, h - self.crop + 1, (1,), generator=self.generator))
            else:
                left, top = (w - self.crop) // 2, (h - self.crop) // 2
            image = image.crop((left, top, left + self.crop, top + self.crop))
            if self.train and bool(torch.rand(1, generator=self.generator) < 0.5):
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return (pixels - IMAGENET_MEAN) / IMAGENET_STD, label


def digits_split(seed: int, test_fraction: float) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                           tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's bundled digits (8x8, pixels scaled to [0, 1]) as ((x_train, y_train), (x_test, y_test)),
    shuffled by ``seed``: the same split for the training case and the inference case that reuses it."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])
