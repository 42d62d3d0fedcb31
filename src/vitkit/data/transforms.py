"""Batched image transforms on the compute device.

Inputs are uint8 batches (B, C, H, W) straight from a source; outputs are float batches in the
model's value range (the paper's [-1, 1] by default). Randomness comes from an explicit
``torch.Generator`` so that a step's augmentation depends only on (seed, step): a resumed run
sees exactly the images an uninterrupted one would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import DataError
from ..preprocessing import normalize
from .randaugment import RandAugmentConfig, rand_augment


def step_generator(seed: int, step: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator whose stream depends only on (seed, step).

    Args:
        seed: the run's seed.
        step: the training step.
        device: the device the generator draws on (that of the batches it augments).

    Returns:
        A new generator on ``device``, seeded with a mix of ``seed`` and ``step``.
    """
    g = torch.Generator(device=device)
    g.manual_seed((seed * 0x9E3779B1 + step * 0x85EBCA77 + 1) % (2**63 - 1))
    return g


def _uniform(n: int, lo: float, hi: float, g: torch.Generator, device) -> torch.Tensor:
    return torch.rand(n, generator=g, device=device) * (hi - lo) + lo


_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601, as Pillow's "L"


def match_channels(x: torch.Tensor, in_chans: int) -> torch.Tensor:
    """Convert an image batch (B, C, H, W) to ``in_chans`` channels.

    One channel to three: the grey value repeated. Three to one: luminance (ITU-R BT.601, as
    Pillow's "L"). Any other mismatch is a ``ValueError``.

    Args:
        x: the batch (B, C, H, W).
        in_chans: the channels wanted.

    Returns:
        ``x`` itself when it has ``in_chans`` channels; from one channel, a view that repeats it
        ``in_chans`` times, in the dtype of ``x``; from three to one, float32 luminance
        (B, 1, H, W), not rounded.

    Raises:
        ValueError: any other pair of channel counts.
    """
    c = x.shape[1]
    if c == in_chans:
        return x
    if c == 1:
        return x.expand(-1, in_chans, -1, -1)  # (B, in_chans, H, W)
    if c == 3 and in_chans == 1:
        w = torch.tensor(_LUMA, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        return (x.float() * w).sum(dim=1, keepdim=True)  # (B, 1, H, W)
    raise ValueError(f"cannot feed {c}-channel images to a model that takes {in_chans} channels")


def hflip(x: torch.Tensor, g: torch.Generator, p: float = 0.5) -> torch.Tensor:
    """Flip each image left-right with probability ``p``.

    Args:
        x: the batch (B, C, H, W).
        g: the generator, on the device of ``x``.
        p: the probability that an image is flipped.

    Returns:
        A new batch of the same shape and dtype.
    """
    mask = torch.rand(x.shape[0], generator=g, device=x.device) < p
    return torch.where(mask.view(-1, 1, 1, 1), x.flip(-1), x)


def random_crop(x: torch.Tensor, g: torch.Generator, pad: int = 4, fill: float = 0) -> torch.Tensor:
    """Pad every side by ``pad`` and take a random crop of the original size, per image.

    Args:
        x: the batch (B, C, H, W).
        g: the generator, on the device of ``x``.
        pad: pixels added on every side; 0 or less: no crop.
        fill: the value of the padding.

    Returns:
        The cropped batch (B, C, H, W), in the dtype of ``x``; ``x`` itself when ``pad`` is 0 or
        less.
    """
    B, C, H, W = x.shape
    if pad <= 0:
        return x
    xp = F.pad(x, (pad, pad, pad, pad), value=fill)  # (B, C, H+2p, W+2p)
    dy = torch.randint(0, 2 * pad + 1, (B,), generator=g, device=x.device)
    dx = torch.randint(0, 2 * pad + 1, (B,), generator=g, device=x.device)
    rows = (dy[:, None] + torch.arange(H, device=x.device)).view(B, 1, H, 1).expand(B, C, H, W + 2 * pad)
    xp = xp.gather(2, rows)  # (B, C, H, W+2p)
    cols = (dx[:, None] + torch.arange(W, device=x.device)).view(B, 1, 1, W).expand(B, C, H, W)
    return xp.gather(3, cols)  # (B, C, H, W)


def inception_crop(
    x: torch.Tensor,
    size: tuple[int, int],
    g: torch.Generator,
    area: tuple[float, float] = (0.05, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """Random-resized ("inception") crop of each image, resampled bilinearly to ``size``.

    Per image: a box with a random fraction of the area and a log-uniform aspect ratio,
    clipped to the image, at a random position. Float input (B, C, H, W) -> (B, C, *size).

    Args:
        x: a float batch (B, C, H, W).
        size: (H, W) of the result, in pixels.
        g: the generator, on the device of ``x``.
        area: the range of the box's area, as fractions of the image's.
        ratio: the range of the box's aspect ratio (width / height).

    Returns:
        The crops, (B, C, *size), in the dtype of ``x``.
    """
    B, C, H, W = x.shape
    dev = x.device
    a = _uniform(B, area[0], area[1], g, dev) * H * W
    logr = _uniform(B, math.log(ratio[0]), math.log(ratio[1]), g, dev)
    r = torch.exp(logr)
    w = torch.sqrt(a * r).clamp(1, W)
    h = torch.sqrt(a / r).clamp(1, H)
    cx = torch.rand(B, generator=g, device=dev) * (W - w) + w / 2
    cy = torch.rand(B, generator=g, device=dev) * (H - h) + h / 2
    theta = torch.zeros(B, 2, 3, device=dev, dtype=x.dtype)
    theta[:, 0, 0] = w / W
    theta[:, 0, 2] = 2 * cx / W - 1
    theta[:, 1, 1] = h / H
    theta[:, 1, 2] = 2 * cy / H - 1
    grid = F.affine_grid(theta, [B, C, size[0], size[1]], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def resize(x: torch.Tensor, size: tuple[int, int], mode: str = "bilinear") -> torch.Tensor:
    """Bilinear (or ``mode="bicubic"``) resize of a float batch (antialiased when shrinking).

    Args:
        x: a float batch (B, C, H, W).
        size: (H, W) of the result, in pixels.
        mode: "bilinear" or "bicubic".

    Returns:
        The resized batch (B, C, *size); ``x`` itself when it already has that size.
    """
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    shrink = size[0] < x.shape[-2] or size[1] < x.shape[-1]
    return F.interpolate(x, size=size, mode=mode, align_corners=False, antialias=shrink)


def center_crop(x: torch.Tensor, fraction: float) -> torch.Tensor:
    """Keep the central ``fraction`` of each side.

    Args:
        x: a batch (..., H, W).
        fraction: the share of each side kept; 1 or more: all of it.

    Returns:
        A view of the centre, each side ``round(side * fraction)`` pixels (at least 1); ``x``
        itself when ``fraction`` is 1 or more.
    """
    if fraction >= 1.0:
        return x
    H, W = x.shape[-2:]
    h, w = max(1, round(H * fraction)), max(1, round(W * fraction))
    top, left = (H - h) // 2, (W - w) // 2
    return x[..., top : top + h, left : left + w]


ERASE_MODES = ("pixel", "rand", "const")


@dataclass(frozen=True)
class EraseConfig:
    """Random erasing (Zhong et al., 2020) as timm's ``RandomErasing``: with probability ``prob``
    an image gets 1 to ``max_count`` boxes (uniformly many), each of a random fraction of the
    image in ``area`` divided by that count and a log-uniform aspect ratio (height / width) in
    ``aspect``, at a random place; up to 10 tries a box to fit inside the image, else that box is
    left out. ``mode``: "pixel" fills with per-pixel N(0, 1) noise, "rand" with one N(0, 1)
    colour a box, "const" with zeros; in normalised units, since it runs after normalisation.

    Attributes:
        prob: the probability that an image is erased at all.
        area: the (low, high) fraction of the image the boxes cover, 0 < low <= high <= 1.
        aspect: the (low, high) aspect ratio (height / width) of a box.
        max_count: the most boxes an image gets, at least 1.
        mode: "pixel", "rand" or "const": what fills a box.

    Raises:
        ValueError: on creation, a value out of its range or an unknown mode.
    """

    prob: float = 0.25
    area: tuple[float, float] = (0.02, 1 / 3)
    aspect: tuple[float, float] = (0.3, 1 / 0.3)
    max_count: int = 1
    mode: str = "pixel"

    def __post_init__(self) -> None:
        if self.mode not in ERASE_MODES:
            raise ValueError(f"erasing mode must be one of {', '.join(ERASE_MODES)}, got {self.mode!r}")
        if not (0 < self.area[0] <= self.area[1] <= 1) or not (0 < self.aspect[0] <= self.aspect[1]):
            raise ValueError(f"erasing area must be 0 < low <= high <= 1 and aspect 0 < low <= high, got {self}")
        if self.max_count < 1:
            raise ValueError(f"erasing count must be at least 1, got {self.max_count}")


_ERASE_TRIES = 10  # timm's attempts at a box that fits


def random_erase(x: torch.Tensor, cfg: EraseConfig, g: torch.Generator) -> torch.Tensor:
    """Erase random boxes of a normalised float batch (B, C, H, W); returns a new batch.

    Batched: every draw is made for every image, box slot and try (shapes that depend only on
    the batch), and each box is the first try that fits, as timm's loop would take it.

    Args:
        x: a normalised float batch (B, C, H, W).
        cfg: the erasing settings.
        g: the generator, on the device of ``x``.

    Returns:
        The batch with its boxes erased, a new tensor; ``x`` is left as it is.
    """
    B, C, H, W = x.shape
    dev, k = x.device, cfg.max_count
    erase = torch.rand(B, generator=g, device=dev) < cfg.prob
    count = torch.randint(1, k + 1, (B,), generator=g, device=dev)  # (B,)
    area = _uniform(B * k * _ERASE_TRIES, *cfg.area, g, dev).view(B, k, _ERASE_TRIES) * (H * W)
    area = area / count.view(B, 1, 1)
    logr = _uniform(B * k * _ERASE_TRIES, math.log(cfg.aspect[0]), math.log(cfg.aspect[1]), g, dev)
    r = torch.exp(logr).view(B, k, _ERASE_TRIES)
    h = torch.round(torch.sqrt(area * r))  # (B, k, tries)
    w = torch.round(torch.sqrt(area / r))
    fits = (h < H) & (w < W)
    first = fits.long().argmax(dim=2, keepdim=True)  # the first try that fits, (B, k, 1)
    h, w = h.gather(2, first).squeeze(2), w.gather(2, first).squeeze(2)  # (B, k)
    used = fits.any(dim=2) & erase[:, None] & (torch.arange(k, device=dev)[None] < count[:, None])
    top = torch.floor(torch.rand(B, k, generator=g, device=dev) * (H - h + 1))
    left = torch.floor(torch.rand(B, k, generator=g, device=dev) * (W - w + 1))
    rows = torch.arange(H, device=dev, dtype=x.dtype).view(1, H, 1)
    cols = torch.arange(W, device=dev, dtype=x.dtype).view(1, 1, W)
    out = x.clone()
    for s in range(k):
        t, lf = top[:, s].view(B, 1, 1), left[:, s].view(B, 1, 1)
        inside = (rows >= t) & (rows < t + h[:, s].view(B, 1, 1)) & (cols >= lf) & (cols < lf + w[:, s].view(B, 1, 1))
        mask = (inside & used[:, s].view(B, 1, 1)).unsqueeze(1)  # (B, 1, H, W)
        if cfg.mode == "pixel":
            fill = torch.randn(B, C, H, W, generator=g, device=dev, dtype=x.dtype)
        elif cfg.mode == "rand":
            fill = torch.randn(B, C, 1, 1, generator=g, device=dev, dtype=x.dtype)
        else:
            fill = torch.zeros((), device=dev, dtype=x.dtype)
        out = torch.where(mask, fill, out)
    return out


@dataclass
class TransformConfig:
    """Augmentation of a recipe. ``crop``: "inception" (area 0.05-1, aspect 3/4-4/3), "pad"
    (random crop after padding by ``pad``), or "none"; ``flip``: random horizontal flips;
    ``randaugment``: RandAugment after the crop and flip (timm's order); ``erase``: random
    erasing after normalisation. Mixup and CutMix need the labels: ``vitkit.data.mix``.

    Attributes:
        img_size: the (height, width) the model takes, in pixels; an int means a square.
        crop: the training crop: "inception", "pad" or "none" (a resize to ``img_size``).
        pad: the padding (pixels) of the "pad" crop.
        flip: random horizontal flips in training.
        area_min: the smallest fraction of the image the "inception" crop keeps.
        eval_crop: the centre-crop fraction at evaluation (1.0: resize only).
        eval_interpolation: resizing at evaluation: "bilinear" or "bicubic" (the weights' own).
        mean: the per-channel mean the pixels (in [0, 1]) are normalised by.
        std: the per-channel standard deviation the pixels are normalised by.
        randaugment: RandAugment's settings; None: none.
        erase: random erasing's settings; None: none.

    Raises:
        ValueError: on creation, an unknown ``crop`` or ``eval_interpolation``.
    """

    img_size: tuple[int, int] = (224, 224)
    crop: str = "inception"
    pad: int = 4
    flip: bool = True
    area_min: float = 0.05
    eval_crop: float = 1.0  # centre-crop fraction at evaluation (1.0: resize only)
    eval_interpolation: str = "bilinear"  # resizing at evaluation: "bilinear" or "bicubic" (the weights' own)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    randaugment: RandAugmentConfig | None = None
    erase: EraseConfig | None = None

    def __post_init__(self) -> None:
        if self.crop not in ("inception", "pad", "none"):
            raise ValueError(f"crop must be 'inception', 'pad' or 'none', got {self.crop!r}")
        if self.eval_interpolation not in ("bilinear", "bicubic"):
            raise ValueError(f"eval_interpolation must be 'bilinear' or 'bicubic', got {self.eval_interpolation!r}")
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = tuple(self.img_size)
        self.mean, self.std = tuple(self.mean), tuple(self.std)


def train_transform(x: torch.Tensor, cfg: TransformConfig, g: torch.Generator) -> torch.Tensor:
    """uint8 batch on the compute device -> augmented float batch in the model's range.

    In order: the "pad" crop, the "inception" crop (or a resize to ``cfg.img_size``), the flip,
    RandAugment, normalisation, random erasing; each where ``cfg`` asks for it.

    Args:
        x: a uint8 batch (B, C, H, W).
        cfg: the augmentation.
        g: the step's generator (:func:`step_generator`), on the device of ``x``.

    Returns:
        float32 (B, C, *cfg.img_size), normalised with ``cfg.mean`` and ``cfg.std``.

    Raises:
        DataError: ``cfg.mean`` does not have one value for each channel of ``x``.
    """
    if cfg.crop == "pad":
        x = random_crop(x, g, cfg.pad)
    x = x.float()
    if cfg.crop == "inception":
        x = inception_crop(x, cfg.img_size, g, area=(cfg.area_min, 1.0))
    else:
        x = resize(x, cfg.img_size)
    if cfg.flip:
        x = hflip(x, g)
    if cfg.randaugment is not None:
        if len(cfg.mean) != x.shape[1]:
            raise DataError(f"{len(cfg.mean)} normalisation channels for images with {x.shape[1]} channels")
        fill = torch.tensor([min(255.0, round(255 * m)) for m in cfg.mean])  # timm's fill: the mean colour
        x = rand_augment(x, cfg.randaugment, g, fill)
    x = normalize(x, cfg.mean, cfg.std)
    if cfg.erase is not None and cfg.erase.prob > 0:
        x = random_erase(x, cfg.erase, g)
    return x


def eval_transform(x: torch.Tensor, cfg: TransformConfig) -> torch.Tensor:
    """uint8 batch -> float batch: optional centre crop, resize, value range.

    Args:
        x: a uint8 batch (B, C, H, W).
        cfg: the transform; ``eval_crop``, ``eval_interpolation``, ``img_size``, ``mean`` and
            ``std`` are used.

    Returns:
        float32 (B, C, *cfg.img_size), normalised with ``cfg.mean`` and ``cfg.std``.

    Raises:
        DataError: ``cfg.mean`` does not have one value for each channel of ``x``.
    """
    x = center_crop(x.float(), cfg.eval_crop)
    x = resize(x, cfg.img_size, cfg.eval_interpolation)
    return normalize(x, cfg.mean, cfg.std)
