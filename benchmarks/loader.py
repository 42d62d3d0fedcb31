"""Throughput of the data path alone (no model): images per second, median of a few passes.

Cases:
- Fashion-MNIST in memory with the demo recipe's transforms (pad-crop, flip, [-1, 1]) on
  batches of 256;
- a folder of generated 256x256 JPEGs, decoded by Pillow in worker processes, then inception
  crop to 224, flip and [-1, 1] on the batch; and the same without the transforms (decoding only).

Usage: python benchmarks/loader.py [--json benchmarks/out/loader.json] [--passes 3] [--workers 2]
[--threads N]. On a machine shared with other work, ``--threads 1`` avoids the intra-op threads
spinning against each other, which can make small tensor ops a hundred times slower.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitkit.data import (
    DataError,
    Dataset,
    ImageFolder,
    TransformConfig,
    load_idx_dataset,
    step_generator,
    train_transform,
)


def make_jpeg_folder(root: Path, n: int, size: int = 256, classes: int = 10, seed: int = 0) -> None:
    """``n`` photo-like JPEGs (smooth colour fields plus grain), ``classes`` sub-folders."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for i in range(n):
        folder = root / f"class_{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        phase = rng.uniform(0, 2 * np.pi, 3)
        freq = rng.uniform(1, 6, 3)
        channels = [np.sin(2 * np.pi * f * (xx + yy * (c + 1) / 3) + p) for c, (f, p) in enumerate(zip(freq, phase))]
        img = (np.stack(channels, -1) + 1) * 110 + rng.normal(0, 12, (size, size, 3))
        Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(folder / f"{i:05d}.jpg", quality=90)


def time_passes(
    data: Dataset, batch_size: int, passes: int, workers: int, transform: Callable | None
) -> tuple[list[float], int]:
    """Seconds per pass over one epoch, and the images in one."""
    times, count = [], 0
    for p in range(passes):
        count = 0
        start = time.perf_counter()
        batches = data.batches(batch_size, shuffle=True, seed=0, epoch=p, num_workers=workers)
        for step, (x, _) in enumerate(batches):
            if transform is not None:
                x = transform(x, step_generator(0, step))
            count += x.shape[0]
        times.append(time.perf_counter() - start)
    return times, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="benchmarks/out/loader.json", help="where to write the results")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per case (median reported)")
    parser.add_argument("--workers", type=int, default=2, help="decoding processes for the JPEG folder")
    parser.add_argument("--jpegs", type=int, default=384, help="images in the generated JPEG folder")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for the transforms (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    results = []

    def record(case: str, data: Dataset, batch_size: int, workers: int, transform: Callable | None) -> None:
        times, images = time_passes(data, batch_size, args.passes, workers, transform)
        median = statistics.median(times)
        results.append(
            {
                "case": case,
                "images": images,
                "batch_size": batch_size,
                "workers": workers,
                "passes_s": [round(t, 4) for t in times],
                "median_s": round(median, 4),
                "images_per_s": round(images / median, 1),
            }
        )

    try:
        fmnist = load_idx_dataset("fashion-mnist", "train", allow_download=False)
    except DataError as e:
        results.append({"case": "fashion-mnist", "skipped": str(e)})
    else:
        cfg = TransformConfig(img_size=(28, 28), crop="pad", pad=2, flip=True, mean=(0.5,), std=(0.5,))
        record("fashion-mnist, memory, pad-crop+flip+norm", fmnist, 256, 0, lambda x, g: train_transform(x, cfg, g))

    with tempfile.TemporaryDirectory(prefix="vitkit-bench-") as tmp:
        make_jpeg_folder(Path(tmp), args.jpegs)
        folder = ImageFolder(tmp, "train", val_fraction=0.0, load_size=256)
        cfg = TransformConfig(img_size=(224, 224), crop="inception")
        record(f"jpeg folder 256px, {args.workers} workers, decode only", folder, 64, args.workers, None)
        record(
            f"jpeg folder 256px, {args.workers} workers, +inception 224",
            folder,
            64,
            args.workers,
            lambda x, g: train_transform(x, cfg, g),
        )
        skipped = folder.skips.skipped

    header = f"{'case':<52} {'images':>7} {'median s':>9} {'images/s':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        if "skipped" in r:
            print(f"{r['case']:<52} skipped: {r['skipped']}")
        else:
            print(f"{r['case']:<52} {r['images']:>7} {r['median_s']:>9.3f} {r['images_per_s']:>10.1f}")

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "passes": args.passes,
        "undecodable_images": skipped,
    }
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
