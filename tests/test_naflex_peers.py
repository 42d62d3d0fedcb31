"""timm's NaFlexVit and Hugging Face's SigLIP 2 files load into vitkit with their own outputs on NaFlex batches.

Runs in the peers tier (``make test-peers``: timm on the path); skipped where timm is absent.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from vitkit.errors import VitkitError
from vitkit.models.naflex import collate

pytestmark = pytest.mark.peers


def _timm():
    return pytest.importorskip("timm", reason="timm is not installed (it needs torchvision)", exc_type=ImportError)


def _randomised(model):
    torch.manual_seed(1)
    with torch.no_grad():  # LayerScale, the head and the latent start small or zero: make them count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _batch():
    g = torch.Generator().manual_seed(0)
    # grids 8x8 (the table's own), 5x7 (smaller) and 9x11 (larger, and more patches than 64)
    images = [torch.randn(3, h * 16, w * 16, generator=g) for h, w in ((8, 8), (5, 7), (9, 11))]
    return collate(images, patch=16, max_tokens=99, fitted=True)


def _timm_input(b):
    return {"patches": b.patches, "patch_coord": b.coords, "patch_valid": b.valid}


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("naflexvit_base_patch16_gap", {}),
        ("naflexvit_base_patch16_siglip", {}),
    ],
)
def test_timm_naflexvit_file_gives_timm_outputs(tmp_path, caplog, name, kwargs):
    timm = _timm()
    ref = timm.create_model(
        name, pretrained=False, depth=2, embed_dim=64, num_heads=2, num_classes=10, pos_embed_grid_size=(8, 8),
        **kwargs,
    )  # fmt: skip
    ref = _randomised(ref)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    model = vitkit.load_pretrained(str(path), num_heads=2).eval()
    assert "pos_resize=" in caplog.text and "(timm's NaFlexVit" in caplog.text
    b = _batch()
    with torch.no_grad():
        want = ref(_timm_input(b))
        got = model(b)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        plain = torch.randn(2, 3, 128, 128)  # the table's own grid: the square path agrees too
        torch.testing.assert_close(model(plain), ref(plain), atol=2e-5, rtol=1e-4)


def test_timm_naflexvit_pieces_vitkit_lacks_are_named(tmp_path):
    timm = _timm()
    ref = timm.create_model(
        "naflexvit_base_patch16_parfac_gap", pretrained=False, depth=1, embed_dim=64, num_heads=2, num_classes=0
    )
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    with pytest.raises(VitkitError, match="embeds.pos_embed_y: timm's factorized position table"):
        vitkit.load_pretrained(str(path), num_heads=2)


def test_hf_siglip2_naflex_folder_gives_transformers_outputs(tmp_path):
    t = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    from vitkit.models.naflex import naflex_features

    cfg = t.Siglip2VisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, patch_size=16, num_patches=64
    )
    peer = _randomised(t.Siglip2VisionModel(cfg))
    peer.save_pretrained(tmp_path / "hf")
    ours = vitkit.load_pretrained(tmp_path / "hf").eval()
    assert ours.cfg.pos_resize == "bilinear_aa" and ours.cfg.classifier == "map" and ours.cfg.img_size == (128, 128)
    b = _batch()
    shapes = torch.tensor(b.grids)
    with torch.no_grad():
        out = peer(pixel_values=b.patches, pixel_attention_mask=b.valid.long(), spatial_shapes=shapes)
        tokens, mask = naflex_features(ours, b)
        pooled = ours(b)  # no head: the pooled output
    torch.testing.assert_close(pooled, out.pooler_output, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(tokens[mask], out.last_hidden_state[b.valid], atol=2e-5, rtol=1e-4)
