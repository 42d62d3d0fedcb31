"""A run's ``result.json``: what a finished run measured, checked before the report reads it.

A result is written once, atomically, when its run is scored (:mod:`.scoring`); a file that is
torn, not JSON, or holds a value of the wrong type or range is damaged (:func:`load_result` says
which key), and one of an older scoring is scored again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# Bump when the scoring changes: results of an older scoring are scored again (not retrained).
SCORE_VERSION = 3


def machine_seconds(res: dict[str, Any]) -> float:
    """The share of the machine's time a run took: its wall time over the runs trained at once
    beside it (``runs_at_once``, 1 where the result does not say). Summed over runs, the time
    the runs take whatever ``--jobs`` trained them.

    Args:
        res: a run's result (``result.json``).

    Returns:
        Seconds, 0 where the result has no wall time.
    """
    at_once = res.get("runs_at_once")
    return float(res.get("wall_seconds") or 0.0) / (at_once if _is_count(at_once) and at_once >= 1 else 1)


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a JSON number (a bool is not), else None. A number too large
    for a float (``1e999`` reads as inf; a 400-digit integer does not fit) is ``inf``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _check_accuracy(where: str, value: Any, optional: bool = False) -> str | None:
    """Why ``value`` cannot be an accuracy (a number in [0, 1]), or None if it can. A float that is
    not finite is accepted: it is what a diverged run measures, and the report leaves it out."""
    if value is None and optional:
        return None
    x = _number(value)
    if x is None:
        return f"{where} is {type(value).__name__} {_short(value)}, not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not 0.0 <= x <= 1.0:
        return f"{where} is {_short(value)}, not an accuracy between 0 and 1"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_result(res: Any) -> str | None:
    """Why ``res`` (a parsed ``result.json``) is not a result this scoring could have written, or
    None if it is one. Only the numbers the report reads are checked: each present, of its type,
    and in its range.

    Args:
        res: what ``json.loads`` gave for the file.

    Returns:
        One clause naming the key at fault, or None.
    """
    if not isinstance(res, dict):
        return f"holds a JSON {_json_kind(res)}, not an object"
    missing = [k for k in ("score_version", "test_top1", "fewshot", "wall_seconds", "train_flops") if k not in res]
    if missing:
        return f"has no {', '.join(missing)}"
    version = res["score_version"]
    if not _is_count(version) or version != SCORE_VERSION:
        return f"score_version is {_short(version)}, not {SCORE_VERSION}"
    fewshot = res["fewshot"]
    if not isinstance(fewshot, dict):
        return f"fewshot is {_short(fewshot)}, not an object"
    if "mean" not in fewshot or "shots" not in fewshot:
        return f"fewshot has no {' or '.join(k for k in ('mean', 'shots') if k not in fewshot)}"
    own = res.get("fewshot_in_domain")
    if own is not None and not (isinstance(own, dict) and "mean" in own):
        return f"fewshot_in_domain is {_short(own)}, not an object with a mean"
    problems = [
        None if own is None else _check_accuracy("fewshot_in_domain.mean", own["mean"]),
        _check_accuracy("test_top1", res["test_top1"]),
        _check_accuracy("minival_top1", res.get("minival_top1"), optional=True),
        _check_accuracy("fewshot.mean", fewshot["mean"]),
        None if _is_count(fewshot["shots"]) else f"fewshot.shots is {_short(fewshot['shots'])}, not a count",
    ]
    for key, low in (("wall_seconds", 0.0), ("train_flops", 1.0)):
        x = _number(res[key])
        if x is None or not math.isfinite(x) or x < low:
            problems.append(f"{key} is {_short(res[key])}, not a finite number of at least {low:g}")
    return next((p for p in problems if p is not None), None)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000


def _json_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def load_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A run's ``result.json``, checked.

    Args:
        path: the file (``OUT/runs/KEY/result.json``).

    Returns:
        ``(result, None)`` for a finished run; ``(None, None)`` if there is no file or it is of an
        older scoring (the run is scored again); ``(None, why)`` if the file is damaged (torn,
        not JSON, or a value of the wrong type, range or size), ``why`` one clause naming what.

    Raises:
        OSError: the file exists but cannot be read (its permissions, a folder in its place).
    """
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        res = json.loads(text, parse_float=_parse_float)
    except _TooLarge as e:
        return None, f"holds a number too large for a float ({_short(str(e))})"
    except RecursionError:
        return None, "is nested too deeply to be a result"
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        return None, f"is not valid JSON ({str(e).splitlines()[0]})" if text.strip() else "is empty"
    version = res.get("score_version") if isinstance(res, dict) else None
    if _is_count(version) and version != SCORE_VERSION:
        return None, None  # another scoring's numbers: scored again, not damaged
    why = check_result(res)
    return (None, why) if why else (res, None)


class _TooLarge(ValueError):
    """A JSON number literal beyond a float's range (``1e999``), which would read as inf."""


def _parse_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise _TooLarge(literal)
    return value


def read_result(path: Path) -> dict[str, Any] | None:
    """A finished run's result, or None if it is missing, damaged or of an older scoring.

    Args:
        path: the run's ``result.json``.

    Returns:
        The result, or None.
    """
    return load_result(path)[0]


def nonfinite_fields(res: dict[str, Any]) -> list[str]:
    """The accuracies of a result that are not finite numbers (what a diverged run measures).

    Args:
        res: a result that :func:`check_result` accepts.

    Returns:
        Each as ``test top-1 not a number`` or ``few-shot mean infinite``.
    """
    fields = (("test top-1", res.get("test_top1")), ("minival top-1", res.get("minival_top1")),
              ("few-shot mean", (res.get("fewshot") or {}).get("mean")),
              ("in-domain few-shot mean", (res.get("fewshot_in_domain") or {}).get("mean")))  # fmt: skip
    return [
        f"{name} {'not a number' if math.isnan(value) else 'infinite'}"
        for name, value in fields
        if isinstance(value, float) and not math.isfinite(value)
    ]
