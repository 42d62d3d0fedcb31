"""Heads: the replaceable, zero-initialised classifier every vitkit model shares (section 3.2), and
the attention-pooling (MAP) head of big_vision, an alternative to the class token and to GAP."""

from __future__ import annotations

import torch
from torch import nn

from .attention import attend


class ReplaceableHead:
    """Mixin for models with ``cfg``, ``num_features`` and an optional linear ``head``."""

    def reset_classifier(self, num_classes: int, bias_init: float = 0.0) -> None:
        """Replace the head by a zero-initialised one (the paper's fine-tuning); 0 removes it.
        A DeiT distillation head (``head_dist``) is replaced (or removed) with it.

        Args:
            num_classes: the new head's outputs; 0: no head (the model returns its features).
            bias_init: the value every bias of the new head starts at.
        """
        p = next(self.parameters())
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        self.head = self._new_head(self.num_features, num_classes, bias_init, p)
        if getattr(self.cfg, "distill_token", False):
            self.head_dist = self._new_head(self.cfg.width, num_classes, bias_init, p)

    @staticmethod
    def _new_head(features: int, num_classes: int, bias_init: float, like: nn.Parameter) -> nn.Linear | None:
        if not num_classes:
            return None
        head = nn.Linear(features, num_classes, device=like.device, dtype=like.dtype)
        nn.init.zeros_(head.weight)
        nn.init.constant_(head.bias, bias_init)
        return head


class MAPHead(nn.Module):
    """Multi-head attention pooling (``classifier="map"``): one learned probe token attends over
    the encoder's normed tokens, then a pre-norm MLP residual. (B, N, D) -> (B, D)::

        y = MHA(query=probe, keys=values=tokens)     # one output token
        y = y + MLP(LN(y))

    big_vision's ``MAPHead`` (``pool_type="map"``; SigLIP, ViT-G) and timm's
    ``AttentionPoolLatent`` (``global_pool="map"``) compute this. The names are timm's:
    ``latent`` (the probe, (1, 1, D)), ``q`` (D -> D), ``kv`` (D -> 2D, keys then values),
    ``proj``, ``norm``, ``mlp.fc1`` / ``mlp.fc2``; big_vision's ``MAPHead_0/probe``,
    ``MultiHeadDotProductAttention_0/{query,key,value,out}``, ``LayerNorm_0`` and
    ``MlpBlock_0/Dense_{0,1}`` map onto them (:mod:`vitkit.checkpoint.official`). Both use the
    encoder's number of heads and MLP size; ``mlp`` is the encoder's kind of MLP
    (:class:`vitkit.models.vit.Mlp`), so the activation is the encoder's too.
    """

    impl: str = "auto"  # the attention path (vitkit.models.attention), as the blocks'

    def __init__(self, dim: int, num_heads: int, mlp: nn.Module, ln_eps: float = 1e-6) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=ln_eps)
        self.mlp = mlp
        if not self.latent.is_meta:  # a model on the meta device draws nothing
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Probe N(0, 1/D) (timm's scale), xavier-uniform dense layers, zero biases."""
        nn.init.normal_(self.latent, std=self.latent.shape[-1] ** -0.5)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.ones_(self.norm.weight)
        nn.init.zeros_(self.norm.bias)

    def forward(self, tokens: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens (B, N, D) -> pooled (B, D); ``key_mask`` (B, N) bool, False on padding tokens,
        which the probe does not attend to."""
        B, N, D = tokens.shape
        H, hd = self.num_heads, self.head_dim
        q = self.q(self.latent).reshape(1, 1, H, hd).transpose(1, 2).expand(B, -1, -1, -1)  # (B, H, 1, hd)
        kv = self.kv(tokens).reshape(B, N, 2, H, hd).permute(2, 0, 3, 1, 4)  # (2, B, H, N, hd)
        k, v = kv.unbind(0)
        bias = None
        if key_mask is not None:  # (B, N) -> (B, 1, 1, N): -inf on padded keys
            bias = torch.zeros(B, 1, 1, N, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        out, _ = attend(
            q,
            k,
            v,
            scale=hd**-0.5,
            dropout_p=0.0,
            training=self.training,
            impl=self.impl,
            need_weights=False,
            bias=bias,
        )  # (B, H, 1, hd)
        y = self.proj(out.transpose(1, 2).reshape(B, 1, D))  # (B, 1, D)
        y = y + self.mlp(self.norm(y))
        return y[:, 0]  # (B, D)
