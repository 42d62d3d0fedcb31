"""vitkit: the Vision Transformer of "An Image is Worth 16x16 Words" as software."""

from .checkpoint import CheckpointError, Preprocessing, load_pretrained, save_checkpoint
from .models import ResNetConfig, ViTConfig, create_model, list_models, model_config

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "Preprocessing",
    "ResNetConfig",
    "ViTConfig",
    "__version__",
    "create_model",
    "list_models",
    "load_pretrained",
    "model_config",
    "save_checkpoint",
]
