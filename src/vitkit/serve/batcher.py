"""Dynamic batching: images that arrive within a short window go through the model together.

One thread owns the model. It takes the first waiting image, then keeps taking images until the
batch is full (``max_batch``) or ``window_s`` has passed since the first, runs the batch and
hands each caller its own rows through a :class:`concurrent.futures.Future`. The queue is
bounded: when ``max_queue`` images wait, :meth:`Batcher.submit` refuses at once
(:class:`QueueFull`, which the server answers 503) instead of letting memory grow. Closing puts a
stop mark behind everything accepted, so the thread finishes those first (a drain).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

_STOP = object()


class QueueFull(Exception):
    """The batcher's queue holds ``max_queue`` images already."""


class BatcherClosed(Exception):
    """The batcher is stopping and takes no more images."""


@dataclass
class Item:
    """One image waiting for the model.

    Attributes:
        image: the preprocessed image (C, H, W).
        wants: what the caller needs: "logits", "embedding" or both.
        future: where its results go: a dict from each wanted name to its (K,) or (D,) tensor.
    """

    image: torch.Tensor
    wants: frozenset[str]
    future: Future[dict[str, torch.Tensor]] = field(default_factory=Future)


class Batcher:
    """A bounded queue and the thread that runs the model on batches from it.

    Args:
        run: the model on a batch: (images (B, C, H, W), the names wanted by any item) -> a dict
            of (B, ...) tensors, one per name.
        max_batch: the most images in one call of ``run``.
        window_s: how long the first image of a batch waits for others, in seconds.
        max_queue: the most images that may wait; more are refused.
        on_batch: called after each batch with (its size, the seconds ``run`` took).
        on_depth: called with the queue's length whenever it changes.
    """

    def __init__(
        self,
        run: Callable[[torch.Tensor, frozenset[str]], dict[str, torch.Tensor]],
        max_batch: int,
        window_s: float,
        max_queue: int,
        on_batch: Callable[[int, float], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch < 1 or max_queue < 1 or window_s < 0:
            raise ValueError(
                "max_batch and max_queue must be positive and window_s not negative, "
                f"got {max_batch}, {max_queue}, {window_s}"
            )
        self.run, self.max_batch, self.window_s = run, max_batch, window_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._on_batch, self._on_depth = on_batch, on_depth
        self._closed = False
        self.accepted = self.answered = 0  # images, since the start
        self._count_lock = threading.Lock()
        self._lock = threading.Lock()  # submit against close: nothing enters behind the stop mark
        self._thread = threading.Thread(target=self._loop, name="vitkit-batcher", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """How many images wait (not counting the batch being computed)."""
        return self._queue.qsize()

    @property
    def in_flight(self) -> int:
        """How many images were accepted and not yet answered (queued, or in the batch computing)."""
        return self.accepted - self.answered

    def submit(self, image: torch.Tensor, wants: frozenset[str]) -> Future[dict[str, torch.Tensor]]:
        """Queue one image.

        Args:
            image: the preprocessed image (C, H, W).
            wants: the names of the results needed ("logits", "embedding").

        Returns:
            The future of its results.

        Raises:
            QueueFull: ``max_queue`` images wait already.
            BatcherClosed: :meth:`close` was called.
        """
        item = Item(image, wants)
        with self._lock:
            if self._closed:
                raise BatcherClosed("the server is stopping")
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                raise QueueFull(f"{self._queue.maxsize} images wait already") from None
            with self._count_lock:
                self.accepted += 1
        self._depth_changed()
        return item.future

    def close(self, timeout: float | None = None) -> bool:
        """Stop taking images, finish the ones accepted, and end the thread.

        Args:
            timeout: the most seconds to wait for the thread (None: as long as it takes).

        Returns:
            True when the thread ended (every accepted image answered).
        """
        with self._lock:  # no image enters once this is set
            first, self._closed = not self._closed, True
        if first:
            self._queue.put(_STOP)  # behind every accepted image; waits while the queue is full
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _depth_changed(self) -> None:
        if self._on_depth is not None:
            self._on_depth(self._queue.qsize())

    def _collect(self, first: Item) -> tuple[list[Item], bool]:
        """``first`` and the images that follow it within the window: (the batch, whether the
        stop mark was met)."""
        batch, deadline = [first], time.monotonic() + self.window_s
        while len(batch) < self.max_batch:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)
        return batch, False

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                break
            batch, stop = self._collect(first)
            self._depth_changed()
            self._compute(batch)

    def _compute(self, batch: list[Item]) -> None:
        live = [item for item in batch if item.future.set_running_or_notify_cancel()]
        try:
            if live:
                self._answer(live)
        finally:
            with self._count_lock:
                self.answered += len(batch)

    def _answer(self, live: list[Item]) -> None:
        wants = frozenset().union(*(item.wants for item in live))
        start = time.perf_counter()
        try:
            out = self.run(torch.stack([item.image for item in live]), wants)
        except Exception as e:  # the model failed on this batch: every caller in it hears why
            for item in live:
                item.future.set_exception(e)
            return
        seconds = time.perf_counter() - start
        for i, item in enumerate(live):
            item.future.set_result({name: out[name][i] for name in item.wants})
        if self._on_batch is not None:
            self._on_batch(len(live), seconds)
