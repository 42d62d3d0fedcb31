"""What the download cache refuses to keep, against a local HTTP server on 127.0.0.1 that
misbehaves on purpose: error pages served with status 200, bodies cut short (with and without a
Content-Length), lengths that lie, a file of one format under another's name, query strings and
fragments, cache folders in the way, out-of-range timeouts, and cached files damaged after the
fact. Each refusal is one line naming the address and the cache file, and leaves nothing under
the cache file's name, so a later call, once the server is fixed, downloads the real file."""

from __future__ import annotations

import http.server
import io
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save as safetensors_bytes

import vitkit
from vitkit.errors import CheckpointError, DownloadError, UsageError
from vitkit.export import export_weights
from vitkit.hub import cache
from vitkit.hub.download import download, partial_path

TINY = dict(img_size=16, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=10)

HTML = b"<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head><body>Access denied</body></html>\n"
PAGES = {  # what servers answer with status 200 instead of the file: (body, Content-Type)
    "html": (HTML, "text/html; charset=utf-8"),
    "html-untyped": (b"  \n<html><body>Sign in to continue</body></html>", None),
    "xml": (b'<?xml version="1.0"?><Error><Code>AccessDenied</Code></Error>', "application/xml"),
    "json": (b'{"error": "token expired"}', "application/json"),
    "plain": (b"Service temporarily unavailable, try again later.\n", "text/plain"),
}


@dataclass
class Route:
    """One path's answer: ``length`` is the Content-Length sent ("auto": the body's, None: none,
    the body then ending when the connection closes)."""

    body: bytes
    content_type: str | None = "application/octet-stream"
    length: int | str | None = "auto"
    etag: str | None = None


class Server:
    """A server that answers each path as its :class:`Route` says, HTTP/1.0 (the connection
    closes after each answer), recording the path and query of every request."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append(self.path)
                route = server.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                if route.content_type:
                    self.send_header("Content-Type", route.content_type)
                if route.length is not None:
                    n = len(route.body) if route.length == "auto" else route.length
                    self.send_header("Content-Length", str(n))
                if route.etag:
                    self.send_header("ETag", route.etag)
                self.end_headers()
                self.wfile.write(route.body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def environment(tmp_path, monkeypatch):
    """A private cache, online, no mirror or timeout from the machine running the tests."""
    for name in ("VITKIT_OFFLINE", "VITKIT_MIRROR", "VITKIT_DOWNLOAD_TIMEOUT", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return vitkit.create_model("vit_ti16", **TINY).eval()


@pytest.fixture(scope="module")
def weights(tiny_model, tmp_path_factory) -> dict[str, bytes]:
    """The tiny model as each format the cache checks: vitkit safetensors, official .npz, and
    PyTorch files (the zip layout, and the older single-pickle one)."""
    folder = tmp_path_factory.mktemp("weights")
    vitkit.save_checkpoint(tiny_model, folder / "w.safetensors")
    export_weights(tiny_model, folder / "w.npz", "official")
    state = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    torch.save(state, folder / "zip.bin")
    torch.save(state, folder / "legacy.bin", _use_new_zipfile_serialization=False)
    return {
        ".safetensors": (folder / "w.safetensors").read_bytes(),
        ".npz": (folder / "w.npz").read_bytes(),
        ".bin": (folder / "zip.bin").read_bytes(),
        "legacy.bin": (folder / "legacy.bin").read_bytes(),
    }


def _same_outputs(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.allclose(a(x), b(x), atol=1e-5)


def _refused(url: str, load=None) -> str:
    """The one-line DownloadError that fetching ``url`` gives; nothing under the cache file's name."""
    with pytest.raises(DownloadError) as e:
        (load or vitkit.load_pretrained)(url)
    text = str(e.value)
    dest = cache.cache_path(url)
    assert "\n" not in text and "Traceback" not in text
    assert cache.fetch_address(url) in text and str(dest) in text, text
    assert ".download.tmp" not in text and ".state.tmp" not in text
    assert not dest.exists()
    return text


