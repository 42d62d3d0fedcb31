"""The run folder of a training run: who holds it, what a killed run left in it, its metrics log.

- What a run folder is: a folder vitkit made for a run carries the marker file ``OUT/.vitkit-run``.
  A run goes into a folder that is new, empty, or marked (to resume or start over); a folder with
  anything else in it is refused, so ``--out`` given a folder of other files (a home folder, ``/``,
  a dataset) never has its files overwritten. A folder written by a vitkit that did not mark its
  folders is recognised by what such a run left (``.lock`` with ``config.yaml``, or step
  checkpoints) and marked.
- One run at a time: the run holds ``OUT/.lock`` (``fcntl.flock``, not blocking) for its life. The
  operating system drops the lock when the process ends, killed or not, so a lock file left by a
  dead run never blocks; the file names the holder (pid, host, start time) for the one refused.
- A run killed while writing leaves the temporaries of :func:`vitkit.files.atomic_write` behind;
  the next run removes those of the files a run writes.
- ``metrics.jsonl``: one JSON record a line, appended one whole line at a time. A torn last line
  (a crash while appending) is dropped when the log is read; a damaged line elsewhere is an error
  that names the file and the line.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import TrainingError, UsageError
from ..files import RUN_MARKER, temporary_target, write_text

try:
    import fcntl
except ImportError:  # not on POSIX: runs go unlocked
    fcntl = None  # type: ignore[assignment]

METRICS = "metrics.jsonl"
LOCK = ".lock"
MARKER = RUN_MARKER
# What a run writes through atomic_write, in the run folder and in checkpoints/.
_WRITTEN = re.compile(
    r"config\.yaml|metrics\.jsonl|curves\.png|best\.safetensors|step_\d+\.safetensors|\.vitkit-run"
    r"|summary\.json|epochs\.csv|README\.md|worst\.png|confusion\.(json|png)"
)
_STEP = re.compile(r"step_\d+\.safetensors")


class RunFolder:
    """``out`` and what lives in it; :meth:`acquire` before anything reads or writes there.

    Args:
        out: the run folder (it need not exist yet).

    Raises:
        UsageError: an empty name.
    """

    def __init__(self, out: str | Path) -> None:
        if not str(out).strip():
            raise UsageError("--out is empty: name the folder the run writes to")
        self.out = Path(out)
        self.checkpoints = self.out / "checkpoints"
        self.metrics = self.out / METRICS
        self._fd: int | None = None
        self._created = False

    # -- the lock ---------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Hold the folder (made if missing), or stop with one line naming the run that holds it
        or saying why the folder is not a run folder (:func:`check_run_folder`).

        Raises:
            UsageError: ``out`` is a file, or a folder of other files.
            TrainingError: another run holds the folder, or it cannot be made, locked or marked.
        """
        self._created = not self.out.exists()
        check_run_folder(self.out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise TrainingError(f"{self.out}: cannot use as the run folder ({e.strerror or e})") from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 500).decode(errors="replace").strip() or "a process that has not said which"
                os.close(fd)
                raise TrainingError(
                    f"{self.out} is in use by another run ({holder}); wait for it to end, or use another --out"
                ) from None
            except OSError:  # a file system without locks: the run goes unlocked
                pass
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        with contextlib.suppress(OSError):  # who holds it is for the message of the one refused
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
        self._fd = fd
        marker = self.out / MARKER
        if not marker.is_file():
            try:
                write_text(marker, json.dumps({"vitkit": __version__, "created": started}) + "\n")
            except OSError as e:
                self.release(failed_start=True)
                raise TrainingError(f"{marker}: cannot mark the run folder ({e.strerror or e})") from None

    def release(self, failed_start: bool = False) -> None:
        """Let the folder go. ``failed_start``: the run never began, so a folder this run made
        (holding only the lock file) is removed again.

        Args:
            failed_start: whether the run never began.
        """
        if self._fd is None:
            return
        if failed_start and self._created:
            with contextlib.suppress(OSError):
                for name in (LOCK, MARKER):
                    (self.out / name).unlink(missing_ok=True)
                self.out.rmdir()  # only if empty
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __del__(self) -> None:  # a Trainer dropped without running lets the folder go too
        with contextlib.suppress(Exception):
            self.release()

    # -- what a killed run left -------------------------------------------------------------------
    def remove_stale_temporaries(self) -> list[str]:
        """Remove the temporaries a killed run's atomic writes left here and in checkpoints/ (the
        folder is held, so no other run is writing them); returns their names.

        Returns:
            The file names removed, without their folders.
        """
        removed = []
        for folder in (self.out, self.checkpoints):
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                target = temporary_target(p.name)
                if target and _WRITTEN.fullmatch(target) and p.is_file():
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                    removed.append(p.name)
        return removed

    # -- what is kept -----------------------------------------------------------------------------
    def kept(self, best_step: int | None = None) -> str:
        """What a run that stops now leaves to resume from and to use, in words.

        Args:
            best_step: the step of ``best.safetensors``, named where it is kept (None: not named).

        Returns:
            E.g. ``OUT/checkpoints/step_400.safetensors is kept; best.safetensors (step 300) is kept``,
            or ``no checkpoint was written``.
        """
        from .state import list_checkpoints

        ckpts = list_checkpoints(self.checkpoints)
        text = f"{ckpts[-1]} is kept" if ckpts else "no checkpoint was written"
        if (self.out / "best.safetensors").is_file():
            text += "; best.safetensors" + (f" (step {best_step})" if best_step is not None else "") + " is kept"
        return text

    @contextlib.contextmanager
    def writing(self, path: Path, doing: str, step: int, best_step: int | None = None) -> Iterator[None]:
        """Turn a failed write (a full disk, a read-only folder) into one line naming the file.

        Args:
            path: the file the block writes.
            doing: what the block does, as the message says it ("write the checkpoint").
            step: the step the run stops at.
            best_step: the step of ``best.safetensors``, for :meth:`kept`.

        Yields:
            None; the block is the write.

        Raises:
            TrainingError: the block raised an ``OSError``; the message also says what is kept.
        """
        try:
            yield
        except OSError as e:
            reason = e.strerror or str(e) or type(e).__name__
            raise TrainingError(
                f"{path}: cannot {doing} ({reason}); the run stops at step {step}, {self.kept(best_step)}"
            ) from None

    # -- the metrics log --------------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one record as one whole line (a single write, flushed).

        Args:
            record: the record, JSON-serialisable, with an integer ``step``.
        """
        line = json.dumps(record) + "\n"
        with open(self.metrics, "a") as f:
            f.write(line)
            f.flush()

    def truncate_metrics(self, step: int) -> None:
        """Keep the records up to ``step`` (the resumed one), dropping a torn last line; atomically.

        Args:
            step: the last step whose records are kept.

        Raises:
            TrainingError: the log cannot be read, or a line other than the last is damaged.
        """
        if not self.metrics.is_file():
            return
        keep = [line for line, rec in read_metrics(self.metrics) if rec["step"] <= step]
        write_text(self.metrics, "".join(line + "\n" for line in keep))


def check_run_folder(out: str | Path) -> None:
    """Refuse, in one line, a folder a run must not write into: one that exists, is not empty and
    is not a run folder (no :data:`MARKER`, and not what an older vitkit's run left: ``.lock``
    with ``config.yaml``, or step checkpoints in ``checkpoints/``).

    Args:
        out: the folder given as ``--out``.

    Raises:
        UsageError: ``out`` is a file, or a folder of other files.
        TrainingError: a run folder with checkpoints whose ``config.yaml`` was emptied or cut
            (:func:`check_saved_recipe`).
    """
    out = Path(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise UsageError(f"{out}: is a file, not a folder: give --out a new or empty folder, or a run folder")
    try:
        names = {p.name for p in out.iterdir()}
    except OSError as e:
        raise UsageError(f"{out}: cannot read the folder ({e.strerror or e})") from None
    # the lock and temporaries of a run's own files: a run stopped before it marked the folder
    ours = {n for n in names if n == LOCK or ((t := temporary_target(n)) is not None and _WRITTEN.fullmatch(t))}
    if names <= ours:
        return
    ckpts = out / "checkpoints"
    has_steps = ckpts.is_dir() and any(_STEP.fullmatch(p.name) for p in ckpts.iterdir())
    if MARKER in names or {LOCK, "config.yaml"} <= names or has_steps:
        if has_steps:
            check_saved_recipe(out / "config.yaml")
        return
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise UsageError(
        f"{out}: not empty ({shown}) and not a vitkit run folder (no {MARKER}); give --out a new or "
        "empty folder, or the folder of a run to resume"
    )


# The sections of every recipe a run saves (``config.yaml``): a saved recipe without one of them
# was cut or emptied, and would read back as the defaults (a "different recipe").
RECIPE_SECTIONS = ("model", "data", "augment", "optim", "train", "log")


def check_saved_recipe(saved: Path) -> None:
    """Refuse, in one line naming it, the ``config.yaml`` of a run to resume when it was emptied
    or cut: no text, only comments, or a mapping without a section every saved recipe has
    (:data:`RECIPE_SECTIONS`; its top-level keys are found line by line, nothing is parsed). Text
    that is not such a mapping is left to the resume's own check, which names it too. A missing
    file is left alone (a run from before recipes were saved).

    Args:
        saved: the run folder's ``config.yaml``.

    Raises:
        TrainingError: naming ``saved``, what is wrong with it, and that each checkpoint keeps a copy.
    """
    try:
        text = saved.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    except OSError as e:
        raise TrainingError(f"{saved}: cannot read the recipe of the run in this folder ({e.strerror or e})") from None
    body = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if body and not re.match(r"[A-Za-z_]\w*:", body[0]):
        return  # not the block mapping a run writes (edited by hand?): the resume's own check reads it
    top = {m.group(1) for line in body if (m := re.match(r"([A-Za-z_]\w*):", line))}  # no parse: no alias bombs
    missing = [k for k in RECIPE_SECTIONS if k not in top]
    if missing:
        what = "is empty" if not body else f"has no {', '.join(missing)} section{'s' if len(missing) > 1 else ''}"
        raise TrainingError(
            f"{saved}: the recipe saved with this run {what} ({len(text.encode())} bytes): the file was emptied or "
            "cut. Each checkpoint keeps a copy (its metadata 'recipe'): put it back to resume, or use another --out"
        )


def read_metrics(path: str | Path, strict: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) for each record of a ``metrics.jsonl``. A last line that does not parse (torn by
    a crash while appending) is dropped; one elsewhere is a :class:`TrainingError` naming the file
    and line, or, with ``strict`` False, skipped too.

    Args:
        path: the ``metrics.jsonl`` file.
        strict: whether a damaged line before the last is an error (True) or skipped (False).

    Returns:
        (line, record) pairs in file order: the line as written, without its newline, and its
        record (a mapping with an integer ``step``). Blank lines are skipped.

    Raises:
        TrainingError: the file cannot be read, or (``strict``) a line before the last is damaged.
    """
    path = Path(path)
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        raise TrainingError(f"{path}: cannot read the metrics log ({e.strerror or e})") from None
    while lines and not lines[-1].strip("\x00 \t"):
        lines.pop()  # blank, or zeros a crash left where the last line should be
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                raise ValueError("not a record with a step")
        except (ValueError, RecursionError) as e:
            if number == len(lines) or not strict:
                continue
            why = e if isinstance(e, ValueError) else "nested too deeply"
            raise TrainingError(
                f"{path}: line {number} is damaged ({why}); remove it (or the file) to resume the run"
            ) from None
        out.append((line, rec))
    return out


__all__ = ["LOCK", "MARKER", "METRICS", "RunFolder", "check_run_folder", "read_metrics"]
