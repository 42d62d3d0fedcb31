"""Token merging (ToMe: Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023) for inference.

In each block, between the attention and the MLP, the ``r`` most similar pairs of patch tokens are
merged, so the sequence shrinks by ``r`` tokens a block and the later blocks cost less. As in the
paper: similarity is the cosine of the attention's keys (averaged over heads); matching is
bipartite (the tokens split alternately into two sets, each token of the first joined to its most
similar token of the second, the ``r`` best joins merged); a merged token is the size-weighted
mean of those it stands for, and attention is proportional (the log of each key's size added to
its logits), so that a token standing for ``s`` patches weighs as they would. The tokens before the
patches (the class token, the distillation token, registers) are never merged.

:func:`apply_token_merging` wraps each block of a vitkit ViT in place (:class:`MergingBlock`); the
block's own modules do the work, so a model prepared for serving (packed or int8 layers) merges
as well. With ``r = 0`` the wrapped model computes what the plain one does.

Models with 2-D RoPE (DINOv3, ``pos_embed="rope_*"``) merge too: each token carries its rotation
angles, and a merged token's are the size-weighted mean of those it stands for. A rotation angle
is the patch's position times a fixed frequency, so the merged token turns as a patch at the
centroid of its patches would. Models with relative position terms are refused: their bias table
is indexed by the grid's offsets, which merging dissolves.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import attend
from .config import ROPE_POS_EMBEDS
from .posembed import rotate_patches
from .vit import Block, VisionTransformer


class _Sizes:
    """How many patches each token of the current forward pass stands for, and (RoPE) the rotation
    angles of the patch tokens, shared by the blocks."""

    def __init__(self, rope_scale: torch.Tensor | None = None) -> None:
        self.size: torch.Tensor | None = None  # (B, N, 1), None: all ones
        self.angles: torch.Tensor | None = None  # (B, N_patches, head_dim / 2), None: the grid's own
        self.rope_scale = rope_scale  # (head_dim / 4,) radians per unit of position; None: no RoPE


def _rope_scale(kind: str, head_dim: int, theta: float) -> torch.Tensor:
    """Radians per unit of position of each frequency of a 2-D RoPE (:func:`.posembed.rope_angles`)."""
    exponents = 4.0 * torch.arange(head_dim // 4, dtype=torch.float64) / head_dim
    return theta**-exponents if kind == "rope_axial" else 2.0 * math.pi / theta**exponents


def _angles_of_table(table: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The rotation angles (N, head_dim / 2) of a rotary table (2, N, head_dim), unwrapped: each
    patch's row and column positions are read from the slowest frequency (which turns by well under
    half a turn across any grid), and every frequency's angle is that position times its scale."""
    q, scale = scale.numel(), scale.to(table.device)
    slow = torch.atan2(table[1].double(), table[0].double())  # (N, hd), wrapped to (-pi, pi]
    rows, cols = slow[:, q - 1] / scale[-1], slow[:, 2 * q - 1] / scale[-1]
    return torch.cat([rows[:, None] * scale, cols[:, None] * scale], dim=-1).float()


