"""``vitkit convert``: weights from any supported format to vitkit, official .npz, timm or HF, or a
model for serving: a ``torch.export`` program (.pt2, optionally AOTInductor-compiled) or ONNX. With
``--adapter-weights`` the adapters are merged into the weights first, or, with ``--to peft``,
written alone for Hugging Face peft."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import adapter_argument, count, parse_size, real

HELP = "convert weights between official .npz, timm, HF and vitkit, or export to .pt2 or ONNX"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="weights: .npz, .safetensors, .bin, a Hugging Face folder, a vitkit run or a name")
    p.add_argument(
        "dst", help="output: .safetensors (vitkit), .npz (official), .onnx, .pt2 (torch.export), a folder with --to hf"
    )
    p.add_argument(
        "--to",
        choices=["vitkit", "official", "timm", "hf", "onnx", "pt2", "peft"],
        default=None,
        help="format (default: from dst's suffix); timm writes .safetensors, hf a folder, peft a folder of "
        "the --adapter-weights alone for Hugging Face peft (on the base written with --to hf)",
    )
    adapter_argument(p)
    p.add_argument("--layout", choices=["prelinen", "linen"], default="prelinen", help="official key layout")
    p.add_argument(
        "--aoti",
        action="store_true",
        help="with .pt2: compile ahead of time with AOTInductor (needs a C++ compiler; a minute or more on a CPU)",
    )
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
    p.add_argument(
        "--classifier",
        choices=["token", "gap"],
        default=None,
        help="pooling, for weights that do not record it: the class token or the mean of the patch tokens "
        "(timm's: as timm builds the file's layout, the mean for its DINOv3 models)",
    )


def run(args: argparse.Namespace) -> int:
    from ..errors import ExportError, UsageError
    from ..export import aoti_available, check_destination, export_weights, format_for
    from ..hub import load_pretrained
    from .common import download_bar

    dst = Path(args.dst)
    if args.to == "peft":
        return _run_peft(args, dst)
    to = args.to or format_for(dst)  # .safetensors vitkit, .npz official, .onnx, .pt2; other names need --to
    check_destination(dst, to)  # before the weights are read: a name vitkit could not read back is refused
    if args.aoti and to != "pt2":
        raise UsageError(f"--aoti writes an AOTInductor package, a .pt2 file: not the {to} format")
    if args.aoti and (why := aoti_available()):
        raise ExportError(f"{dst}: cannot package with AOTInductor: {why}")
    overrides = {}
    if args.img_size:
        overrides["img_size"] = args.img_size
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.act is not None:
        overrides["act"] = args.act
    if args.ln_eps is not None:
        overrides["ln_eps"] = args.ln_eps
    if args.classifier is not None:
        overrides["classifier"] = args.classifier
    with download_bar(args.src) as bar:
        model = load_pretrained(args.src, name=args.name, num_heads=args.num_heads, progress=bar, **overrides)
    for note in model.load_report.notes:
        print(f"note: {note}")
    if args.adapter_weights:
        from ..checkpoint.adapters import load_adapters

        load_adapters(model, args.adapter_weights, merge=True)
        print(f"note: adapters {args.adapter_weights} merged into the weights")
    check = export_weights(model, dst, to, layout=args.layout, aoti=args.aoti)
    for line in export_lines(check):
        print(line)
    print(f"{model.load_report.source} {args.src} -> {to} {dst}")
    return 0


def _run_peft(args: argparse.Namespace, dst: Path) -> int:
    """``--to peft``: the adapters of ``--adapter-weights`` on the base ``src``, written as a peft folder."""
    from ..checkpoint.adapters import export_peft, load_adapters
    from ..errors import UsageError
    from .common import load_model

    if not args.adapter_weights:
        raise UsageError("--to peft writes adapters: give them with --adapter-weights FILE")
    if args.img_size or args.num_classes is not None:
        raise UsageError("--to peft writes the adapters alone; --img-size and --num-classes change the base")
    model = load_model(args.src, name=args.name, num_heads=args.num_heads)
    load_adapters(model, args.adapter_weights)
    export_peft(model, dst)
    print(f"{args.adapter_weights} -> peft {dst} (adapter_model.safetensors, adapter_config.json)")
    return 0


def export_lines(check: dict[str, Any]) -> list[str]:
    """What a serving export's check says, for people: which exporter wrote the file (a note
    when ONNX fell back to the TorchScript exporter), and how close its outputs are to PyTorch's.

    Args:
        check: what :func:`vitkit.export.export_weights` returned.

    Returns:
        The lines to print; none for the weight formats.
    """
    fmt = check.get("format")
    if fmt not in ("onnx", "pt2"):
        return []
    lines = []
    if fmt == "onnx" and check.get("fallback"):
        lines.append(f"note: written by the TorchScript exporter, which PyTorch deprecates: {check['fallback']}")
    sizes = " and ".join(str(b) for b in check.get("batch_sizes", []))
    if fmt == "pt2":
        what = "AOTInductor package" if check["exporter"] == "aoti" else "torch.export program"
        where = f"{what} (torch {check['torch']}, dynamic batch)"
    else:
        where = f"ONNX opset {check['opset']} by the {check['exporter']} exporter, dynamic batch"
    if check["max_abs_diff"] is None:
        lines.append(f"{where}; not checked: onnxruntime is not installed (pip install onnxruntime)")
    else:
        runner = f"onnxruntime {check['onnxruntime']}" if fmt == "onnx" else "read back"
        lines.append(
            f"{where}; {runner}: logits within {check['max_abs_diff']:.2e} of PyTorch at batch sizes {sizes} "
            f"(tolerance {check['tolerance']:.1e})"
        )
    return lines
