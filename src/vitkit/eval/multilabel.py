"""Metrics of multi-label classifiers: average precision, mAP, and F1 at per-class thresholds.

A multi-label model scores every class on its own (a sigmoid per class); an image's targets are a
multi-hot row (N, K). Average precision is scikit-learn's ``average_precision_score``: the
precision at each distinct score, weighted by the recall it adds (no interpolation). mAP is
"macro" (the mean of the classes' APs, over the classes that have a positive image) or "micro"
(one AP over every (image, class) pair). A multi-label model predicts the classes whose
probability reaches the class's threshold, chosen where the class's F1 is highest on a held-out
split (the minival) and stored with the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..data.base import Dataset
from ..errors import UsageError
from ..precision import PrecisionLike
from .classify import prf_rows
from .features import model_outputs

DEFAULT_THRESHOLD = 0.5  # the threshold of a class without a positive image to choose one on


def _ranked(scores: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(true positives, false positives, score) at each distinct score, from the highest down."""
    order = scores.double().argsort(descending=True)
    s, t = scores.double()[order], targets.double()[order]
    last = torch.ones_like(s, dtype=torch.bool)
    last[:-1] = s[1:] != s[:-1]  # the last position of each run of tied scores
    tp = t.cumsum(0)[last]
    fp = (1 - t).cumsum(0)[last]
    return tp, fp, s[last]


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> float | None:
    """Average precision of one class (scikit-learn's ``average_precision_score``).

    Args:
        scores: (N,) scores of the class (higher: more likely).
        targets: (N,) 0/1.

    Returns:
        The AP, or None when no image is positive (it is not defined).
    """
    positives = float(targets.double().sum())
    if positives == 0:
        return None
    tp, fp, _ = _ranked(scores, targets)
    precision = tp / (tp + fp)
    recall = tp / positives
    gained = torch.diff(recall, prepend=torch.zeros(1, dtype=recall.dtype))
    return float((gained * precision).sum())


