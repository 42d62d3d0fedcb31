"""``vitkit eval | fewshot | probe | predict`` end to end on a tiny random model and synthetic data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitkit
from vitkit.cli import main

CLASSES = [f"class_{i}" for i in range(10)]  # the synthetic data's, which eval matches by name


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder holding best.safetensors with class names in its metadata."""
    torch.manual_seed(0)
    model = vitkit.create_model(
        "vit_ti16", img_size=32, patch_size=8, depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=10
    )
    with torch.no_grad():  # a head that is not all zeros, so predictions differ between images
        model.head.weight.normal_(std=0.5)
    run = tmp_path_factory.mktemp("run")
    vitkit.save_checkpoint(model, run / "best.safetensors", extra={"classes": json.dumps(CLASSES)})
    return run


def test_eval_writes_table_confusion_and_json(run_dir, tmp_path, capsys):
    out_json = tmp_path / "eval.json"
    rc = main(["eval", str(run_dir), "--data", "synthetic", "--max-images", "64", "--json", str(out_json)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "top-1" in text and "top-5" in text and "class_3" in text
    data = json.loads(out_json.read_text())
    assert data["num_images"] == 64 and data["num_classes"] == 10 and data["split"] == "test"
    assert 0.0 <= data["top1"] <= data["top5"] <= 1.0 and len(data["per_class"]) == 10
    conf = json.loads((run_dir / "eval" / "confusion_synthetic_test.json").read_text())
    assert np.array(conf["matrix"]).sum() == 64 and data["confusion_json"].endswith("confusion_synthetic_test.json")
    if data["confusion_png"]:
        assert (run_dir / "eval" / "confusion_synthetic_test.png").is_file()


def test_fewshot_json(run_dir, tmp_path, capsys):
    out_json = tmp_path / "fewshot.json"
    args = ["fewshot", str(run_dir / "best.safetensors"), "--data", "synthetic", "--shots", "1", "5"]
    rc = main([*args, "--seeds", "2", "--max-test", "128", "--json", str(out_json)])
    assert rc == 0
    assert "± " in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["shots"] == [1, 5] and data["seeds"] == [0, 1] and data["num_test"] == 128
    assert [r["train_examples"] for r in data["results"]] == [10, 50]
    assert all(0.0 <= r["mean"] <= 1.0 and len(r["per_seed"]) == 2 for r in data["results"])

    rc = main([*args, "--seeds", "1", "--max-test", "64", "--l2-grid"])
    assert rc == 0
    assert "best l2" in capsys.readouterr().out


def test_probe_json(run_dir, tmp_path, capsys):
    out_json = tmp_path / "probe.json"
    args = ["probe", str(run_dir), "--data", "synthetic", "--max-train", "200", "--max-test", "100"]
    rc = main([*args, "--knn-k", "5", "--max-iter", "50", "--json", str(out_json)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "linear probe" in text and "5-NN" in text
    data = json.loads(out_json.read_text())
    assert data["linear_probe"]["num_train"] == 200 and data["knn"]["num_test"] == 100
    assert data["knn"]["k"] == 5 and 0.0 <= data["linear_probe"]["top1"] <= 1.0


def test_predict_uses_stored_class_names(run_dir, tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(0)
    color = tmp_path / "color.png"
    Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(color)
    gray = tmp_path / "gray.png"
    Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8), mode="L").save(gray)
    out_json = tmp_path / "pred.json"
    rc = main(["predict", str(run_dir), str(color), str(gray), "--top-k", "3", "--json", str(out_json)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "class_" in text
    preds = json.loads(out_json.read_text())["predictions"]
    assert [p["image"] for p in preds] == [str(color), str(gray)]
    for p in preds:
        probs = [t["prob"] for t in p["top_k"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert all(t["class"] == CLASSES[t["index"]] for t in p["top_k"])


def test_user_errors_are_one_line(run_dir, tmp_path, capsys):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    cases = [
        (["predict", str(run_dir), str(tmp_path / "missing.png")], "missing.png: no such image file"),
        (["predict", str(run_dir), str(broken)], "broken.png: not an image"),
        (["eval", str(tmp_path / "nothing"), "--data", "synthetic"], "nothing: no such file or folder"),
        (["fewshot", str(run_dir), "--data", "no-such-data"], "unknown data 'no-such-data'"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def test_eval_scores_the_serving_path(run_dir, tmp_path, capsys):
    """``--serve`` and ``--precision int8`` evaluate the model as prepare_inference serves it."""
    base = ["eval", str(run_dir), "--data", "synthetic", "--max-images", "64"]
    results = {}
    fp32 = ["--precision", "fp32"]  # the default, auto, is bf16 where the CPU computes it natively
    for extra in (
        fp32,
        ["--serve", *fp32],
        ["--precision", "int8", "--calib", "64"],
        ["--precision", "int8", "--calib", "0"],
    ):
        out_json = tmp_path / "e.json"
        assert main([*base, *extra, "--json", str(out_json)]) == 0
        results[" ".join(extra)] = json.loads(out_json.read_text())
    captured = capsys.readouterr()
    assert "int8: activation scales calibrated on 64 images of synthetic train" in captured.err
    assert "fp32 served" in captured.out and "int8 served" in captured.out
    eager, served = results["--precision fp32"], results["--serve --precision fp32"]
    assert eager["mode"] == "eager" and served["mode"] == "served"
    assert served["top1"] == eager["top1"]  # packed fp32: the same function
    for key in ("--precision int8 --calib 64", "--precision int8 --calib 0"):
        assert abs(results[key]["top1"] - eager["top1"]) <= 3 / 64  # a random model: a few images may flip
    assert "int8: dynamic quantisation (activation scales from each batch; --calib 0)" in captured.err
    with pytest.raises(SystemExit):
        main([*base, "--precision", "int4"])
    # bad values are one line on stderr and exit code 2, like every other command's
    with pytest.raises(SystemExit) as e:
        main([*base, "--precision", "int8", "--calib", "-5"])
    assert e.value.code == 2 and "argument --calib: must be at least 0, got -5" in capsys.readouterr().err
    if torch.cuda.is_available():
        assert main([*base, "--precision", "int8", "--device", "cuda"]) == 2
        assert "runs on the CPU's int8 kernels, not on cuda" in capsys.readouterr().err
    else:  # refused when the command line is read
        with pytest.raises(SystemExit):
            main([*base, "--precision", "int8", "--device", "cuda"])
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow  # torch.compile of the int8 model: about 25 s on 2 cores
def test_eval_compiles_the_served_model(run_dir, tmp_path, capsys):
    base = ["eval", str(run_dir), "--data", "synthetic", "--max-images", "64", "--precision", "int8", "--calib", "64"]
    results = {}
    for extra in ([], ["--compile"]):
        out_json = tmp_path / "e.json"
        assert main([*base, *extra, "--json", str(out_json)]) == 0
        results[" ".join(extra)] = json.loads(out_json.read_text())
    assert results["--compile"]["mode"] == "served, compiled" and "int8 served, compiled" in capsys.readouterr().out
    assert abs(results["--compile"]["top1"] - results[""]["top1"]) <= 2 / 64  # other roundings, same model
