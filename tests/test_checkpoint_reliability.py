"""Weight files from untrusted sources: what a file's metadata can make vitkit print, allocate or
assume, and what vitkit's own files keep through conversion and get as permissions."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import stat
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import vitkit
from vitkit.checkpoint.values import printable
from vitkit.cli import main
from vitkit.errors import CheckpointError
from vitkit.files import atomic_write, current_umask, write_text

BASE = dict(img_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3)


def tiny(seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny ViT with random weights everywhere, so that every parameter shows in the outputs."""
    torch.manual_seed(seed)
    m = vitkit.create_model("vit_s16", **{**BASE, **kw}).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.ndim == 1 and p.shape[0] % 2 else 0.0))
    return m


@pytest.fixture
def umask():
    """Set the process umask for one test, and restore it."""
    before = os.umask(0o022)
    os.umask(before)
    yield lambda mask: os.umask(mask)
    os.umask(before)


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ---------------------------------------------------------------------------------------------
# Permissions of written files: as open() gives them.


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077, 0o027])
def test_written_files_honour_the_umask(tmp_path, umask, mask):
    umask(mask)
    assert current_umask() == mask
    write_text(tmp_path / "a.txt", "x")
    atomic_write(tmp_path / "b.bin", lambda f: f.write(b"x"))
    vitkit.save_checkpoint(tiny(), tmp_path / "m.safetensors")
    with open(tmp_path / "plain.txt", "w") as f:  # what a plain open() gives
        f.write("x")
    want = 0o666 & ~mask
    assert mode_of(tmp_path / "plain.txt") == want
    for name in ("a.txt", "b.bin", "m.safetensors"):
        assert mode_of(tmp_path / name) == want, name


def test_a_replaced_file_keeps_its_permissions(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "a.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    write_text(target, "new")
    assert target.read_text() == "new" and mode_of(target) == 0o640


def test_the_umask_is_read_without_being_changed(umask, monkeypatch):
    umask(0o027)
    real_open = open

    def no_proc(path, *a, **kw):  # a system without /proc/self/status
        if str(path) == "/proc/self/status":
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)

    assert current_umask() == 0o027
    monkeypatch.setattr("builtins.open", no_proc)
    assert current_umask() == 0o027
    monkeypatch.undo()
    assert current_umask() == 0o027


# ---------------------------------------------------------------------------------------------
# Helpers: files with chosen metadata.


def rewrite_metadata(path, **changes) -> None:
    """``path`` written again with metadata entries replaced (None removes one); tensors kept."""
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for k, v in changes.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    save_file(tensors, str(path), metadata=meta)


def saved(tmp_path, name="m.safetensors", model=None, **extra) -> Path:
    m = model if model is not None else tiny()
    return vitkit.save_checkpoint(m, tmp_path / name, extra={k: v for k, v in extra.items()})


def image(tmp_path, name="img.png") -> Path:
    from PIL import Image

    p = tmp_path / name
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(p)
    return p


def safe_on_a_terminal(text: str) -> bool:
    """No character a terminal acts on: only printable characters and line ends."""
    return all(c.isprintable() or c == "\n" for c in text)


# ---------------------------------------------------------------------------------------------
# Class names: whatever a file holds, what vitkit prints cannot act on a terminal.

HOSTILE_NAMES = [
    "\x1b[31mred\x1b[0m",  # ANSI colour
    "cat\nvitkit predict: error: forged line",  # a forged line
    "\rdog",  # carriage return: overwrite the line
    "\u202etxt.exe",  # bidi override
    "\x9b2J",  # C1 control sequence introducer
    "bell\x07",
    "tab\tname\x00nul\x7fdel",
    "line\u2028separator\u200bzero-width\u2066isolate",
    "\ud800 lone surrogate",
    "x" * 10_000,
]


