"""The routes (Starlette) and the server process (uvicorn) of :class:`~vitkit.serve.app.ModelService`.

Stopping: on SIGTERM or SIGINT uvicorn stops accepting connections and waits for the requests it
has (each waiting on its image's batch) to be answered, up to ``graceful_timeout_s``; then the
app's shutdown closes the batcher, which answers anything still queued. :func:`run_server`
returns normally after a SIGTERM, so that the process exits 0 (uvicorn alone would re-raise the
signal and die by it).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import UsageError
from .app import CONTENT_TYPE, ModelService, Problem, decode_image, elapsed

WANTS = {"predict": frozenset({"logits"}), "embed": frozenset({"embedding"})}


def _starlette() -> Any:
    try:
        import starlette.applications
        import uvicorn  # noqa: F401
    except ImportError:
        raise UsageError(
            "vitkit serve needs Starlette, uvicorn and python-multipart: pip install 'vitkit[serve]'"
        ) from None
    return starlette.applications


async def _read_body(request: Any, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Problem(413, f"the body's {int(declared):,} bytes are over the limit of {limit:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, f"the body is over the limit of {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _image_bytes(request: Any, limit: int) -> tuple[bytes, str]:
    """The image of a request: (its bytes, its name): the first file of a multipart body, or the body."""
    from starlette.datastructures import UploadFile
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException
    from starlette.requests import Request

    body = await _read_body(request, limit)
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        return body, "the body"

    async def replay() -> dict[str, Any]:  # the body already read, for the form parser
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=32)
    except (MultiPartException, HTTPException) as e:
        raise Problem(400, f"a multipart body that cannot be read: {getattr(e, 'detail', None) or e}") from None
    try:
        files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        if not files:
            raise Problem(400, "the multipart body has no file; send the image as a file field")
        return await files[0].read(), f"file {files[0].filename or files[0].size}"
    finally:
        await form.close()


def _top_k(request: Any, service: ModelService) -> int:
    text = request.query_params.get("top_k")
    if text is None:
        return service.options.top_k
    if not text.isdigit() or not 1 <= int(text) <= max(service.num_classes, 1):
        raise Problem(400, f"top_k must be a whole number from 1 to {service.num_classes}, got {text[:20]!r}")
    return int(text)


def _handler(service: ModelService, endpoint: str) -> Callable[[Any], Any]:
    """The route of ``POST /predict`` or ``POST /embed``."""
    from anyio import CapacityLimiter, to_thread
    from starlette.responses import JSONResponse

    limiter = CapacityLimiter(service.decode_threads)
    opts = service.options

    async def handle(request: Any) -> Any:
        start = time.perf_counter()
        try:
            if endpoint == "predict" and not service.num_classes:
                raise Problem(404, "this model has no classification head; POST /embed for its embeddings")
            top_k = _top_k(request, service) if endpoint == "predict" else 0
            data, name = await _image_bytes(request, opts.max_body_bytes)
            image = await to_thread.run_sync(
                decode_image, data, name, service.preprocess_model, opts.max_pixels, limiter=limiter
            )  # fmt: skip
            out = await service.infer(image, WANTS[endpoint])
            if endpoint == "predict":
                body: dict[str, Any] = {"top_k": service.predictions(out["logits"], top_k)}
            else:
                vector = out["embedding"]
                body = {"dim": int(vector.numel()), "embedding": vector.tolist()}
            status = 200
        except Problem as p:
            status, body = p.status, {"error": p.message}
        except Exception as e:  # the model failed: one line, and the service goes on
            status, body = (
                500,
                {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"},
            )
        service.metrics.request(endpoint, status, elapsed(start))
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse(body, status_code=status, headers=headers)

    return handle


def build_app(service: ModelService) -> Any:
    """The ASGI app of ``service``: its routes, and the batcher started and drained with it.

    Args:
        service: the model service.

    Returns:
        A Starlette application.

    Raises:
        UsageError: Starlette, uvicorn or python-multipart is not installed.
    """
    applications = _starlette()
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    async def health(request: Any) -> Any:
        start = time.perf_counter()
        response = JSONResponse(service.health())
        service.metrics.request("health", 200, elapsed(start))
        return response

    async def metrics(request: Any) -> Any:
        service.metrics.request("metrics", 200, 0.0)
        return PlainTextResponse(service.metrics.render(), media_type=CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            from anyio import to_thread

            await to_thread.run_sync(service.close)  # answers what is still queued

    routes = [
        Route("/predict", _handler(service, "predict"), methods=["POST"]),
        Route("/embed", _handler(service, "embed"), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return applications.Starlette(routes=routes, lifespan=lifespan)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket for the server (port 0: a free one, which ``getsockname`` then tells).
    Connections made before the server runs wait in its backlog.

    Args:
        host: the address to listen on.
        port: the port, or 0.

    Returns:
        The socket, bound and listening.

    Raises:
        OSError: the address is taken or cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say so, and with
    # it on, a keep-alive client waits for a delayed ACK (~40 ms) on every answer
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def run_server(
    service: ModelService, sock: socket.socket, graceful_timeout_s: float = 30.0, log_level: str = "warning"
) -> None:
    """Serve until SIGTERM or SIGINT, then drain: the requests in flight are answered first.

    Args:
        service: the model service.
        sock: the bound socket (:func:`listen`).
        graceful_timeout_s: the most seconds to wait for requests in flight once a stop is asked.
        log_level: uvicorn's log level ("warning": errors only; "info": also every request).

    Raises:
        UsageError: Starlette, uvicorn or python-multipart is not installed.
        KeyboardInterrupt: the stop was a SIGINT (Ctrl+C).
    """
    import uvicorn

    config = uvicorn.Config(
        build_app(service),
        log_level=log_level,
        access_log=log_level in ("info", "debug"),
        timeout_graceful_shutdown=graceful_timeout_s,
        limit_concurrency=2 * service.options.max_queue + 64,  # beyond it uvicorn answers 503 itself
        lifespan="on",
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal it stopped on once it has drained; a handler that does nothing
    # takes a SIGTERM then, so the process ends with status 0 rather than killed by the signal.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
