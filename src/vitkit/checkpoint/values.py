"""Checks of the values a file brings in (a vitkit config in safetensors metadata, a Hugging Face
``config.json``): each wrong one is a :class:`CheckpointError` naming the file and the key, before
any of them reaches a constructor (where it would be a ``TypeError`` or a ``ZeroDivisionError``)
or allocates memory (a width of a billion)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..models.config import ViTConfig, token_grid_problem

# Bounds on sizes read from a file: far above any real model, far below what exhausts memory.
MAX_DIM = 1 << 16  # width, MLP size, representation size, image side, channels
MAX_CLASSES = 1 << 22
MAX_DEPTH = 1 << 12  # blocks, and ResNet units per stage
MAX_JSON_BYTES = 16 << 20  # a config.json (ImageNet-21k label names are about 1 MB)


def loads(text: str | bytes, where: str) -> Any:
    """JSON from a file; malformed (or absurdly nested) JSON is a :class:`CheckpointError`."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{where}: not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None


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
    from ..models.config import POOLINGS, POS_EMBEDS, ResNetConfig, ViTConfig

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
            "act": lambda v, k: choice(v, where, key(k), ("gelu_tanh", "gelu")),
            "ln_eps": lambda v, k: number(v, where, key(k), 0.0, 1.0, lo_open=True),
            "resnet_units": lambda v, k: v is None or units(v, where, key(k), min_stages=0),
            "resnet_width": lambda v, k: integer(v, where, key(k), 32, MAX_DIM),
            "dynamic_img_size": lambda v, k: flag(v, where, key(k)),
            "distill_token": lambda v, k: flag(v, where, key(k)),
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


def check_preprocessing(d: Any, in_chans: int, where: str) -> None:
    if not isinstance(d, dict):
        raise CheckpointError(f"{where}: preprocessing must be a JSON object, got {type(d).__name__}")
    unknown = sorted(str(k) for k in d if k not in ("mean", "std", "img_size", "interpolation", "crop_pct"))
    if unknown:
        raise CheckpointError(f"{where}: unknown preprocessing field(s) {unknown[:5]}")
    for key in ("mean", "std"):
        v = d.get(key)
        if not isinstance(v, list) or len(v) != in_chans:
            raise _bad(where, f"preprocessing[{key!r}]", f"a list of {in_chans} numbers (one per channel)", v)
        for i, x in enumerate(v):
            if key == "std":
                number(x, where, f"preprocessing['std'][{i}]", 0.0, 1e6, lo_open=True)
            else:
                number(x, where, f"preprocessing['mean'][{i}]", -1e6, 1e6)
    size_pair(d.get("img_size"), where, "preprocessing['img_size']")
    if "interpolation" in d:
        choice(d["interpolation"], where, "preprocessing['interpolation']", ("bilinear", "bicubic"))
    if "crop_pct" in d:
        number(d["crop_pct"], where, "preprocessing['crop_pct']", 0.0, 1.0, lo_open=True)
