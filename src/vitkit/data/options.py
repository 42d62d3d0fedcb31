"""The options each data source takes (``data.options`` in a recipe, ``**options`` of
:func:`vitkit.data.build_dataset`), checked before anything is read: an unknown name or a bad
value is one line naming the option, not a torch error from inside the source (``arange()``
of a string, a resize to 0 pixels) or a silently ignored typo."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable
from typing import Any

from .streaming import MODES, RESIZES

MAX_SIDE = 1 << 14  # pixels a side of a loaded image; far above any model, far below memory's end
MAX_IMAGES = 1 << 24  # images of a synthetic split

Check = Callable[[Any], str | None]  # the value -> what is wrong with it, or None


def _whole(lo: int, hi: int | None = None) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be a whole number, got {v!r}"
        if v < lo or (hi is not None and v > hi):
            return f"must be in [{lo}, {hi}], got {v}" if hi is not None else f"must be at least {lo}, got {v}"
        return None

    return check


def _size(v: Any) -> str | None:
    """N or [H, W], each side in [1, MAX_SIDE]."""
    sides = v if isinstance(v, list | tuple) and len(v) == 2 else [v]
    for s in sides:
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_SIDE:
            return f"must be N or [H, W] with sides in [1, {MAX_SIDE}], got {v!r}"
    return None


def _fraction(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and 0 <= v < 1):
        return f"must be a number in [0, 1), got {v!r}"
    return None


def _flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def _text(v: Any) -> str | None:
    return None if isinstance(v, str | os.PathLike) and str(v) else f"must be a non-empty string, got {v!r}"


def _one_of(*choices: str) -> Check:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"

    return check


def _names(v: Any) -> str | None:
    if not isinstance(v, list | tuple) or not v or not all(isinstance(x, str) and x for x in v):
        return f"must be a non-empty list of class names, got {v!r}"
    return None if len(set(v)) == len(v) else "must not repeat a class name"


# img_size is taken by every source: the size a decoding source loads at (without load_size), the
# size synthetic images are made at; in-memory sources keep their own (batches are resized to the
# model's), so a recipe can name it whatever its data is.
_DECODED = {"load_size": _size, "img_size": _size, "resize": _one_of(*RESIZES), "mode": _one_of(*MODES)}

# source kind -> option -> check. "folder" and "shards" are the pattern sources.
OPTIONS: dict[str, dict[str, Check]] = {
    "fashion-mnist": {"allow_download": _flag, "img_size": _size},
    "mnist": {"allow_download": _flag, "img_size": _size},
    "synthetic": {
        "n": _whole(1, MAX_IMAGES),
        "img_size": _size,
        "num_classes": _whole(1, 1 << 16),
        "in_chans": _whole(1, 64),
    },
    "cifar10": {"root": _text, "allow_download": _flag, "img_size": _size},
    "cifar100": {"root": _text, "allow_download": _flag, "img_size": _size, "label_kind": _one_of("fine", "coarse")},
    "digits": {"img_size": _size},
    "folder": {**_DECODED, "val_fraction": _fraction, "split_seed": _whole(0)},
    "labels": {**_DECODED},
    "shards": {
        **_DECODED,
        "num_samples": _whole(1),
        "shuffle_buffer": _whole(0),
        "classes": _names,
        "num_classes": _whole(1, 1 << 22),
        "reader": _text,
    },
}


def option_problem(kind: str, options: dict[str, Any]) -> tuple[str, str] | None:
    """(option name, what is wrong) for the first bad option of a source of ``kind``, or None.

    Args:
        kind: a key of :data:`OPTIONS` (a source name, "folder", "labels" or "shards"); any
            other kind has nothing checked.
        options: the options, by name, checked in their order. An option set to None is not a
            bad value, but its name must be one the source takes.

    Returns:
        The name of the first option the source does not take (the text suggests the closest
        known name and lists them all) or whose value is wrong (the text says what it must be
        and what it got), with that text; None when every option is fine.
    """
    known = OPTIONS.get(kind)
    if known is None:
        return None
    for name, value in options.items():
        if name not in known:
            accepted = ", ".join(sorted(known)) or "none"
            close = difflib.get_close_matches(str(name), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return str(name), f"is not an option of {kind} data{hint}; it takes: {accepted}"
        if value is not None and (problem := known[name](value)):
            return str(name), problem
    return None


__all__ = ["MAX_SIDE", "OPTIONS", "option_problem"]
