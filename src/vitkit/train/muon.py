"""Muon (Jordan et al., 2024) for the encoder's weight matrices, AdamW for the rest, in one optimiser.

Muon replaces each weight matrix's momentum by the nearest semi-orthogonal matrix before the
step: every direction of the update gets the same size, so the directions that plain gradients
under-train move as fast as the dominant ones. Its authors found it reaches a given loss in
fewer steps than AdamW on small Transformers; that is what a short CPU schedule needs (the
demo's schedule ends while its model is still learning). Muon is defined for matrices
that map hidden features to hidden features only: the patch embedding, the head, position
embeddings, tokens, biases and norm scales stay with AdamW (as its authors advise).

The orthogonalisation is the quintic Newton-Schulz iteration of the Muon paper (coefficients
3.4445, -4.7750, 2.0315, five steps), in bf16 where the device computes bf16 natively and fast and
in fp32 elsewhere (the precision policy, :mod:`vitkit.precision`: on a CPU that emulates bf16 the
iteration would be ~100x slower), run on all matrices of one shape at once as a batched matmul:
on a CPU the per-op cost of many small matmuls would otherwise dominate. The
update is scaled by ``0.2 * sqrt(max(rows, cols))`` (Liu et al., 2025, "Muon is scalable"), which
gives it the root-mean-square size of a typical AdamW update, so one learning rate and one
weight decay serve both kinds of parameter.

Under data parallelism every process holds the same averaged gradients and would repeat the same
iteration; given the data-parallel ``process_group``, each of W processes iterates on 1/W of the
matrices of each shape and gathers the others' results (as modded-nanogpt distributes it), so
the iteration's cost is divided by W for one all-gather of the updates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from ..precision import Precision, PrecisionLike, as_precision, resolve_precision

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(
    g: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with ``g``'s singular vectors (the Newton-Schulz
    iteration drives the singular values towards 1, to within about 0.5-1.5 after five steps).

    Args:
        g: a matrix or a batch of them, ``(..., rows, cols)``.
        steps: Newton-Schulz iterations.
        eps: added to the Frobenius norm the input is divided by.
        dtype: what the iteration computes in (bf16 or fp32).

    Returns:
        fp32, in ``g``'s shape.
    """
    a, b, c = NS_COEFFICIENTS
    tall = g.size(-2) > g.size(-1)
    x = (g.mT if tall else g).to(dtype)  # iterate on the smaller Gram matrix
    batch = x.shape[:-2]
    x = x.reshape(-1, *x.shape[-2:])
    # Frobenius norm >= spectral norm: after this every singular value is at most 1
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        gram = torch.bmm(x, x.mT)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a)
    x = x.reshape(*batch, *x.shape[-2:]).float()
    return x.mT if tall else x


