"""CIFAR-10 and CIFAR-100, held in memory as uint8 (N, 3, 32, 32).

Both releases of the Toronto site are read: the python one (``cifar-10-batches-py/``,
``cifar-100-python/``: pickled dicts of numpy arrays) and the binary one
(``cifar-10-batches-bin/``, ``cifar-100-binary/``: fixed-size records). Either may be an extracted
folder or the ``.tar.gz`` as downloaded, under ``$VITKIT_DATA/cifar10`` (resp. ``cifar100``) or a
``root`` given by the caller. When nothing is found, the python release is downloaded from the
dataset's own address and its published md5 checked.

The pickles are read with an unpickler that only lets the numpy array machinery through, so a
tampered file cannot run code: anything else is refused with a :class:`DataError`.
"""

from __future__ import annotations

import codecs
import hashlib
import http.client
import io
import pickle
import tarfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError
from ..files import atomic_write
from .base import ArrayDataset
from .idx import data_home

try:  # numpy >= 2 keeps the array internals in numpy._core; numpy 1.x in numpy.core
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray
    from numpy.core import numeric as _numeric

IMAGE_SHAPE = (3, 32, 32)
IMAGE_BYTES = 3 * 32 * 32


@dataclass(frozen=True)
class Release:
    """Where one CIFAR variant lives and how its files are named."""

    url: str
    md5: str
    archive: str  # python release, as downloaded
    py_folder: str
    bin_archive: str
    bin_folder: str
    py_files: dict[str, tuple[str, ...]]  # split -> pickled batches
    py_meta: str
    bin_files: dict[str, tuple[str, ...]]  # split -> binary batches
    bin_meta: str  # class names, one a line
    label_bytes: int  # leading label bytes per binary record
    num_classes: int


RELEASES = {
    "cifar10": Release(
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        archive="cifar-10-python.tar.gz",
        py_folder="cifar-10-batches-py",
        bin_archive="cifar-10-binary.tar.gz",
        bin_folder="cifar-10-batches-bin",
        py_files={"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
        py_meta="batches.meta",
        bin_files={"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)},
        bin_meta="batches.meta.txt",
        label_bytes=1,
        num_classes=10,
    ),
    "cifar100": Release(
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        archive="cifar-100-python.tar.gz",
        py_folder="cifar-100-python",
        bin_archive="cifar-100-binary.tar.gz",
        bin_folder="cifar-100-binary",
        py_files={"train": ("train",), "test": ("test",)},
        py_meta="meta",
        bin_files={"train": ("train.bin",), "test": ("test.bin",)},
        bin_meta="fine_label_names.txt",
        label_bytes=2,  # coarse, then fine
        num_classes=100,
    ),
}

SPLITS = {"train": "train", "test": "test", "val": "test"}

# The only globals a pickled numpy array needs, under both numpy spellings. ``_codecs.encode``
# appears in protocol-2 pickles written by Python 3 (how they store bytes).
_NUMPY_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}
for _module in ("numpy.core", "numpy._core"):
    _NUMPY_GLOBALS[(f"{_module}.multiarray", "_reconstruct")] = _multiarray._reconstruct
    _NUMPY_GLOBALS[(f"{_module}.multiarray", "scalar")] = _multiarray.scalar
    if hasattr(_numeric, "_frombuffer"):
        _NUMPY_GLOBALS[(f"{_module}.numeric", "_frombuffer")] = _numeric._frombuffer


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings and numpy arrays, and refuses every other global.

    ``where`` names the file in the error. Python-2 strings are decoded as latin-1, which is
    how numpy expects the raw bytes of arrays pickled by Python 2 (the CIFAR release).

    Args:
        file: the open pickle, read in binary.
        where: the file's name, for the error.
    """

    def __init__(self, file: io.BufferedIOBase, where: str) -> None:
        super().__init__(file, encoding="latin1")
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        """The global a pickle names, if it is one a numpy array needs.

        Args:
            module: the module the pickle names.
            name: the name in that module.

        Returns:
            The numpy (or ``_codecs``) object for one of the few allowed globals.

        Raises:
            DataError: any other global, naming the file and the global.
        """
        try:
            return _NUMPY_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(
                f"{self.where}: refusing to unpickle {module}.{name}; a CIFAR batch holds only numpy "
                "arrays and lists, so this file is not a genuine release (or was tampered with)"
            ) from None


def load_numpy_pickle(data: bytes, where: str) -> Any:
    """Unpickle ``data`` (the contents of ``where``) allowing only numpy arrays besides builtins.

    Args:
        data: the pickled bytes.
        where: the file they came from, for errors.

    Returns:
        The unpickled object (for a CIFAR batch, a dict of numpy arrays and lists).

    Raises:
        DataError: a global other than numpy's array machinery, or a truncated or garbled pickle.
    """
    try:
        return NumpyOnlyUnpickler(io.BytesIO(data), where).load()
    except DataError:
        raise
    except Exception as e:  # a truncated or garbled pickle raises any of a dozen types
        raise DataError(f"{where}: not a readable CIFAR pickle ({type(e).__name__}: {e})") from None


def _text(value: Any) -> str:
    return value.decode("latin1") if isinstance(value, bytes) else str(value)


def _str_keys(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a pickled dict, found {type(obj).__name__}")
    return {_text(k): v for k, v in obj.items()}


def _field(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise DataError(f"{where}: no {key!r} entry (has {', '.join(sorted(d))})")
    return d[key]


# -- finding the files ---------------------------------------------------------------------------

FileReader = Callable[[str], bytes]


def _folder_reader(folder: Path) -> FileReader:
    def read(fname: str) -> bytes:
        path = folder / fname
        try:
            return path.read_bytes()
        except OSError as e:
            raise DataError(f"{path}: cannot be read ({e})") from None

    return read


def _archive_reader(archive: Path, folder: str, wanted: list[str]) -> FileReader:
    """Read the ``wanted`` members of ``folder/`` in one pass over the (gzipped) tar."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r|*") as tar:
            for member in tar:
                parent, _, fname = member.name.rpartition("/")
                if member.isreg() and fname in wanted and parent.rstrip("/").endswith(folder):
                    found[fname] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"{archive}: cannot be read as a tar archive ({e}); delete it and download again") from None

    def read(fname: str) -> bytes:
        if fname not in found:
            raise DataError(f"{archive}: has no member {folder}/{fname}")
        return found[fname]

    return read


