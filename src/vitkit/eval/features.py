"""Run a frozen model over a dataset: logits for classification, pre-logits for linear evaluation.

Every evaluation in :mod:`vitkit.eval` goes through :func:`model_outputs`, so they all see the
images the same way: the model's own preprocessing (``model.preprocessing``: value range and
resolution), channels converted to what the model takes, no augmentation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import nn

from ..data.base import Dataset
from ..data.transforms import TransformConfig, eval_transform, match_channels
from ..errors import UsageError
from ..models.naflex import NaflexBatch, forward_naflex, naflex_patch
from ..precision import PrecisionLike, ServingPrecision, as_precision, serving_precision
from ..preprocessing import Preprocessing
from .naflex import naflex_source, to_naflex

Head = Literal["logits", "pre_logits"]


@dataclass
class ModelOutputs:
    """What :func:`model_outputs` returns: one row per image, in the order they were read.

    Attributes:
        outputs: (N, K) logits or (N, F) pre-logits, float32, on the CPU.
        labels: the dataset's labels, int64, on the CPU: class indices (N,), or multi-hot rows
            (N, K) for a multi-label source.
        seconds: wall time of the loop, in seconds: reading, transforms and the model.
    """

    outputs: torch.Tensor
    labels: torch.Tensor
    seconds: float

    @property
    def images_per_s(self) -> float:
        """Throughput of the loop: images (one a row of ``outputs``, multi-label or not) per
        second; NaN when ``seconds`` is 0."""
        return self.outputs.shape[0] / self.seconds if self.seconds > 0 else float("nan")


def model_preprocessing(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> Preprocessing:
    """The preprocessing ``model`` expects, at ``img_size`` when given.

    Loaded models carry ``model.preprocessing``; a freshly created vitkit model gets the paper's
    [-1, 1] range at its configured resolution.

    Args:
        model: a model with ``preprocessing``, a vitkit ``cfg``, or both.
        img_size: the input size in pixels, (H, W) or N for a square; None: the model's
            configured ``cfg.img_size``, or its preprocessing's size for a model without a config.

    Returns:
        A new :class:`~vitkit.preprocessing.Preprocessing`: the model's mean, std, interpolation
        and crop at that size (``model.preprocessing`` is left as it is).

    Raises:
        ValueError: a model with neither ``preprocessing`` nor a vitkit ``cfg``.
    """
    pre = getattr(model, "preprocessing", None)
    cfg = getattr(model, "cfg", None)
    if pre is None:
        if cfg is None:
            raise ValueError("the model has neither .preprocessing nor a vitkit .cfg; set model.preprocessing")
        pre = Preprocessing.for_config(cfg)
    size = pre.img_size
    if img_size is not None:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    elif cfg is not None:
        size = tuple(cfg.img_size)
    return Preprocessing(tuple(pre.mean), tuple(pre.std), tuple(size), pre.interpolation, pre.crop_pct, pre.crop_mode)


def _dataset_len(dataset: Dataset) -> int | None:
    try:
        return len(dataset)
    except (NotImplementedError, TypeError):
        return None


def _batches(
    dataset: Dataset, batch_size: int, max_images: int | None, sample_seed: int, shard: dict[str, int]
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The dataset in its order, or a seeded random ``max_images`` of it; with ``world_size > 1``
    this process's share of every batch, and ``max_images`` rounded up to whole batches."""
    n = _dataset_len(dataset)
    subsample = max_images is not None and (n is None or max_images < n)
    left = max_images if max_images is not None else None
    world_size = shard["world_size"]
    for images, labels in dataset.batches(batch_size, shuffle=subsample, seed=sample_seed, **shard):
        if left is not None:
            if world_size == 1:
                images, labels = images[:left], labels[:left]
            left -= labels.numel() if world_size == 1 else batch_size
        if labels.numel():  # a rank's batch whose images could not be read is yielded empty
            yield images, labels
        if left is not None and left <= 0:
            return  # before the source reads another batch


