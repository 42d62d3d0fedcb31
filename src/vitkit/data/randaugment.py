"""RandAugment (Cubuk et al., 2020) on batches, on the compute device, with timm's numbers.

timm's RandAugment (``rand-m9-n2-mstd0.5``), which DeiT and AugReg train with, works on one Pillow
image at a time in loader workers. Here the same ops run on a float batch (B, C, H, W) of values in
[0, 255], each image with its own ops and magnitudes, so that it costs little next to the model
and needs no worker processes. Each op equals its Pillow counterpart (``ImageOps``,
``ImageEnhance``, ``Image.transform``) to within one intensity level on nearly every pixel of a
photograph (``tests/test_augment.py`` measures how nearly, op by op).

The numbers, as timm's ``auto_augment.py`` has them: a magnitude ``m`` on a 0-10 scale; each of
``n`` layers picks one op uniformly (with replacement) and applies it with probability 0.5; with
magnitude noise ``mstd`` each application draws its magnitude from N(m, mstd) (uniformly from
[0, m] when ``mstd`` is above 100), clipped to [0, 10]. From magnitude to argument:

================  ============================  =========================================
op                argument                      increasing variant (``inc1``)
================  ============================  =========================================
rotate            m/10 * 30 degrees, random +-  (the same)
shear x, y        m/10 * 0.3, random sign       (the same)
translate x, y    m/10 * 0.45 of the side, +-   (the same)
posterize         int(m/10 * 4) bits kept       4 - int(m/10 * 4)
solarize          threshold int(m/10 * 256)     256 - int(m/10 * 256)
solarize add      int(m/10 * 110) added below   (the same)
                  level 128
colour, contrast, factor m/10 * 1.8 + 0.1       max(0.1, 1 +- m/10 * 0.9)
brightness,
sharpness
auto-contrast,    none                          none
equalize, invert
================  ============================  =========================================

The op set is timm's default: the RandAugment paper's ops (but identity) plus ``Invert`` and
``SolarizeAdd``, which timm and the TensorFlow RandAugment of AugReg both add (``ops`` chooses
fewer). Geometric ops fill uncovered pixels with the mean colour (as
timm does: the normalisation mean times 255, rounded) and resample bilinearly. On grey images
(C = 1) the colour op is the identity; the others act on the one channel as Pillow's "L" mode does.

Every random number of a batch is drawn up front, in shapes that depend only on the batch size,
from the caller's generator: the augmentation of a step is a function of (seed, step), whatever
the images hold, which is what resuming bit-exactly needs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

OPS = (  # timm's _RAND_TRANSFORMS, in its order
    "auto_contrast",
    "equalize",
    "invert",
    "rotate",
    "posterize",
    "solarize",
    "solarize_add",
    "color",
    "contrast",
    "brightness",
    "sharpness",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
)
GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
MAX_MAGNITUDE = 10.0  # timm's _LEVEL_DENOM: magnitudes are on a 0-10 scale

# Pillow's RGB -> L: (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16, i.e. BT.601 luma, rounded.
_PIL_LUMA = (19595 / 65536, 38470 / 65536, 7471 / 65536)


@dataclass(frozen=True)
class RandAugmentConfig:
    """RandAugment's settings; :meth:`parse` reads timm's spelling (``"rand-m9-n2-mstd0.5"``).

    ``num_ops``: ops applied in turn to each image (timm's ``n``); ``magnitude``: 0-10 (``m``);
    ``magnitude_std``: noise on the magnitude per application (``mstd``; ``inf``: uniform in
    [0, magnitude]); ``prob``: chance that a chosen op is applied (timm's 0.5; ``p``);
    ``increasing``: the variants whose strength grows with the magnitude (``inc1``, as DeiT).

    Attributes:
        num_ops: ops applied in turn to each image, at least 1 (timm's ``n``).
        magnitude: the ops' strength on timm's 0-10 scale (``m``).
        magnitude_std: the standard deviation of the noise on the magnitude per application
            (``mstd``); ``inf``: uniform in [0, magnitude].
        prob: the chance that a chosen op is applied, in [0, 1] (``p``).
        increasing: use the variants whose strength grows with the magnitude (``inc1``).
        ops: the ops drawn from, by name (all of them by default).

    Raises:
        ValueError: on creation, a value out of its range or an unknown op.
    """

    num_ops: int = 2
    magnitude: float = 9.0
    magnitude_std: float = 0.0
    prob: float = 0.5
    increasing: bool = False
    ops: tuple[str, ...] = OPS

    def __post_init__(self) -> None:
        if self.num_ops < 1:
            raise ValueError(f"the number of ops must be at least 1, got {self.num_ops}")
        if not 0 <= self.magnitude <= MAX_MAGNITUDE:
            raise ValueError(f"magnitude must be in [0, 10], got {self.magnitude:g}")
        if not self.magnitude_std >= 0:
            raise ValueError(f"the magnitude noise must be >= 0, got {self.magnitude_std:g}")
        if not 0 <= self.prob <= 1:
            raise ValueError(f"the probability of an op must be in [0, 1], got {self.prob:g}")
        unknown = [o for o in self.ops if o not in OPS]
        if unknown or not self.ops:
            raise ValueError(f"unknown ops {unknown}; known: {', '.join(OPS)}")

    @classmethod
    def parse(cls, spec: str) -> RandAugmentConfig:
        """``"rand-m9-n2-mstd0.5-inc1-p0.5"`` (any order after ``rand``): timm's keys m, n, mstd
        (above 100: uniform), inc, and p. A malformed spec is a ``ValueError`` saying which part.

        Args:
            spec: ``rand`` followed by ``-KEYVALUE`` parts; keys left out keep their defaults.
                ``inc0`` is off, any other ``inc`` value on.

        Returns:
            The settings, with every op of :data:`OPS`.

        Raises:
            ValueError: a spec that does not start with ``rand``, a part that is not one of the
                keys with a number, a fractional ``n``, or a value out of range.
        """
        parts = spec.strip().split("-")
        if parts[0] != "rand":
            raise ValueError(f"{spec!r} does not start with 'rand' (e.g. 'rand-m9-n2-mstd0.5')")
        fields: dict[str, float | int | bool] = {}
        for part in parts[1:]:
            m = re.fullmatch(r"(mstd|inc|m|n|p)(\d+(?:\.\d*)?|\.\d+)", part)
            if m is None:
                known = "m<magnitude>, n<ops>, mstd<noise>, inc<0|1>, p<prob>"
                raise ValueError(f"{spec!r}: cannot read {part!r} (known: {known})")
            key, value = m.group(1), float(m.group(2))
            if key == "m":
                fields["magnitude"] = value
            elif key == "n":
                if value != int(value):
                    raise ValueError(f"{spec!r}: the number of ops must be whole, got {part!r}")
                fields["num_ops"] = int(value)
            elif key == "mstd":
                fields["magnitude_std"] = math.inf if value > 100 else value
            elif key == "inc":
                fields["increasing"] = value != 0  # timm reads any inc<digit> as on; inc0 is off here
            else:
                fields["prob"] = value
        try:
            return cls(**fields)
        except ValueError as e:
            raise ValueError(f"{spec!r}: {e}") from None


# -- the ops: float (b, C, H, W) in [0, 255] and per-image arguments (b,) -> the same shape ---------------------


def _luma(x: torch.Tensor) -> torch.Tensor:
    """Pillow's "L" of an RGB batch, rounded as Pillow rounds it: (b, 1, H, W)."""
    if x.shape[1] == 1:
        return x
    w = torch.tensor(_PIL_LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return torch.floor((x * w).sum(dim=1, keepdim=True) + 0.5)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Pillow's ``Image.blend(degenerate, x, factor)``, clipped (ImageEnhance's extrapolation)."""
    f = factor.view(-1, 1, 1, 1).to(x.dtype)
    return (degenerate + f * (x - degenerate)).clamp(0, 255)


def auto_contrast(x: torch.Tensor, _arg: torch.Tensor | None = None) -> torch.Tensor:
    """``ImageOps.autocontrast``: each channel stretched from its own min..max to 0..255.
    (Pillow truncates each mapped value to an integer; this keeps the fraction.)"""
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    span = hi - lo
    stretched = ((x - lo) * (255.0 / span.clamp_min(1e-6))).clamp(0, 255)
    return torch.where(span > 0, stretched, x)


def equalize(x: torch.Tensor, _arg: torch.Tensor | None = None) -> torch.Tensor:
    """``ImageOps.equalize``, channel by channel, with Pillow's look-up table: with ``step`` the
    count of all pixels but those of the brightest level present,
    divided by 255 (floor; older Pillow divided by 256), level i maps to
    (step // 2 + pixels below i) // step; one level present, or step 0: unchanged.
    Values are binned to the nearest integer level first (exact on integer inputs)."""
    b, c, h, w = x.shape
    levels = x.round().clamp(0, 255).long().view(b * c, h * w)  # (bC, HW)
    hist = torch.zeros(b * c, 256, dtype=torch.long, device=x.device).scatter_add_(1, levels, torch.ones_like(levels))
    present = hist > 0
    top = 255 - present.flip(1).long().argmax(dim=1, keepdim=True)  # the brightest level present, (bC, 1)
    step = (h * w - hist.gather(1, top)) // 255  # (bC, 1)
    below = hist.cumsum(1) - hist  # pixels below each level, (bC, 256)
    lut = ((step // 2 + below) // step.clamp_min(1)).clamp(max=255)
    keep = (present.sum(1, keepdim=True) <= 1) | (step == 0)
    out = lut.gather(1, levels).to(x.dtype).view(b, c, h, w)
    return torch.where(keep.view(b, c, 1, 1), x, out)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``ImageOps.posterize``: keep the top ``bits`` bits of each level (8 or more: unchanged)."""
    unit = torch.pow(2.0, (8 - bits).clamp(min=0).to(x.dtype)).view(-1, 1, 1, 1)
    return torch.where((bits >= 8).view(-1, 1, 1, 1), x, torch.floor(x / unit) * unit)


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """``ImageOps.solarize``: levels at or above ``threshold`` inverted."""
    return torch.where(x >= threshold.view(-1, 1, 1, 1).to(x.dtype), 255 - x, x)


def invert(x: torch.Tensor, _arg: torch.Tensor | None = None) -> torch.Tensor:
    """``ImageOps.invert``: every level l becomes 255 - l."""
    return 255 - x


def solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    """timm's ``solarize_add`` (a look-up table through ``Image.point``): ``add`` added to the
    levels below 128, capped at 255; the others unchanged."""
    return torch.where(x < 128, (x + add.view(-1, 1, 1, 1).to(x.dtype)).clamp(max=255), x)


def color(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``ImageEnhance.Color``: blend with the grey image; a grey batch is left as it is."""
    if x.shape[1] == 1:
        return x
    return _blend(_luma(x), x, factor)


def contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``ImageEnhance.Contrast``: blend with the image's mean grey level, rounded to an integer."""
    mean = torch.floor(_luma(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
    return _blend(mean, x, factor)


def brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``ImageEnhance.Brightness``: blend with black."""
    return _blend(torch.zeros_like(x), x, factor)


def sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``ImageEnhance.Sharpness``: blend with ``ImageFilter.SMOOTH`` of the image (3x3 weights 1,
    centre 5, over 13), which Pillow rounds to integers and leaves the one-pixel border of
    unfiltered. The filter is written as sums of shifted views: a depthwise convolution of small
    images costs more in its set-up than in its arithmetic on CPU."""
    h, w = x.shape[-2:]
    if h < 3 or w < 3:
        return x
    rows = x[..., :, :-2] + x[..., :, 1:-1] + x[..., :, 2:]  # (b, C, H, W-2)
    box = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]  # (b, C, H-2, W-2): the 3x3 sums
    smooth = x.clone()
    smooth[..., 1:-1, 1:-1] = torch.floor((box + 4 * x[..., 1:-1, 1:-1]) / 13 + 0.5)
    return _blend(smooth, x, factor)


def affine(x: torch.Tensor, coeffs: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """``Image.transform(size, AFFINE, (a, b, c, d, e, f), BILINEAR, fillcolor=fill)`` per image.

    ``coeffs`` (b, 6) map each output pixel centre (X, Y) to the input point (aX + bY + c,
    dX + eY + f), in pixel units with the image spanning [0, W) x [0, H), as Pillow's do. Where
    that point falls outside the image the output is ``fill``; inside, bilinear interpolation with
    the edge pixels repeated (grid_sample's "border"): Pillow's rule exactly, so only rounding
    (Pillow returns integers) differs. An image whose coefficients are the identity is returned
    unchanged, bit for bit.

    Args:
        x: a float batch (b, C, H, W).
        coeffs: the coefficients (b, 6) of each image, as :func:`pillow_coeffs` gives them.
        fill: the colour (C,) of pixels that come from outside the image.

    Returns:
        The transformed batch (b, C, H, W), in the dtype of ``x``.
    """
    b, _, h, w = x.shape
    k = coeffs.to(x.dtype).view(b, 6, 1, 1)
    xs = torch.arange(w, device=x.device, dtype=x.dtype) + 0.5  # output pixel centres, (W,)
    ys = (torch.arange(h, device=x.device, dtype=x.dtype) + 0.5).view(h, 1)  # (H, 1)
    u = k[:, 0] * xs + k[:, 1] * ys + k[:, 2]  # (b, H, W): where each output pixel comes from, in pixels
    v = k[:, 3] * xs + k[:, 4] * ys + k[:, 5]
    # Inside the image in pixel units, where a shift by half a pixel lands exactly on the edge as in Pillow.
    inside = ((u >= 0) & (u < w) & (v >= 0) & (v < h)).unsqueeze(1)  # (b, 1, H, W)
    grid = torch.stack((u * (2 / w) - 1, v * (2 / h) - 1), dim=-1)  # (b, H, W, 2) in grid_sample's units
    sampled = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    out = torch.where(inside, sampled, fill.to(x.dtype).view(1, -1, 1, 1))
    identity = torch.tensor([1.0, 0, 0, 0, 1.0, 0], device=x.device, dtype=coeffs.dtype)
    same = (coeffs == identity).all(dim=1).view(b, 1, 1, 1)
    return torch.where(same, x, out)


def pillow_coeffs(op: str, arg: float, size: tuple[int, int]) -> tuple[float, ...]:
    """The affine coefficients (a, b, c, d, e, f) Pillow uses for a geometric op: ``Image.rotate``
    (counter-clockwise about the centre, with its cosines rounded to 15 digits) and timm's
    ``transform`` calls for shear (x' = x + arg * y) and translation (by ``arg`` of the side).

    Args:
        op: "rotate", "shear_x", "shear_y", "translate_x" or "translate_y".
        arg: degrees for "rotate", the shear factor for the shears, the fraction of the width
            (height) for "translate_x" ("translate_y"); as :func:`op_argument` gives it.
        size: (H, W) of the image, in pixels.

    Returns:
        (a, b, c, d, e, f), mapping an output pixel (X, Y) to the input point (aX + bY + c,
        dX + eY + f); the identity for a rotation by a multiple of 360 degrees.

    Raises:
        KeyError: an ``op`` that is not geometric.
    """
    h, w = size
    if op == "rotate":
        if arg % 360 == 0:
            return (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
        a = -math.radians(arg)
        cos, sin = round(math.cos(a), 15), round(math.sin(a), 15)
        cx, cy = w / 2, h / 2
        return (cos, sin, cos * -cx + sin * -cy + cx, -sin, cos, -sin * -cx + cos * -cy + cy)
    return {
        "shear_x": (1.0, arg, 0.0, 0.0, 1.0, 0.0),
        "shear_y": (1.0, 0.0, 0.0, arg, 1.0, 0.0),
        "translate_x": (1.0, 0.0, arg * w, 0.0, 1.0, 0.0),
        "translate_y": (1.0, 0.0, 0.0, 0.0, 1.0, arg * h),
    }[op]


def geometric(x: torch.Tensor, ops: list[str], args: list[float], fill: torch.Tensor) -> torch.Tensor:
    """Image i of the batch through geometric op ``ops[i]`` with argument ``args[i]``: one resampling.

    Args:
        x: a float batch (b, C, H, W).
        ops: one geometric op a image (names of :data:`GEOMETRIC`).
        args: one argument a image, as :func:`pillow_coeffs` takes it.
        fill: the colour (C,) of uncovered pixels.

    Returns:
        The transformed batch (b, C, H, W).

    Raises:
        ValueError: ``ops`` and ``args`` of different lengths.
        KeyError: an op that is not geometric.
    """
    rows = [pillow_coeffs(op, a, tuple(x.shape[-2:])) for op, a in zip(ops, args, strict=True)]
    return affine(x, torch.tensor(rows, dtype=torch.float64, device=x.device), fill)


_COLOUR_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "auto_contrast": auto_contrast,
    "equalize": equalize,
    "posterize": posterize,
    "solarize": solarize,
    "invert": invert,
    "solarize_add": solarize_add,
    "color": color,
    "contrast": contrast,
    "brightness": brightness,
    "sharpness": sharpness,
}


def op_argument(op: str, magnitude: float, sign: float = 1.0, increasing: bool = False) -> float:
    """timm's magnitude (0-10) -> argument of ``op`` (the table of the module docstring); ``sign``
    (+-1) is the random negation of the signed ops.

    Args:
        op: a name of :data:`OPS`.
        magnitude: the magnitude, 0-10.
        sign: +1 or -1; the geometric ops and, with ``increasing``, the enhancement ops (colour,
            contrast, brightness, sharpness) take it, the others ignore it.
        increasing: the ``inc1`` variants (see the table of the module docstring).

    Returns:
        The argument: degrees for rotate, a shear factor, a fraction of the side for the
        translations, bits kept for posterize, a threshold level for solarize, the level added
        by solarize add, a blend factor for the enhancement ops; 0 for the ops without one.
    """
    level = magnitude / MAX_MAGNITUDE
    if op == "rotate":
        return level * 30 * sign
    if op in ("shear_x", "shear_y"):
        return level * 0.3 * sign
    if op in ("translate_x", "translate_y"):
        return level * 0.45 * sign
    if op == "posterize":
        bits = math.floor(level * 4)
        return 4 - bits if increasing else bits
    if op == "solarize":
        threshold = math.floor(level * 256)
        return 256 - threshold if increasing else threshold
    if op == "solarize_add":
        return math.floor(level * 110)
    if op in ("color", "contrast", "brightness", "sharpness"):
        return max(0.1, 1 + level * 0.9 * sign) if increasing else level * 1.8 + 0.1
    return 0.0  # auto_contrast, equalize, invert: no argument


def apply_op(x: torch.Tensor, op: str, args: list[float] | float, fill: torch.Tensor) -> torch.Tensor:
    """One op on every image of a float batch in [0, 255]: ``args`` one argument an image (or one for all).

    Args:
        x: a float batch (B, C, H, W) in [0, 255].
        op: a name of :data:`OPS`.
        args: the op's argument (see :func:`op_argument`), one for every image or one for all.
        fill: the colour (C,) of pixels a geometric op uncovers.

    Returns:
        The transformed batch (B, C, H, W), in [0, 255].

    Raises:
        KeyError: an unknown ``op``.
    """
    args = [float(args)] * x.shape[0] if isinstance(args, (int, float)) else [float(a) for a in args]
    if op in GEOMETRIC:
        return geometric(x, [op] * len(args), args, fill)
    return _COLOUR_OPS[op](x, torch.tensor(args, device=x.device))


def rand_augment(x: torch.Tensor, cfg: RandAugmentConfig, g: torch.Generator, fill: torch.Tensor) -> torch.Tensor:
    """RandAugment of a float batch (B, C, H, W) in [0, 255]; returns a new batch, still in [0, 255].

    ``fill``: the colour (C,) of pixels the geometric ops uncover. The draws (op, whether it
    applies, magnitude, sign: per image and layer) come to the host in one transfer and each
    image's arguments are worked out there, as timm does per image; then, per layer, the images
    that chose each colour op are gathered and transformed together, and those that chose any
    geometric op are resampled together: a layer costs about one op per image in a few calls.

    Args:
        x: a float batch (B, C, H, W) in [0, 255].
        cfg: the RandAugment settings.
        g: the generator every draw comes from, on the device of ``x``.
        fill: the colour (C,) of pixels a geometric op uncovers, in [0, 255].

    Returns:
        The augmented batch (B, C, H, W), a new tensor; ``x`` is left as it is.
    """
    b = x.shape[0]
    dev = x.device
    n = cfg.num_ops
    choice = torch.randint(len(cfg.ops), (n, b), generator=g, device=dev)
    applied = torch.rand(n, b, generator=g, device=dev) < cfg.prob
    noise = torch.randn(n, b, generator=g, device=dev)
    spread = torch.rand(n, b, generator=g, device=dev)
    sign = torch.where(torch.rand(n, b, generator=g, device=dev) > 0.5, -1.0, 1.0)  # timm negates above 0.5
    if math.isinf(cfg.magnitude_std):
        magnitude = spread * cfg.magnitude
    else:
        magnitude = cfg.magnitude + cfg.magnitude_std * noise
    magnitude = magnitude.clamp(0, MAX_MAGNITUDE)
    taken, magnitude, sign = torch.stack([torch.where(applied, choice, -1).float(), magnitude, sign]).tolist()
    out = x.clone()
    fill = fill.to(dev)
    for layer in range(n):
        groups: dict[str, tuple[list[int], list[float]]] = {}
        for i in range(b):
            k = int(taken[layer][i])
            if k >= 0:
                op = cfg.ops[k]
                members, args = groups.setdefault("geometric" if op in GEOMETRIC else op, ([], []))
                members.append(i)
                args.append(op_argument(op, magnitude[layer][i], sign[layer][i], cfg.increasing))
        for op, (members, args) in groups.items():
            idx = torch.tensor(members, device=dev)
            if op == "geometric":
                ops = [cfg.ops[int(taken[layer][i])] for i in members]
                out[idx] = geometric(out[idx], ops, args, fill)
            else:
                out[idx] = _COLOUR_OPS[op](out[idx], torch.tensor(args, device=dev))
    return out


__all__ = [
    "GEOMETRIC",
    "MAX_MAGNITUDE",
    "OPS",
    "RandAugmentConfig",
    "affine",
    "apply_op",
    "geometric",
    "op_argument",
    "pillow_coeffs",
    "rand_augment",
]
