"""``vitkit convert --to hf`` of a fine-tuned run: the model card, the class names and a
multi-label model's thresholds travel with the weights, and come back when vitkit loads the folder."""

from __future__ import annotations

import json

import torch

from vitkit.checkpoint import save_checkpoint
from vitkit.checkpoint.load import load_pretrained
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


def test_a_single_label_file_outside_a_run_folder_has_no_card_or_problem_type(tmp_path):
    run = _run_folder(tmp_path, multilabel=False)
    (run / MARKER).unlink()  # a README.md beside weights that no run wrote is not taken for a card
    out = tmp_path / "hf"
    export_weights(load_pretrained(run / "best.safetensors"), out, "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert "problem_type" not in cfg and cfg["id2label"]["1"] == "dog"
    assert not (out / "README.md").exists()
