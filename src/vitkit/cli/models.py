"""``vitkit models``: the registered models with parameters and analytic GFLOPs."""

from __future__ import annotations

import argparse

from .common import count, parse_size

HELP = "list models with parameters and GFLOPs (--pretrained: the weights known by name)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="model names (default: all registered)")
    p.add_argument("--img-size", type=parse_size, default=None, help="input size, N or HxW")
    p.add_argument("--num-classes", type=count(0, 1_000_000), default=None)
    p.add_argument("--json", help="also write the table to this JSON file")
    p.add_argument("--pretrained", action="store_true", help="list the pretrained weights vitkit loads by name")


def run(args: argparse.Namespace) -> int:
    from ..files import write_json
    from ..models import list_models
    from ..models.summary import describe_models

    if args.pretrained:
        return _pretrained(args)
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


def _pretrained(args: argparse.Namespace) -> int:
    """The names table: source, resolution, data, the publisher's ImageNet top-1, licence."""
    from ..files import write_json
    from ..hub.names import list_pretrained, rows
    from ..models import canonical_name

    wanted = {canonical_name(n) for n in args.names} | set(args.names)
    entries = [e for e in list_pretrained() if not args.names or e.model in wanted or e.name in wanted]
    table = rows(entries)
    if args.json:
        write_json(args.json, table)
    width = max(len("name"), *(len(r["name"]) for r in table)) if table else 4
    print(f"{'name':<{width}}  {'source':<8} {'res':>4}  {'data':<26} {'top-1':>6}  {'licence':<10} reported in")
    for r in table:
        top1 = f"{r['top1']:.2f}" if r["top1"] is not None else ""
        print(
            f"{r['name']:<{width}}  {r['source']:<8} {r['resolution']:>4}  {r['data']:<26} {top1:>6}  "
            f"{r['licence']:<10} {r['top1_source']}"
        )
    print("top-1: ImageNet-1k, %, as the publisher reports it (blank: none published for that file)")
    print(
        "load with vitkit.load_pretrained(NAME) or create_model(MODEL, pretrained=TAG); aliases: the release file names"
    )
    return 0
