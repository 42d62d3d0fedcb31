"""``load_pretrained``: any supported weight file -> a vitkit model, with the same outputs.

Formats are detected from the file: vitkit safetensors (config in the metadata), official JAX
``.npz`` (both key layouts, big_vision too), timm and Hugging Face state dicts (safetensors or a
``weights_only`` PyTorch file; a Hugging Face folder with ``config.json``), and vitkit run folders
(which stand for their best checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, UsageError, VitkitError
from ..models.config import ROPE_POS_EMBEDS, ResNetConfig, ViTConfig
from ..models.posembed import resample_1d, resample_pos_embed, resample_relative_embed
from ..models.registry import HEAD_PREFIXES, RELEASES, build_model, canonical_name, model_config
from ..preprocessing import Preprocessing
from . import values
from .io import read_npz, read_safetensors, read_safetensors_metadata, read_torch_state_dict
from .naflexvit import is_naflexvit, naflexvit_to_timm
from .native import FORMAT, carried_metadata, config_from_meta, preprocessing_from_meta, read_native
from .official import convert_official, is_official, select_arrays
from .peers import (
    HF_FAMILY_DEFAULTS,
    convert_hf,
    convert_timm,
    heads_for,
    hf_family,
    hf_labels,
    hf_preprocessing,
    is_hf,
    is_timm,
    read_hf_dir,
    read_json_beside,
    timm_model_name,
    timm_pooling,
    timm_preprocessing,
    timm_to_vitkit,
)

log = logging.getLogger("vitkit")

# Architecture fields a model name fixes; a file whose tensors disagree is an error.
_ARCH_FIELDS = ("width", "depth", "num_heads", "mlp_dim", "patch_size", "resnet_units", "num_registers", "mlp_type")
# Values a file may not record that the name of a release (models.registry.RELEASES) says.
_RELEASE_FIELDS = ("act", "ln_eps", "pos_embed", "rope_theta")


@dataclass
class LoadReport:
    """What :func:`load_pretrained` read and what it changed, for callers that want to say so.

    Attributes:
        path: the file read.
        source: its format: "vitkit", "official", "timm" or "hf".
        notes: what loading changed (a resized position table, a replaced head...), one line each.
        name: the pretrained name or address the file was fetched for (:mod:`vitkit.hub`); None
            for a file given by its path.
        assumed: config values the file does not record and nothing given said, with the value
            assumed (announced in a warning when the model is loaded).
        metadata: the file's metadata beyond the model's config and preprocessing (class names,
            the training step...): what :func:`vitkit.save_checkpoint` writes again with the model.
    """

    path: str
    source: str  # vitkit | official | timm | hf
    notes: list[str] = field(default_factory=list)
    name: str | None = None  # the pretrained name or address the file was fetched for (vitkit.hub)
    # Config values the file does not record and nothing given said, with the value assumed
    # (announced in a warning when the model is loaded).
    assumed: dict[str, Any] = field(default_factory=dict)
    # The file's metadata beyond the model's config and preprocessing (class names, the training
    # step...): what :func:`vitkit.save_checkpoint` writes again with the model.
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class _Loaded:
    state: dict[str, torch.Tensor]
    cfg: ViTConfig | ResNetConfig
    source: str
    preprocessing: Preprocessing | None = None
    notes: list[str] = field(default_factory=list)
    heads_known: bool = False  # the file gives the number of heads (timm tensors alone do not)
    assumed: dict[str, tuple[Any, str]] = field(default_factory=dict)  # field -> (value assumed, on what grounds)
    metadata: dict[str, str] = field(default_factory=dict)  # a vitkit file's metadata to keep (carried_metadata)
    name: str | None = None  # the vitkit model the file's own config names (a timm hub folder's architecture)


def stored_names(metadata: dict[str, str], num_classes: int) -> list[str] | None:
    """The class names in a file's metadata (key "classes", a JSON list), when they name each
    of ``num_classes`` outputs.

    Args:
        metadata: the file's metadata.
        num_classes: the outputs of the model's head.

    Returns:
        The names, or None.
    """
    try:
        names = json.loads(metadata.get("classes") or "null")
    except (ValueError, RecursionError):
        return None
    if isinstance(names, list) and num_classes and len(names) == num_classes and all(isinstance(n, str) for n in names):
        return names
    return None


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder stands for its best checkpoint (else its last); other paths as they are.

    Args:
        path: a weight file, or a folder: a run folder, or a Hugging Face folder.

    Returns:
        The file: a folder's ``best.safetensors``, ``model.safetensors`` or ``last.safetensors``
        (the first there is), else its latest ``checkpoints/step_*.safetensors``, else its
        ``pytorch_model.bin``; any other path unchanged.

    Raises:
        CheckpointError: nothing at ``path``, or a folder holding none of those files.
    """
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