def _nothing_left(url: str) -> None:
    """The refused body is gone too: only the lock file stays beside the cache file."""
    dest = cache.cache_path(url)
    assert sorted(p.name for p in dest.parent.iterdir()) == [f".{dest.name}.lock"]


# -- bodies that are not the file ---------------------------------------------------------------


@pytest.mark.parametrize("page", sorted(PAGES))
@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".bin"])
def test_an_error_page_served_with_200_is_refused(server, weights, tiny_model, page, suffix):
    body, kind = PAGES[page]
    server.routes[f"/w{suffix}"] = Route(body, kind)
    url = f"{server.base}/w{suffix}"
    text = _refused(url)
    what = "a web page" if page.startswith(("html", "xml")) else "text"
    assert f"the server sent {what}, not weights" in text and "refused, nothing cached at" in text
    _nothing_left(url)
    # the host is fixed: the next call downloads the file, since nothing bad was cached
    server.routes[f"/w{suffix}"] = Route(weights[suffix])
    if suffix == ".bin":
        assert download(url, cache.cache_path(url)).read_bytes() == weights[suffix]
    else:
        assert _same_outputs(vitkit.load_pretrained(url), tiny_model)
    assert len(server.requests) == 2


def test_an_empty_body_is_refused(server):
    server.routes["/w.npz"] = Route(b"")
    text = _refused(f"{server.base}/w.npz")
    assert "the server sent an empty body, not weights" in text


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".bin"])
@pytest.mark.parametrize("keep", [0.1, 0.5, 0.999])
def test_a_body_cut_short_without_a_length_is_refused(server, weights, tiny_model, suffix, keep):
    data = weights[suffix]
    server.routes[f"/w{suffix}"] = Route(data[: int(len(data) * keep)], length=None)
    url = f"{server.base}/w{suffix}"
    text = _refused(url)
    assert f"not a valid {suffix} file (" in text and "the server announced no length" in text
    _nothing_left(url)
    server.routes[f"/w{suffix}"] = Route(data, length=None)  # whole, still without a length: it parses
    assert download(url, cache.cache_path(url)).read_bytes() == data


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
@pytest.mark.parametrize("short", [1, 100, "half"])
def test_a_content_length_shorter_than_the_file_is_refused(server, weights, tiny_model, suffix, short):
    data = weights[suffix]
    announced = len(data) // 2 if short == "half" else len(data) - short
    server.routes[f"/w{suffix}"] = Route(data, length=announced)  # the client reads only what was announced
    url = f"{server.base}/w{suffix}"
    text = _refused(url)
    assert f"not a valid {suffix} file (" in text
    _nothing_left(url)
    server.routes[f"/w{suffix}"] = Route(data)
    assert _same_outputs(vitkit.load_pretrained(url), tiny_model)


@pytest.mark.parametrize("extra", [1, 1000])
@pytest.mark.parametrize("etag", [None, '"v1"'])
def test_a_content_length_longer_than_the_body_is_refused(server, weights, tiny_model, extra, etag):
    data = weights[".npz"]
    server.routes["/w.npz"] = Route(data, length=len(data) + extra, etag=etag)
    url = f"{server.base}/w.npz"
    text = _refused(url)
    assert f"the server announced {len(data) + extra} bytes and sent {len(data)}" in text
    assert "nothing cached at" in text and len(server.requests) == 3  # the attempts of one call
    server.routes["/w.npz"] = Route(data, etag=etag)
    assert _same_outputs(vitkit.load_pretrained(url), tiny_model)
    assert not partial_path(cache.cache_path(url)).exists()


