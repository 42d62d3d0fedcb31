"""2-D rotary position embeddings (``pos_embed="rope_dinov3"`` and ``"rope_axial"``) and DINOv3's
weights from timm's state dicts and Hugging Face folders, with the peers' own models as the
reference where they are installed (random weights: nothing is downloaded)."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

import vitkit
from vitkit.models.posembed import rope_angles, rope_table, rotate_patches

TINY = dict(img_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)
DINOV3 = dict(pos_embed="rope_dinov3", num_registers=4, layer_scale_init=1e-5, ln_eps=1e-5, act="gelu")


def tiny(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    model = vitkit.create_model("vit_s16", **{**TINY, **DINOV3, **kw})
    _randomise(model)
    return model


def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Random values for every parameter (zero-initialised heads and tokens included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.ndim == 1 and p.shape[0] % 2 == 0 else 0.0))


def _save(sd: dict[str, torch.Tensor], path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


# ---------------------------------------------------------------------------------------------
# The rotary tables and what they compute.


def test_rope_angles_place_the_patches_as_each_kind_says():
    dinov3 = rope_angles((2, 4), 8, theta=100.0, kind="rope_dinov3")  # (8 patches, 4): row pairs, then column pairs
    assert dinov3.shape == (8, 4)
    centres_rows, centres_cols = torch.tensor([-0.5, 0.5]), torch.tensor([-0.75, -0.25, 0.25, 0.75])
    periods = 100.0 ** torch.tensor([0.0, 0.5], dtype=torch.float64)  # theta ** (4k / head_dim)
    expected_rows = 2 * math.pi * centres_rows.double()[:, None] / periods  # (2, 2)
    expected_cols = 2 * math.pi * centres_cols.double()[:, None] / periods  # (4, 2)
    torch.testing.assert_close(dinov3.reshape(2, 4, 4)[:, 0, :2], expected_rows)
    torch.testing.assert_close(dinov3.reshape(2, 4, 4)[0, :, 2:], expected_cols)
    axial = rope_angles((2, 4), 8, theta=100.0, kind="rope_axial").reshape(2, 4, 4)
    torch.testing.assert_close(axial[1, 3], torch.tensor([1.0, 0.1, 3.0, 0.3], dtype=torch.float64))
    with pytest.raises(ValueError, match="divisible by 4"):
        rope_angles((2, 2), 6)


@pytest.mark.parametrize("kind", ["rope_axial", "rope_dinov3"])
def test_rotated_logits_depend_on_the_offset_only_and_prefix_tokens_stay(kind):
    """q . k after rotation is the same for every pair of patches at the same offset (RoPE's point);
    the prefix tokens are left as they were and every vector keeps its length."""
    table = rope_table((3, 3), 8, kind=kind)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    prefix = torch.randn(1, 1, 2, 8)
    qs = rotate_patches(torch.cat([prefix, q.float().expand(1, 1, 9, 8)], dim=2), table)
    ks = rotate_patches(k.float().expand(1, 1, 9, 8), table)
    torch.testing.assert_close(qs[..., :2, :], prefix, atol=0, rtol=0)
    torch.testing.assert_close(qs[0, 0, 2:].norm(dim=-1), q.float().norm().expand(9))
    logits = qs[0, 0, 2:] @ ks[0, 0].T  # (9, 9)
    # (0, 0)-(1, 1) and (1, 1)-(2, 2): the same offset; on the centred grid too (equal spacing)
    torch.testing.assert_close(logits[0, 4], logits[4, 8], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[1, 2], logits[4, 5], atol=1e-5, rtol=0)


def test_rope_config_is_checked_and_written_only_when_used():
    cfg = vitkit.model_config("vit_s16", **TINY, pos_embed="rope_axial", rope_theta=1000.0)
    assert cfg.to_dict()["rope_theta"] == 1000.0 and type(cfg).from_dict(cfg.to_dict()) == cfg
    assert "rope_theta" not in vitkit.model_config("vit_s16").to_dict()
    with pytest.raises(ValueError, match="head width divisible by 4"):
        vitkit.model_config("vit_s16", **{**TINY, "width": 36, "num_heads": 6}, pos_embed="rope_dinov3")
    with pytest.raises(ValueError, match="rope_theta"):
        vitkit.model_config("vit_s16", rope_theta=float("inf"))


# ---------------------------------------------------------------------------------------------
# The model: any input size, every attention path, the serving and export paths.


@pytest.mark.parametrize("kind", ["rope_axial", "rope_dinov3"])
def test_rope_model_takes_any_size_and_set_img_size_agrees(kind):
    model = tiny(pos_embed=kind).eval()
    assert model.pos_embed is None and "rope" not in model.state_dict()  # computed, not stored
    x = torch.randn(2, 3, 48, 40)
    with torch.no_grad():
        other_size = model.forward_features(x)  # no dynamic_img_size needed: nothing is sized
        model.set_img_size((48, 40))
        assert model.rope.shape == (2, 6 * 5, 16)
        torch.testing.assert_close(model.forward_features(x), other_size, atol=0, rtol=0)
        inter = model.forward_intermediates(x, indices=[-1], return_attention=True, output_fmt="NCHW")
    assert inter["tokens"][0].shape == (2, 32, 6, 5) and inter["attention"][0].shape == (2, 2, 35, 35)
    with pytest.raises(ValueError, match="patch dropout"):
        model.set_patch_drop(0.5)


@pytest.mark.parametrize("kind", ["rope_axial", "rope_dinov3"])
def test_rope_in_every_attention_path_and_the_recompute_path(kind):
    model = tiny(pos_embed=kind, mlp_type="swiglu").train()
    from test_foundation import assert_attention_paths_agree

    assert_attention_paths_agree(model, torch.randn(2, 3, 32, 32))


def test_rope_model_serves_saves_and_analyses(tmp_path):
    from vitkit.inference import fold_attention_scale, prepare_inference

    model = tiny(width=64, num_heads=4).eval()  # head_dim 16: the folded scale 1/4 is exact
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        served = prepare_inference(model, "fp32")
        torch.testing.assert_close(served(x), ref, atol=1e-5, rtol=1e-5)
        folded = prepare_inference(model, "fp32", pack=False, copy_model=True)
        assert fold_attention_scale(folded) == 2
        torch.testing.assert_close(folded(x), ref, atol=1e-6, rtol=1e-6)
    vitkit.save_checkpoint(model, tmp_path / "m.safetensors")
    back = vitkit.load_pretrained(tmp_path / "m.safetensors")
    assert back.cfg == model.cfg and back.load_report.source == "vitkit"
    with torch.no_grad():
        torch.testing.assert_close(back(x), ref, atol=0, rtol=0)
    from vitkit.analysis import analyze
    from vitkit.preprocessing import LoadedImages

    pixels = (x.permute(0, 2, 3, 1).clamp(-1, 1) * 127.5 + 127.5).to(torch.uint8).numpy()
    rep = analyze(model, LoadedImages(["a", "b"], pixels, x))
    assert rep.pos_similarity is None and "absolute" in rep.pos_summary["skipped"]
    assert rep.rollout.shape == (2, 4, 4)


def test_rope_model_exports_load_back_or_are_refused(tmp_path):
    from vitkit.checkpoint import to_hf
    from vitkit.export import export_program, export_weights

    model = tiny().eval()
    result = export_program(model, tmp_path / "m.pt2")
    assert result["max_abs_diff"] <= 1e-5 and result["dynamic_batch"]
    program = torch.export.load(tmp_path / "m.pt2").module()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), atol=1e-5, rtol=0)
    for to, dst, match in [("timm", "t.safetensors", "rope_dinov3"), ("official", "o.npz", "rope_dinov3")]:
        with pytest.raises(vitkit.CheckpointError, match=match):
            export_weights(model, tmp_path / dst, to)
        assert not (tmp_path / dst).exists()
    with pytest.raises(vitkit.CheckpointError, match="rope_dinov3"):
        to_hf(model.state_dict(), model.cfg)


def test_rope_model_exports_to_onnx(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from vitkit.export import export_onnx

    result = export_onnx(tiny().eval(), tmp_path / "m.onnx")
    assert result["exporter"] == "dynamo" and result["max_abs_diff"] < 1e-5


def test_dinov3_release_models_build():
    with torch.device("meta"):
        small, hplus = vitkit.create_model("vit_s16_dinov3"), vitkit.create_model("vit_hplus16_dinov3")
    assert small.cfg.pos_embed == "rope_dinov3" and small.cfg.num_registers == 4 and small.pos_embed is None
    assert small.cfg.ln_eps == 1e-5 and small.cfg.classifier == "token" and small.cfg.num_classes == 0
    assert hplus.cfg.mlp_type == "swiglu" and hplus.blocks[0].mlp.fc1.out_features == 2 * 5120
    assert hplus.cfg.num_heads == 20 and hplus.rope.shape == (2, 14 * 14, 64)


# ---------------------------------------------------------------------------------------------
# timm's DINOv3 (its Eva layout), against timm's forward.

SMALL_TIMM = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, global_pool="token")
TIMM_ARCHS = [
    "vit_small_patch16_dinov3",  # no qkv bias
    "vit_small_patch16_dinov3_qkvb",  # q and v biases
    "vit_small_plus_patch16_dinov3",  # unpacked SwiGLU
    "vit_huge_plus_patch16_dinov3_qkvb",
]


def _timm():
    return pytest.importorskip("timm", reason="timm is not installed (it needs torchvision)", exc_type=ImportError)


@pytest.mark.peers
@pytest.mark.parametrize("arch", TIMM_ARCHS)
def test_timm_dinov3_loads_exactly(arch, tmp_path):
    timm = _timm()
    torch.manual_seed(0)
    peer = timm.create_model(arch, pretrained=False, num_classes=0, **SMALL_TIMM).eval()
    _randomise(peer)
    path = _save(peer.state_dict(), tmp_path / "timm.safetensors")
    ours = vitkit.load_pretrained(path, num_heads=2, classifier="token")  # as the peer was built
    assert ours.cfg.pos_embed == "rope_dinov3" and ours.cfg.num_registers == 4 and ours.cfg.ln_eps == 1e-5
    assert set(ours.load_report.assumed) == {"act", "ln_eps", "pos_embed", "rope_theta"}
    for size in ((32, 32), (48, 40)):  # the size built for, and another (timm's dynamic_img_size)
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            tokens, ref_tokens = ours.forward_features(x), peer.forward_features(x)
            pooled = ours.forward_head(tokens, pre_logits=True)
            ref_pooled = peer.forward_head(ref_tokens, pre_logits=True)
        diffs = [(tokens - ref_tokens).abs().max(), (pooled - ref_pooled).abs().max()]
        assert max(diffs) < 1e-5, (size, diffs)


@pytest.mark.peers
@pytest.mark.parametrize("arch", TIMM_ARCHS[:3])
def test_timm_dinov3_pooled_output_and_logits_equal_timms(arch, tmp_path):
    """timm's DINOv3 models as timm builds them (global_pool='avg': the mean of the normed patch
    tokens, the class and storage tokens left out; no fc_norm), with a head: vitkit's pooled output
    and logits are timm's ``forward_head(..., pre_logits=True)`` and its logits."""
    timm = _timm()
    torch.manual_seed(0)
    small = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    peer = timm.create_model(arch, pretrained=False, **small).eval()
    assert peer.global_pool == "avg" and isinstance(peer.fc_norm, torch.nn.Identity)
    _randomise(peer)
    ours = vitkit.load_pretrained(_save(peer.state_dict(), tmp_path / "timm.safetensors"), num_heads=2)
    assert ours.cfg.classifier == "gap" and ours.load_report.assumed["classifier"] == "gap"
    for size in ((32, 32), (48, 40)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            pooled = ours.forward_head(ours.forward_features(x), pre_logits=True)
            ref_pooled = peer.forward_head(peer.forward_features(x), pre_logits=True)
            diffs = [(pooled - ref_pooled).abs().max(), (ours(x) - peer(x)).abs().max()]
        assert max(diffs) < 1e-5, (size, diffs)


@pytest.mark.peers
def test_timm_dinov3_folder_names_its_release(tmp_path):
    """A timm hub folder: the architecture names the vitkit model, global_pool the pooling (nothing
    assumed; without it, timm's default for the model is, aloud) and the pretrained_cfg gives the
    preprocessing and the size."""
    timm = _timm()
    torch.manual_seed(0)
    peer = timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_classes=0, img_size=32)
    _randomise(peer.eval())
    folder = tmp_path / "timm"
    folder.mkdir()
    _save(peer.state_dict(), folder / "model.safetensors")
    pretrained = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "input_size": [3, 256, 256]}
    config = {"architecture": "vit_small_patch16_dinov3", "pretrained_cfg": {**pretrained, "crop_pct": 1.0}}
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        tokens = peer.forward_features(x)
        pooled = {"avg": peer.forward_head(tokens, pre_logits=True), "token": tokens[:, 0], None: None}
    pooled[None] = pooled["avg"]  # timm's default for its DINOv3 models
    for global_pool, ref in pooled.items():
        said = {} if global_pool is None else {"global_pool": global_pool}
        (folder / "config.json").write_text(json.dumps({**config, **said}))
        ours = vitkit.load_pretrained(folder / "model.safetensors")
        assumed = {"classifier": "gap"} if global_pool is None else {}
        assert ours.load_report.assumed == assumed and ours.cfg.num_heads == 6 and ours.cfg.img_size == (256, 256)
        assert ours.preprocessing.img_size == (256, 256) and ours.preprocessing.interpolation == "bicubic"
        with torch.no_grad():
            assert (ours.forward_head(ours.forward_features(x), pre_logits=True) - ref).abs().max() < 1e-5
    (folder / "config.json").write_text(json.dumps({**config, "global_pool": "max"}))
    with pytest.raises(vitkit.CheckpointError, match="global_pool='max'"):
        vitkit.load_pretrained(folder / "model.safetensors")


