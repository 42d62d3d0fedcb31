"""Fashion-MNIST and MNIST in their IDX files (``train-images-idx3-ubyte.gz``...).

Looked for under ``$VITKIT_DATA/<name>/``, then where Debian's ``dataset-fashion-mnist`` package
puts it (``/usr/share/datasets/fashion-mnist/``), then downloaded from the dataset's own address
into ``$VITKIT_DATA/<name>/`` (default ``~/.cache/vitkit/data``) with its checksum verified.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import urllib.request
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..files import atomic_write
from .base import ArrayDataset

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# sha256 of the *decompressed* IDX files (independent of how the .gz was compressed), and the md5
# of the upstream .gz where that is what the dataset publishes.
CHECKSUMS = {
    "fashion-mnist": {
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
    "mnist": {
        "train-images-idx3-ubyte": "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte": "md5:d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte": "md5:9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte": "md5:ec29112dd5afa0611ce80d1b7f02629c",
    },
}

URLS = {
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
}

CLASSES = {
    "fashion-mnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
    "mnist": [str(i) for i in range(10)],
}

SYSTEM_DIRS = {
    "fashion-mnist": [Path("/usr/share/datasets/fashion-mnist")],
    "mnist": [Path("/usr/share/datasets/mnist")],
}


def data_home() -> Path:
    """Where data sets are kept and downloaded to.

    Returns:
        ``VITKIT_DATA``, else ``~/.cache/vitkit/data``; read on every call.
    """
    return Path(os.environ.get("VITKIT_DATA", Path.home() / ".cache" / "vitkit" / "data"))


def candidate_dirs(name: str) -> list[Path]:
    """The folders searched for a data set's files, in order.

    Args:
        name: "fashion-mnist" or "mnist".

    Returns:
        ``data_home() / name``, then the folder a Debian package installs it in, if any.
    """
    return [data_home() / name, *SYSTEM_DIRS.get(name, [])]


def _find(name: str, stem: str) -> Path | None:
    for d in candidate_dirs(name):
        for fname in (f"{stem}.gz", stem):
            if (d / fname).is_file():
                return d / fname
    return None


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot be read ({e})") from None


def parse_idx(data: bytes, path: Path | str = "<idx>") -> np.ndarray:
    """Decode an IDX file (big-endian header: magic with dtype code and rank, then the sizes).

    Args:
        data: the file's bytes, decompressed.
        path: the file, for errors.

    Returns:
        The uint8 array of the shape the header gives, a read-only view of ``data``.

    Raises:
        DataError: a file too short, not of unsigned bytes, or whose size does not match its
            header.
    """
    if len(data) < 4:
        raise DataError(f"{path}: too short to be an IDX file")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DataError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes), file has {body.size}")
    return body.reshape(dims)


def _verify(name: str, stem: str, path: Path) -> None:
    want = CHECKSUMS.get(name, {}).get(stem)
    if want is None:
        return
    if want.startswith("md5:"):
        got = hashlib.md5(path.read_bytes()).hexdigest()
        ok = got == want[4:]
    else:
        got = hashlib.sha256(_read_bytes(path)).hexdigest()
        ok = got == want
    if not ok:
        raise DataError(f"{path}: checksum mismatch (expected {want}, got {got}); delete it and download again")


def download(name: str, dest: Path | None = None) -> Path:
    """Fetch the four IDX files of ``name`` from the dataset's own address, checksums verified.

    Files already in ``dest`` (as ``.gz``) are kept as they are.

    Args:
        name: "fashion-mnist" or "mnist".
        dest: the folder to write to (created if need be); None: ``data_home() / name``.

    Returns:
        ``dest``.

    Raises:
        DataError: a download that failed, or a file whose checksum does not match (it stays
            in ``dest``: the message says to delete it).
    """
    dest = dest or data_home() / name
    dest.mkdir(parents=True, exist_ok=True)
    for stems in FILES.values():
        for stem in stems:
            target = dest / f"{stem}.gz"
            if target.is_file():
                continue
            url = URLS[name] + f"{stem}.gz"
            try:
                with urllib.request.urlopen(url, timeout=60) as r:
                    blob = r.read()
            except OSError as e:
                raise DataError(
                    f"{name}: not found in {', '.join(map(str, candidate_dirs(name)))} and the download from "
                    f"{url} failed ({e}). Install it (Debian: apt-get install dataset-fashion-mnist) or put the "
                    f"four IDX files in {dest}"
                ) from None
            atomic_write(target, lambda f, b=blob: f.write(b))
            _verify(name, stem, target)
    return dest


def load_idx_dataset(name: str, split: str, allow_download: bool = True) -> ArrayDataset:
    """Fashion-MNIST or MNIST ``split`` ("train" or "test") as an in-memory uint8 dataset.

    Args:
        name: "fashion-mnist" or "mnist".
        split: "train" or "test".
        allow_download: download the files into ``$VITKIT_DATA/<name>`` when they are not
            found (:func:`candidate_dirs`).

    Returns:
        uint8 images (N, 1, 28, 28) and int64 labels (N,), with the data set's class names,
        named ``NAME/SPLIT``.

    Raises:
        DataError: an unknown split, files not found (and no download allowed, or a download
            that failed), or files that cannot be read, are not IDX files or do not match.
    """
    if split not in FILES:
        raise DataError(f"{name}: unknown split {split!r} (train or test)")
    stems = FILES[split]
    paths = [_find(name, s) for s in stems]
    if any(p is None for p in paths):
        if not allow_download:
            raise DataError(
                f"{name}: {split} files not found in {', '.join(map(str, candidate_dirs(name)))}; "
                "Debian: apt-get install dataset-fashion-mnist, or set VITKIT_DATA"
            )
        download(name)
        paths = [_find(name, s) for s in stems]
    images = parse_idx(_read_bytes(paths[0]), paths[0])
    labels = parse_idx(_read_bytes(paths[1]), paths[1])
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise DataError(f"{paths[0]}: {images.shape} images do not match {labels.shape} labels in {paths[1]}")
    imgs = torch.from_numpy(images.copy())[:, None]  # (N, 1, 28, 28)
    return ArrayDataset(imgs, torch.from_numpy(labels.astype(np.int64)), CLASSES[name], name=f"{name}/{split}")
