"""Token merging's speed/accuracy curve: r against images a second and top-1 on a trained model.

For each r (tokens merged in each block, ``prepare_inference(model, precision, merge=r)``), the
test split's top-1 and the images a second of the prepared model on one batch, timed in
interleaved rounds (r = 0, 2, 4, ..., then again) so that load on a shared machine hits every r
alike; each r's median over the rounds is reported, with its speed-up over r = 0 and its top-1
change. Preprocessing and data loading are left out of the timing (the images are prepared once).

    python benchmarks/merge_curve.py --model runs/demo                           # the demo model
    python benchmarks/merge_curve.py --model runs/demo --r 0,1,2,3,4,5,6,7 --rounds 5 \\
        --json benchmarks/results/merge_curve.json
    python benchmarks/merge_curve.py --arch vit_b16 --r 0,8,16 --batch-size 8   # speed alone

``--arch NAME`` times a named model with random weights on random images at its own size (no
data, no top-1): the speed side of the curve for models too large to train here, such as ViT-B/16
at 224 px (a block merges at most half of its tokens, so r = 16 leaves more than 197 - 12 x 16).

The demo (``make demo``: 28 px Fashion-MNIST images, 4 px patches, 49 tokens, 6 blocks, average
pooling) merges at most 24 tokens a block over its first blocks; r = 8 leaves 49 - 6 x 8 = 1 patch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


def top1(served: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The fraction of images whose most probable class is their label."""
    right = total = 0
    with torch.inference_mode():
        for x, y in batches:
            right += int((served(x.to(served.input_dtype)).argmax(1) == y).sum())
            total += len(y)
    return right / total


def rate(served: torch.nn.Module, x: torch.Tensor, seconds: float) -> float:
    """Images a second of ``served`` on batch ``x``, repeated for about ``seconds``."""
    x = x.to(served.input_dtype)
    with torch.inference_mode():
        served(x)  # warm-up
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            served(x)
            n += 1
    return n * len(x) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="runs/demo", help="a trained checkpoint or run folder")
    p.add_argument("--arch", help="time this named model with random weights instead (no top-1)")
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--split", default="test")
    p.add_argument("--max-test", type=int, default=10_000, help="test images scored")
    p.add_argument("--r", default="0,1,2,3,4,5,6", help="tokens merged per block, each in turn")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "int8"])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="timing per r per round")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    import vitkit
    from vitkit.data import build_dataset
    from vitkit.eval import model_inputs
    from vitkit.inference import prepare_inference
    from vitkit.precision import resolve_precision

    precision = resolve_precision(args.precision, "cpu").name if args.precision != "int8" else "int8"
    if args.arch:
        torch.manual_seed(0)
        model = vitkit.create_model(args.arch).eval()
        cfg = model.cfg
        height, width = (cfg.img_size, cfg.img_size) if isinstance(cfg.img_size, int) else cfg.img_size
        timing_batch = torch.randn(args.batch_size, cfg.in_chans, height, width)
        batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        source = f"{args.arch} (random weights), {args.batch_size} random images at {height}x{width} px"
    else:
        model = vitkit.load_pretrained(args.model).eval()
        dataset = build_dataset(args.data, args.split)
        batches = list(model_inputs(model, dataset, batch_size=args.batch_size, max_images=args.max_test))
        timing_batch = batches[0][0]
        source = f"{args.model}: {sum(len(y) for _, y in batches)} {args.split} images of {args.data}"
    rs = [int(r) for r in args.r.split(",")]
    served = {r: prepare_inference(model, precision, merge=r) for r in rs}
    accuracy = {r: top1(served[r], batches) if batches else None for r in rs}
    speeds: dict[int, list[float]] = {r: [] for r in rs}
    for _ in range(args.rounds):
        for r in rs:
            speeds[r].append(rate(served[r], timing_batch, args.seconds))
    base = rs[0]
    rows = []
    for r in rs:
        tokens = served[r].forward_features(timing_batch[:1].to(served[r].input_dtype)).shape[1]
        rows.append({
            "r": r, "tokens_out": tokens, "images_per_s": statistics.median(speeds[r]),
            "rounds": speeds[r], "top1": accuracy[r],
        })  # fmt: skip
    print(f"{source}, {precision}, batch {len(timing_batch)}, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} rounds")  # fmt: skip
    print("| r | tokens after the last block | images/s | speed-up | top-1 | change |")
    print("|---|---|---|---|---|---|")
    first = rows[0]
    for row in rows:
        speedup = row["images_per_s"] / first["images_per_s"]
        if row["top1"] is None:
            shown = "| - | - |"
        else:
            shown = f"| {100 * row['top1']:.2f}% | {100 * (row['top1'] - first['top1']):+.2f} |"
        print(f"| {row['r']} | {row['tokens_out']} | {row['images_per_s']:.2f} | {speedup:.2f}x {shown}")
    if args.json:
        from vitkit.files import write_json

        write_json(args.json, {"args": vars(args), "precision": precision, "cpu_count": os.cpu_count(),
                               "baseline_r": base, "rows": rows})  # fmt: skip
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
