"""Issue #14, fault injection: a run killed (SIGKILL) in the middle of writing a checkpoint, the
best weights or a line of its log, on in-memory and on streamed data with dropout and drop-path,
resumes to bit-identical weights; a real full disk (a small tmpfs, where this process may mount
one) stops the run in one line with the previous checkpoint whole, and the run resumes once there
is room.

The kills are exact, not timed: a driver process patches the one call that writes (``os.replace``
of a checkpoint's temporary, ``RunFolder.append_metrics``) to leave a half-written file or line
behind and SIGKILL itself, as a power cut or the OOM killer would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from _recipes import changed
from vitkit.files import temporary_target
from vitkit.train.state import latest_loadable, list_checkpoints, load_train_state

TINY = {
    "seed": 5,
    "model": {
        "name": "vit_ti16",
        "overrides": {
            "img_size": 16,
            "patch_size": 4,
            "width": 32,
            "depth": 2,
            "num_heads": 2,
            "mlp_dim": 64,
            "drop_rate": 0.1,
            "drop_path_rate": 0.1,
        },
    },
    "data": {"name": "synthetic", "options": {"img_size": 16, "n": 128}},
    "augment": {"crop": "pad", "pad": 2, "flip": True},
    "optim": {"name": "adamw", "lr": 3e-3, "warmup_steps": 2, "weight_decay": 0.05},
    "train": {"steps": 12, "batch_size": 16, "precision": "fp32"},
    "log": {"log_every": 1, "eval_every": 3, "checkpoint_every": 4, "keep_last": 2, "plot": False},
}

# The driver: arm one fault, then run ``vitkit train`` as the CLI would. FAULT is "ckpt:N" (the
# N-th checkpoint's temporary is cut in half, then the process dies before the rename),
# "renamed:N" (dies right after the N-th checkpoint's rename, before the rotation), "best:N"
# (the N-th best.safetensors, cut) or "log:N" (half of the N-th log line is written).
DRIVER = r"""
import os, signal, sys
from vitkit.cli import main
from vitkit.files import temporary_target
from vitkit.train.runfolder import RunFolder

kind, n = sys.argv[1].split(":")
n = int(n)
seen = {"count": 0}

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def hit():
    seen["count"] += 1
    return seen["count"] == n

real_replace = os.replace

