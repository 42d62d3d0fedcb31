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

from .errors import DataError, UsageError

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
    resizes the whole image to ``img_size``. ``crop_mode`` "center" keeps the aspect ratio at 1.0
    too: the shorter side to ``img_size``, then the centre (CLIP's, SigLIP's and timm's eval
    transform at crop fraction 1); "squash" (the default) resizes the whole image.

    Attributes:
        mean: one value a channel, in [0, 1] units.
        std: one value a channel, in [0, 1] units.
        img_size: the model's input size (height, width), in pixels.
        interpolation: how images are resized: "bilinear" or "bicubic".
        crop_pct: the fraction of the resized image (its shorter side) that the centre crop
            keeps, as above; 1.0: as ``crop_mode`` says.
        crop_mode: at ``crop_pct`` 1: "squash" the whole image, or "center" (shorter side, then
            crop).
        naflex: the most patches an image may have when it is seen whole at its own aspect ratio
            (NaFlex: the model was trained so); None: every image resized to ``img_size``.
    """

    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    img_size: tuple[int, int] = (224, 224)
    interpolation: str = "bilinear"
    crop_pct: float = 1.0
    crop_mode: str = "squash"
    naflex: int | None = None

    @classmethod
    def for_config(cls, cfg: Any) -> Preprocessing:
        """The paper's [-1, 1] range for a model config (anything with ``in_chans`` and ``img_size``).

        Args:
            cfg: the model's config.

        Returns:
            mean = std = 0.5 for each of its channels, at its ``img_size``, bilinear, no crop.
        """
        c = cfg.in_chans
        return cls(mean=(0.5,) * c, std=(0.5,) * c, img_size=tuple(cfg.img_size))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``crop_pct`` only when it crops, so files that do not crop read as before.

        Returns:
            ``mean``, ``std`` and ``img_size`` as lists, ``interpolation``, ``crop_pct`` unless it
            is 1.0, ``crop_mode`` unless it is "squash", and ``naflex`` where it is set.
        """
        d = asdict(self)
        if d["crop_pct"] == 1.0:
            del d["crop_pct"]
        if d["crop_mode"] == "squash":
            del d["crop_mode"]
        if d["naflex"] is None:
            del d["naflex"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocessing:
        """The inverse of :meth:`to_dict`.

        Args:
            d: a dict with ``mean``, ``std`` and ``img_size``, and optionally ``interpolation``
                (default "bilinear"), ``crop_pct`` (default 1.0), ``crop_mode`` (default
                "squash") and ``naflex`` (default None). Values are not checked here.

        Returns:
            The preprocessing.

        Raises:
            KeyError: a required key is missing.
        """
        return cls(
            mean=tuple(d["mean"]),
            std=tuple(d["std"]),
            img_size=tuple(d["img_size"]),
            interpolation=d.get("interpolation", "bilinear"),
            crop_pct=float(d.get("crop_pct", 1.0)),
            crop_mode=str(d.get("crop_mode", "squash")),
            naflex=None if d.get("naflex") is None else int(d["naflex"]),
        )


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 or [0, 255] floats (B, C, H, W) -> ``(x / 255 - mean) / std`` per channel, float32.

    Args:
        x: the batch (B, C, H, W), uint8 or float with values in [0, 255].
        mean: one value a channel, in [0, 1] units.
        std: one value a channel, in [0, 1] units.

    Returns:
        The normalised batch (B, C, H, W), float32, on the device of ``x``.

    Raises:
        DataError: ``mean`` or ``std`` does not have one value for each channel of ``x``.
    """
    import torch

    x = x.float()
    m = torch.tensor(tuple(mean), device=x.device, dtype=x.dtype).view(1, -1, 1, 1) * 255.0
    s = torch.tensor(tuple(std), device=x.device, dtype=x.dtype).view(1, -1, 1, 1) * 255.0
    for name, values in (("mean", m), ("std", s)):
        if values.shape[1] != x.shape[1]:
            raise DataError(f"{values.shape[1]} normalisation {name} values for images with {x.shape[1]} channels")
    return (x - m) / s


@dataclass
class LoadedImages:
    """Images ready for a model: what :func:`load_images` returns.

    Attributes:
        names: one per image: the file's stem, or the name it was given.
        pixels: the resized images, uint8 (B, H, W) for grey or (B, H, W, 3) for RGB: for
            pictures.
        inputs: the normalised images (B, C, H, W), float32: for the model.
    """

    names: list[str]
    pixels: np.ndarray
    inputs: torch.Tensor

    def __len__(self) -> int:
        return len(self.names)


def _resample(pre: Preprocessing) -> Any:
    from PIL import Image

    return Image.Resampling.BICUBIC if pre.interpolation == "bicubic" else Image.Resampling.BILINEAR


def prepare_images(images: Sequence[tuple[str, Image.Image]], pre: Preprocessing, in_chans: int) -> LoadedImages:
    """Named Pillow images -> :class:`LoadedImages`: converted to ``in_chans`` channels (grey or
    RGB), centre-cropped to ``pre.crop_pct`` of each side, resized to ``pre.img_size`` with
    ``pre.interpolation``, normalised with ``pre``.

    Images deeper than 8 bits are first brought to 8 bits by the range of their format
    (:func:`eight_bit`). With ``pre.crop_pct`` 1 each image is resized to ``pre.img_size``
    whole; below 1, as timm's evaluation does: resized so that ``img_size`` is that fraction of
    it, then the centre ``img_size`` kept (the aspect ratio is kept for a square ``img_size``).

    Args:
        images: (name, Pillow image) pairs, at least one.
        pre: the preprocessing of the model.
        in_chans: the model's input channels, 1 (grey) or 3 (RGB).

    Returns:
        The names, the resized uint8 pixels (B, H, W) for grey or (B, H, W, 3) for RGB, and the
        normalised float32 inputs (B, C, H, W).

    Raises:
        DataError: ``in_chans`` other than 1 or 3, no images, a deep image whose values are
            outside the range of its format, or a mean that does not match ``in_chans``.
    """
    import numpy as np
    import torch

    if in_chans not in (1, 3):
        raise DataError(f"image files have 1 or 3 channels; the model takes {in_chans}")
    if not images:
        raise DataError("no images given")
    mode = "L" if in_chans == 1 else "RGB"
    h, w = pre.img_size
    pixels = np.stack([np.asarray(_resize_crop(eight_bit(im, name).convert(mode), (h, w), pre)) for name, im in images])
    x = torch.from_numpy(pixels.copy())
    x = x[..., None] if x.ndim == 3 else x  # (B, H, W, C)
    inputs = normalize(x.permute(0, 3, 1, 2), pre.mean, pre.std)  # (B, C, H, W)
    return LoadedImages([name for name, _ in images], pixels, inputs)


def _resize_crop(im: Image.Image, size: tuple[int, int], pre: Preprocessing) -> Image.Image:
    """An image file to ``size`` (h, w) as its weights' publisher prepares it. ``crop_pct`` 1 with
    ``crop_mode`` "squash": a plain resize (the official code's). Otherwise timm's eval transform: the shorter side to
    ``floor(side / crop_pct)``, keeping the aspect ratio (both sides, for a non-square size), then
    the central ``size``; so a photo is never squashed. On batches of square images, which the
    data sources load, :func:`vitkit.data.transforms.center_crop` then a resize is the same crop."""
    h, w = size
    if pre.crop_pct >= 1.0 and pre.crop_mode != "center":
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
    whose warning is an error here), is a :class:`DataError` naming it.

    Args:
        path: the image file.

    Returns:
        The decoded image, loaded into memory; an image deeper than 8 bits is brought to 8 bits
        by the range of its format (:func:`eight_bit`), other modes are as Pillow decodes them.

    Raises:
        DataError: a folder, a missing file, a decompression bomb, a file Pillow cannot read
            or that is damaged, or a deep image whose values are outside its format's range.
    """
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Corrupt EXIF data"...: a readable file reads
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im.load()
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
    return eight_bit(im, str(path))  # a 16-bit or float image scaled by its range, not clipped


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:160] if lines else type(e).__name__


def load_images(paths: Sequence[str | Path], pre: Preprocessing, in_chans: int) -> LoadedImages:
    """Image files as a model with ``pre`` and ``in_chans`` takes them; every file is read before
    any is used, so a bad one fails first.

    Args:
        paths: the image files.
        pre: the preprocessing of the model (see :func:`prepare_images`).
        in_chans: the model's input channels, 1 (grey) or 3 (RGB).

    Returns:
        The images, named by their file stems, as :func:`prepare_images` gives them.

    Raises:
        DataError: a file that cannot be read as an image (see :func:`read_image`), or as
            :func:`prepare_images` raises.
    """
    return prepare_images([(Path(p).stem, read_image(p)) for p in paths], pre, in_chans)


SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
_TIFF_BITS_PER_SAMPLE, _TIFF_SAMPLE_FORMAT, _TIFF_SIGNED = 258, 339, 2
_FLOAT_SLACK = 1 / 510  # half an 8-bit level: rounding noise of a [0, 1] float image, not another range


def integer_range(img: Image.Image) -> int:
    """The largest value a mode ``I`` image can hold by its file's declaration.

    Args:
        img: an open Pillow image of mode ``I``.

    Returns:
        ``2**bits - 1`` for a TIFF's BitsPerSample (``2**(bits - 1) - 1`` when its SampleFormat
        is signed), else 65535: PNG, PGM and PPM decode deeper-than-8-bit samples to 0..65535.
    """
    tags = getattr(img, "tag_v2", None)
    if tags is not None:
        bits = tags.get(_TIFF_BITS_PER_SAMPLE)
        bits = bits[0] if isinstance(bits, tuple) and bits else bits
        fmt = tags.get(_TIFF_SAMPLE_FORMAT)
        fmt = fmt[0] if isinstance(fmt, tuple) and fmt else fmt
        if isinstance(bits, int) and 8 < bits <= 32:
            return 2 ** (bits - (fmt == _TIFF_SIGNED)) - 1
    return 65535


def _as_l(values: np.ndarray) -> Image.Image:
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(values, dtype=np.uint8))


