"""Data sources (uint8 batches) and batched transforms on the compute device.

Every command names its data the same way (``--data``): ``fashion-mnist``, ``mnist``,
``cifar10``, ``cifar100``, ``digits`` (scikit-learn's), ``synthetic``, and further sources
registered in :data:`SOURCES`; a folder path (an image-folder tree), a labels file (``.csv`` or
``.jsonl``, ``labels.py``) or a shard pattern (``shards/train-{000..099}.tar``) through
:data:`PATTERN_SOURCES`. Options a source does not
use are ignored, so that one set of options (``img_size``...) can be passed to any of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import DataError
from .base import ArrayDataset, Dataset, SkipCounter
from .carve import MINIVAL, carve
from .cifar import download_cifar, load_cifar
from .digits import load_digits_dataset
from .folder import FileImages, ImageFolder
from .idx import load_idx_dataset
from .labels import LabelsFile, is_labels_file, read_labels_file
from .mix import MixConfig, Mixed, mix_batch
from .options import option_problem
from .plan import BatchPlan, batch_choice, epoch_order
from .randaugment import RandAugmentConfig, rand_augment
from .shards import ShardDataset, expand_braces, shard_paths
from .streaming import StreamingDataset, decode_image
from .synthetic import synthetic_dataset
from .transforms import EraseConfig, TransformConfig, eval_transform, random_erase, step_generator, train_transform


def _pick(options: dict[str, Any], *names: str) -> dict[str, Any]:
    """The options a source takes, out of all that were passed."""
    return {k: options[k] for k in names if options.get(k) is not None}


def _streamed(options: dict[str, Any], *names: str) -> dict[str, Any]:
    """Options of a streaming source; images load at ``load_size``, else ``img_size``, else 256."""
    picked = _pick(options, "resize", "mode", *names)
    picked["load_size"] = options.get("load_size") or options.get("img_size") or 256
    return picked


_SYNTHETIC_SEEDS = {"train": 0, "test": 1, "val": 2}  # each split its own images


def _unknown_split(name: str, split: str) -> int:
    raise DataError(f"{name}: unknown split {split!r} (train, val or test)")


# name -> loader(split, **options) -> Dataset
SOURCES: dict[str, Callable[..., Dataset]] = {
    "fashion-mnist": lambda split, **kw: load_idx_dataset("fashion-mnist", split, **_pick(kw, "allow_download")),
    "mnist": lambda split, **kw: load_idx_dataset("mnist", split, **_pick(kw, "allow_download")),
    "synthetic": lambda split, **kw: synthetic_dataset(
        n=kw.get("n", 2048 if split == "train" else 512),
        img_size=kw.get("img_size", 32),
        num_classes=kw.get("num_classes", 10),
        in_chans=kw.get("in_chans", 3),
        seed=_SYNTHETIC_SEEDS[split] if split in _SYNTHETIC_SEEDS else _unknown_split("synthetic", split),
        name=f"synthetic/{split}",
    ),
    "cifar10": lambda split, **kw: load_cifar("cifar10", split, **_pick(kw, "root", "allow_download")),
    "cifar100": lambda split, **kw: load_cifar("cifar100", split, **_pick(kw, "root", "allow_download", "label_kind")),
    "digits": lambda split, **kw: load_digits_dataset(split),
}
"""The named data sources: name -> ``loader(split, **options)`` returning the split's dataset."""

ALIASES = {
    "fmnist": "fashion-mnist",
    "fashion_mnist": "fashion-mnist",
    "cifar-10": "cifar10",
    "cifar-100": "cifar100",
}
"""Other spellings of the names of :data:`SOURCES`."""