def model_inputs(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    img_size: int | tuple[int, int] | None = None,
    max_images: int | None = None,
    sample_seed: int = 0,
    *,
    transform: TransformConfig | None = None,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 0,
    naflex: int | None = None,
) -> Iterator[tuple[torch.Tensor | NaflexBatch, torch.Tensor]]:
    """``dataset`` as ``model`` takes it: (images (B, C, H, W) float32 resized and normalised the
    model's way, labels), lazily; the subset and resizing as in :func:`model_outputs` (a ViT of
    another size gets its position embeddings resized in place now). Also the calibration input
    of :func:`vitkit.inference.calibrate_int8`.

    Args:
        model: the model the inputs are for; its preprocessing as :func:`model_preprocessing`
            gives it, its input channels from its ``cfg`` (else the channels of the mean).
        dataset: the source to read.
        batch_size: images a batch, summed over the processes.
        device: where the images are moved before they are transformed; labels stay on the CPU.
        img_size: the input size in pixels, (H, W) or N for a square; None: the model's.
        max_images: read a random subset of this many images (rounded up to whole batches with
            ``world_size > 1``); None: every image, in the dataset's order.
        sample_seed: the seed of that subset.
        transform: replaces the model's preprocessing (training evaluates with its recipe's,
            centre crop included); ``img_size`` is then not used and the model not resized.
        rank: this process's rank, ``0..world_size - 1``.
        world_size: the processes each batch is shared among; this one reads its share.
        num_workers: decode streamed sources in that many loader processes (0: this process).
        naflex: each image at its own aspect ratio, in at most this many patches (NaFlex): the
            batches are :class:`~vitkit.models.naflex.NaflexBatch` es and the model keeps its size.
            None: as the model's ``preprocessing.naflex`` says (unless ``transform`` is given);
            0: squares.

    Returns:
        An iterator of (images (B, C, H, W) float32 on ``device``, or NaFlex batches, labels as
        the dataset gives them). A batch whose images all failed to decode is left out.

    Raises:
        ValueError: a model without preprocessing or config (:func:`model_preprocessing`).
    """
    dev = torch.device(device)
    cfg = getattr(model, "cfg", None)
    if naflex is None and transform is None:  # a model trained on NaFlex batches is evaluated so
        naflex = getattr(getattr(model, "preprocessing", None), "naflex", None)
    naflex = naflex or None  # 0: square, whatever the model was trained on
    patch = naflex_patch(model) if naflex is not None else 0
    if transform is None:
        pre = model_preprocessing(model, img_size)
        resize = naflex is None and hasattr(model, "set_img_size")  # NaFlex resamples positions per image
        if cfg is not None and tuple(cfg.img_size) != pre.img_size and resize:
            model.set_img_size(pre.img_size)
        transform = TransformConfig(
            img_size=pre.img_size,
            crop="none",
            flip=False,
            eval_crop=pre.crop_pct,
            eval_interpolation=pre.interpolation,
            mean=pre.mean,
            std=pre.std,
        )
    in_chans = cfg.in_chans if cfg is not None else len(transform.mean)

    def per_image(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        return eval_transform(match_channels(x, in_chans), replace(transform, img_size=size))

    def generate() -> Iterator[tuple[torch.Tensor | NaflexBatch, torch.Tensor]]:
        shard = {"rank": rank, "world_size": world_size, "num_workers": num_workers}
        if naflex is not None:
            source = naflex_source(dataset, patch, naflex)
            for images, y in _batches(source, batch_size, max_images, sample_seed, shard):
                on_dev = images.to(dev) if isinstance(images, torch.Tensor) else [im.to(dev) for im in images]
                yield to_naflex(on_dev, patch, naflex, per_image), y
            return
        for images, y in _batches(dataset, batch_size, max_images, sample_seed, shard):
            x = match_channels(images.to(dev, non_blocking=True), in_chans)
            yield eval_transform(x, transform), y  # (B, C, H, W) float, the model's range

    return generate()


def model_outputs(
    model: nn.Module,
    dataset: Dataset,
    head: Head = "logits",
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    precision: PrecisionLike = "fp32",
    img_size: int | tuple[int, int] | None = None,
    max_images: int | None = None,
    sample_seed: int = 0,
    progress: Callable[[int], None] | None = None,
    **options: Any,
) -> ModelOutputs:
    """Run ``model`` (in eval mode, under ``torch.inference_mode``) over ``dataset``.

    Images are resized to ``img_size`` (default: the model's) and normalised with the model's
    mean/std; a ViT whose size differs gets its position embeddings resized in place
    (``set_img_size``). With ``max_images`` smaller than the dataset, a random subset (seeded by
    ``sample_seed``) is read so that class-sorted sources still give every class. The model is
    moved to ``device`` and left there, in the training mode it had.

    Args:
        model: the model to run.
        dataset: the source to read.
        head: "logits" (``model(x)``) or "pre_logits" (``forward_head(forward_features(x),
            pre_logits=True)``: the representation few-shot and probes use).
        batch_size: images a forward pass, summed over the processes.
        device: where the model runs.
        precision: a :class:`~vitkit.precision.Precision`, or "fp32", "bf16" (autocast) or
            "auto" (:mod:`vitkit.precision`); a model from
            :func:`~vitkit.inference.prepare_inference` runs in the precision it was prepared
            for instead.
        img_size: the input size in pixels, (H, W) or N for a square; None: the model's.
        max_images: read a random subset of this many images; None: all of them.
        sample_seed: the seed of that subset.
        progress: called with the number of images of each finished batch.
        **options: ``forward``, the module to call for logits (a compiled or DDP-wrapped
            ``model``), and ``transform``, ``rank``, ``world_size``, ``num_workers``, ``naflex``
            of :func:`model_inputs`.

    Returns:
        The outputs and labels of this process's images, and the time the loop took. With
        ``world_size > 1`` a process that read no image gets empty tensors.

    Raises:
        UsageError: a ``batch_size`` or ``max_images`` below 1, an unknown ``head`` or
            ``precision``, or no images to evaluate (none in the dataset, or none that could be
            read; the message gives examples of why).
        ValueError: a model without preprocessing or config (:func:`model_preprocessing`).
    """
    if batch_size < 1:
        raise UsageError(f"batch_size must be positive, got {batch_size}")
    if max_images is not None and max_images < 1:
        raise UsageError(f"max_images must be positive, got {max_images}")
    dev = torch.device(device)
    compute = as_precision(precision, dev)
    world_size = options.get("world_size", 1)
    runner = options.pop("forward", None)
    runner = model if runner is None else runner  # not `or`: a compiled module has no truth value
    batches = model_inputs(model, dataset, batch_size, dev, img_size, max_images, sample_seed, **options)
    forward = _head_function(runner, head)
    was_training = runner.training
    runner.eval().to(dev)
    outs: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    start = time.perf_counter()
    try:
        # a model from prepare_inference has its precision built in: no autocast around it
        served = hasattr(model, "input_dtype")
        with torch.inference_mode(), nullcontext() if served else compute.autocast(dev):
            for x, y in batches:
                out = forward(x.to(model.input_dtype) if served else x)
                outs.append(out.float().cpu())
                labels.append(y.long().cpu())
                if progress is not None:
                    progress(y.numel())
    finally:
        runner.train(was_training)
    seconds = time.perf_counter() - start
    if not outs:
        if world_size > 1:  # one process's share, empty: whether all are is the caller's to ask
            return ModelOutputs(torch.empty(0, 0), torch.empty(0, dtype=torch.int64), seconds)
        skips = getattr(dataset, "skips", None)
        unread = skips.skipped if skips is not None else 0
        why = f" ({unread} could not be read, e.g. {'; '.join(skips.examples[:3])})" if unread else ""
        raise UsageError(f"{getattr(dataset, 'name', 'dataset')}: no images to evaluate{why}")
    return ModelOutputs(torch.cat(outs), torch.cat(labels), seconds)


def _head_function(model: nn.Module, head: Head) -> Callable[[torch.Tensor], torch.Tensor]:
    if head == "logits":
        return model
    if head == "pre_logits":

        def pre_logits(x: torch.Tensor | NaflexBatch) -> torch.Tensor:
            if isinstance(x, NaflexBatch):
                return forward_naflex(model, x, pre_logits=True)
            if (whole := getattr(model, "forward_pre_logits", None)) is not None:
                return whole(x)  # an inference runtime's model: the representation in one call
            return model.forward_head(model.forward_features(x), pre_logits=True)

        return pre_logits
    raise UsageError(f"head must be 'logits' or 'pre_logits', got {head!r}")


def extract_features(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    precision: PrecisionLike = "fp32",
    img_size: int | tuple[int, int] | None = None,
    max_images: int | None = None,
    progress: Callable[[int], None] | None = None,
    sample_seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-logits features (N, F) float32 and labels (N,) int64 of ``dataset``, on the CPU.

    The representation is ``forward_head(forward_features(x), pre_logits=True)`` (ViT: the
    pooled, normed token after the optional tanh pre-logits layer; BiT ResNet: the globally
    pooled feature map). See :func:`model_outputs` for preprocessing, sizes and subsampling.

    Args:
        model: a model with ``forward_features`` and ``forward_head``.
        dataset: the source to read.
        batch_size: images a forward pass.
        device: where the model runs; it is moved there and left there.
        precision: "fp32", "bf16" (autocast) or "auto" (:mod:`vitkit.precision`).
        img_size: the input size in pixels, (H, W) or N for a square; None: the model's.
        max_images: read a random subset of this many images; None: all of them.
        progress: called with the number of images of each finished batch.
        sample_seed: the seed of that subset.

    Returns:
        (features (N, F) float32, labels (N,) int64), one row per image read.

    Raises:
        UsageError: bad arguments, or no images to evaluate, as :func:`model_outputs` raises.
        ValueError: a model without preprocessing or config (:func:`model_preprocessing`).
    """
    res = model_outputs(
        model,
        dataset,
        head="pre_logits",
        batch_size=batch_size,
        device=device,
        precision=precision,
        img_size=img_size,
        max_images=max_images,
        sample_seed=sample_seed,
        progress=progress,
    )
    return res.outputs, res.labels


def served_model(
    model: nn.Module,
    precision: ServingPrecision,
    data: str | Dataset | None = None,
    split: str = "train",
    calib_images: int = 512,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    smooth: float | None = None,
) -> tuple[nn.Module, int]:
    """``model`` as :func:`vitkit.inference.prepare_inference` serves it in ``precision``, and
    the number of calibration images used. int8 with ``calib_images > 0`` calibrates static
    activation scales on that many images of ``data`` (a dataset, or a name for
    :func:`vitkit.data.build_dataset` with ``split``); 0 quantises dynamically, per batch.

    Args:
        model: the model to serve; it is moved to ``device``, and otherwise left unchanged.
        precision: "auto", "fp32", "bf16" or "int8", as :func:`~vitkit.inference.prepare_inference`
            takes it.
        data: the calibration images for static int8; not read otherwise.
        split: the split of ``data`` when it is a name.
        calib_images: how many images static int8 is calibrated on; 0: dynamic int8.
        batch_size: images a batch while the calibration images are read.
        device: where the served model runs; int8 runs on the CPU only.
        smooth: static int8: smooth the activations first with this alpha
            (:func:`vitkit.inference.smooth_activations`); None: no smoothing.

    Returns:
        (the served model, the number of calibration images used: 0 unless int8 was calibrated).

    Raises:
        UsageError: int8 on a device other than the CPU, or static int8 without ``data``.
        ValueError: as :func:`~vitkit.inference.prepare_inference` refuses, e.g. static int8
            where this torch build has no oneDNN int8 kernels (use ``calib_images=0`` there).
        DataError: a ``data`` name :func:`~vitkit.data.build_dataset` cannot read.
    """
    from ..data import build_dataset
    from ..inference import prepare_inference

    dev = torch.device(device)
    precision = serving_precision(precision, dev)
    if precision == "int8" and dev.type != "cpu":
        raise UsageError(f"int8 serving runs on the CPU's int8 kernels, not on {device}")
    calibration = None
    if precision == "int8" and calib_images > 0:
        if data is None:
            raise UsageError("static int8 calibration needs data (or calib_images=0 for dynamic int8)")
        source = build_dataset(data, split) if isinstance(data, str) else data
        calibration = list(model_inputs(model, source, batch_size=batch_size, max_images=calib_images))
    used = sum(len(x) for x, _ in calibration) if calibration else 0
    return prepare_inference(model.to(dev), precision, calibration=calibration, smooth=smooth), used
