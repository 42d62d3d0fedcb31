"""NaFlex from a source: images decoded at their own aspect ratio, evaluated and embedded."""

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.data.folder import ImageFolder
from vitkit.data.streaming import decode_image
from vitkit.errors import VitkitError
from vitkit.eval.classify import evaluate
from vitkit.eval.features import model_inputs, model_outputs
from vitkit.eval.naflex import naflex_source, to_naflex
from vitkit.models.naflex import NaflexBatch, collate

SHAPES = [(40, 120), (120, 40), (64, 64), (30, 200)]  # (H, W): wide, tall, square, very wide


def _folder(root, shapes=SHAPES, per_class=2):
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        for split in ("train", "val"):
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                h, w = shapes[i % len(shapes)]
                Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def _model(**kw):
    torch.manual_seed(0)
    cfg = dict(width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=2, patch_size=8, img_size=32)
    model = vitkit.create_model("vit_b16", **{**cfg, **kw}).eval()
    torch.nn.init.normal_(model.head.weight)
    return model


def test_decode_fit_keeps_aspect_ratio(tmp_path):
    Image.new("RGB", (120, 40)).save(tmp_path / "wide.png")
    x = decode_image(str(tmp_path / "wide.png"), (1, 1), fit=(8, 16))
    assert x.dtype == torch.uint8 and x.shape == (3, 16, 48)  # a 2x6 grid: 12 of 16 patches, 3:1


def test_folder_with_naflex_gives_images_at_their_own_sizes(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path)), "val", load_size=32)
    nf = naflex_source(ds, patch=8, max_tokens=16)
    assert ds.naflex is None and nf.naflex == (8, 16)  # the source itself is unchanged
    images, labels = next(iter(nf.batches(4)))
    assert isinstance(images, list) and len(images) == labels.numel() == 4
    assert {tuple(im.shape[-2:]) for im in images} == {(16, 48), (48, 16)}
    square, _ = next(iter(ds.batches(4)))
    assert square.shape == (4, 3, 32, 32)


def test_to_naflex_resizes_a_square_batch_to_its_grids():
    x = torch.randint(0, 255, (2, 3, 28, 28), dtype=torch.uint8)
    b = to_naflex(x, 8, 9, lambda im, size: torch.nn.functional.interpolate(im.float(), size=size))
    assert b.grids == [(3, 3), (3, 3)] and b.patches.shape == (2, 9, 192)


def test_naflex_source_refuses_an_empty_budget(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path)), "val", load_size=32)
    with pytest.raises(VitkitError, match="max_tokens must be at least 1"):
        naflex_source(ds, 8, 0)


@pytest.mark.parametrize("classifier", ["token", "gap", "map"])
def test_evaluate_naflex_equals_one_image_at_a_time(tmp_path, classifier):
    ds = ImageFolder(str(_folder(tmp_path)), "val", load_size=32)
    model = _model(pos_embed="learned2d", classifier=classifier)
    batched = model_outputs(model, ds, batch_size=4, naflex=16)
    single = model_outputs(model, ds, batch_size=1, naflex=16)
    torch.testing.assert_close(batched.outputs, single.outputs, atol=1e-5, rtol=1e-5)
    metrics = evaluate(model, ds, batch_size=3, naflex=16)
    assert metrics["num_images"] == 4
    assert model.cfg.img_size == (32, 32)  # NaFlex leaves the model's own size as it was


def test_naflex_sees_what_a_square_resize_distorts(tmp_path):
    # A 1:3 image: NaFlex keeps its aspect ratio, the square path squeezes it; their inputs differ.
    ds = ImageFolder(str(_folder(tmp_path, shapes=[(30, 90)], per_class=1)), "val", load_size=32, resize="plain")
    model = _model(pos_embed="sincos2d", classifier="gap")
    (b, _), (sq, _) = next(model_inputs(model, ds, 2, naflex=12)), next(model_inputs(model, ds, 2))
    assert isinstance(b, NaflexBatch) and b.grids == [(2, 6), (2, 6)] and sq.shape == (2, 3, 32, 32)


def test_pre_logits_of_a_naflex_batch(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path)), "val", load_size=32)
    model = _model(pos_embed="learned2d", classifier="gap")
    feats = model_outputs(model, ds, head="pre_logits", batch_size=2, naflex=16)
    assert feats.outputs.shape == (4, 32)


def test_naflex_refuses_a_model_that_cannot_take_it(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path)), "val", load_size=32)
    with pytest.raises(VitkitError, match="naflex: pos_embed='relative'"):
        next(model_inputs(_model(pos_embed="relative"), ds, 2, naflex=16))
    resnet = vitkit.create_model("bit_r50x1", num_classes=2)
    with pytest.raises(VitkitError, match="naflex: needs a ViT"):
        next(model_inputs(resnet, ds, 2, naflex=16))


