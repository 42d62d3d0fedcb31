"""Classification metrics of a model with a head: top-1, top-5, per-class accuracy, confusion.

Accuracies are fractions in [0, 1]. The confusion matrix has the true class on the rows and the
predicted class on the columns, as counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.base import Dataset
from ..data.transforms import TransformConfig
from ..errors import UsageError, writing
from ..files import atomic_write
from ..models.naflex import NaflexBatch, unpatchify
from ..precision import PrecisionLike, as_precision
from .features import model_inputs, model_outputs


class NonFiniteOutputs(UsageError):
    """The model gave NaN or infinite logits (finite weights whose activations overflow): no
    metric of them means anything, so :func:`evaluate` says so instead of scoring argmax(NaN)."""


def topk_hits(scores: torch.Tensor, labels: torch.Tensor, k: int) -> int:
    """How many rows have their label among the ``k`` highest scores.

    Ties are broken towards the lower class index, as ``argmax`` does, so top-1 always agrees
    with the confusion matrix (an all-zero head predicts class 0, not an arbitrary class). A row
    whose label score is NaN counts as wrong.

    Args:
        scores: the scores (N, K) of each class.
        labels: the true class of each row (N,).
        k: how many of the highest scores count.

    Returns:
        The number of rows whose label is among their ``k`` highest scores.
    """
    labels = labels.long().to(scores.device)
    target = scores.gather(1, labels[:, None])  # (N, 1)
    index = torch.arange(scores.shape[1], device=scores.device)
    ahead = (scores > target) | ((scores == target) & (index[None] < labels[:, None]))  # (N, K)
    rank = ahead.sum(dim=1).masked_fill(target[:, 0].isnan(), scores.shape[1])  # (N,)
    return int((rank < k).sum())


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, k: int) -> float:
    """Fraction of rows (scores (N, K), labels (N,)) whose label is among the ``k`` highest
    scores, ties broken as in :func:`topk_hits`.

    Args:
        scores: the scores (N, K) of each class.
        labels: the true class of each row (N,).
        k: how many of the highest scores count.

    Returns:
        The fraction, in [0, 1].

    Raises:
        ValueError: no rows.
    """
    if scores.shape[0] == 0:
        raise ValueError("no predictions to score")
    return topk_hits(scores, labels, k) / scores.shape[0]


def confusion_matrix(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(K, K) int64 counts: row = true class, column = predicted class.

    Args:
        predictions: the predicted class of each image (N,).
        labels: the true class of each image (N,).
        num_classes: K; both inputs lie in 0..K-1.

    Returns:
        The counts (K, K), int64.
    """
    flat = labels.long() * num_classes + predictions.long()
    return torch.bincount(flat, minlength=num_classes * num_classes).view(num_classes, num_classes)


def classification_metrics(
    logits: torch.Tensor, labels: torch.Tensor, classes: Sequence[str] | None = None
) -> dict[str, Any]:
    """Metrics of logits (N, K) against labels (N,).

    Args:
        logits: the model's outputs (N, K).
        labels: the true class of each image (N,), in 0..K-1.
        classes: the K class names; None: "0", "1"...

    Returns:
        ``num_images``, ``num_classes``, ``classes``, ``top1``, ``top5`` (None with fewer than
        5 classes), ``mean_per_class`` (the mean over classes that have images), ``per_class`` (a
        list of ``{"class", "count", "accuracy"}``; accuracy None for a class without images) and
        ``confusion`` (K x K nested lists of counts, rows true, columns predicted). Accuracies
        are fractions in [0, 1].

    Raises:
        ValueError: shapes that do not match, no images, labels outside 0..K-1, or a number of
            class names other than K.
    """
    return metrics_from_counts(classification_counts(logits, labels), classes)


