"""An adversarial pass as a script: careless and hostile inputs to every command, each run as a
user would (``python -m vitkit ...`` in a fresh process, a time limit), and the outcome counted:
success where success is right, one clear error line where an error is right, or a traceback, a
hang (over the limit) or a wrong success.

    python benchmarks/adversarial.py [--json benchmarks/out/adversarial.json] [--timeout 90]

    python benchmarks/adversarial.py --only embed --only "labels files"   # some groups only

The cases follow classes of failure (hangs, silent corruption, resume and faults, small files
that cost a lot, validation at the door, run folders, the download cache, values without bounds,
hostile recipes and files, wrong data; then embed and embeddings files, labels files, exports and
their reload, hub names and caches, the reproduce runner, and deep input and absent devices:
JSON nested thousands deep, control characters in recipes, absent devices, an emptied saved
recipe, damaged shards) and share one tiny model (and a multi-label one, trained on a labels file,
for the exports). The download cases serve files from a local HTTP server on 127.0.0.1; the
reproduce cases run one smoke experiment once (about 25 s). A real full disk needs a small tmpfs
(root with mount rights); without one that case is left out and said so. Run it alone: each case
starts torch (a few seconds), 229 cases in all (and the full disk).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import vitkit

T = (
    "--set model.overrides.img_size=32 --set model.overrides.width=32 --set model.overrides.depth=2 "
    "--set model.overrides.num_heads=2 --set model.overrides.mlp_dim=64 --eval-every 0 --set train.patch_drop=0"
)
TRAIN = f"train --data synthetic {T} --batch-size 16 --steps 2"
TRAIN4 = TRAIN.replace("--steps 2", "--steps 4")
TRAIN8 = TRAIN.replace("--steps 2", "--steps 8")
ERROR_LINE = re.compile(r"^vitkit( \w+)?: (error|interrupted)")


@dataclass
class Case:
    group: str
    what: str
    argv: str  # formatted with the workspace's paths (d: the workspace)
    expect: str = "error"  # "error": one line; "ok": rc 0 (and ``check`` holds)
    check: Callable[[Path], str | None] | None = None  # what is wrong after an "ok", or None
    before: Callable[[Path], None] | None = None
    after: Callable[[Path], None] | None = None
    env: dict[str, str] | None = None  # added to the environment (formatted like argv)
    output: Callable[[str], str | None] | None = None  # what is wrong in stdout + stderr, or None


def _same_config(a: str, b: str, keys: tuple[str, ...]) -> Callable[[Path], str | None]:
    def check(d: Path) -> str | None:
        if not (d / b).exists():
            return None  # refused in one line: the format cannot hold it
        x, y = vitkit.load_pretrained(d / a).cfg, vitkit.load_pretrained(d / b).cfg
        lost = [k for k in keys if getattr(x, k) != getattr(y, k)]
        return f"lost {lost}" if lost else None

    return check


def _finite(path: str) -> Callable[[Path], str | None]:
    def check(d: Path) -> str | None:
        p = d / path
        if not p.exists():
            return None
        bad = [k for k, v in load_file(str(p)).items() if v.is_floating_point() and not torch.isfinite(v).all()]
        return f"{p.name} holds non-finite {bad[:2]}" if bad else None

    return check


def _bytes_mutated(d: Path, name: str, out: str, cut: float | None = None, flip: int | None = None) -> None:
    data = bytearray((d / name).read_bytes())
    if cut is not None:
        data = data[: int(len(data) * cut)]
    if flip is not None:
        data[flip] ^= 0xFF
    (d / out).write_bytes(bytes(data))


def workspace(d: Path) -> None:
    """The files the cases use: a tiny run and exports of it, images, folders, hostile files."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "vitkit", *shlex.split(TRAIN)]
    extra = "--set model.overrides.pos_embed=sincos2d --set model.overrides.classifier=gap"
    subprocess.run([*base, *shlex.split(extra), "--out", str(d / "r")], check=True, env=env, capture_output=True)
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)
    Image.fromarray(photo).save(d / "img.png")
    Image.fromarray(photo).save(d / "img.jpg", quality=90)
    _bytes_mutated(d, "img.jpg", "truncated.jpg", cut=0.4)
    Image.new("L", (20000, 20000)).save(d / "bomb.png")  # 400 Mpx: over Pillow's bomb limit
    (d / "text.png").write_text("not an image")
    for name, n, classes in (("six", 3, 2), ("eighty", 40, 2)):
        for c in range(classes):
            (d / name / f"c{c}").mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(d / name / f"c{c}/{i}.png")
    for c in range(2):
        (d / "junk" / f"c{c}").mkdir(parents=True)
        for i in range(8):
            (d / "junk" / f"c{c}/{i}.png").write_bytes(rng.bytes(300))
    for split in ("train", "val"):
        for c in range(2):
            (d / "badval" / split / f"c{c}").mkdir(parents=True)
            for i in range(4):
                target = d / "badval" / split / f"c{c}/{i}.png"
                if split == "val":
                    target.write_bytes(b"broken")
                else:
                    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(target)
    tensors, meta = load_file(str(d / "r/best.safetensors")), None
    from safetensors import safe_open

    with safe_open(str(d / "r/best.safetensors"), framework="pt") as f:
        meta = f.metadata()
    nan = dict(tensors)
    nan["blocks.0.mlp.fc1.weight"] = torch.full_like(nan["blocks.0.mlp.fc1.weight"], float("nan"))
    save_file(nan, str(d / "nan.safetensors"), metadata=meta)
    big = dict(tensors)
    big["head.weight"] = torch.full_like(big["head.weight"], 3e38)  # finite, but its products are not
    save_file(big, str(d / "overflow.safetensors"), metadata=meta)
    _bytes_mutated(d, "r/best.safetensors", "cut.safetensors", cut=0.5)
    _bytes_mutated(d, "r/best.safetensors", "flip.safetensors", flip=20)
    bomb = zipfile.ZipFile(d / "bomb.npz", "w", zipfile.ZIP_DEFLATED)  # ~1 MB holding 1 GiB
    with bomb as z, z.open("unused_name.npy", "w", force_zip64=True) as f:
        f.write(b"\x93NUMPY")
        chunk = bytes(1 << 24)
        for _ in range(64):
            f.write(chunk)
    (d / "a_file").write_text("x")
    hf = d / "hf"
    from vitkit.export import export_weights

    plain = vitkit.create_model("vit_s16", img_size=32, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64)
    export_weights(plain, hf, to="hf")
    (hf / "config.json").unlink()
    three = vitkit.create_model("vit_s16", img_size=32, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64)
    vitkit.save_checkpoint(three.__class__(three.cfg.replace(num_classes=3)), d / "three.safetensors")
    (d / "bad.yaml").write_text("train: {steps: [1, 2}\n")
    (d / "list.yaml").write_text("- a\n- b\n")
    hostile_files(d, tensors, meta)
    more_files(d)


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)


