"""The augmentations of data-scarce training (AugReg, DeiT): RandAugment against Pillow on real
photographs, Mixup and CutMix targets, random erasing, repeated augmentation, and a run with all
of them that resumes bit-exactly."""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image, ImageEnhance, ImageOps

from _recipes import changed, stopped_and_resumed
from vitkit.data import ArrayDataset, BatchPlan, EraseConfig, MixConfig, RandAugmentConfig, ShardDataset, mix_batch
from vitkit.data.mix import smoothed_one_hot
from vitkit.data.randaugment import GEOMETRIC, OPS, apply_op, op_argument, rand_augment
from vitkit.data.transforms import TransformConfig, random_erase, step_generator, train_transform
from vitkit.train import RecipeError, load_recipe, parse_set, train
from vitkit.train.config import AugmentSection, Recipe
from vitkit.train.loop import loss_fn
from vitkit.train.state import list_checkpoints, load_train_state

skdata = pytest.importorskip("skimage.data")

# -- RandAugment against Pillow ------------------------------------------------------------------

FILL = 128


def _photos() -> list[Image.Image]:
    """scikit-image's photographs, downsized (bilinear) to keep the test fast; one grey."""
    return [
        Image.fromarray(skdata.astronaut()).resize((64, 64), Image.Resampling.BILINEAR),
        Image.fromarray(skdata.chelsea()).resize((72, 48), Image.Resampling.BILINEAR),
        Image.fromarray(skdata.coffee()).resize((60, 40), Image.Resampling.BILINEAR),
        Image.fromarray(skdata.camera()).resize((50, 50), Image.Resampling.BILINEAR),
    ]


PHOTOS = _photos()


def _pillow(op: str, im: Image.Image, arg: float) -> Image.Image:
    """The op as timm applies it to a Pillow image (bilinear resampling, mean-colour fill)."""
    kw = {"resample": Image.Resampling.BILINEAR, "fillcolor": (FILL,) * 3 if im.mode == "RGB" else FILL}
    w, h = im.size
    affine = {
        "shear_x": (1, arg, 0, 0, 1, 0),
        "shear_y": (1, 0, 0, arg, 1, 0),
        "translate_x": (1, 0, arg * w, 0, 1, 0),
        "translate_y": (1, 0, 0, 0, 1, arg * h),
    }
    if op in affine:
        return im.transform(im.size, Image.Transform.AFFINE, affine[op], **kw)
    enhance = {
        "color": ImageEnhance.Color,
        "contrast": ImageEnhance.Contrast,
        "brightness": ImageEnhance.Brightness,
        "sharpness": ImageEnhance.Sharpness,
    }
    if op in enhance:
        return enhance[op](im).enhance(arg)
    return {
        "auto_contrast": lambda: ImageOps.autocontrast(im),
        "equalize": lambda: ImageOps.equalize(im),
        "posterize": lambda: ImageOps.posterize(im, int(arg)),
        "solarize": lambda: ImageOps.solarize(im, int(arg)),
        "invert": lambda: ImageOps.invert(im),
        "solarize_add": lambda: im.point(
            [min(255, i + int(arg)) if i < 128 else i for i in range(256)] * len(im.getbands())
        ),
        "rotate": lambda: im.rotate(arg, **kw),
    }[op]()


def _tensor(im: Image.Image) -> torch.Tensor:
    a = torch.from_numpy(np.array(im)).float()
    return a[None, None] if a.ndim == 2 else a.permute(2, 0, 1)[None]  # (1, C, H, W)


# Arguments at magnitudes 0 (or the smallest Pillow takes), 2.5, 5, 9 and 10, both signs for the signed ops.
ARGS = {
    "auto_contrast": [0],
    "equalize": [0],
    "posterize": [1, 2, 3, 4],  # Pillow refuses 0 bits; see test_posterize_to_no_bits_is_black
    "solarize": [0, 64, 128, 230, 256],
    "invert": [0],
    "solarize_add": [0, 27, 55, 99, 110],
    **{op: [0.1, 0.55, 1.0, 1.72, 1.9] for op in ("color", "contrast", "brightness", "sharpness")},
    "rotate": [-30, -7.5, 15, 27],
    **{op: [-0.3, -0.075, 0.15, 0.27] for op in ("shear_x", "shear_y")},
    **{op: [-0.45, -0.1125, 0.225, 0.405] for op in ("translate_x", "translate_y")},
}
EXACT = (
    "equalize",
    "posterize",
    "solarize",
    "invert",
    "solarize_add",
)  # integer in, integer out: no rounding to differ


