"""Pretrained weights by name (``vitkit.hub``): names to addresses, and downloads against a local
HTTP server on 127.0.0.1 (Range requests, dropped and stalled connections, damaged bodies, 404s),
a Hugging Face cache laid out by hand in offline mode, and the error lines. Nothing here reaches
the internet: the Google Cloud Storage addresses of the table go to the local server through
``VITKIT_MIRROR``, the hub is offline."""

from __future__ import annotations

import base64
import copy
import errno
import hashlib
import http.server
import io
import json
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.errors import DownloadError, UsageError
from vitkit.export import export_weights
from vitkit.hub import Pretrained, cache, find, register_pretrained
from vitkit.hub import download as download_module
from vitkit.hub.download import download
from vitkit.hub.hf import timm_model_name
from vitkit.hub.names import for_model
from vitkit.preprocessing import Preprocessing, prepare_images

TINY = dict(img_size=16, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=10)
BUCKET = "https://storage.googleapis.com/vitkit-test"


class Server:
    """Files in memory over HTTP, with ``Range`` support and per-path misbehaviour:
    ``drop`` (the first answer stops halfway), ``corrupt`` (a flipped byte, with the true MD5 in
    ``x-goog-hash``), ``stall`` (headers, then silence)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.mode: dict[str, str] = {}
        self.requests: list[dict[str, str | None]] = []
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append({"path": self.path, "range": self.headers.get("Range")})
                server.serve(self)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        path = h.path.split("?")[0]
        if path not in self.files:
            h.send_error(404)
            return
        body, mode = self.files[path], self.mode.get(path)
        start = 0
        etag = '"' + hashlib.md5(body).hexdigest()[:8] + '"'
        m = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range") or "")
        same = h.headers.get("If-Range") in (None, etag)  # If-Range: the range only of the same file
        if m and same and int(m.group(1)) < len(body):
            start = int(m.group(1))
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            h.send_response(200)
        h.send_header("Content-Length", str(len(body) - start))
        if mode != "drop-no-etag":
            h.send_header("ETag", etag)
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        h.send_header("x-goog-hash", f"crc32c=AAAAAA==,md5={md5}")
        h.end_headers()
        if mode == "stall":
            h.wfile.write(body[:10])
            h.wfile.flush()
            self.release.wait(10)
            return
        if mode == "corrupt":
            body = body[:100] + bytes([body[100] ^ 0xFF]) + body[101:]
        if mode in ("drop", "drop-no-etag") and start == 0:
            self.mode.pop(path)  # only the first answer breaks off
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.wfile.write(body[start:])

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def environment(tmp_path, monkeypatch):
    """A private cache, online, no mirror or hub settings from the machine running the tests."""
    for name in ("VITKIT_OFFLINE", "VITKIT_MIRROR", "VITKIT_DOWNLOAD_TIMEOUT", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_ti16", **TINY).eval()
    with torch.no_grad():
        model.head.weight.normal_(std=0.5)
    return model


@pytest.fixture(scope="module")
def npz_bytes(tiny_model, tmp_path_factory) -> bytes:
    """The tiny model as an official-format .npz, written by vitkit's exporter."""
    path = tmp_path_factory.mktemp("npz") / "tiny.npz"
    export_weights(tiny_model, path, "official")
    return path.read_bytes()


def _entry(name: str, url: str, **kw) -> Pretrained:
    pre = kw.pop("preprocessing", Preprocessing(img_size=(16, 16), interpolation="bicubic", crop_pct=0.875))
    entry = Pretrained(name, None, url, 16, "test", preprocessing=pre, source="user", **kw)
    register_pretrained(entry)
    return entry


