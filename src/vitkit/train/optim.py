"""Optimisers and learning-rate schedules of the paper (section 4.1, appendix B).

Pre-training: Adam(W), betas 0.9/0.999, weight decay 0.1, linear warm-up then linear (or cosine)
decay. Fine-tuning: SGD with momentum 0.9, no weight decay, cosine decay. Gradient clipping at
global norm 1 in both (done by the loop).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import OptimSection

# Parameters that never get weight decay: biases, norm scales, embeddings of positions/class.
# Names match as substrings: "pos_embed" covers learned2d's pos_embed_row, _col and _prefix;
# "rel_embed" is every block's relative-position table (blocks.{i}.attn.rel_embed).
_NO_DECAY_NAMES = ("pos_embed", "cls_token", "rel_embed")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or any(n in name for n in _NO_DECAY_NAMES):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: OptimSection, fused: bool = False) -> torch.optim.Optimizer:
    """The recipe's optimiser over ``model``'s trainable parameters. ``fused`` (CUDA parameters
    only) runs Adam's update as one kernel per group instead of several per tensor."""
    name = cfg.name.lower()
    groups = param_groups(model, cfg.weight_decay)
    if name in ("adamw", "adam"):
        # The paper's Adam with "weight decay": we apply it decoupled, as big_vision does.
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    raise ValueError(f"unknown optimiser {cfg.name!r}: adamw, adam or sgd")


def lr_at(step: int, total: int, cfg: OptimSection) -> float:
    """Learning rate at ``step`` (0-based) of ``total``: linear warm-up, then the decay."""
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
    for group in optimizer.param_groups:
        group["lr"] = lr
