"""`vitkit serve` under load on 127.0.0.1, against calling the model in a loop.

The server runs as its own process (``python -m vitkit serve MODEL --port 0``). Clients are threads,
each with one keep-alive HTTP connection, sending ``POST /predict`` with PNG images as fast as
answers come, at each concurrency level; every level reports requests a second and the p50/p99
latency seen by the clients, and the server's mean batch size (from ``/metrics``). The reference
rows call the same prepared model (:func:`vitkit.inference.prepare_inference`, the same precision)
in a loop in this process: one image a call, and ``--max-batch`` images a call (what batching can
reach at best), images preprocessed already. The server runs vitkit's own path (``--backend torch``)
like the loop, so that the rows differ by serving alone; ``--backend auto`` gives it the runtime
that ``vitkit serve`` would choose by default on this machine (the loop stays on vitkit's path).

Checked, not only measured (the run fails otherwise):
- no request is lost: every request sent is answered 200 (none 503, none dropped);
- memory stays bounded: the server's resident memory after a second round at the highest
  concurrency is within ``--rss-slack-mb`` of the first's (no growth with requests served);
- every bad input is a 4xx whose error is one line: bytes that are not an image, an empty body,
  a truncated PNG, an image over the pixel limit, a body over the size limit, a bad ``top_k``,
  a multipart body without a file, a GET where a POST is wanted;
- SIGTERM during a round: every request the server accepted is answered, its count equals the
  clients' count of answers, and the process exits 0.

    python benchmarks/serve_load.py                                  # a tiny model, seconds
    python benchmarks/serve_load.py --arch vit_s16 --img-size 224 --requests 400 \\
        --json benchmarks/results/serve_load.json                   # ViT-S/16, random weights
    python benchmarks/serve_load.py --model runs/demo                # a trained model

A busy machine slows the server and the loop alike; read the ratio of the rows.
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TINY = {"img_size": 32, "patch_size": 8, "depth": 2, "width": 32, "num_heads": 2, "mlp_dim": 64}


def make_model(args: argparse.Namespace, folder: Path) -> str:
    """The weights to serve: ``--model`` as given, or a random ``--arch`` written to ``folder``."""
    if args.model:
        return args.model
    import torch

    import vitkit

    torch.manual_seed(0)
    if args.arch == "tiny":
        model = vitkit.create_model("vit_ti16", num_classes=10, **TINY)
    else:
        model = vitkit.create_model(args.arch, num_classes=10, img_size=args.img_size)
    path = folder / "model.safetensors"
    vitkit.save_checkpoint(model, path)
    return str(path)


def make_pngs(count: int, size: int) -> list[bytes]:
    """``count`` PNGs of random pixels, ``size`` pixels a side."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