def _same_outputs(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.allclose(a(x), b(x), atol=1e-5)


# -- names --------------------------------------------------------------------------------------


def test_release_names_resolve_to_their_public_addresses():
    e = find("imagenet21k/ViT-B_16")
    assert e.url == "https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz" and e.model == "vit_b16"
    ft = find("imagenet21k+imagenet2012/ViT-B_16.npz")
    assert ft.name == "vit_b16.in21k_ft_in1k" and ft.resolution == 384 and ft.top1 == 84.0
    assert cache.fetch_address(ft.url).endswith("/vit_models/imagenet21k%2Bimagenet2012/ViT-B_16.npz")
    aug = "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384"
    assert find(aug) is find(f"augreg/{aug}") is find(f"gs://vit_models/augreg/{aug}.npz")
    assert find(aug).name == "vit_b16.augreg_in21k_ft_in1k" and find(aug).top1 == 85.49
    assert for_model("vit_b16", True).name == "vit_b16.augreg_in21k_ft_in1k"
    assert for_model("vit_h14", True).name == "vit_h14.in21k"
    assert cache.https_address("gs://big_vision/x/y.npz") == "https://storage.googleapis.com/big_vision/x/y.npz"


def test_cache_folders_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("VITKIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "vitkit"
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "mine"))
    url = "https://storage.googleapis.com/vit_models/imagenet21k+imagenet2012/ViT-B_16.npz"
    assert (
        cache.cache_path(url)
        == tmp_path / "mine/storage.googleapis.com/vit_models/imagenet21k_imagenet2012/ViT-B_16.npz"
    )
    assert cache.cache_path("https://h.example/../../etc/passwd").parent == tmp_path / "mine/h.example/etc"
    assert cache.hf_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    assert cache.hf_cache_dir() == tmp_path / "hubcache"


def test_unknown_names_suggest_close_ones():
    with pytest.raises(UsageError, match=r"did you mean vit_b16\.augreg_in21k_ft_in1k"):
        vitkit.load_pretrained("vit_b16.augreg_in21k_ft_in1kk")
    with pytest.raises(UsageError, match=r"did you mean imagenet21k\+imagenet2012/ViT-B_16, imagenet21k/ViT-B_16\?"):
        vitkit.load_pretrained("ViT-B_16")
    with pytest.raises(UsageError, match=r"vit_b16 has no pretrained tag 'in22k' \(known: in21k, in21k_ft_in1k"):
        vitkit.create_model("vit_b16", pretrained="in22k")
    with pytest.raises(vitkit.CheckpointError, match="no such file or folder"):  # a file name stays a path
        vitkit.load_pretrained("missing.npz")
    with pytest.raises(vitkit.CheckpointError, match=r"no such file or folder; or did you mean imagenet21k/ViT-B_16"):
        vitkit.load_pretrained("imagenet21k/ViT-B_61")


# -- downloads ----------------------------------------------------------------------------------


def test_download_once_then_from_the_cache(server, npz_bytes, tiny_model, monkeypatch):
    server.files["/vitkit-test/tiny.npz"] = npz_bytes
    monkeypatch.setenv("VITKIT_MIRROR", server.base)
    _entry("tiny.test", f"{BUCKET}/tiny.npz")
    model = vitkit.load_pretrained("tiny.test")
    assert _same_outputs(model, tiny_model)
    assert len(server.requests) == 1 and server.requests[0]["range"] is None
    cached = cache.cache_path(f"{BUCKET}/tiny.npz")
    assert cached.read_bytes() == npz_bytes and model.load_report.path == str(cached)
    assert model.load_report.name == "tiny.test" and model.load_report.source == "official"
    # the table's preprocessing travels with the weights
    assert model.preprocessing == Preprocessing(img_size=(16, 16), interpolation="bicubic", crop_pct=0.875)
    again = vitkit.load_pretrained("tiny.test")
    assert len(server.requests) == 1 and _same_outputs(again, tiny_model)
    # gs:// paths and the https:// address of an entry are the same file, from the same cache
    assert _same_outputs(vitkit.load_pretrained("gs://vitkit-test/tiny.npz"), tiny_model)
    assert len(server.requests) == 1
    left = sorted(p.name for p in cached.parent.iterdir())
    assert left == [".tiny.npz.lock", "tiny.npz"]  # no partial or state file left, the lock stays


