"""The runtime layer at the ground floor: the choices vitkit makes from what the machine reports
or from measurements, recorded in one place, each with a pin that makes two runs decide alike.

Three kinds of choice are made at run time:

- ``precision``: whether bf16 is native on the device (:mod:`vitkit.precision`; pin
  ``VITKIT_BF16=native|emulated``);
- ``attention``: which explicit attention path trains a shape faster on this CPU
  (:func:`vitkit.models.attention.choose_training_path`; pin ``VITKIT_ATTENTION=math|recompute``);
- ``kernel``: which kernel serves a linear layer's shape faster on this CPU
  (:func:`vitkit.inference.choose_linear_kernel`; pin ``VITKIT_KERNELS=onednn|torch``).

Each is recorded once per process and key (:func:`record_choice`) with how it was made
("measured", "reported by the device", "pinned by VITKIT_..."); a training run writes the record
into its ``summary.json`` (``measured_choices``). Measurements go through one timing helper,
:func:`fastest`, which times the candidates in turns so that a slow moment of a shared machine
hits them all.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from .errors import UsageError

PINS = {"precision": "VITKIT_BF16", "attention": "VITKIT_ATTENTION", "kernel": "VITKIT_KERNELS"}
"""The environment variable that pins each kind of choice."""
_PIN_VALUES = {"attention": ("math", "recompute"), "kernel": ("onednn", "torch")}

_RECORD: dict[tuple[str, str], dict[str, Any]] = {}


def pinned(kind: str) -> str | None:
    """The value the environment pins a kind of choice to, if it does (``attention``, ``kernel``;
    the precision's pin is read by :mod:`vitkit.precision`).

    Args:
        kind: "attention" or "kernel".

    Returns:
        The pinned value, or None when the variable is unset or empty.

    Raises:
        UsageError: the variable holds a value that kind cannot take.
    """
    name = PINS[kind]
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    if value not in _PIN_VALUES[kind]:
        raise UsageError(f"{name}={value!r}: use {' or '.join(_PIN_VALUES[kind])} (or leave it unset to measure)")
    return value


def record_choice(kind: str, key: str, value: str, how: str, **details: Any) -> None:
    """Keep a choice in the process's record (the first one of a kind and key stays).

    Args:
        kind: "precision", "attention" or "kernel".
        key: what it was chosen for (a device, a shape), in words.
        value: what was chosen.
        how: "measured", "reported by the device", or "pinned by VITKIT_...".
        **details: numbers behind it (timings in seconds), kept as they are.
    """
    _RECORD.setdefault((kind, key), {"kind": kind, "key": key, "value": value, "how": how, **details})


def measured_choices() -> list[dict[str, Any]]:
    """Every choice this process made so far, in the order made.

    Returns:
        One dict a choice: ``kind``, ``key``, ``value``, ``how`` and its details.
    """
    return [dict(v) for v in _RECORD.values()]


def clear_choices() -> None:
    """Forget the record (tests)."""
    _RECORD.clear()


def fastest(
    candidates: dict[str, Callable[[], object]], repeats: int = 5, untimed: int = 1
) -> tuple[str, dict[str, float]]:
    """Which of ``candidates`` runs fastest: each timed ``repeats`` times, taking turns, after
    ``untimed`` warm-up rounds; the best time of each counts (a CUDA candidate synchronises itself).

    Args:
        candidates: name -> the work to time.
        repeats: timed rounds.
        untimed: warm-up rounds.

    Returns:
        The fastest's name and every candidate's best seconds.
    """
    best = {name: math.inf for name in candidates}
    for i in range(untimed + repeats):
        for name, fn in candidates.items():  # interleaved
            start = time.perf_counter()
            fn()
            if i >= untimed:
                best[name] = min(best[name], time.perf_counter() - start)
    return min(best, key=best.get), best


__all__ = ["PINS", "clear_choices", "fastest", "measured_choices", "pinned", "record_choice"]