class Server:
    """``vitkit serve`` as a child process on a free port of 127.0.0.1."""

    def __init__(self, model: str, args: argparse.Namespace) -> None:
        cmd = [sys.executable, "-m", "vitkit", "serve", model, "--port", "0", "--precision", args.precision]
        cmd += ["--backend", args.backend]
        cmd += ["--max-batch", str(args.max_batch), "--batch-window-ms", str(args.window_ms)]
        cmd += ["--max-body-mb", "1", "--max-pixels", str(4 * args.img_size**2)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        line = ""
        while "serving" not in line:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: {self.proc.stderr.read()}")
            line = self.proc.stdout.readline()
            print(f"  server: {line.rstrip()}", file=sys.stderr)
        self.host, port = line.split()[1].removeprefix("http://").split(":")
        self.port = int(port)

    def rss_mb(self) -> float:
        """The server's resident memory now, in MiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        text = self.request("GET", "/metrics")[1]
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if not ln.startswith("#"))}


def client(server: Server, pngs: list[bytes], todo: list[int], lock: threading.Lock, out: dict) -> None:
    """Send requests on one keep-alive connection while ``todo`` has any; record each answer."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    while True:
        with lock:
            if not todo:
                break
            i = todo.pop()
        start = time.perf_counter()
        try:
            conn.request("POST", "/predict", body=pngs[i % len(pngs)])
            r = conn.getresponse()
            r.read()
            status = r.status
        except (OSError, http.client.HTTPException):
            status = 0  # no answer
            conn.close()
            conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
        with lock:
            out["status"].append(status)
            out["latency"].append(time.perf_counter() - start)
    conn.close()


def load_round(server: Server, pngs: list[bytes], clients: int, requests: int) -> dict:
    """``requests`` POST /predict from ``clients`` threads at once: rate, latency, statuses."""
    before = server.metrics()
    todo, lock = list(range(requests)), threading.Lock()
    out: dict = {"status": [], "latency": []}
    threads = [threading.Thread(target=client, args=(server, pngs, todo, lock, out)) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    after = server.metrics()
    batches = after["vitkit_batch_size_count"] - before.get("vitkit_batch_size_count", 0)
    images = after["vitkit_batch_size_sum"] - before.get("vitkit_batch_size_sum", 0)
    lat = sorted(out["latency"])
    return {
        "clients": clients,
        "requests": requests,
        "ok": sum(s == 200 for s in out["status"]),
        "statuses": sorted(set(out["status"])),
        "per_second": requests / seconds,
        "p50_ms": 1e3 * lat[len(lat) // 2],
        "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "mean_batch": images / batches if batches else 0.0,
        "rss_mb": server.rss_mb(),
    }


def model_loop(model_path: str, args: argparse.Namespace, pngs: list[bytes]) -> list[dict]:
    """The prepared model called in a loop here: one image a call, then ``--max-batch`` a call."""
    import torch

    import vitkit
    from vitkit.inference import prepare_inference
    from vitkit.serve.app import decode_image

    model = vitkit.load_pretrained(model_path)
    served = prepare_inference(model, args.precision)
    images = torch.stack([decode_image(p, "x", model, 1 << 30) for p in pngs])  # as the server decodes
    rows = []
    for batch in (1, args.max_batch):
        lat, n = [], 0
        start = time.perf_counter()
        with torch.inference_mode():
            while n < args.requests:
                x = images[n % len(images) : n % len(images) + batch]
                x = torch.cat([x, images[: batch - len(x)]]) if len(x) < batch else x
                t = time.perf_counter()
                served(x.to(served.input_dtype))
                lat.append(time.perf_counter() - t)
                n += batch
        seconds = time.perf_counter() - start
        lat.sort()
        rows.append({
            "row": f"model loop, batch {batch}", "per_second": n / seconds,
            "p50_ms": 1e3 * lat[len(lat) // 2], "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        })  # fmt: skip
    return rows


def bad_inputs(server: Server, png: bytes, size: int) -> list[dict]:
    """Each bad request and what it got: every one must be a 4xx whose body is one line."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (3 * size, 3 * size)).save(buf, format="PNG")
    boundary = "loadtestboundary"
    multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    no_file = f'--{boundary}\r\nContent-Disposition: form-data; name="x"\r\n\r\ny\r\n--{boundary}--\r\n'.encode()
    cases = [
        ("not an image", "POST", "/predict", b"hello", {}),
        ("empty body", "POST", "/predict", b"", {}),
        ("truncated PNG", "POST", "/embed", png[: len(png) // 2], {}),
        ("image over the pixel limit", "POST", "/predict", buf.getvalue(), {}),
        ("body over the size limit", "POST", "/predict", b"\0" * (2 << 20), {}),
        ("top_k 0", "POST", "/predict?top_k=0", png, {}),
        ("multipart without a file", "POST", "/embed", no_file, multipart),
        ("GET /predict", "GET", "/predict", b"", {}),
    ]  # fmt: skip
    out = []
    for name, method, path, body, headers in cases:
        status, text = server.request(method, path, body, headers)
        out.append(
            {
                "case": name,
                "status": status,
                "answer": text.strip(),
                "ok": 400 <= status < 500 and "\n" not in text.strip(),
            }
        )
    return out


def sigterm_round(server: Server, pngs: list[bytes], clients: int, answered_before: int) -> dict:
    """SIGTERM while ``clients`` threads send: accepted requests answered, exit status 0."""
    todo, lock = list(range(100 * clients)), threading.Lock()
    out: dict = {"status": [], "latency": []}
    threads = [threading.Thread(target=client, args=(server, pngs, todo, lock, out)) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    server.proc.send_signal(signal.SIGTERM)
    with lock:
        todo.clear()  # the clients stop sending after their current request
    for t in threads:
        t.join()
    code = server.proc.wait(timeout=120)
    stderr = server.proc.stderr.read()
    said = [ln for ln in stderr.splitlines() if "after answering" in ln]
    server_count = int(said[-1].split("answering")[1].split()[0]) if said else -1
    ok = sum(s == 200 for s in out["status"])
    return {
        "exit_status": code,
        "answered_in_round": ok,
        "not_200": sorted({s for s in out["status"] if s != 200}),
        "server_answered": server_count,
        "clients_answered": answered_before + ok,
    }


def table(rounds: list[dict], loop: list[dict]) -> str:
    lines = [
        "| row | clients | requests/s | p50 ms | p99 ms | mean batch | server RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        lines.append(
            f"| vitkit serve | {r['clients']} | {r['per_second']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
            f"| {r['mean_batch']:.1f} | {r['rss_mb']:.0f} |"
        )
    for r in loop:
        lines.append(f"| {r['row']} | - | {r['per_second']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | - | - |")
    return "\n".join(lines)


def failures(rounds: list[dict], bad: list[dict], stop: dict, slack_mb: float) -> list[str]:
    """What the run must not show: lost requests, memory growth, a bad input not a one-line 4xx,
    an unclean stop."""
    out = [
        f"{r['clients']} clients: {r['requests'] - r['ok']} of {r['requests']} not answered 200 ({r['statuses']})"
        for r in rounds
        if r["ok"] != r["requests"]
    ]
    top = [r for r in rounds if r["clients"] == max(x["clients"] for x in rounds)]
    if len(top) >= 2 and top[-1]["rss_mb"] > top[0]["rss_mb"] + slack_mb:
        out.append(
            f"server memory grew from {top[0]['rss_mb']:.0f} to {top[-1]['rss_mb']:.0f} MiB between two equal rounds"
        )
    out += [f"bad input '{b['case']}' got {b['status']}: {b['answer'][:120]}" for b in bad if not b["ok"]]
    if stop["exit_status"] != 0:
        out.append(f"after SIGTERM the server exited {stop['exit_status']}")
    if stop["not_200"] and set(stop["not_200"]) != {0}:
        out.append(f"during the drain clients got {stop['not_200']}")
    if stop["server_answered"] != stop["clients_answered"]:
        out.append(
            f"the server answered {stop['server_answered']} requests, the clients received {stop['clients_answered']}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="weights to serve (default: a random --arch written to a temporary folder)")
    p.add_argument("--arch", default="tiny", help="tiny (a 2-layer 32 px ViT), or a vitkit model name: vit_s16...")
    p.add_argument("--img-size", type=int, default=32, help="the random model's and the images' size")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "int8"])
    p.add_argument(
        "--backend",
        default="torch",
        choices=["torch", "auto", "openvino", "onnxruntime"],
        help="the server's backend (default: vitkit's own path, as the loop)",
    )
    p.add_argument("--concurrency", default="1,8,32", help="clients at once, each level in turn")
    p.add_argument("--requests", type=int, default=200, help="requests per level")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--window-ms", type=float, default=5.0)
    p.add_argument("--rss-slack-mb", type=float, default=64.0, help="allowed memory growth between equal rounds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(args, Path(tmp))
        if args.model:
            import vitkit

            args.img_size = vitkit.load_pretrained(model).cfg.img_size[0]
        pngs = make_pngs(16, args.img_size)
        server = Server(model, args)
        try:
            load_round(server, pngs, 2, 2 * args.max_batch)  # warm-up: the first batches pay for one-off work
            rounds = [load_round(server, pngs, c, args.requests) for c in levels]
            rounds.append(load_round(server, pngs, max(levels), args.requests))  # memory: the same round again
            bad = bad_inputs(server, pngs[0], args.img_size)
            answered = 2 * args.max_batch + sum(r["ok"] for r in rounds) + sum(b["case"] != "GET /predict" for b in bad)
            stop = sigterm_round(server, pngs, max(levels), answered)
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
        loop = model_loop(model, args, pngs)
    print(table(rounds, loop))
    print("\nbad inputs:")
    for b in bad:
        print(f"  {b['status']}  {b['case']}: {b['answer'][:100]}")
    print(f"\nSIGTERM during a round of {max(levels)} clients: exit {stop['exit_status']}, "
          f"{stop['answered_in_round']} requests answered in the drain, the server counted "
          f"{stop['server_answered']} answered in all, the clients {stop['clients_answered']}")  # fmt: skip
    problems = failures(rounds, bad, stop, args.rss_slack_mb)
    if args.json:
        from vitkit.files import write_json

        info = {"args": vars(args), "cpu_count": os.cpu_count(), "rounds": rounds, "model_loop": loop}
        info.update(bad_inputs=bad, sigterm=stop, failures=problems)
        write_json(args.json, info)
        print(f"wrote {args.json}")
    for line in problems:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
