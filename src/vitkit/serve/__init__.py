"""``vitkit serve``: a model behind HTTP, with dynamic batching, limits, metrics and a drain on
SIGTERM. :class:`ModelService` holds the model prepared for serving and its batcher;
:func:`build_app` makes its ASGI app (Starlette); :func:`run_server` runs it under uvicorn.
Starlette, uvicorn and python-multipart come with the ``serve`` extra."""

from __future__ import annotations

from .app import ModelService, Problem, ServeOptions, decode_image
from .batcher import Batcher, BatcherClosed, QueueFull
from .http import build_app, listen, run_server
from .metrics import Metrics

__all__ = [
    "Batcher",
    "BatcherClosed",
    "Metrics",
    "ModelService",
    "Problem",
    "QueueFull",
    "ServeOptions",
    "build_app",
    "decode_image",
    "listen",
    "run_server",
]
