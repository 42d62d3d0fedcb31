"""NaFlex against resizing to a square, on photographs cropped to many aspect ratios.

    python benchmarks/naflex_accuracy.py --json benchmarks/results/naflex_accuracy_zen3.json

The task: which of ten scikit-image photographs a crop comes from (four of them textures of
brick, grass, gravel and the moon's surface). Each crop has a random aspect ratio from 1:3 to 3:1
and a random size (a tenth to a third of the photograph's shorter side),
saved at its own shape (at most 96 px a side): 60 training and 20 validation crops a class. A
small ViT (width 64, 4 blocks, patch 4) is trained from scratch three ways, with the same steps,
seeds and budget of 64 patches an image:

- ``crop``: each image scaled so that its shorter side fits 32 px, the centre square kept;
- ``squash``: each image stretched whole to 32x32;
- ``naflex``: each image whole at its own aspect ratio, in at most 64 patches (an 8x8 grid for a
  square, 4x13 for 1:3...).

Every arm is trained and evaluated its own way, for ``--seeds`` seeds; the table gives the
validation top-1 of each (mean and each seed) and NaFlex's difference from each square arm, paired
by seed, with a 95% t interval.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
from pathlib import Path

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "camera", "brick", "grass", "gravel", "moon", "coins"]
ASPECTS = [1 / 3, 1 / 2, 2 / 3, 1.0, 3 / 2, 2.0, 3.0]  # width / height
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def make_crops(root: Path, per_class: tuple[int, int] = (60, 20), seed: int = 0) -> None:
    """Crops of each photograph at random aspect ratios and sizes, in root/{train,val}/<photo>/."""
    import numpy as np
    import skimage.data
    from PIL import Image

    rng = random.Random(seed)
    for name in PHOTOS:
        x = np.asarray(getattr(skimage.data, name)())
        img = Image.fromarray(np.stack([x] * 3, -1) if x.ndim == 2 else x[..., :3])
        w, h = img.size
        for split, n in zip(("train", "val"), per_class):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                aspect = rng.choice(ASPECTS)
                area = rng.uniform(min(w, h) / 10, min(w, h) / 3) ** 2
                cw = min(w, round(math.sqrt(area * aspect)))
                ch = min(h, round(math.sqrt(area / aspect)))
                left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
                crop = img.crop((left, top, left + cw, top + ch))
                crop.thumbnail((96, 96), Image.Resampling.BILINEAR)  # at most 96 px a side, aspect kept
                crop.save(folder / f"{i:03d}.png")


def recipe(data: Path, arm: str, seed: int, steps: int):
    from vitkit.train.config import recipe_from_dict

    options = {"load_size": 32, "resize": "plain" if arm == "squash" else "shorter"}
    tree = {
        "seed": seed,
        "model": {
            "name": "vit_ti16",
            "overrides": {
                "img_size": 32,
                "patch_size": 4,
                "width": 64,
                "depth": 4,
                "num_heads": 4,
                "mlp_dim": 128,
                "classifier": "gap",
                "pos_embed": "learned",
            },
        },
        "data": {"name": str(data), "options": options, "eval_split": "val"},
        "augment": {"crop": "inception", "area_min": 0.35, "flip": True},
        "optim": {"name": "adamw", "lr": 2e-3, "warmup_steps": 30, "weight_decay": 0.05},
        "train": {"steps": steps, "batch_size": 32, "precision": "fp32", "label_smoothing": 0.1},
        "log": {"log_every": 50, "eval_every": steps, "checkpoint_every": 0, "plot": False},
    }
    if arm == "naflex":
        tree["data"]["naflex"] = {"max_tokens": 64}
    return recipe_from_dict(tree)


def interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t interval of paired differences."""
    m = statistics.mean(diffs)
    if len(diffs) < 2:
        return m, float("nan"), float("nan")
    half = T95[len(diffs) - 1] * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return m, m - half, m + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--json", default="benchmarks/out/naflex_accuracy.json")
    args = ap.parse_args()

    import torch

    from vitkit.cpu import cpu_info
    from vitkit.train import train

    arms = ["crop", "squash", "naflex"]
    top1: dict[str, list[float]] = {a: [] for a in arms}
    seconds: dict[str, list[float]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "crops"
        make_crops(data)
        for seed in range(args.seeds):
            for arm in arms:
                result = train(recipe(data, arm, seed, args.steps), Path(tmp) / f"{arm}{seed}")
                top1[arm].append(result.best_top1 if result.final_top1 is None else result.final_top1)
                seconds[arm].append(result.train_seconds)
                print(f"seed {seed} {arm}: top-1 {100 * top1[arm][-1]:.2f}%, {result.train_seconds:.0f} s", flush=True)
    diffs = {
        other: interval([100 * (n - o) for n, o in zip(top1["naflex"], top1[other])]) for other in ("crop", "squash")
    }
    out = {
        "machine": cpu_info()["model"],
        "torch": torch.__version__,
        "photos": PHOTOS,
        "steps": args.steps,
        "seeds": args.seeds,
        "top1": top1,
        "train_seconds": seconds,
        "naflex_minus": {k: {"mean": m, "lo": lo, "hi": hi} for k, (m, lo, hi) in diffs.items()},
    }
    print("\n| arm | validation top-1, mean | each seed | training seconds, median |\n|---|---|---|---|")
    for arm in arms:
        each = ", ".join(f"{100 * v:.2f}" for v in top1[arm])
        print(f"| {arm} | {100 * statistics.mean(top1[arm]):.2f}% | {each} | {statistics.median(seconds[arm]):.0f} |")
    for other, (m, lo, hi) in diffs.items():
        print(f"NaFlex - {other}: {m:+.2f} points (95% interval {lo:+.2f} to {hi:+.2f})")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
