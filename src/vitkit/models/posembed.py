"""Position embeddings: the fixed 2-D sin-cos variant and resizing of learned ones (section 3.2).

Both are pure functions, used at load time, at run time on request, and by the analyses.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F


def sincos_2d_pos_embed(grid: tuple[int, int], dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine embedding (as in big_vision), shape (gh * gw, dim), raster order."""
    if dim % 4:
        raise ValueError(f"sincos2d position embedding needs a width divisible by 4, got {dim}")
    gh, gw = grid
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    quarter = dim // 4
    omega = torch.arange(quarter, dtype=torch.float64) / max(quarter - 1, 1)
    omega = 1.0 / temperature**omega  # (dim/4,)
    x = x.flatten()[:, None] * omega[None]  # (gh*gw, dim/4)
    y = y.flatten()[:, None] * omega[None]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).float()  # (gh*gw, dim)


def square_side(n: int) -> int | None:
    """The side of the square grid of ``n`` cells, or None when ``n`` cells form none (``n < 1``
    included). Exact integer arithmetic: ``round(n ** 0.5)`` is not, for large ``n``."""
    if n < 1:
        return None
    side = math.isqrt(n)
    return side if side * side == n else None


def infer_grid(num_patches: int, hint: tuple[int, int] | None = None) -> tuple[int, int]:
    """Grid of a flattened embedding: ``hint`` if it fits, else the square one."""
    if hint is not None and hint[0] * hint[1] == num_patches:
        return hint
    side = square_side(num_patches)
    if side is None:
        raise ValueError(
            f"cannot infer the grid of {num_patches} position embeddings: not a square; pass old_grid=(rows, cols)"
        )
    return (side, side)


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    mode: Literal["bilinear", "bicubic"] = "bilinear",
    align_corners: bool | None = None,
) -> torch.Tensor:
    """Resize a learned position embedding (1, prefix + gh*gw, D) to another grid.

    The prefix rows (the class token's embedding) are kept as they are; the grid is resized by
    2-D interpolation. The default, bilinear with ``align_corners=True``, is what the official
    code does (``scipy.ndimage.zoom(order=1)``); ``mode="bicubic"`` (with antialiasing when
    shrinking, as timm does) is the alternative. Rectangular grids work both ways.
    """
    if pos_embed.ndim != 3 or pos_embed.shape[0] != 1:
        raise ValueError(f"position embedding must have shape (1, N, D), got {tuple(pos_embed.shape)}")
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    old_grid = infer_grid(grid.shape[1], old_grid)
    new_grid = (int(new_grid[0]), int(new_grid[1]))
    if tuple(old_grid) == new_grid:
        return pos_embed
    if align_corners is None:
        align_corners = mode == "bilinear"
    D = grid.shape[-1]
    dtype = grid.dtype
    g = grid.double().reshape(1, old_grid[0], old_grid[1], D).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    antialias = mode == "bicubic" and (new_grid[0] < old_grid[0] or new_grid[1] < old_grid[1])
    g = F.interpolate(g, size=new_grid, mode=mode, align_corners=align_corners, antialias=antialias)
    g = g.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], D).to(dtype)  # (1, gh'*gw', D)
    return torch.cat([prefix, g], dim=1)
