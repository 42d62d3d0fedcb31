"""``vitkit serve``: a model behind HTTP (POST /predict, POST /embed, GET /health, GET /metrics)."""

from __future__ import annotations

import argparse

from .common import (
    WEIGHTS_HELP,
    backend_argument,
    count,
    load_model,
    merge_argument,
    parse_device,
    precision_argument,
    real,
)

HELP = "serve a model over HTTP: /predict, /embed, /health, /metrics, with dynamic batching"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt", metavar="MODEL", help=WEIGHTS_HELP)
    p.add_argument("--port", type=count(0, 65535), default=8000, help="0: a free port, printed when serving")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    p.add_argument("--device", type=parse_device, default="cpu", help="cpu, cuda, cuda:1...")
    precision_argument(
        p, "int8", help="auto: bf16 where this device computes it natively and fast, else fp32; fp32; bf16; int8 (CPU)"
    )
    merge_argument(p)
    backend_argument(p)
    p.add_argument("--max-batch", type=count(1, 4096), default=16, help="the most images in one model call")
    p.add_argument(
        "--batch-window-ms", type=real(0.0), default=5.0, help="how long a batch's first image waits for others"
    )
    p.add_argument("--max-queue", type=count(1, 1 << 20), default=256, help="images waiting beyond it get 503")
    p.add_argument("--max-body-mb", type=real(above=0.0), default=16.0, help="larger request bodies get 413")
    p.add_argument("--max-pixels", type=count(1), default=25_000_000, help="larger images (w x h) get 413")
    p.add_argument("--top-k", type=count(1, 1_000_000), default=5, help="classes /predict gives (?top_k=N)")
    p.add_argument(
        "--graceful-timeout", type=real(0.0), default=30.0, help="seconds to finish requests in flight on SIGTERM"
    )
    p.add_argument("--log-level", choices=["warning", "info", "debug"], default="warning", help="info: every request")


def run(args: argparse.Namespace) -> int:
    import sys

    from ..serve import ModelService, ServeOptions, listen, run_server
    from .common import chosen_backend, chosen_precision

    options = ServeOptions(
        max_batch=args.max_batch,
        batch_window_ms=args.batch_window_ms,
        max_queue=args.max_queue,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        max_pixels=args.max_pixels,
        top_k=args.top_k,
    )
    sock = listen(args.host, args.port)  # before the model loads: a taken port fails at once
    model = load_model(args.ckpt)
    precision = chosen_precision(args.precision, args.device)
    runner = chosen_backend(args, model, precision)
    service = ModelService(model, precision, args.device, options, name=str(args.ckpt), merge=args.merge, served=runner)
    host, port = sock.getsockname()[:2]
    heads = f"{service.num_classes} classes" if service.num_classes else "no head: /embed only"
    merging = f", merging {args.merge} tokens a block" if args.merge else ""
    backend = f", {service.backend}" if runner is not None else ""
    print(f"model        {args.ckpt} ({heads}, {service.precision}{backend}, {args.device}{merging})")
    window = f"{options.batch_window_ms:g} ms window"
    print(f"batching     up to {options.max_batch} images, {window}, queue {options.max_queue}")
    print(f"serving      http://{host}:{port}  (POST /predict, POST /embed, GET /health, GET /metrics)", flush=True)
    run_server(service, sock, args.graceful_timeout, args.log_level)
    answered = sum(n for (endpoint, _), n in service.metrics.requests.items() if endpoint in ("predict", "embed"))
    print(f"stopped      after answering {answered} predict/embed requests", file=sys.stderr)
    return 0