@pytest.mark.parametrize("op", OPS)
def test_each_op_matches_pillow_on_photographs(op: str) -> None:
    """The uint8 result (ours rounded) within one level of Pillow's on at least 99.9% of the pixels
    of every photograph and argument (100% when this was written), and exactly for the integer ops.
    Where they differ by one level it is rounding: Pillow truncates blends and resampling to
    integers, we keep floats; the geometric ops follow Pillow's rule at the borders exactly
    (fill where the source point is outside the image, edge pixels repeated inside)."""
    for im in PHOTOS:
        x = _tensor(im)
        fill = torch.full((x.shape[1],), float(FILL))
        for arg in ARGS[op]:
            ref = torch.from_numpy(np.array(_pillow(op, im, arg)).astype(np.int64))
            ours = apply_op(x, op, arg, fill)[0].round().clamp(0, 255).long()
            ours = ours[0] if ours.shape[0] == 1 else ours.permute(1, 2, 0)
            diff = (ours - ref).abs()
            assert (diff <= 1).float().mean() >= 0.999, (op, im.mode, im.size, arg)
            if op in EXACT:
                assert diff.max() == 0, (op, im.size, arg)


def test_posterize_to_no_bits_is_black_and_colour_is_identity_on_grey() -> None:
    x = _tensor(PHOTOS[0])
    assert apply_op(x, "posterize", 0, torch.zeros(3)).max() == 0  # timm's m < 2.5
    grey = _tensor(PHOTOS[3])
    assert torch.equal(apply_op(grey, "color", 1.9, torch.zeros(1)), grey)


def test_magnitude_zero_is_identity_for_geometric_ops() -> None:
    x = torch.cat([_tensor(PHOTOS[0]), _tensor(PHOTOS[0]).flip(-1)])
    cfg = RandAugmentConfig(num_ops=3, magnitude=0, prob=1.0, ops=GEOMETRIC)
    assert torch.equal(rand_augment(x, cfg, step_generator(0, 0), torch.full((3,), 128.0)), x)
    for op in GEOMETRIC:
        assert op_argument(op, 0.0, -1.0) == 0
        assert torch.equal(apply_op(x, op, 0.0, torch.zeros(3)), x)


def test_rand_augment_applies_the_op_and_argument_it_drew() -> None:
    """With one op, always applied, at a fixed magnitude, every image is what apply_op gives for
    that op at +-argument: the batched path (one resampling for all geometric ops) is the op."""
    x = torch.cat([_tensor(PHOTOS[0])] * 6)
    fill = torch.full((3,), 128.0)
    for op in OPS:
        out = rand_augment(
            x, RandAugmentConfig(num_ops=1, magnitude=7, prob=1.0, ops=(op,)), step_generator(2, 0), fill
        )
        candidates = [apply_op(x[:1], op, op_argument(op, 7.0, s), fill)[0] for s in (1.0, -1.0)]
        assert all(any(torch.allclose(img, c, atol=1e-3) for c in candidates) for img in out), op


def test_magnitude_to_argument_is_timms() -> None:
    m, plus, minus = 9.0, 1.0, -1.0

    def arg(op, sign=plus, inc=False):
        return op_argument(op, m, sign, inc)

    assert arg("rotate") == pytest.approx(27) and arg("rotate", minus) == pytest.approx(-27)
    assert arg("shear_x") == pytest.approx(0.27) and arg("translate_y", minus) == pytest.approx(-0.405)
    assert arg("posterize") == 3 and arg("posterize", inc=True) == 1
    assert arg("solarize") == 230 and arg("solarize", inc=True) == 26
    assert arg("solarize_add") == 99 and arg("solarize_add", inc=True) == 99 and arg("invert") == 0
    assert arg("contrast") == pytest.approx(1.72)
    assert arg("contrast", plus, True) == pytest.approx(1.81) and arg("color", minus, True) == pytest.approx(0.19)


