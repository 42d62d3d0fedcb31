"""Warnings that save a user a day: one line each about data or results that look wrong.

The trainer prints them through its progress messages and records them in the run's summary.
Each is a function of the data or the metrics alone, so a resumed run says the same as one never
interrupted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..data import Dataset

FEW_IMAGES = 20  # a class with fewer training images than this is hard to learn
CHANCE_MARGIN = 0.05  # a validation score within this of chance is "not learning"


def class_counts(ds: Dataset) -> list[int] | None:
    """Images of each class in ``ds`` (a multi-label source: images with that label), or None for a
    source whose labels are not known before it is read (shards).

    Args:
        ds: the dataset.

    Returns:
        One count a class, in class order, or None.
    """
    rows = getattr(ds, "label_rows", None)
    if rows is not None:
        return [int(v) for v in rows.sum(0).tolist()]
    labels = getattr(ds, "labels", None)
    if labels is None:
        return None
    return torch.bincount(torch.as_tensor(labels, dtype=torch.int64), minlength=ds.num_classes).tolist()


def _listed(names: Sequence[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def few_images_warning(ds: Dataset, least: int = FEW_IMAGES) -> str | None:
    """A line naming the classes with fewer than ``least`` training images, or None.

    Args:
        ds: the training dataset.
        least: the fewest images a class may have without a warning.

    Returns:
        The warning (the first five such classes with their counts), or None when every class has
        enough images or the counts are not known before reading (shards).
    """
    counts = class_counts(ds)
    if counts is None:
        return None
    few = [f"{ds.classes[c]} ({n})" for c, n in enumerate(counts) if n < least]
    if not few:
        return None
    return (
        f"{len(few)} of {ds.num_classes} classes have fewer than {least} training images: {_listed(few)}; "
        "expect those to be learnt poorly, and their validation scores to be noisy; add images if you can"
    )


def second_evaluation_step(eval_every: int, steps: int) -> int:
    """The step of a run's second evaluation (its only one when there is one): where the
    near-chance check is made.

    Args:
        eval_every: steps between evaluations (0: none during the run, only at its end).
        steps: the run's training steps.

    Returns:
        ``2 * eval_every``, capped at ``steps``; ``steps`` when ``eval_every`` is 0.
    """
    return min(2 * eval_every, steps) if eval_every else steps


def chance_warning(
    score: float, num_classes: int, step: int, multilabel: bool = False, baseline: float | None = None
) -> str | None:
    """A line when a validation score is within :data:`CHANCE_MARGIN` of what guessing gets.

    Args:
        score: top-1 (single-label), or mAP (multi-label).
        num_classes: the classes; chance top-1 is 1 / num_classes.
        step: the step it was measured at.
        multilabel: whether ``score`` is an mAP.
        baseline: the mAP of scoring each class by its frequency (multi-label).

    Returns:
        The warning, or None.
    """
    if multilabel:
        if baseline is None or score > baseline + CHANCE_MARGIN:
            return None
        what, chance = "mAP", f"{100 * baseline:.1f}% scoring each class by its frequency"
    else:
        floor = 1 / num_classes
        if score > floor + CHANCE_MARGIN:
            return None
        what, chance = "top-1", f"{100 * floor:.1f}% for {num_classes} classes"
    return (
        f"validation {what} {100 * score:.1f}% at step {step} is within {100 * CHANCE_MARGIN:.0f} points of chance "
        f"({chance}): the model is not learning yet; check that the labels match the images, lower optim.lr "
        "if training diverges, or train longer"
    )


def never_predicted_warning(predicted: Sequence[int], classes: Sequence[str]) -> str | None:
    """A line naming the classes that no validation image was predicted as, or None.

    Args:
        predicted: how many validation images were predicted as each class.
        classes: the class names.

    Returns:
        The warning (the first five such classes by name), or None when every class was predicted.
    """
    never = [classes[c] for c, n in enumerate(predicted) if n == 0]
    if not never:
        return None
    return (
        f"{len(never)} of {len(classes)} classes were never predicted on the validation split: {_listed(never)}; "
        "the model ignores them (too few training images, labels that do not match the images, or too short a run)"
    )


def nonfinite_loss_advice(lr: float, batch_size: int, warmup_steps: int) -> str:
    """What a non-finite loss most likely means and what to try, in one sentence.

    Args:
        lr: the peak learning rate of the run.
        batch_size: the run's batch size.
        warmup_steps: the run's warm-up steps.

    Returns:
        The advice: a learning rate ten times lower, a longer warm-up, gradient clipping, fp32, or
        skipping such steps.
    """
    return (
        f"the learning rate {lr:.3g} is most likely too high for this model at batch {batch_size}; "
        f"try optim.lr={lr / 10:.2g}, a longer warm-up (optim.warmup_steps, now {warmup_steps}), "
        "train.grad_clip=1, or train.precision=fp32; or set train.on_nonfinite=skip to leave such steps out"
    )


__all__ = [
    "CHANCE_MARGIN",
    "FEW_IMAGES",
    "chance_warning",
    "class_counts",
    "few_images_warning",
    "never_predicted_warning",
    "nonfinite_loss_advice",
    "second_evaluation_step",
]
