"""Training never hangs, never loses a run, and every bad input gets one clear line (issue #14).

One test per way a run used to go wrong: a batch larger than the data (hang), a streamed epoch
with no readable image (hang), bad recipe values (refused when read, naming the key), non-finite
weights (never written, never kept), a torn metrics log (still resumable), two runs in one folder
(the second refused at once), temporaries of a killed write (removed), a full disk (one line, the
previous checkpoint intact).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vitkit
from _recipes import changed
from vitkit.checkpoint.io import read_safetensors, write_safetensors
from vitkit.cli import main
from vitkit.errors import DataError, RecipeError, TrainingError
from vitkit.train import Progress, load_recipe, parse_set, train
from vitkit.train.config import Recipe, TrainSection, recipe_from_dict
from vitkit.train.loop import Trainer
from vitkit.train.runfolder import RunFolder, read_metrics
from vitkit.train.state import latest_loadable, list_checkpoints, load_train_state, nonfinite_names

TINY = {
    "model": {
        "name": "vit_ti16",
        "overrides": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64},
    },
    "data": {"name": "synthetic", "eval_split": "", "options": {"img_size": 16, "n": 64}},
    "augment": {"crop": "none", "flip": False},
    "optim": {"lr": 1e-3, "warmup_steps": 0},
    "train": {"steps": 4, "batch_size": 16},
    "log": {
        "log_every": 1,
        "eval_every": 0,
        "checkpoint_every": 2,
        "keep_last": 5,
        "tensorboard": False,
        "plot": False,
    },
}


def tiny(**changes) -> Recipe:
    """The tiny recipe with ``section__key=value`` changes (``model__overrides__width``...)."""
    return recipe_from_dict(changed(TINY, **changes))


def write_tiny(path: Path, **changes) -> Path:
    path.write_text(json.dumps(tiny(**changes).to_dict()))  # JSON is YAML
    return path


class Messages(Progress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the test run) when the block takes longer than ``seconds``."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: it hangs")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def all_finite(path: Path) -> bool:
    tensors, _ = read_safetensors(path)
    return not nonfinite_names(tensors)


# -- 1. nothing hangs ------------------------------------------------------------------------------


def test_batch_larger_than_the_data_is_refused_at_once(tmp_path):
    out = tmp_path / "run"
    with deadline(60), pytest.raises(RecipeError) as e:
        train(tiny(data__options__n=10, train__batch_size=32), out)
    assert str(e.value) == (
        "train.batch_size 32 is larger than the 10 training images of synthetic/train; lower --batch-size"
    )
    assert not out.exists()  # a run that never began leaves no folder behind


def _image_folder(root: Path, per_class: int, readable: bool) -> Path:
    from PIL import Image

    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            if readable:
                Image.new("RGB", (20, 20), (40 * i, 100, 200)).save(root / c / f"{i}.png")
            else:
                (root / c / f"{i}.png").write_bytes(b"not a png at all")
    return root


def test_finetune_with_a_small_folder_names_the_batch_size(tmp_path, capsys):
    folder = _image_folder(tmp_path / "pets", per_class=6, readable=True)  # 10 for training, 2 held out
    weights = vitkit.save_checkpoint(vitkit.create_model("vit_ti16", img_size=32, depth=1), tmp_path / "w.safetensors")
    with deadline(120):
        argv = ["finetune", "--from", str(weights), "--config", "finetune_sgd", "--data", str(folder)]
        rc = main([*argv, "--out", str(tmp_path / "ft")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (
        "vitkit finetune: error: train.batch_size 512 is larger than the 10 training images of pets/train; "
        "lower --batch-size"
    )


def test_an_epoch_without_one_readable_image_stops(tmp_path):
    folder = _image_folder(tmp_path / "broken", per_class=4, readable=False)
    recipe = tiny(data__name=str(folder), data__options={"img_size": 16}, train__batch_size=4)
    with deadline(120), pytest.raises(DataError) as e:
        train(recipe, tmp_path / "run")
    msg = str(e.value)
    # 3 of each class's 4 images are for training (one is held out); the batch of 4 is all unreadable
    assert msg.startswith("broken/train: epoch 0 gave no batch to train on (4 images could not be read, e.g. ")
    assert "not an image Pillow can read" in msg and "\n" not in msg


# -- 2. every value checked when the recipe is read -------------------------------------------------

BAD_VALUES = [
    ("train.steps", 0, r"^train\.steps must be in \[1, 1000000000\], got 0$"),
    ("train.batch_size", -32, r"^train\.batch_size must be in \[1, 16777216\], got -32$"),
    ("train.accum_steps", 0, r"train\.accum_steps must be in \[1, 65536\]"),
    ("optim.warmup_steps", -1, r"optim\.warmup_steps must be in \[0, 1000000000\], got -1"),
    ("log.eval_every", -1, r"^log\.eval_every must be >= 0, got -1$"),
    ("log.log_every", -5, r"log\.log_every must be >= 0"),
    ("log.checkpoint_every", -1, r"log\.checkpoint_every must be >= 0"),
    ("log.keep_last", 0, r"log\.keep_last must be in \[1, 100000\], got 0"),
    ("optim.lr", "nan", r"^optim\.lr: expected a finite number, got 'nan'$"),
    ("optim.lr", math.inf, r"optim\.lr: expected a finite number, got inf"),
    ("optim.lr", -0.001, r"optim\.lr must be >= 0, got -0\.001"),
    ("optim.weight_decay", -0.1, r"optim\.weight_decay must be >= 0"),
    ("optim.betas", [0.9, 1.0], r"optim\.betas must be in \[0, 1\), got 1\.0"),
    ("optim.betas", [0.9], r"optim\.betas: expected 2 values"),
    ("optim.momentum", 1.5, r"optim\.momentum must be in \[0, 1\)"),
    ("optim.eps", -1e-8, r"optim\.eps must be >= 0"),
    ("train.grad_clip", -1, r"train\.grad_clip must be >= 0"),
    ("train.label_smoothing", 1.0, r"train\.label_smoothing must be in \[0, 1\), got 1\.0"),
    ("train.ema_decay", 1.0, r"train\.ema_decay must be in \[0, 1\)"),
    ("train.patch_drop", 1.0, r"train\.patch_drop must be in \[0, 1\)"),
    ("train.patch_drop_until", 1.5, r"train\.patch_drop_until must be in \[0, 1\], got 1\.5"),
    ("augment.area_min", 0, r"augment\.area_min must be in \(0, 1\], got 0\.0"),
    ("augment.eval_crop", 1.5, r"augment\.eval_crop must be in \(0, 1\]"),
    ("augment.pad", -2, r"augment\.pad must be in \[0, 4096\]"),
    (
        "optim.name",
        "adamwx",
        r"^optim\.name must be one of adamw, adam, sgd, muon, got 'adamwx'; did you mean 'adamw'\?$",
    ),
    ("optim.schedule", "cosin", r"optim\.schedule must be one of cosine, linear, constant, got 'cosin'"),
    ("train.precision", "fp16", r"train\.precision must be one of auto, fp32, bf16, got 'fp16'"),
    ("train.loss", "hinge", r"train\.loss must be one of softmax, sigmoid"),
    ("train.on_nonfinite", "ignore", r"train\.on_nonfinite must be one of stop, skip"),
    ("augment.crop", "random", r"augment\.crop must be one of inception, pad, none"),
    ("train.attention", "flash", r"train\.attention must be one of auto, sdpa, math, recompute"),
    ("model.init", "xavier", r"model\.init must be one of default, mimetic"),
    ("model.pos_embed_mode", "nearest", r"model\.pos_embed_mode must be one of bilinear, bicubic"),
    ("data.minival", -1, r"data\.minival must be >= 0"),
    ("data.subset", 0, r"data\.subset must be > 0, got 0\.0"),
    ("data.subset", 2.5, r"data\.subset must be a whole number of images or a fraction in \(0, 1\]"),
    ("data.num_workers", -1, r"data\.num_workers must be in \[0, 256\]"),
    ("data.eval_max_images", 0, r"data\.eval_max_images must be >= 1"),
    ("seed", -1, r"seed must be in \[0, 4294967296\), got -1"),
    ("train.steps", "many", r"train\.steps: expected an integer, got 'many'"),
    ("train.steps", 2.5, r"train\.steps: expected an integer, got 2\.5"),
    ("train.steps", "inf", r"train\.steps: expected an integer"),
    ("optim.lr", True, r"optim\.lr: expected a number, got True"),
    ("optim.lr", [1], r"optim\.lr: expected a number"),
    ("model.overrides.width", 0, r"^model\.overrides\.width must be in \[1, 65536\], got 0$"),
    ("model.overrides.depth", -1, r"model\.overrides\.depth must be in \[1, 1024\], got -1"),
    ("model.overrides.patch_size", 0, r"model\.overrides\.patch_size must be in \[1, 1024\], got 0"),
    ("model.overrides.num_classes", 0, r"model\.overrides\.num_classes must be in \[1, 1000000\], got 0"),
    ("model.overrides.img_size", -16, r"model\.overrides\.img_size must be in \[1, 16384\], got -16"),
    ("model.overrides.img_size", [16, 0], r"model\.overrides\.img_size must be in \[1, 16384\], got 0"),
    ("model.overrides.width", 32.5, r"model\.overrides\.width must be a whole number, got 32\.5"),
    ("model.overrides.drop_rate", 1.0, r"model\.overrides\.drop_rate must be in \[0, 1\)"),
    ("model.overrides.num_heads", 5, r"^model\.overrides: width 32 is not divisible by num_heads 5$"),
    ("model.overrides.hidden", 5, r"^model\.overrides: unknown model option\(s\) \['hidden'\]"),
    ("model.name", "vit_bb16", r"^model\.name: unknown model 'vit_bb16'; did you mean vit_b16"),
    ("train.stepz", 5, r"unknown recipe key 'train\.stepz'; did you mean steps"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_VALUES, ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES])
def test_a_bad_value_is_refused_when_the_recipe_is_read(key, value, message):
    base = [("model.overrides", dict(TINY["model"]["overrides"])), ("model.name", "vit_ti16")]
    with pytest.raises(RecipeError, match=message):
        load_recipe(None, [*base, (key, value)])


def test_the_edges_of_every_range_are_accepted():
    r = load_recipe(
        None,
        [
            ("train.steps", 1),
            ("optim.warmup_steps", 0),
            ("log.keep_last", 1),
            ("log.eval_every", 0),
            ("optim.lr", 0),
            ("optim.betas", [0, 0.999]),
            ("train.patch_drop_until", 1),
            ("augment.area_min", 1),
            ("augment.eval_crop", "1.0"),
            ("optim.name", "AdamW"),  # the optimiser's name was always read case-blind
            ("data.subset", 1.0),
            ("data.minival", "100"),
            ("train.steps", "1e3"),
            ("seed", 4294967295),
        ],
    )
    assert (r.train.steps, r.optim.name, r.data.minival, r.augment.eval_crop) == (1000, "AdamW", 100.0, 1.0)


def test_nesterov_without_momentum_is_refused():
    with pytest.raises(RecipeError, match=r"^optim\.nesterov needs optim\.momentum above 0, got 0$"):
        load_recipe(None, [("optim.name", "sgd"), ("optim.nesterov", True), ("optim.momentum", 0)])


def test_a_recipe_built_in_python_gets_the_same_checks(tmp_path):
    with pytest.raises(RecipeError, match=r"train\.steps must be in \[1, 1000000000\], got 0"):
        Trainer(Recipe(train=TrainSection(steps=0)), tmp_path / "run")
    with pytest.raises(RecipeError, match=r"train\.device: expected cpu, cuda or cuda:N, got 'tpu'"):
        train(tiny(train__device="tpu"), tmp_path / "run")
    with pytest.raises(RecipeError, match=r"model\.overrides\.num_classes 5 is smaller than the 10 classes"):
        Trainer(tiny(model__overrides__num_classes=5), tmp_path / "run2")


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--steps", "0"], "vitkit train: error: train.steps must be in [1, 1000000000], got 0"),
        (["--eval-every", "-1"], "vitkit train: error: log.eval_every must be >= 0, got -1"),
        (["--lr", "nan"], "vitkit train: error: optim.lr: expected a finite number, got nan"),
        (["--set", "optim.schedule=cosin"], "vitkit train: error: optim.schedule must be one of cosine, linear, "
         "constant, got 'cosin'; did you mean 'cosine'?"),
    ],
)  # fmt: skip
def test_cli_says_a_bad_value_in_one_line(tmp_path, capsys, flags, line):
    recipe = write_tiny(tmp_path / "r.yaml")
    assert main(["train", "--config", str(recipe), "--out", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [line]
    assert not (tmp_path / "run").exists()


SECTIONS = {
    f.name: f.default_factory for f in dataclasses.fields(Recipe) if f.default_factory is not dataclasses.MISSING
}
KEYS = [
    *(f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)),
    "seed", "description", "model", "train", "nope", "train.nope",
    *(f"model.overrides.{k}" for k in ("width", "depth", "num_heads", "img_size", "patch_size", "num_classes",
                                       "classifier", "drop_rate", "bogus", "units")),
    "data.options.n",
]  # fmt: skip
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-3, max_value=40),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),  # training flushes denormals
    st.text(max_size=10),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "1e3", "0", "-1", "true", "adamw", "cosine", "bf16", "vit_b16"]),
    st.lists(st.one_of(st.integers(-2, 64), st.floats(allow_subnormal=False), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), st.integers(-2, 64), max_size=2),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4))
def test_any_value_is_taken_or_refused_with_a_recipe_error(sets):
    try:
        recipe = load_recipe(None, list(sets.items()))
    except RecipeError as e:
        assert str(e) and "\n" not in str(e)
        return
    recipe_from_dict(recipe.to_dict())  # what was taken reads back


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["model", "data", "augment", "optim", "train", "log", "seed", 7]),
        st.one_of(VALUES, st.dictionaries(st.sampled_from([k.split(".")[-1] for k in KEYS] + [3]), VALUES, max_size=3)),
        max_size=3,
    )
)
def test_any_tree_is_taken_or_refused_with_a_recipe_error(tree):
    with contextlib.suppress(RecipeError):
        recipe_from_dict(tree)


# -- 3. non-finite weights are never written or kept -------------------------------------------------


def _poison_after_step(trainer: Trainer, step: int) -> None:
    """Turn one weight into NaN right after the optimiser step that makes ``step`` steps."""
    real = trainer.optimizer.step

    def step_then_poison(*args, **kwargs):
        out = real(*args, **kwargs)
        if trainer.state.step + 1 == step:
            with torch.no_grad():
                trainer.model.head.weight[0, 0] = float("nan")
        return out

    trainer.optimizer.step = step_then_poison


def test_skip_mode_stops_at_nonfinite_weights_and_keeps_the_finite(tmp_path):
    recipe = tiny(train__on_nonfinite="skip", train__steps=6, data__eval_split="test", log__eval_every=1)
    trainer = Trainer(recipe, tmp_path / "run")
    _poison_after_step(trainer, 3)
    with pytest.raises(TrainingError) as e:
        trainer.run()
    msg = str(e.value)
    assert msg.startswith("the weights are not finite at step 3 (head.weight")
    assert "they were not evaluated and best.safetensors was not written" in msg
    assert "step_0000002.safetensors is kept; best.safetensors (step " in msg and "\n" not in msg
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step_0000002.safetensors"]
    assert all_finite(tmp_path / "run" / "checkpoints" / "step_0000002.safetensors")
    assert all_finite(tmp_path / "run" / "best.safetensors")
    assert latest_loadable(tmp_path / "run" / "checkpoints").state.step == 2  # resumable


def test_a_checkpoint_is_never_written_with_nonfinite_weights(tmp_path):
    trainer = Trainer(tiny(train__steps=6, log__checkpoint_every=1), tmp_path / "run")
    _poison_after_step(trainer, 1)
    with pytest.raises(TrainingError, match=r"^the weights are not finite at step 1 \(head\.weight; lr 0\.001\): "
                       r"checkpoint step_0000001 was not written; no checkpoint was written\. Lower"):  # fmt: skip
        trainer.run()
    assert not list_checkpoints(tmp_path / "run" / "checkpoints")


def test_skipped_steps_log_no_loss(tmp_path, monkeypatch):
    from vitkit.train import objectives as loop

    real, calls = loop.loss_fn, []

    def nan_on_the_second_step(*args):
        calls.append(1)
        loss = real(*args)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(loop, "loss_fn", nan_on_the_second_step)
    messages = Messages()
    result = train(tiny(train__on_nonfinite="skip"), tmp_path / "run", messages)
    assert result.step == 4
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[1] == {**records[1], "step": 2, "loss": None, "skipped": 1}
    assert all(isinstance(r["loss"], float) and "skipped" not in r for i, r in enumerate(records) if i != 1)
    assert "skipped 1 steps whose loss was not finite (train.on_nonfinite=skip)" in messages.lines
    assert load_train_state(list_checkpoints(tmp_path / "run" / "checkpoints")[-1]).state.nonfinite_skipped == 1


def test_a_diverging_run_keeps_only_finite_resumable_checkpoints(tmp_path, capsys):
    """The issue's case: --lr 1e3, no warm-up, a checkpoint every 2 steps."""
    recipe = write_tiny(tmp_path / "r.yaml", train__steps=40, data__eval_split="test", log__eval_every=4)
    cmd = ["train", "--config", str(recipe), "--out", str(tmp_path / "run"), "--lr", "1e3"]
    cmd += ["--set", "optim.warmup_steps=0", "--checkpoint-every", "2"]
    for _ in range(2):  # the second resumes from what the first kept
        rc = main(cmd)
        err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
        assert rc in (0, 2) and len(err) == (rc == 2), err
        ckpts = list_checkpoints(tmp_path / "run" / "checkpoints")
        assert all(all_finite(p) for p in ckpts)
        if (tmp_path / "run" / "best.safetensors").is_file():
            assert all_finite(tmp_path / "run" / "best.safetensors")
        if ckpts:
            assert latest_loadable(tmp_path / "run" / "checkpoints") is not None
        if rc == 2:
            assert "finite" in err[0] and ("is kept" in err[0] or "no checkpoint was written" in err[0])


