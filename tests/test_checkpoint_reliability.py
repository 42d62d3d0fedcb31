"""Weight files from untrusted sources: what a file's metadata can make vitkit print, allocate or
assume, and what vitkit's own files keep through conversion and get as permissions."""

from __future__ import annotations

import os
import stat

import pytest
import torch

import vitkit
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
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


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
