"""``vitkit <command>``: the one place that parses arguments and prints for humans.

Each command is a module of this package with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; the commands do their work through the library (``vitkit.train``,
``vitkit.eval``, ``vitkit.analysis``, ...), which they import only when they run, so
``vitkit --help`` starts without torch. Library errors (:class:`vitkit.VitkitError`, and file
errors) become one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType

from ..errors import RunStopped, VitkitError
from . import analyze, bench, convert, embed, fewshot, finetune, models, predict, probe, reproduce, serve, train, view
from . import eval as evaluate
from .common import check_paths

COMMANDS: dict[str, ModuleType] = {
    "train": train,
    "finetune": finetune,
    "eval": evaluate,
    "fewshot": fewshot,
    "probe": probe,
    "predict": predict,
    "embed": embed,
    "serve": serve,
    "analyze": analyze,
    "view": view,
    "reproduce": reproduce,
    "bench": bench,
    "convert": convert,
    "models": models,
}

TRAINING_COMMANDS = ("train", "finetune", "reproduce")
"""The commands that choose OpenMP's wait policy from the machine's load before torch starts."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitkit", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details; show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    try:
        check_paths(args)  # a mistyped path is said at once, not after torch has loaded
        if args.command in TRAINING_COMMANDS:
            from ..runtime import choose_wait_policy

            choose_wait_policy()  # before torch starts: its OpenMP reads the choice when it loads
        return COMMANDS[args.command].run(args)
    except RunStopped as e:  # a checkpoint was written: the same command resumes
        print(f"vitkit {args.command}: {e}", file=sys.stderr)
        return 128 + e.signum
    except (VitkitError, OSError, ValueError) as e:  # ValueError: library checks not yet a VitkitError
        if args.verbose:
            raise
        print(f"vitkit {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitkit {args.command}: interrupted", file=sys.stderr)
        return 130


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"  # FileNotFoundError, PermissionError, a full disk...
    return str(e).strip().replace("\n", " ") or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
