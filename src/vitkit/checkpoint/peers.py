"""timm and Hugging Face ``transformers`` ViT state dicts <-> vitkit.

vitkit's parameter names follow timm's for the plain ViT, so the timm mapping is nearly the
identity; Hugging Face splits q, k and v and names the sub-layers differently. The architecture
is read from the tensors (and from the HF ``config.json`` when there is one).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import VIT_SIZES, ViTConfig, hybrid_stem_stride
from ..models.posembed import square_side
from . import values

_UNSUPPORTED_TIMM = (
    "fc_norm.", "reg_token", "attn.q_norm", "attn.k_norm", "ls1.", "ls2.", "norm_pre.",
    "attn_pool.pos_embed", "attn_pool.q_norm", "attn_pool.k_norm",
)  # fmt: skip


def is_timm(keys: set[str]) -> bool:
    return "patch_embed.proj.weight" in keys and any(k.startswith("blocks.0.") for k in keys)


def is_hf(keys: set[str]) -> bool:
    return any(k.startswith(("vit.embeddings.", "embeddings.patch_embeddings.")) for k in keys)


# What timm's VisionTransformer and Hugging Face's ViTConfig use when nothing says otherwise: the
# values a state dict without its config is read with (its tensors show neither).
TIMM_DEFAULTS: dict[str, Any] = {"act": "gelu", "ln_eps": 1e-6}
HF_DEFAULTS: dict[str, Any] = {"act": "gelu", "ln_eps": 1e-12}


def heads_for(width: int) -> tuple[int, str]:
    """The number of attention heads assumed for a ViT of ``width`` whose file does not say it,
    and on what grounds: the standard size of that width (ViT-Ti to ViT-H), else heads of 64
    channels, as in every standard size but ViT-Ti (one head where those do not divide the width).

    Args:
        width: the model's width.

    Returns:
        The heads, and a phrase saying why.
    """
    for size, (w, _, heads, _) in VIT_SIZES.items():
        if w == width:
            return heads, f"ViT-{size}'s, the standard ViT of width {width}"
    heads = max(1, width // 64)
    if width % heads:
        heads = 1
    if heads * 64 == width:
        return heads, f"width {width} in heads of 64 channels"
    plural = "s" if heads > 1 else ""
    return heads, f"{heads} head{plural} of {width // heads} channels: width {width} is not a multiple of 64"


def _grid_img(num_pos: int, patch: tuple[int, int], stride: int, path: Any) -> tuple[int, int]:
    """The image size whose token grid is the square of ``num_pos`` cells."""
    side = square_side(num_pos)
    if side is None:
        raise CheckpointError(f"{path}: {num_pos} position embeddings do not form a square grid")
    return (side * patch[0] * stride, side * patch[1] * stride)


# ---------------------------------------------------------------------------------------------
# timm


def _timm_backbone_key(k: str) -> str:
    """timm's hybrid backbone names -> vitkit's. A ResNet with stages is timm's ``ResNetV2``
    (``stem.conv``, ``stages.{s}.blocks.{u}.norm{n}``, ``downsample``); the root alone is its bare
    stem (``patch_embed.backbone.conv`` / ``.norm``: ``create_resnetv2_stem``)."""
    k = re.sub(r"^patch_embed\.backbone\.(stem\.)?conv\.", "patch_embed.backbone.conv_root.", k)
    k = re.sub(r"^patch_embed\.backbone\.(stem\.)?norm\.", "patch_embed.backbone.gn_root.", k)
    m = re.match(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.(.*)", k)
    if m:
        s, u, rest = m.groups()
        rest = re.sub(r"^norm(\d)\.", r"gn\1.", rest)
        rest = rest.replace("downsample.conv.", "conv_proj.").replace("downsample.norm.", "gn_proj.")
        k = f"patch_embed.backbone.stages.{s}.{u}.{rest}"
    return k


def _vitkit_backbone_key(k: str, stem_only: bool) -> str:
    """The inverse of :func:`_timm_backbone_key`."""
    root = "patch_embed.backbone." if stem_only else "patch_embed.backbone.stem."
    k = k.replace("patch_embed.backbone.conv_root.", f"{root}conv.").replace(
        "patch_embed.backbone.gn_root.", f"{root}norm."
    )
    m = re.match(r"patch_embed\.backbone\.stages\.(\d+)\.(\d+)\.(.*)", k)
    if m:
        s, u, rest = m.groups()
        rest = re.sub(r"^gn(\d)\.", r"norm\1.", rest)
        rest = rest.replace("conv_proj.", "downsample.conv.").replace("gn_proj.", "downsample.norm.")
        k = f"patch_embed.backbone.stages.{s}.blocks.{u}.{rest}"
    return k


def _count_units(sd: dict[str, torch.Tensor]) -> tuple[int, ...]:
    """Units per stage of a timm hybrid backbone, from ``patch_embed.backbone.stages.{s}.{u}.*``."""
    counts: dict[int, int] = {}
    for k in sd:
        m = re.match(r"patch_embed\.backbone\.stages\.(\d+)\.(\d+)\.", k)
        if m:
            s, u = int(m.group(1)), int(m.group(2))
            counts[s] = max(counts.get(s, 0), u + 1)
    return tuple(counts[s] for s in sorted(counts))


def timm_to_vitkit(sd: dict[str, torch.Tensor], path: Any = "<timm>") -> dict[str, torch.Tensor]:
    """timm parameter names -> vitkit's (float32), refusing timm features vitkit does not have."""
    bad = sorted(k for k in sd if any(p in k for p in _UNSUPPORTED_TIMM))
    if bad:
        raise CheckpointError(
            f"{path}: timm features vitkit's ViT does not have (norm after pooling, "
            f"register tokens, qk-norm, layer scale...): {bad[:6]}"
        )
    out = {}
    for k, v in sd.items():
        k = k.replace("pre_logits.fc.", "pre_logits.")
        out[_timm_backbone_key(k)] = v.float()
    return out


