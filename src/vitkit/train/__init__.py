"""Training and fine-tuning: recipes, optimisers and schedules, the loop, distributed set-up."""

from .config import Recipe, RecipeError, find_recipe, load_recipe, parse_set
from .loop import Progress, RunResult, Trainer, TrainingError, evaluate_top1, train
from .optim import build_optimizer, lr_at

__all__ = [
    "Progress",
    "Recipe",
    "RecipeError",
    "RunResult",
    "Trainer",
    "TrainingError",
    "build_optimizer",
    "evaluate_top1",
    "find_recipe",
    "load_recipe",
    "lr_at",
    "parse_set",
    "train",
]
