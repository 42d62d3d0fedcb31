"""``vitkit finetune``: fine-tune pretrained weights on your own images.

Without ``--config`` it fits a recipe to the weights and the data (:mod:`vitkit.train.autofit`:
the weights' resolution, a short schedule by the number of images, SGD with a head learning rate
and layer-wise decay) and says what it chose first; with ``--config`` it runs that recipe (the
paper's SGD fine-tuning: ``--config finetune_sgd``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from .common import count
from .train import fitted, recipe_arguments, train_from_args

HELP = "fine-tune pretrained weights on a folder or labels file (a recipe fitted to them, or --config)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="init_from", required=True, help="weights: .npz, timm/HF files, vitkit file or run")
    p.add_argument("--img-size", type=count(1, 16384), help="fine-tuning resolution (position embeddings are resized)")
    p.add_argument(
        "--adapter",
        choices=["lora", "dora"],
        help="train LoRA or DoRA adapters on the frozen weights (finetune.adapter; rank 8 on q and v by default)",
    )
    recipe_arguments(
        p,
        None,
        config_help="default: a recipe fitted to the weights and --data, said in the first lines",
        out_help="default: runs/finetune-<data name>",
    )


def _default_out(data: str) -> str:
    stem = Path(data.rstrip("/")).stem or "data"
    return str(Path("runs") / f"finetune-{re.sub(r'[^A-Za-z0-9_.-]+', '_', stem)}")


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    extra: list[tuple[str, Any]] = [("model.init_from", str(args.init_from))]
    if args.adapter:
        extra.append(("finetune.adapter.kind", args.adapter))
    if args.config is None:
        if not args.data:
            raise UsageError("finetune without --config fits its recipe to the data: give --data FOLDER or FILE")
        extra = _planned(args) + extra
        args.config = "finetune_sgd"
    elif args.img_size:
        extra.append(("model.overrides.img_size", args.img_size))
    if args.out is None:
        args.out = _default_out(args.data or "data")
        print(f"run folder: {args.out}")
    return train_from_args(args, extra)


def _planned(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The fitted recipe's keys, less those the command line sets itself; its lines printed."""
    from ..train.autofit import plan_finetune

    return fitted(plan_finetune(str(args.init_from), args.data, args.img_size), args)
