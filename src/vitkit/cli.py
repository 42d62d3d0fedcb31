"""``vitkit <command>``: the one place that parses arguments and prints for humans."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(name: str):
    def register(fn: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = fn
        return fn

    return register


class UserError(Exception):
    """An error to show as one line, without a traceback."""


def _parse_size(text: str) -> int | tuple[int, int]:
    if "x" in text:
        h, w = text.lower().split("x")
        return (int(h), int(w))
    return int(text)


# ---------------------------------------------------------------------------------------------
# models


@command("models")
def cmd_models(args: argparse.Namespace) -> int:
    import vitkit
    from vitkit.models import count_params, model_flops

    names = args.names or vitkit.list_models()
    rows = []
    for name in names:
        overrides = {"img_size": args.img_size} if args.img_size else {}
        if args.num_classes is not None:
            overrides["num_classes"] = args.num_classes
        model = vitkit.create_model(name, **overrides)
        cfg = model.cfg
        rows.append(
            {
                "name": name,
                "params": count_params(model),
                "gflops": model_flops(model) / 1e9,
                "img_size": list(cfg.img_size),
            }
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(f"{'model':<14} {'params':>14} {'GFLOPs':>9}  img")
    for r in rows:
        print(f"{r['name']:<14} {r['params']:>14,} {r['gflops']:>9.2f}  {r['img_size'][0]}x{r['img_size'][1]}")
    print("GFLOPs: 2 x multiply-adds of every matmul and convolution, one image, forward (see vitkit.models.flops)")
    return 0


# ---------------------------------------------------------------------------------------------
# convert


@command("convert")
def cmd_convert(args: argparse.Namespace) -> int:
    import numpy as np

    import vitkit
    from vitkit.checkpoint import hf_config_for, to_hf, to_official, to_timm
    from vitkit.checkpoint.io import atomic_write, write_safetensors

    overrides = {}
    if args.img_size:
        overrides["img_size"] = args.img_size
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    model = vitkit.load_pretrained(args.src, name=args.name, **overrides)
    for note in model.load_report.notes:
        print(f"note: {note}")
    dst = Path(args.dst)
    to = args.to or {".npz": "official", ".onnx": "onnx"}.get(dst.suffix, "vitkit")
    sd = model.state_dict()
    if to == "vitkit":
        vitkit.save_checkpoint(model, dst)
    elif to == "official":
        arrays = to_official(sd, model.cfg, layout=args.layout)
        atomic_write(dst, lambda f: np.savez(f, **arrays))
    elif to == "timm":
        write_safetensors(dst, to_timm(sd), {"format": "pt"})
    elif to == "onnx":
        from vitkit.export import export_onnx

        check = export_onnx(model, dst)
        if check["max_abs_diff"] is not None:
            print(f"onnxruntime {check['onnxruntime']}: logits within {check['max_abs_diff']:.2e} of PyTorch")
        else:
            print("onnxruntime is not installed: the export was not checked (pip install onnxruntime)")
    elif to == "hf":
        dst.mkdir(parents=True, exist_ok=True)
        write_safetensors(dst / "model.safetensors", to_hf(sd, model.cfg), {"format": "pt"})
        cfg = hf_config_for(model.cfg)
        cfg["architectures"] = ["ViTForImageClassification" if model.cfg.num_classes else "ViTModel"]
        atomic_write(dst / "config.json", lambda f: f.write(json.dumps(cfg, indent=2)), mode="w")
    print(f"{model.load_report.source} {args.src} -> {to} {dst}")
    return 0


# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitkit", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list models with parameters and GFLOPs")
    p.add_argument("names", nargs="*", help="model names (default: all registered)")
    p.add_argument("--img-size", type=_parse_size, default=None, help="input size, N or HxW")
    p.add_argument("--num-classes", type=int, default=None)
    p.add_argument("--json", help="also write the table to this JSON file")

    p = sub.add_parser("convert", help="convert weights between official .npz, timm, HF and vitkit")
    p.add_argument("src", help="weights: .npz, .safetensors, .bin, a Hugging Face folder or a vitkit run")
    p.add_argument("dst", help="output: .safetensors (vitkit), .npz (official), .onnx, a folder with --to hf")
    p.add_argument("--to", choices=["vitkit", "official", "timm", "hf", "onnx"], default=None)
    p.add_argument("--layout", choices=["prelinen", "linen"], default="prelinen", help="official key layout")
    p.add_argument("--name", default=None, help="check the weights against this model name")
    p.add_argument("--img-size", type=_parse_size, default=None, help="resize position embeddings")
    p.add_argument("--num-classes", type=int, default=None, help="replace the head")

    for extra in _EXTRA_PARSERS:
        extra(sub)
    return parser


# Later modules (training, evaluation, analysis, benchmarks) add their sub-commands here.
_EXTRA_PARSERS: list[Callable[[argparse._SubParsersAction], None]] = []


def main(argv: list[str] | None = None) -> int:
    _load_extras()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    from vitkit.checkpoint.io import CheckpointError
    from vitkit.train.loop import TrainingError

    try:
        return COMMANDS[args.command](args)
    except (UserError, CheckpointError, TrainingError, ValueError, FileNotFoundError) as e:
        if args.verbose:
            raise
        print(f"vitkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitkit {args.command}: interrupted", file=sys.stderr)
        return 130


def _load_extras() -> None:
    """Import the modules whose commands register themselves (kept lazy for a fast start)."""
    import importlib

    for mod in ("vitkit.train.cli", "vitkit.eval.cli", "vitkit.analysis.cli", "vitkit.bench"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


if __name__ == "__main__":
    sys.exit(main())
