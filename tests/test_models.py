"""Contracts over every registered model (at a tiny size), and the official parameter counts."""

from __future__ import annotations

import pytest
import torch
import yaml

import vitkit
from vitkit.models import count_params, model_flops
from vitkit.models.config import ResNetConfig
from vitkit.models.posembed import add_tokens_and_positions

TINY_VIT = dict(width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)
TINY_RESNET = dict(num_classes=5, img_size=32)


def tiny(name: str, **kw):
    cfg = vitkit.model_config(name)
    if isinstance(cfg, ResNetConfig):
        return vitkit.create_model(name, units=(1,) * len(cfg.units), **{**TINY_RESNET, **kw})
    extra = {}
    if cfg.resnet_units is not None:
        extra = dict(resnet_units=(1,) * len(cfg.resnet_units), resnet_width=32)
    patch = min(cfg.patch_size[0], 8)
    size = kw.pop("img_size", patch * 4 * (cfg.stem_stride if cfg.resnet_units else 1))
    return vitkit.create_model(name, **{**TINY_VIT, **extra, "patch_size": patch, "img_size": size, **kw})


# The wide BiT ResNets hold ~100M+ parameters even with one unit per stage: full run only.
WIDE = {"bit_r50x3", "bit_r101x3", "bit_r152x2", "bit_r152x4"}
ALL_MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in WIDE else n for n in vitkit.list_models()]

PAPER_PARAMS = {
    "vit_ti16": 5_717_416,
    "vit_s16": 22_050_664,
    "vit_b16": 86_567_656,
    "vit_b32": 88_224_232,
    "vit_l16": 304_326_632,
    "vit_h14": 632_045_800,
    "r50_vit_b16": 98_659_112,
    "bit_r50x1": 25_549_352,
}


@pytest.mark.parametrize("name", PAPER_PARAMS)
def test_parameter_counts_equal_official(name):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    assert count_params(model) == PAPER_PARAMS[name]


def test_flops_match_published_figures():
    with torch.device("meta"):
        assert model_flops(vitkit.create_model("vit_b16")) / 1e9 == pytest.approx(35.13, abs=0.01)
        assert model_flops(vitkit.create_model("vit_s16")) / 1e9 == pytest.approx(9.20, abs=0.01)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_contract_forward_backward_shapes(name):
    torch.manual_seed(0)
    model = tiny(name)
    size = model.cfg.img_size
    x = torch.randn(2, 3, *size)
    logits = model(x)
    assert logits.shape == (2, 5)
    # The zero-initialised head gives zero logits; give it weights so gradients reach the body.
    torch.nn.init.normal_(model.head.weight, std=0.1)
    model(x).square().sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    feats = model.forward_features(x)
    pre = model.forward_head(feats, pre_logits=True)
    assert pre.shape == (2, model.num_features)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_contract_save_load_round_trip_is_bit_exact(name, tmp_path):
    torch.manual_seed(0)
    model = tiny(name).eval()
    path = vitkit.save_checkpoint(model, tmp_path / "m.safetensors")
    loaded = vitkit.load_pretrained(path)
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
    x = torch.randn(2, 3, *model.cfg.img_size)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))


@pytest.mark.parametrize("name", [n for n in vitkit.list_models() if not n.startswith("bit")])
def test_contract_second_resolution(name):
    model = tiny(name)
    h, w = model.cfg.img_size
    stride = model.cfg.total_stride
    model.set_img_size((h + 2 * stride[0], w + stride[1]))  # rectangular
    x = torch.randn(1, 3, h + 2 * stride[0], w + stride[1])
    assert model(x).shape == (1, 5)
    tokens = model.forward_features(x)
    grid = model.cfg.grid_size
    assert tokens.shape[1] == grid[0] * grid[1] + model.num_prefix_tokens


@pytest.mark.parametrize(
    "spelling,name",
    [("ViT-B/16", "vit_b16"), ("R50+ViT-B/16", "r50_vit_b16"), ("ViT-Ti/16", "vit_ti16"), ("BiT-M-R50x1", "bit_r50x1")],
)
def test_paper_spellings(spelling, name):
    assert vitkit.model_config(spelling) == vitkit.model_config(name)