@pytest.mark.peers
@pytest.mark.parametrize("name", [n for n in vitkit.list_models() if n.endswith("dinov3")])
def test_dinov3_parameter_counts_equal_timm(name):
    """Each release's size, on the meta device, against timm's model of it (its ``_qkvb`` variant
    where there is one): vitkit's qkv bias holds the key's zeros too (timm keeps them in a buffer),
    and all three where timm's model has none."""
    from vitkit.checkpoint.peers import timm_model_name
    from vitkit.models import count_params

    timm = _timm()
    archs = sorted(a for a in timm.list_models("vit_*dinov3*") if timm_model_name(a) == name)
    arch = next((a for a in archs if a.endswith("_qkvb")), archs[0])
    with torch.device("meta"):
        ours = vitkit.create_model(name)
        peer = timm.create_model(arch, pretrained=False, num_classes=0)
    biases = 1 if arch.endswith("_qkvb") else 3
    assert count_params(ours) - biases * ours.cfg.depth * ours.cfg.width == count_params(peer)


def _eva_file(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model`` (a DINOv3-like vitkit model of width 32, SwiGLU or not) in timm's Eva names: gamma_1,
    q_bias and v_bias (its key bias set to zero, as DINOv3's is), an unpacked SwiGLU."""
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.bias[32:64] = 0  # DINOv3's key bias is zero
    sd = {}
    swiglu = model.cfg.mlp_type == "swiglu"
    for k, v in model.state_dict().items():
        k = k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2")
        if k.endswith("attn.qkv.bias"):
            sd[k.replace("qkv.bias", "q_bias")], sd[k.replace("qkv.bias", "v_bias")] = v[:32], v[64:]
        elif swiglu and ".mlp.fc1." in k:
            sd[k.replace("fc1", "fc1_g")], sd[k.replace("fc1", "fc1_x")] = v[:64], v[64:]
        else:
            sd[k] = v
    return sd


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "vitkit"]


def test_timm_dinov3_files_pool_as_timm_does_and_say_so(tmp_path, caplog):
    """A file in timm's Eva layout (its DINOv3 models) pools as timm builds those models: the mean of
    the normed patch tokens, the class and storage tokens left out; the warning names the pooling
    and its grounds, and ``classifier="token"`` reads the class token instead (nothing assumed)."""
    model = tiny().eval()  # a head of 5 classes
    path = _save(_eva_file(model), tmp_path / "eva.safetensors")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        ours = vitkit.load_pretrained(path, num_heads=2)
    assert ours.cfg.classifier == "gap" and ours.cfg.has_class_token and ours.cls_token is not None
    assert ours.load_report.assumed["classifier"] == "gap"
    (line,) = _warnings(caplog)
    grounds = "timm's Eva layout, its DINOv3 models: timm pools the mean of the patch tokens, global_pool='avg'"
    assert f"classifier='gap' ({grounds})" in line, line
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        tokens = model.forward_features(x)  # (B, 1 + 4 + N, D)
        mean = tokens[:, 5:].mean(dim=1)  # the patch tokens alone
        torch.testing.assert_close(ours.forward_head(ours.forward_features(x), pre_logits=True), mean)
        torch.testing.assert_close(ours(x), model.head(mean))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        token = vitkit.load_pretrained(path, num_heads=2, classifier="token")
    assert "classifier" not in token.load_report.assumed and "classifier" not in _warnings(caplog)[0]
    with torch.no_grad():
        torch.testing.assert_close(token(x), model(x), atol=0, rtol=0)


def test_metas_dinov3_files_read_the_class_token_and_say_so(tmp_path, caplog):
    """Meta's own DINOv3 files pool as Meta's DINOv3 (and transformers' pooler_output) do: the
    class token; the warning names that too."""
    model = tiny(mlp_type="swiglu", num_classes=0).eval()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.bias[32:64] = 0  # DINOv3's key bias is zero
    path = _save(_meta_file(model, key_bias=torch.zeros(32)), tmp_path / "meta.safetensors")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        ours = vitkit.load_pretrained(path, num_heads=2)
    assert ours.cfg.classifier == "token" and ours.load_report.assumed["classifier"] == "token"
    assert "rope_theta" not in ours.load_report.assumed  # the file's periods say it
    (line,) = _warnings(caplog)
    assert "classifier='token' (Meta's DINOv3 reads the class token, as transformers' pooler_output" in line, line
    mean = vitkit.load_pretrained(path, num_heads=2, classifier="gap")  # the class token stays, unpooled
    assert mean.cfg.has_class_token and "classifier" not in mean.load_report.assumed
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(mean(x), model.forward_features(x)[:, 5:].mean(dim=1))


def test_convert_records_the_pooling_given(tmp_path, caplog):
    """``vitkit convert --classifier``: a vitkit file that records the pooling (nothing assumed)."""
    from vitkit.cli import main

    model = tiny(num_classes=0).eval()
    src, dst = _save(_eva_file(model), tmp_path / "eva.safetensors"), tmp_path / "out.safetensors"
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["convert", str(src), str(dst), "--num-heads", "2"]) == 0
    assert "--classifier ..." in _warnings(caplog)[0]
    assert main(["convert", str(src), str(dst), "--num-heads", "2", "--classifier", "token"]) == 0
    back = vitkit.load_pretrained(dst)
    assert back.cfg.classifier == "token" and not back.load_report.assumed
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)


