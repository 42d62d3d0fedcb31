"""`vitkit view` on a folder of Fashion-MNIST images: how large the page is, how long the command
takes, and how long headless Chromium takes to open it (until every panel is drawn).

The folder holds the first N images of Fashion-MNIST's test split (Debian's dataset-fashion-mnist,
read with vitkit's IDX reader) as PNG files in one folder per class; the model is the demo's
architecture (``configs/fmnist_vit.yaml``: width 128, 6 layers, 4 heads, 4x4 patches, GAP) with
random weights, which changes neither the page's size nor its time. The page shows 8 images one
by one and all N in the scatter (PCA).

    python benchmarks/view_page.py                    # 10,000 images
    python benchmarks/view_page.py --images 500       # a quick look

Needs Chromium (``apt-get install chromium``) and websocket-client for the browser time; without
them it reports the size and the command's time only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the DevTools driver of the browser tests
READY = "document.body && document.body.dataset.ready === '1'"


def write_folder(folder: Path, count: int) -> None:
    """The first ``count`` Fashion-MNIST test images as FOLDER/<class>/<index>.png."""
    from PIL import Image

    from vitkit.data.idx import load_idx_dataset

    test = load_idx_dataset("fashion-mnist", "test", allow_download=False)
    for i in range(min(count, len(test))):
        path = folder / test.classes[int(test.labels[i])].replace("/", "-") / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(test.images[i, 0].numpy()).save(path)


def demo_model(path: Path) -> Path:
    """The demo's architecture with random weights and Fashion-MNIST's class names, saved to ``path``."""
    import torch

    import vitkit
    from vitkit.data.idx import load_idx_dataset

    classes = load_idx_dataset("fashion-mnist", "test", allow_download=False).classes

    torch.manual_seed(0)
    model = vitkit.create_model(
        "vit_s16",
        img_size=28,
        patch_size=4,
        width=128,
        depth=6,
        num_heads=4,
        mlp_dim=256,
        in_chans=1,
        classifier="gap",
        pos_embed="sincos2d",
        num_classes=10,
    )
    return vitkit.save_checkpoint(model, path, extra={"classes": json.dumps(classes)})


def open_time(page: Path) -> dict[str, float] | None:
    """Seconds until the page has drawn every panel in headless Chromium: as this script saw it
    (from the navigation command to the answer that the page is ready) and as the page's own clock
    says (from the navigation's start)."""
    try:
        from _browser import Browser, chromium
    except ImportError:
        return None
    binary = chromium()
    if binary is None:
        return None
    with Browser(binary, record_requests=False) as b:  # the request events would carry every data: URL whole
        seconds = b.open(page, READY, timeout=60)
        own = float(b.evaluate("document.body.dataset.readyMs")) / 1000
        errors = b.errors()
    if errors:
        raise SystemExit(f"the page logged errors: {errors[:3]}")
    return {"wall_s": round(seconds, 2), "page_clock_s": round(own, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--json", help="also write the numbers here")
    p.add_argument("--keep", help="copy the page here")
    args = p.parse_args()
    from vitkit.cli import main as vitkit

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        t0 = time.perf_counter()
        write_folder(tmp_path / "images", args.images)
        ckpt = demo_model(tmp_path / "demo.safetensors")
        t1 = time.perf_counter()
        out = tmp_path / "view.html"
        argv = ["view", str(ckpt), str(tmp_path / "images"), "--out", str(out), "--projections", "pca"]
        if vitkit(argv) != 0:
            raise SystemExit("vitkit view failed")
        t2 = time.perf_counter()
        result = {
            "images": args.images,
            "write_folder_s": round(t1 - t0, 2),
            "view_command_s": round(t2 - t1, 2),
            "page_mb": round(out.stat().st_size / 1e6, 2),
            "chromium_open": open_time(out),
        }
        if args.keep:
            Path(args.keep).write_bytes(out.read_bytes())
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
