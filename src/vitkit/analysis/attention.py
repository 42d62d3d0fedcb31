"""What the attention looks at: rollout (paper Figure 6) and mean attention distance (Figure 7 right).

All functions take the per-block softmax weights that
``VisionTransformer.forward_intermediates(x, return_attention=True)["attention"]`` returns: a list,
one (B, heads, N, N) tensor per block, rows = queries, columns = keys, tokens in the model's order
(prefix tokens such as the class token first, then the patches in raster order).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

HeadFusion = Literal["mean", "max", "min"]


# ----------------------------------------------------------------------------------------------
# Collecting the weights.


def _check_vit(model: nn.Module) -> None:
    if not hasattr(model, "forward_intermediates") or not hasattr(model, "cfg"):
        raise TypeError(
            f"attention analyses need a vitkit VisionTransformer, got {type(model).__name__} "
            "(a CNN such as the BiT ResNet has no attention)"
        )


def grid_of(model: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    """Token grid (rows, cols) ``model`` makes of ``images`` (B, C, H, W).

    Args:
        model: a vitkit ViT or hybrid.
        images: model inputs (B, C, H, W); only their height and width are read.

    Returns:
        The grid (rows, cols).

    Raises:
        TypeError: ``model`` is not a vitkit ViT.
    """
    _check_vit(model)
    return model.cfg.grid_for(tuple(images.shape[-2:]))


def collect_attention(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Run ``model`` on ``images`` (B, C, H, W) without gradients and return the softmax
    weights of every block: a list of ``depth`` tensors (B, heads, N, N), on the CPU in float32.

    The model is put in eval mode for the call (so attention dropout is off) and restored after.

    Args:
        model: a vitkit ViT or hybrid.
        images: model inputs (B, C, H, W), already normalised.

    Returns:
        One (B, heads, N, N) tensor per block, first block first.

    Raises:
        TypeError: ``model`` is not a vitkit ViT.
    """
    _check_vit(model)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            out = model.forward_intermediates(images, return_attention=True)
    finally:
        model.train(was_training)
    return [w.float().cpu() for w in out["attention"]]


def _check_attentions(attentions: list[torch.Tensor]) -> None:
    if len(attentions) == 0:
        raise ValueError("need the attention weights of at least one block, got an empty list")
    first = tuple(attentions[0].shape)
    for i, w in enumerate(attentions):
        if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
            raise ValueError(f"attention weights of block {i} must have shape (B, heads, N, N), got {tuple(w.shape)}")
        if (w.shape[0], w.shape[-1]) != (first[0], first[-1]):
            raise ValueError(f"block {i} has attention of shape {tuple(w.shape)}, block 0 has {first}")


def _check_tokens(num_tokens: int, grid: tuple[int, int], num_prefix_tokens: int) -> int:
    gh, gw = grid
    if num_prefix_tokens < 0 or num_tokens != num_prefix_tokens + gh * gw:
        raise ValueError(
            f"attention over {num_tokens} tokens does not fit a {gh}x{gw} grid with {num_prefix_tokens} "
            f"prefix token(s) ({num_prefix_tokens + gh * gw} tokens)"
        )
    return gh * gw


# ----------------------------------------------------------------------------------------------
# Attention rollout (Abnar and Zuidema, 2020).


