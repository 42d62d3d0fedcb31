"""The pieces of later ViTs (registers, LayerScale, pre-norm, fc_norm, q/k norm, SwiGLU, QuickGELU)
and the loading of DINOv2, CLIP and SigLIP weights from timm and Hugging Face files, with the
peers' own models as the reference where they are installed."""

from __future__ import annotations

import logging
import re

import pytest
import torch

import vitkit
from vitkit.analysis.attention import cls_rollout_map, collect_attention, mean_attention_distance
from vitkit.inference import fold_attention_scale
from vitkit.models import ViTConfig, model_flops
from vitkit.models.vit import LayerScale, QuickGELU, SwiGLU

TINY = dict(img_size=28, patch_size=7, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)
ALL_PIECES = dict(
    num_registers=3, layer_scale_init=0.5, pre_norm=True, qk_norm=True, mlp_type="swiglu", act="quick_gelu"
)


def tiny(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    model = vitkit.create_model("vit_s16", **{**TINY, **kw})
    _randomise(model)
    return model


def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Random values for every parameter (zero-initialised heads and tokens included), so that
    each piece changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.ndim == 1 and p.shape[0] % 2 == 0 else 0.0))


# ---------------------------------------------------------------------------------------------
# The pieces, each off by default.


def test_pieces_are_off_by_default():
    model = vitkit.create_model("vit_ti16", **TINY)
    names = " ".join(model.state_dict())
    for piece in ("reg_token", "ls1", "ls2", "q_norm", "k_norm", "fc_norm", "norm_pre"):
        assert piece not in names
    assert "patch_embed.proj.bias" in names and "norm.weight" in names
    assert not {"num_registers", "layer_scale_init", "pre_norm", "fc_norm", "qk_norm"} & set(model.cfg.to_dict())
    assert isinstance(model.blocks[0].ls1, torch.nn.Identity) and model.blocks[0].attn.q_norm is None


def test_config_writes_only_the_pieces_in_use_and_reads_them_back():
    cfg = ViTConfig(**{**TINY, **ALL_PIECES, "fc_norm": True, "classifier": "gap", "patch_bias": False})
    d = cfg.to_dict()
    assert {"num_registers", "layer_scale_init", "pre_norm", "qk_norm", "mlp_type", "fc_norm", "patch_bias"} <= set(d)
    assert "class_token" not in d and not cfg.has_class_token
    assert ViTConfig.from_dict(d) == cfg
    cfg = cfg.replace(class_token=True)
    d = cfg.to_dict()
    assert d["class_token"] is True and cfg.has_class_token and cfg.num_prefix_tokens == 1 + 3
    assert ViTConfig.from_dict(d) == cfg


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(num_registers=-1), "num_registers"),
        (dict(num_registers=True), "num_registers"),
        (dict(layer_scale_init=float("nan")), "layer_scale_init"),
        (dict(mlp_type="geglu"), "mlp_type"),
        (dict(act="relu"), "quick_gelu"),
        (dict(distill_token=True, fc_norm=True), "fc_norm"),
        (dict(class_token=False), "class_token"),  # classifier "token" pools it
        (dict(class_token=1, classifier="gap"), "class_token"),
    ],
)
def test_config_refuses_wrong_pieces(bad, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(**{**TINY, **bad})


def test_a_class_token_kept_with_average_pooling(tmp_path):
    """``class_token=True`` with "gap": the class token is in the sequence (with its position row)
    but the pooling is the mean of the patch tokens alone; saved and loaded back as it is."""
    model = tiny(classifier="gap", class_token=True, num_registers=2).eval()
    assert model.cls_token is not None and model.num_prefix_tokens == 3 and model.pos_embed.shape == (1, 1 + 16, 32)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        tokens = model.forward_features(x)  # (B, 1 + 2 + 16, D)
        assert tokens.shape == (2, 19, 32)
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens[:, 3:].mean(dim=1))
    vitkit.save_checkpoint(model, tmp_path / "m.safetensors")
    back = vitkit.load_pretrained(tmp_path / "m.safetensors")
    assert back.cfg == model.cfg and not back.load_report.assumed
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    from vitkit.export import export_weights

    plain = tiny(classifier="gap", class_token=True).eval()  # no registers: timm's layout
    with pytest.raises(vitkit.CheckpointError, match="classifier='gap'"):  # it would read back as "token"
        export_weights(plain, tmp_path / "o.npz", "official")
    export_weights(plain, tmp_path / "t.safetensors", "timm")  # the config travels in the metadata
    assert vitkit.load_pretrained(tmp_path / "t.safetensors").cfg == plain.cfg


