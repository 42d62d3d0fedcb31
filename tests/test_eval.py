"""vitkit.eval: known answers for metrics, few-shot least squares, probes and feature extraction."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import vitkit
from vitkit.checkpoint import Preprocessing
from vitkit.data import ArrayDataset, synthetic_dataset
from vitkit.eval import (
    RidgeEigen,
    classification_metrics,
    evaluate,
    extract_features,
    fewshot_eval,
    fewshot_indices,
    fewshot_needed_indices,
    knn_eval,
    linear_probe,
    ridge_closed_form,
    topk_accuracy,
    write_confusion_matrix,
)


def tiny_vit(**overrides) -> nn.Module:
    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=8, depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=10)
    return vitkit.create_model("vit_ti16", **{**kw, **overrides})


def clusters(n_per_class: int, num_classes: int = 6, dim: int = 24, spread: float = 0.3, seed: int = 0):
    """Gaussian blobs around well separated centres: linearly separable with a wide margin."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim)) * 4.0
    y = np.repeat(np.arange(num_classes), n_per_class)
    x = centres[y] + spread * rng.normal(size=(y.size, dim))
    perm = rng.permutation(y.size)
    return x[perm].astype(np.float32), y[perm]


# ----------------------------------------------------------------------------------------------
# ridge regression


@pytest.mark.parametrize("n, d", [(40, 7), (6, 15)])  # primal (N >= D) and dual (N < D) forms
@pytest.mark.parametrize("l2", [1e-3, 1.0, 1024.0])
def test_ridge_closed_form_equals_lstsq_on_augmented_system(n, d, l2):
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(n, d)), rng.normal(size=(n, 3))
    A = np.concatenate([X, np.sqrt(l2) * np.eye(d)])
    B = np.concatenate([Y, np.zeros((d, 3))])
    want = np.linalg.lstsq(A, B, rcond=None)[0]
    np.testing.assert_allclose(ridge_closed_form(X, Y, l2), want, rtol=1e-8, atol=1e-10)


def test_one_decomposition_serves_every_l2():
    rng = np.random.default_rng(2)
    for n, d in [(30, 9), (5, 12)]:
        X, Y = rng.normal(size=(n, d)), rng.normal(size=(n, 4))
        solver = RidgeEigen.fit(X, Y)
        for l2 in (0.5, 16.0, 4096.0):
            separate = np.linalg.solve(X.T @ X + l2 * np.eye(d), X.T @ Y)
            np.testing.assert_allclose(solver.solve(l2), separate, rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="l2 must be positive"):
        solver.solve(0.0)


# ----------------------------------------------------------------------------------------------
# few-shot


def reference_fewshot(train_x, train_y, test_x, test_y, shots, seed, l2, k):
    """big_vision's recipe written out plainly: whiten, bias column 100, {-1, 1} targets, lstsq."""
    idx = fewshot_indices(train_y, [shots], seed, k)[shots]
    x = train_x[idx].astype(np.float64)
    mean, std = x.mean(0), x.std(0) + 1e-5
    xa = np.concatenate([(x - mean) / std, np.full((len(idx), 1), 100.0)], axis=1)
    t = 2.0 * np.eye(k)[train_y[idx]] - 1.0
    d = xa.shape[1]
    w = np.linalg.lstsq(np.concatenate([xa, np.sqrt(l2) * np.eye(d)]), np.concatenate([t, np.zeros((d, k))]))[0]
    xt = np.concatenate([(test_x - mean) / std, np.full((len(test_x), 1), 100.0)], axis=1)
    return float(((xt @ w).argmax(1) == test_y).mean())


def test_fewshot_separable_features_are_perfect():
    train_x, train_y = clusters(30)
    rng = np.random.default_rng(3)
    test_x = train_x + 0.1 * rng.normal(size=train_x.shape).astype(np.float32)  # fresh points of the blobs
    res = fewshot_eval(train_x, train_y, test_x, train_y, shots=[1, 5, 10], seeds=3)
    for row in res["results"]:
        assert row["mean"] == 1.0 and row["std"] == 0.0 and len(row["per_seed"]) == 3
    assert [r["train_examples"] for r in res["results"]] == [6, 30, 60]
    assert res["l2"] == [1024.0] and res["best"] == [] and res["num_classes"] == 6 and res["seeds"] == [0, 1, 2]


