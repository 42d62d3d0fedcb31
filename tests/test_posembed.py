from __future__ import annotations

import numpy as np
import pytest
import torch

import vitkit
from vitkit.errors import CheckpointError
from vitkit.models import (
    ViTConfig,
    learned_2d_pos_table,
    relative_offset_index,
    resample_1d,
    resample_pos_embed,
    resample_relative_embed,
    sincos_2d_pos_embed,
)
from vitkit.models.posembed import relative_num_offsets


def test_bilinear_equals_scipy_zoom_order1():
    scipy_ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(0)
    pe = rng.normal(size=(1, 1 + 5 * 7, 8)).astype(np.float32)
    out = resample_pos_embed(torch.from_numpy(pe), (9, 4), old_grid=(5, 7)).numpy()
    grid = pe[0, 1:].reshape(5, 7, 8)
    ref = scipy_ndimage.zoom(grid.astype(np.float64), (9 / 5, 4 / 7, 1), order=1)
    np.testing.assert_allclose(out[0, 1:].reshape(9, 4, 8), ref, atol=1e-6)
    np.testing.assert_array_equal(out[0, 0], pe[0, 0])


def test_same_grid_is_identity():
    pe = torch.randn(1, 17, 4)
    assert resample_pos_embed(pe, (4, 4)) is pe


def test_non_square_needs_old_grid():
    with pytest.raises(ValueError, match="not a square"):
        resample_pos_embed(torch.randn(1, 1 + 6, 4), (3, 3))


def test_sincos_is_separable_and_bounded():
    pe = sincos_2d_pos_embed((3, 5), 16)
    assert pe.shape == (15, 16) and pe.abs().max() <= 1
    grid = pe.reshape(3, 5, 16)
    # first half encodes the column (x), second half the row (y)
    torch.testing.assert_close(grid[0, :, :8], grid[2, :, :8])
    torch.testing.assert_close(grid[:, 0, 8:], grid[:, 4, 8:])
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_pos_embed((2, 2), 6)


# ----------------------------------------------------------------------------------------------
# The alternatives of appendix D.4: 2-D learned ("learned2d") and 1-D relative ("relative").

POS_EMBEDS = ("learned", "learned2d", "sincos2d", "relative", "none")
TINY = dict(img_size=(16, 24), patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)


def tiny(**kw):
    torch.manual_seed(0)
    m = vitkit.create_model("vit_ti16", **{**TINY, **kw})
    torch.nn.init.normal_(m.head.weight, std=0.1)  # zero logits otherwise: no gradient reaches the body
    return m


def position_params(m):
    return {n: p for n, p in m.named_parameters() if "pos_embed" in n or "rel_embed" in n}


@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("pos_embed", POS_EMBEDS)
def test_every_pos_embed_runs_and_trains_its_tables(pos_embed, classifier):
    m = tiny(pos_embed=pos_embed, classifier=classifier).train()
    x = torch.randn(2, 3, 16, 24)
    prefix = 1 if classifier == "token" else 0
    assert m.forward_features(x).shape == (2, prefix + 4 * 6, 32)
    m(x).square().sum().backward()
    params = position_params(m)
    expected = {
        "learned": {"pos_embed"},
        "learned2d": {"pos_embed_row", "pos_embed_col"} | ({"pos_embed_prefix"} if prefix else set()),
        "relative": {"blocks.0.attn.rel_embed", "blocks.1.attn.rel_embed"},
    }.get(pos_embed, set())
    assert set(params) == expected
    for p in params.values():
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert (m.pos_embed_table() is None) == (pos_embed in ("relative", "none"))


def test_pos_embed_choices_and_odd_width():
    choices = "'learned', 'learned2d', 'sincos2d', 'relative', 'rope_axial', 'rope_dinov3' or 'none', got 'rope'"
    with pytest.raises(ValueError, match=choices):
        ViTConfig(pos_embed="rope")
    with pytest.raises(ValueError, match="pos_embed 'learned2d' needs an even width"):
        ViTConfig(width=33, num_heads=3, mlp_dim=64, pos_embed="learned2d")