def eight_bit(img: Image.Image, name: str) -> Image.Image:
    """``img`` with 8-bit samples: deeper images scaled by their declared range, others unchanged.

    Args:
        img: a Pillow image, of any mode.
        name: the file (or another name) to put in the error of an image outside its range.

    Returns:
        ``img`` itself for 8-bit and 1-bit modes; for ``I;16*``, ``I`` and ``F`` images a new
        ``L`` image, as the module docstring describes.

    Raises:
        DataError: a mode ``I`` image with values outside 0..its declared maximum, or a mode ``F``
            image with values outside [0, 1] (or not finite); the message names ``name`` and the
            range found.
    """
    import numpy as np

    mode = img.mode
    if mode in SIXTEEN_BIT_MODES:
        values = np.asarray(img).astype(np.uint32)
        return _as_l((values * 255 + 32767) // 65535)
    if mode == "I":
        values = np.asarray(img).astype(np.int64)
        top = integer_range(img)
        lo, hi = (int(values.min()), int(values.max())) if values.size else (0, 0)
        if lo < 0 or hi > top:
            raise DataError(
                f"{name}: a 32-bit integer image with values in [{lo}, {hi}], outside the 0..{top} of its "
                "format; save it with unsigned 8- or 16-bit samples"
            )
        return _as_l((values * 255 + top // 2) // top)
    if mode == "F":
        values = np.asarray(img, dtype=np.float64)
        finite = bool(np.isfinite(values).all())
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if not finite or lo < -_FLOAT_SLACK or hi > 1 + _FLOAT_SLACK:
            found = "values that are not finite" if not finite else f"values in [{lo:.6g}, {hi:.6g}]"
            raise DataError(
                f"{name}: a floating-point image with {found}; vitkit reads float images as values in "
                "[0, 1] (save it scaled to [0, 1], or with 8- or 16-bit integer samples)"
            )
        return _as_l(np.rint(np.clip(values, 0.0, 1.0) * 255))
    return img


def fit_grid(height: int, width: int, patch: int, max_tokens: int) -> tuple[int, int]:
    """The largest grid with the image's aspect ratio whose patch count fits ``max_tokens``.

    Args:
        height: image height in pixels.
        width: image width in pixels.
        patch: patch side in pixels.
        max_tokens: the most patches the image may have (at least 1).

    Returns:
        (rows, cols), each at least 1, with rows * cols <= max_tokens.

    Raises:
        UsageError: ``max_tokens`` below 1.
        DataError: an image with no pixels.
    """
    if max_tokens < 1:
        raise UsageError(f"naflex max_tokens={max_tokens}: an image needs at least 1 patch")
    if height < 1 or width < 1:
        raise DataError(f"naflex: image of size {height}x{width} has no pixels")
    # Scale s so that (h*s/p) * (w*s/p) ~= max_tokens, then step down until the rounded-up grid fits.
    scale = math.sqrt(max_tokens * patch * patch / (height * width))
    while True:
        rows = max(1, math.ceil(height * scale / patch))
        cols = max(1, math.ceil(width * scale / patch))
        if rows * cols <= max_tokens:
            return rows, cols
        if rows == 1 and cols == 1:
            return 1, 1
        scale *= 0.99


__all__ = [
    "LoadedImages",
    "Preprocessing",
    "eight_bit",
    "fit_grid",
    "integer_range",
    "load_images",
    "normalize",
    "prepare_images",
    "read_image",
]
