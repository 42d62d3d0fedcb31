"""Image-folder trees, streamed: images decoded with Pillow while the epoch runs (``streaming.py``).

A tree has one sub-folder per class (``root/<class>/**/<image>``), either once, in which case a
deterministic fraction of every class is held out for validation, or as ``root/train/`` plus
``root/val/`` (or ``root/test/``).

A classifier needs two classes at least: a tree of one class folder (all images in
``root/images/``, say) would train to 100% and score 100% while learning nothing, so it is
refused, as is a class folder of the training tree that holds no image.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import DataError
from .base import SkipCounter
from .plan import BatchPlan
from .streaming import StreamingDataset

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm")


def _is_image(name: str, extensions: tuple[str, ...]) -> bool:
    return not name.startswith(".") and name.lower().endswith(extensions)


def _class_dirs(tree: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(tree) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise DataError(f"{tree}: cannot list the class folders ({e})") from None


def _images_under(folder: Path, extensions: tuple[str, ...]) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames) if _is_image(f, extensions))
    return found


def _held_out(paths: list[str], root: Path, fraction: float, seed: int) -> set[str]:
    """The validation share of one class: the files that rank first by a hash of their path.

    Hashing (rather than a permutation) keeps a file on the same side when others are added.
    """
    if fraction <= 0 or len(paths) < 2:
        return set()
    n_val = min(len(paths) - 1, math.ceil(len(paths) * fraction))

    def rank(path: str) -> str:
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        return hashlib.sha256(f"{seed}:{rel}".encode()).hexdigest()

    return set(sorted(paths, key=rank)[:n_val])


class FileImages(StreamingDataset):
    """Images named by file path, each with a label, decoded while the epoch runs: what the image
    folder and the labels files (``labels.py``) share. ``samples`` holds (path, label) pairs;
    sources whose labels are not one class an image (multi-hot rows) keep an index there and map
    it in :meth:`targets_of`. A subclass fills :attr:`samples` in its constructor.

    Args:
        load_size: the (height, width) images are decoded to, in pixels; an int means a square.
        mode: "RGB" or "L" (grey).
        resize: "shorter" (scale the shorter side to fit, crop the centre) or "plain" (stretch).
        name: the source's name in messages and reports.

    Raises:
        ValueError: an unknown ``mode`` or ``resize``.
    """

    samples: list[tuple[str, int]]

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def labels(self) -> torch.Tensor:
        """The label of every image, in the order of :attr:`samples`."""
        return torch.tensor([label for _, label in self.samples], dtype=torch.int64)

    def targets_of(self, labels: torch.Tensor) -> torch.Tensor:
        """What a batch's labels stand for (here: themselves, class indices).

        Args:
            labels: the int64 labels (B,) of a batch, as :attr:`samples` holds them.

        Returns:
            The batch's targets: ``labels`` itself here; a subclass may map them (to multi-hot
            rows, say).
        """
        return labels

    def subset(self, indices: torch.Tensor, name: str | None = None) -> FileImages:
        """The same source restricted to the images at ``indices`` (into :attr:`samples`).

        Args:
            indices: int64 positions in :attr:`samples`, in the order the subset keeps them.
            name: the subset's name; None: this source's.

        Returns:
            A shallow copy with those samples and a skip counter of its own; classes and
            decoding settings are shared with this source.
        """
        part = copy.copy(self)
        part.samples = [self.samples[i] for i in indices.tolist()]
        part.name = name or self.name
        part.skips = SkipCounter()
        return part

    def epoch_batches(self, plan: BatchPlan, num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of decoded batches; the plan picks the files, ``num_workers`` processes decode them.

        Args:
            plan: the epoch's batches for this rank.
            num_workers: decoding processes (0: decode in this process); the order does not
                depend on it.

        Yields:
            (uint8 images (B, C, H, W), targets): the targets as :meth:`targets_of` gives them,
            int64 (B,) for class labels. Images that fail to decode are left out and counted in
            ``skips``; a batch left empty is skipped on one rank, yielded empty on several.

        Raises:
            DataError: an image whose values are outside the range of its format.
        """
        items = (
            [(path, label, path) for path, label in map(self.samples.__getitem__, local.tolist())]
            for local in plan.index_batches(len(self))
        )
        for images, labels in self.decode_batches(items, num_workers, keep_empty=plan.world_size > 1):
            yield images, self.targets_of(labels)


