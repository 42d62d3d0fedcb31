"""What NaFlex costs a training step: a batch of images at their own aspect ratios (each fitted to
at most ``--max-tokens`` patches, padded to the longest, keys masked) against a batch of squares
at the full budget, the model's plain path.

    python benchmarks/naflex_cost.py                       # ViT-S/16, 196 patches an image, batch 16
    python benchmarks/naflex_cost.py --model vit_b16 --batch 8 --json benchmarks/results/naflex_cost.json

A training step is forward, backward and an SGD update. The NaFlex batch cycles through aspect
ratios from 1:3 to 3:1, so its images hold fewer real patches than the squares (a grid of whole
patches rarely fills the budget exactly) and it carries padding; the comparison is per real
patch: (NaFlex seconds / its real patches) / (square seconds / its patches). A third variant runs
the squares through the NaFlex path (the same shapes, nothing padded), which isolates what the
mask and the per-image position rows cost. Preparing a batch (resizing each image to its grid
and cutting it, against resizing a square batch) is timed apart. Rounds take the variants in
turns, so that a slow moment of a shared machine hits all; the medians are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

# (height, width) proportions the NaFlex batch cycles through
ASPECTS = [(1, 3), (1, 2), (2, 3), (1, 1), (3, 2), (2, 1), (3, 1)]


def _images(batch: int, side: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(batch):
        h, w = ASPECTS[i % len(ASPECTS)]
        scale = side / max(h, w)
        out.append(torch.rand(3, max(16, round(h * scale * 1.5)), max(16, round(w * scale * 1.5)), generator=g))
    return out


def _step(model, opt, x, y) -> float:
    import torch

    start = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit_s16")
    ap.add_argument("--max-tokens", type=int, default=196)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps a variant a round (after one untimed)")
    ap.add_argument("--json", default="benchmarks/out/naflex_cost.json")
    args = ap.parse_args()

    import torch

    import vitkit
    from vitkit.cpu import cpu_info
    from vitkit.data.transforms import resize
    from vitkit.models.naflex import collate, fit_grid

    torch.manual_seed(0)
    model = vitkit.create_model(args.model, num_classes=10).train()
    patch = int(model.cfg.patch_size[0])
    side = round(args.max_tokens**0.5) * patch  # the square at the full budget
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    raw = _images(args.batch, side, seed=1)
    labels = torch.arange(args.batch) % 10

    def prepare_naflex():
        return collate(raw, patch, args.max_tokens)  # each image resized to its grid, cut, padded

    def prepare_square():
        return torch.cat([resize(im[None], (side, side)) for im in raw])

    naflex = prepare_naflex()
    square = prepare_square()
    as_naflex = collate(list(square), patch, args.max_tokens)  # the squares through the NaFlex path
    grids = [fit_grid(im.shape[-2], im.shape[-1], patch, args.max_tokens) for im in raw]
    real = naflex.real_tokens
    square_tokens = args.batch * (side // patch) ** 2
    variants = {"square": square, "naflex": naflex, "squares_as_naflex": as_naflex}
    times: dict[str, list[float]] = {k: [] for k in variants}
    prep: dict[str, list[float]] = {"naflex": [], "square": []}
    for r in range(args.rounds):
        for name, x in variants.items():
            _step(model, opt, x, labels)  # untimed: the allocator settles on this shape
            times[name].append(statistics.median(_step(model, opt, x, labels) for _ in range(args.steps)))
        for name, fn in (("naflex", prepare_naflex), ("square", prepare_square)):
            start = time.perf_counter()
            fn()
            prep[name].append(time.perf_counter() - start)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    per_token = (med["naflex"] / real) / (med["square"] / square_tokens)
    mask_cost = med["squares_as_naflex"] / med["square"]
    out = {
        "machine": cpu_info()["model"],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "max_tokens": args.max_tokens,
        "batch": args.batch,
        "grids": grids,
        "real_tokens": real,
        "padded_tokens": naflex.valid.numel(),
        "square_tokens": square_tokens,
        "step_seconds": times,
        "step_median": med,
        "prepare_seconds": {k: statistics.median(v) for k, v in prep.items()},
        "per_token_ratio": per_token,
        "mask_ratio": mask_cost,
    }
    print(f"\n{args.model}, batch {args.batch}, at most {args.max_tokens} patches an image; {out['machine']}")
    print("| step | patches (real / computed) | seconds | seconds per 1,000 real patches |")
    print("|---|---|---|---|")
    rows = [
        ("square", square_tokens, square_tokens, med["square"]),
        ("NaFlex, mixed aspect ratios", real, naflex.valid.numel(), med["naflex"]),
        ("squares through the NaFlex path", square_tokens, square_tokens, med["squares_as_naflex"]),
    ]
    for name, n_real, n_all, s in rows:
        print(f"| {name} | {n_real} / {n_all} | {s:.3f} | {1000 * s / n_real:.4f} |")
    print(
        f"\nNaFlex / square per real patch: {per_token:.3f} (target <= 1.2); mask and positions alone: {mask_cost:.3f}"
    )
    prep_s = out["prepare_seconds"]
    print(f"preparing a batch: NaFlex {prep_s['naflex']:.4f} s, square {prep_s['square']:.4f} s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