def test_learned2d_table_is_row_then_column():
    m = tiny(pos_embed="learned2d")
    row, col, prefix = m.pos_embed_row, m.pos_embed_col, m.pos_embed_prefix
    assert row.shape == (1, 4, 16) and col.shape == (1, 6, 16) and prefix.shape == (1, 1, 32)
    table = m.pos_embed_table()
    assert table.shape == (1, 1 + 24, 32)
    assert torch.equal(table[0, 0], prefix[0, 0])
    for i in range(4):
        for j in range(6):
            assert torch.equal(table[0, 1 + i * 6 + j], torch.cat([row[0, i], col[0, j]]))
    assert learned_2d_pos_table(row, col).shape == (1, 24, 32)
    for p in (row, col, prefix):
        assert 0.01 < p.std() < 0.04  # N(0, 0.02)
    # no class-token position: no prefix table, the table covers the patches only
    assert tiny(pos_embed="learned2d", classifier="gap").pos_embed_prefix is None
    big_vision = tiny(pos_embed="learned2d", cls_pos_embed=False)
    assert big_vision.pos_embed_prefix is None and big_vision.pos_embed_table().shape == (1, 24, 32)


def test_resample_1d_is_linear_with_aligned_corners():
    t = torch.tensor([[9.0], [0.0], [1.0], [4.0]])[None]  # (1, 1 prefix + 3, 1)
    out = resample_1d(t, 5, num_prefix_tokens=1)
    torch.testing.assert_close(out[0, :, 0], torch.tensor([9.0, 0.0, 0.5, 1.0, 2.5, 4.0]))
    assert resample_1d(t, 3, num_prefix_tokens=1) is t
    scipy_ndimage = pytest.importorskip("scipy.ndimage")
    table = torch.randn(1, 7, 3, dtype=torch.float64)
    ref = scipy_ndimage.zoom(table[0].numpy(), (11 / 7, 1), order=1)  # the official convention
    np.testing.assert_allclose(resample_1d(table, 11)[0].numpy(), ref, atol=1e-12)


def test_relative_offsets_and_their_resize():
    index = relative_offset_index(3, num_prefix_tokens=1)  # patches 0, 1, 2 after the class token
    # entry 0: pairs with the class token; patch offsets i - j = -2..2 -> entries 1..5
    assert index.tolist() == [[0, 0, 0, 0], [0, 3, 2, 1], [0, 4, 3, 2], [0, 5, 4, 3]]
    assert relative_offset_index(3).tolist() == [[2, 1, 0], [3, 2, 1], [4, 3, 2]]
    table = torch.randn(1 + 5, 4)
    assert resample_relative_embed(table, 3, 1) is table
    big = resample_relative_embed(table, 5, 1)  # 2*5-1 offsets + the class entry
    assert big.shape == (1 + 9, 4)
    assert torch.equal(big[0], table[0])  # the class entry kept
    torch.testing.assert_close(big[[1, -1]], table[[1, -1]])  # the extreme offsets stay at the ends
    m = tiny(pos_embed="relative")
    attn = m.blocks[0].attn
    assert attn.rel_embed.shape == (1 + 2 * 24 - 1, 16)
    tables = [f"blocks.{i}.attn.rel_embed" for i in range(len(m.blocks))]
    assert [k for k in m.state_dict() if ".attn.rel" in k] == tables  # the tables alone are stored
    assert tiny(pos_embed="relative", classifier="gap").blocks[0].attn.rel_embed.shape == (2 * 24 - 1, 16)
    assert m.pos_embed is None


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 2, 7, 49])
def test_relative_bias_is_each_pairs_entry_and_so_is_its_gradient(n, prefix):
    """The gather-free bias equals the table entry of every pair (relative_offset_index), and
    so do the gradients it sends to the queries and the table."""
    torch.manual_seed(n + prefix)
    m = tiny(pos_embed="relative", classifier="token" if prefix else "gap")
    attn = m.blocks[0].attn
    attn.rel_prefix, attn.rel_patches = prefix, n
    table = torch.randn(relative_num_offsets(n, prefix), attn.head_dim, dtype=torch.float64)
    attn.rel_embed = torch.nn.Parameter(table)
    q = torch.randn(2, 3, prefix + n, attn.head_dim, dtype=torch.float64, requires_grad=True)
    index = relative_offset_index(n, prefix)
    want = (q * attn.scale) @ attn.rel_embed.T
    want = want.gather(-1, index.expand(2, 3, prefix + n, prefix + n))
    got = attn.relative_bias(q)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    grad = torch.randn_like(want)
    g_want = torch.autograd.grad(want, (q, attn.rel_embed), grad)
    g_got = torch.autograd.grad(got, (q, attn.rel_embed), grad)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def _plain_relative_attention(x, qkv_w, qkv_b, rel, proj_w, proj_b, heads, prefix):
    """softmax(q k^T * scale + bias) v with bias[i, j] = q_i * scale . rel[offset(i, j)], in loops."""
    B, T, D = x.shape
    hd = D // heads
    scale = hd**-0.5
    n = T - prefix
    qkv = x @ qkv_w.T + qkv_b  # (B, T, 3D)
    q, k, v = qkv[..., :D], qkv[..., D : 2 * D], qkv[..., 2 * D :]

    def entry(i, j):
        if i < prefix or j < prefix:
            return 0
        return (i - prefix) - (j - prefix) + (n - 1) + (1 if prefix else 0)

    rows = []
    for b in range(B):
        per_token = []
        for i in range(T):
            per_head = []
            for h in range(heads):
                cols = slice(h * hd, (h + 1) * hd)
                qi = q[b, i, cols]
                logits = torch.stack([(qi * scale) @ k[b, j, cols] + (qi * scale) @ rel[entry(i, j)] for j in range(T)])
                w = logits.softmax(0)
                per_head.append(sum(w[j] * v[b, j, cols] for j in range(T)))
            per_token.append(torch.cat(per_head))
        rows.append(torch.stack(per_token))
    return torch.stack(rows) @ proj_w.T + proj_b  # (B, T, D)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("impl", ["math", "sdpa", "auto", "recompute"])