def test_parse_reads_timms_spelling() -> None:
    assert RandAugmentConfig.parse("rand-m9-n2-mstd0.5") == RandAugmentConfig(2, 9.0, 0.5, 0.5, False)
    c = RandAugmentConfig.parse("rand-m9-mstd0.5-inc1")  # DeiT's: two ops by default
    assert (c.num_ops, c.increasing) == (2, True)
    assert math.isinf(RandAugmentConfig.parse("rand-m7-mstd101").magnitude_std)  # above 100: uniform
    assert RandAugmentConfig.parse("rand-n1-m3-p1").prob == 1.0
    for bad, why in [
        ("rand-m11", r"magnitude must be in \[0, 10\]"),
        ("augmix-m3", "does not start"),
        ("rand-q3", "q3"),
    ]:
        with pytest.raises(ValueError, match=why):
            RandAugmentConfig.parse(bad)


def test_magnitude_noise_is_normal_around_the_magnitude() -> None:
    """Brightness alone on a flat grey of 100: each output is 100 * (m / 10 * 1.8 + 0.1), so the
    magnitude each image drew reads back."""
    x = torch.full((4000, 1, 2, 2), 100.0)
    for std in (0.0, 0.5):
        cfg = RandAugmentConfig(num_ops=1, magnitude=5, magnitude_std=std, prob=1.0, ops=("brightness",))
        out = rand_augment(x, cfg, step_generator(1, 0), torch.zeros(1))[:, 0, 0, 0]
        m = (out / 100 - 0.1) / 1.8 * 10
        assert m.mean().item() == pytest.approx(5, abs=0.03)
        assert m.std().item() == pytest.approx(std, abs=0.03)
    half = RandAugmentConfig(num_ops=1, magnitude=7, prob=0.5, ops=("brightness",))  # at 5 the factor is 1
    changed_share = (rand_augment(x, half, step_generator(1, 0), torch.zeros(1)) != x).flatten(1).any(1)
    assert changed_share.float().mean().item() == pytest.approx(0.5, abs=0.04)  # timm applies each op half the time


def test_rand_augment_is_per_image_and_a_function_of_the_generator() -> None:
    x = _tensor(PHOTOS[1]).expand(32, -1, -1, -1).contiguous()
    cfg = RandAugmentConfig.parse("rand-m9-n2-mstd0.5")
    fill = torch.full((3,), 128.0)
    a = rand_augment(x, cfg, step_generator(5, 7), fill)
    assert torch.equal(a, rand_augment(x, cfg, step_generator(5, 7), fill))
    assert not torch.equal(a, rand_augment(x, cfg, step_generator(5, 8), fill))
    distinct = {tuple(img.flatten()[:50].tolist()) for img in a}
    assert len(distinct) > 10  # the same image, augmented differently in the batch
    assert a.min() >= 0 and a.max() <= 255


