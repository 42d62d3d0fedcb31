"""Writing files so that nothing is lost: through a temporary file, fsynced, renamed over the
target. Used by every package that writes (checkpoints, datasets, reports, exports)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import writing

_TMP_SUFFIX = ".tmp"
RUN_MARKER = ".vitkit-run"
"""The file that marks a folder as a vitkit run folder (a training run writes it first)."""


def atomic_write(path: str | Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write through a temporary file in the same folder, fsync it, then rename over ``path``.

    A crash or a failed write leaves any previous file at ``path`` untouched. The temporary is
    ``.NAME.XXXXXXXX.tmp``; a process killed while writing leaves it behind
    (:func:`temporary_target` recognises it). A failed write is an ``OSError`` that names
    ``path``, not the temporary (:func:`vitkit.errors.writing`). The file gets the permissions
    ``open()`` would give it: those of the file it replaces, else 0666 less the process umask
    (0644 under the usual umask 022).

    Args:
        path: the file to write.
        write: called with the open temporary file; writes the content.
        mode: the mode the temporary is opened in (``"wb"`` or ``"w"``).
    """
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        permissions = _permissions_for(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TMP_SUFFIX, dir=path.parent)
        try:
            if hasattr(os, "fchmod"):  # mkstemp makes it 0600, readable by its owner alone
                os.fchmod(fd, permissions)
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


def _permissions_for(path: Path) -> int:
    """The permission bits ``open(path, "w")`` would leave ``path`` with: an existing file keeps
    its own, a new one gets 0666 less the process umask."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode) & 0o777
    except OSError:
        pass
    return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process umask, read without changing it where the system shows it (Linux's
    ``/proc/self/status``): setting it to read it back would race with threads creating files."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temporary_target(name: str) -> str | None:
    """The file name an :func:`atomic_write` temporary called ``name`` was for, or None if
    ``name`` is not one (``.metrics.jsonl.k3j_x9a2.tmp`` -> ``metrics.jsonl``).

    Args:
        name: a file name, without its folder.

    Returns:
        The name of the file it was to replace, or None.
    """
    if not (name.startswith(".") and name.endswith(_TMP_SUFFIX)):
        return None
    parts = name[1 : -len(_TMP_SUFFIX)].rsplit(".", 1)  # mkstemp's random part has no dot
    return parts[0] if len(parts) == 2 and parts[0] else None


def write_text(path: str | Path, text: str) -> None:
    """Atomically write ``text`` to ``path``.

    Args:
        path: the file to write.
        text: its content, encoded as ``open(path, "w")`` would encode it.
    """
    atomic_write(path, lambda f: f.write(text), mode="w")


def write_json(path: str | Path, payload: Any) -> None:
    """Atomically write ``payload`` as indented JSON.

    Args:
        path: the file to write.
        payload: any value ``json.dumps`` takes.
    """
    write_text(path, json.dumps(payload, indent=2))


# The characters a YAML stream may not hold (YAML 1.1's printable set, as PyYAML's reader checks it).
_YAML_UNPRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_YAML_KEY = re.compile(r"\s*(?:-\s+)?([^\s:#'\"][^:#]*?)\s*:(?:\s|$)")


def yaml_text_problem(text: str, source: str) -> str | None:
    """Why ``text`` cannot be YAML because of a character in it, or None: a control character
    (other than tab and newline), a lone surrogate or another code point YAML does not allow,
    which PyYAML refuses with a traceback before it parses anything. The phrase names ``source``,
    the line, the key on that line where there is one, and the character as an escape.

    Args:
        text: the YAML text (a recipe file, a ``--set`` value).
        source: what it came from, for the message (the file, ``--set train.steps``).

    Returns:
        One line for an error, or None when every character may be in YAML.
    """
    m = _YAML_UNPRINTABLE.search(text)
    if m is None:
        return None
    line_no = text.count("\n", 0, m.start()) + 1
    line = text.splitlines()[line_no - 1] if text.splitlines() else ""
    key = _YAML_KEY.match(line[: m.start() - (text.rfind("\n", 0, m.start()) + 1)])
    where = f"line {line_no}" + (f", key {key.group(1)!r}" if key else "")
    shown = m.group().encode("unicode_escape").decode("ascii")
    return (
        f"{source}: {where} holds the character {shown}, which YAML does not allow: remove it, or write it "
        f'as the escape "{shown}" inside double quotes'
    )


def check_yaml_text(text: str, source: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` with :func:`yaml_text_problem`'s line when ``text`` holds a character YAML
    does not allow (call it before a YAML parser sees ``text``).

    Args:
        text: the YAML text.
        source: what it came from, for the message.
        error: the exception class to raise (``vitkit.errors.RecipeError`` for recipes).

    Raises:
        error: naming ``source``, the line and the key.
    """
    problem = yaml_text_problem(text, source)
    if problem is not None:
        raise error(problem)


def slug(text: str, default: str = "data") -> str:
    """``text`` as a safe file-name part: runs of other characters become one underscore."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.") or default


__all__ = [
    "RUN_MARKER",
    "atomic_write",
    "check_yaml_text",
    "temporary_target",
    "write_json",
    "write_text",
    "yaml_text_problem",
]