def test_any_http_address_and_offline_mode(server, tiny_model, tmp_path, monkeypatch):
    vitkit.save_checkpoint(tiny_model, tmp_path / "w.safetensors")
    server.files["/files/w.safetensors"] = (tmp_path / "w.safetensors").read_bytes()
    url = f"{server.base}/files/w.safetensors"
    monkeypatch.setenv("VITKIT_OFFLINE", "1")
    with pytest.raises(DownloadError) as e:
        vitkit.load_pretrained(url)
    cached = cache.cache_path(url)
    assert str(e.value) == f"{cached}: not in the cache and VITKIT_OFFLINE is set; it would be downloaded from {url}"
    assert not server.requests
    monkeypatch.delenv("VITKIT_OFFLINE")
    assert _same_outputs(vitkit.load_pretrained(url), tiny_model)
    monkeypatch.setenv("VITKIT_OFFLINE", "1")  # now cached: offline works
    assert _same_outputs(vitkit.load_pretrained(url), tiny_model) and len(server.requests) == 1


def test_a_dropped_download_resumes_with_a_range_request(server, npz_bytes, tiny_model):
    server.files["/t.npz"] = npz_bytes
    server.mode["/t.npz"] = "drop"
    model = vitkit.load_pretrained(f"{server.base}/t.npz")
    assert _same_outputs(model, tiny_model)
    assert [r["range"] for r in server.requests] == [None, f"bytes={len(npz_bytes) // 2}-"]


def test_an_interrupted_download_resumes_in_a_later_call(server, npz_bytes, tmp_path):
    server.files["/t.npz"] = npz_bytes
    server.mode["/t.npz"] = "drop"
    dest = tmp_path / "c" / "t.npz"
    broken = r"(announced \d+ bytes and sent \d+|connection broke).*nothing cached at .*t\.npz"
    with pytest.raises(DownloadError, match=broken):
        download(f"{server.base}/t.npz", dest, attempts=1)
    assert not dest.exists()  # never a partial file under the final name
    part = download_module.partial_path(dest)
    assert part.stat().st_size == len(npz_bytes) // 2 and vitkit.files.temporary_target(part.name) == "t.npz"
    download(f"{server.base}/t.npz", dest)
    assert dest.read_bytes() == npz_bytes and not part.exists()
    assert server.requests[-1]["range"] == f"bytes={len(npz_bytes) // 2}-"


def test_a_partial_download_without_a_validator_starts_over(server, npz_bytes, tmp_path):
    """A server that sends no ETag cannot say whether the file is the one the partial bytes came
    from: appending could splice two versions, so the next call downloads the whole file again."""
    server.files["/t.npz"] = npz_bytes
    server.mode["/t.npz"] = "drop-no-etag"
    dest = tmp_path / "c" / "t.npz"
    with pytest.raises(DownloadError):
        download(f"{server.base}/t.npz", dest, attempts=1)
    assert download_module.partial_path(dest).stat().st_size == len(npz_bytes) // 2
    download(f"{server.base}/t.npz", dest)
    assert dest.read_bytes() == npz_bytes and server.requests[-1]["range"] is None


def test_a_file_changed_on_the_server_starts_over(server, npz_bytes, tmp_path):
    """A partial file of the old version is never joined to the new one (If-Range with the ETag)."""
    server.files["/t.npz"] = npz_bytes
    server.mode["/t.npz"] = "drop"
    dest = tmp_path / "c" / "t.npz"
    with pytest.raises(DownloadError):
        download(f"{server.base}/t.npz", dest, attempts=1)
    other = io.BytesIO()
    np.savez(other, a=np.arange(10.0))
    new = other.getvalue()
    server.files["/t.npz"] = new
    download(f"{server.base}/t.npz", dest)
    assert dest.read_bytes() == new and server.requests[-1]["range"] == f"bytes={len(npz_bytes) // 2}-"


def test_a_corrupted_body_is_refused_and_nothing_cached(server, npz_bytes, monkeypatch):
    server.files["/vitkit-test/bad.npz"] = npz_bytes
    server.mode["/vitkit-test/bad.npz"] = "corrupt"
    monkeypatch.setenv("VITKIT_MIRROR", server.base)
    with pytest.raises(DownloadError, match=r"damaged \(MD5 .*x-goog-hash gives .*refused, nothing cached"):
        vitkit.load_pretrained("gs://vitkit-test/bad.npz")
    folder = cache.cache_path(f"{BUCKET}/bad.npz").parent
    assert [p.name for p in folder.iterdir()] == [".bad.npz.lock"]


