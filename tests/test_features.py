"""Dense features: ``forward_intermediates(output_fmt="NCHW")`` and ``features_only=True`` models,
on rectangular inputs, hybrids (whose reduction includes the CNN's stride) and BiT ResNets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitkit

TINY = dict(width=32, depth=4, num_heads=2, mlp_dim=64, num_classes=5)


def test_nchw_maps_are_the_patch_tokens_on_their_grid():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_ti16", patch_size=4, img_size=(16, 24), **TINY).eval()
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        nlc = model.forward_intermediates(x, indices=[1, -1])
        maps = model.forward_intermediates(x, indices=[1, -1], output_fmt="NCHW")
    assert [m.shape for m in maps["tokens"]] == [(2, 32, 4, 6)] * 2  # (B, D, H/4, W/4), rectangular
    for tokens, fmap, prefix in zip(nlc["tokens"], maps["tokens"], maps["prefix_tokens"], strict=True):
        torch.testing.assert_close(prefix, tokens[:, :1])  # the class token, apart
        for i, j in [(0, 0), (0, 5), (3, 0), (2, 4)]:  # patch (i, j) is token 1 + i * 6 + j (raster order)
            torch.testing.assert_close(fmap[:, :, i, j], tokens[:, 1 + i * 6 + j])
    torch.testing.assert_close(maps["normed"], nlc["normed"])


def test_nchw_maps_of_the_official_fixture(fixtures):
    """The official code's residual stream (``encoderblock_i_out``), laid out on its grid."""
    d = fixtures / "r_vit_tiny"
    model = vitkit.load_pretrained(d / "params_prelinen.npz", features_only=True, out_indices=2)
    assert model.feature_info == [
        {"num_chs": 32, "reduction": 8, "module": "blocks.0"},  # 2 ResNet stages: stride 8, 1x1 patches
        {"num_chs": 32, "reduction": 8, "module": "blocks.1"},
    ]
    assert model.feature_info.channels() == [32, 32] and model.feature_info.reduction() == [8, 8]
    x = torch.from_numpy(np.load(d / "input.npy")).permute(0, 3, 1, 2)
    inter = np.load(d / "intermediates.npz")
    with torch.no_grad():
        maps = model(x)
    for i, fmap in enumerate(maps):
        want = inter[f"encoderblock_{i}_out"][:, 1:].reshape(4, 4, 4, 32)  # (B, gh, gw, D), NHWC
        np.testing.assert_allclose(fmap.permute(0, 2, 3, 1).numpy(), want, atol=2e-5, rtol=0)
    normed = vitkit.load_pretrained(d / "params_prelinen.npz").forward_intermediates(x, output_fmt="NCHW", norm=True)
    want = inter["encoded"][:, 1:].reshape(4, 4, 4, 32)
    np.testing.assert_allclose(normed["tokens"][-1].detach().permute(0, 2, 3, 1).numpy(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    "name,extra,size,reduction",
    [
        ("vit_ti16", dict(patch_size=4, classifier="gap"), (16, 28), 4),
        ("vit_ti16", dict(patch_size=4, classifier="map"), (20, 12), 4),
        ("r_vit_ti16", dict(patch_size=2, resnet_width=32), (32, 48), 8),  # the ResNet root alone: 4 x 2
        ("r50_vit_b16", dict(patch_size=1, resnet_units=(1, 1), resnet_width=32), (24, 40), 8),  # root 4, stage 2
        ("r26_vit_s32", dict(patch_size=1, resnet_units=(1, 1, 1, 1), resnet_width=32), (64, 32), 32),
    ],
)
def test_features_only_models(name, extra, size, reduction):
    torch.manual_seed(0)
    model = vitkit.create_model(name, features_only=True, out_indices=(0, -1), img_size=size, **{**TINY, **extra})
    assert model.feature_info == [
        {"num_chs": 32, "reduction": reduction, "module": "blocks.0"},
        {"num_chs": 32, "reduction": reduction, "module": "blocks.3"},
    ]
    maps = model(torch.randn(2, 3, *size))
    assert [m.shape for m in maps] == [(2, 32, size[0] // reduction, size[1] // reduction)] * 2
    maps[-1].sum().backward()  # a neck trains through them
    assert model.model.patch_embed.proj.weight.grad is not None


def test_out_indices_and_their_errors():
    model = vitkit.create_model("vit_ti16", patch_size=4, img_size=16, features_only=True, **TINY)
    assert [f["module"] for f in model.feature_info] == ["blocks.1", "blocks.2", "blocks.3"]  # the last 3
    last2 = vitkit.create_model("vit_ti16", patch_size=4, img_size=16, features_only=True, out_indices=2, **TINY)
    assert last2.out_indices == [2, 3]
    with pytest.raises(ValueError, match="must name some of the 4 blocks"):
        vitkit.create_model("vit_ti16", patch_size=4, img_size=16, features_only=True, out_indices=[4], **TINY)
    with pytest.raises(ValueError, match="pass features_only=True too"):
        vitkit.create_model("vit_ti16", out_indices=[1])
    with pytest.raises(ValueError, match="output_fmt must be 'NLC' or 'NCHW'"):
        vitkit.create_model("vit_ti16", patch_size=4, img_size=16, **TINY).forward_intermediates(
            torch.zeros(1, 3, 16, 16), output_fmt="NHWC"
        )


def test_dynamic_img_size_maps_follow_the_input():
    model = vitkit.create_model(
        "vit_ti16", patch_size=4, img_size=16, dynamic_img_size=True, features_only=True, out_indices=1, **TINY
    )
    assert model(torch.randn(1, 3, 32, 20))[0].shape == (1, 32, 8, 5)


def test_patch_dropout_refuses_dense_maps():
    model = vitkit.create_model("vit_ti16", patch_size=4, img_size=16, **TINY).train()
    model.set_patch_drop(0.5)
    with pytest.raises(ValueError, match="needs every patch token"):
        model.forward_intermediates(torch.zeros(1, 3, 16, 16), output_fmt="NCHW")


def test_bit_resnet_stage_outputs():
    torch.manual_seed(0)
    model = vitkit.create_model("bit_r50x1", units=(1, 1, 1, 1), img_size=64, features_only=True).eval()
    assert model.feature_info.reduction() == [2, 4, 8, 16, 32]
    assert model.feature_info.channels() == [64, 256, 512, 1024, 2048]
    assert [f["module"] for f in model.feature_info] == ["conv_root", "stages.0", "stages.1", "stages.2", "norm"]
    x = torch.randn(1, 3, 64, 96)  # rectangular
    with torch.no_grad():
        maps = model(x)
        features = model.model.forward_features(x)
    assert [m.shape[-2:] for m in maps] == [(32, 48), (16, 24), (8, 12), (4, 6), (2, 3)]
    assert torch.equal(maps[-1], features)  # the last map is forward_features' (after GN-ReLU)
    picked = vitkit.create_model("bit_r50x1", units=(1, 1, 1, 1), features_only=True, out_indices=[1, -1])
    assert picked.feature_info.reduction() == [4, 32]