@pytest.mark.parametrize(
    "served, name, reads_as",
    [
        (".npz", "w.safetensors", "a .npz file"),
        (".safetensors", "w.npz", "a .safetensors file"),
        (".npz", "w.bin", "a .npz file"),
        (".safetensors", "w.pth", "a .safetensors file"),
        (".bin", "w.npz", "a PyTorch file"),
        (".bin", "w.safetensors", "a PyTorch file"),
    ],
)
def test_a_file_of_another_format_is_refused(server, weights, served, name, reads_as):
    server.routes[f"/{name}"] = Route(weights[served])
    url = f"{server.base}/{name}"
    text = _refused(url)
    suffix = Path(name).suffix
    assert f"not a valid {suffix} file (" in text
    assert f"; it reads as {reads_as}: the address's name does not match the file" in text
    _nothing_left(url)


def test_a_damaged_archive_member_is_refused(server, weights):
    """A flipped byte inside an array: the zip's CRC32 of that member catches it."""
    data = bytearray(weights[".npz"])
    data[len(data) // 3] ^= 0xFF
    server.routes["/w.npz"] = Route(bytes(data))
    text = _refused(f"{server.base}/w.npz")
    assert "not a valid .npz file (member" in text and "does not match its CRC32); refused, nothing cached" in text
    assert "reads as" not in text


def test_pytorch_files_are_checked_without_unpickling(server, weights, tmp_path):
    """The zip layout is checked as a zip; the older pickle layout only by its magic number, so
    it is kept only when the server announced a length that the body matched."""
    dest = tmp_path / "c" / "legacy.bin"
    server.routes["/legacy.bin"] = Route(weights["legacy.bin"])
    assert download(f"{server.base}/legacy.bin", dest).read_bytes() == weights["legacy.bin"]
    server.routes["/unknown-length.bin"] = Route(weights["legacy.bin"], length=None)
    with pytest.raises(DownloadError, match="older pickle layout, whose length cannot be checked"):
        download(f"{server.base}/unknown-length.bin", tmp_path / "c" / "unknown-length.bin")
    assert not (tmp_path / "c" / "unknown-length.bin").exists()
    server.routes["/zip.pt"] = Route(weights[".bin"], length=None)  # a zip checks its own length
    assert download(f"{server.base}/zip.pt", tmp_path / "c" / "zip.pt").read_bytes() == weights[".bin"]
    server.routes["/cut.pt"] = Route(weights[".bin"][:-50], length=None)
    with pytest.raises(DownloadError, match=r"not a valid \.pt file \(a zip archive without its directory \(cut short"):
        download(f"{server.base}/cut.pt", tmp_path / "c" / "cut.pt")


# -- query strings and fragments ----------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    ["?token=abc", "?token=abc#frag", "?X-Amz-Expires=3600&X-Amz-Signature=0f1e2d&name=w.bin", "#part"],
)
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_a_query_string_is_sent_but_does_not_name_the_format(server, weights, tiny_model, suffix, tail):
    server.routes[f"/d/w{suffix}"] = Route(weights[suffix])
    url = f"{server.base}/d/w{suffix}{tail}"
    model = vitkit.load_pretrained(url)
    assert _same_outputs(model, tiny_model)
    dest = cache.cache_path(url)
    assert dest.suffix == suffix and dest.is_file() and model.load_report.path == str(dest)
    query = tail.split("#")[0]
    assert server.requests == [f"/d/w{suffix}{query}"]  # the query is asked, the fragment never sent
    assert "token" not in dest.name and "Signature" not in dest.name  # no secret in a file name
    vitkit.load_pretrained(url)  # from the cache
    assert len(server.requests) == 1


def test_different_queries_are_different_cache_files(server, weights, tiny_model):
    server.routes["/w.npz"] = Route(weights[".npz"])
    a, b = f"{server.base}/w.npz?token=abc", f"{server.base}/w.npz?token=abd"
    assert len({cache.cache_path(a), cache.cache_path(b), cache.cache_path(f"{server.base}/w.npz")}) == 3
    assert cache.cache_path(a) == cache.cache_path(a + "#frag")
    vitkit.load_pretrained(a)
    vitkit.load_pretrained(b)
    assert len(server.requests) == 2


