"""Serving precisions on a trained model: top-1, agreement with fp32 and images/s, per form of int8.

    python benchmarks/int8_accuracy.py runs/demo --data fashion-mnist

Rows (each on the whole ``--split``, 10,000 images for Fashion-MNIST's test split):

- ``fp32``, ``bf16``: vitkit's serving path (bf16 weights; leave it out where the CPU emulates bf16).
- ``int8``: int8 weights per output channel on the x86 int8 dot-product kernels, activations
  quantised with each batch's range (dynamic).
- ``int8-static``: activation scales fixed once from ``--calib`` training images (static).
- ``int8-static-smooth``: the same after activation smoothing (SmoothQuant, ``--alpha``) of the
  layers that read a LayerNorm (:func:`vitkit.inference.smooth_activations`).
- ``int8-static-compiled``: ``int8-static`` under ``torch.compile`` (other roundings of the fused
  LayerNorm, softmax and quantisation; its images/s are from a second pass: the first compiles).
- ``openvino-int8`` (NNCF, transformer mode: SmoothQuant), ``onnxruntime-int8`` (dynamic): the
  runtimes fed from vitkit's ONNX export, where installed (:mod:`vitkit.backends`).

Each row gives top-1, its difference from fp32 in points, the share of images whose top class is
fp32's (top-1 agreement) and the mean and smallest cosine between an image's logits and fp32's.
A form of int8 is acceptable where its top-1 stays within ``--budget`` points (0.2) of fp32.
Prints a table and writes JSON (and, with ``--markdown``, the table as Markdown).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import vitkit
from vitkit.data import build_dataset
from vitkit.eval import model_inputs
from vitkit.eval.features import model_outputs
from vitkit.inference import prepare_inference

ALL = "fp32,bf16,int8,int8-static,int8-static-smooth,int8-static-compiled,openvino-int8,onnxruntime-int8"


def served(base: torch.nn.Module, form: str, calib: torch.Tensor, alpha: float) -> tuple[torch.nn.Module, int]:
    """The model of one row, and how many passes its images/s needs (2 when compiled)."""
    if form in ("openvino-int8", "onnxruntime-int8"):
        from vitkit.backends import runtime_model

        backend = form.split("-")[0]
        return runtime_model(base, backend, "int8", calib if backend == "openvino" else None), 1
    precision = form.split("-")[0]
    static = "static" in form
    model = prepare_inference(
        base,
        precision,
        calibration=calib if static else None,
        smooth=alpha if form.endswith("smooth") else None,
    )
    if form.endswith("compiled"):
        return torch.compile(model), 2
    return model, 1


def compare(logits: torch.Tensor, labels: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Top-1, and agreement with the fp32 logits ``ref`` (top-1 agreement; mean and smallest cosine)."""
    cos = torch.nn.functional.cosine_similarity(logits.double(), ref.double(), dim=1)
    return {
        "top1": 100 * float((logits.argmax(1) == labels).double().mean()),
        "top1_agreement": 100 * float((logits.argmax(1) == ref.argmax(1)).double().mean()),
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt", help="a run folder or any weights vitkit loads")
    ap.add_argument("--data", default="fashion-mnist")
    ap.add_argument("--split", default="test")
    ap.add_argument("--max-images", type=int, default=None, help="a random subset of the split (default: all)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--calib", type=int, default=512, help="training images that calibrate static int8")
    ap.add_argument("--calib-split", default="train")
    ap.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant's migration strength")
    ap.add_argument("--budget", type=float, default=0.2, help="top-1 points int8 may lose")
    ap.add_argument("--precisions", default=ALL, help=f"comma-separated rows, fp32 first (default: {ALL})")
    ap.add_argument("--json", default="benchmarks/out/int8_accuracy.json")
    ap.add_argument("--markdown", default=None, help="also write the table to this Markdown file")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    base = vitkit.load_pretrained(args.ckpt).float().eval()
    dataset = build_dataset(args.data, args.split)
    calib_data = build_dataset(args.data, args.calib_split)
    calib = torch.cat([x for x, _ in model_inputs(base, calib_data, max_images=args.calib)])
    forms = args.precisions.split(",")
    if forms[0] != "fp32":
        ap.error("--precisions must start with fp32 (the reference)")
    rows, ref = [], None
    for form in forms:
        try:
            model, passes = served(base, form, calib, args.alpha)
        except Exception as e:  # a runtime that is not installed, or a precision this CPU lacks
            rows.append({"precision": form, "skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"})
            continue
        for _ in range(passes):
            res = model_outputs(model, dataset, "logits", args.batch_size, max_images=args.max_images)
        ref = res.outputs if ref is None else ref
        rows.append({"precision": form, **compare(res.outputs, res.labels, ref), "images_per_s": res.images_per_s})
    report(rows, args)


def report(rows: list[dict], args: argparse.Namespace) -> None:
    """Print the table (Markdown, as benchmarks/RESULTS.md shows it) and write the JSON."""
    fp32 = rows[0]["top1"]
    lines = [
        "| precision | top-1 | images/s | vs fp32 (points) | top-1 agreement | cosine, mean | cosine, min |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| `{r['precision']}` | skipped: {r['skipped']} | | | | | |")
            continue
        r["delta_points"] = r["top1"] - fp32
        lines.append(
            f"| `{r['precision']}` | {r['top1']:.2f}% | {r['images_per_s']:.0f} | {r['delta_points']:+.2f} | "
            f"{r['top1_agreement']:.2f}% | {r['cosine_mean']:.5f} | {r['cosine_min']:.4f} |"
        )
    ok = {
        r["precision"]: abs(r["delta_points"]) <= args.budget
        for r in rows
        if "int8" in r["precision"] and "skipped" not in r
    }
    table = "\n".join(lines)
    print(table)
    print(
        f"int8 within {args.budget} points of fp32: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in ok.items())
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    summary = {"ckpt": args.ckpt, "data": args.data, "split": args.split, "calib": args.calib, "rows": rows}
    Path(args.json).write_text(json.dumps({**summary, "alpha": args.alpha, "within_budget": ok}, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