def build_dataset(
    spec: str,
    split: str = "train",
    *,
    minival: float = 0,
    subset: float | None = None,
    subset_seed: int = 0,
    val: str | None = None,
    multilabel: bool | None = None,
    **options: Any,
) -> Dataset:
    """Resolve a ``--data`` value to a dataset split ("train", "test" or "val").

    ``minival`` and ``subset`` carve the training split (:func:`vitkit.data.carve.carve`): the
    split "minival" is then ``minival`` images held out of "train", and "train" is a
    class-balanced ``subset`` of the rest. Other splits are unchanged.

    A labels file (``spec`` a ``.csv`` or ``.jsonl`` file) reads its validation split ("val",
    "test") from the labels file ``val``; without one, a minival is carved out of it (stratified
    by label: ``minival`` images, by default a tenth and at least one of each class), and "train"
    is the rest. ``multilabel`` True reads a labels file's rows as multi-hot even when each row has
    one label (None: multi-hot when a row has several).

    Args:
        spec: a name of :data:`SOURCES` or :data:`ALIASES` (case ignored), a folder, a labels
            file (``.csv`` or ``.jsonl``) or a shard pattern (``shards/train-{000..099}.tar``).
        split: "train", "test", "val", or "minival" (with ``minival`` given, or for a labels
            file).
        minival: images held out of "train" as the split "minival": a count, or a fraction in
            (0, 1) of the training split; 0: none (a labels file without ``val``: the default of
            :func:`default_minival`).
        subset: the images "train" keeps of what the minival leaves: a count, or a fraction in
            (0, 1]; None: all of them.
        subset_seed: the seed of the order in which each class's images are held out and kept.
        val: a labels file holding the validation images of the labels file ``spec``; only for a
            labels file.
        multilabel: for a labels file: True reads its rows as multi-hot, False as class indices;
            None: multi-hot when a row has several labels.
        **options: options of the source (``img_size``, ``load_size``, ``allow_download``,
            ``root``...; :data:`vitkit.data.options.OPTIONS` lists what each source takes),
            checked before anything is read.

    Returns:
        The dataset of that split.

    Raises:
        DataError: an unknown source, split or option, a bad option value, ``val`` given for a
            source that is not a labels file, "minival" asked for without ``minival``, a carve
            the data cannot give (:func:`vitkit.data.carve.carve`), or data that cannot be read.
    """
    if is_labels_file(spec):
        return _labels_split(spec, split, minival, subset, subset_seed, val, multilabel, options)
    if val:
        raise DataError(f"data.val={val} is the validation file of a labels file; data.name {spec} is not one")
    if minival or subset is not None:
        if split in ("train", MINIVAL):
            return carve(_source(spec, "train", options), split, minival, subset, subset_seed)
    elif split == MINIVAL:
        raise DataError(f"{spec}: split 'minival' needs data.minival, the number of training images to hold out")
    return _source(spec, split, options)


