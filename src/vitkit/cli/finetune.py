"""``vitkit finetune``: fine-tune pretrained weights (the paper's SGD recipe by default)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import count
from .train import recipe_arguments, train_from_args

HELP = "fine-tune pretrained weights with the paper's SGD recipe"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="init_from", required=True, help="weights: .npz, timm/HF files, vitkit file or run")
    p.add_argument("--img-size", type=count(1, 16384), help="fine-tuning resolution (position embeddings are resized)")
    recipe_arguments(p, "finetune_sgd")


def run(args: argparse.Namespace) -> int:
    extra: list[tuple[str, Any]] = [("model.init_from", str(args.init_from))]
    if args.img_size:
        extra.append(("model.overrides.img_size", args.img_size))
    return train_from_args(args, extra)
