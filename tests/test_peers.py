"""Parity with the peers' own models on random weights, where the peers are installed."""

from __future__ import annotations

import json

import pytest
import torch

import vitkit
from vitkit.checkpoint import hf_config_for, to_hf, to_timm

pytestmark = pytest.mark.peers


def _hf():
    return pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")


def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05 + (1.0 if p.ndim == 1 and p.shape[0] % 2 else 0.0))


@pytest.mark.parametrize("with_head", [True, False])
def test_hf_vit_logits_match(tmp_path, with_head):
    transformers = _hf()
    from safetensors.torch import save_file

    cfg = transformers.ViTConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        num_labels=7,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    if with_head:
        hf = transformers.ViTForImageClassification(cfg).eval()
    else:
        hf = transformers.ViTModel(cfg, add_pooling_layer=True).eval()
    _randomise(hf)
    hf.save_pretrained(tmp_path / "hf")  # the files as Hugging Face writes them
    ours = vitkit.load_pretrained(tmp_path / "hf")
    # transformers >= 5 names its modules differently from its files: both are read.
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, tmp_path / "raw.safetensors")
    raw = vitkit.load_pretrained(tmp_path / "raw.safetensors", num_heads=3)
    assert ours.load_report.source == "hf" and ours.cfg.ln_eps == 1e-12 and ours.cfg.act == "gelu"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        if with_head:
            ref = hf(pixel_values=x).logits
            got = ours(x)
            torch.testing.assert_close(raw(x), got)
        else:
            ref = hf(pixel_values=x).pooler_output  # dense + tanh on the class token = pre-logits
            got = ours.forward_head(ours.forward_features(x), pre_logits=True)
    assert (got - ref).abs().max() < 1e-5


def test_hf_export_runs_in_transformers(tmp_path):
    transformers = _hf()
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ours = vitkit.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=4, act="gelu").eval()
    _randomise(ours, 1)
    save_file(to_hf(ours.state_dict(), ours.cfg), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(hf_config_for(ours.cfg)))
    hf = transformers.ViTForImageClassification.from_pretrained(str(tmp_path)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (hf(pixel_values=x).logits - ours(x)).abs().max() < 1e-5


def test_timm_vit_logits_match(tmp_path):
    timm = pytest.importorskip("timm", reason="timm is not installed (it needs torchvision)", exc_type=ImportError)
    from safetensors.torch import save_file

    peer = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=6
    ).eval()
    _randomise(peer)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "timm.safetensors")
    ours = vitkit.load_pretrained(tmp_path / "timm.safetensors", num_heads=3)
    assert ours.load_report.source == "timm"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (peer(x) - ours(x)).abs().max() < 1e-5
    assert set(to_timm(ours.state_dict())) == set(peer.state_dict())


def test_timm_state_dict_round_trip(tmp_path):
    """Without timm installed: a timm-named state dict written by vitkit loads back identically."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ours = vitkit.create_model("vit_s16", img_size=32, depth=2, num_classes=3, representation_size=16, act="gelu")
    _randomise(ours, 2)
    sd = to_timm(ours.state_dict())
    assert "pre_logits.fc.weight" in sd
    save_file(sd, tmp_path / "pytorch_model.safetensors")
    back = vitkit.load_pretrained(tmp_path / "pytorch_model.safetensors")
    assert back.cfg.num_heads == 6  # read from the size table: width 384 is ViT-S
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x), ours.eval()(x), atol=0, rtol=0)


def test_torch_bin_is_read_weights_only(tmp_path):
    ours = vitkit.create_model("vit_ti16", img_size=32, depth=1, act="gelu")
    torch.save(ours.state_dict(), tmp_path / "pytorch_model.bin")
    back = vitkit.load_pretrained(tmp_path / "pytorch_model.bin")
    assert back.load_report.source == "timm"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil()}, tmp_path / "evil.bin")
    with pytest.raises(vitkit.CheckpointError, match=r"evil\.bin"):
        vitkit.load_pretrained(tmp_path / "evil.bin")