def test_fewshot_matches_plain_reference_on_hard_data():
    rng = np.random.default_rng(4)
    k, d = 5, 12
    train_x, test_x = rng.normal(size=(200, d)), rng.normal(size=(120, d))
    train_y, test_y = rng.integers(0, k, 200), rng.integers(0, k, 120)
    train_x[:, 0] += train_y  # some signal, far from separable
    test_x[:, 0] += test_y
    for l2 in (1.0, 1024.0):
        res = fewshot_eval(train_x, train_y, test_x, test_y, shots=[2, 5], seeds=[0, 7], l2=l2, num_classes=k)
        for row in res["results"]:
            want = [reference_fewshot(train_x, train_y, test_x, test_y, row["shots"], s, l2, k) for s in (0, 7)]
            assert row["per_seed"] == pytest.approx(want, abs=1e-12)
            assert row["std"] == pytest.approx(np.std(want, ddof=1))


def test_fewshot_l2_grid_equals_separate_runs():
    rng = np.random.default_rng(5)
    train_x, train_y = rng.normal(size=(150, 10)), rng.integers(0, 4, 150)
    test_x, test_y = rng.normal(size=(80, 10)), rng.integers(0, 4, 80)
    grid = [1.0, 32.0, 1024.0]
    together = fewshot_eval(train_x, train_y, test_x, test_y, shots=[3, 8], seeds=2, l2=grid)
    for row in together["results"]:
        alone = fewshot_eval(train_x, train_y, test_x, test_y, shots=[row["shots"]], seeds=2, l2=row["l2"])
        assert row["per_seed"] == alone["results"][0]["per_seed"]
    assert [b["shots"] for b in together["best"]] == [3, 8]
    for b in together["best"]:
        assert b["mean"] == max(r["mean"] for r in together["results"] if r["shots"] == b["shots"])


def test_fewshot_samples_are_seeded_nested_and_per_class():
    labels = np.repeat(np.arange(4), [10, 10, 10, 2])  # class 3 has only two images
    a = fewshot_indices(labels, [1, 5], seed=0)
    b = fewshot_indices(labels, [1, 5], seed=0)
    c = fewshot_indices(labels, [1, 5], seed=1)
    assert all((a[s] == b[s]).all() for s in (1, 5)) and not (a[5] == c[5]).all()
    assert np.bincount(labels[a[5]]).tolist() == [5, 5, 5, 2]
    assert set(a[1]) <= set(a[5])  # nested across shot counts
    needed = fewshot_needed_indices(labels, [1, 5], seeds=2)
    assert set(needed) == set(a[5]) | set(c[5])


def test_fewshot_on_embedded_subset_equals_full():
    rng = np.random.default_rng(6)
    train_x, train_y = rng.normal(size=(300, 8)), rng.integers(0, 5, 300)
    test_x, test_y = rng.normal(size=(50, 8)), rng.integers(0, 5, 50)
    full = fewshot_eval(train_x, train_y, test_x, test_y, shots=[1, 4], seeds=3, num_classes=5)
    rows = fewshot_needed_indices(train_y, [1, 4], 3, 5)
    rows = rng.permutation(rows)  # any order works
    part = fewshot_eval(train_x[rows], train_y, test_x, test_y, shots=[1, 4], seeds=3, num_classes=5, train_rows=rows)
    assert part["results"] == full["results"]
    with pytest.raises(ValueError, match="not embedded"):
        fewshot_eval(train_x[rows[:-3]], train_y, test_x, test_y, shots=[4], seeds=3, train_rows=rows[:-3])


# ----------------------------------------------------------------------------------------------
# classification metrics