def test_resume_skips_a_checkpoint_with_nonfinite_weights(tmp_path):
    train(tiny(), tmp_path / "run")
    newest = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    tensors, meta = read_safetensors(newest)
    tensors["head.bias"][0] = float("inf")
    write_safetensors(newest, tensors, meta)  # as an older vitkit could have written it
    messages = Messages()
    result = train(tiny(), tmp_path / "run", messages)
    assert result.resumed_from == 2 and result.step == 4
    assert messages.lines[0] == (
        "skipped checkpoint step_0000004.safetensors (non-finite values in head.bias); "
        "resuming from step_0000002.safetensors"
    )


@pytest.mark.parametrize(
    ("other", "why"),
    [
        ({"model__overrides__width": 48}, "another model: "),  # another width
        ({"model__overrides__depth": 2}, "is not this model's"),  # another depth
        (
            {"model__overrides__mlp_dim": 32},
            "another model: blocks.0.mlp.fc1.weight is (32, 32), this model's (64, 32)",
        ),
    ],
)
def test_resume_skips_a_checkpoint_of_another_run(tmp_path, other, why):
    train(tiny(), tmp_path / "run")
    train(tiny(**other), tmp_path / "other")
    theirs = list_checkpoints(tmp_path / "other" / "checkpoints")[-1]
    copied = tmp_path / "run" / "checkpoints" / "step_0000006.safetensors"
    copied.write_bytes(theirs.read_bytes())  # a newer step, of another model
    messages = Messages()
    result = train(tiny(train__steps=4), tmp_path / "run", messages)
    assert result.resumed_from == 4
    assert messages.lines[0].startswith("skipped checkpoint step_0000006.safetensors (another model: ")
    assert why in messages.lines[0], messages.lines[0]


