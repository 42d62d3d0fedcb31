"""The one model builder: what a recipe's model is at step 0, for training, fine-tuning and
``reproduce`` alike."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import RecipeError, VitkitError
from ..models.adapters import adapter_spec_from_dict, apply_adapters
from ..models.init import mimetic_init_
from ..models.registry import create_model
from .config import Recipe


def build_model(recipe: Recipe, num_classes: int, in_chans: int, notes: list[str] | None = None) -> nn.Module:
    """The recipe's model before its first step: built (or loaded from ``model.init_from``) with the
    recipe's overrides, initialised as the recipe says and with its head's bias set (0 for a softmax
    head, ``-log K`` for a sigmoid one, or ``train.head_bias_init``); with ``finetune.adapter``, its
    weights frozen under LoRA or DoRA adapters. Torch's generator is seeded
    by ``recipe.seed`` first, so that the weights are a function of it.

    Args:
        recipe: the recipe.
        num_classes: the classes of the data (the head's size unless ``model.overrides`` sets it).
        in_chans: the data's channels (a model built from scratch takes them).
        notes: where the loader's notes on the weights it read go (one line each); None: dropped.

    Returns:
        The model, on the CPU, in training mode.

    Raises:
        RecipeError: overrides the model refuses, or fewer classes than the data has.
    """
    r = recipe
    torch.manual_seed(r.seed)  # the weights are a function of the seed alone
    overrides = dict(r.model.overrides)
    overrides.setdefault("num_classes", num_classes)
    if overrides["num_classes"] < num_classes:
        raise RecipeError(
            f"model.overrides.num_classes {overrides['num_classes']} is smaller than the data's {num_classes} classes"
        )
    try:
        if r.model.init_from:
            from ..hub import load_pretrained  # files, and names downloaded once (vitkit.hub)

            model = load_pretrained(r.model.init_from, pos_embed_mode=r.model.pos_embed_mode, **overrides)
            if notes is not None:
                notes += [f"{r.model.init_from}: {note}" for note in model.load_report.notes]
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
    bias = r.train.head_bias_init
    if bias is None and r.train.loss == "sigmoid":
        bias = -math.log(model.num_classes)
    for head in (getattr(model, "head", None), getattr(model, "head_dist", None)):
        if bias is not None and head is not None:
            nn.init.constant_(head.bias, bias)
    if r.finetune.adapter:  # the base frozen, the adapters (and the head, the norms as asked) trained
        spec = adapter_spec_from_dict(r.finetune.adapter)
        try:
            apply_adapters(model, spec, base_name=r.model.init_from)
        except ValueError as e:
            raise RecipeError(f"finetune.adapter: {e}") from None
    return model


__all__ = ["build_model"]