def test_registers_follow_the_class_token_without_a_position():
    model = tiny(num_registers=4).eval()
    assert model.num_prefix_tokens == 5 and model.cfg.pos_prefix_rows == 1
    assert model.pos_embed.shape == (1, 1 + 16, 32)  # the class token's row and the grid's: none for registers
    x = torch.randn(2, 3, 28, 28)
    z0 = model.embed(x)
    assert z0.shape == (2, 5 + 16, 32)
    torch.testing.assert_close(z0[:, 1:5], model.reg_token.expand(2, -1, -1), atol=0, rtol=0)
    torch.testing.assert_close(z0[:, 0], (model.cls_token + model.pos_embed[:, :1])[:, 0].expand(2, -1))
    # cls_pos_embed=False (timm's no_embed_class): the table is the grid's alone
    unplaced = tiny(num_registers=4, cls_pos_embed=False)
    assert unplaced.pos_embed.shape == (1, 16, 32) and unplaced.cfg.pos_prefix_rows == 0
    # a GAP model with registers: they are its prefix, left out of the mean
    gap = tiny(num_registers=2, classifier="gap").eval()
    tokens = gap.forward_features(x)
    assert tokens.shape == (2, 2 + 16, 32)
    torch.testing.assert_close(gap.pool(tokens), tokens[:, 2:].mean(1))


@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d", "learned2d"])
def test_registers_at_another_resolution(pos_embed):
    static = tiny(num_registers=2, pos_embed=pos_embed).eval()
    dynamic = tiny(num_registers=2, pos_embed=pos_embed, dynamic_img_size=True).eval()
    dynamic.load_state_dict(static.state_dict())
    static.set_img_size((42, 35))
    x = torch.randn(1, 3, 42, 35)
    with torch.no_grad():
        out = static.forward_features(x)
        assert out.shape == (1, 3 + 6 * 5, 32)
        torch.testing.assert_close(dynamic.forward_features(x), out)


def test_registers_in_intermediates_features_attention_and_analyses():
    model = tiny(num_registers=3, classifier="map").eval()  # no class token: the registers are the prefix
    x = torch.randn(2, 3, 28, 28)
    out = model.forward_intermediates(x, return_attention=True, output_fmt="NCHW")
    assert [t.shape for t in out["tokens"]] == [(2, 32, 4, 4)] * 2
    assert [t.shape for t in out["prefix_tokens"]] == [(2, 3, 32)] * 2
    assert [w.shape for w in out["attention"]] == [(2, 2, 19, 19)] * 2
    features = vitkit.create_model("vit_s16", **TINY, num_registers=3, features_only=True, out_indices=[0, 1])
    assert [f.shape for f in features(x)] == [(2, 32, 4, 4)] * 2
    assert cls_rollout_map(model, x).shape == (2, 4, 4)
    distance = mean_attention_distance(collect_attention(model, x), (4, 4), 7, model.num_prefix_tokens)
    assert distance.shape == (2, 2) and torch.isfinite(distance).all()


def test_patch_dropout_keeps_the_registers():
    model = tiny(num_registers=3).train()
    model.set_patch_drop(0.5)
    z0 = model.embed(torch.randn(2, 3, 28, 28))
    assert z0.shape == (2, 1 + 3 + 8, 32)
    torch.testing.assert_close(z0[:, 1:4], model.reg_token.expand(2, -1, -1), atol=0, rtol=0)