# What reading a file may raise beyond vitkit's own errors when its tensors or values are not what
# their names promise (a kernel of the wrong rank, a config the constructor refuses...).
_FILE_ERRORS = (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OverflowError, RuntimeError)

# safetensors metadata keys of a timm file written by vitkit: the config and preprocessing that
# timm's tensors do not show (heads, activation, image size...). timm ignores them.
TIMM_CONFIG_KEY = "vitkit_config"
TIMM_PREPROCESSING_KEY = "vitkit_preprocessing"

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # those torch.isfinite takes


def read_any(path: str | Path, num_heads: int | None = None) -> _Loaded:
    """Read a weight file of any supported format into vitkit names and an inferred config.

    Whatever is wrong with the file is a :class:`CheckpointError` naming it.

    Args:
        path: a weight file or a folder (:func:`resolve_checkpoint`).
        num_heads: the attention heads, for a file that does not record them (timm tensors);
            None: assumed from the width.

    Returns:
        What was read: the state dict in vitkit's names (``state``), the config (``cfg``), the
        format (``source``), the preprocessing the file records (or None), notes, the values
        assumed and the metadata to keep.

    Raises:
        CheckpointError: a file that cannot be read or mapped, or that records another number
            of heads than ``num_heads``.
    """
    p = resolve_checkpoint(Path(path))
    try:
        loaded = _read(p, num_heads)
    except VitkitError:
        raise
    except _FILE_ERRORS as e:
        why = f"{type(e).__name__}: {_line(e)}"
        raise CheckpointError(f"{p}: tensors do not form a model vitkit can read ({why})") from e
    if num_heads is not None and loaded.heads_known and loaded.cfg.num_heads != num_heads:
        raise CheckpointError(
            f"{p}: the file records num_heads={loaded.cfg.num_heads}, but num_heads={num_heads} was given"
        )
    return loaded


def _line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return values.printable(lines[0], 200) if lines else type(e).__name__


def _read(p: Path, num_heads: int | None) -> _Loaded:
    in_hf_folder = p.name in ("model.safetensors", "pytorch_model.bin")

    def hf_cfg() -> dict[str, Any] | None:
        return read_hf_dir(p.parent) if in_hf_folder else None

    suffix = p.suffix.lower()
    meta: dict[str, str] = {}
    if suffix == ".npz":
        sd, cfg = convert_official(read_npz(p, select=lambda names: select_arrays(names, p)), p)
        loaded = _Loaded(sd, cfg, "official", Preprocessing.for_config(cfg), heads_known=True)
        if cfg.pos_embed == "none":
            loaded.assumed["img_size"] = (cfg.img_size, "no position table shows it")
        return loaded
    if suffix == ".safetensors":
        if read_safetensors_metadata(p).get("format") == FORMAT:
            sd, cfg, pre, meta = read_native(p)
            return _Loaded(sd, cfg, "vitkit", pre, heads_known=True, metadata=carried_metadata(meta))
        tensors, meta = read_safetensors(p)
    elif suffix in (".bin", ".pth", ".pt"):
        tensors = read_torch_state_dict(p)
    else:
        raise CheckpointError(f"{p}: unknown weight format '{suffix}' (expected .safetensors, .npz, .bin or .pth)")
    keys = set(tensors)
    if is_naflexvit(keys):
        return _read_naflexvit(p, tensors, hf_cfg(), num_heads)
    if is_hf(keys):
        return _read_hf(p, tensors, hf_cfg(), num_heads, in_hf_folder)
    if is_timm(keys):
        if TIMM_CONFIG_KEY in meta:
            return _read_timm_with_config(p, tensors, meta, num_heads)
        return _read_timm(p, tensors, hf_cfg(), num_heads)
    if is_official(keys):
        raise CheckpointError(f"{p}: official JAX weights are read from .npz files")
    sample = sorted(keys)[:5]
    raise CheckpointError(f"{p}: tensors are not a ViT vitkit recognises (first keys: {sample})")


