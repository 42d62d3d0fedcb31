"""Top-k classes of images: what ``vitkit predict`` prints, as data."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import torch
from torch import nn

from ..checkpoint.values import number, printable
from ..errors import CheckpointError, DataError, UsageError
from ..models.naflex import NaflexBatch
from ..precision import PrecisionLike, as_precision

if TYPE_CHECKING:
    from PIL import Image


def _stored_metadata(model: nn.Module) -> dict[str, str]:
    """The metadata of the vitkit checkpoint a model was loaded from ({} for none) or what an
    exported file recorded of it, and over it that of the adapter file applied onto it (a
    fine-tune's class names)."""
    adapter = getattr(model, "adapter_metadata", None) or {}
    exported = getattr(model, "exported_metadata", None) or {}  # an ONNX or .pt2 file's (vitkit.export)
    return {**_checkpoint_metadata(model), **exported, **adapter}


def _checkpoint_metadata(model: nn.Module) -> dict[str, str]:
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
        from ..checkpoint.peers import hf_label_metadata

        with contextlib.suppress(CheckpointError):  # loading checked them against the file's head: one
            meta.update(hf_label_metadata(p.parent, int(getattr(model, "num_classes", 0) or 0)))  # replaced since
    return meta


DECODE_KEYS = ("load_size", "resize")
"""The data options that decide how an image file becomes pixels, kept with a run's best weights."""


def stored_decoding(model: nn.Module) -> dict[str, Any]:
    """How the run that made a model's weights decoded its validation images (``load_size``,
    ``resize``), so that scoring the same images again gives the same pixels and the same top-1.

    Args:
        model: a model loaded by vitkit.

    Returns:
        The data options (empty for weights that did not come from a run, or a run that kept
        none of them).
    """
    try:
        stored = json.loads(_stored_metadata(model).get("decoding") or "{}")
    except (json.JSONDecodeError, RecursionError):
        return {}
    return {k: v for k, v in stored.items() if k in DECODE_KEYS} if isinstance(stored, dict) else {}


def stored_thresholds(model: nn.Module) -> list[float] | None:
    """The per-class probability thresholds of a multi-label model, stored with its checkpoint.

    Args:
        model: a model loaded by vitkit.

    Returns:
        One threshold per output (a class is predicted when its sigmoid reaches it), or None for a
        single-label model or a multi-label one stored without thresholds.

    Raises:
        CheckpointError: stored thresholds that are not one number in [0, 1] per output of the
            head, naming the file (they are not dropped: the predictions would change unsaid).
    """
    meta = _stored_metadata(model)
    if meta.get("multilabel") != "true":
        return None
    text = meta.get("thresholds") or "null"
    k = int(getattr(model, "num_classes", 0) or 0)
    where = _metadata_source(model, "thresholds")
    try:
        values = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise CheckpointError(
            f"{where}: metadata 'thresholds' is not JSON ({printable(text, 40)!r}); "
            f"it must be a list of {k} numbers in [0, 1]"
        ) from None
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != k:
        what = f"{len(values)} values" if isinstance(values, list) else f"a {type(values).__name__}"
        raise CheckpointError(
            f"{where}: metadata 'thresholds' must be a list of {k} numbers (one per output of the head), got {what}"
        )
    return [number(v, where, f"metadata 'thresholds'[{i}]", 0.0, 1.0) for i, v in enumerate(values)]


def _metadata_source(model: nn.Module, key: str) -> str:
    """The file whose metadata :func:`_stored_metadata` read ``key`` from (for messages)."""
    if key in (getattr(model, "adapter_metadata", None) or {}):
        return str(getattr(model, "adapter_source", None) or "the adapter file")
    report = getattr(model, "load_report", None)
    return str(getattr(report, "path", "") or "the model's checkpoint")


def stored_class_names(model: nn.Module) -> list[str] | None:
    """The class names of a model: its ``class_names`` attribute (which
    :func:`vitkit.load_pretrained` sets from the file, and a caller may set), else those stored
    with the checkpoint it was loaded from, or None.

    Args:
        model: a model, loaded by vitkit or not.

    Returns:
        One name per output of the head: the attribute, or the names of a vitkit checkpoint's
        metadata key "classes" (written by training), or a Hugging Face folder's ``id2label``;
        None where there are none, or names that do not fit the head.
    """
    k = int(getattr(model, "num_classes", 0) or 0)
    names = getattr(model, "class_names", None)
    if names is None:
        try:
            names = json.loads(_stored_metadata(model).get("classes") or "null")
        except (json.JSONDecodeError, RecursionError):
            return None
    if isinstance(names, (list, tuple)) and len(names) == k and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def class_names(model: nn.Module) -> list[str]:
    """The class names a loaded model was trained with (:func:`stored_class_names`), else the
    class indices as strings.

    Args:
        model: a model with a classification head.

    Returns:
        One name per output of the head.
    """
    stored = stored_class_names(model)
    return stored if stored is not None else [str(i) for i in range(int(getattr(model, "num_classes", 0) or 0))]


ImageInput = Union[str, Path, "Image.Image"]
"""One image for :func:`predict`: a file (anything Pillow reads) or a Pillow image."""


def as_inputs(model: nn.Module, images: Any) -> torch.Tensor:
    """What :func:`predict` is given, as the model's input batch (B, C, H, W): a tensor as it
    is; image files and Pillow images (one, or a sequence) read and preprocessed with the model's
    own ``preprocessing`` (the paper's [-1, 1] at its size where it has none), every file read
    before any is used.

    Args:
        model: the model the images are for (its ``preprocessing`` and ``cfg.in_chans``).
        images: a preprocessed batch, or an image file or Pillow image, or a sequence of them.

    Returns:
        The preprocessed batch.

    Raises:
        DataError: a file that cannot be read as an image, or no images.
        UsageError: something that is neither a tensor, a path nor a Pillow image.
    """
    from ..preprocessing import Preprocessing, prepare_images

    if isinstance(images, torch.Tensor):
        return images
    cfg = getattr(model, "cfg", None)
    pre = getattr(model, "preprocessing", None) or Preprocessing.for_config(cfg)
    return prepare_images(_named_images(images), pre, int(getattr(cfg, "in_chans", 3))).inputs


def naflex_inputs(model: nn.Module, images: Any, max_tokens: int) -> list[NaflexBatch]:
    """Image files or Pillow images as NaFlex batches of one image each: every image at its own
    aspect ratio, resized whole to the largest grid of the model's patches that ``max_tokens``
    allows, then prepared with the model's ``preprocessing`` at that size.

    Args:
        model: a ViT that takes NaFlex batches (:func:`~vitkit.models.naflex.check_naflex_model`).
        images: an image file or Pillow image, or a sequence of them.
        max_tokens: the most patches an image may have.

    Returns:
        One batch per image, in order.

    Raises:
        DataError: a file that cannot be read as an image, or no images.
        UsageError: a model that cannot take NaFlex batches, or ``max_tokens`` below 1.
    """
    from dataclasses import replace

    from ..models.naflex import collate, fit_grid, naflex_patch
    from ..preprocessing import Preprocessing, prepare_images

    patch = naflex_patch(model)
    if max_tokens < 1:
        raise UsageError(f"naflex: max_tokens must be at least 1 (one patch), got {max_tokens}")
    pre = getattr(model, "preprocessing", None) or Preprocessing.for_config(model.cfg)
    batches = []
    for name, im in _named_images(images):
        rows, cols = fit_grid(im.size[1], im.size[0], patch, max_tokens)
        x = prepare_images([(name, im)], replace(pre, img_size=(rows * patch, cols * patch)), model.cfg.in_chans)
        batches.append(collate([x.inputs[0]], patch, max_tokens, fitted=True))
    return batches


def _named_images(images: Any) -> list[tuple[str, Any]]:
    """(name, Pillow image) of each file or Pillow image given, every file read before any is used."""
    from PIL import Image

    from ..preprocessing import read_image

    items = [images] if isinstance(images, (str, Path, Image.Image)) else list(images)
    named = []
    for i, item in enumerate(items):
        if isinstance(item, (str, Path)):
            named.append((Path(item).stem, read_image(item)))
        elif isinstance(item, Image.Image):
            named.append((f"image {i + 1}", item))
        else:
            raise UsageError(f"image {i + 1}: expected a file path or a PIL image, got {type(item).__name__}")
    if not named:
        raise DataError("no images given")
    return named


@torch.inference_mode()
def predict(
    model: nn.Module,
    images: torch.Tensor | ImageInput | Sequence[ImageInput],
    top_k: int = 5,
    classes: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    precision: PrecisionLike = "fp32",
    thresholds: Sequence[float] | str | None = "stored",
    naflex: int | None = None,
) -> list[list[dict[str, Any]]]:
    """The ``top_k`` most probable classes of each image, named by the model's class names, as
    ``vitkit predict`` prints them: per image, ``{"class", "index", "prob"}`` rows, most probable
    first.

    ``images`` are image files or Pillow images (one, or a list), which are read and preprocessed
    with the model's own ``preprocessing`` (:func:`as_inputs`), or a batch (B, C, H, W) already
    preprocessed (:func:`vitkit.load_images` makes one). ``classes`` names the classes (default:
    :func:`class_names` of the model: the names stored with its weights). ``precision``: a
    :class:`~vitkit.precision.Precision`, or "fp32", "bf16" (autocast) or "auto" (:mod:`vitkit.precision`).

    A multi-label model (``thresholds`` "stored": the ones stored with its weights,
    :func:`stored_thresholds`; or given) scores each class by its own sigmoid, and an image gets
    every class whose probability reaches the class's threshold (``top_k`` at most, most probable
    first; none may reach it), each row with its ``threshold``.

    Args:
        model: a classifier with a head (:func:`vitkit.load_pretrained` gives it its class names
            and preprocessing).
        images: image files or Pillow images, one or a sequence, or a preprocessed batch.
        top_k: the most classes given per image.
        classes: one name per output of the head; None: :func:`class_names` of the model.
        device: where the model runs; it is moved there and left there.
        precision: a :class:`~vitkit.precision.Precision`, or "fp32", "bf16" or "auto".
        thresholds: "stored" (a multi-label model's own; none: the softmax), one probability
            threshold per class, or None: the softmax's top classes.
        naflex: see each image at its own aspect ratio, in at most this many patches
            (:func:`naflex_inputs`; files and Pillow images only); None: as the model's
            ``preprocessing.naflex`` says (a model trained on NaFlex batches); 0: resized to the
            model's size.

    Returns:
        Per image, its rows ``{"class", "index", "prob"}`` (and ``"threshold"``), most probable
        first; probabilities in [0, 1].

    Raises:
        UsageError: a model without a head, ``top_k`` below 1, class names or thresholds that
            do not match the head, images of another type, or outputs that are not finite.
        DataError: an image file that cannot be read.
    """
    if isinstance(thresholds, str):
        if thresholds != "stored":
            raise UsageError(f"thresholds: 'stored', a list of probabilities or None, got {thresholds!r}")
        thresholds = stored_thresholds(model)
    if naflex is None and not isinstance(images, torch.Tensor):  # as the model was trained: NaFlex or squares
        naflex = getattr(getattr(model, "preprocessing", None), "naflex", None)
    naflex = naflex or None  # 0: squares
    if naflex is not None and isinstance(images, torch.Tensor):
        raise UsageError("naflex: give image files or Pillow images; a preprocessed batch is already square")
    images = as_inputs(model, images) if naflex is None else naflex_inputs(model, images, naflex)
    k_model = int(getattr(model, "num_classes", 0) or 0)
    if not k_model:
        raise UsageError("the model has no classification head (num_classes=0); nothing to predict")
    if top_k < 1:
        raise UsageError(f"top_k must be positive, got {top_k}")
    names = list(classes) if classes is not None else class_names(model)
    if len(names) != k_model:
        raise UsageError(f"{len(names)} class names for a model of {k_model} classes")
    dev = torch.device(device)
    compute = as_precision(precision, dev)
    was_training = model.training
    model.eval().to(dev)
    try:
        with torch.inference_mode(), compute.autocast(dev):
            one = (lambda x: x.to(dev)) if naflex is not None else (lambda x: x[None].to(dev))
            logits = torch.cat([model(one(x)).float().cpu() for x in images])  # (B, K)
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
