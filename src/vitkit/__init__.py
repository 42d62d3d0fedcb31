"""vitkit: the Vision Transformer of "An Image is Worth 16x16 Words" as software.

The public names below load their modules (and torch) on first use, so that ``import vitkit``
and ``vitkit --help`` stay fast; ``from vitkit import create_model`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError, DataError, RecipeError, TrainingError, UsageError, VitkitError

__version__ = "0.1.0"
"""vitkit's version."""

_LAZY = {
    "Preprocessing": "vitkit.preprocessing",
    "load_images": "vitkit.preprocessing",
    "ResNetConfig": "vitkit.models",
    "ViTConfig": "vitkit.models",
    "create_model": "vitkit.hub",
    "list_models": "vitkit.models",
    "model_config": "vitkit.models",
    "load_pretrained": "vitkit.hub",
    "save_checkpoint": "vitkit.checkpoint",
    "predict": "vitkit.eval",
}

if TYPE_CHECKING:
    from .checkpoint import save_checkpoint
    from .eval.predict import predict
    from .hub import create_model, load_pretrained
    from .models import ResNetConfig, ViTConfig, list_models, model_config
    from .preprocessing import Preprocessing, load_images


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vitkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


# In the order of use: the API page lists them so, the errors last.
__all__ = [  # noqa: RUF022
    "create_model",
    "load_pretrained",
    "predict",
    "load_images",
    "Preprocessing",
    "list_models",
    "model_config",
    "save_checkpoint",
    "ViTConfig",
    "ResNetConfig",
    "__version__",
    "VitkitError",
    "UsageError",
    "DataError",
    "CheckpointError",
    "RecipeError",
    "TrainingError",
]
