"""The shipped recipes of issue 16 (ImageNet-1k from scratch, big_vision's plain ViT-S/16, DeiT-S,
a small ViT on CIFAR-10): each parses to the numbers its description names, and each starts, takes
steps on synthetic stand-in data of its shape and resumes bit for bit. Their full runs need
ImageNet or CIFAR-10 and days of a GPU; these tests change only what makes a run fit one CPU core
in seconds (the data, the batch, the step count, the logging, and for the 224 px ViTs the width
and depth), and keep every augmentation, regulariser, pooling, position embedding, patch and
image size as the recipe has them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import vitkit
from _recipes import stopped_and_resumed
from vitkit.train import find_recipe, load_recipe, train
from vitkit.train.config import CONFIG_DIR, Recipe
from vitkit.train.state import list_checkpoints, load_train_state

RECIPES = ("vit_b16_i1k_scratch", "vit_s16_i1k_90ep", "vit_s16_i1k_300ep", "deit_s16_i1k", "vit_cifar10_scratch")
IMAGENET_TRAIN = 1_281_167  # ImageNet-1k's training images

# a narrow, shallow stand-in for the 224 px ViT-B/S: patch 16 and 196 tokens kept, seconds a step
SHRUNK = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def raw(name: str) -> dict[str, Any]:
    return yaml.safe_load(find_recipe(name).read_text())


def stand_in(name: str, tmp_path: Path, *, shrink: bool = True, steps: int = 4, batch: int = 6) -> Path:
    """``name``'s recipe with synthetic data of its image size and class count, a small batch,
    ``steps`` steps, a checkpoint every 2 and no evaluation until the end (on 8 images)."""
    tree = copy.deepcopy(raw(name))
    over = tree["model"]["overrides"]
    size, classes = over["img_size"], over.get("num_classes", 1000)
    if shrink and size == 224:
        over.update(SHRUNK)
        if over.get("representation_size"):
            over["representation_size"] = SHRUNK["width"]
    tree["data"] = {
        "name": "synthetic",
        "options": {"img_size": size, "num_classes": classes, "n": 24},
        "num_workers": 0,
    }
    tree["data"]["eval_max_images"] = 8
    tree["train"].update(steps=steps, batch_size=batch, accum_steps=1)
    tree["log"] = {
        "log_every": 1,
        "eval_every": 0,
        "checkpoint_every": 2,
        "keep_last": 5,
        "plot": False,
        "tensorboard": False,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_train_state(list_checkpoints(run / "checkpoints")[-1]).model_state


def test_recipes_are_shipped_and_listed():
    """Each is found by name, as `vitkit train --config NAME` finds it, and named in the list a
    wrong name prints."""
    for name in RECIPES:
        assert find_recipe(name) == CONFIG_DIR / f"{name}.yaml"
    with pytest.raises(vitkit.errors.RecipeError) as e:
        find_recipe("no_such_recipe")
    assert all(name in str(e.value) for name in RECIPES)


def test_train_help_lists_the_recipes(capsys):
    from vitkit.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert all(f"{name}," in text or f"{name} (" in text for name in RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_parses_and_builds_its_model(name):
    recipe = load_recipe(find_recipe(name))
    assert "Where vitkit departs" in recipe.description  # each says where it leaves its paper
    cfg = vitkit.model_config(recipe.model.name, **recipe.model.overrides)
    assert cfg.num_classes == (10 if "cifar" in name else 1000)


def test_recipe_numbers_are_their_papers():
    """The numbers each description names, and the epochs turned into steps as it says."""
    b16 = load_recipe(find_recipe("vit_b16_i1k_scratch"))  # the ViT paper's Table 3
    assert (b16.optim.lr, b16.optim.weight_decay, b16.train.batch_size) == (3e-3, 0.3, 4096)
    assert b16.model.overrides["drop_rate"] == 0.1 and b16.optim.warmup_steps == 10_000
    assert b16.optim.schedule == "cosine" and b16.train.steps == 300 * IMAGENET_TRAIN // 4096 == 93_835

    for name, epochs in (("vit_s16_i1k_90ep", 90), ("vit_s16_i1k_300ep", 300)):  # big_vision
        s16 = load_recipe(find_recipe(name))
        assert s16.train.steps == epochs * IMAGENET_TRAIN // 1024
        assert s16.train.batch_size == 1024 and s16.optim.lr == 1e-3 and s16.optim.warmup_steps == 10_000
        assert s16.optim.weight_decay == pytest.approx(1e-4 / 1e-3)  # big_vision's wd is not scaled by the lr
        assert (s16.augment.randaugment, s16.augment.mixup_alpha, s16.augment.cutmix_alpha) == ("rand-m10-n2", 0.2, 0)
        o = s16.model.overrides
        assert (o["classifier"], o["pos_embed"], o["drop_rate"], o["drop_path_rate"]) == ("gap", "sincos2d", 0, 0)

    deit = load_recipe(find_recipe("deit_s16_i1k"))
    per_epoch = IMAGENET_TRAIN // 256 * 256 // 1024  # RASampler's epoch, in whole batches
    assert per_epoch == 1251 and deit.train.steps == 300 * per_epoch and deit.optim.warmup_steps == 5 * per_epoch
    assert deit.optim.lr == 5e-4 * deit.train.batch_size / 512 and deit.optim.weight_decay == 0.05
    a = deit.augment
    assert (a.mixup_alpha, a.cutmix_alpha, a.mix_switch_prob, a.erase_prob, a.repeats) == (0.8, 1.0, 0.5, 0.25, 3)
    assert a.randaugment == "rand-m9-mstd0.5-inc1" and deit.train.label_smoothing == 0.1
    assert deit.model.overrides["drop_path_rate"] == 0.1 and deit.train.distill == "none"

    cifar = load_recipe(find_recipe("vit_cifar10_scratch"))
    assert cifar.train.steps == 300 * (50_000 // 128) and cifar.optim.warmup_steps == 10 * 390
    model = vitkit.create_model(cifar.model.name, **cifar.model.overrides)
    assert sum(p.numel() for p in model.parameters()) == 3_722_250  # ViT-Lite-7/4: CCT's 3.72M


def test_deit_recipe_takes_the_distilled_variant():
    """The keys its description names turn it into DeiT-S with the distillation token: the recipe
    reads, and the model has the second token and head."""
    sets = [
        ("model.overrides.distill_token", True),
        ("train.teacher", "teacher.safetensors"),
        ("train.distill", "hard"),
    ]
    recipe = load_recipe(find_recipe("deit_s16_i1k"), sets)
    model = vitkit.create_model(recipe.model.name, **{**recipe.model.overrides, **SHRUNK})
    assert model.cfg.distill_token and hasattr(model, "head_dist")
    assert (recipe.train.distill_alpha, recipe.train.distill_temperature) == (0.5, 1.0)


def assert_resumes_bit_exact(recipe: Recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``recipe`` (4 steps, checkpoints at 2 and 4) once through; run it again stopped at step
    3, resume it, and check its last weights equal the first run's, and that steps 3-4 trained."""

    full = train(recipe, tmp_path / "a")
    assert full.resumed_from is None
    first = load_train_state(list_checkpoints(tmp_path / "a" / "checkpoints")[0])
    assert first.state.step == 2

    resumed = stopped_and_resumed(recipe, tmp_path / "b", 3, monkeypatch, seed=12345)
    assert resumed.resumed_from == 2
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], first.model_state[k]) for k in a)  # steps 3 and 4 moved the weights


