"""Bad input gets a clear error that names what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoint import CheckpointError
from vitkit.cli import main


def test_unknown_model_suggests_close_names():
    from vitkit.errors import UsageError

    with pytest.raises(UsageError, match=r"unknown model 'vit_bb16'.*vit_b16"):  # a ValueError too
        vitkit.create_model("vit_bb16")
    with pytest.raises(UsageError, match="pass features_only=True too"):
        vitkit.create_model("vit_ti16", out_indices=[1])


def test_unknown_override_is_named():
    with pytest.raises(ValueError, match="hidden_size"):
        vitkit.create_model("vit_ti16", hidden_size=3)


def test_wrong_channel_count():
    m = vitkit.create_model("vit_ti16", img_size=32, depth=1)
    with pytest.raises(ValueError, match="expected 3 input channels, got 1"):
        m(torch.zeros(1, 1, 32, 32))


def test_size_not_divisible_by_patch():
    with pytest.raises(ValueError, match=r"30x30 is not divisible by the patch size 16x16"):
        vitkit.create_model("vit_ti16", img_size=30)
    m = vitkit.create_model("vit_ti16", img_size=32, depth=1)
    with pytest.raises(ValueError, match=r"input size 40x40 is not divisible"):
        m(torch.zeros(1, 3, 40, 40))


def test_other_size_without_dynamic_is_explained():
    m = vitkit.create_model("vit_ti16", img_size=32, depth=1)
    with pytest.raises(ValueError, match=r"differs from the model's img_size 32x32"):
        m(torch.zeros(1, 3, 48, 48))


def test_truncated_npz(tmp_path, fixtures):
    src = (fixtures / "vit_tiny_token" / "params_prelinen.npz").read_bytes()
    bad = tmp_path / "cut.npz"
    bad.write_bytes(src[: len(src) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.npz: not a readable \.npz"):
        vitkit.load_pretrained(bad)


def test_truncated_safetensors(tmp_path):
    m = vitkit.create_model("vit_ti16", img_size=32, depth=1)
    path = vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=r"m\.safetensors: not a readable safetensors"):
        vitkit.load_pretrained(path)


def test_a_flipped_bit_in_a_weight_is_caught_by_its_crc32(tmp_path):
    """safetensors checks headers and sizes, not values: vitkit writes each tensor's CRC32 into
    the metadata and checks it on reading, so a changed value is named, not loaded."""
    import json

    from safetensors.torch import save_file

    from vitkit.checkpoint.io import CHECKSUM_KEY, read_safetensors, tensor_crc32

    m = vitkit.create_model("vit_ti16", img_size=32, depth=1)
    path = vitkit.save_checkpoint(m, tmp_path / "m.safetensors")
    tensors, meta = read_safetensors(path)
    sums = json.loads(meta[CHECKSUM_KEY])
    assert sums.keys() == tensors.keys() and sums["head.weight"] == tensor_crc32(m.state_dict()["head.weight"])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # inside the last tensor's bytes: the file still parses
    (tmp_path / "flip.safetensors").write_bytes(data)
    with pytest.raises(CheckpointError, match=r"flip\.safetensors: tensor '.+' does not match the CRC32 written"):
        vitkit.load_pretrained(tmp_path / "flip.safetensors")
    # a table that leaves a tensor out is refused; another writer's file (no table) reads unchecked
    save_file(tensors, tmp_path / "short.safetensors", {**meta, CHECKSUM_KEY: json.dumps({"head.weight": "0"})})
    with pytest.raises(CheckpointError, match=r"short\.safetensors: tensors and vitkit_crc32 table disagree"):
        read_safetensors(tmp_path / "short.safetensors")
    save_file(tensors, tmp_path / "plain.safetensors", {k: v for k, v in meta.items() if k != CHECKSUM_KEY})
    assert vitkit.load_pretrained(tmp_path / "plain.safetensors").cfg.depth == 1


def test_foreign_file(tmp_path):
    p = tmp_path / "notes.safetensors"
    p.write_text("hello")
    with pytest.raises(CheckpointError, match="notes.safetensors"):
        vitkit.load_pretrained(p)
    q = tmp_path / "weights.h5"
    q.write_text("x")
    with pytest.raises(CheckpointError, match=r"unknown weight format '\.h5'"):
        vitkit.load_pretrained(q)


def test_foreign_npz(tmp_path):
    p = tmp_path / "other.npz"
    np.savez(p, foo=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"other\.npz.*embedding/kernel"):
        vitkit.load_pretrained(p)


def test_pickled_npz_is_refused(tmp_path):
    p = tmp_path / "pickle.npz"
    np.savez(p, obj=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="pickle.npz"):
        vitkit.load_pretrained(p)


def test_missing_file():
    with pytest.raises(CheckpointError, match="no such file"):
        vitkit.load_pretrained("/nonexistent/model.npz")


def test_unmapped_arrays_are_listed(tmp_path, fixtures):
    arrays = dict(np.load(fixtures / "vit_tiny_token" / "params_prelinen.npz"))
    arrays["Transformer/extra/kernel"] = np.zeros(2, np.float32)
    p = tmp_path / "extra.npz"
    np.savez(p, **arrays)
    with pytest.raises(CheckpointError, match="Transformer/extra/kernel"):
        vitkit.load_pretrained(p)


def test_missing_keys_are_listed(tmp_path):
    from safetensors.torch import save_file

    m = vitkit.create_model("vit_ti16", img_size=32, depth=2)
    sd = {k: v for k, v in m.state_dict().items() if not k.startswith("blocks.1.mlp")}
    p = tmp_path / "timm.safetensors"
    save_file(sd, p)
    with pytest.raises(CheckpointError, match=r"missing \['blocks\.1\.mlp"):
        vitkit.load_pretrained(p)


def test_name_mismatch(fixtures):
    with pytest.raises(CheckpointError, match=r"do not fit vit_b16: width 32 in the file vs 768"):
        vitkit.load_pretrained(fixtures / "vit_tiny_token" / "params_prelinen.npz", name="vit_b16")


def test_cli_reports_one_line(capsys, tmp_path):
    bad = tmp_path / "broken.npz"
    bad.write_bytes(b"PK\x03\x04garbage")
    assert main(["convert", str(bad), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.npz" in err[0] and "Traceback" not in err[0]
