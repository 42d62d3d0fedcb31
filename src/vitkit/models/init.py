"""Alternative initialisations of a ViT's attention (the architecture is untouched).

Mimetic initialisation (Trockman and Kolter, "Mimetic Initialization of Self-Attention Layers",
ICML 2023): the query and key projections of each head are drawn so that ``W_q W_k^T`` is close
to ``alpha Z + beta I`` (Z random), and value and output projections so that ``W_v W_o`` is close
to ``alpha Z - beta I``. With position embeddings in the tokens, the identity part makes each
patch attend to its neighbours at step 0, the pattern that pre-trained ViTs show; it speeds up
training from scratch on small data. Only weights change: every loader still reads the model.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _factor(dim: int, rank: int, alpha: float, beta: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A, B of shape (dim, rank) with ``A @ B.T`` the best rank-``rank`` fit of ``alpha Z + beta I``."""
    z = torch.randn(dim, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)
    u, s, vh = torch.linalg.svd(alpha * z + beta * torch.eye(dim, dtype=torch.float64))
    root = s[:rank].sqrt()
    return u[:, :rank] * root, vh[:rank].T * root  # (dim, rank) each


@torch.no_grad()
def mimetic_init_(
    model: nn.Module,
    qk: tuple[float, float] = (0.7, 0.7),
    vo: tuple[float, float] = (0.4, 0.4),
    seed: int = 0,
) -> nn.Module:
    """Re-initialise every block's attention of a vitkit ViT in place (see the module docstring)."""
    if not hasattr(model, "blocks"):
        raise ValueError(
            f"mimetic initialisation needs a ViT's attention blocks; {type(model).__name__} has none "
            "(in a recipe: model.init=default)"
        )
    g = torch.Generator().manual_seed(seed)
    for blk in model.blocks:
        attn = blk.attn
        D, H, hd = attn.qkv.in_features, attn.num_heads, attn.head_dim
        w = attn.qkv.weight  # (3D, D): rows [q; k; v], head h at rows h*hd:(h+1)*hd of each
        for h in range(H):
            a, b = _factor(D, hd, qk[0], qk[1], g)  # x W_q^h (W_k^h)^T x^T ~ x (alpha Z + beta I) x^T
            rows = slice(h * hd, (h + 1) * hd)
            w[rows] = a.T.to(w.dtype)  # query rows (hd, D)
            w[D:][rows] = b.T.to(w.dtype)  # key rows
        # value (D -> D over all heads) and output projection: W_v^T W_o^T ~ alpha Z - beta I
        a, b = _factor(D, D, vo[0], -vo[1], g)
        w[2 * D :] = a.T.to(w.dtype)  # (D, D) value rows: v = x @ a
        attn.proj.weight.copy_(b.to(attn.proj.weight.dtype))  # out = v @ b.T -> x a b^T
        attn.qkv.bias.zero_()
        attn.proj.bias.zero_()
    return model