class FakeClassifier(nn.Module):
    """Reads the image code (its pixel value) and returns a fixed row of logits for it."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)
        self.num_classes = table.shape[1]
        self.preprocessing = Preprocessing(mean=(0.0,), std=(1 / 255,), img_size=(4, 4))  # identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x[:, 0, 0, 0].round().long()]


def ranking_logits(orders: list[list[int]]) -> torch.Tensor:
    """One row per image; ``orders[i]`` lists the classes best first."""
    k = len(orders[0])
    out = torch.zeros(len(orders), k)
    for i, order in enumerate(orders):
        for rank, c in enumerate(order):
            out[i, c] = float(k - rank)
    return out


def test_evaluate_fake_model_known_answers():
    labels = [0, 1, 2, 3, 4, 5, 0]
    orders = [
        [0, 1, 2, 3, 4, 5],  # right
        [0, 1, 2, 3, 4, 5],  # label 1 second
        [0, 1, 3, 4, 2, 5],  # label 2 fifth: top-5 only
        [0, 1, 2, 4, 5, 3],  # label 3 sixth: wrong both ways
        [4, 0, 1, 2, 3, 5],  # right
        [1, 2, 5, 0, 3, 4],  # label 5 third
        [2, 0, 1, 3, 4, 5],  # label 0 second
    ]
    n = len(labels)
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous()
    ds = ArrayDataset(images, torch.tensor(labels), [f"c{i}" for i in range(6)], name="fake")
    model = FakeClassifier(ranking_logits(orders))
    m = evaluate(model, ds, batch_size=3)
    assert m["num_images"] == 7 and m["num_classes"] == 6
    assert m["top1"] == pytest.approx(2 / 7)
    assert m["top5"] == pytest.approx(6 / 7)
    want = np.zeros((6, 6), dtype=int)
    for y, order in zip(labels, orders):
        want[y, order[0]] += 1
    assert m["confusion"] == want.tolist()
    per_class = {r["class"]: r["accuracy"] for r in m["per_class"]}
    assert per_class == {"c0": 0.5, "c1": 0.0, "c2": 0.0, "c3": 0.0, "c4": 1.0, "c5": 0.0}
    assert m["mean_per_class"] == pytest.approx(1.5 / 6)
    assert m["images_per_s"] > 0

    model.num_classes = 4
    with pytest.raises(ValueError, match="predicts 4 classes but fake has 6"):
        evaluate(model, ds)


def test_metrics_ties_missing_classes_and_few_classes():
    logits = torch.zeros(4, 3)  # an all-zero head: argmax (and top-1) is class 0
    labels = torch.tensor([0, 0, 1, 2])
    m = classification_metrics(logits, labels, ["a", "b", "c"])
    assert m["top1"] == 0.5 and m["top5"] is None
    assert m["confusion"] == [[2, 0, 0], [1, 0, 0], [1, 0, 0]]
    assert topk_accuracy(logits, labels, 2) == 0.75  # ties go to the lower index
    m = classification_metrics(torch.eye(3)[[0, 0]], torch.tensor([0, 0]))
    assert m["per_class"][1] == {"class": "1", "count": 0, "accuracy": None} and m["mean_per_class"] == 1.0
    with pytest.raises(ValueError, match="labels outside"):
        classification_metrics(torch.zeros(2, 3), torch.tensor([0, 3]))


def test_write_confusion_matrix(tmp_path):
    pytest.importorskip("matplotlib")
    conf = [[5, 1, 0], [2, 3, 0], [0, 0, 4]]
    j, p = write_confusion_matrix(conf, ["cat", "dog", "eel"], tmp_path / "out", stem="cm")
    data = json.loads(j.read_text())
    assert data["matrix"] == conf and data["classes"] == ["cat", "dog", "eel"]
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="does not fit"):
        write_confusion_matrix(conf, ["a", "b"], tmp_path)


# ----------------------------------------------------------------------------------------------
# linear probe and kNN


def test_linear_probe_and_knn_on_separable_features():
    train_x, train_y = clusters(40, seed=0)
    test_x, test_y = train_x + 0.05, train_y
    lin = linear_probe(train_x, train_y, test_x, test_y, weight_decay=1e-4, max_iter=50)
    assert lin["top1"] == 1.0 and lin["train_accuracy"] == 1.0 and lin["top5"] == 1.0
    assert lin["iterations"] > 0 and lin["grid"] == [] and lin["num_classes"] == 6
    knn = knn_eval(train_x, train_y, test_x, test_y, k=10)
    assert knn["top1"] == 1.0 and knn["weighting"] == "distance" and knn["temperature"] == 0.07
    knn = knn_eval(torch.from_numpy(train_x), train_y, test_x, test_y, k=500, weighting="majority", batch_size=7)
    assert knn["k"] == 240 and knn["top1"] == pytest.approx(1 / 6)  # every class ties: class 0 wins


def test_linear_probe_grid_picks_on_held_out_data():
    rng = np.random.default_rng(7)
    train_x, train_y = clusters(30, spread=3.0, seed=2)
    train_x = np.concatenate([train_x, rng.normal(size=(train_x.shape[0], 40))], axis=1)  # many useless dims
    lin = linear_probe(train_x, train_y, train_x, train_y, weight_decay=[1e-6, 1e-2, 10.0], max_iter=40)
    assert [g["weight_decay"] for g in lin["grid"]] == [1e-6, 1e-2, 10.0]
    assert lin["weight_decay"] == max(lin["grid"], key=lambda g: g["val_accuracy"])["weight_decay"]
    assert lin["weight_decay"] != 10.0  # crushing every weight loses on held-out data


def test_knn_distance_weighting_beats_a_crowd():
    # one close neighbour of class 1 against two distant ones of class 0
    train_x = torch.tensor([[1.0, 0.05], [0.2, 1.0], [0.25, 1.0]])
    train_y = torch.tensor([1, 0, 0])
    test_x, test_y = torch.tensor([[1.0, 0.0]]), torch.tensor([1])
    assert knn_eval(train_x, train_y, test_x, test_y, k=3)["top1"] == 1.0
    assert knn_eval(train_x, train_y, test_x, test_y, k=3, weighting="majority")["top1"] == 0.0


# ----------------------------------------------------------------------------------------------
# feature extraction


def manual_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    x = (images.float() / 255 - 0.5) / 0.5
    with torch.no_grad():
        return model.forward_head(model.forward_features(x), pre_logits=True)


def test_extract_features_is_the_pre_logits_of_normalised_images():
    model = tiny_vit()
    ds = synthetic_dataset(n=10, img_size=32)
    calls = []
    feats, labels = extract_features(model, ds, batch_size=4, progress=calls.append)
    assert feats.shape == (10, 32) and feats.dtype == torch.float32
    assert calls == [4, 4, 2] and torch.equal(labels, ds.labels)
    torch.testing.assert_close(feats, manual_features(model, ds.images), atol=1e-5, rtol=1e-5)
    bf16, _ = extract_features(model, ds, precision="bf16")
    assert bf16.dtype == torch.float32 and (bf16 - feats).abs().max() < 0.1
    with pytest.raises(ValueError, match="precision"):
        extract_features(model, ds, precision="fp8")


def test_extract_features_converts_channels():
    gray = synthetic_dataset(n=4, img_size=32, in_chans=1)
    rgb = ArrayDataset(gray.images.expand(-1, 3, -1, -1).contiguous(), gray.labels, gray.classes)
    model3 = tiny_vit()
    a, _ = extract_features(model3, gray)
    b, _ = extract_features(model3, rgb)
    torch.testing.assert_close(a, b)
    model1 = tiny_vit(in_chans=1)
    c, _ = extract_features(model1, rgb)  # grey RGB -> luminance == the grey value
    d, _ = extract_features(model1, gray)
    torch.testing.assert_close(c, d, atol=1e-4, rtol=1e-4)


def test_extract_features_other_size_subset_and_resnet():
    model = tiny_vit(num_classes=0)
    ds = synthetic_dataset(n=20, img_size=32)
    feats, labels = extract_features(model, ds, img_size=48, max_images=5)
    assert model.cfg.img_size == (48, 48) and feats.shape == (5, 32)
    again, labels2 = extract_features(model, ds, max_images=5)
    assert torch.equal(labels, labels2) and torch.equal(feats, again)  # the same seeded subset
    resnet = vitkit.create_model("bit_r50x1", units=(1, 1), img_size=32, num_classes=0)
    feats, _ = extract_features(resnet, ds, max_images=4)
    assert feats.shape == (4, resnet.num_features)
    with pytest.raises(ValueError, match="no classification head"):
        evaluate(model, ds)


def test_throughput_counts_images_not_labels_of_a_multi_label_source():
    from vitkit.eval.features import ModelOutputs

    multi = ModelOutputs(torch.zeros(10, 4), torch.zeros(10, 4, dtype=torch.int64), seconds=2.0)
    single = ModelOutputs(torch.zeros(10, 4), torch.zeros(10, dtype=torch.int64), seconds=2.0)
    assert multi.images_per_s == single.images_per_s == 5.0
    assert math.isnan(ModelOutputs(torch.zeros(1, 4), torch.zeros(1, dtype=torch.int64), seconds=0.0).images_per_s)
