"""Serving precisions on a trained model: top-1 and images/s in fp32, bf16 weights and int8.

    python benchmarks/int8_accuracy.py runs/demo --data fashion-mnist

int8 (int8 weights per output channel on the x86 int8 dot-product kernels) comes in two forms:
"int8" quantises activations with each batch's range (dynamic); "int8-static" fixes their scales
once from ``--calib`` training images (static: faster, and what ``vitkit bench`` and
``benchmarks/peers.py`` time). "int8-static-compiled" is the same model under ``torch.compile``,
which computes the fused LayerNorm, softmax and quantisation with other roundings (its images/s
are from a second pass: the first compiles). Each is
acceptable where its top-1 stays within 0.5 points of fp32. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import vitkit
from vitkit.bench import prepare_inference
from vitkit.data import build_dataset
from vitkit.eval import evaluate, model_inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt", help="a run folder or any weights vitkit loads")
    ap.add_argument("--data", default="fashion-mnist")
    ap.add_argument("--split", default="test")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--calib", type=int, default=512, help="training images that calibrate int8-static")
    ap.add_argument("--calib-split", default="train")
    ap.add_argument(
        "--precisions",
        default="fp32,bf16,int8,int8-static,int8-static-compiled",
        help="comma-separated, fp32 first (leave out bf16 where the CPU emulates it: ~100x slower)",
    )
    ap.add_argument("--json", default="benchmarks/out/int8_accuracy.json")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    base = vitkit.load_pretrained(args.ckpt)
    dataset = build_dataset(args.data, args.split)
    calib_data = build_dataset(args.data, args.calib_split)
    calib = torch.cat([x for x, _ in model_inputs(base, calib_data, max_images=args.calib)])
    rows = []
    for precision in args.precisions.split(","):
        calibration = calib if "static" in precision else None
        model = prepare_inference(base, precision.split("-")[0], calibration=calibration)  # a copy
        passes = 1
        if precision.endswith("compiled"):
            model, passes = torch.compile(model), 2  # the first pass compiles (full and last batch)
        for _ in range(passes):
            res = evaluate(
                model, dataset, batch_size=args.batch_size, precision="bf16" if precision == "bf16" else "fp32"
            )
        rows.append({"precision": precision, "top1": 100 * res["top1"], "images_per_s": res["images_per_s"]})
    fp32 = rows[0]["top1"]
    print(f"{'precision':<21} {'top-1':>8} {'vs fp32':>9} {'img/s':>9}")
    for r in rows:
        r["delta_points"] = r["top1"] - fp32
        print(f"{r['precision']:<21} {r['top1']:7.2f}% {r['delta_points']:+8.2f} {r['images_per_s']:9.0f}")
    ok = all(abs(r["delta_points"]) <= 0.5 for r in rows if r["precision"].startswith("int8"))
    print(f"int8 (every form) within 0.5 points of fp32: {'yes' if ok else 'no'}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    summary = {"ckpt": args.ckpt, "data": args.data, "rows": rows, "int8_ok": ok}
    Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
