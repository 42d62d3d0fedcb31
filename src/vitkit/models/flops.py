"""Analytic forward cost of a model, for ``vitkit models`` and the benchmarks.

Counted: 2 x multiply-adds of every matrix multiply and convolution (patch embedding, q/k/v,
the two attention products Q K^T and A V, output projection, MLP (a SwiGLU's three matrices), a
MAP head's, pre-logits, head, ResNet convolutions; with relative positions, the query against the
offset table Q R^T). Not counted: normalisation (LayerScale, q/k norms too), activations, softmax,
pooling, additions, gathers (a few percent at most). This is the convention of the peers'
published figures (ViT-B/16 at 224 px: 35.13 GFLOPs).
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
    mlp_mats = 3 if cfg.mlp_type == "swiglu" else 2  # SwiGLU: gate and value D x M, then M x D
    per_block = 2 * N * D * 3 * D + 2 * 2 * N * N * D + 2 * N * D * D + 2 * mlp_mats * N * D * M
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
    """Forward FLOPs per image of a vitkit model (``model.cfg`` decides the formula).

    Args:
        model: a vitkit ViT, hybrid or BiT ResNet.
        img_size: the input's (height, width) in pixels; None: the model's own.

    Returns:
        The forward pass's floating-point operations for one image (a multiply-add counts two).
    """
    cfg = model.cfg
    if isinstance(cfg, ResNetConfig):
        return resnet_flops(cfg, img_size)
    return vit_flops(cfg, img_size)


def count_params(model: nn.Module) -> int:
    """Parameters of ``model`` (on any device, the meta device too).

    Args:
        model: a built model.

    Returns:
        The number of parameter values.
    """
    return sum(p.numel() for p in model.parameters())


def approx_params(cfg: ViTConfig | ResNetConfig) -> int:
    """About how many parameters a config builds, from its sizes alone (nothing is allocated): the
    encoder's matrices, the patch embedding, the position table and the head; a ResNet's (or a
    hybrid's) convolutions are counted as its forward's multiply-adds per output pixel would
    suggest, a small fraction of a ViT's. For bounds and memory estimates, not for reports
    (:func:`count_params` of a model built on the meta device is exact).

    Args:
        cfg: the model's config.

    Returns:
        The approximate parameter count.
    """
    if isinstance(cfg, ResNetConfig):
        width = 64 * cfg.width_factor
        chans = width * 4 * 2 ** (len(cfg.units) - 1) if cfg.units else width
        convs = sum(n * 17 * (width * 2**i) ** 2 for i, n in enumerate(cfg.units))  # 1x1 + 3x3 + 1x1, 4x out
        return 49 * cfg.in_chans * width + convs + chans * (cfg.num_classes + 1)
    D, M, L = cfg.width, cfg.mlp_dim, cfg.depth
    gh, gw = cfg.grid_size
    ph, pw = cfg.patch_size
    cin = cfg.in_chans
    if cfg.resnet_units is not None:  # the patches come from the ResNet's last stage
        cin = cfg.resnet_width * 4 * 2 ** max(len(cfg.resnet_units) - 1, 0)
    feat = cfg.representation_size or D
    mlp_mats = 3 if cfg.mlp_type == "swiglu" else 2
    block = 4 * D * D + mlp_mats * D * M + 9 * D + (mlp_mats - 1) * M
    table = (gh * gw + cfg.num_prefix_tokens) * D if cfg.pos_embed.startswith("learned") else 0
    pre_logits = (D + 1) * cfg.representation_size if cfg.representation_size else 0
    head = (feat + 1) * cfg.num_classes * (2 if cfg.distill_token else 1)
    return L * block + ph * pw * cin * D + table + pre_logits + head


def memory_estimate(cfg: ViTConfig | ResNetConfig, batch: int = 0, training: bool = False) -> int:
    """About how many bytes a model needs in fp32: its weights, and with ``training`` their
    gradients and two optimiser moments; ``batch`` images' activations on top (what a training step
    keeps for its backward, or what one forward holds at a time). A lower bound in spirit: it is
    used to refuse what cannot fit, never to promise that something does.

    Args:
        cfg: the model's config.
        batch: images a step computes at once (0: the weights alone).
        training: count gradients, optimiser state and the activations kept for the backward.

    Returns:
        Bytes.
    """
    params = approx_params(cfg)
    total = params * (16 if training else 4)
    if batch and isinstance(cfg, ViTConfig):
        gh, gw = cfg.grid_size
        n = gh * gw + cfg.num_prefix_tokens
        D, M, H = cfg.width, cfg.mlp_dim, cfg.num_heads
        per_block = n * (8 * D + 2 * M) + 2 * H * n * n  # a block's saved tensors; attention weights
        per_image = (cfg.depth if training else 1) * per_block + n * D
        total += 4 * batch * per_image
    elif batch:
        total += 4 * batch * cfg.in_chans * cfg.img_size[0] * cfg.img_size[1] * (16 if training else 4)
    return total


def check_memory(
    cfg: ViTConfig | ResNetConfig, what: str, batch: int = 0, training: bool = False, device: str = "cpu"
) -> None:
    """Refuse, in one line, a model (and batch) that cannot fit the memory left on ``device``:
    an override of a million wide, a batch of millions, would otherwise end in the allocator's
    traceback or the out-of-memory killer.

    Args:
        cfg: the model's config.
        what: what asked for it, to name in the message (``model.overrides``, ``--batch``).
        batch: images computed at once (0: the weights alone).
        training: a training step (gradients, optimiser state, kept activations).
        device: "cpu" (the host's available memory) or a CUDA device (its free memory).

    Raises:
        UsageError: the estimate (:func:`memory_estimate`) exceeds the memory available.
    """
    from ..cpu import available_memory
    from ..errors import UsageError

    need = memory_estimate(cfg, batch, training)
    if str(device).startswith("cuda"):
        import torch

        free = torch.cuda.mem_get_info(torch.device(device))[0] if torch.cuda.is_available() else None
    else:
        free = available_memory()
    if free is None or need <= free:
        return
    shape = f"width {cfg.width}, depth {cfg.depth}, MLP {cfg.mlp_dim}, " if isinstance(cfg, ViTConfig) else ""
    doing = f"training at batch {batch}" if training else (f"a forward at batch {batch}" if batch else "its weights")
    raise UsageError(
        f"{what}: the model ({shape}{approx_params(cfg):,} parameters) needs about {_gb(need)} for {doing}; "
        f"{device} has {_gb(free)} available"
    )


def _gb(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n < 2**50 else f"{n:.1e} bytes"
