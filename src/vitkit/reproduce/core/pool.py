"""The run processes of a suite that trains several runs at once (``--jobs``): each a ``python -c``
process in a process group of its own, fed runs over a socket, stopped with the suite.

Leaving :class:`Processes` by an error or a signal stops them at once: no queued run starts, the
running ones get SIGINT (their folders keep the last checkpoint, from which the next call
resumes) and, after a grace period, SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from ...errors import TrainingError
from .scoring import train_and_score
from .signals import STOP_GRACE_SECONDS, STOP_SIGNALS, _signal_run, _signals_held, _signals_ignored


def _threads(n: int) -> None:

    torch.set_num_threads(n)


def _watch_parent(parent: int) -> None:
    """Interrupt this process if the suite's process goes away (killed with SIGKILL): a run must
    not go on training into a folder that the next call resumes."""
    if hasattr(signal, "pthread_sigmask"):  # signals go to the main thread, which may be waiting on a read
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGINT)
            return


def _worker(fd: int, threads: int) -> None:
    """A run process (``python -c``, started by :class:`Processes` in a process group of its
    own, so a terminal's Ctrl-C reaches the suite's process alone, which stops the runs itself).
    It trains and scores the runs the suite sends over the socket ``fd``, one at a time, answering
    ``("ok", result)`` or ``("error", exception)``; ``None`` or a closed socket ends it. SIGINT to
    its group stops the run as Ctrl-C would stop ``vitkit train``: from its last checkpoint on.

    Args:
        fd: its end of the socket pair.
        threads: torch's intra-op threads.
    """
    code = 1
    conn = Connection(fd)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if hasattr(signal, "pthread_sigmask"):  # started while the suite held them back
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        conn.send(("ready", None))  # from now on SIGINT stops it cleanly
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
        _threads(threads)
        while (job := conn.recv()) is not None:
            try:
                res = train_and_score(*job)
            except Exception as e:
                conn.send(("error", _portable(e, job[1])))
            else:
                conn.send(("ok", res))
        code = 0
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        code = 130
    except BaseException:
        traceback.print_exc()  # the suite names the run whose process ended
    finally:
        # Every file is written and closed by now: leave without the interpreter's teardown of
        # torch, which takes seconds and would hold up a stop.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# A run process imports vitkit from where the suite's process found it (its sys.path, as
# multiprocessing's spawn passes it), then serves runs.
_WORKER = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[3]); "
    "from vitkit.reproduce.core.pool import _worker; _worker(int(sys.argv[1]), int(sys.argv[2]))"
)


PARALLEL = hasattr(os, "killpg") and os.name == "posix"  # run processes need process groups


def usable_cores() -> int:
    """The CPU cores this process may run on.

    Returns:
        The count of its CPU affinity where the system reports one, else of the machine's cores.
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_jobs(budget: str) -> int:
    """How many runs ``--jobs auto`` trains at once: one a core, each on one thread, for the
    desktop budget on a CPU. Its models are small, so two runs on one thread each train about
    1.2-1.6x more images a second than one run on two threads. The smoke budget's runs last
    seconds (a run process's start-up would dominate), the full budget's models are large, and
    a GPU trains one run at a time: those get 1.

    Args:
        budget: the suite's budget, one of :data:`~vitkit.reproduce.BUDGETS`.

    Returns:
        The number of runs at once, at least 1.
    """
    if budget != "desktop" or not PARALLEL:
        return 1

    return 1 if torch.cuda.is_available() else usable_cores()


