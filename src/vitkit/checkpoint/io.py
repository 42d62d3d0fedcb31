"""Safe file reading and atomic writing. Nothing here unpickles an untrusted file."""

from __future__ import annotations

import json
import math
import struct
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_save

from ..errors import CheckpointError
from ..files import atomic_write
from . import values

# Metadata key of the CRC32 of each tensor's bytes, written with every file vitkit writes.
# safetensors checks a file's header and sizes but not its values: a flipped bit in a weight
# would load without a word. Other writers' files have no such table and are read unchecked.
CHECKSUM_KEY = "vitkit_crc32"

# Metadata key of the class names a vitkit checkpoint was trained with (a JSON list), written by
# training and printed by ``vitkit predict``. Names from a file are made printable when read.
CLASSES_KEY = "classes"
MAX_CLASS_NAME_CHARS = 256  # a longer name is cut (ImageNet-21k's longest is about 200)
MAX_CLASS_NAMES = values.MAX_CLASSES  # more names than a model may have classes is a damaged file


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """A tensor's raw bytes as a flat uint8 array (no copy for a contiguous CPU tensor), for checksums."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def tensor_crc32(t: torch.Tensor) -> str:
    """The CRC32 of a tensor's bytes, as 8 hex digits."""
    return f"{zlib.crc32(tensor_bytes(t)):08x}"


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Atomically write tensors (made contiguous, on the CPU) with string metadata and the
    CRC32 of each tensor (:data:`CHECKSUM_KEY`, checked by :func:`read_safetensors`)."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    sums = json.dumps({k: tensor_crc32(v) for k, v in sorted(tensors.items())}, separators=(",", ":"))
    blob = safetensors_save(tensors, metadata={**metadata, CHECKSUM_KEY: sums})
    atomic_write(path, lambda f: f.write(blob))


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a damaged file is a :class:`CheckpointError`:
    one safetensors refuses, or one whose tensors do not match the CRC32s written with them.
    The metadata is checked as :func:`read_safetensors_metadata` checks it.

    Args:
        path: the ``.safetensors`` file.

    Returns:
        The tensors by name, and the metadata (class names made printable).
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = checked_metadata(path, f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: not a readable safetensors file ({_one_line(e)})") from None
    if CHECKSUM_KEY in meta:
        _check_sums(path, tensors, meta[CHECKSUM_KEY])
    return tensors, meta


def _check_sums(path: Path, tensors: dict[str, torch.Tensor], table: str) -> None:
    damaged = (
        "the file is damaged: use another copy, or an earlier checkpoint (if its tensors were "
        f"changed on purpose, write it again without the {CHECKSUM_KEY} metadata)"
    )
    try:
        sums = json.loads(table)
        if not isinstance(sums, dict):
            raise ValueError("not a table")
    except (ValueError, RecursionError):
        raise CheckpointError(f"{path}: its {CHECKSUM_KEY} metadata does not read as a table; {damaged}") from None
    if sums.keys() != tensors.keys():
        odd = sorted(sums.keys() ^ tensors.keys())
        raise CheckpointError(f"{path}: tensors and {CHECKSUM_KEY} table disagree on {odd[:3]}; {damaged}")
    for name, tensor in tensors.items():
        got = tensor_crc32(tensor)
        if got != sums[name]:
            raise CheckpointError(
                f"{path}: tensor {name!r} does not match the CRC32 written with it "
                f"({got}, written {sums[name]}); {damaged}"
            )


def read_safetensors_metadata(path: str | Path) -> dict[str, str]:
    """Only the metadata of a safetensors file (the header; no tensor is read), checked
    (:func:`checked_metadata`): no value nested deeper than JSON parsers can follow, and class
    names that cannot act on a terminal.

    Args:
        path: the ``.safetensors`` file.

    Returns:
        The metadata, key by key.
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return checked_metadata(path, f.metadata() or {})
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: not a readable safetensors file ({_one_line(e)})") from None


def checked_metadata(path: str | Path, meta: dict[str, str]) -> dict[str, str]:
    """A file's string metadata made safe for every reader: a value nested deeper than
    :data:`vitkit.checkpoint.values.MAX_NESTING` is refused (Python's parsers would fail with a
    ``RecursionError``), and the class names (:data:`CLASSES_KEY`) are made printable.

    Args:
        path: the file, for messages.
        meta: the metadata as read.

    Returns:
        A copy of ``meta`` with the class names made printable.

    Raises:
        CheckpointError: naming the file and the key, for a value nested too deep or more class
            names than a model may have classes.
    """
    out = dict(meta)
    for key, value in out.items():
        values.check_nesting(value, str(path), f"metadata {str(key)[:60]!r} is")  # repr: escaped
    if CLASSES_KEY in out:
        out[CLASSES_KEY] = printable_class_names(out[CLASSES_KEY], f"{path}: metadata {CLASSES_KEY!r}")
    return out


def printable_class_names(text: str, where: str) -> str:
    """The class names of a file's metadata (a JSON list) with each name made printable
    (:func:`vitkit.checkpoint.values.printable`) and cut to :data:`MAX_CLASS_NAME_CHARS`; text
    that is not a JSON list is made printable whole (no reader takes it for names).

    Args:
        text: the metadata value.
        where: the file and key, for the message.

    Returns:
        The value to keep, JSON when it was (``text`` itself when every name was printable).

    Raises:
        CheckpointError: naming ``where``, for more names than a model may have classes.
    """
    try:
        names = json.loads(text)
    except (ValueError, RecursionError):
        return values.printable(text)
    if not isinstance(names, list):
        return values.printable(text)
    if len(names) > MAX_CLASS_NAMES:
        raise CheckpointError(f"{where}: {len(names)} class names, more than the {MAX_CLASS_NAMES} vitkit reads")
    safe = [values.printable(n, MAX_CLASS_NAME_CHARS) if isinstance(n, str) else n for n in names]
    return text if safe == names else json.dumps(safe, ensure_ascii=False)


# An .npz is a zip of .npy members, and PyTorch's .bin/.pth a zip of records. Their sizes are read
# from the zip directory (and each .npy member's header) before anything is decompressed: a small
# file must not unpack into gigabytes. Both numpy's zip reader and PyTorch's stop at the size the
# directory gives a member, so the directory bounds what they inflate.
ZIP_MAX_RATIO = 32  # uncompressed bytes per byte of file, and per compressed byte of a member
ZIP_MIN_BOUND = 64 << 20  # ... but small files and members may always unpack to this many bytes
NPZ_MAX_RATIO = ZIP_MAX_RATIO  # the bounds of .npz files (float weights unpack to about 1 byte a byte)
NPZ_MIN_BOUND = ZIP_MIN_BOUND
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what numpy and PyTorch write; others inflate unbounded


def read_npz(path: str | Path, select: Callable[[list[str]], list[str]] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, with pickled object arrays refused.

    ``select`` gets the array names (from the zip directory, before anything is decompressed)
    and returns those to read, or raises :class:`CheckpointError` for names it refuses. The
    arrays read may unpack to at most ``NPZ_MAX_RATIO`` times the file's size (``NPZ_MIN_BOUND``
    for small files); each member's ``.npy`` header must agree with the size the zip directory
    gives it. A damaged or oversized file is a :class:`CheckpointError` naming it.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as zf:
            infos = {info.filename: info for info in zf.infolist()}  # the last of a repeated name, as open() does
            members = {(n[: -len(".npy")] if n.endswith(".npy") else n): info for n, info in infos.items()}
            names = list(members) if select is None else select(list(members))
            check_zip_sizes(path, size, {n: members[n] for n in names}, "array", "numpy")
            out = {}
            for name in names:
                with zf.open(members[name]) as f:
                    out[name] = _read_npy_member(path, name, f, members[name].file_size)
            return out
    except CheckpointError:
        raise
    except _NPZ_ERRORS as e:
        raise CheckpointError(f"{path}: not a readable .npz file ({_one_line(e)})") from None


# A damaged zip or .npy raises any of these (zipfile, zlib, numpy's header parser, a short read).
_NPZ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    ValueError,
    OSError,
    EOFError,
    KeyError,
    IndexError,
    TypeError,
    OverflowError,
    NotImplementedError,
    RuntimeError,
    SyntaxError,
    struct.error,
    tokenize.TokenError,  # numpy parses the .npy header's dict with the tokenizer
    RecursionError,  # ... and a header nested deep enough overflows its parser
)


def check_zip_sizes(
    path: Path, size: int, members: dict[str, zipfile.ZipInfo], kind: str = "member", writer: str = "the writer"
) -> None:
    """Refuse, before anything is decompressed, zip members that would unpack to more than their
    file warrants: a member compressed other than stored or deflated (whose size nothing checks),
    a compressed member of more than :data:`ZIP_MAX_RATIO` times its compressed bytes, and members
    of more than ``ZIP_MAX_RATIO`` times the file in all (each at least :data:`ZIP_MIN_BOUND`).

    Args:
        path: the file, for messages.
        size: its size in bytes.
        members: the members that will be read, by the name the message gives them.
        kind: what a member is, for messages ("array", "record").
        writer: what writes such files, for the message on compression methods.

    Raises:
        CheckpointError: naming the file and the member.
    """
    for name, info in members.items():
        if info.compress_type not in _ZIP_METHODS:
            raise CheckpointError(
                f"{path}: {kind} {name!r} is compressed with zip method {info.compress_type}; "
                f"{writer} writes only stored or deflated members"
            )
    for name, info in members.items():
        bound = max(ZIP_MAX_RATIO * info.compress_size, ZIP_MIN_BOUND)
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > bound:
            raise CheckpointError(
                f"{path}: {kind} {name!r} would unpack to {_mib(info.file_size)} from {_mib(info.compress_size)} "
                f"({_mib(bound)} at most: {ZIP_MAX_RATIO} times its compressed size, at least "
                f"{_mib(ZIP_MIN_BOUND)}): refusing to decompress it"
            )
    total = sum(info.file_size for info in members.values())
    bound = max(ZIP_MAX_RATIO * size, ZIP_MIN_BOUND)
    if total > bound:
        name, info = max(members.items(), key=lambda kv: kv[1].file_size)
        raise CheckpointError(
            f"{path}: {kind} {name!r} would unpack to {_mib(info.file_size)} ({_mib(total)} for all {kind}s read), "
            f"more than a {_mib(size)} file may ({_mib(bound)}: {ZIP_MAX_RATIO} times its size, at least "
            f"{_mib(ZIP_MIN_BOUND)}): refusing to decompress it"
        )


def _read_npy_member(path: Path, name: str, f: Any, stored: int) -> np.ndarray:
    """One ``.npy`` member, read as ``np.load`` reads it once its header agrees with the zip."""
    from numpy.lib import format as npy

    version = npy.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = npy.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = npy.read_array_header_2_0(f)
    else:
        raise CheckpointError(f"{path}: array {name!r} has .npy format version {version}; vitkit reads 1.0 and 2.0")
    if dtype.hasobject:
        raise CheckpointError(f"{path}: array {name!r} holds Python objects (a pickle); vitkit reads only numbers")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes != stored - f.tell():
        raise CheckpointError(
            f"{path}: array {name!r}: its header says {tuple(shape)} {dtype} ({nbytes} bytes) "
            f"but the archive holds {stored - f.tell()} bytes for it"
        )
    f.seek(0)
    arr = npy.read_array(f, allow_pickle=False)
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.names is None:
        return bf16_to_float32(arr)
    return arr


def bf16_to_float32(arr: np.ndarray) -> np.ndarray:
    """bf16 values stored as 2-byte void entries, as float32, exactly.

    numpy has no bf16 type: JAX's (ml_dtypes') bfloat16 arrays saved with ``np.savez`` come back
    as ``|V2``, the raw bytes of each value. That is how big_vision's half-size checkpoints
    (PaliGemma's ``*.bf16.npz``) store their weights. A bf16 value is the top half of the
    float32 of the same value, so shifting its 16 bits up is the exact conversion; the bytes are
    little-endian, as written on the x86 and ARM machines that make these files."""
    bits = np.ascontiguousarray(arr).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(arr.shape)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


_ZIP_MAGIC = b"PK\x03\x04"  # how PyTorch tells its zip layout from the older pickle stream


def read_torch_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A PyTorch ``.bin``/``.pth`` state dict, through ``weights_only=True`` (no arbitrary code).

    PyTorch's zip layout has its records' sizes checked first (:func:`check_zip_sizes`), so that
    a small file cannot unpack into gigabytes; the older layout stores its tensors uncompressed.

    Args:
        path: the ``.bin``/``.pth``/``.pt`` file.

    Returns:
        The tensors by name (a ``state_dict``, ``model`` or ``module`` entry unwrapped).
    """
    path = Path(path)
    _check_torch_zip(path)
    try:
        with warnings.catch_warnings():  # a damaged file warns (an odd pickle protocol) before it fails
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file; all mean the same here
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({_one_line(e)})") from None
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state dict), got {type(obj).__name__}")
    return obj


def _check_torch_zip(path: Path) -> None:
    """The records of a PyTorch zip file within :func:`check_zip_sizes`' bounds (no other layout
    compresses anything)."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                return
        size = path.stat().st_size
        with zipfile.ZipFile(path) as zf:
            records = {info.filename: info for info in zf.infolist()}
    except (OSError, zipfile.BadZipFile, zlib.error, ValueError, EOFError, OverflowError, struct.error) as e:
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({_one_line(e)})") from None
    check_zip_sizes(path, size, records, "record", "PyTorch")


def _one_line(e: BaseException) -> str:
    """The first line of a reader's message, made printable (it may quote the file's bytes)."""
    text = str(e).strip().splitlines()
    return values.printable(text[0], 200) if text else type(e).__name__
