"""Training throughput of recipe variants, side by side: the demo recipe with ``--set`` changes.

    python benchmarks/step_variants.py --variant "autocast=train.bf16_weights=false" --variant "bf16 weights="
    python benchmarks/step_variants.py --full ...        # every patch, as the last 10% of the demo's steps
    python benchmarks/step_variants.py --tiny ...        # a check that it runs (seconds)

Each ``--variant NAME=SET;SET;...`` is a Trainer built from ``--config`` with those changes (an
empty list: the recipe as it is). Each timed block is ``--steps`` optimiser steps
(``Trainer.train_step``: transforms, forward, backward, clipping, optimiser) on the recipe's own
batches, after ``--warmup`` untimed ones; the variants take turns block by block (``--rounds``
times), so a machine that slows down or speeds up affects them alike, and the table gives each
one's median as a ratio to the first's. The step counter stays at 0, so patch dropout is on as in
the demo's first 90% of steps; ``--full`` turns it off for all of them. Writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from augment_throughput import TINY, time_variants, write_results


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, sets = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: give NAME=SET;SET (SET as --set takes it)")
    return name, [s for s in sets.split(";") if s]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/fmnist_vit.yaml")
    ap.add_argument("--variant", type=parse_variant, action="append", required=True)
    ap.add_argument("--full", action="store_true", help="every patch (train.patch_drop=0) in every variant")
    ap.add_argument("--steps", type=int, default=20, help="optimiser steps per timed block")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per variant before the first block")
    ap.add_argument("--rounds", type=int, default=7, help="timed blocks per variant, taken in turns")
    ap.add_argument("--tiny", action="store_true", help="a small model on synthetic data, 2 steps")
    ap.add_argument("--json", default="benchmarks/out/step_variants.json")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.warmup, args.rounds = 2, 1, 2
    variants = dict(args.variant)
    if len(variants) != len(args.variant):
        ap.error("two --variant share a name")

    from vitkit.train import load_recipe, parse_set
    from vitkit.train.dist import resolve_device
    from vitkit.train.process import configure_process

    base = [*(TINY if args.tiny else []), *(["train.patch_drop=0"] if args.full else []), "log.tensorboard=false"]
    recipes = {n: load_recipe(args.config, parse_set([*base, *sets])) for n, sets in variants.items()}
    names = list(recipes)
    configure_process(resolve_device(recipes[names[0]].train.device))
    step_s, _ = time_variants(recipes, args.steps, args.warmup, args.rounds)

    results = []
    first = statistics.median(step_s[names[0]])
    for n in names:
        med = statistics.median(step_s[n])
        batch = recipes[n].train.batch_size
        results.append(
            {
                "variant": n,
                "sets": variants[n],
                "step_ms": [round(1000 * s, 2) for s in step_s[n]],
                "median_step_ms": round(1000 * med, 2),
                "images_per_s": round(batch / med, 1),
                "speed_vs_first": round(first / med, 3),
            }
        )
    print(
        f"{args.config}{' (tiny)' if args.tiny else ''}{', every patch' if args.full else ''}: "
        f"{args.rounds} rounds of {args.steps} steps, {torch.get_num_threads()} threads"
    )
    header = f"{'variant':<28} {'ms/step':>9} {'images/s':>9} {'speed vs ' + names[0]:>22}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['variant']:<28} {r['median_step_ms']:>9.2f} {r['images_per_s']:>9.1f} {r['speed_vs_first']:>22.3f}")
    write_results(args, results, full=args.full)


if __name__ == "__main__":
    main()
