"""What the embeddings learned: position-embedding similarity (paper Figure 7 centre) and the
principal components of the patch-embedding filters (Figure 7 left)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..models.posembed import infer_grid

# ----------------------------------------------------------------------------------------------
# Position embeddings.


def _pos_embed_of(model: nn.Module) -> tuple[torch.Tensor, tuple[int, int], int]:
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "grid_size"):
        raise TypeError(
            f"expected a vitkit VisionTransformer or a position-embedding tensor, got {type(model).__name__}"
        )
    if getattr(cfg, "pos_embed", None) == "relative":
        raise ValueError(
            "the model has no absolute position embedding (pos_embed='relative' learns one per query-key "
            "offset, inside attention); there is nothing to compare"
        )
    table = getattr(model, "pos_embed_table", None)  # learned2d: the full table, composed
    pos = table() if callable(table) else getattr(model, "pos_embed", None)
    if pos is None:
        raise ValueError(
            f"the model has no position embedding (pos_embed={cfg.pos_embed!r}); there is nothing to compare"
        )
    return pos.detach(), tuple(cfg.grid_size), cfg.pos_prefix_rows


def pos_embed_similarity(
    source: nn.Module | torch.Tensor,
    grid: tuple[int, int] | None = None,
    num_prefix_tokens: int | None = None,
) -> torch.Tensor:
    """Cosine similarity of every patch's position embedding to every other: (gh, gw, gh, gw).

    ``sim[i, j]`` is the (gh, gw) map of how similar patch (i, j)'s embedding is to each patch's;
    the paper shows it as a grid of such maps. ``source`` is a model (learned, learned2d or
    sin-cos embeddings; its grid and prefix rows are read from the config) or a tensor (1, N, D) or
    (N, D). For a tensor, ``grid`` defaults to the square one and ``num_prefix_tokens`` to
    whatever ``grid`` leaves over (0 without ``grid``). Prefix rows (the class token's) are left out.

    Args:
        source: a vitkit ViT, or a position table (1, N, D) or (N, D).
        grid: the patches' grid (rows, cols); None: the model's, or the square one.
        num_prefix_tokens: the table's rows before the patches'; None: as above.

    Returns:
        The similarities (gh, gw, gh, gw), float32, in [-1, 1].

    Raises:
        ValueError: a model without a position table, a table not of those shapes, or one
            whose rows do not fit the grid and prefix rows.
    """
    if isinstance(source, nn.Module):
        pos, model_grid, model_prefix = _pos_embed_of(source)
        grid = model_grid if grid is None else grid
        num_prefix_tokens = model_prefix if num_prefix_tokens is None else num_prefix_tokens
    else:
        pos = source.detach()
    if pos.ndim == 3:
        if pos.shape[0] != 1:
            raise ValueError(f"position embedding must have shape (1, N, D) or (N, D), got {tuple(pos.shape)}")
        pos = pos[0]  # (N, D)
    if pos.ndim != 2:
        raise ValueError(f"position embedding must have shape (1, N, D) or (N, D), got {tuple(pos.shape)}")
    N = pos.shape[0]
    if grid is None:
        num_prefix_tokens = num_prefix_tokens or 0
        grid = infer_grid(N - num_prefix_tokens)
    gh, gw = int(grid[0]), int(grid[1])
    if num_prefix_tokens is None:
        num_prefix_tokens = N - gh * gw
    if num_prefix_tokens < 0 or num_prefix_tokens + gh * gw != N:
        raise ValueError(f"{N} position embeddings do not fit a {gh}x{gw} grid with {num_prefix_tokens} prefix row(s)")
    emb = pos[num_prefix_tokens:].to(torch.float64)  # (P, D)
    emb = emb / emb.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    sim = emb @ emb.T  # (P, P)
    return sim.reshape(gh, gw, gh, gw).float()  # (gh, gw, gh, gw)


def pos_embed_similarity_summary(similarity: torch.Tensor) -> dict[str, float | None]:
    """Mean cosine similarity by how two patches are placed, from a (gh, gw, gh, gw) similarity.

    Keys: ``neighbours`` (4-connected, one step apart), ``same_row`` and ``same_column`` (sharing
    the row or column, self excluded), ``other`` (sharing neither), ``far`` (more than half the
    longer grid side apart, euclidean in patches) and ``self`` (the diagonal, 1 unless an
    embedding is zero). A learned 2-D structure shows as neighbours and same row/column well above
    other and far. A group with no pairs (e.g. ``far`` on a 2x2 grid) is ``None``.

    Args:
        similarity: the similarities (gh, gw, gh, gw) of :func:`pos_embed_similarity`.

    Returns:
        The mean similarity of each group above, by its key.

    Raises:
        ValueError: a tensor not of shape (gh, gw, gh, gw).
    """
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(f"expected a (gh, gw, gh, gw) similarity, got {tuple(similarity.shape)}")
    gh, gw = similarity.shape[:2]
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()  # (P,)
    same_row = rows[:, None] == rows[None, :]  # (P, P)
    same_col = cols[:, None] == cols[None, :]
    dist = torch.sqrt(((rows[:, None] - rows[None, :]) ** 2 + (cols[:, None] - cols[None, :]) ** 2).double())
    self_pair = same_row & same_col
    sim = similarity.reshape(gh * gw, gh * gw).double()  # (P, P)
    groups = {
        "self": self_pair,
        "neighbours": dist == 1,
        "same_row": same_row & ~self_pair,
        "same_column": same_col & ~self_pair,
        "other": ~same_row & ~same_col,
        "far": dist > max(gh, gw) / 2,
    }
    return {name: (float(sim[mask].mean()) if mask.any() else None) for name, mask in groups.items()}


# ----------------------------------------------------------------------------------------------
# Patch-embedding filters.


class FilterPCA(NamedTuple):
    """Leading principal components of the patch-embedding filters.

    Attributes:
        components: the components (k, C, ph, pw), each of unit norm.
        explained_variance_ratio: the share of the filters' total variance each explains (k,).
    """

    components: torch.Tensor  # (k, C, ph, pw), unit norm
    explained_variance_ratio: torch.Tensor  # (k,), share of the total variance of the filters


def embedding_filter_components(source: nn.Module | torch.Tensor, k: int = 28) -> FilterPCA:
    """Principal components of the patch-embedding filters E (paper Figure 7 left).

    ``source`` is a ViT (its ``patch_embed.proj`` convolution) or the kernel itself (D, C, ph, pw).
    The D filters are flattened to vectors of C*ph*pw values, centred (the mean filter removed)
    and decomposed by SVD. Returns the first ``k`` components (fewer if the filters span fewer
    dimensions), each of unit norm and with the sign that makes its largest-magnitude entry
    positive, and the fraction of the total variance each explains. For hybrids the filters act
    on the ResNet feature map, so C is its channel count, not RGB.

    Args:
        source: a vitkit ViT, or its patch-embedding kernel (D, C, ph, pw).
        k: the most components to return, at least 1.

    Returns:
        The components and the share of variance each explains, float32.

    Raises:
        TypeError: a module without a ``patch_embed.proj`` convolution.
        ValueError: a kernel not of 4 dimensions, ``k`` below 1, fewer than two filters, or
            filters that are all equal.
    """
    if isinstance(source, nn.Module):
        proj = getattr(getattr(source, "patch_embed", None), "proj", None)
        if not isinstance(proj, nn.Conv2d):
            raise TypeError(f"expected a vitkit VisionTransformer with patch_embed.proj, got {type(source).__name__}")
        weight = proj.weight.detach()
    else:
        weight = source.detach()
    if weight.ndim != 4:
        raise ValueError(f"patch-embedding kernel must have shape (D, C, ph, pw), got {tuple(weight.shape)}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    D, C, ph, pw = weight.shape
    if D < 2:
        raise ValueError("need at least two filters for principal components")
    x = weight.reshape(D, C * ph * pw).to(torch.float64).cpu()  # (D, F)
    x = x - x.mean(dim=0, keepdim=True)
    _, s, vt = torch.linalg.svd(x, full_matrices=False)  # s (r,), vt (r, F), r = min(D, F)
    var = s**2
    total = var.sum()
    if total <= 0:
        raise ValueError("all patch-embedding filters are equal; there is no variance to decompose")
    k = min(k, vt.shape[0])
    comps = vt[:k]  # (k, F)
    biggest = comps.abs().argmax(dim=1, keepdim=True)  # (k, 1)
    comps = comps * torch.sign(comps.gather(1, biggest))
    return FilterPCA(
        components=comps.reshape(k, C, ph, pw).float(),  # (k, C, ph, pw)
        explained_variance_ratio=(var[:k] / total).float(),
    )
