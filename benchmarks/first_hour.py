"""A user's first result on a CPU: the README's quick start, timed, on a folder of photographs.

It makes ``FOLDER/train/<class>/*.jpg`` and ``FOLDER/val/<class>/*.jpg`` from scikit-image's
photographs (four classes, one photograph each: random crops of 20-70% of its shorter side, at
odd sizes and aspect ratios, some mirrored; train and val from different crops), then runs the
quick start's commands as a user types them, each timed as a whole process (start-up, weight
loading, decoding, the forward passes):

    vitkit embed WEIGHTS FOLDER/train --out train.safetensors
    vitkit embed WEIGHTS FOLDER/val --out val.safetensors
    vitkit probe --train-embeddings train.safetensors --test-embeddings val.safetensors --json probe.json

and, with ``--finetune``, the README's fine-tune of the same folder (``vitkit finetune --from
WEIGHTS --data FOLDER --img-size 112``), whose run folder then predicts. It prints one JSON
object: the seconds of each command, their total, and the linear probe's and k-NN's validation
accuracy (and the fine-tune's, as its run records it). Classes here are photographs, so crops of
one class share its colours: an easier task than most folders; use ``--folder`` to time your own.

    python benchmarks/first_hour.py                                # ViT-S/16 (ImageNet-21k), 40+15 a class
    python benchmarks/first_hour.py --finetune --json benchmarks/out/first_hour.json
    python benchmarks/first_hour.py --weights vit_s16.safetensors  # a file instead of a name: offline

The weights are downloaded once into vitkit's cache (``vitkit models --pretrained`` lists names).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHOTOS = ("chelsea", "coffee", "astronaut", "rocket")  # scikit-image's: a cat, a cup, a portrait, a launch


def make_folder(root: Path, train_per_class: int, val_per_class: int, seed: int = 0) -> None:
    """``root/train/<photo>/`` and ``root/val/<photo>/``: JPEG crops of scikit-image's photographs.

    Args:
        root: the folder to fill (created).
        train_per_class: crops a class in ``train``.
        val_per_class: crops a class in ``val``.
        seed: the crops' random seed.
    """
    import numpy as np
    import skimage.data
    from PIL import Image, ImageOps

    rng = np.random.default_rng(seed)
    for name in PHOTOS:
        x = np.asarray(getattr(skimage.data, name)())
        img = Image.fromarray(np.stack([x] * 3, -1) if x.ndim == 2 else x[..., :3])
        for split, count in (("train", train_per_class), ("val", val_per_class)):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                side = int(min(img.size) * rng.uniform(0.2, 0.7))
                w, h = side, int(side * rng.uniform(0.6, 1.5))
                w, h = min(w, img.size[0]), min(h, img.size[1])
                left, top = int(rng.integers(0, img.size[0] - w + 1)), int(rng.integers(0, img.size[1] - h + 1))
                crop = img.crop((left, top, left + w, top + h))
                crop = crop.resize((int(w * rng.uniform(0.5, 1.2)) or 1, int(h * rng.uniform(0.5, 1.2)) or 1))
                (ImageOps.mirror(crop) if rng.random() < 0.5 else crop).save(root / split / name / f"{i:03d}.jpg")


def timed(args: list[str], cwd: Path) -> float:
    """Run ``vitkit ARGS`` in ``cwd``; its wall seconds. A failure ends the benchmark with its output.

    Args:
        args: the command's arguments after ``vitkit``.
        cwd: where it runs.

    Returns:
        Seconds.
    """
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "vitkit", *args], cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"vitkit {' '.join(args)} failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return seconds


PROBE_ARGS = ["--train-embeddings", "train.safetensors", "--test-embeddings", "val.safetensors", "--json", "probe.json"]


def run_probe(weights: str, folder: Path, work: Path) -> dict[str, object]:
    """The quick start's embed + probe, timed; the probe's accuracies."""
    seconds = {
        "embed_train": timed(["embed", weights, str(folder / "train"), "--out", "train.safetensors"], work),
        "embed_val": timed(["embed", weights, str(folder / "val"), "--out", "val.safetensors"], work),
        "probe": timed(["probe", *PROBE_ARGS], work),
    }
    result = json.loads((work / "probe.json").read_text())
    top1 = {"linear_probe": result["linear_probe"]["top1"], "knn": result["knn"]["top1"]}
    return {"seconds": seconds, "total_s": sum(seconds.values()), "val_top1": top1, "probe": result}


def run_finetune(weights: str, folder: Path, work: Path) -> dict[str, object]:
    """The README's fine-tune of the folder, timed; what its run records of validation."""
    run = work / "runs" / "mine"
    seconds = timed(
        ["finetune", "--from", weights, "--data", str(folder), "--img-size", "112", "--out", str(run)], work
    )
    path = run / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    kept = ("best_score", "score", "best_epoch", "best_step", "steps", "train_seconds")
    return {"total_s": seconds, **{k: summary.get(k) for k in kept}}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--weights", default="vit_s16.augreg_in21k", help="a pretrained name or a weights file")
    p.add_argument("--train-per-class", type=int, default=40)
    p.add_argument("--val-per-class", type=int, default=15)
    p.add_argument("--folder", type=Path, default=None, help="your own FOLDER/train and FOLDER/val instead")
    p.add_argument("--finetune", action="store_true", help="also time the fine-tune (minutes)")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args()
    weights = str(Path(args.weights).resolve()) if Path(args.weights).exists() else args.weights
    with tempfile.TemporaryDirectory(prefix="first_hour_") as tmp:
        work = Path(tmp)
        folder = args.folder.resolve() if args.folder else work / "my_photos"
        if args.folder is None:
            make_folder(folder, args.train_per_class, args.val_per_class)
        images = {s: sum(1 for _ in (folder / s).rglob("*.jpg")) for s in ("train", "val")}
        out: dict[str, object] = {
            "weights": args.weights,
            "images": images,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "embed_probe": run_probe(weights, folder, work),
        }
        if args.finetune:
            out["finetune"] = run_finetune(weights, folder, work)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
