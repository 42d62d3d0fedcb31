"""BiT ResNets: weight-standardised convolutions and GroupNorm (Kolesnikov et al., 2020).

Two families live here:
- :class:`HybridStem`: the CNN front end of the paper's hybrids (R50+ViT-B/16: stage 4 removed,
  stage 3 given 9 units). It follows the official ``models_resnet.py`` exactly: post-activation
  bottlenecks, GroupNorm with 32 groups and eps 1e-6, TF "SAME" padding (asymmetric for stride 2).
- :class:`ResNetV2`: the pre-activation BiT ResNet v2 the paper compares with (BiT-L is a
  ResNet152x4); ``bit_r50x1`` and wider in the registry.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ResNetConfig
from .heads import ReplaceableHead


def same_pad(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """TF/flax ``padding="SAME"``: the total padding is split with the extra pixel after."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):  # F.pad wants (left, right, top, bottom)
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    if not any(pads):
        return x
    return F.pad(x, pads, value=value)


class StdConv2d(nn.Conv2d):
    """Convolution with weight standardisation per output channel.

    ``eps_in_sqrt=False`` (the official ViT hybrid): ``(w - mean) / (std + eps)``;
    ``eps_in_sqrt=True`` (BiT): ``(w - mean) / sqrt(var + eps)``. ``tf_same`` pads as TF does.
    """

    def __init__(
        self,
        in_chans: int,
        out_chans: int,
        kernel_size: int,
        stride: int = 1,
        eps: float = 1e-5,
        eps_in_sqrt: bool = False,
        tf_same: bool = True,
        padding: int = 0,
    ) -> None:
        super().__init__(in_chans, out_chans, kernel_size, stride=stride, padding=padding, bias=False)
        self.eps = eps
        self.eps_in_sqrt = eps_in_sqrt
        self.tf_same = tf_same

    def standardized_weight(self) -> torch.Tensor:
        w = self.weight
        var, mean = torch.var_mean(w, dim=(1, 2, 3), keepdim=True, unbiased=False)
        if self.eps_in_sqrt:
            return (w - mean) / torch.sqrt(var + self.eps)
        return (w - mean) / (torch.sqrt(var) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tf_same:
            x = same_pad(x, self.kernel_size[0], self.stride[0])
        return F.conv2d(x, self.standardized_weight(), None, self.stride, self.padding)


def group_norm(chans: int, eps: float = 1e-6) -> nn.GroupNorm:
    return nn.GroupNorm(32, chans, eps=eps)


def make_stages(unit: type[nn.Module], units: tuple[int, ...], width: int) -> tuple[nn.ModuleList, int]:
    """The bottleneck stages of a BiT ResNet, built of ``unit(in_chans, mid, stride)``: stage ``i``
    has ``units[i]`` units of middle width ``width * 2**i`` and output ``4x`` that, and halves the
    resolution at its first unit (except the first stage, after the root's max-pool). Returns the
    stages and their output channels."""
    stages, chans = [], width
    for i, n in enumerate(units):
        mid = width * 2**i
        stage = []
        for j in range(n):
            stage.append(unit(chans, mid, stride=2 if (i > 0 and j == 0) else 1))
            chans = 4 * mid
        stages.append(nn.Sequential(*stage))
    return nn.ModuleList(stages), chans


# ----------------------------------------------------------------------------------------------
# Hybrid stem (official vit_jax models_resnet.py layout).


class HybridUnit(nn.Module):
    """Post-activation bottleneck: 1x1 -> 3x3 (stride) -> 1x1, projection shortcut when needed."""

    def __init__(self, in_chans: int, mid: int, stride: int) -> None:
        super().__init__()
        out = 4 * mid
        self.conv1 = StdConv2d(in_chans, mid, 1)
        self.gn1 = group_norm(mid)
        self.conv2 = StdConv2d(mid, mid, 3, stride=stride)
        self.gn2 = group_norm(mid)
        self.conv3 = StdConv2d(mid, out, 1)
        self.gn3 = group_norm(out)
        self.conv_proj = self.gn_proj = None
        if in_chans != out or stride != 1:
            self.conv_proj = StdConv2d(in_chans, out, 1, stride=stride)
            self.gn_proj = group_norm(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.conv_proj is None else self.gn_proj(self.conv_proj(x))
        y = F.relu(self.gn1(self.conv1(x)))
        y = F.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return F.relu(residual + y)


class HybridStem(nn.Module):
    """Root (7x7/2 conv, GN, ReLU, 3x3/2 max-pool) and the ResNet stages; output stride
    :func:`~vitkit.models.config.hybrid_stem_stride` of ``units``. ``units=()`` is the root alone
    (stride 4, ``width`` channels out), as the official code builds it for an empty
    ``resnet.num_layers``."""

    def __init__(self, units: tuple[int, ...], width: int = 64, in_chans: int = 3) -> None:
        super().__init__()
        self.conv_root = StdConv2d(in_chans, width, 7, stride=2)
        self.gn_root = group_norm(width)
        self.stages, self.out_chans = make_stages(HybridUnit, units, width)

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.GroupNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, HybridUnit):
                nn.init.zeros_(m.gn3.weight)  # each residual branch starts as identity

    def forward_root(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gn_root(self.conv_root(x)))  # (B, W, H/2, W/2)
        x = same_pad(x, 3, 2, value=float("-inf"))
        return F.max_pool2d(x, 3, 2)  # (B, W, H/4, W/4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_root(x)
        for stage in self.stages:
            x = stage(x)
        return x  # (B, 4W * 2^(S-1), H/stride, W/stride)


# ----------------------------------------------------------------------------------------------
# BiT ResNet v2 (pre-activation), the CNN baseline.


class PreActUnit(nn.Module):
    """Pre-activation bottleneck: GN-ReLU-conv1x1, GN-ReLU-conv3x3(stride), GN-ReLU-conv1x1."""

    def __init__(self, in_chans: int, mid: int, stride: int) -> None:
        super().__init__()
        out = 4 * mid
        conv = dict(eps=1e-10, eps_in_sqrt=True, tf_same=False)
        self.gn1 = group_norm(in_chans, eps=1e-5)
        self.conv1 = StdConv2d(in_chans, mid, 1, **conv)
        self.gn2 = group_norm(mid, eps=1e-5)
        self.conv2 = StdConv2d(mid, mid, 3, stride=stride, padding=1, **conv)
        self.gn3 = group_norm(mid, eps=1e-5)
        self.conv3 = StdConv2d(mid, out, 1, **conv)
        self.proj = StdConv2d(in_chans, out, 1, stride=stride, **conv) if (in_chans != out or stride != 1) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.gn1(x))
        shortcut = x if self.proj is None else self.proj(pre)
        y = self.conv1(pre)
        y = self.conv2(F.relu(self.gn2(y)))
        y = self.conv3(F.relu(self.gn3(y)))
        return y + shortcut


