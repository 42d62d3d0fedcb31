"""Parity with the official JAX code on the fixtures it computed (../shared/fixtures/official)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoint import convert_official, to_official

FIXTURES = ["vit_tiny_token", "vit_tiny_gap_repr", "r_vit_tiny", "vit_tiny_token_res24"]
LAYOUTS = ["prelinen", "linen"]


def run(model, fixture_dir):
    x = torch.from_numpy(np.load(fixture_dir / "input.npy")).permute(0, 3, 1, 2)  # NHWC -> NCHW
    with torch.no_grad():
        out = model.forward_intermediates(x)
        pre = model.forward_head(out["normed"], pre_logits=True)
        logits = model.forward_head(out["normed"])
    return out, pre.numpy(), logits.numpy()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", FIXTURES)
def test_logits_and_pre_logits_match_reference(fixtures, name, layout):
    d = fixtures / name
    model = vitkit.load_pretrained(d / f"params_{layout}.npz")
    out, pre, logits = run(model, d)
    assert np.abs(logits - np.load(d / "logits.npy")).max() < 5e-6
    assert np.abs(pre - np.load(d / "pre_logits.npy")).max() < 5e-5
    inter = np.load(d / "intermediates.npz")
    np.testing.assert_allclose(out["embedded"].numpy(), inter["tokens_with_posemb"], atol=2e-5, rtol=0)
    for i, tokens in enumerate(out["tokens"]):
        np.testing.assert_allclose(tokens.numpy(), inter[f"encoderblock_{i}_out"], atol=2e-5, rtol=0)
    np.testing.assert_allclose(out["normed"].numpy(), inter["encoded"], atol=2e-5, rtol=0)


def test_hybrid_stem_intermediates(fixtures):
    d = fixtures / "r_vit_tiny"
    model = vitkit.load_pretrained(d / "params_prelinen.npz")
    inter = np.load(d / "intermediates.npz")
    x = torch.from_numpy(np.load(d / "input.npy")).permute(0, 3, 1, 2)
    bb = model.patch_embed.backbone
    nhwc = lambda t: t.permute(0, 2, 3, 1).numpy()
    with torch.no_grad():
        np.testing.assert_allclose(nhwc(bb.conv_root(x)), inter["stem/conv_root_out"], atol=2e-5, rtol=0)
        y = bb.forward_root(x)
        y = bb.stages[0](y)
        np.testing.assert_allclose(nhwc(y), inter["resnet/block1_out"], atol=2e-5, rtol=0)
        y = bb.stages[1](y)
        np.testing.assert_allclose(nhwc(y), inter["resnet/block2_out"], atol=2e-5, rtol=0)


def test_inferred_config(fixtures):
    cfg = vitkit.load_pretrained(fixtures / "r_vit_tiny" / "params_prelinen.npz").cfg
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim) == (32, 2, 2, 64)
    assert cfg.resnet_units == (1, 1) and cfg.resnet_width == 32 and cfg.img_size == (32, 32)
    gap = vitkit.load_pretrained(fixtures / "vit_tiny_gap_repr" / "params_linen.npz").cfg
    assert gap.classifier == "gap" and gap.representation_size is not None


def test_resize_to_res24_matches_official_interpolation(fixtures):
    model = vitkit.load_pretrained(fixtures / "vit_tiny_token" / "params_prelinen.npz", img_size=24)
    ref = np.load(fixtures / "vit_tiny_token_res24" / "pos_embedding_resized.npy")
    assert np.abs(model.pos_embed.detach().numpy() - ref).max() < 1e-6
    _, _, logits = run(model, fixtures / "vit_tiny_token_res24")
    assert np.abs(logits - np.load(fixtures / "vit_tiny_token_res24" / "logits.npy")).max() < 5e-6
    assert any("resized 4x4 -> 6x6" in n for n in model.load_report.notes)


def test_resize_bicubic_and_rectangular(fixtures):
    path = fixtures / "vit_tiny_token" / "params_prelinen.npz"
    bil = vitkit.load_pretrained(path, img_size=(24, 32))
    bic = vitkit.load_pretrained(path, img_size=(24, 32), pos_embed_mode="bicubic")
    assert bil.pos_embed.shape == bic.pos_embed.shape == (1, 1 + 6 * 8, 32)
    assert not torch.allclose(bil.pos_embed, bic.pos_embed)
    torch.testing.assert_close(bil.pos_embed[:, 0], bic.pos_embed[:, 0])  # class token row kept
    assert bil(torch.zeros(1, 3, 24, 32)).shape == (1, 10)


def test_new_num_classes_replaces_head(fixtures):
    model = vitkit.load_pretrained(fixtures / "vit_tiny_token" / "params_prelinen.npz", num_classes=3)
    assert model.head.out_features == 3 and model.head.weight.abs().sum() == 0
    assert any("head replaced: 10 -> 3" in n for n in model.load_report.notes)


@pytest.mark.parametrize("name", ["vit_tiny_token", "vit_tiny_gap_repr", "r_vit_tiny"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_export_to_official_round_trips(fixtures, name, layout):
    arrays = dict(np.load(fixtures / name / f"params_{layout}.npz"))
    sd, cfg = convert_official(arrays)
    back = to_official(sd, cfg, layout=layout)
    assert set(back) == set(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v.reshape(back[k].shape), err_msg=k)


def test_big_vision_variants(fixtures, tmp_path):
    """big_vision: ``params/`` prefix, scanned blocks, class token without position embedding."""
    d = fixtures / "vit_tiny_token"
    arrays = dict(np.load(d / "params_linen.npz"))
    ref = vitkit.load_pretrained(d / "params_linen.npz")
    bv = {}
    blocks = [k for k in arrays if k.startswith("Transformer/encoderblock_0/")]
    for k in blocks:
        rest = k[len("Transformer/encoderblock_0/") :]
        stacked = np.stack([arrays[f"Transformer/encoderblock_{i}/{rest}"] for i in range(2)])
        bv[f"params/Transformer/encoderblock/{rest}"] = stacked
    for k, v in arrays.items():
        if not k.startswith("Transformer/encoderblock_") and "posembed" not in k:
            bv[f"params/{k}"] = v
    pos = arrays["Transformer/posembed_input/pos_embedding"]
    bv["params/pos_embedding"] = pos[:, 1:]  # no class-token row
    bv["opt/state/mu"] = np.zeros(3, np.float32)
    p = tmp_path / "bv.npz"
    np.savez(p, **bv)
    model = vitkit.load_pretrained(p)
    assert model.cfg.cls_pos_embed is False and model.cfg.depth == 2
    x = torch.from_numpy(np.load(d / "input.npy")).permute(0, 3, 1, 2)
    with torch.no_grad():
        # Same weights except the class token's position embedding (0 here): compare to the
        # reference with that row zeroed.
        ref.pos_embed.data[:, 0] = 0
        torch.testing.assert_close(model(x), ref(x), atol=1e-6, rtol=0)


def _as_bf16_bytes(a: np.ndarray) -> np.ndarray:
    """A float array as JAX's bf16 arrays come back from ``np.savez``: 2-byte void entries."""
    return torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view("V2")


