"""The training core: the run plan (every check before the first step), the objectives, the event
stream and its trackers, the record of measured choices and their pins, and stopping on a signal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from _recipes import TINY_VIT, changed, tiny_recipe
from vitkit.data.mix import MixConfig
from vitkit.errors import RecipeError, RunStopped
from vitkit.train import load_recipe, train
from vitkit.train.events import Background, Event, Events, Sink
from vitkit.train.loop import Trainer
from vitkit.train.objectives import Sigmoid, Softmax, loss_fn, objective_for
from vitkit.train.plan import RunPlan, micro_batch
from vitkit.train.state import list_checkpoints, load_train_state

SRC = Path(__file__).resolve().parents[1] / "src" / "vitkit"


def _write(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(changed(TINY_VIT, **changes)))
    return path


def _vitkit(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vitkit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )


# -- the plan ---------------------------------------------------------------------------------------
def test_a_head_of_other_classes_than_the_evaluation_split_is_refused_before_training(tmp_path):
    recipe = tiny_recipe(tmp_path, model__overrides__num_classes=1000, data__eval_split="test")
    with pytest.raises(RecipeError, match=r"predicts 1000 classes .* synthetic/test has 10; set --set "
                       r"model\.overrides\.num_classes=10"):  # fmt: skip
        RunPlan.from_recipe(recipe)
    assert not (tmp_path / "run").exists()


def test_train_plan_prints_the_plan_and_trains_nothing(tmp_path):
    out = _vitkit("train", "--config", str(_write(tmp_path)), "--out", str(tmp_path / "run"), "--plan", "--steps", "6")
    assert out.returncode == 0, out.stderr
    assert "schedule: 6 steps" in out.stdout  # the overrides are in the plan it prints
    assert "batch: 16 a step = 1 processes x 1 micro-steps x 16" in out.stdout
    assert "precision: fp32" in out.stdout and "(nothing trained: --plan)" in out.stdout
    assert not (tmp_path / "run").exists()


def test_the_micro_batch_is_one_formula():
    recipe = changed(TINY_VIT, train__batch_size=64, train__accum_steps=4)
    from vitkit.train.config import recipe_from_dict

    assert micro_batch(recipe_from_dict(recipe), 2) == 8


# -- objectives ------------------------------------------------------------------------------------
def test_the_objectives_own_their_loss_and_targets():
    g = torch.Generator().manual_seed(0)
    x, logits, y = torch.randn(4, 3, 8, 8), torch.randn(4, 5, generator=g), torch.tensor([0, 1, 2, 3])
    soft = objective_for(_train(loss="softmax"), 5, MixConfig(label_smoothing=0.1), None)
    assert isinstance(soft, Softmax)
    xs, ys = soft.targets(x, y, g)
    assert xs is x and torch.equal(ys, y)  # no mixing: the class indices
    assert soft.loss(x, logits, ys).item() == pytest.approx(loss_fn(logits, y, "softmax", 0.1).item())
    sig = objective_for(_train(loss="sigmoid"), 5, MixConfig(), None)
    assert isinstance(sig, Sigmoid)
    rows = torch.zeros(4, 3)
    rows[0, 1] = 1
    _, targets = sig.targets(x, rows, g)  # multi-hot rows of 3 data classes, padded to 5 outputs
    assert targets.shape == (4, 5) and targets[0, 1] == 1 and targets[:, 3:].sum() == 0
    mixed = objective_for(_train(loss="softmax"), 5, MixConfig(mixup_alpha=0.8), None)
    _, soft_targets = mixed.targets(x, y, g)
    assert soft_targets.shape == (4, 5) and torch.allclose(soft_targets.sum(1), torch.ones(4))


def _train(**keys):
    from vitkit.train.config import TrainSection

    return TrainSection(**keys)


# -- events and trackers ---------------------------------------------------------------------------
class _Failing(Sink):
    def on_event(self, event: Event) -> None:
        raise ConnectionError("tracker server unreachable")


class _Slow(Sink):
    def __init__(self) -> None:
        import threading

        self.release = threading.Event()

    def on_event(self, event: Event) -> None:
        self.release.wait(5)


def test_a_failing_or_hanging_tracker_never_stops_or_blocks_the_run():
    warnings: list[str] = []
    failing = Background(_Failing(), "failing", warnings.append)
    slow = _Slow()
    hanging = Background(slow, "hanging", warnings.append, capacity=2, close_timeout=0.2)
    events = Events([failing, hanging])
    for step in range(10):  # returns at once although one sink raises and the other waits
        events.publish("step", step, {"loss": 1.0})
    events.close()
    slow.release.set()
    assert any(
        "failing stopped logging after an error (ConnectionError: tracker server unreachable)" in w for w in warnings
    )
    assert any("hanging: still busy after 0 s" in w for w in warnings)
    assert any(re.search(r"hanging: [789] events were dropped", w) for w in warnings)  # 2 wait, 1 in hand


def test_a_tracker_whose_package_is_missing_is_refused_at_the_start(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(RecipeError, match=r"log.trackers: wandb needs the wandb package \(pip install wandb\)"):
        RunPlan.from_recipe(tiny_recipe(tmp_path, log__trackers=["wandb"]))


@pytest.mark.slow
def test_mlflow_logs_a_runs_curves_in_its_local_sqlite_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    recipe = tiny_recipe(tmp_path, log__trackers=["mlflow"], data__eval_split="test", log__eval_every=4)
    train(recipe, tmp_path / "run")
    assert not any((tmp_path / "cwd").iterdir())  # nothing in the working directory: all in the run folder
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == tmp_path.name]
    (run,) = client.search_runs([exp.experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == list(range(1, 9))
    assert [m.step for m in client.get_metric_history(run.info.run_id, "top1")] == [4, 8]
    assert run.data.params["train.steps"] == "8" and run.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "README.md"} <= artifacts
    assert (tmp_path / "run" / "mlflow-artifacts").is_dir()


def _wandb_history(path: Path) -> dict[int, dict]:
    """The history rows of an offline W&B run file: records of the LevelDB log format (32 KiB blocks
    of crc, length, type, data) after a 7-byte header, each a ``wandb_internal_pb2.Record``."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, rows = path.read_bytes(), 7, b"", {}
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if n == 0 and kind == 0:
            break
        buf, pos = buf + data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            if record.WhichOneof("record_type") == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                rows.setdefault(record.history.step.num, {}).update(items)
    return rows