def classification_counts(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What the metrics are made of, as one int64 vector that processes can sum: the K x K
    confusion matrix (row-major), then the top-1 and top-5 hits."""
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"expected logits (N, K) and labels (N,), got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if labels.numel() == 0:
        raise ValueError("no predictions to score")
    num_classes = logits.shape[1]
    labels = labels.long()
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels outside 0..{num_classes - 1}")
    conf = confusion_matrix(logits.argmax(dim=1), labels, num_classes)
    hits = [topk_hits(logits, labels, 1), topk_hits(logits, labels, 5) if num_classes >= 5 else 0]
    return torch.cat([conf.flatten(), torch.tensor(hits, dtype=torch.int64)])


def metrics_from_counts(counts: torch.Tensor, classes: Sequence[str] | None = None) -> dict[str, Any]:
    """:func:`classification_metrics` from :func:`classification_counts` (summed over processes)."""
    num_classes = math.isqrt(counts.numel() - 2)
    conf = counts[:-2].view(num_classes, num_classes).cpu()
    top1_hits, top5_hits = int(counts[-2]), int(counts[-1])
    names = list(classes) if classes is not None else [str(i) for i in range(num_classes)]
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class names for {num_classes} logits")
    per_row = conf.sum(dim=1)
    correct = conf.diagonal()
    per_class = [
        {
            "class": names[i],
            "count": int(per_row[i]),
            "accuracy": (correct[i] / per_row[i]).item() if per_row[i] else None,
        }
        for i in range(num_classes)
    ]
    present = [p["accuracy"] for p in per_class if p["accuracy"] is not None]
    n = int(per_row.sum())
    return {
        "num_images": n,
        "num_classes": num_classes,
        "classes": names,
        "top1": top1_hits / n,
        "top5": top5_hits / n if num_classes >= 5 else None,
        "mean_per_class": sum(present) / len(present),
        "per_class": per_class,
        "confusion": conf.tolist(),
    }


def per_class_prf(confusion: torch.Tensor | Sequence[Sequence[int]], classes: Sequence[str]) -> list[dict[str, Any]]:
    """Precision, recall and F1 of every class, from a confusion matrix (rows true, columns
    predicted), as scikit-learn's ``precision_recall_fscore_support(average=None)`` gives them.

    Args:
        confusion: (K, K) counts.
        classes: the K class names.

    Returns:
        One ``{"class", "precision", "recall", "f1", "support", "predicted"}`` per class. A value
        whose denominator is 0 (a class never predicted: precision; without images: recall) is
        0.0, as scikit-learn's ``zero_division=0``.
    """
    conf = torch.as_tensor(confusion, dtype=torch.float64)
    return prf_rows(conf.diagonal(), conf.sum(dim=0), conf.sum(dim=1), classes)


def prf_rows(
    tp: torch.Tensor, predicted: torch.Tensor, support: torch.Tensor, classes: Sequence[str]
) -> list[dict[str, Any]]:
    """Per-class precision, recall and F1 from the counts of true positives, predictions and
    images of each class (float64, (K,)); a value whose denominator is 0 is 0.0.

    Args:
        tp: true positives per class.
        predicted: predictions per class.
        support: images (or labels) per class.
        classes: the class names.

    Returns:
        One ``{"class", "precision", "recall", "f1", "support", "predicted"}`` per class.
    """
    precision = torch.where(predicted > 0, tp / predicted.clamp(min=1), 0.0)
    recall = torch.where(support > 0, tp / support.clamp(min=1), 0.0)
    both = precision + recall
    f1 = torch.where(both > 0, 2 * precision * recall / both.clamp(min=1e-300), 0.0)
    return [
        {
            "class": name,
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
            "predicted": int(predicted[i]),
        }
        for i, name in enumerate(classes)
    ]


def _few(names: Sequence[str], most: int = 5) -> str:
    """The first ``most`` of ``names`` for a message, with how many more there are."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def class_order(
    model_classes: Sequence[str] | None,
    data_classes: Sequence[str],
    *,
    model_name: str = "the model",
    data_name: str = "the data",
    hint: str = "",
) -> tuple[list[int] | None, str | None]:
    """Which output of a model scores each class of the data, matched by class name.

    Args:
        model_classes: the class names stored with the model, one per output (None: it stores none).
        data_classes: the data's class names, one per label.
        model_name: what to call the model in messages (its file).
        data_name: what to call the data in messages.
        hint: appended to the error, to say how to score by position instead.

    Returns:
        ``(order, note)``. ``order`` is None when output i scores label i: the model stores no
        names, the names are the same in the same order, or their numbers differ (which
        :func:`evaluate` refuses by count). Otherwise ``order[c]`` is the output that scores the
        data's class ``c``, and ``note`` one line saying that the outputs are matched by name.

    Raises:
        UsageError: the model's names and the data's differ (or repeat, so that they cannot be
            matched one to one); the message names the first few that differ.
    """
    if model_classes is None or len(model_classes) != len(data_classes) or list(model_classes) == list(data_classes):
        return None, None
    model_set, data_set = set(model_classes), set(data_classes)
    if model_set == data_set and len(model_set) == len(model_classes) == len(data_classes):
        index = {name: i for i, name in enumerate(model_classes)}
        order = [index[name] for name in data_classes]
        moved = sum(1 for c, i in enumerate(order) if c != i)
        note = (
            f"{model_name} stores the classes of {data_name} in another order ({moved} of {len(order)} "
            "moved); its outputs are matched to them by name"
        )
        return order, note
    only_model = [n for n in model_classes if n not in data_set]
    only_data = [n for n in data_classes if n not in model_set]
    if only_model or only_data:
        differ = "; ".join(
            f"{where}: {_few(names)}"
            for where, names in (("only the model's", only_model), ("only the data's", only_data))
            if names
        )
        what = f"other classes than {data_name} ({differ})"
    else:
        repeated = sorted({n for names in (model_classes, data_classes) for n in names if list(names).count(n) > 1})
        what = f"class names that cannot be matched one to one with {data_name}'s (repeated: {_few(repeated)})"
    raise UsageError(f"{model_name} was trained on {what}" + (f"; {hint}" if hint else ""))


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    precision: PrecisionLike = "fp32",
    img_size: int | tuple[int, int] | None = None,
    max_images: int | None = None,
    progress: Callable[[int], None] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    logit_order: Sequence[int] | None = None,
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Classify ``dataset`` with ``model``'s head and score it.

    Returns :func:`classification_metrics` plus ``loss`` (the mean over the images of
    ``loss_of``, which returns the summed loss of logits and labels; default: softmax
    cross-entropy), ``images_per_s`` and ``seconds`` (the whole loop:
    reading, transforms and the model), ``skipped`` (images of a decoding source that could not
    be read, left out of every number) and ``skipped_examples`` (up to five of them, with why).
    Preprocessing, ``img_size`` and ``max_images`` (a seeded random subset) as in
    :func:`vitkit.eval.features.model_outputs`. The model must predict the dataset's classes; a
    model without a head is a ``ValueError`` (use few-shot or a probe).

    Several processes (``rank``, ``world_size`` in ``options``) each score their share;
    ``reduce`` sums :func:`classification_counts` over them (an all-reduce), so every process
    returns the metrics of the whole split. ``options`` go to :func:`model_outputs`.

    ``logit_order``: the output that scores each of the dataset's classes, as :func:`class_order`
    matches them by name (None: output i scores class i). The metrics are in the dataset's order.

    Args:
        model: a vitkit classifier whose head predicts the dataset's classes.
        dataset: the split to score.
        batch_size: images per forward pass.
        device: where the model runs; it is moved there and left there.
        precision: "fp32", "bf16" (autocast) or "auto" (:mod:`vitkit.precision`).
        img_size: the input size; None: the model's.
        max_images: score a seeded random subset of this many images; None: all of them.
        progress: called with the number of images of each finished batch.
        reduce: sums a tensor over the processes (an all-reduce); None: one process.
        logit_order: the output that scores each of the dataset's classes; None: the identity.
        loss_of: the summed loss of (logits, labels); None: softmax cross-entropy.
        **options: passed on to :func:`model_outputs` (``rank``, ``world_size``,
            ``num_workers``, ``forward``...).

    Returns:
        The metrics described above.

    Raises:
        UsageError: a model without a head or whose classes differ from the dataset's, a
            ``logit_order`` that is not an order of the outputs, no images on any process, or
            logits that are not finite (:class:`NonFiniteOutputs`).
    """
    if getattr(model, "num_classes", None) == 0:
        raise UsageError("the model has no classification head (num_classes=0); use few-shot or a linear probe")
    k_model = getattr(model, "num_classes", None)
    if k_model is not None and k_model != dataset.num_classes:
        raise UsageError(
            f"the model predicts {k_model} classes but {dataset.name} has {dataset.num_classes}; "
            "fine-tune it on this data, or use few-shot or a linear probe"
        )
    if logit_order is not None and sorted(logit_order) != list(range(dataset.num_classes)):
        raise UsageError(f"logit_order must order the {dataset.num_classes} outputs, got {list(logit_order)[:10]}")
    skips = getattr(dataset, "skips", None)
    before = (skips.skipped, len(skips.examples)) if skips is not None else (0, 0)
    res = model_outputs(
        model, dataset, "logits", batch_size, device, precision, img_size, max_images, 0, progress, **options
    )
    scored = res.labels.numel()
    if reduce is not None and not int(reduce(torch.tensor([scored], dtype=torch.int64))[0]):
        # every process asks, so all of them raise together (one alone would leave the rest waiting)
        raise UsageError(f"{dataset.name}: no images to evaluate on any of the processes")
    if scored and res.outputs.shape[1] != dataset.num_classes:
        raise UsageError(f"the model gives {res.outputs.shape[1]} logits but {dataset.name} has {dataset.num_classes}")
    outputs = res.outputs if logit_order is None or not scored else res.outputs[:, list(logit_order)]
    k = dataset.num_classes
    counts = classification_counts(outputs, res.labels) if scored else torch.zeros(k * k + 2, dtype=torch.int64)
    skipped = skips.skipped - before[0] if skips is not None else 0
    examples = list(skips.examples[before[1] :]) if skips is not None else []
    nonfinite = int((~torch.isfinite(outputs).all(dim=1)).sum())
    loss_sum = torch.zeros(1, dtype=torch.float64)
    if scored and not nonfinite:
        summed = loss_of or (lambda z, y: torch.nn.functional.cross_entropy(z, y, reduction="sum"))
        loss_sum += float(summed(outputs.float(), res.labels))
    if reduce is not None:  # every process reduces the same tensors, so all of them raise or none
        counts = reduce(counts)
        loss_sum = reduce(loss_sum)
        skipped, nonfinite = (int(v) for v in reduce(torch.tensor([skipped, nonfinite], dtype=torch.int64)))
    if nonfinite:  # finite weights can still overflow; the argmax of NaN logits is no prediction
        raise NonFiniteOutputs(
            f"the model's logits are not finite for {nonfinite} of the {int(counts[:-2].sum())} images scored "
            "(its activations overflow); no metrics are reported"
        )
    metrics = metrics_from_counts(counts, dataset.classes)
    metrics["loss"] = float(loss_sum[0]) / max(metrics["num_images"], 1)
    metrics["images_per_s"] = res.images_per_s
    metrics["seconds"] = res.seconds
    metrics["skipped"] = skipped  # images that could not be decoded, left out of the numbers
    metrics["skipped_examples"] = examples  # a few of them (this process's), with why
    return metrics


def write_confusion_matrix(
    confusion: Sequence[Sequence[int]] | torch.Tensor,
    classes: Sequence[str],
    out_dir: str | Path,
    stem: str = "confusion",
    title: str | None = None,
) -> tuple[Path, Path]:
    """Write the confusion matrix as ``<stem>.json`` and ``<stem>.png`` in ``out_dir``.

    The JSON holds ``classes`` and ``matrix`` (rows true, columns predicted). The picture colours
    each row by its fractions (so rare classes show as clearly as common ones), prints the counts
    when there are at most 20 classes, and names the classes on the axes when there are at most
    60. Needs matplotlib (``pip install 'vitkit[plot]'``); the JSON is written first either way.

    Args:
        confusion: the counts (K, K), rows true, columns predicted.
        classes: the K class names.
        out_dir: the folder to write in (made if missing).
        stem: the files' name without suffix.
        title: the picture's title; None: "confusion matrix".

    Returns:
        (json path, png path).

    Raises:
        ValueError: a matrix that is not square, or does not fit the class names.
        ImportError: matplotlib is not installed (after the JSON is written).
    """
    conf = torch.as_tensor(confusion, dtype=torch.int64)
    k = conf.shape[0]
    if conf.shape != (k, k) or len(classes) != k:
        raise ValueError(f"confusion matrix {tuple(conf.shape)} does not fit {len(classes)} classes")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
    payload = {"classes": list(classes), "rows": "true", "columns": "predicted", "matrix": conf.tolist()}
    with writing(json_path):
        atomic_write(json_path, lambda f: f.write(json.dumps(payload, indent=1)), mode="w")

    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("matplotlib is needed for the confusion-matrix picture: pip install 'vitkit[plot]'") from None

    rows = conf.sum(dim=1, keepdim=True).clamp(min=1)
    frac = (conf.double() / rows).numpy()
    side = min(4.0 + 0.35 * k, 24.0)
    fig = Figure(figsize=(side + 1.5, side), layout="constrained")  # no pyplot: no global state
    ax = fig.add_subplot()
    im = ax.imshow(frac, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    if k <= 60:
        ax.set_xticks(range(k), labels=list(classes), rotation=90, fontsize=8)
        ax.set_yticks(range(k), labels=list(classes), fontsize=8)
    if k <= 20:
        for i in range(k):
            for j in range(k):
                if conf[i, j]:
                    color = "white" if frac[i, j] > 0.5 else "black"
                    ax.text(j, i, str(int(conf[i, j])), ha="center", va="center", fontsize=7, color=color)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title or "confusion matrix")
    with writing(png_path):
        atomic_write(png_path, lambda f: fig.savefig(f, format="png", dpi=100))
    return json_path, png_path


@dataclass
class ScoredImages:
    """Every image of a pass scored one by one, and the worst of them kept to be looked at."""

    logits: torch.Tensor  # (N, K) float32
    targets: torch.Tensor  # (N,) int64 class indices, or (N, K) float multi-hot rows
    losses: torch.Tensor  # (N,) the loss of each image
    worst_images: torch.Tensor  # (W, C, H, W) float in [0, 1]: the model's input, unnormalised
    worst_index: torch.Tensor  # (W,) int64 rows of ``logits`` of those images, highest loss first


@torch.inference_mode()
def scored_images(
    model: nn.Module,
    dataset: Dataset,
    loss_per_image: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    transform: TransformConfig | None = None,
    worst: int = 16,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    precision: PrecisionLike = "fp32",
    max_images: int | None = None,
    num_workers: int = 0,
    naflex: int | None = None,
) -> ScoredImages:
    """Run ``model`` over ``dataset`` (one process, in eval mode) and keep every image's logits
    and loss, and the ``worst`` images (highest loss) as the model saw them.

    Args:
        model: a classifier.
        dataset: the images; its labels are class indices (B,) or multi-hot rows (B, K).
        loss_per_image: (logits (B, K), targets) -> the loss of each image (B,).
        transform: the evaluation transform (default: the model's preprocessing).
        worst: how many of the highest-loss images to keep.
        batch_size: images a forward pass.
        device: where the model runs.
        precision: a :class:`~vitkit.precision.Precision`, or "fp32", "bf16" or "auto".
        max_images: a seeded random subset of this many (as :func:`model_outputs`).
        num_workers: decoding processes of a streamed source.
        naflex: each image at its own aspect ratio in at most this many patches (NaFlex); the
            worst images are then shown stretched to the model's square size.

    Returns:
        A :class:`ScoredImages`.
    """
    dev = torch.device(device)
    compute = as_precision(precision, dev)
    was_training = model.training
    model.eval().to(dev)
    mean = torch.tensor(transform.mean if transform else model.preprocessing.mean).view(1, -1, 1, 1)
    std = torch.tensor(transform.std if transform else model.preprocessing.std).view(1, -1, 1, 1)
    logits, targets, losses = [], [], []
    kept_images = torch.empty(0)
    kept_loss, kept_index = torch.empty(0), torch.empty(0, dtype=torch.int64)
    seen = 0
    batches = model_inputs(
        model, dataset, batch_size, dev, None, max_images, 0, transform=transform, num_workers=num_workers,
        naflex=naflex,
    )  # fmt: skip
    try:
        for x, y in batches:
            with compute.autocast(dev):
                z = model(x).float().cpu()
            loss = loss_per_image(z, y).float().cpu()
            logits.append(z), targets.append(y), losses.append(loss)
            if isinstance(x, NaflexBatch):  # each image as the model saw it, stretched to one size for the grid
                x = _naflex_images(x, model)
            shown = ((x.float().cpu() * std + mean).clamp(0, 1) * 255).round().to(torch.uint8)  # (B, C, H, W)
            pool_loss = torch.cat([kept_loss, loss])
            pool_images = torch.cat([kept_images, shown]) if len(kept_images) else shown
            pool_index = torch.cat([kept_index, torch.arange(seen, seen + len(y))])
            top = pool_loss.topk(min(worst, len(pool_loss))).indices
            kept_loss, kept_images, kept_index = pool_loss[top], pool_images[top], pool_index[top]
            seen += len(y)
    finally:
        model.train(was_training)
    if not logits:
        raise UsageError(f"{dataset.name}: no images to score")
    worst_images = kept_images.float() / 255
    return ScoredImages(torch.cat(logits), torch.cat(targets), torch.cat(losses), worst_images, kept_index)


def _naflex_images(batch: NaflexBatch, model: nn.Module) -> torch.Tensor:
    """A NaFlex batch's images put back together and resized to the model's size: (B, C, H, W)."""
    patch, size = int(model.cfg.patch_size[0]), tuple(model.cfg.img_size)
    images = [unpatchify(batch, i, patch)[None].float() for i in range(len(batch))]
    return torch.cat([F.interpolate(im, size=size, mode="bilinear", antialias=True) for im in images])


def write_image_grid(images: torch.Tensor, titles: Sequence[str], path: str | Path, title: str = "") -> Path:
    """A grid of images (N, C, H, W) in [0, 1], each with its title, as a PNG (atomically).

    Args:
        images: the images; 1 or 3 channels.
        titles: one caption per image (a newline splits it in two lines).
        path: the PNG to write.
        title: the caption of the whole figure.

    Returns:
        ``path``.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("matplotlib is needed for the image grid: pip install 'vitkit[plot]'") from None
    n = len(images)
    cols = min(n, 4) or 1
    rows = max(1, math.ceil(n / cols))
    fig = Figure(figsize=(2.6 * cols, 2.9 * rows), layout="constrained")
    for i in range(rows * cols):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.axis("off")
        if i < n:
            img = images[i].float().permute(1, 2, 0).numpy()  # (H, W, C)
            ax.imshow(img[..., 0] if img.shape[2] == 1 else img, cmap="gray" if img.shape[2] == 1 else None)
            ax.set_title(titles[i], fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    with writing(path):
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=90))
    return path