def test_timm_eva_names_pack_into_vitkits_layers(tmp_path):
    """Without timm: a DINOv3 model written with timm's Eva names (gamma_1, q_bias and v_bias, an
    unpacked SwiGLU) reads back as the same model; Eva files in other layouts are refused."""
    model = tiny(mlp_type="swiglu", num_classes=0).eval()
    sd = _eva_file(model)
    back = vitkit.load_pretrained(_save(sd, tmp_path / "eva.safetensors"), num_heads=2, classifier="token")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    sd["pos_embed"] = torch.zeros(1, 17, 32)  # EVA-02 and RoPE-ViT keep a position table: not DINOv3
    with pytest.raises(vitkit.CheckpointError, match="Eva layout"):
        vitkit.load_pretrained(_save(sd, tmp_path / "eva02.safetensors"), num_heads=2)


@pytest.mark.parametrize(
    "key,piece",
    [
        ("blocks.0.attn.qkv.bias_mask", "masked qkv bias without DINOv3's storage tokens"),
        ("rope_embed.freqs", "rotary position embeddings other than"),
        ("blocks.0.attn.gate.weight", "gated attention"),
    ],
)
def test_pieces_vitkit_does_not_have_are_refused_by_name(key, piece, tmp_path):
    from vitkit.checkpoint.peers import to_timm

    sd = to_timm(tiny(pos_embed="learned").state_dict())
    sd[key] = torch.zeros(4)
    with pytest.raises(vitkit.CheckpointError, match=piece):
        vitkit.load_pretrained(_save(sd, tmp_path / "m.safetensors"), num_heads=2)


