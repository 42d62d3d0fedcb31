from __future__ import annotations

import copy
import json
import sys

import numpy as np
import pytest
import torch
from torch import nn

import vitkit
from test_export_pt2 import small_model
from vitkit.bench import bench_model, prepare_inference
from vitkit.cli import main
from vitkit.errors import ExportError
from vitkit.inference import Int8Linear, PackedLinear, onednn_int8_available, onednn_linear_available
from vitkit.precision import bf16_support


def test_onnx_export_matches_pytorch(tmp_path):
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    import onnxruntime as ort

    from vitkit.export import ONNX_OPSET, export_onnx

    m = small_model("token")
    path = tmp_path / "m.onnx"
    result = export_onnx(m, path)
    assert result["exporter"] == "dynamo" and result["fallback"] is None
    assert result["opset"] == ONNX_OPSET == 18 and result["batch_sizes"] == [1, 3]
    assert result["max_abs_diff"] is not None and result["max_abs_diff"] < 1e-5
    proto = onnx.load(path)
    assert [(o.domain, o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [("", 18)]
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["vitkit.config"]) == m.cfg.to_dict() and meta["vitkit.arch"] == "vit"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["pixels"] and [o.name for o in sess.get_outputs()] == ["logits"]
    x = torch.randn(5, 3, 32, 32)  # dynamic batch: another size again
    with torch.no_grad():
        np.testing.assert_allclose(sess.run(None, {"pixels": x.numpy()})[0], m(x).numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "family",
    ["gap_sincos2d", *(pytest.param(f, marks=pytest.mark.slow) for f in ("map", "deit", "hybrid", "bit_resnet"))],
)
def test_onnx_dynamo_export_of_every_family(tmp_path, family):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from vitkit.export import export_onnx

    result = export_onnx(small_model(family), tmp_path / "m.onnx")
    assert result["exporter"] == "dynamo" and result["opset"] == 18
    assert result["max_abs_diff"] is not None and result["max_abs_diff"] < 1e-5


def test_convert_cli_to_onnx(tmp_path, fixtures, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    import onnxruntime as ort

    src, dst = fixtures / "r_vit_tiny" / "params_prelinen.npz", tmp_path / "r.onnx"
    assert main(["convert", str(src), str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"ONNX opset 18 by the dynamo exporter, dynamic batch; onnxruntime {ort.__version__}: logits within"
    )
    assert out[0].endswith("of PyTorch at batch sizes 1 and 3 (tolerance 1.0e-04)")
    assert out[1] == f"official {src} -> onnx {dst}"
    x = np.load(fixtures / "r_vit_tiny" / "input.npy").transpose(0, 3, 1, 2)  # NHWC -> NCHW
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"pixels": np.ascontiguousarray(x)})[0]
    assert np.abs(got - np.load(fixtures / "r_vit_tiny" / "logits.npy")).max() < 1e-5  # the official model's


def test_onnx_without_onnxscript_falls_back_to_torchscript_and_says_so(tmp_path, fixtures, capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from vitkit.export import export_onnx

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # an install without onnxscript
    result = export_onnx(small_model("token"), tmp_path / "m.onnx")
    assert result["exporter"] == "torchscript" and result["opset"] == 18
    assert result["fallback"] == "onnxscript is not installed (pip install 'vitkit[onnx]')"
    assert result["max_abs_diff"] is not None and result["max_abs_diff"] < 1e-5
    src, dst = fixtures / "r_vit_tiny" / "params_prelinen.npz", tmp_path / "r.onnx"
    assert main(["convert", str(src), str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "note: written by the TorchScript exporter, which PyTorch deprecates: onnxscript is not installed "
        "(pip install 'vitkit[onnx]')"
    )
    assert out[1].startswith("ONNX opset 18 by the torchscript exporter, dynamic batch; onnxruntime")
    assert dst.is_file()


def test_onnx_without_the_onnx_package_is_one_line(tmp_path, fixtures, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # what an install without the onnx extra has
    src = fixtures / "r_vit_tiny" / "params_prelinen.npz"
    assert main(["convert", str(src), str(tmp_path / "r.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"vitkit convert: error: {tmp_path / 'r.onnx'}: writing ONNX needs the onnx package: pip install 'vitkit[onnx]'"
    ]
    assert not (tmp_path / "r.onnx").exists()


class Eigenvalues(nn.Module):
    """A head neither ONNX exporter has a translation for (``linalg.eigvalsh``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x[:, :4].reshape(-1, 2, 2)
        return torch.linalg.eigvalsh(a @ a.transpose(1, 2))


def test_onnx_refuses_a_model_neither_exporter_handles_in_one_line(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from vitkit.export import export_onnx

    m = small_model("gap_sincos2d")
    m.head = Eigenvalues()
    path = tmp_path / "m.onnx"
    with pytest.raises(ExportError) as e:
        export_onnx(m, path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        f"{path}: ONNX cannot hold VisionTransformer (width 192, depth 2, patch 8x8, classifier 'gap', "
        "pos_embed 'sincos2d'): the dynamo exporter failed: No ONNX function found for"
    )
    assert "aten._linalg_eigh" in message
    assert "the TorchScript exporter failed too: Exporting the operator 'aten::linalg_eigvalsh'" in message
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_onnx_refuses_weights_one_file_cannot_hold_before_exporting(tmp_path, monkeypatch):
    pytest.importorskip("onnx")
    import vitkit.export as export

    monkeypatch.setattr(export, "ONNX_MAX_BYTES", 1 << 20)  # a ViT-H or BiT-R152x4 against 2 GB
    monkeypatch.setattr(export, "_onnx_dynamo", None)  # never reached
    with pytest.raises(ExportError, match=r"GiB of weights, more than one ONNX file holds \(2 GB\): export it to "):
        export.export_onnx(small_model("token"), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("pack", [None, False])
def test_int8_inference_stays_close_to_fp32(pack):
    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5).eval()
    torch.nn.init.normal_(m.head.weight, std=0.1)
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        ref = m(x)
        q8 = prepare_inference(m, "int8", pack=pack)
        got = q8(x.to(q8.input_dtype)).float()
    if pack is None and onednn_int8_available():  # oneDNN's int8 kernels, the MLP's GELU fused
        assert sum(isinstance(mod, Int8Linear) for mod in q8.modules()) == 2 * 4 + 1
        # the rest of the model in bf16 where the CPU computes it natively (the precision policy)
        rest = torch.bfloat16 if bf16_support("cpu").native else torch.float32
        assert q8.blocks[0].mlp.fc1.act == "gelu_tanh" and q8.input_dtype == rest
    # Random weights are the hard case for quantisation; the logits must still agree closely.
    # (Top-1 on a trained model is checked by benchmarks/int8_accuracy.py.)
    assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.98


@pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_packed_inference_equals_the_model(act):
    torch.manual_seed(0)
    m = vitkit.create_model(
        "vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5, act=act, representation_size=16
    ).eval()
    torch.nn.init.normal_(m.head.weight, std=0.1)
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        ref = m(x)
        fp32 = prepare_inference(m, "fp32", pack=True)
        torch.testing.assert_close(fp32(x), ref, atol=1e-5, rtol=1e-5)
        if onednn_linear_available(torch.bfloat16):  # oneDNN's bf16 kernels (none on AVX2-only CPUs)
            bf16 = prepare_inference(m, "bf16", pack=True)
            plain_bf16 = prepare_inference(m, "bf16", pack=False)
            torch.testing.assert_close(bf16(x.bfloat16()), plain_bf16(x.bfloat16()), atol=2e-2, rtol=2e-2)
        # every dense layer packed, the MLP's GELU fused into fc1
        packed = [mod for mod in fp32.modules() if isinstance(mod, PackedLinear)]
        assert len(packed) == 2 * 4 + 2 and not any(isinstance(mod, torch.nn.Linear) for mod in fp32.modules())
        assert fp32.blocks[0].mlp.fc1.act == act and isinstance(fp32.blocks[0].mlp.act, torch.nn.Identity)
        torch.testing.assert_close(copy.deepcopy(fp32)(x), ref, atol=1e-5, rtol=1e-5)
    # the argument is untouched and still trains
    assert isinstance(m.blocks[0].mlp.fc1, torch.nn.Linear) and m.blocks[0].mlp.fc1.weight.requires_grad
    with pytest.raises(TypeError, match="holds torch.float32 weights but got a torch.bfloat16 input"):
        fp32.head(torch.zeros(1, 16, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="inference-only"):  # packed layers (the default packs none on some CPUs)
        prepare_inference(m, "fp32", pack=True)(x.clone().requires_grad_())
    with pytest.raises(ValueError, match="prepared for inference already"):
        prepare_inference(fp32, "bf16")
    assert not any(mod.training for mod in fp32.modules())


def test_matmul_ceiling_counts_every_kernel():
    from vitkit.bench import matmul_ceiling

    for precision in ("fp32", "bf16", "int8"):
        assert matmul_ceiling(precision, sizes=(256,)) > 0


@pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN int8 kernels")
def test_traceable_quantisation_matches_the_kernel():
    from vitkit.inference import _fp32_reciprocal, _quantize_activations, _quantize_traceable

    torch.manual_seed(0)
    for scale, zp in ((0.05, 100), (0.0371, 7)):
        x = torch.cat([torch.randn(100000) * 4, torch.tensor([1e6, -1e6, 0.0])])
        halves = (torch.arange(-300, 300) + 0.5) * scale  # values at a rounding boundary
        for dtype in (torch.float32, torch.bfloat16):
            fused = _quantize_traceable(x.to(dtype), _fp32_reciprocal(scale), zp)
            torch.testing.assert_close(fused, _quantize_activations(x.to(dtype), scale, zp)[0], atol=0, rtol=0)
        fused, kernel = (
            _quantize_traceable(halves, _fp32_reciprocal(scale), zp).int(),
            _quantize_activations(halves, scale, zp)[0].int(),
        )
        assert (fused - kernel).abs().max() <= 1 and (fused != kernel).float().mean() < 0.02


@pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("precision", ["fp32", "int8-static", pytest.param("int8-dynamic", marks=pytest.mark.slow)])
def test_prepared_models_compile_whole(precision):
    from torch._dynamo.utils import counters

    # The packed layers are opaque to Inductor; each is one custom op in the compiled graph, and
    # the model compiles without a graph break (fullgraph) to the same outputs.
    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5).eval()
    torch.nn.init.normal_(m.head.weight, std=0.1)
    x = torch.randn(4, 3, 32, 32)
    served = prepare_inference(m, precision[:4], calibration=x if precision == "int8-static" else None)
    compiled = torch.compile(served, fullgraph=True)
    with torch.inference_mode():
        exact = m(x)
        x = x.to(served.input_dtype)
        counters.clear()
        torch.compile(served, backend="eager")(x)  # without fullgraph: no graph break either
        assert not counters["graph_break"]
        ref, got = served(x).float(), compiled(x).float()
        if precision == "fp32":
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        else:  # Inductor rounds to bf16 at other points, which moves some codes by a step
            assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.99
            assert torch.nn.functional.cosine_similarity(got.flatten(), exact.flatten(), dim=0) > 0.98
        if precision == "int8-static":
            with pytest.raises(RuntimeError, match="non-finite input"):
                compiled(torch.full_like(x, float("nan")))


@pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN int8 kernels")
def test_one_compiled_graph_serves_every_prepared_model():
    # Handles and static scales are graph inputs, not guarded constants: another model of the same
    # architecture, or another calibration, reuses the compiled graph (Dynamo would otherwise
    # recompile per model and, past its recompile limit, silently fall back to eager).
    from torch._dynamo.utils import counters

    from vitkit.inference import Int8Linear

    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(2, 3, 32, 32)
    outs = []
    with torch.inference_mode():
        for seed in range(3):
            torch.manual_seed(seed)
            m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5).eval()
            torch.nn.init.normal_(m.head.weight, std=0.1)
            served = prepare_inference(m, "int8", calibration=x * (1 + seed))
            xs = x.to(served.input_dtype)  # bf16 where the CPU computes it natively, else fp32
            outs.append((torch.compile(served, backend="eager")(xs), served(xs)))
    assert counters["stats"]["unique_graphs"] == 2  # the finite-input check and the model, once
    for compiled, eager in outs:
        assert torch.nn.functional.cosine_similarity(compiled.flatten().float(), eager.flatten().float(), dim=0) > 0.99
    # a layer built by hand (out_dtype None) returns its input's dtype compiled as in eager
    layer = Int8Linear(torch.nn.Linear(16, 8))
    layer.input_qparams = (0.02, 128)
    with torch.inference_mode():
        v = torch.randn(4, 16)
        torch.testing.assert_close(torch.compile(layer, backend="eager", fullgraph=True)(v), layer(v))


@pytest.mark.slow
def test_bench_compiles_the_serving_model():
    for precision in ("bf16", "int8"):
        r = bench_model("vit_ti16", batch=2, precision=precision, img_size=32, compile=True, warmup=1, iters=2)
        assert r.compiled and r.compile_s is not None and r.images_per_s > 0


def test_bench_reports_fraction_of_ceiling():
    r = bench_model("vit_ti16", batch=2, mode="train", img_size=32, warmup=1, iters=2, ceiling=100.0)
    assert r.images_per_s > 0 and r.gflops_per_image > 0
    assert r.fraction_of_ceiling == pytest.approx(r.achieved_gflops / 100.0)
    assert r.achieved_gflops == pytest.approx(3 * r.gflops_per_image * r.images_per_s)


@pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN int8 kernels")
def test_static_int8_calibrated_once_from_images():
    from vitkit.data import build_dataset
    from vitkit.eval import model_inputs
    from vitkit.inference import calibrate_int8

    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=5).eval()
    torch.nn.init.normal_(m.head.weight, std=0.1)
    data = build_dataset("synthetic", "train", img_size=32, n=64)
    calib = [x for x, _ in model_inputs(m, data, batch_size=32)]  # the model's own preprocessing
    x = torch.cat(calib)[:8]
    with torch.inference_mode():
        ref = m(x)
        q8 = prepare_inference(m, "int8", calibration=calib)
        got = q8(x.to(q8.input_dtype)).float()
        fc1, fc2 = q8.blocks[0].mlp.fc1, q8.blocks[0].mlp.fc2
        assert fc2.input_qparams is not None and fc1.output_qparams == fc2.input_qparams
        assert fc1(torch.zeros(2, 3, 192, dtype=q8.input_dtype)).dtype == torch.uint8  # fc2's codes
        assert "static" in repr(fc2) and not any(getattr(layer, "observing", False) for layer in q8.modules())
        assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.98
        assert torch.isfinite(q8((100 * x).to(q8.input_dtype))).all()  # out of range: clamped, not broken
        with pytest.raises(ValueError, match=r"non-finite input \(shape \(8, 3, 32, 32\)\)"):
            q8(torch.full_like(x, float("nan")).to(q8.input_dtype))
        dynamic = prepare_inference(m, "int8")
        with pytest.raises(TypeError, match="no static input scale"):
            dynamic.blocks[0].mlp.fc2(torch.zeros(2, 3, 768, dtype=torch.uint8))
        with pytest.raises(ValueError, match="got no images"):
            calibrate_int8(dynamic, [])
        assert dynamic.blocks[0].mlp.fc2.input_qparams is None  # a failed calibration changes nothing
        assert calibrate_int8(dynamic, model_inputs(m, data, batch_size=32)) == 2 * 4 + 1  # (images, labels)
        static = [layer.input_qparams for layer in dynamic.modules() if hasattr(layer, "input_qparams")]
        with pytest.raises(ValueError, match="differs from the model's img_size"):
            calibrate_int8(dynamic, [torch.zeros(2, 3, 16, 16)])  # fails inside the model's forward
        assert static == [layer.input_qparams for layer in dynamic.modules() if hasattr(layer, "input_qparams")]
    with pytest.raises(ValueError, match="prepared with prepare_inference"):
        calibrate_int8(prepare_inference(m, "bf16"), x)
    with pytest.raises(ValueError, match="calibration sets static int8 scales"):
        prepare_inference(m, "bf16", calibration=x)


def test_attention_scale_folded_into_qkv_for_serving():
    from vitkit.inference import fold_attention_scale

    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_heads=6, num_classes=5).eval()
    torch.nn.init.normal_(m.head.weight, std=0.1)  # head_dim 32: the scale is not a power of two
    x = torch.randn(2, 3, 32, 32)
    folded = copy.deepcopy(m)
    assert fold_attention_scale(folded) == 2 and folded.blocks[0].attn.scale == 1.0
    # only packed models are folded: a model of plain nn.Linear could be saved, scale and all
    assert prepare_inference(m, "fp32", pack=False).blocks[0].attn.scale == 32**-0.5
    with torch.no_grad():
        for impl in ("sdpa", "math"):
            m.set_attention_impl(impl)
            folded.set_attention_impl(impl)
            torch.testing.assert_close(folded(x), m(x), atol=1e-5, rtol=1e-5)
    assert m.blocks[0].attn.scale == 32**-0.5


@pytest.mark.skipif(not onednn_linear_available(), reason="needs oneDNN's CPU linear kernels")
@pytest.mark.parametrize("faster", ["torch", "onednn"])
def test_the_default_keeps_the_kernel_timed_faster_and_times_each_shape_once(monkeypatch, faster):
    """No fixed assumption about which library is fast: prepare_inference times both on each
    layer shape and keeps the faster; a second prepare of the same shapes times nothing."""
    import vitkit.inference as inference

    monkeypatch.setattr(inference, "_KERNEL_CHOICES", {})
    timed = []

    def fastest(candidates, **timing):  # every candidate timed, the one the case says wins
        timed.extend(candidates.values())
        return faster, {name: 1.0 if name == faster else 2.0 for name in candidates}

    monkeypatch.setattr(inference, "fastest", fastest)
    m = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=3, num_classes=5).eval()
    torch.nn.init.normal_(m.head.weight, std=0.1)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        served = prepare_inference(m, "fp32")
        torch.testing.assert_close(served(x), m(x), atol=1e-5, rtol=1e-5)
    # shapes: qkv, proj, fc1 with its GELU fused, fc2, head: five decisions for 3 * 4 + 1 layers (and,
    # where the fused fc1 lost, fc1 alone as a sixth)
    decisions = 5 if faster == "onednn" else 6
    assert len(timed) == 2 * decisions
    packed = sum(isinstance(mod, PackedLinear) for mod in served.modules())
    plain = sum(type(mod) is torch.nn.Linear for mod in served.modules())
    if faster == "onednn":
        assert (packed, plain) == (3 * 4 + 1, 0) and served.kernel_choices == {"onednn": 13, "torch": 0}
        assert isinstance(served.blocks[0].mlp.act, torch.nn.Identity)  # GELU fused into fc1
    else:
        assert (packed, plain) == (0, 3 * 4 + 1) and served.kernel_choices == {"onednn": 0, "torch": 13}
        assert not isinstance(served.blocks[0].mlp.act, torch.nn.Identity)  # left as it was
        # a plain qkv keeps its weights in state_dict: the attention scale is not folded into them
        assert served.blocks[0].attn.scale == m.blocks[0].attn.scale
        assert torch.equal(served.blocks[0].attn.qkv.weight, m.blocks[0].attn.qkv.weight)
    prepare_inference(m, "fp32")
    assert len(timed) == 2 * decisions  # decided once per shape in the process
    assert sum(isinstance(mod, PackedLinear) for mod in prepare_inference(m, "fp32", pack=True).modules()) == 13


def test_the_bf16_ceiling_of_a_cpu_that_emulates_it_is_measured_on_small_matrices(monkeypatch):
    import vitkit.bench as bench
    from vitkit.precision import Bf16Support

    sides, real = [], torch.randn
    monkeypatch.setattr(bench, "bf16_support", lambda device: Bf16Support(False, "no native bf16 (a test)"))
    monkeypatch.setattr(torch, "randn", lambda *a, **k: sides.append(a[0]) or real(*a, **k))
    assert bench.matmul_ceiling("bf16") > 0
    assert set(sides) == {512}  # 4096 in emulated bf16 would take minutes
