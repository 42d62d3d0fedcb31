"""Shared by the training tests: a recipe tree with ``section__key=value`` changes."""

from __future__ import annotations

import copy
from typing import Any

# A tiny ViT on synthetic data: 8 steps, checkpoints every 4 (the optimiser and distillation tests).
TINY_VIT = {
    "seed": 5,
    "model": {
        "name": "vit_ti16",
        "overrides": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64},
    },
    "data": {"name": "synthetic", "options": {"img_size": 16, "n": 128}},
    "augment": {"crop": "pad", "pad": 2, "flip": True},
    "optim": {"name": "adamw", "lr": 3e-3, "warmup_steps": 2, "weight_decay": 0.05},
    "train": {"steps": 8, "batch_size": 16, "precision": "fp32"},
    "log": {"log_every": 1, "eval_every": 0, "checkpoint_every": 4, "keep_last": 5, "plot": False},
}


def tiny_recipe(tmp_path: Any, **changes: Any) -> Any:
    """:data:`TINY_VIT` with ``changes`` (as :func:`changed`), written under ``tmp_path`` and loaded."""
    import yaml

    from vitkit.train import load_recipe

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(changed(TINY_VIT, **changes)))
    return load_recipe(path)


def changed(tree: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``tree`` with each ``a__b__c=value`` set at ``tree[a][b][c]``."""
    out = copy.deepcopy(tree)
    for dotted, value in changes.items():
        node = out
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def stopped(recipe: Any, out: Any, stop_at: int, monkeypatch: Any) -> None:
    """Train ``recipe`` into ``out`` until the step ``stop_at`` starts, then stop it with an
    exception inside the step, as a crash would leave it."""
    import pytest

    from vitkit.train import train
    from vitkit.train.loop import Trainer

    class Stop(Exception):
        pass

    real_step = Trainer.train_step

    def stopping(self: Any, images: Any, labels: Any, *budget: Any) -> Any:
        if self.state.step == stop_at:
            raise Stop
        return real_step(self, images, labels, *budget)

    monkeypatch.setattr(Trainer, "train_step", stopping)
    with pytest.raises(Stop):
        train(recipe, out)
    monkeypatch.setattr(Trainer, "train_step", real_step)


def stopped_and_resumed(recipe: Any, out: Any, stop_at: int, monkeypatch: Any, seed: int = 12345) -> Any:
    """:func:`stopped`, then run it again: the resumed run's result. The process's RNG is
    reseeded in between, so that the resumed run cannot lean on it."""
    import torch

    from vitkit.train import train

    stopped(recipe, out, stop_at, monkeypatch)
    torch.manual_seed(seed)
    return train(recipe, out)