def test_layer_scale_pre_norm_and_fc_norm_where_they_act():
    model = vitkit.create_model("vit_s16", **TINY, layer_scale_init=1e-5)
    gammas = [m.gamma for m in model.modules() if isinstance(m, LayerScale)]
    assert len(gammas) == 4 and all(torch.equal(g, torch.full((32,), 1e-5)) for g in gammas)
    model = tiny(pre_norm=True).eval()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        z0 = model.embed(x)
        torch.testing.assert_close(model.norm_pre(model.pos_drop(_raw_tokens(model, x))), z0)
    model = tiny(fc_norm=True, classifier="gap").eval()
    assert isinstance(model.norm, torch.nn.Identity) and "norm.weight" not in model.state_dict()
    with torch.no_grad():
        tokens = model.forward_features(x)
        pooled = model.forward_head(tokens, pre_logits=True)
        torch.testing.assert_close(pooled, model.fc_norm(tokens.mean(1)))  # no prefix token
        torch.testing.assert_close(model(x), model.head(pooled))


def _raw_tokens(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """z0 before the pre-norm: the class token and the patches, positions added."""
    patches = model.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, D)
    return torch.cat([model.cls_token.expand(x.shape[0], -1, -1), patches], dim=1) + model.pos_embed


def test_swiglu_and_quick_gelu_compute_their_formulas():
    torch.manual_seed(0)
    mlp = SwiGLU(8, 12)
    x = torch.randn(3, 8)
    w = mlp.fc1.weight  # (24, 8): the gate's 12 rows, then the value's
    gate, value = x @ w[:12].T + mlp.fc1.bias[:12], x @ w[12:].T + mlp.fc1.bias[12:]
    expected = (gate * torch.sigmoid(gate) * value) @ mlp.fc2.weight.T + mlp.fc2.bias
    torch.testing.assert_close(mlp(x), expected)
    torch.testing.assert_close(QuickGELU()(x), x * torch.sigmoid(1.702 * x))
    model = vitkit.create_model("vit_s16", **TINY, mlp_type="swiglu")
    assert model.blocks[0].mlp.fc1.weight.shape == (128, 32) and model.blocks[0].mlp.fc2.weight.shape == (32, 64)
    with torch.device("meta"):
        plain = vitkit.create_model("vit_s16", **TINY)
    tokens, depth = 1 + 16, 2
    assert model_flops(model) - model_flops(plain) == depth * 2 * tokens * 32 * 64  # one more D x M matrix


def assert_attention_paths_agree(model, x) -> None:
    """The sdpa, math and recompute attention paths, and gradient checkpointing, give ``model`` the
    same outputs and gradients on ``x``."""
    outs, grads = {}, {}
    for impl in ("sdpa", "math", "recompute"):
        model.set_attention_impl(impl)
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        outs[impl] = out.detach()
        grads[impl] = torch.cat([p.grad.flatten() for p in model.parameters()])
    for impl in ("sdpa", "recompute"):
        torch.testing.assert_close(outs[impl], outs["math"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads[impl], grads["math"], atol=1e-4, rtol=1e-4)
    model.zero_grad()
    model.set_attention_impl("auto")
    model.set_grad_checkpointing(True)
    model(x).square().sum().backward()
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in model.parameters()]), grads["math"])


@pytest.mark.parametrize("pieces", [dict(qk_norm=True), ALL_PIECES], ids=["qk_norm", "all"])
def test_attention_paths_agree_with_the_pieces(pieces):
    model = tiny(**pieces).train()
    x = torch.randn(2, 3, 28, 28)
    assert_attention_paths_agree(model, x)
    weights = model.eval().forward_intermediates(x, return_attention=True)["attention"]
    assert weights[0].shape == (
        2,
        2,
        1 + 3 * ("num_registers" in pieces) + 16,
        1 + 3 * ("num_registers" in pieces) + 16,
    )


def test_folding_the_attention_scale_into_the_query_norm_is_exact():
    model = tiny(qk_norm=True, width=64, num_heads=4).eval()  # head_dim 16: the scale 1/4 is a power of two
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        before = model(x)
        assert fold_attention_scale(model) == 2
        assert model.blocks[0].attn.scale == 1.0
        torch.testing.assert_close(model(x), before, atol=0, rtol=0)


