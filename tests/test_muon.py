"""Muon for the encoder's matrices, AdamW for the rest (``optim.name: muon``)."""

from __future__ import annotations

import math

import pytest
import torch

import vitkit
from _recipes import stopped_and_resumed, tiny_recipe
from conftest import free_port
from vitkit.errors import RecipeError
from vitkit.precision import resolve_precision
from vitkit.train import load_recipe, train
from vitkit.train.config import OptimSection
from vitkit.train.muon import MuonAdamW, orthogonalize
from vitkit.train.optim import build_optimizer, is_muon_param, set_lr
from vitkit.train.state import list_checkpoints, load_train_state

SMALL = dict(img_size=16, patch_size=4, width=32, depth=3, num_heads=2, mlp_dim=64, num_classes=5)


@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 64), (3, 64, 32)])
def test_orthogonalize_flattens_the_singular_values(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    # columns scaled over a decade; five steps lift a singular value of ~1/500 of the Frobenius norm
    # to ~1 (the first step's slope is 3.4445), so far smaller ones would stay small
    g = g * torch.logspace(-1, 0, shape[-1])
    o = orthogonalize(g)
    assert o.shape == g.shape and o.dtype == torch.float32
    s = torch.linalg.svdvals(o)
    # the quintic iteration stops short of 1 by design: its authors report 0.5-1.5 (Muon's docs)
    assert s.min() > 0.3 and s.max() < 1.3, (s.min(), s.max())
    # the singular vectors are g's: o is g's polar factor up to the singular values' errors
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    polar = u @ vh
    cos = (o * polar).sum((-2, -1)) / (o.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert (cos > 0.95).all(), cos


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = vitkit.create_model("vit_ti16", **SMALL)
    opt = build_optimizer(model, OptimSection(name="muon", lr=1e-3, weight_decay=0.05))
    assert isinstance(opt, MuonAdamW)
    kind = {id(p): g["muon"] for g in opt.param_groups for p in g["params"]}
    muon = {n for n, p in model.named_parameters() if kind[id(p)]}
    want = {f"blocks.{i}.{m}.weight" for i in range(3) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
    assert muon == want
    assert all(is_muon_param(n, p) == (n in want) for n, p in model.named_parameters())
    # every parameter once; weight decay as for AdamW (matrices only: no norms, biases, positions)
    assert sorted(kind) == sorted(id(p) for p in model.parameters())
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert wd[id(model.patch_embed.proj.weight)] == 0.05 and wd[id(model.blocks[0].norm1.weight)] == 0.0


def test_a_muon_step_by_hand():
    """Nesterov momentum, orthogonalised, scaled to AdamW's update size, decoupled weight decay."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16, 48))
    w0 = w.detach().clone()
    opt = MuonAdamW([{"params": [w], "muon": True, "weight_decay": 0.1}], lr=0.01, momentum=0.9)
    grads = [torch.randn(16, 48), torch.randn(16, 48)]
    buf = torch.zeros(16, 48)
    want = w0.clone()
    for g in grads:
        w.grad = g.clone()
        opt.step()
        buf = 0.9 * buf + 0.1 * g
        update = 0.1 * g + 0.9 * buf  # Nesterov: the gradient pushed on by the new momentum
        ortho = orthogonalize(update, dtype=opt.ns_dtype(w.device))  # as the policy resolves auto
        want = want * (1 - 0.01 * 0.1) - 0.01 * 0.2 * math.sqrt(48) * ortho
    torch.testing.assert_close(w.detach(), want, atol=1e-6, rtol=1e-5)


def test_a_split_qkv_weight_steps_as_three_matrices():
    """A fused qkv weight with a split of 3 takes the step that q, k and v would as three
    parameters of their own (orthogonalised and scaled apart), and build_optimizer marks only
    the qkv weights so under optim.muon_split_qkv."""
    torch.manual_seed(2)
    fused = torch.nn.Parameter(torch.randn(3 * 8, 8))
    apart = [torch.nn.Parameter(b.detach().clone()) for b in fused.detach().chunk(3)]
    other = torch.nn.Parameter(torch.randn(8, 16))  # unsplit, of another shape
    a = MuonAdamW([{"params": [fused, other], "muon": True, "weight_decay": 0.1, "splits": [3, 1]}], lr=0.01)
    b = MuonAdamW([{"params": [*apart, torch.nn.Parameter(other.detach().clone())], "muon": True,
                    "weight_decay": 0.1}], lr=0.01)  # fmt: skip
    for _ in range(3):
        g, go = torch.randn(24, 8), torch.randn(8, 16)
        fused.grad, other.grad = g.clone(), go.clone()
        for p, gb in zip(apart, g.chunk(3)):
            p.grad = gb.clone()
        b.param_groups[0]["params"][3].grad = go.clone()
        a.step()
        b.step()
    torch.testing.assert_close(fused.detach(), torch.cat([p.detach() for p in apart]), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(other.detach(), b.param_groups[0]["params"][3].detach(), atol=1e-6, rtol=1e-5)
    model = vitkit.create_model("vit_ti16", **SMALL)
    opt = build_optimizer(model, OptimSection(name="muon", muon_split_qkv=True))
    names = {id(p): n for n, p in model.named_parameters()}
    split = {names[id(p)]: k for g in opt.param_groups if g["muon"] for p, k in zip(g["params"], g["splits"])}
    assert {n for n, k in split.items() if k == 3} == {f"blocks.{i}.attn.qkv.weight" for i in range(3)}
    assert set(split.values()) == {1, 3}


def test_a_split_that_does_not_divide_the_rows_is_refused():
    w = torch.nn.Parameter(torch.randn(10, 4))
    with pytest.raises(ValueError, match=r"a split of 3 does not divide the 10 rows of a \(10, 4\) matrix"):
        MuonAdamW([{"params": [w], "muon": True, "splits": [3]}])


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_the_adamw_groups_match_torchs_adamw(fused, monkeypatch):
    """On the CPU the AdamW groups take torch's fused kernel; elsewhere (or where it is missing)
    the foreach ops: both are torch's AdamW."""
    calls = []
    if fused:
        kernel = torch._fused_adamw_
        monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    else:
        monkeypatch.setattr(vitkit.train.muon, "_fusable", lambda params: False)
    torch.manual_seed(1)
    a = [torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3, 4))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    ours = MuonAdamW([{"params": a, "weight_decay": 0.1}], lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    theirs = torch.optim.AdamW([{"params": b, "weight_decay": 0.1}], lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert len(calls) == (5 if fused else 0)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)


def test_muon_lr_scale_scales_the_matrices_only():
    model = vitkit.create_model("vit_ti16", **SMALL)
    opt = build_optimizer(model, OptimSection(name="muon", lr=1e-3, muon_lr_scale=4.0, layer_decay=0.5))
    set_lr(opt, 1e-3)
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    # layer decay still applies: block 2 is layer 3 of 0..4, a factor 0.5 below the heads
    assert lr[id(model.blocks[2].mlp.fc1.weight)] == pytest.approx(1e-3 * 0.5 * 4.0)
    assert lr[id(model.blocks[2].mlp.fc1.bias)] == pytest.approx(1e-3 * 0.5)
    assert lr[id(model.head.weight)] == pytest.approx(1e-3)


def test_muon_on_a_model_without_encoder_blocks_is_refused():
    from vitkit.models.config import ResNetConfig
    from vitkit.models.registry import build_model

    resnet = build_model(ResNetConfig(units=(1, 1), num_classes=3))
    with pytest.raises(RecipeError, match="optim.name muon updates a ViT's encoder-block matrices; ResNet"):
        build_optimizer(resnet, OptimSection(name="muon"))


def test_a_muon_group_of_a_vector_is_refused():
    with pytest.raises(ValueError, match=r"Muon updates matrices only.*\(5,\)"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.zeros(5))], "muon": True}])


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-weights"])
def test_a_muon_run_resumes_to_the_same_weights(tmp_path, monkeypatch, bf16):
    """Also with train.bf16_weights: the checkpoints hold the fp32 weights, and the copy is
    rounded from them again on resuming."""
    extra = {"train__precision": "bf16", "train__bf16_weights": True} if bf16 else {}
    r = tiny_recipe(tmp_path, optim__name="muon", **extra)
    train(r, tmp_path / "a")
    resumed = stopped_and_resumed(r, tmp_path / "b", 6, monkeypatch)
    assert resumed.resumed_from == 4
    a = load_train_state(list_checkpoints(tmp_path / "a" / "checkpoints")[-1])
    b = load_train_state(list_checkpoints(tmp_path / "b" / "checkpoints")[-1])
    assert a.state.step == b.state.step == 8
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    assert all(v.dtype == torch.float32 for v in b.model_state.values() if v.is_floating_point())
    assert {g["muon"] for g in b.optim_state["param_groups"]} == {True, False}


