"""``vitkit models``: the registered models with parameters and analytic GFLOPs."""

from __future__ import annotations

import argparse

from .common import count, parse_size

HELP = "list models with parameters and GFLOPs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="model names (default: all registered)")
    p.add_argument("--img-size", type=parse_size, default=None, help="input size, N or HxW")
    p.add_argument("--num-classes", type=count(0), default=None)
    p.add_argument("--json", help="also write the table to this JSON file")


def run(args: argparse.Namespace) -> int:
    from ..files import write_json
    from ..models import list_models
    from ..models.summary import describe_models

    overrides = {"img_size": args.img_size} if args.img_size else {}
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    rows = describe_models(args.names or list_models(), **overrides)
    if args.json:
        write_json(args.json, rows)
    print(f"{'model':<14} {'params':>14} {'GFLOPs':>9}  img")
    for r in rows:
        print(f"{r['name']:<14} {r['params']:>14,} {r['gflops']:>9.2f}  {r['img_size'][0]}x{r['img_size'][1]}")
    print("GFLOPs: 2 x multiply-adds of every matmul and convolution, one image, forward (see vitkit.models.flops)")
    return 0
