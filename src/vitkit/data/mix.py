"""Mixup (Zhang et al., 2018) and CutMix (Yun et al., 2019) on batches, with timm's semantics.

Each image is mixed with its mirror in the batch (image i with image B-1-i, as timm's ``flip``):

- Mixup: ``x = lam * x + (1 - lam) * x_mirror`` with lam ~ Beta(mixup_alpha, mixup_alpha).
- CutMix: a box of the mirror image is pasted in. Its sides are ``int(side * sqrt(1 - lam))``
  with lam ~ Beta(cutmix_alpha, cutmix_alpha), centred on a uniformly random pixel and clipped
  to the image; lam is then corrected to the share of the image left unpasted (``correct_lam``),
  so the targets say what the pixels hold.
- With both alphas above 0, CutMix is chosen with probability ``switch_prob``; a batch (or an
  image, or a pair) is mixed at all with probability ``prob``.
- The targets are soft: ``lam * y + (1 - lam) * y_mirror`` of one-hot labels with label
  smoothing folded in (off value ``s / K``, on value ``1 - s + s / K``), which is what both the
  softmax and the sigmoid losses of the training loop take (``vitkit.train.loop.loss_fn``).
- ``mode``: "batch" draws one lam (and box) for the whole batch, "elem" one for each image,
  "pair" one for each pair (i, B-1-i), the same for both (the batch must be even).

The random numbers come from a NumPy generator seeded by one draw from the caller's torch
generator (torch has no seeded Beta sampler), so a step's mixing is a function of (seed, step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

MIX_MODES = ("batch", "pair", "elem")


@dataclass(frozen=True)
class MixConfig:
    """Mixup and CutMix settings (timm's ``Mixup``): alphas of the Beta distributions (0: off),
    the probability of mixing, of choosing CutMix when both are on, the mode, and the label
    smoothing folded into the targets.

    Attributes:
        mixup_alpha: the Beta distribution's alpha of Mixup's lam; 0: no Mixup.
        cutmix_alpha: the Beta distribution's alpha of CutMix's lam; 0: no CutMix.
        prob: the probability that a batch (image, pair) is mixed at all, in [0, 1].
        switch_prob: with both alphas above 0, the probability of CutMix rather than Mixup.
        mode: "batch" (one lam for the batch), "pair" (one per mirrored pair) or "elem" (one
            per image).
        correct_lam: correct CutMix's lam to the share of the image its clipped box leaves.
        label_smoothing: the smoothing folded into the soft targets, in [0, 1).

    Raises:
        ValueError: on creation, a value out of its range or an unknown mode.
    """

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"
    correct_lam: bool = True
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise ValueError(f"mixup and cutmix alphas must be >= 0, got {self.mixup_alpha:g}, {self.cutmix_alpha:g}")
        for name in ("prob", "switch_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name):g}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing:g}")
        if self.mode not in MIX_MODES:
            raise ValueError(f"mix mode must be one of {', '.join(MIX_MODES)}, got {self.mode!r}")

    @property
    def enabled(self) -> bool:
        """Whether any image can be mixed."""
        return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.prob > 0


class Mixed(NamedTuple):
    """A mixed batch: what :func:`mix_batch` returns.

    Attributes:
        images: the mixed images (B, C, H, W).
        targets: the soft targets (B, K), float: each row sums to 1 (softmax), or is a soft
            label (sigmoid).
        lam: the weight of each image's own label (B,).
    """

    images: torch.Tensor  # (B, C, H, W)
    targets: torch.Tensor  # (B, K) float, each row sums to 1 (softmax) or is a soft label (sigmoid)
    lam: torch.Tensor  # (B,) the weight of each image's own label


def smoothed_one_hot(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """One-hot rows (B, K) with label smoothing: ``s / K`` off, ``1 - s + s / K`` on.

    Args:
        labels: class indices (B,).
        num_classes: K, the number of classes.
        smoothing: s, the label smoothing, from 0 (plain one-hot rows).

    Returns:
        float32 rows (B, K), on the device of ``labels``, each summing to 1.
    """
    off = smoothing / num_classes
    return F.one_hot(labels.long(), num_classes).float() * (1 - smoothing) + off


def _draw_lam(n: int, cfg: MixConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(lam, use CutMix) for ``n`` draws, as timm draws them per batch or per element."""
    lam, cut = np.ones(n), np.zeros(n, dtype=bool)
    if not cfg.enabled:
        return lam, cut
    mixed = rng.random(n) < cfg.prob
    if cfg.mixup_alpha > 0 and cfg.cutmix_alpha > 0:
        cut = rng.random(n) < cfg.switch_prob
        drawn = np.where(
            cut, rng.beta(cfg.cutmix_alpha, cfg.cutmix_alpha, n), rng.beta(cfg.mixup_alpha, cfg.mixup_alpha, n)
        )
    elif cfg.mixup_alpha > 0:
        drawn = rng.beta(cfg.mixup_alpha, cfg.mixup_alpha, n)
    else:
        cut = np.ones(n, dtype=bool)
        drawn = rng.beta(cfg.cutmix_alpha, cfg.cutmix_alpha, n)
    return np.where(mixed, drawn, 1.0), cut & mixed & (drawn < 1)


def cutmix_boxes(lam: np.ndarray, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """timm's ``rand_bbox``: boxes (n, 4) = (top, bottom, left, right), bottom and right
    exclusive, with sides ``int(side * sqrt(1 - lam))`` around a random centre, clipped.

    Args:
        lam: one mixing weight in [0, 1] a box (n,).
        size: (H, W) of the images, in pixels.
        rng: draws each box's centre, a uniformly random pixel.

    Returns:
        int64 boxes (n, 4) in pixels, clipped to the image; a box whose side would be under 2
        pixels (lam at or near 1) is empty.
    """
    h, w = size
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = (h * ratio).astype(np.int64), (w * ratio).astype(np.int64)
    cy, cx = rng.integers(0, h, len(lam)), rng.integers(0, w, len(lam))
    return np.stack(
        [
            np.clip(cy - cut_h // 2, 0, h),
            np.clip(cy + cut_h // 2, 0, h),
            np.clip(cx - cut_w // 2, 0, w),
            np.clip(cx + cut_w // 2, 0, w),
        ],
        axis=1,
    )


def mix_batch(
    images: torch.Tensor, labels: torch.Tensor, num_classes: int, cfg: MixConfig, g: torch.Generator
) -> Mixed:
    """Mix a float batch (B, C, H, W) and its int labels (B,) as ``cfg`` says; returns new tensors.

    With mixing off (or a batch that the draw leaves unmixed) the images come back unchanged and
    the targets are the smoothed one-hot labels.

    Args:
        images: a float batch (B, C, H, W).
        labels: int class indices (B,).
        num_classes: K, the number of classes of the targets.
        cfg: the mixing settings.
        g: the caller's generator; one number is drawn from it to seed the step's draws.

    Returns:
        The mixed images (B, C, H, W) (``images`` itself, not a copy, when nothing is mixed),
        the soft targets (B, K) float32, and each image's own weight ``lam`` (B,) in the dtype
        of ``images``.

    Raises:
        ValueError: mode "pair" with an odd batch.
    """
    B, _, H, W = images.shape
    dev = images.device
    if cfg.mode == "pair" and B % 2:
        raise ValueError(f"mix mode 'pair' needs an even batch, got {B} images")
    seed = int(torch.randint(0, 2**62, (1,), generator=g, device=g.device).item())
    rng = np.random.default_rng(seed)
    n = {"batch": 1, "pair": B // 2, "elem": B}[cfg.mode]
    lam, cut = _draw_lam(n, cfg, rng)
    boxes = cutmix_boxes(lam, (H, W), rng)
    if cfg.correct_lam:
        area = (boxes[:, 1] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 2])
        lam = np.where(cut, 1 - area / (H * W), lam)
    y = smoothed_one_hot(labels.to(dev), num_classes, cfg.label_smoothing)
    if cfg.mode == "batch":
        return _mix_whole_batch(images, y, float(lam[0]), bool(cut[0]), boxes[0].tolist())
    if cfg.mode == "pair":  # image B-1-i takes the draw of image i
        lam, cut, boxes = (np.concatenate([a, a[::-1]]) for a in (lam, cut, boxes))
    lam_t = torch.as_tensor(lam, dtype=images.dtype).to(dev)  # (B,)
    if not cut.any() and (lam == 1).all():
        return Mixed(images, y, lam_t)
    cut_t = torch.as_tensor(cut).to(dev)
    box = torch.as_tensor(boxes).to(dev).view(B, 4, 1, 1)
    mirror = images.flip(0)
    weight = torch.where(cut_t, torch.ones_like(lam_t), lam_t).view(B, 1, 1, 1)
    out = weight * images + (1 - weight) * mirror
    rows = torch.arange(H, device=dev).view(1, H, 1)
    cols = torch.arange(W, device=dev).view(1, 1, W)
    inside = (rows >= box[:, 0]) & (rows < box[:, 1]) & (cols >= box[:, 2]) & (cols < box[:, 3])  # (B, H, W)
    out = torch.where((inside & cut_t.view(B, 1, 1)).unsqueeze(1), mirror, out)
    targets = lam_t.view(B, 1).float() * y + (1 - lam_t.view(B, 1).float()) * y.flip(0)
    return Mixed(out, targets, lam_t)


def _mix_whole_batch(images: torch.Tensor, y: torch.Tensor, lam: float, cut: bool, box: list[int]) -> Mixed:
    """Mode "batch": one lam and one box for every image, so plain arithmetic and a slice."""
    lam_t = torch.full((images.shape[0],), lam, dtype=images.dtype, device=images.device)
    if lam == 1 and not cut:
        return Mixed(images, y, lam_t)
    mirror = images.flip(0)
    if cut:
        top, bottom, left, right = box
        out = images.clone()
        out[:, :, top:bottom, left:right] = mirror[:, :, top:bottom, left:right]
    else:
        out = images * lam + mirror * (1 - lam)
    return Mixed(out, y * lam + y.flip(0) * (1 - lam), lam_t)


__all__ = ["MIX_MODES", "MixConfig", "Mixed", "cutmix_boxes", "mix_batch", "smoothed_one_hot"]