def test_a_query_string_address_refused_names_its_cache_file(server):
    server.routes["/w.safetensors"] = Route(HTML, "text/html")
    url = f"{server.base}/w.safetensors?token=abc#x"
    text = _refused(url)
    assert text.startswith(f"{server.base}/w.safetensors?token=abc: the server sent a web page, not weights")


def test_an_address_without_a_weight_suffix_is_refused_before_downloading(server):
    for url in (f"{server.base}/download?file=w.npz", f"{server.base}/weights/latest", f"{server.base}/w.ckpt?x=1"):
        with pytest.raises(UsageError, match=r"ends in none of \.npz, \.safetensors, \.bin, \.pth, \.pt, the suffixes"):
            vitkit.load_pretrained(url)
    assert not server.requests


# -- files already in the cache -----------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    ["html", "truncated", "padded", "other-format", "empty"],
)
def test_a_bad_cached_file_is_named_with_how_to_refresh_it(server, weights, tiny_model, damage, monkeypatch):
    """A file under the cache's name that is not what it should be (kept by a vitkit that did not
    check, or damaged since) is refused as a cached file, naming it, never as a format error."""
    server.routes["/w.safetensors"] = Route(weights[".safetensors"])
    url = f"{server.base}/w.safetensors"
    dest = cache.cache_path(url)
    dest.parent.mkdir(parents=True)
    data = weights[".safetensors"]
    dest.write_bytes(
        {
            "html": HTML,
            "truncated": data[:-7],
            "padded": data + b"\0" * 7,
            "other-format": weights[".npz"],
            "empty": b"",
        }[damage]
    )
    for offline in (True, False):
        if offline:
            monkeypatch.setenv("VITKIT_OFFLINE", "1")
        else:
            monkeypatch.delenv("VITKIT_OFFLINE")
        with pytest.raises(DownloadError) as e:
            vitkit.load_pretrained(url)
        text = str(e.value)
        assert text.startswith(f"{dest}: the cached copy of {url} fails verification: ")
        assert text.endswith(f"delete it (rm '{dest}') to download it again") and "\n" not in text
    assert not server.requests
    dest.unlink()
    assert _same_outputs(vitkit.load_pretrained(url), tiny_model) and len(server.requests) == 1


def test_a_cached_file_of_the_wrong_size_for_the_table_is_named(server, weights, monkeypatch):
    from vitkit.hub import Pretrained, register_pretrained

    data = weights[".npz"]
    monkeypatch.setenv("VITKIT_MIRROR", server.base)
    url = "https://storage.googleapis.com/vitkit-test/sized.npz"
    register_pretrained(Pretrained("tiny.sized", None, url, 16, "test", source="user", size=len(data) + 1))
    dest = cache.cache_path(url)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(data)
    with pytest.raises(DownloadError, match=rf"fails verification: {len(data)} bytes, the table gives {len(data) + 1}"):
        vitkit.load_pretrained("tiny.sized")


def test_a_read_error_of_a_cached_file_says_it_is_the_cached_copy(server):
    """A file that passes every check but holds no ViT: the reader's error, with where it came from."""
    server.routes["/other.safetensors"] = Route(safetensors_bytes({"linear.weight": torch.zeros(2, 2)}))
    url = f"{server.base}/other.safetensors"
    with pytest.raises(CheckpointError) as e:
        vitkit.load_pretrained(url)
    text = str(e.value)
    assert text.startswith(f"{cache.cache_path(url)}: tensors are not a ViT")
    assert f"the file is the cached copy of {url}: if it is damaged, delete it to download it again" in text


# -- the cache folder ---------------------------------------------------------------------------


