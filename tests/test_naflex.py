import pytest
import torch

from vitkit.errors import VitkitError
from vitkit.models.naflex import collate, fit_grid, patchify


@pytest.mark.parametrize(("h", "w"), [(224, 224), (100, 400), (400, 100), (37, 251), (1, 1000)])
@pytest.mark.parametrize("budget", [1, 16, 196, 256])
def test_fit_grid_fits_budget_and_keeps_aspect(h, w, budget):
    rows, cols = fit_grid(h, w, 16, budget)
    assert 1 <= rows * cols <= budget
    # The longer side of the image is the longer side of the grid.
    assert (rows >= cols) == (h >= w) or rows == cols


def test_fit_grid_square_uses_whole_budget():
    assert fit_grid(224, 224, 16, 196) == (14, 14)
    assert fit_grid(100, 400, 16, 256) == (8, 32)


def test_fit_grid_refuses_empty_budget():
    with pytest.raises(VitkitError, match="max_tokens=0"):
        fit_grid(10, 10, 16, 0)


def test_patchify_matches_conv_layout():
    # A patch flattened (row, col, channel) equals the image block read in that order.
    img = torch.randn(3, 32, 48)
    p = patchify(img, (2, 3), 16)  # no resize: 32x48 is already 2x3 patches of 16
    assert p.shape == (6, 16 * 16 * 3)
    block = img[:, 16:32, 32:48].permute(1, 2, 0).reshape(-1)  # patch at row 1, col 2
    torch.testing.assert_close(p[5], block, atol=1e-5, rtol=1e-5)


def test_collate_pads_and_marks_valid():
    b = collate([torch.randn(3, 64, 64), torch.randn(3, 32, 128)], patch=16, max_tokens=16)
    assert b.grids == [(4, 4), (2, 8)]
    assert b.patches.shape == (2, 16, 768)
    assert b.valid.all()
    b = collate([torch.randn(3, 64, 64), torch.randn(3, 16, 32)], patch=16, max_tokens=16)
    # A small image is scaled up to the budget too; 1:2 rounds up to a 3x5 grid (15 patches).
    assert b.grids[1] == (3, 5)
    assert b.valid.sum(1).tolist() == [16, 15]
    assert b.coords[1, 4:6].tolist() == [[0, 4], [1, 0]]
    assert not b.valid[1, 15]
    assert (b.patches[1, 15:] == 0).all()


import vitkit  # noqa: E402
from vitkit.models.naflex import forward_naflex  # noqa: E402

TINY = dict(width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5, patch_size=8, img_size=32)


def tiny_vit(**kw):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_b16", **{**TINY, **kw}).eval()
    torch.nn.init.normal_(model.head.weight)  # the head starts at zero: logits would hide every difference
    return model


KINDS = [
    dict(pos_embed="learned", classifier="token"),
    dict(pos_embed="learned2d", classifier="token"),
    dict(pos_embed="sincos2d", classifier="gap"),
    dict(pos_embed="learned", classifier="gap"),
    dict(pos_embed="rope_dinov3", classifier="token"),
    dict(pos_embed="rope_axial", classifier="gap"),
    dict(pos_embed="learned2d", classifier="map"),
    dict(pos_embed="sincos2d", classifier="gap", num_registers=2, fc_norm=True),
]


@pytest.mark.parametrize("kw", KINDS, ids=lambda k: f"{k['pos_embed']}-{k['classifier']}")
def test_naflex_batch_of_one_equals_square_forward(kw):
    model = tiny_vit(**kw)
    img = torch.randn(3, 32, 32)
    b = collate([img], patch=8, max_tokens=16)  # 4x4 grid: no resize, no padding
    with torch.no_grad():
        torch.testing.assert_close(forward_naflex(model, b), model(img[None]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", KINDS, ids=lambda k: f"{k['pos_embed']}-{k['classifier']}")
def test_naflex_padding_changes_nothing(kw):
    model = tiny_vit(**kw)
    imgs = [torch.randn(3, 32, 32), torch.randn(3, 16, 40), torch.randn(3, 48, 8)]
    with torch.no_grad():
        together = forward_naflex(model, collate(imgs, patch=8, max_tokens=16))
        alone = torch.cat([forward_naflex(model, collate([im], patch=8, max_tokens=16)) for im in imgs])
    assert collate(imgs, patch=8, max_tokens=16).valid.sum(1).tolist() != [16, 16, 16]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_naflex_gradient_flows():
    model = tiny_vit(pos_embed="learned2d").train()
    b = collate([torch.randn(3, 32, 32), torch.randn(3, 16, 40)], patch=8, max_tokens=16)
    forward_naflex(model, b).sum().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.blocks.parameters())


@pytest.mark.parametrize("kw", [dict(pos_embed="relative"), dict(distill_token=True)])
def test_naflex_refuses_unsupported_model(kw):
    model = tiny_vit(**kw)
    with pytest.raises(VitkitError, match="naflex"):
        forward_naflex(model, collate([torch.randn(3, 32, 32)], patch=8, max_tokens=16))


def test_naflex_refuses_patches_of_another_size():
    model = tiny_vit()
    with pytest.raises(VitkitError, match="patches of 768 values, the model wants 192"):
        forward_naflex(model, collate([torch.randn(3, 32, 32)], patch=16, max_tokens=4))


def test_model_forward_takes_a_naflex_batch():
    model = tiny_vit(pos_embed="learned2d", classifier="map")
    b = collate([torch.randn(3, 32, 32), torch.randn(3, 16, 40)], patch=8, max_tokens=16)
    with torch.no_grad():
        torch.testing.assert_close(model(b), forward_naflex(model, b))
        feats = forward_naflex(model, b, pre_logits=True)
    assert feats.shape == (2, 32)


def test_collate_of_fitted_images_only_cuts():
    imgs = [torch.randn(3, 16, 40), torch.randn(3, 24, 8)]  # 2x5 and 3x1 grids of 8 px
    b = collate(imgs, patch=8, max_tokens=16, fitted=True)
    assert b.grids == [(2, 5), (3, 1)]
    torch.testing.assert_close(b.patches[0, :10], patchify(imgs[0], (2, 5), 8))
    with pytest.raises(VitkitError, match="not a grid of at most 4 patches"):
        collate(imgs, patch=8, max_tokens=4, fitted=True)


def test_grad_checkpointing_gives_the_same_gradients():
    grads = []
    for ckpt in (False, True):
        model = tiny_vit(pos_embed="learned2d").train()
        model.set_grad_checkpointing(ckpt)
        b = collate([torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(1))], patch=8, max_tokens=16)
        forward_naflex(model, b).sum().backward()
        grads.append(model.patch_embed.proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