def _bin_meta(release: Release, label_kind: str) -> str:
    return "coarse_label_names.txt" if release.label_bytes == 2 and label_kind == "coarse" else release.bin_meta


def _locate(release: Release, base: Path, split: str, label_kind: str) -> tuple[str, FileReader, str] | None:
    """Find a release under ``base``: (format "py"|"bin", reader, description) or None."""
    py_needed = [*release.py_files[split], release.py_meta]
    bin_needed = [*release.bin_files[split], _bin_meta(release, label_kind)]
    for folder in (base / release.py_folder, base):
        if all((folder / f).is_file() for f in py_needed):
            return "py", _folder_reader(folder), str(folder)
    for folder in (base / release.bin_folder, base):
        if all((folder / f).is_file() for f in bin_needed):
            return "bin", _folder_reader(folder), str(folder)
    if (base / release.archive).is_file():
        path = base / release.archive
        return "py", _archive_reader(path, release.py_folder, py_needed), str(path)
    if (base / release.bin_archive).is_file():
        path = base / release.bin_archive
        return "bin", _archive_reader(path, release.bin_folder, bin_needed), str(path)
    return None


def download_cifar(name: str, dest: str | Path | None = None) -> Path:
    """Download the python release of ``name`` ("cifar10" or "cifar100") into ``dest``.

    The archive is written atomically and only kept when its md5 matches the published one.

    Args:
        name: "cifar10" or "cifar100".
        dest: the folder to write the archive to (created if need be); None:
            ``$VITKIT_DATA/<name>`` (``VITKIT_DATA`` defaults to ``~/.cache/vitkit/data``).

    Returns:
        The archive, ``cifar-10-python.tar.gz`` or ``cifar-100-python.tar.gz`` in ``dest``,
        downloaded again even when it is already there.

    Raises:
        KeyError: ``name`` is not a CIFAR variant.
        DataError: the md5 of what was downloaded does not match (nothing is kept).
        OSError: the download or the write failed (``urllib.error.URLError`` and timeouts
            included); ``http.client.HTTPException`` for a broken answer.
    """
    release = RELEASES[name]
    dest = Path(dest) if dest is not None else data_home() / name
    target = dest / release.archive

    def fetch(f: io.BufferedIOBase) -> None:
        digest = hashlib.md5()
        with urllib.request.urlopen(release.url, timeout=60) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != release.md5:
            raise DataError(
                f"{release.url}: md5 {digest.hexdigest()} does not match the published {release.md5}; not kept"
            )

    atomic_write(target, fetch)
    return target


# -- parsing -------------------------------------------------------------------------------------