def _fusable(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW kernel takes this group: floating parameters of one dtype on
    the CPU. Their gradients and moments share the dtype and device (torch enforces it for
    gradients; the moments are made like the parameters), and the step counts are CPU float32
    scalars as the kernel wants them."""
    dtype = params[0].dtype
    return (
        hasattr(torch, "_fused_adamw_")
        and dtype in (torch.float32, torch.bfloat16, torch.float16)
        and all(p.device.type == "cpu" and p.dtype == dtype for p in params)
    )


class MuonAdamW(torch.optim.Optimizer):
    """One optimiser over groups of two kinds: a group with ``"muon": True`` is updated by Muon
    (momentum, Nesterov, orthogonalised, decoupled weight decay), every other group by AdamW.
    Every group takes ``lr`` and ``weight_decay``; a Muon group may also take ``splits``, one int
    per parameter: how many equal blocks of rows to orthogonalise separately (3 for a fused qkv
    weight, whose q, k and v are three maps). The state (Muon's momentum buffer, AdamW's two
    moments and step count) is per parameter, so ``state_dict`` and resuming work as for torch's
    optimisers. ``precision`` is what the orthogonalisation computes in: "auto" (bf16 where the
    parameters' device computes it natively and fast, fp32 elsewhere; :mod:`vitkit.precision`),
    "fp32" or "bf16"."""

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        process_group: Any = None,
        precision: PrecisionLike = "auto",
    ) -> None:
        if not isinstance(precision, Precision):
            resolve_precision(precision)  # an unknown name fails here, not at the first step
        self.precision = precision
        # The data-parallel group whose processes share the orthogonalisation (module docstring);
        # None: this process does all of it. Its members must hold the same gradients.
        self.process_group = process_group
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            muon=False,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"]:
                bad = [tuple(p.shape) for p in group["params"] if p.ndim != 2]
                if bad:
                    raise ValueError(f"Muon updates matrices only; this group holds tensors of shape {bad}")
                for p, k in zip(group["params"], group.get("splits") or []):
                    if k < 1 or p.shape[0] % k:
                        raise ValueError(
                            f"a split of {k} does not divide the {p.shape[0]} rows of a {tuple(p.shape)} matrix"
                        )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._muon if group["muon"] else self._adamw)(group, params)
        return loss

    def _muon(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        split_of = dict(zip(map(id, group["params"]), group.get("splits") or [1] * len(group["params"])))
        splits = [split_of[id(p)] for p in params]
        grads = [p.grad.float() for p in params]
        bufs = []
        for p, g in zip(params, grads):
            st = self.state[p]
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros_like(g)
            bufs.append(st["momentum_buffer"])
        torch._foreach_lerp_(bufs, grads, 1 - mu)
        updates = [g.lerp(b, mu) for g, b in zip(grads, bufs)] if group["nesterov"] else bufs
        # A matrix with a split of k is k matrices stacked by rows (a fused qkv weight: q, k and v),
        # each orthogonalised and scaled as a matrix of its own.
        pieces = [piece for u, k in zip(updates, splits) for piece in u.chunk(k, dim=0)]
        # One batched iteration per shape up to transposition (orthogonalising commutes with it):
        # the MLP's (hidden, width) and (width, hidden) matrices go together, all made wide.
        wide = [u if u.size(0) <= u.size(1) else u.T for u in pieces]
        by_shape: dict[torch.Size, list[int]] = {}
        for i, u in enumerate(wide):
            by_shape.setdefault(u.shape, []).append(i)
        steps: list[torch.Tensor] = [torch.empty(0)] * len(pieces)
        for idx in by_shape.values():
            for i, o in zip(idx, self._orthogonalize(torch.stack([wide[i] for i in idx]), group["ns_steps"])):
                steps[i] = o if wide[i] is pieces[i] else o.T
        if wd:
            torch._foreach_mul_(params, 1 - lr * wd)
        start = 0
        for p, k in zip(params, splits):
            step = steps[start] if k == 1 else torch.cat(steps[start : start + k])
            p.add_(step, alpha=-lr * 0.2 * math.sqrt(max(steps[start].shape)))  # the blocks are of one shape
            start += k

    def ns_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the Newton-Schulz iteration computes in on ``device`` (the policy caches its answer)."""
        return as_precision(self.precision, device).dtype

    def _orthogonalize(self, stack: torch.Tensor, steps: int) -> torch.Tensor:
        """:func:`orthogonalize` of a stack of matrices (n, r, c), shared among the processes of
        ``process_group``: each takes a contiguous 1/W of the stack (the last ones padded with
        zero matrices, which the iteration leaves zero) and all of them gather every share."""
        pg = self.process_group
        world = dist.get_world_size(pg) if pg is not None else 1
        n = stack.shape[0]
        dtype = self.ns_dtype(stack.device)
        if world == 1 or n == 1:
            return orthogonalize(stack, steps, dtype=dtype)
        per = -(-n // world)
        rank = dist.get_rank(pg)
        mine = stack[rank * per : (rank + 1) * per]
        if mine.shape[0] < per:
            mine = torch.cat([mine, mine.new_zeros(per - mine.shape[0], *stack.shape[1:])])
        mine = orthogonalize(mine, steps, dtype=dtype).contiguous()
        shares = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(shares, mine, group=pg)
        return torch.cat(shares)[:n]

    def _adamw(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        grads, avgs, sqs, counts = [], [], [], []
        for p in params:
            st = self.state[p]
            if "exp_avg" not in st:
                st["step"] = torch.zeros((), dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p)
                st["exp_avg_sq"] = torch.zeros_like(p)
            grads.append(p.grad)
            avgs.append(st["exp_avg"])
            sqs.append(st["exp_avg_sq"])
            counts.append(st["step"])
        torch._foreach_add_(counts, 1)
        if _fusable(params):
            # One call for the whole group: on a CPU the foreach ops below are a loop of small
            # ops per tensor (and a scalar wrapped per tensor), a measurable share of the step
            # for the ~50 biases and norm scales a ViT hands to AdamW. Same update, same state.
            torch._fused_adamw_(
                params, grads, avgs, sqs, [], counts, lr=lr, beta1=beta1, beta2=beta2, weight_decay=wd,
                eps=eps, amsgrad=False, maximize=False,
            )  # fmt: skip
            return
        step = float(counts[0])
        torch._foreach_lerp_(avgs, grads, 1 - beta1)
        torch._foreach_mul_(sqs, beta2)
        torch._foreach_addcmul_(sqs, grads, grads, value=1 - beta2)
        denom = torch._foreach_sqrt(sqs)
        torch._foreach_div_(denom, math.sqrt(1 - beta2**step))
        torch._foreach_add_(denom, eps)
        if wd:
            torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_addcdiv_(params, avgs, denom, value=-lr / (1 - beta1**step))
