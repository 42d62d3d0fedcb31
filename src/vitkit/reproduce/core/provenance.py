"""What made the numbers: the vitkit commit, the CPU (and GPU), the precision and torch, for one
run (:func:`run_provenance`) and for the machine of a call (:func:`machine`)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from ...cpu import cpu_info
from ...precision import PrecisionLike, as_precision, bf16_support


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu, made = cpu_info(), run_provenance("auto")  # precision: what `train.precision: auto` computes in
    return {
        **made,
        "cpu_flags": [f for f, on in cpu["flags"].items() if on],
        "cores": cpu["cores"],
        "bf16": bf16_support("cuda" if made["gpu"] else "cpu").reason,
        "python": platform.python_version(),
    }


def run_provenance(precision: PrecisionLike) -> dict[str, Any]:
    """What made one run: the vitkit commit, the CPU (and GPU), the precision it computed in and
    torch; a report names these for its runs, which several calls and machines may have made.

    Args:
        precision: the run's resolved precision, or the recipe's ``train.precision`` ("auto",
            "fp32" or "bf16"), resolved on the GPU when there is one, else on the CPU.

    Returns:
        ``commit``, ``cpu``, ``gpu``, ``precision`` (the one that computed) and ``torch``.
    """

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "commit": source_commit(),
        "cpu": cpu_info()["model"],
        "gpu": gpu,
        "precision": as_precision(precision, "cuda" if gpu else "cpu").name,
        "torch": torch.__version__,
    }


def source_commit() -> str | None:
    """The git commit of the vitkit source that ran, with ``+changes`` when the package's tracked
    files have uncommitted changes (a report published into the checkout is not a change to the
    code); None outside a git checkout."""

    here = Path(__file__).resolve().parent
    package = here.parents[1]  # vitkit/, whose files made the numbers

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short=12", "HEAD")
    if not commit:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", str(package))
    return commit + ("+changes" if dirty else "")
