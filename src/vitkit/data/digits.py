"""scikit-learn's handwritten digits (UCI's 8x8 optical digits, 1,797 images, 10 classes) as a source.

They ship inside scikit-learn, so they are real images that need no download: a task that
``vitkit reproduce`` uses for few-shot transfer (a task no model saw in pre-training), and a
quick one for tests. The 8x8 images of values 0-16 become uint8 0-255; a fixed third of every
class (chosen by a seeded order) is the test split, the rest the training split.
"""

from __future__ import annotations

import torch

from ..errors import DataError
from .base import ArrayDataset
from .carve import class_orders

TEST_FRACTION = 1 / 3


def load_digits_dataset(split: str) -> ArrayDataset:
    """The ``split`` ("train" or "test") of scikit-learn's digits, (N, 1, 8, 8) uint8.

    Args:
        split: "train" (about two thirds of each class) or "test" (the other third).

    Returns:
        uint8 images (N, 1, 8, 8) in 0-255, int64 labels (N,), classes "0" to "9", named
        ``digits/SPLIT``.

    Raises:
        DataError: an unknown split, or scikit-learn not installed.
    """
    if split not in ("train", "test"):
        raise DataError(f"digits: unknown split {split!r} (train or test)")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("digits: needs scikit-learn, which ships these images (pip install scikit-learn)") from None
    bunch = load_digits()
    images = torch.from_numpy(bunch.images).mul(255 / 16).round().clamp(0, 255).to(torch.uint8)[:, None]
    labels = torch.from_numpy(bunch.target).long()
    test = torch.cat([o[: round(len(o) * TEST_FRACTION)] for o in class_orders(labels, 10, seed=0)])
    is_test = torch.zeros(len(labels), dtype=torch.bool)
    is_test[test] = True
    keep = (is_test if split == "test" else ~is_test).nonzero().flatten()
    return ArrayDataset(images[keep], labels[keep], [str(d) for d in range(10)], name=f"digits/{split}")
