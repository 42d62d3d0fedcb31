"""Images deeper than 8 bits, brought to 8 bits by their value range rather than clipped.

Pillow converts 16-bit, 32-bit integer and float images to ``L`` or ``RGB`` by clipping each value
to [0, 255], so a mid-grey 16-bit image (32768) would come out white. :func:`eight_bit` scales them
instead, by the range their format declares:

- 16-bit integers (modes ``I;16``, ``I;16B``, ``I;16L``, ``I;16N``): 0..65535 to 0..255
  (``v / 257``, rounded);
- 32-bit integer images (mode ``I``): 0..2**bits - 1, where ``bits`` is the TIFF's declared
  BitsPerSample (less one for a signed SampleFormat); other formats (PNG, PGM, PPM) give mode
  ``I`` only for samples deeper than 8 bits, which Pillow has scaled to 0..65535, so 16;
- float images (mode ``F``): values in [0, 1] are taken as such (``v * 255``, rounded).

Values outside the declared range (a negative value, a float image of 0..255 or of HDR radiance,
NaN) are refused with a :class:`~vitkit.errors.DataError` naming the file and the range found:
normalising each image by its own minimum and maximum would change what every image means. Other
modes (``1``, ``L``, ``P``, ``LA``, ``RGB``, ``RGBA``, ``CMYK``...) are returned unchanged; Pillow
converts them without loss of range.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from ..errors import DataError

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


__all__ = ["SIXTEEN_BIT_MODES", "eight_bit", "integer_range"]
