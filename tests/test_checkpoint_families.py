"""Every released ViT checkpoint family loads: AugReg's stem-only R+Ti/16 and its R26/R50
hybrids, i21k and fine-tuned files (heads of 21843 or 1000 classes or none, position embeddings
for 224 or 384 px, pre-logits or not), the key variants of older and newer official code, and
big_vision's MAP head (also from timm's ``global_pool="map"`` layout).

Parity is checked against ``_official_ref.reference_forward``, the official forward written out
in float64, itself checked here against what the official code computed on the shared fixtures.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitkit
from _official_ref import nchw, official_arrays, official_shapes, reference_forward, reference_map_head
from vitkit.checkpoint import convert_official, convert_timm, to_timm
from vitkit.checkpoint.official import infer_config, select_arrays
from vitkit.errors import CheckpointError
from vitkit.export import export_weights

LAYOUTS = ["prelinen", "linen"]
# A stem-only hybrid at test size: the ResNet root alone (32 channels), 4x4 patches over its
# stride-4 map, so 16 px per token; 32 px images make a 2x2 grid (+ class token).
STEM_ONLY = dict(width=32, depth=2, heads=2, mlp=64, patch=4, grid=2, resnet=(), resnet_width=32, num_classes=5)


def save(tmp_path, arrays, name="w.npz"):
    p = tmp_path / name
    np.savez(p, **arrays)
    return p


def images(n, size, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, size[0], size[1], 3)).astype(np.float32)


def logits_of(model, x_nhwc):
    with torch.no_grad():
        return model(nchw(x_nhwc)).numpy()


# ---------------------------------------------------------------------------------------------
# The reference itself, against the official code's own outputs.


@pytest.mark.parametrize("name", ["r_vit_tiny", "vit_tiny_gap_repr"])
def test_reference_forward_reproduces_the_official_outputs(fixtures, name):
    d = fixtures / name
    out = reference_forward(dict(np.load(d / "params_prelinen.npz")), np.load(d / "input.npy"))
    assert np.abs(out["logits"].numpy() - np.load(d / "logits.npy")).max() < 5e-7
    assert np.abs(out["pre_logits"].numpy() - np.load(d / "pre_logits.npy")).max() < 5e-6


# ---------------------------------------------------------------------------------------------
# Stem-only hybrids (AugReg's R_Ti_16: resnet.num_layers = ()).


def test_stem_only_stride_arithmetic():
    cfg = vitkit.model_config("R_Ti_16")  # AugReg's file name prefix
    assert cfg == vitkit.model_config("R+ViT-Ti/16") == vitkit.model_config("r_vit_ti16")
    assert cfg.resnet_units == () and cfg.patch_size == (8, 8) and cfg.stem_stride == 4  # conv /2, max-pool /2
    assert cfg.total_stride == (32, 32) and cfg.grid_size == (7, 7)  # 224 px: 49 tokens + class token
    assert cfg.replace(img_size=384).grid_size == (12, 12)  # the fine-tuned file's 145 positions
    assert vitkit.model_config("r50_vit_b16").stem_stride == 16 and vitkit.model_config("R26_S_32").stem_stride == 32


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stem_only_official_file_loads_with_parity(tmp_path, layout):
    """The file that stopped with 'img_size must be an int or a pair of ints' before."""
    arrays = official_arrays(seed=1, layout=layout, **STEM_ONLY)
    assert not any(k.startswith("block") for k in arrays)
    model = vitkit.load_pretrained(save(tmp_path, arrays))
    cfg = model.cfg
    assert cfg.resnet_units == () and cfg.resnet_width == 32 and cfg.patch_size == (4, 4)
    assert cfg.img_size == (32, 32) and cfg.total_stride == (16, 16) and cfg.num_classes == 5
    x = images(3, (32, 32), seed=2)
    ref = reference_forward(arrays, x, layout)
    assert np.abs(logits_of(model, x) - ref["logits"].numpy()).max() < 2e-6
    with torch.no_grad():
        tokens = model.forward_features(nchw(x)).numpy()
    assert np.abs(tokens - ref["tokens"].numpy()).max() < 2e-5


def test_stem_only_root_matches_the_official_stem_output(fixtures, tmp_path):
    """The root of r_vit_tiny, computed by the official code (``stem/gn_root_out``), under a
    stem-only file built from the fixture's arrays: vitkit's backbone gives its max-pooled ReLU."""
    d = fixtures / "r_vit_tiny"
    arrays = {k: v for k, v in np.load(d / "params_prelinen.npz").items() if not k.startswith("block")}
    rng = np.random.default_rng(3)
    arrays["embedding/kernel"] = (rng.standard_normal((2, 2, 32, 32)) / 11).astype(np.float32)  # over 32 root channels
    arrays["Transformer/posembed_input/pos_embedding"] = (0.1 * rng.standard_normal((1, 1 + 16, 32))).astype(np.float32)
    model = vitkit.load_pretrained(save(tmp_path, arrays))
    assert model.cfg.resnet_units == () and model.cfg.total_stride == (8, 8) and model.cfg.grid_size == (4, 4)
    x = np.load(d / "input.npy")
    gn_root = torch.from_numpy(np.load(d / "intermediates.npz")["stem/gn_root_out"])  # (4, 16, 16, 32) NHWC
    want = torch.nn.functional.max_pool2d(
        torch.nn.functional.pad(gn_root.relu().permute(0, 3, 1, 2), (0, 1, 0, 1), value=-np.inf), 3, 2
    )  # SAME max-pool of a 16x16 map: 0 before, 1 after
    with torch.no_grad():
        got = model.patch_embed.backbone(nchw(x))
    assert got.shape == (4, 32, 8, 8)
    assert (got - want).abs().max() < 2e-5
    assert np.abs(logits_of(model, x) - reference_forward(arrays, x)["logits"].numpy()).max() < 2e-6


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stem_only_export_has_the_official_names_and_round_trips(tmp_path, layout):
    torch.manual_seed(0)
    model = vitkit.create_model(
        "r_vit_ti16", width=32, depth=2, num_heads=2, mlp_dim=64, resnet_width=32, patch_size=4, img_size=32,
        num_classes=5,
    ).eval()  # fmt: skip
    torch.nn.init.normal_(model.head.weight, std=0.1)  # zero-initialised: give it values
    torch.nn.init.normal_(model.cls_token, std=0.1)
    dst = tmp_path / "r_ti.npz"
    export_weights(model, dst, "official", layout=layout)
    written = dict(np.load(dst))
    want = official_shapes(layout=layout, **STEM_ONLY)
    assert {k: v.shape for k, v in written.items()} == want  # names and shapes of the official model
    back = vitkit.load_pretrained(dst)
    assert back.cfg == model.cfg
    x = images(2, (32, 32))
    np.testing.assert_array_equal(logits_of(back, x), logits_of(model, x))
    ref = reference_forward(written, x, layout)
    assert np.abs(logits_of(model, x) - ref["logits"].numpy()).max() < 2e-6


def test_stem_only_timm_layout(tmp_path):
    """timm builds the root alone as a bare stem (``patch_embed.backbone.conv`` / ``.norm``)."""
    sd, cfg = convert_official(official_arrays(seed=4, **STEM_ONLY))
    timm_sd = to_timm(sd, cfg)
    backbone = sorted(k for k in timm_sd if k.startswith("patch_embed.backbone."))
    assert backbone == [
        "patch_embed.backbone.conv.weight",
        "patch_embed.backbone.norm.bias",
        "patch_embed.backbone.norm.weight",
    ]
    back, tcfg = convert_timm(timm_sd, num_heads=2)
    assert tcfg.resnet_units == () and tcfg.img_size == (32, 32) and tcfg.total_stride == (16, 16)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_staged_hybrid_timm_names_round_trip():
    sd, cfg = convert_official(official_arrays(seed=5, **{**STEM_ONLY, "resnet": (1, 1), "patch": 1}))
    timm_sd = to_timm(sd, cfg)
    assert "patch_embed.backbone.stem.conv.weight" in timm_sd
    assert "patch_embed.backbone.stages.1.blocks.0.downsample.conv.weight" in timm_sd
    assert "patch_embed.backbone.stages.0.blocks.0.norm3.weight" in timm_sd
    back, tcfg = convert_timm(timm_sd, num_heads=2)
    assert tcfg.resnet_units == (1, 1) and set(back) == set(sd)


# ---------------------------------------------------------------------------------------------
# The AugReg hybrids and the file families.

# The official configs (vit_jax/configs/models.py), AugReg name -> (width, depth, heads, MLP,
# patch size, resnet.num_layers or None).
OFFICIAL_CONFIGS = {
    "Ti_16": (192, 12, 3, 768, 16, None),
    "S_32": (384, 12, 6, 1536, 32, None),
    "S_16": (384, 12, 6, 1536, 16, None),
    "B_32": (768, 12, 12, 3072, 32, None),
    "B_16": (768, 12, 12, 3072, 16, None),
    "B_8": (768, 12, 12, 3072, 8, None),
    "L_16": (1024, 24, 16, 4096, 16, None),
    "R_Ti_16": (192, 12, 3, 768, 8, ()),
    "R26_S_32": (384, 12, 6, 1536, 1, (2, 2, 2, 2)),
    "R50_L_32": (1024, 24, 16, 4096, 1, (3, 4, 6, 3)),
}


@pytest.mark.parametrize("name", OFFICIAL_CONFIGS)
def test_registry_names_the_official_configs(name):
    width, depth, heads, mlp, patch, units = OFFICIAL_CONFIGS[name]
    cfg = vitkit.model_config(name)
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim, cfg.patch_size) == (
        width,
        depth,
        heads,
        mlp,
        (patch,) * 2,
    )
    assert cfg.resnet_units == units and (units is None or cfg.resnet_width == 64)
    # Pixels per token: the /16 or /32 of the name, except R+Ti/16, whose name is nominal: its
    # config's comment says the root downscales 2x, but the code's conv and max-pool make 4x.
    stride = 32 if name == "R_Ti_16" else int(name.rsplit("_", 1)[1])
    assert cfg.total_stride == (stride, stride)


def _lazy_arrays(shapes):
    """Zero arrays of these shapes that take no memory (the config is read from shapes alone)."""
    return {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}


# (family, pre-training head classes or 0, image size, pre-logits): the i21k files (21843
# classes at 224 px), the ImageNet fine-tunes (1000 at 224 or 384), a file saved without its head,
# and the original release's i21k files with a pre-logits layer.
FAMILIES = [
    ("i21k", 21843, 224, None),
    ("ft224", 1000, 224, None),
    ("ft384", 1000, 384, None),
    ("nohead", 0, 224, None),
]


@pytest.mark.parametrize("family,classes,size,rep", [*FAMILIES, ("i21k-prelogits", 21843, 224, "width")])
@pytest.mark.parametrize("name", ["R_Ti_16", "R26_S_32", "R50_L_32", "B_16", "S_32"])
def test_file_families_read_as_the_named_architecture(name, family, classes, size, rep):
    width, depth, heads, mlp, patch, units = OFFICIAL_CONFIGS[name]
    grid = size // vitkit.model_config(name).total_stride[0]
    shapes = official_shapes(
        width=width, depth=depth, heads=heads, mlp=mlp, patch=patch, grid=grid, num_classes=classes,
        representation=width if rep else None, resnet=units,
    )  # fmt: skip
    names = select_arrays(list(shapes))
    assert sorted(names) == sorted(shapes)
    cfg = infer_config(_lazy_arrays(shapes))
    want = vitkit.model_config(name, img_size=size, num_classes=classes, representation_size=width if rep else None)
    assert cfg == want
    with torch.device("meta"):  # the vitkit model has a tensor for every array, of the same size
        model = vitkit.create_model(
            name, img_size=size, num_classes=classes, representation_size=width if rep else None
        )
    assert sum(p.numel() for p in model.parameters()) == sum(int(np.prod(s)) for s in shapes.values())


@pytest.mark.parametrize("family,classes,size,rep", FAMILIES)
def test_full_size_r_ti_16_files_load(tmp_path, family, classes, size, rep):
    """AugReg's R+Ti/16 at full size, every family: loads, names itself, runs."""
    width, depth, heads, mlp, patch, units = OFFICIAL_CONFIGS["R_Ti_16"]
    grid = size // 32
    arrays = official_arrays(
        seed=6, width=width, depth=depth, heads=heads, mlp=mlp, patch=patch, grid=grid, num_classes=classes,
        resnet=units,
    )  # fmt: skip
    model = vitkit.load_pretrained(save(tmp_path, arrays), name="R_Ti_16")
    assert model.cfg == vitkit.model_config("R_Ti_16", img_size=size, num_classes=classes)
    x = images(1, (size, size))
    with torch.no_grad():
        out = model(nchw(x))
    assert out.shape == (1, classes or width)
    if classes:
        ref = reference_forward(arrays, x)["logits"].numpy()
        assert np.abs(out.numpy() - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_fine_tuning_an_i21k_hybrid_resizes_and_replaces_the_head(tmp_path):
    arrays = official_arrays(seed=7, **{**STEM_ONLY, "num_classes": 21843 // 100})
    model = vitkit.load_pretrained(save(tmp_path, arrays), img_size=48, num_classes=10)
    assert model.cfg.grid_size == (3, 3) and model.pos_embed.shape == (1, 1 + 9, 32)
    assert model.head.out_features == 10 and model.head.weight.abs().sum() == 0
    assert any("resized 2x2 -> 3x3" in n for n in model.load_report.notes)


# ---------------------------------------------------------------------------------------------
# Key variants of other code generations.

TINY = dict(width=32, depth=2, heads=2, mlp=64, patch=4, grid=4, num_classes=5, layout="linen")


def _same_model(tmp_path, arrays, variant):
    x = images(2, (16, 16))
    ref = logits_of(vitkit.load_pretrained(save(tmp_path, arrays, "ref.npz")), x)
    model = vitkit.load_pretrained(save(tmp_path, variant, "variant.npz"))
    np.testing.assert_array_equal(logits_of(model, x), ref)
    return model


def test_old_flax_optimizer_prefix(tmp_path):
    arrays = official_arrays(seed=8, **TINY)
    variant = {f"opt/target/{k}": v for k, v in arrays.items()}
    variant["opt/state/step"] = np.zeros((), np.int32)  # skipped, never read
    _same_model(tmp_path, arrays, variant)


def test_position_embedding_inside_the_encoder(tmp_path):
    """big_vision before 2022: ``Transformer/pos_embedding``."""
    arrays = official_arrays(seed=9, **TINY)
    variant = dict(arrays)
    variant["Transformer/pos_embedding"] = variant.pop("Transformer/posembed_input/pos_embedding")
    _same_model(tmp_path, arrays, variant)


def test_image_tower_of_a_two_tower_model(tmp_path):
    """LiT / SigLIP: the image tower under ``params/img/``, a text tower beside it."""
    arrays = official_arrays(seed=10, **{**TINY, "classifier": "map"})
    variant = {f"params/img/{k}": v for k, v in arrays.items()}
    variant["params/txt/Embed_0/embedding"] = np.zeros((7, 4), np.float32)
    variant["params/t"] = np.zeros((1,), np.float32)
    _same_model(tmp_path, arrays, variant)


def test_group_norm_of_old_flax_and_pre_logits_family(tmp_path):
    arrays = official_arrays(seed=11, **{**STEM_ONLY, "representation": 16})
    variant = {k: (v.reshape(1, 1, 1, -1) if k.startswith("gn_root/") else v) for k, v in arrays.items()}
    model = vitkit.load_pretrained(save(tmp_path, variant))  # GroupNorm (1, 1, 1, C), as before flax 0.3.6
    assert model.cfg.representation_size == 16 and model.cfg.num_classes == 5
    x = images(2, (32, 32))
    ref = reference_forward(arrays, x)
    assert np.abs(logits_of(model, x) - ref["logits"].numpy()).max() < 2e-6
    with torch.no_grad():
        pre = model.forward_head(model.forward_features(nchw(x)), pre_logits=True)
    assert np.abs(pre.numpy() - ref["pre_logits"].numpy()).max() < 2e-5


# ---------------------------------------------------------------------------------------------
# big_vision's MAP head.

MAP = dict(width=32, depth=2, heads=4, mlp=64, patch=4, grid=4, num_classes=5, classifier="map", layout="linen")


def test_map_head_from_a_big_vision_file_has_parity(tmp_path):
    arrays = official_arrays(seed=12, **MAP)
    bv = {f"params/{k}": v for k, v in arrays.items() if "posembed" not in k}
    bv["params/pos_embedding"] = arrays["Transformer/posembed_input/pos_embedding"]  # big_vision's place
    bv["opt/mu/head/kernel"] = np.zeros((32, 5), np.float32)  # optimiser state, skipped
    model = vitkit.load_pretrained(save(tmp_path, bv))
    assert model.cfg.classifier == "map" and model.num_prefix_tokens == 0 and model.cls_token is None
    x = images(3, (16, 16), seed=13)
    ref = reference_forward(arrays, x, "linen")
    assert np.abs(logits_of(model, x) - ref["logits"].numpy()).max() < 2e-6
    with torch.no_grad():  # the head alone, on the reference's own tokens
        pooled = model.attn_pool(ref["tokens"].float())
    assert (pooled.double() - reference_map_head(arrays, ref["tokens"])).abs().max() < 2e-6


def test_inlined_map_head_of_vit_g_development(tmp_path):
    arrays = official_arrays(seed=14, **MAP)
    variant = {k.removeprefix("MAPHead_0/"): v for k, v in arrays.items()}
    assert "probe" in variant and "MlpBlock_0/Dense_0/kernel" in variant
    _same_model(tmp_path, arrays, variant)


def test_map_head_exports_to_big_vision_names_and_back(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_ti16", img_size=16, patch_size=4, depth=2, width=32, num_heads=4, mlp_dim=64,
                                num_classes=5, classifier="map").eval()  # fmt: skip
    torch.nn.init.normal_(model.head.weight, std=0.1)
    dst = tmp_path / "map.npz"
    export_weights(model, dst, "official", layout="linen")
    written = dict(np.load(dst))
    assert {k: v.shape for k, v in written.items()} == official_shapes(**MAP)
    back = vitkit.load_pretrained(dst)
    assert back.cfg == model.cfg
    x = images(2, (16, 16))
    np.testing.assert_array_equal(logits_of(back, x), logits_of(model, x))
    assert np.abs(logits_of(model, x) - reference_forward(written, x, "linen")["logits"].numpy()).max() < 2e-6


def timm_state_dict_from_big_vision(a: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """timm's layout of a MAP ViT, written from timm's documented names and its npz loader's
    transposes (``AttentionPoolLatent``: latent, q, kv = [key; value], proj, norm, mlp.fc1/fc2)."""
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))
    D = a["embedding/kernel"].shape[-1]
    sd = {
        "patch_embed.proj.weight": t(a["embedding/kernel"].transpose(3, 2, 0, 1)),
        "patch_embed.proj.bias": t(a["embedding/bias"]),
        "pos_embed": t(a["Transformer/posembed_input/pos_embedding"]),
        "norm.weight": t(a["Transformer/encoder_norm/scale"]),
        "norm.bias": t(a["Transformer/encoder_norm/bias"]),
        "head.weight": t(a["head/kernel"].T),
        "head.bias": t(a["head/bias"]),
    }
    flat = lambda k: a[k].reshape(D, -1).T  # (D, H, hd) -> (D, D) -> out x in

    def lin(dst, src):
        sd[f"{dst}.weight"], sd[f"{dst}.bias"] = t(a[f"{src}/kernel"].T), t(a[f"{src}/bias"])

    i = 0
    while f"Transformer/encoderblock_{i}/LayerNorm_0/scale" in a:
        b, p = f"Transformer/encoderblock_{i}", f"blocks.{i}"
        for ln, src in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_1")):
            sd[f"{p}.{ln}.weight"], sd[f"{p}.{ln}.bias"] = t(a[f"{b}/{src}/scale"]), t(a[f"{b}/{src}/bias"])
        m = f"{b}/MultiHeadDotProductAttention_0"
        sd[f"{p}.attn.qkv.weight"] = t(np.concatenate([flat(f"{m}/{n}/kernel") for n in ("query", "key", "value")]))
        sd[f"{p}.attn.qkv.bias"] = t(
            np.concatenate([a[f"{m}/{n}/bias"].reshape(-1) for n in ("query", "key", "value")])
        )
        sd[f"{p}.attn.proj.weight"] = t(a[f"{m}/out/kernel"].reshape(-1, D).T)
        sd[f"{p}.attn.proj.bias"] = t(a[f"{m}/out/bias"])
        lin(f"{p}.mlp.fc1", f"{b}/MlpBlock_0/Dense_0")
        lin(f"{p}.mlp.fc2", f"{b}/MlpBlock_0/Dense_1")
        i += 1
    m = "MAPHead_0/MultiHeadDotProductAttention_0"
    sd["attn_pool.latent"] = t(a["MAPHead_0/probe"])
    sd["attn_pool.q.weight"], sd["attn_pool.q.bias"] = t(flat(f"{m}/query/kernel")), t(a[f"{m}/query/bias"].reshape(-1))
    sd["attn_pool.kv.weight"] = t(np.concatenate([flat(f"{m}/{n}/kernel") for n in ("key", "value")]))
    sd["attn_pool.kv.bias"] = t(np.concatenate([a[f"{m}/{n}/bias"].reshape(-1) for n in ("key", "value")]))
    sd["attn_pool.proj.weight"] = t(a[f"{m}/out/kernel"].reshape(-1, D).T)
    sd["attn_pool.proj.bias"] = t(a[f"{m}/out/bias"])
    sd["attn_pool.norm.weight"] = t(a["MAPHead_0/LayerNorm_0/scale"])
    sd["attn_pool.norm.bias"] = t(a["MAPHead_0/LayerNorm_0/bias"])
    lin("attn_pool.mlp.fc1", "MAPHead_0/MlpBlock_0/Dense_0")
    lin("attn_pool.mlp.fc2", "MAPHead_0/MlpBlock_0/Dense_1")
    return sd


def test_map_head_from_a_timm_state_dict(tmp_path):
    from safetensors.torch import save_file

    arrays = official_arrays(seed=15, **MAP)
    sd = timm_state_dict_from_big_vision(arrays)
    p = tmp_path / "timm_map.safetensors"
    save_file(sd, str(p))
    model = vitkit.load_pretrained(p, num_heads=4, act="gelu_tanh")  # timm's tensors say neither
    assert model.cfg.classifier == "map" and model.cfg.num_heads == 4
    x = images(2, (16, 16), seed=16)
    assert np.abs(logits_of(model, x) - reference_forward(arrays, x, "linen")["logits"].numpy()).max() < 2e-6
    # vitkit -> timm layout -> vitkit: the same tensors, the names timm's AttentionPoolLatent has
    out = to_timm(model.state_dict(), model.cfg)
    assert {k for k in out if k.startswith("attn_pool.")} == {k for k in sd if k.startswith("attn_pool.")}
    back, cfg = convert_timm(out, num_heads=4)
    assert cfg.classifier == "map" and all(torch.equal(back[k], model.state_dict()[k]) for k in back)


def test_map_head_refusals(tmp_path):
    arrays = official_arrays(seed=17, **MAP)
    sd, _ = convert_official(arrays)
    bad = dict(sd, cls_token=torch.zeros(1, 1, 32))
    with pytest.raises(CheckpointError, match="class token and attention pooling"):
        convert_timm(to_timm(bad), num_heads=4)
    odd = dict(arrays)
    odd["MAPHead_0/MlpBlock_0/Dense_0/kernel"] = np.zeros((32, 48), np.float32)
    odd["MAPHead_0/MlpBlock_0/Dense_0/bias"] = np.zeros((48,), np.float32)
    odd["MAPHead_0/MlpBlock_0/Dense_1/kernel"] = np.zeros((48, 32), np.float32)
    with pytest.raises(CheckpointError, match="MLP size 48, the encoder 4 and 64"):
        vitkit.load_pretrained(save(tmp_path, odd))
    model = vitkit.load_pretrained(save(tmp_path, arrays, "ok.npz"))
    with pytest.raises(
        CheckpointError, match="Hugging Face's ViT cannot hold attention pooling \\(classifier='map'\\)"
    ):
        export_weights(model, tmp_path / "hf_out", "hf")
    assert not (tmp_path / "hf_out").exists()


def test_map_model_contract(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_s16", img_size=32, patch_size=8, depth=2, width=32, num_heads=4, mlp_dim=64,
                                num_classes=3, classifier="map")  # fmt: skip
    torch.nn.init.normal_(model.head.weight, std=0.1)
    x = torch.randn(2, 3, 32, 32)
    model(x).square().sum().backward()
    assert model.attn_pool.latent.grad is not None and model.attn_pool.latent.grad.abs().sum() > 0
    path = vitkit.save_checkpoint(model.eval(), tmp_path / "m.safetensors")
    back = vitkit.load_pretrained(path)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    from vitkit.models import model_flops

    with torch.device("meta"):
        gap = vitkit.create_model("vit_s16", classifier="gap")
        mapped = vitkit.create_model("vit_s16", classifier="map")
    D, N, M = 384, 196, 1536
    assert model_flops(mapped) - model_flops(gap) == 2 * D * D * 2 + 2 * N * D * 2 * D + 4 * N * D + 4 * D * M


def test_map_head_matches_timm_where_timm_imports(tmp_path):
    timm = pytest.importorskip("timm", reason="timm is not installed (it needs torchvision)", exc_type=ImportError)
    from safetensors.torch import save_file

    torch.manual_seed(0)
    peer = timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0,
        num_classes=5, class_token=False, global_pool="map",
    ).eval()  # fmt: skip
    with torch.no_grad():  # zero-initialised parts (head, latent's neighbours) get values too
        for p in peer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "timm_map.safetensors")
    ours = vitkit.load_pretrained(tmp_path / "timm_map.safetensors", num_heads=4)
    assert ours.cfg.classifier == "map" and ours.cfg.act == "gelu"
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), peer(x), atol=1e-5, rtol=0)
    assert set(to_timm(ours.state_dict(), ours.cfg)) == set(peer.state_dict())