# ---------------------------------------------------------------------------------------------
# Hugging Face's DINOv3ViTModel, saved as transformers saves it.

SMALL_HF = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
HF_CASES = {
    "registers": dict(num_register_tokens=4),
    "gated": dict(num_register_tokens=4, use_gated_mlp=True, hidden_act="silu"),
    "key_bias_no_registers": dict(key_bias=True),
    "no_biases": dict(query_bias=False, value_bias=False, proj_bias=False, mlp_bias=False, rope_theta=50.0),
}


def _hf():
    return pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")


def _hf_dinov3(case: str) -> torch.nn.Module:
    t = _hf()
    torch.manual_seed(0)
    cfg = t.DINOv3ViTConfig(**SMALL_HF, image_size=32, patch_size=8, **HF_CASES[case])
    model = t.DINOv3ViTModel(cfg).eval()
    _randomise(model)
    return model


@pytest.mark.peers
@pytest.mark.parametrize("case", HF_CASES)
def test_hf_dinov3_loads_exactly(case, tmp_path):
    peer = _hf_dinov3(case)
    peer.save_pretrained(tmp_path / "hf")
    processor = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 2}
    processor |= {"size": {"height": 224, "width": 224}, "do_resize": True, "do_normalize": True}
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(processor))
    ours = vitkit.load_pretrained(tmp_path / "hf")
    assert ours.load_report.source == "hf" and not ours.load_report.assumed
    assert ours.cfg.pos_embed == "rope_dinov3" and ours.cfg.rope_theta == peer.config.rope_theta
    assert ours.preprocessing.crop_mode == "squash" and ours.preprocessing.interpolation == "bilinear"
    for size in ((32, 32), (48, 40)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            out = peer(pixel_values=x)
            tokens = ours.forward_features(x)
            pooled = ours.forward_head(tokens, pre_logits=True)
        diffs = [(tokens - out.last_hidden_state).abs().max(), (pooled - out.pooler_output).abs().max()]
        assert max(diffs) < 1e-5, (size, diffs)


@pytest.mark.peers
def test_hf_dinov3_module_names_load_without_config(tmp_path):
    """transformers' module names (``model.layer.{i}``, not its files' ``layer.{i}``), given the heads:
    DINOv3's defaults are assumed aloud."""
    peer = _hf_dinov3("gated")
    ours = vitkit.load_pretrained(_save(peer.state_dict(), tmp_path / "raw.safetensors"), num_heads=2)
    assert set(ours.load_report.assumed) == {"act", "ln_eps", "rope_theta"} and ours.cfg.ln_eps == 1e-5
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = peer(pixel_values=x).pooler_output
        assert (ours.forward_head(ours.forward_features(x), pre_logits=True) - ref).abs().max() < 1e-5


def test_hf_dinov3_gated_mlp_of_another_activation_is_refused(tmp_path):
    model = tiny(mlp_type="swiglu", num_classes=0)
    folder = tmp_path / "hf"
    folder.mkdir()
    sd = {"embeddings.patch_embeddings.weight": model.patch_embed.proj.weight.detach()}
    sd["embeddings.patch_embeddings.bias"] = model.patch_embed.proj.bias.detach()
    sd["embeddings.cls_token"] = torch.zeros(1, 1, 32)
    for i in range(2):
        p = f"layer.{i}."
        for n in ("norm1", "norm2"):
            sd[f"{p}{n}.weight"], sd[f"{p}{n}.bias"] = torch.ones(32), torch.zeros(32)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[f"{p}attention.{n}.weight"] = torch.zeros(32, 32)
        sd[f"{p}layer_scale1.lambda1"], sd[f"{p}layer_scale2.lambda1"] = torch.ones(32), torch.ones(32)
        for n, shape in (("gate_proj", (64, 32)), ("up_proj", (64, 32)), ("down_proj", (32, 64))):
            sd[f"{p}mlp.{n}.weight"] = torch.zeros(shape)
    sd["norm.weight"], sd["norm.bias"] = torch.ones(32), torch.zeros(32)
    _save(sd, folder / "model.safetensors")
    config = {"model_type": "dinov3_vit", "num_attention_heads": 2, "use_gated_mlp": True, "hidden_act": "gelu"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match="gated MLP with hidden_act 'gelu'"):
        vitkit.load_pretrained(folder)
    config["hidden_act"] = "silu"
    (folder / "config.json").write_text(json.dumps(config))
    assert vitkit.load_pretrained(folder).cfg.mlp_type == "swiglu"


# ---------------------------------------------------------------------------------------------
# Names of the released weights.


def test_dinov3_release_names_are_listed_with_their_sources():
    from vitkit.checkpoint.peers import timm_model_name
    from vitkit.hub.names import find, list_pretrained, rows

    for repo, name in [
        ("facebook/dinov3-vits16-pretrain-lvd1689m", "vit_s16_dinov3.lvd1689m"),
        ("hf-hub:facebook/dinov3-vith16plus-pretrain-lvd1689m", "vit_hplus16_dinov3.lvd1689m"),
        ("facebook/dinov3-vitl16-pretrain-sat493m", "vit_l16_dinov3.sat493m"),
        ("timm/vit_small_plus_patch16_dinov3.lvd1689m", "vit_splus16_dinov3.lvd1689m_timm"),
        ("timm/vit_7b_patch16_dinov3.sat493m", "vit_7b16_dinov3.sat493m_timm"),
    ]:
        assert find(repo).name == name
    entries = [r for r in rows(list_pretrained()) if r["model"] and r["model"].endswith("dinov3")]
    assert len(entries) == 16 and all(r["licence"].startswith("DINOv3 License") for r in entries)
    assert all(r["url"].startswith("hf-hub:") and r["preprocessing"] is not None for r in entries)
    sat = next(r for r in entries if r["name"] == "vit_l16_dinov3.sat493m")
    assert sat["preprocessing"]["mean"] == [0.430, 0.411, 0.296]
    assert timm_model_name("vit_huge_plus_patch16_dinov3_qkvb") == "vit_hplus16_dinov3"
    assert timm_model_name("vit_small_patch16_dinov3") == "vit_s16_dinov3"


def _hub_repo(root, repo: str, files: dict[str, bytes]) -> None:
    """The layout huggingface_hub keeps: refs/main names a revision, whose snapshot links to blobs
    named by their sha256."""
    import hashlib

    folder = root / "hub" / f"models--{repo.replace('/', '--')}"
    rev = hashlib.sha1(repo.encode()).hexdigest()
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(rev)
    (folder / "snapshots" / rev).mkdir(parents=True)
    (folder / "blobs").mkdir()
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (folder / "snapshots" / rev / name).symlink_to(f"../../blobs/{blob.name}")


def test_a_dinov3_name_loads_from_the_hub_cache(tmp_path, monkeypatch):
    """``facebook/dinov3-vits16-pretrain-lvd1689m``'s files (a DINOv3ViTModel of the real width and
    depth, random) found by name in the hub's cache, offline: the model the name says, with the
    repository's preprocessing."""
    t = _hf()
    torch.manual_seed(0)
    cfg = t.DINOv3ViTConfig(num_register_tokens=4, layerscale_value=1e-5)  # ViT-S/16's sizes are the defaults
    peer = t.DINOv3ViTModel(cfg).eval()
    _randomise(peer)
    peer.save_pretrained(tmp_path / "repo")
    files = {n: (tmp_path / "repo" / n).read_bytes() for n in ("config.json", "model.safetensors")}
    processor = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 2}
    files["preprocessor_config.json"] = json.dumps({**processor, "size": {"height": 224, "width": 224}}).encode()
    _hub_repo(tmp_path / "cache", "facebook/dinov3-vits16-pretrain-lvd1689m", files)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = vitkit.load_pretrained("vit_s16_dinov3.lvd1689m")
    assert model.load_report.name == "vit_s16_dinov3.lvd1689m" and model.cfg == vitkit.model_config("vit_s16_dinov3")
    assert model.preprocessing.crop_mode == "squash" and model.preprocessing.mean == (0.485, 0.456, 0.406)
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        assert (model.forward_features(x) - peer(pixel_values=x).last_hidden_state).abs().max() < 1e-5


