"""Data sets the inference cases share: local readers, and synthetic inputs that say they are synthetic."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler, default_collate

from flagperf.training.data import ImageFolder


class SyntheticDataset(Dataset[tuple[torch.Tensor | tuple[torch.Tensor, ...], int]]):
    """Deterministic random inputs (no labels worth scoring): the pipeline reports throughput only.

    A pool of at most ``POOL`` distinct items is made once, here, before any worker forks (the workers share
    it copy-on-write), and item i is pool item i % POOL: making a 3x224x224 image from a random generator
    costs milliseconds, and at an accelerator's thousands of images per second the generators, not the
    engine, would set ``whole``."""

    synthetic = True
    POOL = 64

    def __init__(self, count: int, make: Callable[[torch.Generator], torch.Tensor | tuple[torch.Tensor, ...]],
                 description: str, seed: int = 0) -> None:
        self.count = count
        self.seed = seed
        self.pool = [make(torch.Generator().manual_seed(seed * 1_000_003 + i)) for i in range(min(count, self.POOL))]
        repeated = f", {len(self.pool)} distinct, repeated" if count > len(self.pool) else ""
        self.description = f"synthetic: {count} x {description}{repeated} (no data set given)"

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], int]:
        return self.pool[index % len(self.pool)], -1


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


def cast_floating(inputs: Any, dtype: torch.dtype) -> Any:
    """Floating tensors of a batch's inputs in ``dtype``; integer inputs (token ids, masks) unchanged."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype) if inputs.is_floating_point() else inputs
    if isinstance(inputs, list | tuple):
        return type(inputs)(cast_floating(x, dtype) for x in inputs)
    return inputs


class CastInputs:
    """A collate function that makes each batch's inputs in the dtype the model or engine takes, in the
    loader's workers, so nothing converts it inside a timed region. With torch's default collate the items
    are cast before they are stacked: the batch is written once, at its final size, straight into the shared
    memory a worker hands back (half the bytes to stack, pin and copy for FP16, and no second copy of a cast
    batch). A class, not a closure, so spawned workers can pickle it."""

    def __init__(self, collate: Callable[[list[Any]], Any], dtype: torch.dtype) -> None:
        self.collate, self.dtype = collate, dtype

    def __call__(self, items: list[Any]) -> Any:
        # Only torch's own collate is handed cast items: a case's collate may compute in the items' dtype or
        # read fields of its own item type, so its batch is cast afterwards.
        if self.collate is default_collate and all(type(item) is tuple and len(item) == 2 for item in items):
            items = [(cast_floating(inputs, self.dtype), label) for inputs, label in items]
        inputs, labels = self.collate(items)
        return cast_floating(inputs, self.dtype), labels  # a no-op when the items were cast


PREFETCH_FACTOR = 2  # batches each worker keeps ready (pinned FP16 ResNet-50 batches of 256 are 77 MB each)