def test_relative_attention_equals_the_plain_computation(impl, training):
    m = tiny(pos_embed="relative", img_size=(8, 12))  # grid 2 x 3: 6 patches and the class token
    m.set_attention_impl(impl)
    attn = m.blocks[0].attn.train(training)
    x = torch.randn(2, 7, 32)
    params = [attn.qkv.weight, attn.qkv.bias, attn.rel_embed, attn.proj.weight, attn.proj.bias]
    ref_params = [p.detach().double().requires_grad_() for p in params]
    ref = _plain_relative_attention(x.double(), *ref_params, heads=2, prefix=1)
    out = attn(x)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()  # gradients reach the table and the query (qkv) weights
    ref.square().sum().backward()
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(p.grad.double(), r.grad, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # inference ("auto": the fused kernel on the CPU), and the path that returns the weights
        torch.testing.assert_close(attn(x).double(), ref.detach(), atol=1e-5, rtol=1e-5)
        out_w, weights = attn(x, return_weights=True)
    torch.testing.assert_close(out_w.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 7))


def test_relative_attention_paths_agree_under_autocast():
    m = tiny(pos_embed="relative").train()
    x = torch.randn(2, 3, 16, 24)
    outs = {}
    for impl in ("sdpa", "math"):
        m.set_attention_impl(impl)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs[impl] = m(x).float()
    assert (outs["sdpa"] - outs["math"]).norm() / outs["math"].norm() < 2e-2