def test_batch_to_dtype():
    b = collate([torch.randn(3, 16, 16)], 8, 4)
    assert b.to(torch.bfloat16).patches.dtype == torch.bfloat16 and b.to(torch.bfloat16).coords.dtype == torch.long


# -- training -----------------------------------------------------------------------------------------
def _naflex_recipe(tmp_path, **changes):
    import yaml

    from _recipes import TINY_VIT, changed
    from vitkit.train import load_recipe

    folder = _folder(tmp_path / "photos", per_class=8)
    base = dict(
        data__name=str(folder),
        data__options={"load_size": 16},
        data__eval_split="val",
        data__naflex={"max_tokens": 16},
        model__overrides__pos_embed="learned2d",
        model__overrides__classifier="gap",
        augment__crop="inception",
        train__batch_size=4,
        log__eval_every=4,
    )
    tree = changed(TINY_VIT, **{**base, **changes})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_recipe(path)


@pytest.mark.parametrize("budgets", [{}, {"seq_lens": [4, 9, 16], "batch_tokens": 36}])
def test_naflex_training_on_images_of_mixed_shapes_resumes_exactly(tmp_path, monkeypatch, budgets):
    from _recipes import stopped_and_resumed
    from vitkit.train import train
    from vitkit.train.loop import Trainer
    from vitkit.train.state import list_checkpoints, load_train_state

    seen = []
    real = Trainer.train_step

    def spying(self, images, labels, budget=None):
        seen.append(({tuple(im.shape[-2:]) for im in images}, len(images), budget))
        return real(self, images, labels, budget)

    import vitkit.train.loop as loop

    inputs, real_input = [], loop._model_input

    def input_spy(*args, **kwargs):
        out = real_input(*args, **kwargs)
        inputs.append([r * c for r, c in out.grids])
        return out

    monkeypatch.setattr(Trainer, "train_step", spying)
    monkeypatch.setattr(loop, "_model_input", input_spy)
    recipe = _naflex_recipe(tmp_path, data__naflex={"max_tokens": 16, **budgets})
    whole = train(recipe, tmp_path / "whole")
    monkeypatch.setattr(Trainer, "train_step", real)
    assert any(len(shapes) > 1 for shapes, _, _ in seen)  # batches of images at several shapes
    if budgets:  # a token budget: each batch 36 patches' worth of images of the budget it drew
        drawn = {(n, b) for _, n, b in seen}
        assert drawn <= {(9, 4), (4, 9), (2, 16)} and len(drawn) >= 2
        assert all(max(n) <= b for n, (_, _, b) in zip(inputs, seen, strict=True))  # each image fits its budget
        assert any(max(n) < 16 for n in inputs)  # images cut to a smaller budget than max_tokens
    assert (tmp_path / "whole" / "worst.png").is_file()
    summary = (tmp_path / "whole" / "summary.json").read_text()
    assert '"top1"' in summary
    resumed = stopped_and_resumed(recipe, tmp_path / "b", 5, monkeypatch)
    assert resumed.resumed_from == 4 and resumed.step == whole.step == 8
    a, b = (load_train_state(list_checkpoints(tmp_path / r / "checkpoints")[-1]).model_state for r in ("whole", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_naflex_run_evaluates_as_vitkit_eval_does(tmp_path):
    from vitkit.train import train

    result = train(_naflex_recipe(tmp_path), tmp_path / "run")
    ds = ImageFolder(str(tmp_path / "photos"), "val", load_size=16)
    best = vitkit.load_pretrained(str(tmp_path / "run" / "best.safetensors"))
    again = evaluate(best, ds, naflex=16)
    row = next(r for r in result.report.epochs if r["step"] == result.best_step)
    assert again["top1"] == pytest.approx(result.best_top1)
    assert again["loss"] == pytest.approx(row["val_loss"], rel=1e-4)  # the same images, seen the same way


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"augment__mixup_alpha": 0.8}, "cannot be combined with augment.mixup_alpha"),
        ({"train__patch_drop": 0.5}, "cannot be combined with train.patch_drop"),
        ({"model__overrides__pos_embed": "relative"}, "data.naflex: naflex: pos_embed='relative'"),
    ],
)
def test_naflex_training_refuses_what_it_cannot_combine(tmp_path, change, message):
    from vitkit.errors import RecipeError
    from vitkit.train import train

    with pytest.raises(RecipeError, match=message):
        train(_naflex_recipe(tmp_path, **change), tmp_path / "run")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"max_tokens": 0}, r"\[1, 16384\], got 0"),
        ({"tokens": 4}, "naflex.tokens is not a NaFlex option"),
        ({"max_tokens": 16, "seq_lens": [4, 32]}, r"seq_lens\[1\] must be a whole number of patches in \[1, 16\]"),
        ({"max_tokens": 16, "seq_lens": []}, "seq_lens must be a list of patch budgets"),
        ({"max_tokens": 16, "batch_tokens": 8}, r"batch_tokens \(8\) holds no image of the largest budget \(16"),
    ],
)
def test_naflex_recipe_values_are_checked(tmp_path, value, message):
    from vitkit.errors import RecipeError

    with pytest.raises(RecipeError, match=message):
        _naflex_recipe(tmp_path, data__naflex=value)