def test_muon_settings_are_checked(tmp_path):
    with pytest.raises(RecipeError, match=r"optim.muon_lr_scale must be > 0, got 0"):
        load_recipe(None, [("optim.name", "muon"), ("optim.muon_lr_scale", 0)])
    with pytest.raises(RecipeError, match=r"optim.muon_momentum must be in \[0, 1\), got 1"):
        load_recipe(None, [("optim.name", "muon"), ("optim.muon_momentum", 1)])
    with pytest.raises(RecipeError, match="optim.name muon.*train.fsdp"):
        load_recipe(None, [("optim.name", "muon"), ("train.fsdp", True)])


def _share_orthogonalization(rank: int, world: int, port: int, out: str) -> None:
    """A process of the test below: the shared iteration of stacks of 1-5 matrices, and how many
    matrices this process iterated on itself."""
    import os

    import torch.distributed as dist

    from vitkit.train import muon

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    iterated = []
    plain = muon.orthogonalize
    muon.orthogonalize = lambda g, steps=5, **kw: (iterated.append(g.shape[0]), plain(g, steps, **kw))[1]
    opt = MuonAdamW([{"params": [torch.nn.Parameter(torch.zeros(2, 2))]}], process_group=dist.group.WORLD)
    stacks = [torch.randn(n, 16, 32, generator=torch.Generator().manual_seed(n)) for n in range(1, 6)]
    shared = [opt._orthogonalize(s, 5) for s in stacks]
    torch.save({"shared": shared, "iterated": iterated}, f"{out}.{rank}")
    dist.destroy_process_group()


def test_data_parallel_processes_share_the_iteration(tmp_path):
    """Two processes given their group each iterate on half of a stack (a lone matrix: both on
    it) and end with the whole stack, equal to one process's iteration to bf16's rounding."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "shares")
    mp.spawn(_share_orthogonalization, args=(2, free_port(), out), nprocs=2)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for r in ranks:
        assert r["iterated"] == [1, 1, 2, 2, 3]  # n = 1 whole; then ceil(n / 2) each, zero-padded
        for n, o in enumerate(r["shared"], start=1):
            g = torch.randn(n, 16, 32, generator=torch.Generator().manual_seed(n))
            want = orthogonalize(g, dtype=resolve_precision("auto").dtype)  # as the optimiser's default
            assert o.shape == want.shape and o.dtype == want.dtype
            assert (o - want).abs().max() < 1e-2  # bf16 iteration: batched over other stacks
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["shared"], ranks[1]["shared"]))
