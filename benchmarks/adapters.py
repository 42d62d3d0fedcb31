"""What LoRA buys on a CPU against a full fine-tune: speed, memory and accuracy, in one run.

Speed and memory (``--speed``): a training step (forward, cross-entropy, backward, AdamW over
what trains) of ViT-S/16 and ViT-B/16 at 224 px on random images, fully fine-tuned and with LoRA
(rank 8 on q and v, the head trained: ``vitkit finetune --adapter lora``'s default), each in a
fresh process per round so that one's freed memory cannot hide the other's peak; the rounds
alternate the two, and each reports images a second (median of its timed steps) and the
process's peak resident memory above what it held before the first step (activations kept for
the backward, gradients, AdamW's moments).

Accuracy (``--accuracy BASE``): the transfer task of a trained model: ``vitkit finetune --from
BASE --data digits`` (scikit-learn's handwritten digits, a task the Fashion-MNIST demo model never
saw) with and without ``--adapter lora``, each with finetune's own recipe for the task, over
``--seeds`` seeds; test top-1 of each run's best weights on the digits' test split, and the paired
difference (LoRA minus full) with its 95% t interval over the seeds.

    python benchmarks/adapters.py --speed                          # ViT-S/16 and B/16 at 224 px
    python benchmarks/adapters.py --accuracy runs/demo --seeds 5   # the demo model as the base
    python benchmarks/adapters.py --speed --tiny                   # a check that it runs (seconds)

It prints a table and writes JSON (``--json``). Run it alone: it times the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, resource, statistics, sys, time
import torch
import vitkit
from vitkit.models.adapters import adapter_spec_from_dict, apply_adapters
from vitkit.precision import as_precision
arch, method = sys.argv[1], sys.argv[2]
batch, img, steps, warmup = (int(v) for v in sys.argv[3:7])
overrides = {"img_size": img, "num_classes": 10}
if arch == "tiny":
    arch, overrides = "vit_ti16", {**overrides, "depth": 2, "width": 64, "num_heads": 2, "mlp_dim": 128}
torch.manual_seed(0)
model = vitkit.create_model(arch, **overrides)
if method == "lora":
    apply_adapters(model, adapter_spec_from_dict({"kind": "lora", "rank": 8, "targets": ["q", "v"]}), base_name=arch)
trainable = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(trainable, lr=1e-4)
x, y = torch.randn(batch, 3, img, img), torch.randint(0, 10, (batch,))
precision = as_precision("auto")
model.train()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def step():
    with precision.autocast("cpu"):
        out = model(x)
    torch.nn.functional.cross_entropy(out.float(), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(warmup):
    step()
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({
    "images_per_s": batch / statistics.median(times),
    "peak_mb": (peak - base) / 1024, "trainable": sum(p.numel() for p in trainable),
    "params": sum(p.numel() for p in model.parameters()), "precision": precision.name,
    "threads": torch.get_num_threads(),
}))
"""


def speed(args: argparse.Namespace) -> list[dict]:
    """Images a second and peak memory of each model and method, rounds alternating the methods."""
    archs = [("tiny", 4, 64)] if args.tiny else [("vit_s16", args.batch_s, 224), ("vit_b16", args.batch_b, 224)]
    rows = []
    for arch, batch, img in archs:
        runs: dict[str, list[dict]] = {"full": [], "lora": []}
        for _ in range(args.rounds):
            for method in ("full", "lora"):
                cmd = [sys.executable, "-c", WORKER, arch, method, str(batch), str(img), str(args.steps), "2"]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for method, got in runs.items():
            rows.append({
                "model": arch, "method": method, "batch": batch, "img_size": img,
                "images_per_s": statistics.median(r["images_per_s"] for r in got),
                "images_per_s_rounds": [r["images_per_s"] for r in got],
                "peak_mb": statistics.median(r["peak_mb"] for r in got),
                "trainable": got[0]["trainable"], "params": got[0]["params"], "precision": got[0]["precision"],
                "threads": got[0]["threads"],
            })  # fmt: skip
    return rows


