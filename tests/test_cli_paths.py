"""A mistyped path is said before torch loads: the command line checks its path arguments first,
so the one-line error comes at once (checked here as torch never imported, not by the clock)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROGRAM = """
import sys
from vitkit.cli import main
code = main(sys.argv[1:])
print("exit", code, "torch loaded" if "torch" in sys.modules else "torch not loaded")
"""


def _vitkit(tmp_path: Path, *args: str) -> tuple[str, str]:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    return result.stdout.strip(), result.stderr.strip()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["predict", "runs/mine/best.safetensors", "cat.jpg"], "runs/mine/best.safetensors: no such file or folder"),
        (["predict", "w.safetensors", "cat.jpg", "dgo.jpg"], "dgo.jpg: no such image file"),
        (["eval", "./runs/dmeo", "--data", "my_images"], "./runs/dmeo: no such file or folder"),
        (["embed", "w.safetensors", "my_imagse", "--out", "e.safetensors"], "my_imagse: no such folder"),
        (["convert", "model.npz", "out.safetensors"], "model.npz: no such file or folder"),
        (["finetune", "--from", "w.safetensors", "--data", "./my_imgs", "--out", "r"], "./my_imgs: no such data"),
        (["probe", "--train-embeddings", "tr.safetensors", "--test-embeddings", "te.safetensors"], "tr.safetensors"),
    ],
)
def test_a_wrong_path_is_one_line_before_torch_loads(tmp_path, args, said):
    (tmp_path / "w.safetensors").write_bytes(b"")
    (tmp_path / "cat.jpg").write_bytes(b"")
    (tmp_path / "runs").mkdir()
    out, err = _vitkit(tmp_path, *args)
    assert out == "exit 2 torch not loaded"
    assert err == f"vitkit {args[0]}: error: " + err.split("error: ", 1)[1] and said in err and "\n" not in err


def test_a_weights_name_is_not_taken_for_a_path(tmp_path):
    from vitkit.cli.common import _surely_a_path

    for name in ("vit_b16.augreg_in21k_ft_in1k", "imagenet21k/ViT-B_16", "hf-hub:google/vit-base-patch16-224"):
        assert not _surely_a_path(name, (".npz", ".safetensors"))