def convert_timm(sd: dict[str, torch.Tensor], path: Any = "<timm>", num_heads: int | None = None):
    """timm ``VisionTransformer`` state dict -> (vitkit state dict, config read off the tensors)."""
    out = timm_to_vitkit(sd, path)
    latents = out["attn_pool.latent"].shape[1] if "attn_pool.latent" in out else 1
    if latents != 1:
        raise CheckpointError(f"{path}: timm attention pooling with {latents} latent tokens; vitkit's MAP head has one")
    if "attn_pool.latent" in out and "cls_token" in out:
        raise CheckpointError(
            f"{path}: a class token and attention pooling (global_pool='map'); vitkit pools with one of them"
        )
    w = out["patch_embed.proj.weight"]  # (D, C, ph, pw)
    width, cin, ph, pw = w.shape
    depth = 1 + max(int(m.group(1)) for k in out if (m := re.match(r"blocks\.(\d+)\.", k)))
    units = None
    if "patch_embed.backbone.conv_root.weight" in out:
        cin = out["patch_embed.backbone.conv_root.weight"].shape[1]
        units = _count_units(out)
    stride = hybrid_stem_stride(units)
    classifier = "token" if "cls_token" in out else "map" if "attn_pool.latent" in out else "gap"
    distill = "dist_token" in out  # DeiT's distilled models: a second prefix token and head_dist
    prefix = (1 if classifier == "token" else 0) + (1 if distill else 0)
    img = (224, 224)
    if "pos_embed" in out:
        img = _grid_img(out["pos_embed"].shape[1] - prefix, (ph, pw), stride, path)
    cfg = ViTConfig(
        img_size=img,
        patch_size=(ph, pw),
        in_chans=cin,
        num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0,
        width=width,
        depth=depth,
        num_heads=num_heads or heads_for(width)[0],
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
        classifier=classifier,
        representation_size=out["pre_logits.weight"].shape[0] if "pre_logits.weight" in out else None,
        pos_embed="learned" if "pos_embed" in out else "none",
        act=TIMM_DEFAULTS["act"],
        ln_eps=TIMM_DEFAULTS["ln_eps"],
        resnet_units=units,
        resnet_width=out["patch_embed.backbone.conv_root.weight"].shape[0] if units else 64,
        distill_token=distill,
    )
    return out, cfg


# Parameter names (last component) of the position embeddings timm and Hugging Face cannot hold.
_POS_KINDS = {
    "pos_embed_row": "learned2d",
    "pos_embed_col": "learned2d",
    "pos_embed_prefix": "learned2d",
    "rel_embed": "relative",
}


def check_timm(cfg: Any) -> None:
    """Refuse a model timm's ``VisionTransformer`` cannot be: a BiT ResNet, or position
    embeddings other than one learned 1-D table (or none)."""
    if not isinstance(cfg, ViTConfig):
        what = type(cfg).__name__
        raise CheckpointError(f"timm's VisionTransformer holds ViTs, not a {what}; export to vitkit instead")
    if cfg.pos_embed in ("sincos2d", "learned2d", "relative"):
        raise CheckpointError(
            f"timm's VisionTransformer holds one learned 1-D position table, not pos_embed={cfg.pos_embed!r}; "
            "export to vitkit instead"
        )


