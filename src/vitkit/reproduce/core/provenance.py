"""What made the numbers: the vitkit commit and a hash of its code, the call, the CPU (and GPU),
the precision and torch, for one run (:func:`run_provenance`) and for the machine of a call
(:func:`machine`)."""

from __future__ import annotations

import datetime
import functools
import hashlib
import platform
import secrets
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


def run_provenance(precision: PrecisionLike, call: str | None = None) -> dict[str, Any]:
    """What made one run: the vitkit commit and code, the call, the CPU (and GPU), the precision
    it computed in and torch; a report names these for its runs, which several calls, code
    versions and machines may have made.

    Args:
        precision: the run's resolved precision, or the recipe's ``train.precision`` ("auto",
            "fp32" or "bf16"), resolved on the GPU when there is one, else on the CPU.
        call: the id of the ``vitkit reproduce`` call that trained it (:func:`new_call_id`).

    Returns:
        ``commit``, ``code`` (:func:`code_hash`), ``call``, ``cpu``, ``gpu``, ``precision`` (the
        one that computed) and ``torch``.
    """

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "commit": source_commit(),
        "code": code_hash(),
        "call": call,
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


@functools.cache
def code_hash() -> str:
    """A hash of the vitkit code that runs (:func:`_hash_tree` of the package). Unlike the commit
    it needs no git checkout, and it changes with any edit to the code, committed or not, and
    with nothing else.

    Returns:
        12 hex digits.
    """
    return _hash_tree(Path(__file__).resolve().parents[2])  # vitkit/


def _hash_tree(root: Path) -> str:
    """SHA-256 over every Python and YAML file under ``root`` (its path relative to ``root`` and
    its bytes, in sorted order; ``__pycache__`` left out), the first 12 hex digits."""
    digest = hashlib.sha256()
    files = [f for f in (*root.rglob("*.py"), *root.rglob("*.yaml")) if "__pycache__" not in f.parts]
    for f in sorted(files, key=lambda f: f.relative_to(root).as_posix()):
        digest.update(f.relative_to(root).as_posix().encode() + b"\0")
        digest.update(f.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def new_call_id() -> str:
    """An id for one ``vitkit reproduce`` call: its UTC start time and 4 random hex digits
    (``20261206T004012Z-3fa9``), which every run the call trains records.

    Returns:
        The id.
    """
    return f"{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"
