"""``vitkit convert``: weights from any supported format to vitkit, official .npz, timm, HF or ONNX."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import count, parse_size, real

HELP = "convert weights between official .npz, timm, HF and vitkit"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="weights: .npz, .safetensors, .bin, a Hugging Face folder, a vitkit run or a name")
    p.add_argument("dst", help="output: .safetensors (vitkit), .npz (official), .onnx, a folder with --to hf")
    p.add_argument(
        "--to",
        choices=["vitkit", "official", "timm", "hf", "onnx"],
        default=None,
        help="format (default: from dst's suffix); timm writes .safetensors, hf a folder",
    )
    p.add_argument("--layout", choices=["prelinen", "linen"], default="prelinen", help="official key layout")
    p.add_argument("--name", default=None, help="check the weights against this model name")
    p.add_argument("--img-size", type=parse_size, default=None, help="resize position embeddings")
    p.add_argument("--num-classes", type=count(0, 1_000_000), default=None, help="replace the head")
    p.add_argument(
        "--num-heads",
        type=count(1),
        default=None,
        help="attention heads, for weights that do not record them (timm state dicts, HF without config.json)",
    )
    p.add_argument(
        "--act",
        choices=["gelu", "gelu_tanh"],
        default=None,
        help="MLP activation, for weights that do not record it (timm's: gelu unless given)",
    )
    p.add_argument(
        "--ln-eps",
        type=real(above=0.0),
        default=None,
        help="LayerNorm epsilon, for weights that do not record it (timm's: 1e-6 unless given)",
    )


def run(args: argparse.Namespace) -> int:
    from ..export import check_destination, export_weights, format_for
    from ..hub import load_pretrained
    from .common import download_bar

    dst = Path(args.dst)
    to = args.to or format_for(dst)  # .safetensors vitkit, .npz official, .onnx; other names need --to
    check_destination(dst, to)  # before the weights are read: a name vitkit could not read back is refused
    overrides = {}
    if args.img_size:
        overrides["img_size"] = args.img_size
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.act is not None:
        overrides["act"] = args.act
    if args.ln_eps is not None:
        overrides["ln_eps"] = args.ln_eps
    with download_bar(args.src) as bar:
        model = load_pretrained(args.src, name=args.name, num_heads=args.num_heads, progress=bar, **overrides)
    for note in model.load_report.notes:
        print(f"note: {note}")
    check = export_weights(model, dst, to, layout=args.layout)
    if to == "onnx" and check["max_abs_diff"] is not None:
        print(f"onnxruntime {check['onnxruntime']}: logits within {check['max_abs_diff']:.2e} of PyTorch")
    elif to == "onnx":
        print("onnxruntime is not installed: the export was not checked (pip install onnxruntime)")
    print(f"{model.load_report.source} {args.src} -> {to} {dst}")
    return 0
