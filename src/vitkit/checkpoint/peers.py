"""timm and Hugging Face ``transformers`` ViT state dicts <-> vitkit.

vitkit's parameter names follow timm's for the plain ViT and for the pieces of later ViTs
(``reg_token``, ``ls1.gamma``, ``attn.q_norm``, ``norm_pre``, ``fc_norm``, the packed SwiGLU's
``mlp.fc1``), so the timm mapping is nearly the identity; DINOv2's own files differ in three names.
Hugging Face splits q, k and v and names the sub-layers differently per model: ViT, DINOv2 (with
and without registers), CLIP's and SigLIP's image towers are read. The architecture is read from
the tensors (and from the HF ``config.json`` when there is one); what a file holds that vitkit's
ViT does not have is refused, named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import OPTIONAL_FIELDS, ROPE_POS_EMBEDS, VIT_SIZES, ViTConfig, hybrid_stem_stride
from ..models.posembed import square_side
from ..models.registry import RELEASES
from ..preprocessing import Preprocessing
from . import values
from .naflexvit import channels_and_patch

# Pieces of timm's (and Meta's DINOv3 files') ViTs that vitkit's does not have: a part of a key ->
# what it is. timm's DINOv3 files (its Eva layout) hold no RoPE tensor: their RoPE is DINOv3's.
_UNSUPPORTED_TIMM = {
    "rope": "rotary position embeddings other than DINOv3's (EVA's, RoPE-Mixed's learned frequencies)",
    "bias_mask": "a masked qkv bias without DINOv3's storage tokens",
    "local_cls_norm": "DINOv3 7B's local class-token norm, without DINOv3's storage tokens",
    "attn.norm.": "a norm inside attention (timm's scale_attn_norm)",
    "mlp.norm.": "a norm inside the MLP (timm's scale_mlp_norm)",
    "patch_embed.norm.": "a norm after the patch embedding",
    "relative_position": "relative position bias tables (BEiT)",
    "attn.gate.": "gated attention",
    "attn_pool.pos_embed": "a position embedding in the attention pooling",
    "attn_pool.q_norm": "q/k norm in the attention pooling",
    "attn_pool.k_norm": "q/k norm in the attention pooling",
}

# Names of DINOv2's own files (torch.hub) that differ from timm's.
_DINOV2_NAMES = [(r"^register_tokens$", "reg_token"), (r"\.mlp\.w12\.", ".mlp.fc1."), (r"\.mlp\.w3\.", ".mlp.fc2.")]
# timm's Eva (its DINOv3 models): LayerScale as gamma_1 / gamma_2 of the block.
_EVA_NAMES = [(r"\.gamma_1$", ".ls1.gamma"), (r"\.gamma_2$", ".ls2.gamma")]
# Tensors a file may hold that play no part in an image's forward pass: DINOv2's masked-image token.
_TRAINING_ONLY = ("mask_token",)


def unsupported_pieces(keys: Any, table: dict[str, str] = _UNSUPPORTED_TIMM) -> str | None:
    """What a state dict's keys hold that vitkit's ViT does not have, as one phrase naming the
    pieces and the first keys of each; None when there is nothing.

    Args:
        keys: the state dict's keys.
        table: a part of a key -> the piece it belongs to.

    Returns:
        The phrase, or None.
    """
    found: dict[str, list[str]] = {}
    for k in sorted(keys):
        for part, what in table.items():
            if part in k:
                found.setdefault(what, []).append(k)
                break
    if not found:
        return None
    return "; ".join(f"{what} ({', '.join(ks[:3])}{', ...' if len(ks) > 3 else ''})" for what, ks in found.items())


def is_timm(keys: set[str]) -> bool:
    return "patch_embed.proj.weight" in keys and any(k.startswith("blocks.0.") for k in keys)


# What timm's VisionTransformer uses when nothing says otherwise: the values a state dict without
# its config is read with (its tensors show neither). Hugging Face's: HF_FAMILY_DEFAULTS.
TIMM_DEFAULTS: dict[str, Any] = {"act": "gelu", "ln_eps": 1e-6}


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


def timm_to_vitkit(
    sd: dict[str, torch.Tensor], path: Any = "<timm>", notes: list[str] | None = None
) -> dict[str, torch.Tensor]:
    """timm parameter names -> vitkit's (float32), refusing pieces vitkit does not have, each
    named with its keys. DINOv2's own names (``register_tokens``, the SwiGLU's ``w12`` and
    ``w3``) are read too; its masked-image token, which images never use, is left out (said in
    ``notes``)."""
    sd = _meta_dinov3(sd, path, notes)
    if bad := unsupported_pieces(sd):
        raise CheckpointError(f"{path}: the file holds pieces vitkit's ViT does not have: {bad}")
    out = {}
    for k, v in sd.items():
        if k in _TRAINING_ONLY:
            if notes is not None:
                notes.append(f"left out {k!r}: a token of masked-image training, not used on images")
            continue
        k = k.replace("pre_logits.fc.", "pre_logits.")
        for pattern, repl in _DINOV2_NAMES + _EVA_NAMES:
            k = re.sub(pattern, repl, k)
        out[_timm_backbone_key(k)] = v.float()
    _pack_eva_blocks(out)
    return out


def _meta_dinov3(sd: dict[str, torch.Tensor], path: Any, notes: list[str] | None) -> dict[str, torch.Tensor]:
    """Meta's own DINOv3 files (``storage_tokens``) in timm's names: the storage tokens as
    registers, each qkv bias times its ``bias_mask`` (the key's part zero), the SwiGLU's ``w1``
    (the gate), ``w2`` and ``w3``; the RoPE periods are checked to be DINOv3's (base 100, the
    head width four times their count) and left out, as is the 7B's local class-token norm of
    pre-training. Other files are returned as they are."""
    if "storage_tokens" not in sd:
        return sd
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k.endswith(".bias_mask") or k.startswith("local_cls_norm."):
            continue
        if k.endswith("rope_embed.periods"):
            _check_rope_periods(v, path)
            continue
        if k.endswith(".attn.qkv.bias") and f"{k}_mask" in sd:
            v = v.float() * sd[f"{k}_mask"].float()
        k = k.replace("storage_tokens", "reg_token")
        k = re.sub(r"\.mlp\.w1\.", ".mlp.fc1_g.", k)
        k = re.sub(r"\.mlp\.w2\.", ".mlp.fc1_x.", k)
        out[re.sub(r"\.mlp\.w3\.", ".mlp.fc2.", k)] = v
    if notes is not None and any(k.startswith("local_cls_norm.") for k in sd):
        notes.append("left out local_cls_norm: the local crops' class-token norm of pre-training")
    return out


def _check_rope_periods(periods: torch.Tensor, path: Any) -> None:
    """Refuse RoPE periods other than those of DINOv3's released ViTs: ``100 ** (4k / head_dim)``
    for k < head_dim / 4 (stored in bf16 there, hence the tolerance)."""
    count = periods.numel()
    expected = 100.0 ** (4.0 * torch.arange(count, dtype=torch.float64) / (4 * count))
    if periods.ndim != 1 or not torch.allclose(periods.double(), expected, rtol=1e-2):
        raise CheckpointError(
            f"{path}: rope_embed.periods are not DINOv3's base-100 periods for a head width of {4 * count}: "
            "rotary embeddings of other periods are not ones vitkit has"
        )


def _pack_eva_blocks(out: dict[str, torch.Tensor]) -> None:
    """timm's Eva layers in vitkit's packed form (in place): separate q and v biases (the key's is
    fixed at zero) or none at all as one qkv bias, q, k, v; an unpacked SwiGLU's ``fc1_g`` (the
    gate) and ``fc1_x`` as one ``fc1``, the gate's rows first. Each computes what it did."""
    blocks = sorted({m.group(0) for k in out if (m := re.match(r"blocks\.\d+\.", k))})
    for b in blocks:
        qkv = out.get(f"{b}attn.qkv.weight")
        if qkv is not None and f"{b}attn.qkv.bias" not in out:
            zeros = torch.zeros(qkv.shape[0] // 3)
            q, v = out.pop(f"{b}attn.q_bias", zeros), out.pop(f"{b}attn.v_bias", zeros)
            out[f"{b}attn.qkv.bias"] = torch.cat([q, zeros, v])
        if f"{b}mlp.fc1_g.weight" in out:
            for t in ("weight", "bias"):
                gate, value = out.pop(f"{b}mlp.fc1_g.{t}"), out.pop(f"{b}mlp.fc1_x.{t}")
                out[f"{b}mlp.fc1.{t}"] = torch.cat([gate, value], dim=0)


def _is_eva(keys: Any) -> bool:
    """Whether a timm state dict is in timm's Eva layout (its DINOv3 models): LayerScale as
    ``gamma_1``, separate q and v biases, an unpacked SwiGLU; or one of Meta's DINOv3 files."""
    return "storage_tokens" in keys or any(k.endswith((".gamma_1", ".attn.q_bias")) or ".mlp.fc1_g." in k for k in keys)


# The RoPE of timm's DINOv3 models (timm's state dicts do not show it; timm's Eva builds it so).
TIMM_DINOV3_ROPE = {"pos_embed": "rope_dinov3", "rope_theta": 100.0}


def _timm_rope(keys: Any, out: dict[str, torch.Tensor], path: Any) -> dict[str, Any]:
    """The position fields of a timm file in the Eva layout or of Meta's DINOv3 files: DINOv3's RoPE
    for DINOv3's layout (no position table, a class token and storage tokens); other Eva models
    (EVA, RoPE-ViT) refused."""
    if not _is_eva(keys):
        return {}
    if "pos_embed" in out or "reg_token" not in out or "cls_token" not in out:
        raise CheckpointError(
            f"{path}: timm's Eva layout (gamma_1, q_bias...) without DINOv3's tokens (a class token, storage "
            "tokens, no position table): EVA's and RoPE-ViT's position embeddings are not ones vitkit has"
        )
    return dict(TIMM_DINOV3_ROPE)


def timm_pooling(keys: Any, global_pool: str | None = None, path: Any = "<timm>") -> tuple[dict[str, Any], str | None]:
    """How the tokens of a timm state dict (or of DINOv2's or Meta's DINOv3 files) are pooled:
    the ``classifier`` and ``class_token`` config fields, and, where neither the tensors nor
    ``global_pool`` say it, on what grounds the library's default was taken. An attention-pooling
    latent says "map"; timm's ``global_pool`` ("token" or "avg", from its hub ``config.json``) says
    the rest; otherwise the default of the library whose layout the file has: Meta's DINOv3 (and
    DINOv2) read the class token; timm averages the patch tokens of its Eva models (its DINOv3),
    of models with ``fc_norm`` and of models without a class token, and reads the class token of
    the others. timm's average leaves out the class and register tokens, as vitkit's "gap" does.

    Args:
        keys: the state dict's keys, in the file's names.
        global_pool: timm's ``global_pool`` where the file's config says it; None: not said.
        path: the file's name, for the messages.

    Returns:
        The config fields, and the grounds of the default taken (None when nothing was assumed).

    Raises:
        CheckpointError: a ``global_pool`` vitkit does not pool with, or "token" without a class token.
    """
    keys = set(keys)
    cls = "cls_token" in keys
    if "attn_pool.latent" in keys:
        return {"classifier": "map"}, None
    if global_pool is not None:
        if global_pool not in ("token", "avg") or (global_pool == "token" and not cls):
            ways = "'token' (the class token) or 'avg'" if cls else "'avg' alone (they have no class token)"
            raise CheckpointError(
                f"{path}: global_pool={global_pool!r}: vitkit pools these weights by {ways}, the mean of the "
                "patch tokens"
            )
        if global_pool == "token":
            return {"classifier": "token"}, None
        return {"classifier": "gap", "class_token": True if cls else None}, None
    if "storage_tokens" in keys:
        return {"classifier": "token"}, "Meta's DINOv3 reads the class token, as transformers' pooler_output does"
    if {"register_tokens", "mask_token"} & keys or any(".mlp.w12." in k for k in keys):
        return {"classifier": "token"}, "DINOv2's own file: DINOv2 reads the class token"
    avg = "timm pools the mean of the patch tokens, global_pool='avg'"
    if not cls:
        return {"classifier": "gap"}, f"no class token: {avg}"
    if _is_eva(keys):
        return {"classifier": "gap", "class_token": True}, f"timm's Eva layout, its DINOv3 models: {avg}"
    if "fc_norm.weight" in keys:
        return {"classifier": "gap", "class_token": True}, f"a class token and fc_norm, built for avg pooling: {avg}"
    return {"classifier": "token"}, "timm's default, global_pool='token': the class token"


def convert_timm(
    sd: dict[str, torch.Tensor],
    path: Any = "<timm>",
    num_heads: int | None = None,
    notes: list[str] | None = None,
    global_pool: str | None = None,
) -> tuple[dict[str, torch.Tensor], ViTConfig]:
    """timm ``VisionTransformer`` state dict (or DINOv2's own) -> (vitkit state dict, config read
    off the tensors). What was changed on the way is said in ``notes``: a position row of a
    register token folded into it, a token left out. The pooling is :func:`timm_pooling`'s.

    Args:
        sd: the timm (or DINOv2) state dict.
        path: the file's name, for the messages.
        num_heads: the attention heads, which the tensors do not show; None: assumed from the
            width (:func:`heads_for`).
        notes: a list the notes are appended to; None: they are dropped.
        global_pool: timm's ``global_pool`` where the file's config says it; None: the default
            of the file's layout (:func:`timm_pooling`).

    Returns:
        The state dict in vitkit's names (float32) and the config read off the tensors.

    Raises:
        CheckpointError: a piece vitkit does not have (more than one attention-pooling latent,
            a class token together with attention pooling, a position layout it cannot map...).
    """
    out = timm_to_vitkit(sd, path, notes)
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
    pooling, _ = timm_pooling(sd, global_pool, path)
    distill = "dist_token" in out  # DeiT's distilled models: a second prefix token and head_dist
    prefix = (1 if "cls_token" in out else 0) + (1 if distill else 0)
    img, cls_pos_embed = (224, 224), True
    rope = _timm_rope(sd, out, path)
    if "pos_embed" in out:
        rows = _timm_position_rows(out, prefix, (ph, pw), stride, path, notes)
        img = _grid_img(out["pos_embed"].shape[1] - rows, (ph, pw), stride, path)
        cls_pos_embed = rows > 0 or prefix == 0
    cfg = ViTConfig(
        img_size=img,
        patch_size=(ph, pw),
        in_chans=cin,
        num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0,
        width=width,
        depth=depth,
        num_heads=num_heads or heads_for(width)[0],
        **pooling,
        representation_size=out["pre_logits.weight"].shape[0] if "pre_logits.weight" in out else None,
        pos_embed=rope.get("pos_embed", "learned" if "pos_embed" in out else "none"),
        rope_theta=rope.get("rope_theta", 100.0),
        cls_pos_embed=cls_pos_embed,
        resnet_units=units,
        resnet_width=out["patch_embed.backbone.conv_root.weight"].shape[0] if units else 64,
        distill_token=distill,
        **_timm_pieces(out, path, dinov3=bool(rope)),
    )
    return out, cfg


def _timm_pieces(out: dict[str, torch.Tensor], path: Any, dinov3: bool = False) -> dict[str, Any]:
    """The config fields of the later pieces a timm state dict holds, and its MLP's kind and width:
    a packed SwiGLU's first layer is twice as wide as its second's input. ``dinov3``: timm's
    DINOv3 layout, whose LayerNorm epsilon is 1e-5."""
    if "fc_norm.weight" in out and "norm.weight" in out:
        raise CheckpointError(f"{path}: a final norm both before and after pooling; vitkit's ViT has one of them")
    if "fc_norm.weight" not in out and "norm.weight" not in out:
        raise CheckpointError(f"{path}: no final norm (timm's final_norm=False); vitkit's ViT always has one")
    fc1, fc2 = out["blocks.0.mlp.fc1.weight"].shape[0], out["blocks.0.mlp.fc2.weight"].shape[1]
    swiglu = fc1 == 2 * fc2 and fc1 != fc2
    pre_norm = "norm_pre.weight" in out
    return {
        "mlp_dim": fc2,
        "mlp_type": "swiglu" if swiglu else "mlp",
        "num_registers": out["reg_token"].shape[1] if "reg_token" in out else 0,
        "layer_scale_init": LAYER_SCALE_INIT if "blocks.0.ls1.gamma" in out else None,
        "pre_norm": pre_norm,
        "fc_norm": "fc_norm.weight" in out,
        "qk_norm": "blocks.0.attn.q_norm.weight" in out,
        "patch_bias": "patch_embed.proj.bias" in out,
        **timm_defaults(pre_norm or dinov3),
    }


# The starting value of LayerScale's gammas recorded for loaded weights (DINOv2's): the file's
# gammas replace it; it matters only to a model trained anew from the config.
LAYER_SCALE_INIT = 1e-5


def timm_defaults(pre_norm: bool) -> dict[str, Any]:
    """The activation and LayerNorm epsilon timm builds a ViT with when its file does not say:
    timm's defaults, and for a CLIP tower (a norm before the blocks) or a DINOv3 model the epsilon
    of those models (1e-5).

    Args:
        pre_norm: whether the model is a CLIP tower (a LayerNorm before the blocks) or a DINOv3.

    Returns:
        ``{"act": ..., "ln_eps": ...}``.
    """
    return {"act": TIMM_DEFAULTS["act"], "ln_eps": TIMM_CLIP_LN_EPS if pre_norm else TIMM_DEFAULTS["ln_eps"]}


TIMM_CLIP_LN_EPS = 1e-5


def _timm_position_rows(
    out: dict[str, torch.Tensor], prefix: int, patch: tuple[int, int], stride: int, path: Any, notes: list[str] | None
) -> int:
    """How many rows of timm's position table belong to the tokens before the patches: the class
    and distillation tokens' (``prefix``), none (timm's ``no_embed_class``: DINOv2 with registers),
    or, for a file that gives the registers positions too, theirs after those; such a register's
    row is added to the register token (in ``out``) and left out of the table, which computes the
    same: a register's position is a constant."""
    rows = out["pos_embed"].shape[1]
    registers = out["reg_token"].shape[1] if "reg_token" in out else 0
    # the common layouts first (DINOv2's own, timm's no_embed_class), so that a grid that happens to be
    # square after the registers' rows too is read as they have it; without registers a class token
    # has its row (timm's no_embed_class is a layout of models with registers), so that a table
    # whose rows are square only without it is refused, not read as another grid
    layouts = (prefix, 0, prefix + registers) if registers else (prefix,)
    for candidate in dict.fromkeys(layouts):
        if candidate <= rows and square_side(rows - candidate) is not None:
            break
    else:
        return prefix  # the error of a table without a square grid: _grid_img's
    if registers and candidate == prefix + registers:
        pe = out["pos_embed"]
        out["reg_token"] = out["reg_token"] + pe[:, prefix : prefix + registers]
        out["pos_embed"] = torch.cat([pe[:, :prefix], pe[:, prefix + registers :]], dim=1)
        if notes is not None:
            notes.append(f"the position rows of the {registers} register tokens added to them")
        return prefix
    return candidate


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
    if cfg.pos_embed in ("sincos2d", "learned2d", "relative", *ROPE_POS_EMBEDS):
        raise CheckpointError(
            f"timm's VisionTransformer holds one learned 1-D position table, not pos_embed={cfg.pos_embed!r}; "
            "export to vitkit instead"
        )
    if cfg.num_registers and cfg.pos_prefix_rows:
        raise CheckpointError(
            "timm's VisionTransformer gives register tokens a position row whenever the class token has one; "
            "this model's class token has one and its registers none (DINOv2's layout): export to vitkit instead"
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
    keeps in the file's metadata, for vitkit to read back.

    Args:
        sd: the vitkit model's state dict.
        cfg: the model's config, to check against what timm can hold; None: the state dict alone
            is checked.

    Returns:
        The state dict in timm's names.

    Raises:
        CheckpointError: a model timm's ``VisionTransformer`` cannot hold.
    """
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
# Hugging Face transformers: ViTModel / ViTForImageClassification, Dinov2Model and
# Dinov2WithRegistersModel, CLIPVisionModel (or CLIPModel's vision tower), SiglipVisionModel (or
# SiglipModel's vision tower)


_HF_V5_NAMES = [  # transformers >= 5 module names -> the names its files (and older versions) use
    (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
]


def _hf_legacy_name(key: str, patterns: list[tuple[str, str]] = _HF_V5_NAMES) -> str:
    for pattern, repl in patterns:
        key = re.sub(pattern, repl, key)
    return key


# A config.json's model_type -> the family of converters that reads it.
HF_MODEL_TYPES = {
    "vit": "vit",
    "dinov2": "dinov2",
    "dinov2_with_registers": "dinov2",
    "dinov3_vit": "dinov3",
    "clip": "clip",
    "clip_vision_model": "clip",
    "siglip": "siglip",
    "siglip_vision_model": "siglip",
    "siglip2": "siglip",
    "siglip2_vision_model": "siglip",
}
# What each family's config class has when its config.json leaves a key out.
HF_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit": {"act": "gelu", "ln_eps": 1e-12},
    "dinov2": {"act": "gelu", "ln_eps": 1e-6},
    "dinov3": {"act": "gelu", "ln_eps": 1e-5},
    "clip": {"act": "quick_gelu", "ln_eps": 1e-5},
    "siglip": {"act": "gelu_pytorch_tanh", "ln_eps": 1e-6},
}
HF_DEFAULTS: dict[str, Any] = HF_FAMILY_DEFAULTS["vit"]
# Hugging Face's activation names -> vitkit's (gelu_new is GELU's tanh approximation, written out).
_HF_ACTS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "quick_gelu": "quick_gelu"}
# Tensors of a CLIP or SigLIP file that are not the image tower's.
_OTHER_TOWER = ("text_model.", "text_projection.", "logit_scale", "logit_bias")


def is_hf(keys: set[str]) -> bool:
    prefixes = ("vit.embeddings.", "embeddings.patch_embeddings.", "dinov2.embeddings.", "vision_model.embeddings.")
    return any(k.startswith(prefixes) for k in keys) or "embeddings.patch_embedding.weight" in keys


def hf_family(keys: set[str], hf_config: dict[str, Any] | None, where: str = "config.json") -> str:
    """Which Hugging Face model a file holds: "vit", "dinov2", "dinov3", "clip" or "siglip", from its
    ``config.json``'s ``model_type`` or, without one, from its tensors' names.

    Args:
        keys: the state dict's keys.
        hf_config: its ``config.json``, or None.
        where: the config's path, for the message.

    Returns:
        The family.

    Raises:
        CheckpointError: a model type vitkit does not read.
    """
    if hf_config is not None and "model_type" in hf_config:
        kind = hf_config["model_type"]
        if not isinstance(kind, str) or kind not in HF_MODEL_TYPES:
            pieces = unsupported_pieces(keys)
            raise CheckpointError(
                f"{where}: model_type {values.printable(str(kind), 60)!r} is not a ViT vitkit reads "
                f"({', '.join(HF_MODEL_TYPES)}){'; it holds ' + pieces if pieces else ''}"
            )
        return HF_MODEL_TYPES[kind]
    names = " ".join(keys)
    if any(k.endswith("embeddings.patch_embeddings.weight") for k in keys):  # DINOv2's has a .projection
        return "dinov3"
    if "class_embedding" in names:
        return "clip"
    if "embeddings.patch_embedding." in names:
        return "siglip"
    if "layer_scale1." in names or "register_tokens" in names:
        return "dinov2"
    return "vit"


def convert_hf(
    sd: dict[str, torch.Tensor],
    hf_config: dict[str, Any] | None = None,
    path: Any = "<hf>",
    num_heads: int | None = None,
) -> tuple[dict[str, torch.Tensor], ViTConfig, list[str]]:
    """HF state dict (+ its ``config.json``) -> (vitkit state dict, config, notes): a ViT, a DINOv2
    (with or without registers), or the image tower of a CLIP or SigLIP model (the text tower of
    a whole CLIPModel or SiglipModel file is left out, and said in the notes).

    The number of heads is not in the tensors: it comes from ``config.json`` (where a key
    Hugging Face left out has its default, 12 heads) or from ``num_heads``; without either
    the weights are refused. The values read from ``config.json`` are checked.

    Args:
        sd: the Hugging Face state dict.
        hf_config: its ``config.json``, parsed; None: none beside the weights.
        path: the weight file's name (its folder's ``config.json`` is named in the messages).
        num_heads: the attention heads, where there is no ``config.json``.

    Returns:
        The state dict in vitkit's names, the config, and notes on what was left out.

    Raises:
        CheckpointError: a model family or piece vitkit does not read, no number of heads, or a
            ``config.json`` value that is not valid.
    """
    where = str(Path(path).parent / "config.json")
    family = hf_family(set(sd), hf_config, where)
    vision = hf_config
    if hf_config is not None and family in ("clip", "siglip") and "vision_config" in hf_config:
        vision, where = hf_config["vision_config"], f"{where}: vision_config"
        if not isinstance(vision, dict):
            raise CheckpointError(f"{where} must be a JSON object, got {type(vision).__name__}")
    if bad := unsupported_pieces(sd):
        raise CheckpointError(f"{path}: the file holds pieces vitkit's ViT does not have: {bad}")
    reader = _HFReader(sd, path)
    converters = {"vit": _hf_vit, "dinov2": _hf_dinov2, "dinov3": _hf_dinov3, "clip": _hf_clip, "siglip": _hf_siglip}
    fields = converters[family](reader)
    if family == "dinov3":
        theta = (vision or {}).get("rope_theta", 100.0)
        fields["rope_theta"] = values.number(theta, where, "rope_theta", 1.0, 1e9, lo_open=True)
    out, prefix = reader.out, reader.prefix_rows
    if vision is not None:
        check_hf_shapes(vision, out, reader.depth, where)
    heads, act, eps, img = _hf_settings(vision, out, num_heads, where, path, family, prefix)
    width, cin, ph, pw = out["patch_embed.proj.weight"].shape
    try:
        cfg = ViTConfig(
            img_size=img,
            patch_size=(ph, pw),
            in_chans=cin,
            num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0,
            width=width,
            depth=reader.depth,
            num_heads=heads,
            mlp_dim=out["blocks.0.mlp.fc2.weight"].shape[1],
            act=act,
            ln_eps=eps,
            **fields,
        )
    except ValueError as e:  # heads that do not divide the width, most likely
        raise CheckpointError(f"{where if vision is not None else path}: {e}") from None
    return out, cfg, reader.finish()


class _HFReader:
    """Takes a Hugging Face state dict's tensors into vitkit's names, keeping track of what was
    used: :meth:`finish` says what was left."""

    def __init__(self, sd: dict[str, torch.Tensor], path: Any) -> None:
        self.sd, self.path = sd, path
        self.used: set[str] = set()
        self.out: dict[str, torch.Tensor] = {}
        self.notes: list[str] = []
        self.depth = 0
        self.prefix_rows = 1  # position rows before the grid's: the class token's

    def has(self, key: str) -> bool:
        return key in self.sd

    def take(self, key: str) -> torch.Tensor:
        if key not in self.sd:
            raise CheckpointError(f"{self.path}: missing tensor {key!r}")
        self.used.add(key)
        return self.sd[key].float()

    def put(self, dst: str, src: str, parts: tuple[str, ...] = ("weight", "bias")) -> None:
        for t in parts:
            self.out[f"{dst}.{t}"] = self.take(f"{src}.{t}")

    def count_layers(self, pattern: str) -> None:
        found = [int(m.group(1)) for k in self.sd if (m := re.match(pattern, k))]
        if not found:
            raise CheckpointError(f"{self.path}: no encoder layers (no tensor matches {pattern!r})")
        self.depth = 1 + max(found)

    def leave(self, prefixes: tuple[str, ...], why: str) -> None:
        left = sorted(k for k in self.sd if k.startswith(prefixes) and k not in self.used)
        if left:
            self.used.update(left)
            self.notes.append(f"left out {len(left)} tensor(s) {why}: {left[:3]}")

    def finish(self) -> list[str]:
        unused = sorted(set(self.sd) - self.used)
        if unused:
            self.notes.append(f"ignored tensors not used by image classification: {unused[:6]}")
        return self.notes


def _hf_vit(r: _HFReader) -> dict[str, Any]:
    """``ViTModel`` / ``ViTForImageClassification``: a plain ViT (its pooler, dense + tanh on the
    class token, is the paper's pre-logits layer)."""
    r.sd = {_hf_legacy_name(k): v for k, v in r.sd.items()}
    p = "vit." if any(k.startswith("vit.") for k in r.sd) else ""
    emb = f"{p}embeddings."
    r.put("patch_embed.proj", f"{emb}patch_embeddings.projection")
    r.out["cls_token"] = r.take(f"{emb}cls_token")
    r.out["pos_embed"] = r.take(f"{emb}position_embeddings")
    r.count_layers(rf"{re.escape(p)}encoder\.layer\.(\d+)\.")
    for i in range(r.depth):
        src, dst = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        r.put(dst + "norm1", src + "layernorm_before")
        r.put(dst + "norm2", src + "layernorm_after")
        _hf_qkv(r, dst, src + "attention.attention.", ("query", "key", "value"))
        r.put(dst + "attn.proj", src + "attention.output.dense")
        r.put(dst + "mlp.fc1", src + "intermediate.dense")
        r.put(dst + "mlp.fc2", src + "output.dense")
    r.put("norm", f"{p}layernorm")
    has_head = r.has("classifier.weight")
    if has_head:
        r.put("head", "classifier")
    if r.has(f"{p}pooler.dense.weight") and not has_head:
        r.put("pre_logits", f"{p}pooler.dense")
    rep = r.out["pre_logits.weight"].shape[0] if "pre_logits.weight" in r.out else None
    return {"classifier": "token", "representation_size": rep}


def _hf_qkv(r: _HFReader, dst: str, src: str, names: tuple[str, str, str]) -> None:
    """Separate query, key and value layers -> one qkv layer, (3D, D) rows q, k, v."""
    for t in ("weight", "bias"):
        r.out[f"{dst}attn.qkv.{t}"] = torch.cat([r.take(f"{src}{n}.{t}") for n in names], dim=0)


_DINOV2_V5_NAMES = [  # transformers >= 5 module names of Dinov2 -> its files' names
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.down_proj\.", ".mlp.weights_out."),
]


def _hf_dinov2(r: _HFReader) -> dict[str, Any]:
    """``Dinov2Model`` and ``Dinov2WithRegistersModel``: LayerScale (``layer_scale{1,2}.lambda1``),
    registers after the class token without a position (``register_tokens``), and the giant's
    SwiGLU (``mlp.weights_in``, the gate's half first, and ``mlp.weights_out``). The pooled
    output, ``pooler_output``, is the class token after the final norm: vitkit's "token" pooling."""
    r.sd = {_hf_legacy_name(k, _DINOV2_V5_NAMES): v for k, v in r.sd.items()}
    p = "dinov2." if any(k.startswith("dinov2.") for k in r.sd) else ""
    emb = f"{p}embeddings."
    r.put("patch_embed.proj", f"{emb}patch_embeddings.projection")
    r.out["cls_token"] = r.take(f"{emb}cls_token")
    r.out["pos_embed"] = r.take(f"{emb}position_embeddings")  # (1, 1 + N, D): the class token's row first
    if r.has(f"{emb}register_tokens"):
        r.out["reg_token"] = r.take(f"{emb}register_tokens")  # (1, R, D)
    r.leave((f"{emb}mask_token",), "of masked-image training, not used on images")
    r.count_layers(rf"{re.escape(p)}encoder\.layer\.(\d+)\.")
    for i in range(r.depth):
        src, dst = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        r.put(dst + "norm1", src + "norm1")
        r.put(dst + "norm2", src + "norm2")
        _hf_qkv(r, dst, src + "attention.attention.", ("query", "key", "value"))
        r.put(dst + "attn.proj", src + "attention.output.dense")
        r.out[dst + "ls1.gamma"] = r.take(src + "layer_scale1.lambda1")
        r.out[dst + "ls2.gamma"] = r.take(src + "layer_scale2.lambda1")
        if r.has(src + "mlp.gate_proj.weight"):  # transformers >= 5: the SwiGLU's halves apart
            for t in ("weight", "bias"):
                halves = [r.take(f"{src}mlp.{n}.{t}") for n in ("gate_proj", "up_proj")]
                r.out[f"{dst}mlp.fc1.{t}"] = torch.cat(halves, dim=0)
            r.put(dst + "mlp.fc2", src + "mlp.weights_out")
        elif r.has(src + "mlp.weights_in.weight"):
            r.put(dst + "mlp.fc1", src + "mlp.weights_in")
            r.put(dst + "mlp.fc2", src + "mlp.weights_out")
        else:
            r.put(dst + "mlp.fc1", src + "mlp.fc1")
            r.put(dst + "mlp.fc2", src + "mlp.fc2")
    r.put("norm", f"{p}layernorm")
    r.leave(("classifier.",), "of Dinov2ForImageClassification's head (on the class and mean patch tokens together)")
    swiglu = r.out["blocks.0.mlp.fc1.weight"].shape[0] == 2 * r.out["blocks.0.mlp.fc2.weight"].shape[1]
    return {
        "classifier": "token",
        "num_registers": r.out["reg_token"].shape[1] if "reg_token" in r.out else 0,
        "layer_scale_init": LAYER_SCALE_INIT,
        "mlp_type": "swiglu" if swiglu else "mlp",
    }


def _hf_dinov3(r: _HFReader) -> dict[str, Any]:
    """``DINOv3ViTModel``: the class token, then the storage (register) tokens, no position table:
    2-D RoPE in every layer (``rope_theta`` of ``config.json``, set by :func:`convert_hf`).
    LayerScale, separate q, k and v layers (each bias optional: the released files have no key
    bias), a GELU MLP (``up_proj``, ``down_proj``) or a SwiGLU (``gate_proj``, ``up_proj``,
    ``down_proj``), the final norm; ``pooler_output`` is the class token after it."""
    patch = next(k for k in r.sd if k.endswith("embeddings.patch_embeddings.weight"))
    p = patch[: -len("embeddings.patch_embeddings.weight")]
    emb = f"{p}embeddings."
    r.put("patch_embed.proj", f"{emb}patch_embeddings")
    r.out["cls_token"] = r.take(f"{emb}cls_token")
    if r.has(f"{emb}register_tokens") and r.sd[f"{emb}register_tokens"].shape[1]:
        r.out["reg_token"] = r.take(f"{emb}register_tokens")  # (1, R, D)
    r.leave((f"{emb}mask_token", f"{emb}register_tokens"), "of masked-image training or empty")
    layers = f"{p}model.layer." if any(k.startswith(f"{p}model.layer.") for k in r.sd) else f"{p}layer."
    r.count_layers(rf"{re.escape(layers)}(\d+)\.")
    for i in range(r.depth):
        src, dst = f"{layers}{i}.", f"blocks.{i}."
        r.put(dst + "norm1", src + "norm1")
        r.put(dst + "norm2", src + "norm2")
        att = src + "attention."
        r.out[dst + "attn.qkv.weight"] = torch.cat([r.take(f"{att}{n}_proj.weight") for n in "qkv"], dim=0)
        r.out[dst + "attn.qkv.bias"] = torch.cat([_bias_or_zeros(r, f"{att}{n}_proj") for n in "qkv"], dim=0)
        r.out[dst + "attn.proj.weight"], r.out[dst + "attn.proj.bias"] = _linear(r, att + "o_proj")
        r.out[dst + "ls1.gamma"] = r.take(src + "layer_scale1.lambda1")
        r.out[dst + "ls2.gamma"] = r.take(src + "layer_scale2.lambda1")
        gated = r.has(src + "mlp.gate_proj.weight")
        firsts = [_linear(r, f"{src}mlp.{n}") for n in (("gate_proj", "up_proj") if gated else ("up_proj",))]
        r.out[dst + "mlp.fc1.weight"] = torch.cat([w for w, _ in firsts], dim=0)  # the gate's rows first
        r.out[dst + "mlp.fc1.bias"] = torch.cat([b for _, b in firsts], dim=0)
        r.out[dst + "mlp.fc2.weight"], r.out[dst + "mlp.fc2.bias"] = _linear(r, src + "mlp.down_proj")
    r.put("norm", f"{p}norm")
    return {
        "classifier": "token",
        "num_registers": r.out["reg_token"].shape[1] if "reg_token" in r.out else 0,
        "layer_scale_init": LAYER_SCALE_INIT,
        "mlp_type": "swiglu" if gated else "mlp",
        "pos_embed": "rope_dinov3",
    }


def _bias_or_zeros(r: _HFReader, layer: str) -> torch.Tensor:
    """The bias of a Hugging Face linear layer, or zeros (its width) where it has none."""
    if r.has(f"{layer}.bias"):
        return r.take(f"{layer}.bias")
    return torch.zeros(r.sd[f"{layer}.weight"].shape[0])


def _linear(r: _HFReader, layer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of a Hugging Face linear layer, a zero bias where it has none."""
    return r.take(f"{layer}.weight"), _bias_or_zeros(r, layer)


def _hf_tower_layers(r: _HFReader, p: str) -> None:
    """The encoder layers CLIP and SigLIP name alike (``encoder.layers.{i}.self_attn...``), and
    the final norm (``post_layernorm``)."""
    r.count_layers(rf"{re.escape(p)}encoder\.layers\.(\d+)\.")
    for i in range(r.depth):
        src, dst = f"{p}encoder.layers.{i}.", f"blocks.{i}."
        r.put(dst + "norm1", src + "layer_norm1")
        r.put(dst + "norm2", src + "layer_norm2")
        _hf_qkv(r, dst, src + "self_attn.", ("q_proj", "k_proj", "v_proj"))
        r.put(dst + "attn.proj", src + "self_attn.out_proj")
        r.put(dst + "mlp.fc1", src + "mlp.fc1")
        r.put(dst + "mlp.fc2", src + "mlp.fc2")
    r.put("norm", f"{p}post_layernorm")
    r.leave(_OTHER_TOWER, "of the text tower")
    r.leave((f"{p}embeddings.position_ids",), "of position indices (0, 1, 2...)")


def _vision_prefix(r: _HFReader) -> str:
    return "vision_model." if any(k.startswith("vision_model.") for k in r.sd) else ""


def _hf_clip(r: _HFReader) -> dict[str, Any]:
    """CLIP's image tower (``CLIPVisionModel``, or ``CLIPModel``'s ``vision_model``): a patch
    embedding without bias, a LayerNorm before the blocks (``pre_layrnorm``), and the final one
    (``post_layernorm``) on the class token: its ``pooler_output`` is vitkit's pre-logits. A
    whole CLIPModel's image projection (``visual_projection``, no bias) becomes the head, so the
    model's output is CLIP's image embedding."""
    p = _vision_prefix(r)
    emb = f"{p}embeddings."
    r.out["patch_embed.proj.weight"] = r.take(f"{emb}patch_embedding.weight")
    cls = r.take(f"{emb}class_embedding")  # (D,)
    r.out["cls_token"] = cls.reshape(1, 1, -1)
    r.out["pos_embed"] = r.take(f"{emb}position_embedding.weight")[None]  # (1, 1 + N, D)
    r.put("norm_pre", f"{p}pre_layrnorm")
    _hf_tower_layers(r, p)
    if r.has("visual_projection.weight"):
        r.out["head.weight"] = r.take("visual_projection.weight")  # (E, D)
        r.out["head.bias"] = torch.zeros(r.out["head.weight"].shape[0])
    return {"classifier": "token", "pre_norm": True, "patch_bias": False}


def _hf_siglip(r: _HFReader) -> dict[str, Any]:
    """SigLIP's image tower (``SiglipVisionModel``, or ``SiglipModel``'s ``vision_model``): no
    class token, the final norm on every token, then the attention-pooling head (``head``:
    ``probe``, a ``torch.nn.MultiheadAttention`` whose packed projection splits into vitkit's
    ``q`` and ``kv``, ``layernorm``, ``mlp``): its ``pooler_output`` is vitkit's pre-logits. A
    tower without the head (``vision_use_head`` false) pools by the mean of the tokens (vitkit's
    "gap"), as ``SiglipForImageClassification`` does before its ``classifier``, read as the head."""
    p = _vision_prefix(r)
    emb = f"{p}embeddings."
    fields: dict[str, Any] = {}
    if r.has(f"{emb}patch_embedding.weight") and r.sd[f"{emb}patch_embedding.weight"].ndim == 2:
        # SigLIP 2: a linear layer over patches in (row, col, channel) order, and its table resampled
        # for each image's grid with antialiasing (its NaFlex towers)
        w = r.take(f"{emb}patch_embedding.weight")  # (D, P*P*C)
        channels, side = channels_and_patch(w.shape[0], w.shape[1], r.path)
        r.out["patch_embed.proj.weight"] = w.reshape(w.shape[0], side, side, channels).permute(0, 3, 1, 2)
        r.out["patch_embed.proj.bias"] = r.take(f"{emb}patch_embedding.bias")
        fields["pos_resize"] = "bilinear_aa"
    else:
        r.put("patch_embed.proj", f"{emb}patch_embedding")
    r.out["pos_embed"] = r.take(f"{emb}position_embedding.weight")[None]  # (1, N, D): no class token
    r.prefix_rows = 0
    _hf_tower_layers(r, p)
    head = f"{p}head."
    if not r.has(f"{head}probe"):
        if r.has("classifier.weight"):
            r.put("head", "classifier")
        return {"classifier": "gap", **fields}
    D = r.out["pos_embed"].shape[-1]
    r.out["attn_pool.latent"] = r.take(f"{head}probe")  # (1, 1, D)
    for t, src in (("weight", "in_proj_weight"), ("bias", "in_proj_bias")):
        packed = r.take(f"{head}attention.{src}")  # (3D, ...): rows q, k, v
        r.out[f"attn_pool.q.{t}"], r.out[f"attn_pool.kv.{t}"] = packed[:D], packed[D:]
    r.put("attn_pool.proj", f"{head}attention.out_proj")
    r.put("attn_pool.norm", f"{head}layernorm")
    r.put("attn_pool.mlp.fc1", f"{head}mlp.fc1")
    r.put("attn_pool.mlp.fc2", f"{head}mlp.fc2")
    return {"classifier": "map", **fields}


def check_hf_shapes(config: dict[str, Any], sd: dict[str, torch.Tensor], depth: int, where: str) -> None:
    """A Hugging Face ``config.json`` against the weights it came with, in vitkit's names: each size
    the config states (``hidden_size``, ``num_hidden_layers``, ``intermediate_size``,
    ``patch_size``, ``num_channels``) must be the one the tensors have. The weights decide the
    model; a config that says otherwise describes other weights (or was edited), and whatever
    else it says (heads, activation, epsilon) cannot be trusted for these.

    Args:
        config: the ``config.json`` (its ``vision_config`` for CLIP and SigLIP).
        sd: the weights in vitkit's names.
        depth: the encoder layers the weights hold.
        where: the config's path, for the message.

    Raises:
        CheckpointError: naming ``where``, the first key that disagrees, its value and the weights'.
    """
    width, cin, ph, pw = sd["patch_embed.proj.weight"].shape
    found: dict[str, Any] = {
        "hidden_size": width,
        "num_hidden_layers": depth,
        "num_channels": cin,
        "patch_size": ph if ph == pw else [ph, pw],
    }
    if "blocks.0.mlp.fc2.weight" in sd and config.get("model_type", "vit") == "vit":  # DINOv2's: mlp_ratio
        found["intermediate_size"] = sd["blocks.0.mlp.fc2.weight"].shape[1]
    for key, actual in found.items():
        if key not in config:
            continue  # Hugging Face's default would apply: the weights' value is used, as it always was
        said = config[key]
        if key == "patch_size" and isinstance(said, (list, tuple)) and len(said) == 2 and said[0] == said[1]:
            said = said[0]
        if isinstance(said, bool) or said != actual:
            shown = repr(said) if len(repr(said)) <= 40 else repr(said)[:37] + "..."
            raise CheckpointError(
                f"{where}: {key} is {shown}, but the weights have {actual}: the config does not describe these "
                "weights (use the config.json that came with them)"
            )


def hf_labels(config: dict[str, Any], num_classes: int, where: str) -> tuple[list[str] | None, list[float] | None]:
    """The class names (``id2label``) and multi-label thresholds (``vitkit_thresholds`` with
    ``problem_type`` "multi_label_classification") of a Hugging Face ``config.json``, checked
    against the head they describe: ``id2label`` an object whose keys are the integers 0..K-1 as
    strings, each naming a class, K the head's outputs; the thresholds one number in [0, 1] per
    output. A model without a head (``num_classes`` 0) has no classes: Hugging Face writes a
    default ``id2label`` into every config, and it is ignored there.

    Args:
        config: the parsed ``config.json``.
        num_classes: the outputs of the head the weights hold (0: none).
        where: the config's path, for messages.

    Returns:
        The names (None where the config gives none) and the thresholds (None where it gives
        none, or the model is not multi-label).

    Raises:
        CheckpointError: naming ``where`` and the key, for the first value that does not fit.
    """
    if num_classes <= 0:
        return None, None
    names, labels = None, config.get("id2label")
    if labels is not None:
        if not isinstance(labels, dict):
            raise CheckpointError(
                f'{where}: id2label must be an object {{"0": name, ...}}, got a {type(labels).__name__}'
            )
        keys = {str(k): v for k, v in labels.items()}
        odd = sorted(k for k in keys if not (k.isdigit() and str(int(k)) == k))
        if odd:
            raise CheckpointError(f"{where}: id2label key {values.printable(odd[0], 40)!r} is not a class index 0..K-1")
        if len(keys) != num_classes:
            raise CheckpointError(
                f"{where}: id2label names {len(keys)} classes, but the head has {num_classes} outputs"
            )
        missing = [i for i in range(num_classes) if str(i) not in keys]
        if missing:
            raise CheckpointError(
                f"{where}: id2label has no class {missing[0]} (its keys must be 0..{num_classes - 1})"
            )
        names = [keys[str(i)] for i in range(num_classes)]
        bad = next((i for i, n in enumerate(names) if not isinstance(n, str)), None)
        if bad is not None:
            raise CheckpointError(f"{where}: id2label[{str(bad)!r}] must be a name (a string), got {names[bad]!r:.40}")
    thresholds = None
    if config.get("problem_type") == "multi_label_classification" and "vitkit_thresholds" in config:
        given = config["vitkit_thresholds"]
        if not isinstance(given, list) or len(given) != num_classes:
            what = f"{len(given)} values" if isinstance(given, list) else f"a {type(given).__name__}"
            raise CheckpointError(
                f"{where}: vitkit_thresholds must be a list of {num_classes} numbers (one per output of the head), "
                f"got {what}"
            )
        thresholds = [values.number(v, where, f"vitkit_thresholds[{i}]", 0.0, 1.0) for i, v in enumerate(given)]
    return names, thresholds


def _hf_settings(
    hf_config: dict[str, Any] | None,
    out: dict[str, torch.Tensor],
    num_heads: int | None,
    where: str,
    path: Any,
    family: str = "vit",
    prefix: int = 1,
) -> tuple[int, str, float, tuple[int, int]]:
    """Heads, activation (vitkit's name), LayerNorm epsilon and image size of a Hugging Face
    model of ``family``: the values of its ``config.json`` (checked; a key it leaves out has that
    family's default), the heads from ``num_heads`` without one, the image size from the grid of
    position embeddings (after ``prefix`` rows)."""
    if hf_config is None and num_heads is None:
        raise CheckpointError(
            f"{path}: Hugging Face weights without their config.json (looked for {where}): the number of "
            "attention heads is not in the tensors; put config.json beside them or pass num_heads"
        )
    width, _, ph, pw = out["patch_embed.proj.weight"].shape
    defaults = HF_FAMILY_DEFAULTS[family]
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
    swiglu = out["blocks.0.mlp.fc1.weight"].shape[0] == 2 * out["blocks.0.mlp.fc2.weight"].shape[1]
    gated_dinov3 = swiglu and family == "dinov3"  # DINOv3's gated MLP: SiLU, as its released configs say
    act = hf_config.get("hidden_act", "silu" if gated_dinov3 else defaults["act"])
    if not swiglu and (not isinstance(act, str) or act not in _HF_ACTS):  # a SwiGLU's gate is SiLU whatever it says
        raise CheckpointError(f"{where}: hidden_act {act!r} is not supported ({', '.join(_HF_ACTS)})")
    if gated_dinov3 and act != "silu":  # transformers gates with the activation the config names
        raise CheckpointError(f"{where}: a gated MLP with hidden_act {act!r}; vitkit's SwiGLU gates with SiLU")
    eps = hf_config.get("layer_norm_eps", defaults["ln_eps"])
    eps = values.number(eps, where, "layer_norm_eps", 0.0, 1.0, lo_open=True)
    if "pos_embed" not in out:  # RoPE: no table shows the size; the config's, else Hugging Face's default
        h, w = values.size_pair(hf_config.get("image_size", 224), where, "image_size")
        return heads, _HF_ACTS.get(act, "gelu"), eps, (max(ph, h - h % ph), max(pw, w - w % pw))
    num_patches = out["pos_embed"].shape[1] - prefix
    img = _grid_img(num_patches, (ph, pw), 1, path) if square_side(num_patches) else None
    if "image_size" in hf_config:  # a rectangular image size (Hugging Face takes a pair) names the grid
        h, w = values.size_pair(hf_config["image_size"], where, "image_size")
        if h % ph == 0 and w % pw == 0 and (h // ph) * (w // pw) == num_patches:
            img = (h, w)
    if img is None:
        img = _grid_img(num_patches, (ph, pw), 1, path)  # the error: not a square, and not the config's
    return heads, _HF_ACTS.get(act, "gelu"), eps, img


_POSITIONS = {
    "sincos2d": "2-D sin-cos positions",
    "learned2d": "a 2-D position table",
    "relative": "relative positions",
    "rope_axial": "rotary positions",
    "rope_dinov3": "rotary positions",
    "none": "no position embedding",
}


def _hf_cannot_hold(cfg: ViTConfig) -> list[str]:
    """The parts of a ViT that Hugging Face's ViT has no place for, in words with their config
    values (``global average pooling (classifier='gap')``...)."""
    parts = []
    if cfg.classifier != "token":
        pooling = "global average pooling" if cfg.classifier == "gap" else "attention pooling"
        parts.append(f"{pooling} (classifier={cfg.classifier!r})")
    if cfg.pos_embed != "learned":
        parts.append(f"{_POSITIONS.get(cfg.pos_embed, 'other positions')} (pos_embed={cfg.pos_embed!r})")
    elif not cfg.cls_pos_embed and cfg.classifier == "token":
        parts.append("a class token without a position (cls_pos_embed=False)")
    if cfg.resnet_units is not None:
        parts.append("a hybrid's ResNet stem")
    if cfg.distill_token:
        parts.append("a distillation token (DeiT's distilled models are another model type there)")
    return parts


def check_hf(cfg: Any, has_head: bool | None = None, has_pre_logits: bool | None = None) -> None:
    """Refuse a model Hugging Face's ``ViTModel`` / ``ViTForImageClassification`` cannot be:
    only plain class-token ViTs with one learned 1-D position table that the class token shares,
    and a pre-logits layer only without a head (as ``ViTModel``'s pooler). ``has_head`` and
    ``has_pre_logits`` default to what ``cfg`` says."""
    if not isinstance(cfg, ViTConfig):
        raise CheckpointError(
            f"Hugging Face's ViT holds ViTs, not a {type(cfg).__name__}: export to vitkit (.safetensors) or ONNX "
            "(.onnx) instead"
        )
    parts = _hf_cannot_hold(cfg)
    if parts:
        raise CheckpointError(
            f"Hugging Face's ViT cannot hold {' and '.join(parts)}: it has a class token and one learned 1-D "
            "position table the class token shares; export to vitkit (.safetensors) or ONNX (.onnx) instead"
        )
    used = sorted(f for f, default in OPTIONAL_FIELDS.items() if getattr(cfg, f) != default)
    if used or cfg.act == "quick_gelu":
        pieces = ", ".join(used + (["act='quick_gelu'"] if cfg.act == "quick_gelu" else []))
        raise CheckpointError(f"Hugging Face ViT has none of {pieces}: export to vitkit or timm instead")
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
    what Hugging Face cannot hold is refused (:func:`check_hf`).

    Args:
        sd: the vitkit model's state dict.
        cfg: the model's config.

    Returns:
        The state dict in Hugging Face's names, contiguous tensors.

    Raises:
        CheckpointError: a model Hugging Face's ``ViTForImageClassification`` cannot hold.
    """
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
    """The ``config.json`` a Hugging Face ``ViTConfig`` needs for :func:`to_hf`'s output.

    Args:
        cfg: the model's config.

    Returns:
        The config's keys and values (without class names: :func:`vitkit.export.hf_labels`).
    """
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


def hf_label_metadata(folder: Path, num_classes: int | None = None) -> dict[str, str]:
    """A Hugging Face folder's class names (``id2label`` of its ``config.json``) and, for a
    multi-label model vitkit exported, its thresholds, as vitkit checkpoint metadata; {} where
    the config has none (thresholds are kept where the config names no classes).

    Args:
        folder: the folder of ``config.json``.
        num_classes: the outputs of the model's head; None: as many as ``id2label`` names (or
            as thresholds, where it has no ``id2label``).

    Returns:
        ``classes`` (a JSON list, names made printable), and ``multilabel``/``thresholds``.

    Raises:
        CheckpointError: class names or thresholds that do not fit the head (:func:`hf_labels`).
    """
    from .io import CLASSES_KEY, printable_class_names

    cfg = read_hf_dir(folder)
    if cfg is None:
        return {}
    labels, given = cfg.get("id2label"), cfg.get("vitkit_thresholds")
    if num_classes is not None:
        k = num_classes
    elif labels is not None:
        k = len(labels) if isinstance(labels, (dict, list)) else 1
    else:  # thresholds without names: as many classes as thresholds
        k = len(given) if isinstance(given, list) else 1
    names, thresholds = hf_labels(cfg, k, str(folder / "config.json"))
    out = {}
    if names is not None:
        out[CLASSES_KEY] = printable_class_names(json.dumps(names), f"{folder / 'config.json'}: id2label")
    if thresholds is not None:
        out.update(multilabel="true", thresholds=json.dumps(thresholds))
    return out


# ---------------------------------------------------------------------------------------------
# What a peer's files say beside the tensors: timm's architecture and pretrained_cfg (its hub
# config.json), transformers' preprocessor_config.json.

_TIMM_SIZES = {"tiny": "ti", "small": "s", "base": "b", "large": "l", "huge": "h", "giant": "g", "so400m": "so400m"}
_DINOV3_SIZES = {"small": "s", "small_plus": "splus", "base": "b", "large": "l", "huge_plus": "hplus", "7b": "7b"}
_PIL_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # Pillow's codes in preprocessor_config.json


def timm_model_name(architecture: str) -> str | None:
    """The vitkit model a timm architecture is: ``vit_base_patch16_224`` -> ``vit_b16``, and the
    releases of :data:`vitkit.models.registry.RELEASES`: ``vit_small_patch14_reg4_dinov2`` ->
    ``vit_s14_reg4_dinov2``, ``vit_base_patch16_clip_quickgelu_224`` -> ``vit_b16_clip_quickgelu``,
    ``vit_so400m_patch14_siglip_224`` -> ``vit_so400m14_siglip``,
    ``vit_small_plus_patch16_dinov3_qkvb`` -> ``vit_splus16_dinov3``.

    Args:
        architecture: timm's model name (its hub ``config.json``'s ``architecture``).

    Returns:
        The vitkit model name, or None for an architecture vitkit has no name for.
    """
    m = re.fullmatch(r"vit_(small|small_plus|base|large|huge_plus|7b)_patch16_dinov3(_qkvb)?", architecture)
    if m:
        return f"vit_{_DINOV3_SIZES[m.group(1)]}16_dinov3"
    m = re.fullmatch(
        r"vit_([a-z0-9]+)_patch(\d+)_(reg4_dinov2|dinov2|clip_quickgelu_224|clip_224|siglip_224)", architecture
    )
    if m and m.group(1) in _TIMM_SIZES:
        kind = m.group(3).removesuffix("_224")
        name = f"vit_{_TIMM_SIZES[m.group(1)]}{m.group(2)}_{kind}"
        return name if name in RELEASES else None
    m = re.match(r"vit_(tiny|small|base|large|huge)_patch(\d+)_", architecture)
    return f"vit_{_TIMM_SIZES[m.group(1)]}{m.group(2)}" if m else None


def timm_preprocessing(cfg: Any, where: Any) -> Preprocessing | None:
    """The preprocessing of timm's ``pretrained_cfg`` (mean, std, input size, interpolation,
    crop fraction), checked; None when it gives no mean and std.

    Args:
        cfg: the ``pretrained_cfg`` object of a timm hub ``config.json``.
        where: the file, for messages.

    Returns:
        The preprocessing, or None.
    """
    if not isinstance(cfg, dict) or "mean" not in cfg or "std" not in cfg:
        return None
    size = cfg.get("input_size", [3, 224, 224])
    interpolation = cfg.get("interpolation", "bicubic")
    return _checked_preprocessing(
        {
            "mean": list(cfg["mean"]) if isinstance(cfg["mean"], (list, tuple)) else cfg["mean"],
            "std": list(cfg["std"]) if isinstance(cfg["std"], (list, tuple)) else cfg["std"],
            "img_size": list(size[-2:]) if isinstance(size, (list, tuple)) else size,
            "interpolation": interpolation if interpolation in ("bilinear", "bicubic") else "bilinear",
            "crop_pct": cfg.get("crop_pct", 1.0),
            # timm's eval transform: "center" resizes the shorter side and crops, even at crop_pct 1
            "crop_mode": "squash" if cfg.get("crop_mode") == "squash" else "center",
        },
        where,
    )


def hf_preprocessing(proc: Any, where: Any) -> Preprocessing | None:
    """The preprocessing of a transformers ``preprocessor_config.json``, checked; None when it
    gives no mean and std. A resize of the shorter side followed by a centre crop (CLIP's,
    DINOv2's: shorter side 256, crop 224) is the crop fraction ``crop / shorter side`` with
    ``crop_mode`` "center", so a non-square image keeps its aspect ratio at fraction 1 too.

    Args:
        proc: the parsed ``preprocessor_config.json``.
        where: the file, for messages.

    Returns:
        The preprocessing, or None.
    """
    if not isinstance(proc, dict) or "image_mean" not in proc or "image_std" not in proc:
        return None
    size = proc.get("size", 224)
    crop = proc.get("crop_size") if proc.get("do_center_crop", "crop_size" in proc) else None
    crop_pct = proc.get("crop_pct") or 1.0
    mode = "squash"
    if isinstance(size, dict) and "shortest_edge" in size:
        mode = "center"  # the shorter side, then the centre: the aspect ratio is kept
        side = size["shortest_edge"]
        crop_side = crop.get("height", side) if isinstance(crop, dict) else crop if isinstance(crop, int) else side
        size, crop_pct = crop_side, (crop_side / side if isinstance(side, int) and side > 0 else crop_pct)
    elif isinstance(size, dict):
        size = [size.get("height", 224), size.get("width", 224)]
    return _checked_preprocessing(
        {
            "mean": proc["image_mean"],
            "std": proc["image_std"],
            "img_size": size,
            "interpolation": _PIL_RESAMPLE.get(proc.get("resample"), "bilinear"),
            "crop_pct": crop_pct,
            "crop_mode": mode,
        },
        where,
    )


def _checked_preprocessing(d: dict[str, Any], where: Any) -> Preprocessing:
    if isinstance(d["img_size"], int) and not isinstance(d["img_size"], bool):
        d["img_size"] = [d["img_size"], d["img_size"]]
    chans = len(d["mean"]) if isinstance(d["mean"], list) else 3
    try:
        values.check_preprocessing(d, chans, str(where))
    except TypeError as e:
        raise CheckpointError(f"{where}: preprocessing values are not numbers ({e})") from None
    return Preprocessing.from_dict(d)


def read_json_beside(path: Path, name: str) -> Any:
    """The JSON file ``name`` in the folder of ``path``, parsed and bounded as every config is, or
    None without one.

    Args:
        path: a weight file.
        name: the file name (``config.json``, ``preprocessor_config.json``).

    Returns:
        The parsed JSON, or None.
    """
    beside = path.parent / name
    return values.read_json_file(beside) if beside.is_file() else None
