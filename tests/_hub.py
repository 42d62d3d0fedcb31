"""A stand-in, on 127.0.0.1, for the two servers vitkit downloads weights from by name: Google Cloud
Storage (the official and AugReg releases; vitkit reaches it through ``VITKIT_MIRROR``) and the
Hugging Face hub (``hf-hub:`` names; huggingface_hub reaches it through ``HF_ENDPOINT``).

The files of vitkit's table of names are there (the official and AugReg releases; Google's ViT
and Meta's DINOv2 and DINOv3 repositories on the hub): each is made on its first request, with
random weights of the real shape in its publisher's format (an official ``.npz``; a repository's
``config.json``, ``model.safetensors`` and ``preprocessor_config.json``, as its publisher wrote
them), then kept for the rest of the test session. The answers carry what the real servers send
and the downloaders check: the length, an ETag, the MD5 of Google's ``x-goog-hash``, the hub's
commit and a large file's sha256; ``Range`` requests resume. An address it has no file for is
answered 404 (the hub's ``RepoNotFound`` or ``EntryNotFound``), naming it.

It is also the proxy of the examples' environment (:meth:`HubStandIn.env`), and refuses to be
one: an address that is neither a name's file nor on 127.0.0.1 fails at once instead of reaching
the network.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import re
import shutil
import sys
import threading
import traceback
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

GCS_HOST = "storage.googleapis.com"
HF_HOST = "huggingface.co"
HF_FILES = ("config.json", "model.safetensors", "preprocessor_config.json")
# What vitkit and huggingface_hub wait for before giving up (the first request of a file makes it:
# seconds of CPU, longer on a busy machine).
PATIENCE = "600"

IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
RESCALE = {"do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_resize": True}
# The preprocessor_config.json of each family's repositories, as their publishers wrote them.
PROCESSORS = {
    "vit": {
        "feature_extractor_type": "ViTFeatureExtractor",
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "size": 224,
        "do_normalize": True,
        "do_resize": True,
    },
    "dinov2": {
        "image_processor_type": "BitImageProcessor",
        **IMAGENET,
        **RESCALE,
        "resample": 3,
        "size": {"shortest_edge": 256},
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "do_convert_rgb": True,
    },
    "dinov3": {
        "image_processor_type": "DINOv3ViTImageProcessorFast",
        **IMAGENET,
        **RESCALE,
        "resample": 2,
        "size": {"height": 224, "width": 224},
    },
}


@dataclass(frozen=True)
class Served:
    """A file as the server answers for it: its size and the digest its ETag gives (the MD5 of
    Google's objects; on the hub, the sha256 of a large file kept in LFS, the git blob's sha1 of
    a small one)."""

    path: Path
    size: int
    digest: bytes


def _describe(path: Path, kind: str) -> Served:
    """``kind``: "md5", "sha256" or "git" (the sha1 of the git blob)."""
    size = path.stat().st_size
    if kind == "git":
        h = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    else:
        h = hashlib.new(kind, usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return Served(path, size, h.digest())


def random_fill(model, seed: int = 0) -> None:
    """Every parameter and buffer of ``model``, in place: N(0, 0.02), the scale of ViT's init."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.normal_(0, 0.02, generator=gen)


def official_npz(name: str, dest: Path) -> None:
    """The official ``.npz`` of a name of vitkit's table: its model at its resolution, with a head
    of 21843 classes (pre-trained on ImageNet-21k) or 1000 (fine-tuned), and the pre-logits
    layer of the 2020 release's pre-trained files."""
    import vitkit
    from vitkit.export import export_weights
    from vitkit.hub import find

    entry = find(name)
    pretrained_only = not entry.finetune
    representation = vitkit.model_config(entry.model).width if pretrained_only and entry.source == "official" else None
    model = vitkit.create_model(
        entry.model,
        img_size=entry.resolution,
        num_classes=21843 if pretrained_only else 1000,
        representation_size=representation,
    )
    export_weights(model, dest, "official")


