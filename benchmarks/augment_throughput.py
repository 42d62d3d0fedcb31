"""What RandAugment and Mixup cost the demo: training throughput of configs/fmnist_vit.yaml with them on and off.

    python benchmarks/augment_throughput.py                     # the measurement (a quiet machine, ~3 min)
    python benchmarks/augment_throughput.py --tiny              # a check that it runs (seconds)

Variants, each a Trainer built from the demo recipe with ``--set`` changes:
- off: the recipe as it is (no augmentation);
- randaugment+mixup: ``augment.randaugment=rand-m9-n2-mstd0.5``, ``augment.mixup_alpha=0.8``,
  ``augment.cutmix_alpha=1.0`` (DeiT's settings, Mixup or CutMix per batch);
- and, to see where the time goes, RandAugment alone, Mixup/CutMix alone, and all of the above
  with random erasing (``augment.erase_prob=0.25``) and 3 repeats.

Each timed block is ``--steps`` optimiser steps (``Trainer.train_step``: transforms, mixing,
forward, backward, optimiser) after ``--warmup`` untimed ones, on the recipe's own batches; the
variants take turns block by block (``--rounds`` times), so a machine that slows down or speeds
up during the run affects them alike. The step counter stays at 0, so patch dropout is on, as in
the first 80% of the demo's steps. Also timed, without the model: the augmentation alone
(transforms and mixing of one batch). The target of issue 16: "randaugment+mixup" within 10% of
"off" (ratio >= 0.90). Writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

VARIANTS = {
    "off": [],
    "randaugment+mixup": [
        "augment.randaugment=rand-m9-n2-mstd0.5",
        "augment.mixup_alpha=0.8",
        "augment.cutmix_alpha=1.0",
    ],
    "randaugment only": ["augment.randaugment=rand-m9-n2-mstd0.5"],
    "mixup/cutmix only": ["augment.mixup_alpha=0.8", "augment.cutmix_alpha=1.0"],
    "all (+erasing, 3 repeats)": [
        "augment.randaugment=rand-m9-n2-mstd0.5",
        "augment.mixup_alpha=0.8",
        "augment.cutmix_alpha=1.0",
        "augment.erase_prob=0.25",
        "augment.repeats=3",
    ],
}
TINY = [
    "data.name=synthetic",
    "data.options={img_size: 28, in_chans: 1, n: 256}",
    "data.eval_split=",
    "model.overrides.depth=1",
    "model.overrides.width=32",
    "model.overrides.mlp_dim=64",
    "train.batch_size=32",
    "train.precision=fp32",
    "train.bf16_weights=false",
]


def batches_of(trainer, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of the recipe's training data, in its order (epochs wrap)."""
    r, out, epoch = trainer.recipe, [], 0
    while len(out) < count:
        for batch in trainer.train_ds.batches(
            r.train.batch_size, shuffle=True, seed=r.seed, epoch=epoch, drop_last=True, repeats=r.augment.repeats
        ):
            out.append(batch)
            if len(out) == count:
                break
        epoch += 1
    return out


def time_steps(trainer, batches) -> float:
    start = time.perf_counter()
    for images, labels in batches:
        trainer.train_step(images, labels)
    return time.perf_counter() - start


