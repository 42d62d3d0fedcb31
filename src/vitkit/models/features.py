"""Dense features for downstream heads: ``create_model(name, features_only=True, out_indices=...)``.

A detection or segmentation neck (FPN, UPerNet, DPT...) takes a list of NCHW feature maps and
needs to know, for each, its channels and its reduction (input pixels per map cell). timm's
``features_only`` models give exactly that, with ``feature_info``; these wrappers give the same
for vitkit's ViTs and hybrids (blocks' patch tokens on their grid,
:meth:`~vitkit.models.vit.VisionTransformer.forward_intermediates` with ``output_fmt="NCHW"``) and
for the BiT ResNets (the root and the stage outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .resnet import ResNetV2
from .vit import VisionTransformer


class FeatureInfo(list):
    """One dict per returned map, in order: ``num_chs`` (channels), ``reduction`` (input pixels
    per map cell: an int, or an (h, w) pair for a non-square stride) and ``module`` (the vitkit
    module whose output it is). ``channels()`` and ``reduction()`` list one field, as timm's
    ``FeatureInfo`` does."""

    def channels(self) -> list[int]:
        """The ``num_chs`` field of every map.

        Returns:
            The channels of each map, in order.
        """
        return [f["num_chs"] for f in self]

    def reduction(self) -> list[Any]:
        """The ``reduction`` field of every map.

        Returns:
            The reduction of each map (input pixels per map cell), in order.
        """
        return [f["reduction"] for f in self]


def take_indices(count: int, out_indices: int | Sequence[int], what: str) -> list[int]:
    """``out_indices`` as sorted, non-negative positions among ``count``: an int n is the last n;
    a sequence names positions, negative ones counted from the end (timm's convention)."""
    if isinstance(out_indices, int) and not isinstance(out_indices, bool):
        if not 1 <= out_indices <= count:
            raise ValueError(f"out_indices={out_indices} asks for the last {out_indices} of {count} {what}")
        return list(range(count - out_indices, count))
    try:
        picked = [int(i) for i in out_indices]
    except (TypeError, ValueError):
        raise ValueError(f"out_indices must be an int or a list of ints, got {out_indices!r}") from None
    bad = [i for i in picked if not -count <= i < count]
    if bad or not picked:
        raise ValueError(f"out_indices {list(out_indices)} must name some of the {count} {what} (0..{count - 1})")
    return sorted({i % count for i in picked})


def _reduction(stride: tuple[int, int]) -> int | tuple[int, int]:
    return stride[0] if stride[0] == stride[1] else stride


class ViTFeatures(nn.Module):
    """A ViT or hybrid whose forward returns the patch tokens of some blocks as NCHW maps,
    [(B, D, H / s, W / s)], ``s`` the total stride (patch size times a hybrid's CNN stride).
    ``norm``: pass each through the encoder's final LayerNorm. The whole model is ``.model``
    (its state dict under ``model.``), so weights load into it as into any vitkit model.

    Args:
        model: the ViT or hybrid to wrap.
        out_indices: the blocks whose patch tokens to return: an int n the last n, a sequence
            their positions (negative ones counted from the last).
        norm: pass each map through the encoder's final LayerNorm.

    Raises:
        ValueError: ``out_indices`` names no block, or one the model does not have.
    """

    def __init__(self, model: VisionTransformer, out_indices: int | Sequence[int] = 3, norm: bool = False) -> None:
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.norm = norm
        self.out_indices = take_indices(len(model.blocks), out_indices, "blocks")
        red = _reduction(model.cfg.total_stride)
        self.feature_info = FeatureInfo(
            {"num_chs": model.cfg.width, "reduction": red, "module": f"blocks.{i}"} for i in self.out_indices
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Images -> the chosen blocks' patch tokens on their grid.

        Args:
            x: the images (B, C, H, W).

        Returns:
            One map (B, D, H / s, W / s) per block of ``out_indices``, in order.
        """
        out = self.model.forward_intermediates(x, indices=self.out_indices, output_fmt="NCHW", norm=self.norm)
        return out["tokens"]


class ResNetFeatures(nn.Module):
    """A BiT ResNet whose forward returns its root and stage outputs as NCHW maps
    (:meth:`~vitkit.models.resnet.ResNetV2.forward_stages`): position 0 is the root convolution
    (reduction 2), position i >= 1 stage i (reduction 4, 8, 16, 32 for four stages), the last after
    the final GroupNorm and ReLU.

    Args:
        model: the ResNet to wrap.
        out_indices: the maps to return: an int n the last n, a sequence their positions
            (negative ones counted from the last); None: all of them.

    Raises:
        ValueError: ``out_indices`` names no map, or one the model does not have.
    """

    def __init__(self, model: ResNetV2, out_indices: int | Sequence[int] | None = None) -> None:
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        chans = [64 * model.cfg.width_factor] + [256 * model.cfg.width_factor * 2**i for i in range(len(model.stages))]
        reductions = [2] + [4 * 2**i for i in range(len(model.stages))]
        modules = ["conv_root"] + [f"stages.{i}" for i in range(len(model.stages) - 1)] + ["norm"]
        count = len(chans)
        self.out_indices = take_indices(count, count if out_indices is None else out_indices, "feature maps")
        self.feature_info = FeatureInfo(
            {"num_chs": chans[i], "reduction": reductions[i], "module": modules[i]} for i in self.out_indices
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Images -> the chosen maps.

        Args:
            x: the images (B, C, H, W).

        Returns:
            One map (B, C_i, H / r_i, W / r_i) per position of ``out_indices``, in order.
        """
        maps = self.model.forward_stages(x)
        return [maps[i] for i in self.out_indices]


def features_model(model: nn.Module, out_indices: int | Sequence[int] | None = None) -> nn.Module:
    """Wrap a vitkit model as a features-only model (``create_model(..., features_only=True)``):
    ``out_indices`` defaults to the last 3 blocks of a ViT (all of fewer), every map of a ResNet.

    Args:
        model: a vitkit ViT, hybrid or BiT ResNet.
        out_indices: the blocks (ViT) or maps (ResNet) to return: an int n the last n, a sequence
            their positions; None: the default above.

    Returns:
        A :class:`ViTFeatures` or :class:`ResNetFeatures` around ``model``; its ``feature_info``
        describes the maps.

    Raises:
        ValueError: a model of another kind, or ``out_indices`` the model cannot give.
    """
    if isinstance(model, VisionTransformer):
        return ViTFeatures(model, min(3, len(model.blocks)) if out_indices is None else out_indices)
    if isinstance(model, ResNetV2):
        return ResNetFeatures(model, out_indices)
    raise ValueError(f"features_only takes a vitkit ViT, hybrid or BiT ResNet, not a {type(model).__name__}")