def test_wandb_logs_a_runs_curves_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    recipe = tiny_recipe(tmp_path, log__trackers=["wandb"], data__eval_split="test", log__eval_every=4)
    train(recipe, tmp_path / "run")
    (run_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/*.wandb")  # offline: synced later
    rows = _wandb_history(run_file)
    assert sorted(rows) == list(range(1, 9)) and all("loss" in r and "lr" in r for r in rows.values())
    assert [s for s, r in rows.items() if "top1" in r] == [4, 8]


# -- measured choices and their pins ---------------------------------------------------------------
def test_a_runs_summary_records_each_measured_choice_and_the_pins_reproduce_them(tmp_path):
    recipe = _write(tmp_path, train__precision="auto", train__steps=2, data__eval_split="test", log__eval_every=2)
    a = _vitkit("train", "--config", str(recipe), "--out", str(tmp_path / "a"))
    assert a.returncode == 0, a.stderr
    choices = json.loads((tmp_path / "a" / "summary.json").read_text())["measured_choices"]
    kinds = {c["kind"] for c in choices}
    assert "precision" in kinds and "attention" in kinds, choices
    attention = [c for c in choices if c["kind"] == "attention"]
    assert all(c["how"] == "measured" and c["value"] in ("math", "recompute") for c in attention)
    # pinning each choice to what the first run measured makes the second decide alike, unmeasured
    pins = {"VITKIT_ATTENTION": attention[0]["value"]}
    precision = next(c for c in choices if c["kind"] == "precision")
    pins["VITKIT_BF16"] = precision["value"]
    b = _vitkit("train", "--config", str(recipe), "--out", str(tmp_path / "b"), **pins)
    assert b.returncode == 0, b.stderr
    again = json.loads((tmp_path / "b" / "summary.json").read_text())["measured_choices"]
    assert {(c["kind"], c["key"], c["value"]) for c in again} >= {(c["kind"], c["key"], c["value"]) for c in attention}
    assert all(c["how"].startswith("pinned by VITKIT_") for c in again if c["kind"] in ("attention", "precision"))


def test_a_bad_pin_is_named_in_one_line(tmp_path):
    out = _vitkit("train", "--config", str(_write(tmp_path)), "--out", str(tmp_path / "r"), VITKIT_ATTENTION="fast")
    assert out.returncode == 2 and "VITKIT_ATTENTION='fast': use math or recompute" in out.stderr
    out = _vitkit("train", "--config", str(_write(tmp_path)), "--out", str(tmp_path / "w"), VITKIT_WAIT="fast")
    assert out.returncode == 2 and "VITKIT_WAIT='fast': use spin or passive" in out.stderr


# -- a busy machine --------------------------------------------------------------------------------
_CHOOSE = (
    "import os, sys, vitkit.runtime as r\n"
    "r.busy_cores_elsewhere = lambda seconds: float(sys.argv[1])\n"
    "c = r.choose_wait_policy()\n"
    "print(c['value'], os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)\n"
)


@pytest.mark.parametrize(
    "busy, env, want",
    [
        ("1.9", {}, "passive PASSIVE False"),  # a rival holds the cores: sleep at once
        ("0.1", {}, "spin None False"),  # a machine of one's own: libgomp's default
        ("1.9", {"OMP_WAIT_POLICY": "ACTIVE"}, "as set ACTIVE False"),  # the user's setting is kept
        ("0.1", {"VITKIT_WAIT": "passive"}, "passive PASSIVE False"),  # the pin wins over the load
    ],
)
def test_openmps_wait_policy_is_chosen_from_the_load_before_torch_starts(busy, env, want):
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VITKIT_WAIT")}
    out = subprocess.run([sys.executable, "-c", _CHOOSE, busy], capture_output=True, text=True, env={**base, **env})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == want


def test_a_run_says_how_its_threads_wait_and_records_it(tmp_path):
    out = _vitkit("train", "--config", str(_write(tmp_path)), "--out", str(tmp_path / "r"), VITKIT_WAIT="passive")
    assert out.returncode == 0, out.stderr
    assert "OpenMP threads wait passively: pinned by VITKIT_WAIT (VITKIT_WAIT=spin to spin)" in out.stdout + out.stderr
    choices = json.loads((tmp_path / "r" / "summary.json").read_text())["measured_choices"]
    (wait,) = [c for c in choices if c["kind"] == "wait"]
    assert wait["value"] == "passive" and wait["how"] == "pinned by VITKIT_WAIT"


# -- stopping --------------------------------------------------------------------------------------
def test_sigterm_writes_a_checkpoint_and_the_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    recipe = tiny_recipe(tmp_path, log__checkpoint_every=0, train__ema_decay=0.9, model__overrides__drop_rate=0.1)
    whole = train(recipe, tmp_path / "whole")
    real = Trainer.train_step

    def terminated_in_step_5(self, images, labels):
        if self.state.step == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives during the step: the step finishes first
        return real(self, images, labels)

    monkeypatch.setattr(Trainer, "train_step", terminated_in_step_5)
    with pytest.raises(RunStopped, match=r"stopped by SIGTERM at step 5; checkpoint step_0000005 written") as e:
        train(recipe, tmp_path / "cut")
    assert e.value.signum == signal.SIGTERM
    assert [p.name for p in list_checkpoints(tmp_path / "cut" / "checkpoints")] == ["step_0000005.safetensors"]
    monkeypatch.setattr(Trainer, "train_step", real)
    resumed = train(recipe, tmp_path / "cut")
    assert resumed.resumed_from == 5 and resumed.step == whole.step == 8
    a = load_train_state(list_checkpoints(tmp_path / "whole" / "checkpoints")[-1]).model_state
    b = load_train_state(list_checkpoints(tmp_path / "cut" / "checkpoints")[-1]).model_state
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoints_follow_the_clock_as_well_as_the_steps(tmp_path):
    recipe = tiny_recipe(tmp_path, log__checkpoint_every=0, log__checkpoint_minutes=1e-9, log__keep_last=20)
    train(recipe, tmp_path / "run")
    steps = [load_train_state(p).state.step for p in list_checkpoints(tmp_path / "run" / "checkpoints")]
    assert steps == list(range(1, 9))  # a checkpoint after every step: each took longer than the interval


# -- the shape of the core -------------------------------------------------------------------------
def test_the_trainer_stays_small_and_takes_no_untyped_trainer():
    import ast

    tree = ast.parse((SRC / "train" / "loop.py").read_text())
    (trainer,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    methods = [n for n in trainer.body if isinstance(n, ast.FunctionDef)]
    assert trainer.end_lineno - trainer.lineno + 1 <= 350 and len(methods) <= 18
    raises = [n for n in ast.walk(tree) if isinstance(n, ast.Raise) and "RecipeError" in ast.unparse(n)]
    assert not raises, "recipe checks belong to the plan"
    for path in (SRC / "train").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args:
                    if arg.arg in ("t", "trainer") and (arg.annotation is None or ast.unparse(arg.annotation) == "Any"):
                        raise AssertionError(f"{path.name}:{node.lineno} {node.name} takes an untyped trainer")


# -- adapters through the core ---------------------------------------------------------------------
def _base(tmp_path: Path) -> Path:
    import vitkit

    torch.manual_seed(0)
    overrides = TINY_VIT["model"]["overrides"]
    vitkit.save_checkpoint(vitkit.create_model("vit_ti16", **overrides, num_classes=10), tmp_path / "base.safetensors")
    return tmp_path / "base.safetensors"


def test_a_lora_finetune_trains_only_the_adapters_and_the_head_and_resumes_exactly(tmp_path, monkeypatch):
    import vitkit
    from _recipes import stopped_and_resumed
    from vitkit.checkpoint.adapters import load_adapters
    from vitkit.checkpoint.native import read_native

    base = _base(tmp_path)
    adapter = {"kind": "lora", "rank": 2, "targets": ["q", "v", "fc1"]}
    recipe = tiny_recipe(tmp_path, model__init_from=str(base), finetune__adapter=adapter, data__eval_split="test",
                         log__eval_every=8, train__steps=8, optim__lr=0.01)  # fmt: skip
    whole = train(recipe, tmp_path / "whole")
    final = load_train_state(list_checkpoints(tmp_path / "whole" / "checkpoints")[-1]).model_state
    start = read_native(base)[0]
    frozen = [k for k in start if not k.startswith("head.")]
    assert all(torch.equal(final[k], start[k]) for k in frozen)  # the base did not move
    assert any(not torch.equal(final[k], torch.zeros_like(final[k])) for k in final if ".lora_B." in k)
    # best.safetensors serves as plain weights: equal to the base with the adapter file applied
    merged = vitkit.load_pretrained(tmp_path / "whole" / "best.safetensors").eval()
    applied = vitkit.load_pretrained(base, num_classes=10).eval()
    load_adapters(applied, tmp_path / "whole" / "adapter.safetensors")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(merged(x), applied(x), atol=1e-5)
    resumed = stopped_and_resumed(recipe, tmp_path / "cut", 5, monkeypatch)
    assert resumed.resumed_from == 4 and resumed.step == whole.step
    again = load_train_state(list_checkpoints(tmp_path / "cut" / "checkpoints")[-1]).model_state
    assert all(torch.equal(final[k], again[k]) for k in final)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({}, r"finetune.adapter adapts pretrained weights: set model.init_from"),
        ({"train__ema_decay": 0.9, "model__init_from": "x.safetensors"}, r"does not take train.ema_decay"),
        ({"model__init_from": "x.safetensors", "finetune__adapter__rank": 0}, r"finetune.adapter.rank must be"),
    ],
)
def test_adapter_recipes_that_cannot_work_are_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(RecipeError, match=message):
        tiny_recipe(tmp_path, finetune__adapter={"kind": "lora"}, **changes)


def test_serving_export_and_bench_import_nothing_from_training():
    import ast

    for name in ("export.py", "bench.py", "inference.py"):
        for node in ast.walk(ast.parse((SRC / name).read_text())):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                assert not target.startswith((".train", "vitkit.train")), f"{name} imports {target}"


def test_eval_of_a_runs_best_weights_gives_the_runs_own_validation_top1(tmp_path):
    import numpy as np
    from PIL import Image

    import vitkit
    from vitkit.data import build_dataset
    from vitkit.eval.classify import model_outputs
    from vitkit.eval.predict import stored_decoding

    rng = np.random.default_rng(0)
    for c in range(3):  # odd-sized photographs of three faintly different tints
        (tmp_path / "photos" / f"class{c}").mkdir(parents=True)
        for i in range(20):
            a = rng.integers(0, 256, (40 + i, 57, 3)).astype(np.int16)
            a[..., c] += 30
            Image.fromarray(a.clip(0, 255).astype(np.uint8)).save(tmp_path / "photos" / f"class{c}" / f"{i}.jpg")
    data, run = str(tmp_path / "photos"), tmp_path / "run"
    out = _vitkit("train", "--data", data, "--out", str(run), "--steps", "6", "--precision", "fp32")
    assert out.returncode == 0, out.stderr
    model = vitkit.load_pretrained(run / "best.safetensors").eval()
    assert stored_decoding(model) == {"load_size": [74, 74]}
    plan = RunPlan.from_recipe(load_recipe(run / "config.yaml"))
    seen = model_outputs(
        model, plan.eval_ds, "logits", 64, "cpu", "fp32", None, None, 0, None, transform=plan.transform
    )
    again = model_outputs(model, build_dataset(data, "val", **stored_decoding(model)), "logits", 64, "cpu", "fp32",
                          None, None, 0, None)  # fmt: skip
    assert torch.equal(seen.outputs, again.outputs)  # the same pixels, so the same logits
    best = json.loads((run / "summary.json").read_text())["best_score"]
    scored = _vitkit(
        "eval", str(run / "best.safetensors"), "--data", data, "--split", "val", "--precision", "fp32",
        "--out", str(tmp_path / "eval"),
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert re.search(rf"top-1\s+{100 * best:.2f}%", scored.stdout), (best, scored.stdout)