def _parse_pickled(
    release: Release, read: FileReader, split: str, where: str, label_kind: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    label_key = "labels" if release.label_bytes == 1 else f"{label_kind}_labels"
    images, labels = [], []
    for fname in release.py_files[split]:
        at = f"{where}/{fname}"
        batch = _str_keys(load_numpy_pickle(read(fname), at), at)
        data = _field(batch, "data", at)
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != IMAGE_BYTES:
            shape = getattr(data, "shape", None)
            raise DataError(f"{at}: 'data' must be uint8 (N, {IMAGE_BYTES}), got {type(data).__name__} {shape}")
        lab = np.asarray(_field(batch, label_key, at), dtype=np.int64)
        if lab.shape != (data.shape[0],):
            raise DataError(f"{at}: {lab.shape[0]} labels for {data.shape[0]} images")
        images.append(data)
        labels.append(lab)
    meta_at = f"{where}/{release.py_meta}"
    meta = _str_keys(load_numpy_pickle(read(release.py_meta), meta_at), meta_at)
    names_key = "label_names" if release.label_bytes == 1 else f"{label_kind}_label_names"
    classes = [_text(c) for c in _field(meta, names_key, meta_at)]
    return np.concatenate(images), np.concatenate(labels), classes


def _parse_binary(
    release: Release, read: FileReader, split: str, where: str, label_kind: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    record = release.label_bytes + IMAGE_BYTES
    label_col = 0 if release.label_bytes == 1 or label_kind == "coarse" else 1
    images, labels = [], []
    for fname in release.bin_files[split]:
        blob = read(fname)
        if len(blob) == 0 or len(blob) % record:
            raise DataError(f"{where}/{fname}: {len(blob)} bytes is not a whole number of {record}-byte records")
        rows = np.frombuffer(blob, dtype=np.uint8).reshape(-1, record)
        labels.append(rows[:, label_col].astype(np.int64))
        images.append(rows[:, release.label_bytes :])
    lines = read(_bin_meta(release, label_kind)).decode("utf-8", errors="replace").splitlines()
    classes = [line.strip() for line in lines if line.strip()]
    return np.concatenate(images), np.concatenate(labels), classes


def load_cifar(
    name: str,
    split: str = "train",
    *,
    root: str | Path | None = None,
    allow_download: bool = True,
    label_kind: str = "fine",
) -> ArrayDataset:
    """CIFAR-10 or CIFAR-100 ``split`` ("train", "test"; "val" means test) in memory.

    Looks in ``root`` (default ``$VITKIT_DATA/<name>``) for the extracted python or binary
    release, or either ``.tar.gz``; downloads the python release there when none is found and
    ``allow_download``. ``label_kind`` picks CIFAR-100's "fine" (100) or "coarse" (20) labels.

    Args:
        name: "cifar10" or "cifar100".
        split: "train", "test" or "val" (the test split).
        root: the folder to look in and download to; None: ``$VITKIT_DATA/<name>``
            (``VITKIT_DATA`` defaults to ``~/.cache/vitkit/data``).
        allow_download: download the python release when nothing is found.
        label_kind: "fine" or, for CIFAR-100 only, "coarse".

    Returns:
        The split in memory: uint8 images (N, 3, 32, 32), int64 labels (N,), the class names of
        the release, named ``NAME/SPLIT`` (``cifar10/test`` for "val").

    Raises:
        DataError: an unknown variant, split or ``label_kind``; no files and no download allowed,
            or a download that failed; a file that cannot be read, a pickle that holds anything
            but numpy arrays and lists, malformed batches, the wrong number of class names or
            labels out of range.
    """
    if name not in RELEASES:
        raise DataError(f"unknown CIFAR variant {name!r}: expected one of {', '.join(RELEASES)}")
    if split not in SPLITS:
        raise DataError(f"{name}: unknown split {split!r} (train, test or val)")
    kinds = ("fine", "coarse") if name == "cifar100" else ("fine",)
    if label_kind not in kinds:
        raise DataError(f"{name}: label_kind must be one of {', '.join(kinds)}, got {label_kind!r}")
    release = RELEASES[name]
    part = SPLITS[split]
    base = Path(root) if root is not None else data_home() / name
    found = _locate(release, base, part, label_kind)
    if found is None:
        how = (
            f"put {release.archive} (or the extracted {release.py_folder}/, or the binary release) in {base}, "
            "or set VITKIT_DATA"
        )
        if not allow_download:
            raise DataError(f"{name}: no {part} files in {base}; {how} (get it from {release.url})")
        try:
            download_cifar(name, base)
        except (OSError, http.client.HTTPException) as e:
            raise DataError(
                f"{name}: not found in {base} and the download from {release.url} failed ({e}); {how}"
            ) from None
        found = _locate(release, base, part, label_kind)
        if found is None:  # the archive arrived but lacks the files
            raise DataError(f"{base / release.archive}: downloaded, but it has no {release.py_folder}/ {part} files")
    fmt, read, where = found
    parse = _parse_pickled if fmt == "py" else _parse_binary
    images, labels, classes = parse(release, read, part, where, label_kind)
    want = release.num_classes if label_kind == "fine" else 20
    if len(classes) != want:
        raise DataError(f"{where}: {len(classes)} class names, expected {want}")
    if labels.size and (labels.min() < 0 or labels.max() >= want):
        raise DataError(f"{where}: labels outside 0..{want - 1} (found {labels.min()}..{labels.max()})")
    imgs = torch.from_numpy(np.ascontiguousarray(images).reshape(-1, *IMAGE_SHAPE))  # (N, 3, 32, 32)
    return ArrayDataset(imgs, torch.from_numpy(labels), classes, name=f"{name}/{part}")


__all__ = ["RELEASES", "NumpyOnlyUnpickler", "download_cifar", "load_cifar", "load_numpy_pickle"]