def to_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig | None = None) -> dict[str, torch.Tensor]:
    """vitkit ViT state dict -> timm names (the pre-logits layer as ``pre_logits.fc``, a hybrid's
    ResNet as timm's ``ResNetV2`` or, the root alone, its bare stem; a MAP head keeps its names,
    timm's ``attn_pool``; a distillation token and head keep theirs, those of timm's
    ``VisionTransformerDistilled``).
    timm's ViT has one learned 1-D position table at most: "learned2d" and "relative" tables
    (``pos_embed_row``..., ``blocks.{i}.attn.rel_embed``) are refused, and with ``cfg`` the fixed
    "sincos2d" table (not in the state dict) and BiT ResNets too (:func:`check_timm`). What
    timm's tensors do not show (heads, activation, image size...) :func:`vitkit.export.export_weights`
    keeps in the file's metadata, for vitkit to read back."""
    if cfg is not None:
        check_timm(cfg)
    hybrid = any(k.startswith("patch_embed.backbone.") for k in sd)
    stem_only = hybrid and not any(k.startswith("patch_embed.backbone.stages.") for k in sd)
    kind = next((_POS_KINDS[k.rsplit(".", 1)[-1]] for k in sd if k.rsplit(".", 1)[-1] in _POS_KINDS), None)
    if kind is not None:
        raise CheckpointError(
            f"timm's VisionTransformer holds one learned 1-D position table, not pos_embed={kind!r}; "
            "export to vitkit instead"
        )
    return {_vitkit_backbone_key(k.replace("pre_logits.", "pre_logits.fc."), stem_only): v for k, v in sd.items()}


# ---------------------------------------------------------------------------------------------
# Hugging Face transformers (ViTModel / ViTForImageClassification)