_HF_FAMILY_NAMES = {"dinov2": " for DINOv2", "dinov3": " for DINOv3", "clip": " for CLIP", "siglip": " for SigLIP"}


def _read_hf(
    p: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any] | None, num_heads: int | None, in_folder: bool
) -> _Loaded:
    """A Hugging Face file (a ViT, DINOv2, CLIP or SigLIP image tower), with the ``config.json``
    and ``preprocessor_config.json`` of its folder when it is in one."""
    if config is None and num_heads is None:  # a guess of the heads would give other outputs
        raise CheckpointError(
            f"{p.parent / 'config.json'}: missing; Hugging Face weights keep their number of attention heads "
            "there (or pass num_heads)"
            if in_folder
            else f"{p}: Hugging Face weights without config.json (vitkit reads the one beside model.safetensors "
            "or pytorch_model.bin): the number of attention heads is not in the tensors; pass num_heads"
        )
    sd, cfg, notes = convert_hf(tensors, config, p, num_heads=num_heads)
    if config is not None:  # class names and thresholds that do not fit the head are refused, not dropped
        hf_labels(config, cfg.num_classes, str(p.parent / "config.json"))
    proc = read_json_beside(p, "preprocessor_config.json") if in_folder else None
    pre = hf_preprocessing(proc, p.parent / "preprocessor_config.json") if proc is not None else None
    loaded = _Loaded(sd, cfg, "hf", pre or Preprocessing.for_config(cfg), notes, heads_known=True)
    if config is None:  # what transformers would read from a config.json that leaves them out
        family = hf_family(set(tensors), None)
        said = {"act": cfg.act, "ln_eps": HF_FAMILY_DEFAULTS[family]["ln_eps"]}
        if family == "dinov3":
            said["rope_theta"] = cfg.rope_theta
        why = "Hugging Face's default" + _HF_FAMILY_NAMES.get(family, "")
        loaded.assumed = {k: (v, why) for k, v in said.items()}
    return loaded


def _read_timm(
    p: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any] | None, num_heads: int | None
) -> _Loaded:
    """A timm state dict (or DINOv2's own file), with what the timm hub ``config.json`` of its
    folder says: the architecture (the vitkit model it is, see :func:`timm_model_name`), the heads
    and ``pretrained_cfg``'s preprocessing. Values nothing says are assumed aloud."""
    where = p.parent / "config.json"
    heads = num_heads
    if heads is None and config is not None and "num_heads" in config:
        heads = values.integer(config["num_heads"], str(where), "num_heads")
    notes: list[str] = []
    global_pool = config.get("global_pool") if config is not None else None
    if global_pool is not None and not isinstance(global_pool, str):
        raise CheckpointError(f"{where}: global_pool must be a string, got {values.printable(repr(global_pool), 60)}")
    sd, cfg = convert_timm(tensors, p, heads, notes, global_pool=global_pool)
    pre = timm_preprocessing(config.get("pretrained_cfg"), where) if config is not None else None
    loaded = _Loaded(sd, cfg, "timm", pre or Preprocessing.for_config(cfg), notes, heads_known=heads is not None)
    if config is not None and isinstance(config.get("architecture"), str):
        loaded.name = timm_model_name(config["architecture"])
    if heads is None:
        loaded.assumed["num_heads"] = heads_for(cfg.width)
    dinov3 = cfg.pos_embed in ROPE_POS_EMBEDS
    meta = "storage_tokens" in tensors  # Meta's own DINOv3 file, not timm's
    library = "Meta's DINOv3" if meta else "timm's DINOv3" if dinov3 else "timm's"
    family = " for its DINOv3 models" if dinov3 else " for its CLIP towers" if cfg.pre_norm else ""
    loaded.assumed["act"] = (cfg.act, "Meta's DINOv3" if meta else "timm's default")
    loaded.assumed["ln_eps"] = (cfg.ln_eps, "Meta's DINOv3" if meta else f"timm's default{family}")
    if dinov3:  # RoPE takes any input size: the size the weights were published for, where it is said
        layout = "storage tokens" if meta else "timm's Eva layout with storage tokens"
        loaded.assumed["pos_embed"] = (cfg.pos_embed, f"{library}: {layout} and no position table")
        if not any(k.endswith("rope_embed.periods") for k in tensors):  # Meta's files hold the periods, checked
            loaded.assumed["rope_theta"] = (cfg.rope_theta, library)
        if pre is not None and all(s % p == 0 for s, p in zip(pre.img_size, cfg.patch_size)):
            loaded.cfg = cfg.replace(img_size=tuple(pre.img_size))
    elif cfg.pos_embed == "none":
        loaded.assumed["img_size"] = (cfg.img_size, "no position table shows it")
    _, pooling_grounds = timm_pooling(tensors, global_pool, p)
    if pooling_grounds is not None:  # the pooling the tensors do not show: the default of the file's library
        loaded.assumed["classifier"] = (cfg.classifier, pooling_grounds)
    return loaded


