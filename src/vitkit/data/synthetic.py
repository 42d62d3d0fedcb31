"""Synthetic images for tests and smoke runs: each class is a grating of its own orientation and
frequency plus noise, so a model can learn it in a few steps and accuracy means something."""

from __future__ import annotations

import math

import torch

from .base import ArrayDataset


def synthetic_dataset(
    n: int = 512,
    img_size: int | tuple[int, int] = 32,
    num_classes: int = 10,
    in_chans: int = 3,
    seed: int = 0,
    noise: float = 0.25,
    name: str = "synthetic",
) -> ArrayDataset:
    """Gratings, one orientation and frequency a class, with Gaussian noise, in memory.

    Class ``k`` is a sine grating at ``k * 180 / num_classes`` degrees, of one of three
    frequencies (by ``k % 3``), at a random phase; the classes are as balanced as ``n`` allows,
    in a random order. The same arguments give the same images.

    Args:
        n: the number of images.
        img_size: N or (H, W), in pixels.
        num_classes: the number of classes.
        in_chans: channels; each holds the same grating, with noise of its own.
        seed: the seed of every random draw.
        noise: the standard deviation of the noise, in units of the grating's amplitude (1).
        name: the dataset's name.

    Returns:
        uint8 images (n, in_chans, H, W), int64 labels (n,), classes ``class_0``...
    """
    h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % num_classes
    labels = labels[torch.randperm(n, generator=g)]
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    angle = labels.float() * math.pi / num_classes  # (N,)
    freq = 2.0 + (labels % 3).float() * 1.5
    phase = torch.rand(n, generator=g) * 2 * math.pi
    proj = xx[None] * torch.cos(angle)[:, None, None] + yy[None] * torch.sin(angle)[:, None, None]
    img = torch.sin(proj * freq[:, None, None] * math.pi + phase[:, None, None])  # (N, H, W)
    img = img[:, None].expand(n, in_chans, h, w) + noise * torch.randn(n, in_chans, h, w, generator=g)
    images = ((img.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    classes = [f"class_{i}" for i in range(num_classes)]
    return ArrayDataset(images, labels, classes, name=name)
