"""``vitkit analyze``: the paper's analyses of a checkpoint, as PNG figures and one JSON file."""

from __future__ import annotations

import argparse

from ..errors import UsageError, writing
from .common import WEIGHTS_HELP, count, index, load_model, parse_size

HELP = "attention rollout, attention distance, embeddings: figures and JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt", help=WEIGHTS_HELP)
    p.add_argument("--images", nargs="+", default=None, help="image files (default: scikit-image's sample photos)")
    p.add_argument("--out", required=True, help="folder for the PNG figures and analysis.json")
    p.add_argument("--img-size", type=parse_size, default=None, help="resolution, N or HxW (resizes positions)")
    p.add_argument(
        "--layers", type=index, nargs="+", default=None, help="layers (0-based) of the per-head attention maps"
    )
    p.add_argument(
        "--components", type=count(1, 100_000), default=28, help="principal components of the filters to keep"
    )


def run(args: argparse.Namespace) -> int:
    from ..analysis import analyze, sample_images
    from ..preprocessing import load_images, prepare_images

    model = load_model(args.ckpt, args.img_size)
    pre, chans = model.preprocessing, model.cfg.in_chans
    if args.images:
        images, sources = load_images(args.images, pre, chans), list(args.images)
    else:
        try:
            samples = sample_images()
        except UsageError as e:
            raise UsageError(f"{e} (give them with --images)") from None
        images = prepare_images(samples, pre, chans)
        sources = [f"skimage.data.{n}()" for n in images.names]
    report = analyze(model, images, layers=args.layers, components=args.components)
    extra = {"checkpoint": str(args.ckpt), "source": model.load_report.source}
    extra["preprocessing"] = model.preprocessing.to_dict()
    with writing(args.out):  # a full disk names the folder
        json_path = report.write(args.out, extra=extra, sources=sources)
    print(f"analyzed {report.name} ({model.load_report.source}) on {len(images)} image(s): {', '.join(images.names)}")
    for p in [*report.figures, json_path]:
        print(f"  wrote {p}")
    return 0