def _read_naflexvit(
    p: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any] | None, num_heads: int | None
) -> _Loaded:
    """A timm NaFlexVit file: read as timm's plain ViT, with what its layout fixes and what timm's
    NaFlexVit assumes (the activation, how the position table follows another grid) said aloud."""
    plain, fixed, assumed = naflexvit_to_timm(tensors, p)
    loaded = _read_timm(p, plain, config, num_heads)
    values = {**fixed, **{k: v for k, (v, _) in assumed.items()}}
    loaded.cfg = loaded.cfg.replace(**values)
    loaded.assumed.pop("act", None)
    loaded.assumed.update(assumed)
    loaded.assumed.pop("ln_eps", None)  # timm's 1e-6, as its plain ViT's
    loaded.assumed["ln_eps"] = (loaded.cfg.ln_eps, "timm's NaFlexVit")
    if loaded.preprocessing.img_size != loaded.cfg.img_size:
        loaded.preprocessing = Preprocessing.for_config(loaded.cfg)
    return loaded


def _read_timm_with_config(p: Path, tensors: dict, meta: dict[str, str], num_heads: int | None) -> _Loaded:
    """A timm file vitkit wrote: the config and preprocessing in its metadata are the model's."""
    cfg = config_from_meta({"config": meta[TIMM_CONFIG_KEY]}, p)
    if not isinstance(cfg, ViTConfig):
        raise CheckpointError(f"{p}: vitkit metadata of a timm file must hold a ViT config")
    if num_heads is not None and num_heads != cfg.num_heads:
        raise CheckpointError(f"{p}: the file records num_heads={cfg.num_heads}, but num_heads={num_heads} was given")
    pre = (
        preprocessing_from_meta(meta, cfg, p, TIMM_PREPROCESSING_KEY)
        if TIMM_PREPROCESSING_KEY in meta
        else Preprocessing.for_config(cfg)
    )
    return _Loaded(timm_to_vitkit(tensors, p), cfg, "timm", pre, heads_known=True)


# The command-line option of ``vitkit convert`` that sets each value a file may not record.
_CONVERT_OPTIONS = {
    "num_heads": "--num-heads",
    "act": "--act",
    "ln_eps": "--ln-eps",
    "img_size": "--img-size",
    "classifier": "--classifier",
}


def _assumed_warning(path: Path, assumed: dict[str, tuple[Any, str]]) -> str:
    """One line: which values ``path`` does not record, what was assumed for each and why, and
    how to give them."""
    names = list(assumed)
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" or {names[-1]}"
    said = ", ".join(f"{k}={_shown(v)} ({why})" for k, (v, why) in assumed.items())
    given = ", ".join(f"{k}=..." for k in names)
    flags = " ".join(f"{_CONVERT_OPTIONS[k]} ..." for k in names if k in _CONVERT_OPTIONS)
    return (
        f"warning: {path}: the file does not record {listed}; assumed {said}. If the weights were made "
        f"otherwise their outputs are wrong: pass {given} to load_pretrained, or write a vitkit file that "
        f"records them with vitkit convert {path} OUT.safetensors {flags}"
    )


