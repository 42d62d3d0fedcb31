"""The training loop's one stream of events, and what consumes it.

The loop says what happened (:class:`Event`: a logged window of steps, an evaluation, a
checkpoint, the end) and does nothing else with it; the run's log (``metrics.jsonl``, from which
``epochs.csv`` and the curves are drawn), TensorBoard and the opt-in trackers
(:mod:`vitkit.train.trackers`) are sinks on the stream. Only the main process publishes.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP, EVALUATION, CHECKPOINT, END = "step", "evaluation", "checkpoint", "end"


@dataclass(frozen=True)
class Event:
    """One thing the loop did.

    Attributes:
        kind: "step" (a logged window of steps), "evaluation", "checkpoint" or "end".
        step: the step it happened after.
        record: its numbers, as the log keeps them (``loss``, ``lr``, ``img_per_s``... for a step;
            ``top1`` or ``map``, ``val_nll`` for an evaluation); for a checkpoint ``path``.
    """

    kind: str
    step: int
    record: dict[str, Any] = field(default_factory=dict)

    def scalars(self) -> dict[str, float]:
        """The record's numbers a tracker plots (the step and non-numbers left out).

        Returns:
            name -> value.
        """
        return {
            k: float(v)
            for k, v in self.record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }


class Sink:
    """What consumes the events; each method may be left as it is."""

    def on_event(self, event: Event) -> None:
        """Take one event.

        Args:
            event: what happened.
        """

    def close(self) -> None:
        """The run ended (or stopped); flush and let go."""


class MetricsLog(Sink):
    """The run's ``metrics.jsonl``: one JSON line per logged window of steps and per evaluation.

    Args:
        append: writes one record (the run folder's atomic appender, with its error messages).
    """

    def __init__(self, append: Callable[[dict[str, Any]], None]) -> None:
        self.append = append

    def on_event(self, event: Event) -> None:
        """Take one event (see :meth:`Sink.on_event`).

        Args:
            event: what happened.
        """
        if event.kind in (STEP, EVALUATION):
            self.append(event.record)


def summary_writer(out: Path) -> Any:
    """TensorBoard's writer of ``<out>/tb``; None where the package is not installed.

    Args:
        out: the run folder.

    Returns:
        A ``SummaryWriter``, or None.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(out / "tb"))


class TensorBoard(Sink):
    """TensorBoard scalars under ``<run>/tb`` (a no-op where the package is not installed).

    Args:
        out: the run folder.
    """

    def __init__(self, out: Path) -> None:
        self.writer = summary_writer(out)

    def on_event(self, event: Event) -> None:
        """Take one event (see :meth:`Sink.on_event`).

        Args:
            event: what happened.
        """
        if self.writer is not None and event.kind in (STEP, EVALUATION):
            for k, v in event.scalars().items():
                self.writer.add_scalar(k, v, event.step)

    def close(self) -> None:
        """The run ended: flush and let go (see :meth:`Sink.close`)."""
        if self.writer is not None:
            self.writer.close()


class Background(Sink):
    """Runs another sink on a thread of its own, so that a slow or failing one (a tracker whose
    server hangs) never blocks or stops the run: events wait in a bounded queue (the oldest kept,
    the newest dropped when it is full) and the first error switches the sink off with a warning.

    Args:
        sink: the sink to run; its ``on_event`` and ``close`` run on the thread.
        name: what the warnings call it.
        warn: says a warning (one line).
        capacity: events that may wait.
        close_timeout: seconds :meth:`close` waits for the queue to drain.
    """

    def __init__(
        self, sink: Sink, name: str, warn: Callable[[str], None], capacity: int = 10_000, close_timeout: float = 30.0
    ) -> None:
        self.sink, self.name, self.warn, self.close_timeout = sink, name, warn, close_timeout
        self.queue: queue.Queue[Event | None] = queue.Queue(maxsize=capacity)
        self.error: str | None = None
        self.dropped = 0
        self.thread = threading.Thread(target=self._work, name=f"vitkit-{name}", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            event = self.queue.get()
            if event is None:
                break
            if self.error is None:
                try:
                    self.sink.on_event(event)
                except Exception as e:  # a tracker's failure is the tracker's, never the run's
                    self.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if self.error is None:
            try:
                self.sink.close()
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"

    def on_event(self, event: Event) -> None:
        """Take one event (see :meth:`Sink.on_event`).

        Args:
            event: what happened.
        """
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """The run ended: flush and let go (see :meth:`Sink.close`)."""
        deadline = time.monotonic() + self.close_timeout
        with contextlib.suppress(queue.Full):  # the end marker waits for room only as long as the sink may take
            self.queue.put(None, timeout=self.close_timeout)
        self.thread.join(max(deadline - time.monotonic(), 0.0))
        if self.thread.is_alive():
            self.warn(f"{self.name}: still busy after {self.close_timeout:.0f} s; the run did not wait for it")
        elif self.error is not None:
            self.warn(f"{self.name} stopped logging after an error ({self.error}); the run went on without it")
        if self.dropped:
            self.warn(f"{self.name}: {self.dropped} events were dropped (it could not keep up)")


class Events:
    """The stream: publishes each event to every sink, in order.

    Args:
        sinks: the consumers.
    """

    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks = list(sinks)

    def publish(self, kind: str, step: int, record: dict[str, Any] | None = None) -> Event:
        """Publish one event.

        Args:
            kind: "step", "evaluation", "checkpoint" or "end".
            step: the step it happened after.
            record: its numbers.

        Returns:
            The event.
        """
        event = Event(kind, step, dict(record or {}))
        for sink in self.sinks:
            sink.on_event(event)
        return event

    def close(self) -> None:
        """Close every sink (the stream ends with the run)."""
        for sink in self.sinks:
            sink.close()


__all__ = [
    "CHECKPOINT",
    "END",
    "EVALUATION",
    "STEP",
    "Background",
    "Event",
    "Events",
    "MetricsLog",
    "Sink",
    "TensorBoard",
]
