"""``load_pretrained``: any supported weight file -> a vitkit model, with the same outputs.

Formats are detected from the file: vitkit safetensors (config in the metadata), official JAX
``.npz`` (both key layouts, big_vision too), timm and Hugging Face state dicts (safetensors or a
``weights_only`` PyTorch file; a Hugging Face folder with ``config.json``), and vitkit run folders
(which stand for their best checkpoint).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, UsageError
from ..models.config import ResNetConfig, ViTConfig
from ..models.posembed import resample_1d, resample_pos_embed, resample_relative_embed
from ..models.registry import build_model, model_config
from ..preprocessing import Preprocessing
from .io import read_npz, read_safetensors, read_safetensors_metadata, read_torch_state_dict
from .native import FORMAT, read_native
from .official import convert_official, is_official, select_arrays
from .peers import convert_hf, convert_timm, is_hf, is_timm, read_hf_dir

log = logging.getLogger("vitkit")

# Architecture fields a model name fixes; a file whose tensors disagree is an error.
_ARCH_FIELDS = ("width", "depth", "num_heads", "mlp_dim", "patch_size", "resnet_units")


@dataclass
class LoadReport:
    """What :func:`load_pretrained` read and what it changed, for callers that want to say so."""

    path: str
    source: str  # vitkit | official | timm | hf
    notes: list[str] = field(default_factory=list)


@dataclass
class _Loaded:
    state: dict[str, torch.Tensor]
    cfg: ViTConfig | ResNetConfig
    source: str
    preprocessing: Preprocessing | None = None
    notes: list[str] = field(default_factory=list)


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder stands for its best checkpoint (else its last); other paths as they are."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or folder")
    if p.is_dir():
        for cand in ("best.safetensors", "model.safetensors", "last.safetensors"):
            if (p / cand).is_file():
                return p / cand
        ckpts = sorted((p / "checkpoints").glob("step_*.safetensors")) if (p / "checkpoints").is_dir() else []
        if ckpts:
            return ckpts[-1]
        if (p / "pytorch_model.bin").is_file():
            return p / "pytorch_model.bin"
        raise CheckpointError(f"{p}: folder holds no checkpoint (looked for best/model/last.safetensors)")
    return p


def read_any(path: str | Path, num_heads: int | None = None) -> _Loaded:
    """Read a weight file of any supported format into vitkit names and an inferred config."""
    given = Path(path)
    p = resolve_checkpoint(given)
    hf_cfg = read_hf_dir(p.parent) if p.name in ("model.safetensors", "pytorch_model.bin") else None
    suffix = p.suffix.lower()
    if suffix == ".npz":
        sd, cfg = convert_official(read_npz(p, select=lambda names: select_arrays(names, p)), p)
        return _Loaded(sd, cfg, "official", Preprocessing.for_config(cfg))
    if suffix == ".safetensors":
        if read_safetensors_metadata(p).get("format") == FORMAT:
            sd, cfg, pre, _ = read_native(p)
            return _Loaded(sd, cfg, "vitkit", pre)
        tensors, _ = read_safetensors(p)
    elif suffix in (".bin", ".pth", ".pt"):
        tensors = read_torch_state_dict(p)
    else:
        raise CheckpointError(f"{p}: unknown weight format '{suffix}' (expected .safetensors, .npz, .bin or .pth)")
    keys = set(tensors)
    if is_hf(keys):
        sd, cfg, notes = convert_hf(tensors, hf_cfg, p)
        return _Loaded(sd, cfg, "hf", Preprocessing.for_config(cfg), notes)
    if is_timm(keys):
        heads = num_heads or (hf_cfg or {}).get("num_heads")
        sd, cfg = convert_timm(tensors, p, heads)
        return _Loaded(sd, cfg, "timm", Preprocessing.for_config(cfg))
    if is_official(keys):
        raise CheckpointError(f"{p}: official JAX weights are read from .npz files")
    sample = sorted(keys)[:5]
    raise CheckpointError(f"{p}: tensors are not a ViT vitkit recognises (first keys: {sample})")


def _apply_name(loaded: _Loaded, name: str, path: Path) -> None:
    named = model_config(name)
    if isinstance(named, ResNetConfig) != isinstance(loaded.cfg, ResNetConfig):
        raise CheckpointError(f"{path}: the file holds a {type(loaded.cfg).__name__}, not a {name}")
    if isinstance(named, ViTConfig):
        diff = {f: (getattr(loaded.cfg, f), getattr(named, f)) for f in _ARCH_FIELDS}
        diff = {f: v for f, v in diff.items() if v[0] != v[1]}
        if set(diff) == {"num_heads"}:  # heads are not visible in timm tensors: trust the name
            loaded.cfg = loaded.cfg.replace(num_heads=named.num_heads)
        elif diff:
            detail = ", ".join(f"{f} {a} in the file vs {b} for {name}" for f, (a, b) in diff.items())
            raise CheckpointError(f"{path}: weights do not fit {name}: {detail}")


def _resize_positions(sd: dict[str, torch.Tensor], cfg: ViTConfig, grid: tuple[int, int], mode: str) -> list[str]:
    """Resize the position tables of ``sd`` (in place) from ``cfg``'s grid to ``grid``; the note
    that says so, if anything changed. The 1-D learned table is resized in 2-D (``mode``); the row
    and column tables of "learned2d" and the offset tables of "relative" linearly, in 1-D."""
    old = cfg.grid_size
    if grid == old or cfg.pos_embed not in ("learned", "learned2d", "relative"):
        return []
    if cfg.pos_embed == "learned":
        if "pos_embed" not in sd:
            return []
        sd["pos_embed"] = resample_pos_embed(sd["pos_embed"], grid, old, cfg.pos_prefix_rows, mode=mode)
    elif mode != "bilinear":
        raise UsageError(
            f"pos_embed_mode {mode!r} resizes a 2-D grid; pos_embed={cfg.pos_embed!r} has 1-D tables, "
            "resized linearly: use pos_embed_mode='bilinear'"
        )
    else:
        mode = "linear, 1-D"
        for key in list(sd):
            if key in ("pos_embed_row", "pos_embed_col"):
                sd[key] = resample_1d(sd[key], grid[0] if key == "pos_embed_row" else grid[1])
            elif key.endswith(".attn.rel_embed"):
                sd[key] = resample_relative_embed(sd[key], grid[0] * grid[1], cfg.num_prefix_tokens)
    return [f"position embeddings resized {old[0]}x{old[1]} -> {grid[0]}x{grid[1]} ({mode})"]


def load_pretrained(
    path: str | Path,
    name: str | None = None,
    pos_embed_mode: str = "bilinear",
    num_heads: int | None = None,
    **overrides: Any,
) -> nn.Module:
    """Load weights from any supported file into a vitkit model, in eval mode.

    ``name`` (optional) is checked against the architecture read from the file. ``overrides``
    are config fields: a different ``img_size`` resizes the position embeddings (``pos_embed_mode``
    "bilinear", the official method, or "bicubic"; the 1-D tables of "learned2d" and "relative"
    linearly, in 1-D); a different ``num_classes`` replaces the head
    by a zero-initialised one; others (dropout rates, ``dynamic_img_size``...) are set as given.
    The returned model has ``.load_report`` (a :class:`LoadReport`) and ``.preprocessing``.
    """
    loaded = read_any(path, num_heads=num_heads)
    p = Path(path)
    if name is not None:
        _apply_name(loaded, name, p)
    cfg = loaded.cfg
    sd = dict(loaded.state)
    notes = list(loaded.notes)
    if isinstance(cfg, ViTConfig) and "img_size" in overrides:
        notes += _resize_positions(sd, cfg, cfg.replace(img_size=overrides["img_size"]).grid_size, pos_embed_mode)
    new_classes = overrides.get("num_classes", cfg.num_classes)
    new_classes = 0 if new_classes is None else int(new_classes)
    if new_classes != cfg.num_classes:
        sd.pop("head.weight", None)
        sd.pop("head.bias", None)
        notes.append(
            f"head replaced: {cfg.num_classes} -> {new_classes} classes"
            + (" (zero-initialised)" if new_classes else " (removed)")
        )
    try:
        cfg = cfg.replace(**overrides)
    except ValueError as e:
        raise CheckpointError(f"{p}: {e}") from None
    model = build_model(cfg)
    own = model.state_dict()
    missing = sorted(
        k for k in own if k not in sd and not (k.startswith("head.") and new_classes != loaded.cfg.num_classes)
    )
    unexpected = sorted(k for k in sd if k not in own)
    if missing or unexpected:
        raise CheckpointError(
            f"{p}: keys do not match the {loaded.source} model: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    bad = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in sd.items() if v.shape != own[k].shape]
    if bad:
        raise CheckpointError(f"{p}: tensor shapes do not match the model: {bad[:6]}")
    model.load_state_dict(sd, strict=False)
    pre = loaded.preprocessing or Preprocessing.for_config(cfg)
    if isinstance(cfg, (ViTConfig, ResNetConfig)):
        pre = Preprocessing(pre.mean, pre.std, tuple(cfg.img_size), pre.interpolation)
    model.preprocessing = pre
    model.load_report = LoadReport(str(p), loaded.source, notes)
    for note in notes:
        log.info("%s: %s", p, note)
    return model.eval()
