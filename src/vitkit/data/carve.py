"""Splits carved out of a training split: a held-out validation set and nested class-balanced subsets.

The paper's data-scaling study (Figure 4) pre-trains on random subsets of one training set and
early-stops on a validation set, never on the test set. Both come from the training split here:

- ``minival`` images (big_vision's name for the held-out slice of ImageNet's training split) are
  set aside, the same number from every class, and form the split called ``"minival"``;
- of the rest, a ``subset`` of images is kept for training, again the same number per class.

Each class's images are put in one random order fixed by ``seed``; the minival takes the first of
each class, the subset the next ones. A smaller subset is therefore always contained in a larger
one (nested, as the paper's JFT subsets are), and the minival never overlaps any of them.

Multi-label data (a labels file whose rows carry several labels: a class and attribute tags) has
no one class per image, so its minival is carved by iterative stratification (Sechidis, Tsoumakas
and Vlahavas, 2011; :func:`multilabel_minival`): every label, tags included, gets about its share
of the minival, whichever label of a row it is. The subset of what is left is taken as for
single-label data, each image counted under its rarest label.
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


def multilabel_minival(rows: torch.Tensor, n_val: int, seed: int) -> torch.Tensor:
    """The images of a multi-label minival, by iterative stratification: each label is to have
    ``n_val / N`` of its images in the minival. The label with the fewest images not yet placed
    goes first; its images, in a random order fixed by ``seed``, each go to the side (minival or
    training) that still wants the most of that label, ties to the side that wants the most images,
    then to training; a side that is full takes no more. Every label is counted, not only a row's
    first or rarest one, so tags that are never the first label of a row get their share too.

    Args:
        rows: multi-hot rows (N, K), one per image (images without a label fill the room left).
        n_val: the images to hold out, at most N.
        seed: the seed of the order images of one label are placed in.

    Returns:
        The int64 positions (sorted) of the ``n_val`` minival images.
    """
    n = rows.shape[0]
    has = rows > 0
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g)  # one random order, so ties fall the same way on every machine
    placed = torch.zeros(n, dtype=torch.bool)
    side = torch.zeros(n, dtype=torch.bool)  # True: minival
    counts = has.sum(0).double()
    want = [counts * (n_val / n), counts * (1 - n_val / n)]  # per label: minival, training
    room = [n_val, n - n_val]
    while (has & ~placed[:, None]).any():
        left = (has & ~placed[:, None]).sum(0)
        label = int(torch.where(left > 0, left, n + 1).argmin())  # fewest images left; ties: lowest index
        for i in order[has[order, label] & ~placed[order]].tolist():
            pick = 0 if (want[0][label], room[0]) > (want[1][label], room[1]) else 1
            pick = pick if room[pick] > 0 else 1 - pick
            placed[i], side[i] = True, pick == 0
            room[pick] -= 1
            want[pick] -= has[i].double()
    for i in order[~placed[order]].tolist():  # images without a label fill what room is left
        pick = 0 if room[0] > room[1] else 1
        side[i] = pick == 0
        room[pick] -= 1
    return side.nonzero().flatten()


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
    if getattr(train, "multilabel", False) and n_val:
        return _carve_multilabel(train, split, orders, n_val, subset, seed)
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
    return _training_subset(train, [o[q:] for o, q in zip(orders, val_quota)], n_val, subset)


def _carve_multilabel(
    train: Dataset, split: str, orders: list[torch.Tensor], n_val: int, subset: float | None, seed: int
) -> Dataset:
    """:func:`carve` for multi-label data: the minival by :func:`multilabel_minival`; every label
    must keep an image to train on; the subset from the rest, each image under its rarest label."""
    rows = train.label_rows
    val = multilabel_minival(rows, n_val, seed)
    in_val = torch.zeros(len(train), dtype=torch.bool)
    in_val[val] = True
    left = (rows[~in_val] > 0).sum(0)
    emptied = [c for c in range(train.num_classes) if left[c] == 0]
    if emptied:
        available = (rows > 0).sum(0).tolist()
        raise DataError(
            f"{train.name}: data.minival of {n_val} images takes every image of label "
            f"{_named(train, available, lambda c: c in emptied)}, leaving none to train on; lower data.minival "
            "or add images"
        )
    if split == MINIVAL:
        return train.subset(val, name=f"{train.name}:minival")
    return _training_subset(train, [o[~in_val[o]] for o in orders], n_val, subset)


def _training_subset(train: Dataset, rest: list[torch.Tensor], n_val: int, subset: float | None) -> Dataset:
    """The training images: ``subset`` of those the minival left (``rest``, each class's in its
    order), balanced over the classes (:func:`balanced_quota`)."""
    k = train.num_classes
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


__all__ = ["MINIVAL", "balanced_quota", "carve", "class_orders", "image_count", "multilabel_minival"]