def _time_augment(trainer, batches) -> float:
    """Seconds for the transforms and mixing of these batches, no model (as train_step does them)."""
    from vitkit.data import mix_batch, step_generator, train_transform
    from vitkit.data.transforms import match_channels

    start = time.perf_counter()
    for step, (images, labels) in enumerate(batches):
        g = step_generator(trainer.recipe.seed, step, trainer.device)
        x = train_transform(match_channels(images.to(trainer.device), trainer.model.cfg.in_chans), trainer.tcfg, g)
        if trainer.mix.enabled:
            x = mix_batch(x, labels.to(trainer.device), trainer.model.num_classes, trainer.mix, g).images
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def time_variants(
    recipes: dict, steps: int, warmup: int, rounds: int, also: Callable | None = None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds a step takes for each recipe, one Trainer each, ``rounds`` blocks of ``steps`` in
    turns after ``warmup`` untimed steps; and the seconds a step of ``also(trainer, batches)``
    takes, timed after each block (empty lists without it)."""
    from vitkit.train.loop import Trainer

    step_s: dict[str, list[float]] = {n: [] for n in recipes}
    also_s: dict[str, list[float]] = {n: [] for n in recipes}
    with tempfile.TemporaryDirectory(prefix="vitkit-stepbench-") as tmp:
        trainers = {n: Trainer(r, Path(tmp) / f"run{i}") for i, (n, r) in enumerate(recipes.items())}
        try:
            batches = {n: batches_of(t, warmup + steps) for n, t in trainers.items()}
            for n, t in trainers.items():
                t.model.train(), t.compute.net.train()
                time_steps(t, batches[n][:warmup])
            for _ in range(rounds):
                for n, t in trainers.items():
                    step_s[n].append(time_steps(t, batches[n][warmup:]) / steps)
                    if also is not None:
                        also_s[n].append(also(t, batches[n][warmup:]) / steps)
        finally:
            for t in trainers.values():
                t.close()
    return step_s, also_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/fmnist_vit.yaml")
    ap.add_argument("--steps", type=int, default=40, help="optimiser steps per timed block")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps per variant before the first block")
    ap.add_argument("--rounds", type=int, default=5, help="timed blocks per variant, taken in turns")
    ap.add_argument("--only", nargs="*", default=None, help="variants to run (default: all)")
    ap.add_argument(
        "--tiny", action="store_true", help="a small model on synthetic data, 2 steps: a check that it runs"
    )
    ap.add_argument("--json", default="benchmarks/out/augment_throughput.json")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.warmup, args.rounds = 2, 1, 2

    from vitkit.train import load_recipe, parse_set
    from vitkit.train.dist import resolve_device
    from vitkit.train.process import configure_process

    names = args.only or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    base = TINY if args.tiny else []
    recipes = {n: load_recipe(args.config, parse_set([*base, *VARIANTS[n], "log.tensorboard=false"])) for n in names}
    configure_process(resolve_device(recipes[names[0]].train.device))

    step_s, augment_s = time_variants(recipes, args.steps, args.warmup, args.rounds, _time_augment)

    batch = recipes[names[0]].train.batch_size
    base_ips = batch / statistics.median(step_s[names[0]])
    results = []
    for n in names:
        med = statistics.median(step_s[n])
        results.append(
            {
                "variant": n,
                "sets": VARIANTS[n],
                "step_s": [round(s, 5) for s in step_s[n]],
                "median_step_s": round(med, 5),
                "images_per_s": round(batch / med, 1),
                "ratio_to_first": round(batch / med / base_ips, 3),
                "augment_ms_per_batch": round(1000 * statistics.median(augment_s[n]), 3),
            }
        )
    header = f"{'variant':<28} {'images/s':>9} {'vs ' + names[0]:>9} {'augment ms/batch':>17}"
    print(f"{args.config}{' (tiny)' if args.tiny else ''}: batch {batch}, {args.rounds} rounds of {args.steps} steps")
    print(header)
    print("-" * len(header))
    for r in results:
        ips, ratio, ms = r["images_per_s"], r["ratio_to_first"], r["augment_ms_per_batch"]
        print(f"{r['variant']:<28} {ips:>9.1f} {ratio:>9.3f} {ms:>17.2f}")
    write_results(args, results, batch_size=batch)


def write_results(args: argparse.Namespace, results: list[dict], **meta: object) -> None:
    """The JSON of a step benchmark: its settings, the machine's, and ``results``."""
    from vitkit.files import write_json

    meta = {
        "config": args.config,
        "tiny": args.tiny,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        **meta,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, {"meta": meta, "results": results})
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