def test_resume_skips_a_checkpoint_with_a_changed_value(tmp_path):
    """A flipped bit in a weight leaves a file that parses and is finite: the CRC32 table written
    with it catches the change, and the run resumes from the checkpoint before."""
    train(tiny(), tmp_path / "run")
    newest = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0x01
    newest.write_bytes(data)
    messages = Messages()
    result = train(tiny(), tmp_path / "run", messages)
    assert result.resumed_from == 2 and result.step == 4
    line = messages.lines[0]
    assert line.startswith("skipped checkpoint step_0000004.safetensors (tensor '"), line
    assert "does not match the CRC32 written with it" in line
    assert line.endswith("); resuming from step_0000002.safetensors"), line


# -- 4. a torn metrics log -------------------------------------------------------------------------


def test_a_torn_last_line_of_the_log_does_not_stop_the_resume(tmp_path):
    train(tiny(), tmp_path / "straight")
    train(tiny(), tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "step_0000004.safetensors").unlink()  # killed after step 3's log line...
    log = tmp_path / "run" / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:3]) + '\n{"step": 4, "loss": 2.3')  # ...while appending step 4's
    result = train(tiny(), tmp_path / "run")
    assert result.resumed_from == 2
    straight = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    resumed = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4] and log.read_text().endswith("\n")
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], rel=1e-6, abs=0)