def test_release_models_build_with_their_pieces():
    with torch.device("meta"):
        reg = vitkit.create_model("vit_s14_reg4_dinov2")
        giant = vitkit.create_model("vit_g14_dinov2")
        clip = vitkit.create_model("vit_b16_clip_quickgelu")
        siglip = vitkit.create_model("vit_so400m14_siglip")
    assert reg.cfg.num_registers == 4 and reg.cfg.img_size == (518, 518) and reg.pos_embed.shape == (1, 1 + 37**2, 384)
    assert isinstance(giant.blocks[0].mlp, SwiGLU) and giant.blocks[0].mlp.fc1.out_features == 8192
    assert clip.norm_pre is not None and clip.patch_embed.proj.bias is None and clip.cfg.act == "quick_gelu"
    assert siglip.attn_pool is not None and siglip.cls_token is None and siglip.cfg.num_heads == 16


# ---------------------------------------------------------------------------------------------
# timm's state dicts (timm's own names), against timm's forward.

SMALL_TIMM = dict(img_size=28, patch_size=7, embed_dim=32, depth=2, num_heads=2)
TIMM_CASES = {
    "dinov2": ("vit_small_patch14_dinov2", {}, {}),
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", {}, {}),
    "dinov2_giant_swiglu": ("vit_giant_patch14_dinov2", dict(mlp_ratio=4.0), {}),
    "clip": ("vit_base_patch16_clip_224", dict(num_classes=6), {}),
    "clip_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(num_classes=6), dict(act="quick_gelu")),
    "siglip": ("vit_base_patch16_siglip_224", {}, {}),
    "qk_norm": ("vit_small_patch16_224", dict(qk_norm=True, num_classes=6), {}),
    "reg4_gap_fc_norm": ("vit_base_patch16_reg4_gap_256", dict(num_classes=6), {}),
    "class_token_avg_fc_norm": ("vit_small_patch16_224", dict(global_pool="avg", num_classes=6), {}),
}


def _timm():
    return pytest.importorskip("timm", reason="timm is not installed (it needs torchvision)", exc_type=ImportError)


def _save(sd: dict[str, torch.Tensor], path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


@pytest.mark.peers
@pytest.mark.parametrize("case", TIMM_CASES)
def test_timm_release_loads_exactly(case, tmp_path):
    timm = _timm()
    arch, kw, given = TIMM_CASES[case]
    torch.manual_seed(0)
    peer = timm.create_model(arch, pretrained=False, **{"num_classes": 0, **SMALL_TIMM, **kw}).eval()
    _randomise(peer)
    ours = vitkit.load_pretrained(_save(peer.state_dict(), tmp_path / "timm.safetensors"), num_heads=2, **given)
    assert ours.load_report.source == "timm"
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        tokens, ref_tokens = ours.forward_features(x), peer.forward_features(x)
        pooled = ours.forward_head(tokens, pre_logits=True)
        ref_pooled = peer.forward_head(ref_tokens, pre_logits=True)
        diffs = [(tokens - ref_tokens).abs().max(), (pooled - ref_pooled).abs().max()]
        if peer.num_classes:
            diffs.append((ours(x) - peer(x)).abs().max())
    assert max(diffs) < 1e-5, diffs
    assert not ours.load_report.assumed.keys() - {"act", "ln_eps", "classifier"}  # the heads were given


def test_timm_file_pieces_read_from_the_tensors(tmp_path):
    """Without timm: a timm-named file holding every piece reads back as the model it came from."""
    from vitkit.checkpoint import to_timm

    model = tiny(**{**ALL_PIECES, "act": "gelu"}, cls_pos_embed=False).eval()
    path = _save(to_timm(model.state_dict()), tmp_path / "model.safetensors")
    back = vitkit.load_pretrained(path, num_heads=2, ln_eps=1e-6)  # with a pre-norm timm's CLIP 1e-5 is assumed
    for field in ("num_registers", "pre_norm", "qk_norm", "mlp_type", "mlp_dim", "cls_pos_embed", "patch_bias"):
        assert getattr(back.cfg, field) == getattr(model.cfg, field), field
    assert back.cfg.layer_scale_init is not None
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)


