"""vitkit's own weight format: one safetensors file whose metadata carries the model config and
the preprocessing the weights expect (value range as mean/std, resolution)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from ..models.config import ResNetConfig, ViTConfig
from ..preprocessing import Preprocessing
from . import values
from .io import read_safetensors, write_safetensors

FORMAT = "vitkit"
FORMAT_VERSION = "1"


def config_to_meta(cfg: ViTConfig | ResNetConfig) -> dict[str, str]:
    arch = "resnet_v2" if isinstance(cfg, ResNetConfig) else "vit"
    return {"arch": arch, "config": json.dumps(cfg.to_dict(), sort_keys=True)}


def config_from_meta(meta: dict[str, str], path: Any = "<file>", key: str = "config") -> ViTConfig | ResNetConfig:
    """The model config in a file's metadata (``key``: JSON of ``cfg.to_dict()``, with ``arch``),
    every value checked (:func:`vitkit.checkpoint.values.check_config_dict`): a wrong type, an
    unknown field or an absurd size is a :class:`CheckpointError` naming the file and the key."""
    where = f"{path}: vitkit metadata"
    if key not in meta:
        raise CheckpointError(f"{where} has no model config (no {key!r} entry)")
    arch = meta.get("arch", "vit")
    if arch not in ("vit", "resnet_v2"):
        raise CheckpointError(f"{where}: arch must be 'vit' or 'resnet_v2', got {arch[:40]!r}")
    d = values.loads(meta[key], where)
    values.check_config_dict(d, arch, where)
    try:
        cfg = ResNetConfig.from_dict(d) if arch == "resnet_v2" else ViTConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: the model config is not valid ({e})") from None
    values.check_grid(cfg, where)
    return cfg


def preprocessing_from_meta(meta: dict[str, str], cfg: ViTConfig | ResNetConfig, path: Any, key: str) -> Preprocessing:
    where = f"{path}: vitkit metadata"
    if key not in meta:
        raise CheckpointError(f"{where} has no preprocessing (no {key!r} entry)")
    d = values.loads(meta[key], where)
    values.check_preprocessing(d, cfg.in_chans, where)
    return Preprocessing.from_dict(d)


def save_checkpoint(
    model: nn.Module,
    path: str | Path,
    preprocessing: Preprocessing | None = None,
    extra: dict[str, str] | None = None,
) -> Path:
    """Write ``model``'s weights, config and preprocessing to ``path`` (atomically).

    Loading it back with :func:`vitkit.load_pretrained` gives bit-identical parameters.
    """
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, (ViTConfig, ResNetConfig)):
        raise TypeError("save_checkpoint needs a vitkit model (with a .cfg ViTConfig or ResNetConfig)")
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    pre = preprocessing or getattr(model, "preprocessing", None)
    return save_weights(model.state_dict(), cfg, path, pre, extra)


def save_weights(
    state: dict[str, torch.Tensor],
    cfg: ViTConfig | ResNetConfig,
    path: str | Path,
    preprocessing: Preprocessing | None = None,
    extra: dict[str, str] | None = None,
) -> Path:
    """Write a model's state dict with its config as a vitkit checkpoint (atomically): what
    :func:`save_checkpoint` does, for weights held apart from a model (gathered from shards,
    or an average of the weights)."""
    pre = preprocessing or Preprocessing.for_config(cfg)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **config_to_meta(cfg),
        "preprocessing": json.dumps(pre.to_dict()),
        **(extra or {}),
    }
    path = Path(path)
    write_safetensors(path, dict(state), meta)
    return path


def read_native(path: str | Path) -> tuple[dict[str, torch.Tensor], ViTConfig | ResNetConfig, Preprocessing, dict]:
    tensors, meta = read_safetensors(path)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("__train__/")}  # training state
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a vitkit checkpoint (no 'format: vitkit' metadata)")
    cfg = config_from_meta(meta, path)
    return tensors, cfg, preprocessing_from_meta(meta, cfg, path, "preprocessing"), meta
