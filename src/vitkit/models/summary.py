"""One row of facts per named model: what ``vitkit models`` prints."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .flops import count_params, model_flops
from .registry import create_model


def describe_models(names: Iterable[str], **overrides: Any) -> list[dict[str, Any]]:
    """``{"name", "params", "gflops", "img_size"}`` for each model name, built with ``overrides``
    (GFLOPs: 2 x multiply-adds of one image's forward pass, :func:`model_flops`)."""
    rows = []
    for name in names:
        model = create_model(name, **overrides)
        rows.append(
            {
                "name": name,
                "params": count_params(model),
                "gflops": model_flops(model) / 1e9,
                "img_size": list(model.cfg.img_size),
            }
        )
    return rows
