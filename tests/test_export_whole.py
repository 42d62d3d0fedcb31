"""Exports are whole: an ONNX file and a ``torch.export`` program carry the model's class names
and preprocessing, and ``vitkit predict`` (and :func:`vitkit.predict`) on the file reads them back
and gives the weights' own predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.errors import CheckpointError
from vitkit.export import load_exported

TINY = {"img_size": 16, "patch_size": 8, "width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64}


@pytest.fixture
def weights(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_s16", num_classes=3, **TINY)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    model.preprocessing = vitkit.Preprocessing((0.4, 0.5, 0.6), (0.2, 0.3, 0.25), (16, 16), "bicubic")
    path = tmp_path / "w.safetensors"
    vitkit.save_checkpoint(model, path, extra={"classes": json.dumps(["cat", "dog", "fox"])})
    rng = np.random.default_rng(1)
    photos = []
    for i, (w, h) in enumerate([(30, 21), (17, 40)]):
        photos.append(str(tmp_path / f"{i}.png"))
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(photos[-1])
    return path, photos


def _predicted(tmp_path, ckpt, photos) -> list[list[dict]]:
    out = tmp_path / f"{ckpt.name}.json"
    assert main(["predict", str(ckpt), *photos, "--top-k", "2", "--precision", "fp32", "--json", str(out)]) == 0
    return [r["top_k"] for r in json.loads(out.read_text())["predictions"]]


def _same(got, want):
    assert [[r["class"] for r in g] for g in got] == [[r["class"] for r in w] for w in want]
    assert np.allclose([[r["prob"] for r in g] for g in got], [[r["prob"] for r in w] for w in want], atol=1e-4)


@pytest.mark.slow  # exports (seconds each)
@pytest.mark.parametrize("suffix", [".onnx", ".pt2"])
def test_predict_on_an_export_reads_its_class_names_and_preprocessing(tmp_path, weights, suffix):
    if suffix == ".onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    path, photos = weights
    exported = tmp_path / f"m{suffix}"
    assert main(["convert", str(path), str(exported)]) == 0
    served = load_exported(exported)
    assert served.class_names == ["cat", "dog", "fox"]
    assert served.preprocessing == vitkit.load_pretrained(path).preprocessing
    want = _predicted(tmp_path, path, photos)
    _same(_predicted(tmp_path, exported, photos), want)
    _same(vitkit.predict(served, photos, top_k=2), want)


@pytest.mark.slow  # exports (seconds each)
@pytest.mark.parametrize("suffix", [".onnx", ".pt2"])
def test_a_multilabel_export_keeps_its_thresholds(tmp_path, weights, suffix):
    if suffix == ".onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    from vitkit.eval.predict import stored_thresholds

    path, photos = weights
    model = vitkit.load_pretrained(path)
    multi = tmp_path / "multi.safetensors"
    extra = {"classes": json.dumps(["cat", "dog", "fox"]), "multilabel": "true", "thresholds": "[0.5, 0.25, 0.75]"}
    vitkit.save_checkpoint(model, multi, extra=extra)
    exported = tmp_path / f"multi{suffix}"
    assert main(["convert", str(multi), str(exported)]) == 0
    assert stored_thresholds(load_exported(exported)) == [0.5, 0.25, 0.75]
    # predict on the export applies them as it does on the weights (each class above its threshold)
    want = _predicted(tmp_path, multi, photos)
    got = _predicted(tmp_path, exported, photos)
    assert sum(map(len, want)) > 0 and all("threshold" in r for preds in want for r in preds)
    assert [[r["class"] for r in g] for g in got] == [[r["class"] for r in w] for w in want]
    for g, w in zip(got, want):
        assert np.allclose([r["prob"] for r in g], [r["prob"] for r in w], atol=1e-4)


def test_a_file_without_vitkit_metadata_is_refused_in_one_line(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["pixels"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])],
    )
    onnx.save(helper.make_model(graph), tmp_path / "other.onnx")
    with pytest.raises(CheckpointError, match="other.onnx: carries no vitkit metadata"):
        load_exported(tmp_path / "other.onnx")


@pytest.mark.slow  # an export (seconds)
@pytest.mark.parametrize(
    "value, message",
    [
        ("[" * 100000 + "]" * 100000, r"vitkit.preprocessing: the JSON is nested 100000 levels deep"),
        ("{not json", r"vitkit.preprocessing: not valid JSON"),
        (
            '{"mean": [0.5, 0.5, 0.5], "std": [0, 0, 0], "img_size": [16, 16]}',
            r"vitkit.preprocessing: preprocessing\['std'\]\[0\] must be",
        ),
        (None, None),  # no key (an older export): the config's own preprocessing
    ],
)
def test_an_exports_damaged_preprocessing_is_refused_not_replaced(tmp_path, weights, value, message):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    path, _ = weights
    exported = tmp_path / "m.onnx"
    assert main(["convert", str(path), str(exported)]) == 0
    proto = onnx.load(str(exported))
    kept = [(p.key, p.value) for p in proto.metadata_props if p.key != "vitkit.preprocessing"]
    del proto.metadata_props[:]
    for k, v in [*kept, *([("vitkit.preprocessing", value)] if value is not None else [])]:
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.save(proto, str(exported))
    if message is None:
        assert load_exported(exported).preprocessing == vitkit.Preprocessing.for_config(load_exported(exported).cfg)
        return
    with pytest.raises(CheckpointError, match=f"m.onnx: {message}"):
        load_exported(exported)