def default_minival(train: Dataset) -> int:
    """The images a minival holds when none is asked for: a tenth, at least one of each class.

    Args:
        train: the training split the minival is carved out of.

    Returns:
        The larger of its number of classes and a tenth of its images (rounded up).
    """
    return max(train.num_classes, -(-len(train) // 10))


def _labels_split(
    spec: str,
    split: str,
    minival: float,
    subset: float | None,
    seed: int,
    val: str | None,
    multilabel: bool | None,
    options: dict[str, Any],
) -> Dataset:
    """A split of a labels file: the validation file's, or carved out of the training file."""
    check_options(spec, options)
    if split not in ("train", "val", "test", MINIVAL):
        raise DataError(f"{spec}: unknown split {split!r} (train, val, test or minival)")
    kw = _streamed(options)
    train = LabelsFile(spec, "train", multilabel=multilabel, **kw)
    if val:
        if split in ("val", "test"):
            return LabelsFile(val, split, classes=train.classes, multilabel=train.multilabel, **kw)
        if split == MINIVAL and not minival:
            raise DataError(f"{spec}: split 'minival' needs data.minival, the number of training images to hold out")
        return carve(train, split, minival, subset, seed) if minival or subset is not None else train
    held = minival or default_minival(train)
    return carve(train, "train" if split == "train" else MINIVAL, held, subset, seed)


def source_kind(spec: str) -> str | None:
    """Which source a ``--data`` value names: a key of :data:`SOURCES`, "folder", "shards", or
    None when it names none (yet: a folder that does not exist).

    Args:
        spec: a ``--data`` value.

    Returns:
        The key of :data:`SOURCES` a name or alias stands for (case ignored); "folder" for an
        existing folder; "labels" for an existing ``.csv`` or ``.jsonl`` file; "shards" for
        anything else with ``.tar`` in it; else None.
    """
    key = ALIASES.get(spec.lower(), spec.lower())
    if key in SOURCES:
        return key
    if os.path.isdir(spec):
        return "folder"
    if is_labels_file(spec):
        return "labels"
    return "shards" if ".tar" in spec else None


def check_options(spec: str, options: dict[str, Any]) -> None:
    """A :class:`DataError` naming the first option the source of ``spec`` does not take, or takes
    another kind of value for (:mod:`vitkit.data.options`).

    Args:
        spec: a ``--data`` value; a value that names no source yet (see :func:`source_kind`)
            has nothing checked.
        options: the options that would be passed to its source, by name (of an option set to
            None, only the name is checked).

    Raises:
        DataError: ``SPEC: option NAME ...``, saying what is wrong with the first bad option
            (an unknown name suggests the closest known one and lists those the source takes).
    """
    kind = source_kind(spec)
    if kind is not None and (bad := option_problem(kind, options)):
        raise DataError(f"{spec}: option {bad[0]} {bad[1]}")


def _source(spec: str, split: str, options: dict[str, Any]) -> Dataset:
    check_options(spec, options)
    key = ALIASES.get(spec.lower(), spec.lower())
    if key in SOURCES:
        return SOURCES[key](split, **options)
    for matcher, loader in PATTERN_SOURCES:
        if matcher(spec):
            return loader(spec, split, **options)
    known = ", ".join(sorted(SOURCES))
    raise DataError(
        f"unknown data {spec!r}: expected one of {known}, a folder, a labels file (.csv, .jsonl) or a shard pattern"
    )


# (predicate on the spec, loader(spec, split, **options)) for folders and shard patterns.
PATTERN_SOURCES: list[tuple[Callable[[str], bool], Callable[..., Dataset]]] = [
    (
        os.path.isdir,
        lambda spec, split, **kw: ImageFolder(spec, split, **_streamed(kw, "val_fraction", "split_seed")),
    ),
    (
        lambda spec: ".tar" in spec,
        lambda spec, split, **kw: ShardDataset(
            spec, split, **_streamed(kw, "num_samples", "shuffle_buffer", "classes", "num_classes", "reader")
        ),
    ),
]
"""The sources a ``--data`` value names by its form, tried in order: (does the value name one?,
``loader(spec, split, **options)``): an image folder, then WebDataset shards."""

__all__ = [
    "ALIASES",
    "MINIVAL",
    "PATTERN_SOURCES",
    "SOURCES",
    "ArrayDataset",
    "BatchPlan",
    "DataError",
    "Dataset",
    "EraseConfig",
    "FileImages",
    "ImageFolder",
    "LabelsFile",
    "MixConfig",
    "Mixed",
    "RandAugmentConfig",
    "ShardDataset",
    "SkipCounter",
    "StreamingDataset",
    "TransformConfig",
    "batch_choice",
    "build_dataset",
    "carve",
    "check_options",
    "decode_image",
    "default_minival",
    "download_cifar",
    "epoch_order",
    "eval_transform",
    "expand_braces",
    "is_labels_file",
    "load_cifar",
    "load_digits_dataset",
    "load_idx_dataset",
    "mix_batch",
    "rand_augment",
    "random_erase",
    "read_labels_file",
    "shard_paths",
    "source_kind",
    "step_generator",
    "synthetic_dataset",
    "train_transform",
]
