from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.bench import bench_model, prepare_inference
from vitkit.cli import main


def test_onnx_export_matches_pytorch(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from vitkit.export import export_onnx

    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5)
    torch.nn.init.normal_(m.head.weight, std=0.1)
    result = export_onnx(m, tmp_path / "m.onnx")
    assert result["max_abs_diff"] is not None and result["max_abs_diff"] < 1e-4


def test_convert_cli_to_onnx(tmp_path, fixtures, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    assert main(["convert", str(fixtures / "r_vit_tiny" / "params_prelinen.npz"), str(tmp_path / "r.onnx")]) == 0
    assert "logits within" in capsys.readouterr().out


def test_int8_inference_stays_close_to_fp32():
    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5).eval()
    torch.nn.init.normal_(m.head.weight, std=0.1)
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        ref = m(x)
        q = prepare_inference(
            vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5), "fp32"
        )
        q.load_state_dict(m.state_dict())
        q8 = prepare_inference(q, "int8")
        got = q8(x)
    # Random weights are the hard case for quantisation; the logits must still agree closely.
    # (Top-1 on a trained model is checked by benchmarks/int8_accuracy.py.)
    assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.98


def test_bench_reports_fraction_of_ceiling():
    r = bench_model("vit_ti16", batch=2, mode="train", img_size=32, warmup=1, iters=2, ceiling=100.0)
    assert r.images_per_s > 0 and r.gflops_per_image > 0
    assert r.fraction_of_ceiling == pytest.approx(r.achieved_gflops / 100.0)
    assert r.achieved_gflops == pytest.approx(3 * r.gflops_per_image * r.images_per_s)
