"""Issue #14 for weight files, exports, loaders and images: every bad input gets one clear line,
nothing is silently corrupted. Valid models round-trip through every format with identical
outputs, or are refused before anything is written."""

from __future__ import annotations

import errno
import functools
import io
import json
import os
import struct
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoint import CheckpointError, to_official
from vitkit.cli import main
from vitkit.errors import DataError, VitkitError
from vitkit.export import export_weights

BASE = dict(img_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3)


def tiny(seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny ViT with random weights everywhere (heads and position tables included), so that
    every parameter shows in the outputs."""
    torch.manual_seed(seed)
    m = vitkit.create_model("vit_s16", **{**BASE, **kw}).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.ndim == 1 and p.shape[0] % 2 else 0.0))
    return m


def outputs(m: torch.nn.Module, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    x = torch.randn(2, m.cfg.in_chans, *m.cfg.img_size)
    with torch.no_grad():
        return m.forward_head(m.forward_features(x), pre_logits=not m.cfg.num_classes)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def files_under(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ---------------------------------------------------------------------------------------------
# 1. exporters write what the format holds, and refuse the rest before writing anything

OPTIONS = {
    "token": {},
    "gap": {"classifier": "gap"},
    "sincos2d": {"pos_embed": "sincos2d"},
    "none": {"pos_embed": "none"},
    "none_224": {"pos_embed": "none", "img_size": 224, "patch_size": 32},
    "learned2d": {"pos_embed": "learned2d"},
    "relative": {"pos_embed": "relative"},
    "representation": {"representation_size": 8},
    "representation_no_head": {"representation_size": 8, "num_classes": 0},
    "no_head": {"num_classes": 0},
    "cls_pos_embed_false": {"cls_pos_embed": False},
    "rect_grid": {"img_size": (16, 24)},
    "rect_patch": {"img_size": (16, 8), "patch_size": (4, 2)},
    "heads_8": {"num_heads": 8},
    "heads_1": {"num_heads": 1},
    "exact_gelu": {"act": "gelu"},
    "ln_eps_1e-12": {"ln_eps": 1e-12},
    "hybrid": {"resnet_units": (1, 1), "resnet_width": 32, "patch_size": 1, "img_size": 32},
    "gray": {"in_chans": 1},
}

# (format, option) pairs the format cannot hold: refused in one line, nothing written.
REFUSED = {
    "official": {
        "sincos2d",
        "none",
        "learned2d",
        "relative",
        "rect_grid",
        "exact_gelu",
        "ln_eps_1e-12",
    },
    "timm": {"sincos2d", "learned2d", "relative"},
    "hf": {
        "gap",
        "sincos2d",
        "none",
        "none_224",
        "learned2d",
        "relative",
        "representation",
        "cls_pos_embed_false",
        "hybrid",
    },
    "vitkit": set(),
}
DESTINATIONS = {"vitkit": "m.safetensors", "official": "m.npz", "timm": "m.safetensors", "hf": "m_hf"}


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("to", ["vitkit", "official", "linen", "timm", "hf"])
def test_every_format_round_trips_or_refuses(tmp_path, to, option):
    fmt, layout = ("official", "linen") if to == "linen" else (to, "prelinen")
    m = tiny(**OPTIONS[option])
    dst = tmp_path / DESTINATIONS[fmt]
    if option in REFUSED[fmt]:
        with pytest.raises(CheckpointError) as e:
            export_weights(m, dst, fmt, layout=layout)
        assert "\n" not in str(e.value) and "export to vitkit" in str(e.value)
        assert files_under(tmp_path) == []
        return
    export_weights(m, dst, fmt, layout=layout)
    back = vitkit.load_pretrained(dst)
    assert back.cfg == m.cfg, f"{option} through {to}: {back.cfg} != {m.cfg}"
    assert torch.equal(outputs(back), outputs(m))
    assert back.load_report.notes == [] or fmt == "hf"


def test_official_gap_and_cls_positions_are_inferred(tmp_path):
    """What the official arrays do show: the classifier and whether the class token has a position."""
    for kw in ({"classifier": "gap", "representation_size": 8}, {"cls_pos_embed": False, "img_size": 4}):
        m = tiny(**kw)
        export_weights(m, tmp_path / "m.npz", "official")
        back = vitkit.load_pretrained(tmp_path / "m.npz")
        assert back.cfg == m.cfg and torch.equal(outputs(back), outputs(m))


def test_timm_file_keeps_the_config_and_stays_a_timm_state_dict(tmp_path):
    m = tiny(num_heads=8, act="gelu_tanh", img_size=(16, 24), representation_size=8)
    export_weights(m, tmp_path / "t.safetensors", "timm")
    tensors = load_file(tmp_path / "t.safetensors")
    assert "pre_logits.fc.weight" in tensors and "blocks.0.attn.qkv.weight" in tensors
    bare = tmp_path / "bare.safetensors"  # the same tensors without vitkit's metadata: read as before
    save_file(tensors, bare)
    with pytest.raises(CheckpointError, match="do not form a square grid"):
        vitkit.load_pretrained(bare)
    back = vitkit.load_pretrained(tmp_path / "t.safetensors")
    assert back.cfg.num_heads == 8 and back.cfg.img_size == (16, 24) and torch.equal(outputs(back), outputs(m))
    with pytest.raises(CheckpointError, match="records num_heads=8, but num_heads=2 was given"):
        vitkit.load_pretrained(tmp_path / "t.safetensors", num_heads=2)


def test_preprocessing_a_format_cannot_hold_is_refused_and_the_others_keep_it(tmp_path):
    from vitkit.preprocessing import Preprocessing

    m = tiny()
    m.preprocessing = Preprocessing((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), (16, 16))
    with pytest.raises(CheckpointError, match="does not record preprocessing"):
        export_weights(m, tmp_path / "m.npz", "official")
    assert files_under(tmp_path) == []
    export_weights(m, tmp_path / "t.safetensors", "timm")  # kept in the metadata
    assert vitkit.load_pretrained(tmp_path / "t.safetensors").preprocessing == m.preprocessing
    export_weights(m, tmp_path / "hf", "hf")  # kept in preprocessor_config.json
    assert vitkit.load_pretrained(tmp_path / "hf").preprocessing == m.preprocessing


def test_bit_resnet_exports_only_to_vitkit(tmp_path):
    m = vitkit.create_model("bit_r50x1", units=(1, 1), img_size=32, num_classes=3).eval()
    for fmt, name in (("official", "m.npz"), ("timm", "m.safetensors"), ("hf", "hf")):
        with pytest.raises(CheckpointError, match="not a ResNetConfig"):
            export_weights(m, tmp_path / name, fmt)
    export_weights(m, tmp_path / "m.safetensors", "vitkit")
    assert torch.equal(outputs(vitkit.load_pretrained(tmp_path / "m.safetensors")), outputs(m))


def test_convert_cli_refuses_the_demo_run_to_official(tmp_path, capsys):
    """``vitkit convert runs/demo demo.npz`` of a sin-cos model: refused, not written."""
    run = tmp_path / "run"
    vitkit.save_checkpoint(tiny(pos_embed="sincos2d"), run / "best.safetensors")
    assert main(["convert", str(run), str(tmp_path / "demo.npz")]) == 2
    assert "pos_embed='sincos2d'" in one_line_error(capsys)
    assert not (tmp_path / "demo.npz").exists()
    assert main(["convert", str(run), str(tmp_path / "t.safetensors"), "--to", "timm"]) == 2
    assert "pos_embed='sincos2d'" in one_line_error(capsys)


# ---------------------------------------------------------------------------------------------
# 2. destination names that do not fit the format


@pytest.mark.parametrize(
    ("name", "to", "expected"),
    [
        ("m.pth", None, "m.safetensors"),
        ("m.bin", None, "m.safetensors"),
        ("m.pth", "timm", "m.safetensors"),
        ("m.bin", "vitkit", "m.safetensors"),
        ("m.safetensors", "official", "m.npz"),
        ("m.npz", "timm", "m.safetensors"),
        ("m.onnx", "vitkit", "m.safetensors"),
        ("m.npz", "onnx", "m.onnx"),
        ("m.safetensors", "hf", "is a folder"),
        ("weights", None, "cannot tell the format from the name"),
    ],
)
def test_convert_refuses_names_it_could_not_read_back(tmp_path, capsys, name, to, expected):
    src = vitkit.save_checkpoint(tiny(), tmp_path / "src" / "m.safetensors")
    argv = ["convert", str(src), str(tmp_path / name)] + (["--to", to] if to else [])
    assert main(argv) == 2
    err = one_line_error(capsys)
    assert expected.replace("is a folder", "folder") in err and name in err
    assert files_under(tmp_path) == ["src", "src/m.safetensors"]


def test_convert_infers_the_format_from_the_name(tmp_path, capsys):
    src = vitkit.save_checkpoint(tiny(), tmp_path / "m.safetensors")
    assert main(["convert", str(src), str(tmp_path / "o.npz")]) == 0
    assert main(["convert", str(src), str(tmp_path / "o.SAFETENSORS")]) == 0
    assert vitkit.load_pretrained(tmp_path / "o.npz").load_report.source == "official"
    assert vitkit.load_pretrained(tmp_path / "o.SAFETENSORS").load_report.source == "vitkit"


# ---------------------------------------------------------------------------------------------
# 3. non-finite weights


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_weights_are_refused(tmp_path, capsys, bad):
    m = tiny()
    with torch.no_grad():
        m.blocks[1].mlp.fc2.weight[3, 5] = bad
    path = vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"m\.safetensors: tensor 'blocks\.1\.mlp\.fc2\.weight' holds 1 non"):
        vitkit.load_pretrained(path)
    assert vitkit.load_pretrained(path, allow_nonfinite=True).blocks[1].mlp.fc2.weight.isfinite().sum() == 64 * 32 - 1
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (16, 16), (10, 20, 30)).save(image)
    assert main(["predict", str(path), str(image)]) == 2
    assert "non-finite" in one_line_error(capsys)
    arrays = to_official(tiny().state_dict(), tiny().cfg)
    arrays["Transformer/encoder_norm/scale"][0] = bad
    np.savez(tmp_path / "o.npz", **arrays)
    with pytest.raises(CheckpointError, match=r"o\.npz: tensor 'norm\.weight'"):
        vitkit.load_pretrained(tmp_path / "o.npz")


def test_nonfinite_head_that_is_replaced_does_not_matter(tmp_path):
    m = tiny()
    with torch.no_grad():
        m.head.weight[0, 0] = float("nan")
    path = vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    assert vitkit.load_pretrained(path, num_classes=5).head.weight.abs().sum() == 0


# ---------------------------------------------------------------------------------------------
# 4 and 5. Hugging Face config.json, and values a file brings in


def _hf_folder(tmp_path, config_edit=None, name="hf"):
    folder = tmp_path / name
    m = tiny(num_heads=4, act="gelu", ln_eps=1e-12)  # Hugging Face's defaults
    export_weights(m, folder, "hf")
    if config_edit is not None:
        cfg = json.loads((folder / "config.json").read_text())
        config_edit(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder, m


def test_hf_folder_without_config_json_is_refused(tmp_path, capsys):
    folder, m = _hf_folder(tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"hf/config\.json: missing; .*number of attention heads"):
        vitkit.load_pretrained(folder)
    assert torch.equal(outputs(vitkit.load_pretrained(folder, num_heads=4)), outputs(m))
    raw = tmp_path / "raw.safetensors"
    (folder / "model.safetensors").rename(raw)
    with pytest.raises(CheckpointError, match=r"raw\.safetensors: Hugging Face weights without config\.json"):
        vitkit.load_pretrained(raw)
    assert main(["convert", str(raw), str(tmp_path / "o.safetensors")]) == 2
    assert "pass num_heads" in one_line_error(capsys)


def test_hf_config_defaults_are_hugging_faces(tmp_path):
    """A key Hugging Face leaves out of config.json (its own default) means that default."""
    folder, m = _hf_folder(tmp_path, lambda c: [c.pop(k) for k in ("hidden_act", "layer_norm_eps", "image_size")])
    back = vitkit.load_pretrained(folder)
    assert back.cfg == m.cfg and torch.equal(outputs(back), outputs(m))
    folder, _ = _hf_folder(tmp_path, lambda c: c.pop("num_attention_heads"), name="h2")
    with pytest.raises(CheckpointError, match="default of 12 does not divide the width 32"):
        vitkit.load_pretrained(folder)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_attention_heads", "4"),
        ("num_attention_heads", 0),
        ("num_attention_heads", -4),
        ("num_attention_heads", 4.0),
        ("num_attention_heads", 5),
        ("num_attention_heads", True),
        ("layer_norm_eps", "1e-6"),
        ("layer_norm_eps", -1.0),
        ("layer_norm_eps", float("nan")),
        ("hidden_act", 3),
        ("hidden_act", "relu"),
        ("image_size", [16]),
        ("image_size", "16"),
        ("image_size", 0),
    ],
)
def test_bad_hf_config_values_are_named(tmp_path, key, value):
    folder, _ = _hf_folder(tmp_path, lambda c: c.__setitem__(key, value))
    with pytest.raises(CheckpointError) as e:
        vitkit.load_pretrained(folder)
    msg = str(e.value)
    assert "config.json" in msg and (key in msg or "num_heads" in msg or "divisible" in msg), msg
    assert "\n" not in msg


@pytest.mark.parametrize("text", ["[1, 2]", '"vit"', "{", "[" * 100_000 + "]" * 100_000])
def test_hf_config_json_that_is_not_an_object(tmp_path, text):
    folder, _ = _hf_folder(tmp_path)
    (folder / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=r"config\.json"):
        vitkit.load_pretrained(folder)


def _edit_native(path, edit_config=None, edit_meta=None):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
    tensors = load_file(path)
    if edit_config is not None:
        cfg = json.loads(meta["config"])
        edit_config(cfg)
        meta["config"] = json.dumps(cfg)
    if edit_meta is not None:
        edit_meta(meta)
    save_file(tensors, path, metadata=meta)


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_set("width", "32"), "config['width']"),
        (_set("width", 32.0), "config['width']"),
        (_set("num_heads", 0), "config['num_heads']"),
        (_set("num_heads", 3), "not divisible by num_heads 3"),
        (_set("patch_size", 0), "config['patch_size']"),
        (_set("patch_size", [4]), "config['patch_size']"),
        (_set("img_size", [16, -16]), "config['img_size'][1]"),
        (_set("depth", -1), "config['depth']"),
        (_set("depth", 4000), "4000 blocks"),
        (_set("width", 10**9), "config['width']"),
        (_set("mlp_dim", 64.0), "config['mlp_dim']"),
        (_set("mlp_dim", 65536), "tensor shapes do not match"),
        (_set("num_classes", -1), "config['num_classes']"),
        (_set("num_classes", 10**6), "tensor shapes do not match"),
        (_set("representation_size", "8"), "config['representation_size']"),
        (_set("drop_rate", 2.0), "config['drop_rate']"),
        (_set("ln_eps", "x"), "config['ln_eps']"),
        (_set("ln_eps", 0), "config['ln_eps']"),
        (_set("act", None), "config['act']"),
        (_set("pos_embed", ["learned"]), "config['pos_embed']"),
        (_set("cls_pos_embed", "yes"), "config['cls_pos_embed']"),
        (_set("resnet_units", [0]), "config['resnet_units'][0]"),
        (_set("hidden_size", 32), "unknown ViTConfig field(s) ['hidden_size']"),
    ],
)
def test_bad_vitkit_config_values_are_named(tmp_path, edit, named):
    path = vitkit.save_checkpoint(tiny(), tmp_path / "m.safetensors")
    _edit_native(path, edit_config=edit)
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        vitkit.load_pretrained(path)
    assert time.perf_counter() - t0 < 5
    assert named in str(e.value) and "m.safetensors" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_free_image_size_from_a_file_is_bounded(tmp_path):
    path = vitkit.save_checkpoint(tiny(pos_embed="sincos2d"), tmp_path / "m.safetensors")
    _edit_native(path, edit_config=_set("img_size", [4096, 4096]))  # 1024 x 1024 tokens: a 128 MB table
    with pytest.raises(CheckpointError, match="more than the 65536 tokens"):
        vitkit.load_pretrained(path)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_set("config", "{"), "not valid JSON"),
        (_set("config", "[]"), "must be a JSON object"),
        (_set("arch", "cnn"), "arch must be"),
        (lambda m: m.pop("config"), "no model config"),
        (_set("preprocessing", '{"mean": [0.5], "std": [0.5], "img_size": [16, 16]}'), "preprocessing['mean']"),
        (
            _set("preprocessing", '{"mean": [0.5,0.5,0.5], "std": [0.5,0,0.5], "img_size": [16, 16]}'),
            "preprocessing['std'][1]",
        ),
        (
            _set("preprocessing", '{"mean": [0,0,0], "std": [1,1,1], "img_size": 16, "interpolation": "x"}'),
            "preprocessing['interpolation']",
        ),
        (_set("preprocessing", "null"), "preprocessing must be a JSON object"),
    ],
)
def test_bad_vitkit_metadata_is_named(tmp_path, edit, named):
    path = vitkit.save_checkpoint(tiny(), tmp_path / "m.safetensors")
    _edit_native(path, edit_meta=edit)
    with pytest.raises(CheckpointError) as e:
        vitkit.load_pretrained(path)
    assert named in str(e.value) and "m.safetensors" in str(e.value), str(e.value)


def test_tensors_of_the_wrong_rank_are_a_checkpoint_error(tmp_path):
    sd = tiny().state_dict()
    sd["patch_embed.proj.weight"] = sd["patch_embed.proj.weight"].flatten()
    save_file(sd, tmp_path / "t.safetensors")
    with pytest.raises(CheckpointError, match=r"t\.safetensors: tensors do not form a model vitkit can read"):
        vitkit.load_pretrained(tmp_path / "t.safetensors", num_heads=2)
    sd = tiny().state_dict()
    sd["blocks.99999999.norm1.weight"] = torch.ones(32)  # a depth of 10^8 by its name: refused, not built
    save_file(sd, tmp_path / "deep.safetensors")
    with pytest.raises(CheckpointError, match="100000000 blocks"):
        vitkit.load_pretrained(tmp_path / "deep.safetensors", num_heads=2)


def test_heads_the_file_gives_are_not_overridden_by_a_name(tmp_path):
    m = tiny(width=192, num_heads=6, mlp_dim=768, depth=12, patch_size=16, img_size=32)
    export_weights(m, tmp_path / "m.npz", "official")
    with pytest.raises(CheckpointError, match="num_heads 6 in the file vs 3 for vit_ti16"):
        vitkit.load_pretrained(tmp_path / "m.npz", name="vit_ti16")


# ---------------------------------------------------------------------------------------------
# 6. small files that unpack into huge arrays


def _npy_header(shape, dtype="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _bomb_member(zf: zipfile.ZipFile, name: str, nbytes: int, method=zipfile.ZIP_DEFLATED) -> None:
    """A member whose .npy holds ``nbytes`` of zeros, written in chunks (never held whole)."""
    info = zipfile.ZipInfo(name)
    info.compress_type = method
    with zf.open(info, "w", force_zip64=True) as f:
        f.write(_npy_header((nbytes // 4,)))
        chunk = bytes(1 << 22)
        for _ in range(nbytes // len(chunk)):
            f.write(chunk)


def _official_arrays() -> dict[str, np.ndarray]:
    m = tiny()
    return to_official(m.state_dict(), m.cfg)


def _write_npz(path, arrays, extra=None, method=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for k, v in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, v, allow_pickle=False)
            zf.writestr(f"{k}.npy", buf.getvalue())
        for name, nbytes in (extra or {}).items():
            _bomb_member(zf, f"{name}.npy", nbytes, method)


def _refuses_fast(path, match):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(CheckpointError, match=match):
            vitkit.load_pretrained(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB while refusing"


BOMB = 200 << 20  # 200 MiB of zeros: about 200 KB deflated


def test_npz_bomb_of_an_unknown_name_is_refused_by_name(tmp_path):
    p = tmp_path / "bomb.npz"
    _write_npz(p, _official_arrays(), {"Transformer/huge": BOMB})
    assert p.stat().st_size < 2 << 20
    _refuses_fast(p, r"bomb\.npz: arrays vitkit does not know how to map: \['Transformer/huge'\]")


def test_npz_bomb_of_a_known_name_is_refused_by_size(tmp_path):
    arrays = _official_arrays()
    del arrays["head/kernel"]
    p = tmp_path / "bomb.npz"
    _write_npz(p, arrays, {"head/kernel": BOMB})
    _refuses_fast(p, r"bomb\.npz: array 'head/kernel' would unpack to 200\.0 MiB")


def test_npz_optimiser_state_is_skipped_unread(tmp_path):
    """big_vision: arrays outside ``params/`` (optimiser state) are never decompressed."""
    arrays = {f"params/{k}": v for k, v in _official_arrays().items()}
    p = tmp_path / "bv.npz"
    _write_npz(p, arrays, {"opt/mu/huge": BOMB})
    tracemalloc.start()
    try:
        model = vitkit.load_pretrained(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20 and torch.equal(outputs(model), outputs(tiny()))


def test_npz_header_that_lies_about_its_size(tmp_path):
    arrays = _official_arrays()
    p = tmp_path / "lie.npz"
    with zipfile.ZipFile(p, "w") as zf:
        for k, v in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, v, allow_pickle=False)
            data = buf.getvalue()
            if k == "head/kernel":  # the header claims 4 GiB; the member holds a few bytes
                data = _npy_header((1 << 30,)) + data[-64:]
            zf.writestr(f"{k}.npy", data)
    _refuses_fast(p, r"lie\.npz: array 'head/kernel': its header says \(1073741824,\)")


def test_npz_with_another_compression_is_refused(tmp_path):
    arrays = _official_arrays()
    p = tmp_path / "bz.npz"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_BZIP2) as zf:
        for k, v in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, v, allow_pickle=False)
            zf.writestr(f"{k}.npy", buf.getvalue())
    with pytest.raises(CheckpointError, match="compressed with zip method 12"):
        vitkit.load_pretrained(p)


def test_compressed_npz_of_real_weights_loads(tmp_path):
    m = tiny()
    np.savez_compressed(tmp_path / "c.npz", **to_official(m.state_dict(), m.cfg))
    assert torch.equal(outputs(vitkit.load_pretrained(tmp_path / "c.npz")), outputs(m))


def test_npy_renamed_npz_is_a_checkpoint_error(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    (tmp_path / "a.npy").rename(tmp_path / "a.npz")
    with pytest.raises(CheckpointError, match=r"a\.npz: not a readable \.npz"):
        vitkit.load_pretrained(tmp_path / "a.npz")


# ---------------------------------------------------------------------------------------------
# 7. images: truncated files and decompression bombs in predict and analyze; eval's skips


@pytest.fixture
def ckpt(tmp_path):
    return vitkit.save_checkpoint(tiny(), tmp_path / "ckpt" / "m.safetensors")


def _image_bytes(fmt: str, size=(64, 48)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP"])
def test_truncated_images_are_one_line(tmp_path, capsys, ckpt, fmt):
    data = _image_bytes(fmt)
    for cut in (len(data) // 2, len(data) - 7, 40):
        p = tmp_path / f"cut_{cut}.{fmt.lower()}"
        p.write_bytes(data[:cut])
        rc = main(["predict", str(ckpt), str(p)])
        if rc == 0:  # some decoders pad a short file: the image is complete as far as Pillow knows
            capsys.readouterr()
            continue
        assert rc == 2
        err = one_line_error(capsys)
        assert p.name in err and "not an image Pillow can read" in err


def test_decompression_bombs_are_refused(tmp_path, capsys, ckpt, monkeypatch):
    from PIL import Image

    from vitkit.preprocessing import read_image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    for side, what in ((40, "warning"), (64, "error")):  # 1600 px: over the limit; 4096: over twice it
        p = tmp_path / f"bomb_{what}.png"
        p.write_bytes(_image_bytes("PNG", (side, side)))
        with pytest.raises(DataError, match=f"bomb_{what}.png: refused as a decompression bomb"):
            read_image(p)
        assert main(["predict", str(ckpt), str(p)]) == 2
        assert "decompression bomb" in one_line_error(capsys)
    assert main(["analyze", str(ckpt), "--images", str(p), "--out", str(tmp_path / "a")]) == 2
    assert "bomb_error.png: refused as a decompression bomb" in one_line_error(capsys)
    assert not (tmp_path / "a").exists()


def _image_folder(root, classes=("a", "b", "c"), per_class=3, broken=()):
    from PIL import Image

    for split in ("train", "val"):
        for i, c in enumerate(classes):
            d = root / split / c
            d.mkdir(parents=True)
            for j in range(per_class):
                Image.new("RGB", (8, 8), (40 * i, 20 * j, 0)).save(d / f"{j}.png")
    for rel in broken:
        (root / rel).write_bytes(_image_bytes("PNG")[:60])


def test_eval_reports_skipped_images(tmp_path, capsys, ckpt):
    from vitkit.data import build_dataset
    from vitkit.eval import evaluate

    root = tmp_path / "data"
    _image_folder(root, broken=("val/a/1.png", "val/c/2.png"))
    m = evaluate(vitkit.load_pretrained(ckpt), build_dataset(str(root), "val"), batch_size=4)
    assert m["num_images"] == 7 and m["skipped"] == 2 and len(m["skipped_examples"]) == 2
    assert any("1.png" in e for e in m["skipped_examples"])
    out = tmp_path / "e.json"
    rc = main(["eval", str(ckpt), "--data", str(root), "--split", "val", "--json", str(out), "--out", str(tmp_path)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "skipped 2 unreadable image(s), not counted" in err
    assert json.loads(out.read_text())["skipped"] == 2


def test_eval_on_only_unreadable_images_says_so(tmp_path, capsys, ckpt):
    root = tmp_path / "data"
    _image_folder(root, per_class=1, broken=("val/a/0.png", "val/b/0.png", "val/c/0.png"))
    assert main(["eval", str(ckpt), "--data", str(root), "--split", "val", "--out", str(tmp_path)]) == 2
    assert "no images to evaluate (3 could not be read" in one_line_error(capsys)


# ---------------------------------------------------------------------------------------------
# 8. full disks and read-only folders: one line naming the path, no partial file


def _full_disk(monkeypatch):
    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)


def _read_only(monkeypatch):
    import tempfile

    import vitkit.files

    def mkstemp(prefix="", suffix="", dir=None):
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, f"{prefix}x{suffix}"))

    monkeypatch.setattr(vitkit.files.tempfile, "mkstemp", mkstemp)
    assert tempfile.mkstemp is mkstemp


@pytest.mark.parametrize("failure", [_full_disk, _read_only])
@pytest.mark.parametrize("to", ["m.safetensors", "m.npz", "m.onnx", "timm", "hf"])
def test_convert_to_a_full_or_read_only_disk(tmp_path, capsys, monkeypatch, ckpt, failure, to):
    out = tmp_path / "out"
    out.mkdir()
    dst, extra = {"timm": ("t.safetensors", ["--to", "timm"]), "hf": ("hf", ["--to", "hf"])}.get(to, (to, []))
    failure(monkeypatch)
    assert main(["convert", str(ckpt), str(out / dst), *extra]) == 2
    err = one_line_error(capsys)
    assert f"{out / dst}" in err and ("No space left" in err or "Permission denied" in err), err
    assert ".tmp" not in err
    assert files_under(out) == []


@pytest.mark.parametrize("failure", [_full_disk, _read_only])
def test_reports_to_a_full_or_read_only_disk(tmp_path, capsys, monkeypatch, ckpt, failure):
    from PIL import Image

    image = tmp_path / "x.png"
    Image.new("RGB", (16, 16), (10, 20, 30)).save(image)
    out = tmp_path / "out"
    out.mkdir()
    _image_folder(tmp_path / "data", per_class=1)
    failure(monkeypatch)
    cases = [
        (["predict", str(ckpt), str(image), "--json", str(out / "p.json")], out / "p.json"),
        (["eval", str(ckpt), "--data", str(tmp_path / "data"), "--split", "val", "--out", str(out)], out),
        (["analyze", str(ckpt), "--images", str(image), "--out", str(out / "a")], out / "a"),
    ]
    for argv, named in cases:
        assert main(argv) == 2
        err = one_line_error(capsys)
        assert str(named) in err and ".tmp" not in err, err
    assert [f for f in files_under(out) if not (out / f).is_dir()] == []


def test_writing_names_the_destination():
    from vitkit.errors import writing

    with pytest.raises(OSError) as e, writing("/x/dst.npz"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert e.value.filename == "/x/dst.npz" and e.value.errno == errno.ENOSPC
    with pytest.raises(PermissionError) as e, writing("/x/dst.npz"):
        raise PermissionError(errno.EACCES, "Permission denied", "/x/.dst.npz.abc.tmp")
    assert e.value.filename == "/x/dst.npz"
    with pytest.raises(FileNotFoundError) as e, writing("/x/dst.npz"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")
    assert e.value.filename == "/x"  # an error that names a real path keeps it


# ---------------------------------------------------------------------------------------------
# fuzzing: random files and mutations of valid ones load or raise a VitkitError, quickly

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(
    max_examples=int(os.environ.get("VITKIT_FUZZ_EXAMPLES", "120")),  # more for a deeper run
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TIME_BOUND_S = 10.0
OUTCOMES: dict[str, dict[str, int]] = {}


def _load_or_vitkit_error(path, kind: str, **kw) -> None:
    t0 = time.perf_counter()
    try:
        vitkit.load_pretrained(path, **kw)
        outcome = "loaded"
    except VitkitError as e:
        assert "\n" not in str(e), str(e)
        outcome = type(e).__name__
    assert time.perf_counter() - t0 < TIME_BOUND_S
    counts = OUTCOMES.setdefault(kind, {})
    counts[outcome] = counts.get(outcome, 0) + 1


@functools.cache
def valid_files() -> dict[str, bytes | str]:
    """Valid files of every format to mutate (a function, not a fixture: hypothesis would print it)."""
    import tempfile

    m = tiny()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        files: dict[str, bytes | str] = {"vitkit": vitkit.save_checkpoint(m, root / "m.safetensors").read_bytes()}
        export_weights(m, root / "t.safetensors", "timm")
        files["timm"] = (root / "t.safetensors").read_bytes()
        export_weights(m, root / "o.npz", "official")
        files["npz"] = (root / "o.npz").read_bytes()
        np.savez_compressed(root / "c.npz", **to_official(m.state_dict(), m.cfg))
        files["npz_deflated"] = (root / "c.npz").read_bytes()
        export_weights(m, root / "hf", "hf")
        files["hf_weights"] = (root / "hf" / "model.safetensors").read_bytes()
        files["hf_config"] = (root / "hf" / "config.json").read_text()
    return files


SUFFIX = {"vitkit": ".safetensors", "timm": ".safetensors", "npz": ".npz", "npz_deflated": ".npz"}
flips = st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=8)


def _mutate(data: bytes, edits, cut: int | None) -> bytes:
    b = bytearray(data)
    for pos, byte in edits:
        b[pos % len(b)] = byte
    return bytes(b[: cut % (len(b) + 1)] if cut is not None else b)


@FUZZ
@given(data=st.binary(max_size=4096), suffix=st.sampled_from([".safetensors", ".npz", ".bin", ".pth"]))
def test_fuzz_random_bytes(tmp_path_factory, data, suffix):
    p = tmp_path_factory.mktemp("r") / f"f{suffix}"
    p.write_bytes(data)
    _load_or_vitkit_error(p, f"random{suffix}")


@FUZZ
@given(kind=st.sampled_from(sorted(SUFFIX)), edits=flips, cut=st.none() | st.integers(0, 1 << 30))
def test_fuzz_byte_flips_and_truncation(tmp_path_factory, kind, edits, cut):
    p = tmp_path_factory.mktemp("m") / f"f{SUFFIX[kind]}"
    p.write_bytes(_mutate(valid_files()[kind], edits, cut))
    _load_or_vitkit_error(p, f"flip-{kind}")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 40), 1 << 40)
    | st.floats(allow_subnormal=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _safetensors_header(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _with_header(header: dict, rest: bytes) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + rest


@FUZZ
@given(
    kind=st.sampled_from(["vitkit", "timm"]),
    pick=st.integers(0, 1 << 20),
    value=json_values,
    in_config=st.booleans(),
)
def test_fuzz_safetensors_header_json(tmp_path_factory, kind, pick, value, in_config):
    """Edit one entry of the safetensors header: a tensor's dtype, shape or offsets, or a metadata
    value, or one field of the vitkit config JSON in the metadata."""
    header, rest = _safetensors_header(valid_files()[kind])
    meta = header["__metadata__"]
    config_key = "config" if kind == "vitkit" else "vitkit_config"
    if in_config:
        cfg = json.loads(meta[config_key])
        keys = sorted(cfg)
        cfg[keys[pick % len(keys)]] = value
        meta[config_key] = json.dumps(cfg)
    else:
        names = sorted(k for k in header if k != "__metadata__")
        name = names[pick % len(names)]
        field = ("dtype", "shape", "data_offsets")[pick % 3]
        header[name][field] = value
    p = tmp_path_factory.mktemp("h") / "f.safetensors"
    p.write_bytes(_with_header(header, rest))
    _load_or_vitkit_error(p, f"header-{kind}")


@FUZZ
@given(
    edits=st.dictionaries(
        st.sampled_from(
            ["num_attention_heads", "hidden_act", "layer_norm_eps", "image_size", "patch_size", "hidden_size", "x"]
        ),
        json_values | st.integers(-3, 70),
        max_size=3,
    ),
    drop=st.sets(st.sampled_from(["num_attention_heads", "hidden_act", "layer_norm_eps", "image_size"])),
    raw=st.none() | st.text(max_size=64),
)
def test_fuzz_hf_config_json(tmp_path_factory, edits, drop, raw):
    folder = tmp_path_factory.mktemp("hf")
    (folder / "model.safetensors").write_bytes(valid_files()["hf_weights"])
    cfg = json.loads(valid_files()["hf_config"])
    cfg.update(edits)
    for k in drop:
        cfg.pop(k, None)
    (folder / "config.json").write_text(raw if raw is not None else json.dumps(cfg))
    _load_or_vitkit_error(folder, "hf-config")


def test_fuzz_outcomes_are_reported():
    """Not a check: prints how the fuzzed cases ended (``pytest -s`` shows it)."""
    for kind, counts in sorted(OUTCOMES.items()):
        print(f"{kind}: {counts}")


def test_atomic_write_names_the_target_and_leaves_no_temporary(tmp_path, monkeypatch):
    import errno as errno_

    from vitkit.files import atomic_write

    target = tmp_path / "out" / "weights.safetensors"
    target.parent.mkdir()
    target.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(errno_.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic_write(target, lambda f: f.write(b"new"))
    assert info.value.filename == str(target) and info.value.errno == errno_.ENOSPC
    assert target.read_bytes() == b"old" and sorted(p.name for p in target.parent.iterdir()) == [target.name]