def test_overrides_apply():
    m = vitkit.create_model(
        "vit_ti16",
        img_size=(32, 48),
        patch_size=8,
        in_chans=1,
        num_classes=0,
        classifier="gap",
        representation_size=16,
        pos_embed="sincos2d",
        act="gelu",
        ln_eps=1e-5,
        depth=1,
    )
    assert m.head is None and m.cls_token is None
    assert m.forward(torch.randn(2, 1, 32, 48)).shape == (2, 16)
    assert m.blocks[0].norm1.eps == 1e-5
    assert m.blocks[0].mlp.act.approximate == "none"


def test_head_is_zero_initialised_and_reset():
    m = tiny("vit_ti16")
    assert m.head.weight.abs().sum() == 0
    m.reset_classifier(7)
    assert m.head.out_features == 7 and m.head.weight.abs().sum() == 0 and m.cfg.num_classes == 7
    m.reset_classifier(0)
    assert m(torch.randn(1, 3, *m.cfg.img_size)).shape == (1, m.num_features)


def test_attention_weights_equal_fused_path():
    torch.manual_seed(0)
    m = tiny("vit_ti16").eval()
    x = torch.randn(2, 3, *m.cfg.img_size)
    out = m.forward_intermediates(x, return_attention=True)
    assert len(out["attention"]) == len(m.blocks)
    for w in out["attention"]:
        assert w.shape == (2, 2, 17, 17)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 17))
    torch.testing.assert_close(out["normed"], m.forward_features(x), atol=1e-5, rtol=0)
    # The explicit path's output equals the fused one block by block.
    blk = m.blocks[0]
    z = m.embed(x)
    torch.testing.assert_close(blk(z), blk(z, return_weights=True)[0], atol=1e-5, rtol=0)
    only_last = m.forward_intermediates(x, indices=[-1], return_attention=True)
    assert len(only_last["tokens"]) == 1 and len(only_last["attention"]) == 1


def test_dynamic_img_size_resizes_at_run_time():
    torch.manual_seed(0)
    m = tiny("vit_ti16", dynamic_img_size=True).eval()
    x = torch.randn(1, 3, 48, 40)
    assert m(x).shape == (1, 5)
    static = tiny("vit_ti16").eval()
    static.load_state_dict(m.state_dict())
    static.set_img_size((48, 40))
    torch.testing.assert_close(static.forward_features(x), m.forward_features(x))


