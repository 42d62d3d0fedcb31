"""Is a downloaded body the weight file its name promises? Checked before a download is renamed
into the cache, and again each time a cached file is used.

Each format is checked the way its reader will read it, without reading the tensors:

- ``.safetensors``: the header parses and its tensors cover the file exactly (safetensors'
  own check, through :func:`vitkit.checkpoint.io.read_safetensors_metadata`), so a short or
  padded body is refused.
- ``.npz``: a zip archive whose directory lists ``.npy`` arrays
  (:func:`vitkit.checkpoint.io.read_npz`, which lists the arrays before decompressing any), and
  whose members match their CRC32s.
- ``.bin``, ``.pth``, ``.pt``: PyTorch's zip archive with its ``data.pkl`` (checked as a zip, never
  unpickled), or the older single-pickle layout, recognised by its leading magic number; that
  layout cannot be checked for length, so it is accepted only when the server announced a length
  that the body matched, or a checksum matched.

A body that reads as text (an HTML error page served with status 200, a JSON error) is refused
as such, whatever its name.
"""

from __future__ import annotations

import re
import struct
import zipfile
import zlib
from pathlib import Path

from ..errors import CheckpointError

SAFETENSORS = ".safetensors"
NPZ = ".npz"
TORCH = (".bin", ".pth", ".pt")
SUFFIXES = (NPZ, SAFETENSORS, *TORCH)

# torch.save's pre-1.6 layout starts with the pickle of a magic number: PROTO 2, LONG1 of 10 bytes.
_LEGACY_TORCH = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_ZIP_SIGNATURE = b"PK\x03\x04"
_HEAD = 4096  # bytes looked at to tell text from binary
# What reading a damaged zip raises (its directory, a member's header, deflated data).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, struct.error, OSError, ValueError, EOFError, NotImplementedError)


def text_body(path: Path, content_type: str | None = None) -> str | None:
    """Why ``path`` is a web page or other text rather than weights, or None if it is binary.

    Weight files start with binary bytes (a safetensors header length, a zip signature, a pickle
    opcode); a body whose first bytes decode as text is an error page or a message from the server.

    Args:
        path: the file.
        content_type: the server's ``Content-Type``, quoted where it says HTML.

    Returns:
        A phrase for the error (``the server sent a web page, not weights (...)``), or None.
    """
    with open(path, "rb") as f:
        head = f.read(_HEAD)
    if not head:
        return "the server sent an empty body, not weights"
    if b"\0" in head:
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(head) < _HEAD or e.start < len(head) - 4:  # not merely a character cut by the sample's end
            return None
        text = head[: e.start].decode("utf-8")
    if any(ord(c) < 32 and c not in "\t\r\n\f" for c in text):
        return None
    kind = (content_type or "").split(";")[0].strip().lower()
    said = f"Content-Type {kind}; " if kind else ""
    quoted = _quote(text)
    if text.lstrip("\ufeff \t\r\n").startswith("<") or kind in ("text/html", "application/xhtml+xml"):
        return f"the server sent a web page, not weights ({said}it begins {quoted})"
    return f"the server sent text, not weights ({said}it begins {quoted})"


