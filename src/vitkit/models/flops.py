"""Analytic forward cost of a model, for ``vitkit models`` and the benchmarks.

Counted: 2 x multiply-adds of every matrix multiply and convolution (patch embedding, q/k/v,
the two attention products Q K^T and A V, output projection, MLP, a MAP head's, pre-logits, head, ResNet
convolutions; with relative positions, the query against the offset table Q R^T). Not counted:
normalisation, activations, softmax, pooling, additions, gathers (a few percent at most). This
is the convention of the peers' published figures (ViT-B/16 at 224 px: 35.13 GFLOPs).
"""

from __future__ import annotations

from torch import nn

from .config import ResNetConfig, ViTConfig
from .posembed import relative_num_offsets


def _conv(h: int, w: int, k: int, cin: int, cout: int, stride: int) -> tuple[int, int, int]:
    ho, wo = -(-h // stride), -(-w // stride)
    return 2 * k * k * cin * cout * ho * wo, ho, wo


def _bottlenecks(h: int, w: int, chans: int, width: int, units: tuple[int, ...]) -> tuple[int, int, int, int]:
    flops = 0
    for i, n in enumerate(units):
        mid = width * 2**i
        for j in range(n):
            stride = 2 if (i > 0 and j == 0) else 1
            f1, _, _ = _conv(h, w, 1, chans, mid, 1)
            f2, ho, wo = _conv(h, w, 3, mid, mid, stride)
            f3, _, _ = _conv(ho, wo, 1, mid, 4 * mid, 1)
            flops += f1 + f2 + f3
            if chans != 4 * mid or stride != 1:
                flops += _conv(h, w, 1, chans, 4 * mid, stride)[0]
            h, w, chans = ho, wo, 4 * mid
    return flops, h, w, chans


def vit_flops(cfg: ViTConfig, img_size: tuple[int, int] | None = None) -> int:
    """Forward FLOPs of one image through a ViT or hybrid."""
    h, w = img_size or cfg.img_size
    flops, cin = 0, cfg.in_chans
    if cfg.resnet_units is not None:
        f, h, w = _conv(h, w, 7, cin, cfg.resnet_width, 2)
        h, w = -(-h // 2), -(-w // 2)  # max-pool
        fb, h, w, cin = _bottlenecks(h, w, cfg.resnet_width, cfg.resnet_width, cfg.resnet_units)
        flops += f + fb
    ph, pw = cfg.patch_size
    gh, gw = h // ph, w // pw
    D, M = cfg.width, cfg.mlp_dim
    flops += 2 * gh * gw * ph * pw * cin * D  # patch embedding
    N = gh * gw + cfg.num_prefix_tokens
    per_block = 2 * N * D * 3 * D + 2 * 2 * N * N * D + 2 * N * D * D + 2 * 2 * N * D * M
    if cfg.pos_embed == "relative":  # q @ R^T: 2 N hd num_offsets per head, heads x hd = D
        per_block += 2 * N * D * relative_num_offsets(gh * gw, cfg.num_prefix_tokens)
    flops += cfg.depth * per_block
    if cfg.classifier == "map":  # one probe query: q, k and v projections, its two products, out, MLP
        flops += 2 * D * D + 2 * N * D * 2 * D + 2 * 2 * N * D + 2 * D * D + 2 * 2 * D * M
    feat = D
    if cfg.representation_size:
        flops += 2 * D * cfg.representation_size
        feat = cfg.representation_size
    flops += 2 * feat * cfg.num_classes * (2 if cfg.distill_token else 1)  # DeiT: a second head
    return flops


def resnet_flops(cfg: ResNetConfig, img_size: tuple[int, int] | None = None) -> int:
    """Forward FLOPs of one image through a BiT ResNet v2."""
    h, w = img_size or cfg.img_size
    width = 64 * cfg.width_factor
    f, h, w = _conv(h, w, 7, cfg.in_chans, width, 2)
    h, w = -(-h // 2), -(-w // 2)
    fb, h, w, chans = _bottlenecks(h, w, width, width, cfg.units)
    return f + fb + 2 * chans * cfg.num_classes


def model_flops(model: nn.Module, img_size: tuple[int, int] | None = None) -> int:
    """Forward FLOPs per image of a vitkit model (``model.cfg`` decides the formula)."""
    cfg = model.cfg
    if isinstance(cfg, ResNetConfig):
        return resnet_flops(cfg, img_size)
    return vit_flops(cfg, img_size)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
