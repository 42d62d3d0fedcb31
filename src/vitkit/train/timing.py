"""Counting the training loop's time and steps: a stopwatch that pauses for evaluation and
checkpoints, a window of recent steps for the log, and the test of whether a step is due."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


def due(step: int, every: int | None, last: int) -> bool:
    """Whether something done every ``every`` steps (0 or None: never) is due after ``step``;
    always after the ``last`` step."""
    return step == last or (bool(every) and step % every == 0)


class Stopwatch:
    """Training time: :meth:`lap` adds the time since the previous lap (or since the end of the
    last pause); time inside :meth:`paused` counts nowhere."""

    def __init__(self) -> None:
        self.total = 0.0  # seconds counted since the stopwatch was made
        self.unbanked = 0.0  # of which not yet taken by bank()
        self._mark = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self._mark = now - self._mark, now
        self.total += dt
        self.unbanked += dt
        return dt

    def bank(self) -> float:
        """The time counted since the last call (to add to a saved total)."""
        out, self.unbanked = self.unbanked, 0.0
        return out

    @contextmanager
    def paused(self) -> Iterator[None]:
        try:
            yield
        finally:
            self._mark = time.perf_counter()


class Window:
    """The steps since the last log line: their mean loss, how many were skipped (a non-finite
    loss), and images per second of training time; ``total_images``: every image since it was
    made (a reset keeps it)."""

    def __init__(self) -> None:
        self.total_images = 0
        self.reset()

    def reset(self) -> None:
        self.loss, self.losses, self.images, self.seconds = 0.0, 0, 0, 0.0
        self.skipped = 0

    def add(self, loss: float | None, images: int, seconds: float) -> None:
        if loss is not None:
            self.loss, self.losses = self.loss + loss, self.losses + 1
        else:  # a skipped non-finite step has no loss
            self.skipped += 1
        self.images += images
        self.total_images += images
        self.seconds += seconds

    @property
    def mean_loss(self) -> float | None:
        """The mean over the steps that had a loss; None when every step was skipped."""
        return self.loss / self.losses if self.losses else None

    @property
    def images_per_s(self) -> float:
        return self.images / max(self.seconds, 1e-9)
