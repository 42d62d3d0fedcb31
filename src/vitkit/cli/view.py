"""``vitkit view``: one self-contained HTML page that looks inside a ViT, offline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError, writing
from .common import WEIGHTS_HELP, count, load_model, parse_size

HELP = "one offline HTML page: attention, rollout, patch similarity, PCA, Figure 7 panels, embedding scatter"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt", metavar="MODEL", help=WEIGHTS_HELP)
    p.add_argument("images", metavar="IMAGES", nargs="+", help="image files or folders (walked at any depth)")
    p.add_argument("--out", required=True, help="the HTML file to write")
    p.add_argument("--img-size", type=parse_size, default=None, help="resolution, N or HxW (resizes positions)")
    p.add_argument(
        "--max-images",
        type=count(1, 10_000),
        default=8,
        help="images shown one by one, with attention and patch similarity (default 8)",
    )
    p.add_argument(
        "--max-points",
        type=count(0, 10_000_000),
        default=10_000,
        help="images in the embedding scatter; more are subsampled, seeded (default 10000; 0: no scatter)",
    )
    p.add_argument(
        "--projections",
        nargs="+",
        choices=["pca", "umap", "tsne"],
        default=None,
        help="the scatter's projections (default: pca, and umap where umap-learn is installed)",
    )
    p.add_argument("--batch-size", type=count(1, 1 << 16), default=64, help="images per batch for the scatter")
    p.add_argument("--workers", type=count(0, 256), default=4, help="threads that decode images (0: none)")


def _gather(inputs: list[str]) -> list[tuple[Path, str, str | None]]:
    """(folder, path relative to it, label) for each image: a folder's files with their class
    folder as label; a file alone without one."""
    from ..eval.embed import image_files

    items: list[tuple[Path, str, str | None]] = []
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            for rel in image_files(path):
                head, sep, _ = rel.partition("/")
                items.append((path, rel, head if sep else None))
        elif path.is_file():
            items.append((path.parent, path.name, None))
        else:
            raise UsageError(f"{path}: no such file or folder")
    return items


def _spread(n: int, k: int) -> list[int]:
    """``k`` indices of ``n`` spread evenly (all of them when ``k >= n``)."""
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..analysis.view import available_projections, collect_points, view_data, write_view
    from ..preprocessing import load_images

    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"{out}: a folder; give the HTML file to write")
    items = _gather(args.images)
    model = load_model(args.ckpt, args.img_size)
    if not hasattr(model, "forward_intermediates"):
        raise UsageError(f"{args.ckpt}: the model is a {type(model).__name__}; vitkit view needs a Vision Transformer")
    projections = args.projections or [p for p in available_projections() if p != "tsne"]
    kept = items
    if len(items) > args.max_points:
        keep = np.sort(np.random.default_rng(0).permutation(len(items))[: args.max_points])
        kept = [items[i] for i in keep]
    points = None
    if args.max_points and len(kept) >= 3:
        points = collect_points(model, kept, batch_size=args.batch_size, workers=args.workers)
    readable = points.paths if points is not None else [str(root / rel) for root, rel, _ in kept]  # unreadable: skipped
    paths = [readable[i] for i in _spread(len(readable), args.max_images)]
    images = load_images(paths, model.preprocessing, model.cfg.in_chans)
    data = view_data(model, images, paths, points=points, projections=projections)
    with writing(out):
        size = write_view(out, data)
    scatter = f", {len(points.paths)} in the scatter ({', '.join(projections)})" if points is not None else ""
    print(f"viewed {data['model']['name']} on {len(images)} image(s){scatter}")
    if len(items) > len(kept):
        print(f"  the scatter shows {len(kept)} of {len(items)} images (raise with --max-points)")
    if len(kept) > len(images):
        print(f"  {len(images)} of them shown one by one (raise with --max-images)")
    if points is not None and points.skipped:
        listed = "; ".join(f"{p} ({why})" for p, why in points.skipped[:5])
        more = f"; and {len(points.skipped) - 5} more" if len(points.skipped) > 5 else ""
        print(f"warning: skipped {len(points.skipped)} unreadable file(s): {listed}{more}", file=sys.stderr)
    print(f"wrote {out} ({size / 1e6:.1f} MB)")
    return 0
