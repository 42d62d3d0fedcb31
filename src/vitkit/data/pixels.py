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

from ..preprocessing import SIXTEEN_BIT_MODES, eight_bit, integer_range

__all__ = ["SIXTEEN_BIT_MODES", "eight_bit", "integer_range"]