def attention_rollout(
    attentions: list[torch.Tensor],
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Attention rollout through all given blocks, (B, N, N).

    Per block: fuse the heads (``"mean"``, as the paper; ``"max"`` or ``"min"`` are common
    variants), optionally zero the ``discard_ratio`` smallest weights of every query row, add the
    identity for the residual connection and renormalise the rows to sum to one. The blocks are
    then chained, ``rollout = A_L @ ... @ A_2 @ A_1``, so that ``rollout[b, i, j]`` is how much of
    input token ``j`` flows into output token ``i``. Identity attention gives an identity rollout.

    Args:
        attentions: the softmax weights of each block, (B, heads, N, N) each
            (:func:`collect_attention`).
        head_fusion: how the heads are fused: "mean", "max" or "min".
        discard_ratio: the fraction of each query row's smallest weights zeroed, in [0, 1).

    Returns:
        The rollout (B, N, N), float32 (float64 for float64 weights); each row sums to one.

    Raises:
        ValueError: an empty list, or weights that are not (B, heads, N, N) alike, an unknown
            ``head_fusion``, or a ``discard_ratio`` outside [0, 1).
    """
    _check_attentions(attentions)
    if head_fusion not in ("mean", "max", "min"):
        raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    dtype = torch.float64 if attentions[0].dtype == torch.float64 else torch.float32
    B, _, N, _ = attentions[0].shape
    eye = torch.eye(N, dtype=dtype, device=attentions[0].device)
    rollout = eye.expand(B, N, N).clone()  # (B, N, N)
    num_discard = int(N * discard_ratio)
    for w in attentions:
        w = w.to(dtype)
        if head_fusion == "mean":
            a = w.mean(dim=1)  # (B, N, N)
        elif head_fusion == "max":
            a = w.amax(dim=1)
        else:
            a = w.amin(dim=1)
        if num_discard:
            lowest = a.topk(num_discard, dim=-1, largest=False).indices  # (B, N, num_discard)
            a = a.scatter(-1, lowest, 0.0)
        a = a + eye
        a = a / a.sum(dim=-1, keepdim=True)
        rollout = a @ rollout
    return rollout


def _query_rows(
    matrix: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int, query: int | tuple[int, int] | None
) -> torch.Tensor:
    """Rows of ``matrix`` (..., N, N) for one query, over the patch keys: (..., gh*gw).

    ``query=None``: the class token (first prefix token), or for models without one the mean
    over all patch queries. An int (raster index) or a (row, col) pair: that patch.
    """
    gh, gw = grid
    P = _check_tokens(matrix.shape[-1], grid, num_prefix_tokens)
    patches = matrix[..., num_prefix_tokens:]  # (..., N, P)
    if query is None:
        if num_prefix_tokens:
            return patches[..., 0, :]  # (..., P)
        return patches[..., num_prefix_tokens:, :].mean(dim=-2)  # (..., P)
    index = query[0] * gw + query[1] if isinstance(query, tuple) else int(query)
    if not 0 <= index < P:
        raise ValueError(f"query patch {query!r} is outside the {gh}x{gw} grid")
    return patches[..., num_prefix_tokens + index, :]  # (..., P)


def rollout_map(
    rollout: torch.Tensor,
    grid: tuple[int, int],
    num_prefix_tokens: int,
    query: int | tuple[int, int] | None = None,
) -> torch.Tensor:
    """One query's row of a rollout (B, N, N) over the patch tokens, as maps (B, gh, gw) scaled
    to [0, 1] per image (a constant map becomes all zeros). ``query`` as in :func:`cls_rollout_map`.

    Args:
        rollout: the rollout (B, N, N) of :func:`attention_rollout`.
        grid: the token grid (rows, cols).
        num_prefix_tokens: the tokens before the patches (class, distillation, registers).
        query: the query token: None for the class token (without one, the mean over the patch
            queries); a patch by its raster index or (row, col).

    Returns:
        The maps (B, gh, gw), in [0, 1].

    Raises:
        ValueError: N does not fit the grid and prefix tokens, or a query outside the grid.
    """
    row = _query_rows(rollout, grid, num_prefix_tokens, query)  # (B, P)
    lo = row.amin(dim=-1, keepdim=True)
    hi = row.amax(dim=-1, keepdim=True)
    row = (row - lo) / (hi - lo).clamp_min(torch.finfo(row.dtype).tiny)
    return row.reshape(row.shape[0], grid[0], grid[1])  # (B, gh, gw)


def cls_rollout_map(
    model: nn.Module,
    images: torch.Tensor,
    query: int | tuple[int, int] | None = None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Where the model looks (paper Figure 6): the rollout row of the class token over the patch
    tokens, (B, gh, gw), scaled to [0, 1] per image.

    ``images`` are model inputs (B, C, H, W), already normalised. For models without a class
    token (GAP) the default is the mean of the patch-token rows; ``query`` (a raster index or a
    (row, col) pair) picks one patch's row instead, for any model.

    Args:
        model: a vitkit ViT or hybrid.
        images: model inputs (B, C, H, W), already normalised.
        query: the query token: None for the class token (without one, the mean over the patch
            queries); a patch by its raster index or (row, col).
        head_fusion: how the heads are fused: "mean", "max" or "min".
        discard_ratio: the fraction of each query row's smallest weights zeroed, in [0, 1).

    Returns:
        The maps (B, gh, gw), in [0, 1].

    Raises:
        TypeError: ``model`` is not a vitkit ViT.
        ValueError: a bad ``head_fusion``, ``discard_ratio`` or ``query``.
    """
    attentions = collect_attention(model, images)
    rollout = attention_rollout(attentions, head_fusion=head_fusion, discard_ratio=discard_ratio)
    return rollout_map(rollout, grid_of(model, images), model.cfg.num_prefix_tokens, query)


def token_attention_maps(
    attentions: list[torch.Tensor],
    grid: tuple[int, int],
    num_prefix_tokens: int,
    query: int | tuple[int, int] | None = None,
) -> torch.Tensor:
    """Raw attention of one query over the patch keys, per block and head: (B, layers, heads, gh, gw).

    ``query=None`` is the class token (or, without one, the mean over patch queries); see
    :func:`cls_rollout_map`. The weights are shown as they are: the share a query puts on prefix
    tokens is not redistributed, so a map sums to at most one.

    Args:
        attentions: the softmax weights of each block, (B, heads, N, N) each
            (:func:`collect_attention`).
        grid: the token grid (rows, cols).
        num_prefix_tokens: the tokens before the patches (class, distillation, registers).
        query: the query token: None for the class token (without one, the mean over the patch
            queries); a patch by its raster index or (row, col).

    Returns:
        The maps (B, layers, heads, gh, gw).

    Raises:
        ValueError: an empty list, or weights that are not (B, heads, N, N) alike, N that does
            not fit the grid and prefix tokens, or a query outside the grid.
    """
    _check_attentions(attentions)
    rows = torch.stack([_query_rows(w, grid, num_prefix_tokens, query) for w in attentions], dim=1)  # (B, L, H, P)
    B, L, H, _ = rows.shape
    return rows.reshape(B, L, H, grid[0], grid[1])  # (B, L, H, gh, gw)


# ----------------------------------------------------------------------------------------------
# Mean attention distance (paper Figure 7 right, appendix D.7).


def patch_distances(grid: tuple[int, int], stride: int | tuple[int, int]) -> torch.Tensor:
    """Euclidean distances in input pixels between the centres of all patch pairs, (P, P), float64.

    ``stride`` is the number of input pixels per token along (h, w): the patch size, times the
    stem's downsampling for hybrids (``cfg.total_stride``).

    Args:
        grid: the token grid (rows, cols).
        stride: input pixels per token along (h, w); an int for both.

    Returns:
        The distances (P, P), P = rows * cols, patches in raster order.
    """
    gh, gw = grid
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    rows, cols = torch.meshgrid(
        torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij"
    )
    centres = torch.stack([(rows.flatten() + 0.5) * sh, (cols.flatten() + 0.5) * sw], dim=1)  # (P, 2)
    return torch.cdist(centres, centres)  # (P, P)


def mean_attention_distance(
    attentions: list[torch.Tensor],
    grid: tuple[int, int],
    stride: int | tuple[int, int],
    num_prefix_tokens: int,
) -> torch.Tensor:
    """Attention-weighted mean distance in input pixels between query and key patches,
    per block and head: (layers, heads), float64.

    For every query patch, the distances (between patch centres, ``stride`` pixels apart, see
    :func:`patch_distances`) to all key patches are averaged with the query's attention weights;
    the result is averaged over query patches and images. This is the "attention distance" of the
    paper, analogous to a CNN's receptive field size.

    Prefix tokens (the class token) have no place in the image, so they are dropped both as
    queries and as keys, and each query's weights over the patch keys are renormalised to sum to
    one: the result is the expected distance of the patches a query attends to. (Counting the
    class token's share as distance zero would instead make a head look more local the more it
    attends to the class token.)

    Args:
        attentions: the softmax weights of each block, (B, heads, N, N) each
            (:func:`collect_attention`).
        grid: the token grid (rows, cols).
        stride: input pixels per token along (h, w) (``cfg.total_stride``); an int for both.
        num_prefix_tokens: the tokens before the patches (class, distillation, registers).

    Returns:
        The distances in pixels (layers, heads), float64, on the CPU.

    Raises:
        ValueError: an empty list, or weights that are not (B, heads, N, N) alike, or N that
            does not fit the grid and prefix tokens.
    """
    _check_attentions(attentions)
    _check_tokens(attentions[0].shape[-1], grid, num_prefix_tokens)
    dist = patch_distances(grid, stride).to(attentions[0].device)  # (P, P)
    per_layer = []
    for w in attentions:
        a = w[..., num_prefix_tokens:, num_prefix_tokens:].to(torch.float64)  # (B, H, P, P)
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        per_query = (a * dist).sum(dim=-1)  # (B, H, P)
        per_layer.append(per_query.mean(dim=(0, 2)))  # (H,)
    return torch.stack(per_layer).cpu()  # (L, H)


def prefix_attention_share(attentions: list[torch.Tensor], num_prefix_tokens: int) -> torch.Tensor:
    """The share of attention that patch queries give the prefix tokens (the class token,
    registers), per block and head: (layers, heads), float64, each in [0, 1].

    It is what :func:`mean_attention_distance` leaves out when it renormalises over patch keys:
    a head whose patches mostly read the class token has a small share of its weight left to
    spread over the image, however far that spreads.

    Args:
        attentions: softmax weights of each block, (B, heads, N, N), from :func:`collect_attention`.
        num_prefix_tokens: tokens before the patches (0 for a model pooled by GAP without
            registers: the share is then zero).

    Returns:
        (layers, heads) shares, averaged over patch queries and images.
    """
    _check_attentions(attentions)
    if num_prefix_tokens < 0 or num_prefix_tokens >= attentions[0].shape[-1]:
        raise ValueError(f"num_prefix_tokens must be in [0, {attentions[0].shape[-1]}), got {num_prefix_tokens}")
    rows = [
        w[..., num_prefix_tokens:, :num_prefix_tokens].to(torch.float64).sum(-1).mean(dim=(0, 2)) for w in attentions
    ]
    return torch.stack(rows).cpu()


# ----------------------------------------------------------------------------------------------
# How much of the rollout falls on the object (paper Figure 6, as a number).


def rollout_patch_weights(
    rollout: torch.Tensor,
    grid: tuple[int, int],
    num_prefix_tokens: int,
    query: int | tuple[int, int] | None = None,
) -> torch.Tensor:
    """One query's rollout row over the patch tokens as a distribution over the image:
    (B, gh*gw), float64, each row summing to one.

    Unlike :func:`rollout_map` (scaled to [0, 1] for pictures), the weights keep their
    proportions, so sums over regions of the image mean something.

    Args:
        rollout: from :func:`attention_rollout`, (B, N, N).
        grid: the token grid (rows, cols).
        num_prefix_tokens: tokens before the patches.
        query: as in :func:`cls_rollout_map` (None: the class token, or the mean over patch
            queries for a model without one).

    Returns:
        (B, gh*gw) weights in raster order; the share the query keeps on prefix tokens is left
        out and the rest renormalised.
    """
    row = _query_rows(rollout, grid, num_prefix_tokens, query).to(torch.float64)  # (B, P)
    return row / row.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)