def test_model_in_train_mode_uses_dropout():
    m = tiny("vit_ti16", drop_rate=0.5, drop_path_rate=0.5).train()
    x = torch.randn(2, 3, *m.cfg.img_size)
    torch.manual_seed(0)
    a = m.forward_features(x)
    torch.manual_seed(1)
    b = m.forward_features(x)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_attention_paths_agree_in_values_and_gradients(autocast):
    torch.manual_seed(0)
    m = tiny("vit_ti16").train()
    torch.nn.init.normal_(m.head.weight, std=0.1)
    x = torch.randn(2, 3, *m.cfg.img_size)
    outs, grads = {}, {}
    for impl in ("sdpa", "math", "recompute"):
        m.set_attention_impl(impl)
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = m(x).float()
        out.square().sum().backward()
        outs[impl] = out.detach()
        grads[impl] = m.blocks[0].attn.qkv.weight.grad.clone()
    if autocast:  # recompute is the explicit path with the weights recomputed: the same numbers
        torch.testing.assert_close(outs["recompute"], outs["math"], atol=0, rtol=0)
        torch.testing.assert_close(grads["recompute"], grads["math"], atol=0, rtol=0)
        for a, b in ((outs["sdpa"], outs["math"]), (grads["sdpa"], grads["math"])):  # bf16 rounding
            assert (a - b).norm() / b.norm() < 2e-2
    else:
        torch.testing.assert_close(outs["recompute"], outs["math"], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(grads["recompute"], grads["math"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(outs["sdpa"], outs["math"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads["sdpa"], grads["math"], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="attention impl"):
        m.set_attention_impl("flash")


def test_recomputed_attention_supports_double_backward_and_torch_func():
    from vitkit.models.attention import _RecomputedAttention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def explicit(q, k, v):
        return ((q * 0.5) @ k.transpose(-2, -1)).softmax(-1) @ v

    def recompute(q, k, v):
        return _RecomputedAttention.apply(q, k, v, 0.5, torch.float64, torch.float64)

    assert torch.autograd.gradcheck(recompute, (q, k, v))
    assert torch.autograd.gradgradcheck(recompute, (q, k, v))  # e.g. gradient penalties
    ref = torch.func.grad(lambda q: explicit(q, k, v).square().sum())(q)
    torch.testing.assert_close(torch.func.grad(lambda q: recompute(q, k, v).square().sum())(q), ref)


def test_cpu_training_attention_keeps_weights_only_for_short_sequences(monkeypatch):
    """CPU training keeps the N x N weights for the backward only while they cost less than q, k
    and v (N <= 3 head_dim); longer sequences recompute them, keeping what the fused kernel keeps."""
    import vitkit.models.attention as attention
    from vitkit.models.attention import attention_path

    monkeypatch.setattr(attention, "_TRAINING_PATHS", {})  # the rule, not a measurement of this CPU

    def saved_shapes(m, impl):
        m.set_attention_impl(impl)
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            m(torch.randn(2, 3, *m.cfg.img_size))
        return shapes

    for patch, keeps in ((4, False), (8, True)):  # N = 65 > 3 x 8, N = 17 < 3 x 8
        m = vitkit.create_model("vit_ti16", img_size=32, patch_size=patch, width=32, depth=1, num_heads=4, mlp_dim=64)
        n = m.cfg.grid_size[0] * m.cfg.grid_size[1] + 1
        square = (2, 4, n, n)
        assert square in saved_shapes(m, "math")
        assert (square in saved_shapes(m, "auto")) == keeps
        assert square not in saved_shapes(m, "recompute")
        with torch.no_grad():  # nothing is saved without gradients: the explicit path
            assert (
                attention_path(torch.zeros(1, 4, n, 8, dtype=torch.bfloat16), m.blocks[0].attn.impl, False, 0.0)
                == "math"
            )


def test_cpu_training_attention_takes_the_path_measured_faster_for_its_shape(monkeypatch, tmp_path):
    """Where choose_training_path timed a shape, "auto" follows the measurement, not the rule;
    the trainer times the shapes it trains on (full and patch-dropped sequences)."""
    import vitkit.models.attention as attention
    from vitkit.models.attention import attention_path, choose_training_path

    monkeypatch.setattr(attention, "_TRAINING_PATHS", {})
    q = torch.zeros(2, 4, 65, 8, requires_grad=True)  # the rule: recompute (65 > 3 x 8)
    with torch.enable_grad():
        assert attention_path(q, "auto", False, 0.0) == "recompute"
        attention._TRAINING_PATHS[(torch.float32, 2, 4, 65, 8)] = "math"
        assert attention_path(q, "auto", False, 0.0) == "math"
        assert attention_path(q, "recompute", False, 0.0) == "recompute"  # asked for: as asked
    assert attention_path(q.detach()[..., :8, :], "auto", False, 0.0) == "math"  # no gradients: nothing to measure
    choice = choose_training_path(2, 4, 17, 8)
    assert choice in ("math", "recompute") and attention._TRAINING_PATHS[(torch.float32, 2, 4, 17, 8)] == choice

    from _recipes import changed
    from vitkit.train import load_recipe
    from vitkit.train.loop import Trainer

    tree = changed(
        {"model": {"name": "vit_ti16", "overrides": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 1}}},
        model__overrides__num_heads=2,
        model__overrides__mlp_dim=64,
        data={"name": "synthetic", "options": {"img_size": 16, "n": 64}},
        train={"steps": 2, "batch_size": 16, "accum_steps": 2, "patch_drop": 0.5, "precision": "bf16"},
    )
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tree))
    Trainer(load_recipe(tmp_path / "r.yaml"), tmp_path / "run")
    # micro-batch 8, 2 heads of 16, the class token + all 16 patches or 8 of them, in bf16
    assert {(torch.bfloat16, 8, 2, 17, 16), (torch.bfloat16, 8, 2, 9, 16)} <= set(attention._TRAINING_PATHS)


def test_mimetic_init_makes_qk_product_near_identity():
    from vitkit.models.init import mimetic_init_

    m = tiny("vit_ti16", width=64, num_heads=2)
    mimetic_init_(m, qk=(0.0, 1.0), vo=(0.0, 1.0))
    D, hd = 64, 32
    w = m.blocks[0].attn.qkv.weight
    q, k = w[:hd], w[D : D + hd]  # head 0: (hd, D) each
    # with alpha = 0 the target is beta * I, whose best rank-hd fit is a projection: q^T k = P, P^2 = P
    p = q.T @ k
    torch.testing.assert_close(p @ p, p, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.trace(p), torch.tensor(float(hd)), atol=1e-3, rtol=0)
    vo = w[2 * D :].T @ m.blocks[0].attn.proj.weight.T  # x -> x W_v^T W_o^T
    torch.testing.assert_close(vo, -torch.eye(D), atol=1e-4, rtol=0)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_patch_dropout_keeps_a_subset_of_patches_in_training_only(classifier):
    torch.manual_seed(0)
    model = vitkit.create_model(
        "vit_ti16", img_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, classifier=classifier
    )
    x = torch.randn(3, 3, 32, 32)
    model.eval()
    full = model.embed(x)
    model.set_patch_drop(0.5)
    model.train()
    kept = model.embed(x)
    prefix = model.num_prefix_tokens
    assert kept.shape == (3, prefix + 8, 32)  # 16 patches, half kept
    assert torch.equal(kept[:, :prefix], full[:, :prefix])  # the class token is never dropped
    for b in range(3):  # every kept token is one of that image's tokens, each at most once
        d = torch.cdist(kept[b, prefix:], full[b, prefix:])
        assert (d.min(dim=1).values < 1e-5).all()  # embedded alone: another summation order
        assert len(set(d.argmin(dim=1).tolist())) == 8
    model.eval()  # evaluation sees every patch, whatever the training rate
    assert torch.equal(model.embed(x), full)
    model.train()
    model(x).sum().backward()  # the encoder and head run on the shorter sequence
    with pytest.raises(ValueError, match=r"patch drop rate must be in \[0, 1\), got 1.0"):
        model.set_patch_drop(1.0)


def test_patch_dropout_flat_weight_prefers_patches_with_content():
    """A flat weight below 1 keeps flat patches (an empty background) less often; at 1 the draw
    is the uniform one, the same subset as before the weight existed."""
    model = vitkit.create_model(
        "vit_ti16", img_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, in_chans=1, classifier="gap"
    )
    model.train()
    x = torch.full((64, 1, 32, 32), -1.0)  # 16 patches of 8x8: an empty background ...
    content = [0, 5, 6, 9, 10, 15]  # ... but for these six patches, in raster order
    for i in content:
        r, c = divmod(i, 4)
        x[:, :, r * 8 : r * 8 + 8, c * 8 : c * 8 + 8] = torch.rand(64, 1, 8, 8) * 2 - 1

    def kept(rate, weight, seed=0):
        model.set_patch_drop(rate, weight)
        torch.manual_seed(seed)
        tokens = model.embed(x)
        full = model.eval().embed(x)
        model.train()
        return [torch.cdist(tokens[b], full[b]).argmin(dim=1).tolist() for b in range(len(x))]

    # keeping as many patches as have content, a tiny flat weight keeps exactly those
    assert all(k == content for k in kept(10 / 16, 1e-6))
    # keeping more than have content: every content patch, and flat ones to fill up
    assert all(set(content) < set(k) and len(k) == 8 for k in kept(0.5, 1e-6))
    # a weight of 0.25: about a quarter as likely as a content patch, per draw
    counts = torch.zeros(16)
    for seed in range(20):
        for k in kept(0.75, 0.25, seed):
            counts[k] += 1
    flat_rate = counts[[i for i in range(16) if i not in content]].mean() / counts[content].mean()
    assert 0.15 < flat_rate < 0.4
    # weight 1 is the uniform draw of before, subset for subset
    torch.manual_seed(3)
    before = torch.rand(len(x), 16).argsort(dim=1)[:, :8].sort(dim=1).values.tolist()
    assert kept(0.5, 1.0, seed=3) == before
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="patch drop flat weight must be in"):
            model.set_patch_drop(0.5, bad)