def _finetune(base: str, seed: int, adapter: bool, out: Path, steps: int | None) -> float:
    """One ``vitkit finetune`` of ``base`` on the digits, and its best weights' test top-1."""
    cmd = [sys.executable, "-m", "vitkit", "finetune", "--from", base, "--data", "digits", "--out", str(out)]
    cmd += (
        ["--seed", str(seed)] + (["--adapter", "lora"] if adapter else []) + (["--steps", str(steps)] if steps else [])
    )
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    import vitkit
    from vitkit.data import build_dataset
    from vitkit.eval import evaluate

    model = vitkit.load_pretrained(out / "best.safetensors")
    return float(evaluate(model, build_dataset("digits", "test"), precision="auto")["top1"])


def accuracy(args: argparse.Namespace) -> dict:
    """Test top-1 of full and LoRA fine-tunes of ``args.accuracy`` on the digits, seed by seed."""
    from vitkit.reproduce.core.stats import paired_difference

    full, lora = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            full.append(_finetune(args.accuracy, seed, False, Path(tmp) / f"full{seed}", args.ft_steps))
            lora.append(_finetune(args.accuracy, seed, True, Path(tmp) / f"lora{seed}", args.ft_steps))
            print(f"  seed {seed}: full {100 * full[-1]:.2f}%, lora {100 * lora[-1]:.2f}%", flush=True)
    diff = paired_difference(lora, full)
    return {
        "base": args.accuracy, "task": "digits", "seeds": args.seeds,
        "full_top1": full, "lora_top1": lora,
        "lora_minus_full": None if diff is None else diff.scaled(100).to_dict(),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speed", action="store_true", help="speed and memory of ViT-S/16 and B/16")
    ap.add_argument("--accuracy", metavar="BASE", help="a trained run or weights to fine-tune on the digits")
    ap.add_argument("--tiny", action="store_true", help="a tiny model instead of S/16 and B/16: a check that it runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps a round, after 2 untimed")
    ap.add_argument("--batch-s", type=int, default=16)
    ap.add_argument("--batch-b", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--ft-steps", type=int, default=None, help="fine-tuning steps (default: finetune's own)")
    ap.add_argument("--json", default="benchmarks/out/adapters.json")
    args = ap.parse_args()
    if not (args.speed or args.accuracy):
        ap.error("ask for --speed, --accuracy BASE or both")
    from vitkit.cpu import cpu_info

    result: dict = {"meta": {"cpu": cpu_info(), "python": platform.python_version(), "command": " ".join(sys.argv)}}
    if args.speed:
        result["speed"] = rows = speed(args)
        print("| model | method | trainable parameters | images/s | peak memory (MiB) | vs full |")
        print("|---|---|---:|---:|---:|---:|")
        for r in rows:
            ref = next(x for x in rows if x["model"] == r["model"] and x["method"] == "full")
            print(
                f"| {r['model']} (batch {r['batch']}, {r['precision']}) | {r['method']} | {r['trainable']:,} | "
                f"{r['images_per_s']:.2f} | {r['peak_mb']:.0f} | {r['images_per_s'] / ref['images_per_s']:.2f}x |"
            )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")  # the speed kept if accuracy fails
    if args.accuracy:
        result["accuracy"] = acc = accuracy(args)
        d = acc["lora_minus_full"]
        print(f"digits test top-1 over {acc['seeds']} seeds: full {100 * statistics.mean(acc['full_top1']):.2f}%, "
              f"LoRA {100 * statistics.mean(acc['lora_top1']):.2f}%")  # fmt: skip
        if d is not None:
            print(f"LoRA minus full: {d['estimate']:+.2f} points, 95% interval [{d['low']:+.2f}, {d['high']:+.2f}]")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