def _sliced(batch: Any, start: int, stop: int) -> Any:
    """Items start..stop-1 of a collated batch (a tensor, or lists and tuples of tensors): views, no copy."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, list | tuple):
        return type(batch)(_sliced(x, start, stop) for x in batch)
    return batch


def _pinned(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, list | tuple):
        return type(batch)(_pinned(x) for x in batch)
    return batch


class SyntheticBatches:
    """A synthetic data set's batches, made once: collated in the pass's dtype, pinned on an accelerator, and
    handed out again for every batch of every epoch, in the order the case's sequential loader gives them.

    Synthetic items repeat (item i is pool item i % P, P = SyntheticDataset.POOL at most), so a loader's
    workers would remake the same few batches for every batch of the pass. At an accelerator's rate that
    remaking, and the pin thread's copy of each fresh shared-memory batch, bound ``whole`` (ResNet-50 at batch
    256 on an H100: 3,810 images/s whole against 16,457 core). Here loading costs nothing in ``whole``; the
    copy of each batch to the device stays inside it (and inside core).

    One collated block of P + B - 1 items holds every batch: batch k is its items s..s+B-1, s = k*B mod P (a
    view). So the pinned memory is P + B - 1 items, whatever the batch size (not one block per distinct
    batch). The block is only read (copies to the device), never written."""

    def __init__(self, dataset: SyntheticDataset, batch_size: int, batches: int, dtype: torch.dtype | None,
                 pin: bool) -> None:
        pool = len(dataset.pool)
        self.dataset, self.batch_size, self.batches, self.pinned = dataset, batch_size, batches, pin
        collate = CastInputs(default_collate, dtype) if dtype is not None else default_collate
        block = collate([dataset[i % pool] for i in range(pool + batch_size - 1)])
        self.block = _pinned(block) if pin else block
        distinct = min(batches, pool // math.gcd(batch_size, pool))  # batch k and k + distinct hold the same items
        starts = [k * batch_size % pool for k in range(distinct)]
        self.ring = [_sliced(self.block, start, start + batch_size) for start in starts]

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Any]:
        return (self.ring[k % len(self.ring)] for k in range(self.batches))


def makes_batches_once(base: Any) -> bool:
    """Whether with_data_path makes this loader's batches once (SyntheticBatches): a SyntheticDataset (its own
    item rule) whose items a torch DataLoader hands out in order (0, 1, 2 ...) in full batches with torch's
    default collate, as FlagPerf's loaders do."""
    if not isinstance(base, DataLoader) or not isinstance(base.dataset, SyntheticDataset):
        return False
    sampler = base.batch_sampler
    return (type(base.dataset).__getitem__ is SyntheticDataset.__getitem__ and base.collate_fn is default_collate
            and type(sampler) is BatchSampler and type(sampler.sampler) is SequentialSampler and sampler.drop_last
            and base.batch_size is not None)


def with_data_path(base: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """The case's data loader, rebuilt for the device: batches made in ``dtype`` by the workers, in pinned
    (page-locked) host memory on an accelerator so that copies to it are asynchronous, and prefetched. A
    synthetic data set read in order gets its batches made once instead (SyntheticBatches).

    The case's dataset, sampler, collate and worker settings are kept; a loader that is not a map-style
    torch DataLoader is returned as it is (its case owns its data path)."""
    if not isinstance(base, DataLoader) or isinstance(base.dataset, IterableDataset):
        return base
    if makes_batches_once(base):
        assert base.batch_size is not None
        return SyntheticBatches(base.dataset, base.batch_size, len(base), dtype, pin=device.type != "cpu")
    collate = CastInputs(base.collate_fn, dtype) if dtype is not None else base.collate_fn
    workers = base.num_workers
    return DataLoader(base.dataset, **_batching(base), num_workers=workers, collate_fn=collate,
                      pin_memory=device.type != "cpu", timeout=base.timeout, worker_init_fn=base.worker_init_fn,
                      multiprocessing_context=base.multiprocessing_context, generator=base.generator,
                      prefetch_factor=PREFETCH_FACTOR if workers > 0 else None, persistent_workers=workers > 0)


def in_flight_batches(loader: Any) -> int:
    """How many pinned batches a loader can hold at once: each worker's prefetched batches, plus the one in
    use. Page-locked memory is allocated (cudaHostAlloc: pages locked, the driver's lock held, other CUDA
    calls of the process waiting) the first time each of these is made, then reused by torch's caching host
    allocator, so the warm-up must pass through this many batches for a timed pass to start in the steady
    state. 0 for a loader that does not pin."""
    if not isinstance(loader, DataLoader) or not loader.pin_memory:
        return 0
    workers = loader.num_workers
    return (workers * (loader.prefetch_factor or 0) if workers > 0 else 0) + 1


def in_main_process(base: Any) -> Any:
    """The same batches (dataset, sampler, collate), made in the calling process, unpinned: for taking a few
    batches once. A worker loader would go on making and pinning its prefetched batches in the background,
    in the timed region that follows. A loader that is not a torch DataLoader is returned as is."""
    if not isinstance(base, DataLoader):
        return base
    return DataLoader(base.dataset, num_workers=0, collate_fn=base.collate_fn, generator=base.generator,
                      **_batching(base))


def _batching(base: DataLoader) -> dict[str, Any]:
    """How a rebuilt loader batches as ``base`` does."""
    if isinstance(base.dataset, IterableDataset):
        return {"batch_size": base.batch_size, "drop_last": base.drop_last}
    if base.batch_sampler is None:  # batch_size=None: the dataset's items are the batches
        return {"batch_size": None, "sampler": base.sampler}
    return {"batch_sampler": base.batch_sampler}
