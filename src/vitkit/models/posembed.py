"""Position embeddings: the fixed 2-D sin-cos variant, resizing of learned ones (section 3.2), and the
tables of the alternatives of appendix D.4 (Table 8): 2-D learned (a row and a column table) and
1-D relative (one embedding per query-key offset, used inside attention).

All are pure functions, used at build time, at load time, at run time on request, and by the analyses.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F


def sincos_2d_pos_embed(grid: tuple[int, int], dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine embedding (as in big_vision), shape (gh * gw, dim), raster order.

    Args:
        grid: the token grid (rows, cols).
        dim: the embedding width, a multiple of 4: sines and cosines of the column, then of the
            row, a quarter each.
        temperature: the base of the frequencies.

    Returns:
        The table (gh * gw, dim), float32.

    Raises:
        ValueError: ``dim`` is not a multiple of 4.
    """
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
    antialias: bool | None = None,
) -> torch.Tensor:
    """Resize a learned position embedding (1, prefix + gh*gw, D) to another grid.

    The prefix rows (the class token's embedding) are kept as they are; the grid is resized by
    2-D interpolation. The default, bilinear with ``align_corners=True``, is what the official
    code does (``scipy.ndimage.zoom(order=1)``); ``mode="bicubic"`` (with antialiasing when
    shrinking, as timm does) is the alternative. Rectangular grids work both ways.

    Args:
        pos_embed: the table (1, prefix + gh*gw, D).
        new_grid: the grid to resize to (rows, cols).
        old_grid: the table's grid; None: the square one its length implies.
        num_prefix_tokens: the rows before the grid's, kept as they are.
        mode: "bilinear" or "bicubic".
        align_corners: as in :func:`torch.nn.functional.interpolate`; None: True for bilinear,
            False for bicubic.
        antialias: as in :func:`torch.nn.functional.interpolate`; None: for bicubic where a
            side shrinks, else not.

    Returns:
        The table (1, prefix + gh'*gw', D) in the input's dtype; ``pos_embed`` itself when the
        grid is the same.

    Raises:
        ValueError: a table not of shape (1, N, D), or no ``old_grid`` for a grid that is not
            square.
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
    if antialias is None:
        antialias = mode == "bicubic" and (new_grid[0] < old_grid[0] or new_grid[1] < old_grid[1])
    g = F.interpolate(g, size=new_grid, mode=mode, align_corners=align_corners, antialias=antialias)
    g = g.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], D).to(dtype)  # (1, gh'*gw', D)
    return torch.cat([prefix, g], dim=1)


# ViTConfig.pos_resize -> resample_pos_embed's (mode, align_corners, antialias)
POS_RESIZE_ARGS: dict[str, tuple[Literal["bilinear", "bicubic"], bool | None, bool | None]] = {
    "bilinear": ("bilinear", None, None),
    "bilinear_aa": ("bilinear", False, True),
    "bicubic_aa": ("bicubic", False, True),
}


def resample_1d(table: torch.Tensor, new_length: int, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Resize a table of embeddings (..., L, C) along its length L to ``num_prefix_tokens + new_length``.

    The first ``num_prefix_tokens`` entries are kept as they are; the others are interpolated
    linearly with ``align_corners=True`` (the first and last entries stay where they are: the
    official bilinear convention, in one dimension). The same length returns ``table`` itself.
    Used for the row and column tables of "learned2d" and the offset table of "relative".

    Args:
        table: the embeddings (..., L, C).
        new_length: the entries after the prefix once resized.
        num_prefix_tokens: the leading entries kept as they are.

    Returns:
        The table (..., num_prefix_tokens + new_length, C) in the input's dtype.

    Raises:
        ValueError: a table of fewer than 2 dimensions, or a length below one before or after.
    """
    if table.ndim < 2:
        raise ValueError(f"embedding table must have shape (..., L, C), got {tuple(table.shape)}")
    prefix, body = table[..., :num_prefix_tokens, :], table[..., num_prefix_tokens:, :]
    old_length, new_length = body.shape[-2], int(new_length)
    if new_length < 1 or old_length < 1:
        raise ValueError(f"cannot resize {old_length} embeddings to {new_length}")
    if old_length == new_length:
        return table
    lead, C = body.shape[:-2], body.shape[-1]
    b = body.double().reshape(-1, old_length, C).transpose(1, 2)  # (n, C, L)
    b = F.interpolate(b, size=new_length, mode="linear", align_corners=True)
    b = b.transpose(1, 2).reshape(*lead, new_length, C).to(table.dtype)  # (..., L', C)
    return torch.cat([prefix, b], dim=-2)


