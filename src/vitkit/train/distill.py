"""Distillation through attention (DeiT; Touvron et al., ICML 2021): a fixed teacher's predictions
on the same augmented batch as a second target.

The student's distillation head (``model.distill_token``; the class head itself without one) is
trained against the teacher, the class head against the labels:
``loss = (1 - alpha) * label_loss(class logits) + alpha * teacher_loss(distillation logits)``.
"hard" distillation (DeiT's best) takes the teacher's top class as a label; "soft" the KL
divergence between the teacher's and the student's softmax at a temperature T, scaled by T^2 so
that its gradients keep their size as T changes (Hinton et al., 2015).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint.io import tensor_bytes
from ..errors import RecipeError, VitkitError
from ..precision import PrecisionLike, as_precision
from ..preprocessing import Preprocessing


def soft_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, summed over the classes and
    averaged over the images. (DeiT's code divides the sum by images x classes instead, which
    makes its soft term K times smaller; the per-image mean is the KL divergence itself.)"""
    t = temperature
    log_p_student = F.log_softmax(student.float() / t, dim=-1)  # (B, K)
    log_p_teacher = F.log_softmax(teacher.float() / t, dim=-1)  # (B, K)
    kl = F.kl_div(log_p_student, log_p_teacher, reduction="sum", log_target=True)
    return kl * (t * t) / student.shape[0]


def distillation_loss(
    label_loss: torch.Tensor,
    student: torch.Tensor,
    teacher: torch.Tensor,
    kind: str,
    alpha: float,
    temperature: float = 1.0,
    hard_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
) -> torch.Tensor:
    """DeiT's objective from the class head's loss against the labels (``label_loss``), the
    distillation head's logits (``student``, (B, K)) and the teacher's (``teacher``, (B, K)):
    ``(1 - alpha) * label_loss + alpha * teacher term``; the teacher term is ``hard_loss(student,
    teacher's argmax)`` ("hard": cross-entropy by default, the run's loss in training) or
    :func:`soft_distillation_loss` ("soft")."""
    if kind == "hard":
        term = hard_loss(student.float(), teacher.argmax(dim=-1))
    elif kind == "soft":
        term = soft_distillation_loss(student, teacher, temperature)
    else:
        raise ValueError(f"distillation must be 'hard' or 'soft', got {kind!r}")
    return (1 - alpha) * label_loss + alpha * term


def weights_digest(model: nn.Module) -> str:
    """sha256 over a model's state dict (names, dtypes, shapes, values, in name order): what the
    trainer keeps to tell, on resuming, that the teacher is still the one the run started with,
    however it was named (a file, a run folder whose best weights move on, a hub name)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


class Teacher:
    """A fixed teacher: any checkpoint :func:`vitkit.load_pretrained` reads (a CNN or a ViT), in
    eval mode, without gradients. It sees the student's augmented batch, brought to its own value
    range (mean and std per channel) and, if its resolution differs, resized to it."""

    def __init__(
        self,
        path: str | Path,
        num_classes: int,
        in_chans: int,
        preprocessing: Preprocessing,
        device: torch.device,
        precision: PrecisionLike = "fp32",
    ) -> None:
        from ..hub import load_pretrained  # a file, a run folder, or a name / address downloaded once

        try:
            model = load_pretrained(path)
        except VitkitError as e:  # a bad file, an unknown name, a failed download
            raise RecipeError(f"train.teacher: {e}") from None
        if model.num_classes != num_classes:
            raise RecipeError(
                f"train.teacher {path}: the teacher predicts {model.num_classes} classes, the model {num_classes}; "
                "a teacher must be trained on the same classes"
            )
        if model.cfg.in_chans != in_chans:
            raise RecipeError(
                f"train.teacher {path}: the teacher takes {model.cfg.in_chans} input channels, the model {in_chans}"
            )
        self.digest = weights_digest(model)
        self.model: nn.Module = model.to(device).eval().requires_grad_(False)
        self.device, self.precision = device, as_precision(precision, device)
        theirs = model.preprocessing
        # x_teacher = (x * std_s + mean_s - mean_t) / std_t, per channel: (1, C, 1, 1) scale and shift
        std_s, mean_s = torch.tensor(preprocessing.std), torch.tensor(preprocessing.mean)
        std_t, mean_t = torch.tensor(theirs.std), torch.tensor(theirs.mean)
        self.same_range = bool(torch.equal(std_s, std_t) and torch.equal(mean_s, mean_t))
        self.scale = (std_s / std_t).view(1, -1, 1, 1).to(device)
        self.shift = ((mean_s - mean_t) / std_t).view(1, -1, 1, 1).to(device)
        self.img_size = tuple(theirs.img_size)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The teacher's logits (B, K), float32, for the student's input batch ``x`` (B, C, H, W)."""
        if not self.same_range:
            x = x * self.scale + self.shift
        if tuple(x.shape[-2:]) != self.img_size:
            x = F.interpolate(x, size=self.img_size, mode="bilinear", align_corners=False, antialias=True)
        with self.precision.autocast(self.device):
            return self.model(x).float()