def test_a_sha256_from_the_table_is_checked(server, npz_bytes, monkeypatch):
    server.files["/vitkit-test/sha.npz"] = npz_bytes
    monkeypatch.setenv("VITKIT_MIRROR", server.base)
    _entry("tiny.badsha", f"{BUCKET}/sha.npz", sha256="0" * 64)
    with pytest.raises(DownloadError, match=f"sha256 {hashlib.sha256(npz_bytes).hexdigest()}, the table gives 0{{64}}"):
        vitkit.load_pretrained("tiny.badsha")
    assert not cache.cache_path(f"{BUCKET}/sha.npz").exists()
    good = _entry("tiny.goodsha", f"{BUCKET}/sha.npz", sha256=hashlib.sha256(npz_bytes).hexdigest())
    assert vitkit.load_pretrained(good.name).load_report.name == "tiny.goodsha"


def test_404_is_one_line(server):
    with pytest.raises(DownloadError) as e:
        vitkit.load_pretrained(f"{server.base}/nothing.npz")
    assert str(e.value) == f"{server.base}/nothing.npz: HTTP 404 (not found)"


def test_a_stalled_server_times_out_quickly(server, npz_bytes, monkeypatch):
    server.files["/slow.npz"] = npz_bytes
    server.mode["/slow.npz"] = "stall"
    monkeypatch.setenv("VITKIT_DOWNLOAD_TIMEOUT", "0.5")
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"no answer for 0.5 s, the server stalled"):
        vitkit.load_pretrained(f"{server.base}/slow.npz")
    assert time.monotonic() - start < 5
    monkeypatch.setenv("VITKIT_DOWNLOAD_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="VITKIT_DOWNLOAD_TIMEOUT must be a number of seconds from 0.1 to 3600"):
        vitkit.load_pretrained(f"{server.base}/slow2.npz")


def test_no_network_is_one_line():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match=r"cannot reach http://127.0.0.1:\d+/x.npz \(.*\); without a network"):
        vitkit.load_pretrained(f"http://127.0.0.1:{port}/x.npz")


def test_an_unwritable_cache_is_one_line(server, npz_bytes, tmp_path, monkeypatch):
    server.files["/t.npz"] = npz_bytes
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "afile" / "cache"))  # fails for root too
    where = r"t\.npz: cannot keep the download at .*afile/cache/127.0.0.1_\d+/t\.npz \(.*afile is a file"
    with pytest.raises(DownloadError, match=where):
        vitkit.load_pretrained(f"{server.base}/t.npz")
    assert not server.requests


def test_a_full_disk_keeps_no_partial_file(server, npz_bytes, tmp_path, monkeypatch):
    server.files["/t.npz"] = npz_bytes

    def full(f, chunk):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download_module, "_write", full)
    dest = tmp_path / "c" / "t.npz"
    with pytest.raises(
        DownloadError, match=rf"{dest}: no space left on device while downloading .*partial file was removed"
    ):
        download(f"{server.base}/t.npz", dest)
    assert [p.name for p in dest.parent.iterdir()] == [".t.npz.lock"]


# -- the Hugging Face hub, offline --------------------------------------------------------------