class ResNetV2(ReplaceableHead, nn.Module):
    """BiT ResNet v2; ``forward_head(forward_features(x), pre_logits=True)`` gives the pooled
    representation (pre-logits).

    Args:
        cfg: the network's configuration; the convolutions start Kaiming-normal, the head zero.
    """

    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        wf = cfg.width_factor
        conv = dict(eps=1e-10, eps_in_sqrt=True, tf_same=False)
        self.conv_root = StdConv2d(cfg.in_chans, 64 * wf, 7, stride=2, padding=3, **conv)
        self.stages, chans = make_stages(PreActUnit, cfg.units, 64 * wf)
        self.norm = group_norm(chans, eps=1e-5)
        self.num_features = chans
        self.head = nn.Linear(chans, cfg.num_classes) if cfg.num_classes else None
        if self.conv_root.weight.is_meta:  # a model on the meta device draws nothing
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if self.head is not None:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def _check_input(self, x: torch.Tensor) -> None:
        if x.ndim != 4 or x.shape[1] != self.cfg.in_chans:
            raise ValueError(f"expected an NCHW batch with {self.cfg.in_chans} channels, got shape {tuple(x.shape)}")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> the final feature map after GN-ReLU, (B, C, H/32, W/32).

        Args:
            x: the images (B, C, H, W).

        Returns:
            The last stage's map after GN-ReLU (B, C, H/32, W/32) for four stages.

        Raises:
            ValueError: ``x`` is not a batch of 4 dimensions with the model's channels.
        """
        return self.forward_stages(x)[-1]

    def forward_stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Images -> the root convolution's map (B, 64w, H/2, W/2) and each stage's output, the
        resolution halved at every stage after the first (H/4 ... H/32 for four stages); the last
        after the final GN-ReLU (pre-activation units leave their outputs un-normalised).

        Args:
            x: the images (B, C, H, W).

        Returns:
            The root's map, then one map per stage.

        Raises:
            ValueError: ``x`` is not a batch of 4 dimensions with the model's channels.
        """
        self._check_input(x)
        x = self.conv_root(x)  # (B, 64w, H/2, W/2)
        maps = [x]
        x = F.max_pool2d(F.pad(x, (1, 1, 1, 1)), 3, 2)  # (B, 64w, H/4, W/4)
        for stage in self.stages:
            x = stage(x)
            maps.append(x)
        maps[-1] = F.relu(self.norm(x))
        return maps

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Feature map -> logits: the spatial mean, then the linear head.

        Args:
            features: the final feature map (B, C, h, w) of :meth:`forward_features`.
            pre_logits: return the pooled features instead of the logits.

        Returns:
            The logits (B, num_classes), or the pooled features (B, C) with ``pre_logits`` or for
            a model without a head.
        """
        x = features.mean(dim=(2, 3))  # (B, C)
        if pre_logits or self.head is None:
            return x
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> logits: :meth:`forward_features`, then :meth:`forward_head`.

        Args:
            x: the images (B, C, H, W).

        Returns:
            The logits (B, num_classes), or the pooled features (B, C) for a model without a head.

        Raises:
            ValueError: ``x`` is not a batch of 4 dimensions with the model's channels.
        """
        return self.forward_head(self.forward_features(x))
