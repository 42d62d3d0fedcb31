from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.analysis import (
    attention_rollout,
    cls_rollout_map,
    collect_attention,
    embedding_filter_components,
    mean_attention_distance,
    pos_embed_similarity,
    pos_embed_similarity_summary,
    rollout_map,
    token_attention_maps,
)
from vitkit.cli import main

# ----------------------------------------------------------------------------------------------
# Attention rollout


def _tiny_vit(**overrides):
    kw = dict(img_size=32, patch_size=8, depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=10)
    kw.update(overrides)
    torch.manual_seed(0)
    return vitkit.create_model("vit_ti16", **kw).eval()


def test_identity_attention_gives_identity_rollout():
    eye = torch.eye(5).expand(2, 3, 5, 5)  # (B, H, N, N)
    out = attention_rollout([eye, eye, eye])
    torch.testing.assert_close(out, torch.eye(5).expand(2, 5, 5))


def test_two_layer_rollout_by_hand():
    # layer 1: heads [[1, 0], [0, 1]] and [[0, 1], [0, 1]] -> mean [[.5, .5], [0, 1]]
    #   + I = [[1.5, .5], [0, 2]] -> rows renormalised [[.75, .25], [0, 1]]
    # layer 2: one head [[0, 1], [1, 0]] -> + I = all ones -> [[.5, .5], [.5, .5]]
    # rollout = A2 @ A1 = [[.375, .625], [.375, .625]] (A1 @ A2 would be all .5)
    layer1 = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]]])  # (1, 2, 2, 2)
    layer2 = torch.tensor([[[[0.0, 1.0], [1.0, 0.0]]]])  # (1, 1, 2, 2)
    out = attention_rollout([layer1, layer2])
    torch.testing.assert_close(out, torch.tensor([[[0.375, 0.625], [0.375, 0.625]]]))


def test_rollout_rows_stay_distributions_and_options_are_checked():
    attn = [torch.rand(2, 3, 7, 7).softmax(-1) for _ in range(4)]
    for fusion in ("mean", "max", "min"):
        out = attention_rollout(attn, head_fusion=fusion, discard_ratio=0.3)
        torch.testing.assert_close(out.sum(-1), torch.ones(2, 7))
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout(attn, head_fusion="median")
    with pytest.raises(ValueError, match="discard_ratio"):
        attention_rollout(attn, discard_ratio=1.0)
    with pytest.raises(ValueError, match="at least one block"):
        attention_rollout([])


def test_rollout_map_picks_the_query_and_scales_to_unit_range():
    grid = (2, 3)
    rollout = torch.rand(2, 7, 7)
    maps = rollout_map(rollout, grid, num_prefix_tokens=1)
    assert maps.shape == (2, 2, 3)
    assert torch.allclose(maps.amin(dim=(1, 2)), torch.zeros(2))
    assert torch.allclose(maps.amax(dim=(1, 2)), torch.ones(2))
    row = rollout[0, 0, 1:]
    torch.testing.assert_close(maps[0].flatten(), (row - row.min()) / (row.max() - row.min()))
    # a chosen patch, by raster index or (row, col)
    by_index = rollout_map(rollout, grid, 1, query=4)
    torch.testing.assert_close(by_index, rollout_map(rollout, grid, 1, query=(1, 1)))
    row = rollout[1, 1 + 4, 1:]
    torch.testing.assert_close(by_index[1].flatten(), (row - row.min()) / (row.max() - row.min()))
    with pytest.raises(ValueError, match="outside"):
        rollout_map(rollout, grid, 1, query=6)
    with pytest.raises(ValueError, match="does not fit"):
        rollout_map(rollout, (2, 2), 1)


def test_cls_rollout_map_on_models():
    model = _tiny_vit()
    images = torch.randn(3, 3, 32, 32)
    maps = cls_rollout_map(model, images)
    assert maps.shape == (3, 4, 4) and maps.min() >= 0 and maps.max() <= 1
    expected = rollout_map(attention_rollout(collect_attention(model, images)), (4, 4), 1)
    torch.testing.assert_close(maps, expected)
    gap = _tiny_vit(classifier="gap")
    maps = cls_rollout_map(gap, images)
    rollout = attention_rollout(collect_attention(gap, images))
    mean_row = rollout.mean(dim=1)[0]  # no prefix token: mean over all (patch) query rows
    torch.testing.assert_close(maps[0].flatten(), (mean_row - mean_row.min()) / (mean_row.max() - mean_row.min()))
    assert cls_rollout_map(gap, images, query=5).shape == (3, 4, 4)
    with pytest.raises(TypeError, match="VisionTransformer"):
        cls_rollout_map(vitkit.create_model("bit_r50x1", units=(1, 1, 1, 1), num_classes=2), images)


