"""Fine-tuning on one's own images: labels files (CSV, JSON lines, multi-label), what a run ends
with (per-epoch table, per-class scores, confusion matrix, worst images, model card), the warnings,
the metrics against scikit-learn, multi-label thresholds through predict, and a labels-file run
killed with SIGKILL that resumes bit-exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from _recipes import TINY_VIT, changed
from conftest import free_port
from vitkit.data import build_dataset
from vitkit.errors import DataError, TrainingError
from vitkit.eval.classify import confusion_matrix, per_class_prf
from vitkit.eval.multilabel import best_thresholds, multilabel_ap, multilabel_metrics, multilabel_prf
from vitkit.train import load_recipe, train
from vitkit.train.advice import chance_warning, few_images_warning, never_predicted_warning

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def _image(path: Path, colour: int, g: torch.Generator) -> None:
    img = (torch.rand(16, 16, 3, generator=g) * 60).to(torch.uint8)
    img[..., colour % 3] += 150
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img.numpy()).save(path)


def labels_file(root: Path, rows: list[tuple[str, str]], name: str = "train.csv", seed: int = 0) -> Path:
    """Images under ``root/images`` and a labels file naming them (relative paths)."""
    g = torch.Generator().manual_seed(seed)
    classes = sorted({x for _, labels in rows for x in labels.split()})
    for rel, labels in rows:
        if not (root / rel).exists():
            _image(root / rel, classes.index(labels.split()[0]), g)
    path = root / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps({"path": rel, "labels": labels.split()}) + "\n" for rel, labels in rows))
    else:
        path.write_text("path,labels\n" + "".join(f"{rel},{labels}\n" for rel, labels in rows))
    return path


def single_rows(per_class: int = 10, classes: str = "abc") -> list[tuple[str, str]]:
    return [(f"images/{c}{i}.png", c) for c in classes for i in range(per_class)]


def multi_rows(n: int = 48) -> list[tuple[str, str]]:
    names = ["a", "b", "c"]
    return [(f"images/m{i}.png", " ".join(sorted({names[i % 3], names[(i // 3) % 3]}))) for i in range(n)]


# -- labels files ---------------------------------------------------------------------------------
def test_csv_and_jsonl_read_the_same_with_a_stratified_minival(tmp_path):
    rows = single_rows(10)
    csv_file = labels_file(tmp_path, rows)
    jsonl_file = labels_file(tmp_path, rows, "train.jsonl")
    for f in (csv_file, jsonl_file):
        train = build_dataset(str(f), "train", load_size=16)
        val = build_dataset(str(f), "val", load_size=16)
        assert train.classes == ["a", "b", "c"] and not train.multilabel
        assert len(train) + len(val) == 30
        assert torch.bincount(val.labels, minlength=3).tolist() == [1, 1, 1]  # a tenth, one of each class
        assert not {p for p, _ in train.samples} & {p for p, _ in val.samples}
        assert all(Path(p).is_file() for p, _ in train.samples)  # relative to the file's folder
        images, labels = next(iter(train.batches(4)))
        assert images.shape == (4, 3, 16, 16) and labels.dtype == torch.int64


def test_a_spreadsheets_csv_with_a_byte_order_mark_and_crlf_reads_as_plain_csv(tmp_path):
    rows = single_rows(10)
    plain = labels_file(tmp_path, rows)
    excel = tmp_path / "excel.csv"  # what "CSV UTF-8" of a spreadsheet writes
    excel.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    a, b = build_dataset(str(plain), "train", load_size=16), build_dataset(str(excel), "train", load_size=16)
    assert a.classes == b.classes and a.samples == b.samples


def test_a_validation_file_is_read_with_the_training_classes(tmp_path):
    train_file = labels_file(tmp_path, single_rows(6))
    val_file = labels_file(tmp_path, [(f"images/v{c}.png", c) for c in "ab"], "val.csv")
    val = build_dataset(str(train_file), "val", val=str(val_file), load_size=16)
    assert val.classes == ["a", "b", "c"] and len(val) == 2
    assert len(build_dataset(str(train_file), "train", val=str(val_file), load_size=16)) == 18
    bad = labels_file(tmp_path, [("images/v_a.png", "a"), ("images/vz.png", "zebra")], "bad_val.csv")
    with pytest.raises(DataError, match=r"bad_val.csv line 3: label 'zebra' is not a class of the training file"):
        build_dataset(str(train_file), "val", val=str(bad), load_size=16)


@pytest.mark.parametrize(
    "text, message",
    [
        ("path,labels\nimages/a0.png,a\nimages/nowhere.png,b\n", r"train.csv line 3: .*nowhere.png does not exist"),
        ("path,labels\nimages/a0.png,a\nimages/b0.png,b,extra\n", r"train.csv line 3: 3 fields where the header has 2"),
        ("path,labels\nimages/a0.png,a\nimages/b0.png,\n", r"train.csv line 3: images/b0.png has no labels"),
        ("file,label\nimages/a0.png,a\n", r"train.csv line 1: no column path or labels in the header"),
    ],
)
def test_a_bad_csv_is_one_line_naming_the_file_and_line(tmp_path, text, message):
    labels_file(tmp_path, single_rows(2, "ab"))
    (tmp_path / "train.csv").write_text(text)
    with pytest.raises(DataError, match=message):
        build_dataset(str(tmp_path / "train.csv"), "train", load_size=16)


def test_a_bad_jsonl_row_and_a_class_too_small_for_the_minival(tmp_path):
    labels_file(tmp_path, single_rows(2, "ab"))
    (tmp_path / "train.jsonl").write_text('{"path": "images/a0.png", "labels": "a"}\n{"path": "images/b0.png"\n')
    with pytest.raises(DataError, match=r"train.jsonl line 2: not a JSON object"):
        build_dataset(str(tmp_path / "train.jsonl"), "train")
    small = labels_file(tmp_path, [*single_rows(6, "ab"), ("images/c0.png", "c")], "small.csv")
    with pytest.raises(DataError, match=r"small.csv.*takes every image of class c \(1\)"):
        build_dataset(str(small), "train", load_size=16)


def test_a_multi_label_file_gives_multi_hot_rows(tmp_path):
    f = labels_file(tmp_path, multi_rows(48))
    train = build_dataset(str(f), "train", load_size=16)
    val = build_dataset(str(f), "val", load_size=16)
    assert train.multilabel and val.multilabel and len(train) + len(val) == 48
    _, rows = next(iter(train.batches(8)))
    assert rows.shape == (8, 3) and rows.dtype == torch.float32 and set(rows.sum(1).tolist()) <= {1.0, 2.0}
    assert torch.equal(rows, train.label_rows[:8])  # batches in file order carry the rows of those images
    assert (val.label_rows.sum(0) > 0).all()  # the minival holds every label


def test_a_row_with_several_labels_in_a_single_label_dataset_is_named(tmp_path):
    from vitkit.data.labels import LabelsFile

    f = labels_file(tmp_path, multi_rows(12))
    with pytest.raises(DataError, match=rf"^{f} line 3: 2 labels \(a, b\) in a single-label dataset"):
        LabelsFile(f, multilabel=False, load_size=16)


# -- metrics against scikit-learn -----------------------------------------------------------------
def test_per_class_precision_recall_f1_match_scikit_learn():
    g = torch.Generator().manual_seed(1)
    truth, predicted = torch.randint(0, 6, (500,), generator=g), torch.randint(0, 5, (500,), generator=g)
    rows = per_class_prf(confusion_matrix(predicted, truth, 6), list("abcdef"))
    p, r, f, s = sklearn_metrics.precision_recall_fscore_support(
        truth.numpy(), predicted.numpy(), labels=range(6), average=None, zero_division=0
    )
    for key, want in (("precision", p), ("recall", r), ("f1", f), ("support", s)):
        np.testing.assert_allclose([row[key] for row in rows], want, atol=1e-12)
    assert rows[5]["predicted"] == 0 and rows[5]["precision"] == 0.0


def test_average_precision_and_multilabel_f1_match_scikit_learn():
    g = torch.Generator().manual_seed(2)
    scores = torch.randint(0, 7, (300, 5), generator=g).float() / 6  # ties, as scikit-learn breaks them
    targets = (torch.rand(300, 5, generator=g) < 0.3).float()
    got = multilabel_ap(scores, targets)
    t, s = targets.numpy(), scores.numpy()
    np.testing.assert_allclose(got["per_class_ap"], sklearn_metrics.average_precision_score(t, s, average=None))
    assert got["map_macro"] == pytest.approx(sklearn_metrics.average_precision_score(t, s, average="macro"))
    assert got["map_micro"] == pytest.approx(sklearn_metrics.average_precision_score(t, s, average="micro"))
    predicted = (torch.rand(300, 5, generator=g) < 0.4).float()
    rows = multilabel_prf(predicted, targets, list("abcde"))
    p, r, f, _ = sklearn_metrics.precision_recall_fscore_support(t, predicted.numpy(), average=None, zero_division=0)
    np.testing.assert_allclose([row["f1"] for row in rows], f, atol=1e-12)
    np.testing.assert_allclose([row["precision"] for row in rows], p, atol=1e-12)
    np.testing.assert_allclose([row["recall"] for row in rows], r, atol=1e-12)


def test_thresholds_give_each_class_its_best_f1():
    g = torch.Generator().manual_seed(3)
    targets = (torch.rand(200, 4, generator=g) < 0.4).float()
    probs = (0.6 * targets + 0.7 * torch.rand(200, 4, generator=g)).clamp(0, 1)
    chosen = best_thresholds(probs, targets)
    m = multilabel_metrics(torch.logit(probs.clamp(1e-6, 1 - 1e-6)), targets, list("abcd"), chosen)
    for c in range(4):
        precision, recall, _ = sklearn_metrics.precision_recall_curve(targets[:, c].numpy(), probs[:, c].numpy())
        best = np.max(2 * precision * recall / np.maximum(precision + recall, 1e-12))
        assert m["per_class"][c]["f1"] == pytest.approx(best)


# -- warnings -------------------------------------------------------------------------------------
def test_each_warning_is_one_line_naming_what_is_wrong(tmp_path):
    f = labels_file(tmp_path, [*single_rows(30, "a"), *single_rows(5, "b")])
    text = few_images_warning(build_dataset(str(f), "train", load_size=16))
    assert text is not None and "1 of 2 classes have fewer than 20 training images: b (3)" in text
    assert "\n" not in text
    assert chance_warning(0.12, 10, 200) is not None and "within 5 points of chance (10.0% for 10 classes)" in (
        chance_warning(0.12, 10, 200) or ""
    )
    assert chance_warning(0.5, 10, 200) is None
    assert "mAP 31.0%" in (chance_warning(0.31, 4, 8, multilabel=True, baseline=0.3) or "")
    assert chance_warning(0.9, 4, 8, multilabel=True, baseline=0.3) is None
    assert "never predicted on the validation split: b, d" in (never_predicted_warning([3, 0, 2, 0], "abcd") or "")
    assert never_predicted_warning([1, 1], "ab") is None


def test_a_non_finite_loss_says_the_likely_cause_and_what_to_try(tmp_path):
    recipe = _recipe(
        tmp_path,
        "synthetic",
        optim__name="sgd",
        optim__lr=1e30,
        optim__warmup_steps=0,
        optim__schedule="constant",
        train__grad_clip=0.0,
        train__steps=20,
    )
    with pytest.raises(TrainingError) as e:
        train(recipe, tmp_path / "run")
    text = str(e.value)
    assert "non-finite loss at step" in text and "\n" not in text
    assert "too high for this model at batch 16" in text and "optim.lr=1e+29" in text and "warm-up" in text


# -- runs -----------------------------------------------------------------------------------------
def _recipe(tmp_path: Path, data: str, **changes):
    tree = changed(TINY_VIT, data__name=data, **changes)
    if data.endswith((".csv", ".jsonl")):
        tree["data"]["options"] = {"load_size": 16}
        tree["data"]["eval_split"] = "val"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_recipe(path)


def test_a_run_ends_with_its_table_per_class_scores_worst_images_and_model_card(tmp_path):
    f = labels_file(tmp_path, single_rows(8))  # 8 images a class: a warning
    result = train(_recipe(tmp_path, str(f), log__eval_every=4), tmp_path / "run")
    run, report = tmp_path / "run", result.report
    for name in ("summary.json", "epochs.csv", "README.md", "worst.png", "confusion.png", "confusion.json"):
        assert (run / name).is_file(), name
    assert [r["epoch"] for r in report.epochs] == list(range(1, len(report.epochs) + 1))
    assert report.best_epoch is not None and any(r["top1"] is not None for r in report.epochs)
    assert [r["class"] for r in report.per_class] == ["a", "b", "c"]
    assert sum(r["support"] for r in report.per_class) == 3
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_epoch"] == report.best_epoch and summary["warnings"] == report.warnings
    assert any("fewer than 20 training images" in w for w in summary["warnings"])
    card = (run / "README.md").read_text()
    assert "| a | 7 | 1 |" in card and "Started from: none (trained from scratch)" in card
    assert "adamw, lr 0.003" in card and "Trained on " in card and "fewer than 20 training images" in card
    assert (run / "epochs.csv").read_text().startswith("epoch,step,train_loss,val_loss,top1,map,seconds\n")
    assert Image.open(run / "worst.png").size[0] > 100


def test_a_run_that_learns_nothing_warns_of_chance_and_of_classes_never_predicted(tmp_path):
    f = labels_file(tmp_path, single_rows(24))  # a model that does not train predicts one class
    result = train(_recipe(tmp_path, str(f), optim__lr=0.0, log__eval_every=4), tmp_path / "run")
    warnings = result.report.warnings
    assert any(
        "validation top-1 37.5% at step 8 is within 5 points of chance (33.3% for 3 classes)" in w for w in warnings
    )
    assert any("2 of 3 classes were never predicted on the validation split" in w for w in warnings)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "warning" in r] == [8]  # at the second evaluation, in its record


def test_a_multi_label_run_stores_thresholds_that_predict_uses(tmp_path):
    from vitkit import load_pretrained
    from vitkit.eval import predict
    from vitkit.eval.predict import stored_thresholds

    f = labels_file(tmp_path, multi_rows(48))
    recipe = _recipe(tmp_path, str(f), train__loss="sigmoid", augment__mixup_alpha=0.4, log__eval_every=4)
    result = train(recipe, tmp_path / "run")
    assert result.multilabel and result.report.multilabel is not None
    assert {"map_macro", "map_micro", "baseline_map_macro", "thresholds"} <= set(result.report.multilabel)
    assert all("ap" in r and "threshold" in r for r in result.report.per_class)
    model = load_pretrained(tmp_path / "run" / "best.safetensors")
    thresholds = stored_thresholds(model)
    assert thresholds is not None and len(thresholds) == 3
    out = predict(model, torch.zeros(2, 3, 16, 16), thresholds=thresholds)
    assert all(all(r["prob"] >= r["threshold"] for r in rows) for rows in out)
    from vitkit.cli import main  # vitkit eval scores the labels file at the stored thresholds

    assert main(["eval", str(tmp_path / "run"), "--data", str(f), "--json", str(tmp_path / "eval.json")]) == 0
    got = json.loads((tmp_path / "eval.json").read_text())
    assert got["multilabel"] and got["thresholds"] == thresholds and got["num_images"] == 48
    assert 0.0 <= got["map_macro"] <= 1.0 and len(got["per_class"]) == 3
    with pytest.raises(Exception, match="train.loss=sigmoid"):
        train(_recipe(tmp_path, str(f)), tmp_path / "softmax")


def test_a_labels_file_run_killed_with_sigkill_resumes_bit_exact(tmp_path):
    """Killed (SIGKILL, in a process of its own) right after its first checkpoint, a multi-label
    run with Mixup resumes to the weights and summary of one never interrupted (both of those
    run here, on one thread as the killed one)."""
    from test_faults import DRIVER, ENV, final_weights

    f = labels_file(tmp_path, multi_rows(48))
    tree = changed(TINY_VIT, data__name=str(f), train__loss="sigmoid", augment__mixup_alpha=0.4)
    tree["data"].update(options={"load_size": 16}, eval_split="val")
    tree["log"].update(eval_every=4, checkpoint_every=4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tree))
    killed = subprocess.run(
        [sys.executable, "-c", DRIVER, "renamed:1", str(recipe), str(tmp_path / "run")], env=ENV, capture_output=True
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_recipe(recipe), tmp_path / "ref")
        resumed = train(load_recipe(recipe), tmp_path / "run")
    finally:
        torch.set_num_threads(threads)
    assert resumed.resumed_from == 4
    want, got = final_weights(tmp_path / "ref"), final_weights(tmp_path / "run")
    assert all(torch.equal(got[k], want[k]) for k in want)
    ref_summary = json.loads((tmp_path / "ref" / "summary.json").read_text())
    run_summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert run_summary["multilabel"] == ref_summary["multilabel"]
    assert [r["val_loss"] for r in run_summary["epochs"]] == [r["val_loss"] for r in ref_summary["epochs"]]


def test_finetune_with_no_other_flag_fits_its_recipe_and_says_so_first(tmp_path, capsys):
    import vitkit
    from vitkit.cli import main

    f = labels_file(tmp_path, single_rows(8, "ab"))  # 16 images: 14 to train on, a minival of 2
    weights = vitkit.save_checkpoint(
        vitkit.create_model("vit_ti16", img_size=24, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64),
        tmp_path / "w.safetensors",
    )
    rc = main(
        ["finetune", "--from", str(weights), "--data", str(f), "--out", str(tmp_path / "ft"), "--set", "log.plot=false"]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0] == "resolution 24x24 (the weights' resolution); images decoded at 28x28"
    assert out[1].startswith("schedule: 30 epochs of the 14 training images (2 classes): 30 steps of batch 8")
    assert out[2].startswith("learning rate: the new head at 0.0025 (SGD, momentum 0.9, cosine)")
    recipe = load_recipe(tmp_path / "ft" / "config.yaml")
    from vitkit.train.plan import RunPlan

    # the run's own plan counts epochs as the fitted recipe does (a short last batch left out)
    assert any(line.startswith("schedule: 30 steps (30.0 epochs)") for line in RunPlan.from_recipe(recipe).describe())
    assert (recipe.optim.name, recipe.optim.layer_decay, recipe.train.steps, recipe.log.eval_every) == (
        "sgd",
        0.75,
        30,
        1,
    )
    assert recipe.model.init_from == str(weights) and recipe.data.eval_split == "val"
    assert (tmp_path / "ft" / "README.md").is_file() and f"Started from: `{weights}`" in (
        tmp_path / "ft" / "README.md"
    ).read_text()


@pytest.mark.slow
def test_a_multi_label_run_under_torchrun_matches_one_process(tmp_path):
    """Two DDP processes (gloo) on a multi-label labels file take the losses of one process with
    the same global batch, and score the same mAP (every process scores the whole split)."""
    f = labels_file(tmp_path, multi_rows(48))
    tree = changed(TINY_VIT, data__name=str(f), train__loss="sigmoid", augment__crop="none", augment__flip=False)
    tree["data"].update(options={"load_size": 16}, eval_split="val")
    tree["train"]["steps"] = 4
    tree["log"].update(eval_every=4, checkpoint_every=4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tree))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = ["-m", "vitkit", "train", "--config", str(recipe), "--device", "cpu"]
    run = {"env": env, "capture_output": True, "text": True}
    one = subprocess.run([sys.executable, *base, "--out", str(tmp_path / "one")], **run)
    assert one.returncode == 0, one.stderr[-2000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port())]
    two = subprocess.run([*cmd, *base, "--out", str(tmp_path / "two")], **run)
    assert two.returncode == 0, two.stderr[-2000:]

    def logged(d: Path) -> list[dict]:
        return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]

    a, b = logged(tmp_path / "one"), logged(tmp_path / "two")
    la, lb = [r["loss"] for r in a if "loss" in r], [r["loss"] for r in b if "loss" in r]
    assert len(la) == len(lb) == 4 and max(abs(x - y) for x, y in zip(la, lb)) < 1e-5, (la, lb)
    ma, mb = [r["map"] for r in a if "map" in r], [r["map"] for r in b if "map" in r]
    assert len(ma) == len(mb) == 1 and abs(ma[0] - mb[0]) < 1e-5
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["multilabel"]["map_macro"] == pytest.approx(ma[0], abs=1e-6)


def test_finetune_fits_a_recipe_to_a_named_dataset_without_a_validation_split(tmp_path):
    """A named dataset (digits: train and test only) takes no decoding size, and the best weights
    are chosen on a minival held out of its training split, the test split left unseen."""
    import vitkit
    from vitkit.train.autofit import plan_finetune

    model = vitkit.create_model("vit_ti16", img_size=16, patch_size=4, in_chans=1, depth=1, width=16, num_heads=1,
                                mlp_dim=32, num_classes=10)  # fmt: skip
    vitkit.save_checkpoint(model, tmp_path / "base.safetensors")
    sets = dict(plan_finetune(str(tmp_path / "base.safetensors"), "digits").sets)
    assert sets["data.options"] == {} and sets["data.eval_split"] == "minival" and sets["data.minival"] == 0.1
