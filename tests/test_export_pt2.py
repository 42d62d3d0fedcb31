"""``torch.export`` programs (.pt2): every model family exports with a dynamic batch, reads back
with the model's outputs, and what cannot be exported or checked is refused without a file."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from torch import nn

import vitkit
from vitkit.cli import main
from vitkit.errors import ExportError, UsageError
from vitkit.export import check_destination, export_program, export_weights, format_for

# Small random models of each family vitkit builds (a few seconds each to export on two cores).
FAMILIES = {
    "token": ("vit_ti16", {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 5}),
    "gap_sincos2d": (
        "vit_ti16",
        {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 5, "classifier": "gap", "pos_embed": "sincos2d"},
    ),
    "map": ("vit_ti16", {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 5, "classifier": "map"}),
    "relative": ("vit_ti16", {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 5, "pos_embed": "relative"}),
    "learned2d": (
        "vit_ti16",
        {"img_size": (32, 48), "patch_size": 8, "depth": 2, "num_classes": 5, "pos_embed": "learned2d"},
    ),
    "deit": ("vit_ti16", {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 5, "distill_token": True}),
    "rope_dinov3": (
        "vit_ti16",
        {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 5, "pos_embed": "rope_dinov3", "num_registers": 4},
    ),
    "hybrid": ("r_vit_ti16", {"img_size": 64, "depth": 2, "num_classes": 5}),
    "bit_resnet": ("bit_r50x1", {"img_size": 64, "units": (1, 1), "num_classes": 5}),
}


def small_model(family: str) -> nn.Module:
    """A small random model of ``family``, its zero-initialised heads given weights so that the
    outputs are not all equal."""
    torch.manual_seed(0)
    name, overrides = FAMILIES[family]
    m = vitkit.create_model(name, **overrides).eval()
    for head in (m.head, getattr(m, "head_dist", None)):
        if head is not None:
            nn.init.normal_(head.weight, std=0.1)
            nn.init.normal_(head.bias, std=0.1)
    return m


def images(model: nn.Module, batch: int) -> torch.Tensor:
    return torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size)


def files_under(path) -> list[str]:
    return sorted(p.name for p in path.rglob("*"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pt2_reads_back_with_the_model_outputs(tmp_path, family):
    m = small_model(family)
    path = tmp_path / "m.pt2"
    result = export_program(m, path)
    assert result["format"] == "pt2" and result["exporter"] == "torch.export" and result["dynamic_batch"]
    assert result["batch_sizes"] == [1, 3] and result["max_abs_diff"] <= 1e-5
    extra = {"vitkit.json": ""}
    program = torch.export.load(path, extra_files=extra)
    meta = json.loads(extra["vitkit.json"])
    assert json.loads(meta["vitkit.config"]) == m.cfg.to_dict()
    assert json.loads(meta["vitkit.preprocessing"])["mean"] == [0.5] * m.cfg.in_chans
    served = program.module()
    for batch in (1, 4):  # neither is the batch traced (2)
        x = images(m, batch)
        with torch.no_grad():
            torch.testing.assert_close(served(x), m(x), atol=1e-5, rtol=0)


def test_a_program_that_differs_from_the_model_is_not_written(tmp_path, monkeypatch):
    m = small_model("token")
    real_load = torch.export.load

    class Shifted:  # a program that reads back with outputs 1e-3 away from the model's
        def __init__(self, program):
            self.program = program

        def module(self):
            served = self.program.module()
            return lambda x: served(x) + 1e-3

    monkeypatch.setattr(torch.export, "load", lambda f, **kw: Shifted(real_load(f, **kw)))
    path = tmp_path / "m.pt2"
    with pytest.raises(ExportError) as e:
        export_program(m, path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path}: the exported program outputs differ from PyTorch")
    assert "by 0.001 at batch 1" in message and message.endswith("; not written")
    assert files_under(tmp_path) == []  # no file, no temporary


class DataDependent(nn.Module):
    """A head whose branch depends on the values: ``torch.export`` cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


def test_a_model_torch_export_cannot_trace_is_refused_in_one_line(tmp_path):
    m = small_model("token")
    m.head = DataDependent()
    path = tmp_path / "m.pt2"
    with pytest.raises(ExportError) as e:
        export_program(m, path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        f"{path}: torch.export cannot export VisionTransformer (width 192, depth 2, patch 8x8, classifier 'token', "
        "pos_embed 'learned'): Could not guard on data-dependent expression"
    )
    assert files_under(tmp_path) == []


def test_pt2_names_and_destinations():
    assert format_for("m.pt2") == "pt2" and format_for("M.PT2") == "pt2"
    with pytest.raises(UsageError, match=r"the pt2 format is a \.pt2 file, not \.onnx"):
        check_destination("m.onnx", "pt2")
    with pytest.raises(UsageError, match="vitkit writes no pickled PyTorch files"):
        format_for("m.pt")
    with pytest.raises(UsageError, match="aoti does not apply to the onnx format"):
        export_weights(small_model("token"), "m.onnx", "onnx", aoti=True)


def official_input(fixtures, name: str) -> tuple[torch.Tensor, np.ndarray]:
    d = fixtures / name
    x = torch.from_numpy(np.load(d / "input.npy")).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
    return x, np.load(d / "logits.npy")


def test_convert_cli_to_pt2_says_what_it_checked(tmp_path, fixtures, capsys):
    src = fixtures / "r_vit_tiny" / "params_prelinen.npz"
    dst = tmp_path / "r.pt2"
    assert main(["convert", str(src), str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"torch.export program (torch {torch.__version__}, dynamic batch); read back: logits within"
    )
    assert out[0].endswith("of PyTorch at batch sizes 1 and 3 (tolerance 1.0e-05)")
    assert out[1] == f"official {src} -> pt2 {dst}"
    x, logits = official_input(fixtures, "r_vit_tiny")  # the official JAX model's outputs
    with torch.no_grad():
        got = torch.export.load(dst).module()(x).numpy()
    assert np.abs(got - logits).max() < 1e-5


def test_convert_cli_aoti_only_for_pt2(tmp_path, fixtures, capsys):
    src = fixtures / "r_vit_tiny" / "params_prelinen.npz"
    assert main(["convert", str(src), str(tmp_path / "r.onnx"), "--aoti"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vitkit convert: error: --aoti writes an AOTInductor package, a .pt2 file: not the onnx format"]
    assert files_under(tmp_path) == []


@pytest.mark.slow
def test_aoti_package_runs_the_model(tmp_path):
    """AOTInductor compiles the program to C++ (about a minute for a small ViT on two cores)."""
    from vitkit.export import aoti_available

    if why := aoti_available():
        pytest.skip(why)
    m = small_model("token")
    path = tmp_path / "m.pt2"
    result = export_program(m, path, aoti=True)
    assert result["exporter"] == "aoti" and result["max_abs_diff"] <= 1e-5
    runner = torch._inductor.aoti_load_package(io.BytesIO(path.read_bytes()))
    for batch in (1, 4):
        x = images(m, batch)
        with torch.no_grad():
            torch.testing.assert_close(runner(x), m(x), atol=1e-5, rtol=0)