def _shown(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2:
        return f"{value[0]}x{value[1]}"
    return repr(value)


def _apply_name(loaded: _Loaded, name: str, path: Path) -> None:
    named = model_config(name)
    if isinstance(named, ResNetConfig) != isinstance(loaded.cfg, ResNetConfig):
        raise CheckpointError(f"{path}: the file holds a {type(loaded.cfg).__name__}, not a {name}")
    if isinstance(named, ViTConfig):
        diff = {f: (getattr(loaded.cfg, f), getattr(named, f)) for f in _ARCH_FIELDS}
        diff = {f: v for f, v in diff.items() if v[0] != v[1]}
        if set(diff) == {"num_heads"} and not loaded.heads_known:  # not in timm tensors: trust the name
            loaded.cfg = loaded.cfg.replace(num_heads=named.num_heads)
        elif diff:
            detail = ", ".join(f"{f} {a} in the file vs {b} for {name}" for f, (a, b) in diff.items())
            raise CheckpointError(f"{path}: weights do not fit {name}: {detail}")
        loaded.assumed.pop("num_heads", None)  # the name says it
        if canonical_name(name) in RELEASES:  # a release's name says how its authors built it
            said = {f: getattr(named, f) for f in _RELEASE_FIELDS if f in loaded.assumed}
            loaded.cfg = loaded.cfg.replace(**said)
            for f in said:
                loaded.assumed.pop(f)


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


def _adapt_distill_token(sd: dict[str, torch.Tensor], old: ViTConfig, new: ViTConfig) -> list[str]:
    """DeiT fine-tuning across the distillation token, in place on ``sd``; the note that says so.

    A file without the token, loaded with ``distill_token=True``, gets it as a copy of its class
    token, with the class token's position row (when the class token has one), and a distillation
    head as a copy of its head (when the head is kept): the two heads start out identical and
    near the file's predictions (every token now also attends to the copy), and DeiT's training
    pulls them apart. A distilled file loaded with
    ``distill_token=False`` loses the token, its position row and its head."""
    if old.distill_token == new.distill_token:
        return []
    if old.pos_embed == "relative":  # its offset tables count the prefix tokens
        raise UsageError(
            "distill_token cannot be switched on a model with pos_embed='relative': its offset tables "
            "count the prefix tokens; build the model anew"
        )
    rows = old.pos_prefix_rows
    if new.distill_token:
        sd["dist_token"] = sd["cls_token"].clone()
        if rows and "pos_embed" in sd:
            pe = sd["pos_embed"]
            sd["pos_embed"] = torch.cat([pe[:, :1], pe[:, :1], pe[:, 1:]], dim=1)
        for part in ("weight", "bias"):
            if f"head.{part}" in sd:
                sd[f"head_dist.{part}"] = sd[f"head.{part}"].clone()
        return ["distillation token added: a copy of the class token (its position row and head too)"]
    sd.pop("dist_token", None)
    sd.pop("head_dist.weight", None)
    sd.pop("head_dist.bias", None)
    if rows and "pos_embed" in sd:
        pe = sd["pos_embed"]
        sd["pos_embed"] = torch.cat([pe[:, :1], pe[:, 2:]], dim=1)
    return ["distillation token removed, with its position row and head"]


def _drop_replaced_heads(sd: dict[str, torch.Tensor], old: int, new: int) -> list[str]:
    """A new class count: the heads' tensors leave ``sd`` (the model's zero-initialised ones stay)."""
    if new == old:
        return []
    for key in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):
        sd.pop(key, None)
    return [f"head replaced: {old} -> {new} classes" + (" (zero-initialised)" if new else " (removed)")]