def test_dinov2_own_file_names_and_register_positions(tmp_path, caplog):
    """DINOv2's own files (torch.hub): ``register_tokens``, the SwiGLU's ``w12``/``w3`` and the
    masked-image token; a file giving the registers position rows has them folded into the tokens."""
    model = tiny(num_registers=2, mlp_type="swiglu", layer_scale_init=1e-5, act="gelu").eval()
    sd = {k.replace("reg_token", "register_tokens").replace("mlp.fc1", "mlp.w12").replace("mlp.fc2", "mlp.w3"): v
          for k, v in model.state_dict().items()}  # fmt: skip
    sd["mask_token"] = torch.zeros(1, 32)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        back = vitkit.load_pretrained(_save(sd, tmp_path / "dinov2.safetensors"), num_heads=2)
    assert "classifier='token' (DINOv2's own file: DINOv2 reads the class token)" in caplog.text
    assert any("mask_token" in n for n in back.load_report.notes)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    # timm's layout without no_embed_class: rows for the class token, then the registers, then the grid
    reg_rows = torch.randn(1, 2, 32)
    sd = dict(model.state_dict())
    sd["pos_embed"] = torch.cat([sd["pos_embed"][:, :1], reg_rows, sd["pos_embed"][:, 1:]], dim=1)
    sd["reg_token"] = sd["reg_token"] - reg_rows
    back = vitkit.load_pretrained(_save(sd, tmp_path / "rows.safetensors"), num_heads=2)
    assert any("register" in n for n in back.load_report.notes)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x))


@pytest.mark.parametrize(
    "key,piece",
    [
        ("rope.periods", "RoPE"),
        ("blocks.0.attn.norm.weight", "scale_attn_norm"),
        ("local_cls_norm.weight", "local class-token norm"),
        ("blocks.0.attn.qkv.bias_mask", "masked qkv bias"),
    ],
)
def test_pieces_vitkit_does_not_have_are_refused_by_name(key, piece, tmp_path):
    from vitkit.checkpoint import to_timm

    sd = to_timm(tiny().state_dict())
    sd[key] = torch.zeros(4)
    with pytest.raises(vitkit.CheckpointError, match=rf"{piece}.*{re.escape(key)}"):
        vitkit.load_pretrained(_save(sd, tmp_path / "m.safetensors"), num_heads=2)


def test_timm_class_token_with_fc_norm_pools_the_mean_of_the_patches(tmp_path):
    """A class token and fc_norm: timm builds these for global_pool='avg', the mean of the patch
    tokens with the class token kept in the sequence, then the norm; assumed aloud."""
    from vitkit.checkpoint import to_timm

    model = tiny(num_classes=0, act="gelu").eval()
    sd = to_timm(model.state_dict())
    sd["fc_norm.weight"], sd["fc_norm.bias"] = sd.pop("norm.weight"), sd.pop("norm.bias")
    back = vitkit.load_pretrained(_save(sd, tmp_path / "m.safetensors"), num_heads=2)
    assert back.cfg.classifier == "gap" and back.cfg.has_class_token and back.cfg.fc_norm
    assert back.load_report.assumed["classifier"] == "gap"
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        last = model.forward_intermediates(x, indices=[-1])["tokens"][0]  # (B, 1 + N, D): z_L, not normed
        norm = model.norm
        expected = torch.nn.functional.layer_norm(last[:, 1:].mean(dim=1), (32,), norm.weight, norm.bias, norm.eps)
        torch.testing.assert_close(back(x), expected)


# ---------------------------------------------------------------------------------------------
# Hugging Face models, saved as transformers saves them, against transformers' forward.

SMALL_HF = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]


def _hf():
    return pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")


