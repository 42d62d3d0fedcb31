"""Issue #14 for weight files, exports, loaders and images: every bad input gets one clear line,
nothing is silently corrupted. Valid models round-trip through every format with identical
outputs, or are refused before anything is written."""

from __future__ import annotations

import io
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoint import CheckpointError, to_official

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
