"""Optimisers and learning-rate schedules of the paper (section 4.1, appendix B).

Pre-training: Adam(W), betas 0.9/0.999, weight decay 0.1, linear warm-up then linear (or cosine)
decay. Fine-tuning: SGD with momentum 0.9, no weight decay, cosine decay. Gradient clipping at
global norm 1 in both (done by the loop).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

from ..errors import RecipeError
from ..precision import PrecisionLike
from .config import OptimSection
from .muon import MuonAdamW

# Parameters that get no weight decay besides every tensor of at most one dimension (biases, the
# scales of LayerNorm and GroupNorm): position embeddings and the learned prefix tokens. Names
# match as substrings: "pos_embed" covers learned2d's pos_embed_row, _col and _prefix; "rel_embed"
# is every block's relative-position table (blocks.{i}.attn.rel_embed).
_NO_DECAY_NAMES = ("pos_embed", "cls_token", "dist_token", "reg_token", "rel_embed")

# What comes before the encoder blocks: BEiT's layer 0 (a hybrid's ResNet stem is in patch_embed).
_EMBEDDING_NAMES = ("patch_embed.", "cls_token", "dist_token", "reg_token", "pos_embed", "norm_pre.")


def decays(name: str, param: torch.Tensor) -> bool:
    """Whether weight decay applies to a parameter: to weight matrices and convolution kernels
    only. Not to biases and norm scales (decaying them towards 0 only fights the normalisation),
    nor to position embeddings, relative-position tables, class or distillation tokens, which are
    embeddings rather than weights (as big_vision, timm and DeiT do)."""
    return param.ndim > 1 and not any(n in name for n in _NO_DECAY_NAMES)


def is_muon_param(name: str, param: torch.Tensor) -> bool:
    """Whether ``optim.name=muon`` updates a parameter by Muon: a weight matrix inside an encoder
    block (attention's qkv and output projections, the MLP's two layers). Everything else,
    including the patch embedding and the heads, is AdamW's."""
    return param.ndim == 2 and name.startswith("blocks.") and decays(name, param)


def layer_id(name: str, depth: int) -> int:
    """The layer of a ViT parameter for layer-wise learning-rate decay, by BEiT's rule (Bao et
    al., 2022; timm's ``param_groups_layer_decay``): 0 for what feeds the encoder (the patch
    embedding, with a hybrid's ResNet stem, the class and distillation tokens, the position
    embeddings), ``i + 1`` for block ``i``, ``depth + 1`` for what follows it (the final norm, the
    pre-logits layer, the heads)."""
    if name.startswith(_EMBEDDING_NAMES):
        return 0
    m = re.match(r"blocks\.(\d+)\.", name)
    return int(m.group(1)) + 1 if m else depth + 1


def layer_scales(depth: int, decay: float) -> list[float]:
    """The learning-rate factor of each layer 0 .. depth + 1: ``decay ** (depth + 1 - layer)``, so
    that the heads train at the full rate and each layer below at ``decay`` times the one above."""
    return [decay ** (depth + 1 - i) for i in range(depth + 2)]


