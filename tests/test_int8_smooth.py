"""Static int8 with activation smoothing (SmoothQuant): the fp32 function is kept, and outlier
channels of the activations stop costing the other channels their resolution."""

from __future__ import annotations

import copy

import pytest
import torch

import vitkit
from vitkit.inference import onednn_int8_available, prepare_inference, smooth_activations


def outlier_model() -> torch.nn.Module:
    """A tiny ViT whose LayerNorms give a few channels 30x the others' range, as trained
    Transformers' activations have."""
    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5).eval()
    with torch.no_grad():
        torch.nn.init.normal_(m.head.weight, std=0.1)
        for block in m.blocks:
            for norm in (block.norm1, block.norm2):
                norm.weight[:4] *= 30.0
    return m


def test_smoothing_keeps_the_fp32_function():
    m = outlier_model()
    x = torch.randn(4, 3, 32, 32)
    smoothed = copy.deepcopy(m)
    assert smooth_activations(smoothed, torch.randn(8, 3, 32, 32)) == 2 * 2  # qkv and fc1 of each block
    with torch.no_grad():
        torch.testing.assert_close(smoothed(x), m(x), atol=1e-4, rtol=1e-4)
        peak = smoothed.blocks[0].norm1.weight.abs().max() / smoothed.blocks[0].norm1.weight.abs().median()
        assert peak < 10  # the outliers left the activations (30x before)
    with pytest.raises(ValueError, match="alpha"):
        smooth_activations(smoothed, x, alpha=1.5)
    with pytest.raises(ValueError, match="no images"):
        smooth_activations(smoothed, [])


@pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN int8 kernels")
def test_smoothed_static_int8_is_closer_to_fp32_on_outliers():
    m = outlier_model()
    calib = torch.randn(32, 3, 32, 32)
    x = torch.randn(16, 3, 32, 32)

    def error(model: torch.nn.Module) -> float:
        with torch.inference_mode():
            got = model(x.to(model.input_dtype)).float()
            return float((got - m(x)).norm() / m(x).norm())

    plain = error(prepare_inference(m, "int8", calibration=calib))
    smooth = error(prepare_inference(m, "int8", calibration=calib, smooth=0.5))
    assert smooth < 0.7 * plain, (smooth, plain)
    with pytest.raises(ValueError, match="smooth needs calibration"):
        prepare_inference(m, "int8", smooth=0.5)


@pytest.mark.slow
@pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN int8 kernels")
def test_eval_smooth_flag(tmp_path, capsys):
    from vitkit.cli import main

    torch.manual_seed(0)
    m = vitkit.create_model(
        "vit_ti16", img_size=32, patch_size=8, depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=10
    )
    vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    args = ["eval", str(tmp_path / "m.safetensors"), "--data", "synthetic", "--max-images", "32", "--precision", "int8"]
    args += ["--calib", "32", "--out", str(tmp_path / "out")]
    assert main([*args, "--smooth", "0.5"]) == 0
    assert "after smoothing (alpha 0.5)" in capsys.readouterr().err
    assert main([*args, "--smooth", "2"]) == 2
    assert "alpha must be in [0, 1]" in capsys.readouterr().err
