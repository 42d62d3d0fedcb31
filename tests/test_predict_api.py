"""Prediction from Python: :func:`vitkit.predict` takes image files or Pillow images and gives what
``vitkit predict`` prints, named by the class names a loaded model carries (``model.class_names``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.errors import UsageError

TINY = {"img_size": 16, "patch_size": 8, "width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64}


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_s16", num_classes=3, **TINY)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    path = tmp_path / "w.safetensors"
    vitkit.save_checkpoint(model, path, extra={"classes": json.dumps(["cat", "dog", "fox"])})
    rng = np.random.default_rng(0)
    photos = []
    for i, (w, h) in enumerate([(30, 21), (17, 40), (16, 16)]):
        photos.append(tmp_path / f"{i}.jpg")
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(photos[-1])
    return path, photos


def test_a_loaded_model_carries_its_class_names(saved, tmp_path):
    path, _ = saved
    model = vitkit.load_pretrained(path)
    assert model.class_names == ["cat", "dog", "fox"]
    assert vitkit.load_pretrained(path, num_classes=5).class_names is None  # a new head, new classes
    from vitkit.export import export_weights

    export_weights(model, tmp_path / "hf", "hf")
    assert vitkit.load_pretrained(tmp_path / "hf").class_names == ["cat", "dog", "fox"]


def test_predict_takes_files_and_pil_images_as_the_cli_does(saved, tmp_path):
    path, photos = saved
    model = vitkit.load_pretrained(path)
    out = tmp_path / "p.json"
    assert (
        main(["predict", str(path), *map(str, photos), "--top-k", "2", "--precision", "fp32", "--json", str(out)]) == 0
    )
    cli = [r["top_k"] for r in json.loads(out.read_text())["predictions"]]
    assert vitkit.predict(model, photos, top_k=2) == cli
    assert vitkit.predict(model, [Image.open(p) for p in photos], top_k=2) == cli
    assert vitkit.predict(model, str(photos[0]), top_k=2) == cli[:1]  # one image: a list of one
    assert {r["class"] for rows in cli for r in rows} <= {"cat", "dog", "fox"}


def test_predict_names_what_it_cannot_take(saved):
    path, photos = saved
    model = vitkit.load_pretrained(path)
    with pytest.raises(UsageError, match="image 2: expected a file path or a PIL image, got int"):
        vitkit.predict(model, [photos[0], 3])
    with pytest.raises(vitkit.DataError, match="nope.jpg: no such image file"):
        vitkit.predict(model, [photos[0], photos[0].parent / "nope.jpg"])
