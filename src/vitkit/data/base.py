"""What every data source gives: uint8 image batches (B, C, H, W) and int64 labels.

Two kinds of source:
- :class:`ArrayDataset`: the whole split in memory as one uint8 tensor (Fashion-MNIST, MNIST,
  CIFAR, synthetic). Batches are slices of a seeded permutation: cheap, and exactly
  reproducible from (seed, epoch, batch index), which is what resuming needs.
- streaming sources (image folders, WebDataset shards) decode with Pillow in loader workers;
  they derive from ``StreamingDataset`` (``streaming.py``).
Both cut an epoch into batches by the same :class:`~vitkit.data.plan.BatchPlan`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..errors import DataError
from .plan import BatchPlan


@dataclass
class SkipCounter:
    """Images that could not be decoded, counted per epoch and reported at its end.

    Attributes:
        skipped: the images skipped since the last :meth:`reset`.
        examples: up to five of them, each with why it failed.
    """

    skipped: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        """Count one image that could not be decoded.

        Args:
            what: the image and why it failed, as a report shows it; the first five of an
                epoch are kept as examples.
        """
        self.skipped += 1
        if len(self.examples) < 5:
            self.examples.append(what)

    def reset(self) -> tuple[int, list[str]]:
        """What was counted since the last reset, and a fresh start for the next epoch.

        Returns:
            The number of images skipped and up to five examples.
        """
        out = (self.skipped, list(self.examples))
        self.skipped, self.examples = 0, []
        return out


class Dataset:
    """Common surface of all sources.

    :meth:`batches` is the one signature callers use; it checks the arguments once, as a
    :class:`BatchPlan`, and each source only implements :meth:`epoch_batches` for a plan.
    """

    name: str = "dataset"
    classes: list[str]
    in_chans: int
    image_size: tuple[int, int]  # (H, W) of the uint8 batches the loader yields
    skips: SkipCounter

    @property
    def num_classes(self) -> int:
        """The number of classes, ``len(classes)``."""
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
        repeats: int = 1,
        sizes: tuple[int, ...] = (),
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (uint8 images (B, C, H, W), int64 labels (B,)) for one epoch.

        ``batch_size`` is the global batch: with ``world_size > 1`` each rank gets a disjoint
        1/world_size of every batch (so the global batch equals a one-process run's).
        ``start_batch`` skips that many batches of the epoch (resuming mid-epoch).
        ``num_workers`` decoding processes, for sources that decode (the order does not depend on it).
        ``repeats``: each image that many times in a row (repeated augmentation; see :class:`BatchPlan`).
        Bad arguments raise ``ValueError`` here, before the first batch is asked for.

        Args:
            batch_size: the global batch, summed over the ranks.
            shuffle: permute the epoch by (seed, epoch); else the source's own order.
            seed: the run's seed.
            epoch: the epoch, from 0.
            start_batch: global batches of the epoch to skip.
            rank: this process's rank, ``0..world_size - 1``.
            world_size: the processes the global batch is split among.
            drop_last: leave out a short last batch.
            num_workers: decoding processes (0: decode in this process).
            repeats: how many times in a row each image comes, from 1.
            sizes: global batch sizes each batch draws one of (:class:`BatchPlan`); empty:
                every batch ``batch_size``.

        Returns:
            An iterator of (uint8 images (B, C, H, W), labels): int64 class indices (B,), or
            float32 multi-hot rows (B, K) for a multi-label labels file.

        Raises:
            ValueError: a ``batch_size`` or ``repeats`` below 1, a negative ``start_batch`` or a
                ``rank`` outside ``0..world_size - 1``.
        """
        plan = BatchPlan(batch_size, shuffle, seed, epoch, start_batch, rank, world_size, drop_last, repeats, sizes)
        return self.epoch_batches(plan, num_workers)

    def epoch_batches(self, plan: BatchPlan, num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of one epoch as ``plan`` cuts it; what each source implements.

        Args:
            plan: the epoch's batches for this rank.
            num_workers: decoding processes, for sources that decode.

        Returns:
            An iterator of (uint8 images (B, C, H, W), labels), as :meth:`batches` describes.

        Raises:
            NotImplementedError: here, in the base class.
        """
        raise NotImplementedError


class ArrayDataset(Dataset):
    """A split held in memory: ``images`` uint8 (N, C, H, W), ``labels`` int64 (N,).

    Args:
        images: the images, uint8 (N, C, H, W); kept (made contiguous), not copied.
        labels: one class index per image (N,); stored as int64.
        classes: the class names, by index.
        name: the split's name in messages and reports.

    Raises:
        DataError: images that are not uint8 (N, C, H, W), or a label count that differs.
    """

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

    def epoch_batches(self, plan: BatchPlan, num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Slices of the in-memory tensors; ``num_workers`` is not needed (nothing to decode).

        Args:
            plan: the epoch's batches for this rank.
            num_workers: ignored.

        Yields:
            (uint8 images (B, C, H, W), int64 labels (B,)), this rank's share of each global
            batch from ``plan.start_batch`` on.
        """
        for local in plan.index_batches(len(self)):
            yield self.images[local], self.labels[local]

    def subset(self, indices: torch.Tensor, name: str | None = None) -> ArrayDataset:
        """The images at ``indices``, as a dataset of their own.

        Args:
            indices: int64 positions of the images, in the order the subset keeps them.
            name: the subset's name; None: this dataset's.

        Returns:
            A new dataset holding copies of those images and labels, with the same classes.
        """
        return ArrayDataset(self.images[indices], self.labels[indices], self.classes, name or self.name)
