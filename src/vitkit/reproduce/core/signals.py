"""Stopping a suite on a signal: SIGINT (Ctrl-C) or SIGTERM raises :class:`Interrupted` in the
suite's process, which stops its run processes and keeps every finished run; so does the end of
a time limit (:func:`stop_after`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from ...errors import UsageError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


HELD_SIGNALS = (*STOP_SIGNALS, signal.SIGALRM) if hasattr(signal, "SIGALRM") else STOP_SIGNALS

STOP_GRACE_SECONDS = 5.0  # how long runs told to stop may take before they are killed


class Interrupted(KeyboardInterrupt):
    """The suite was stopped by SIGINT (Ctrl-C) or SIGTERM. Finished runs are kept; the runs that
    were training stopped where they were and resume from their last checkpoint on the next call.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``, or ``"SIGALRM"`` where a time limit ended.
        limit_minutes: the time limit that stopped the suite (:func:`stop_after`); None for a signal.
        finished: runs of the suite with a result when it stopped (None if it stopped before the
            runner looked).
        total: runs the suite asked for (None likewise).

    Args:
        signal_name: the signal that stopped the suite.
    """

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.limit_minutes: float | None = None
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
def stop_after(minutes: float | None) -> Iterator[None]:
    """While inside, ``minutes`` after entering, :class:`Interrupted` is raised in the main thread
    as SIGINT would raise it (with ``limit_minutes`` set), so a long suite can be cut into calls
    that each end on time; the next call resumes where this one stopped.

    Args:
        minutes: the limit; None for none.

    Yields:
        Nothing; the timer is off on leaving.

    Raises:
        UsageError: a limit not above zero, or a system without interval timers (``setitimer``).
    """
    if minutes is None:
        yield
        return
    if not minutes > 0:
        raise UsageError(f"--stop-after must be above 0 minutes, got {minutes:g}")
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        raise UsageError("--stop-after needs interval timers (setitimer) in the main thread; this system has none")

    def ended(signum: int, frame: Any) -> None:
        e = Interrupted("SIGALRM")
        e.limit_minutes = minutes
        raise e

    previous = signal.signal(signal.SIGALRM, ended)
    signal.setitimer(signal.ITIMER_REAL, 60.0 * minutes)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and the time limit's SIGALRM held back in this thread, delivered on leaving
    (to the handlers of :func:`stop_on_signals` and :func:`stop_after`): a process started inside
    is registered before a stop can look."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored and the time limit's SIGALRM held back (in the main thread): the
    last clean-up must not be cut short, and a limit that ends during it still stops the suite."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    alarm = tuple(set(HELD_SIGNALS) - set(STOP_SIGNALS))
    held = signal.pthread_sigmask(signal.SIG_BLOCK, alarm) if alarm and hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _signal_run(pid: int, sig: int) -> None:
    """Send ``sig`` to a run's process and every process it started (its process group)."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError, AttributeError):
        pass  # its group is gone (its own process may still be a zombie), or no process groups here
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
