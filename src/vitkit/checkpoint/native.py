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
from .io import CHECKSUM_KEY, CLASSES_KEY, read_safetensors, write_safetensors

FORMAT = "vitkit"
FORMAT_VERSION = "1"

# Metadata a vitkit file's writer makes anew from the model (its config, preprocessing and
# checksums), and the training state, which describes tensors only a training checkpoint holds.
# The rest (class names, training step and score, the recipe...) is kept when a loaded model is
# written again (:func:`carried_metadata`).
_WRITTEN_KEYS = ("format", "format_version", "arch", "config", "preprocessing", CHECKSUM_KEY, "train_state")


def carried_metadata(meta: dict[str, str]) -> dict[str, str]:
    """The metadata of a vitkit file that :func:`save_checkpoint` keeps when the model loaded
    from it is written again: all but what the writer makes anew from the model.

    Args:
        meta: the file's metadata, as read (:func:`vitkit.checkpoint.io.read_safetensors`).

    Returns:
        The entries to keep.
    """
    return {k: v for k, v in meta.items() if k not in _WRITTEN_KEYS}


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

    Loading it back with :func:`vitkit.load_pretrained` gives bit-identical parameters. A model
    loaded from a vitkit file keeps that file's other metadata (its class names, while it has as
    many classes; its training step and score...: ``model.load_report.metadata``), so converting
    a file to vitkit loses nothing; ``extra`` adds entries or replaces them.

    Args:
        model: a vitkit model (with ``.cfg``).
        path: the ``.safetensors`` file to write.
        preprocessing: what the weights expect (default: the model's ``.preprocessing``).
        extra: more string metadata.

    Returns:
        ``path``.

    Raises:
        TypeError: ``model`` is not a vitkit model (it has no ``.cfg`` ViTConfig or ResNetConfig).
    """
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, (ViTConfig, ResNetConfig)):
        raise TypeError("save_checkpoint needs a vitkit model (with a .cfg ViTConfig or ResNetConfig)")
    report = getattr(model, "load_report", None)
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    pre = preprocessing or getattr(model, "preprocessing", None)
    kept = _kept_metadata(getattr(report, "metadata", None) or {}, cfg)
    return save_weights(model.state_dict(), cfg, path, pre, {**kept, **(extra or {})})


def _kept_metadata(meta: dict[str, str], cfg: ViTConfig | ResNetConfig) -> dict[str, str]:
    """A loaded file's metadata to write with its model: class names only while they name the
    model's classes (a replaced head has others)."""
    kept = carried_metadata(meta)
    if CLASSES_KEY in kept:
        try:
            names = json.loads(kept[CLASSES_KEY])
        except (ValueError, RecursionError):
            names = None
        if not isinstance(names, list) or len(names) != cfg.num_classes:
            del kept[CLASSES_KEY]
    return kept


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
    """A vitkit checkpoint: its model tensors (training state left out), config, preprocessing
    and metadata, each checked.

    Args:
        path: the ``.safetensors`` file.

    Returns:
        ``(tensors, config, preprocessing, metadata)``.
    """
    tensors, meta = read_safetensors(path)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("__train__/")}  # training state
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a vitkit checkpoint (no 'format: vitkit' metadata)")
    cfg = config_from_meta(meta, path)
    return tensors, cfg, preprocessing_from_meta(meta, cfg, path, "preprocessing"), meta
