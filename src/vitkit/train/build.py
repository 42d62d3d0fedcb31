"""The model a run starts from: one builder for training, fine-tuning and ``vitkit reproduce``.

:func:`build_model` makes the model a recipe describes for data of ``num_classes`` classes and
``in_chans`` channels, before any step and before any device placement or wrapper (DDP, FSDP,
``torch.compile``): seeded by the recipe's seed, built from the registry or from ``model.init_from``,
initialised as the recipe says (``model.init``, ``train.head_bias_init``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..errors import RecipeError, VitkitError
from ..hub import load_pretrained
from ..models.init import mimetic_init_
from ..models.registry import create_model
from .config import Recipe


def build_model(
    recipe: Recipe, num_classes: int, in_chans: int, notes: Callable[[str], None] | None = None
) -> nn.Module:
    """The model ``recipe`` trains, as it is before its first step (in train mode, on the CPU).

    The global torch generator is seeded with ``recipe.seed`` first, so the same recipe gives the
    same weights wherever it is built. ``model.overrides`` win over the data's class and channel
    counts; a model started from ``model.init_from`` takes the file's channels and resizes its
    position embedding by ``model.pos_embed_mode``. The classifier's bias is then set to
    ``train.head_bias_init`` (default: 0, or ``-log(K)`` for ``train.loss: sigmoid``, so that each
    class starts at probability 1/K).

    Args:
        recipe: the run's recipe.
        num_classes: the classes of the training data.
        in_chans: the channels of the training data.
        notes: called with each note on what a pretrained file could not map (None: dropped).

    Returns:
        The model.

    Raises:
        RecipeError: ``model.overrides.num_classes`` is below ``num_classes``, or the model
            refuses the overrides.
    """
    r = recipe
    torch.manual_seed(r.seed)
    overrides = dict(r.model.overrides)
    overrides.setdefault("num_classes", num_classes)
    if overrides["num_classes"] < num_classes:
        raise RecipeError(
            f"model.overrides.num_classes {overrides['num_classes']} is smaller than the "
            f"{num_classes} classes of {r.data.name}"
        )
    try:
        if r.model.init_from:
            model = load_pretrained(r.model.init_from, pos_embed_mode=r.model.pos_embed_mode, **overrides)
            for note in model.load_report.notes:
                if notes is not None:
                    notes(f"{r.model.init_from}: {note}")
            model.train()
        else:
            overrides.setdefault("in_chans", in_chans)
            model = create_model(r.model.name, **overrides)
            if r.model.init == "mimetic":
                mimetic_init_(model, seed=r.seed)
    except ValueError as e:  # the model's own checks, of the overrides with the file's or the data's values
        if isinstance(e, VitkitError):
            raise
        raise RecipeError(f"model.overrides: {e}") from None
    set_head_bias(model, r)
    return model


def set_head_bias(model: nn.Module, recipe: Recipe) -> None:
    """Set the classifier's bias (and a distillation head's) as ``recipe`` asks: to
    ``train.head_bias_init``, or to ``-log(K)`` for ``train.loss: sigmoid`` when it says nothing;
    left as built otherwise.

    Args:
        model: the model, changed in place.
        recipe: the run's recipe.
    """
    bias = recipe.train.head_bias_init
    if bias is None and recipe.train.loss == "sigmoid":
        bias = -math.log(model.num_classes)
    if bias is None:
        return
    for head in (getattr(model, "head", None), getattr(model, "head_dist", None)):
        if head is not None:
            nn.init.constant_(head.bias, bias)
