"""Top-k classes of images: what ``vitkit predict`` prints, as data."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, UsageError
from .features import autocast


def _stored_metadata(model: nn.Module) -> dict[str, str]:
    """The metadata of the vitkit checkpoint a model was loaded from ({} for none)."""
    from ..checkpoint import resolve_checkpoint
    from ..checkpoint.io import read_safetensors_metadata

    report = getattr(model, "load_report", None)
    if report is None or not report.path:
        return {}
    p = resolve_checkpoint(report.path)
    if p.suffix.lower() != ".safetensors":
        return {}
    try:
        meta = read_safetensors_metadata(p)
    except CheckpointError:
        return {}
    if p.name == "model.safetensors" and "classes" not in meta:
        meta.update(hf_label_metadata(p.parent))
    return meta


def hf_label_metadata(folder: Path) -> dict[str, str]:
    """A Hugging Face folder's class names (``id2label`` of its ``config.json``) and, for a
    multi-label model vitkit exported, its thresholds, as vitkit checkpoint metadata; {} where
    the config has none or they do not list classes 0..K-1.

    Args:
        folder: the folder of ``config.json``.

    Returns:
        ``classes`` (a JSON list, names made printable), and ``multilabel``/``thresholds``.
    """
    from ..checkpoint.io import CLASSES_KEY, printable_class_names
    from ..checkpoint.peers import read_hf_dir

    try:
        cfg = read_hf_dir(folder)
    except CheckpointError:
        return {}
    labels = (cfg or {}).get("id2label")
    if not isinstance(labels, dict) or not labels:
        return {}
    names = [labels.get(str(i)) for i in range(len(labels))]
    if not all(isinstance(n, str) for n in names):
        return {}
    try:
        out = {CLASSES_KEY: printable_class_names(json.dumps(names), f"{folder / 'config.json'}: id2label")}
    except CheckpointError:
        return {}
    thresholds = cfg.get("vitkit_thresholds") if cfg.get("problem_type") == "multi_label_classification" else None
    if isinstance(thresholds, list) and len(thresholds) == len(names):
        out.update(multilabel="true", thresholds=json.dumps(thresholds))
    return out


def stored_thresholds(model: nn.Module) -> list[float] | None:
    """The per-class probability thresholds of a multi-label model, stored with its checkpoint.

    Args:
        model: a model loaded by vitkit.

    Returns:
        One threshold per output (a class is predicted when its sigmoid reaches it), or None for a
        single-label model, or thresholds that do not fit the head.
    """
    meta = _stored_metadata(model)
    if meta.get("multilabel") != "true":
        return None
    try:
        values = json.loads(meta.get("thresholds") or "null")
    except (json.JSONDecodeError, RecursionError):
        return None
    k = int(getattr(model, "num_classes", 0) or 0)
    if not isinstance(values, list) or len(values) != k:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in values):
        return None
    return [float(v) for v in values]


def stored_class_names(model: nn.Module) -> list[str] | None:
    """The class names stored with the checkpoint a model was loaded from, or None.

    Args:
        model: a model loaded by vitkit (its ``load_report`` names the file).

    Returns:
        The names of a vitkit checkpoint's metadata key "classes" (written by training), one per
        output of the head; None for a model that was not loaded from a file, a file that stores
        none, or names that do not fit the head.
    """
    k = int(getattr(model, "num_classes", 0) or 0)
    try:
        names = json.loads(_stored_metadata(model).get("classes") or "null")
    except (json.JSONDecodeError, RecursionError):
        return None
    if isinstance(names, list) and len(names) == k and all(isinstance(n, str) for n in names):
        return names
    return None


def class_names(model: nn.Module) -> list[str]:
    """The class names a loaded model was trained with: those stored with a vitkit checkpoint
    (metadata key "classes", written by training), else the class indices as strings.

    Args:
        model: a model with a classification head.

    Returns:
        One name per output of the head.
    """
    stored = stored_class_names(model)
    return stored if stored is not None else [str(i) for i in range(int(getattr(model, "num_classes", 0) or 0))]


@torch.inference_mode()
def predict(
    model: nn.Module,
    images: torch.Tensor,
    top_k: int = 5,
    classes: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    thresholds: Sequence[float] | None = None,
) -> list[list[dict[str, Any]]]:
    """The ``top_k`` most probable classes of each image of a preprocessed batch (B, C, H, W)
    (:func:`vitkit.load_images` makes one): per image, ``{"class", "index", "prob"}`` rows, most
    probable first. ``classes`` names the classes (default: :func:`class_names` of the model).
    ``precision``: "fp32", "bf16" (autocast) or "auto" (:mod:`vitkit.precision`).

    ``thresholds`` (a multi-label model: :func:`stored_thresholds`): each class is scored by its
    own sigmoid, and an image gets every class whose probability reaches the class's threshold
    (``top_k`` at most, most probable first; none may reach it), each row with its
    ``threshold``.

    Args:
        model: a classifier with a head.
        images: the preprocessed batch (B, C, H, W).
        top_k: the most classes given per image.
        classes: one name per output of the head; None: :func:`class_names` of the model.
        device: where the model runs; it is moved there and left there.
        precision: "fp32", "bf16" or "auto".
        thresholds: one probability threshold per class, for a multi-label model; None: the
            softmax's top classes.

    Returns:
        Per image, its rows ``{"class", "index", "prob"}`` (and ``"threshold"``), most probable
        first; probabilities in [0, 1].

    Raises:
        UsageError: a model without a head, ``top_k`` below 1, class names or thresholds that
            do not match the head, or outputs that are not finite.
    """
    k_model = int(getattr(model, "num_classes", 0) or 0)
    if not k_model:
        raise UsageError("the model has no classification head (num_classes=0); nothing to predict")
    if top_k < 1:
        raise UsageError(f"top_k must be positive, got {top_k}")
    names = list(classes) if classes is not None else class_names(model)
    if len(names) != k_model:
        raise UsageError(f"{len(names)} class names for a model of {k_model} classes")
    dev = torch.device(device)
    was_training = model.training
    model.eval().to(dev)
    try:
        with torch.inference_mode(), autocast(dev, precision):
            logits = torch.cat([model(x[None].to(dev)).float().cpu() for x in images])  # (B, K)
    finally:
        model.train(was_training)
    return top_classes(logits, names, top_k, thresholds)


def top_classes(
    logits: torch.Tensor, names: Sequence[str], top_k: int, thresholds: Sequence[float] | None = None
) -> list[list[dict[str, Any]]]:
    """The rows :func:`predict` gives, from a batch of logits already computed (a server's batch).

    Args:
        logits: (B, K) float logits.
        names: one name per class (K).
        top_k: the most classes given per image.
        thresholds: one probability threshold per class, for a multi-label model; None: the
            softmax's top classes.

    Returns:
        Per image, its rows ``{"class", "index", "prob"}`` (and ``"threshold"``), most probable first.

    Raises:
        UsageError: outputs that are not finite, or thresholds that do not match the head.
    """
    logits = logits.float()
    bad = (~torch.isfinite(logits).all(dim=1)).nonzero().flatten().tolist()
    if bad:  # finite weights can still overflow; a softmax of inf is NaN, not a probability
        raise UsageError(
            f"the model's outputs are not finite for image {', '.join(str(i + 1) for i in bad[:5])}"
            f"{' ...' if len(bad) > 5 else ''} of {len(logits)} (its activations overflow); no prediction is made"
        )
    if thresholds is not None:
        return _above_thresholds(logits, names, thresholds, top_k)
    probs = logits.softmax(dim=1)
    top = probs.topk(min(top_k, logits.shape[1]), dim=1)
    return [
        [{"class": names[i], "index": int(i), "prob": float(p)} for p, i in zip(vals.tolist(), idx.tolist())]
        for vals, idx in zip(top.values, top.indices)
    ]


def _above_thresholds(
    logits: torch.Tensor, names: Sequence[str], thresholds: Sequence[float], top_k: int
) -> list[list[dict[str, Any]]]:
    """Per image, the classes whose sigmoid reaches their threshold, most probable first."""
    if len(thresholds) != logits.shape[1]:
        raise UsageError(f"{len(thresholds)} thresholds for a model of {logits.shape[1]} classes")
    probs = logits.sigmoid()
    out = []
    for row in probs:
        hits = [(float(p), i) for i, p in enumerate(row.tolist()) if p >= thresholds[i]]
        hits.sort(key=lambda h: -h[0])
        out.append([{"class": names[i], "index": i, "prob": p, "threshold": thresholds[i]} for p, i in hits[:top_k]])
    return out
