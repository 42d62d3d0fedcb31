"""The CUDA path: the same functions as on the CPU, on a GPU. Skipped where there is none (CI);
run where one is lent with ``pytest -m cuda``. Every CUDA path here has its CPU twin tested in
the other files; these tests check that the two agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import vitkit
from vitkit.bench import bench_model
from vitkit.inference import prepare_inference
from vitkit.train import load_recipe, train
from vitkit.train.loop import Trainer
from vitkit.train.state import list_checkpoints, load_train_state

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

from conftest import free_port  # noqa: E402
from test_train import write_recipe  # noqa: E402  (the tiny recipe the CPU tests use)


@pytest.fixture(autouse=True)
def _exact_fp32():
    """fp32 means fp32: no TF32 in matmuls or convolutions while comparing with the CPU."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", ["vit_tiny_token", "vit_tiny_gap_repr", "r_vit_tiny"])
def test_official_fixtures_on_cuda(fixtures, name):
    d = fixtures / name
    model = vitkit.load_pretrained(d / "params_linen.npz").cuda().eval()
    x = torch.from_numpy(np.load(d / "input.npy")).permute(0, 3, 1, 2).cuda()
    with torch.no_grad():
        logits = model(x).cpu().numpy()
    assert np.abs(logits - np.load(d / "logits.npy")).max() < 5e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_attention_matches_explicit_forward_and_backward(dtype):
    """On CUDA the model uses scaled_dot_product_attention (flash / memory-efficient kernels);
    the explicit softmax path is its reference."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_s16", img_size=64, num_classes=10).cuda()
    torch.nn.init.normal_(model.head.weight, std=0.02)  # zero-initialised: would hide everything
    x = torch.randn(4, 3, 64, 64, device="cuda")
    out, grads = {}, {}
    for impl in ("sdpa", "math", "recompute"):
        model.set_attention_impl(impl)
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            y = model(x)
        y.float().square().mean().backward()
        out[impl] = y.detach().float()
        grads[impl] = model.blocks[0].attn.qkv.weight.grad.clone()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(out["sdpa"], out["math"]) < tol
    assert rel_err(grads["sdpa"], grads["math"]) < (1e-4 if dtype == torch.float32 else 5e-2)
    # recompute runs the explicit path's ops in its dtypes (CUDA autocast: softmax in fp32); only
    # the order of a bf16 reduction may differ
    assert rel_err(out["recompute"], out["math"]) < (1e-6 if dtype == torch.float32 else 1e-3)
    assert rel_err(grads["recompute"], grads["math"]) < (1e-5 if dtype == torch.float32 else 5e-3)


def test_cuda_forward_matches_cpu_in_fp32_and_bf16():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_b16", img_size=96, num_classes=10).eval()
    torch.nn.init.normal_(model.head.weight, std=0.02)
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        ref = model(x)
        gpu = model.cuda()(x.cuda())
        assert rel_err(gpu, ref) < 1e-5
        served = prepare_inference(model, "bf16")
        assert next(served.parameters()).dtype == torch.bfloat16
        assert rel_err(served(x.cuda().to(served.input_dtype)).float(), ref) < 3e-2
    with pytest.raises(ValueError, match="int8 serving runs on the CPU"):
        prepare_inference(model, "int8")


def test_training_on_cuda_learns_and_resumes(tmp_path):
    """bf16 autocast, fused AdamW, checkpoint with the CUDA RNG state, resume to the same end."""
    recipe = write_recipe(tmp_path, train__steps=30, train__precision="bf16", train__device="cuda")
    result = train(load_recipe(recipe), tmp_path / "full")
    assert result.final_top1 is not None and result.final_top1 > 0.3
    assert "cuda" in load_train_state(list_checkpoints(tmp_path / "full" / "checkpoints")[-1]).rng

    # 12 steps straight vs stopped after step 8's checkpoint and resumed: the same weights (to the
    # rounding of reductions whose order may differ between runs).
    short = write_recipe(tmp_path, train__precision="bf16", train__device="cuda")
    train(load_recipe(short), tmp_path / "a")
    part = Trainer(load_recipe(short), tmp_path / "b")

    class Stop(Exception):
        pass

    def stop_after_step_8(module, args):
        if module.training and part.state.step == 8:
            raise Stop

    part.model.register_forward_pre_hook(stop_after_step_8)
    with pytest.raises(Stop):
        part.run()
    resumed = Trainer(load_recipe(short), tmp_path / "b")
    assert resumed.resumed_from == 8
    resumed.run()
    a = load_train_state(list_checkpoints(tmp_path / "a" / "checkpoints")[-1]).model_state
    b = load_train_state(list_checkpoints(tmp_path / "b" / "checkpoints")[-1]).model_state
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


def test_torchrun_with_nccl_on_one_gpu(tmp_path):
    recipe = write_recipe(tmp_path, train__steps=4, train__device="cuda", log__eval_every=4)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "1",
            "--master-port",
            str(free_port()),
            "-m",
            "vitkit",
            "train",
            "--config",
            str(recipe),
            "--out",
            str(tmp_path / "run"),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(x)["loss"] for x in lines if "loss" in x]
    assert len(losses) == 4 and all(np.isfinite(losses))


def test_bench_on_cuda_reports_a_sane_fraction():
    r = bench_model("vit_s16", batch=16, precision="bf16", device="cuda", img_size=64, warmup=2, iters=3)
    assert r.device.startswith("cuda") and r.images_per_s > 0 and r.peak_memory_mb > 0
    assert 0 < r.fraction_of_ceiling < 1.2
    t = bench_model("vit_s16", batch=16, mode="train", precision="bf16", device="cuda", img_size=64, iters=3)
    assert t.images_per_s > 0


def test_eval_on_cuda_equals_cpu(tmp_path):
    from vitkit.eval import evaluate

    recipe = load_recipe(write_recipe(tmp_path, train__steps=6))
    train(recipe, tmp_path / "run")
    model = vitkit.load_pretrained(tmp_path / "run")
    from vitkit.data import build_dataset

    ds = build_dataset("synthetic", "test", img_size=16, n=256)
    cpu = evaluate(model, ds, device="cpu")
    gpu = evaluate(model, ds, device="cuda")
    assert cpu["top1"] == pytest.approx(gpu["top1"], abs=1 / 128)