@pytest.mark.parametrize("pos_embed", ["learned2d", "relative"])
def test_save_load_round_trip_is_exact(pos_embed, tmp_path):
    m = tiny(pos_embed=pos_embed).eval()
    path = vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    loaded = vitkit.load_pretrained(path)
    assert loaded.cfg == m.cfg
    for (k, a), (k2, b) in zip(m.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        assert torch.equal(m(x), loaded(x))


@pytest.mark.parametrize("pos_embed", ["learned2d", "relative"])
def test_resize_to_another_grid(pos_embed, tmp_path):
    m = tiny(pos_embed=pos_embed).eval()
    path = vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    x = torch.randn(1, 3, 20, 28)  # grid 5 x 7: 35 patches
    with pytest.raises(ValueError, match="differs from the model's img_size"):
        m(x)
    loaded = vitkit.load_pretrained(path, img_size=(20, 28))
    assert "resized 4x6 -> 5x7 (linear, 1-D)" in loaded.load_report.notes[0]
    resized = tiny(pos_embed=pos_embed).eval()
    resized.set_img_size((20, 28))
    dynamic = tiny(pos_embed=pos_embed, dynamic_img_size=True).eval()
    if pos_embed == "learned2d":
        for model in (loaded, resized):
            assert model.pos_embed_row.shape == (1, 5, 16) and model.pos_embed_col.shape == (1, 7, 16)
        assert loaded.pos_embed_table().shape == (1, 1 + 35, 32)
    else:
        for model in (loaded, resized):
            assert model.blocks[1].attn.rel_embed.shape == (1 + 2 * 35 - 1, 16)
    with torch.no_grad():
        want = resized(x)
        assert want.shape == (1, 5)
        torch.testing.assert_close(loaded(x), want)
        torch.testing.assert_close(dynamic(x), want)  # resized at run time, the same way
        assert dynamic(torch.randn(1, 3, 16, 24)).shape == (1, 5)  # and back at the table's own size
    with pytest.raises(ValueError, match="resized linearly: use pos_embed_mode='bilinear'"):
        vitkit.load_pretrained(path, img_size=(20, 28), pos_embed_mode="bicubic")


@pytest.mark.parametrize("pos_embed", ["learned2d", "relative"])
def test_resize_to_the_same_size_is_the_identity(pos_embed, tmp_path):
    m = tiny(pos_embed=pos_embed).eval()
    path = vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    x = torch.randn(2, 3, 16, 24)
    loaded = vitkit.load_pretrained(path, img_size=(16, 24))
    assert loaded.load_report.notes == []
    with torch.no_grad():
        want = m(x)
        m.set_img_size((16, 24))
        assert torch.equal(m(x), want) and torch.equal(loaded(x), want)
    flipped = tiny(pos_embed="relative").eval()  # 6 x 4 has the 24 patches of 4 x 6: the same 1-D offsets
    flipped.set_img_size((24, 16))
    assert flipped.blocks[0].attn.rel_embed.shape == (48, 16)


@pytest.mark.parametrize("to", ["official", "timm", "hf"])
@pytest.mark.parametrize("pos_embed", ["learned2d", "relative"])
def test_exporters_refuse_in_one_line(pos_embed, to, tmp_path):
    from vitkit.export import export_weights

    m = tiny(pos_embed=pos_embed)
    dst = tmp_path / "out"
    want = (
        f"\\(pos_embed='{pos_embed}'\\).*export to vitkit"
        if to == "hf"
        else f"not pos_embed='{pos_embed}'; export to vitkit"
    )
    with pytest.raises(CheckpointError, match=want) as e:
        export_weights(m, dst, to)
    assert "\n" not in str(e.value)
    assert not dst.exists()
    export_weights(m, tmp_path / "m.safetensors", "vitkit")  # vitkit's own file holds them


def test_flops_count_the_relative_term():
    from vitkit.models.flops import vit_flops

    cfg = ViTConfig(**{**TINY, "pos_embed": "learned"})
    rel = cfg.replace(pos_embed="relative")
    N, D, offsets = 1 + 24, 32, 1 + 2 * 24 - 1
    assert vit_flops(rel) - vit_flops(cfg) == cfg.depth * 2 * N * D * offsets  # heads x (2 N hd offsets)
    assert vit_flops(cfg.replace(pos_embed="learned2d")) == vit_flops(cfg)


def test_position_tables_get_no_weight_decay():
    from vitkit.train.optim import param_groups

    for pos_embed in ("learned2d", "relative"):
        m = tiny(pos_embed=pos_embed)
        decay, no_decay = param_groups(m, 0.1)
        tables = {id(p) for p in position_params(m).values()}
        assert tables and tables <= {id(p) for p in no_decay["params"]}
        assert not tables & {id(p) for p in decay["params"]}


def test_similarity_analysis_of_the_new_options():
    from vitkit.analysis import pos_embed_similarity

    m = tiny(pos_embed="learned2d")
    sim = pos_embed_similarity(m)
    assert sim.shape == (4, 6, 4, 6)
    torch.testing.assert_close(sim, pos_embed_similarity(m.pos_embed_table(), grid=(4, 6)))
    with pytest.raises(ValueError, match="no absolute position embedding"):
        pos_embed_similarity(tiny(pos_embed="relative"))


def test_relative_works_with_the_rest_of_the_model():
    from vitkit.inference import fold_attention_scale
    from vitkit.models.init import mimetic_init_

    m = tiny(pos_embed="relative").eval()
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        want = m(x)
        fold_attention_scale(m)  # the bias is computed from the scaled query: folding keeps it
        torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)
    mimetic_init_(m)
    assert torch.isfinite(m(x)).all()
    out = m.forward_intermediates(x, return_attention=True)
    assert out["attention"][0].shape == (2, 2, 25, 25)
    with pytest.raises(ValueError, match="patch dropout needs absolute position embeddings"):
        m.set_patch_drop(0.5)
    m.set_patch_drop(0.0)


@pytest.mark.parametrize("pos_embed", ["learned2d", "relative"])
def test_onnx_export_of_the_new_options(pos_embed, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from vitkit.export import export_onnx

    result = export_onnx(tiny(pos_embed=pos_embed), tmp_path / "m.onnx")
    assert result["max_abs_diff"] is not None and result["max_abs_diff"] < 1e-4