def _quote(text: str, limit: int = 60) -> str:
    """The start of a server's text, on one line, printable, short."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return repr(flat[:limit] + ("..." if len(flat) > limit else ""))


def format_problem(path: Path, suffix: str, *, length_known: bool, members: bool = True) -> str | None:
    """What keeps ``path`` from being the weight file its suffix names, or None if it is one.

    Args:
        path: the file.
        suffix: the format the address promises (``.npz``, ``.safetensors``, ``.bin``...).
        length_known: the body's length was checked (against the server's ``Content-Length``, the
            table's size, or a checksum); without it, a format that cannot be checked for length
            is refused.
        members: check the CRC32 of every member of a zip archive (a pass over the whole file);
            False checks headers and directories only.

    Returns:
        A phrase for the error naming the format and what is wrong, or None.
    """
    suffix = suffix.lower()
    if suffix == SAFETENSORS:
        why = _safetensors_problem(path)
    elif suffix == NPZ:
        why = _npz_problem(path, members)
    elif suffix in TORCH:
        why = _torch_problem(path, length_known, members)
    elif length_known:
        return None
    else:
        return (
            f"its length was not announced and its format cannot be checked (the name ends in neither "
            f"{', '.join(SUFFIXES)})"
        )
    if why is None:
        return None
    kind = _kind(path)
    if kind is not None and kind != _kind_of_suffix(suffix):
        mismatch = f"it reads as {_KINDS[kind]}: the address's name does not match the file"
        return f"not a valid {suffix} file ({why}); {mismatch}"
    return f"not a valid {suffix} file ({why})"


_KINDS = {SAFETENSORS: f"a {SAFETENSORS} file", NPZ: f"a {NPZ} file", "torch": "a PyTorch file"}


def _kind_of_suffix(suffix: str) -> str:
    return "torch" if suffix in TORCH else suffix


def describe(path: Path) -> str | None:
    """The weight format ``path`` reads as, whatever its name (for errors), or None.

    Args:
        path: the file.

    Returns:
        ``"a .safetensors file"``, ``"a .npz file"``, ``"a PyTorch file"``, or None.
    """
    kind = _kind(path)
    return _KINDS[kind] if kind is not None else None


def _kind(path: Path) -> str | None:
    """``.safetensors``, ``.npz`` or ``torch``: what ``path`` holds, by its own structure."""
    if _safetensors_problem(path) is None:
        return SAFETENSORS
    names = _zip_names(path)
    if names:
        if all(n.endswith(".npy") for n in names):
            return NPZ
        if any(n.endswith("data.pkl") for n in names):
            return "torch"
        return None
    with open(path, "rb") as f:
        return "torch" if f.read(len(_LEGACY_TORCH)) == _LEGACY_TORCH else None


def _one_line(e: CheckpointError, path: Path) -> str:
    """A reader's error as a phrase: without the file name it starts with (the caller names the
    file) and without its "not a readable ... file (...)" wrapper (the caller says that too)."""
    text = str(e)
    prefix = f"{path}: "
    text = text[len(prefix) :] if text.startswith(prefix) else text
    m = re.fullmatch(r"not a readable \S+ file \((.*)\)", text)
    return m.group(1) if m else text


def _safetensors_problem(path: Path) -> str | None:
    from ..checkpoint.io import read_safetensors_metadata

    try:
        read_safetensors_metadata(path)
    except CheckpointError as e:
        return _one_line(e, path)
    return None


def _npz_problem(path: Path, members: bool) -> str | None:
    from ..checkpoint.io import read_npz

    def listed(names: list[str]) -> list[str]:
        if not names:
            raise CheckpointError(f"{path}: the archive holds no arrays")
        return []  # the directory is enough here; nothing is decompressed

    try:
        read_npz(path, select=listed)
    except CheckpointError as e:
        return _one_line(e, path)
    others = [n for n in _zip_names(path) or [] if not n.endswith(".npy")]
    if others:
        return f"the zip archive holds {others[0]!r}, not only .npy arrays"
    return _zip_crc_problem(path) if members else None


def _torch_problem(path: Path, length_known: bool, members: bool) -> str | None:
    with open(path, "rb") as f:
        head = f.read(len(_LEGACY_TORCH))
    if head.startswith(_ZIP_SIGNATURE):
        names = _zip_names(path)
        if names is None:
            return "a zip archive without its directory (cut short, or damaged)"
        if not any(n.endswith("data.pkl") for n in names):
            return "a zip archive without the data.pkl of a PyTorch file"
        return _zip_crc_problem(path) if members else None
    if head != _LEGACY_TORCH:
        return "neither PyTorch's zip archive nor its older pickle layout"
    if not length_known:
        return "PyTorch's older pickle layout, whose length cannot be checked, and the server announced none"
    return None


def _zip_names(path: Path) -> list[str] | None:
    """The member names of a zip archive, or None if ``path`` does not open as one."""
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.namelist()
    except _ZIP_ERRORS:
        return None


def _zip_crc_problem(path: Path) -> str | None:
    """The first member of a zip whose bytes do not match its CRC32, as a phrase, or None.

    Members are only checked while their declared sizes stay within what the reader will accept
    (:data:`vitkit.checkpoint.io.NPZ_MAX_RATIO` times the file, at least ``NPZ_MIN_BOUND``); a
    larger archive is left for the reader to refuse, rather than decompressed here.
    """
    from ..checkpoint.io import NPZ_MAX_RATIO, NPZ_MIN_BOUND

    try:
        with zipfile.ZipFile(path) as zf:
            declared = sum(info.file_size for info in zf.infolist())
            if declared > max(NPZ_MAX_RATIO * path.stat().st_size, NPZ_MIN_BOUND):
                return None
            bad = zf.testzip()
    except _ZIP_ERRORS as e:
        return f"a damaged zip archive: {e or type(e).__name__}"
    return f"member {bad!r} does not match its CRC32" if bad is not None else None


__all__ = ["SUFFIXES", "describe", "format_problem", "text_body"]