def bipartite_merge(
    x: torch.Tensor, metric: torch.Tensor, size: torch.Tensor, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the ``r`` most similar pairs of tokens (bipartite soft matching), size-weighted.

    Args:
        x: the tokens (B, M, D).
        metric: what similarity is measured on (B, M, d) (the keys, averaged over heads).
        size: how many patches each token stands for (B, M, 1).
        r: how many tokens to remove (at most half of them, rounded down, are).

    Returns:
        The merged tokens (B, M - r, D) and their sizes (B, M - r, 1): the tokens of the first
        set that were not merged, then those of the second set, each the size-weighted mean of the
        tokens merged into it.
    """
    r = min(r, x.shape[1] // 2)
    if r <= 0:
        return x, size
    metric = metric / metric.norm(dim=-1, keepdim=True)
    a, b = metric[:, ::2], metric[:, 1::2]
    scores = a @ b.transpose(-1, -2)  # (B, Ma, Mb)
    best, best_b = scores.max(dim=-1)  # each token of A: its closest of B
    order = best.argsort(dim=-1, descending=True)[..., None]  # (B, Ma, 1)
    kept, merged = order[:, r:], order[:, :r]
    into = best_b[..., None].gather(1, merged)  # (B, r, 1): where each merged token goes

    # the tokens times their sizes, and the sizes, as one tensor: one gather and one scatter for both
    t = torch.cat([x.float() * size, size], dim=-1)  # (B, M, D + 1), fp32: sums of sizes stay exact
    src, dst = t[:, ::2], t[:, 1::2]
    c = t.shape[-1]
    stay = src.gather(1, kept.expand(-1, -1, c))
    moved = src.gather(1, merged.expand(-1, -1, c))
    dst = dst.scatter_reduce(1, into.expand(-1, -1, c), moved, reduce="sum")
    out = torch.cat([stay, dst], dim=1)  # (B, M - r, D + 1)
    size = out[..., -1:]
    return (out[..., :-1] / size).to(x.dtype), size


class MergingBlock(nn.Module):
    """A ViT block that merges ``r`` tokens after its attention (see the module doc).

    Args:
        block: the block to wrap (its modules are used as they are).
        r: tokens merged in this block.
        prefix: the tokens before the patches, never merged.
        sizes: the token sizes shared by the model's blocks.
        first: whether this is the model's first block (it starts every forward pass afresh).
    """

    def __init__(self, block: Block, r: int, prefix: int, sizes: _Sizes, first: bool) -> None:
        super().__init__()
        self.block, self.r, self.prefix, self.first = block, r, prefix, first
        self._sizes = sizes

    def forward(self, x: torch.Tensor, return_weights: bool = False, rope: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, D) -> (B, N - r, D) (or fewer merged where few tokens are left).

        Args:
            x: the tokens.
            return_weights: must be False: merged attention has no per-patch weights.
            rope: the model's rotary table of the patch grid (2, N_patches, head_dim), for a model
                with 2-D RoPE; each token turns by its own (merged) angles.

        Returns:
            The block's output, merged.

        Raises:
            ValueError: attention weights were asked for, or a rotary table the model was not
                wrapped for (or one per image, a NaFlex batch).
        """
        if return_weights:
            raise ValueError("token merging gives no attention weights; run the model without --merge")
        shared = self._sizes
        if rope is not None and (shared.rope_scale is None or rope.dim() != 3):
            raise ValueError("token merging: a rotary table the merging blocks were not set up for (or a NaFlex batch)")
        if self.first:
            shared.size, shared.angles = None, None  # every token is one patch at its grid place
        state, angles = shared.size, shared.angles
        if state is not None and state.shape[:2] != x.shape[:2]:
            raise ValueError(f"token merging: {x.shape[1]} tokens where {state.shape[1]} were left")
        size = torch.ones(x.shape[0], x.shape[1], 1, device=x.device) if state is None else state
        if rope is not None and angles is not None:  # merged tokens: each its own rotation, per image
            turned = angles.repeat(1, 1, 2)  # (B, N_patches, hd): the rotate-half layout
            rope = torch.stack([turned.cos(), turned.sin()])[:, :, None]  # (2, B, 1, N_patches, hd)
        blk, p = self.block, self.prefix
        attn_out, keys = self._attention(blk.norm1(x), state, rope)  # no bias while every size is one
        x = x + blk.drop_path(blk.ls1(attn_out))
        patches, size_p = x[:, p:], size[:, p:]
        if rope is None:
            patches, size_p = bipartite_merge(patches, keys[:, p:], size_p, self.r)
        else:  # the angles ride along as extra channels: merged as size-weighted means, in fp32
            if angles is None:
                angles = _angles_of_table(rope, shared.rope_scale).to(x.device).expand(x.shape[0], -1, -1)
            both, size_p = bipartite_merge(torch.cat([patches.float(), angles], -1), keys[:, p:], size_p, self.r)
            patches, shared.angles = both[..., : x.shape[-1]].to(x.dtype), both[..., x.shape[-1] :]
        unchanged = state is None and patches.shape[1] == x.shape[1] - p
        x = torch.cat([x[:, :p], patches], dim=1)
        shared.size = None if unchanged else torch.cat([size[:, :p], size_p], dim=1)
        if unchanged:
            shared.angles = None  # nothing merged yet: the next block takes the grid's table as it is
        return x + blk.drop_path(blk.ls2(blk.mlp(blk.norm2(x))))

    def _attention(
        self, x: torch.Tensor, size: torch.Tensor | None, rope: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's attention with each key's logits raised by log(size) (proportional
        attention; None: every token one patch, no bias), the patches' queries and keys turned by
        ``rope`` where given, and its keys averaged over heads (B, N, hd)."""
        attn = self.block.attn
        B, N, D = x.shape
        qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim)  # (B, N, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, N, hd)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is not None:
            q, k = rotate_patches(q, rope), rotate_patches(k, rope)
        bias = None if size is None else size.log()[:, None, None, :, 0].to(q.dtype)  # (B, 1, 1, N)
        out, _ = attend(
            q, k, v, scale=attn.scale, dropout_p=attn.attn_drop, training=attn.training, impl=attn.impl,
            need_weights=False, bias=bias,
        )  # fmt: skip
        out = out.transpose(1, 2).reshape(B, N, D)  # (B, H, N, hd) -> (B, N, D)
        return attn.proj_drop(attn.proj(out)), k.mean(dim=1)


def apply_token_merging(model: nn.Module, r: int) -> nn.Module:
    """Make a vitkit ViT merge ``r`` tokens in each block (ToMe), in place.

    Args:
        model: a :class:`~vitkit.models.vit.VisionTransformer` (a plain one or one prepared by
            :func:`vitkit.inference.prepare_inference`), not merging already.
        r: tokens merged per block (0: the wrapped blocks compute what the plain ones do).

    Returns:
        ``model``, its blocks wrapped; ``model.token_merging`` is ``r``.

    Raises:
        ValueError: ``r`` negative, a model that is not a vitkit ViT, a model with relative
            position terms, or one that merges already.
    """
    if r < 0:
        raise ValueError(f"token merging: r must be 0 or more, got {r}")
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"token merging works on vitkit's ViTs, not {type(model).__name__}")
    cfg = model.cfg
    if cfg.pos_embed == "relative":
        raise ValueError(f"token merging: the model's positions ({cfg.pos_embed}) are tied to the patch grid")
    if any(isinstance(b, MergingBlock) for b in model.blocks):
        raise ValueError("token merging is applied to this model already")
    rope = cfg.pos_embed in ROPE_POS_EMBEDS
    sizes = _Sizes(_rope_scale(cfg.pos_embed, cfg.width // cfg.num_heads, cfg.rope_theta) if rope else None)
    prefix = int(cfg.num_prefix_tokens)
    for i, blk in enumerate(model.blocks):
        model.blocks[i] = MergingBlock(blk, r, prefix, sizes, first=i == 0)
    model.token_merging = r
    return model


__all__ = ["MergingBlock", "apply_token_merging", "bipartite_merge"]