_HF_V5_NAMES = [  # transformers >= 5 module names -> the names its files (and older versions) use
    (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
]


def _hf_legacy_name(key: str) -> str:
    for pattern, repl in _HF_V5_NAMES:
        key = re.sub(pattern, repl, key)
    return key


def convert_hf(
    sd: dict[str, torch.Tensor],
    hf_config: dict[str, Any] | None = None,
    path: Any = "<hf>",
    num_heads: int | None = None,
) -> tuple[dict[str, torch.Tensor], ViTConfig, list[str]]:
    """HF ViT state dict (+ its ``config.json``) -> (vitkit state dict, config, notes).

    The number of heads is not in the tensors: it comes from ``config.json`` (where a key
    Hugging Face left out has its default, 12 heads) or from ``num_heads``; without either
    the weights are refused. The values read from ``config.json`` are checked."""
    sd = {_hf_legacy_name(k): v for k, v in sd.items()}
    p = "vit." if any(k.startswith("vit.") for k in sd) else ""
    notes: list[str] = []
    used: set[str] = set()

    def take(k: str) -> torch.Tensor:
        if k not in sd:
            raise CheckpointError(f"{path}: missing tensor {k!r}")
        used.add(k)
        return sd[k].float()

    out: dict[str, torch.Tensor] = {}
    emb = f"{p}embeddings."
    out["patch_embed.proj.weight"] = take(f"{emb}patch_embeddings.projection.weight")
    out["patch_embed.proj.bias"] = take(f"{emb}patch_embeddings.projection.bias")
    out["cls_token"] = take(f"{emb}cls_token")
    out["pos_embed"] = take(f"{emb}position_embeddings")
    depth = 1 + max(int(m.group(1)) for k in sd if (m := re.match(rf"{re.escape(p)}encoder\.layer\.(\d+)\.", k)))
    for i in range(depth):
        src, dst = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        for t in ("weight", "bias"):
            out[dst + f"norm1.{t}"] = take(src + f"layernorm_before.{t}")
            out[dst + f"norm2.{t}"] = take(src + f"layernorm_after.{t}")
            out[dst + f"attn.qkv.{t}"] = torch.cat(
                [take(src + f"attention.attention.{n}.{t}") for n in ("query", "key", "value")], dim=0
            )
            out[dst + f"attn.proj.{t}"] = take(src + f"attention.output.dense.{t}")
            out[dst + f"mlp.fc1.{t}"] = take(src + f"intermediate.dense.{t}")
            out[dst + f"mlp.fc2.{t}"] = take(src + f"output.dense.{t}")
    out["norm.weight"] = take(f"{p}layernorm.weight")
    out["norm.bias"] = take(f"{p}layernorm.bias")
    has_head = "classifier.weight" in sd
    if has_head:
        out["head.weight"] = take("classifier.weight")
        out["head.bias"] = take("classifier.bias")
    pooler = f"{p}pooler.dense.weight"
    if pooler in sd and not has_head:
        # ViTModel's pooler (dense + tanh on the class token) is the paper's pre-logits layer.
        out["pre_logits.weight"] = take(pooler)
        out["pre_logits.bias"] = take(f"{p}pooler.dense.bias")
    unused = sorted(set(sd) - used)
    if unused:
        notes.append(f"ignored tensors not used by image classification: {unused[:6]}")
    width, cin, ph, pw = out["patch_embed.proj.weight"].shape
    where = str(Path(path).parent / "config.json")
    heads, act, eps, img = _hf_settings(hf_config, out, num_heads, where, path)
    try:
        cfg = ViTConfig(
            img_size=img,
            patch_size=(ph, pw),
            in_chans=cin,
            num_classes=out["head.weight"].shape[0] if has_head else 0,
            width=width,
            depth=depth,
            num_heads=heads,
            mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
            classifier="token",
            representation_size=out["pre_logits.weight"].shape[0] if "pre_logits.weight" in out else None,
            act="gelu" if act == "gelu" else "gelu_tanh",
            ln_eps=eps,
        )
    except ValueError as e:  # heads that do not divide the width, most likely
        raise CheckpointError(f"{where if hf_config is not None else path}: {e}") from None
    return out, cfg, notes


def _hf_settings(
    hf_config: dict[str, Any] | None, out: dict[str, torch.Tensor], num_heads: int | None, where: str, path: Any
) -> tuple[int, str, float, tuple[int, int]]:
    """Heads, activation, LayerNorm epsilon and image size of a Hugging Face ViT: the values of
    its ``config.json`` (checked; a key it leaves out has Hugging Face's default), the heads
    from ``num_heads`` without one, the image size from the grid of position embeddings."""
    if hf_config is None and num_heads is None:
        raise CheckpointError(
            f"{path}: Hugging Face weights without their config.json (looked for {where}): the number of "
            "attention heads is not in the tensors; put config.json beside them or pass num_heads"
        )
    width, _, ph, pw = out["patch_embed.proj.weight"].shape
    if hf_config is None:
        heads, hf_config = num_heads, {}
    elif "num_attention_heads" in hf_config:
        heads = values.integer(hf_config["num_attention_heads"], where, "num_attention_heads")
    elif width % 12 == 0:
        heads = 12  # what Hugging Face reads from a config.json that leaves its default out
    else:
        raise CheckpointError(
            f"{where}: no num_attention_heads, and Hugging Face's default of 12 does not divide the width {width}"
        )
    act = hf_config.get("hidden_act", HF_DEFAULTS["act"])
    if not isinstance(act, str) or act not in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        raise CheckpointError(f"{where}: hidden_act {act!r} is not supported (gelu or gelu_pytorch_tanh)")
    eps = hf_config.get("layer_norm_eps", HF_DEFAULTS["ln_eps"])
    eps = values.number(eps, where, "layer_norm_eps", 0.0, 1.0, lo_open=True)
    num_patches = out["pos_embed"].shape[1] - 1
    img = _grid_img(num_patches, (ph, pw), 1, path) if square_side(num_patches) else None
    if "image_size" in hf_config:  # a rectangular image size (Hugging Face takes a pair) names the grid
        h, w = values.size_pair(hf_config["image_size"], where, "image_size")
        if h % ph == 0 and w % pw == 0 and (h // ph) * (w // pw) == num_patches:
            img = (h, w)
    if img is None:
        img = _grid_img(num_patches, (ph, pw), 1, path)  # the error: not a square, and not the config's
    return heads, act, eps, img


def check_hf(cfg: Any, has_head: bool | None = None, has_pre_logits: bool | None = None) -> None:
    """Refuse a model Hugging Face's ``ViTModel`` / ``ViTForImageClassification`` cannot be:
    only plain class-token ViTs with one learned 1-D position table that the class token shares,
    and a pre-logits layer only without a head (as ``ViTModel``'s pooler). ``has_head`` and
    ``has_pre_logits`` default to what ``cfg`` says."""
    if not isinstance(cfg, ViTConfig):
        raise CheckpointError(f"Hugging Face ViT holds ViTs, not a {type(cfg).__name__}; export to vitkit instead")
    if cfg.pos_embed != "learned":
        raise CheckpointError(
            f"Hugging Face ViT holds one learned 1-D position table, not pos_embed={cfg.pos_embed!r}; "
            "export to vitkit instead"
        )
    if cfg.distill_token:
        raise CheckpointError(
            "Hugging Face ViT has no distillation token (DeiT's distilled models are another model type there); "
            "export to vitkit or timm instead"
        )
    if cfg.classifier != "token" or cfg.resnet_units is not None:
        what = "a hybrid" if cfg.resnet_units is not None else f"classifier={cfg.classifier!r}"
        raise CheckpointError(
            f"Hugging Face ViT holds only plain, class-token models with learned position embeddings, not {what}; "
            "export to vitkit instead"
        )
    if not cfg.cls_pos_embed:
        raise CheckpointError(
            "Hugging Face ViT gives the class token a position embedding; this model has cls_pos_embed=False: "
            "export to vitkit instead"
        )
    has_head = bool(cfg.num_classes) if has_head is None else has_head
    has_pre_logits = bool(cfg.representation_size) if has_pre_logits is None else has_pre_logits
    if has_head and has_pre_logits:
        raise CheckpointError(
            "Hugging Face ViTForImageClassification has no pre-logits layer: drop it or the head "
            "(num_classes=0 keeps it, as ViTModel's pooler), or export to vitkit instead"
        )


def to_hf(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """vitkit plain-ViT (token classifier) -> ``ViTForImageClassification`` state dict
    (or ``ViTModel`` with its pooler when the model has a pre-logits layer and no head);
    what Hugging Face cannot hold is refused (:func:`check_hf`)."""
    has_head = "head.weight" in sd
    check_hf(cfg, has_head, "pre_logits.weight" in sd)
    p = "vit." if has_head else ""
    D = cfg.width
    out = {
        f"{p}embeddings.cls_token": sd["cls_token"],
        f"{p}embeddings.position_embeddings": sd["pos_embed"],
        f"{p}embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        f"{p}embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        f"{p}layernorm.weight": sd["norm.weight"],
        f"{p}layernorm.bias": sd["norm.bias"],
    }
    for i in range(cfg.depth):
        src, dst = f"blocks.{i}.", f"{p}encoder.layer.{i}."
        for t in ("weight", "bias"):
            out[dst + f"layernorm_before.{t}"] = sd[src + f"norm1.{t}"]
            out[dst + f"layernorm_after.{t}"] = sd[src + f"norm2.{t}"]
            qkv = sd[src + f"attn.qkv.{t}"]
            for j, n in enumerate(("query", "key", "value")):
                out[dst + f"attention.attention.{n}.{t}"] = qkv[j * D : (j + 1) * D]
            out[dst + f"attention.output.dense.{t}"] = sd[src + f"attn.proj.{t}"]
            out[dst + f"intermediate.dense.{t}"] = sd[src + f"mlp.fc1.{t}"]
            out[dst + f"output.dense.{t}"] = sd[src + f"mlp.fc2.{t}"]
    if has_head:
        out["classifier.weight"] = sd["head.weight"]
        out["classifier.bias"] = sd["head.bias"]
    elif "pre_logits.weight" in sd:
        out["pooler.dense.weight"] = sd["pre_logits.weight"]
        out["pooler.dense.bias"] = sd["pre_logits.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def hf_config_for(cfg: ViTConfig) -> dict[str, Any]:
    """The ``config.json`` a Hugging Face ``ViTConfig`` needs for :func:`to_hf`'s output."""
    return {
        "model_type": "vit",
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu" if cfg.act == "gelu" else "gelu_pytorch_tanh",
        "layer_norm_eps": cfg.ln_eps,
        "image_size": _one_or_pair(cfg.img_size),  # Hugging Face takes (h, w) pairs too
        "patch_size": _one_or_pair(cfg.patch_size),
        "num_channels": cfg.in_chans,
        "qkv_bias": True,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "num_labels": max(cfg.num_classes, 1),
    } | ({"pooler_output_size": cfg.representation_size} if cfg.representation_size not in (None, cfg.width) else {})


def _one_or_pair(size: tuple[int, int]) -> int | list[int]:
    return size[0] if size[0] == size[1] else list(size)


def read_hf_dir(path: Path) -> dict[str, Any] | None:
    """The ``config.json`` of a Hugging Face folder (a JSON object), or None without one."""
    cfg = path / "config.json"
    if not cfg.is_file():
        return None
    d = values.read_json_file(cfg)
    if not isinstance(d, dict):
        raise CheckpointError(f"{cfg}: expected a JSON object, got {type(d).__name__}")
    return d
