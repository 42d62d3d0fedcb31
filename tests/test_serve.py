"""``vitkit serve``: the answers over HTTP are the model's own, every bad input is a 4xx with one
line, a full queue is a 503, batches form, the metrics count, and SIGTERM drains and exits 0.
Servers listen on 127.0.0.1, on a free port; every wait is bounded."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("multipart")

from vitkit.serve import Batcher, ModelService, QueueFull, ServeOptions, build_app

TINY = {"img_size": 32, "patch_size": 8, "depth": 2, "width": 32, "num_heads": 2, "mlp_dim": 64, "num_classes": 3}
CLASSES = ["cat", "dog", "owl"]
SRC = Path(vitkit.__file__).parent.parent


def _tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    model = vitkit.create_model("vit_ti16", **TINY)
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)  # the zero-initialised head would give uniform classes
    return model


def _png(width: int = 40, height: int = 30, seed: int = 0, flat: bool = False) -> bytes:
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    pixels = pixels * 0 + 128 if flat else pixels  # flat: a small file of many pixels
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "tiny.safetensors"
    vitkit.save_checkpoint(_tiny(), path, extra={"classes": json.dumps(CLASSES)})
    return path


def _post(
    url: str, data: bytes, content_type: str = "application/octet-stream", timeout: float = 30
) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _multipart(data: bytes, field: str = "file") -> tuple[bytes, str]:
    boundary = "vitkitboundary1234"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="x.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


class _ThreadServer:
    """uvicorn in a thread of this process (no signal handling there), on a free port."""

    def __init__(self, service: ModelService) -> None:
        import uvicorn

        from vitkit.serve import listen

        self.sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(service), log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> _ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)


@pytest.fixture(scope="module")
def served(ckpt):
    """An fp32 service of the tiny model, and its URL."""
    model = vitkit.load_pretrained(ckpt)
    service = ModelService(model, "fp32", options=ServeOptions(max_body_bytes=50_000, max_pixels=10_000))
    with _ThreadServer(service) as server:
        yield service, server.url, model


def test_predict_and_embed_are_the_models_own(served):
    _, url, model = served
    png = _png()
    image = vitkit.preprocessing.prepare_images([("x", Image.open(io.BytesIO(png)))], model.preprocessing, 3).inputs
    with torch.no_grad():
        probs = model.eval()(image).softmax(1)[0]
        pooled = model.forward_head(model.forward_features(image), pre_logits=True)[0]
    status, body = _post(f"{url}/predict?top_k=2", png)
    assert status == 200, body
    best = probs.argsort(descending=True)[:2].tolist()
    assert [r["class"] for r in body["top_k"]] == [CLASSES[i] for i in best]
    assert body["top_k"][0]["prob"] == pytest.approx(float(probs[best[0]]), abs=1e-5)
    status, multi = _post(f"{url}/predict", *_multipart(png))  # the same image as a multipart file
    assert status == 200 and [r["class"] for r in multi["top_k"][:2]] == [r["class"] for r in body["top_k"]]
    status, emb = _post(f"{url}/embed", png)
    assert status == 200 and emb["dim"] == 32
    assert torch.allclose(torch.tensor(emb["embedding"]), pooled, atol=1e-4)


@pytest.mark.parametrize(
    "body, query, status, words",
    [
        (b"not an image at all", "", 400, "not an image Pillow can read"),
        (b"", "", 400, "empty"),
        (_png()[:60], "", 400, "damaged image"),
        (_png(200, 100, flat=True), "", 413, "200x100 pixels is over the limit"),
        (b"x" * 60_000, "", 413, "over the limit of 50,000"),
        (_png(), "?top_k=0", 400, "top_k must be"),
        (_png(), "?top_k=many", 400, "top_k must be"),
    ],
)
def test_bad_inputs_get_a_4xx_with_one_line(served, body, query, status, words):
    _, url, _ = served
    got, answer = _post(f"{url}/predict{query}", body)
    assert got == status, answer
    assert words in answer["error"] and "\n" not in answer["error"]


def test_a_multipart_body_without_a_file_is_refused(served):
    _, url, _ = served
    boundary = "b0undary"
    body = f'--{boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n--{boundary}--\r\n'.encode()
    status, answer = _post(f"{url}/embed", body, f"multipart/form-data; boundary={boundary}")
    assert status == 400 and "no file" in answer["error"]


def test_health_and_metrics(served):
    _, url, _ = served
    assert _post(f"{url}/predict", _png())[0] == 200
    health = json.loads(_get(f"{url}/health"))
    assert health["status"] == "ok" and health["precision"] == "fp32" and health["classes"] == 3
    text = _get(f"{url}/metrics")
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert int(lines['vitkit_requests_total{endpoint="predict",code="200"}']) >= 1
    assert int(lines["vitkit_batch_size_count"]) >= 1
    assert int(lines['vitkit_batch_size_bucket{le="+Inf"}']) == int(lines["vitkit_batch_size_count"])
    assert "vitkit_queue_depth" in lines and 'vitkit_errors_total{endpoint="predict"}' in lines


def test_a_full_queue_is_answered_503(ckpt):
    """The model held on a gate: one batch computes, max_queue images wait, the next is refused.

    The first request is sent alone and held in the model before the two that queue are sent: sent
    together, the third could find the first still queued (the batcher's thread not yet woken) and
    be refused itself."""
    model = vitkit.load_pretrained(ckpt)
    service = ModelService(model, "fp32", options=ServeOptions(max_batch=1, batch_window_ms=0, max_queue=2))
    gate, entered, run = threading.Event(), threading.Event(), service.run_batch
    service.run_batch = lambda images, wants: (entered.set(), gate.wait(20), run(images, wants))[2]
    results: list[int] = []

    def send() -> threading.Thread:
        thread = threading.Thread(target=lambda: results.append(_post(f"{server.url}/predict", _png())[0]))
        thread.start()
        return thread

    def wait_for(condition) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, service.health()
            time.sleep(0.02)

    with _ThreadServer(service) as server:
        threads = [send()]
        wait_for(entered.is_set)  # the first image is in the model, held
        threads += [send(), send()]
        wait_for(lambda: service.batcher.depth == 2)  # two queued
        status, answer = _post(f"{server.url}/predict", _png())
        assert status == 503 and "queue is full" in answer["error"], answer
        gate.set()
        for t in threads:
            t.join(20)
    assert results == [200, 200, 200]


def test_batcher_forms_batches_and_drains_on_close():
    sizes: list[int] = []
    gate = threading.Event()

    def run(images: torch.Tensor, wants: frozenset[str]) -> dict[str, torch.Tensor]:
        gate.wait(10)
        sizes.append(len(images))
        return {"logits": images.flatten(1).sum(1, keepdim=True)}

    batcher = Batcher(run, max_batch=4, window_s=0.0, max_queue=4)
    image = [torch.full((1, 2, 2), float(i)) for i in range(5)]
    futures = [batcher.submit(image[0], frozenset({"logits"}))]
    deadline = time.monotonic() + 10
    while batcher.depth:  # the thread took the first image and is held in the model
        assert time.monotonic() < deadline
        time.sleep(0.01)
    futures += [batcher.submit(image[i], frozenset({"logits"})) for i in range(1, 5)]  # the queue is full now
    with pytest.raises(QueueFull):
        batcher.submit(image[0], frozenset({"logits"}))
    gate.set()
    assert batcher.close(timeout=10)
    assert [float(f.result(timeout=0)["logits"][0]) for f in futures] == [4.0 * i for i in range(5)]
    assert sizes == [1, 4]  # the four that waited went through together
    assert batcher.accepted == batcher.answered == 5


@pytest.mark.slow  # a server process starts (torch, the model): ~10 s
def test_sigterm_drains_what_was_accepted_and_exits_0(ckpt, tmp_path):
    cmd = [sys.executable, "-m", "vitkit", "serve", str(ckpt), "--port", "0", "--precision", "fp32"]
    cmd += ["--batch-window-ms", "1500", "--max-batch", "64"]  # the batch waits for its window: requests stay in flight
    env = {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "serving" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else line
            line = proc.stdout.readline()
        url = line.split()[1]
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(_post(f"{url}/predict", _png())[0])) for _ in range(6)
        ]
        for t in threads:
            t.start()
        while json.loads(_get(f"{url}/health"))["in_flight"] < 6:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        assert results == [200] * 6
        assert "after answering 6 predict/embed requests" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_cli_refuses_a_missing_model_in_one_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nothing.safetensors"), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nothing.safetensors" in err and len(err.splitlines()) == 1


def test_the_listening_socket_lets_asyncio_turn_nagle_off():
    """asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP; without it every keep-alive
    answer waits for the client's delayed ACK (~40 ms)."""
    import socket

    from vitkit.serve import listen

    sock = listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.getsockname()[1] > 0
    finally:
        sock.close()