def test_reading_the_log_drops_only_a_torn_tail(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [rec["step"] for _, rec in read_metrics(log)] == [1, 2]
    log.write_text('{"step": 1, "loss": 2.0}\n\x00\x00\x00\x00\n')  # zeros a crash can leave
    assert [rec["step"] for _, rec in read_metrics(log)] == [1]
    log.write_text('{"step": 1, "loss": 2.0}\ngarbage\n{"step": 3, "loss": 1.0}\n')
    with pytest.raises(TrainingError, match=r"metrics\.jsonl: line 2 is damaged .*remove it \(or the file\)"):
        read_metrics(log)
    assert [rec["step"] for _, rec in read_metrics(log, strict=False)] == [1, 3]
    pytest.importorskip("matplotlib")
    from vitkit.train.curves import plot_curves

    log.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": null, "skipped": 1}\n{"step": 3, "lo')
    assert plot_curves(log, tmp_path / "curves.png") == tmp_path / "curves.png"


# -- 5. one run a folder ---------------------------------------------------------------------------


def test_a_second_run_into_the_same_folder_is_refused_at_once(tmp_path):
    holder = RunFolder(tmp_path / "run")
    holder.acquire()
    try:
        start = time.perf_counter()
        with pytest.raises(TrainingError) as e:
            train(tiny(), tmp_path / "run")
        assert time.perf_counter() - start < 10
        msg = str(e.value)
        assert msg.startswith(
            f"{tmp_path / 'run'} is in use by another run (pid {os.getpid()} on {socket.gethostname()}"
        )
        assert msg.endswith("wait for it to end, or use another --out")
    finally:
        holder.release()
    assert train(tiny(), tmp_path / "run").step == 4  # let go: the run goes ahead


def test_the_lock_file_of_a_killed_run_does_not_block(tmp_path):
    run = tmp_path / "run"
    code = (
        "import sys, time\n"
        "from vitkit.train.runfolder import RunFolder\n"
        f"held = RunFolder({str(run)!r})\n"
        "held.acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(TrainingError, match=rf"in use by another run \(pid {proc.pid} "):
            Trainer(tiny(), run)
    finally:
        proc.kill()
        proc.wait()
    assert f"pid {proc.pid}" in (run / ".lock").read_text()  # the killed holder's file is still there...
    assert train(tiny(), run).step == 4  # ...and blocks nothing


# -- 6. temporaries of killed writes ----------------------------------------------------------------


def test_temporaries_of_killed_writes_are_removed_at_start(tmp_path):
    run = tmp_path / "run"
    train(tiny(), run)
    # A process killed inside atomic_write, as a SIGKILL would leave it.
    code = (
        "import os, sys\n"
        "from vitkit.files import atomic_write\n"
        "atomic_write(sys.argv[1], lambda f: (f.write(b'partial'), f.flush(), os._exit(9)))\n"
    )
    for target in (run / "checkpoints" / "step_0000006.safetensors", run / "metrics.jsonl", run / "notes.txt"):
        assert subprocess.run([sys.executable, "-c", code, str(target)]).returncode == 9
    left = sorted(p.name for p in [*run.iterdir(), *(run / "checkpoints").iterdir()] if p.name.endswith(".tmp"))
    assert len(left) == 3
    messages = Messages()
    train(tiny(), run, messages)
    left = sorted(p.name for p in [*run.iterdir(), *(run / "checkpoints").iterdir()] if p.name.endswith(".tmp"))
    assert len(left) == 1 and left[0].startswith(".notes.txt.")  # not a file of the run's: not its to remove
    assert messages.lines[0].startswith(f"{run}: removed 2 temporary files a killed run left (")


def test_a_killed_plot_write_is_removed_too(tmp_path):
    run = tmp_path / "run"
    train(tiny(), run)
    code = (
        "import os, sys\n"
        "from vitkit.files import atomic_write\n"
        "atomic_write(sys.argv[1], lambda f: (f.write(b'partial'), f.flush(), os._exit(9)))\n"
    )
    for name in ("curves.png", ".vitkit-run", "config.yaml", "summary.json", "README.md"):
        assert subprocess.run([sys.executable, "-c", code, str(run / name)]).returncode == 9
    train(tiny(), run, Messages())
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


# -- 6b. what a run folder is ---------------------------------------------------------------------


def _a_folder_of_other_files(root: Path, kind: str) -> Path:
    """Folders a careless --out names: a home folder, a dataset, a project, one with a log."""
    root.mkdir()
    if kind == "notes":
        (root / "notes.txt").write_text("mine")
    elif kind == "dataset":
        (root / "cat").mkdir()
        (root / "cat" / "a.png").write_bytes(b"png")
    elif kind == "config-only":
        (root / "config.yaml").write_text("mine: 1\n")  # a config.yaml alone is not a run
    elif kind == "hidden":
        (root / ".bashrc").write_text("export X=1\n")
    return root


@pytest.mark.parametrize("kind", ["notes", "dataset", "config-only", "hidden"])
def test_a_folder_of_other_files_is_refused_and_left_as_it_was(tmp_path, kind):
    out = _a_folder_of_other_files(tmp_path / "out", kind)
    before = sorted((p.relative_to(out), p.read_bytes() if p.is_file() else b"") for p in out.rglob("*"))
    with pytest.raises(vitkit.errors.UsageError, match=rf"^{out}: not empty \(.*\) and not a vitkit run folder"):
        train(tiny(), out)
    assert sorted((p.relative_to(out), p.read_bytes() if p.is_file() else b"") for p in out.rglob("*")) == before


def test_the_command_line_refuses_root_an_empty_name_and_a_file_in_one_line(tmp_path, capsys):
    recipe = write_tiny(tmp_path / "r.yaml")
    a_file = tmp_path / "a.txt"
    a_file.write_text("x")
    for out, message in (
        ("/", "/: not empty ("),
        ("", "--out is empty"),
        (str(a_file), f"{a_file}: is a file, not a folder"),
    ):
        assert main(["train", "--config", str(recipe), "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert a_file.read_text() == "x"


def test_new_empty_marked_and_older_run_folders_are_run_folders(tmp_path):
    new = tmp_path / "new"
    train(tiny(), new)
    assert (new / ".vitkit-run").is_file()
    (new / "train.log").write_text("a user's log beside the run")  # a marked folder may hold more
    assert train(tiny(), new).resumed_from == 4
    empty = tmp_path / "empty"
    empty.mkdir()
    train(tiny(train__steps=2), empty)
    assert (empty / ".vitkit-run").is_file()
    # a run folder from before the marker: the lock and the config, or step checkpoints
    (new / ".vitkit-run").unlink()
    assert train(tiny(), new).resumed_from == 4
    assert (new / ".vitkit-run").is_file()
    older = tmp_path / "older"
    older.mkdir()
    (older / ".lock").write_text("pid 1 on host, started then\n")
    (older / "config.yaml").write_text(json.dumps(tiny().to_dict()))
    train(tiny(train__steps=2), older)
    assert (older / ".vitkit-run").is_file()


@pytest.mark.parametrize("left", [[".lock"], [".lock", "..vitkit-run.k3j_x9a2.tmp"], [".config.yaml.ab12cd34.tmp"]])
def test_a_folder_a_stopped_start_left_is_a_run_folder(tmp_path, left):
    out = tmp_path / "run"
    out.mkdir()
    for name in left:
        (out / name).write_text("")
    train(tiny(), out)
    assert (out / ".vitkit-run").is_file() and not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_run_that_cannot_start_leaves_no_folder_behind(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError):
        train(tiny(train__batch_size=10_000), out)
    assert not out.exists()


# -- 7. a full disk, a read-only folder --------------------------------------------------------------


def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    from vitkit.checkpoint import io

    real = io.atomic_write

    def full_at_step_4(path, write, mode="wb"):
        if Path(path).name == "step_0000004.safetensors":

            def partial(f):
                f.write(b"\0" * 100)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            return real(path, partial, mode)
        return real(path, write, mode)

    monkeypatch.setattr(io, "atomic_write", full_at_step_4)
    run = tmp_path / "run"
    with pytest.raises(TrainingError) as e:
        train(tiny(train__steps=6), run)
    assert str(e.value) == (
        f"{run / 'checkpoints' / 'step_0000004.safetensors'}: cannot write the checkpoint (No space left on device); "
        f"the run stops at step 4, {run / 'checkpoints' / 'step_0000002.safetensors'} is kept"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000002.safetensors"]  # no temporary
    assert load_train_state(run / "checkpoints" / "step_0000002.safetensors").state.step == 2
    monkeypatch.setattr(io, "atomic_write", real)
    assert train(tiny(train__steps=6), run).resumed_from == 2  # room again: it goes on


def test_a_read_only_log_stops_the_run_in_one_line(tmp_path, monkeypatch):
    def read_only(self, record):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.metrics))

    monkeypatch.setattr(RunFolder, "append_metrics", read_only)
    with pytest.raises(TrainingError) as e:
        train(tiny(), tmp_path / "run")
    assert str(e.value) == (
        f"{tmp_path / 'run' / 'metrics.jsonl'}: cannot append to the log (Read-only file system); "
        "the run stops at step 1, no checkpoint was written"
    )


# -- recipes read by one YAML loader with limits ----------------------------------------------------

_BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_BILLION_LAUGHS, "values once its aliases are expanded"),
        ("train: {steps: " + "[" * 3000 + "]" * 3000 + "}", "nested more than"),
        ("train: {steps: " + "[" * 60 + "]" * 60 + "}", "nested more than"),
        ("a: &a [*a]\n", "not valid YAML|nested more than"),
        ("train: !!python/object/apply:os.system ['echo hi']\n", "not valid YAML"),
        ("train: !!python/name:os.system\n", "not valid YAML"),
        ("train: {steps: 1\n", "not valid YAML"),
        ("x: " + "y" * 1_100_000, "characters of YAML"),
    ],
)
def test_hostile_yaml_is_one_line_from_a_file_and_from_set(tmp_path, capsys, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with deadline(30):
        assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(path) in err[0] and re.search(message, err[0]), err
        value = text.split(":", 1)[1].strip() if text.startswith("train:") else text
        key = "train" if text.startswith("train:") else "description"
        assert main(["train", "--out", str(tmp_path / "run"), "--set", f"{key}={value}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and len(err[0]) < 400, err
    assert not (tmp_path / "run").exists()


def test_an_undecodable_recipe_is_named(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_bytes(b"train:\n  steps: \xff\xfe4\n")
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    assert f"{path}: not UTF-8 text (byte " in capsys.readouterr().err


def test_a_long_bad_value_is_quoted_short():
    with pytest.raises(RecipeError) as e:
        load_recipe(None, parse_set(["train.steps=" + "x" * 100_000]))
    assert len(str(e.value)) < 200


# -- values with bounds, and a model that cannot fit ------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model.overrides.width", 10**9),
        ("model.overrides.mlp_dim", 10**8),
        ("model.overrides.depth", 10**6),
        ("model.overrides.num_classes", 10**9),
        ("model.overrides.img_size", 10**6),
        ("augment.erase_count", 10**9),
        ("augment.repeats", 10**6),
        ("train.batch_size", 10**12),
        ("train.accum_steps", 10**9),
        ("data.num_workers", 10**6),
    ],
)
def test_a_huge_value_is_refused_when_the_recipe_is_read(key, value):
    with pytest.raises(RecipeError, match=rf"^{re.escape(key)} must be in \[") as e:
        load_recipe(None, parse_set([f"{key}={value}"]))
    assert len(str(e.value)) < 120


@pytest.mark.parametrize(
    "overrides",
    [
        {"width": 65536, "depth": 1024, "num_heads": 1024},  # within each bound, ~17e12 parameters
        {"width": 49152, "mlp_dim": 262144, "depth": 200, "num_heads": 48},
        {"num_classes": 1_000_000, "width": 65536, "num_heads": 64, "depth": 1},
    ],
)
def test_a_model_that_cannot_fit_memory_is_refused_before_it_is_built(overrides):
    with deadline(20), pytest.raises(vitkit.errors.UsageError, match=r"^model: the model \(width .* GiB available"):
        vitkit.create_model("vit_b16", **overrides)


def test_a_training_batch_that_cannot_fit_is_refused_in_one_line(tmp_path):
    big = {"img_size": 256, "patch_size": 2, "width": 256, "depth": 12, "num_heads": 4, "mlp_dim": 1024}
    # 16384 tokens an image: the attention weights a step keeps are ~100 GiB an image
    recipe = tiny(model__overrides=big, data__options={"img_size": 256, "n": 64})
    message = r"training at batch 16; cpu has .* available"
    with deadline(60), pytest.raises(vitkit.errors.UsageError, match=message):
        train(recipe, tmp_path / "run")


@pytest.mark.parametrize(
    "argv",
    [
        "fewshot CKPT --seeds 1000000000",
        "fewshot CKPT --shots 5 100000000",
        "bench --batch 1000000000",
        "models --num-classes 100000000000",
        "predict CKPT IMG --top-k 99999999999",
        "reproduce --out OUT --jobs 100000",
    ],
)
def test_a_huge_flag_is_refused_in_one_line(tmp_path, capsys, argv):
    args = argv.replace("CKPT", str(tmp_path / "m.safetensors")).replace("IMG", str(tmp_path / "x.png"))
    with pytest.raises(SystemExit) as e:
        main(args.replace("OUT", str(tmp_path / "o")).split())
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "must be at most" in err[-1]


def test_the_models_table_is_computed_without_building_the_weights(capsys):
    from vitkit.models.flops import count_params
    from vitkit.models.summary import describe_models

    with deadline(30):
        rows = describe_models(["vit_h14", "bit_r152x4", "vit_ti16"])
    assert rows[2]["params"] == count_params(vitkit.create_model("vit_ti16"))
    assert rows[0]["params"] == 632_045_800
