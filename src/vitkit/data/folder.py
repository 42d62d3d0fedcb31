"""Image-folder trees, and the Pillow decoding that all streaming sources share.

A tree has one sub-folder per class (``root/<class>/**/<image>``), either once, in which case a
deterministic fraction of every class is held out for validation, or as ``root/train/`` plus
``root/val/`` (or ``root/test/``).

Streaming sources decode with Pillow in DataLoader worker processes. The order of an epoch is
planned in the main process (a pure function of seed and epoch, as for in-memory data) and only
the decoding is handed to the workers, so the batches do not depend on ``num_workers``. Every
image is decoded to a fixed ``load_size`` so that batches stack; the random crops and flips of
training happen later, on the batch, on the compute device (``transforms.py``). An image that
cannot be decoded is left out of its batch and counted in ``skips``; it never ends the epoch.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from ..errors import DataError
from .base import Dataset, SkipCounter
from .plan import BatchPlan

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm")
MODES = {"RGB": 3, "L": 1}
RESIZES = ("shorter", "plain")

# One image to decode: (file path or encoded bytes, label, a name for error reports).
Item = tuple[str | bytes, int, str]


def _size_pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    if h < 1 or w < 1:
        raise ValueError(f"load_size must be positive, got {size}")
    return int(h), int(w)


def decode_image(
    source: str | bytes, size: tuple[int, int], *, mode: str = "RGB", resize: str = "shorter"
) -> torch.Tensor:
    """Decode an image file (path or bytes) to uint8 (C, H, W) of exactly ``size`` = (H, W).

    ``resize="shorter"`` scales the shorter side to fit and crops the centre; ``"plain"``
    stretches the whole image to ``size``. Raises whatever Pillow raises on a bad file.
    """
    height, width = size
    with Image.open(source if isinstance(source, str) else io.BytesIO(source)) as img:
        w0, h0 = img.size
        scale = max(width / w0, height / h0) if resize == "shorter" else None
        # Let the JPEG decoder shrink by a power of two while staying at least as large as needed.
        want = (math.ceil(w0 * scale), math.ceil(h0 * scale)) if scale else (width, height)
        img.draft(mode, want)
        if img.mode == "P":  # palette images may carry transparency that RGB conversion warns about
            img = img.convert("RGBA")
        img = img.convert(mode)
        w1, h1 = img.size
        if resize == "shorter":
            crop_w, crop_h = min(w1, h1 * width / height), min(h1, w1 * height / width)
            left, top = (w1 - crop_w) / 2, (h1 - crop_h) / 2
            box = (left, top, left + crop_w, top + crop_h)
        else:
            box = (0, 0, w1, h1)
        img = img.resize((width, height), Image.Resampling.BILINEAR, box=box)
        pixels = np.array(img, dtype=np.uint8)  # (H, W, C) or (H, W)
    if pixels.ndim == 2:
        return torch.from_numpy(pixels)[None]  # (1, H, W)
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()  # (C, H, W)


class _Decoder(TorchDataset):
    """What DataLoader workers run: turn each planned item into a tensor, or a note of failure."""

    def __init__(self, size: tuple[int, int], mode: str, resize: str) -> None:
        self.size, self.mode, self.resize = size, mode, resize

    def __getitem__(self, item: Item) -> tuple[torch.Tensor | None, int, str]:
        source, label, name = item
        try:
            return decode_image(source, self.size, mode=self.mode, resize=self.resize), label, ""
        except UnidentifiedImageError:
            return None, label, f"{name} (not an image Pillow can read)"
        except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for damaged files
            return None, label, f"{name} ({type(e).__name__}: {e})"


class _Collate:
    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = shape

    def __call__(self, decoded: list[tuple[torch.Tensor | None, int, str]]):
        images = [img for img, _, _ in decoded if img is not None]
        labels = [label for img, label, _ in decoded if img is not None]
        failed = [why for img, _, why in decoded if img is None]
        stacked = torch.stack(images) if images else torch.empty((0, *self.shape), dtype=torch.uint8)
        return stacked, torch.tensor(labels, dtype=torch.int64), failed


class _Planned:
    """A batch sampler over an iterable of planned batches (lists of items)."""

    def __init__(self, batches: Iterable[list[Item]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[list[Item]]:
        return iter(self.batches)


class StreamingDataset(Dataset):
    """A source whose images are decoded with Pillow while the epoch runs.

    Subclasses plan the epoch (which items form each batch on this rank) and call
    :meth:`decode_batches`, which decodes the plan in ``num_workers`` processes, keeping order.
    """

    def __init__(self, load_size: int | tuple[int, int], mode: str, resize: str, name: str) -> None:
        if mode not in MODES:
            raise ValueError(f"{name}: mode must be one of {', '.join(MODES)}, got {mode!r}")
        if resize not in RESIZES:
            raise ValueError(f"{name}: resize must be one of {', '.join(RESIZES)}, got {resize!r}")
        self.image_size = _size_pair(load_size)
        self.mode, self.resize = mode, resize
        self.in_chans = MODES[mode]
        self.name = name
        self.skips = SkipCounter()

    def decode_batches(
        self, plan: Iterable[list[Item]], num_workers: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Decode each planned batch to (uint8 (B, C, H, W), int64 (B,)), in plan order.

        Items that fail to decode are dropped from their batch and added to ``skips``; a batch
        left empty is not yielded.
        """
        loader = DataLoader(
            _Decoder(self.image_size, self.mode, self.resize),
            batch_sampler=_Planned(plan),
            num_workers=num_workers,
            collate_fn=_Collate((self.in_chans, *self.image_size)),
        )
        for images, labels, failed in loader:
            for why in failed:
                self.skips.add(why)
            if len(labels):
                yield images, labels


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


class ImageFolder(StreamingDataset):
    """Images in class sub-folders, decoded with Pillow to ``load_size`` (H, W) uint8.

    ``split``: "train", "val" or "test". With ``root/train/`` present, "train" reads it and
    "val"/"test" read ``root/val/`` or ``root/test/`` (whichever exists, the named one first).
    Otherwise every class folder directly under ``root`` is split: ``val_fraction`` of each class
    (chosen by a hash of the path and ``split_seed``) is "val" (and "test"), the rest "train".
    Class names are the folder names of the training tree, sorted; labels index them.
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
        self.samples: list[tuple[str, int]] = []
        for label, cls in enumerate(self.classes):
            paths = _images_under(tree / cls, extensions) if (tree / cls).is_dir() else []
            if held_out is not None:
                val = _held_out(paths, root, val_fraction, split_seed)
                paths = [p for p in paths if (p in val) == held_out]
            self.samples.extend((p, label) for p in paths)
        if not self.samples:
            raise DataError(f"{tree}: no images ({', '.join(extensions)}) for split {split!r}")

    def __len__(self) -> int:
        return len(self.samples)

    def epoch_batches(self, plan: BatchPlan, num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of decoded batches; the plan picks the files, ``num_workers`` processes decode them."""
        items = (
            [(path, label, path) for path, label in map(self.samples.__getitem__, local.tolist())]
            for local in plan.index_batches(len(self))
        )
        return self.decode_batches(items, num_workers)


__all__ = ["IMAGE_EXTENSIONS", "ImageFolder", "StreamingDataset", "decode_image"]
