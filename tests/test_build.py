"""One model builder: :func:`vitkit.train.build.build_model` gives the weights the Trainer starts
from, for the demo recipe, a reproduce run's recipe and a sigmoid-loss recipe (its head bias)."""

from __future__ import annotations

import math

import pytest
import torch

from _recipes import TINY_VIT, changed
from _standins import tiny_fashion_mnist
from vitkit.errors import RecipeError
from vitkit.reproduce.core.spec import DataInfo, Suite
from vitkit.train import load_recipe
from vitkit.train.build import build_model
from vitkit.train.config import recipe_from_dict
from vitkit.train.loop import Trainer


def _trainer_weights(recipe, out) -> dict[str, torch.Tensor]:
    trainer = Trainer(recipe, out)
    try:
        return {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    finally:
        trainer.close()


def _assert_same(built: torch.nn.Module, trainer: dict[str, torch.Tensor]) -> None:
    mine = built.state_dict()
    assert list(mine) == list(trainer)
    different = [k for k in mine if not torch.equal(mine[k], trainer[k])]
    assert not different, different


def test_the_demo_recipe_builds_what_the_trainer_starts_from(tmp_path, monkeypatch):
    tiny_fashion_mnist(tmp_path / "data" / "fashion-mnist")
    monkeypatch.setenv("VITKIT_DATA", str(tmp_path / "data"))
    recipe = load_recipe("configs/fmnist_vit.yaml")
    _assert_same(build_model(recipe, 10, 1), _trainer_weights(recipe, tmp_path / "run"))


@pytest.mark.parametrize("role", ["vit-tiny", "bit-r5"])
def test_a_reproduce_recipe_builds_what_the_trainer_starts_from(tmp_path, role):
    info = DataInfo("synthetic", (32, 32), 3, [str(i) for i in range(10)], 1000)
    suite = Suite(tmp_path / "suite", "synthetic", "smoke", None, info)
    recipe = recipe_from_dict(suite.recipe(role, 1))
    _assert_same(build_model(recipe, 10, 3), _trainer_weights(recipe, tmp_path / "run"))


def test_a_sigmoid_head_starts_at_probability_one_over_k(tmp_path):
    recipe = recipe_from_dict(changed(TINY_VIT, train__loss="sigmoid"))
    model = build_model(recipe, 10, 3)
    assert torch.allclose(model.head.bias, torch.full((10,), -math.log(10)))
    _assert_same(model, _trainer_weights(recipe, tmp_path / "run"))
    fixed = build_model(recipe_from_dict(changed(TINY_VIT, train__head_bias_init=0.5)), 10, 3)
    assert torch.equal(fixed.head.bias, torch.full((10,), 0.5))


def test_fewer_classes_than_the_data_is_refused_in_one_line():
    recipe = recipe_from_dict(changed(TINY_VIT, model__overrides__num_classes=5))
    with pytest.raises(RecipeError, match="num_classes 5 is smaller than the data's 10 classes"):
        build_model(recipe, 10, 3)