def test_bf16_values_stored_as_two_byte_voids_read_exactly():
    from vitkit.checkpoint.io import bf16_to_float32

    values = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.140625, 1e-40, -1e38, float("inf"), float("-inf")])
    got = bf16_to_float32(_as_bf16_bytes(values.numpy().reshape(3, 3)))
    assert got.dtype == np.float32 and got.shape == (3, 3)
    assert torch.equal(torch.from_numpy(got).flatten(), values.to(torch.bfloat16).float())
    assert np.isnan(bf16_to_float32(_as_bf16_bytes(np.array([np.nan], np.float32)))).all()


def test_a_big_vision_bf16_checkpoint_loads_as_the_weights_rounded_to_bf16(fixtures, tmp_path):
    """big_vision's half-size files (PaliGemma's ``*.bf16.npz``) hold every float array as bf16,
    which numpy reads back as 2-byte voids: they load as the fp32 checkpoint rounded to bf16."""
    d = fixtures / "vit_tiny_token"
    arrays = dict(np.load(d / "params_linen.npz"))
    np.savez(tmp_path / "half.bf16.npz", **{k: _as_bf16_bytes(v) for k, v in arrays.items()})
    model = vitkit.load_pretrained(tmp_path / "half.bf16.npz")
    ref = vitkit.load_pretrained(d / "params_linen.npz")
    rounded = {k: v.to(torch.bfloat16).float() for k, v in ref.state_dict().items()}
    got = model.state_dict()
    assert got.keys() == rounded.keys()
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], rounded[k]) for k in got)
    _, _, logits = run(model, d)
    assert np.abs(logits - np.load(d / "logits.npy")).max() < 0.05  # bf16 weights: about 3 digits
