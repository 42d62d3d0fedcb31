"""What every data source gives: uint8 image batches (B, C, H, W) and int64 labels.

Two kinds of source:
- :class:`ArrayDataset`: the whole split in memory as one uint8 tensor (Fashion-MNIST, MNIST,
  CIFAR, synthetic). Batches are slices of a seeded permutation: cheap, and exactly
  reproducible from (seed, epoch, batch index), which is what resuming needs.
- streaming sources (image folders, WebDataset shards) decode with Pillow in loader workers;
  they derive from ``StreamingDataset`` in ``folder.py`` (``shards.py`` too).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..errors import DataError


@dataclass
class SkipCounter:
    """Images that could not be decoded, counted per epoch and reported at its end."""

    skipped: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.skipped += 1
        if len(self.examples) < 5:
            self.examples.append(what)

    def reset(self) -> tuple[int, list[str]]:
        out = (self.skipped, list(self.examples))
        self.skipped, self.examples = 0, []
        return out


class Dataset:
    """Common surface of all sources."""

    name: str = "dataset"
    classes: list[str]
    in_chans: int
    image_size: tuple[int, int]  # (H, W) of the uint8 batches the loader yields

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        raise NotImplementedError

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        start_batch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        num_workers: int = 0,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (uint8 images (B, C, H, W), int64 labels (B,)) for one epoch.

        ``batch_size`` is the global batch: with ``world_size > 1`` each rank gets a disjoint
        1/world_size of every batch (so the global batch equals a one-process run's).
        ``start_batch`` skips that many batches of the epoch (resuming mid-epoch).
        """
        raise NotImplementedError

    def steps_per_epoch(self, batch_size: int, world_size: int = 1, drop_last: bool = True) -> int:
        n, b = len(self), batch_size
        return n // b if drop_last else -(-n // b)

    skips: SkipCounter


class ArrayDataset(Dataset):
    """A split held in memory: ``images`` uint8 (N, C, H, W), ``labels`` int64 (N,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: list[str], name: str = "arrays") -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise DataError(f"{name}: images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise DataError(f"{name}: {labels.shape[0]} labels for {images.shape[0]} images")
        self.images = images.contiguous()
        self.labels = labels.long()
        self.classes = list(classes)
        self.name = name
        self.in_chans = images.shape[1]
        self.image_size = (images.shape[2], images.shape[3])
        self.skips = SkipCounter()

    def __len__(self) -> int:
        return self.images.shape[0]

    def order(self, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
        if not shuffle:
            return torch.arange(len(self))
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return torch.randperm(len(self), generator=g)

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        start_batch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        num_workers: int = 0,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        idx = self.order(shuffle, seed, epoch)
        global_b = batch_size
        n = len(idx) // global_b * global_b if drop_last else len(idx)
        for start in range(start_batch * global_b, n, global_b):
            chunk = idx[start : start + global_b]
            local = chunk[rank::world_size] if world_size > 1 else chunk
            if len(local) == 0:
                continue
            yield self.images[local], self.labels[local]

    def subset(self, indices: torch.Tensor, name: str | None = None) -> ArrayDataset:
        return ArrayDataset(self.images[indices], self.labels[indices], self.classes, name or self.name)
