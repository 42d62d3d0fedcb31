"""CIFAR (pickle and binary releases), image folders and WebDataset shards, on files made here."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import io
import os
import pickle
import struct
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import free_port
from vitkit.data import DataError, ImageFolder, ShardDataset, build_dataset, expand_braces, shard_paths
from vitkit.data import cifar as cifar_module
from vitkit.data.cifar import load_cifar, load_numpy_pickle

# -- CIFAR ---------------------------------------------------------------------------------------

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _cifar_arrays(n: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, num_classes, n).astype(np.int64)


def _write_cifar10_pickles(folder: Path, per_batch: int = 4) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The python release's layout; keys as bytes, the way the real files come back in Python 3."""
    folder.mkdir(parents=True)
    written = {}
    for i, fname in enumerate([*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]):
        data, labels = _cifar_arrays(per_batch, 10, seed=i)
        with open(folder / fname, "wb") as f:
            pickle.dump({b"batch_label": fname.encode(), b"labels": labels.tolist(), b"data": data}, f)
        written[fname] = (data, labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in CIFAR10_NAMES], b"num_vis": 3072}, f)
    return written


def _py2_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """A dict pickled the way Python 2's cPickle wrote the CIFAR release (protocol 2, str=bytes)."""

    def s(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<I", len(b)) + b

    def i(n: int) -> bytes:
        return b"K" + bytes([n]) if n < 256 else b"M" + struct.pack("<H", n)

    arr = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85" + s(b"b") + b"\x87R"
    arr += b"(" + i(1) + b"(" + b"".join(i(d) for d in data.shape) + b"t"
    arr += b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R(" + i(3) + s(b"|")
    arr += b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xff" + i(0) + b"tb"
    arr += b"\x89" + s(data.tobytes()) + b"tb"
    labels_op = b"](" + b"".join(i(n) for n in labels) + b"e"
    return b"\x80\x02}(" + s(b"data") + arr + s(b"labels") + labels_op + b"u."


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "data"
    monkeypatch.setenv("VITKIT_DATA", str(home))
    return home


def test_cifar10_pickled_release(data_home: Path) -> None:
    written = _write_cifar10_pickles(data_home / "cifar10" / "cifar-10-batches-py")
    train = build_dataset("cifar10", "train", allow_download=False, img_size=224)
    assert len(train) == 20 and train.image_size == (32, 32) and train.in_chans == 3
    assert train.classes == CIFAR10_NAMES
    first = written["data_batch_1"][0]
    assert torch.equal(train.images[:4], torch.from_numpy(first).view(4, 3, 32, 32))
    assert train.labels.tolist()[:4] == written["data_batch_1"][1].tolist()
    val = build_dataset("cifar-10", "val", allow_download=False)
    assert torch.equal(val.images, torch.from_numpy(written["test_batch"][0]).view(-1, 3, 32, 32))


def test_cifar10_python2_pickles_and_tar_gz(data_home: Path) -> None:
    folder = data_home / "staging" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    data, labels = _cifar_arrays(3, 10, seed=7)
    for fname in [*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]:
        (folder / fname).write_bytes(_py2_pickle(data, labels.tolist()))
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": CIFAR10_NAMES}, f, protocol=2)
    archive = data_home / "cifar10" / "cifar-10-python.tar.gz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    test = load_cifar("cifar10", "test", allow_download=False)
    assert torch.equal(test.images, torch.from_numpy(data).view(3, 3, 32, 32))
    assert test.labels.tolist() == labels.tolist()


def test_cifar_binary_releases(data_home: Path) -> None:
    folder = data_home / "cifar10" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    data, labels = _cifar_arrays(5, 10, seed=1)
    records = np.concatenate([labels.astype(np.uint8)[:, None], data], axis=1)
    for fname in [*(f"data_batch_{k}.bin" for k in range(1, 6)), "test_batch.bin"]:
        (folder / fname).write_bytes(records.tobytes())
    (folder / "batches.meta.txt").write_text("\n".join(CIFAR10_NAMES) + "\n\n")
    train = load_cifar("cifar10", "train", allow_download=False)
    assert len(train) == 25 and train.classes == CIFAR10_NAMES
    assert torch.equal(train.images[:5], torch.from_numpy(data).view(5, 3, 32, 32))

    folder100 = data_home / "cifar100" / "cifar-100-binary"
    folder100.mkdir(parents=True)
    data, fine = _cifar_arrays(6, 100, seed=2)
    coarse = fine // 5
    records = np.concatenate([coarse.astype(np.uint8)[:, None], fine.astype(np.uint8)[:, None], data], axis=1)
    (folder100 / "train.bin").write_bytes(records.tobytes())
    (folder100 / "fine_label_names.txt").write_text("\n".join(f"fine{i}" for i in range(100)))
    (folder100 / "coarse_label_names.txt").write_text("\n".join(f"coarse{i}" for i in range(20)))
    assert load_cifar("cifar100", "train", allow_download=False).labels.tolist() == fine.tolist()
    coarse_set = load_cifar("cifar100", "train", allow_download=False, label_kind="coarse")
    assert coarse_set.labels.tolist() == coarse.tolist() and coarse_set.num_classes == 20

    (folder / "test_batch.bin").write_bytes(b"\0" * 3072)
    with pytest.raises(DataError, match=r"test_batch\.bin: .* not a whole number of 3073-byte records"):
        load_cifar("cifar10", "test", allow_download=False)


def test_cifar100_pickled_release(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    data, fine = _cifar_arrays(6, 100, seed=3)
    for fname in ("train", "test"):
        with open(folder / fname, "wb") as f:
            pickle.dump({"data": data, "fine_labels": fine.tolist(), "coarse_labels": (fine // 5).tolist()}, f)
    with open(folder / "meta", "wb") as f:
        names = {"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": [f"c{i}" for i in range(20)]}
        pickle.dump(names, f)
    ds = build_dataset("cifar100", "test", root=str(tmp_path), allow_download=False)
    assert ds.name == "cifar100/test" and ds.classes[:2] == ["f0", "f1"] and ds.labels.tolist() == fine.tolist()


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_malicious_pickle_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    _write_cifar10_pickles(folder)
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({"data": _Exploit(), "labels": [0]}, f)
    with pytest.raises(DataError, match=r"data_batch_3: refusing to unpickle (posix|os)\.system"):
        load_cifar("cifar10", "train", root=tmp_path, allow_download=False)
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(DataError, match="refusing to unpickle builtins.eval"):
        load_numpy_pickle(b"cbuiltins\neval\n(S'1'\ntR.", "evil.pkl")


def test_cifar_missing_data_says_where_and_how(data_home: Path) -> None:
    with pytest.raises(DataError) as info:
        build_dataset("cifar10", "train", allow_download=False)
    message = str(info.value)
    assert str(data_home / "cifar10") in message and "cifar-10-python.tar.gz" in message
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in message


def test_cifar_download_verifies_md5(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staging = data_home.parent / "staging"
    _write_cifar10_pickles(staging / "cifar-10-batches-py")
    blob = io.BytesIO()
    with tarfile.open(fileobj=blob, mode="w:gz") as tar:
        tar.add(staging / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    payload = blob.getvalue()

    def fake_urlopen(url: str, timeout: float = 0):
        assert url == cifar_module.RELEASES["cifar10"].url
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    archive = data_home / "cifar10" / "cifar-10-python.tar.gz"
    with pytest.raises(DataError, match="does not match the published c58f30108f718f92721af3b95e74349a"):
        load_cifar("cifar10", "train")
    assert not archive.exists() and not list(archive.parent.glob("*.tmp"))

    release = dataclasses.replace(cifar_module.RELEASES["cifar10"], md5=hashlib.md5(payload).hexdigest())
    monkeypatch.setitem(cifar_module.RELEASES, "cifar10", release)
    assert len(load_cifar("cifar10", "train")) == 20 and archive.is_file()

    def offline(url: str, timeout: float = 0):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(DataError, match=r"cifar100: not found in .* download from https://.*failed.*no network"):
        load_cifar("cifar100", "train")


# -- image folders -------------------------------------------------------------------------------


def _save(path: Path, color: tuple[int, int, int], size=(20, 12), mode: str = "RGB", fmt: str = "PNG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, color)
    if mode == "L":
        img = img.convert("L")
    elif mode == "P":
        img = img.convert("P", palette=Image.Palette.ADAPTIVE)
    img.save(path, fmt)


def _make_tree(root: Path, per_class: int = 5, corrupt: bool = True) -> None:
    """Three classes of small images in several formats and modes, plus one broken JPEG."""
    kinds = [
        ("png", "RGB", "PNG"),
        ("jpg", "RGB", "JPEG"),
        ("png", "L", "PNG"),
        ("png", "P", "PNG"),
        ("JPEG", "L", "JPEG"),
    ]
    for c, cls in enumerate(["cat", "dog", "eel"]):
        for i in range(per_class):
            ext, mode, fmt = kinds[i % len(kinds)]
            _save(root / cls / f"img{i}.{ext}", (40 * c + i, 100 + i, 200 - c), mode=mode, fmt=fmt)
    (root / "eel" / "notes.txt").write_text("not an image")
    if corrupt:
        (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")


def _all(ds, batch_size: int, **kw) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    images, labels = [], []
    for x, y in ds.batches(batch_size, **kw):
        images.append(x)
        labels.append(y)
    return images, labels


def test_folder_split_is_deterministic_and_disjoint(tmp_path: Path) -> None:
    _make_tree(tmp_path, per_class=10, corrupt=False)
    train = ImageFolder(tmp_path, "train", val_fraction=0.2)
    val = ImageFolder(tmp_path, "val", val_fraction=0.2)
    assert train.classes == val.classes == ["cat", "dog", "eel"]
    assert len(val) == 6 and len(train) == 24
    assert not {p for p, _ in train.samples} & {p for p, _ in val.samples}
    assert ImageFolder(tmp_path, "test", val_fraction=0.2).samples == val.samples
    assert ImageFolder(tmp_path, "val", val_fraction=0.2, split_seed=1).samples != val.samples


def test_folder_batches_decode_and_skip_corrupt(tmp_path: Path) -> None:
    _make_tree(tmp_path)
    ds = ImageFolder(tmp_path, "train", val_fraction=0.0, load_size=(16, 8))
    assert len(ds) == 16 and ds.image_size == (16, 8) and ds.in_chans == 3
    images, labels = _all(ds, 4)
    assert all(x.dtype == torch.uint8 and x.shape[1:] == (3, 16, 8) for x in images)
    assert sum(len(y) for y in labels) == 15
    assert ds.skips.skipped == 1 and "broken.jpg" in ds.skips.examples[0]
    # a solid-colour image stays that colour (shorter-side resize and centre crop)
    first = ImageFolder(tmp_path, "train", val_fraction=0.0, load_size=6)
    x, y = next(first.batches(1))
    assert x.shape == (1, 3, 6, 6) and y.item() == 0
    assert x[0, :, 0, 0].tolist() == [0, 100, 200] and (x == x[:, :, :1, :1]).all()
    gray = ImageFolder(tmp_path, "train", val_fraction=0.0, load_size=6, mode="L", resize="plain")
    assert next(gray.batches(2))[0].shape == (2, 1, 6, 6)


def test_folder_with_train_and_val_trees(tmp_path: Path) -> None:
    for split, n in (("train", 3), ("val", 2)):
        for cls in ("ant", "bee"):
            for i in range(n):
                _save(tmp_path / split / cls / f"{i}.png", (i, 0, 0))
    train, val = ImageFolder(tmp_path, "train", load_size=8), build_dataset(str(tmp_path), "val", img_size=8)
    assert isinstance(val, ImageFolder) and val.image_size == (8, 8)
    assert (len(train), len(val), val.classes) == (6, 4, ["ant", "bee"])
    assert len(ImageFolder(tmp_path, "test", load_size=8)) == 4  # test falls back to val/
    _save(tmp_path / "val" / "wasp" / "0.png", (0, 0, 0))
    with pytest.raises(DataError, match="class folders not in .*train: wasp"):
        ImageFolder(tmp_path, "val")
    with pytest.raises(DataError, match="not a folder"):
        ImageFolder(tmp_path / "nowhere")


def test_folder_order_ranks_resume_and_workers(tmp_path: Path) -> None:
    _make_tree(tmp_path, per_class=6)
    ds = ImageFolder(tmp_path, "train", val_fraction=0.0, load_size=8)
    full = _all(ds, 5, shuffle=True, seed=3, epoch=1)
    again = _all(ds, 5, shuffle=True, seed=3, epoch=1)
    other = _all(ds, 5, shuffle=True, seed=3, epoch=2)
    assert all(torch.equal(a, b) for a, b in zip(full[0], again[0], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(full[1], other[1]))
    # the global batch is split among ranks; interleaving the ranks gives it back
    r0 = _all(ds, 5, shuffle=True, seed=3, epoch=1, rank=0, world_size=2)
    r1 = _all(ds, 5, shuffle=True, seed=3, epoch=1, rank=1, world_size=2)
    order = [int(i) for i in torch.randperm(len(ds), generator=torch.Generator().manual_seed(3 * 1_000_003 + 1))]
    for b, (y0, y1) in enumerate(zip(r0[1], r1[1], strict=True)):
        chunk = [ds.samples[i][1] for i in order[5 * b : 5 * b + 5] if "broken" not in ds.samples[i][0]]
        assert sorted(y0.tolist() + y1.tolist()) == sorted(chunk)
    # resuming at batch 2 gives the rest of the epoch
    tail = _all(ds, 5, shuffle=True, seed=3, epoch=1, start_batch=2)
    assert all(torch.equal(a, b) for a, b in zip(tail[0], full[0][2:], strict=True))
    assert len(_all(ds, 5, drop_last=True)[0]) == 3
    # decoding in worker processes changes nothing, and skips are still counted here
    ds.skips.reset()
    workers = _all(ds, 5, shuffle=True, seed=3, epoch=1, num_workers=2)
    assert all(torch.equal(a, b) for a, b in zip(workers[0], full[0], strict=True))
    assert ds.skips.skipped == 1


# -- WebDataset shards ---------------------------------------------------------------------------


def _sample_image(sample_id: int, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    digits = (sample_id % 16, sample_id // 16 % 16, sample_id // 256)  # base 16, one digit a channel
    Image.new("RGB", (6, 4), tuple(16 * d + 8 for d in digits)).save(out, fmt)
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _write_shards(folder: Path, n_shards: int = 4, per_shard: int = 6, prefix: str = "train") -> list[int]:
    """Shards of samples whose image colour encodes their id; returns the ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = []
    for s in range(n_shards):
        with tarfile.open(folder / f"{prefix}-{s:03d}.tar", "w") as tar:
            for i in range(per_shard):
                sid = s * 100 + i
                ext = "jpg" if i % 3 == 2 else "png"
                _add(tar, f"{sid:05d}.{ext}", _sample_image(sid, "JPEG" if ext == "jpg" else "PNG"))
                _add(tar, f"{sid:05d}.cls", f"{sid % 3}\n".encode())
                ids.append(sid)
    return ids


def _ids(x: torch.Tensor) -> list[int]:
    """Sample ids back from decoded solid-colour images (JPEG is off by a little)."""
    return [sum(int(img[c, 0, 0]) // 16 * 16**c for c in range(3)) for img in x]


def _shard_ids(ds: ShardDataset, batch_size: int, **kw) -> list[list[int]]:
    return [_ids(x) for x, _ in ds.batches(batch_size, **kw)]


HAVE_WEBDATASET = importlib.util.find_spec("webdataset") is not None
needs_webdataset = pytest.mark.skipif(not HAVE_WEBDATASET, reason="webdataset not installed")
READERS = ["tarfile", pytest.param("webdataset", marks=needs_webdataset)]


def test_expand_braces_and_shard_paths(tmp_path: Path) -> None:
    assert expand_braces("a-{000..002}.tar") == ["a-000.tar", "a-001.tar", "a-002.tar"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("{a,b{1..2}}-{x,y}") == ["a-x", "a-y", "b1-x", "b1-y", "b2-x", "b2-y"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(DataError, match="unbalanced"):
        expand_braces("a-{1..2.tar")
    _write_shards(tmp_path, n_shards=3)
    _write_shards(tmp_path, n_shards=1, prefix="val")
    pattern = str(tmp_path / "train-{000..002}.tar")
    assert [p.name for p in shard_paths(pattern)] == ["train-000.tar", "train-001.tar", "train-002.tar"]
    assert [p.name for p in shard_paths(pattern, "val")] == ["val-000.tar"]
    assert [p.name for p in shard_paths(str(tmp_path / "{split}-{000..000}.tar"), "test")] == ["val-000.tar"]
    assert len(shard_paths(str(tmp_path / "train-*.tar"))) == 3
    with pytest.raises(DataError, match=r"1 of 4 shards not found \(first: .*train-003.tar\)"):
        shard_paths(str(tmp_path / "train-{000..003}.tar"))


@pytest.mark.parametrize("reader", READERS)
def test_shards_read_every_sample_once(tmp_path: Path, reader: str) -> None:
    ids = _write_shards(tmp_path)
    (tmp_path / "classes.txt").write_text("red\ngreen\nblue\n")
    ds = ShardDataset(str(tmp_path / "train-{000..003}.tar"), load_size=(4, 6), reader=reader, shuffle_buffer=5)
    assert (len(ds), ds.classes, ds.image_size, ds.in_chans) == (24, ["red", "green", "blue"], (4, 6), 3)
    for shuffle in (False, True):
        batches = list(ds.batches(5, shuffle=shuffle, seed=1))
        assert [len(y) for _, y in batches] == [5, 5, 5, 5, 4]
        got = [i for x, _ in batches for i in _ids(x)]
        assert sorted(got) == ids
        assert [y for _, ys in batches for y in ys.tolist()] == [i % 3 for i in got]
    assert ds.skips.skipped == 0


def test_shards_order_resume_and_ranks(tmp_path: Path) -> None:
    _write_shards(tmp_path)
    ds = ShardDataset(str(tmp_path / "train-{000..003}.tar"), load_size=4, reader="tarfile", shuffle_buffer=4)
    full = _shard_ids(ds, 4, shuffle=True, seed=5, epoch=2)
    assert full == _shard_ids(ds, 4, shuffle=True, seed=5, epoch=2)
    assert full != _shard_ids(ds, 4, shuffle=True, seed=5, epoch=3)
    assert _shard_ids(ds, 4, shuffle=True, seed=5, epoch=2, start_batch=3) == full[3:]
    assert _shard_ids(ds, 4, shuffle=True, seed=5, epoch=2, num_workers=2) == full
    # two ranks: same number of batches, each half of the global batch, disjoint shards
    r0 = _shard_ids(ds, 4, shuffle=True, seed=5, epoch=2, rank=0, world_size=2)
    r1 = _shard_ids(ds, 4, shuffle=True, seed=5, epoch=2, rank=1, world_size=2)
    assert len(r0) == len(r1) == 6 and all(len(b) == 2 for b in r0 + r1)
    seen0, seen1 = {i for b in r0 for i in b}, {i for b in r1 for i in b}
    assert not seen0 & seen1 and len(seen0 | seen1) == 24
    assert {i // 100 for i in seen0}.isdisjoint({i // 100 for i in seen1})
    # a fixed epoch length: a rank that runs short starts over its shards
    longer = ShardDataset(str(tmp_path / "train-{000..003}.tar"), load_size=4, num_samples=40, reader="tarfile")
    r0 = _shard_ids(longer, 4, rank=0, world_size=2)
    assert len(r0) == 10 and len({i for b in r0 for i in b}) == 12
    with pytest.raises(DataError, match="4 shards cannot be split among 5 ranks"):
        next(ds.batches(5, rank=0, world_size=5))


@pytest.mark.parametrize("reader", READERS)
def test_shards_skip_bad_samples(tmp_path: Path, reader: str) -> None:
    _write_shards(tmp_path, n_shards=2, per_shard=3)
    with tarfile.open(tmp_path / "train-002.tar", "w") as tar:
        _add(tar, "00900.png", _sample_image(900))
        _add(tar, "00900.cls", b"1")
        _add(tar, "00901.jpg", b"\xff\xd8\xff garbage")  # undecodable
        _add(tar, "00901.cls", b"2")
        _add(tar, "00902.png", _sample_image(902))  # no label
        _add(tar, "00903.png", _sample_image(903))
        _add(tar, "00903.cls", b"two")  # label is not a number
    first = (tmp_path / "train-000.tar").read_bytes()
    (tmp_path / "train-003.tar").write_bytes(first[:700])  # cut inside its first member
    ds = ShardDataset(str(tmp_path / "train-{000..003}.tar"), load_size=4, reader=reader, num_classes=3)
    assert len(ds) == 9  # counted from the headers: 00902 has no label, the cut shard no whole sample
    seen = [i for b in _shard_ids(ds, 4) for i in b]
    assert seen == [0, 1, 2, 100, 101, 102, 900, 0]  # the epoch is filled up from the start again
    reasons = "\n".join(ds.skips.examples)
    assert ds.skips.skipped == 5, reasons
    for why in ("00901 (not an image", "00902 (no .cls)", "00903 (.cls is not an integer"):
        assert why in reasons
    # the cut shard is named, with where it ends: in the padding after its first member
    assert "train-003.tar (cut short after member 00000.png: ReadError: unexpected end of data)" in reasons


def _write_shards_with_an_unreadable_run(folder: Path) -> str:
    """Two shards of 8 samples, of which shard 001's last 4 do not decode: split between two
    ranks at 4 images a rank, rank 1's second share of the epoch is unreadable whole."""
    _write_shards(folder, n_shards=1, per_shard=8)
    with tarfile.open(folder / "train-001.tar", "w") as tar:
        for i in range(8):
            _add(tar, f"{100 + i:05d}.png", _sample_image(100 + i) if i < 4 else b"not an image")
            _add(tar, f"{100 + i:05d}.cls", b"1\n")
    return str(folder / "train-{000..001}.tar")


def test_a_ranks_unreadable_share_of_a_batch_comes_out_empty_in_its_place(tmp_path: Path) -> None:
    """Alone, a batch left with no readable image is not yielded; one of several ranks yields it
    empty, so that its batches stay paired with the other ranks' (the trainer drops it on all)."""
    ds = ShardDataset(_write_shards_with_an_unreadable_run(tmp_path), load_size=4, reader="tarfile", num_classes=3)
    r0 = [len(y) for _, y in ds.batches(8, rank=0, world_size=2)]
    r1 = [len(y) for _, y in ds.batches(8, rank=1, world_size=2)]
    assert r0 == [4, 4] and r1 == [4, 0]
    x, _ = list(ds.batches(8, rank=1, world_size=2))[1]
    assert x.shape == (0, 3, 4, 4) and x.dtype == torch.uint8
    assert [_ids(x) for x, _ in ds.batches(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [100, 101, 102, 103]]


def test_two_processes_train_on_through_a_batch_one_of_them_cannot_read(tmp_path: Path) -> None:
    """Each epoch rank 1's second share is unreadable: both processes drop that batch, so they
    stay in the same epoch at the same batch. Before, rank 1 went on to its next epoch's first
    batch, paired with rank 0's second: the ranks trained on batches the plan never put together,
    and the checkpoint (rank 0's place in the data) was not where rank 1 stood."""
    import subprocess

    import yaml

    from vitkit.train.state import list_checkpoints, load_train_state

    recipe = {
        "seed": 1,
        "model": {
            "name": "vit_ti16",
            "overrides": {"img_size": 8, "patch_size": 4, "width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32},
        },
        "data": {
            "name": _write_shards_with_an_unreadable_run(tmp_path / "shards"),
            # no shuffle buffer: whichever rank draws shard 001 has its second share unreadable
            "options": {"img_size": 8, "reader": "tarfile", "num_classes": 3, "shuffle_buffer": 0},
            "eval_split": "",
        },
        "augment": {"crop": "none", "flip": False},
        "optim": {"name": "sgd", "lr": 0.1},
        "train": {"steps": 3, "batch_size": 8, "precision": "fp32"},
        "log": {"log_every": 1, "eval_every": 0, "checkpoint_every": 0, "plot": False, "tensorboard": False},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port())]
    cmd += [
        "-m",
        "vitkit",
        "train",
        "--config",
        str(tmp_path / "r.yaml"),
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "run"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    steps = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(steps) == 3
    state = load_train_state(list_checkpoints(tmp_path / "run" / "checkpoints")[-1]).state
    assert (state.epoch, state.batch_in_epoch) == (2, 1)  # one step an epoch: its second batch dropped


def test_evaluation_with_one_process_unable_to_read_its_share_scores_the_others(tmp_path: Path) -> None:
    """Shard 001, rank 1's, does not decode at all. Rank 1 scores nothing and says so to the
    others instead of stopping alone (which left them waiting in the all-reduce): the metrics are
    rank 0's. With nothing readable anywhere, every process raises the same one line."""
    import vitkit
    from vitkit.errors import UsageError
    from vitkit.eval import evaluate

    _write_shards(tmp_path, n_shards=1, per_shard=8)
    with tarfile.open(tmp_path / "train-001.tar", "w") as tar:
        for i in range(8):
            _add(tar, f"{100 + i:05d}.png", b"not an image")
            _add(tar, f"{100 + i:05d}.cls", b"1\n")
    ds = ShardDataset(str(tmp_path / "train-{000..001}.tar"), load_size=8, reader="tarfile", num_classes=3)
    model = vitkit.create_model(
        "vit_ti16", img_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3
    )
    sent: list[torch.Tensor] = []  # what rank 0 contributes to each all-reduce, in order

    def rank0_reduce(t: torch.Tensor) -> torch.Tensor:
        sent.append(t.clone())
        return t

    alone = evaluate(model, ds, batch_size=8, rank=0, world_size=2)
    first = evaluate(model, ds, batch_size=8, rank=0, world_size=2, reduce=rank0_reduce)
    calls = iter(sent)
    second = evaluate(model, ds, batch_size=8, rank=1, world_size=2, reduce=lambda t: t + next(calls))
    assert second["top1"] == first["top1"] == alone["top1"] and second["confusion"] == alone["confusion"]
    assert sum(map(sum, second["confusion"])) == 8 and second["skipped"] == 8  # rank 1's 8, rank 0's none
    with pytest.raises(UsageError, match=r"no images to evaluate on any of the processes"):
        evaluate(model, ds, batch_size=8, rank=1, world_size=2, reduce=lambda t: t * 0)


def test_shard_classes_and_bad_labels(tmp_path: Path) -> None:
    _write_shards(tmp_path, n_shards=2, per_shard=3)
    pattern = str(tmp_path / "train-{000..001}.tar")
    assert ShardDataset(pattern).classes == ["class_0", "class_1", "class_2"]  # largest label in shard 0
    assert len(ShardDataset(pattern, num_classes=5).classes) == 5
    ds = ShardDataset(pattern, num_classes=2, reader="tarfile")
    with pytest.raises(DataError, match=r"train-000.tar:00002: class 2, but there are 2 classes"):
        list(ds.batches(2))
    built = build_dataset(pattern, "train", img_size=12, reader="tarfile")
    assert isinstance(built, ShardDataset) and built.image_size == (12, 12)


@needs_webdataset
def test_shard_readers_agree(tmp_path: Path) -> None:
    _write_shards(tmp_path, n_shards=3, per_shard=5)
    kw = dict(load_size=4, shuffle_buffer=6)
    a = ShardDataset(str(tmp_path / "train-{000..002}.tar"), reader="tarfile", **kw)
    b = ShardDataset(str(tmp_path / "train-{000..002}.tar"), reader="webdataset", **kw)
    assert _shard_ids(a, 4, shuffle=True, seed=2) == _shard_ids(b, 4, shuffle=True, seed=2)


def test_reader_falls_back_to_tarfile_without_webdataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitkit.data import shards

    monkeypatch.setitem(sys.modules, "webdataset", None)  # makes "import webdataset..." fail
    monkeypatch.setitem(sys.modules, "webdataset.tariterators", None)
    assert shards._reader("auto") is shards._tarfile_samples
    with pytest.raises(DataError, match=r"pip install 'vitkit\[shards\]'"):
        shards._reader("webdataset")
    _write_shards(tmp_path, n_shards=2, per_shard=2)
    ds = ShardDataset(str(tmp_path / "train-{000..001}.tar"), load_size=4, num_classes=3)
    assert sorted(i for b in _shard_ids(ds, 3) for i in b) == [0, 1, 100, 101]
