"""The HTTP service: a model prepared for serving, behind Starlette routes run by uvicorn.

``POST /predict`` and ``POST /embed`` take one image, as the request body's raw bytes or as the
file of a ``multipart/form-data`` body, and answer JSON; ``GET /health`` and ``GET /metrics``
(Prometheus) report on the service. Images are decoded in a few threads, then queued for the
:class:`~vitkit.serve.batcher.Batcher`, whose one thread runs the model on dynamic batches. Every
refusal is a 4xx or 503 whose JSON ``error`` is one line naming what was wrong: a body over the
size limit (413), an image over the pixel limit (413), bytes that are not an image (400), a full
queue (503, with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import DataError, UsageError
from ..precision import ServingPrecision
from ..preprocessing import prepare_images
from .batcher import Batcher, BatcherClosed, QueueFull
from .metrics import CONTENT_TYPE, Metrics


@dataclass(frozen=True)
class ServeOptions:
    """How the service batches and what it accepts.

    Attributes:
        max_batch: the most images in one model call.
        batch_window_ms: how long the first image of a batch waits for others to join it.
        max_queue: the most images waiting for the model; more are answered 503.
        max_body_bytes: the largest request body; larger ones are answered 413.
        max_pixels: the most pixels (width x height) of an image; larger ones are answered 413.
        top_k: the classes ``/predict`` gives when the request does not say (``?top_k=N``).
        decode_threads: threads that decode images at once (0: the CPU count).
    """

    max_batch: int = 16
    batch_window_ms: float = 5.0
    max_queue: int = 256
    max_body_bytes: int = 16 << 20
    max_pixels: int = 25_000_000
    top_k: int = 5
    decode_threads: int = 0

    def __post_init__(self) -> None:
        small = [n for n in ("max_batch", "max_queue", "max_body_bytes", "max_pixels", "top_k") if getattr(self, n) < 1]
        if small or self.batch_window_ms < 0 or self.decode_threads < 0:
            raise UsageError(f"serve options must be positive (batch window and decode threads: not negative): {self}")


class Problem(Exception):
    """A request answered with an error: its HTTP status and one line saying why.

    Args:
        status: the HTTP status.
        message: the line.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def decode_image(data: bytes, name: str, model: nn.Module, max_pixels: int) -> torch.Tensor:
    """One encoded image (PNG, JPEG... anything Pillow reads) as the model's input.

    Args:
        data: the file's bytes.
        name: what the error lines call it.
        model: the model (its ``preprocessing`` and ``cfg.in_chans``).
        max_pixels: the most pixels accepted, checked from the header before decoding.

    Returns:
        The preprocessed image (C, H, W), float32.

    Raises:
        Problem: 400 for bytes Pillow cannot read or a damaged image, 413 for one over ``max_pixels``.
    """
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise Problem(400, f"{name}: empty; send the image file's bytes as the body, or as a multipart file")
    try:
        im = Image.open(io.BytesIO(data))
        width, height = im.size
        if width * height > max_pixels:
            raise Problem(413, f"{name}: {width}x{height} pixels is over the limit of {max_pixels:,}")
        im.load()
    except Problem:
        raise
    except Image.DecompressionBombError as e:
        raise Problem(413, f"{name}: refused as a decompression bomb ({_first_line(e)})") from None
    except UnidentifiedImageError:
        raise Problem(400, f"{name}: not an image Pillow can read") from None
    except MemoryError:
        raise
    except Exception as e:  # a damaged file: OSError (truncated), SyntaxError, ValueError, struct.error...
        raise Problem(400, f"{name}: a damaged image ({type(e).__name__}: {_first_line(e)})") from None
    try:
        return prepare_images([(name, im)], model.preprocessing, model.cfg.in_chans).inputs[0]
    except DataError as e:
        raise Problem(400, f"{name}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else type(e).__name__


class ModelService:
    """A model prepared once for serving, its dynamic batcher and its metrics.

    Args:
        model: a vitkit model as :func:`vitkit.load_pretrained` returns it (``preprocessing``,
            ``cfg``; class names and a multi-label model's thresholds from its checkpoint).
        precision: "auto", "fp32", "bf16" or "int8", as :func:`vitkit.inference.prepare_inference` takes it.
        device: where the model runs.
        options: batching and limits.
        name: how ``/health`` and ``/metrics`` name the model.
        merge: tokens merged in each block (token merging, :mod:`vitkit.models.merge`); 0: none.
        served: the model prepared already, e.g. an inference runtime's
            (:func:`vitkit.backends.serving_backend`); None: :func:`~vitkit.inference.prepare_inference`
            of ``model``.

    Raises:
        ValueError: what :func:`vitkit.inference.prepare_inference` refuses; token merging with
            ``served``.
    """

    def __init__(
        self,
        model: nn.Module,
        precision: ServingPrecision = "auto",
        device: str = "cpu",
        options: ServeOptions | None = None,
        name: str = "",
        merge: int = 0,
        served: nn.Module | None = None,
    ) -> None:
        from ..eval.predict import class_names, stored_thresholds
        from ..inference import prepare_inference
        from ..precision import serving_precision

        self.options = options or ServeOptions()
        self.device = torch.device(device)
        self.precision = precision = serving_precision(precision, self.device)
        self.num_classes = int(getattr(model, "num_classes", 0) or 0)
        self.names = class_names(model) if self.num_classes else []
        self.thresholds = stored_thresholds(model) if self.num_classes else None
        self.preprocess_model = model  # preprocessing and in_chans only
        if served is not None and merge:
            raise UsageError("token merging runs on vitkit's own path, not on an inference runtime's model")
        self.served = served if served is not None else prepare_inference(model.to(self.device), precision, merge=merge)
        self.backend = getattr(served, "backend", "torch")
        self.merge = merge
        self.name = name or type(model).__name__
        self.metrics = Metrics(
            self.options.max_batch,
            {"model": self.name, "precision": precision, "device": str(device), "backend": self.backend},
        )
        self.batcher: Batcher | None = None
        self.decode_threads = self.options.decode_threads or os.cpu_count() or 1

    @torch.inference_mode()
    def run_batch(self, images: torch.Tensor, wants: frozenset[str]) -> dict[str, torch.Tensor]:
        """The model on one batch: what the batcher's thread calls.

        Args:
            images: preprocessed images (B, C, H, W).
            wants: "logits" and/or "embedding".

        Returns:
            The wanted outputs, float32 on the CPU: "logits" (B, K), "embedding" (B, D) (the
            pre-logits the head reads, as ``vitkit embed --pool pooled``).
        """
        model = self.served
        if (outputs := getattr(model, "outputs", None)) is not None:  # an inference runtime: one call
            names = {"embedding": "pooled", "logits": "logits"}
            got = outputs(images.to(self.device, model.input_dtype), [names[w] for w in sorted(wants)])
            return {w: got[names[w]].float().cpu() for w in wants}
        feats = model.forward_features(images.to(self.device, model.input_dtype))
        out = {}
        if "embedding" in wants:
            out["embedding"] = model.forward_head(feats, pre_logits=True).float().cpu()
        if "logits" in wants:
            out["logits"] = model.forward_head(feats).float().cpu()
        return out

    def start(self) -> None:
        """Start the batcher's thread (the app's startup calls it)."""
        if self.batcher is None:
            o = self.options
            self.batcher = Batcher(
                self.run_batch, o.max_batch, o.batch_window_ms / 1e3, o.max_queue,
                on_batch=self.metrics.batch, on_depth=self.metrics.set_queue_depth,
            )  # fmt: skip

    def close(self, timeout: float | None = None) -> bool:
        """Answer every image accepted, then stop the batcher's thread.

        Args:
            timeout: the most seconds to wait (None: as long as it takes).

        Returns:
            True when every accepted image was answered.
        """
        return self.batcher.close(timeout) if self.batcher is not None else True

    def health(self) -> dict[str, Any]:
        """What ``GET /health`` answers.

        Returns:
            The status, the model, precision and device, and the batcher's state.
        """
        return {
            "status": "ok",
            "model": self.name,
            "precision": self.precision,
            "device": str(self.device),
            "merge": self.merge,
            "classes": self.num_classes,
            "queue_depth": self.batcher.depth if self.batcher else 0,
            "in_flight": self.batcher.in_flight if self.batcher else 0,
            "max_batch": self.options.max_batch,
            "max_queue": self.options.max_queue,
        }

    async def infer(self, image: torch.Tensor, wants: frozenset[str]) -> dict[str, torch.Tensor]:
        """Queue one preprocessed image and wait for its results.

        Args:
            image: the image (C, H, W).
            wants: "logits" and/or "embedding".

        Returns:
            Its results, one tensor per wanted name.

        Raises:
            Problem: 503 when the queue is full or the service is stopping.
        """
        if self.batcher is None:
            raise Problem(503, "the service has not started")
        try:
            future = self.batcher.submit(image, wants)
        except QueueFull as e:
            raise Problem(503, f"busy: the queue is full ({e}); try again shortly") from None
        except BatcherClosed:
            raise Problem(503, "the service is stopping") from None
        return await asyncio.wrap_future(future)

    def predictions(self, logits: torch.Tensor, top_k: int) -> list[dict[str, Any]]:
        """One image's classes, as ``vitkit predict`` gives them.

        Args:
            logits: its (K,) logits.
            top_k: the most classes given.

        Returns:
            Rows ``{"class", "index", "prob"}`` (and ``"threshold"`` for a multi-label model),
            most probable first.

        Raises:
            Problem: 500 when the model's outputs are not finite.
        """
        from ..eval.predict import top_classes

        try:
            return top_classes(logits[None], self.names, top_k, self.thresholds)[0]
        except UsageError as e:
            raise Problem(500, str(e)) from None


def elapsed(start: float) -> float:
    """Seconds since ``start`` (a :func:`time.perf_counter` reading).

    Args:
        start: the reading.

    Returns:
        The seconds.
    """
    return time.perf_counter() - start


__all__ = ["CONTENT_TYPE", "ModelService", "Problem", "ServeOptions", "decode_image"]
