"""Token merging (ToMe): r = 0 computes what the plain model does, small r stays close, the class
token and registers are never merged, merged tokens are size-weighted means, a model prepared
for serving merges alike, and models with 2-D RoPE merge with each token turning by its own
(merged) angles."""

from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.inference import prepare_inference
from vitkit.models.merge import _angles_of_table, _rope_scale, apply_token_merging, bipartite_merge
from vitkit.models.posembed import rope_angles, rope_table

SMALL = {"img_size": 64, "patch_size": 8, "depth": 4, "width": 64, "num_heads": 4, "mlp_dim": 128, "num_classes": 10}


def _model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = vitkit.create_model("vit_ti16", **{**SMALL, **overrides}).eval()
    with torch.no_grad():
        model.head.weight.normal_(0, 0.5)
    return model


def _images(n: int = 4) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(n, 3, 64, 64)


@pytest.mark.parametrize("overrides", [{}, {"num_registers": 2}, {"classifier": "gap"}])
def test_r0_computes_what_the_plain_model_does(overrides):
    model, x = _model(**overrides), _images()
    with torch.no_grad():
        plain = model(x)
        merged = apply_token_merging(model, 0)(x)
    assert torch.allclose(merged, plain, atol=1e-5), (merged - plain).abs().max()


def test_small_r_stays_close_and_shortens_the_sequence():
    model, x = _model(num_registers=2), _images()
    with torch.no_grad():
        plain_tokens, plain = model.forward_features(x), model(x)
        apply_token_merging(model, 4)
        tokens, merged = model.forward_features(x), model(x)
    prefix = model.cfg.num_prefix_tokens  # the class token and two registers
    assert tokens.shape[1] == prefix + 64 - 4 * 4
    cos = torch.nn.functional.cosine_similarity(merged, plain, dim=1)
    assert cos.min() > 0.95, cos
    # the prefix tokens went through every block unmerged: they stay near the plain model's
    prefix_cos = torch.nn.functional.cosine_similarity(tokens[:, :prefix], plain_tokens[:, :prefix], dim=-1)
    assert prefix_cos.min() > 0.95, prefix_cos


def test_merged_tokens_are_size_weighted_means():
    x = torch.tensor([[[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, 5.0]]])  # A = rows 0, 2; B = rows 1, 3
    size = torch.tensor([[[3.0], [1.0], [1.0], [1.0]]])
    out, out_size = bipartite_merge(x, x, size, r=1)  # both A rows match their B row; the closer merges
    assert out.shape == (1, 3, 2) and sorted(out_size.flatten().tolist()) == [1.0, 1.0, 4.0]
    merged = out[out_size[..., 0] == 4.0][0]
    assert torch.allclose(merged, torch.tensor([1.5, 0.0]))  # (3 * 1 + 1 * 3) / 4: row 0 into row 1


def test_attention_is_proportional_to_token_size():
    """A token of size 2 draws the attention its two identical patches would: the other tokens'
    outputs are those of the sequence with the duplicate unmerged."""
    model = apply_token_merging(_model(), 0)
    block = model.blocks[0]
    torch.manual_seed(2)
    t = torch.randn(1, 3, 64)
    duplicated = torch.cat([t, t[:, 2:]], dim=1)  # token 2 twice
    with torch.no_grad():
        full, _ = block._attention(duplicated, torch.ones(1, 4, 1))
        merged, _ = block._attention(t, torch.tensor([[[1.0], [1.0], [2.0]]]))
    assert torch.allclose(merged[:, :2], full[:, :2], atol=1e-5), (merged[:, :2] - full[:, :2]).abs().max()


def test_a_prepared_model_merges_as_the_plain_one():
    model, x = _model(), _images()
    served = prepare_inference(model, "fp32", merge=4)
    with torch.no_grad():
        expected = apply_token_merging(_model(), 4)(x)
        got = served(x.to(served.input_dtype)).float()
    assert torch.allclose(got, expected, atol=1e-3), (got - expected).abs().max()


def test_refusals():
    with pytest.raises(ValueError, match="r must be 0 or more"):
        apply_token_merging(_model(), -1)
    with pytest.raises(ValueError, match="tied to the patch grid"):
        apply_token_merging(_model(pos_embed="relative"), 2)
    with pytest.raises(ValueError, match="not set up for"):  # a rotary table given to a model without RoPE
        apply_token_merging(_model(), 2).blocks[0](torch.randn(1, 65, 64), rope=rope_table((8, 8), 16))
    model = apply_token_merging(_model(), 2)
    with pytest.raises(ValueError, match="already"):
        apply_token_merging(model, 2)


def test_predict_and_serve_take_merge(tmp_path, capsys):
    from PIL import Image

    from vitkit.cli import main
    from vitkit.serve import ModelService

    ckpt = tmp_path / "m.safetensors"
    vitkit.save_checkpoint(_model(), ckpt)
    Image.new("RGB", (64, 64), (120, 30, 200)).save(tmp_path / "a.png")
    assert main(["predict", str(ckpt), str(tmp_path / "a.png"), "--merge", "4", "--precision", "fp32"]) == 0
    assert "a.png" in capsys.readouterr().out
    service = ModelService(vitkit.load_pretrained(ckpt), "fp32", merge=4)
    assert service.health()["merge"] == 4 and service.served.token_merging == 4


