"""The runtime layer at the ground floor: the choices vitkit makes from what the machine reports
or from measurements, recorded in one place, each with a pin that makes two runs decide alike.

Three kinds of choice are made at run time:

- ``precision``: whether bf16 is native on the device (:mod:`vitkit.precision`; pin
  ``VITKIT_BF16=native|emulated``);
- ``attention``: which explicit attention path trains a shape faster on this CPU
  (:func:`vitkit.models.attention.choose_training_path`; pin ``VITKIT_ATTENTION=math|recompute``);
- ``kernel``: which kernel serves a linear layer's shape faster on this CPU
  (:func:`vitkit.inference.choose_linear_kernel`; pin ``VITKIT_KERNELS=onednn|torch``);
- ``wait``: how OpenMP's threads wait at a barrier, chosen before torch starts from the load
  other processes put on the machine (:func:`choose_wait_policy`; pin ``VITKIT_WAIT=spin|passive``).

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

PINS = {"precision": "VITKIT_BF16", "attention": "VITKIT_ATTENTION", "kernel": "VITKIT_KERNELS", "wait": "VITKIT_WAIT"}
"""The environment variable that pins each kind of choice."""
_PIN_VALUES = {"attention": ("math", "recompute"), "kernel": ("onednn", "torch"), "wait": ("spin", "passive")}
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""OpenMP's own settings of how threads wait: where the user sets one, vitkit sets none."""
BUSY_CORES = 0.5
"""Cores other processes keep busy at start from which OpenMP's threads are told to wait passively."""

_RECORD: dict[tuple[str, str], dict[str, Any]] = {}


def pinned(kind: str) -> str | None:
    """The value the environment pins a kind of choice to, if it does (``attention``, ``kernel``,
    ``wait``; the precision's pin is read by :mod:`vitkit.precision`).

    Args:
        kind: "attention", "kernel" or "wait".

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
        kind: "precision", "attention", "kernel" or "wait".
        key: what it was chosen for (a device, a shape), in words.
        value: what was chosen.
        how: "measured", "reported by the device", or "pinned by VITKIT_...".
        **details: numbers behind it (timings in seconds), kept as they are.
    """
    _RECORD.setdefault((kind, key), {"kind": kind, "key": key, "value": value, "how": how, **details})


def _cpu_ticks() -> tuple[int, int, int]:
    """(busy ticks of every CPU together, all ticks of every CPU together, the CPUs counted), from /proc/stat."""
    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    fields = [int(v) for v in lines[0].split()[1:]]  # user nice system idle iowait irq softirq steal ...
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(fields[:8]) - idle, sum(fields[:8]), max(cpus, 1)


def _own_ticks() -> int:
    """The CPU ticks this process used so far (user and system), from /proc/self/stat."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of the line


def busy_cores_elsewhere(seconds: float = 0.25) -> float | None:
    """How many cores other processes keep busy, sampled over ``seconds``.

    Args:
        seconds: how long to watch.

    Returns:
        Cores' worth of CPU time that processes other than this one used, per second of the
        sample; None where the operating system does not say (no ``/proc``).
    """
    try:
        busy0, total0, cpus = _cpu_ticks()
        own0 = _own_ticks()
        time.sleep(seconds)
        busy1, total1, _ = _cpu_ticks()
        own1 = _own_ticks()
    except (OSError, ValueError, IndexError):
        return None
    per_cpu = (total1 - total0) / cpus  # ticks that passed on each CPU
    if per_cpu <= 0:
        return None
    return max(0.0, (busy1 - busy0 - (own1 - own0)) / per_cpu)


def choose_wait_policy(probe_seconds: float = 0.25) -> dict[str, Any]:
    """Choose how OpenMP's threads wait at a barrier, before torch starts: ``spin`` (libgomp's
    default: spin a while, then sleep; fastest on a machine of one's own) or ``passive`` (sleep at
    once; on a machine where other processes want the cores, a spinning thread waits for a
    partner the other process holds, and a step of many small parallel regions collapses).

    ``passive`` is chosen when other processes keep at least :data:`BUSY_CORES` cores busy over a
    short sample at start. The choice changes how threads wait, never how the work is split
    between them, so a run's numbers are the same either way. ``VITKIT_WAIT`` pins it; where the
    environment sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` that setting is kept; once torch
    has started (its OpenMP reads the settings when it loads) nothing can change. The choice is
    recorded (:func:`measured_choices`) and sets ``OMP_WAIT_POLICY`` for this process and the
    ones it starts.

    Args:
        probe_seconds: how long the machine's load is sampled.

    Returns:
        The record: ``value`` ("spin", "passive", or "as set"), ``how``, and ``busy_cores``
        when measured.
    """
    import sys

    key = "OpenMP threads"
    given = {k: os.environ[k] for k in OPENMP_WAIT_VARIABLES if os.environ.get(k, "").strip()}
    if given:
        setting = ", ".join(f"{k}={v}" for k, v in given.items())
        record_choice("wait", key, "as set", f"set by {setting}")
    elif "torch" in sys.modules:
        record_choice("wait", key, "spin", "torch had started: libgomp's default")
    elif (pin := pinned("wait")) is not None:
        record_choice("wait", key, pin, f"pinned by {PINS['wait']}")
    else:
        busy = busy_cores_elsewhere(probe_seconds)
        value = "passive" if busy is not None and busy >= BUSY_CORES else "spin"
        how = "measured" if busy is not None else "no load reported by the system"
        record_choice("wait", key, value, how, busy_cores=None if busy is None else round(busy, 2))
    chosen = _RECORD[("wait", key)]
    if chosen["value"] == "passive" and "torch" not in sys.modules:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return dict(chosen)


def wait_policy_line() -> str | None:
    """What :func:`choose_wait_policy` chose, in one line for a run's first messages, with how to
    override it; None where nothing was chosen in this process.

    Returns:
        E.g. ``OpenMP threads wait passively: other processes kept 1.9 cores busy at start
        (VITKIT_WAIT=spin to spin)``.
    """
    chosen = _RECORD.get(("wait", "OpenMP threads"))
    if chosen is None:
        return None
    value, how = chosen["value"], chosen["how"]
    if value == "as set":
        return f"OpenMP threads wait as {how.removeprefix('set by ')} says"
    busy = chosen.get("busy_cores")
    why = f"other processes kept {busy:g} cores busy at start" if busy is not None else how
    if value == "passive":
        return f"OpenMP threads wait passively: {why} ({PINS['wait']}=spin to spin)"
    return f"OpenMP threads spin, then sleep (libgomp's default): {why} ({PINS['wait']}=passive on a busy machine)"


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


__all__ = [
    "BUSY_CORES",
    "OPENMP_WAIT_VARIABLES",
    "PINS",
    "busy_cores_elsewhere",
    "choose_wait_policy",
    "clear_choices",
    "fastest",
    "measured_choices",
    "pinned",
    "record_choice",
    "wait_policy_line",
]