def object_fraction(pixels: torch.Tensor, grid: tuple[int, int], threshold: float = 0.0) -> torch.Tensor:
    """The share of each token's pixels that belong to the object, for images whose background
    is blank (Fashion-MNIST, MNIST: zero): a pixel is the object's when any channel exceeds
    ``threshold``. The mask is averaged onto the token grid by area.

    Args:
        pixels: the images as the model saw them, (B, H, W) or channels last (B, H, W, C)
            (as :class:`vitkit.preprocessing.LoadedImages` holds them), any numeric dtype.
        grid: the token grid (rows, cols).
        threshold: the pixel value a pixel must exceed to count as the object.

    Returns:
        (B, gh, gw) fractions in [0, 1], float64.
    """
    import torch.nn.functional as F

    x = torch.as_tensor(pixels)
    if x.ndim == 4:
        x = x.amax(dim=-1)  # (B, H, W): object where any channel is
    if x.ndim != 3:
        raise ValueError(f"pixels must be (B, H, W) or (B, H, W, C), got shape {tuple(x.shape)}")
    mask = (x.to(torch.float64) > threshold).to(torch.float64)  # (B, H, W)
    return F.adaptive_avg_pool2d(mask[:, None], tuple(grid))[:, 0]  # (B, gh, gw)


