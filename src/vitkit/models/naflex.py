"""NaFlex inputs: images kept at their own aspect ratio, cut into patches under a token budget.

A NaFlex batch holds patches already cut: ``patches (B, L, P*P*C)``, ``coords (B, L, 2)`` (row and
column of each patch in its image's grid) and ``valid (B, L)`` (False on padding rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from vitkit.errors import UsageError
from vitkit.models.posembed import add_tokens_and_positions
from vitkit.preprocessing import fit_grid


@dataclass
class NaflexBatch:
    """A batch of images, each as the patches of its own grid, padded to a common length.

    Attributes:
        patches: (B, L, P*P*C) float, each row a patch flattened in (row, col, channel) order.
        coords: (B, L, 2) long, the (row, col) of each patch in its image's grid; 0 on padding.
        valid: (B, L) bool, True for real patches.
        grids: the (rows, cols) grid of each image.
    """

    patches: torch.Tensor
    coords: torch.Tensor
    valid: torch.Tensor
    grids: list[tuple[int, int]]

    def to(
        self, device: torch.device | str | torch.dtype | None = None, dtype: torch.dtype | None = None
    ) -> NaflexBatch:
        """The batch on ``device``, its patches in ``dtype`` (coords and validity keep theirs).

        Args:
            device: where the tensors go; None: where they are; a dtype: as ``dtype``.
            dtype: the patches' dtype; None: theirs.

        Returns:
            A new batch (the same one where nothing changes).
        """
        if isinstance(device, torch.dtype):  # .to(dtype), as a tensor takes it
            device, dtype = None, device
        patches = self.patches.to(device=device, dtype=dtype)
        return NaflexBatch(patches, self.coords.to(device), self.valid.to(device), self.grids)

    def __len__(self) -> int:
        return self.patches.shape[0]

    @property
    def real_tokens(self) -> int:
        """The patches of the batch that are not padding."""
        return int(self.valid.sum())


def patchify(image: torch.Tensor, grid: tuple[int, int], patch: int) -> torch.Tensor:
    """Resize one image to ``grid`` patches (aspect ratio kept by the grid) and cut it.

    Args:
        image: (C, H, W) float.
        grid: (rows, cols) from :func:`fit_grid`.
        patch: patch side in pixels.

    Returns:
        (rows*cols, P*P*C) patches in raster order, each flattened as (row, col, channel).
    """
    rows, cols = grid
    c = image.shape[0]
    size = (rows * patch, cols * patch)
    x = image
    if tuple(image.shape[-2:]) != size:  # an image decoded at its grid's size is only cut
        x = F.interpolate(image[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    # (C, rows*P, cols*P) -> (rows, P, cols, P, C) -> (rows, cols, P, P, C) -> (rows*cols, P*P*C)
    x = x.permute(1, 2, 0).reshape(rows, patch, cols, patch, c)
    return x.permute(0, 2, 1, 3, 4).reshape(rows * cols, patch * patch * c)


def fitted_grid(image: torch.Tensor, patch: int, max_tokens: int) -> tuple[int, int]:
    """The grid of an image already resized to whole patches (as NaFlex decoding leaves it).

    Args:
        image: (C, H, W) with H and W multiples of ``patch``.
        patch: patch side in pixels.
        max_tokens: the most patches one image may have.

    Returns:
        (H / patch, W / patch).

    Raises:
        UsageError: sides that are not whole patches, or more patches than ``max_tokens``.
    """
    h, w = image.shape[-2:]
    if h % patch or w % patch or (h // patch) * (w // patch) > max_tokens:
        raise UsageError(f"naflex: an image of {h}x{w} px is not a grid of at most {max_tokens} patches of {patch} px")
    return h // patch, w // patch


def unpatchify(batch: NaflexBatch, index: int, patch: int) -> torch.Tensor:
    """One image of a batch, put back together from its patches (the inverse of :func:`patchify`).

    Args:
        batch: a NaFlex batch.
        index: which image.
        patch: patch side in pixels.

    Returns:
        (C, rows*P, cols*P).
    """
    rows, cols = batch.grids[index]
    x = batch.patches[index, : rows * cols]  # (rows*cols, P*P*C)
    c = x.shape[1] // (patch * patch)
    # (rows*cols, P*P*C) -> (rows, cols, P, P, C) -> (C, rows, P, cols, P) -> (C, rows*P, cols*P)
    x = x.reshape(rows, cols, patch, patch, c).permute(4, 0, 2, 1, 3)
    return x.reshape(c, rows * patch, cols * patch)


def collate(images: list[torch.Tensor], patch: int, max_tokens: int, fitted: bool = False) -> NaflexBatch:
    """Fit each image to the budget, cut it into patches and pad the batch to a common length.

    Args:
        images: list of (C, H, W) float images of any sizes.
        patch: patch side in pixels.
        max_tokens: the most patches one image may have.
        fitted: the images are already at their grid's size (:func:`fitted_grid`): only cut.

    Returns:
        A :class:`NaflexBatch` of length L = the largest patch count in the batch.
    """
    if not images:
        raise UsageError("naflex: an empty batch")
    if fitted:
        grids = [fitted_grid(im, patch, max_tokens) for im in images]
    else:
        grids = [fit_grid(im.shape[-2], im.shape[-1], patch, max_tokens) for im in images]
    cut = [patchify(im, g, patch) for im, g in zip(images, grids, strict=True)]
    length = max(p.shape[0] for p in cut)
    dim = cut[0].shape[1]
    patches = torch.zeros(len(cut), length, dim, dtype=cut[0].dtype)
    coords = torch.zeros(len(cut), length, 2, dtype=torch.long)
    valid = torch.zeros(len(cut), length, dtype=torch.bool)
    for i, (p, (rows, cols)) in enumerate(zip(cut, grids, strict=True)):
        n = p.shape[0]
        patches[i, :n] = p
        r = torch.arange(rows).repeat_interleave(cols)  # (rows*cols,) raster order
        col = torch.arange(cols).repeat(rows)
        coords[i, :n] = torch.stack([r, col], dim=-1)
        valid[i, :n] = True
    return NaflexBatch(patches=patches, coords=coords, valid=valid, grids=grids)


# Position kinds a NaFlex batch can use: their table is computed or resampled for any grid.
NAFLEX_POS_EMBEDS = ("learned", "learned2d", "sincos2d", "none", "rope_axial", "rope_dinov3")
_ROPE = ("rope_axial", "rope_dinov3")


def check_naflex_model(model: torch.nn.Module) -> None:
    """Refuse, in one line, a model whose NaFlex forward is not supported.

    Args:
        model: a :class:`vitkit.models.vit.VisionTransformer`.
    """
    cfg = model.cfg
    if cfg.pos_embed not in NAFLEX_POS_EMBEDS:
        raise UsageError(
            f"naflex: pos_embed={cfg.pos_embed!r} cannot be computed per image grid; "
            f"supported: {', '.join(NAFLEX_POS_EMBEDS)}"
        )
    if cfg.classifier not in ("token", "gap", "map"):
        raise UsageError(f"naflex: classifier={cfg.classifier!r} is not supported; use 'token', 'gap' or 'map'")
    if model.patch_embed.backbone is not None or model.dist_token is not None:
        raise UsageError("naflex: hybrid (ResNet stem) and distilled models are not supported")
    if cfg.patch_size[0] != cfg.patch_size[1]:
        raise UsageError(f"naflex: patches of {cfg.patch_size[0]}x{cfg.patch_size[1]} px; NaFlex cuts square patches")


def naflex_patch(model: torch.nn.Module) -> int:
    """The patch side a model's NaFlex batches are cut in, after :func:`check_naflex_model`.

    Args:
        model: a :class:`vitkit.models.vit.VisionTransformer` (anything else is refused in one line).

    Returns:
        The patch side in pixels.
    """
    if not hasattr(model, "patch_embed") or not hasattr(model, "cfg"):
        raise UsageError(f"naflex: needs a ViT; {type(model).__name__} has no patch embedding")
    check_naflex_model(model)
    return int(model.cfg.patch_size[0])


def naflex_features(model: torch.nn.Module, batch: NaflexBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaFlex batch -> the normed tokens (B, T+L, D) and the token mask (B, T+L).

    T is the number of prefix tokens (class token, registers); the mask is False on padding.

    Args:
        model: a :class:`vitkit.models.vit.VisionTransformer` that :func:`check_naflex_model` accepts.
        batch: the patches, coordinates and validity of each image.

    Returns:
        (tokens, mask).
    """
    check_naflex_model(model)
    proj = model.patch_embed.proj
    # conv weight (D, C, P, P) -> (D, P, P, C) -> (D, P*P*C): the (row, col, channel) order of patchify
    weight = proj.weight.permute(0, 2, 3, 1).reshape(proj.out_channels, -1)
    if batch.patches.shape[-1] != weight.shape[1]:
        raise UsageError(
            f"naflex: patches of {batch.patches.shape[-1]} values, the model wants {weight.shape[1]} (P*P*C)"
        )
    x = F.linear(batch.patches, weight, proj.bias)  # (B, L, D)
    B, L = x.shape[:2]
    pos = rope = None
    if model.cfg.pos_embed in _ROPE:  # each image's rotary rows, gathered by its coords
        tables = []
        for i, grid in enumerate(batch.grids):
            idx = batch.coords[i, :, 0] * grid[1] + batch.coords[i, :, 1]
            tables.append(model._rope_table(grid).to(x.device)[:, idx])  # (2, L, hd)
        rope = torch.stack(tables, dim=1)[:, :, None]  # (2, B, 1, L, hd)
    elif model.cfg.pos_embed != "none":
        rows = []
        prefix_rows = None
        for i, grid in enumerate(batch.grids):
            table = model.pos_embed_table(grid)  # (1, P+N, D)
            n = grid[0] * grid[1]
            prefix_rows = table[:, : table.shape[1] - n]
            # coords of image i -> raster index into its table
            idx = batch.coords[i, :, 0] * grid[1] + batch.coords[i, :, 1]
            rows.append(table[0, table.shape[1] - n :][idx] * batch.valid[i, :, None])
        pos = torch.cat([prefix_rows.expand(B, -1, -1), torch.stack(rows)], dim=1)  # (B, P+L, D)
    x = add_tokens_and_positions(x, model.prefix_tokens(), pos, model.cfg.cls_pos_embed, model.reg_token)
    x = model._pre_norm(x)
    T = x.shape[1] - L
    mask = torch.cat([torch.ones(B, T, dtype=torch.bool, device=x.device), batch.valid.to(x.device)], dim=1)
    recompute = model.grad_checkpointing and torch.is_grad_enabled()
    for blk in model.blocks:
        if recompute:  # as forward_features: the block runs again in the backward pass
            x = checkpoint(blk, x, rope=rope, key_mask=mask, use_reentrant=False)
        else:
            x = blk(x, rope=rope, key_mask=mask)
    return model.norm(x), mask


def forward_naflex(model: torch.nn.Module, batch: NaflexBatch, pre_logits: bool = False) -> torch.Tensor:
    """A NaFlex batch -> logits (B, K) (the pooled features for a model without a head).

    Args:
        model: a :class:`vitkit.models.vit.VisionTransformer`.
        batch: the patches, coordinates and validity of each image.
        pre_logits: return the representation before the classifier (as ``forward_head``'s).

    Returns:
        The logits, or the representation, pooled over each image's real tokens only (the class
        token, the mean of the real patches, or the MAP head's probe attending to real tokens).
    """
    tokens, mask = naflex_features(model, batch)
    x = model.pool(tokens, mask)
    if model.pre_logits is not None:
        x = torch.tanh(model.pre_logits(x))
    return x if pre_logits or model.head is None else model.head(x)