ROPE = {"pos_embed": "rope_dinov3", "num_registers": 4, "rope_theta": 100.0}


@pytest.mark.parametrize("kind", ["rope_axial", "rope_dinov3"])
@pytest.mark.parametrize("grid", [(8, 8), (37, 50)])
def test_rope_angles_are_read_back_from_the_table_unwrapped(kind, grid):
    """Every frequency's angle, the fastest ones many turns round on a large grid, from the
    cosines and sines alone."""
    scale = _rope_scale(kind, 64, 100.0)
    got = _angles_of_table(rope_table(grid, 64, 100.0, kind), scale)
    expected = rope_angles(grid, 64, 100.0, kind).float()
    assert expected.abs().max() > 3.2  # beyond half a turn: a wrapped reading would be wrong
    assert torch.allclose(got, expected, atol=1e-3, rtol=1e-5), (got - expected).abs().max()


@pytest.mark.parametrize("kind", ["rope_axial", "rope_dinov3"])
def test_a_rope_model_merges(kind):
    """r = 0 is the plain model; small r stays close; the class token and registers stay."""
    model, x = _model(**{**ROPE, "pos_embed": kind}), _images()
    with torch.no_grad():
        plain = model(x)
        assert torch.allclose(apply_token_merging(_model(**{**ROPE, "pos_embed": kind}), 0)(x), plain, atol=1e-5)
        apply_token_merging(model, 4)
        tokens, merged = model.forward_features(x), model(x)
    prefix = model.cfg.num_prefix_tokens
    assert prefix == 5 and tokens.shape[1] == prefix + 64 - 4 * 4
    cos = torch.nn.functional.cosine_similarity(merged, plain, dim=1)
    assert cos.min() > 0.95, cos


def test_merged_rope_angles_keep_the_patches_centroid():
    """Merging keeps the size-weighted sum of the angles: each merged token turns by the mean
    angle of the patches it stands for, wherever those were. (Axial RoPE: its positions, the row
    and column indices, do not sum to zero as DINOv3's centred ones do.)"""
    model, x = apply_token_merging(_model(**{**ROPE, "pos_embed": "rope_axial"}), 6), _images()
    with torch.no_grad():
        model(x)
    shared, prefix = model.blocks[0]._sizes, model.cfg.num_prefix_tokens
    size, angles = shared.size[:, prefix:], shared.angles
    assert angles.shape[1] == 64 - 4 * 6 and size.sum(1).eq(64).all()
    expected = rope_angles((8, 8), 16, 100.0, "rope_axial").float().sum(0)
    got = (size * angles).sum(1)  # (B, 8)
    assert torch.allclose(got, expected.expand_as(got), atol=1e-3), (got - expected).abs().max()
    assert (size > 1).any()  # tokens were merged


def test_a_merged_rope_token_turns_by_its_patches_mean_angle():
    """Two identical patches at one place, merged into a token of size 2 at that place, draw the
    attention they would unmerged; turned by another angle, the result differs."""
    model = apply_token_merging(_model(**ROPE), 0)
    block = model.blocks[0]
    torch.manual_seed(2)
    t = torch.randn(1, 5 + 3, 64)  # 5 prefix tokens, 3 patches
    angles = torch.randn(1, 3, 8)  # head_dim 16: 8 angles a token
    duplicated = torch.cat([t, t[:, -1:]], dim=1)
    dup_angles = torch.cat([angles, angles[:, -1:]], dim=1)

    def table(a: torch.Tensor) -> torch.Tensor:
        turned = a.repeat(1, 1, 2)
        return torch.stack([turned.cos(), turned.sin()])[:, :, None]

    with torch.no_grad():
        full, _ = block._attention(duplicated, torch.ones(1, 9, 1), table(dup_angles))
        sizes = torch.ones(1, 8, 1)
        sizes[0, -1] = 2.0
        merged, _ = block._attention(t, sizes, table(angles))
        elsewhere = angles.clone()
        elsewhere[0, -1] += 0.5
        moved, _ = block._attention(t, sizes, table(elsewhere))
    assert torch.allclose(merged[:, :7], full[:, :7], atol=1e-5), (merged[:, :7] - full[:, :7]).abs().max()
    assert not torch.allclose(moved[:, :7], full[:, :7], atol=1e-3)


def test_a_prepared_rope_model_merges_as_the_plain_one():
    model, x = _model(**ROPE), _images()
    served = prepare_inference(model, "fp32", merge=4)
    with torch.no_grad():
        expected = apply_token_merging(_model(**ROPE), 4)(x)
        got = served(x.to(served.input_dtype)).float()
    assert torch.allclose(got, expected, atol=1e-3), (got - expected).abs().max()
