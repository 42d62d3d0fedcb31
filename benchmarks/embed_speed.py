"""`vitkit embed` against timm on the same folder of images, as whole commands.

A user who wants DINOv2 features of a folder runs either ``vitkit embed MODEL FOLDER --out F`` or
a short timm script: create the model, its own transforms (``resolve_data_config`` +
``create_transform``), a DataLoader with decoding workers, the pre-logits of every image, saved to a
safetensors file. Both are timed here as whole processes (start-up, weight loading, decoding and the
forward passes), interleaved over rounds (A B C A B C ...) so that load on a shared machine hits
them alike; the ratio to timm's default is what to read. The weights are a random initialisation
of timm's ``vit_base_patch14_dinov2.lvd142m`` written as a timm file (model.safetensors and its
config.json with the pretrained config), so both read the same file and the same preprocessing:
518 px, bicubic, the whole image. No download.

Rows:
- vitkit: ``vitkit embed`` as shipped (precision ``auto``: bf16 where the CPU has it natively);
- timm: the timm script in fp32, timm's default;
- timm-bf16: the same script under ``torch.autocast("cpu", torch.bfloat16)``, timm's best mode
  on a CPU with bf16 (left out where the CPU has none).

    python benchmarks/embed_speed.py                           # 32 images, 2 rounds
    python benchmarks/embed_speed.py --images 64 --rounds 3 --json benchmarks/out/embed_speed.json

timm must be importable (``PYTHONPATH=.peers`` after ``make test-peers`` installed it there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "vit_base_patch14_dinov2.lvd142m"


def make_images(folder: Path, count: int) -> None:
    """``count`` JPEG crops of scikit-image's photographs, each of its own size (300-500 px a side).

    Args:
        folder: where to write them (created).
        count: how many.
    """
    import numpy as np
    import skimage.data
    from PIL import Image

    rng = random.Random(0)
    names = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry"]
    photos = [Image.fromarray(np.asarray(getattr(skimage.data, n)())[..., :3]) for n in names]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        img = photos[i % len(photos)]
        w, h = img.size
        side = rng.randint(min(w, h) // 2, min(w, h))
        x, y = rng.randint(0, w - side), rng.randint(0, h - side)
        size = (rng.randint(300, 500), rng.randint(300, 500))
        img.crop((x, y, x + side, y + side)).resize(size, Image.BICUBIC).save(folder / f"{i:05d}.jpg", quality=90)


def make_weights(folder: Path) -> None:
    """A timm file of a randomly initialised :data:`MODEL`: ``model.safetensors`` and ``config.json``.

    Args:
        folder: where to write them (created).
    """
    import timm
    from safetensors.torch import save_file

    model = timm.create_model(MODEL, pretrained=False)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    plain = (int, float, str, list, tuple, type(None))
    cfg = {k: v for k, v in model.pretrained_cfg.items() if isinstance(v, plain)}
    arch = MODEL.split(".")[0]
    (folder / "config.json").write_text(json.dumps({"architecture": arch, "num_classes": 0, "pretrained_cfg": cfg}))


def timm_job(weights: Path, images: Path, out: Path, bf16: bool, batch_size: int, workers: int) -> None:
    """What a timm user writes: the model from the file, its own transforms, pre-logits saved.

    Args:
        weights: the folder of :func:`make_weights`.
        images: the image folder.
        out: the safetensors file to write.
        bf16: run under bf16 autocast.
        batch_size: images a batch.
        workers: DataLoader processes that decode.
    """
    import contextlib

    import timm
    import torch
    from PIL import Image
    from safetensors.torch import load_file, save_file
    from timm.data import create_transform, resolve_data_config

    model = timm.create_model(MODEL, pretrained=False, num_classes=0)
    model.load_state_dict(load_file(str(weights / "model.safetensors")), strict=False)
    model.eval()
    transform = create_transform(**resolve_data_config({}, model=model))
    paths = sorted(p for p in images.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))

    class Files(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> torch.Tensor:
            return transform(Image.open(paths[i]).convert("RGB"))

    loader = torch.utils.data.DataLoader(Files(), batch_size=batch_size, num_workers=workers)
    cast = torch.autocast("cpu", torch.bfloat16) if bf16 else contextlib.nullcontext()
    vectors = []
    with torch.inference_mode(), cast:
        for x in loader:
            vectors.append(model(x).float())
    save_file({"embeddings": torch.cat(vectors)}, str(out))


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def _clear_outputs(work: Path) -> None:
    import shutil

    for p in work.glob("*.safetensors*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _commands(work: Path, args: argparse.Namespace, bf16: bool) -> dict[str, list[str]]:
    me = [sys.executable, str(Path(__file__).resolve())]
    timm = [*me, "--timm-job", str(work / "weights"), str(work / "images"), "--batch-size", str(args.batch_size)]
    timm += ["--workers", str(args.workers)]
    vitkit_bin = str(Path(sys.executable).with_name("vitkit"))
    out = str(work / "v.safetensors")
    rows = {
        "vitkit": [vitkit_bin, "embed", str(work / "weights"), str(work / "images"), "--out", out],
        "timm": [*timm, "--out", str(work / "t.safetensors")],
    }
    rows["vitkit"] += ["--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    if bf16:
        rows["timm-bf16"] = [*timm, "--out", str(work / "tb.safetensors"), "--bf16"]
    return rows


def main() -> None:
    """Prepare the images and weights, time each row's command over the rounds, print and write."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="benchmarks/out/embed_speed.json")
    ap.add_argument("--timm-job", nargs=2, metavar=("WEIGHTS", "IMAGES"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.timm_job:
        weights, images = (Path(p) for p in args.timm_job)
        timm_job(weights, images, Path(args.out), args.bf16, args.batch_size, args.workers)
        return

    from vitkit.cpu import cpu_info
    from vitkit.precision import resolve_precision

    info = cpu_info()
    bf16 = resolve_precision("auto", "cpu").name == "bf16"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_images(work / "images", args.images)
        make_weights(work / "weights")
        env = dict(os.environ)
        rows = _commands(work, args, bf16)
        seconds: dict[str, list[float]] = {name: [] for name in rows}
        for r in range(args.rounds):
            for name, cmd in rows.items():
                _clear_outputs(work)  # a finished file would be reused by vitkit's resume, not recomputed
                seconds[name].append(_timed(cmd, env))
                print(f"round {r + 1}: {name:10s} {seconds[name][-1]:7.1f} s", flush=True)
    base = statistics.median(seconds["timm"])
    print(f"\n{args.images} images, {MODEL} (518 px), batch {args.batch_size}, {args.workers} workers")
    print(f"CPU: {info['model']} ({info['cores']} cores), torch {_torch_version()}")
    print(f"{'row':12s} {'median s':>9s} {'img/s':>7s} {'timm / row':>11s}")
    table = {}
    for name, s in seconds.items():
        med = statistics.median(s)
        table[name] = {"seconds": s, "median_s": med, "img_per_s": args.images / med, "speedup_vs_timm": base / med}
        print(f"{name:12s} {med:9.1f} {args.images / med:7.2f} {base / med:10.2f}x")
    record = {"model": MODEL, "images": args.images, "rounds": args.rounds, "batch_size": args.batch_size}
    record |= {"workers": args.workers, "cpu": info, "python": platform.python_version(), "rows": table}
    record["torch"] = _torch_version()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1))
    print(f"wrote {args.json}")


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