def test_token_attention_maps_shape_and_values():
    attn = [torch.rand(2, 3, 1 + 6, 1 + 6).softmax(-1) for _ in range(4)]
    maps = token_attention_maps(attn, (2, 3), num_prefix_tokens=1)
    assert maps.shape == (2, 4, 3, 2, 3)
    torch.testing.assert_close(maps[1, 2, 0].flatten(), attn[2][1, 0, 0, 1:])


# ----------------------------------------------------------------------------------------------
# Mean attention distance


def _average_pairwise_distance(grid, stride):
    gh, gw = grid
    sh, sw = stride
    total, count = 0.0, 0
    for r1 in range(gh):
        for c1 in range(gw):
            for r2 in range(gh):
                for c2 in range(gw):
                    total += math.hypot((r1 - r2) * sh, (c1 - c2) * sw)
                    count += 1
    return total / count


@pytest.mark.parametrize(
    "grid, stride, prefix",
    [((4, 4), (16, 16), 1), ((3, 5), (16, 16), 0), ((2, 7), (32, 8), 1), ((5, 3), (12, 20), 0)],
)
def test_uniform_attention_distance_is_mean_pairwise_distance(grid, stride, prefix):
    N = prefix + grid[0] * grid[1]
    uniform = torch.full((2, 3, N, N), 1.0 / N)
    expected = _average_pairwise_distance(grid, stride)
    stride_arg = stride[0] if stride[0] == stride[1] else stride
    out = mean_attention_distance([uniform, uniform], grid, stride_arg, prefix)
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)


def test_attention_distance_local_heads_and_class_token_share():
    grid, stride = (3, 4), 10
    P = 12
    eye = torch.eye(P + 1).expand(1, 1, P + 1, P + 1)
    # each patch attends to itself: distance 0
    assert mean_attention_distance([eye], grid, stride, 1).item() == 0.0
    # half the weight on the class token, half uniform over patches: same as uniform
    half = torch.cat([torch.full((1, 1, P + 1, 1), 0.5), torch.full((1, 1, P + 1, P), 0.5 / P)], dim=-1)
    expected = _average_pairwise_distance(grid, (stride, stride))
    np.testing.assert_allclose(mean_attention_distance([half], grid, stride, 1).item(), expected, rtol=1e-12)
    # each patch attends to its right neighbour when there is one, else to itself
    right = torch.zeros(1, 1, P, P)
    for i in range(P):
        right[0, 0, i, i + 1 if (i % 4) < 3 else i] = 1.0
    np.testing.assert_allclose(mean_attention_distance([right], grid, stride, 0).item(), 10 * 9 / 12)
    with pytest.raises(ValueError, match="does not fit"):
        mean_attention_distance([eye], (4, 4), stride, 1)


def test_attention_distance_of_a_hybrid_is_in_input_pixels():
    model = _tiny_vit(patch_size=1, resnet_units=(1, 1), resnet_width=32, img_size=64)
    assert model.cfg.total_stride == (8, 8) and model.cfg.grid_size == (8, 8)
    attn = collect_attention(model, torch.randn(1, 3, 64, 64))
    dist = mean_attention_distance(attn, model.cfg.grid_size, model.cfg.total_stride, 1)
    assert dist.shape == (2, 2)
    # bounded by the largest centre-to-centre distance, in pixels
    assert (dist > 0).all() and (dist <= math.hypot(56, 56)).all()


# ----------------------------------------------------------------------------------------------
# Position embeddings and filters