class ImageFolder(FileImages):
    """Images in class sub-folders, decoded with Pillow to ``load_size`` (H, W) uint8.

    ``split``: "train", "val" or "test". With ``root/train/`` present, "train" reads it and
    "val"/"test" read ``root/val/`` or ``root/test/`` (whichever exists, the named one first).
    Otherwise every class folder directly under ``root`` is split: ``val_fraction`` of each class
    (chosen by a hash of the path and ``split_seed``) is "val" (and "test"), the rest "train".
    Class names are the folder names of the training tree, sorted; labels index them.

    ``min_classes`` (default 2, what a classifier needs): a tree with fewer class folders is a
    :class:`DataError` naming it and the class found; 1 allows a single folder (for features).
    Every class folder of the training tree must hold an image (a class without one could never
    be learnt); a class missing from ``val/`` or ``test/`` only has no score there.

    Args:
        root: the tree's folder.
        split: "train", "val" or "test", as above.
        load_size: the (height, width) images are decoded to, in pixels; an int means a square.
        resize: "shorter" (scale the shorter side to fit, crop the centre) or "plain" (stretch).
        mode: "RGB" or "L" (grey).
        val_fraction: the share of each class held out as "val" in a tree without ``train/``,
            in [0, 1), rounded up but never a whole class; not used with ``train/``.
        split_seed: the seed of the hash that picks the held-out images.
        extensions: the file suffixes read as images, in any case; hidden files and folders (a
            leading ".") are left out.
        min_classes: the fewest class folders the training tree may have.

    Raises:
        DataError: an unknown ``split``; a ``root`` that is not a folder; a ``val``/``test``
            split of a tree with ``train/`` but neither ``val/`` nor ``test/``, or with class
            folders not in ``train/``; too few class folders; a training class folder without
            images; a tree whose class folders cannot be listed; or no images for ``split``.
        ValueError: ``val_fraction`` outside [0, 1), or an unknown ``mode`` or ``resize``.
    """

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        *,
        load_size: int | tuple[int, int] = 256,
        resize: str = "shorter",
        mode: str = "RGB",
        val_fraction: float = 0.1,
        split_seed: int = 0,
        extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
        min_classes: int = 2,
    ) -> None:
        root = Path(root)
        super().__init__(load_size, mode, resize, name=f"{root.name or root}/{split}")
        if split not in ("train", "val", "test"):
            raise DataError(f"{root}: unknown split {split!r} (train, val or test)")
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        if not root.is_dir():
            raise DataError(f"{root}: not a folder")
        extensions = tuple(e.lower() for e in extensions)
        self.root = root
        if (root / "train").is_dir():
            self.classes = _class_dirs(root / "train")
            if split == "train":
                tree = root / "train"
            else:
                names = ("val", "test") if split == "val" else ("test", "val")
                trees = [root / n for n in names if (root / n).is_dir()]
                if not trees:
                    raise DataError(f"{root}: has train/ but no val/ or test/ folder for split {split!r}")
                tree = trees[0]
                unknown = sorted(set(_class_dirs(tree)) - set(self.classes))
                if unknown:
                    raise DataError(f"{tree}: class folders not in {root / 'train'}: {', '.join(unknown[:5])}")
            held_out = None
        else:
            tree = root
            self.classes = _class_dirs(root)
            held_out = split != "train"
        if not self.classes:
            raise DataError(f"{tree}: no class sub-folders (expected {tree}/<class>/<image>)")
        train_tree = root / "train" if held_out is None else root
        if len(self.classes) < min_classes:
            found = "one class folder" if len(self.classes) == 1 else f"{len(self.classes)} class folders"
            raise DataError(
                f"{train_tree}: {found} ({', '.join(self.classes)}); a classifier needs {min_classes} classes "
                f"at least, one sub-folder each ({train_tree}/<class>/<image>)"
            )
        self.samples: list[tuple[str, int]] = []
        for label, cls in enumerate(self.classes):
            paths = _images_under(tree / cls, extensions) if (tree / cls).is_dir() else []
            if not paths and tree == train_tree:
                raise DataError(
                    f"{tree / cls}: a class folder with no images ({', '.join(extensions)}); add images or "
                    "remove the folder"
                )
            if held_out is not None:
                val = _held_out(paths, root, val_fraction, split_seed)
                paths = [p for p in paths if (p in val) == held_out]
            self.samples.extend((p, label) for p in paths)
        if not self.samples:
            raise DataError(f"{tree}: no images ({', '.join(extensions)}) for split {split!r}")


__all__ = ["IMAGE_EXTENSIONS", "FileImages", "ImageFolder"]
