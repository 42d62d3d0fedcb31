"""Training and fine-tuning: recipes, optimisers and schedules, the loop, distributed set-up."""

from .config import Recipe, RecipeError, find_recipe, load_recipe, parse_set
from .loop import Progress, RunResult, Trainer, TrainingError, train
from .optim import build_optimizer, lr_at
from .process import configure_process

__all__ = [
    "Progress",
    "Recipe",
    "RecipeError",
    "RunResult",
    "Trainer",
    "TrainingError",
    "build_optimizer",
    "configure_process",
    "find_recipe",
    "load_recipe",
    "lr_at",
    "parse_set",
    "train",
]