@pytest.mark.parametrize(
    ("naflex", "message"),
    [
        (
            {"max_tokens": 16, "seq_lens": [1, 16], "batch_tokens": 4000},
            "up to 4000 images of 1 patches, more than the 16",
        ),
        ({"max_tokens": 16, "batch_tokens": 16}, "holds 1 images of 16 patches, and a step needs at least 2"),
    ],
)
def test_a_token_budget_the_data_or_the_step_cannot_fill_is_refused(tmp_path, naflex, message):
    from vitkit.errors import RecipeError
    from vitkit.train.plan import RunPlan

    with pytest.raises(RecipeError, match=message):
        RunPlan.from_recipe(_naflex_recipe(tmp_path, data__naflex=naflex, train__accum_steps=2))


def test_a_token_budget_beyond_the_memory_left_is_refused_in_one_line(tmp_path, monkeypatch):
    import vitkit.cpu
    from vitkit.errors import UsageError
    from vitkit.models.flops import memory_estimate
    from vitkit.train.plan import RunPlan

    naflex = {"max_tokens": 16, "batch_tokens": 256}  # 16 images of 16 patches: 4 times train.batch_size
    plan = RunPlan.from_recipe(_naflex_recipe(tmp_path, data__naflex=naflex))
    cfg = plan.model.cfg
    between = (memory_estimate(cfg, 4, True) + memory_estimate(cfg, 16, True)) // 2
    monkeypatch.setattr(vitkit.cpu, "available_memory", lambda: between)
    with pytest.raises(UsageError, match="data.naflex.batch_tokens"):
        RunPlan.from_recipe(_naflex_recipe(tmp_path, data__naflex=naflex))


def test_a_token_budgets_batches_split_evenly_among_micro_steps(tmp_path):
    from vitkit.train.plan import RunPlan

    naflex = {"max_tokens": 16, "seq_lens": [4, 9, 16], "batch_tokens": 64}  # 16, 7 and 4 images
    plan = RunPlan.from_recipe(_naflex_recipe(tmp_path, data__naflex=naflex, train__accum_steps=4))
    assert plan.naflex_sizes == (16, 4, 4)  # each rounded down to a multiple of the 4 micro-steps
    lines = plan.describe()
    assert any("64 patches a batch: 16 of 4, 4 of 9, 4 of 16 patches" in line for line in lines)
    assert "batch: 16 or 4 images a step, by the patch budget it draws" in "\n".join(lines)


def test_naflex_on_the_command_line(tmp_path, capsys):
    import json

    from vitkit.cli import main

    recipe = _naflex_recipe(tmp_path)
    recipe_file, run = str(tmp_path / "recipe.yaml"), str(tmp_path / "run")
    assert main(["train", "--config", recipe_file, "--out", run, "--steps", "4"]) == 0
    assert recipe.data.naflex == {"max_tokens": 16}
    photos = str(tmp_path / "photos")
    out = tmp_path / "eval.json"
    assert main(["eval", run, "--data", photos, "--split", "val", "--naflex", "16", "--json", str(out)]) == 0
    naflex = json.loads(out.read_text())
    assert main(["eval", run, "--data", photos, "--split", "val", "--naflex", "0", "--json", str(out)]) == 0
    square = json.loads(out.read_text())
    assert naflex["num_images"] == square["num_images"] == 16 and naflex["loss"] != square["loss"]
    image = str(tmp_path / "photos" / "val" / "a" / "0.png")
    capsys.readouterr()
    assert main(["predict", run, image, "--naflex", "16", "--top-k", "1"]) == 0
    assert capsys.readouterr().out.startswith(image)
    assert main(["predict", run, image, "--naflex", "16", "--backend", "onnxruntime"]) == 2
    assert "--naflex runs on vitkit's own path; --backend onnxruntime" in capsys.readouterr().err
    assert main(["eval", run, "--data", photos, "--split", "val", "--naflex", "16", "--serve"]) == 2
    assert "--naflex runs vitkit's eager path" in capsys.readouterr().err