def learned_2d_pos_table(row: torch.Tensor, col: torch.Tensor, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """The "learned2d" E_pos (1, P + gh*gw, D) from a row table (1, gh, D/2) and a column table
    (1, gw, D/2): patch (i, j), raster order, gets ``cat(row[i], col[j])`` (row half first), after
    the ``prefix`` rows (1, P, D) when given (the class token's position).

    Args:
        row: the row table (1, gh, D/2).
        col: the column table (1, gw, D/2).
        prefix: the rows of the prefix tokens (1, P, D); None: none.

    Returns:
        E_pos (1, P + gh*gw, D).
    """
    gh, gw = row.shape[1], col.shape[1]
    grid = torch.cat([row[:, :, None].expand(-1, gh, gw, -1), col[:, None].expand(-1, gh, gw, -1)], dim=-1)
    grid = grid.reshape(1, gh * gw, grid.shape[-1])  # (1, gh*gw, D)
    return grid if prefix is None else torch.cat([prefix, grid], dim=1)


# ----------------------------------------------------------------------------------------------
# 1-D relative positions (appendix D.4): one learned embedding per query-key offset.
#
# Patches are positions 0..N-1 in raster order; a query-key pair of patches (i, j) has the offset
# i - j in [-(N-1), N-1]: 2N-1 entries. With prefix tokens (the class token) the table has one
# more entry, first, used by every pair with a prefix token in it: 2N-1+1 entries. Entry of a
# pair of patches: (i - j) + (N - 1) + 1 with the prefix entry, (i - j) + (N - 1) without.


def relative_num_offsets(num_patches: int, num_prefix_tokens: int = 0) -> int:
    """Entries of the relative table: 2N-1 patch offsets, plus one for the prefix pairs if any."""
    return 2 * num_patches - 1 + (1 if num_prefix_tokens else 0)


def relative_offset_index(
    num_patches: int, num_prefix_tokens: int = 0, device: torch.device | str | None = None
) -> torch.Tensor:
    """The (T, T) table entry of every (query, key) pair, T = prefix + N tokens (prefix first).

    Args:
        num_patches: N, the patch tokens.
        num_prefix_tokens: the tokens before the patches; every pair with one of them uses entry 0.
        device: where to make the index.

    Returns:
        The entries (T, T), int64.
    """
    P, N = num_prefix_tokens, num_patches
    extra = 1 if P else 0
    pos = torch.arange(N, device=device)
    index = torch.zeros(P + N, P + N, dtype=torch.long, device=device)  # prefix pairs: entry 0
    index[P:, P:] = pos[:, None] - pos[None, :] + (N - 1) + extra
    return index


def resample_relative_embed(table: torch.Tensor, num_patches: int, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Resize a relative table (2N-1 [+1], C) to ``num_patches`` N' patches: the patch offsets are
    interpolated linearly (align_corners=True) from 2N-1 to 2N'-1 entries, the prefix entry kept.

    Offsets are in raster order, the paper's 1-D choice: across grid widths an offset means only
    approximately the same displacement (offset gw is "one row down" on one grid, not on another).

    Args:
        table: the relative table (2N-1, C), or (2N, C) with the prefix entry first.
        num_patches: N', the patch tokens of the new grid.
        num_prefix_tokens: the model's prefix tokens (any number: the table has one entry for them).

    Returns:
        The table (2N'-1, C), or (2N', C) with the prefix entry.
    """
    extra = 1 if num_prefix_tokens else 0
    return resample_1d(table, relative_num_offsets(num_patches), num_prefix_tokens=extra)


# ----------------------------------------------------------------------------------------------
# 2-D rotary position embeddings (RoPE): each head's queries and keys of the patches are rotated,
# channel pair by channel pair, by angles that grow with the patch's place, so that the logit of
# a query-key pair depends on their offset. A quarter of the pairs turns with the row, a quarter
# with the column, each at the frequencies theta ** (-4k / head_dim), k = 0 .. head_dim/4 - 1.
#
# "rope_axial" places patch (i, j) at (i, j), its row and column indices (RoPE-Axial, Heo et al.
# 2024). "rope_dinov3" places it at its centre in [-1, 1] on each axis, (2 (i + 0.5) / gh - 1,
# 2 (j + 0.5) / gw - 1), and turns by 2 pi times that over the period theta ** (4k / head_dim)
# (DINOv3): the angles span the same range on every grid, so another resolution needs no resize.
#
# The pairs are in the rotate-half layout: channel c pairs with channel c + head_dim/2, and the
# angles of the first half are [row angles, column angles]; the second half repeats them.


def rope_angles(grid: tuple[int, int], head_dim: int, theta: float = 100.0, kind: str = "rope_dinov3") -> torch.Tensor:
    """The rotation angle of each patch and channel pair, (gh * gw, head_dim / 2), raster order,
    in float64: the row's angles first, then the column's.

    Args:
        grid: the token grid (rows, cols).
        head_dim: channels per attention head (a multiple of 4).
        theta: the base of the frequencies.
        kind: "rope_axial" (row and column indices) or "rope_dinov3" (patch centres in [-1, 1]).

    Returns:
        The angles.
    """
    if head_dim % 4 or head_dim < 4:
        raise ValueError(f"2-D RoPE needs a head width divisible by 4, got {head_dim}")
    if kind not in ("rope_axial", "rope_dinov3"):
        raise ValueError(f"RoPE kind must be 'rope_axial' or 'rope_dinov3', got {kind!r}")
    gh, gw = int(grid[0]), int(grid[1])
    exponents = 4.0 * torch.arange(head_dim // 4, dtype=torch.float64) / head_dim  # (hd/4,)
    if kind == "rope_axial":
        rows, cols = torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64)
        scale = theta**-exponents  # radians per unit of position
    else:
        rows = 2.0 * (torch.arange(gh, dtype=torch.float64) + 0.5) / gh - 1.0
        cols = 2.0 * (torch.arange(gw, dtype=torch.float64) + 0.5) / gw - 1.0
        scale = 2.0 * math.pi / theta**exponents  # one turn per period
    row_angles = (rows[:, None] * scale)[:, None].expand(gh, gw, -1)  # (gh, gw, hd/4)
    col_angles = (cols[:, None] * scale)[None].expand(gh, gw, -1)  # (gh, gw, hd/4)
    return torch.cat([row_angles, col_angles], dim=-1).reshape(gh * gw, head_dim // 2)


def rope_table(grid: tuple[int, int], head_dim: int, theta: float = 100.0, kind: str = "rope_dinov3") -> torch.Tensor:
    """The cosines and sines a grid's patches are rotated with, (2, gh * gw, head_dim), float32,
    in the rotate-half layout (:func:`rope_angles`, repeated over the two halves).

    Args:
        grid: the token grid (rows, cols).
        head_dim: channels per attention head (a multiple of 4).
        theta: the base of the frequencies.
        kind: "rope_axial" or "rope_dinov3".

    Returns:
        ``table[0]`` the cosines, ``table[1]`` the sines.
    """
    angles = rope_angles(grid, head_dim, theta, kind).repeat(1, 2)  # (N, hd)
    return torch.stack([angles.cos(), angles.sin()]).float()


def rotate_patches(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Queries or keys (B, H, T, hd) with their last N tokens, the patches, rotated by a
    :func:`rope_table` of N rows; the T - N tokens before them (class token, registers) unchanged.

    Args:
        x: the queries or keys.
        table: (2, N, hd): cosines and sines (cast to ``x``'s dtype); or (2, B, 1, N, hd), one
            table per image (a NaFlex batch).

    Returns:
        The rotated tensor, of ``x``'s shape and dtype.
    """
    cos, sin = table.to(x.dtype).unbind(0)  # (N, hd) or (B, 1, N, hd) each
    prefix = x.shape[-2] - cos.shape[-2]
    patches = x[..., prefix:, :]
    first, second = patches.chunk(2, dim=-1)
    turned = torch.cat([-second, first], dim=-1)  # each pair (a, b) -> (-b, a): a quarter turn
    rotated = patches * cos + turned * sin
    return torch.cat([x[..., :prefix, :], rotated], dim=-2) if prefix else rotated


def add_tokens_and_positions(
    patches: torch.Tensor,
    prefix: torch.Tensor | None,
    pos: torch.Tensor | None,
    cls_pos_embed: bool,
    registers: torch.Tensor | None = None,
) -> torch.Tensor:
    """z0 of eq. 1 from the patch tokens (B, N, D): the prefix tokens (1, P, D) (the class token,
    then DeiT's distillation token; None for none) put first and E_pos (if any) added, to every
    token or, with ``cls_pos_embed`` False (big_vision), to the patches before the prefix joins them.
    The register tokens (1, R, D), if any, go in after the prefix tokens once the positions are
    added: they have none (DINOv2 with registers)."""
    x = patches
    if prefix is not None:
        tokens = prefix.expand(x.shape[0], -1, -1)  # (B, P, D)
        if pos is not None and not cls_pos_embed:
            x = x + pos
            pos = None
        x = torch.cat([tokens, x], dim=1)  # (B, P+N, D)
    if pos is not None:
        x = x + pos
    if registers is not None:
        p = 0 if prefix is None else prefix.shape[1]
        regs = registers.expand(x.shape[0], -1, -1)  # (B, R, D)
        x = torch.cat([x[:, :p], regs, x[:, p:]], dim=1)  # (B, P+R+N, D)
    return x
