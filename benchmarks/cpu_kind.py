"""What this CPU computes fast, and the demo recipe's training speed on it, in one run.

    python benchmarks/cpu_kind.py                    # this CPU as it is
    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/cpu_kind.py                # an AVX-512 CPU made to compute like an AVX2-only one
    python benchmarks/cpu_kind.py --tiny             # a check that it runs (seconds)

Prints and writes (``--json``):
- the CPU (model, flags, torch's vector level, oneDNN's bf16 support) and what the precision
  policy (``vitkit.precision``) resolves ``auto`` to, with its reason;
- the machine's own ``torch.mm`` rate at 1024 x 1024 in fp32 and bf16 (the best of a few);
- the demo recipe's (``configs/fmnist_vit.yaml``) training speed as shipped (``precision: auto``)
  and with each explicit precision: images/s of ``Trainer.train_step`` in its two phases (8
  patches kept an image, the first 88% of the steps; 36 patches, the last 12%), the schedule's
  mean over both, and images/s per GFLOP/s of the fp32 ``torch.mm`` rate measured in the same
  run. The variants take turns block by block (``--rounds``), as ``step_variants.py`` does, so a
  machine whose speed drifts affects them alike; the mm rate is measured between the rounds too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from augment_throughput import write_results

PHASES = {"8 patches": ("train.patch_drop=0.84", 0.88), "36 patches": ("train.patch_drop=0.27", 0.12)}


def mm_rate(dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """GFLOP/s of ``torch.mm`` on n x n matrices in ``dtype``, the best of ``repeats``."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def build(config: str, sets: list[str], tiny: bool, out: Path) -> object:
    from vitkit.train import load_recipe, parse_set
    from vitkit.train.loop import Trainer

    base = ["data.eval_split=", "log.plot=false", "log.tensorboard=false"]
    if tiny:
        base += ["data.name=synthetic", 'data.options={"img_size": 28, "n": 512, "in_chans": 1}']
    trainer = Trainer(load_recipe(config, parse_set(base + sets)), out)
    trainer.model.train(), trainer.compute.net.train()
    return trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/fmnist_vit.yaml")
    ap.add_argument("--precisions", default="auto,fp32,bf16", help="comma-separated: what to time the recipe in")
    ap.add_argument("--steps", type=int, default=10, help="optimiser steps per timed block")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="synthetic data, 2 steps a block")
    ap.add_argument("--json", default="benchmarks/out/cpu_kind.json")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.warmup, args.rounds = 2, 1, 1

    import tempfile

    from vitkit.cpu import cpu_info
    from vitkit.precision import bf16_support, resolve_precision
    from vitkit.train.process import configure_process

    configure_process(torch.device("cpu"))
    info = cpu_info()
    onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    auto = resolve_precision("auto")
    print(f"CPU: {info['model']} ({info['cores']} cores), torch {torch.__version__} at {info['torch_capability']}")
    print(f"flags: {', '.join(f for f, on in info['flags'].items() if on)}; oneDNN bf16: {onednn_bf16}")
    print(f"{auto.describe()}  [{bf16_support().reason}]")

    precisions = [p for p in args.precisions.split(",") if p]
    slow_bf16 = not bf16_support().native
    rates: dict[str, list[float]] = {"fp32": [], "bf16": []}
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for p in precisions:
            for phase, (drop, _) in PHASES.items():
                sets = [f"train.precision={p}", drop] + (["train.bf16_weights=false"] if p == "fp32" else [])
                t = build(args.config, sets, args.tiny, Path(tmp) / f"{p}-{phase.split()[0]}")
                batch = t.recipe.train.batch_size
                images, labels = next(iter(t.train_ds.batches(batch, shuffle=True, seed=0, drop_last=True)))
                steps = args.steps if not (p == "bf16" and slow_bf16) else max(1, args.steps // 10)
                for _ in range(args.warmup if steps == args.steps else 1):
                    t.train_step(images, labels)
                trainers[(p, phase)] = (t, images, labels, steps)
        for _ in range(args.rounds):
            rates["fp32"].append(mm_rate(torch.float32))
            rates["bf16"].append(mm_rate(torch.bfloat16, n=1024 if not slow_bf16 else 256, repeats=2))
            for key, (t, images, labels, steps) in trainers.items():
                start = time.perf_counter()
                for _ in range(steps):
                    t.train_step(images, labels)
                times.setdefault(key, []).append((time.perf_counter() - start) / steps)
        for t, *_ in trainers.values():
            t.close()

    fp32_rate = statistics.median(rates["fp32"])
    print(f"\ntorch.mm 1024x1024: fp32 {fp32_rate:.0f} GFLOP/s, bf16 {statistics.median(rates['bf16']):.1f} GFLOP/s")
    rows = []
    batch = next(iter(trainers.values()))[0].recipe.train.batch_size
    print(f"\n{'precision':<22} {'8 patches':>12} {'36 patches':>12} {'schedule':>12} {'img/s per GFLOP/s':>18}")
    for p in precisions:
        step = {phase: statistics.median(times[(p, phase)]) for phase in PHASES}
        mean_step = sum(w * step[phase] for phase, (_, w) in PHASES.items())
        ips = {phase: batch / s for phase, s in step.items()}
        row = {
            "precision": p,
            "resolved": resolve_precision(p).name,
            "img_per_s": ips,
            "schedule_img_per_s": batch / mean_step,
            "img_per_s_per_gflops_8_patches": ips["8 patches"] / fp32_rate,
            "img_per_s_per_gflops_schedule": batch / mean_step / fp32_rate,
            "step_ms": {k: 1e3 * v for k, v in step.items()},
        }
        rows.append(row)
        label = f"{p} -> {row['resolved']}" if p == "auto" else p
        print(
            f"{label:<22} {ips['8 patches']:12.0f} {ips['36 patches']:12.0f} {row['schedule_img_per_s']:12.0f} "
            f"{row['img_per_s_per_gflops_8_patches']:8.1f} / {row['img_per_s_per_gflops_schedule']:.1f}"
        )
    print("(img/s per GFLOP/s: in the 8-patch phase / over the schedule; of the fp32 torch.mm rate above)")
    write_results(
        args,
        rows,
        cpu=info,
        onednn_bf16=onednn_bf16,
        auto={"name": auto.name, "reason": auto.reason},
        mm_gflops={k: statistics.median(v) for k, v in rates.items()},
    )


if __name__ == "__main__":
    main()