def _hf_model(case: str):
    """(model, its image processor, the image side) for one family, small and random."""
    t = _hf()
    if case.startswith("dinov2"):
        extra = dict(use_swiglu_ffn=True) if case == "dinov2_swiglu" else {}
        if case == "dinov2_registers":
            model = t.Dinov2WithRegistersModel(
                t.Dinov2WithRegistersConfig(**SMALL_HF, image_size=28, patch_size=7, num_register_tokens=4)
            )
        else:
            model = t.Dinov2Model(t.Dinov2Config(**SMALL_HF, image_size=28, patch_size=7, **extra))
        proc = t.BitImageProcessorPil(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, **IMAGENET)
    elif case.startswith("clip"):
        vision = dict(**SMALL_HF, image_size=28, patch_size=7, projection_dim=12)
        if case == "clip_with_projection":
            text = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
            model = t.CLIPModel(t.CLIPConfig(vision_config=vision, text_config=text, projection_dim=12))
        else:
            model = t.CLIPVisionModel(t.CLIPVisionConfig(**vision))
        proc = t.CLIPImageProcessorPil()
    else:
        model = t.SiglipVisionModel(t.SiglipVisionConfig(**SMALL_HF, image_size=28, patch_size=7))
        proc = t.SiglipImageProcessorPil()
    return model.eval(), proc


HF_CASES = ["dinov2", "dinov2_swiglu", "dinov2_registers", "clip", "clip_with_projection", "siglip"]


@pytest.mark.peers
@pytest.mark.parametrize("case", HF_CASES)
def test_hf_release_loads_exactly(case, tmp_path):
    peer, proc = _hf_model(case)
    _randomise(peer)
    peer.save_pretrained(tmp_path / "hf")
    proc.save_pretrained(tmp_path / "hf")
    ours = vitkit.load_pretrained(tmp_path / "hf")
    assert ours.load_report.source == "hf" and not ours.load_report.assumed
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        out = peer.vision_model(pixel_values=x) if case == "clip_with_projection" else peer(pixel_values=x)
        tokens = ours.forward_features(x)
        pooled = ours.forward_head(tokens, pre_logits=True)
        diffs = {"pooler_output": (pooled - out.pooler_output).abs().max()}
        if case.startswith("clip"):  # CLIP's last_hidden_state is before its final norm
            last = ours.forward_intermediates(x, indices=[-1])["tokens"][0]
            diffs["last_hidden_state"] = (last - out.last_hidden_state).abs().max()
        else:
            diffs["last_hidden_state"] = (tokens - out.last_hidden_state).abs().max()
        if case == "clip_with_projection":
            diffs["image_embeds"] = (ours(x) - peer.get_image_features(pixel_values=x).pooler_output).abs().max()
    assert max(diffs.values()) < 1e-5, diffs
    pre = ours.preprocessing
    if case.startswith("dinov2"):  # shorter side to 256, the central 224
        assert pre.mean == (0.485, 0.456, 0.406) and pre.crop_pct == 224 / 256 and pre.interpolation == "bicubic"
    elif case.startswith("clip"):
        assert list(pre.mean) == CLIP_MEAN and pre.crop_pct == 1.0
    else:
        assert pre.mean == (0.5, 0.5, 0.5) and pre.std == (0.5, 0.5, 0.5)


@pytest.mark.peers
@pytest.mark.parametrize("case", ["dinov2_swiglu", "dinov2_registers", "clip", "siglip"])
def test_hf_module_names_load_without_config(case, tmp_path):
    """transformers >= 5 names its modules otherwise than its files (Dinov2's q_proj, gate_proj...):
    a state dict of the module names loads too, given the heads; the family's defaults are assumed."""
    peer, _ = _hf_model(case)
    _randomise(peer)
    ours = vitkit.load_pretrained(_save(peer.state_dict(), tmp_path / "raw.safetensors"), num_heads=2)
    assert set(ours.load_report.assumed) == {"act", "ln_eps"}
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        ref = peer(pixel_values=x).pooler_output
        assert (ours.forward_head(ours.forward_features(x), pre_logits=True) - ref).abs().max() < 1e-5


def test_hf_model_types_vitkit_does_not_read_are_refused(tmp_path):
    import json

    folder = tmp_path / "eva"
    folder.mkdir()
    sd = {"embeddings.patch_embeddings.weight": torch.zeros(32, 3, 16, 16), "rope.freqs": torch.zeros(8)}
    _save(sd, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "eva02"}))
    with pytest.raises(vitkit.CheckpointError, match=r"eva02.*rotary"):
        vitkit.load_pretrained(folder)


# ---------------------------------------------------------------------------------------------
# Names of the released weights, through the hub's cache (offline: nothing is downloaded).


