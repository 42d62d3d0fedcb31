"""Peak training memory with and without gradient checkpointing of the encoder blocks.

Each mode runs in a fresh Python process (so that one mode's freed memory cannot hide the other's
peak): build the model and AdamW (vitkit's optimiser), then take ``--steps`` full training steps
(forward, cross-entropy, backward, gradient clipping, optimiser step) on a random batch. Measured:
- CUDA: ``torch.cuda.max_memory_allocated`` above what was allocated before the first step;
- CPU: the process's peak resident set (``getrusage`` ``ru_maxrss``) above its resident set
  before the first step, with glibc's default allocator settings (``vitkit train`` keeps freed
  memory mapped on CPUs, which adds what the allocator retains).
Both count the activations kept for the backward pass, the gradients and AdamW's two moments (made
at the first step); the weights themselves are in the baseline. Not a timing benchmark.

Usage: python benchmarks/memory.py [--model vit_b16] [--batch 32] [--img-size 224] [--device auto]
[--precision fp32] [--steps 2] [--threads N] [--json benchmarks/out/memory.json]. The issue's
measurement is the default (ViT-B/16, batch 32, 224 px); a quick check of the script:
``--model vit_ti16 --batch 4``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

MODES = {"plain": False, "checkpointed": True}


def _rss_bytes() -> int:
    """The resident set of this process now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(args: argparse.Namespace, checkpointed: bool) -> dict:
    """One mode, in this process: the peak memory of ``args.steps`` training steps above the
    memory held before the first."""
    from vitkit import create_model
    from vitkit.eval.features import autocast
    from vitkit.train.config import OptimSection
    from vitkit.train.dist import resolve_device
    from vitkit.train.optim import build_optimizer

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    model = create_model(args.model, img_size=args.img_size, num_classes=1000).to(device).train()
    model.set_attention_impl(args.attention)
    model.set_grad_checkpointing(checkpointed)
    optimizer = build_optimizer(model, OptimSection(lr=1e-4, weight_decay=0.05), fused=device.type == "cuda")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, model.cfg.in_chans, args.img_size, args.img_size, generator=g).to(device)
    y = torch.randint(0, 1000, (args.batch,), generator=g).to(device)
    params = sum(p.numel() * p.element_size() for p in model.parameters())

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        base = _rss_bytes()
    for _ in range(args.steps):
        with autocast(device, args.precision):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak, how = torch.cuda.max_memory_allocated(device) - base, "torch.cuda.max_memory_allocated"
    else:
        peak, how = _peak_rss_bytes() - base, "peak RSS (ru_maxrss) above the RSS before the first step"
    return {
        "peak_bytes": int(peak),
        "peak_mib": round(peak / 2**20, 1),
        "baseline_mib": round(base / 2**20, 1),
        "weights_mib": round(params / 2**20, 1),
        "final_loss": float(loss.item()),
        "measured": how,
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--attention", default="auto", help="the attention path (Attention's docstring)")
    ap.add_argument("--steps", type=int, default=2, help="training steps per mode (AdamW state: step 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", default="benchmarks/out/memory.json")
    ap.add_argument("--child", choices=tuple(MODES), help=argparse.SUPPRESS)  # one mode, printed as JSON
    args = ap.parse_args()

    if args.child:
        print(json.dumps(measure(args, MODES[args.child])))
        return
    passed = [f"--model={args.model}", f"--batch={args.batch}", f"--img-size={args.img_size}"]
    passed += [f"--device={args.device}", f"--precision={args.precision}", f"--attention={args.attention}"]
    passed += [f"--steps={args.steps}", f"--threads={args.threads}"]
    results = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, *passed, "--child", mode]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise SystemExit(f"{mode}: the measuring process failed ({tail})")
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])

    plain, ckpt = results["plain"]["peak_bytes"], results["checkpointed"]["peak_bytes"]
    cut = 1 - ckpt / plain if plain > 0 else None
    print(f"{args.model}, batch {args.batch}, {args.img_size} px, {args.precision}, {results['plain']['device']}")
    print(f"  measured: {results['plain']['measured']}; weights {results['plain']['weights_mib']} MiB")
    header = f"{'mode':<14} {'peak MiB':>10} {'final loss':>11}"
    print(header)
    print("-" * len(header))
    for mode, r in results.items():
        print(f"{mode:<14} {r['peak_mib']:>10.1f} {r['final_loss']:>11.4f}")
    if cut is not None:
        print(f"checkpointing cuts the peak by {100 * cut:.1f}% ({plain / max(ckpt, 1):.2f}x less)")

    from vitkit.files import write_json

    out_path = Path(args.json)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        out_path,
        {
            "model": args.model,
            "batch": args.batch,
            "img_size": args.img_size,
            "precision": args.precision,
            "attention": args.attention,
            "steps": args.steps,
            "results": results,
            "peak_cut_fraction": None if cut is None else round(cut, 4),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
    )
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
