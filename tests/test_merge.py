"""Token merging (ToMe): r = 0 computes what the plain model does, small r stays close, the class
token and registers are never merged, merged tokens are size-weighted means, and a model prepared
for serving merges alike."""

from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.inference import prepare_inference
from vitkit.models.merge import apply_token_merging, bipartite_merge

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