def hub_family(repo: str) -> str | None:
    """Whose files a hub repository holds: ``vit`` (Google's ViT), ``dinov2`` or ``dinov3``
    (Meta's); None for the others (timm's, CLIP, SigLIP...), which have no stand-in."""
    for prefix, family in (("google/vit-", "vit"), ("facebook/dinov2-", "dinov2"), ("facebook/dinov3-", "dinov3")):
        if repo.startswith(prefix):
            return family
    return None


def hub_repository(repo: str, model: str, folder: Path) -> None:
    """The files of a hub repository of the ``vit``, ``dinov2`` or ``dinov3`` family for the vitkit
    model its name stands for: Google's ViT as vitkit exports it, Meta's models through
    transformers' own classes (their ``save_pretrained``), and the ``preprocessor_config.json``
    the publisher wrote."""
    import vitkit

    family = hub_family(repo)
    cfg = vitkit.model_config(model)
    if family == "vit":
        from vitkit.export import export_weights

        export_weights(vitkit.create_model(model), folder, "hf")
    else:
        import torch
        import transformers as t

        common = dict(hidden_size=cfg.width, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads)
        swiglu = cfg.mlp_type == "swiglu"
        if family == "dinov3":
            kind = t.DINOv3ViTModel
            config = t.DINOv3ViTConfig(
                **common,
                intermediate_size=cfg.mlp_dim,
                patch_size=cfg.patch_size[0],
                num_register_tokens=cfg.num_registers,
                use_gated_mlp=swiglu,
            )
        else:
            registers = cfg.num_registers > 0
            kind = t.Dinov2WithRegistersModel if registers else t.Dinov2Model
            config = (t.Dinov2WithRegistersConfig if registers else t.Dinov2Config)(
                **common,
                mlp_ratio=cfg.mlp_dim // cfg.width,
                image_size=518,
                patch_size=cfg.patch_size[0],
                use_swiglu_ffn=swiglu,
                **({"num_register_tokens": cfg.num_registers} if registers else {}),
            )
        with torch.device("meta"):
            peer = kind(config)
        peer = peer.to_empty(device="cpu")
        random_fill(peer)
        peer.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PROCESSORS[family], indent=2))