@pytest.mark.parametrize(
    "overrides",
    [
        {"classifier": "token"},
        {"classifier": "gap", "pos_embed": "sincos2d"},
        {"classifier": "token", "cls_pos_embed": False},
        {"classifier": "token", "distill_token": True},
        {"classifier": "gap", "pos_embed": "learned2d"},
        {"classifier": "map", "pos_embed": "none", "in_chans": 1},
    ],
)
def test_patch_dropout_embeds_only_the_kept_patches_with_the_same_result(overrides):
    """Choosing the kept patches before the patch embedding (what a plain ViT does) gives the
    tokens and gradients of embedding every patch and then dropping (what a hybrid does), for
    the same random subset."""
    torch.manual_seed(0)
    kw = dict(img_size=(32, 24), patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3)
    model = vitkit.create_model("vit_ti16", **{**kw, **overrides})
    for table in (model.pos_embed, model.cls_token, model.dist_token):
        if isinstance(table, torch.nn.Parameter):
            torch.nn.init.normal_(table)  # nonzero prefix tokens and rows, so that a misplaced add shows
    model.train()
    model.set_patch_drop(0.5)
    x = torch.randn(4, model.cfg.in_chans, 32, 24)

    def embed_then_drop(m, images):
        tokens = m.patch_embed(images).flatten(2).transpose(1, 2)
        tokens = add_tokens_and_positions(tokens, m.prefix_tokens(), m.pos_embed_table(), m.cfg.cls_pos_embed)
        return m._drop_patches(tokens)

    results = []
    for embed in (model.embed, lambda images: embed_then_drop(model, images)):
        model.zero_grad()
        torch.manual_seed(1)
        tokens = embed(x)
        tokens.square().sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((tokens.detach(), grads))
    (kept, grads), (reference, ref_grads) = results
    assert kept.shape == (4, model.num_prefix_tokens + 6, 32)  # 12 patches, half kept
    torch.testing.assert_close(kept, reference, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys() and "patch_embed.proj.weight" in grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-4, rtol=1e-5, msg=name)


