"""A fine-tuning recipe fitted to the weights and the data: what ``vitkit finetune`` chooses when
no recipe is given.

- the resolution: the weights' own (no resizing of the position embeddings), images decoded a
  little larger so that the random crops have room;
- the schedule, by the training images: a batch of 8 to 32, about 30 epochs for a few hundred
  images down to 5 for tens of thousands, a warm-up of a tenth, one evaluation (and a line of the
  per-epoch table) an epoch;
- the learning rates: SGD with momentum 0.9 (the paper's fine-tuning), the new head at the peak
  rate and the encoder's blocks at layer-wise decayed rates (0.75 a layer), no weight decay;
- a multi-label labels file: the sigmoid loss.

Each choice comes with a line saying what was chosen and why, for the command to print first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..data import build_dataset, source_kind
from ..data.options import OPTIONS
from ..errors import DataError

HEAD_LR = 0.01  # SGD's peak rate (the new head's) at batch 32, scaled linearly with the batch
LAYER_DECAY = 0.75
LOAD_MARGIN = 8 / 7  # images decoded this much larger than the model's input (224 -> 256)


@dataclass
class FinetunePlan:
    """The recipe keys chosen (``sets``, for :func:`vitkit.train.load_recipe`) and a line for each.

    Attributes:
        sets: (recipe key, value) pairs, as ``--set`` takes them.
        lines: one line of explanation for each choice.
    """

    sets: list[tuple[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def batch_for(n_train: int) -> int:
    """The batch for ``n_train`` training images: a power of two from 8 to 32, at most a quarter of
    them where that is at least 8.

    Args:
        n_train: the number of training images.

    Returns:
        The batch size: 8 up to 63 images, 16 up to 127, 32 from 128.
    """
    return max(8, min(32, 2 ** int(math.log2(max(n_train // 4, 1)))))


def epochs_for(n_train: int) -> int:
    """How many epochs to fine-tune ``n_train`` images for: fewer as there are more.

    Args:
        n_train: the number of training images.

    Returns:
        30 up to 500 images, 20 up to 2,000, 10 up to 20,000, 5 beyond.
    """
    if n_train <= 500:
        return 30
    if n_train <= 2_000:
        return 20
    if n_train <= 20_000:
        return 10
    return 5


def _weights_config(init_from: str) -> Any:
    """The config of the weights to start from (the model's resolution, depth and classes)."""
    from ..hub import load_pretrained

    return load_pretrained(init_from).cfg


def plan_finetune(init_from: str, data: str, img_size: int | tuple[int, int] | None = None) -> FinetunePlan:
    """Choose the resolution, schedule and learning rates of fine-tuning ``init_from`` on ``data``.

    Args:
        init_from: the weights (anything :func:`vitkit.load_pretrained` reads).
        data: the training data (a folder, a labels file, any ``--data``).
        img_size: the resolution asked for (None: the weights').

    Returns:
        A :class:`FinetunePlan`.

    Raises:
        DataError: data of unknown size (a stream), or data that cannot be read.
        CheckpointError: weights that cannot be read.
    """
    cfg = _weights_config(init_from)
    size = (
        tuple(cfg.img_size) if img_size is None else ((img_size, img_size) if isinstance(img_size, int) else img_size)
    )
    plan = FinetunePlan(sets=[("description", f"{init_from} fine-tuned on {data} (vitkit finetune's own recipe)")])
    why = "the weights' resolution" if img_size is None else "as asked"
    overrides: dict[str, Any] = {} if img_size is None else {"img_size": list(size)}
    load = [math.ceil(s * LOAD_MARGIN) for s in size]
    decoded = "load_size" in OPTIONS.get(source_kind(data) or "", {})  # files: decoded at a size; arrays: as stored
    options = {"load_size": load} if decoded else {}
    plan.sets += [("model.overrides", overrides), ("data.name", data), ("data.options", options)]
    at = f"; images decoded at {load[0]}x{load[1]}" if decoded else ""
    plan.lines.append(f"resolution {size[0]}x{size[1]} ({why}){at}")
    # a folder or labels file has a "val" split (or carves one); a named dataset has train and test
    # only: a tenth of its training split is held out to choose the best weights, the test set unseen
    val = "val" if decoded else "minival"
    if not decoded:
        plan.sets.append(("data.minival", 0.1))
        plan.lines.append("validation: a tenth of the training split held out (data.minival), the test split unseen")
    train = build_dataset(data, "train", **options, **({} if decoded else {"minival": 0.1}))
    try:
        n = len(train)
    except (NotImplementedError, TypeError):
        raise DataError(f"{data}: fine-tuning without a recipe needs data of known size; give --config") from None
    batch, epochs = min(batch_for(n), n), epochs_for(n)
    per_epoch = max(1, n // batch)
    steps = epochs * per_epoch
    warmup = max(1, steps // 10)
    plan.sets += [
        ("train.batch_size", batch),
        ("train.steps", steps),
        ("optim.warmup_steps", warmup),
        ("log.eval_every", per_epoch),
        ("log.checkpoint_every", per_epoch),
        ("log.log_every", max(1, per_epoch // 4)),
        ("data.eval_split", val),
    ]
    plan.lines.append(
        f"schedule: {epochs} epochs of the {n} training images ({train.num_classes} classes): {steps} steps of "
        f"batch {batch}, {warmup} warm-up steps, an evaluation each epoch ({per_epoch} steps)"
    )
    lr = HEAD_LR * batch / 32
    depth = getattr(cfg, "depth", None)
    plan.sets += [
        ("optim.name", "sgd"),
        ("optim.lr", lr),
        ("optim.weight_decay", 0.0),
        ("optim.layer_decay", LAYER_DECAY),
    ]
    lowest = f", the patch embedding at {lr * LAYER_DECAY ** (depth + 1):.2g}" if depth else ""
    plan.lines.append(
        f"learning rate: the new head at {lr:.3g} (SGD, momentum 0.9, cosine), each encoder block "
        f"{LAYER_DECAY} of the one above{lowest}"
    )
    plan.sets += [("augment.crop", "inception"), ("augment.area_min", 0.25), ("augment.flip", True)]
    if getattr(train, "multilabel", False):
        plan.sets.append(("train.loss", "sigmoid"))
        plan.lines.append("loss: sigmoid (rows of several labels: each class predicted on its own)")
    return plan


SCRATCH_SIZE = 64  # from scratch on a folder: 64 px in 8x8 patches, an 8x8 grid of tokens
SCRATCH_EPOCHS = 3  # times the fine-tuning epochs: weights from scratch need more passes


def plan_scratch(data: str, img_size: int | None = None) -> FinetunePlan:
    """A recipe for training a small ViT from scratch on a folder or labels file: the demo's model
    and optimiser (``fmnist_vit``) at a size photographs keep something at, a schedule by the
    number of images, an evaluation and a checkpoint each epoch.

    Args:
        data: the training data (a folder or a labels file).
        img_size: the resolution (None: :data:`SCRATCH_SIZE`).

    Returns:
        A :class:`FinetunePlan` to apply over the ``fmnist_vit`` recipe.

    Raises:
        DataError: data of unknown size, or data that cannot be read.
    """
    size = img_size or SCRATCH_SIZE
    patch = max(2, size // 8)
    load = math.ceil(size * LOAD_MARGIN)
    train = build_dataset(data, "train", load_size=[load, load])
    try:
        n = len(train)
    except (NotImplementedError, TypeError):
        raise DataError(f"{data}: training without a recipe needs data of known size; give --config") from None
    plan = FinetunePlan(sets=[("description", f"A ViT trained from scratch on {data} (vitkit train's own recipe)")])
    plan.sets += [
        ("data.name", data),
        ("data.options", {"load_size": [load, load]}),
        ("data.eval_split", "val"),
        ("model.overrides.img_size", size),
        ("model.overrides.patch_size", patch),
        ("train.patch_drop", 0.0),
    ]
    plan.lines.append(
        f"model: the demo's ViT (width 128, 6 layers) at {size}x{size} px in {patch}x{patch} patches, from scratch; "
        f"images decoded at {load}x{load}"
    )
    batch, epochs = min(batch_for(n), n), SCRATCH_EPOCHS * epochs_for(n)
    per_epoch = max(1, n // batch)
    steps = epochs * per_epoch
    plan.sets += [
        ("train.batch_size", batch),
        ("train.steps", steps),
        ("optim.warmup_steps", max(1, steps // 10)),
        ("log.eval_every", per_epoch),
        ("log.checkpoint_every", per_epoch),
        ("log.log_every", max(1, per_epoch // 4)),
        ("augment.crop", "inception"),
        ("augment.area_min", 0.25),
        ("augment.flip", True),
    ]
    plan.lines.append(
        f"schedule: {epochs} epochs of the {n} training images ({train.num_classes} classes): {steps} steps of "
        f"batch {batch}, an evaluation and a checkpoint each epoch ({per_epoch} steps) and every 5 minutes"
    )
    if getattr(train, "multilabel", False):
        plan.sets.append(("train.loss", "sigmoid"))
        plan.lines.append("loss: sigmoid (rows of several labels: each class predicted on its own)")
    return plan


__all__ = ["FinetunePlan", "batch_for", "epochs_for", "plan_finetune", "plan_scratch"]