def hostile_files(d: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    """Recipes, weight files, images and folders of the later classes."""
    (d / "laughs.yaml").write_text(LAUGHS)
    (d / "deep.yaml").write_text("train: {steps: " + "[" * 5000 + "]" * 5000 + "}\n")
    (d / "python.yaml").write_text("train: !!python/object/apply:os.system ['echo owned']\n")
    (d / "latin1.yaml").write_bytes("description: caf\xe9\n".encode("latin-1"))
    # folders that are not run folders
    (d / "notes").mkdir()
    (d / "notes" / "thesis.tex").write_text("years of work")
    # weight files with hostile metadata
    names = [f"class_{i}" for i in range(10)]  # the synthetic data's, which the tiny run learnt
    for name, change in (
        ("escape.safetensors", {"classes": ["\x1b[2J\x1b[31mvitkit: error: forged", *names[1:]]}),
        ("crop.safetensors", {"crop_pct": 1e-9}),
        ("reversed.safetensors", {"classes": names[::-1]}),
    ):
        save_file(tensors, str(d / name), metadata=_with_meta(meta, change))
    # a .bin of a few MB that inflates to 1 GiB
    with zipfile.ZipFile(d / "bomb.bin", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        with z.open("archive/data/0", "w", force_zip64=True) as f:
            chunk = bytes(1 << 24)
            for _ in range(64):
                f.write(chunk)
    # images deeper than 8 bits, and folders of one class, of other class names
    grey16 = np.full((32, 32), 32768, dtype=np.uint16)
    Image.fromarray(grey16).save(d / "grey16.png")
    Image.fromarray(np.full((32, 32), 0.5, dtype=np.float32)).save(d / "greyf.tiff")
    rng = np.random.default_rng(1)
    (d / "one" / "only").mkdir(parents=True)
    for i in range(20):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(d / "one" / "only" / f"{i}.png")
    for c in ("dog", "cat"):
        (d / "renamed" / "val" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
                d / "renamed" / "val" / c / f"{i}.png"
            )
    # files a local server hands out: an HTML page, a body cut short, a file behind a query string
    web = d / "web"
    web.mkdir()
    (web / "page.safetensors").write_text("<!DOCTYPE html><html><body>Sign in to continue</body></html>")
    (web / "short.safetensors").write_bytes((d / "r" / "best.safetensors").read_bytes()[:5000])
    (web / "good.safetensors").write_bytes((d / "r" / "best.safetensors").read_bytes())


def _with_meta(meta: dict[str, str], change: dict[str, object]) -> dict[str, str]:
    """vitkit's metadata with ``classes`` replaced or a ``preprocessing`` value set."""
    out = dict(meta)
    for key, value in change.items():
        if key == "classes":
            out["classes"] = json.dumps(value)
        else:
            pre = json.loads(out.get("preprocessing", "{}"))
            pre[key] = value
            out["preprocessing"] = json.dumps(pre)
    return out


DEEP = "[" * 100000 + "]" * 100000  # JSON nested 100000 deep
ML = (
    "--set model.overrides.pos_embed=learned --set model.overrides.classifier=token "
    "--set model.overrides.act=gelu_tanh"  # a run every export format can hold
)
BT = "--backend torch"  # no backend measured and recorded beside the weights


def more_files(d: Path) -> None:
    """The files of the later groups: image folders to embed and embeddings, labels files and a
    multi-label run on one, exports of it with damaged configs, hub caches, shards."""
    from vitkit.checkpoint.io import read_safetensors, write_safetensors
    from vitkit.eval.embed import embed_folder
    from vitkit.export import export_weights

    rng = np.random.default_rng(2)

    def pngs(folder: Path, n: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")

    # folders to embed: a train and a test folder of two classes, one unreadable file in each
    for name, n in (("emb", 6), ("emb_test", 3)):
        for c in ("a", "b"):
            pngs(d / name / c, n)
        (d / name / "a" / "broken.png").write_bytes(b"broken")
    (d / "empty").mkdir()
    model = vitkit.load_pretrained(d / "r")
    for name, folder in (("e_train", "emb"), ("e_test", "emb_test")):
        embed_folder(model, d / folder, batch_size=4, out=d / f"{name}.safetensors")
    tensors, meta = read_safetensors(d / "e_train.safetensors")
    vec = tensors["embeddings"]
    _bytes_mutated(d, "e_train.safetensors", "e_cut.safetensors", cut=0.6)
    for name, v, change in (
        ("e_3d", vec.reshape(vec.shape[0], 2, -1), {}),
        ("e_nan", torch.full_like(vec, float("nan")), {}),
        ("e_inf", vec.clone().index_fill_(0, torch.tensor([0]), float("inf")), {}),
        ("e_rows", vec, {"paths": json.dumps(json.loads(meta["paths"])[:-2])}),
        ("e_narrow", vec[:, :16], {}),
    ):
        write_safetensors(d / f"{name}.safetensors", {"embeddings": v}, {**meta, **change})
    # labels files: images, a multi-label file whose tags never come first, hostile ones
    lab = d / "lab"
    pngs(lab / "im", 24)
    first, tags = ("cat", "dog"), ("warm", "round", "warm round")
    rows = [f"im/{i}.png,{first[i % 2]} {tags[i % 3]}" for i in range(24)]
    (lab / "tags.csv").write_text("path,labels\n" + "\n".join(rows) + "\n")
    single = [f"im/{i}.png,{first[i % 2]}" for i in range(24)]
    for name, text in (
        ("nopath.csv", "path,labels\n" + "\n".join(single[:12]) + "\n,cat\n"),
        ("noimage.csv", "path,labels\n" + "\n".join(single[:12]) + "\nim/missing.png,dog\n"),
        ("empty.csv", ""),
        ("header.csv", "path,labels\n"),
        ("dupes.csv", "path,labels\n" + "\n".join(single + single) + "\n"),
        ("nolabels.csv", "path,tags\n" + "\n".join(single) + "\n"),
        ("bom.csv", "\ufeffpath,labels\r\n" + "\r\n".join(single) + "\r\n"),  # Excel's "CSV UTF-8"
        ("huge.csv", "path,labels\n" + "im/0.png," + "cat " * 5_000_000 + "\n"),
    ):
        (lab / name).write_text(text, encoding="utf-8")
    (lab / "garbage.csv").write_bytes(rng.bytes(4096))
    # a multi-label run on the tags (learned positions, class token: every format holds it)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = f"train --data {lab / 'tags.csv'} {T} {ML} --batch-size 4 --steps 2 --out {d / 'ml'}"
    subprocess.run([sys.executable, "-m", "vitkit", *shlex.split(argv)], check=True, env=env, capture_output=True)
    ml = vitkit.load_pretrained(d / "ml")
    export_weights(ml, d / "ml_hf", to="hf")
    export_weights(ml, d / "ml.onnx", to="onnx")
    _bytes_mutated(d, "ml.onnx", "ml_cut.onnx", cut=0.5)
    import onnx

    proto = onnx.load(str(d / "ml.onnx"))
    for e in proto.metadata_props:
        if e.key == "vitkit.preprocessing":
            e.value = DEEP
    onnx.save(proto, str(d / "ml_deep.onnx"))
    hf_config = json.loads((d / "ml_hf" / "config.json").read_text())
    for name, change in HF_CHANGES.items():
        _hf_variant(d, name, hf_config, change)
    ml_tensors, ml_meta = read_safetensors(d / "ml" / "best.safetensors")
    for name, text in ML_THRESHOLDS.items():
        write_safetensors(d / f"ml_{name}.safetensors", ml_tensors, {**ml_meta, "thresholds": text})
    (d / "x").mkdir()  # where the exports go
    (d / "bell.yaml").write_text("description: ring\x07 the bell\ntrain: {steps: 2}\n")
    hub_caches(d)
    shards(d)


HF_CHANGES: dict[str, dict[str, object] | str] = {
    "width": {"hidden_size": 64},
    "layers": {"num_hidden_layers": 3},
    "patch0": {"patch_size": 0},
    "chans": {"num_channels": 1},
    "gaps": {"id2label": {"0": "cat", "1": "dog", "3": "round", "4": "warm"}},
    "list": {"id2label": ["cat", "dog", "round", "warm"]},
    "t_nan": {"vitkit_thresholds": [float("nan"), 0.2, 0.2, 0.1]},
    "t_neg": {"vitkit_thresholds": [-0.5, 0.2, 0.2, 0.1]},
    "t_len": {"vitkit_thresholds": [0.1, 0.2, 0.2]},
    "t_str": {"vitkit_thresholds": ["0.1", "0.2", "0.2", "0.1"]},
    "deep": "{" + '"a":[' * 5000 + "]" * 5000 + "}",  # thousands deep, as a careless tool writes it
}
ML_THRESHOLDS = {
    "t_nan": "[NaN, 0.2, 0.2, 0.1]",
    "t_neg": "[-0.5, 0.2, 0.2, 0.1]",
    "t_len": "[0.1, 0.2]",
    "t_str": '["0.1", "0.2", "0.2", "0.1"]',
    "t_deep": DEEP,
}


def _hf_variant(d: Path, name: str, config: dict[str, object], change: dict[str, object] | str) -> None:
    """A copy of the multi-label run's Hugging Face folder whose config.json says ``change``."""
    import shutil

    folder = d / f"hf_{name}"
    shutil.copytree(d / "ml_hf", folder)
    text = change if isinstance(change, str) else json.dumps({**config, **change})
    (folder / "config.json").write_text(text)


HUB_SHA = "0123456789abcdef0123456789abcdef01234567"


def hub_caches(d: Path) -> None:
    """A Hugging Face hub cache (``HF_HUB_CACHE``) holding repositories org/good, org/deep (a
    config.json 100000 deep) and org/cut (weights cut short); a vitkit cache whose copy of a named
    file is cut short."""
    from vitkit.hub.names import find

    for repo in ("good", "deep", "cut"):
        snap = d / "hfc" / f"models--org--{repo}" / "snapshots" / HUB_SHA
        snap.mkdir(parents=True)
        (snap.parents[1] / "refs").mkdir()
        (snap.parents[1] / "refs" / "main").write_text(HUB_SHA)
        for f in (d / "ml_hf").iterdir():
            (snap / f.name).write_bytes(f.read_bytes())
    (d / "hfc/models--org--deep/snapshots" / HUB_SHA / "config.json").write_text(DEEP)
    weights = d / "hfc/models--org--cut/snapshots" / HUB_SHA / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:3000])
    entry = find("vit_ti16.augreg_in21k")
    assert entry is not None
    cached = d / "vcache" / "storage.googleapis.com" / entry.url.split("storage.googleapis.com/", 1)[1]
    cached.parent.mkdir(parents=True)
    from vitkit.export import export_weights

    export_weights(vitkit.load_pretrained(d / "ml"), d / "ml.npz", to="official")
    cached.write_bytes((d / "ml.npz").read_bytes()[:4000])


def shards(d: Path) -> None:
    """WebDataset shards: train-0 whole, train-1 cut in the middle of a member, train-2 garbage; val-0."""
    import io
    import tarfile

    rng = np.random.default_rng(3)
    (d / "shards").mkdir()
    for name in ("train-0", "train-1", "val-0"):
        with tarfile.open(d / "shards" / f"{name}.tar", "w") as tar:
            for i in range(16):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
                for suffix, data in (("png", buf.getvalue()), ("cls", str(i % 2).encode())):
                    info = tarfile.TarInfo(f"{name}_{i:04d}.{suffix}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    _bytes_mutated(d, "shards/train-1.tar", "shards/train-1.tar", cut=0.55)
    (d / "shards" / "train-2.tar").write_bytes(rng.bytes(20000))


class _Server:
    """A local HTTP server for the download cases: files of ``root``; ``/cut/NAME`` sends NAME
    without its last half and without a Content-Length."""

    def __init__(self, root: Path) -> None:
        import functools
        import http.server
        import threading

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/cut/"):
                    data = (root / self.path[5:].split("?")[0]).read_bytes()
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    return
                self.path = self.path.split("?")[0]
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        handler = functools.partial(Handler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


def _no_escapes(text: str) -> str | None:
    return "an escape sequence from the file reached the terminal" if "\x1b" in text else None


def _torn_log(d: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "vitkit", *shlex.split(f"{TRAIN4} --checkpoint-every 2 --log-every 1 --out {d / 't'}")],
        check=True,
        capture_output=True,
    )
    log = d / "t/metrics.jsonl"
    text = log.read_text()
    log.write_text(text[: len(text) - 20])  # the last line torn in half
    for p in sorted((d / "t/checkpoints").glob("*.safetensors"))[-1:]:
        p.unlink()  # as if killed before the last checkpoint


def _stale_temporaries(d: Path) -> None:
    _torn_log(d)
    (d / "t/checkpoints/.step_0000004.safetensors.a1b2c3d4.tmp").write_bytes(bytes(1 << 20))


_HOLDER: list[subprocess.Popen] = []


def _hold_folder(d: Path) -> None:
    """Start a long run into ``d/held`` and wait until it holds the folder."""
    argv = [sys.executable, "-m", "vitkit", *shlex.split(TRAIN.replace("--steps 2", "--steps 100000"))]
    _HOLDER.append(subprocess.Popen([*argv, "--out", str(d / "held")], stderr=subprocess.DEVNULL))
    deadline = time.time() + 60
    while not (d / "held" / ".lock").exists() and time.time() < deadline:
        time.sleep(0.05)


def _release_folder(d: Path) -> None:
    for p in _HOLDER:
        p.kill()
        p.wait()
    _HOLDER.clear()


_PORT: list[int] = []  # the local server's port, for the callables that prepare its cache


def _mentions(*texts: str) -> Callable[[str], str | None]:
    def output(text: str) -> str | None:
        missing = [t for t in texts if t not in text]
        return f"the output does not name {', '.join(missing)}" if missing else None

    return output


def _no_controls(text: str) -> str | None:
    odd = sorted({c for c in text if (ord(c) < 32 and c not in "\n\r\t") or ord(c) == 127})
    return f"control characters {odd!r} from the input reached the terminal" if odd else None


def _still_weights(path: str) -> Callable[[Path], str | None]:
    def check(d: Path) -> str | None:
        try:
            vitkit.load_pretrained(d / path)
        except Exception as e:  # any failure is the finding
            return f"{path} no longer loads as weights ({type(e).__name__})"
        return None

    return check


def _valid_json(path: str) -> Callable[[Path], str | None]:
    def check(d: Path) -> str | None:
        try:
            json.loads((d / path).read_text())
        except (OSError, ValueError, RecursionError) as e:
            return f"{path} is left damaged ({type(e).__name__})"
        return None

    return check


EMBED_I = "embed {d}/r {d}/emb --out {d}/ei.safetensors --batch-size 4 --workers 0 " + BT


def _interrupted_embed(d: Path) -> None:
    """``EMBED_I`` stopped (KeyboardInterrupt) after its second batch was written to ``ei.safetensors.parts``."""
    import shutil

    shutil.rmtree(d / "ei.safetensors.parts", ignore_errors=True)
    (d / "ei.safetensors").unlink(missing_ok=True)
    code = (
        "import sys, vitkit.eval.embed as e\nfrom vitkit.cli import main\nw = e._Parts.write\n"
        "def stop(self, i, *a):\n    w(self, i, *a)\n    if i == 1:\n        raise KeyboardInterrupt\n"
        "e._Parts.write = stop\nsys.exit(main(sys.argv[1:]))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, *shlex.split(EMBED_I.format(d=d))], env=env, capture_output=True)


def _torn_part(d: Path) -> None:
    _interrupted_embed(d)
    part = d / "ei.safetensors.parts" / "00001.safetensors"
    part.write_bytes(part.read_bytes()[:300])


def _deep_manifest(d: Path) -> None:
    _interrupted_embed(d)
    (d / "ei.safetensors.parts" / "run.json").write_text(DEEP)


def _copy_run(name: str) -> Callable[[Path], None]:
    def before(d: Path) -> None:
        import shutil

        shutil.rmtree(d / name, ignore_errors=True)
        shutil.copytree(d / "r", d / name)

    return before


def _deep_backend(d: Path) -> None:
    _copy_run("rb")(d)
    (d / "rb" / "backend.json").write_text(DEEP)


REPRO = "reproduce pooling --budget smoke --data synthetic --jobs 1 --out {d}/rep"


def _suite(d: Path) -> None:
    """The smoke suite of one experiment, run once (about 25 s): the later cases rerun it finished."""
    if not (d / "rep" / "report.json").is_file():
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VITKIT_OFFLINE": "1"}
        subprocess.run([sys.executable, "-m", "vitkit", *shlex.split(REPRO.format(d=d))], env=env, capture_output=True)


def _report_cut(d: Path) -> None:
    _suite(d)
    _bytes_mutated(d, "rep/report.json", "rep/report.json", cut=0.5)


def _report_folder(d: Path) -> None:
    _suite(d)
    (d / "rep" / "report.json").unlink(missing_ok=True)
    (d / "rep" / "report.json").mkdir(exist_ok=True)


def _report_folder_gone(d: Path) -> None:
    (d / "rep" / "report.json").rmdir()


def _result_deep(d: Path) -> None:
    _suite(d)
    for p in sorted((d / "rep" / "runs").glob("*/result.json"))[:1]:
        p.write_text(DEEP)


def _result_nan(d: Path) -> None:
    _suite(d)
    for p in sorted((d / "rep" / "runs").glob("*/result.json"))[1:2]:  # another run than _result_deep's
        res = json.loads(p.read_text())
        p.write_text(json.dumps({**res, "test_top1": float("nan")}))


def _deep_state(d: Path) -> None:
    """A partial download of good.safetensors whose state file is JSON nested 100000 deep."""
    from vitkit.hub import cache
    from vitkit.hub.download import partial_path

    os.environ["VITKIT_CACHE"] = str(d / "cache_state")
    try:
        dest = cache.cache_path(f"http://127.0.0.1:{_PORT[0]}/good.safetensors")
    finally:
        del os.environ["VITKIT_CACHE"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial_path(dest).write_bytes((d / "web" / "good.safetensors").read_bytes()[:2000])
    (dest.parent / f".{dest.name}.state.tmp").write_text(DEEP)


def _emptied_config(d: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "vitkit", *shlex.split(f"{TRAIN} --out {d / 'cy'}")], env=env, capture_output=True
    )
    (d / "cy" / "config.yaml").write_text("")


def cases() -> list[Case]:
    out: list[Case] = []

    def add(group: str, what: str, argv: str, expect: str = "error", **kw) -> None:
        out.append(Case(group, what, argv, expect, **kw))

    g = "hangs"
    add(g, "fewer training images than the batch", f"{TRAIN} --set data.options.n=10 --batch-size 32 --out {{d}}/h1")
    add(g, "6 images in a folder, batch 16", f"train --data {{d}}/six {T} --batch-size 16 --steps 2 --out {{d}}/h2")
    add(
        g,
        "finetune a folder of 80 with the shipped batch 512",
        "finetune --from {d}/r --config finetune_sgd --data {d}/eighty --img-size 32 --steps 2 --out {d}/h3",
    )
    add(g, "--batch-size -1", f"{TRAIN} --batch-size -1 --out {{d}}/h4")
    add(g, "every image unreadable", f"train --data {{d}}/junk {T} --batch-size 4 --steps 2 --out {{d}}/h5")

    g = "corruption"
    keys = ("pos_embed", "img_size", "classifier", "num_heads", "width", "depth")
    add(
        g,
        "convert a sincos2d/GAP run to .npz keeps its config or refuses",
        "convert {d}/r {d}/r.npz",
        "any",
        check=_same_config("r", "r.npz", keys),
    )
    add(
        g,
        "... to timm keeps it",
        "convert {d}/r {d}/r_timm.safetensors --to timm",
        "any",
        check=_same_config("r", "r_timm.safetensors", keys),
    )
    add(g, "convert to a .pth name", "convert {d}/r {d}/r.pth")
    add(g, "convert to a .bin name", "convert {d}/r {d}/r.bin")
    add(g, "--to official with a .safetensors name", "convert {d}/r {d}/o.safetensors --to official")
    add(
        g,
        "on_nonfinite=skip never leaves a NaN best",
        f"{TRAIN} --lr 1e30 --set optim.warmup_steps=0 --set train.on_nonfinite=skip --set train.grad_clip=0"
        " --eval-every 1 --out {d}/c1",
        "any",
        check=_finite("c1/best.safetensors"),
    )
    add(
        g,
        "--lr 1e3 with checkpoints every 2",
        f"{TRAIN8} --lr 1e3 --set optim.warmup_steps=0 --checkpoint-every 2 --out {{d}}/c2",
        "any",
        check=_finite("c2/checkpoints/step_0000008.safetensors"),
    )
    add(g, "--lr inf", f"{TRAIN} --lr inf --out {{d}}/c3")
    add(g, "predict with NaN weights", "predict {d}/nan.safetensors {d}/img.png")
    add(g, "eval with NaN weights", "eval {d}/nan.safetensors --data synthetic")
    add(g, "predict with weights whose logits overflow", "predict {d}/overflow.safetensors {d}/img.png")
    add(g, "eval with weights whose logits overflow", "eval {d}/overflow.safetensors --data synthetic --max-images 32")
    add(g, "eval on a folder whose val images are unreadable", "eval {d}/r --data {d}/badval --split val")
    add(g, "a Hugging Face folder without config.json", "predict {d}/hf {d}/img.png")

    g = "resume and faults"
    add(
        g,
        "a torn last log line and a lost checkpoint",
        f"{TRAIN4} --checkpoint-every 2 --log-every 1 --out {{d}}/t",
        "ok",
        before=_torn_log,
    )
    add(
        g,
        "stale temporaries of a killed write",
        f"{TRAIN4} --checkpoint-every 2 --log-every 1 --out {{d}}/t",
        "ok",
        before=_stale_temporaries,
        check=lambda d: None if not list((d / "t").rglob("*.tmp")) else "temporaries left",
    )
    add(
        g,
        "a second run into a folder a run holds",
        f"{TRAIN} --out {{d}}/held",
        before=_hold_folder,
        after=_release_folder,
    )
    for cmd, what in [
        (f"{TRAIN} --out {{d}}/a_file/run", "train into a path under a file"),
        ("eval {d}/r --data synthetic --max-images 16 --json {d}/a_file/x.json", "eval --json there"),
        ("convert {d}/r {d}/a_file/x.safetensors", "convert there"),
        ("predict {d}/r {d}/img.png --json {d}/a_file/x.json", "predict --json there"),
        ("analyze {d}/r --images {d}/img.png --out {d}/a_file/an", "analyze --out there"),
        ("fewshot {d}/r --data synthetic --shots 1 --seeds 1 --json {d}/a_file/x.json", "fewshot --json there"),
        ("probe {d}/r --data synthetic --max-train 64 --max-test 32 --json {d}/a_file/x.json", "probe --json there"),
        ("reproduce pooling --budget smoke --data synthetic --out {d}/a_file/rep", "reproduce --out there"),
    ]:
        add(g, what, cmd)

    g = "bad references"
    add(
        g,
        "a teacher that does not exist",
        f"{TRAIN} --set train.teacher={{d}}/none.safetensors --set train.distill=soft --out {{d}}/dt1",
    )
    add(
        g,
        "a teacher with another class count",
        f"{TRAIN} --set train.teacher={{d}}/three.safetensors --set train.distill=hard --out {{d}}/dt2",
    )
    add(
        g,
        "fine-tune from NaN weights",
        "finetune --from {d}/nan.safetensors --data synthetic --img-size 32 --steps 2 --out {d}/ft",
    )
    add(g, "predict a folder given as an image", "predict {d}/r {d}/six")
    add(g, "an unknown pretrained name", "convert vit_b16.augreg_in99k {d}/x.safetensors")
    add(g, "a known name offline, not in the cache", "predict vit_b16.augreg_in21k {d}/img.png")

    g = "small files, large cost"
    add(g, "a 1 MB .npz of 1 GiB under a name vitkit does not use", "predict {d}/bomb.npz {d}/img.png")
    add(g, "predict a decompression bomb", "predict {d}/r {d}/bomb.png")
    add(g, "predict a truncated JPEG", "predict {d}/r {d}/truncated.jpg")
    add(g, "predict a text file named .png", "predict {d}/r {d}/text.png")
    add(g, "analyze a decompression bomb", "analyze {d}/r --images {d}/bomb.png --out {d}/an1")
    add(g, "analyze a truncated JPEG", "analyze {d}/r --images {d}/truncated.jpg --out {d}/an2")
    add(g, "a safetensors file cut in half", "predict {d}/cut.safetensors {d}/img.png")
    add(g, "a safetensors header with a flipped byte", "predict {d}/flip.safetensors {d}/img.png")
    add(g, "eval at an image size of 100000", "eval {d}/r --data synthetic --img-size 100000")

    g = "validation at the door"
    for key, values in {
        "--batch-size": ["0", "-3", "nan", "x"],
        "--accum-steps": ["0", "-1"],
        "--log-every": ["-1"],
        "--eval-every": ["-1"],
        "--checkpoint-every": ["-2"],
        "--steps": ["0", "-5", "1e3"],
        "--lr": ["nan", "-1", "inf"],
    }.items():
        for v in values:
            add(g, f"train {key} {v}", f"{TRAIN} {key}={v} --out {{d}}/v")
    for key, v in [
        ("optim.warmup_steps", "-1"),
        ("optim.schedule", "cosinus"),
        ("model.overrides.patch_size", "0"),
        ("model.overrides.width", "-32"),
        ("model.overrides.num_classes", "0.5"),
        ("model.overrides.img_size", "30"),
        ("model.overrides.img_size", "80000"),
        ("train.on_nonfinite", "ignore"),
        ("augment.area_min", "1.5"),
        ("augment.randaugment", "rand-m12-n2"),
        ("augment.mixup_alpha", "-1"),
        ("train.distill", "hard"),
        ("optim.layer_decay", "0"),
        ("data.options.n", "abc"),
        ("data.options.img_sz", "32"),
        ("nonsense.key", "1"),
    ]:
        add(g, f"--set {key}={v}", f"{TRAIN} --set {key}={v} --out {{d}}/v")
    add(g, "a recipe that is not YAML", "train --config {d}/bad.yaml --out {d}/v")
    add(g, "a recipe that is a list", "train --config {d}/list.yaml --out {d}/v")
    add(g, "a recipe that does not exist", "train --config {d}/none.yaml --out {d}/v")
    add(g, "--device tpu", f"{TRAIN} --device tpu --out {{d}}/v")
    add(
        g,
        "--device cuda without CUDA",
        "predict {d}/r {d}/img.png --device cuda",
        "error" if not torch.cuda.is_available() else "ok",
    )
    for argv in [
        "convert {d}/r {d}/x.safetensors --img-size 0",
        "convert {d}/r {d}/x.safetensors --num-classes -1",
        "convert {d}/none.npz {d}/x.safetensors",
        "bench --model vit_ti16 --batch 0",
        "bench --model vit_ti16 --iters -1",
        "bench --model vit_nonexistent",
        "bench --model vit_ti16 --img-size 20000",
        "eval {d}/r --data synthetic --batch-size 0",
        "eval {d}/r --data synthetic --img-size 30",
        "eval {d}/r --data nowhere",
        "eval {d}/r --data synthetic --split nosuch",
        "predict {d}/r {d}/img.png --top-k 0",
        "predict {d}/r {d}/missing.png",
        "predict {d}/missing_weights {d}/img.png",
        "analyze {d}/r --images {d}/img.png --out {d}/an3 --layers 9",
        "analyze {d}/r --images {d}/img.png --out {d}/an4 --components 0",
        "fewshot {d}/r --data synthetic --shots 0",
        "probe {d}/r --data synthetic --temperature -1",
        "models vit_ti16 --img-size 100000",
        "models no_such_model",
    ]:
        add(g, argv.replace("{d}/", ""), argv)

    g = "run folders"
    add(g, "train into a folder of other files", f"{TRAIN} --out {{d}}/notes")
    add(g, "train into /", f"{TRAIN} --out /")
    add(g, "train with an empty --out", f"{TRAIN} --out ''")
    add(g, "train into a file", f"{TRAIN} --out {{d}}/a_file")
    add(
        g,
        "--set train.patch_drop=0 on the demo recipe",
        "train --config fmnist_vit --set train.patch_drop=0 "
        "--data synthetic --set data.options.img_size=28 --set data.options.in_chans=1 --steps 1 --batch-size 8 "
        "--eval-every 0 --out {d}/pd0",
        "ok",
    )

    g = "download cache"
    web = {"VITKIT_OFFLINE": "", "VITKIT_CACHE": "{d}/cache"}
    add(g, "an HTML page served with 200", "predict http://127.0.0.1:{port}/page.safetensors {d}/img.png", env=web)
    add(
        g,
        "the same address again (nothing cached)",
        "predict http://127.0.0.1:{port}/page.safetensors {d}/img.png",
        env=web,
        check=lambda d: "the page was cached" if list((d / "cache").rglob("page*")) else None,
    )
    add(
        g,
        "a Content-Length longer than the body",
        "predict http://127.0.0.1:{port}/short.safetensors {d}/img.png",
        env=web,
    )
    add(
        g,
        "a body cut short without a Content-Length",
        "predict http://127.0.0.1:{port}/cut/good.safetensors {d}/img.png",
        env=web,
    )
    add(
        g,
        "a presigned address (a query string)",
        "predict 'http://127.0.0.1:{port}/good.safetensors?token=abc&x=1' {d}/img.png",
        "ok",
        env=web,
    )
    add(
        g,
        "VITKIT_DOWNLOAD_TIMEOUT=inf",
        "predict http://127.0.0.1:{port}/good.safetensors {d}/img.png",
        env={**web, "VITKIT_DOWNLOAD_TIMEOUT": "inf"},
    )

    g = "values without bounds"
    for key, v in [
        ("model.overrides.width", "1000000000"),
        ("model.overrides.mlp_dim", "100000000"),
        ("model.overrides.depth", "100000"),
        ("model.overrides.num_classes", "1000000000"),
        ("augment.erase_count", "1000000000"),
    ]:
        add(g, f"--set {key}={v}", f"{TRAIN} --set {key}={v} --out {{d}}/v")
    for argv in [
        "fewshot {d}/r --data synthetic --seeds 1000000000",
        "train --data synthetic --batch-size 1000000000000 --out {d}/v",
        "bench --model vit_ti16 --batch 1000000000",
        "bench --model vit_b16 --batch 100000",
        "models --num-classes 100000000000",
        "train --data synthetic-{{0..999999999}}.tar --out {d}/v",
        "predict {d}/crop.safetensors {d}/img.png",
    ]:
        add(g, argv.replace("{d}/", ""), argv)
    add(g, "vitkit models (every model, table only)", "models", "ok")

    g = "hostile recipes"
    add(g, "a recipe of expanding aliases", "train --config {d}/laughs.yaml --out {d}/v")
    add(g, "... in --set", f"{TRAIN} --set 'description=[*a]' --out {{d}}/v")
    add(g, "a recipe nested 5000 deep", "train --config {d}/deep.yaml --out {d}/v")
    add(g, "a !!python tag in a recipe", "train --config {d}/python.yaml --out {d}/v")
    add(g, "a !!python tag in --set", f"{TRAIN} --set 'train=!!python/name:os.system' --out {{d}}/v")
    add(g, "a YAML syntax error in --set", f"{TRAIN} --set 'train={{{{steps: [1, 2}}}}' --out {{d}}/v")
    add(g, "a recipe that is not UTF-8", "train --config {d}/latin1.yaml --out {d}/v")

    g = "hostile files"
    add(g, "class names with terminal escapes", "predict {d}/escape.safetensors {d}/img.png", "any", output=_no_escapes)
    add(g, "a .bin that inflates to 1 GiB", "predict {d}/bomb.bin {d}/img.png")

    g = "wrong data"
    add(g, "train on a folder of one class", f"train --data {{d}}/one {T} --batch-size 4 --steps 2 --out {{d}}/w1")
    add(g, "eval on a folder with other class names", "eval {d}/r --data {d}/othernames --split val")
    add(
        g,
        "eval a model whose class names come in another order",
        "eval {d}/reversed.safetensors --data {d}/renamed --split val",
        "any",
    )
    add(g, "predict a 16-bit PNG", "predict {d}/r {d}/grey16.png", "ok")
    add(g, "predict a float TIFF", "predict {d}/r {d}/greyf.tiff", "ok")

    g = "embed"
    e = f"--batch-size 4 --workers 0 {BT}"
    add(g, "embed a folder that does not exist", f"embed {{d}}/r {{d}}/nowhere --out {{d}}/e1.safetensors {e}")
    add(g, "embed an empty folder", f"embed {{d}}/r {{d}}/empty --out {{d}}/e1.safetensors {e}")
    add(
        g,
        "embed a folder with an unreadable file among the images",
        f"embed {{d}}/r {{d}}/emb --out {{d}}/e2.safetensors {e}",
        "ok",
        output=_mentions("broken.png"),
    )
    add(g, "embed a folder of unreadable images", f"embed {{d}}/r {{d}}/junk --out {{d}}/e3.safetensors {e}")
    add(g, "embed --out under a regular file", f"embed {{d}}/r {{d}}/emb --out {{d}}/a_file/e.safetensors {e}")
    add(g, "embed --out a file that exists", f"embed {{d}}/r {{d}}/emb --out {{d}}/e2.safetensors {e}", "any")
    add(
        g,
        "embed --out the model's own weights",
        f"embed {{d}}/rw {{d}}/emb --out {{d}}/rw/best.safetensors {e}",
        "any",
        before=_copy_run("rw"),
        check=_still_weights("rw/best.safetensors"),
    )
    add(g, "resume an interrupted embed", EMBED_I, "ok", before=_interrupted_embed, output=_mentions("resumed"))
    add(g, "resume with a torn part", EMBED_I, "ok", before=_torn_part)
    add(
        g,
        "resume with another batch size",
        EMBED_I.replace("--batch-size 4", "--batch-size 3"),
        before=_interrupted_embed,
    )
    add(g, "resume with a run.json nested 100000 deep", EMBED_I, before=_deep_manifest)
    pe = "--train-embeddings {d}/%s.safetensors --test-embeddings {d}/e_test.safetensors"
    add(g, "probe a truncated embeddings file", "probe " + pe % "e_cut")
    add(g, "fewshot on embeddings of three dimensions", "fewshot " + pe % "e_3d" + " --shots 1 --seeds 1")
    add(g, "probe NaN embeddings", "probe " + pe % "e_nan")
    add(g, "fewshot on NaN embeddings", "fewshot " + pe % "e_nan" + " --shots 1 --seeds 1")
    add(g, "fewshot on embeddings with an infinite row", "fewshot " + pe % "e_inf" + " --shots 1 --seeds 1")
    add(g, "probe embeddings with fewer paths than rows", "probe " + pe % "e_rows")
    add(g, "probe train and test of other widths", "probe " + pe % "e_narrow")
    add(g, "probe a model file given as embeddings", "probe " + pe.replace("{d}/%s", "{d}/r/best"))

    g = "labels files"
    lab = f"{T} --batch-size 4 --steps 2"
    add(
        g,
        "a multi-label file whose tags never come first",
        f"train --data {{d}}/lab/tags.csv {lab} --out {{d}}/l1",
        "ok",
    )
    for name, what in [
        ("nopath", "a row without an image path"),
        ("noimage", "a row naming an image that does not exist"),
        ("empty", "an empty labels file"),
        ("header", "a labels file of only its header"),
        ("nolabels", "no labels column"),
        ("garbage", "binary garbage named .csv"),
        ("huge", "a line of 20 MB"),
    ]:
        add(g, what, f"train --data {{d}}/lab/{name}.csv {lab} --out {{d}}/l2")
    add(g, "every row twice", f"train --data {{d}}/lab/dupes.csv {lab} --out {{d}}/l3", "any")
    add(g, "Excel's CSV UTF-8 (a BOM, CRLF)", f"train --data {{d}}/lab/bom.csv {lab} --out {{d}}/l4", "ok")
    add(g, "eval the multi-label run on its labels file", "eval {d}/ml --data {d}/lab/tags.csv", "ok")
    add(g, "eval a single-label run on a multi-label file", "eval {d}/r --data {d}/lab/tags.csv")

    g = "exports and reload"
    for to, dst in [
        ("onnx", "ml.onnx"),
        ("pt2", "ml.pt2"),
        ("hf", "ml_hf"),
        ("timm", "ml_timm.safetensors"),
        ("official", "ml.npz"),
    ]:
        add(g, f"convert a multi-label run --to {to}", f"convert {{d}}/ml {{d}}/x/{dst} --to {to}", "ok")
        # formats that record thresholds must give them back; the others keep the weights
        keeps = _mentions("threshold") if to in ("onnx", "pt2", "hf") else None
        add(g, f"... predict the {to} export", f"predict {{d}}/x/{dst} {{d}}/img.png {BT}", "ok", output=keeps)
    add(g, "predict a truncated ONNX file", f"predict {{d}}/ml_cut.onnx {{d}}/img.png {BT}")
    add(
        g,
        "an ONNX export whose vitkit.preprocessing is nested 100000 deep",
        f"predict {{d}}/ml_deep.onnx {{d}}/img.png {BT}",
    )
    for name, what in [
        ("width", "hidden_size 64 over weights of 32"),
        ("layers", "num_hidden_layers 3 over 2 blocks"),
        ("patch0", "patch_size 0"),
        ("chans", "num_channels 1 over RGB weights"),
        ("gaps", "id2label keys 0, 1, 3, 4"),
        ("list", "id2label a list"),
        ("t_nan", "vitkit_thresholds with NaN"),
        ("t_neg", "vitkit_thresholds negative"),
        ("t_len", "vitkit_thresholds of 3 for 4 classes"),
        ("t_str", "vitkit_thresholds of strings"),
    ]:
        add(g, f"a Hugging Face folder with {what}", f"predict {{d}}/hf_{name} {{d}}/img.png {BT}")
    for name, what in [
        ("t_nan", "NaN"),
        ("t_neg", "negative"),
        ("t_len", "2 for 4 classes"),
        ("t_str", "strings"),
        ("t_deep", "nested 100000 deep"),
    ]:
        add(g, f"a .safetensors whose thresholds are {what}", f"predict {{d}}/ml_{name}.safetensors {{d}}/img.png {BT}")
    add(g, "convert it to a Hugging Face folder", "convert {d}/ml_t_nan.safetensors {d}/x/nan_hf --to hf")

    g = "hub names"
    hf = {"HF_HUB_CACHE": "{d}/hfc"}
    add(g, "an unknown name offline", f"predict vit_b16.augreg_nosuch {{d}}/img.png {BT}")
    add(g, "../../etc/passwd as the weights", f"predict ../../../../../../etc/passwd {{d}}/img.png {BT}")
    add(g, "a name followed by ../..", f"predict vit_b16.augreg_in21k/../../../etc/passwd {{d}}/img.png {BT}")
    add(g, "hf-hub:../../etc/passwd", f"predict hf-hub:../../etc/passwd {{d}}/img.png {BT}", env=hf)
    add(
        g,
        "a hub revision climbing out of refs/ (@../refs/main)",
        f"predict hf-hub:org/good@../refs/main {{d}}/img.png {BT}",
        env=hf,
    )
    add(
        g,
        "a name with a control character",
        f"predict 'vit_b16\x07.augreg\x1b[2J' {{d}}/img.png {BT}",
        output=_no_controls,
    )
    add(g, "a hub cache of a good repository", f"predict hf-hub:org/good {{d}}/img.png {BT}", "ok", env=hf)
    add(g, "a hub cache config.json nested 100000 deep", f"predict hf-hub:org/deep {{d}}/img.png {BT}", env=hf)
    add(g, "a hub cache whose weights are cut short", f"predict hf-hub:org/cut {{d}}/img.png {BT}", env=hf)
    add(
        g,
        "a cached download cut short, offline",
        f"predict vit_ti16.augreg_in21k {{d}}/img.png {BT}",
        env={"VITKIT_CACHE": "{d}/vcache"},
    )
    add(
        g,
        "a partial download whose state file is nested 100000 deep",
        "predict http://127.0.0.1:{port}/good.safetensors {d}/img.png " + BT,
        "any",
        before=_deep_state,
        env={"VITKIT_OFFLINE": "", "VITKIT_CACHE": "{d}/cache_state"},
    )

    g = "reproduce runner"
    add(g, "reproduce an unknown experiment", "reproduce poolin --plan --out {d}/rp")
    add(g, "reproduce an experiment named ../..", "reproduce ../../etc --plan --out {d}/rp")
    add(g, "reproduce --budget 0", "reproduce pooling --budget 0 --plan --out {d}/rp")
    add(g, "reproduce --seeds -1", "reproduce pooling --seeds -1 --plan --out {d}/rp")
    add(g, "reproduce --plan with --out under a file", "reproduce pooling --plan --out {d}/a_file/rp", "any")
    add(
        g,
        "a suite whose report.json was cut in half, rerun",
        REPRO,
        "ok",
        before=_report_cut,
        check=_valid_json("rep/report.json"),
    )
    add(g, "a folder where report.json goes", REPRO, before=_report_folder, after=_report_folder_gone)
    add(g, "a run's result.json nested 100000 deep, --plan", REPRO + " --plan", "any", before=_result_deep)
    add(g, "a run's result.json with a NaN top-1, rerun", REPRO, "any", before=_result_nan)
    add(g, "reproduce --publish under a file", REPRO + " --publish {d}/a_file/pub", before=_suite)

    g = "deep input and absent devices"
    add(g, "a Hugging Face config.json nested 5000 deep", f"predict {{d}}/hf_deep {{d}}/img.png {BT}")
    add(
        g,
        "a run's backend.json nested 100000 deep",
        "predict {d}/rb {d}/img.png",
        "any",
        before=_deep_backend,
    )
    add(g, "a recipe value with a control character", f"{TRAIN} --set 'description=a\x01b' --out {{d}}/f1")
    add(g, "a recipe file with a bell", "train --config {d}/bell.yaml --out {d}/f1", output=_no_controls)
    add(
        g,
        "an escape sequence written as a YAML escape",
        f"{TRAIN} --set 'model.name=\"vit\\x1b[2Js16\"' --out {{d}}/f1",
        output=_no_controls,
    )
    add(g, "train --device mps", f"{TRAIN} --device mps --out {{d}}/f2")
    add(g, "embed --device mps", f"embed {{d}}/r {{d}}/emb --out {{d}}/f.safetensors --device mps {BT}")
    add(
        g,
        "an emptied config.yaml, the same command again",
        f"{TRAIN} --out {{d}}/cy",
        before=_emptied_config,
        output=_mentions("config.yaml"),
    )
    sh = f"{T} --batch-size 8 --steps 2"
    add(
        g,
        "a WebDataset shard cut short",
        f"train --data '{{d}}/shards/train-{{{{0..1}}}}.tar' {sh} --out {{d}}/f3",
        "any",
        output=_mentions("train-1.tar"),
    )
    add(
        g,
        "a WebDataset shard of garbage",
        f"train --data '{{d}}/shards/train-{{{{0,2}}}}.tar' {sh} --out {{d}}/f4",
        "any",
        output=_mentions("train-2.tar"),
    )
    return out


def outcome(proc: subprocess.CompletedProcess | None) -> str:
    if proc is None:
        return "hang"
    if "Traceback (most recent call last)" in proc.stderr:
        return "traceback"
    if proc.returncode == 0:
        return "ok"
    lines = [x for x in proc.stderr.splitlines() if x.strip() and "\r" not in x and not x.startswith(("note:", "  "))]
    return "one line" if lines and ERROR_LINE.match(lines[-1]) else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="benchmarks/out/adversarial.json")
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="seconds a case may take before it counts as a hang"
    )
    parser.add_argument(
        "--only", action="append", help="cases whose group or description contains this (repeat for several)"
    )
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VITKIT_OFFLINE": "1"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        workspace(d)
        server = _Server(d / "web")
        _PORT[:] = [server.port]
        for case in cases():
            if args.only and not any(o in case.group or o in case.what for o in args.only):
                continue
            if case.before is not None:
                case.before(d)
            argv = [sys.executable, "-m", "vitkit", *shlex.split(case.argv.format(d=d, port=server.port))]
            case_env = {**env, **{k: v.format(d=d) for k, v in (case.env or {}).items()}}
            start = time.perf_counter()
            try:
                proc = subprocess.run(argv, env=case_env, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                proc = None
            seconds = time.perf_counter() - start
            if case.after is not None:
                case.after(d)
            got = outcome(proc)
            wrong = case.check(d) if case.check is not None and got in ("ok", "one line") else None
            if wrong is None and case.output is not None and proc is not None:
                wrong = case.output(proc.stdout + proc.stderr)
            if case.expect == "ok":
                good = got == "ok" and wrong is None
            elif case.expect == "any":  # success or a clear stop, as long as nothing wrong is left
                good = got in ("ok", "one line") and wrong is None
            else:
                good = got == "one line"
            last = "" if proc is None else (proc.stderr.strip().splitlines() or [""])[-1][:160]
            rows.append(
                {
                    "group": case.group,
                    "case": case.what,
                    "outcome": got,
                    "as_expected": good,
                    "seconds": round(seconds, 1),
                }
                | {"problem": wrong, "last_line": last}
            )
            mark = "ok " if good else "BAD"
            print(f"{mark} {got:10s} {seconds:5.1f}s  [{case.group}] {case.what}: {wrong or last}", flush=True)
        server.close()
        tmpfs = _full_disk(d, env, args.timeout)
        if tmpfs is not None:
            rows.append(tmpfs)
            print(f"{'ok ' if tmpfs['as_expected'] else 'BAD'} {tmpfs['outcome']:10s} [faults] {tmpfs['case']}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    bad = [r for r in rows if not r["as_expected"]]
    print(f"\n{len(rows)} cases: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    print(
        f"as expected: {len(rows) - len(bad)}; not: {len(bad)}"
        + (" (" + "; ".join(r["case"] for r in bad) + ")" if bad else "")
    )
    meta = {
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "counts": counts, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.json}")


def _full_disk(d: Path, env: dict[str, str], timeout: float) -> dict | None:
    """Train into a tmpfs with room for about two checkpoints (three are needed while the newest
    is written with keep_last 2): one line naming the file, and nothing half-written left behind."""
    disk = d / "disk"
    disk.mkdir()
    ckpt = max(p.stat().st_size for p in (d / "r" / "checkpoints").iterdir())
    size = (int(2.5 * ckpt) + 65536) // 4096 * 4096
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True
    ).returncode:
        print("(no tmpfs can be mounted here: the real full-disk case is left out)")
        return None
    try:
        argv = [sys.executable, "-m", "vitkit", *shlex.split(TRAIN.replace("--steps 2", "--steps 6"))]
        try:
            flags = ["--checkpoint-every", "1", "--set", "log.keep_last=2", "--out", str(disk / "run")]
            proc = subprocess.run([*argv, *flags], env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc = None
        got = outcome(proc)
        left = [p.name for p in disk.rglob("*.tmp")]
        good = got == "one line" and "No space left" in proc.stderr and not left
        last = "" if proc is None else proc.stderr.strip().splitlines()[-1][:160]
        return {
            "group": "resume and faults",
            "case": f"a real full disk (a tmpfs of {size // 1024} KiB)",
            "outcome": got,
            "as_expected": good,
            "problem": f"temporaries left: {left}" if left else None,
            "last_line": last,
            "seconds": None,
        }
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


if __name__ == "__main__":
    main()