def test_hostile_class_names_are_escaped_for_every_reader(tmp_path):
    from vitkit.checkpoint.io import read_safetensors, read_safetensors_metadata
    from vitkit.eval import class_names

    names = HOSTILE_NAMES[:3]
    p = saved(tmp_path, classes=json.dumps(names))
    for meta in (read_safetensors_metadata(p), read_safetensors(p)[1]):
        got = json.loads(meta["classes"])
        assert got == ["\\x1b[31mred\\x1b[0m", "cat\\nvitkit predict: error: forged line", "\\rdog"]
    assert class_names(vitkit.load_pretrained(p)) == got


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_predict_prints_hostile_class_names_escaped(tmp_path, capsys, hostile):
    names = [hostile, "café 日本", "plain"]
    m = tiny()
    with torch.no_grad():
        m.head.bias.copy_(torch.tensor([10.0, 0.0, -10.0]))  # the hostile name is the top class
    p = saved(tmp_path, model=m, classes=json.dumps(names))
    assert main(["predict", str(p), str(image(tmp_path)), "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    assert safe_on_a_terminal(out), ascii(out)
    lines = out.splitlines()
    assert len(lines) == 4  # the image, then one line per class: nothing forged
    top = lines[1].split("%", 1)[1].strip()
    assert top == printable(hostile, 256) and len(top) <= 256
    assert "café 日本" in out  # letters of every script are kept


def test_class_names_not_in_a_list_are_made_printable(tmp_path):
    from vitkit.checkpoint.io import read_safetensors_metadata

    p = saved(tmp_path, classes="\x1b]0;title\x07 not json")
    assert read_safetensors_metadata(p)["classes"] == "\\x1b]0;title\\x07 not json"
    rewrite_metadata(p, classes=json.dumps(["ok", 3, "\x1b[2J"]))
    assert json.loads(read_safetensors_metadata(p)["classes"]) == ["ok", 3, "\\x1b[2J"]


def test_too_many_class_names_is_one_line(tmp_path, monkeypatch, capsys):
    from vitkit.checkpoint import io

    monkeypatch.setattr(io, "MAX_CLASS_NAMES", 5)
    p = saved(tmp_path, classes=json.dumps([f"c{i}" for i in range(6)]))
    with pytest.raises(CheckpointError, match=r"m\.safetensors: metadata 'classes': 6 class names, more than the 5"):
        vitkit.load_pretrained(p)
    assert main(["predict", str(p), str(image(tmp_path))]) == 2
    assert "6 class names" in one_line_error(capsys)


def test_reader_messages_quoting_a_file_are_printable(tmp_path, capsys):
    header = json.dumps({"a": {"dtype": "F32\x1b[31m\nforged", "shape": [1], "data_offsets": [0, 4]}}).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    assert main(["predict", str(p), str(image(tmp_path))]) == 2
    err = one_line_error(capsys)
    assert "bad.safetensors" in err and "\x1b" not in err and safe_on_a_terminal(err)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    assert safe_on_a_terminal(err), ascii(err)
    return err


# ---------------------------------------------------------------------------------------------
# Compressed members: bounded before anything is inflated, in every zip format read.

BOMB = 200 << 20  # 200 MiB of zeros: about 200 KB deflated


def zeros_member(zf: zipfile.ZipFile, name: str, nbytes: int, method=zipfile.ZIP_DEFLATED, head: bytes = b"") -> None:
    """A member of ``head`` then zeros, ``nbytes`` in all, written in chunks (never held whole)."""
    info = zipfile.ZipInfo(name)
    info.compress_type = method
    with zf.open(info, "w", force_zip64=True) as f:
        f.write(head)
        chunk = bytes(1 << 22)
        left = nbytes - len(head)
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)


def torch_file_with(tmp_path, name: str, replace: dict[str, tuple[int, int]]) -> Path:
    """A PyTorch zip file of a tiny model's state dict with records replaced by zeros:
    ``{suffix of the record's name: (bytes, zip method)}``."""
    ok = tmp_path / "ok.bin"
    torch.save(tiny().state_dict(), ok)
    out = tmp_path / name
    with zipfile.ZipFile(ok) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            hit = next((v for k, v in replace.items() if info.filename.endswith(k)), None)
            if hit is None:
                dst.writestr(info, src.read(info))
            else:
                zeros_member(dst, info.filename, *hit)
    return out


def refuses_fast(path, match) -> None:
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


@pytest.mark.parametrize("record", ["/data/0", "/data.pkl"])
def test_torch_zip_bomb_is_refused_before_inflating(tmp_path, record):
    p = torch_file_with(tmp_path, "bomb.bin", {record: (BOMB, zipfile.ZIP_DEFLATED)})
    assert p.stat().st_size < 1 << 20
    refuses_fast(p, rf"bomb\.bin: record '[^']*{re.escape(record)}' would unpack to 200\.0 MiB from 0\.2 MiB")


def test_torch_zip_of_many_members_is_bounded_in_all(tmp_path, monkeypatch):
    from vitkit.checkpoint import io

    monkeypatch.setattr(io, "ZIP_MIN_BOUND", 1 << 20)  # a small file may unpack to 1 MiB in all
    monkeypatch.setattr(io, "ZIP_MAX_RATIO", 2)  # ... or twice its size
    p = torch_file_with(tmp_path, "many.bin", {f"/data/{i}": (600 << 10, zipfile.ZIP_DEFLATED) for i in range(4)})
    refuses_fast(p, r"many\.bin: record '[^']*/data/\d' would unpack to 0\.6 MiB \(2\.\d MiB for all records read\)")


def test_torch_zip_with_another_compression_is_refused(tmp_path):
    p = torch_file_with(tmp_path, "bz.bin", {"/data/0": (4096, zipfile.ZIP_BZIP2)})
    with pytest.raises(CheckpointError, match=r"bz\.bin: record '[^']*/data/0' is compressed with zip method 12"):
        vitkit.load_pretrained(p)


def test_torch_files_as_written_load(tmp_path):
    m = tiny()
    torch.save(m.state_dict(), tmp_path / "zip.bin")
    torch.save(m.state_dict(), tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    deflated = tmp_path / "deflated.bin"  # a zip tool's recompression: deflated, within the bounds
    with zipfile.ZipFile(tmp_path / "zip.bin") as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    for name in ("zip.bin", "legacy.pth", "deflated.bin"):
        back = vitkit.load_pretrained(tmp_path / name, num_heads=2, act="gelu_tanh")
        assert torch.equal(outputs(back), outputs(m)), name


def test_npz_member_bomb_is_refused_by_its_ratio(tmp_path):
    from vitkit.checkpoint import to_official

    m = tiny()
    arrays = to_official(m.state_dict(), m.cfg)
    del arrays["head/kernel"]
    p = tmp_path / "bomb.npz"
    with zipfile.ZipFile(p, "w") as zf:
        for k, v in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, v, allow_pickle=False)
            zf.writestr(f"{k}.npy", buf.getvalue())
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (BOMB // 4,)})
        zeros_member(zf, "head/kernel.npy", BOMB + len(header.getvalue()), head=header.getvalue())
    refuses_fast(p, r"bomb\.npz: array 'head/kernel' would unpack to 200\.0 MiB from 0\.2 MiB")


def outputs(m: torch.nn.Module, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    x = torch.randn(2, m.cfg.in_chans, *m.cfg.img_size)
    with torch.no_grad():
        return m(x)


# ---------------------------------------------------------------------------------------------
# Preprocessing a file records: every value within what real weights use.

GOOD_PRE = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "img_size": [16, 16]}

BAD_PRE = [
    ("crop_pct", 1e-9),
    ("crop_pct", 0),
    ("crop_pct", -0.875),
    ("crop_pct", float("nan")),
    ("crop_pct", float("inf")),
    ("crop_pct", 1.5),
    ("crop_pct", 0.1),
    ("crop_pct", "0.9"),
    ("crop_pct", True),
    ("mean", [123.675, 116.28, 103.53]),  # the 0-255 scale
    ("mean", [float("nan"), 0.5, 0.5]),
    ("mean", [0.5, 0.5]),
    ("std", [0.0, 0.5, 0.5]),
    ("std", [1e-9, 0.5, 0.5]),
    ("std", [58.395, 57.12, 57.375]),
    ("std", [-0.5, 0.5, 0.5]),
    ("std", [float("inf"), 0.5, 0.5]),
    ("img_size", [0, 16]),
    ("img_size", [100_000, 100_000]),
    ("img_size", [16]),
    ("img_size", "16"),
    ("interpolation", "lanczos"),
    ("interpolation", 2),
]


@pytest.mark.parametrize(("key", "value"), BAD_PRE, ids=[f"{k}={v!r}" for k, v in BAD_PRE])
def test_preprocessing_out_of_bounds_is_refused_naming_file_and_key(tmp_path, capsys, key, value):
    p = saved(tmp_path)
    rewrite_metadata(p, preprocessing=json.dumps({**GOOD_PRE, key: value}))
    where = rf"m\.safetensors: vitkit metadata: preprocessing\['{key}'\]"
    with pytest.raises(CheckpointError, match=where):
        vitkit.load_pretrained(p)
    assert main(["predict", str(p), str(image(tmp_path))]) == 2
    assert f"preprocessing['{key}']" in one_line_error(capsys)


def test_preprocessing_of_a_timm_file_vitkit_wrote_is_bounded(tmp_path):
    from vitkit.checkpoint.load import TIMM_PREPROCESSING_KEY
    from vitkit.export import export_weights

    p = tmp_path / "t.safetensors"
    export_weights(tiny(), p, "timm")
    rewrite_metadata(p, **{TIMM_PREPROCESSING_KEY: json.dumps({**GOOD_PRE, "crop_pct": 1e-9})})
    with pytest.raises(CheckpointError, match=r"t\.safetensors: vitkit metadata: preprocessing\['crop_pct'\]"):
        vitkit.load_pretrained(p)


@pytest.mark.parametrize(
    "pre",
    [
        {"crop_pct": 0.875, "interpolation": "bicubic"},
        {"crop_pct": 0.5},
        {"crop_pct": 1.0},
        {"mean": [0.0, 0.0, 0.0], "std": [1 / 255] * 3},  # raw 0-255 values
        {"mean": [0.5] * 3, "std": [0.5] * 3, "img_size": [384, 384]},
    ],
)
def test_real_preprocessing_values_load(tmp_path, pre):
    p = saved(tmp_path)
    rewrite_metadata(p, preprocessing=json.dumps({**GOOD_PRE, **pre}))
    got = vitkit.load_pretrained(p).preprocessing
    assert got.crop_pct == pre.get("crop_pct", 1.0) and tuple(got.std) == tuple(pre.get("std", GOOD_PRE["std"]))


# ---------------------------------------------------------------------------------------------
# Nesting: metadata and JSON nested thousands deep is refused in one line, not a RecursionError.

DEEP = "[" * 5000 + "]" * 5000
DEEP_OBJECT = '{"a":' * 3000 + "1" + "}" * 3000


@pytest.mark.parametrize("key", ["config", "preprocessing", "classes", "train_state", "vitkit_crc32", "other"])
@pytest.mark.parametrize("deep", [DEEP, DEEP_OBJECT], ids=["lists", "objects"])
def test_deep_metadata_is_one_line(tmp_path, capsys, key, deep):
    from vitkit.checkpoint.io import read_safetensors, read_safetensors_metadata

    p = saved(tmp_path)
    rewrite_metadata(p, **{key: deep})
    message = rf"m\.safetensors: metadata '{key}' is nested \d+ levels deep, more than the 64 vitkit reads"
    for read in (vitkit.load_pretrained, read_safetensors, read_safetensors_metadata):
        with pytest.raises(CheckpointError, match=message):
            read(p)
    assert main(["predict", str(p), str(image(tmp_path))]) == 2
    assert "levels deep" in one_line_error(capsys)


def test_deep_training_state_is_one_line_on_resume(tmp_path):
    from vitkit.train.state import load_train_state

    p = saved(tmp_path, train_state=DEEP)
    with pytest.raises(CheckpointError, match=r"metadata 'train_state' is nested 5000 levels deep"):
        load_train_state(p)


def test_deep_json_elsewhere_is_one_line(tmp_path):
    from vitkit.export import export_weights

    hf = tmp_path / "hf"
    export_weights(tiny(act="gelu"), hf, "hf")
    (hf / "config.json").write_text('{"a": ' + DEEP + "}")
    with pytest.raises(CheckpointError, match=r"config\.json: the JSON is nested 5001 levels deep"):
        vitkit.load_pretrained(hf)
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + "-" * 5000 + "1, }"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    p = tmp_path / "deep.npz"
    with zipfile.ZipFile(p, "w") as zf:
        npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1")
        zf.writestr("embedding/kernel.npy", npy + bytes(4))
    with pytest.raises(CheckpointError, match=r"deep\.npz: not a readable \.npz file"):
        vitkit.load_pretrained(p)


def test_reasonable_nesting_loads(tmp_path):
    nested = json.dumps({"a": [[[{"b": [1, 2, {"c": "[" * 100 + "{" * 100}]}]]]})  # brackets in strings do not count
    p = saved(tmp_path, other=nested)
    assert vitkit.load_pretrained(p).load_report.metadata["other"] == nested


# ---------------------------------------------------------------------------------------------
# Values a file does not record: given, or assumed with a warning that says how to give them.


def timm_file(tmp_path, model, name="timm.safetensors") -> Path:
    """``model`` as timm saves a state dict: tensors only, no config."""
    from vitkit.checkpoint import to_timm

    p = tmp_path / name
    save_file({k: v.contiguous() for k, v in to_timm(model.state_dict()).items()}, str(p))
    return p


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "vitkit"]


WIDE = dict(width=128, num_heads=4, mlp_dim=256, act="gelu")  # head dimension 32, not 64


def test_timm_heads_are_assumed_aloud_and_can_be_given(tmp_path, caplog):
    m = tiny(**WIDE)
    p = timm_file(tmp_path, m)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        guessed = vitkit.load_pretrained(p)
    (line,) = warnings_of(caplog)
    listed = "num_heads, act, ln_eps or classifier"
    assert line.startswith(f"warning: {p}: the file does not record {listed}; assumed num_heads=2")
    assert "classifier='token' (timm's default, global_pool='token': the class token)" in line
    assert "pass num_heads=..., act=..., ln_eps=..., classifier=... to load_pretrained" in line
    assert "--num-heads" in line
    assert "\n" not in line
    assert guessed.cfg.num_heads == 2
    assert guessed.load_report.assumed == {"num_heads": 2, "act": "gelu", "ln_eps": 1e-6, "classifier": "token"}
    assert not torch.allclose(outputs(guessed), outputs(m), atol=1e-4)  # the guess changes the outputs

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        given = vitkit.load_pretrained(p, num_heads=4, act="gelu", ln_eps=1e-6, classifier="token")
    assert warnings_of(caplog) == [] and given.load_report.assumed == {}
    assert torch.equal(outputs(given), outputs(m))


@pytest.mark.parametrize(
    ("kw", "heads", "why"),
    [
        (dict(width=384, num_heads=6, mlp_dim=64), 6, "ViT-S's, the standard ViT of width 384"),
        (dict(width=96, num_heads=3, mlp_dim=64), 1, "1 head of 96 channels: width 96 is not a multiple of 64"),
        (dict(width=256, num_heads=8, mlp_dim=64), 4, "width 256 in heads of 64 channels"),
    ],
)
def test_each_assumed_value_says_its_grounds(tmp_path, caplog, kw, heads, why):
    p = timm_file(tmp_path, tiny(depth=1, **kw))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        model = vitkit.load_pretrained(p, act="gelu_tanh")  # given: not assumed
    (line,) = warnings_of(caplog)
    assert f"num_heads={heads} ({why})" in line and "act" not in line.split(";")[0]
    assert model.cfg.num_heads == heads and "act" not in model.load_report.assumed


def test_a_model_name_gives_the_heads(tmp_path, caplog):
    m = vitkit.create_model("vit_ti16", img_size=32, depth=12, num_classes=2)  # 3 heads of 64 channels
    p = timm_file(tmp_path, m)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        model = vitkit.load_pretrained(p, name="vit_ti16")
    (line,) = warnings_of(caplog)
    assert "num_heads" not in line and "act='gelu'" in line and model.cfg.num_heads == 3


def test_hf_weights_without_config_json_say_what_is_assumed(tmp_path, caplog):
    from vitkit.checkpoint import to_hf

    m = tiny(act="gelu")
    p = tmp_path / "weights.safetensors"
    save_file(to_hf(m.state_dict(), m.cfg), str(p))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        model = vitkit.load_pretrained(p, num_heads=2)
    (line,) = warnings_of(caplog)
    assert "act='gelu' (Hugging Face's default), ln_eps=1e-12 (Hugging Face's default)" in line
    assert model.load_report.assumed == {"act": "gelu", "ln_eps": 1e-12}


def test_files_that_record_everything_load_without_a_warning(tmp_path, caplog):
    from vitkit.export import export_weights

    m = tiny(**WIDE)
    for to, name in (("vitkit", "v.safetensors"), ("timm", "t.safetensors"), ("official", "o.npz"), ("hf", "hf")):
        if to in ("official", "hf"):
            m = tiny(**{**WIDE, "act": "gelu_tanh" if to == "official" else "gelu"})
        export_weights(m, tmp_path / name, to)
        with caplog.at_level(logging.WARNING, logger="vitkit"):
            back = vitkit.load_pretrained(tmp_path / name)
        assert warnings_of(caplog) == [] and back.load_report.assumed == {}, to
        assert back.cfg.num_heads == 4 and torch.allclose(outputs(back), outputs(m), atol=1e-5), to


def test_heads_given_against_the_file_are_refused(tmp_path):
    p = saved(tmp_path, model=tiny(**WIDE))
    with pytest.raises(
        CheckpointError, match=r"m\.safetensors: the file records num_heads=4, but num_heads=2 was given"
    ):
        vitkit.load_pretrained(p, num_heads=2)


def test_cli_warns_and_convert_records_given_values(tmp_path, capsys):
    m = tiny(**WIDE)
    p = timm_file(tmp_path, m)
    img = image(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "vitkit", "predict", str(p), str(img)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    (line,) = run.stderr.splitlines()  # the command line prints the warning as one line
    assert line.startswith("warning: ") and "assumed num_heads=2" in line and "vitkit convert" in line
    assert safe_on_a_terminal(line)
    out = tmp_path / "recorded.safetensors"
    argv = ["convert", str(p), str(out), "--num-heads", "4", "--act", "gelu", "--ln-eps", "1e-6"]
    assert main(argv) == 0
    back = vitkit.load_pretrained(out)
    assert back.cfg.num_heads == 4 and back.load_report.assumed == {} and torch.equal(outputs(back), outputs(m))


# ---------------------------------------------------------------------------------------------
# Conversion to vitkit keeps every metadata field the model still fits.


def metadata_of(path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def rich_checkpoint(tmp_path) -> tuple[torch.nn.Module, Path]:
    """A vitkit file with class names, training provenance, a preprocessing of its own and a
    config away from the defaults."""
    from vitkit.preprocessing import Preprocessing

    m = tiny(act="gelu", ln_eps=1e-5, classifier="gap", pos_embed="sincos2d")
    pre = Preprocessing(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), img_size=(16, 16),
                        interpolation="bicubic", crop_pct=0.875)  # fmt: skip
    extra = {"classes": json.dumps(["tench", "café 日本", "goldfish"]), "step": "1200", "top1": "0.812500",
             "recipe": "model:\n  name: vit_s16\n", "note": "anything a writer added"}  # fmt: skip
    return m, vitkit.save_checkpoint(m, tmp_path / "a.safetensors", preprocessing=pre, extra=extra)


@pytest.mark.parametrize("how", ["cli", "api"])
def test_vitkit_to_vitkit_keeps_every_field(tmp_path, how):
    from vitkit.export import export_weights

    m, a = rich_checkpoint(tmp_path)
    b = tmp_path / "b.safetensors"
    if how == "cli":
        assert main(["convert", str(a), str(b)]) == 0
    else:
        export_weights(vitkit.load_pretrained(a), b, "vitkit")
    assert metadata_of(b) == metadata_of(a)
    back = vitkit.load_pretrained(b)
    assert back.cfg == m.cfg and back.preprocessing == vitkit.load_pretrained(a).preprocessing
    assert back.preprocessing.crop_pct == 0.875 and back.preprocessing.interpolation == "bicubic"
    assert torch.equal(outputs(back), outputs(m))
    from vitkit.eval import class_names

    assert class_names(back) == ["tench", "café 日本", "goldfish"]


def test_conversion_drops_what_no_longer_fits(tmp_path):
    _, a = rich_checkpoint(tmp_path)
    b = tmp_path / "b.safetensors"
    assert main(["convert", str(a), str(b), "--num-classes", "5"]) == 0  # a new head: the names are not its
    meta = metadata_of(b)
    assert "classes" not in meta and meta["step"] == "1200" and meta["note"] == "anything a writer added"
    c = tmp_path / "c.safetensors"
    assert main(["convert", str(a), str(c), "--img-size", "32"]) == 0  # config and preprocessing follow the model
    back = vitkit.load_pretrained(c)
    assert back.cfg.img_size == (32, 32) and back.preprocessing.img_size == (32, 32)
    assert back.preprocessing.crop_pct == 0.875 and json.loads(metadata_of(c)["classes"])[0] == "tench"


def test_training_checkpoint_converts_to_weights_with_their_metadata(tmp_path):
    """A training checkpoint's optimiser state stays behind, and with it the entry describing it."""
    from vitkit.checkpoint.io import read_safetensors, write_safetensors
    from vitkit.train.state import load_train_state

    _, a = rich_checkpoint(tmp_path)
    tensors, meta = read_safetensors(a)
    tensors["__train__/rng/torch"] = torch.get_rng_state()
    write_safetensors(a, tensors, {**meta, "train_state": json.dumps({"step": 1200})})
    b = tmp_path / "b.safetensors"
    assert main(["convert", str(a), str(b)]) == 0
    meta_b = metadata_of(b)
    assert "train_state" not in meta_b and meta_b["classes"] == meta["classes"] and meta_b["recipe"] == meta["recipe"]
    assert not any(k.startswith("__train__/") for k in read_safetensors(b)[0])
    with pytest.raises(CheckpointError, match="without training state"):
        load_train_state(b)


def test_hostile_names_stay_escaped_through_conversion(tmp_path):
    p = saved(tmp_path, classes=json.dumps(HOSTILE_NAMES[:3]))
    b = tmp_path / "b.safetensors"
    assert main(["convert", str(p), str(b)]) == 0
    assert all(safe_on_a_terminal(n) and "\n" not in n for n in json.loads(metadata_of(b)["classes"]))


def test_image_size_without_a_position_table_is_assumed_aloud(tmp_path, caplog):
    from vitkit.checkpoint import to_timm

    m = tiny(pos_embed="none", act="gelu", img_size=32)
    p = tmp_path / "nopos.safetensors"
    save_file({k: v.contiguous() for k, v in to_timm(m.state_dict()).items()}, str(p))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        guessed = vitkit.load_pretrained(p, num_heads=2, act="gelu", ln_eps=1e-6, classifier="token")
    (line,) = warnings_of(caplog)
    assert "does not record img_size; assumed img_size=224x224 (no position table shows it)" in line
    assert "--img-size" in line and guessed.cfg.img_size == (224, 224)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        given = vitkit.load_pretrained(p, num_heads=2, act="gelu", ln_eps=1e-6, classifier="token", img_size=32)
    assert warnings_of(caplog) == [] and given.cfg.img_size == (32, 32) and torch.equal(outputs(given), outputs(m))
