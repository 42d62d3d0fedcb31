"""The Vision Transformer of Dosovitskiy et al. (ICLR 2021), in the paper's order.

Section 3.1, equations 1-4:
    z0  = [x_class; x_p^1 E; ...; x_p^N E] + E_pos            (patch embedding, tokens, positions)
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                           (block, attention half)
    z_l  = MLP(LN(z'_l)) + z'_l                                 (block, MLP half)
    y    = LN(z_L^0)                                            (encoder norm, class token)
followed by the optional tanh "pre-logits" layer and a zero-initialised linear head. The pooled
token is the class token (eq. 4), the mean of the patch tokens ("gap") or big_vision's attention
pooling ("map", :class:`.heads.MAPHead`).

DeiT's distillation token (Touvron et al., ICML 2021; ``distill_token``) is a second prefix token
after the class token, with its own position and its own linear head ``head_dist``, trained
against a teacher's predictions; at evaluation the model returns the mean of the two heads' logits.

Later ViTs add pieces, each off by default (:class:`~.config.ViTConfig`), so that their released
weights load and compute what their authors' code computes:
- register tokens (Darcet et al., ICLR 2024; DINOv2 with registers): ``num_registers`` learned
  tokens after the class (and distillation) token, without a position embedding;
- LayerScale (Touvron et al., 2021; DINOv2): ``x = x + gamma_1 * MSA(LN(x))``, and so for the MLP;
- a LayerNorm on z0 before the first block (CLIP, ``pre_norm``), the final norm moved after
  pooling (``fc_norm``), a LayerNorm over each head's queries and keys (``qk_norm``);
- the SwiGLU MLP of DINOv2's giant model (``mlp_type="swiglu"``) and OpenAI CLIP's QuickGELU;
- 2-D rotary position embeddings instead of E_pos (DINOv3, Simeoni et al. 2025:
  ``pos_embed="rope_dinov3"``; ``"rope_axial"``): every block rotates the patches' queries and keys
  by angles of their place in the grid, the class token and registers unrotated.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import ATTENTION_IMPLS, attend
from .config import ATTENTION_POS_EMBEDS, ROPE_POS_EMBEDS, ViTConfig, check_divisible
from .heads import MAPHead, ReplaceableHead
from .naflex import NaflexBatch, forward_naflex
from .posembed import (
    POS_RESIZE_ARGS,
    add_tokens_and_positions,
    learned_2d_pos_table,
    relative_num_offsets,
    resample_1d,
    resample_pos_embed,
    resample_relative_embed,
    rope_table,
    rotate_patches,
    sincos_2d_pos_embed,
)
from .resnet import HybridStem

# ----------------------------------------------------------------------------------------------
# Patch embedding (eq. 1): a stride-P convolution with a P x P kernel == flatten + linear E.


class PatchEmbed(nn.Module):
    """Images -> the patch grid x_p E, (B, D, gh, gw); a hybrid's patches come from its ResNet stem's map."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_size = cfg.patch_size
        hybrid = cfg.resnet_units is not None  # () too: the ResNet root alone (R+ViT-Ti/16)
        self.backbone = HybridStem(cfg.resnet_units, cfg.resnet_width, cfg.in_chans) if hybrid else None
        in_chans = self.backbone.out_chans if self.backbone is not None else cfg.in_chans
        self.proj = nn.Conv2d(
            in_chans, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size, bias=cfg.patch_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backbone is not None:
            x = self.backbone(x)  # (B, C', H/s, W/s), s = cfg.stem_stride
        x = self.proj(x)  # (B, D, gh, gw)
        return x


def sincos_pos_table(grid: tuple[int, int], width: int, prefix_rows: int) -> torch.Tensor:
    """The fixed 2-D sin-cos E_pos of a grid as the model adds it, (1, prefix_rows + gh*gw, D):
    zero rows for the prefix tokens, so that they get no position."""
    pe = sincos_2d_pos_embed(grid, width)  # (gh*gw, D)
    if prefix_rows:
        pe = torch.cat([torch.zeros(prefix_rows, width), pe], dim=0)
    return pe[None]


# A patch whose pixels span at most this much (normalised units: [-1, 1] spans 2, so ~2.5 grey
# levels of 255) counts as flat for patch dropout's flat weight (VisionTransformer.set_patch_drop).
FLAT_PATCH_RANGE = 0.02


def kept_patches(patches: int, rate: float) -> int:
    """How many of ``patches`` tokens an image keeps at patch drop ``rate`` (at least one)."""
    return max(1, round(patches * (1.0 - rate)))


# ----------------------------------------------------------------------------------------------
# Transformer block (eqs. 2-3).


class Attention(nn.Module):
    """Multi-head self-attention (MSA) with one fused qkv projection.

    The kernel is :func:`.attention.attend`; ``impl`` ("auto", "sdpa", "math" or "recompute",
    set by :meth:`VisionTransformer.set_attention_impl`) chooses which of its paths runs, and
    :mod:`vitkit.models.attention` says which runs where by default.

    ``relative=(num_patches, num_prefix_tokens)`` adds the paper's 1-D relative position term
    (appendix D.4, ``pos_embed="relative"``): a learned table ``rel_embed`` (num_offsets, head_dim),
    shared by the heads, one entry per query-key offset of the patches in raster order and one for
    every pair with a prefix token (:mod:`.posembed`). The content query attends to the table as
    keys; those logits, ``bias[b, h, i, j] = (q[b, h, i] * scale) . rel_embed[index[i, j]]``, are
    added to the content logits before the softmax. The query is scaled as for the content logits,
    so both terms are on one scale and folding the scale into the query weights
    (:func:`vitkit.inference.fold_attention_scale`) leaves the bias as it was.

    ``qk_norm`` puts a LayerNorm (over head_dim, shared by the heads) on each head's queries and
    keys before their product: ``q_norm`` and ``k_norm``.

    ``rope``, given to :meth:`forward` (a :func:`.posembed.rope_table` of the patch grid), rotates
    the patches' queries and keys (after ``qk_norm``) before every path of :func:`.attention.attend`
    takes them; the tokens before the patches keep theirs (2-D RoPE, ``pos_embed="rope_*"``).
    """

    impl: str = "auto"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        relative: tuple[int, int] | None = None,
        qk_norm: bool = False,
        ln_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=ln_eps) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.head_dim, eps=ln_eps) if qk_norm else None
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rel_embed: nn.Parameter | None = None
        if relative is not None:
            self.rel_patches, self.rel_prefix = relative
            self.rel_embed = nn.Parameter(torch.empty(relative_num_offsets(*relative), self.head_dim))
            if not self.rel_embed.is_meta:  # a model on the meta device draws nothing
                nn.init.normal_(self.rel_embed, std=0.02)

    def set_num_patches(self, num_patches: int) -> None:
        """Resize the relative table (in place) for a grid of ``num_patches`` patches
        (:func:`.posembed.resample_relative_embed`); the same count keeps it."""
        if self.rel_embed is None or num_patches == self.rel_patches:
            return
        table = resample_relative_embed(self.rel_embed.detach(), num_patches, self.rel_prefix)
        self.rel_embed = nn.Parameter(table.clone())
        self.rel_patches = num_patches

    def relative_bias(self, q: torch.Tensor) -> torch.Tensor:
        """The relative term (B, H, T, T) for queries (B, H, T, hd): each (query, key) pair's
        ``(q * scale) . rel_embed[entry]``, the entry :func:`.posembed.relative_offset_index`
        gives. A sequence of another length than the table's (``dynamic_img_size``) gets a resized
        table, differentiably.

        The patch block is computed without a gather: the patch queries meet the patch offsets in
        reverse order, (B, H, N, 2N-1), whose row i holds pair (i, j) at column N-1-i+j; read flat,
        that is position N-1 + i(2N-2) + j, so the block is a slice of the flat logits viewed as
        (N, 2N-2) rows, their first N columns. Its backward is a copy, not a scatter."""
        T = q.shape[2]
        table, prefix = self.rel_embed, self.rel_prefix
        n = T - prefix
        if n != self.rel_patches:
            table = resample_relative_embed(table, n, prefix)
        q = q if self.scale == 1.0 else q * self.scale
        extra = 1 if prefix else 0
        flipped = table[extra:].flip(0)  # patch offsets, largest first
        rev = q[:, :, prefix:] @ flipped.transpose(0, 1)  # (B, H, N, 2N-1)
        flat = rev.flatten(-2)[..., n - 1 : n - 1 + n * (2 * n - 2)]
        block = flat.unflatten(-1, (n, 2 * n - 2))[..., :n] if n > 1 else rev  # (B, H, N, N)
        if not prefix:
            return block
        shared = q @ table[0]  # (B, H, T): every pair with a prefix token uses entry 0
        rows = torch.cat([shared[..., prefix:, None].expand(-1, -1, -1, prefix), block], dim=-1)
        return torch.cat([shared[..., :prefix, None].expand(-1, -1, -1, T), rows], dim=-2)

    def forward(
        self,
        x: torch.Tensor,
        return_weights: bool = False,
        rope: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, N, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate_patches(q, rope), rotate_patches(k, rope)
        bias = self.relative_bias(q) if self.rel_embed is not None else None
        if key_mask is not None:  # (B, N) True for real tokens -> (B, 1, 1, N): -inf on padded keys
            pad = torch.zeros(B, 1, 1, N, dtype=q.dtype, device=q.device)
            pad = pad.masked_fill(~key_mask[:, None, None, :], float("-inf"))
            bias = pad if bias is None else bias + pad
        out, weights = attend(
            q, k, v, scale=self.scale, dropout_p=self.attn_drop, training=self.training, impl=self.impl,
            need_weights=return_weights, bias=bias,
        )  # fmt: skip
        out = out.transpose(1, 2).reshape(B, N, D)  # (B, H, N, hd) -> (B, N, D)
        out = self.proj_drop(self.proj(out))
        return (out, weights) if return_weights else out


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)``: the sigmoid approximation of GELU that OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def activation(act: str) -> nn.Module:
    """The MLP's activation module for a config's ``act``: "gelu_tanh", "gelu" or "quick_gelu"."""
    if act == "quick_gelu":
        return QuickGELU()
    return nn.GELU(approximate="tanh" if act == "gelu_tanh" else "none")


