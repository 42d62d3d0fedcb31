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

# Metadata key of the CRC32 of each tensor's bytes, written with every file vitkit writes.
# safetensors checks a file's header and sizes but not its values: a flipped bit in a weight
# would load without a word. Other writers' files have no such table and are read unchecked.
CHECKSUM_KEY = "vitkit_crc32"


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
    one safetensors refuses, or one whose tensors do not match the CRC32s written with them."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
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
    except ValueError:
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
    """Only the metadata of a safetensors file (the header; no tensor is read)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({_one_line(e)})") from None


# An .npz is a zip of .npy members. Their sizes are read from the zip directory and each member's
# header before anything is decompressed: a small file must not unpack into gigabytes.
NPZ_MAX_RATIO = 32  # uncompressed bytes of the arrays read per byte of file (float weights: about 1)
NPZ_MIN_BOUND = 64 << 20  # ... but small files may always unpack to this many bytes
_NPZ_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what numpy writes; others inflate unbounded


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
            _check_npz_sizes(path, size, {n: members[n] for n in names})
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
)


def _check_npz_sizes(path: Path, size: int, members: dict[str, zipfile.ZipInfo]) -> None:
    for name, info in members.items():
        if info.compress_type not in _NPZ_METHODS:
            raise CheckpointError(
                f"{path}: array {name!r} is compressed with zip method {info.compress_type}; "
                "numpy writes only stored or deflated members"
            )
    total = sum(info.file_size for info in members.values())
    bound = max(NPZ_MAX_RATIO * size, NPZ_MIN_BOUND)
    if total > bound:
        name, info = max(members.items(), key=lambda kv: kv[1].file_size)
        raise CheckpointError(
            f"{path}: array {name!r} would unpack to {_mib(info.file_size)} ({_mib(total)} for all arrays read), "
            f"more than a {_mib(size)} file may ({_mib(bound)}: {NPZ_MAX_RATIO} times its size, at least "
            f"{_mib(NPZ_MIN_BOUND)}): refusing to decompress it"
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


def read_torch_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A PyTorch ``.bin``/``.pth`` state dict, through ``weights_only=True`` (no arbitrary code)."""
    path = Path(path)
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


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