def rollout_object_ratio(weights: torch.Tensor, fraction: torch.Tensor) -> torch.Tensor:
    """Rollout mass on the object against the object's share of the image, per image.

    The mass is the sum over tokens of the rollout weight times the token's object fraction;
    the share is the mean object fraction. Attention spread evenly over the image gives 1; all
    of it on the object gives ``1 / share``; more than 1 means the attention concentrates on the
    object.

    Args:
        weights: non-negative token weights, (B, gh*gw) or (B, gh, gw) (e.g. from
            :func:`rollout_patch_weights`); each image's are normalised to sum to one here.
        fraction: the object fraction per token, (B, gh, gw) or (B, gh*gw) (from :func:`object_fraction`).

    Returns:
        (B,) ratios, float64; nan for an image with no object pixel.
    """
    w = weights.reshape(weights.shape[0], -1).to(torch.float64)  # (B, P)
    f = fraction.reshape(fraction.shape[0], -1).to(torch.float64)  # (B, P)
    if w.shape != f.shape:
        raise ValueError(f"weights {tuple(weights.shape)} and object fractions {tuple(fraction.shape)} do not match")
    w = w / w.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    mass = (w * f).sum(dim=-1)  # (B,)
    share = f.mean(dim=-1)  # (B,)
    return torch.where(share > 0, mass / share.clamp_min(torch.finfo(torch.float64).tiny), torch.nan)