def test_predict_naflex_equals_evaluate_naflex_where_no_crop(tmp_path):
    from vitkit.eval.predict import predict

    folder = _folder(tmp_path)
    model = _model(pos_embed="sincos2d", classifier="gap")
    ds = ImageFolder(str(folder), "val", load_size=32)
    out = model_outputs(model, ds, batch_size=4, naflex=16)
    paths = [p for p, _ in ds.samples]
    rows = predict(model, paths, top_k=2, naflex=16, classes=["a", "b"])
    probs = torch.tensor([[r["prob"] for r in sorted(p, key=lambda r: r["index"])] for p in rows])
    torch.testing.assert_close(probs, out.outputs.softmax(-1), atol=2e-2, rtol=0)
    with pytest.raises(VitkitError, match="a preprocessed batch is already square"):
        predict(model, torch.zeros(1, 3, 32, 32), naflex=16, classes=["a", "b"])


def test_a_naflex_run_stores_its_budget_and_is_seen_so_by_default(tmp_path, capsys):
    import json

    from vitkit.cli import main
    from vitkit.eval.predict import predict
    from vitkit.train import train

    result = train(_naflex_recipe(tmp_path), tmp_path / "run")
    best = vitkit.load_pretrained(str(tmp_path / "run" / "best.safetensors"))
    assert best.preprocessing.naflex == 16
    ds = ImageFolder(str(tmp_path / "photos"), "val", load_size=16)
    assert evaluate(best, ds)["top1"] == pytest.approx(result.best_top1)  # NaFlex, as trained
    square = evaluate(best, ds, naflex=0)
    assert square["loss"] != pytest.approx(evaluate(best, ds)["loss"])
    out = tmp_path / "eval.json"
    run, photos = str(tmp_path / "run"), str(tmp_path / "photos")
    assert main(["eval", run, "--data", photos, "--split", "val", "--json", str(out)]) == 0
    assert "NaFlex: at most 16 patches" in json.loads(out.read_text())["mode"]
    image = str(tmp_path / "photos" / "val" / "a" / "0.png")
    stored, forced = predict(best, [image], top_k=2), predict(best, [image], top_k=2, naflex=16)
    assert stored == forced and predict(best, [image], top_k=2, naflex=0) != stored


def test_embed_a_folder_with_naflex(tmp_path):
    from vitkit.eval.embed import embed_folder

    folder = _folder(tmp_path)
    model = _model(pos_embed="learned2d", classifier="gap")
    ds = ImageFolder(str(folder), "val", load_size=32)
    files = [str(__import__("pathlib").Path(p).relative_to(folder)) for p, _ in ds.samples]
    res = embed_folder(model, folder, batch_size=3, files=files, naflex=16)
    want = model_outputs(model, ds, head="pre_logits", batch_size=4, naflex=16).outputs
    torch.testing.assert_close(res.vectors, want, atol=1e-5, rtol=1e-5)  # the same Pillow resize to the grid
    assert res.metadata["preprocessing"]["naflex"] == 16
    square = embed_folder(model, folder, batch_size=3, files=files)
    assert not torch.allclose(square.vectors, res.vectors)
    with pytest.raises(VitkitError, match="NaFlex embeddings cannot be computed with --pool patch"):
        embed_folder(model, folder, pool="patch", files=files, naflex=16)


@pytest.mark.slow
def test_torchrun_token_budget_batches_match_one_process(tmp_path):
    """Two processes draw the same budget and batch size for each batch and split it evenly:
    the losses of a 1-process run with the same global batches."""
    import json
    import os
    import subprocess
    import sys

    from conftest import free_port

    naflex = {"max_tokens": 16, "seq_lens": [4, 8, 16], "batch_tokens": 32}  # 8, 4 or 2 images a batch
    _naflex_recipe(tmp_path, data__naflex=naflex, augment__crop="none", augment__flip=False, log__eval_every=8)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = ["-m", "vitkit", "train", "--config", str(tmp_path / "recipe.yaml"), "--device", "cpu"]
    subprocess.run([sys.executable, *base, "--out", str(tmp_path / "one")], check=True, env=env, capture_output=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port"]
    run = subprocess.run(
        [*torchrun, str(free_port()), *base, "--out", str(tmp_path / "two")], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]

    def losses(run):
        return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]

    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(one) == len(two) == 8 and max(abs(a - b) for a, b in zip(one, two)) < 1e-4