SLOW_RECIPES = ("vit_s16_i1k_90ep", "vit_s16_i1k_300ep", "deit_s16_i1k")  # keys the other recipes' runs cover already


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_RECIPES else []) for n in RECIPES]
)
def test_recipe_starts_takes_steps_and_resumes_bit_exact(name, tmp_path, monkeypatch):
    assert_resumes_bit_exact(load_recipe(stand_in(name, tmp_path)), tmp_path, monkeypatch)


@pytest.mark.slow
def test_distilled_deit_starts_and_resumes_bit_exact(tmp_path, monkeypatch):
    """The DeiT recipe with the keys its description names for the distilled variant, taught by
    a 1000-class ViT (here the plain recipe's stand-in after 2 steps: its run folder is a
    checkpoint load_pretrained reads)."""
    teacher = load_recipe(stand_in("deit_s16_i1k", tmp_path, steps=2))
    train(teacher, tmp_path / "teacher")
    sets = [
        ("model.overrides.distill_token", True),
        ("train.teacher", str(tmp_path / "teacher")),
        ("train.distill", "hard"),
    ]
    recipe = load_recipe(stand_in("deit_s16_i1k", tmp_path), sets)
    assert_resumes_bit_exact(recipe, tmp_path, monkeypatch)
    assert any(k.startswith("head_dist") for k in final_weights(tmp_path / "a"))


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_takes_a_step_at_its_real_size(name, tmp_path):
    """One step at batch 2 of the model the recipe names, at its real width and depth."""
    recipe = load_recipe(stand_in(name, tmp_path, shrink=False, steps=1, batch=2))
    result = train(recipe, tmp_path / "run")
    assert result.resumed_from is None and len(list_checkpoints(tmp_path / "run" / "checkpoints")) == 1
