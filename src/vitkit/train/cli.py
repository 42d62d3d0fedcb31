"""``vitkit train`` and ``vitkit finetune``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..cli import _EXTRA_PARSERS, command
from .config import RecipeError, load_recipe, parse_set
from .loop import Progress, train

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


class TqdmProgress(Progress):
    """A progress bar on stderr, on the main process only."""

    def __init__(self) -> None:
        self.bar = None
        self.quiet = not _is_main_process()

    def start(self, total: int, initial: int) -> None:
        from tqdm import tqdm

        if self.quiet:
            return
        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)

    def update(self, steps: int, **postfix: Any) -> None:
        if self.bar is None:
            return
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)
        if steps:
            self.bar.update(steps)

    def message(self, text: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def find_config(name: str) -> Path:
    """A recipe path, or the name of one shipped with vitkit (``fmnist_vit`` or ``fmnist_vit.yaml``)."""
    p = Path(name)
    if p.is_file():
        return p
    for cand in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if cand.is_file():
            return cand
    shipped = ", ".join(sorted(q.stem for q in CONFIG_DIR.glob("*.yaml")))
    raise RecipeError(f"recipe {name!r} not found (a YAML path, or one of: {shipped})")


def _flag_sets(args: argparse.Namespace) -> list[tuple[str, Any]]:
    flags = {
        "steps": "train.steps",
        "batch_size": "train.batch_size",
        "lr": "optim.lr",
        "eval_every": "log.eval_every",
        "checkpoint_every": "log.checkpoint_every",
        "log_every": "log.log_every",
        "seed": "seed",
        "device": "train.device",
        "precision": "train.precision",
        "data": "data.name",
        "accum_steps": "train.accum_steps",
    }
    sets = [(key, getattr(args, a)) for a, key in flags.items() if getattr(args, a, None) is not None]
    if args.compile:
        sets.append(("train.compile", True))
    return sets


def _run(args: argparse.Namespace, extra_sets: list[tuple[str, Any]]) -> int:
    sets = parse_set(args.set or []) + extra_sets + _flag_sets(args)
    recipe = load_recipe(find_config(args.config), sets)
    result = train(recipe, args.out, TqdmProgress())
    if not _is_main_process():
        return 0
    if result.final_top1 is None:
        print(f"trained {result.step} steps into {result.out_dir}")
        return 0
    print(
        f"run: {result.out_dir}  steps: {result.step}  training time: {result.train_seconds:.0f} s  "
        f"({result.images_per_second:.0f} img/s)"
    )
    if result.best_top1 is not None:
        print(f"best {recipe.data.eval_split} top-1: {100 * result.best_top1:.2f}% (step {result.best_step})")
    print(f"{recipe.data.eval_split} accuracy: {100 * result.final_top1:.2f}%")
    return 0


@command("train")
def cmd_train(args: argparse.Namespace) -> int:
    return _run(args, [])


@command("finetune")
def cmd_finetune(args: argparse.Namespace) -> int:
    extra: list[tuple[str, Any]] = [("model.init_from", str(args.init_from))]
    if args.img_size:
        extra.append(("model.overrides.img_size", args.img_size))
    return _run(args, extra)


def _common(p: argparse.ArgumentParser, default_config: str | None) -> None:
    p.add_argument("--config", default=default_config, required=default_config is None, help="recipe YAML")
    p.add_argument("--out", required=True, help="run folder (re-running with the same folder resumes)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe key, e.g. train.steps=100")
    p.add_argument("--data", help="fashion-mnist, mnist, cifar10, cifar100, synthetic, a folder or shard pattern")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--accum-steps", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--log-every", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--precision", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a recipe (resumes an existing --out)")
    _common(p, "fmnist_vit")
    p = sub.add_parser("finetune", help="fine-tune pretrained weights with the paper's SGD recipe")
    p.add_argument("--from", dest="init_from", required=True, help="weights: .npz, timm/HF files, vitkit file or run")
    p.add_argument("--img-size", type=int, help="fine-tuning resolution (position embeddings are resized)")
    _common(p, "finetune_sgd")


_EXTRA_PARSERS.append(add_parsers)