def _check_file(loaded: _Loaded, path: Path, replace_head: bool, allow_nonfinite: bool) -> None:
    """The file's tensors against the model its config describes, before any real model is built:
    the config may not ask for more blocks than the file has tensors (each costs memory), every
    tensor has the name and shape of the model's (compared with a model built on the ``meta``
    device, which allocates nothing), and every value is finite. ``replace_head``: the head is
    about to be replaced, so its tensors need not be there (nor be finite)."""
    cfg, sd = loaded.cfg, loaded.state
    stages = cfg.units if isinstance(cfg, ResNetConfig) else cfg.resnet_units or ()
    blocks = sum(stages) + (cfg.depth if isinstance(cfg, ViTConfig) else 0)
    if blocks > len(sd):
        raise CheckpointError(
            f"{path}: the config asks for {blocks} blocks and units, but the file holds only {len(sd)} tensors"
        )
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            own = {k: v.shape for k, v in build_model(cfg).state_dict().items()}
    except _FILE_ERRORS as e:
        raise CheckpointError(f"{path}: the file's model config cannot be built ({_line(e)})") from e
    missing = sorted(k for k in own if k not in sd and not (k.startswith(HEAD_PREFIXES) and replace_head))
    unexpected = sorted(k for k in sd if k not in own)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: keys do not match the {loaded.source} model: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    bad = [f"{k} {tuple(v.shape)} vs {tuple(own[k])}" for k, v in sd.items() if v.shape != own[k]]
    if bad:
        raise CheckpointError(f"{path}: tensor shapes do not match the model: {bad[:6]}")
    for k, v in sd.items():
        if v.is_complex():
            raise CheckpointError(f"{path}: tensor {k!r} is complex ({v.dtype}); model weights are real")
        if allow_nonfinite or (replace_head and k.startswith(HEAD_PREFIXES)) or not v.is_floating_point():
            continue
        v = v if v.dtype in _FLOATS else v.float()  # float8 has no isfinite
        if v.numel() and not all(math.isfinite(float(e)) for e in torch.aminmax(v)):  # one pass; NaN propagates
            count = int((~torch.isfinite(v)).sum())
            raise CheckpointError(
                f"{path}: tensor {k!r} holds {count} non-finite value(s) (NaN or inf) of {v.numel()}: "
                "the weights are damaged (pass allow_nonfinite=True to load them anyway)"
            )


