"""The batched transforms: crops keep content, flips flip, values land in [-1, 1], seeds repeat."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitkit.data.transforms import (
    TransformConfig,
    center_crop,
    eval_transform,
    hflip,
    inception_crop,
    normalize,
    random_crop,
    resize,
    step_generator,
    train_transform,
)


def _images(b: int = 4, c: int = 3, h: int = 12, w: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (b, c, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_random_crop_is_a_window_of_the_padded_image() -> None:
    x = _images()
    pad = 3
    out = random_crop(x, step_generator(0, 0), pad=pad)
    assert out.shape == x.shape and out.dtype == x.dtype
    padded = F.pad(x, (pad, pad, pad, pad))
    shifts = set()
    for img, src in zip(out, padded, strict=True):
        found = [
            (dy, dx)
            for dy in range(2 * pad + 1)
            for dx in range(2 * pad + 1)
            if torch.equal(src[:, dy : dy + x.shape[2], dx : dx + x.shape[3]], img)
        ]
        assert found, "the crop is not a window of the padded image"
        shifts.add(found[0])
    assert len(shifts) > 1  # each image gets its own offset
    assert torch.equal(random_crop(x, step_generator(0, 0), pad=0), x)


def test_hflip_probability_one_and_zero() -> None:
    x = _images()
    assert torch.equal(hflip(x, step_generator(1, 0), p=1.0), x.flip(-1))
    assert torch.equal(hflip(x, step_generator(1, 0), p=0.0), x)
    mixed = hflip(_images(b=64), step_generator(1, 0), p=0.5)
    flipped = (mixed == _images(b=64).flip(-1)).flatten(1).all(1)
    assert 0 < int(flipped.sum()) < 64


def test_inception_crop_size_and_full_box_is_a_resize() -> None:
    x = _images(h=16, w=16).float()
    out = inception_crop(x, (7, 9), step_generator(2, 0))
    assert out.shape == (4, 3, 7, 9)
    assert out.min() >= 0 and out.max() <= 255  # bilinear stays within the input's range
    full = inception_crop(x, (24, 24), step_generator(2, 0), area=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.allclose(full, resize(x, (24, 24)), atol=1e-3)
    same = inception_crop(x, (16, 16), step_generator(2, 0), area=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.allclose(same, x, atol=1e-3)


def test_normalize_maps_uint8_to_minus_one_one() -> None:
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 1, 1, 3).expand(2, 3, 1, 3)
    out = normalize(x, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert out.dtype == torch.float32
    assert torch.allclose(out[0, 0, 0], torch.tensor([-1.0, -0.6, 1.0]))
    with pytest.raises(ValueError, match="1 normalisation mean values for images with 3 channels"):
        normalize(x, (0.5,), (0.5,))
    with pytest.raises(ValueError, match="2 normalisation std values for images with 3 channels"):
        normalize(x, (0.5, 0.5, 0.5), (0.5, 0.5))


def test_train_transform_depends_only_on_seed_and_step() -> None:
    x = _images(b=6, h=28, w=28)
    for cfg in (
        TransformConfig(img_size=(16, 16)),
        TransformConfig(img_size=(28, 28), crop="pad", pad=2, mean=(0.5,) * 3, std=(0.5,) * 3),
    ):
        a = train_transform(x, cfg, step_generator(7, 3))
        b = train_transform(x, cfg, step_generator(7, 3))
        c = train_transform(x, cfg, step_generator(7, 4))
        assert a.shape == (6, 3, *cfg.img_size) and torch.equal(a, b) and not torch.equal(a, c)
        assert a.min() >= -1.0 - 1e-6 and a.max() <= 1.0 + 1e-6


def test_eval_transform_and_config() -> None:
    cfg = TransformConfig(img_size=8, eval_crop=0.5)
    assert cfg.img_size == (8, 8)
    x = _images(h=16, w=16)
    out = eval_transform(x, cfg)
    assert out.shape == (4, 3, 8, 8)
    expected = normalize(center_crop(x.float(), 0.5), cfg.mean, cfg.std)  # 8x8 centre, no resize needed
    assert torch.allclose(out, expected)
    with pytest.raises(ValueError, match="crop must be"):
        TransformConfig(crop="random")
