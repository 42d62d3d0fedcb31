"""Splits carved out of a training split: a held-out validation set and nested class-balanced subsets.

The paper's data-scaling study (Figure 4) pre-trains on random subsets of one training set and
early-stops on a validation set, never on the test set. Both come from the training split here:

- ``minival`` images (big_vision's name for the held-out slice of ImageNet's training split) are
  set aside, the same number from every class, and form the split called ``"minival"``;
- of the rest, a ``subset`` of images is kept for training, again the same number per class.

Each class's images are put in one random order fixed by ``seed``; the minival takes the first of
each class, the subset the next ones. A smaller subset is therefore always contained in a larger
one (nested, as the paper's JFT subsets are), and the minival never overlaps any of them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import DataError
from .base import Dataset

MINIVAL = "minival"
"""The name of the split held out of "train" for validation (:func:`carve`)."""


def image_count(value: float, total: int, what: str) -> int:
    """An image count: an integer is a count, a number in (0, 1) a fraction of ``total``.

    Args:
        value: a whole number of images, or a fraction in (0, 1); 1 (``1.0`` too) is all of
            ``total``.
        total: the images a fraction is of.
        what: the option's name, for the error (``"minival"``, ``"subset"``).

    Returns:
        The count: a fraction rounded, at least 1.

    Raises:
        DataError: a negative value, NaN, or a number above 1 that is not whole.
    """
    if value != value or value < 0:  # NaN or negative
        raise DataError(f"data.{what} must be a count or a fraction in (0, 1], got {value}")
    if 0 < value < 1:
        return max(1, round(value * total))
    if value == 1:  # 1.0 from YAML or --set: the whole split (one image would be no subset)
        return total
    if value != int(value):
        raise DataError(f"data.{what} must be a whole number of images or a fraction in (0, 1], got {value}")
    return int(value)


def _labels(dataset: Dataset) -> torch.Tensor:
    labels = getattr(dataset, "labels", None)
    if labels is None or not hasattr(dataset, "subset"):
        raise DataError(
            f"{dataset.name}: data.minival and data.subset need a source whose images can be picked one "
            "by one (an in-memory dataset or an image folder); shards are read as a stream"
        )
    return torch.as_tensor(labels, dtype=torch.int64)


def class_orders(labels: torch.Tensor, num_classes: int, seed: int) -> list[torch.Tensor]:
    """For every class, the indices of its images in a random order fixed by ``seed``.

    Args:
        labels: int64 class indices (N,).
        num_classes: the number of classes; a class without images gets an empty tensor.
        seed: the seed of the one generator the classes draw from, in class order.

    Returns:
        One int64 tensor a class, in class order, of its positions in ``labels``.
    """
    g = torch.Generator().manual_seed(seed)
    orders = []
    for c in range(num_classes):
        idx = (labels == c).nonzero().flatten()
        orders.append(idx[torch.randperm(len(idx), generator=g)])
    return orders


def balanced_quota(available: list[int], total: int) -> list[int]:
    """How many images to take from each class for ``total`` in all: equal shares (the first
    classes one more when it does not divide), and the share a small class cannot fill spread
    over the others.

    Args:
        available: the images of each class.
        total: the images to take in all.

    Returns:
        The number to take from each class, none more than it has; they sum to ``total``.

    Raises:
        DataError: ``total`` is more than all the images available.
    """
    if total > sum(available):
        raise DataError(f"cannot take {total} images from {sum(available)}")
    quota = [0] * len(available)
    left = total
    while left:
        open_ = [c for c in range(len(available)) if quota[c] < available[c]]
        share, extra = divmod(left, len(open_))
        for i, c in enumerate(open_):
            take = min(share + (1 if i < extra else 0), available[c] - quota[c])
            quota[c] += take
            left -= take
    return quota


def _named(train: Dataset, available: list[int], which: Callable[[int], bool]) -> str:
    """The first few classes ``which`` picks, by name, with their number of images."""
    picked = [c for c in range(len(available)) if which(c)]
    listed = ", ".join(f"{train.classes[c]} ({available[c]})" for c in picked[:5])
    return listed + (f" and {len(picked) - 5} more" if len(picked) > 5 else "")


def carve(train: Dataset, split: str, minival: float = 0, subset: float | None = None, seed: int = 0) -> Dataset:
    """The ``split`` ("minival", or "train") carved out of the training split ``train``.

    ``minival`` and ``subset`` are image counts, or fractions (of the training split, and of
    what is left after the minival). A subset of 1.0 (or None) keeps every remaining image.

    Args:
        train: the training split; a source whose images can be picked one by one (it has
            ``labels`` and ``subset``: in-memory data, an image folder, a labels file).
        split: "minival" for the held-out images; any other value gives the training images.
        minival: the images held out, as the same number of each class as far as they go
            (:func:`balanced_quota`): a count, or a fraction of ``train``; 0: none.
        subset: the training images kept of those the minival leaves, balanced the same way: a
            count, or a fraction of them; None or 1.0: all of them.
        seed: the seed of each class's order (:func:`class_orders`): the minival takes the
            first of each class, the subset the next ones.

    Returns:
        The split, a subset of ``train`` named ``NAME:minival`` or ``NAME[N]``; ``train`` itself
        when there is no minival and the subset is all of it.

    Raises:
        DataError: a source that cannot be picked from (shards), a bad count, a minival larger
            than ``train``, smaller than its number of classes, or that takes every image of a
            class, a minival asked of a class without images, a subset larger than what is left or smaller than
            the number of classes, or "minival" asked for with no minival.
    """
    labels = _labels(train)
    k = train.num_classes
    orders = class_orders(labels, k, seed)
    n_val = image_count(minival, len(train), "minival")
    if n_val > len(train):
        raise DataError(f"{train.name}: data.minival of {n_val} images is more than its {len(train)} images")
    available = [len(o) for o in orders]
    val_quota = balanced_quota(available, n_val) if n_val else [0] * k
    if n_val and min(val_quota) == 0:
        if n_val < k:
            raise DataError(f"{train.name}: data.minival of {n_val} images cannot hold one of each of its {k} classes")
        raise DataError(f"{train.name}: no images of class {_named(train, available, lambda c: available[c] == 0)}")
    emptied = [c for c in range(k) if val_quota[c] and val_quota[c] == available[c]]
    if emptied:
        raise DataError(
            f"{train.name}: data.minival of {n_val} images takes every image of class "
            f"{_named(train, available, lambda c: c in emptied)}, leaving none to train on; lower data.minival "
            "or add images"
        )
    if split == MINIVAL:
        if not n_val:
            raise DataError(f"{train.name}: split 'minival' needs data.minival, the number of images to hold out")
        return train.subset(torch.cat([o[:q] for o, q in zip(orders, val_quota)]), name=f"{train.name}:minival")
    rest = [o[q:] for o, q in zip(orders, val_quota)]
    n_rest = sum(len(r) for r in rest)
    n_sub = n_rest if subset is None else image_count(subset, n_rest, "subset")
    if n_sub > n_rest:
        raise DataError(
            f"{train.name}: data.subset of {n_sub} images is larger than the {n_rest} training images "
            f"left after a minival of {n_val}"
        )
    if n_sub < k:
        raise DataError(f"{train.name}: data.subset of {n_sub} images cannot hold one of each of its {k} classes")
    quota = balanced_quota([len(r) for r in rest], n_sub)
    keep = torch.cat([r[:q] for r, q in zip(rest, quota)]).sort().values
    if n_sub == len(train):
        return train
    return train.subset(keep, name=f"{train.name}[{n_sub}]")


__all__ = ["MINIVAL", "balanced_quota", "carve", "class_orders", "image_count"]
