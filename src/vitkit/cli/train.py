"""``vitkit train``: train a model from a recipe; the same command again resumes the run."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .common import count

HELP = "train a model from a recipe (resumes an existing --out)"

# command-line flag -> the recipe key it sets
FLAG_KEYS = {
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
    "naflex": "data.naflex.max_tokens",
}


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


class TqdmProgress:
    """A progress bar on stderr, on the main process only (``vitkit.train.Progress``)."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.quiet = not _is_main_process()

    def start(self, total: int, initial: int) -> None:
        from tqdm import tqdm

        if not self.quiet:
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


def recipe_arguments(
    p: argparse.ArgumentParser, default_config: str | None, config_help: str = "", out_help: str = ""
) -> None:
    """The arguments train and finetune share: the recipe, the run folder, and common overrides.
    ``config_help`` replaces the default of ``--config`` in its help; ``out_help`` makes ``--out``
    optional, saying what it defaults to."""
    # the shipped recipes (vitkit.train.config.CONFIG_DIR, read here without importing torch for --help)
    shipped = ", ".join(sorted(q.stem for q in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")))
    p.add_argument(
        "--config",
        default=default_config,
        required=default_config is None and not config_help,
        help=f"recipe YAML, or the name of a shipped one: {shipped} ({config_help or 'default: %(default)s'})",
    )
    resumes = "run folder (re-running with the same folder resumes)"
    p.add_argument("--out", required=not out_help, help=f"{resumes}; {out_help}" if out_help else resumes)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe key, e.g. train.steps=100")
    p.add_argument("--data", help="fashion-mnist, mnist, cifar10, cifar100, synthetic, a folder or shard pattern")
    for flag in ("steps", "batch-size", "accum-steps", "eval-every", "checkpoint-every", "log-every", "seed"):
        p.add_argument(f"--{flag}", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        help="auto: bf16 where this device computes it natively, else fp32; bf16: autocast, or the recipe's bf16 "
        "weights; fp32: neither",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--naflex",
        type=count(1, 16384),
        metavar="N",
        help="NaFlex: train and evaluate on each image at its own aspect ratio, in at most N patches "
        "(data.naflex.max_tokens)",
    )
    p.add_argument(
        "--plan", action="store_true", help="print the run's plan (every derived value, every check) and train nothing"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    recipe_arguments(
        p,
        None,
        config_help="default: fmnist_vit, or with --data FOLDER or a labels file a recipe fitted to it, said first",
    )


def flag_sets(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The recipe keys the command-line flags set (``--steps``, ``--lr``...), as (key, value)."""
    return [(key, getattr(args, a)) for a, key in FLAG_KEYS.items() if getattr(args, a, None) is not None]


def train_from_args(args: argparse.Namespace, extra_sets: list[tuple[str, Any]]) -> int:
    """Load the recipe with ``--set``, the command's own settings and the flags (in that order of
    precedence, last wins), train it, and print the outcome."""
    from ..train import find_recipe, load_recipe, parse_set, train

    sets = parse_set(args.set or []) + extra_sets
    sets += flag_sets(args)
    if args.precision == "fp32":  # fp32 throughout: no bf16 copy of the weights (the demo recipe has one)
        sets.append(("train.bf16_weights", False))
    if args.compile:
        sets.append(("train.compile", True))
    recipe = load_recipe(find_recipe(args.config), sets)
    if getattr(args, "plan", False):
        from ..train.plan import RunPlan

        for line in RunPlan.from_recipe(recipe).describe():
            print(line)
        print(f"run folder: {args.out} (nothing trained: --plan)")
        return 0
    result = train(recipe, args.out, TqdmProgress())
    if not _is_main_process():
        return 0
    if result.final_top1 is None:
        print(f"trained {result.step} steps into {result.out_dir}")
        return 0
    print_outcome(result, recipe.data.eval_split)
    return 0


def print_outcome(result: Any, split: str) -> None:
    """The end of a run for a human: the per-epoch table, the best epoch, the per-class scores,
    the warnings and the files of the run folder (``vitkit.train.RunResult``)."""
    from ..train.summary import format_epoch_table

    report = result.report
    score = "mAP" if result.multilabel else "top-1"
    if report is not None and report.epochs:
        print(format_epoch_table(report.epochs, report.best_epoch))
    if result.resumed_from is not None and result.resumed_from >= result.step:
        print(f"run: {result.out_dir}  steps: {result.step}  (already finished: nothing trained)")
    else:
        print(
            f"run: {result.out_dir}  steps: {result.step}  training time: {result.train_seconds:.0f} s  "
            f"({result.images_per_second:.0f} img/s)"
        )
    if result.best_top1 is not None:
        epoch = f"epoch {report.best_epoch}, " if report is not None and report.best_epoch else ""
        print(f"best {split} {score}: {100 * result.best_top1:.2f}% ({epoch}step {result.best_step})")
    print(f"{split} {score} at the end: {100 * result.final_top1:.2f}%")
    if report is None:
        return
    if report.multilabel:
        m = report.multilabel
        print(
            f"mAP of the best weights: macro {100 * m['map_macro']:.2f}%, micro {100 * m['map_micro']:.2f}% "
            f"(each class scored by its training frequency: {100 * m['baseline_map_macro']:.2f}%, "
            f"{100 * m['baseline_map_micro']:.2f}%)"
        )
    if report.per_class:
        print(_per_class_table(report.per_class))
    for text in report.warnings:
        print(f"warning: {text}")
    print("wrote " + ", ".join(p.name for p in report.files) + f" in {result.out_dir}")


def _per_class_table(rows: list[dict[str, Any]], most: int = 30) -> str:
    """Precision, recall and F1 a class (the best weights on the validation split), worst F1 first."""
    ap = "ap" in rows[0]
    lines = [f"{'class':<20} {'precision':>9} {'recall':>7} {'F1':>7} {'images':>6}" + (f" {'AP':>7}" if ap else "")]
    for r in sorted(rows, key=lambda r: r["f1"])[:most]:
        extra = "" if not ap else ("       -" if r["ap"] is None else f" {100 * r['ap']:6.2f}%")
        lines.append(
            f"{r['class'][:20]:<20} {100 * r['precision']:8.2f}% {100 * r['recall']:6.2f}% {100 * r['f1']:6.2f}% "
            f"{r['support']:>6}{extra}"
        )
    if len(rows) > most:
        lines.append(f"... and {len(rows) - most} more classes (summary.json)")
    return "\n".join(lines)


def fitted(plan: Any, args: argparse.Namespace) -> list[tuple[str, Any]]:
    """A fitted recipe's keys, less those the command line sets itself; its lines printed, and a
    line for each key the command line sets instead, so that what is printed is what runs.

    Args:
        plan: a :class:`~vitkit.train.autofit.FinetunePlan`.
        args: the command's arguments (``--set`` and the flags).

    Returns:
        The (key, value) pairs to apply under the command line's own.
    """
    from ..train.config import parse_set

    given = dict(parse_set(args.set or []) + flag_sets(args))
    for line in plan.lines:
        print(line)
    kept = []
    for key, value in plan.sets:
        over = [g for g in given if g == key or g.startswith(key + ".")]
        if over:
            print("; ".join(f"{g}={given[g]} (the command line's, not the fitted {value})" for g in over))
        else:
            kept.append((key, value))
    return kept


def run(args: argparse.Namespace) -> int:
    if args.config is None:
        args.config = "fmnist_vit"
        if args.data and _own_data(args.data):
            from ..train.autofit import plan_scratch

            print(f"{args.data}: no --config, so a recipe fitted to it:")
            return train_from_args(args, fitted(plan_scratch(args.data), args))
    return train_from_args(args, [])


def _own_data(data: str) -> bool:
    """Whether ``--data`` is a folder or a labels file (not a named data set or shards)."""
    from ..data import is_labels_file

    return Path(data).is_dir() or is_labels_file(data)