def replace(src, dst, *a, **k):
    target = temporary_target(os.path.basename(src)) or ""
    ours = target.startswith("step_") if kind in ("ckpt", "renamed") else target == "best.safetensors"
    if kind != "log" and ours and hit():
        if kind == "renamed":
            real_replace(src, dst, *a, **k)
        else:
            with open(src, "r+b") as f:
                f.truncate(os.path.getsize(src) // 2)
        die()
    return real_replace(src, dst, *a, **k)

os.replace = replace
real_append = RunFolder.append_metrics

def append(self, record):
    if kind == "log" and hit():
        import json
        line = json.dumps(record) + "\n"
        with open(self.metrics, "a") as f:
            f.write(line[: len(line) // 2])
            f.flush()
        die()
    return real_append(self, record)

RunFolder.append_metrics = append
sys.exit(main(["train", "--config", sys.argv[2], "--out", sys.argv[3]]))
"""

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def recipe_file(tmp_path: Path, data: str, **changes) -> Path:
    tree = changed(TINY, **changes)
    if data == "folder":  # decoded by a DataLoader: the streaming path
        root = tmp_path / "imgs"
        g = torch.Generator().manual_seed(0)
        for c in range(4):
            (root / f"c{c}").mkdir(parents=True, exist_ok=True)
            for i in range(20):
                img = (torch.rand(16, 16, 3, generator=g) * 255).to(torch.uint8).numpy()
                Image.fromarray(img).save(root / f"c{c}" / f"{i}.png")
        tree["data"] = {"name": str(root), "options": {"load_size": 16}}
    path = tmp_path / f"{data}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def train_cli(recipe: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vitkit", "train", "--config", str(recipe), "--out", str(out)]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_train_state(list_checkpoints(run / "checkpoints")[-1]).model_state


def temporaries(run: Path) -> list[str]:
    return [str(p) for p in run.rglob("*") if temporary_target(p.name)]


def logged_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, tuple[Path, dict[str, torch.Tensor], list[int]]]:
    """One uninterrupted run per kind of data."""
    out = {}
    for data in ("memory", "folder"):
        tmp = tmp_path_factory.mktemp(f"ref-{data}")
        recipe = recipe_file(tmp, data)
        assert train_cli(recipe, tmp / "run").returncode == 0
        out[data] = (recipe, final_weights(tmp / "run"), logged_steps(tmp / "run"))
    return out


def _killed_then_resumed(tmp_path: Path, reference, data: str, fault: str) -> None:
    recipe, want, want_steps = reference[data]
    run = tmp_path / "run"
    killed = subprocess.run(
        [sys.executable, "-c", DRIVER, fault, str(recipe), str(run)], env=ENV, capture_output=True, timeout=300
    )
    assert killed.returncode == -9, (fault, killed.returncode, killed.stderr[-2000:])
    if fault.startswith(("ckpt", "best")):
        assert temporaries(run), "the kill left no half-written temporary: the fault did not land mid-write"
    resumed = train_cli(recipe, run)
    assert resumed.returncode == 0, resumed.stderr
    # before the first checkpoint (step 4) there is nothing to resume from: the run starts again
    assert "resuming" in resumed.stderr or fault in ("ckpt:1", "best:1", "log:1")
    got = final_weights(run)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), f"{data} {fault}: resumed weights differ"
    assert logged_steps(run) == want_steps  # the torn or repeated lines are gone, nothing is missing
    assert not temporaries(run), temporaries(run)


@pytest.mark.slow
def test_killed_mid_checkpoint_on_streamed_data_resumes_bit_exact(tmp_path, reference):
    _killed_then_resumed(tmp_path, reference, "folder", "ckpt:2")


@pytest.mark.slow
@pytest.mark.parametrize("data", ["memory", "folder"])
@pytest.mark.parametrize("fault", ["ckpt:1", "ckpt:2", "renamed:2", "best:1", "log:1", "log:7"])
def test_killed_mid_write_resumes_bit_exact(tmp_path, reference, data, fault):
    _killed_then_resumed(tmp_path, reference, data, fault)


def _mount_tmpfs(where: Path, size: int) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.slow
def test_a_full_disk_stops_in_one_line_keeps_the_checkpoint_and_resumes_once_there_is_room(tmp_path, reference):
    """A real ENOSPC, not a patched one: the run folder lives on a tmpfs with room for the config,
    the log and about two checkpoints. keep_last=2 needs three while the newest is written."""
    recipe, want, want_steps = reference["memory"]
    ckpt_bytes = max(p.stat().st_size for p in (recipe.parent / "run" / "checkpoints").iterdir())
    disk = tmp_path / "disk"
    page = 4096
    size = (int(2.5 * ckpt_bytes) + 64 * 1024) // page * page
    if not _mount_tmpfs(disk, size):
        pytest.skip("cannot mount a tmpfs here (needs root, or mount rights in this container)")
    try:
        run = disk / "run"
        full = train_cli(recipe, run)
        lines = [x for x in full.stderr.splitlines() if x.strip()]
        assert full.returncode == 2, full.stderr
        assert len(lines) >= 1 and "No space left on device" in lines[-1] and "is kept" in lines[-1], lines
        assert "Traceback" not in full.stderr
        assert not temporaries(run)  # the failed write left no temporary to fill the disk further
        kept = latest_loadable(run / "checkpoints")
        assert kept is not None and kept.state.step >= 4  # the previous checkpoint is whole
        subprocess.run(["mount", "-o", f"remount,size={8 * size}", str(disk)], check=True, timeout=30)
        resumed = train_cli(recipe, run)
        assert resumed.returncode == 0, resumed.stderr
        assert f"from step {kept.state.step}" in resumed.stderr
        got = final_weights(run)
        assert all(torch.equal(got[k], want[k]) for k in want)
        assert logged_steps(run) == want_steps
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)
