"""Where the time of one vitkit step goes: the operator profile behind benchmarks/RESULTS.md's
"what bounds the rest".

    python benchmarks/op_profile.py --arch b16 --mode infer --precision bf16 --batch 8
    python benchmarks/op_profile.py --arch b16 --mode infer --precision int8 --batch 8 --compile
    python benchmarks/op_profile.py --arch fmnist --mode train --precision bf16 --batch 128

Builds the same model and step as ``benchmarks/peers.py`` (inference through vitkit's serving
path, training with autocast and AdamW), times it, then profiles ``--steps`` steps with
``torch.profiler``. Prints images/s, minor page faults a step, the share of the profiled time spent
in matrix multiplies, and the operators by self time per step; writes JSON.
Under ``--compile`` Inductor's generated kernels are profiled one by one.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import peers

# oneDNN's packed and int8 linears, aten's GEMMs, the patch convolution
MATMULS = ("mm", "addmm", "bmm", "_linear_pointwise", "qlinear_pointwise", "mkldnn_convolution", "linear")


def is_matmul(name: str) -> bool:
    return name.split("::")[-1] in MATMULS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(peers.ARCHS), default="b16")
    ap.add_argument("--mode", choices=["infer", "train"], default="infer")
    ap.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="bf16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--json", default="benchmarks/out/op_profile.json")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    if args.compile:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True  # each generated kernel by name
    torch.manual_seed(0)
    model = peers.build_vitkit(args.arch)
    step = peers.make_step(model, args.arch, args.mode, args.precision, args.batch, args.compile)
    for _ in range(3):
        step()
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / len(times)
    step_s = statistics.median(times)
    with torch.profiler.profile() as prof:
        for _ in range(args.steps):
            step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events)
    ops = sorted(
        (
            {
                "op": e.key,
                "calls_per_step": e.count / args.steps,
                "ms_per_step": e.self_cpu_time_total / 1e3 / args.steps,
                "share": e.self_cpu_time_total / total_us,
            }
            for e in events
        ),
        key=lambda r: -r["ms_per_step"],
    )
    matmul_share = sum(r["share"] for r in ops if is_matmul(r["op"]))
    print(f"vitkit {args.arch} {args.mode} {args.precision} batch {args.batch}{' compiled' if args.compile else ''}")
    print(f"  {args.batch / step_s:.2f} img/s (median step {1e3 * step_s:.1f} ms unprofiled)")
    print(f"  {faults:.0f} minor page faults a step (VITKIT_KEEP_FREED_MEMORY=0 shows glibc's defaults)")
    print(f"  matrix multiplies: {100 * matmul_share:.1f}% of the profiled time")
    print(f"\n{'operator':<60} {'ms/step':>9} {'share':>7} {'calls/step':>11}")
    for r in ops[: args.top]:
        print(f"{r['op'][:60]:<60} {r['ms_per_step']:9.2f} {100 * r['share']:6.1f}% {r['calls_per_step']:11.0f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "images_per_s": args.batch / step_s,
                "minor_faults_per_step": faults,
                "matmul_share": matmul_share,
                "ops": ops,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