def _hub_repo(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    """The layout huggingface_hub keeps: refs/main names a revision; its snapshot links to blobs
    named by their sha256 (the hub's ETag of an LFS file)."""
    folder = root / "hub" / f"models--{repo.replace('/', '--')}"
    rev = hashlib.sha1(repo.encode()).hexdigest()
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(rev)
    snap = folder / "snapshots" / rev
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir()
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return folder


def test_a_prepopulated_hub_cache_loads_offline(tiny_model, tmp_path, monkeypatch):
    export_weights(tiny_model, tmp_path / "hfdir", "hf")
    files = {n: (tmp_path / "hfdir" / n).read_bytes() for n in ("config.json", "model.safetensors")}
    proc = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": 16}
    files["preprocessor_config.json"] = json.dumps(proc).encode()
    folder = _hub_repo(tmp_path / "hf", "org/tiny-vit", files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = vitkit.load_pretrained("hf-hub:org/tiny-vit")
    assert _same_outputs(model, tiny_model) and model.load_report.source == "hf"
    assert model.preprocessing == Preprocessing((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), (16, 16), "bicubic")
    # a timm repository: preprocessing from its pretrained_cfg
    export_weights(tiny_model, tmp_path / "timm.safetensors", "timm")
    cfg = {"architecture": "vit_tiny_test", "pretrained_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 0.9}}
    timm_files = {
        "config.json": json.dumps(cfg).encode(),
        "model.safetensors": (tmp_path / "timm.safetensors").read_bytes(),
    }
    _hub_repo(tmp_path / "hf", "timm/tiny", timm_files)
    timm_model = vitkit.load_pretrained("hf-hub:timm/tiny")
    assert _same_outputs(timm_model, tiny_model) and timm_model.preprocessing.crop_pct == 0.9
    assert timm_model.preprocessing.interpolation == "bicubic"
    assert timm_model_name("vit_base_patch16_224") == "vit_b16" and timm_model_name("deit_tiny") is None
    # missing from the cache, offline: one line with the file and its address
    with pytest.raises(DownloadError) as e:
        vitkit.load_pretrained("hf-hub:org/absent")
    assert "model.safetensors is not in the Hugging Face cache" in str(e.value)
    assert str(e.value).endswith("it would come from https://huggingface.co/org/absent/resolve/main/model.safetensors")
    # a damaged blob is refused
    blob = next(
        p for p in (folder / "blobs").iterdir() if p.name == hashlib.sha256(files["model.safetensors"]).hexdigest()
    )
    blob.write_bytes(files["model.safetensors"][:-1] + b"\0")
    with pytest.raises(DownloadError, match="model.safetensors in the hub cache is damaged"):
        vitkit.load_pretrained("hf-hub:org/tiny-vit")


# -- create_model, the CLI ----------------------------------------------------------------------


def test_create_model_with_a_pretrained_tag(server, tmp_path, monkeypatch):
    torch.manual_seed(0)
    full = vitkit.create_model("vit_ti16", img_size=16, num_classes=3).eval()  # the real Ti/16 shape, tiny input
    vitkit.save_checkpoint(full, tmp_path / "ti.safetensors")
    server.files["/vitkit-test/ti.safetensors"] = (tmp_path / "ti.safetensors").read_bytes()
    monkeypatch.setenv("VITKIT_MIRROR", server.base)
    register_pretrained(Pretrained("vit_ti16.test_tag", "vit_ti16", f"{BUCKET}/ti.safetensors", 16, "test"))
    model = vitkit.create_model("ViT-Ti/16", pretrained="test_tag")
    assert _same_outputs(model, full) and model.load_report.name == "vit_ti16.test_tag"
    resized = vitkit.create_model("vit_ti16", pretrained="gs://vitkit-test/ti.safetensors", img_size=32)
    assert resized.cfg.img_size == (32, 32) and len(server.requests) == 1
    with pytest.raises(vitkit.CheckpointError, match="weights do not fit vit_s16"):
        vitkit.create_model("vit_s16", pretrained="vit_ti16.test_tag")
    assert vitkit.create_model("vit_ti16", depth=1).cfg.depth == 1  # no pretrained: random, as before


def test_cli_convert_predict_eval_and_models_with_names(server, npz_bytes, tiny_model, tmp_path, monkeypatch, capsys):
    server.files["/vitkit-test/tiny.npz"] = npz_bytes
    monkeypatch.setenv("VITKIT_MIRROR", server.base)
    _entry("tiny.cli", f"{BUCKET}/tiny.npz")
    out = tmp_path / "out.safetensors"
    assert main(["convert", "tiny.cli", str(out)]) == 0
    converted = vitkit.load_pretrained(out)
    assert _same_outputs(converted, tiny_model) and converted.preprocessing.crop_pct == 0.875
    image = tmp_path / "img.png"
    Image.new("RGB", (20, 20), (200, 30, 30)).save(image)
    assert main(["predict", "tiny.cli", str(image), "--top-k", "2"]) == 0
    assert main(["eval", "tiny.cli", "--data", "synthetic", "--max-images", "8", "--out", str(tmp_path / "ev")]) == 0
    text = capsys.readouterr().out
    assert "img.png" in text and "top-1" in text and len(server.requests) == 1
    assert main(["models", "--pretrained", "ViT-B/16", "--json", str(tmp_path / "t.json")]) == 0
    table = capsys.readouterr().out
    assert re.search(r"vit_b16\.augreg_in21k_ft_in1k\s+augreg\s+384\s+ImageNet-21k -> ImageNet-1k\s+85\.49", table)
    assert "vit_s16" not in table
    rows = json.loads((tmp_path / "t.json").read_text())
    b16 = next(r for r in rows if r["name"] == "vit_b16.in21k_ft_in1k")
    assert b16["top1"] == 84.0 and b16["preprocessing"]["img_size"] == [384, 384] and b16["licence"] == "Apache-2.0"
    assert main(["predict", "vit_b16.augreg_in21k_ft_in1kk", str(image)]) == 2
    assert "did you mean vit_b16.augreg_in21k_ft_in1k" in capsys.readouterr().err


def test_crop_pct_is_applied_to_images_and_kept_in_files():
    im = Image.new("RGB", (40, 40), (0, 0, 0))
    im.paste((255, 255, 255), (5, 5, 35, 35))  # a white square over the middle three quarters
    cropped = prepare_images([("a", im)], Preprocessing(img_size=(8, 8), crop_pct=0.5), 3)
    assert cropped.pixels.min() == 255  # resized to 16, the central 8 is all white
    resized = prepare_images([("a", im)], Preprocessing(img_size=(8, 8)), 3)
    assert resized.pixels.min() < 50  # without the crop the black border shows
    assert "crop_pct" not in Preprocessing().to_dict()
    assert Preprocessing.from_dict(Preprocessing(crop_pct=0.9).to_dict()).crop_pct == 0.9
    # a non-square photo, as timm's eval transform: shorter side to floor(16 / 0.8) = 20, keeping
    # the aspect ratio (50 x 20 -> 50 x 20), then the central 16 x 16: never squashed
    wide = Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 50, 3), dtype=np.uint8))
    got = prepare_images([("w", wide)], Preprocessing(img_size=(16, 16), crop_pct=0.8, interpolation="bicubic"), 3)
    want = np.asarray(wide.resize((50, 20), Image.Resampling.BICUBIC).crop((17, 2, 33, 18)))
    assert got.pixels.shape == (1, 16, 16, 3) and np.array_equal(got.pixels[0], want)


