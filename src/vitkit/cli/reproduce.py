"""``vitkit reproduce``: rerun the paper's experiments on this machine and write a report."""

from __future__ import annotations

import argparse
import shlex
import sys

from ..reproduce.names import BUDGETS, EXPERIMENTS
from .common import count, count_or_auto, real

HELP = "rerun the paper's experiments (data scaling, compute, position embeddings, ...) and write a report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "experiments", nargs="*", metavar="EXPERIMENT", help=f"any of {', '.join(EXPERIMENTS)} (default: all)"
    )
    p.add_argument("--out", required=True, help="folder for the runs, report.md, report.json and the figures")
    p.add_argument(
        "--data", default="fashion-mnist", help="training data, as for vitkit train (default: fashion-mnist)"
    )
    p.add_argument(
        "--budget",
        choices=BUDGETS,
        default="desktop",
        help="smoke: under 2 minutes; desktop: the study, 4-7 hours on 2 CPU cores (make reproduce splits it into "
        "four calls); full: for a GPU",
    )
    p.add_argument(
        "--seeds", type=count(1, 100), help="seeds of the experiments that compare across seeds (default: the budget's)"
    )
    p.add_argument(
        "--jobs",
        type=count_or_auto(1, 256),
        default="auto",
        help="training runs at once, each with its share of the CPU cores; auto (default): one a core for the "
        "desktop budget on a CPU, else 1",
    )
    p.add_argument(
        "--publish",
        metavar="DIR",
        help="also copy report.md, report.json and the figures into DIR (e.g. docs/reproduce)",
    )
    p.add_argument(
        "--stop-after",
        type=real(above=0),
        metavar="MINUTES",
        help="stop after MINUTES as Ctrl-C does (finished runs kept, the running ones resume) and exit 0; "
        "the same command again goes on",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the runs and training FLOPs of each experiment (and GPU-hours at a stated rate); train nothing",
    )


def run(args: argparse.Namespace) -> int:
    from ..reproduce import reproduce

    command = (
        "vitkit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if sys.argv[1:2] == ["reproduce"]
        else "vitkit reproduce"
    )
    if args.plan:
        print_plan(args)
        return 0
    try:
        reproduce(
            args.experiments,
            out=args.out,
            data=args.data,
            budget=args.budget,
            seeds=args.seeds,
            jobs=args.jobs,
            report=lambda line: print(line, flush=True),
            command=command,
            publish=args.publish,
            stop_after=args.stop_after,
        )
    except KeyboardInterrupt as e:
        print(f"vitkit reproduce: {interrupted_line(e, args.out, command)}", file=sys.stderr, flush=True)
        return 0 if getattr(e, "limit_minutes", None) is not None else 130
    return 0


def print_plan(args: argparse.Namespace) -> None:
    """Print what ``vitkit reproduce`` would train with these arguments (``--plan``).

    Args:
        args: the parsed command line.
    """
    from ..reproduce import ASSUMED_GPU_FLOPS, plan

    p = plan(args.experiments, out=args.out, data=args.data, budget=args.budget, seeds=args.seeds)
    print(f"{'experiment':<14} {'runs':>5} {'training PFLOPs':>16}")
    for name, e in p["experiments"].items():
        print(f"{name:<14} {e['runs']:>5} {e['train_flops'] / 1e15:>16,.2f}")
    print(
        f"{'suite':<14} {p['runs']:>5} {p['train_flops'] / 1e15:>16,.2f}   (runs shared between experiments once; "
        f"{p['finished']} already finished in {args.out})"
    )
    if p["gpu_hours"] < 0.1:
        return  # a CPU-sized suite: GPU-hours say nothing
    print(
        f"at a sustained {ASSUMED_GPU_FLOPS / 1e12:.0f} TFLOP/s (40% of one H100's bf16 peak; reading the images "
        f"often bounds lower): {p['gpu_hours']:,.1f} GPU-hours of training, before scoring"
    )


def interrupted_line(e: KeyboardInterrupt, out: str, command: str) -> str:
    """The one line a stopped suite ends with: what stopped it, what is kept, how to resume.

    Args:
        e: the interruption (:class:`vitkit.reproduce.core.signals.Interrupted` when a signal or
            ``--stop-after`` stopped the runs; a plain ``KeyboardInterrupt`` otherwise).
        out: the suite's folder.
        command: the command line that resumes the suite (the one that was run).

    Returns:
        The line, without the ``vitkit reproduce:`` prefix.
    """
    name = getattr(e, "signal_name", "SIGINT")
    limit = getattr(e, "limit_minutes", None)
    finished, total = getattr(e, "finished", None), getattr(e, "total", None)
    kept = (
        f"{finished} of {total} runs are finished and kept in {out}"
        if finished is not None and total is not None
        else f"finished runs are kept in {out}"
    )
    if limit is not None:
        return f"stopped after {limit:g} min (--stop-after); {kept}; to go on, run: {command}"
    return f"stopped by {name}; {kept}; to resume (interrupted runs go on from their checkpoints), run: {command}"