def _separable_pos_embed(gh, gw, dim=128, prefix=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(gh, dim // 2, generator=g)  # one random code per row ...
    cols = torch.randn(gw, dim // 2, generator=g)  # ... and per column
    pe = torch.cat([rows[:, None].expand(gh, gw, -1), cols[None].expand(gh, gw, -1)], dim=-1)  # (gh, gw, D)
    pe = pe.reshape(gh * gw, dim)  # (P, D), raster order
    return torch.cat([torch.randn(prefix, dim, generator=g), pe])[None]  # (1, prefix + P, D)


def test_separable_pos_embed_shows_rows_and_columns():
    gh, gw = 5, 7
    pe = _separable_pos_embed(gh, gw)
    sim = pos_embed_similarity(pe, grid=(gh, gw))
    assert sim.shape == (gh, gw, gh, gw)
    e = pe[0, 1:].double().numpy()
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    np.testing.assert_allclose(sim.reshape(gh * gw, gh * gw).numpy(), e @ e.T, atol=1e-6)
    s = pos_embed_similarity_summary(sim)
    assert s["self"] == pytest.approx(1.0)
    # sharing a row or column shares half the code (~0.5); sharing neither, ~0
    assert s["same_row"] > 0.35 and s["same_column"] > 0.35
    assert abs(s["other"]) < 0.15 and abs(s["far"]) < 0.15
    for i, j in [(0, 0), (2, 3), (4, 6)]:
        m = sim[i, j].clone()
        m[i, j] = float("nan")
        in_line = torch.cat([m[i], m[:, j]])
        in_line = in_line[~in_line.isnan()]
        elsewhere = m[torch.arange(gh) != i][:, torch.arange(gw) != j]
        assert in_line.min() > elsewhere.max()


def test_pos_embed_similarity_from_models():
    model = _tiny_vit(img_size=(24, 40))  # 3x5 grid, class token
    with torch.no_grad():
        model.pos_embed.copy_(_separable_pos_embed(3, 5, dim=32))
    torch.testing.assert_close(pos_embed_similarity(model), pos_embed_similarity(model.pos_embed, grid=(3, 5)))
    gap = _tiny_vit(classifier="gap")
    assert pos_embed_similarity(gap).shape == (4, 4, 4, 4)
    assert pos_embed_similarity(gap.pos_embed).shape == (4, 4, 4, 4)  # square grid inferred
    sincos = _tiny_vit(pos_embed="sincos2d")
    assert pos_embed_similarity(sincos).shape == (4, 4, 4, 4)
    with pytest.raises(ValueError, match="no position embedding"):
        pos_embed_similarity(_tiny_vit(pos_embed="none"))
    with pytest.raises(ValueError, match="do not fit"):
        pos_embed_similarity(model.pos_embed, grid=(4, 4), num_prefix_tokens=1)


def test_filter_pca_recovers_two_known_patterns():
    C, ph, pw = 3, 4, 5
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, ph), torch.linspace(-1, 1, pw), indexing="ij")
    p1 = torch.stack([xx, xx, xx]).double()  # horizontal ramp, grey
    p2 = torch.stack([yy, -yy, torch.zeros_like(yy)]).double()  # vertical red-green ramp
    p1, p2 = p1 / p1.norm(), p2 / p2.norm()  # orthogonal by symmetry
    assert abs(float((p1 * p2).sum())) < 1e-12
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, generator=g).double(), torch.randn(64, generator=g).double()
    a, b = a - a.mean(), b - b.mean()
    b = b - (a @ b) / (a @ a) * a  # uncorrelated coefficients ...
    a, b = 3 * a / a.norm(), b / b.norm()  # ... with distinct variances
    offset = torch.randn(C, ph, pw, generator=g).double()  # a mean filter, removed by centring
    weight = a[:, None, None, None] * p1 + b[:, None, None, None] * p2 + offset  # (D, C, ph, pw)
    comps, ratio = embedding_filter_components(weight.float(), k=5)
    assert comps.shape == (5, C, ph, pw) and ratio.shape == (5,)
    assert abs(float((comps[0].double() * p1).sum())) == pytest.approx(1.0, abs=1e-5)
    assert abs(float((comps[1].double() * p2).sum())) == pytest.approx(1.0, abs=1e-5)
    assert float(ratio[0]) == pytest.approx(0.9, abs=1e-5) and float(ratio[:2].sum()) == pytest.approx(1.0, abs=1e-5)


def test_filter_pca_of_a_model():
    model = _tiny_vit()
    pca = embedding_filter_components(model, k=40)
    assert pca.components.shape == (32, 3, 8, 8)  # k clipped to D = 32 filters
    torch.testing.assert_close(pca.components.flatten(1).norm(dim=1), torch.ones(32))
    assert float(pca.explained_variance_ratio.sum()) == pytest.approx(1.0, abs=1e-5)
    assert (pca.explained_variance_ratio[:-1] >= pca.explained_variance_ratio[1:]).all()


# ----------------------------------------------------------------------------------------------
# Figures


