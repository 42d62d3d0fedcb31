"""Serving's run-time kernel choice against its two fixed alternatives, on this CPU.

    python benchmarks/kernel_choice.py [--model vit_b16] [--batch 8] [--rounds 5] [--json ...]

For fp32 and bf16: ``prepare_inference`` by default (each layer shape timed with oneDNN packed
weights and with ``nn.Linear``, the faster kept), with ``pack=True`` (every layer oneDNN) and
``pack=False`` (every layer ``nn.Linear``). Images/s of the served model, interleaved over
``--rounds`` (median), the seconds the default's first preparation took (the timing) and its
second (cached), and which kernel it chose how often. The CPU's model and flags go with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import vitkit
import vitkit.inference as inference
from vitkit.cpu import cpu_info
from vitkit.inference import prepare_inference


def _rate(served: torch.nn.Module, x: torch.Tensor, iters: int) -> float:
    with torch.inference_mode():
        served(x)
        start = time.perf_counter()
        for _ in range(iters):
            served(x)
        return iters * x.shape[0] / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json", default="benchmarks/out/kernel_choice.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = vitkit.create_model(args.model).eval()
    x32 = torch.randn(args.batch, 3, *model.cfg.img_size)
    rows = []
    for precision in ("fp32", "bf16"):
        x = x32.to(torch.bfloat16) if precision == "bf16" else x32
        inference._KERNEL_CHOICES.clear()
        start = time.perf_counter()
        auto = prepare_inference(model, precision)
        first = time.perf_counter() - start
        start = time.perf_counter()
        prepare_inference(model, precision)
        second = time.perf_counter() - start
        variants = {"chosen": auto, "oneDNN": prepare_inference(model, precision, pack=True)}
        variants["nn.Linear"] = prepare_inference(model, precision, pack=False)
        rates: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, served in variants.items():  # interleaved
                rates[k].append(_rate(served, x, args.iters))
        med = {k: statistics.median(v) for k, v in rates.items()}
        best_fixed = max(med["oneDNN"], med["nn.Linear"])
        rows.append(
            {
                "precision": precision,
                "images_per_s": med,
                "chosen_vs_best_fixed": med["chosen"] / best_fixed,
                "choices": auto.kernel_choices,
                "prepare_s_first": first,
                "prepare_s_cached": second,
            }
        )
        print(
            f"{precision}: chosen {med['chosen']:.2f} img/s ({auto.kernel_choices}), oneDNN {med['oneDNN']:.2f}, "
            f"nn.Linear {med['nn.Linear']:.2f}; chosen / best fixed {med['chosen'] / best_fixed:.3f}; "
            f"prepare {first:.1f} s, again {second:.2f} s",
            flush=True,
        )
    meta = {"cpu": cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads(), "command": sys.argv}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps({"meta": meta, "model": args.model, "batch": args.batch, "rows": rows}, indent=2)
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
