"""What the training loop costs over the bare step: images a second of ``vitkit train``'s loop
(data order, batching, logging, the progress bar, the checkpoint clock) against the same
Trainer's ``train_step`` called again and again on one batch already in memory.

    python benchmarks/loop_overhead.py                                   # the demo recipe, CPU
    python benchmarks/loop_overhead.py --config vit_b16_i1k_scratch --data synthetic \\
        --set data.options.img_size=224 --batch 256 --device cuda [--compile]

Rounds alternate the two (each a fresh run of ``--steps`` steps; the first ``--warmup`` steps of
each are left out), so that a slow moment of a shared machine hits both; it prints the medians and
their ratio (loop / step) and writes JSON. Evaluation and checkpoints are off: they are timed
apart from training and never counted in its images a second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _recipe(args: argparse.Namespace, steps: int):
    from vitkit.train import find_recipe, load_recipe, parse_set

    sets = parse_set(args.set or [])
    sets += [("train.steps", steps), ("log.eval_every", 0), ("log.checkpoint_every", 0)]
    sets += [("log.checkpoint_minutes", 0.0), ("log.log_every", 1), ("log.plot", False), ("log.tensorboard", False)]
    sets += [("data.eval_split", ""), ("train.device", args.device), ("train.compile", args.compile)]
    if args.data:
        sets.append(("data.name", args.data))
    if args.batch:
        sets.append(("train.batch_size", args.batch))
    return load_recipe(find_recipe(args.config), sets)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def loop_rate(args: argparse.Namespace, folder: Path) -> float:
    """Images a second of the loop, from the log's per-step windows after the warm-up."""
    from vitkit.train import train

    train(_recipe(args, args.warmup + args.steps), folder)
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > args.warmup]
    seconds = sum(1 / r["img_per_s"] for r in rows)  # each window is one step of the same batch
    return len(rows) / seconds


def step_rate(args: argparse.Namespace, folder: Path) -> float:
    """Images a second of the same Trainer's step on one batch, called in a row."""
    from vitkit.train.loop import Trainer

    trainer = Trainer(_recipe(args, args.warmup + args.steps), folder)
    try:
        images, labels = next(iter(trainer.train_ds.batches(trainer.recipe.train.batch_size, shuffle=True, seed=0)))
        trainer.model.train()
        trainer.compute.net.train()
        for i in range(args.warmup):
            trainer.state.step = i
            trainer.train_step(images, labels)
        _sync(args.device)
        start = time.perf_counter()
        for i in range(args.warmup, args.warmup + args.steps):
            # the loop's steps, in its order: a schedule that changes the work (patch dropout's
            # stages) changes it here at the same steps
            trainer.state.step = i
            trainer.train_step(images, labels)
        _sync(args.device)
        return args.steps * len(labels) / (time.perf_counter() - start)
    finally:
        trainer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="fmnist_vit")
    ap.add_argument("--data", default=None)
    ap.add_argument("--set", action="append", metavar="KEY=VALUE")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=40, help="timed steps a round")
    ap.add_argument("--warmup", type=int, default=10, help="steps a round leaves out first")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="benchmarks/out/loop_overhead.json")
    args = ap.parse_args()

    from vitkit.cpu import cpu_info
    from vitkit.train import dist as D
    from vitkit.train.process import configure_process

    configure_process(D.resolve_device(args.device))
    loops, steps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            steps.append(step_rate(args, Path(tmp) / f"step{i}"))
            loops.append(loop_rate(args, Path(tmp) / f"loop{i}"))
            print(f"round {i + 1}: step {steps[-1]:.0f} img/s, loop {loops[-1]:.0f} img/s", flush=True)
    import torch

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_info()["model"]
    out = {
        "machine": where,
        "config": args.config,
        "sets": args.set or [],
        "device": args.device,
        "compile": args.compile,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "step_img_per_s": steps,
        "loop_img_per_s": loops,
        "step_median": statistics.median(steps),
        "loop_median": statistics.median(loops),
        "ratio": statistics.median(loops) / statistics.median(steps),
    }
    print("| machine | recipe | bare step | loop | loop / step |\n|---|---|---|---|---|")
    print(
        f"| {where} | {args.config}{' compiled' if args.compile else ''} | {out['step_median']:.0f} img/s | "
        f"{out['loop_median']:.0f} img/s | {out['ratio']:.3f} |"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
