"""``vitkit bench``: images/s, GFLOP/s and the fraction of this machine's matmul ceiling."""

from __future__ import annotations

import argparse

from .common import chosen_precision, count, parse_device, precision_argument

HELP = "images/s, GFLOP/s and the fraction of the machine's matmul ceiling"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="vit_b16")
    p.add_argument("--batch", type=count(1, 1 << 24), default=8)
    p.add_argument("--mode", choices=["infer", "train"], default="infer")
    precision_argument(p, "int8")
    p.add_argument("--img-size", type=count(1, 16384), default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", type=parse_device, default="cpu")
    p.add_argument("--warmup", type=count(0, 100_000), default=3)
    p.add_argument("--iters", type=count(1, 100_000), default=10)
    p.add_argument("--json", help="write the result here")


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..bench import bench_model
    from ..files import write_json

    r = bench_model(
        args.model,
        batch=args.batch,
        mode=args.mode,
        precision=chosen_precision(args.precision, args.device),
        img_size=args.img_size,
        compile=args.compile,
        device=args.device,
        warmup=args.warmup,
        iters=args.iters,
    )
    print(f"{r.model} {r.mode} {r.precision} batch {r.batch} at {r.img_size[0]}x{r.img_size[1]} on {r.device}")
    print(f"  images/s           {r.images_per_s:10.2f}   (median step {r.step_ms_median:.1f} ms)")
    kind = "forward; training counts 3x" if r.mode == "train" else "forward"
    print(f"  GFLOPs/image       {r.gflops_per_image:10.2f}   ({kind})")
    print(f"  achieved GFLOP/s   {r.achieved_gflops:10.1f}")
    if r.ceiling_gflops:
        print(f"  matmul ceiling     {r.ceiling_gflops:10.1f}   ({100 * r.fraction_of_ceiling:.0f}% of it)")
    if r.compile_s is not None:
        print(f"  compile time       {r.compile_s:10.1f} s (not in the figures above)")
    print(f"  peak memory        {r.peak_memory_mb:10.0f} MB")
    if args.json:
        write_json(args.json, asdict(r))
    return 0
