"""``vitkit reproduce``: rerun the paper's experiments on this machine and write a report."""

from __future__ import annotations

import argparse
import shlex
import sys

from ..reproduce.names import BUDGETS, EXPERIMENTS
from .common import count

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
        help="smoke: under 2 minutes; desktop: the whole suite in under 2 hours on 2 CPU cores; full: for a GPU",
    )
    p.add_argument(
        "--seeds", type=count(1, 100), help="seeds of the experiments that compare across seeds (default: the budget's)"
    )
    p.add_argument(
        "--jobs", type=count(1, 256), default=1, help="training runs at once, each with its share of the CPU cores"
    )


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..reproduce import reproduce

    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    command = (
        "vitkit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if sys.argv[1:2] == ["reproduce"]
        else "vitkit reproduce"
    )
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
        )
    except KeyboardInterrupt as e:
        print(f"vitkit reproduce: {interrupted_line(e, args.out, command)}", file=sys.stderr, flush=True)
        return 130
    return 0


def interrupted_line(e: KeyboardInterrupt, out: str, command: str) -> str:
    """The one line a stopped suite ends with: what stopped it, what is kept, how to resume.

    Args:
        e: the interruption (:class:`vitkit.reproduce.runner.Interrupted` when a signal stopped
            the runs; a plain ``KeyboardInterrupt`` otherwise).
        out: the suite's folder.
        command: the command line that resumes the suite (the one that was run).

    Returns:
        The line, without the ``vitkit reproduce:`` prefix.
    """
    name = getattr(e, "signal_name", "SIGINT")
    finished, total = getattr(e, "finished", None), getattr(e, "total", None)
    kept = (
        f"{finished} of {total} runs are finished and kept in {out}"
        if finished is not None and total is not None
        else f"finished runs are kept in {out}"
    )
    return f"stopped by {name}; {kept}; to resume (interrupted runs go on from their checkpoints), run: {command}"