def test_mimetic_init_of_a_resnet_is_a_clear_error():
    from vitkit.models.init import mimetic_init_

    with pytest.raises(ValueError, match="needs a ViT's attention blocks; ResNetV2 has none"):
        mimetic_init_(vitkit.create_model("bit_r50x1", num_classes=2))


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("vit_ti16", {"pos_embed": "sincos2d", "img_size": 32}),
        ("vit_ti16", {"pos_embed": "relative", "img_size": 32}),
        ("vit_ti16", {"pos_embed": "rope_dinov3", "img_size": 32, "num_registers": 2}),
        ("vit_ti16", {"classifier": "map", "img_size": 32}),
        ("r26_vit_s32", {"img_size": 64}),
        ("bit_r50x1", {"num_classes": 5, "img_size": 64}),
    ],
)
def test_a_model_built_from_tensors_equals_one_given_them_after_random_init(name, overrides):
    from vitkit.models import build_model, model_config

    cfg = model_config(name, **overrides)
    torch.manual_seed(0)
    reference = build_model(cfg).eval()
    state = reference.state_dict()
    rng = torch.random.get_rng_state()
    built = build_model(cfg, state=state).eval()
    assert torch.equal(torch.random.get_rng_state(), rng), "building from tensors drew random numbers"
    assert not any(t.is_meta for t in [*built.parameters(), *built.buffers()])
    assert all(t.data_ptr() != state[k].data_ptr() for k, t in built.state_dict().items()), "tensors are copies"
    assert {k for k, _ in built.named_buffers()} == {k for k, _ in reference.named_buffers()}
    for (k, a), b in zip(reference.named_buffers(), built.buffers()):
        assert torch.equal(a, b), k
    x = torch.randn(2, cfg.in_chans, *cfg.img_size)
    with torch.no_grad():
        assert torch.equal(reference(x), built(x))


def test_a_model_built_from_tensors_zeroes_a_missing_head_and_refuses_other_gaps():
    from vitkit.models import build_model, model_config

    cfg = model_config("vit_ti16", img_size=32, num_classes=7)
    state = {k: v for k, v in build_model(cfg).state_dict().items() if not k.startswith("head.")}
    built = build_model(cfg, state=state)
    assert not built.head.weight.any() and not built.head.bias.any()
    state.pop("norm.weight")
    with pytest.raises(KeyError, match="norm.weight"):
        build_model(cfg, state=state)


def test_cpu_inference_attention_takes_the_fused_kernel_for_long_sequences():
    """Without gradients on the CPU: fp32 always fused; bf16 explicit up to N = 8 head_dim (the
    N x N weights stay in cache), fused beyond; weights asked for are always explicit."""
    from vitkit.models.attention import attention_path

    with torch.no_grad():
        for n, path in ((197, "math"), (512, "math"), (577, "sdpa"), (1370, "sdpa")):
            assert attention_path(torch.zeros(1, 12, n, 64, dtype=torch.bfloat16), "auto", False, 0.0) == path, n
            assert attention_path(torch.zeros(1, 12, n, 64), "auto", False, 0.0) == "sdpa"
            assert attention_path(torch.zeros(1, 12, n, 64, dtype=torch.bfloat16), "auto", True, 0.0) == "math"