def test_a_file_where_a_cache_folder_goes_names_the_cache_file(server, weights, tmp_path, monkeypatch):
    server.routes["/a/w.npz"] = Route(weights[".npz"])
    url = f"{server.base}/a/w.npz"
    host = cache.cache_path(url).parent.parent
    host.mkdir(parents=True)
    (host / "a").write_text("a file")
    text = _refused(url)
    assert f"cannot keep the download at {cache.cache_path(url)} ({host / 'a'} is a file, not a folder)" in text
    assert f"remove {host / 'a'}" in text and not server.requests
    (host / "a").unlink()
    vitkit.load_pretrained(url)
    # the same when VITKIT_CACHE itself is a file
    (tmp_path / "plain").write_text("x")
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "plain"))
    text = _refused(url)
    assert f"({tmp_path / 'plain'} is a file, not a folder)" in text


def test_a_folder_where_the_cache_file_goes_is_named(server, weights):
    server.routes["/w.npz"] = Route(weights[".npz"])
    url = f"{server.base}/w.npz"
    dest = cache.cache_path(url)
    dest.mkdir(parents=True)
    with pytest.raises(DownloadError) as e:
        vitkit.load_pretrained(url)
    assert str(e.value) == (
        f"{url}: cannot keep the download at {dest} (a folder is there); remove the folder {dest}, "
        "or set VITKIT_CACHE to another folder"
    )
    assert not server.requests


def test_a_folder_where_the_partial_download_goes_names_the_cache_file(server, weights):
    server.routes["/w.npz"] = Route(weights[".npz"])
    url = f"{server.base}/w.npz"
    dest = cache.cache_path(url)
    partial_path(dest).mkdir(parents=True)
    with pytest.raises(DownloadError) as e:
        vitkit.load_pretrained(url)
    text = str(e.value)
    assert text.startswith(f"{url}: cannot keep the download at {dest} (") and ".download.tmp" not in text


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_cache_folder_names_the_cache_file(server, weights):
    server.routes["/w.npz"] = Route(weights[".npz"])
    url = f"{server.base}/w.npz"
    folder = cache.cache_path(url).parent
    folder.mkdir(parents=True)
    folder.chmod(0o500)
    try:
        text = _refused(url)
    finally:
        folder.chmod(0o700)
    assert "Permission denied" in text and "set VITKIT_CACHE to a folder you can write" in text


# -- the timeout --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "0", "1e12", "abc", "1e-9", "3601"])
def test_a_timeout_out_of_range_is_refused(server, weights, value, monkeypatch):
    server.routes["/w.npz"] = Route(weights[".npz"])
    monkeypatch.setenv("VITKIT_DOWNLOAD_TIMEOUT", value)
    with pytest.raises(UsageError) as e:
        vitkit.load_pretrained(f"{server.base}/w.npz")
    assert str(e.value) == f"VITKIT_DOWNLOAD_TIMEOUT must be a number of seconds from 0.1 to 3600, got {value!r}"
    assert not server.requests


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0, 0.0, 1e12])
def test_a_timeout_argument_out_of_range_is_refused(server, tmp_path, value):
    with pytest.raises(UsageError, match=r"^timeout must be a number of seconds from 0\.1 to 3600, got"):
        download(f"{server.base}/w.npz", tmp_path / "w.npz", timeout=value)
    assert not server.requests


@pytest.mark.parametrize("value", [" 5 ", "0.1", "3600", "1e2"])
def test_a_timeout_in_range_is_used(value, monkeypatch):
    monkeypatch.setenv("VITKIT_DOWNLOAD_TIMEOUT", value)
    assert cache.timeout() == float(value)


def test_npz_written_by_numpy_passes(server, tmp_path):
    """Any archive of arrays numpy writes, compressed or not, is a valid .npz to the cache."""
    for name, save in (("plain.npz", np.savez), ("small.npz", np.savez_compressed)):
        buf = io.BytesIO()
        save(buf, a=np.arange(100.0), b=np.ones((3, 4), np.float32))
        server.routes[f"/{name}"] = Route(buf.getvalue(), length=None)
        assert download(f"{server.base}/{name}", tmp_path / name).read_bytes() == buf.getvalue()