def test_concurrent_loads_download_once(server, npz_bytes, tmp_path):
    """Ranks of one job asking for the same file at once: one download, every copy whole."""
    server.files["/t.npz"] = npz_bytes
    dest = tmp_path / "c" / "t.npz"
    results: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: results.append(download(f"{server.base}/t.npz", dest).read_bytes()))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [npz_bytes] * 3 and len(server.requests) == 1


def test_eval_inputs_use_the_weights_crop_and_interpolation(tiny_model):
    """What ``vitkit eval`` feeds the model: centre crop and interpolation of model.preprocessing."""
    from vitkit.data import build_dataset
    from vitkit.eval.features import model_inputs
    from vitkit.preprocessing import normalize

    data = build_dataset("synthetic", "test")
    raw, _ = next(data.batches(4, shuffle=False))  # (B, C, 32, 32) uint8
    centre = raw[..., 4:28, 4:28].float()  # 0.75 of each side: 24 x 24
    model = copy.deepcopy(tiny_model)
    for mode in ("bicubic", "bilinear"):
        model.preprocessing = Preprocessing(img_size=(16, 16), interpolation=mode, crop_pct=0.75)
        x, _ = next(model_inputs(model, data, batch_size=4))
        resized = torch.nn.functional.interpolate(centre, size=(16, 16), mode=mode, antialias=True)
        assert torch.allclose(x, normalize(resized, (0.5,) * 3, (0.5,) * 3), atol=1e-4), mode
    model.preprocessing = Preprocessing(img_size=(16, 16))
    plain, _ = next(model_inputs(model, data, batch_size=4))
    assert not torch.allclose(plain, x, atol=1e-2)