class HubStandIn:
    """The server, on a free port of 127.0.0.1, keeping the files it made under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, Served] = {}
        self._lock = threading.Lock()
        self._making: dict[str, threading.Lock] = {}
        self._failed: dict[str, str] = {}  # what could not be made, and why: not tried again
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                stand_in.answer(self, body=True)

            def do_HEAD(self) -> None:
                stand_in.answer(self, body=False)

            def do_CONNECT(self) -> None:  # asked to be a proxy: nothing leaves this machine
                self.send_error(403, "the examples reach no server but the stand-in")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """The environment that sends vitkit's and huggingface_hub's downloads here, and every
        other address nowhere (this server is the proxy, and refuses)."""
        proxy = {name: self.base for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
        return {
            "VITKIT_MIRROR": f"{self.base}/{GCS_HOST}",
            "HF_ENDPOINT": f"{self.base}/{HF_HOST}",
            "VITKIT_DOWNLOAD_TIMEOUT": PATIENCE,
            "HF_HUB_ETAG_TIMEOUT": PATIENCE,
            "HF_HUB_DOWNLOAD_TIMEOUT": PATIENCE,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            **proxy,
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the files ------------------------------------------------------------------------------

    def _made(self, key: str, make) -> None:
        """Run ``make(folder)`` once for ``key`` (its files go in ``root/key``), however many ask."""
        with self._lock:
            lock = self._making.setdefault(key, threading.Lock())
        with lock:
            folder = self.root / key
            if key in self._failed:
                raise RuntimeError(self._failed[key])
            if folder.is_dir():
                return
            partial = self.root / f"{key}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            try:
                make(partial)
            except Exception as e:
                self._failed[key] = f"{key}: {type(e).__name__}: {e}"
                raise
            partial.rename(folder)

    def _served(self, key: str, path: Path, kind: str) -> Served | None:
        if not path.is_file():
            return None
        with self._lock:
            if key not in self.files:
                self.files[key] = _describe(path, kind)
            return self.files[key]

    def gcs_file(self, path: str) -> Served | None:
        """The file of ``https://storage.googleapis.com/PATH``, if it is a name's."""
        from vitkit.hub import find

        url = f"https://{GCS_HOST}/{path}"
        entry = find(url)
        if entry is None or entry.model is None or not path.endswith(".npz"):
            return None
        key = f"{GCS_HOST}/{path}"
        self._made(key, lambda folder: official_npz(entry.name, folder / "weights.npz"))
        return self._served(key, self.root / key / "weights.npz", "md5")

    def hub_repo(self, repo: str) -> Path | None:
        """The folder of a hub repository of vitkit's table, made if need be; None if it has no
        stand-in."""
        from vitkit.hub import find

        entry = find(f"hf-hub:{repo}")
        if entry is None or entry.model is None or hub_family(repo) is None:
            return None
        key = f"{HF_HOST}/{repo}"
        self._made(key, lambda folder: hub_repository(repo, entry.model, folder))
        return self.root / key

    # -- the answers ----------------------------------------------------------------------------

    def answer(self, h: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(h.path).path).lstrip("/")
        try:
            if path.startswith(f"{GCS_HOST}/"):
                rest = path[len(GCS_HOST) + 1 :]
                served = self.gcs_file(rest)
                if served is None:
                    return self._missing(h, f"no stand-in for https://{GCS_HOST}/{rest}")
                md5 = {
                    "ETag": f'"{served.digest.hex()}"',
                    "x-goog-hash": f"md5={base64.b64encode(served.digest).decode()}",
                }
                return self._send(h, served, body, md5)
            m = re.fullmatch(rf"{HF_HOST}/([\w.-]+/[\w.-]+)/resolve/([^/]+)/(.+)", path)
            if m:
                return self._hub(h, m.group(1), m.group(3), body)
            return self._missing(h, f"no stand-in for {h.path}")
        except Exception as e:  # the test's output shows why; the example sees an HTTP 500
            traceback.print_exc(file=sys.stderr)
            h.send_error(500, "the stand-in could not make the file", str(e)[:500])

    def _hub(self, h: http.server.BaseHTTPRequestHandler, repo: str, filename: str, body: bool) -> None:
        folder = self.hub_repo(repo)
        if folder is None:
            return self._missing(h, f"no stand-in for the hub repository {repo}", {"X-Error-Code": "RepoNotFound"})
        commit = hashlib.sha1(repo.encode(), usedforsecurity=False).hexdigest()
        large = filename.endswith(".safetensors")  # kept in LFS, named by its sha256
        key, kind = f"{HF_HOST}/{repo}/{filename}", "sha256" if large else "git"
        served = self._served(key, folder / filename, kind) if filename in HF_FILES else None
        if served is None:
            error = {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}
            return self._missing(h, f"{repo} has no {filename}", error)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{served.digest.hex()}"'}
        if large:
            headers.update({"X-Linked-Etag": headers["ETag"], "X-Linked-Size": str(served.size)})
        self._send(h, served, body, headers)

    @staticmethod
    def _missing(h: http.server.BaseHTTPRequestHandler, why: str, headers: dict[str, str] | None = None) -> None:
        print(f"hub stand-in: 404, {why}", file=sys.stderr)  # in the output of a test that fails
        text = why.encode()
        h.send_response(404)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("X-Error-Message", why)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(text)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(text)

    @staticmethod
    def _send(h: http.server.BaseHTTPRequestHandler, served: Served, body: bool, headers: dict[str, str]) -> None:
        start = 0
        etag = headers["ETag"]
        m = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range") or "")
        if m and h.headers.get("If-Range") in (None, etag) and int(m.group(1)) < served.size:
            start = int(m.group(1))
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{served.size - 1}/{served.size}")
        else:
            h.send_response(200)
        for k, v in headers.items():
            h.send_header(k, v)
        json_file = served.path.suffix == ".json"
        h.send_header("Content-Type", "application/json" if json_file else "application/octet-stream")
        h.send_header("Content-Length", str(served.size - start))
        h.end_headers()
        if not body:
            return
        with open(served.path, "rb") as f:
            f.seek(start)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client went away
                shutil.copyfileobj(f, h.wfile, 1 << 20)