def _hub_repo(root, repo: str, files: dict[str, bytes]) -> None:
    """The layout huggingface_hub keeps: refs/main names a revision, whose snapshot links to
    blobs named by their sha256."""
    import hashlib

    folder = root / "hub" / f"models--{repo.replace('/', '--')}"
    rev = hashlib.sha1(repo.encode()).hexdigest()
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(rev)
    snap = folder / "snapshots" / rev
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir()
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/{blob.name}")


def test_release_names_are_listed_with_their_sources():
    from vitkit.hub.names import find, list_pretrained, rows

    for repo, name in [
        ("facebook/dinov2-small", "vit_s14_dinov2.lvd142m"),
        ("facebook/dinov2-with-registers-giant", "vit_g14_reg4_dinov2.lvd142m"),
        ("timm/vit_small_patch14_dinov2.lvd142m", "vit_s14_dinov2.lvd142m_timm"),
        ("hf-hub:openai/clip-vit-large-patch14", "vit_l14_clip_quickgelu.openai"),
        ("google/siglip-so400m-patch14-224", "vit_so400m14_siglip.webli"),
        ("timm/vit_large_patch14_clip_224.laion2b", "vit_l14_clip.laion2b"),
        ("hf-hub:timm/vit_base_patch16_clip_224.dfn2b", "vit_b16_clip.dfn2b"),
    ]:
        assert find(repo).name == name
    for entry in list_pretrained():
        if entry.model is not None:
            vitkit.model_config(entry.model)  # every entry names a model vitkit builds
    clip = next(r for r in rows(list_pretrained("vit_b16_clip_quickgelu")) if r["name"].endswith(".openai"))
    assert clip["licence"] == "MIT" and clip["preprocessing"]["mean"] == list(CLIP_MEAN)
    openclip = {e.name: e for e in list_pretrained("vit_l14_clip")}  # OpenCLIP's towers: the exact GELU
    assert openclip["vit_l14_clip.laion2b"].preprocessing.mean == (0.5, 0.5, 0.5)  # as OpenCLIP trained it
    assert openclip["vit_l14_clip.datacompxl"].preprocessing.mean == tuple(CLIP_MEAN)


def test_a_dinov2_name_loads_from_the_hub_cache(tmp_path, monkeypatch):
    """``facebook/dinov2-small``'s files (a Dinov2Model of the real width and depth, random, with a
    small position table) found by name in the hub's cache: the model the name says, its heads and
    preprocessing from the repository."""
    import json

    t = _hf()
    torch.manual_seed(0)
    cfg = t.Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, image_size=28, patch_size=14)
    peer = t.Dinov2Model(cfg).eval()
    _randomise(peer)
    peer.save_pretrained(tmp_path / "repo")
    proc = {**IMAGENET, "size": {"shortest_edge": 256}, "crop_size": {"height": 224, "width": 224}, "resample": 3}
    files = {n: (tmp_path / "repo" / n).read_bytes() for n in ("config.json", "model.safetensors")}
    files["preprocessor_config.json"] = json.dumps({**proc, "do_center_crop": True}).encode()
    _hub_repo(tmp_path / "cache", "facebook/dinov2-small", files)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = vitkit.load_pretrained("vit_s14_dinov2.lvd142m")
    assert model.load_report.name == "vit_s14_dinov2.lvd142m" and model.cfg.num_heads == 6
    assert model.preprocessing.crop_pct == 224 / 256 and model.preprocessing.mean == (0.485, 0.456, 0.406)
    x = torch.randn(1, 3, 28, 28)
    with torch.no_grad():
        assert (model.forward_features(x) - peer(pixel_values=x).last_hidden_state).abs().max() < 1e-5


