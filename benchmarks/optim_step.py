"""What an optimiser step costs on the demo's model: AdamW against Muon (optim.name=muon), with the
fused qkv weights orthogonalised whole or as q, k and v apart (optim.muon_split_qkv).

    python benchmarks/optim_step.py            # configs/fmnist_vit.yaml's model
    python benchmarks/optim_step.py --rounds 9 --steps 30

Times ``optimizer.step()`` alone (random gradients, no forward or backward) for each optimiser,
interleaved round by round so that both see the same moments of a shared machine, and reports
the median of the rounds and the ratio. The training step around it is what the demo's
throughput measures (benchmarks/RESULTS.md); this isolates the part Muon adds: the batched
Newton-Schulz iterations on the encoder's matrices.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="src/vitkit/configs/fmnist_vit.yaml")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default="benchmarks/out/optim_step.json")
    args = ap.parse_args()

    import vitkit
    from vitkit.cpu import cpu_info
    from vitkit.train import load_recipe
    from vitkit.train.optim import build_optimizer
    from vitkit.train.process import configure_process

    # training's process settings: without flushing denormals, the Newton-Schulz iteration's tiny
    # values take the CPU's slow path and Muon looks ~1.5x dearer than it is in a training run
    configure_process(torch.device("cpu"))
    recipe = load_recipe(args.config)
    model = vitkit.create_model(recipe.model.name, **recipe.model.overrides, num_classes=10)
    g = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 1e-2
    opts = {}
    variants = {"adamw": {"name": "adamw"}, "muon": {"name": "muon", "muon_split_qkv": False}}
    variants["muon-qkv-apart"] = {"name": "muon", "muon_split_qkv": True}  # optim.muon_split_qkv
    for name, changes in variants.items():
        cfg = type(recipe.optim)(**{**recipe.optim.__dict__, **changes})
        opts[name] = build_optimizer(model, cfg)
        for _ in range(3):  # state allocated, kernels warm
            opts[name].step()
    times: dict[str, list[float]] = {n: [] for n in opts}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, opt in opts.items():
                t = time.perf_counter()
                for _ in range(args.steps):
                    opt.step()
                times[name].append((time.perf_counter() - t) / args.steps * 1e3)
    med = {n: statistics.median(v) for n, v in times.items()}
    info = cpu_info()
    print(f"optimiser step, {recipe.model.name} {recipe.model.overrides}, {torch.get_num_threads()} threads")
    print(f"{'optimiser':<15} {'ms / step':>10} {'ratio':>7}")
    for n in opts:
        print(f"{n:<15} {med[n]:10.2f} {med[n] / med['adamw']:7.2f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "config": args.config,
        "threads": torch.get_num_threads(),
        "cpu": info,
        "torch": torch.__version__,
        "rounds_ms": times,
        "median_ms": med,
        "muon_over_adamw": med["muon"] / med["adamw"],
        "muon_qkv_apart_over_muon": med["muon-qkv-apart"] / med["muon"],
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
