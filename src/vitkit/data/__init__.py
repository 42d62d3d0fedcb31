"""Data sources (uint8 batches) and batched transforms on the compute device.

Every command names its data the same way (``--data``): ``fashion-mnist``, ``mnist``,
``synthetic``, and further sources registered in :data:`SOURCES`.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import ArrayDataset, DataError, Dataset, SkipCounter
from .idx import load_idx_dataset
from .synthetic import synthetic_dataset
from .transforms import TransformConfig, eval_transform, step_generator, train_transform

# name -> loader(split, **options) -> Dataset
SOURCES: dict[str, Callable[..., Dataset]] = {
    "fashion-mnist": lambda split, **kw: load_idx_dataset("fashion-mnist", split, **kw),
    "mnist": lambda split, **kw: load_idx_dataset("mnist", split, **kw),
    "synthetic": lambda split, **kw: synthetic_dataset(
        n=kw.get("n", 2048 if split == "train" else 512),
        img_size=kw.get("img_size", 32),
        num_classes=kw.get("num_classes", 10),
        in_chans=kw.get("in_chans", 3),
        seed=0 if split == "train" else 1,
        name=f"synthetic/{split}",
    ),
}

ALIASES = {"fmnist": "fashion-mnist", "fashion_mnist": "fashion-mnist"}


def build_dataset(spec: str, split: str = "train", **options) -> Dataset:
    """Resolve a ``--data`` value to a dataset split ("train", "test" or "val")."""
    key = ALIASES.get(spec.lower(), spec.lower())
    if key in SOURCES:
        return SOURCES[key](split, **options)
    for matcher, loader in PATTERN_SOURCES:
        if matcher(spec):
            return loader(spec, split, **options)
    known = ", ".join(sorted(SOURCES))
    raise DataError(f"unknown data {spec!r}: expected one of {known}, a folder, or a shard pattern")


# (predicate on the spec, loader(spec, split, **options)) for folders and shard patterns.
PATTERN_SOURCES: list[tuple[Callable[[str], bool], Callable[..., Dataset]]] = []

__all__ = [
    "ALIASES",
    "PATTERN_SOURCES",
    "SOURCES",
    "ArrayDataset",
    "DataError",
    "Dataset",
    "SkipCounter",
    "TransformConfig",
    "build_dataset",
    "eval_transform",
    "load_idx_dataset",
    "step_generator",
    "synthetic_dataset",
    "train_transform",
]
