"""Stopping a suite on a signal: SIGINT (Ctrl-C) or SIGTERM raises :class:`Interrupted` in the
suite's process, which stops its run processes and keeps every finished run."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


STOP_GRACE_SECONDS = 5.0  # how long runs told to stop may take before they are killed


class Interrupted(KeyboardInterrupt):
    """The suite was stopped by SIGINT (Ctrl-C) or SIGTERM. Finished runs are kept; the runs that
    were training stopped where they were and resume from their last checkpoint on the next call.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
        finished: runs of the suite with a result when it stopped (None if it stopped before the
            runner looked).
        total: runs the suite asked for (None likewise).

    Args:
        signal_name: the signal that stopped the suite.
    """

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.finished: int | None = None
        self.total: int | None = None


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (a signal
    the process was started to ignore stays ignored). Outside the main thread it does nothing.

    Yields:
        Nothing; the previous handlers are back on leaving.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _raise_interrupted)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back in this thread, delivered on leaving (to the handlers of
    :func:`stop_on_signals`): a process started inside is registered before a stop can look."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored (in the main thread): the last clean-up must not be cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_run(pid: int, sig: int) -> None:
    """Send ``sig`` to a run's process and every process it started (its process group)."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError, AttributeError):
        pass  # its group is gone (its own process may still be a zombie), or no process groups here
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