def test_axial_rope_trains_from_a_recipe_and_refuses_patch_dropout(tmp_path):
    """A recipe with ``pos_embed: rope_axial`` trains (a few steps on synthetic images); asking it
    for patch dropout is one line before the first step."""
    import yaml

    from test_recipes import stand_in
    from vitkit.errors import RecipeError
    from vitkit.train import load_recipe, train

    path = stand_in("vit_cifar10_scratch", tmp_path, steps=2, batch=4)
    tree = yaml.safe_load(path.read_text())
    tree["model"]["overrides"].update(width=32, depth=2, num_heads=2, mlp_dim=64, pos_embed="rope_axial")
    tree["train"]["patch_drop"] = 0.0
    path.write_text(yaml.safe_dump(tree))
    result = train(load_recipe(path), tmp_path / "run")
    back = vitkit.load_pretrained(tmp_path / "run")
    assert back.cfg.pos_embed == "rope_axial" and result.resumed_from is None
    with pytest.raises(RecipeError, match="patch_drop needs absolute position embeddings"):
        train(load_recipe(path, sets=[("train.patch_drop", 0.5)]), tmp_path / "dropped")


def _meta_file(model: torch.nn.Module, key_bias: torch.Tensor) -> dict[str, torch.Tensor]:
    """``model`` (a DINOv3-like vitkit model, SwiGLU) in the names of Meta's own DINOv3 files: storage
    tokens, a masked qkv bias (its key part ``key_bias``, masked to zero), w1/w2/w3, RoPE periods in bf16."""
    sd: dict[str, torch.Tensor] = {"mask_token": torch.zeros(1, 32)}
    for k, v in model.state_dict().items():
        k = k.replace("reg_token", "storage_tokens")
        if k.endswith("attn.qkv.bias"):
            sd[k] = torch.cat([v[:32], key_bias, v[64:]])
            sd[f"{k}_mask"] = torch.cat([torch.ones(32), torch.zeros(32), torch.ones(32)])
        elif ".mlp.fc1." in k:
            sd[k.replace("fc1", "w1")], sd[k.replace("fc1", "w2")] = v[:64], v[64:]
        else:
            sd[k.replace(".mlp.fc2.", ".mlp.w3.")] = v
    sd["rope_embed.periods"] = (100.0 ** (torch.arange(4) / 4.0)).bfloat16()  # head width 16
    sd["local_cls_norm.weight"], sd["local_cls_norm.bias"] = torch.ones(32), torch.zeros(32)
    return sd


def test_metas_own_dinov3_files_load(tmp_path):
    """Meta's DINOv3 files: the storage tokens, the qkv bias with its key part masked (a nonzero
    key bias in the file, which the mask zeroes), the SwiGLU's w1/w2/w3, the RoPE periods checked
    and left out with the 7B's local class-token norm; other periods refused."""
    model = tiny(mlp_type="swiglu", num_classes=0).eval()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.bias[32:64] = 0
    sd = _meta_file(model, key_bias=torch.full((32,), 3.0))
    back = vitkit.load_pretrained(_save(sd, tmp_path / "meta.safetensors"), num_heads=2)
    assert back.cfg.pos_embed == "rope_dinov3" and back.cfg.num_registers == 4 and back.cfg.mlp_type == "swiglu"
    assert any("local_cls_norm" in n for n in back.load_report.notes)
    x = torch.randn(2, 3, 48, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    sd["rope_embed.periods"] = (10_000.0 ** (torch.arange(4) / 4.0)).bfloat16()
    with pytest.raises(vitkit.CheckpointError, match="not DINOv3's base-100 periods"):
        vitkit.load_pretrained(_save(sd, tmp_path / "other.safetensors"), num_heads=2)
