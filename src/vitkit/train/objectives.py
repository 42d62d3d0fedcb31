"""What a run minimises: one small object per objective, owning its loss, its targets and how a
batch is mixed (compare timm's task objects and big_vision's loss functions).

- :class:`Softmax`: cross-entropy of one class an image (label smoothing, Mixup / CutMix);
- :class:`Sigmoid`: big_vision's sigmoid cross-entropy summed over the classes, for one class an
  image or multi-hot rows of a multi-label source;
- :class:`Distillation`: DeiT's objective, a label objective plus a fixed teacher's.

:func:`objective_for` picks the one a recipe names. A new objective is one more class with the
two methods of :class:`Objective`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..data.mix import MixConfig, mix_batch
from .distill import Teacher, distillation_loss

Output = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, kind: str, smoothing: float) -> torch.Tensor:
    """Softmax cross-entropy, or sigmoid cross-entropy (summed over classes) as big_vision.

    Args:
        logits: (B, K).
        labels: class indices (B,), or soft targets (B, K) from Mixup / CutMix, which already
            hold the label smoothing (``smoothing`` is then not applied again).
        kind: "softmax" or "sigmoid".
        smoothing: the label smoothing of class indices.

    Returns:
        The mean loss of the batch (a scalar, float32).

    Raises:
        ValueError: an unknown ``kind``.
    """
    logits = logits.float()
    if labels.is_floating_point():
        if kind == "softmax":
            return F.cross_entropy(logits, labels)
        if kind == "sigmoid":
            return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / logits.shape[0]
    if kind == "softmax":
        return F.cross_entropy(logits, labels, label_smoothing=smoothing)
    if kind == "sigmoid":
        k = logits.shape[-1]
        target = F.one_hot(labels, k).float()
        if smoothing:
            target = target * (1 - smoothing) + smoothing / k
        return F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / logits.shape[0]
    raise ValueError(f"loss must be softmax or sigmoid, got {kind!r}")


class Objective:
    """A training objective over a model of ``num_classes`` outputs.

    Args:
        kind: "softmax" or "sigmoid" (the recipe's ``train.loss``).
        num_classes: the model's outputs.
        mix: the recipe's Mixup / CutMix, with its label smoothing.
    """

    def __init__(self, kind: str, num_classes: int, mix: MixConfig) -> None:
        self.kind, self.num_classes, self.mix = kind, num_classes, mix

    def targets(self, x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch mixed as the recipe says, and its targets: soft (B, K), holding the label
        smoothing, when mixing is on or the labels are multi-hot rows; else the class indices.

        Args:
            x: the augmented images (B, C, H, W).
            y: class indices (B,) or multi-hot rows (B, K_data).
            g: the step's generator (the mixing draws come from it).

        Returns:
            The images and their targets.
        """
        k = self.num_classes
        if y.ndim == 1:
            return mix_batch(x, y, k, self.mix, g)[:2] if self.mix.enabled else (x, y)
        s = self.mix.label_smoothing  # multi-hot rows (B, K_data), padded to the model's classes
        rows = F.pad(y.float(), (0, k - y.shape[1])) * (1 - s) + s / k
        if not self.mix.enabled:
            return x, rows
        # mix_batch draws the weights and mixes the images; the rows mix with the same weights
        x, _, lam = mix_batch(x, torch.zeros(len(y), dtype=torch.int64, device=y.device), k, self.mix, g)
        lam = lam.view(-1, 1).float()
        return x, lam * rows + (1 - lam) * rows.flip(0)

    def loss(self, x: torch.Tensor, out: Output, y: torch.Tensor) -> torch.Tensor:
        """The loss of a micro-batch.

        Args:
            x: the images the model saw (a teacher sees them too).
            out: the model's logits (B, K), or a distilled model's two outputs.
            y: the targets of :meth:`targets`.

        Returns:
            The mean loss (a scalar).
        """
        logits = out[0] if isinstance(out, tuple) else out
        return loss_fn(logits, y, self.kind, self.mix.label_smoothing)

    def describe(self) -> str:
        """The objective in a few words, for the run plan.

        Returns:
            E.g. "softmax cross-entropy over 10 classes, label smoothing 0.1".
        """
        mixing = f", Mixup/CutMix ({self.mix.mode})" if self.mix.enabled else ""
        smoothing = f", label smoothing {self.mix.label_smoothing:g}" if self.mix.label_smoothing else ""
        return f"{self.kind} cross-entropy over {self.num_classes} classes{smoothing}{mixing}"


class Softmax(Objective):
    """Softmax cross-entropy: one class an image.

    Args:
        kind: "softmax".
        num_classes: the model's outputs.
        mix: the recipe's mixing.
    """


class Sigmoid(Objective):
    """Sigmoid cross-entropy summed over the classes: one class an image, or multi-hot rows.

    Args:
        kind: "sigmoid".
        num_classes: the model's outputs.
        mix: the recipe's mixing.
    """


class Distillation(Objective):
    """DeiT's objective: ``(1 - alpha)`` times the label objective plus ``alpha`` times the
    teacher's (hard: cross-entropy to its argmax; soft: KL at a temperature), the teacher seeing
    the same augmented images. A model without a distillation head is distilled through its one head.

    Args:
        kind: the label objective's loss, "softmax" or "sigmoid".
        num_classes: the model's outputs.
        mix: the recipe's mixing.
        teacher: the fixed teacher.
        how: "hard" or "soft".
        alpha: the teacher's share of the loss.
        temperature: the soft objective's temperature.
    """

    def __init__(
        self, kind: str, num_classes: int, mix: MixConfig, teacher: Teacher, how: str, alpha: float, temperature: float
    ) -> None:
        super().__init__(kind, num_classes, mix)
        self.teacher, self.how, self.alpha, self.temperature = teacher, how, alpha, temperature

    def loss(self, x: torch.Tensor, out: Output, y: torch.Tensor) -> torch.Tensor:
        """The label objective and the teacher's, mixed by ``alpha``.

        Args:
            x: the images the model saw; the teacher sees them too.
            out: the model's logits, or its class and distillation outputs.
            y: the targets of :meth:`targets`.

        Returns:
            The mean loss (a scalar).
        """
        cls, dist = out if isinstance(out, tuple) else (out, out)
        label_loss = loss_fn(cls, y, self.kind, self.mix.label_smoothing)
        teacher = self.teacher(x)
        hard = lambda logits, labels: loss_fn(logits, labels, self.kind, 0.0)
        return distillation_loss(label_loss, dist, teacher, self.how, self.alpha, self.temperature, hard)

    def describe(self) -> str:
        """The objective in a few words.

        Returns:
            The label objective's words and the teacher's share.
        """
        return f"{super().describe()}, distilled ({self.how}, alpha {self.alpha:g}) from a teacher"


def objective_for(train: Any, num_classes: int, mix: MixConfig, teacher: Teacher | None) -> Objective:
    """The objective a recipe's ``train`` section names.

    Args:
        train: the recipe's ``train`` section (``loss``, ``distill`` and its settings).
        num_classes: the model's outputs.
        mix: the recipe's mixing.
        teacher: the teacher of a distillation run; None otherwise.

    Returns:
        :class:`Distillation` when there is a teacher, else :class:`Softmax` or :class:`Sigmoid`.
    """
    if teacher is not None:
        t = train
        return Distillation(t.loss, num_classes, mix, teacher, t.distill, t.distill_alpha, t.distill_temperature)
    return (Sigmoid if train.loss == "sigmoid" else Softmax)(train.loss, num_classes, mix)


__all__ = ["Distillation", "Objective", "Sigmoid", "Softmax", "loss_fn", "objective_for"]
