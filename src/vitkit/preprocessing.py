"""How pixels become model inputs, written once: the :class:`Preprocessing` every weight file
carries, :func:`normalize` for uint8 batches, and :func:`load_images` for image files.

Training transforms (``vitkit.data.transforms``), evaluation, prediction and analysis all
normalise through :func:`normalize`, so a model sees the same numbers everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DataError

if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image


@dataclass(frozen=True)
class Preprocessing:
    """How pixels become model inputs: ``(x / 255 - mean) / std`` per channel, at ``img_size``.

    The default (mean = std = 0.5) is the paper's range [-1, 1]. ``crop_pct`` (timm's): below
    1, the image is resized so that ``img_size`` is that fraction of it (its shorter side, keeping
    the aspect ratio) and the centre ``img_size`` kept; 1.0, the official code's evaluation,
    resizes the whole image to ``img_size``.
    """

    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    img_size: tuple[int, int] = (224, 224)
    interpolation: str = "bilinear"
    crop_pct: float = 1.0

    @classmethod
    def for_config(cls, cfg: Any) -> Preprocessing:
        """The paper's [-1, 1] range for a model config (anything with ``in_chans`` and ``img_size``)."""
        c = cfg.in_chans
        return cls(mean=(0.5,) * c, std=(0.5,) * c, img_size=tuple(cfg.img_size))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``crop_pct`` only when it crops, so files that do not crop read as before."""
        d = asdict(self)
        if d["crop_pct"] == 1.0:
            del d["crop_pct"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocessing:
        return cls(
            mean=tuple(d["mean"]),
            std=tuple(d["std"]),
            img_size=tuple(d["img_size"]),
            interpolation=d.get("interpolation", "bilinear"),
            crop_pct=float(d.get("crop_pct", 1.0)),
        )


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 or [0, 255] floats (B, C, H, W) -> ``(x / 255 - mean) / std`` per channel, float32."""
    import torch

    x = x.float()
    m = torch.tensor(tuple(mean), device=x.device, dtype=x.dtype).view(1, -1, 1, 1) * 255.0
    s = torch.tensor(tuple(std), device=x.device, dtype=x.dtype).view(1, -1, 1, 1) * 255.0
    if m.shape[1] != x.shape[1]:
        raise DataError(f"{len(mean)} normalisation channels for images with {x.shape[1]} channels")
    return (x - m) / s


@dataclass
class LoadedImages:
    """Images ready for a model: what :func:`load_images` returns."""

    names: list[str]  # one per image: the file's stem, or the name it was given
    pixels: np.ndarray  # (B, H, W) or (B, H, W, 3) uint8, resized: for pictures
    inputs: torch.Tensor  # (B, C, H, W) float32, normalised: for the model

    def __len__(self) -> int:
        return len(self.names)


def _resample(pre: Preprocessing) -> Any:
    from PIL import Image

    return Image.Resampling.BICUBIC if pre.interpolation == "bicubic" else Image.Resampling.BILINEAR


def prepare_images(images: Sequence[tuple[str, Image.Image]], pre: Preprocessing, in_chans: int) -> LoadedImages:
    """Named Pillow images -> :class:`LoadedImages`: converted to ``in_chans`` channels (grey or
    RGB), centre-cropped to ``pre.crop_pct`` of each side, resized to ``pre.img_size`` with
    ``pre.interpolation``, normalised with ``pre``."""
    import numpy as np
    import torch

    if in_chans not in (1, 3):
        raise DataError(f"image files have 1 or 3 channels; the model takes {in_chans}")
    if not images:
        raise DataError("no images given")
    mode = "L" if in_chans == 1 else "RGB"
    h, w = pre.img_size
    pixels = np.stack([np.asarray(_resize_crop(im.convert(mode), (h, w), pre)) for _, im in images])
    x = torch.from_numpy(pixels.copy())
    x = x[..., None] if x.ndim == 3 else x  # (B, H, W, C)
    inputs = normalize(x.permute(0, 3, 1, 2), pre.mean, pre.std)  # (B, C, H, W)
    return LoadedImages([name for name, _ in images], pixels, inputs)


def _resize_crop(im: Image.Image, size: tuple[int, int], pre: Preprocessing) -> Image.Image:
    """An image file to ``size`` (h, w) as its weights' publisher prepares it. ``crop_pct`` 1: a
    plain resize (the official code's). Below 1, timm's eval transform: the shorter side to
    ``floor(side / crop_pct)``, keeping the aspect ratio (both sides, for a non-square size), then
    the central ``size``; so a photo is never squashed. On batches of square images, which the
    data sources load, :func:`vitkit.data.transforms.center_crop` then a resize is the same crop."""
    h, w = size
    if pre.crop_pct >= 1.0:
        return im.resize((w, h), _resample(pre))
    iw, ih = im.size
    if h == w:
        side = math.floor(h / pre.crop_pct)
        scale = side / min(iw, ih)
        nw, nh = max(side, round(iw * scale)), max(side, round(ih * scale))
    else:
        nw, nh = math.floor(w / pre.crop_pct), math.floor(h / pre.crop_pct)
    im = im.resize((nw, nh), _resample(pre))
    left, top = (nw - w) // 2, (nh - h) // 2
    return im.crop((left, top, left + w, top + h))


def read_image(path: str | Path) -> Image.Image:
    """Decode one file with Pillow (fully read, so the file is closed); a missing, unreadable or
    truncated file, or one larger than Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``,
    whose warning is an error here), is a :class:`DataError` naming it."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Corrupt EXIF data"...: a readable file reads
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im.load()
                return im
    except IsADirectoryError:
        raise DataError(f"{path}: a folder, not an image file (give the image files)") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such image file") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DataError(f"{path}: refused as a decompression bomb ({_first_line(e)})") from None
    except UnidentifiedImageError as e:
        raise DataError(f"{path}: not an image Pillow can read ({type(e).__name__})") from None
    except MemoryError:
        raise
    except Exception as e:  # a damaged file: OSError (truncated), SyntaxError, ValueError, struct.error...
        raise DataError(f"{path}: not an image Pillow can read ({type(e).__name__}: {_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:160] if lines else type(e).__name__


def load_images(paths: Sequence[str | Path], pre: Preprocessing, in_chans: int) -> LoadedImages:
    """Image files as a model with ``pre`` and ``in_chans`` takes them; every file is read before
    any is used, so a bad one fails first."""
    return prepare_images([(Path(p).stem, read_image(p)) for p in paths], pre, in_chans)


__all__ = ["LoadedImages", "Preprocessing", "load_images", "normalize", "prepare_images", "read_image"]