def param_groups(
    model: nn.Module, weight_decay: float, layer_decay: float = 1.0, muon: bool = False, split_qkv: bool = False
) -> list[dict]:
    """The optimiser's parameter groups: with weight decay or without (:func:`decays`), and with
    ``layer_decay`` below 1 one pair per layer (:func:`layer_id`), each with its ``lr_scale``
    (:func:`set_lr` multiplies the schedule's rate by it). With ``muon`` the encoder's weight
    matrices (:func:`is_muon_param`) form groups of their own, marked
    ``"muon": True``; with ``split_qkv`` as well, their ``splits`` make Muon orthogonalise a fused
    qkv weight as three matrices, q, k and v (:class:`.muon.MuonAdamW`)."""
    if muon:
        groups, names = [], {id(p): n for n, p in model.named_parameters()}
        for g in param_groups(model, weight_decay, layer_decay):
            for m in (True, False):
                ps = [p for p in g["params"] if is_muon_param(names[id(p)], p) == m]
                if ps:
                    groups.append({**g, "params": ps, "muon": m})
                    if m and split_qkv:
                        groups[-1]["splits"] = [3 if names[id(p)].endswith(".attn.qkv.weight") else 1 for p in ps]
        if not any(g["muon"] for g in groups):
            raise RecipeError(
                f"optim.name muon updates a ViT's encoder-block matrices; {type(model).__name__} has none (use adamw)"
            )
        return groups
    if layer_decay == 1.0:
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:
                (decay if decays(name, p) else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return groups
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise RecipeError(
            f"optim.layer_decay needs a ViT's encoder blocks; {type(model).__name__} has none (set it to 1)"
        )
    depth = len(blocks)
    scales = layer_scales(depth, layer_decay)
    by_key: dict[tuple[int, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            by_key.setdefault((layer_id(name, depth), decays(name, p)), []).append(p)
    return [
        {"params": params, "weight_decay": weight_decay if wd else 0.0, "lr_scale": scales[layer]}
        for (layer, wd), params in sorted(by_key.items(), key=lambda kv: (kv[0][0], not kv[0][1]))
    ]


def build_optimizer(
    model: nn.Module,
    cfg: OptimSection,
    fused: bool = False,
    process_group: Any = None,
    precision: PrecisionLike = "auto",
) -> torch.optim.Optimizer:
    """The recipe's optimiser over ``model``'s trainable parameters.

    Args:
        model: the model whose trainable parameters it updates.
        cfg: the recipe's ``optim`` section.
        fused: (CUDA parameters only) Adam's update as one kernel per group instead of several
            per tensor.
        process_group: the data-parallel group (every member with the same averaged gradients)
            among which Muon shares its orthogonalisation; other optimisers ignore it.
        precision: the precision Muon's Newton-Schulz iteration computes in: the step's own
            :class:`~vitkit.precision.Precision`, so that an fp32 run is fp32 throughout (or a
            name, resolved on the parameters' device).

    Returns:
        A torch optimiser.

    Raises:
        ValueError: an unknown optimiser name.
    """
    name = cfg.name.lower()
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay, muon=name == "muon", split_qkv=cfg.muon_split_qkv)
    if name == "muon":
        for g in groups:
            if g["muon"]:
                g["lr_scale"] = g.get("lr_scale", 1.0) * cfg.muon_lr_scale
        return MuonAdamW(
            groups,
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            momentum=cfg.muon_momentum,
            process_group=process_group,
            precision=precision,
        )
    if name in ("adamw", "adam"):
        # The paper's Adam with "weight decay": we apply it decoupled, as big_vision does.
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    raise ValueError(f"unknown optimiser {cfg.name!r}: adamw, adam, sgd or muon")


def lr_at(step: int, total: int, cfg: OptimSection) -> float:
    """Learning rate at ``step`` (0-based) of ``total``: linear warm-up, then the decay.

    Args:
        step: the step, from 0.
        total: the run's steps in all.
        cfg: the recipe's ``optim`` section: the peak rate, warm-up, schedule and final rate.

    Returns:
        The rate: rising linearly to ``cfg.lr`` over the warm-up, then constant, or falling to
        ``cfg.min_lr`` by a cosine or linearly at the last step.

    Raises:
        ValueError: an unknown schedule.
    """
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(total - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    if cfg.schedule == "cosine":
        scale = 0.5 * (1 + math.cos(math.pi * progress))
    elif cfg.schedule == "linear":
        scale = 1 - progress
    else:
        raise ValueError(f"unknown schedule {cfg.schedule!r}: cosine, linear or constant")
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * scale


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's rate ``lr`` times each group's ``lr_scale`` (layer-wise decay; 1 without)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
