"""How a training step computes, in the precision the policy chose (:mod:`vitkit.precision`): one
object the Trainer asks for the forward, the hand-over of gradients to the fp32 weights and the
weights back to what computes, whatever the precision.

- :class:`AutocastCompute`: the fp32 weights compute, under bf16 autocast when the step is bf16
  (none in fp32), wrapped for data parallelism (DDP, or FSDP's shards).
- :class:`Bf16CopyCompute` (``train.bf16_weights`` with a bf16 step): a bf16 copy of the fp32
  weights computes the forward and backward end to end, without the casts autocast puts around
  every matrix multiply and residual add and with LayerNorm and GELU on half the bytes (on a CPU,
  such ops take a large share of a step that matmuls do not fill); the fp32 weights stay the
  optimiser's, the checkpoints' and the evaluation's, so a step's update is not rounded to bf16.
  The copy is not wrapped in DDP: its gradients are averaged over processes in fp32 once they are
  the fp32 weights', and the weights come from rank 0.

A new way to compute a step (fp8 on a GPU, say) is one more class with these methods.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..precision import Precision
from . import dist as D

Output = torch.Tensor | tuple[torch.Tensor, ...]


def bf16_copy(model: nn.Module) -> nn.Module:
    """A bf16 copy of ``model`` (see :class:`Bf16CopyCompute`).

    Args:
        model: the fp32 model; left as it is.

    Returns:
        A deep copy of ``model`` with its parameters and floating buffers in bf16.
    """
    return copy.deepcopy(model).to(torch.bfloat16)


def grads_to_weights(net: nn.Module, model: nn.Module) -> None:
    """Hand the bf16 copy's gradients to the fp32 weights, as fp32, for clipping and the step.

    Args:
        net: the bf16 copy; its gradients are cleared.
        model: the fp32 model, with the same parameters in the same order; each gradient is
            replaced by the copy's (None where the copy has none).
    """
    for q, p in zip(net.parameters(), model.parameters(), strict=True):
        p.grad = None if q.grad is None else q.grad.float()
        q.grad = None


@torch.no_grad()
def copy_weights(model: nn.Module, net: nn.Module) -> None:
    """Round the fp32 weights, and floating buffers, into the bf16 copy (after each step, and
    after resuming).

    Args:
        model: the fp32 model, read.
        net: the bf16 copy, with the same parameters and buffers in the same order; written.
    """
    # one call for all of them: for tensors this small, a Python loop's per-call cost exceeds the copying
    torch._foreach_copy_(list(net.parameters()), list(model.parameters()))
    for a, b in zip(model.buffers(), net.buffers(), strict=True):
        if a.is_floating_point():
            b.copy_(a)


class StepCompute:
    """What computes a training step's forward and backward (the base of the two ways).

    Attributes:
        precision: the policy's choice this step computes in.
        model: the fp32 weights (the optimiser's, the checkpoints', the evaluation's).
        net: the module that runs the forward and backward (``model`` or a copy of it); patch
            dropout and the train/eval mode are set on it.
        wrapped: ``net`` as the forward calls it (wrapped for data parallelism where it is).

    Args:
        model: the fp32 weights.
        precision: the policy's choice.
        net: the module that runs the forward and backward.
        wrapped: ``net`` as the forward calls it.
    """

    def __init__(self, model: nn.Module, precision: Precision, net: nn.Module, wrapped: nn.Module) -> None:
        self.model, self.precision, self.net, self.wrapped = model, precision, net, wrapped
        self._forward: Callable[..., Any] = wrapped

    def compile(self) -> None:
        """``torch.compile`` what computes the step."""
        self._forward = torch.compile(self.wrapped)

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """The context of one micro-step: data parallelism's gradient sync only on the ``last``.

        Args:
            last: whether this is the last micro-step of the step (gradient accumulation).

        Returns:
            The wrapped module's ``no_sync()`` for the micro-steps before the last, else a context
            that does nothing.
        """
        if last or not hasattr(self.wrapped, "no_sync"):
            return contextlib.nullcontext()
        return self.wrapped.no_sync()

    def forward(self, x: torch.Tensor) -> Output:
        """The training forward of fp32 images ``x``; logits in fp32 or in autocast's dtype.

        Args:
            x: a batch of images (B, C, H, W) in fp32, on the step's device.

        Returns:
            The model's output: logits (B, num_classes), or a tuple of tensors where the model
            returns several (distillation's two heads).

        Raises:
            NotImplementedError: here, in the base class.
        """
        raise NotImplementedError

    def gradients_ready(self, info: D.DistInfo) -> None:
        """After the last backward of a step: the fp32 weights hold the step's averaged gradients.

        Args:
            info: this process among the data-parallel ones.
        """

    def weights_loaded(self, info: D.DistInfo) -> None:
        """Once the weights are set (built, or read back on resuming): every process computes with
        rank 0's.

        Args:
            info: this process among the data-parallel ones.
        """

    def weights_changed(self) -> None:
        """After the optimiser's step: what computes sees the new weights."""

    def evaluation_forward(self) -> Callable[..., Any]:
        """What evaluation calls on images (under the step's autocast).

        Returns:
            The module (compiled where the step is) that computes the forward.
        """
        return self._forward


class AutocastCompute(StepCompute):
    """The fp32 weights compute, under autocast in the chosen precision (none for fp32).

    Args:
        model: the fp32 weights, which also compute.
        precision: the policy's choice: autocast's dtype (none for fp32).
        info: this process among the data-parallel ones.
        device: the step's device.
        fsdp: shard the model with FSDP rather than replicate it with DDP, when there are
            several processes.
    """

    def __init__(
        self, model: nn.Module, precision: Precision, info: D.DistInfo, device: torch.device, fsdp: bool
    ) -> None:
        super().__init__(model, precision, model, D.wrap_model(model, info, device, fsdp))
        self.device = device

    def forward(self, x: torch.Tensor) -> Output:
        """The forward of the fp32 weights under the step's autocast.

        Args:
            x: a batch of images (B, C, H, W) in fp32, on the step's device.

        Returns:
            The model's output (logits, or a tuple of tensors), in bf16 where autocast computes
            in bf16, else fp32.
        """
        with self.precision.autocast(self.device):
            return self._forward(x)


class Bf16CopyCompute(StepCompute):
    """A bf16 copy of the weights computes (module docstring); the loss is taken in fp32.

    Args:
        model: the fp32 weights, which the optimiser updates.
        precision: the policy's choice (bf16).
    """

    def __init__(self, model: nn.Module, precision: Precision) -> None:
        net = bf16_copy(model)
        super().__init__(model, precision, net, net)

    def forward(self, x: torch.Tensor) -> Output:
        """The forward of the bf16 copy, its output cast to fp32 for the loss.

        Args:
            x: a batch of images (B, C, H, W) in fp32, on the step's device; cast to bf16.

        Returns:
            The model's output (logits, or a tuple of tensors) in fp32.
        """
        out = self._forward(x.to(torch.bfloat16))
        return tuple(o.float() for o in out) if isinstance(out, tuple) else out.float()

    def gradients_ready(self, info: D.DistInfo) -> None:
        """Move the copy's gradients to the fp32 weights and average them over the processes.

        Args:
            info: this process among the data-parallel ones.
        """
        grads_to_weights(self.net, self.model)
        D.average_gradients(self.model, info)

    def weights_loaded(self, info: D.DistInfo) -> None:
        """Give every process rank 0's fp32 weights and round them into the copy.

        Args:
            info: this process among the data-parallel ones.
        """
        D.broadcast_weights(self.model, info)  # DDP would have; the copy is not wrapped
        copy_weights(self.model, self.net)

    def weights_changed(self) -> None:
        """Round the updated fp32 weights into the copy."""
        copy_weights(self.model, self.net)

    def evaluation_forward(self) -> Callable[..., Any]:
        """Evaluation runs on the fp32 weights, not the copy.

        Returns:
            The fp32 model, uncompiled.
        """
        return self.model  # the fp32 weights, uncompiled (train.compile compiles the copy)


def step_compute(
    model: nn.Module,
    precision: Precision,
    bf16_weights: bool,
    info: D.DistInfo,
    device: torch.device,
    fsdp: bool = False,
    compile: bool = False,
) -> StepCompute:
    """The way a step computes in ``precision``: a bf16 copy of the weights when the step is bf16
    and ``bf16_weights`` asks for it, else the weights themselves under autocast.

    Args:
        model: the fp32 model, on ``device``.
        precision: the resolved precision of the step.
        bf16_weights: the recipe's ``train.bf16_weights`` (ignored when the step is fp32).
        info: this process among the data-parallel ones.
        device: where the step runs.
        fsdp: shard the parameters with FSDP (the autocast way only).
        compile: ``torch.compile`` what computes.

    Returns:
        A :class:`StepCompute`.
    """
    if precision.bf16 and bf16_weights:
        compute: StepCompute = Bf16CopyCompute(model, precision)
    else:
        compute = AutocastCompute(model, precision, info, device, fsdp)
    if compile:
        compute.compile()
    return compute


__all__ = [
    "AutocastCompute",
    "Bf16CopyCompute",
    "StepCompute",
    "bf16_copy",
    "copy_weights",
    "grads_to_weights",
    "step_compute",
]