def resolve_jobs(jobs: int | str, budget: str, report: Callable[[str], None]) -> int:
    """``jobs`` as a number: "auto" becomes :func:`auto_jobs`, said in one line where it trains
    more than one run at once.

    Args:
        jobs: a whole number, or "auto".
        budget: the suite's budget.
        report: called with the line.

    Returns:
        The runs trained at once.

    Raises:
        ValueError: ``jobs`` is neither "auto" nor a whole number.
    """
    if jobs == "auto":
        jobs = auto_jobs(budget)
        if jobs > 1:
            threads = max(1, usable_cores() // jobs)
            report(f"--jobs auto: {jobs} runs at once, {threads} thread{'s' * (threads > 1)} each")
        return jobs
    if not isinstance(jobs, int) or isinstance(jobs, bool):
        raise ValueError(f"jobs must be a whole number or 'auto', got {jobs!r}")
    return jobs


def _portable(e: Exception, run_dir: Path) -> Exception:
    """``e`` as the suite's process can unpickle it (else a :class:`TrainingError` that names the
    run and says what it was), with the run's traceback as a note (``vitkit -v`` shows it)."""

    try:
        pickle.loads(pickle.dumps(e))
    except Exception:
        e = TrainingError(f"{run_dir}: {type(e).__name__}: {e}")
    e.add_note("".join(traceback.format_exception(e)).rstrip())
    return e


@dataclass
class _Process:
    """A run process of the suite and the run it is on (None: idle)."""

    proc: subprocess.Popen[bytes]
    conn: Connection
    job: tuple[Any, ...] | None = None
    started: float = 0.0
    ready: bool = False  # past its start-up: SIGINT stops it cleanly


_PENDING = object()  # no answer yet


class Processes:
    """``jobs`` run processes fed from a queue. Leaving the ``with`` block by an error or a signal
    stops them at once: no queued run starts, the running ones get SIGINT (their run folders keep
    the last checkpoint, from which the next call resumes) and, after a grace period, SIGKILL."""

    def __init__(self, jobs: int, threads: int) -> None:
        self.jobs, self.threads = jobs, threads
        self.procs: list[_Process] = []

    def __enter__(self) -> Processes:
        # A signal may be taken by any of this process's threads; its handler runs in the main
        # thread, which may be waiting for a run to answer. The wake-up socket ends that wait.
        self.wake, self._wake_in = socket.socketpair()
        self.wake.setblocking(False)
        self._wake_in.setblocking(False)
        self._old_wake = None
        if threading.current_thread() is threading.main_thread():
            self._old_wake = signal.set_wakeup_fd(self._wake_in.fileno(), warn_on_full_buffer=False)
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: Any) -> None:
        try:
            if kind is None:
                for p in self.procs:
                    with contextlib.suppress(OSError):
                        p.conn.send(None)
                self._join(timeout=STOP_GRACE_SECONDS)
            else:
                for p in self.procs:
                    with contextlib.suppress(Exception):
                        self._receive(p)  # has it said it is ready?
                    # A process still starting has nothing to keep: it is killed. A ready one stops
                    # as Ctrl-C stops a run, leaving its folder to resume from.
                    _signal_run(p.proc.pid, signal.SIGINT if p.ready else signal.SIGKILL)
                    p.conn.close()  # an idle process reads the end of its queue
                with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: kill them now
                    self._join(timeout=STOP_GRACE_SECONDS)
        finally:
            self._kill()
            if self._old_wake is not None:
                signal.set_wakeup_fd(self._old_wake)
            self.wake.close()
            self._wake_in.close()

    def start(self, job: tuple[Any, ...]) -> None:
        """Send ``job`` to an idle process, starting one if fewer than ``jobs`` are running."""
        idle = next((p for p in self.procs if p.job is None), None)
        if idle is None:
            parent, child = socket.socketpair()
            with _signals_held(), child:  # a signal now is handled once the process is in self.procs
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER, str(child.fileno()), str(self.threads), json.dumps(sys.path)],
                    pass_fds=(child.fileno(),),
                    process_group=0,  # its own group from the start: a terminal's Ctrl-C never reaches it
                )
                idle = _Process(proc, Connection(parent.detach()))
                self.procs.append(idle)
        idle.job, idle.started = job, time.perf_counter()
        with contextlib.suppress(OSError):  # the process is gone: wait() reports it
            idle.conn.send(job)

    def busy(self) -> list[_Process]:
        return [p for p in self.procs if p.job is not None]

    def has_room(self) -> bool:
        return len(self.busy()) < self.jobs

    def wait(self) -> list[tuple[_Process, Any]]:
        """Block until a run answers or a process ends: ``(process, message)`` pairs, the message
        None for a process that ended without answering."""
        busy = self.busy()
        ready = set(wait([p.conn for p in busy] + [self.wake], timeout=1.0))
        if self.wake in ready:
            with contextlib.suppress(BlockingIOError):
                self.wake.recv(4096)  # a signal came: its handler runs as this returns
        out = []
        for p in busy:
            if p.conn in ready or p.proc.poll() is not None:
                message = self._receive(p)
                if message is not _PENDING:
                    out.append((p, message))
        return out

    @staticmethod
    def _receive(p: _Process) -> Any:
        """``p``'s next answer without waiting: the message, None if the process ended without
        one, or ``_PENDING``. A ``ready`` message is noted, not returned."""
        try:
            while p.conn.poll():
                message = p.conn.recv()
                if message[0] != "ready":
                    return message
                p.ready = True
        except (EOFError, OSError):
            return None
        return _PENDING if p.proc.poll() is None else None

    def _join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(max(0.0, deadline - time.monotonic()))

    def _kill(self) -> None:
        with _signals_ignored():
            for p in self.procs:
                if p.proc.poll() is None:
                    _signal_run(p.proc.pid, signal.SIGKILL)
                p.proc.wait()
                p.conn.close()
        self.procs.clear()