class Mlp(nn.Module):
    """Linear(D, D_mlp) -> GELU -> Linear(D_mlp, D), dropout after each dense layer."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu_tanh", drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = activation(act)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class SwiGLU(nn.Module):
    """The gated MLP of DINOv2's giant model: ``fc2(SiLU(x W_gate) * (x W_value))``.

    ``fc1`` packs the two input projections, D -> 2 D_mlp, the gate's half first (the layout of
    DINOv2's ``w12`` and timm's ``SwiGLUPacked``); ``fc2`` is D_mlp -> D (DINOv2's ``w3``).
    Dropout after the product and after ``fc2``."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)  # (..., 2 D_mlp) -> 2 x (..., D_mlp)
        return self.drop2(self.fc2(self.drop1(F.silu(gate) * value)))


class LayerScale(nn.Module):
    """A learned per-channel scale of a residual branch, ``x * gamma`` (CaiT; DINOv2's ``ls1``
    and ``ls2``); ``gamma`` (D,) starts at ``init``."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample (not in the paper; opt-in)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class Block(nn.Module):
    """Pre-norm encoder layer: ``x = x + MSA(LN(x)); x = x + MLP(LN(x))``; with LayerScale
    (``cfg.layer_scale_init``) each branch is scaled by its ``gamma`` before it is added."""

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, eps=cfg.ln_eps)
        rel = (cfg.grid_size[0] * cfg.grid_size[1], cfg.num_prefix_tokens) if cfg.pos_embed == "relative" else None
        self.attn = Attention(
            cfg.width, cfg.num_heads, cfg.attn_drop_rate, cfg.drop_rate, rel, qk_norm=cfg.qk_norm, ln_eps=cfg.ln_eps
        )
        self.norm2 = nn.LayerNorm(cfg.width, eps=cfg.ln_eps)
        if cfg.mlp_type == "swiglu":
            self.mlp: nn.Module = SwiGLU(cfg.width, cfg.mlp_dim, cfg.drop_rate)
        else:
            self.mlp = Mlp(cfg.width, cfg.mlp_dim, cfg.act, cfg.drop_rate)
        scaled = cfg.layer_scale_init is not None
        self.ls1 = LayerScale(cfg.width, cfg.layer_scale_init) if scaled else nn.Identity()
        self.ls2 = LayerScale(cfg.width, cfg.layer_scale_init) if scaled else nn.Identity()
        self.drop_path = DropPath(drop_path)

    def forward(
        self,
        x: torch.Tensor,
        return_weights: bool = False,
        rope: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, N, D) -> (B, N, D); with ``return_weights`` also the attention's softmax weights
        (B, H, N, N), which makes the attention take its explicit path. ``rope``: the rotary
        table of the patch grid, for a model with 2-D RoPE (:meth:`Attention.forward`).
        ``key_mask`` (B, N) bool: False on padding tokens, which no token attends to."""
        attn = self.attn(self.norm1(x), return_weights=return_weights, rope=rope, key_mask=key_mask)
        attn_out, weights = attn if return_weights else (attn, None)
        x = x + self.drop_path(self.ls1(attn_out))
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))
        return (x, weights) if return_weights else x