def _build_loaded(
    cfg: ViTConfig | ResNetConfig, sd: dict[str, torch.Tensor], p: Path, source: str, new_head: bool
) -> nn.Module:
    """The model of ``cfg`` holding ``sd`` when names and shapes match (a replaced head's keys may
    be missing: that head is zero); otherwise one :class:`CheckpointError` naming the file and the
    first differences. No random weights are drawn first (:func:`.build_model`'s ``state``)."""
    with torch.device("meta"):
        own = build_model(cfg).state_dict()
    missing = sorted(k for k in own if k not in sd and not (k.startswith(HEAD_PREFIXES) and new_head))
    unexpected = sorted(k for k in sd if k not in own)
    if missing or unexpected:
        raise CheckpointError(
            f"{p}: keys do not match the {source} model: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    bad = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in sd.items() if v.shape != own[k].shape]
    if bad:
        raise CheckpointError(f"{p}: tensor shapes do not match the model: {bad[:6]}")
    return build_model(cfg, state=sd)


def load_pretrained(
    path: str | Path,
    name: str | None = None,
    pos_embed_mode: str = "bilinear",
    num_heads: int | None = None,
    *,
    allow_nonfinite: bool = False,
    features_only: bool = False,
    out_indices: int | list[int] | None = None,
    **overrides: Any,
) -> nn.Module:
    """Load weights from any supported file into a vitkit model, in eval mode.

    ``name`` (optional) is checked against the architecture read from the file. ``overrides``
    are config fields: a different ``img_size`` resizes the position embeddings (``pos_embed_mode``
    "bilinear", the official method, or "bicubic"; the 1-D tables of "learned2d" and "relative"
    linearly, in 1-D); a different ``num_classes`` replaces the head
    by a zero-initialised one; a ``classifier`` other than "token" on weights with a class token keeps
    the token in the sequence (``class_token=True``), left out of the pooling; others
    (dropout rates, ``dynamic_img_size``...) are set as given.
    ``num_heads`` gives the heads where the file does not (timm tensors, Hugging Face weights
    without config.json); a file that records them must agree. A value the file does not
    record and nothing given says (timm's tensors show neither the heads, the activation, the
    LayerNorm epsilon nor the pooling) is assumed, the default of the library whose layout the
    file has, and a warning (logger ``vitkit``) names each value assumed, on what grounds, and how
    to give it; they are in ``load_report.assumed``. Weights holding NaN or inf are refused unless
    ``allow_nonfinite``.
    The returned model has ``.load_report`` (a :class:`LoadReport`), ``.preprocessing`` and
    ``.class_names`` (the names stored with the weights, one per class, or None).
    ``features_only`` (with ``out_indices``) returns it wrapped as
    ``create_model(..., features_only=True)`` does: a list of NCHW feature maps and ``feature_info``.
    Whatever is wrong with the file is a :class:`CheckpointError` naming it.

    Args:
        path: a weight file (vitkit, official ``.npz``, timm or Hugging Face) or a run folder.
        name: the model the file is expected to hold (a vitkit name); None: whatever it holds.
        pos_embed_mode: how position tables are resized for another ``img_size``: "bilinear"
            or "bicubic".
        num_heads: the attention heads, for a file that does not record them.
        allow_nonfinite: load weights holding NaN or inf instead of refusing them.
        features_only: return the features-only wrapper.
        out_indices: with ``features_only``, the blocks or maps to return.
        **overrides: config fields to change (``img_size``, ``num_classes``, dropout rates...).

    Returns:
        The model in eval mode, with ``.load_report``, ``.preprocessing`` and ``.class_names``.

    Raises:
        CheckpointError: a file that cannot be read, does not fit ``name``, holds non-finite
            weights, or cannot take the ``overrides``.
        UsageError: ``out_indices`` without ``features_only``, or a model that would not fit
            the memory left.
    """
    if out_indices is not None and not features_only:
        raise UsageError("out_indices picks the maps of a features_only=True model; pass features_only=True too")
    loaded = read_any(path, num_heads=num_heads)
    p = Path(path)
    name = name or loaded.name
    if name is not None:
        _apply_name(loaded, name, p)
    assumed = {k: v for k, v in loaded.assumed.items() if k not in overrides}
    cfg = loaded.cfg
    new_classes = overrides.get("num_classes", cfg.num_classes)
    new_classes = 0 if new_classes is None else int(new_classes)
    _check_file(loaded, p, new_classes != cfg.num_classes, allow_nonfinite)
    keep_token = overrides.get("classifier", "token") != "token" and "class_token" not in overrides
    if isinstance(cfg, ViTConfig) and cfg.has_class_token and keep_token:  # the weights' class token stays
        overrides = {**overrides, "class_token": True}
    try:  # what the caller asks for is checked before any tensor is touched
        target = cfg.replace(**overrides)
    except ValueError as e:
        raise CheckpointError(f"{p}: {e}") from None
    values.check_grid(target, f"{p}")
    sd = dict(loaded.state)
    notes = list(loaded.notes)
    if isinstance(cfg, ViTConfig) and "img_size" in overrides:
        notes += _resize_positions(sd, cfg, target.grid_size, pos_embed_mode)
    if isinstance(cfg, ViTConfig):
        notes += _adapt_distill_token(sd, cfg, target)
    notes += _drop_replaced_heads(sd, cfg.num_classes, new_classes)
    cfg = target
    model = _build_loaded(cfg, sd, p, loaded.source, new_head=new_classes != loaded.cfg.num_classes)
    pre = loaded.preprocessing or Preprocessing.for_config(cfg)
    if isinstance(cfg, (ViTConfig, ResNetConfig)):
        pre = dataclasses.replace(pre, img_size=tuple(cfg.img_size))
    model.preprocessing = pre
    metadata = dict(loaded.metadata)
    if loaded.source == "hf" and "classes" not in metadata and p.exists():
        from .peers import hf_label_metadata

        metadata.update(hf_label_metadata(p if p.is_dir() else p.parent))  # config.json's id2label
    if new_classes != loaded.cfg.num_classes:
        metadata.pop("classes", None)  # the names of the replaced head's classes
    said = {k: v for k, (v, _) in assumed.items()}
    model.load_report = LoadReport(str(p), loaded.source, notes, assumed=said, metadata=metadata)
    model.class_names = stored_names(metadata, new_classes)
    for note in notes:
        log.info("%s: %s", p, note)
    if assumed:
        log.warning("%s", _assumed_warning(p, assumed))
    if features_only:
        from ..models.features import features_model

        wrapped = features_model(model.eval(), out_indices)
        wrapped.preprocessing, wrapped.load_report = model.preprocessing, model.load_report
        wrapped.class_names = model.class_names
        return wrapped.eval()
    return model.eval()
