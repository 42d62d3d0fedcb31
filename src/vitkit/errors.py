"""The one family of errors vitkit raises for bad input, each message naming the file, key or
size at fault. The command line catches :class:`VitkitError` and prints its message as one line.

Every class also derives from the built-in error a caller would otherwise expect (``ValueError``
for a bad value, ``RuntimeError`` for a run that cannot go on), so ``except ValueError`` keeps
working. This module imports only the standard library, so the command line can load it without
torch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class VitkitError(Exception):
    """Base of every error vitkit raises on purpose."""


class UsageError(VitkitError, ValueError):
    """An argument that cannot be used: a count below one, an unknown name, a file that is missing."""


class CheckpointError(VitkitError, ValueError):
    """A checkpoint that cannot be read or mapped; the message names the file and what is wrong."""


class DataError(VitkitError, ValueError):
    """A data source that cannot be found or read; the message says where it looked."""


class RecipeError(VitkitError, ValueError):
    """A recipe key or value that is wrong; the message names the key (and suggests close ones)."""


class TrainingError(VitkitError, RuntimeError):
    """A run that cannot go on (non-finite loss, incompatible resume); the message says why."""


class RunStopped(TrainingError):
    """A run stopped by a signal (Ctrl-C, SIGTERM) after writing a checkpoint to resume from.

    Args:
        message: what stopped it and what was written.
        signum: the signal's number (the command exits with 128 + it).
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class ExportError(VitkitError, RuntimeError):
    """An export that failed or whose output does not match the model."""


class DownloadError(VitkitError, RuntimeError):
    """Weights that could not be fetched: no network, a timeout, a missing file, a damaged body, a
    full disk. The message names the address (and the cache file), so it reads as one line."""


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Name ``path`` in the ``OSError`` of a failed write: a full disk names no file, and an atomic
    write fails on its temporary file (``.name.XXXX.tmp``), not the one that was asked for. The
    command line prints it as ``path: No space left on device``."""
    try:
        yield
    except (FileExistsError, NotADirectoryError) as e:  # a file where a folder of the path should be
        blocker = _file_in_the_way(os.fspath(path))
        if blocker is None:
            raise
        raise OSError(e.errno, f"a file, not a folder: {os.fspath(path)} cannot be written under it", blocker) from e
    except OSError as e:
        named = e.filename is not None and not _is_temporary(e.filename)
        if named or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), os.fspath(path)) from e


def _file_in_the_way(path: str) -> str | None:
    """The nearest folder of ``path`` that exists as a file, if one does."""
    parent = os.path.dirname(path)
    while parent and parent != os.path.dirname(parent):
        if os.path.exists(parent):
            return parent if not os.path.isdir(parent) else None
        parent = os.path.dirname(parent)
    return None


def _is_temporary(filename: object) -> bool:
    name = os.path.basename(os.fsdecode(filename)) if isinstance(filename, (str, bytes, os.PathLike)) else ""
    return name.startswith(".") and name.endswith(".tmp")


__all__ = [
    "CheckpointError",
    "DataError",
    "DownloadError",
    "ExportError",
    "RecipeError",
    "RunStopped",
    "TrainingError",
    "UsageError",
    "VitkitError",
]
