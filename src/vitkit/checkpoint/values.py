"""Checks of the values a file brings in (a vitkit config in safetensors metadata, a Hugging Face
``config.json``): each wrong one is a :class:`CheckpointError` naming the file and the key, before
any of them reaches a constructor (where it would be a ``TypeError`` or a ``ZeroDivisionError``)
or allocates memory (a width of a billion)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..models.config import ViTConfig, token_grid_problem

# Bounds on sizes read from a file: far above any real model, far below what exhausts memory.
MAX_DIM = 1 << 16  # width, MLP size, representation size, image side, channels
MAX_CLASSES = 1 << 22
MAX_DEPTH = 1 << 12  # blocks, and ResNet units per stage
MAX_JSON_BYTES = 16 << 20  # a config.json (ImageNet-21k label names are about 1 MB)
# Bounds on the preprocessing a file records. Mean and std are on the [0, 1] scale of pixels
# divided by 255: ImageNet's, CLIP's and the paper's 0.5 are far inside; a std of 1/255 feeds the
# model raw 0-255 values. timm's and Hugging Face's crop fractions are 0.875 to 1.
MEAN_RANGE = (-1.0, 2.0)
STD_RANGE = (1e-3, 10.0)
CROP_PCT_RANGE = (0.5, 1.0)
MAX_IMAGE_SIDE = 1 << 13
MAX_LAYER_SCALE = 1e6  # the starting value of LayerScale's gammas (DINOv2: 1e-5; CaiT: 0.1 to 1e-6)
MAX_NESTING = 64  # brackets inside one another in a JSON value (vitkit's own metadata nests 6 deep)

# A JSON string (possibly unterminated, at the end of a text), or one bracket outside strings.
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)


def nesting_depth(text: str | bytes) -> int:
    """How deep the brackets (``[`` and ``{``) of ``text`` nest, those inside JSON strings left out.

    Args:
        text: JSON (or any text of nested brackets, such as a YAML flow sequence).

    Returns:
        The deepest nesting: 0 for a number or a string, 1 for a flat list.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = deepest = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        c = m.group()
        if c in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif c in ("]", "}"):
            depth = max(depth - 1, 0)
    return deepest


def check_nesting(text: str | bytes, where: str, what: str = "the JSON is") -> None:
    """Refuse ``text`` nested deeper than :data:`MAX_NESTING` before anything parses it (Python's
    JSON and YAML parsers recurse once per level, and fail with a ``RecursionError``).

    Args:
        text: the text a file brings in.
        where: the file (and key) it comes from, for the message.
        what: what the text is, for the message ("metadata 'classes' is").

    Raises:
        CheckpointError: naming ``where``, when the text nests too deep.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if text.count("[") + text.count("{") <= MAX_NESTING:  # it cannot nest deeper than it has brackets
        return
    depth = nesting_depth(text)
    if depth > MAX_NESTING:
        raise CheckpointError(f"{where}: {what} nested {depth} levels deep, more than the {MAX_NESTING} vitkit reads")


def printable(text: str, limit: int | None = None) -> str:
    """``text`` as it can be shown on a terminal: each character a terminal could act on (control
    characters and ANSI escapes, newlines and tabs, C1 codes, bidirectional overrides and other
    invisible format characters, lone surrogates) written as a visible Python escape (``\\x1b``,
    ``\\n``, ``\\u202e``); letters of every script, and spaces, stay as they are.

    Args:
        text: a string from a file (a class name, a reader's message).
        limit: at most this many characters are kept (the escapes counted), the cut marked ``...``.

    Returns:
        The printable text.
    """
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    if limit is not None and len(out) > limit:
        out = out[: max(limit - 3, 0)] + "..."
    return out


def loads(text: str | bytes, where: str) -> Any:
    """JSON from a file; malformed (or absurdly nested) JSON is a :class:`CheckpointError`.

    Args:
        text: the JSON text.
        where: the file (and key) it comes from, for the message.

    Returns:
        The parsed value.
    """
    check_nesting(text, where)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{where}: not valid JSON ({type(e).__name__}: {printable(str(e), 120)})") from None


def read_json_file(path: Path) -> Any:
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: {size} bytes is too large for a config file (at most {MAX_JSON_BYTES})")
    return loads(path.read_bytes(), str(path))


def _bad(where: str, key: str, want: str, value: Any) -> CheckpointError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return CheckpointError(f"{where}: {key} must be {want}, got {shown}")


def integer(value: Any, where: str, key: str, lo: int = 1, hi: int = MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(where, key, f"an integer in [{lo}, {hi}]", value)
    return value


def number(value: Any, where: str, key: str, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > hi or value < lo or (lo_open and value == lo):
        interval = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise _bad(where, key, f"a number in {interval}", value)
    return float(value)


def size_pair(value: Any, where: str, key: str, hi: int = MAX_DIM) -> tuple[int, int]:
    """An int or a pair of ints, each in [1, hi] (image and patch sizes)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return (integer(value[0], where, f"{key}[0]", 1, hi), integer(value[1], where, f"{key}[1]", 1, hi))
    if isinstance(value, int) and not isinstance(value, bool):
        v = integer(value, where, key, 1, hi)
        return (v, v)
    raise _bad(where, key, f"an integer or a pair of integers in [1, {hi}]", value)


def choice(value: Any, where: str, key: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _bad(where, key, "one of " + ", ".join(repr(c) for c in choices), value)
    return value


def flag(value: Any, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, key, "true or false", value)
    return value


def units(value: Any, where: str, key: str, min_stages: int = 1) -> tuple[int, ...]:
    """Units per stage; ``min_stages=0`` admits ``[]`` (a hybrid's ResNet root alone)."""
    if not isinstance(value, (list, tuple)) or not min_stages <= len(value) <= 8:
        raise _bad(where, key, f"a list of {min_stages} to 8 unit counts", value)
    return tuple(integer(u, where, f"{key}[{i}]", 1, MAX_DEPTH) for i, u in enumerate(value))


def check_config_dict(d: Any, arch: str, where: str) -> None:
    """The fields of a vitkit model config read from a file (``ViTConfig.to_dict()`` or
    ``ResNetConfig.to_dict()``): known names, JSON types and sane ranges. Choices the config
    itself checks (divisibility, GroupNorm widths...) are left to it."""
    from ..models.config import ACTIVATIONS, MAX_REGISTERS, MLP_TYPES, POOLINGS, POS_EMBEDS, ResNetConfig, ViTConfig

    if not isinstance(d, dict):
        raise CheckpointError(f"{where}: the model config must be a JSON object, got {type(d).__name__}")
    cls = ResNetConfig if arch == "resnet_v2" else ViTConfig
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise CheckpointError(f"{where}: unknown {cls.__name__} field(s) {unknown[:5]}; known: {sorted(known)}")
    key = lambda k: f"config[{k!r}]"
    checks: dict[str, Any] = {
        "img_size": lambda v, k: size_pair(v, where, key(k)),
        "in_chans": lambda v, k: integer(v, where, key(k), 1, 1 << 12),
        "num_classes": lambda v, k: v is None or integer(v, where, key(k), 0, MAX_CLASSES),
    }
    if cls is ViTConfig:
        checks |= {
            "patch_size": lambda v, k: size_pair(v, where, key(k)),
            "width": lambda v, k: integer(v, where, key(k)),
            "depth": lambda v, k: integer(v, where, key(k), 1, MAX_DEPTH),
            "num_heads": lambda v, k: integer(v, where, key(k)),
            "mlp_dim": lambda v, k: integer(v, where, key(k)),
            "classifier": lambda v, k: choice(v, where, key(k), POOLINGS),
            "representation_size": lambda v, k: v is None or integer(v, where, key(k)),
            "pos_embed": lambda v, k: choice(v, where, key(k), POS_EMBEDS),
            "cls_pos_embed": lambda v, k: flag(v, where, key(k)),
            "drop_rate": lambda v, k: number(v, where, key(k), 0.0, 1.0),
            "attn_drop_rate": lambda v, k: number(v, where, key(k), 0.0, 1.0),
            "drop_path_rate": lambda v, k: number(v, where, key(k), 0.0, 1.0),
            "act": lambda v, k: choice(v, where, key(k), ACTIVATIONS),
            "ln_eps": lambda v, k: number(v, where, key(k), 0.0, 1.0, lo_open=True),
            "resnet_units": lambda v, k: v is None or units(v, where, key(k), min_stages=0),
            "resnet_width": lambda v, k: integer(v, where, key(k), 32, MAX_DIM),
            "dynamic_img_size": lambda v, k: flag(v, where, key(k)),
            "distill_token": lambda v, k: flag(v, where, key(k)),
            "num_registers": lambda v, k: integer(v, where, key(k), 0, MAX_REGISTERS),
            "layer_scale_init": lambda v, k: v is None or number(v, where, key(k), -MAX_LAYER_SCALE, MAX_LAYER_SCALE),
            "pre_norm": lambda v, k: flag(v, where, key(k)),
            "fc_norm": lambda v, k: flag(v, where, key(k)),
            "qk_norm": lambda v, k: flag(v, where, key(k)),
            "mlp_type": lambda v, k: choice(v, where, key(k), MLP_TYPES),
            "patch_bias": lambda v, k: flag(v, where, key(k)),
        }
    else:
        checks |= {
            "units": lambda v, k: units(v, where, key(k)),
            "width_factor": lambda v, k: integer(v, where, key(k), 1, 64),
        }
    for k, v in d.items():
        if k in checks:  # a field added to the config later is left to the config's own checks
            checks[k](v, k)


def check_grid(cfg: Any, where: str) -> None:
    """A config read from a file, or an image size a caller asks for, may not need more tokens
    than the models' bound (:func:`vitkit.models.config.token_grid_problem`)."""
    if isinstance(cfg, ViTConfig) and (problem := token_grid_problem(cfg)):
        raise CheckpointError(f"{where}: {problem}")


MAX_NAFLEX_TOKENS = 16384  # patches an image under NaFlex: a 2048 px square of 16 px patches


def check_preprocessing(d: Any, in_chans: int, where: str) -> None:
    """The preprocessing a file records (:meth:`vitkit.Preprocessing.to_dict`, or a peer's
    equivalent), each value within what any real weights use: the mean and std of each channel
    on the [0, 1] scale (:data:`MEAN_RANGE`, :data:`STD_RANGE`), an image side up to
    :data:`MAX_IMAGE_SIDE`, bilinear or bicubic resampling, and a crop fraction in
    :data:`CROP_PCT_RANGE` (a smaller one would have an image resized to many times its size).

    Args:
        d: the preprocessing read from the file.
        in_chans: the model's input channels (one mean and one std each).
        where: the file (and key) it comes from, for the message.

    Raises:
        CheckpointError: naming ``where`` and the key, for the first value out of bounds.
    """
    if not isinstance(d, dict):
        raise CheckpointError(f"{where}: preprocessing must be a JSON object, got {type(d).__name__}")
    fields = ("mean", "std", "img_size", "interpolation", "crop_pct", "crop_mode", "naflex")
    unknown = sorted(str(k)[:40] for k in d if k not in fields)  # shown as a list: escaped
    if unknown:
        raise CheckpointError(f"{where}: unknown preprocessing field(s) {unknown[:5]}")
    for key, (lo, hi) in (("mean", MEAN_RANGE), ("std", STD_RANGE)):
        v = d.get(key)
        if not isinstance(v, list) or len(v) != in_chans:
            raise _bad(where, f"preprocessing[{key!r}]", f"a list of {in_chans} numbers (one per channel)", v)
        for i, x in enumerate(v):
            number(x, where, f"preprocessing[{key!r}][{i}]", lo, hi)
    size_pair(d.get("img_size"), where, "preprocessing['img_size']", MAX_IMAGE_SIDE)
    if "interpolation" in d:
        choice(d["interpolation"], where, "preprocessing['interpolation']", ("bilinear", "bicubic"))
    if "crop_mode" in d:
        choice(d["crop_mode"], where, "preprocessing['crop_mode']", ("squash", "center"))
    if "crop_pct" in d:
        number(d["crop_pct"], where, "preprocessing['crop_pct']", *CROP_PCT_RANGE)
    if "naflex" in d:  # NaFlex's most patches an image
        integer(d["naflex"], where, "preprocessing['naflex']", 1, MAX_NAFLEX_TOKENS)