def test_figures_rectangular_grid_and_greyscale(tmp_path):
    from vitkit.analysis import figures

    sim = pos_embed_similarity(_separable_pos_embed(3, 5, dim=32), grid=(3, 5))
    mosaic = figures.pos_embed_mosaic(sim)
    assert mosaic.shape == (3 * 4 - 1, 5 * 6 - 1)
    np.testing.assert_array_equal(mosaic[4:7, 12:17], sim[1, 2].numpy())
    assert np.isnan(mosaic[3]).all() and np.isnan(mosaic[:, 5]).all()
    paths = [
        figures.plot_pos_embed_similarity(sim, tmp_path / "sim.png"),
        figures.plot_rollout_overlay(np.zeros((2, 24, 40), np.uint8), torch.rand(2, 3, 5), tmp_path / "roll.png"),
        figures.plot_filter_components(torch.randn(3, 1, 4, 4), tmp_path / "pca.png", torch.tensor([0.5, 0.3, 0.2])),
        figures.plot_attention_maps(torch.rand(3, 2, 3, 5), tmp_path / "attn.png", layers=[0, -1]),
        figures.plot_mean_attention_distance(torch.rand(3, 2) * 30, tmp_path / "dist.png"),
    ]
    for p in paths:
        assert p.is_file() and p.stat().st_size > 1000
    with pytest.raises(ValueError, match="cannot be shown"):
        figures.plot_filter_components(torch.randn(3, 8, 1, 1), tmp_path / "x.png")
    with pytest.raises(ValueError, match="out of range"):
        figures.plot_attention_maps(torch.rand(3, 2, 3, 5), tmp_path / "x.png", layers=[3])


# ----------------------------------------------------------------------------------------------
# The CLI, end to end

FIGURES = ("rollout.png", "mean_attention_distance.png", "pos_embed_similarity.png", "embedding_filters.png")


def _check_report(out: Path, grid, depth, heads, n_images):
    report = json.loads((out / "analysis.json").read_text())
    for name in FIGURES:
        assert (out / name).stat().st_size > 1000
    assert len(list(out.glob("attention_*.png"))) == n_images
    assert np.array(report["mean_attention_distance"]["values"]).shape == (depth, heads)
    assert np.array(report["rollout"]["maps"]).shape == (n_images, *grid)
    assert len(report["images"]) == n_images
    assert report["grid"] == list(grid)
    assert report["pos_embed_similarity"]["neighbours"] is not None
    ratios = np.array(report["filter_pca"]["explained_variance_ratio"])
    assert (ratios > 0).all() and ratios.sum() <= 1 + 1e-6 and (np.diff(ratios) <= 1e-6).all()
    return report


def test_cli_analyze_tiny_model(tmp_path, capsys):
    pytest.importorskip("skimage")
    ckpt = vitkit.save_checkpoint(_tiny_vit(), tmp_path / "tiny.safetensors")
    out = tmp_path / "out"
    assert main(["analyze", str(ckpt), "--out", str(out)]) == 0
    report = _check_report(out, (4, 4), depth=2, heads=2, n_images=3)
    assert report["model"]["config"]["width"] == 32
    assert "analysis.json" in capsys.readouterr().out


def test_cli_analyze_image_files_greyscale_gap(tmp_path):
    from PIL import Image

    files = []
    for i, size in enumerate([(50, 30), (20, 64)]):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (*size, 3), dtype=np.uint8)).save(path)
        files.append(str(path))
    ckpt = vitkit.save_checkpoint(_tiny_vit(classifier="gap", in_chans=1), tmp_path / "gap.safetensors")
    out = tmp_path / "out"
    assert main(["analyze", str(ckpt), "--images", *files, "--out", str(out), "--layers", "-1"]) == 0
    report = _check_report(out, (4, 4), depth=2, heads=2, n_images=2)
    assert [im["name"] for im in report["images"]] == ["img0", "img1"]
    assert main(["analyze", str(ckpt), "--images", str(tmp_path / "missing.png"), "--out", str(out)]) == 2


def test_cli_analyze_without_scikit_image(tmp_path, monkeypatch, capsys):
    ckpt = vitkit.save_checkpoint(_tiny_vit(), tmp_path / "tiny.safetensors")
    monkeypatch.setitem(sys.modules, "skimage", None)  # makes `import skimage` fail
    assert main(["analyze", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    assert "--images" in capsys.readouterr().err


def test_cli_analyze_official_fixture(fixtures, tmp_path):
    pytest.importorskip("skimage")
    npz = fixtures / "vit_tiny_token" / "params_prelinen.npz"
    if not npz.is_file():
        pytest.skip(f"{npz} not found")
    out = tmp_path / "out"
    assert main(["analyze", str(npz), "--out", str(out)]) == 0
    report = _check_report(out, (4, 4), depth=2, heads=2, n_images=3)
    assert report["source"] == "official"
    assert np.array(report["filter_pca"]["explained_variance_ratio"]).shape == (28,)