# ----------------------------------------------------------------------------------------------
# The whole model.

# Position embeddings whose tables are sized for one grid: another input size needs a resize.
_SIZED_POS_EMBEDS = ("learned", "learned2d", "relative")


class VisionTransformer(ReplaceableHead, nn.Module):
    """ViT (and R+ViT hybrid when ``cfg.resnet_units`` is set). Inputs are NCHW floats, in the
    value range the weights were trained with (vitkit and the official models: [-1, 1]).

    Args:
        cfg: the model's configuration; the weights start initialised as the official code does
            (:meth:`reset_parameters`).
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.dynamic_img_size = cfg.dynamic_img_size
        D = cfg.width

        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.has_class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distill_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.num_registers, D)) if cfg.num_registers else None
        (gh, gw), prefix_rows = cfg.grid_size, cfg.pos_prefix_rows
        self.pos_embed_row = self.pos_embed_col = self.pos_embed_prefix = None
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.empty(1, prefix_rows + gh * gw, D))
        elif cfg.pos_embed != "sincos2d":  # learned2d: no 1-D table (below); relative, RoPE: no E_pos
            self.pos_embed = None
        self._derive_buffers(cfg.grid_size)  # the fixed sin-cos table, the RoPE's cosines and sines
        if cfg.pos_embed == "learned2d":  # E_pos of patch (i, j): cat(row[i], col[j]) (pos_embed_table)
            self.pos_embed_row = nn.Parameter(torch.empty(1, gh, D // 2))
            self.pos_embed_col = nn.Parameter(torch.empty(1, gw, D // 2))
            self.pos_embed_prefix = nn.Parameter(torch.empty(1, prefix_rows, D)) if prefix_rows else None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.norm_pre = nn.LayerNorm(D, eps=cfg.ln_eps) if cfg.pre_norm else None
        self.patch_drop_rate = 0.0  # training only; see set_patch_drop
        self.patch_drop_flat_weight = 1.0  # how likely a flat patch is kept, against one with content
        self.patch_drop_share = (0, 1)  # (rank, processes): this batch's part of the global one
        self.grad_checkpointing = False  # see set_grad_checkpointing
        self.distilled_training = False  # see set_distilled_training

        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList([Block(cfg, dpr[i]) for i in range(cfg.depth)])
        # With fc_norm the final LayerNorm acts on the pooled token; the tokens stay as the last block left them.
        self.norm = nn.Identity() if cfg.fc_norm else nn.LayerNorm(D, eps=cfg.ln_eps)

        self.attn_pool = None
        if cfg.classifier == "map":
            self.attn_pool = MAPHead(D, cfg.num_heads, Mlp(D, cfg.mlp_dim, cfg.act), cfg.ln_eps)
        self.fc_norm = nn.LayerNorm(D, eps=cfg.ln_eps) if cfg.fc_norm else None
        self.pre_logits = nn.Linear(D, cfg.representation_size) if cfg.representation_size else None
        self.num_features = cfg.representation_size or D
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else None
        self.head_dist = nn.Linear(D, cfg.num_classes) if cfg.num_classes and cfg.distill_token else None
        if not self.blocks[0].attn.qkv.weight.is_meta:  # a model on the meta device draws nothing
            self.reset_parameters()

    def _derive_buffers(self, grid: tuple[int, int]) -> None:
        """(Re)compute the tensors that follow from the config alone and are never saved: the fixed
        sin-cos table (``pos_embed="sincos2d"``) and the cosines and sines of 2-D RoPE (``rope``,
        read by :meth:`rope_for`), for ``grid``. On the meta device they are computed on the CPU,
        so that a model built there and given loaded tensors (:func:`.registry.build_model`'s
        ``state``) is whole."""
        cfg = self.cfg
        with torch.device("cpu") if torch.get_default_device().type == "meta" else contextlib.nullcontext():
            if cfg.pos_embed == "sincos2d":
                table = sincos_pos_table(grid, cfg.width, cfg.pos_prefix_rows)
                self.register_buffer("pos_embed", table, persistent=False)
            if cfg.pos_embed in ROPE_POS_EMBEDS:  # cosines and sines of the grid's rotations (rope_for)
                self.register_buffer("rope", self._rope_table(grid), persistent=False)

    # -- initialisation (as the official code: xavier-uniform dense layers, lecun-normal patch
    #    kernel, N(0, 0.02) position embeddings, zero class token and head; DeiT's distillation
    #    token truncated N(0, 0.02) as DeiT's, so that it starts apart from the class token;
    #    registers N(0, 1e-6) as DINOv2's, so that they start apart from one another) -----------
    def reset_parameters(self) -> None:
        """Initialise every weight afresh as the official code does: xavier-uniform dense layers,
        a lecun-normal patch kernel, N(0, 0.02) position embeddings, zero class token and head;
        a distillation token and registers as DeiT and DINOv2 start theirs."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.normal_(m.bias, std=1e-6)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for blk in self.blocks:  # q, k and v are separate D x D projections in the paper
            w = blk.attn.qkv.weight
            for i in range(3):
                nn.init.xavier_uniform_(w[i * w.shape[1] : (i + 1) * w.shape[1]])
        proj = self.patch_embed.proj
        fan_in = proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1]
        nn.init.trunc_normal_(proj.weight, std=math.sqrt(1 / fan_in) / 0.87962566103423978)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
        for table in (self.pos_embed, self.pos_embed_row, self.pos_embed_col, self.pos_embed_prefix):
            if isinstance(table, nn.Parameter):
                nn.init.normal_(table, std=0.02)
        for blk in self.blocks:
            if blk.attn.rel_embed is not None:
                nn.init.normal_(blk.attn.rel_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        for blk in self.blocks:
            for scale in (blk.ls1, blk.ls2):
                if isinstance(scale, LayerScale):
                    nn.init.constant_(scale.gamma, self.cfg.layer_scale_init)
        if self.pre_logits is not None:
            nn.init.zeros_(self.pre_logits.bias)
        for head in (self.head, self.head_dist):
            if head is not None:
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)
        if self.patch_embed.backbone is not None:
            self.patch_embed.backbone.reset_parameters()
        if self.attn_pool is not None:
            self.attn_pool.reset_parameters()

    # -- tokens and positions (eq. 1) ---------------------------------------------------------
    def _check_input(self, x: torch.Tensor) -> None:
        if x.ndim != 4:
            raise ValueError(f"expected an NCHW image batch (4 dims), got shape {tuple(x.shape)}")
        if x.shape[1] != self.cfg.in_chans:
            raise ValueError(
                f"expected {self.cfg.in_chans} input channels, got {x.shape[1]} (input shape {tuple(x.shape)}); "
                f"convert the images or create the model with in_chans={x.shape[1]}"
            )
        size = (x.shape[2], x.shape[3])
        check_divisible(size, self.cfg.total_stride, what="input size")
        if size != self.cfg.img_size and not self.dynamic_img_size and self.cfg.pos_embed in _SIZED_POS_EMBEDS:
            raise ValueError(
                f"input size {size[0]}x{size[1]} differs from the model's img_size "
                f"{self.cfg.img_size[0]}x{self.cfg.img_size[1]}; load or create it with img_size={size[0]} "
                "or set dynamic_img_size=True to resize position embeddings at run time"
            )

    def pos_embed_table(self, grid: tuple[int, int] | None = None) -> torch.Tensor | None:
        """E_pos as it is added to the tokens of a ``grid`` (default: the model's), (1, prefix rows
        + gh*gw, D), resized (differentiably) for another grid; None where the model adds none
        ("none", and "relative", whose positions live in the attention).

        Args:
            grid: the token grid (rows, columns); None: the model's own.

        Returns:
            The table (1, prefix rows + gh*gw, D), or None.
        """
        cfg = self.cfg
        grid = cfg.grid_size if grid is None else (int(grid[0]), int(grid[1]))
        if cfg.pos_embed == "learned2d":
            row, col = resample_1d(self.pos_embed_row, grid[0]), resample_1d(self.pos_embed_col, grid[1])
            return learned_2d_pos_table(row, col, self.pos_embed_prefix)
        if self.pos_embed is None:
            return None
        if grid == cfg.grid_size:
            return self.pos_embed
        if cfg.pos_embed == "sincos2d":
            return sincos_pos_table(grid, cfg.width, cfg.pos_prefix_rows).to(self.pos_embed)
        mode, corners, antialias = POS_RESIZE_ARGS[cfg.pos_resize]
        return resample_pos_embed(
            self.pos_embed, grid, cfg.grid_size, cfg.pos_prefix_rows, mode, align_corners=corners, antialias=antialias
        )

    def _rope_table(self, grid: tuple[int, int]) -> torch.Tensor:
        cfg = self.cfg
        return rope_table(grid, cfg.width // cfg.num_heads, cfg.rope_theta, cfg.pos_embed)

    def rope_for(self, x: torch.Tensor) -> torch.Tensor | None:
        """The rotary table (2, gh*gw, head_dim) of the token grid of images ``x`` (B, C, H, W): the
        cached one at the model's grid, computed afresh at another; None for a model without 2-D RoPE.

        Args:
            x: the images (only their height and width are read).

        Returns:
            The cosines and sines (2, gh*gw, head_dim), or None.
        """
        if self.cfg.pos_embed not in ROPE_POS_EMBEDS:
            return None
        grid = self.cfg.grid_for((x.shape[-2], x.shape[-1]))
        if grid == self.cfg.grid_size:
            return self.rope
        return self._rope_table(grid).to(self.rope)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> token sequence z0 (B, P+N, D), dropout applied, then ``norm_pre``
        where the model has one (CLIP); in training with a patch drop rate (:meth:`set_patch_drop`)
        only the kept patch tokens: a random subset of the grid, in raster order.

        Args:
            x: the images (B, C, H, W).

        Returns:
            z0 (B, P+N, D): the P prefix tokens, then the N patch tokens.

        Raises:
            ValueError: ``x`` is not a batch of 4 dimensions with the model's channels, its size
                is not a whole number of patches, or it differs from ``img_size`` where the
                position table is sized for one grid and ``dynamic_img_size`` is off.
        """
        self._check_input(x)
        if self.training and self.patch_drop_rate > 0 and self.patch_embed.backbone is None:
            return self._pre_norm(self.pos_drop(self._embed_kept_patches(x)))
        x = self.patch_embed(x)  # (B, D, gh, gw)
        grid = (x.shape[2], x.shape[3])
        x = x.flatten(2).transpose(1, 2)  # (B, gh*gw, D), raster order
        pos = self.pos_embed_table(grid)
        x = add_tokens_and_positions(x, self.prefix_tokens(), pos, self.cfg.cls_pos_embed, self.reg_token)
        if self.training and self.patch_drop_rate > 0:
            x = self._drop_patches(x)
        return self._pre_norm(self.pos_drop(x))

    def _pre_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.norm_pre is None else self.norm_pre(x)

    def _kept_index(
        self, batch: int, patches: int, device: torch.device, flat: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Which patches each image keeps under patch dropout, (B, keep), ascending (raster order).

        ``flat`` (B, patches), given with a flat weight below 1 (:meth:`set_patch_drop`), marks
        the patches without content; each is that much less likely to be kept than one with content:
        a weighted draw without replacement (Efraimidis and Spirakis: the ``keep`` largest of
        ``u ** (1 / w)``, here as ``log(u) / w``)."""
        keep = kept_patches(patches, self.patch_drop_rate)
        rank, world = self.patch_drop_share
        u = torch.rand(batch * world, patches, device=device)[rank * batch : (rank + 1) * batch]
        if flat is None:
            return u.argsort(dim=1)[:, :keep].sort(dim=1).values
        w = torch.where(flat, self.patch_drop_flat_weight, 1.0)
        return (u.log() / w).topk(keep, dim=1).indices.sort(dim=1).values

    def _embed_kept_patches(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`embed` under patch dropout for a plain (non-hybrid) patch embedding: the same
        tokens as embedding every patch and then keeping a subset (the same random subset too),
        but only the kept patches are embedded. The patch embedding is a linear map of each patch
        (a convolution of stride = kernel), so choosing first is exact, and the embedding and the
        position add then work on a quarter of the tokens at patch drop 0.75."""
        B, C, H, W = x.shape
        ph, pw = self.patch_embed.patch_size
        gh, gw = H // ph, W // pw
        patches = gh * gw
        # (B, C, gh, ph, gw, pw) -> (B, gh*gw, C*ph*pw): each row one patch, in the conv weight's order
        pix = x.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(B, patches, C * ph * pw)
        flat = None
        if self.patch_drop_flat_weight != 1.0:
            flat = (pix.amax(dim=-1) - pix.amin(dim=-1)) <= FLAT_PATCH_RANGE
        idx = self._kept_index(B, patches, x.device, flat)
        pix = pix.gather(1, idx[:, :, None].expand(-1, -1, pix.shape[-1]))
        proj = self.patch_embed.proj
        tokens = F.linear(pix, proj.weight.reshape(proj.out_channels, -1), proj.bias)  # (B, keep, D)
        pos = self.pos_embed_table((gh, gw))
        if pos is not None:  # the kept patches' rows, after the prefix tokens' (none with cls_pos_embed False)
            rows = pos.shape[1] - patches
            pos = torch.cat([pos[:, :rows].expand(B, -1, -1), pos[0, rows:][idx]], dim=1)
        return add_tokens_and_positions(tokens, self.prefix_tokens(), pos, self.cfg.cls_pos_embed, self.reg_token)

    def prefix_tokens(self) -> torch.Tensor | None:
        """The learned tokens put before the patches that may have a position, (1, P, D): the
        class token, then the distillation token; None for a model with neither. The register tokens
        (``reg_token``, (1, R, D)) follow them, without a position (:func:`add_tokens_and_positions`).

        Returns:
            The tokens (1, P, D), or None when the model has neither.
        """
        tokens = [t for t in (self.cls_token, self.dist_token) if t is not None]
        if not tokens:
            return None
        return tokens[0] if len(tokens) == 1 else torch.cat(tokens, dim=1)  # (1, P, D)

    def _drop_patches(self, x: torch.Tensor) -> torch.Tensor:
        """Keep a random subset of the patch tokens of each image (prefix tokens always kept): a
        hybrid's, whose patches come from its ResNet's map (a plain patch embedding chooses before
        embedding, :meth:`_embed_kept_patches`).

        Positions were added already, so the encoder still knows where each kept patch is; the
        cost of the encoder falls with the number of tokens (PatchDropout, Liu et al. 2023;
        FLIP, Li et al. 2023).
        """
        p = self.num_prefix_tokens
        prefix, patches = x[:, :p], x[:, p:]
        B, N, D = patches.shape
        idx = self._kept_index(B, N, x.device)
        patches = patches.gather(1, idx[:, :, None].expand(-1, -1, D))
        return torch.cat([prefix, patches], dim=1) if p else patches

    # -- encoder ------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> the normed token sequence LN(z_L), (B, P+N, D). With gradient checkpointing on
        (:meth:`set_grad_checkpointing`) and gradients wanted, each block keeps only its input and
        runs again in the backward pass.

        Args:
            x: the images (B, C, H, W).

        Returns:
            LN(z_L) (B, P+N, D); with ``fc_norm``, the tokens as the last block left them.

        Raises:
            ValueError: an input :meth:`embed` refuses.
        """
        rope = self.rope_for(x)
        x = self.embed(x)
        recompute = self.grad_checkpointing and torch.is_grad_enabled()
        for blk in self.blocks:
            # preserve_rng_state (the default) replays the forward's dropout and drop-path masks
            x = checkpoint(blk, x, rope=rope, use_reentrant=False) if recompute else blk(x, rope=rope)
        return self.norm(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: list[int] | None = None,
        return_attention: bool = False,
        output_fmt: str = "NLC",
        norm: bool = False,
    ) -> dict[str, Any]:
        """Run the encoder and keep what was asked for.

        Returns a dict with ``"tokens"``: the residual stream after each block in ``indices``
        (all blocks by default; negative indices count from the last), ``"attention"``: the
        (B, heads, N, N) softmax weights of those blocks when ``return_attention`` (computed by
        the explicit path), ``"embedded"``: z0 (after ``norm_pre``, where there is one), and
        ``"normed"``: LN(z_L) (with ``fc_norm``, the tokens as the last block left them).

        ``output_fmt="NCHW"`` gives dense feature maps instead, as a detection or segmentation
        neck takes them: each of ``"tokens"`` is the patch tokens alone laid out on their grid,
        (B, D, H / s, W / s) for an input of H x W pixels and ``s = cfg.total_stride`` (a
        hybrid's CNN stride included), and ``"prefix_tokens"`` holds the tokens before the
        patches of each, (B, P, D): the class token, the distillation token and the registers, those
        the model has (none for "gap" and "map" without registers). ``norm`` applies the encoder's final LayerNorm to
        each kept block's tokens (timm's ``norm=True``).

        Args:
            x: the images (B, C, H, W).
            indices: the blocks whose output to keep, from 0; negative ones count from the last;
                None: every block.
            return_attention: also keep those blocks' attention weights.
            output_fmt: "NLC" (token sequences) or "NCHW" (the patch tokens as feature maps).
            norm: apply the final LayerNorm to each kept block's tokens.

        Returns:
            ``{"tokens": [...], "attention": [...] or None, "embedded": z0, "normed": LN(z_L)}``,
            with ``"prefix_tokens": [...]`` too for "NCHW"; the lists in block order.

        Raises:
            ValueError: an unknown ``output_fmt``, "NCHW" while patch dropout is on in training,
                or an input :meth:`embed` refuses.
        """
        if output_fmt not in ("NLC", "NCHW"):
            raise ValueError(f"output_fmt must be 'NLC' or 'NCHW', got {output_fmt!r}")
        if output_fmt == "NCHW" and self.training and self.patch_drop_rate > 0:
            raise ValueError("output_fmt='NCHW' needs every patch token: turn patch dropout off (set_patch_drop(0))")
        depth = len(self.blocks)
        wanted = set(range(depth) if indices is None else (i % depth for i in indices))
        out: dict[str, Any] = {"tokens": [], "attention": [] if return_attention else None}
        gh, gw = self.cfg.grid_for((x.shape[-2], x.shape[-1]))
        rope = self.rope_for(x)
        out["embedded"] = x = self.embed(x)
        for i, blk in enumerate(self.blocks):
            if return_attention and i in wanted:
                x, w = blk(x, return_weights=True, rope=rope)
                out["attention"].append(w)
            else:
                x = blk(x, rope=rope)
            if i in wanted:
                out["tokens"].append(self.norm(x) if norm else x)
        out["normed"] = self.norm(x)
        if output_fmt == "NCHW":
            p = self.num_prefix_tokens
            out["prefix_tokens"] = [t[:, :p] for t in out["tokens"]]
            # (B, p + gh*gw, D) -> patches in raster order (B, gh, gw, D) -> (B, D, gh, gw)
            out["tokens"] = [t[:, p:].reshape(t.shape[0], gh, gw, -1).permute(0, 3, 1, 2) for t in out["tokens"]]
        return out

    # -- head (eq. 4) ------------------------------------------------------------------------
    def pool(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens (B, P+N, D) -> one vector per image (B, D): the class token, the MAP head's
        output (attending over every token, registers included, as timm's ``attn_pool``) or the
        mean of the patch tokens; then ``fc_norm`` where the model has one.

        Args:
            tokens: the encoder's output (B, P+N, D).
            mask: (B, P+N) bool, False on padding tokens (a NaFlex batch), which neither the mean
                nor the MAP head's probe takes in; None: every token is real.

        Returns:
            The pooled vectors (B, D).
        """
        p = self.num_prefix_tokens
        if self.cfg.classifier == "token":
            x = tokens[:, 0]  # (B, D)
        elif self.attn_pool is not None:
            x = self.attn_pool(tokens, key_mask=mask)  # (B, D)
        elif mask is None:
            x = tokens[:, p:].mean(dim=1)  # (B, D)
        else:  # the mean over each image's real patch tokens
            w = mask[:, p:, None].to(tokens.dtype)  # (B, N, 1)
            x = (tokens[:, p:] * w).sum(1) / w.sum(1).clamp_min(1)
        return x if self.fc_norm is None else self.fc_norm(x)

    def forward_head(
        self, tokens: torch.Tensor, pre_logits: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normed tokens -> logits, or the pre-logits representation when ``pre_logits``.

        With a distillation token: the mean of the class head on the class token and ``head_dist``
        on the distillation token (DeiT's prediction), the mean of the two tokens as pre-logits,
        and in distilled training (:meth:`set_distilled_training`, training mode) the pair
        (class logits, distillation logits) the two losses need.

        Args:
            tokens: the normed tokens (B, P+N, D) of :meth:`forward_features`.
            pre_logits: return the representation before the classifier instead of the logits.

        Returns:
            The logits (B, num_classes); the representation (B, F) (F: ``representation_size``
            or the width) with ``pre_logits`` or for a model without a head; or the pair of
            logits in distilled training.
        """
        if self.dist_token is not None:
            return self._distilled_head(tokens, pre_logits)
        x = self.pool(tokens)
        if self.pre_logits is not None:
            x = torch.tanh(self.pre_logits(x))
        if pre_logits or self.head is None:
            return x
        return self.head(x)

    def _distilled_head(
        self, tokens: torch.Tensor, pre_logits: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        cls, dist = tokens[:, 0], tokens[:, 1]  # (B, D) each
        if pre_logits or self.head is None:
            return (cls + dist) / 2
        cls, dist = self.head(cls), self.head_dist(dist)  # (B, K) each
        if self.distilled_training and self.training:
            return cls, dist
        return (cls + dist) / 2

    def forward(self, x: torch.Tensor | NaflexBatch) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Images -> logits: :meth:`forward_features`, then :meth:`forward_head`.

        Args:
            x: the images (B, C, H, W), in the value range of the model's preprocessing; or a
                :class:`~vitkit.models.naflex.NaflexBatch` of images at their own aspect ratio
                (:func:`~vitkit.models.naflex.forward_naflex`).

        Returns:
            The logits (B, num_classes), the pooled features (B, F) for a model without a head,
            or in distilled training the pair (class logits, distillation logits).

        Raises:
            ValueError: an input :meth:`embed` refuses.
            UsageError: a NaFlex batch for a model whose positions cannot follow each image's grid.
        """
        if isinstance(x, NaflexBatch):
            return forward_naflex(self, x)
        return self.forward_head(self.forward_features(x))

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each encoder block in the backward pass instead of keeping its activations
        (``torch.utils.checkpoint``): training memory falls to about one block's activations
        plus each block's input, for about one more forward pass of compute. The random masks of
        dropout and drop-path are replayed, so the loss and the gradients are those of the plain path.

        Args:
            enable: turn it on (True) or off.
        """
        self.grad_checkpointing = bool(enable)

    def set_distilled_training(self, enable: bool = True) -> None:
        """With a distillation token: in training mode, return (class logits, distillation logits)
        instead of their mean, for a loss against labels and one against a teacher (DeiT).

        Args:
            enable: turn it on (True) or off.

        Raises:
            ValueError: turning it on for a model without a distillation token.
        """
        if enable and self.dist_token is None:
            raise ValueError("distilled training needs a distillation token: create the model with distill_token=True")
        self.distilled_training = bool(enable)

    def set_attention_impl(self, impl: str) -> None:
        """Choose the attention path of every block: "auto" (default), "sdpa", "math" or
        "recompute" (:class:`Attention` says which runs where).

        Args:
            impl: the path's name.

        Raises:
            ValueError: an unknown name.
        """
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention impl must be one of {', '.join(ATTENTION_IMPLS)}, got {impl!r}")
        for blk in self.blocks:
            blk.attn.impl = impl
        if self.attn_pool is not None:
            self.attn_pool.impl = impl

    def set_patch_drop(self, rate: float, flat_weight: float = 1.0, share: tuple[int, int] = (0, 1)) -> None:
        """Drop this fraction of the patch tokens of every training image (0 disables). Not with
        relative positions, which are the kept tokens' places in the sequence, not in the grid.

        ``flat_weight`` < 1 keeps flat patches (every pixel within :data:`FLAT_PATCH_RANGE` of
        the others: an empty background) that much less often than patches with content, so the
        kept tokens carry more of the image where it has a plain background (Fashion-MNIST: ~31%
        of the 4x4 patches are empty); on photographs almost no patch is flat and the draw is
        the uniform one. A plain patch embedding only: a hybrid's tokens are drawn uniformly.

        ``share`` (rank, processes): under data parallelism, this process's batch is share
        ``rank`` of ``processes`` equal parts of the global batch; each process then draws the
        random numbers of the whole global batch (from the global RNG, which the processes hold
        alike) and keeps its part's rows, so that the processes together keep the patches one
        process would keep of the global batch.

        Args:
            rate: the fraction of patch tokens dropped, in [0, 1).
            flat_weight: how likely a flat patch is kept relative to one with content, in (0, 1].
            share: (rank, processes) of this process's batch in the global one.

        Raises:
            ValueError: a value out of its range, or a nonzero ``rate`` for a model whose
                positions act in attention ("relative" or RoPE).
        """
        rank, world = share
        if not 0 <= rank < world:
            raise ValueError(f"patch drop share must be (rank, processes) with 0 <= rank < processes, got {share}")
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"patch drop rate must be in [0, 1), got {rate}")
        if not 0.0 < flat_weight <= 1.0:
            raise ValueError(f"patch drop flat weight must be in (0, 1], got {flat_weight}")
        if rate and self.cfg.pos_embed in ATTENTION_POS_EMBEDS:
            raise ValueError(
                f"patch dropout needs absolute position embeddings: with pos_embed={self.cfg.pos_embed!r} the kept "
                "patches would lose their places in the grid"
            )
        self.patch_drop_rate = float(rate)
        self.patch_drop_flat_weight = float(flat_weight)
        self.patch_drop_share = (int(rank), int(world))

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Resize the position embeddings (in place) for another input resolution: the learned
        table(s), the fixed sin-cos one, every block's relative table, or the rotary table of 2-D
        RoPE (:mod:`.posembed`).

        Args:
            img_size: the new input (height, width) in pixels; an int means a square.

        Raises:
            ValueError: a size the config refuses (not a whole number of patches).
        """
        cfg = self.cfg.replace(img_size=img_size)
        grid = cfg.grid_size
        if self.cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(self.pos_embed_table(grid).detach().clone())
        elif self.cfg.pos_embed == "learned2d":
            self.pos_embed_row = nn.Parameter(resample_1d(self.pos_embed_row.detach(), grid[0]).clone())
            self.pos_embed_col = nn.Parameter(resample_1d(self.pos_embed_col.detach(), grid[1]).clone())
        elif self.cfg.pos_embed == "sincos2d":
            self.register_buffer("pos_embed", self.pos_embed_table(grid).detach().clone(), persistent=False)
        elif self.cfg.pos_embed == "relative":
            for blk in self.blocks:
                blk.attn.set_num_patches(grid[0] * grid[1])
        elif self.cfg.pos_embed in ROPE_POS_EMBEDS:
            self.register_buffer("rope", self._rope_table(grid).to(self.rope), persistent=False)
        self.cfg = cfg