def multilabel_ap(scores: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    """Per-class AP and mAP of scores (N, K) against multi-hot targets (N, K).

    Args:
        scores: (N, K) logits or probabilities.
        targets: (N, K) 0/1.

    Returns:
        ``per_class_ap`` (K values, None for a class without a positive image), ``map_macro``
        (their mean over the classes that have one) and ``map_micro`` (one AP of all pairs).

    Raises:
        ValueError: scores and targets that are not both (N, K).
    """
    if scores.shape != targets.shape or scores.ndim != 2:
        raise ValueError(f"expected scores and targets (N, K), got {tuple(scores.shape)} and {tuple(targets.shape)}")
    per_class = [average_precision(scores[:, c], targets[:, c]) for c in range(scores.shape[1])]
    defined = [ap for ap in per_class if ap is not None]
    return {
        "per_class_ap": per_class,
        "map_macro": sum(defined) / len(defined) if defined else None,
        "map_micro": average_precision(scores.flatten(), targets.flatten()),
    }


def best_thresholds(probs: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """For every class, the probability threshold at which its F1 is highest on these images.

    Args:
        probs: (N, K) probabilities.
        targets: (N, K) 0/1.

    Returns:
        K thresholds: a class is predicted when its probability is at least its threshold. The
        threshold is halfway between the lowest score kept and the next one down, so that a
        score close to it falls the same way; :data:`DEFAULT_THRESHOLD` for a class without a
        positive image.
    """
    out = []
    for c in range(probs.shape[1]):
        p, t = probs[:, c], targets[:, c]
        positives = float(t.double().sum())
        if positives == 0:
            out.append(DEFAULT_THRESHOLD)
            continue
        tp, fp, s = _ranked(p, t)
        f1 = 2 * tp / (tp + fp + positives)
        best = int(f1.argmax())
        below = float(s[best + 1]) if best + 1 < len(s) else 0.0
        out.append((float(s[best]) + below) / 2)
    return out


def multilabel_prf(predicted: torch.Tensor, targets: torch.Tensor, classes: Sequence[str]) -> list[dict[str, Any]]:
    """Precision, recall and F1 of each class of 0/1 predictions (N, K) against targets (N, K), as
    scikit-learn's ``precision_recall_fscore_support(average=None, zero_division=0)``.

    Args:
        predicted: (N, K) 0/1 predictions.
        targets: (N, K) 0/1.
        classes: the K class names.

    Returns:
        One ``{"class", "precision", "recall", "f1", "support", "predicted"}`` per class.
    """
    p, t = predicted.double(), targets.double()
    return prf_rows((p * t).sum(0), p.sum(0), t.sum(0), classes)


def frequency_baseline(train_targets: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    """The mAP of a model that ignores the image and scores each class by its frequency in the
    training images: what a multi-label model must beat to have learnt anything from pixels.

    Args:
        train_targets: (M, K) multi-hot rows of the training images.
        targets: (N, K) multi-hot rows of the images scored.

    Returns:
        :func:`multilabel_ap` of those constant scores.
    """
    freq = train_targets.double().mean(0)  # (K,)
    return multilabel_ap(freq.expand(targets.shape[0], -1), targets)


def multilabel_metrics(
    logits: torch.Tensor,
    targets: torch.Tensor,
    classes: Sequence[str],
    thresholds: Sequence[float] | None = None,
) -> dict[str, Any]:
    """mAP, per-class AP, thresholds and F1 of logits (N, K) against multi-hot targets (N, K).

    Args:
        logits: (N, K) the model's outputs (a sigmoid makes them probabilities).
        targets: (N, K) 0/1.
        classes: the K class names.
        thresholds: the probability threshold of each class; None: chosen on these images
            (:func:`best_thresholds`), which makes the F1 an optimistic estimate.

    Returns:
        :func:`multilabel_ap`'s keys, ``thresholds``, ``per_class`` (:func:`multilabel_prf` at
        the thresholds, each with its ``ap`` and ``threshold``), ``f1_macro``, ``num_images``
        and ``num_classes``.
    """
    targets = targets.float()
    probs = logits.float().sigmoid()
    out = multilabel_ap(logits.float(), targets)
    chosen = list(thresholds) if thresholds is not None else best_thresholds(probs, targets)
    predicted = probs >= torch.tensor(chosen, dtype=probs.dtype)
    per_class = multilabel_prf(predicted, targets, classes)
    for row, ap, th in zip(per_class, out["per_class_ap"], chosen):
        row["ap"], row["threshold"] = ap, th
    out.update(
        thresholds=chosen,
        per_class=per_class,
        f1_macro=sum(r["f1"] for r in per_class) / len(per_class),
        num_images=int(targets.shape[0]),
        num_classes=int(targets.shape[1]),
        classes=list(classes),
    )
    return out


def evaluate_multilabel(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    precision: PrecisionLike = "fp32",
    max_images: int | None = None,
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    thresholds: Sequence[float] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Score a multi-label ``dataset`` (labels are multi-hot rows) with ``model``'s head.

    Every process scores the whole split (AP ranks all images together, so it is not a sum of
    per-process counts). Thresholds are chosen on this split unless ``thresholds`` gives them
    (those a model stored, chosen on its minival: the honest F1 of a test split).

    Args:
        model: a classifier with one output per class.
        dataset: multi-hot labels (N, K).
        batch_size: images a forward pass.
        device: where the model runs.
        precision: "fp32", "bf16" or "auto".
        max_images: a seeded random subset of this many.
        loss_of: (logits, targets) -> the summed loss (default: sigmoid cross-entropy summed).
        thresholds: each class's probability threshold; None: chosen on this split.
        options: ``forward``, ``transform``, ``num_workers`` of :func:`model_outputs`.

    Returns:
        :func:`multilabel_metrics` plus ``loss`` (mean per image), ``baseline_map_macro`` (the mAP of
        scoring each class by a constant: the classes' mean prevalence), ``seconds`` and ``skipped``.

    Raises:
        UsageError: labels that are not multi-hot rows (N, K), or logits that are not finite
            (:class:`~vitkit.eval.classify.NonFiniteOutputs`).
    """
    options = {k: v for k, v in options.items() if k not in ("rank", "world_size", "reduce")}
    res = model_outputs(model, dataset, "logits", batch_size, device, precision, None, max_images, **options)
    targets = res.labels.float()
    if targets.ndim != 2:
        raise UsageError(f"{dataset.name}: multi-label metrics need multi-hot labels (N, K)")
    if not torch.isfinite(res.outputs).all():
        from .classify import NonFiniteOutputs

        raise NonFiniteOutputs("the model's logits are not finite (its activations overflow); no metrics are reported")
    metrics = multilabel_metrics(res.outputs, targets, dataset.classes, thresholds=thresholds)
    summed = loss_of or (lambda z, y: nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum"))
    metrics["loss"] = float(summed(res.outputs, targets)) / max(len(targets), 1)
    metrics["baseline_map_macro"] = frequency_baseline(targets, targets)["map_macro"]  # the mean prevalence
    metrics["seconds"] = res.seconds
    skips = getattr(dataset, "skips", None)
    metrics["skipped"] = skips.skipped if skips is not None else 0
    return metrics


__all__ = [
    "DEFAULT_THRESHOLD",
    "average_precision",
    "best_thresholds",
    "evaluate_multilabel",
    "frequency_baseline",
    "multilabel_ap",
    "multilabel_metrics",
    "multilabel_prf",
]
