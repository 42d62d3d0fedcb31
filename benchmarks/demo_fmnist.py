"""The main job, measured: the demo recipe's test accuracy against training time on this machine.

    python benchmarks/demo_fmnist.py                         # runs configs/fmnist_vit.yaml
    python benchmarks/demo_fmnist.py --out runs/demo         # or reads a finished run

Trains (or reads) a run with evaluations on the Fashion-MNIST test set along the way, then
prints accuracy at the training times of the peers' table in ../shared/docs/anchors.md (timm's
ViT: 49.6 / 69.5 / 73.4 / 76.4% at 150 / 300 / 450 / 600 s; a ResNet-18-style CNN: 77.5 / 89.1 /
91.4 / 92.3%) and writes JSON. Training time excludes evaluation and checkpoint writing and
includes everything else (data, augmentation, optimiser). The accuracy at an intermediate time is
that of the same run, mid-schedule, not of a run scheduled to end there.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

ANCHORS = {
    "timm ViT (28 px, patch 4, D 192, 6 layers), AdamW 1e-3, bf16": [49.6, 69.5, 73.4, 76.4],
    "ResNet-18-style CNN (widths 32-256)": [77.5, 89.1, 91.4, 92.3],
}
TIMES = [150, 300, 450, 600]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/fmnist_vit.yaml")
    ap.add_argument("--out", default="benchmarks/out/demo_run")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--json", default="benchmarks/out/demo_fmnist.json")
    args = ap.parse_args()

    from vitkit.train import load_recipe, parse_set, train

    recipe = load_recipe(args.config, parse_set([f"log.eval_every={args.eval_every}"]))
    out = Path(args.out)
    t0 = time.perf_counter()
    result = train(recipe, out)
    wall = time.perf_counter() - t0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["train_s"], 100 * r["top1"], r["step"]) for r in records if "top1" in r]
    at = {}
    for t in TIMES:
        done = [acc for s, acc, _ in evals if s <= t]
        at[t] = done[-1] if done else None
    n_train = 60000
    epochs = result.step * recipe.train.batch_size / n_train
    print(f"\nvitkit demo: {recipe.model.name} with {recipe.model.overrides}")
    print(
        f"steps {result.step}, {epochs:.1f} epochs, training time {result.train_seconds:.0f} s "
        f"({result.images_per_second:.0f} img/s), wall time of this command {wall:.0f} s"
    )
    print(f"\n{'model':<62} " + " ".join(f"{t:>6} s" for t in TIMES))
    row = " ".join(f"{at[t]:7.1f}%" if at[t] is not None else "      -" for t in TIMES)
    print(f"{'vitkit demo ViT (this run)':<62} {row}")
    for name, vals in ANCHORS.items():
        print(f"{name:<62} " + " ".join(f"{v:7.1f}%" for v in vals))
    print("\nevaluations (training seconds, test top-1):")
    for s, acc, step in evals:
        print(f"  step {step:>6}  {s:7.1f} s  {acc:6.2f}%")
    print(f"\ntest accuracy: {100 * result.final_top1:.2f}% after {result.train_seconds:.0f} s of training")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "recipe": args.config,
                "final_top1": result.final_top1,
                "train_seconds": result.train_seconds,
                "images_per_second": result.images_per_second,
                "steps": result.step,
                "epochs": epochs,
                "wall_seconds": wall,
                "at_seconds": at,
                "evals": evals,
                "anchors": ANCHORS,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "machine": platform.machine(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
