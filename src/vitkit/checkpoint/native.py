"""vitkit's own weight format: one safetensors file whose metadata carries the model config and
the preprocessing the weights expect (value range as mean/std, resolution)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.config import ResNetConfig, ViTConfig
from .io import CheckpointError, read_safetensors, write_safetensors

FORMAT = "vitkit"
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class Preprocessing:
    """How pixels become model inputs: ``(x / 255 - mean) / std`` per channel, at ``img_size``.

    The default (mean = std = 0.5) is the paper's range [-1, 1].
    """

    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    img_size: tuple[int, int] = (224, 224)
    interpolation: str = "bilinear"

    @classmethod
    def for_config(cls, cfg: ViTConfig | ResNetConfig) -> Preprocessing:
        c = cfg.in_chans
        return cls(mean=(0.5,) * c, std=(0.5,) * c, img_size=tuple(cfg.img_size))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocessing:
        return cls(
            mean=tuple(d["mean"]),
            std=tuple(d["std"]),
            img_size=tuple(d["img_size"]),
            interpolation=d.get("interpolation", "bilinear"),
        )


def config_to_meta(cfg: ViTConfig | ResNetConfig) -> dict[str, str]:
    arch = "resnet_v2" if isinstance(cfg, ResNetConfig) else "vit"
    return {"arch": arch, "config": json.dumps(cfg.to_dict(), sort_keys=True)}


def config_from_meta(meta: dict[str, str], path: Any = "<file>") -> ViTConfig | ResNetConfig:
    try:
        d = json.loads(meta["config"])
        arch = meta.get("arch", "vit")
        return ResNetConfig.from_dict(d) if arch == "resnet_v2" else ViTConfig.from_dict(d)
    except (KeyError, json.JSONDecodeError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: vitkit metadata has no valid model config ({e})") from None


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
    pre = preprocessing or getattr(model, "preprocessing", None) or Preprocessing.for_config(cfg)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **config_to_meta(cfg),
        "preprocessing": json.dumps(pre.to_dict()),
        **(extra or {}),
    }
    state = {k: v for k, v in model.state_dict().items()}
    path = Path(path)
    write_safetensors(path, state, meta)
    return path


def read_native(path: str | Path) -> tuple[dict[str, torch.Tensor], ViTConfig | ResNetConfig, Preprocessing, dict]:
    tensors, meta = read_safetensors(path)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("__train__/")}  # training state
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a vitkit checkpoint (no 'format: vitkit' metadata)")
    cfg = config_from_meta(meta, path)
    try:
        pre = Preprocessing.from_dict(json.loads(meta["preprocessing"]))
    except (KeyError, json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"{path}: vitkit metadata has no valid preprocessing ({e})") from None
    return tensors, cfg, pre, meta
