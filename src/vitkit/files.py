"""Writing files so that nothing is lost: through a temporary file, fsynced, renamed over the
target. Used by every package that writes (checkpoints, datasets, reports, exports)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: str | Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write through a temporary file in the same folder, fsync it, then rename over ``path``.

    A crash or a failed write leaves any previous file at ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def write_text(path: str | Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    atomic_write(path, lambda f: f.write(text), mode="w")


def write_json(path: str | Path, payload: Any) -> None:
    """Atomically write ``payload`` as indented JSON."""
    write_text(path, json.dumps(payload, indent=2))


def slug(text: str, default: str = "data") -> str:
    """``text`` as a safe file-name part: runs of other characters become one underscore."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.") or default
