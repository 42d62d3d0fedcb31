"""What every streaming source shares: Pillow decoding in DataLoader workers, in plan order.

Streaming sources (image folders, WebDataset shards) decode with Pillow in DataLoader worker
processes. The order of an epoch is planned in the main process (a pure function of seed and
epoch, as for in-memory data; see ``plan.py``) and only the decoding is handed to the workers, so
the batches do not depend on ``num_workers``. Every image is decoded to a fixed ``load_size`` so
that batches stack; the random crops and flips of training happen later, on the batch, on the
compute device (``transforms.py``). An image that cannot be decoded is left out of its batch and
counted in ``skips``; it never ends the epoch. An image that decodes but whose values are outside
the range its format declares (a float image of 0..255, say; see ``pixels.py``) is refused with a
:class:`~vitkit.errors.DataError` naming the file: scoring or training on it would be wrong
without a word, and skipping would drop every image of a folder saved that way.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from ..errors import DataError
from .base import Dataset, SkipCounter
from .pixels import eight_bit

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
    source: str | bytes,
    size: tuple[int, int],
    *,
    mode: str = "RGB",
    resize: str = "shorter",
    name: str | None = None,
    fit: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Decode an image file (path or bytes) to uint8 (C, H, W) of exactly ``size`` = (H, W).

    With ``fit`` = (patch, max_tokens) the image keeps its aspect ratio instead (NaFlex): it is
    resized whole to the largest grid of patches that ``max_tokens`` allows
    (:func:`vitkit.preprocessing.fit_grid`), and ``size`` is not used.

    Images deeper than 8 bits (16-bit PNG or TIFF, 32-bit integer or float TIFF) are scaled to
    8 bits by the value range of their format (:func:`vitkit.data.pixels.eight_bit`), not clipped.

    Args:
        source: a file path, or the encoded bytes of an image.
        size: (H, W) of the result.
        mode: "RGB" (3 channels) or "L" (1 channel).
        resize: "shorter" scales the shorter side to fit and crops the centre; "plain" stretches
            the whole image to ``size``.
        name: what to call the image in errors (default: the path, or "image bytes").
        fit: (patch side, most patches) for an image at its own aspect ratio; None: ``size``.

    Returns:
        uint8 (C, H, W); with ``fit``, H and W are whole patches.

    Raises:
        DataError: an image whose values are outside its format's range (see ``pixels.py``).
        Exception: whatever Pillow raises on a damaged file.
    """
    height, width = size
    label = name or (source if isinstance(source, str) else "image bytes")
    with Image.open(source if isinstance(source, str) else io.BytesIO(source)) as img:
        w0, h0 = img.size
        if fit is not None:  # the grid the image's own aspect ratio gets, stretched to exactly it
            from ..preprocessing import fit_grid

            rows, cols = fit_grid(h0, w0, *fit)
            height, width, resize = rows * fit[0], cols * fit[0], "plain"
        scale = max(width / w0, height / h0) if resize == "shorter" else None
        # Let the JPEG decoder shrink by a power of two while staying at least as large as needed.
        want = (math.ceil(w0 * scale), math.ceil(h0 * scale)) if scale else (width, height)
        img.draft(mode, want)
        img = eight_bit(img, label)
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


# What a worker makes of one item: (image or None, label, why it failed, whether that refuses the run).
Decoded = tuple[torch.Tensor | None, int, str, bool]


class _Decoder(TorchDataset):
    """What DataLoader workers run: turn each planned item into a tensor, or a note of failure."""

    def __init__(self, size: tuple[int, int], mode: str, resize: str, fit: tuple[int, int] | None = None) -> None:
        self.size, self.mode, self.resize, self.fit = size, mode, resize, fit

    def __getitem__(self, item: Item) -> Decoded:
        source, label, name = item
        try:
            image = decode_image(source, self.size, mode=self.mode, resize=self.resize, name=name, fit=self.fit)
            return image, label, "", False
        except DataError as e:  # readable, but its values cannot be read faithfully: refused, by the main process
            return None, label, str(e), True
        except UnidentifiedImageError:
            return None, label, f"{name} (not an image Pillow can read)", False
        except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for damaged files
            return None, label, f"{name} ({type(e).__name__}: {e})", False


