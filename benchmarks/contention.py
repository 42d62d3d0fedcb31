"""The demo's training throughput on a busy machine: alone, and beside one competing CPU-bound
torch process, under each threading setting; the ratio says how much of the machine's share a
setting keeps (fair share is 50% on a machine whose cores both processes want).

    python benchmarks/contention.py [--seconds 20] [--json benchmarks/out/contention.json]
    python benchmarks/contention.py --settings vitkit default passive   # some settings only

Each measurement is a fresh process training ``configs/fmnist_vit.yaml`` (``Trainer.train_step``
on its own batches) for ``--seconds``, in windows of ``--window`` steps: the median window and the
worst one (a collapse shows there, not in the mean). The competitor is another process doing
what a benchmark of a peer does, 2048x2048 fp32 matmuls with torch's default threads and OpenMP
settings, started before the measured process (which, as ``vitkit train`` does, looks at the
machine's load before torch starts) and stopped after it. Settings are environment variables of
the measured process only:

- vitkit: what ``vitkit train`` does unless told otherwise: OpenMP's wait policy chosen from the
  load at start (:func:`vitkit.runtime.choose_wait_policy`);
- default: libgomp's own default (spin a while, then sleep), pinned by ``VITKIT_WAIT=spin``;
- spin: libgomp spins at barriers for long (``OMP_WAIT_POLICY=ACTIVE``);
- passive: threads sleep at once at a barrier (``OMP_WAIT_POLICY=PASSIVE``);
- spin1k, spin10k, spin100k: ``GOMP_SPINCOUNT`` of that many iterations;
- threads1: one intra-op thread (``OMP_NUM_THREADS=1``).
Run it alone: it measures contention, so anything else running spoils it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS: dict[str, dict[str, str]] = {
    "vitkit": {},
    "default": {"VITKIT_WAIT": "spin"},
    "spin": {"OMP_WAIT_POLICY": "ACTIVE"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin100k": {"GOMP_SPINCOUNT": "100000"},
    "threads1": {"OMP_NUM_THREADS": "1"},
}
COMPETITOR = r"""
import torch, time
a = torch.randn(2048, 2048); b = torch.randn(2048, 2048)
print("ready", flush=True)
while True:
    a @ b
"""

WORKER = r"""
from vitkit.runtime import choose_wait_policy, wait_policy_line
choose_wait_policy()  # before torch starts, as vitkit train does
import json, sys, time, torch
from vitkit.train import load_recipe, parse_set
from vitkit.train.loop import Trainer
from vitkit.train.process import configure_process
import tempfile
config, seconds, window = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
recipe = load_recipe(config, parse_set(["log.plot=false", "log.tensorboard=false", "data.eval_split="]))
trainer = Trainer(recipe, tempfile.mkdtemp())
configure_process(trainer.device)  # as vitkit.train.train does
batches, epoch = [], 0
for b in trainer.train_ds.batches(recipe.train.batch_size, shuffle=True, seed=0, epoch=0, drop_last=True):
    batches.append(b)
    if len(batches) == 64:
        break
for images, labels in batches[:10]:  # warm up
    trainer.train_step(images, labels)
print("ready", flush=True)
sys.stdin.readline()  # the parent starts the clock (and the competitor) first
rates, end, i = [], time.perf_counter() + seconds, 0
while time.perf_counter() < end:
    start = time.perf_counter()
    for _ in range(window):
        images, labels = batches[i % len(batches)]
        trainer.train_step(images, labels)
        i += 1
    rates.append(window * recipe.train.batch_size / (time.perf_counter() - start))
print(json.dumps({"rates": rates, "threads": torch.get_num_threads(), "wait": wait_policy_line()}), flush=True)
"""


def _start(code: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def measure(setting: str, contended: bool, args: argparse.Namespace) -> dict:
    unset = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VITKIT_WAIT")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    rival = _start(COMPETITOR, [], base) if contended else None
    if rival is not None:
        time.sleep(1.0)  # the rival at full load before the measured process looks at the machine
    try:
        worker = _start(WORKER, [args.config, str(args.seconds), str(args.window)], base | SETTINGS[setting])
        out, _ = worker.communicate("go\n", timeout=args.seconds * 20 + 300)
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()
    rec = json.loads(out.strip().splitlines()[-1])
    rates = rec["rates"]
    return {
        "setting": setting,
        "contended": contended,
        "median": statistics.median(rates),
        "worst": min(rates),
        "windows": len(rates),
        "threads": rec["threads"],
        "wait": rec.get("wait"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="src/vitkit/configs/fmnist_vit.yaml")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of training per measurement")
    ap.add_argument("--window", type=int, default=10, help="steps per timed window")
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--json", default="benchmarks/out/contention.json")
    args = ap.parse_args()
    rows = []
    for setting in args.settings:
        for contended in (False, True):
            rows.append(measure(setting, contended, args))
            r = rows[-1]
            mode = "contended" if contended else "alone"
            print(f"  {setting:<9} {mode:<9} median {r['median']:7.0f} img/s, worst {r['worst']:7.0f}", flush=True)
    alone = {r["setting"]: r["median"] for r in rows if not r["contended"]}
    best_alone = max(alone.values())
    print(f"\n{'setting':<10} {'alone':>8} {'vs best':>8} {'contended':>10} {'worst window':>13} {'share kept':>11}")
    for s in args.settings:
        a = next(r for r in rows if r["setting"] == s and not r["contended"])
        c = next(r for r in rows if r["setting"] == s and r["contended"])
        c["share_kept"] = c["median"] / a["median"]
        c["share_of_best_alone"] = c["median"] / best_alone
        print(
            f"{s:<10} {a['median']:8.0f} {a['median'] / best_alone:8.2f} {c['median']:10.0f} {c['worst']:13.0f} "
            f"{c['share_kept']:10.0%}"
        )
    from vitkit.cpu import cpu_info

    meta = {"cpu": cpu_info(), "python": platform.python_version(), "command": " ".join(sys.argv)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
