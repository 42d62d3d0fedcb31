"""One row of facts per named model: what ``vitkit models`` prints."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .flops import count_params, model_flops
from .registry import build_model, model_config


def describe_models(names: Iterable[str], **overrides: Any) -> list[dict[str, Any]]:
    """``{"name", "params", "gflops", "img_size"}`` for each model name with ``overrides``
    (GFLOPs: 2 x multiply-adds of one image's forward pass, :func:`model_flops`). The models are
    built on the meta device: shapes without storage, so the table costs no memory.

    Args:
        names: model names (:func:`vitkit.list_models`).
        **overrides: config fields for every model (``img_size``, ``num_classes``).

    Returns:
        One row per name.
    """
    rows = []
    for name in names:
        cfg = model_config(name, **overrides)
        with torch.device("meta"):
            model = build_model(cfg)
        rows.append(
            {
                "name": name,
                "params": count_params(model),
                "gflops": model_flops(model) / 1e9,
                "img_size": list(model.cfg.img_size),
            }
        )
    return rows