class _Collate:
    def __init__(self, shape: tuple[int, int, int], stack: bool = True) -> None:
        self.shape, self.stack = shape, stack

    def __call__(self, decoded: list[Decoded]):
        images = [img for img, _, _, _ in decoded if img is not None]
        labels = [label for img, label, _, _ in decoded if img is not None]
        failed = [(why, refused) for img, _, why, refused in decoded if img is None]
        if not self.stack:  # NaFlex: each image at its own size
            return images, torch.tensor(labels, dtype=torch.int64), failed
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

    Subclasses implement :meth:`~Dataset.epoch_batches`: they turn the plan of the epoch
    (:class:`~vitkit.data.plan.BatchPlan`) into the items of each batch on this rank, cheap to
    make (paths or encoded bytes), and hand them to :meth:`decode_batches`, which decodes them in
    ``num_workers`` processes, keeping order.

    Args:
        load_size: the (height, width) images are decoded to, in pixels; an int means a square.
        mode: "RGB" or "L" (grey).
        resize: "shorter" (scale the shorter side to fit, crop the centre) or "plain" (stretch).
        name: the source's name in messages and reports.

    Raises:
        ValueError: an unknown ``mode`` or ``resize``.
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
        self.naflex: tuple[int, int] | None = None  # (patch, max_tokens): see with_naflex

    def with_naflex(self, patch: int, max_tokens: int) -> StreamingDataset:
        """The same source, its images decoded at their own aspect ratio for NaFlex: each resized
        whole to the largest grid of ``patch``-pixel patches that ``max_tokens`` allows, and batches
        given as lists of uint8 (C, H, W) images of their own sizes.

        Args:
            patch: the model's patch side in pixels.
            max_tokens: the most patches an image may have.

        Returns:
            A shallow copy that decodes so (this source is left as it is).
        """
        part = copy.copy(self)
        part.naflex = (patch, max_tokens)
        return part

    def decode_batches(
        self, item_batches: Iterable[list[Item]], num_workers: int = 0, keep_empty: bool = False
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Decode each batch of items to (uint8 (B, C, H, W), int64 (B,)), in the order given.

        Items that fail to decode are dropped from their batch and added to ``skips``; a batch
        left empty is not yielded, unless ``keep_empty``: a rank of several must yield one batch
        for each of the plan's, or its batches would pair with other ranks' later ones and it
        would run out first (the trainer drops a batch that is empty on any rank, on all). An
        image whose values are outside its format's range is a :class:`DataError` naming it.

        Args:
            item_batches: the batches of this rank, each a list of (file path or encoded bytes,
                label, name for reports).
            num_workers: DataLoader worker processes that decode (0: this process).
            keep_empty: yield a batch even when none of its images decoded.

        Yields:
            (uint8 images (B, C, H, W) at this source's ``image_size``, int64 labels (B,)) for
            each batch of ``item_batches`` that kept an image (for each, with ``keep_empty``: B
            may then be 0), in order. With :meth:`with_naflex`, the images are a list of uint8
            (C, H, W), each at its own grid's size.

        Raises:
            DataError: an image whose values are outside the range of its format.
        """
        # A DataLoader draws its workers' base seed when an epoch's iterator is made, from the
        # global RNG unless it has a generator of its own. A run resumed mid-epoch makes that
        # iterator at another point of the global stream than an uninterrupted one, so every
        # later dropout mask would differ. Decoding draws nothing random: a private generator.
        loader = DataLoader(
            _Decoder(self.image_size, self.mode, self.resize, self.naflex),
            batch_sampler=_Planned(item_batches),
            num_workers=num_workers,
            collate_fn=_Collate((self.in_chans, *self.image_size), stack=self.naflex is None),
            generator=torch.Generator().manual_seed(0),
        )
        for images, labels, failed in loader:
            for why, refused in failed:
                if refused:
                    raise DataError(why)
                self.skips.add(why)
            if len(labels) or keep_empty:
                yield images, labels


__all__ = ["MODES", "RESIZES", "Item", "StreamingDataset", "decode_image"]