def test_a_timm_folder_names_its_release(tmp_path):
    """A timm hub folder's config.json names the architecture (the vitkit model, so its heads and
    activation are not assumed) and its pretrained_cfg (the preprocessing)."""
    import json

    from vitkit.checkpoint import to_timm

    torch.manual_seed(0)
    model = vitkit.create_model("vit_s14_reg4_dinov2", img_size=28, cls_pos_embed=False).eval()  # timm's layout
    _randomise(model)
    folder = tmp_path / "timm"
    folder.mkdir()
    _save(to_timm(model.state_dict()), folder / "model.safetensors")
    pretrained = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "input_size": [3, 518, 518]}
    config = {"architecture": "vit_small_patch14_reg4_dinov2", "pretrained_cfg": {**pretrained, "crop_pct": 1.0}}
    (folder / "config.json").write_text(json.dumps(config))
    back = vitkit.load_pretrained(folder / "model.safetensors")
    assert back.load_report.assumed == {"classifier": "token"}  # timm's default global_pool for this model
    assert back.cfg.num_heads == 6 and back.cfg.num_registers == 4
    assert back.preprocessing.mean == (0.485, 0.456, 0.406) and back.preprocessing.interpolation == "bicubic"
    x = torch.randn(1, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    config["architecture"] = "vit_base_patch14_reg4_dinov2"  # another size: the tensors disagree
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match="width 384 in the file vs 768 for vit_b14_reg4_dinov2"):
        vitkit.load_pretrained(folder / "model.safetensors")


@pytest.mark.peers
@pytest.mark.parametrize("name", [n for n in vitkit.list_models() if n.endswith(("dinov2", "clip", "siglip"))])
def test_release_parameter_counts_equal_timm(name):
    """Each release's size, built on the meta device, against timm's model of it: timm's DINOv2 with
    registers has no position row for the class token (its value is folded into the token)."""
    from vitkit.checkpoint.peers import timm_model_name
    from vitkit.models import count_params

    timm = _timm()
    arch = next(a for a in timm.list_models("vit_*") if timm_model_name(a) == name)
    with torch.device("meta"):
        ours = vitkit.create_model(name)
        peer = timm.create_model(arch, pretrained=False, num_classes=ours.cfg.num_classes)
    folded = ours.cfg.width if ours.cfg.num_registers else 0
    assert count_params(ours) - folded == count_params(peer)


def test_exports_refuse_what_the_peer_cannot_hold():
    from vitkit.checkpoint import to_hf, to_timm
    from vitkit.checkpoint.peers import check_timm

    dinov2 = tiny(num_registers=2, layer_scale_init=1e-5)
    with pytest.raises(vitkit.CheckpointError, match="layer_scale_init, num_registers"):
        to_hf(dinov2.state_dict(), dinov2.cfg)
    with pytest.raises(vitkit.CheckpointError, match="register tokens a position row"):
        check_timm(dinov2.cfg)
    to_timm(tiny(num_registers=2, cls_pos_embed=False).state_dict(), tiny(num_registers=2, cls_pos_embed=False).cfg)


@pytest.mark.parametrize(
    "options",
    [
        dict(num_registers=4, layer_scale_init=1e-5, classifier="token"),  # DINOv2 with registers
        dict(pre_norm=True, act="quick_gelu", classifier="token"),  # a CLIP image tower
    ],
    ids=["dinov2-registers", "clip"],
)
def test_the_paper_analyses_run_on_todays_backbones(options, tmp_path):
    """Rollout, attention distance, position-embedding similarity and filters on a DINOv2 model
    with registers (the registers are prefix tokens: neither a place in the maps nor in the
    distances) and on a CLIP tower, with the figures drawn."""
    from vitkit.analysis import analyze
    from vitkit.preprocessing import LoadedImages

    pytest.importorskip("matplotlib")
    model = tiny(**options).eval()
    x = torch.randn(3, 3, 28, 28)
    pixels = (x.permute(0, 2, 3, 1).clamp(-1, 1) * 127.5 + 127.5).to(torch.uint8).numpy()
    rep = analyze(model, LoadedImages(["a", "b", "c"], pixels, x))
    assert rep.rollout.shape == (3, 4, 4) and rep.head_maps.shape == (3, 2, 2, 4, 4)
    assert rep.distances.shape == (2, 2) and torch.isfinite(rep.distances).all()
    assert rep.pos_similarity is not None and rep.pos_similarity.shape == (4, 4, 4, 4)
    assert rep.pos_summary["neighbours"] is not None and rep.query == "class token"
    rep.write(tmp_path)
    written = {p.suffix for p in tmp_path.rglob("*")}
    assert {".png", ".json"} <= written
