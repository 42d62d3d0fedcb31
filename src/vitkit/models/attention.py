"""The attention kernel: ``softmax(q k^T * scale + bias) v`` of eq. 2's MSA, and which of three ways computes it.

The optional ``bias`` (B, H, N, N) is added to the logits before the softmax; the relative position
embedding (appendix D.4) hands its term over this way. Every path takes it (``attn_mask`` of the fused
kernel, a float mask being added), except that "recompute" gives way to "math" (:func:`attention_path`).

- "sdpa": ``F.scaled_dot_product_attention``, the fused kernel. It never holds the N x N weights
  (tiles with an online softmax), which is what accelerators and long sequences want.
- "math": the explicit path, ``q * scale``, ``q k^T``, softmax, dropout, ``@ v``. The only path that
  can hand the weights back (the analyses ask for them). At ViT sequence lengths on the CPU the
  weights are small, so the explicit path is a few batched matmuls on the CPU's GEMM kernels and,
  in the backward, matmuls and a softmax backward; the fused CPU kernel instead works tile by tile
  and recomputes the weights tile by tile in its backward, which costs more at these lengths.
- "recompute": the explicit path's numbers, bit for bit, with the weights recomputed in the backward
  instead of kept (:class:`_RecomputedAttention`): what the explicit path saves for its backward
  grows as N^2, the fused kernel's as N.

``impl="auto"`` picks per call (:func:`attention_path`): the fused kernel on accelerators, for
fp32 CPU inference, and for bf16 CPU inference of long sequences (N > 8 head_dim, where the
explicit path's N x N weights outgrow the caches: 1.2-1.3x faster fused from N = 577 on an AVX-512
CPU); the explicit path for shorter bf16 CPU inference and for CPU training, recomputing once
keeping the weights would cost more than q, k and v together (N > 3 head_dim), or, for a shape
:func:`choose_training_path` has timed on this CPU (the trainer times its own), whichever of the
two was faster. The measurements behind these choices are in ``benchmarks/RESULTS.md``.

A scale of exactly 1 is not multiplied in on the explicit path: ``q * 1.0`` is ``q`` in IEEE
arithmetic, so skipping it changes no value and saves one pass over q (the scale may already be
in the query weights, as :func:`vitkit.inference.fold_attention_scale` puts it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..runtime import PINS, fastest, pinned, record_choice

ATTENTION_IMPLS = ("auto", "sdpa", "math", "recompute")


_SOFTMAX_DTYPES: dict[tuple, torch.dtype] = {}


def _attention_dtypes(q: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """The dtypes the explicit path computes in here: (its matmuls, its softmax output). Under
    autocast the matmuls run in the autocast dtype; softmax stays there on the CPU but CUDA's
    autocast runs it in fp32. Asked of autocast itself (once per setting), not assumed."""
    dev = q.device.type
    enabled = torch.is_autocast_enabled(dev)
    mm = torch.get_autocast_dtype(dev) if enabled else q.dtype
    key = (dev, enabled, mm)
    if key not in _SOFTMAX_DTYPES:
        _SOFTMAX_DTYPES[key] = torch.softmax(torch.zeros(2, dtype=mm, device=q.device), -1).dtype
    return mm, _SOFTMAX_DTYPES[key]


class _RecomputedAttention(torch.autograd.Function):
    """``softmax(q k^T * scale) v`` that saves only q, k and v for the backward, as the fused
    kernels do, and recomputes the N x N weights there. The explicit path (``q k^T``, softmax,
    ``@ v``) keeps the weights alive from forward to backward: 12 x B x H x N^2 values for a
    ViT-B/16. Computes in the explicit path's dtypes under the caller's autocast (``mm``: the
    matmuls, ``sm``: softmax's output; :func:`_attention_dtypes`), so the two give the same
    numbers. The backward is built of differentiable ops: double backward and ``torch.func``
    work."""

    @staticmethod
    def forward(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mm: torch.dtype, sm: torch.dtype
    ) -> torch.Tensor:
        with torch.autocast(q.device.type, enabled=False):
            weights = torch.softmax(((q * scale).to(mm) @ k.to(mm).transpose(-2, -1)).to(sm), dim=-1)
            return weights.to(mm) @ v.to(mm)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        q, k, v, ctx.scale, ctx.mm, ctx.sm = inputs
        ctx.save_for_backward(q, k, v)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v = ctx.saved_tensors
        mm, sm, scale = ctx.mm, ctx.sm, ctx.scale
        with torch.autocast(q.device.type, enabled=False):
            qs, km, vm, grad = (q * scale).to(mm), k.to(mm), v.to(mm), grad.to(mm)
            weights = torch.softmax((qs @ km.transpose(-2, -1)).to(sm), dim=-1)  # recomputed
            grad_v = weights.to(mm).transpose(-2, -1) @ grad
            grad_w = (grad @ vm.transpose(-2, -1)).to(sm)
            grad_s = torch.ops.aten._softmax_backward_data(grad_w, weights, -1, sm).to(mm)
            grad_q = (grad_s @ km) * scale
            grad_k = grad_s.transpose(-2, -1) @ qs
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None


def attention_path(q: torch.Tensor, impl: str, need_weights: bool, dropout_p: float, bias: bool = False) -> str:
    """The path that computes attention for queries ``q`` (B, H, N, hd): "sdpa", "math" or
    "recompute". ``impl`` is one of :data:`ATTENTION_IMPLS`; ``dropout_p`` is the dropout rate
    in effect (0 outside training); ``bias``: whether a logits bias is added. The module docstring
    says why each runs where.

    With a bias, "recompute" (asked for, or chosen by "auto") runs the explicit path instead: the
    bias is an N x N tensor that needs a gradient, so the recomputing backward would have to keep
    it (or its gradient's inputs), which is what recomputing the weights is there to avoid."""
    if need_weights:
        return "math"
    if impl == "auto":
        # On the CPU the fused kernel wins for fp32 inference, and for inference in lower precision
        # once the sequence is long (N > 8 head_dim: ViT-B/16 at 384 px, DINOv2 at 518 px), where
        # the explicit path's N x N weights no longer stay in cache.
        training = torch.is_grad_enabled() and q.requires_grad
        if q.device.type != "cpu" or not (torch.is_grad_enabled() or q.dtype != torch.float32):
            return "sdpa"
        if not training and q.shape[-2] > 8 * q.shape[-1]:
            return "sdpa"
        # Recompute the weights when keeping them would cost more than q, k and v together
        # (N > 3 head_dim: ViT-B/16 at 224 px and longer); below that keeping them is cheaper.
        # Where this shape was measured on this CPU (choose_training_path), the measurement decides.
        long = q.shape[-2] > 3 * q.shape[-1]
        measured = _TRAINING_PATHS.get((q.dtype, *q.shape)) if training else None
        impl = measured or ("recompute" if long and training else "math")
    if impl == "recompute" and (dropout_p > 0.0 or not torch.is_grad_enabled() or bias):
        # dropout on the weights needs them kept; without gradients nothing is saved; a bias: above
        return "math"
    return impl


def _explicit(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    dropout_p: float,
    training: bool,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    q = q if scale == 1.0 else q * scale  # a multiply by exactly 1 changes nothing (module docstring)
    logits = q @ k.transpose(-2, -1)  # (B, H, N, N)
    if bias is not None:
        logits = logits + bias
    weights = logits.softmax(dim=-1)
    out = F.dropout(weights, dropout_p, training) @ v  # (B, H, N, hd)
    return out, weights


# (dtype, B, H, N, hd) -> "math" | "recompute": what choose_training_path measured in this process.
_TRAINING_PATHS: dict[tuple[Any, ...], str] = {}


def choose_training_path(
    batch: int, heads: int, tokens: int, head_dim: int, dtype: torch.dtype = torch.float32, repeats: int = 5
) -> str:
    """Which of the two explicit paths trains attention of this shape faster on this CPU, timed
    (forward and backward of q, k, v of shape (batch, heads, tokens, head_dim) in ``dtype``, the
    best of ``repeats``, the two paths taking turns): "math" keeps the weights, "recompute"
    recomputes them in the backward.
    Both give the same numbers bit for bit, so the choice changes speed only, and a resumed run
    may choose differently and still end with the same weights. The rule ``auto`` follows without
    a measurement (recompute beyond N > 3 head_dim) is where the saved memory traffic outweighs
    the second ``q k^T`` on the machines measured; the crossing moves with the CPU's cache and
    bandwidth, which is why the trainer measures it. Decided once per shape in a process."""
    key = (dtype, batch, heads, tokens, head_dim)
    if key in _TRAINING_PATHS:
        return _TRAINING_PATHS[key]
    shape = f"training B={batch} H={heads} N={tokens} hd={head_dim} {str(dtype).removeprefix('torch.')}"
    if (pin := pinned("attention")) is not None:
        record_choice("attention", shape, pin, f"pinned by {PINS['attention']}")
        _TRAINING_PATHS[key] = pin
        return pin
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, generator=g).to(dtype).requires_grad_() for _ in range(3))

    def step(impl: str) -> Callable[[], None]:
        def run() -> None:
            with torch.enable_grad():
                out, _ = attend(
                    q, k, v, scale=head_dim**-0.5, dropout_p=0.0, training=True, impl=impl, need_weights=False
                )
                out.float().sum().backward()

        return run

    choice, times = fastest({impl: step(impl) for impl in ("math", "recompute")}, repeats=repeats)
    record_choice("attention", shape, choice, "measured", seconds=times)
    _TRAINING_PATHS[key] = choice
    return choice


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    dropout_p: float,
    training: bool,
    impl: str,
    need_weights: bool,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(q k^T * scale + bias) v`` for q, k, v of shape (B, H, N, hd), with dropout
    ``dropout_p`` on the weights in training; ``bias`` (broadcastable to (B, H, N, N), optional)
    is added to the logits and gets its gradient on every path. Returns the output (B, H, N, hd)
    and, when ``need_weights``, the softmax weights (B, H, N, N) (else None). ``impl`` chooses
    the path (:func:`attention_path`)."""
    drop = dropout_p if training else 0.0
    path = attention_path(q, impl, need_weights, drop, bias=bias is not None)
    if path == "math":
        out, weights = _explicit(q, k, v, scale, drop, training, bias)
        return out, (weights if need_weights else None)
    if path == "recompute":
        return _RecomputedAttention.apply(q, k, v, scale, *_attention_dtypes(q)), None
    mask = None if bias is None else bias.to(q.dtype)  # a float mask is added to the logits
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=scale), None