def register_attention_share(
    attentions: list[torch.Tensor], num_prefix_tokens: int, num_registers: int
) -> torch.Tensor:
    """The share of attention that patch queries give the register tokens (the last
    ``num_registers`` prefix tokens), per image and block: (B, layers), float64, in [0, 1].

    Registers (Darcet et al., 2024) take over the attention that a model without them puts on a
    few high-norm background patches; this is how much they take, averaged over heads and patch
    queries.

    Args:
        attentions: softmax weights of each block, (B, heads, N, N), from :func:`collect_attention`.
        num_prefix_tokens: all tokens before the patches, registers included.
        num_registers: the register tokens among them, the last ones.

    Returns:
        (B, layers) shares.

    Raises:
        ValueError: weights not (B, heads, N, N) alike, or more registers than prefix tokens.
    """
    _check_attentions(attentions)
    if not 0 <= num_registers <= num_prefix_tokens < attentions[0].shape[-1]:
        raise ValueError(
            f"{num_registers} register(s) among {num_prefix_tokens} prefix token(s) of {attentions[0].shape[-1]}"
        )
    start = num_prefix_tokens - num_registers
    rows = [
        w[..., num_prefix_tokens:, start:num_prefix_tokens].to(torch.float64).sum(-1).mean(dim=(1, 2))
        for w in attentions
    ]
    return torch.stack(rows, dim=1).cpu()  # (B, L)
