"""The table of named models: paper names ("ViT-B/16", "R50+ViT-B/16") and vitkit's ("vit_b16")."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from .config import RESNET_UNITS, VIT_SIZES, ResNetConfig, ViTConfig, token_grid_problem
from .flops import check_memory
from .resnet import ResNetV2
from .vit import VisionTransformer

# Hybrids: name -> (ResNet units, ViT size, patch size over the ResNet's map), as the official
# configs (vit_jax/configs/models.py) give them. The R50 of the paper keeps 3 stages with 3, 4, 9
# units (stride 16); R26 and R50 with 4 stages have stride 32; AugReg's R+Ti/16 has the ResNet root
# alone, no stage (stride 4), under 8x8 patches (config.hybrid_stem_stride): 32 px per token, the
# "/16" of its name notwithstanding (its config's comment counts the root as 2x; its code makes 4x).
HYBRIDS: dict[str, tuple[tuple[int, ...], str, int]] = {
    "r_vit_ti16": ((), "Ti", 8),
    "r50_vit_b16": ((3, 4, 9), "B", 1),
    "r50_vit_l32": ((3, 4, 6, 3), "L", 1),
    "r26_vit_s32": ((2, 2, 2, 2), "S", 1),
}

# Later ViTs whose released weights vitkit loads, each built as its authors' code builds it:
# name -> (ViT size or (width, depth, heads, MLP size), patch size, other config fields).
# DINOv2 (Oquab et al., 2023; with registers, Darcet et al., 2024): LayerScale, exact GELU, trained
# at 518 px (a 37 x 37 position table); the giant's MLP is a SwiGLU of width 4096. CLIP's image
# towers (Radford et al., 2021; the names of timm's): a LayerNorm before the blocks, a patch
# embedding without bias, LayerNorm epsilon 1e-5, the image projection as the head; OpenAI's were
# trained with QuickGELU, OpenCLIP's with the exact GELU. SigLIP (Zhai et al., 2023): no class
# token, attention pooling (MAP), GELU's tanh approximation. DINOv3 (Simeoni et al., 2025): 2-D
# RoPE at the patch centres (base 100) instead of a position table, so any input size; 4 storage
# (register) tokens, LayerScale, LayerNorm epsilon 1e-5, the class token read; S+, H+ and 7B have a
# SwiGLU MLP (widths 1536, 5120 and 8192: two thirds of their MLP ratio's, as DINOv3 builds them).
_DINOV2 = {"img_size": 518, "act": "gelu", "layer_scale_init": 1e-5, "num_classes": 0}
_GIANT = (1536, 40, 24, 4096)
_CLIP = {"pre_norm": True, "patch_bias": False, "ln_eps": 1e-5, "act": "gelu"}
_SIGLIP = {"classifier": "map", "act": "gelu_tanh", "num_classes": 0}
_DINOV3 = {
    "pos_embed": "rope_dinov3",
    "rope_theta": 100.0,
    "num_registers": 4,
    "layer_scale_init": 1e-5,
    "act": "gelu",
    "ln_eps": 1e-5,
    "num_classes": 0,
}
_DINOV3_SWIGLU = {**_DINOV3, "mlp_type": "swiglu"}
RELEASES: dict[str, tuple[str | tuple[int, int, int, int], int, dict[str, Any]]] = {
    **{f"vit_{s.lower()}14_dinov2": (s, 14, _DINOV2) for s in ("S", "B", "L")},
    "vit_g14_dinov2": (_GIANT, 14, {**_DINOV2, "mlp_type": "swiglu"}),
    **{f"vit_{s.lower()}14_reg4_dinov2": (s, 14, {**_DINOV2, "num_registers": 4}) for s in ("S", "B", "L")},
    "vit_g14_reg4_dinov2": (_GIANT, 14, {**_DINOV2, "mlp_type": "swiglu", "num_registers": 4}),
    "vit_b16_clip": ("B", 16, {**_CLIP, "num_classes": 512}),
    "vit_b32_clip": ("B", 32, {**_CLIP, "num_classes": 512}),
    "vit_l14_clip": ("L", 14, {**_CLIP, "num_classes": 768}),
    "vit_b16_clip_quickgelu": ("B", 16, {**_CLIP, "act": "quick_gelu", "num_classes": 512}),
    "vit_b32_clip_quickgelu": ("B", 32, {**_CLIP, "act": "quick_gelu", "num_classes": 512}),
    "vit_l14_clip_quickgelu": ("L", 14, {**_CLIP, "act": "quick_gelu", "num_classes": 768}),
    "vit_b16_siglip": ("B", 16, _SIGLIP),
    "vit_so400m14_siglip": ((1152, 27, 16, 4304), 14, _SIGLIP),
    "vit_s16_dinov3": ("S", 16, _DINOV3),
    "vit_splus16_dinov3": ((384, 12, 6, 1536), 16, _DINOV3_SWIGLU),
    "vit_b16_dinov3": ("B", 16, _DINOV3),
    "vit_l16_dinov3": ("L", 16, _DINOV3),
    "vit_hplus16_dinov3": ((1280, 32, 20, 5120), 16, _DINOV3_SWIGLU),
    "vit_7b16_dinov3": ((4096, 40, 32, 8192), 16, _DINOV3_SWIGLU),
}

LISTED = [
    "vit_ti16",
    "vit_s16",
    "vit_s32",
    "vit_b8",
    "vit_b16",
    "vit_b32",
    "vit_l16",
    "vit_l32",
    "vit_h14",
    "r_vit_ti16",
    "r50_vit_b16",
    "r50_vit_l32",
    "r26_vit_s32",
    "bit_r50x1",
    "bit_r50x3",
    "bit_r101x1",
    "bit_r101x3",
    "bit_r152x2",
    "bit_r152x4",
    *RELEASES,
]

_SIZE_KEYS = {k.lower(): k for k in VIT_SIZES}


def list_models() -> list[str]:
    """The registered model names: the paper's ViTs, hybrids and BiT ResNets, and the later
    releases of :data:`RELEASES` (any ``vit_<size><patch>`` also works in :func:`create_model`).

    Returns:
        The names (a new list), the releases last.
    """
    return list(LISTED)


def canonical_name(name: str) -> str:
    """Paper spellings to vitkit names: "ViT-B/16" -> "vit_b16", "R50+ViT-B/16" -> "r50_vit_b16",
    "R+ViT-Ti/16" -> "r_vit_ti16", "BiT-M-R50x1" -> "bit_r50x1"; and the official file names'
    ("ViT-B_16", AugReg's "R26_S_32", "R_Ti_16").

    Args:
        name: a model name in any of those spellings; case and spaces are ignored.

    Returns:
        The vitkit name; a name none of the patterns match comes back lower-cased, dashes as
        underscores.
    """
    s = name.strip().lower().replace(" ", "")
    m = re.fullmatch(r"(?:r(\d*)[+_])?(?:vit-?)?(ti|s|m|b|l|h)[/_](\d+)", s)
    if m:
        prefix = "" if m.group(1) is None else f"r{m.group(1)}_"
        return f"{prefix}vit_{m.group(2)}{m.group(3)}"
    m = re.fullmatch(r"bit(?:-[sml])?[-_]?r(\d+)x(\d+)", s)
    if m:
        return f"bit_r{m.group(1)}x{m.group(2)}"
    return s.replace("-", "_")


def model_config(name: str, **overrides: Any) -> ViTConfig | ResNetConfig:
    """The config of a named model with ``overrides`` applied; unknown names suggest close ones.

    Args:
        name: a name of :func:`list_models`, any ``vit_<size><patch>``, or a paper spelling
            (:func:`canonical_name`).
        **overrides: config fields to change (``img_size=384``, ``num_classes=10``...).

    Returns:
        A :class:`ViTConfig`, or a :class:`ResNetConfig` for a BiT ResNet.

    Raises:
        ValueError: an unknown name, or an override the config refuses.
    """
    key = canonical_name(name)
    if key in HYBRIDS:
        units, size, patch = HYBRIDS[key]
        width, depth, heads, mlp = VIT_SIZES[size]
        base = ViTConfig(
            patch_size=patch,
            width=width,
            depth=depth,
            num_heads=heads,
            mlp_dim=mlp,
            resnet_units=units,
            resnet_width=64,
        )
        return base.replace(**overrides)
    if key in RELEASES:
        size, patch, fields = RELEASES[key]
        width, depth, heads, mlp = VIT_SIZES[size] if isinstance(size, str) else size
        base = ViTConfig(patch_size=patch, width=width, depth=depth, num_heads=heads, mlp_dim=mlp, **fields)
        return base.replace(**overrides)
    m = re.fullmatch(r"vit_(ti|s|m|b|l|h)(\d+)", key)
    if m:
        width, depth, heads, mlp = VIT_SIZES[_SIZE_KEYS[m.group(1)]]
        patch = int(m.group(2))
        base = ViTConfig(patch_size=patch, width=width, depth=depth, num_heads=heads, mlp_dim=mlp)
        return base.replace(**overrides)
    m = re.fullmatch(r"bit_r(\d+)x(\d+)", key)
    if m and int(m.group(1)) in RESNET_UNITS:
        return ResNetConfig(units=RESNET_UNITS[int(m.group(1))], width_factor=int(m.group(2))).replace(**overrides)
    close = difflib.get_close_matches(key, LISTED, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"unknown model {name!r}{hint} (vitkit.list_models() lists them all)")


def build_model(cfg: ViTConfig | ResNetConfig, state: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """Instantiate a config, after checking that its weights fit the memory left
    (:func:`.flops.check_memory`: one line instead of the allocator's traceback).

    Args:
        cfg: the model's config.
        state: tensors for the model to hold instead of random weights, named and shaped as its
            ``state_dict()`` (a copy of each is taken, in the model's dtype). Then no random
            weights are drawn: the model is built on the ``meta`` device and given these; a
            classifier head absent from ``state`` is zero, as the heads are initialised.

    Returns:
        The model: with random weights, or holding ``state``.

    Raises:
        UsageError: the weights would not fit the memory left.
        ValueError: a token grid too large to build, or a tensor of ``state`` without the
            model's shape.
        KeyError: ``state`` lacks a tensor other than a head's.
    """
    if torch.get_default_device().type != "meta":  # shapes only: nothing to fit
        check_memory(cfg, "model")
    if isinstance(cfg, ViTConfig) and (problem := token_grid_problem(cfg)):
        raise ValueError(problem)
    if state is None:
        return ResNetV2(cfg) if isinstance(cfg, ResNetConfig) else VisionTransformer(cfg)
    with torch.device("meta"):
        model = build_model(cfg)
    model.load_state_dict(_materialised(model.state_dict(), state), assign=True)
    return model  # its buffers, which follow from the config, were computed on the CPU


HEAD_PREFIXES = ("head.", "head_dist.")  # the state-dict names of the classifier heads


def _materialised(own: dict[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of every tensor of ``state`` in the dtype of the (meta) model's own; zeros for a head
    that ``state`` lacks."""
    out = {}
    for key, mine in own.items():
        given = state.get(key)
        if given is None:
            if not key.startswith(HEAD_PREFIXES):
                raise KeyError(f"no tensor for {key!r}")
            given = torch.zeros(mine.shape)
        if given.shape != mine.shape:
            raise ValueError(f"{key}: shape {tuple(given.shape)}, the model's is {tuple(mine.shape)}")
        out[key] = given.to(device="cpu", dtype=mine.dtype, copy=True, memory_format=torch.contiguous_format)
    return out


def create_model(
    name: str, *, features_only: bool = False, out_indices: int | Sequence[int] | None = None, **overrides: Any
) -> nn.Module:
    """Build a named model with random weights.

    ``overrides`` are :class:`ViTConfig` fields (``img_size``, ``patch_size``, ``in_chans``,
    ``num_classes``, ``classifier`` ("token", "gap" or "map"), ``representation_size``,
    ``pos_embed``, ``drop_rate``, ``attn_drop_rate``, ``drop_path_rate``, ``act``, ``ln_eps``,
    sizes...) or, for BiT ResNets, :class:`ResNetConfig` fields.

    ``features_only=True`` returns a model whose forward gives a list of NCHW feature maps, with
    ``feature_info`` (channels and reduction of each), for detection and segmentation necks:
    ``out_indices`` picks the ViT blocks (default: the last 3) or the ResNet's root and stages
    (default: all) (:mod:`.features`).

    Args:
        name: a name of :func:`list_models`, any ``vit_<size><patch>``, or a paper spelling.
        features_only: return the features-only wrapper instead of the classifier.
        out_indices: with ``features_only``, the blocks or maps to return (an int n: the last
            n); None: the default above.
        **overrides: config fields to change.

    Returns:
        The model, with random weights (:func:`vitkit.create_model` also loads pretrained ones).

    Raises:
        ValueError: an unknown name, an override the config refuses, or ``out_indices`` without
            ``features_only``.
        UsageError: the weights would not fit the memory left.
    """
    if not features_only:
        if out_indices is not None:
            raise UsageError("out_indices picks the maps of a features_only=True model; pass features_only=True too")
        return build_model(model_config(name, **overrides))
    from .features import features_model

    return features_model(build_model(model_config(name, **overrides)), out_indices)
