"""Shared by the training tests: a recipe tree with ``section__key=value`` changes."""

from __future__ import annotations

import copy
from typing import Any


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


def stopped_and_resumed(recipe: Any, out: Any, stop_at: int, monkeypatch: Any, seed: int = 12345) -> Any:
    """Train ``recipe`` into ``out`` until the step ``stop_at`` starts (an exception inside the
    step, as a crash would leave it), then run it again: the resumed run's result. The process's
    RNG is reseeded in between, so that the resumed run cannot lean on it."""
    import pytest
    import torch

    from vitkit.train import train
    from vitkit.train.loop import Trainer

    class Stop(Exception):
        pass

    real_step = Trainer.train_step

    def stopping(self: Any, images: Any, labels: Any) -> Any:
        if self.state.step == stop_at:
            raise Stop
        return real_step(self, images, labels)

    monkeypatch.setattr(Trainer, "train_step", stopping)
    with pytest.raises(Stop):
        train(recipe, out)
    monkeypatch.setattr(Trainer, "train_step", real_step)
    torch.manual_seed(seed)
    return train(recipe, out)
