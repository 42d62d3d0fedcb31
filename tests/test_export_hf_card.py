"""``vitkit convert --to hf`` of a fine-tuned run: the model card, the class names and a
multi-label model's thresholds travel with the weights, and come back when vitkit loads the folder."""

from __future__ import annotations

import json

import pytest
import torch

from vitkit.checkpoint import save_checkpoint
from vitkit.checkpoint.load import load_pretrained
from vitkit.errors import CheckpointError
from vitkit.eval.predict import class_names, stored_thresholds
from vitkit.export import export_weights
from vitkit.models.registry import create_model
from vitkit.train.runfolder import MARKER

TINY = {"img_size": 16, "patch_size": 8, "width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64}


def _run_folder(tmp_path, multilabel: bool):
    torch.manual_seed(0)
    model = create_model("vit_s16", num_classes=3, **TINY)
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text("")
    (run / "README.md").write_text("# a fine-tuned ViT\n\nTrained on 3 classes.\n")
    extra = {"classes": json.dumps(["cat", "dog", "fox"])}
    if multilabel:
        extra.update(multilabel="true", thresholds=json.dumps([0.5, 0.25, 0.75]))
    save_checkpoint(model, run / "best.safetensors", extra=extra)
    return run


def test_hf_export_carries_the_card_and_the_labels(tmp_path):
    run = _run_folder(tmp_path, multilabel=True)
    model = load_pretrained(run / "best.safetensors")
    out = tmp_path / "hf"
    export_weights(model, out, "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["id2label"] == {"0": "cat", "1": "dog", "2": "fox"} and cfg["label2id"]["fox"] == 2
    assert cfg["problem_type"] == "multi_label_classification"
    assert cfg["vitkit_thresholds"] == [0.5, 0.25, 0.75]
    assert (out / "README.md").read_text().startswith("# a fine-tuned ViT")
    back = load_pretrained(out)
    assert class_names(back) == ["cat", "dog", "fox"]
    assert stored_thresholds(back) == [0.5, 0.25, 0.75]
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(back.eval()(x), model.eval()(x), atol=1e-5, rtol=1e-5)


def test_a_single_label_file_outside_a_run_folder_gets_a_card_of_its_own(tmp_path):
    run = _run_folder(tmp_path, multilabel=False)
    (run / MARKER).unlink()  # a README.md beside weights that no run wrote is not taken for a card
    out = tmp_path / "hf"
    export_weights(load_pretrained(run / "best.safetensors"), out, "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert "problem_type" not in cfg and cfg["id2label"]["1"] == "dog"
    card = (out / "README.md").read_text()  # not the README.md beside the weights: one made from them
    assert card.startswith("# vitkit model") and "classes (3): cat, dog, fox" in card and "16x16 px" in card


def _photos(folder, sizes=((50, 37), (41, 64), (33, 33), (80, 45))) -> list[str]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i, (w, h) in enumerate(sizes):
        path = folder / f"{i}.png"
        coarse = Image.fromarray((rng.random((6, 6, 3)) * 255).astype(np.uint8))
        coarse.resize((w, h), Image.Resampling.BILINEAR).save(path)  # smooth, as photographs are
        paths.append(str(path))
    return paths


@pytest.mark.slow  # imports transformers (seconds)
@pytest.mark.parametrize("crop_pct", [1.0, 0.875])
def test_a_run_folder_exported_to_hf_runs_in_the_transformers_pipeline(tmp_path, crop_pct):
    transformers = pytest.importorskip("transformers")
    import dataclasses

    from vitkit.cli import main

    run = _run_folder(tmp_path, multilabel=False)
    model = load_pretrained(run / "best.safetensors")
    torch.nn.init.normal_(model.head.weight, std=1.0)  # clear winners: the head starts at zero
    model.preprocessing = dataclasses.replace(model.preprocessing, crop_pct=crop_pct, interpolation="bicubic")
    save_checkpoint(model, run / "best.safetensors")
    assert main(["convert", str(run), str(tmp_path / "hf"), "--to", "hf"]) == 0  # the run folder, not the file
    out = tmp_path / "hf"
    assert (out / "README.md").read_text().startswith("# a fine-tuned ViT")
    processor = transformers.AutoImageProcessor.from_pretrained(out)
    assert list(processor.image_mean) == [0.5, 0.5, 0.5]
    paths = _photos(tmp_path)
    assert main(["predict", str(run), *paths, "--top-k", "1", "--json", str(tmp_path / "p.json")]) == 0
    ours = json.loads((tmp_path / "p.json").read_text())["predictions"]
    pipe = transformers.pipeline("image-classification", model=str(out))
    for path, mine in zip(paths, ours):
        theirs = pipe(path, top_k=1)[0]
        assert theirs["label"] == mine["top_k"][0]["class"]
        assert abs(theirs["score"] - mine["top_k"][0]["prob"]) < 1e-2


def test_a_gap_sincos_model_is_refused_for_hf_in_one_line_naming_what_to_export_to(tmp_path):
    from vitkit.errors import CheckpointError

    model = create_model("vit_s16", num_classes=3, classifier="gap", pos_embed="sincos2d", **TINY)
    with pytest.raises(CheckpointError) as e:
        export_weights(model, tmp_path / "hf", "hf")
    text = str(e.value)
    assert "\n" not in text and not (tmp_path / "hf").exists()
    assert "global average pooling (classifier='gap') and 2-D sin-cos positions (pos_embed='sincos2d')" in text
    assert "vitkit (.safetensors) or ONNX (.onnx)" in text


@pytest.mark.parametrize("crop", [{"crop_pct": 0.875}, {"crop_mode": "center"}, {}])
def test_the_preprocessor_config_reads_back_as_the_same_preprocessing(tmp_path, crop):
    import dataclasses

    import vitkit
    from vitkit.preprocessing import load_images

    model = create_model("vit_s16", num_classes=3, **TINY)
    model.preprocessing = dataclasses.replace(
        vitkit.Preprocessing((0.4, 0.5, 0.6), (0.2, 0.3, 0.25), (16, 16), "bicubic"), **crop
    )
    export_weights(model, tmp_path / "hf", "hf")
    back = load_pretrained(tmp_path / "hf").preprocessing
    paths = _photos(tmp_path)
    torch.testing.assert_close(load_images(paths, back, 3).inputs, load_images(paths, model.preprocessing, 3).inputs)


def test_hf_thresholds_without_class_names_are_kept(tmp_path):
    run = _run_folder(tmp_path, multilabel=True)
    out = tmp_path / "hf"
    export_weights(load_pretrained(run / "best.safetensors"), out, "hf")
    cfg = json.loads((out / "config.json").read_text())
    del cfg["id2label"], cfg["label2id"]
    (out / "config.json").write_text(json.dumps(cfg))
    assert stored_thresholds(load_pretrained(out)) == [0.5, 0.25, 0.75]


@pytest.mark.parametrize(
    "stored, message",
    [
        ("[0.5, NaN, 0.5]", r"'thresholds'\[1\] must be a number in \[0.0, 1.0\], got nan"),
        ("[0.5, -0.1, 0.5]", r"'thresholds'\[1\] must be .* got -0.1"),
        ("[0.5, 0.5]", "'thresholds' must be a list of 3 numbers .* got 2 values"),
        ('["0.5", 0.5, 0.5]', r"'thresholds'\[0\] must be .* got '0.5'"),
        ("{not json", "'thresholds' is not JSON"),
    ],
)
def test_bad_stored_thresholds_are_named_not_dropped(tmp_path, capsys, stored, message):
    model = create_model("vit_s16", num_classes=3, **TINY)
    path = tmp_path / "w.safetensors"
    save_checkpoint(model, path, extra={"multilabel": "true", "thresholds": stored})
    with pytest.raises(CheckpointError, match=f"{path}: metadata {message}"):
        stored_thresholds(load_pretrained(path))
    # the command line says it in one line
    from PIL import Image

    from vitkit.cli import main

    Image.new("RGB", (16, 16)).save(tmp_path / "img.png")
    code = main(["predict", str(path), str(tmp_path / "img.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("vitkit predict: error:") and "thresholds" in err[-1]
