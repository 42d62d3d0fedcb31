"""timm's NaFlexVit state dicts: their ``embeds.*`` names read as timm's plain ViT's.

A NaFlexVit keeps the patch embedding as a linear layer over patches flattened in (row, column,
channel) order, a position table of its own grid without rows for the class or register tokens,
and those tokens under ``embeds.``. The blocks, norms, pooling and head have the plain ViT's names.
What the tensors do not show (the activation, how the table follows another grid) is timm's
default for the model the layout implies, and is named in the load warning.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import CheckpointError

# What vitkit cannot hold yet: a part of a key -> what it is.
_UNSUPPORTED = {
    "embeds.pos_embed_y": "timm's factorized position table (a row table and a column table summed)",
    "embeds.pos_embed_x": "timm's factorized position table (a row table and a column table summed)",
    "embeds.norm_input": "a LayerNorm on the patches before their embedding",
    "embeds.norm.": "a LayerNorm on the embedded patches",
}


def is_naflexvit(keys: set[str]) -> bool:
    """Whether a state dict is in timm's NaFlexVit layout.

    Args:
        keys: the state dict's keys.

    Returns:
        True for ``embeds.proj.weight`` (the patch embedding as a linear layer).
    """
    return "embeds.proj.weight" in keys


def channels_and_patch(width: int, values: int, path: Any) -> tuple[int, int]:
    """The channels and patch side of a linear patch embedding of ``values`` inputs (P*P*C).

    Args:
        width: the layer's outputs (for the message).
        values: its inputs.
        path: the file, for the message.

    Returns:
        (C, P): RGB where P*P*3 fits, else grey.

    Raises:
        CheckpointError: ``values`` is not P*P*C for C of 1 or 3.
    """
    for channels in (3, 1):  # RGB first: what every released NaFlexVit takes
        side = math.isqrt(values // channels)
        if values % channels == 0 and side * side * channels == values:
            return channels, side
    raise CheckpointError(
        f"{path}: embeds.proj.weight is ({width}, {values}): {values} is not P*P*C for square patches "
        "of 1 or 3 channels"
    )


def naflexvit_to_timm(
    tensors: dict[str, torch.Tensor], path: Any
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, tuple[Any, str]]]:
    """A NaFlexVit state dict as timm's plain ViT names it, and what vitkit's config needs besides.

    Args:
        tensors: the NaFlexVit state dict.
        path: the file, for messages.

    Returns:
        (the state dict in timm's plain names, config values the layout fixes, config values assumed
        with why: ``{field: (value, why)}``).

    Raises:
        CheckpointError: a piece vitkit cannot hold (named), or tensors of shapes a NaFlexVit
            does not have.
    """
    for part, what in _UNSUPPORTED.items():
        if any(k.startswith(part) for k in tensors):
            raise CheckpointError(f"{path}: {part.rstrip('.')}: {what}; vitkit's ViT has no such piece")
    w = tensors["embeds.proj.weight"]
    if w.ndim != 2:
        raise CheckpointError(f"{path}: embeds.proj.weight must be a linear layer's (2 dims), got {tuple(w.shape)}")
    width = w.shape[0]
    channels, patch = channels_and_patch(width, w.shape[1], path)
    out: dict[str, torch.Tensor] = {}
    fixed: dict[str, Any] = {"cls_pos_embed": False, "in_chans": channels}
    for key, value in tensors.items():
        if key == "embeds.proj.weight":  # (D, P*P*C) in (row, col, channel) order -> conv (D, C, P, P)
            out["patch_embed.proj.weight"] = value.reshape(width, patch, patch, channels).permute(0, 3, 1, 2)
        elif key == "embeds.proj.bias":
            out["patch_embed.proj.bias"] = value
        elif key == "embeds.pos_embed":  # (1, H, W, D) -> (1, H*W, D): no rows for the prefix tokens
            if value.ndim != 4 or value.shape[0] != 1 or value.shape[-1] != width:
                raise CheckpointError(f"{path}: embeds.pos_embed must be (1, H, W, {width}), got {tuple(value.shape)}")
            rows, cols = value.shape[1], value.shape[2]
            out["pos_embed"] = value.reshape(1, rows * cols, width)
            fixed["img_size"] = (rows * patch, cols * patch)
        elif key.startswith("embeds."):  # cls_token, reg_token
            out[key.removeprefix("embeds.")] = value
        else:
            out[key] = value
    prefix = sum(int(out[k].shape[1]) for k in ("cls_token", "reg_token") if k in out)
    map_pool = any(k.startswith("attn_pool.") for k in out)
    if map_pool and prefix:
        raise CheckpointError(
            f"{path}: a NaFlexVit whose attention pooling leaves out its {prefix} class or register tokens; "
            "vitkit's MAP head attends to every token"
        )
    if "pos_embed" not in out:
        raise CheckpointError(f"{path}: a NaFlexVit without embeds.pos_embed; vitkit reads the learned-table models")
    siglip = map_pool and not prefix  # timm's naflexvit_*_siglip: SigLIP 2's towers
    why = "timm's NaFlexVit" + (" for SigLIP 2 (attention pooling, no class token)" if siglip else "")
    assumed = {
        "act": ("gelu_tanh" if siglip else "gelu", why),
        "pos_resize": ("bilinear_aa" if siglip else "bicubic_aa", why),
    }
    return out, fixed, assumed


__all__ = ["channels_and_patch", "is_naflexvit", "naflexvit_to_timm"]