def test_train_transform_with_randaugment_and_erasing_on_grey_images() -> None:
    x = torch.randint(0, 256, (8, 1, 16, 16), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    cfg = TransformConfig(
        img_size=(16, 16), crop="none", flip=False, mean=(0.5,), std=(0.5,),
        randaugment=RandAugmentConfig.parse("rand-m9-n3"),
        erase=EraseConfig(prob=1.0, mode="const"),
    )  # fmt: skip
    out = train_transform(x, cfg, step_generator(0, 0))
    assert out.shape == (8, 1, 16, 16) and torch.isfinite(out).all()
    assert (out == 0).flatten(1).any(1).all()  # every image has an erased (zero) box
    assert torch.equal(out, train_transform(x, cfg, step_generator(0, 0)))


# -- Mixup and CutMix ----------------------------------------------------------------------------


def _labelled(b: int = 16, k: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose pixels are all their own index, and labels."""
    x = torch.arange(b, dtype=torch.float32).view(b, 1, 1, 1).expand(b, 3, 20, 24).contiguous()
    return x, torch.arange(b) % k


def test_mixup_of_one_hot_targets_sums_to_one_and_matches_lambda() -> None:
    x, y = _labelled()
    for mode in ("batch", "elem", "pair"):
        out = mix_batch(x, y, 10, MixConfig(mixup_alpha=0.8, mode=mode), step_generator(0, 1))
        lam = out.lam
        assert out.targets.sum(1).allclose(torch.ones(16))
        assert not (y == y.flip(0)).any()  # every image has a mirror of another class
        assert torch.allclose(out.targets[torch.arange(16), y], lam)
        assert torch.allclose(out.targets[torch.arange(16), y.flip(0)], 1 - lam)
        assert torch.allclose(out.images, lam.view(-1, 1, 1, 1) * x + (1 - lam.view(-1, 1, 1, 1)) * x.flip(0))
        if mode == "batch":
            assert (lam == lam[0]).all() and 0 < lam[0] < 1
        else:
            assert len(set(lam.tolist())) > 1
        if mode == "pair":
            assert torch.equal(lam, lam.flip(0))


def test_label_smoothing_is_folded_into_the_targets() -> None:
    x, y = _labelled()
    out = mix_batch(x, y, 10, MixConfig(mixup_alpha=1.0, label_smoothing=0.1), step_generator(0, 2))
    assert out.targets.sum(1).allclose(torch.ones(16))
    lam = out.lam[0].item()
    i = 0  # label 0, its mirror (image 15) label 5
    assert out.targets[i, 0].item() == pytest.approx(lam * 0.91 + (1 - lam) * 0.01)
    assert out.targets[i, 5].item() == pytest.approx(lam * 0.01 + (1 - lam) * 0.91)
    assert out.targets[i, 3].item() == pytest.approx(0.01)


def test_cutmix_pasted_area_matches_its_lambda() -> None:
    x, y = _labelled()
    for mode in ("batch", "elem", "pair"):
        for step in range(5):
            out = mix_batch(x, y, 10, MixConfig(cutmix_alpha=1.0, mode=mode), step_generator(3, step))
            own = (out.images == x).all(1).flatten(1).float().mean(1)  # share of each image left as it was
            pasted = (out.images == x.flip(0)).all(1).flatten(1).float().mean(1)
            assert torch.allclose(own, out.lam) and torch.allclose(pasted, 1 - out.lam)
            if mode != "batch":
                assert len(set(out.lam.tolist())) > 1
            assert out.targets.sum(1).allclose(torch.ones(16))


def test_switch_probability_and_mix_probability() -> None:
    x, y = _labelled()
    both = {"mixup_alpha": 1.0, "cutmix_alpha": 1.0}
    cut = mix_batch(x, y, 10, MixConfig(**both, switch_prob=1.0, mode="elem"), step_generator(0, 0))
    assert set(cut.images.unique().tolist()) <= set(range(16))  # pasted pixels only, never blended
    blend = mix_batch(x, y, 10, MixConfig(**both, switch_prob=0.0, mode="elem"), step_generator(0, 0))
    assert not set(blend.images.unique().tolist()) <= set(range(16))
    none = mix_batch(x, y, 10, MixConfig(**both, prob=0.0), step_generator(0, 0))
    assert torch.equal(none.images, x) and torch.equal(none.targets, smoothed_one_hot(y, 10))
    some = mix_batch(x.repeat(50, 1, 1, 1), torch.arange(800) % 10, 10, MixConfig(**both, prob=0.5, mode="elem"),
                     step_generator(0, 0))  # fmt: skip
    assert (some.lam < 1).float().mean().item() == pytest.approx(0.5, abs=0.06)
    with pytest.raises(ValueError, match="even batch"):
        mix_batch(x[:5], y[:5], 10, MixConfig(mixup_alpha=1.0, mode="pair"), step_generator(0, 0))


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_losses_take_soft_targets(kind: str) -> None:
    """One-hot targets with the smoothing folded in give the loss of the labels with smoothing,
    and a lam-mix of targets gives the lam-mix of the two losses (both are linear in the target)."""
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    for s in (0.0, 0.1):
        assert loss_fn(logits, smoothed_one_hot(y, 5, s), kind, 0.0).item() == pytest.approx(
            loss_fn(logits, y, kind, s).item(), rel=1e-5
        )
    mixed = 0.3 * smoothed_one_hot(y, 5) + 0.7 * smoothed_one_hot(y.flip(0), 5)
    expected = 0.3 * loss_fn(logits, y, kind, 0.0) + 0.7 * loss_fn(logits, y.flip(0), kind, 0.0)
    assert loss_fn(logits, mixed, kind, 0.3).item() == pytest.approx(expected.item(), rel=1e-5)


# -- random erasing ------------------------------------------------------------------------------


def test_erasing_area_and_aspect_within_range() -> None:
    x = torch.ones(400, 3, 64, 64)
    cfg = EraseConfig(prob=0.5, area=(0.1, 0.2), aspect=(0.5, 2.0), mode="const")
    out = random_erase(x, cfg, step_generator(0, 0))
    erased = out[:, 0] == 0  # (B, H, W)
    hit = erased.flatten(1).any(1)
    assert hit.float().mean().item() == pytest.approx(0.5, abs=0.08)
    assert torch.equal(out[~hit], x[~hit])
    for mask in erased[hit]:
        rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
        h, w = len(rows), len(cols)
        assert mask.sum() == h * w  # one rectangle
        # the sides are sqrt(area * aspect) and sqrt(area / aspect) rounded: within half a pixel
        assert (h - 0.5) * (w - 0.5) <= 0.2 * 64**2 and (h + 0.5) * (w + 0.5) >= 0.1 * 64**2
        assert (h - 0.5) / (w + 0.5) <= 2.0 and (h + 0.5) / (w - 0.5) >= 0.5
    pixel = random_erase(x, EraseConfig(prob=1.0, mode="pixel"), step_generator(0, 0))
    noise = pixel[pixel != 1]
    assert abs(noise.mean().item()) < 0.05 and noise.std().item() == pytest.approx(1, abs=0.05)
    rand = random_erase(x[:8], EraseConfig(prob=1.0, mode="rand"), step_generator(0, 0))
    colours = [img[:, img[0] != 1].unique(dim=1).shape[1] for img in rand]
    assert colours == [1] * 8  # one colour a box
    several = random_erase(x[:200], EraseConfig(prob=1.0, max_count=3, mode="const"), step_generator(1, 0))
    assert (several[:, 0] == 0).flatten(1).any(1).all()


# -- repeated augmentation -----------------------------------------------------------------------


def test_repeated_sampler_gives_each_index_k_times_and_resumes() -> None:
    n, k = 60, 3
    plan = BatchPlan(12, shuffle=True, seed=4, epoch=2, repeats=k)
    batches = list(plan.index_batches(n))
    seen = torch.cat(batches)
    assert len(seen) == n
    counts = torch.bincount(seen, minlength=n)
    assert set(counts.tolist()) == {0, k} and int((counts == k).sum()) == n // k
    for b in batches:  # batches of 12 hold 4 images, 3 copies each
        assert sorted(torch.bincount(b).tolist())[-4:] == [k] * 4
    assert torch.equal(seen[: n // k * k : k], BatchPlan(12, True, 4, 2).order(n)[: n // k])
    other = torch.cat(list(BatchPlan(12, shuffle=True, seed=4, epoch=3, repeats=k).index_batches(n)))
    assert not torch.equal(other, seen)  # another epoch, other images
    resumed = list(BatchPlan(12, shuffle=True, seed=4, epoch=2, start_batch=3, repeats=k).index_batches(n))
    assert all(torch.equal(a, b) for a, b in zip(resumed, batches[3:], strict=True))


def test_repeated_sampler_spreads_copies_across_ranks() -> None:
    n, k, world = 48, 3, 3
    per_rank = [
        list(BatchPlan(12, True, 1, 0, rank=r, world_size=world, repeats=k).index_batches(n)) for r in range(world)
    ]
    for step in range(len(per_rank[0])):
        shares = [per_rank[r][step] for r in range(world)]
        assert all(len(s) == 4 and len(set(s.tolist())) == 4 for s in shares)  # one copy on each rank
        assert all(torch.equal(shares[0], s) for s in shares)  # DeiT: the copies go to neighbouring ranks
    one = torch.cat(list(BatchPlan(12, True, 1, 0, repeats=k).index_batches(n)))
    assert torch.equal(torch.stack([torch.cat(p) for p in per_rank], 1).flatten(), one)


def test_repeats_reach_in_memory_data_and_shards(tmp_path: Path) -> None:
    images = torch.arange(30, dtype=torch.uint8).view(30, 1, 1, 1).expand(30, 3, 2, 2).contiguous()
    ds = ArrayDataset(images, torch.arange(30) % 3, ["a", "b", "c"])
    x, _ = next(ds.batches(6, shuffle=True, repeats=2))
    assert x[0::2].equal(x[1::2])
    tmp_path.mkdir(exist_ok=True)
    for s in range(2):
        with tarfile.open(tmp_path / f"train-{s:03d}.tar", "w") as tar:
            for i in range(6):
                png = io.BytesIO()
                Image.new("RGB", (4, 4), (60 * s + 10 * i, 0, 0)).save(png, "PNG")
                for name, data in ((f"{s}{i:03d}.png", png.getvalue()), (f"{s}{i:03d}.cls", b"1")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    shards = ShardDataset(str(tmp_path / "train-{000..001}.tar"), load_size=4, num_classes=2)
    batches = [x[:, 0, 0, 0].tolist() for x, _ in shards.batches(4, shuffle=True, seed=2, repeats=2)]
    assert len(batches) == 3 and all(b[0] == b[1] and b[2] == b[3] for b in batches)
    flat = [v for b in batches for v in b]
    assert len(set(flat)) == 6  # 12 samples an epoch, 6 images twice


# -- recipes and a training run ------------------------------------------------------------------

TINY = {
    "seed": 5,
    "model": {
        "name": "vit_ti16",
        "overrides": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64},
    },
    "data": {"name": "synthetic", "options": {"img_size": 16, "n": 96}},
    "augment": {
        "crop": "pad",
        "pad": 2,
        "randaugment": "rand-m9-n2-mstd0.5-inc1",
        "mixup_alpha": 0.8,
        "cutmix_alpha": 1.0,
        "mix_mode": "elem",
        "erase_prob": 0.25,
        "erase_count": 2,
        "repeats": 3,
    },
    "optim": {"name": "adamw", "lr": 3e-3, "warmup_steps": 2},
    "train": {"steps": 10, "batch_size": 24, "label_smoothing": 0.1},
    "log": {
        "log_every": 1,
        "eval_every": 0,
        "checkpoint_every": 4,
        "keep_last": 5,
        "plot": False,
        "tensorboard": False,
    },
}


def test_bad_settings_get_one_line_naming_the_key() -> None:
    cases = {
        "augment.randaugment=rand-m12-n2": r"augment.randaugment: 'rand-m12-n2': magnitude must be in \[0, 10\]",
        "augment.randaugment=rand-m9-z": "augment.randaugment: .*cannot read 'z'",
        "augment.mixup_alpha=-0.1": "augment.mixup_alpha must be in \\[0, 1000\\]",
        "augment.cutmix_alpha=-1": "augment.cutmix_alpha must be in \\[0, 1000\\]",
        "augment.mix_prob=1.2": r"augment.mix_prob must be in \[0, 1\]",
        "augment.mix_switch_prob=-0.5": r"augment.mix_switch_prob must be in \[0, 1\]",
        "augment.erase_prob=2": r"augment.erase_prob must be in \[0, 1\]",
        "augment.erase_area=[0.4,0.1]": "augment.erase_area must be .*low <= high",
        "augment.erase_mode=noise": "augment.erase_mode must be one of pixel, rand, const",
        "augment.repeats=0": "augment.repeats must be in \\[1, 64\\]",
    }
    for setting, message in cases.items():
        with pytest.raises(RecipeError, match=message) as info:
            load_recipe(None, parse_set([setting]))
        assert "\n" not in str(info.value)
    r = load_recipe(None, parse_set(["augment.randaugment=rand-m9-n2-mstd0.5", "augment.cutmix_alpha=1"]))
    assert r.augment.randaugment == "rand-m9-n2-mstd0.5" and r.augment.cutmix_alpha == 1.0


def test_cli_says_a_bad_setting_in_one_line(capsys, tmp_path: Path) -> None:
    from vitkit.cli import main

    recipe = _write(tmp_path, TINY)
    args = [
        "train",
        "--config",
        str(recipe),
        "--out",
        str(tmp_path / "run"),
        "--set",
        "augment.randaugment=rand-m10.5-n0",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vitkit train: error: augment.randaugment: 'rand-m10.5-n0': the number of ops must be at least 1, got 0"
    ]
    assert not (tmp_path / "run").exists()


def test_pair_mode_needs_even_micro_batches(tmp_path: Path) -> None:
    from vitkit.train.loop import Trainer

    tree = changed(TINY, augment__mix_mode="pair", train__batch_size=15, data__options__n=96)
    with pytest.raises(RecipeError, match="augment.mix_mode 'pair' needs an even batch"):
        Trainer(load_recipe(_write(tmp_path, tree)), tmp_path / "run")


def _write(tmp_path: Path, tree: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _final(run: Path) -> dict[str, torch.Tensor]:
    return load_train_state(list_checkpoints(run / "checkpoints")[-1]).model_state


@pytest.mark.slow
def test_training_with_every_augmentation_resumes_bit_exact(tmp_path: Path, monkeypatch) -> None:
    """RandAugment, Mixup/CutMix per image, erasing and 3 repeats, with dropout: stop at step 7
    (checkpoint at 6, mid-epoch: 4 batches an epoch), resume, compare with a run never stopped;
    then the same recipe built in Python (the library API) gives the same weights."""

    tree = changed(TINY, model__overrides__drop_rate=0.1, log__checkpoint_every=3)
    recipe = load_recipe(_write(tmp_path, tree))
    train(recipe, tmp_path / "a")

    resumed = stopped_and_resumed(recipe, tmp_path / "b", 7, monkeypatch, seed=999)
    assert resumed.resumed_from == 6
    a, b = _final(tmp_path / "a"), _final(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)

    plain = load_recipe(_write(tmp_path, changed(tree, augment={"crop": "pad", "pad": 2})))
    train(plain, tmp_path / "plain")
    assert not all(torch.equal(a[k], v) for k, v in _final(tmp_path / "plain").items())  # the augmentation acted

    built = Recipe(**{**recipe.__dict__, "augment": AugmentSection(**recipe.augment.__dict__)})
    train(built, tmp_path / "c")
    c = _final(tmp_path / "c")
    assert all(torch.equal(a[k], c[k]) for k in a)


# -- batches of drawn sizes (a NaFlex token budget) ---------------------------------------------------
@pytest.mark.parametrize("drop_last", [False, True])
def test_drawn_batch_sizes_cover_the_epoch_once_and_resume_and_split_alike(drop_last):
    from vitkit.data.plan import BatchPlan, batch_choice

    n, sizes = 103, (9, 4, 2)
    plan = BatchPlan(1, shuffle=True, seed=3, epoch=2, drop_last=drop_last, sizes=sizes)
    batches = list(plan.index_batches(n))
    # each batch has the size drawn for its index, from all three
    drawn = [sizes[batch_choice(3, 2, j, 3)] for j in range(len(batches))]
    assert [len(b) for b in batches[:-1]] == drawn[:-1] and len(set(drawn)) == 3
    seen = torch.cat(batches)
    assert len(set(seen.tolist())) == len(seen)  # no image twice
    assert len(seen) == n if not drop_last else n - len(seen) < max(sizes)
    # resuming at batch 5 gives the same batches from there; two ranks split each batch between them
    again = list(
        BatchPlan(1, shuffle=True, seed=3, epoch=2, start_batch=5, drop_last=drop_last, sizes=sizes).index_batches(n)
    )
    assert all(torch.equal(a, b) for a, b in zip(again, batches[5:], strict=True))
    ranks = [BatchPlan(1, True, 3, 2, 0, r, 2, drop_last, 1, sizes) for r in (0, 1)]
    for j, (a, b) in enumerate(zip(*(p.index_batches(n) for p in ranks))):
        assert sorted(torch.cat([a, b]).tolist()) == sorted(batches[j].tolist())
    assert [x + y for x, y in zip(*(p.local_sizes(n) for p in ranks))] == [len(b) for b in batches]
    # one size is the fixed batch: the same batches as batch_size
    one = list(BatchPlan(1, shuffle=True, seed=3, epoch=2, drop_last=drop_last, sizes=(8, 8)).index_batches(n))
    fixed = list(BatchPlan(8, shuffle=True, seed=3, epoch=2, drop_last=drop_last).index_batches(n))
    assert all(torch.equal(a, b) for a, b in zip(one, fixed, strict=True))
