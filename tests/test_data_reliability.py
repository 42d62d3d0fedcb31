"""Data that would otherwise give wrong numbers without a word: images deeper than 8 bits, a model
scored against another set of classes, one-class folders, shards cut short, runaway brace ranges."""

from __future__ import annotations

import importlib.util
import io
import json
import struct
import tarfile
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.data import ArrayDataset, ImageFolder, ShardDataset, build_dataset, carve, decode_image, expand_braces
from vitkit.data.pixels import eight_bit
from vitkit.data.shards import MAX_SHARD_NAMES, brace_count
from vitkit.errors import DataError, UsageError
from vitkit.eval import class_order, evaluate

# -- 1. images deeper than 8 bits are scaled by their range, not clipped ---------------------------


def _encoded(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


def _png16(values: np.ndarray, color_type: int) -> bytes:
    """A 16-bit PNG written by hand (Pillow writes none but grey): ``values`` (H, W) or (H, W, C)
    of uint16; colour type 0 grey, 2 RGB, 4 grey with alpha, 6 RGBA."""
    h, w = values.shape[:2]
    rows = b"".join(b"\x00" + values[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _filled(mode: str, value: float, size=(10, 6)) -> Image.Image:
    """A ``mode`` image of ``size`` (W, H) holding ``value`` everywhere, made from raw bytes."""
    dtype = {"I;16": "<u2", "I;16B": ">u2", "I;16L": "<u2", "I": "<i4", "F": "<f4"}[mode]
    return Image.frombytes(mode, size, np.full(size[::-1], value, dtype=dtype).tobytes())


def _pgm16(value: int, maxval: int = 65535, size=(10, 6)) -> bytes:
    return f"P5\n{size[0]} {size[1]}\n{maxval}\n".encode() + np.full(size[::-1], value, dtype=">u2").tobytes()


MID_GREY = {  # each decodes to 128 (or 127: 32767 / 257 = 127.5)
    "I;16 PNG": lambda: _encoded(_filled("I;16", 32768), "PNG"),
    "I;16B PNG": lambda: _encoded(_filled("I;16B", 32768), "PNG"),
    "I;16 TIFF": lambda: _encoded(_filled("I;16", 32768), "TIFF"),
    "I;16B TIFF": lambda: _encoded(_filled("I;16B", 32768), "TIFF"),
    "I;16L TIFF": lambda: _encoded(_filled("I;16L", 32768), "TIFF"),
    "I (32-bit) TIFF": lambda: _encoded(_filled("I", 2**30), "TIFF"),
    "I from a 16-bit PGM": lambda: _pgm16(32768),
    "I from a 10-bit PGM": lambda: _pgm16(512, maxval=1023),
    "I from a 16-bit PPM": lambda: _encoded(_filled("I", 32768), "PPM"),
    "F TIFF": lambda: _encoded(_filled("F", 0.5), "TIFF"),
    "16-bit grey PNG": lambda: _png16(np.full((6, 10), 32768, np.uint16), 0),
    "16-bit RGB PNG": lambda: _png16(np.full((6, 10, 3), 32768, np.uint16), 2),
    "16-bit grey+alpha PNG": lambda: _png16(np.dstack([np.full((6, 10), 32768, np.uint16)] * 2), 4),
    "16-bit RGBA PNG": lambda: _png16(np.full((6, 10, 4), 32768, np.uint16), 6),
}


@pytest.mark.parametrize("kind", list(MID_GREY))
def test_mid_grey_deep_images_decode_to_mid_grey(kind: str) -> None:
    data = MID_GREY[kind]()
    for mode, channels in (("RGB", 3), ("L", 1)):
        x = decode_image(data, (4, 4), mode=mode)
        assert x.shape == (channels, 4, 4) and x.dtype == torch.uint8
        assert int(x.min()) >= 127 and int(x.max()) <= 128, (kind, mode, x.unique().tolist())


def test_sixteen_bit_levels_map_onto_eight_bit_ones() -> None:
    levels = np.arange(256, dtype=np.uint16) * 257  # 0, 257, ..., 65535: exactly the 8-bit levels
    img = Image.frombytes("I;16", (256, 1), levels.astype("<u2").tobytes())
    assert np.asarray(eight_bit(img, "ramp")).tolist() == [list(range(256))]
    floats = Image.frombytes("F", (3, 1), np.array([0.0, 0.25, 1.0], "<f4").tobytes())
    assert np.asarray(eight_bit(floats, "f")).tolist() == [[0, 64, 255]]
    signed = Image.open(io.BytesIO(_encoded(_filled("I", 2**31 - 1), "TIFF")))  # signed 32-bit: its maximum
    assert np.asarray(eight_bit(signed, "s")).max() == 255


@pytest.mark.parametrize(
    ("kind", "make", "found"),
    [
        ("float of 0..255", lambda: _encoded(_filled("F", 128.0), "TIFF"), "values in [128, 128]"),
        ("float below 0", lambda: _encoded(_filled("F", -0.5), "TIFF"), "values in [-0.5, -0.5]"),
        ("float NaN", lambda: _encoded(_filled("F", float("nan")), "TIFF"), "values that are not finite"),
        ("negative integer", lambda: _encoded(_filled("I", -5), "TIFF"), "[-5, -5], outside the 0..2147483647"),
    ],
)
def test_values_outside_the_declared_range_are_refused_naming_the_file(kind: str, make, found: str) -> None:
    with pytest.raises(DataError) as e:
        decode_image(make(), (4, 4), name="scan_017.tif")
    msg = str(e.value)
    assert msg.startswith("scan_017.tif: ") and found in msg and "\n" not in msg, (kind, msg)


def _palette_with_transparency() -> bytes:
    img = Image.new("P", (10, 6), 1)
    img.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
    img.info["transparency"] = 0
    return _encoded(img, "PNG")


@pytest.mark.parametrize(
    ("kind", "make", "rgb"),
    [
        ("1-bit", lambda: _encoded(Image.new("1", (10, 6), 1), "PNG"), (255, 255, 255)),
        ("L", lambda: _encoded(Image.new("L", (10, 6), 77), "PNG"), (77, 77, 77)),
        ("P", lambda: _encoded(Image.new("P", (10, 6), 0), "PNG"), (0, 0, 0)),
        ("P with transparency", _palette_with_transparency, (200, 100, 50)),
        ("LA", lambda: _encoded(Image.new("LA", (10, 6), (90, 40)), "PNG"), (90, 90, 90)),
        ("RGBA", lambda: _encoded(Image.new("RGBA", (10, 6), (10, 20, 30, 0)), "PNG"), (10, 20, 30)),
        ("CMYK TIFF", lambda: _encoded(Image.new("CMYK", (10, 6), (0, 255, 255, 0)), "TIFF"), (255, 0, 0)),
        ("RGB", lambda: _encoded(Image.new("RGB", (10, 6), (1, 2, 3)), "PNG"), (1, 2, 3)),
    ],
)
def test_eight_bit_modes_decode_as_before(kind: str, make, rgb: tuple[int, int, int]) -> None:
    x = decode_image(make(), (4, 4))
    assert x[:, 0, 0].tolist() == list(rgb) and (x == x[:, :1, :1]).all(), kind
    assert decode_image(make(), (4, 4), mode="L").shape == (1, 4, 4)


def test_eight_bit_images_pass_through_unchanged() -> None:
    for mode in ("1", "L", "P", "LA", "RGB", "RGBA", "CMYK"):
        img = Image.new(mode, (3, 2))
        assert eight_bit(img, "x") is img


def _deep_folder(root: Path, per_class: int = 3) -> Path:
    """Two classes of 16-bit PNGs: dark grey (16384) and light grey (49152)."""
    for cls, value in (("dark", 16384), ("light", 49152)):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            (root / cls / f"{i}.png").write_bytes(_encoded(_filled("I;16", value + i), "PNG"))
    return root


def test_a_sixteen_bit_folder_trains_on_its_greys_not_on_white(tmp_path: Path) -> None:
    ds = ImageFolder(_deep_folder(tmp_path / "scans"), "train", val_fraction=0.0, load_size=4)
    x, y = next(ds.batches(6))
    means = {cls: x[y == c].float().mean().item() for c, cls in enumerate(ds.classes)}
    assert means["dark"] == pytest.approx(64, abs=1) and means["light"] == pytest.approx(191, abs=1)
    assert ds.skips.skipped == 0


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_float_image_outside_zero_one_stops_the_epoch_naming_it(tmp_path: Path, num_workers: int) -> None:
    root = _deep_folder(tmp_path / "scans")
    (root / "light" / "hdr.tif").write_bytes(_encoded(_filled("F", 300.0), "TIFF"))
    ds = ImageFolder(root, "train", val_fraction=0.0, load_size=4)
    with pytest.raises(DataError) as e:
        list(ds.batches(4, num_workers=num_workers))
    msg = str(e.value)
    assert msg.startswith(str(root / "light" / "hdr.tif") + ": a floating-point image with values in [300, 300]")
    assert "\n" not in msg


# -- 4. a shard cut short is named, with the member at fault ----------------------------------------


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _shard(path: Path, n: int = 4, compressed: bool = False) -> list[tarfile.TarInfo]:
    """A shard of ``n`` samples (a 24x16 PNG and a .cls each); returns its members' headers."""
    with tarfile.open(path, "w:gz" if compressed else "w") as tar:
        for i in range(n):
            img = np.random.default_rng(i).integers(0, 256, (16, 24, 3), dtype=np.uint8)
            _member(tar, f"{i:05d}.png", _encoded(Image.fromarray(img), "PNG"))
            _member(tar, f"{i:05d}.cls", f"{i % 2}\n".encode())
    with tarfile.open(path) as tar:
        return tar.getmembers()


HAVE_WEBDATASET = importlib.util.find_spec("webdataset") is not None
READERS = ["tarfile", pytest.param("webdataset", marks=pytest.mark.skipif(not HAVE_WEBDATASET, reason="no webdataset"))]


def _cut_reasons(tmp_path: Path, cut: int, reader: str, compressed: bool = False) -> tuple[list[int], list[str]]:
    """Read a copy of a shard cut to its first ``cut`` bytes: (labels read, skip reasons)."""
    whole = tmp_path / ("whole.tar.gz" if compressed else "whole.tar")
    if not whole.exists():
        _shard(whole, compressed=compressed)
    (tmp_path / "classes.txt").write_text("even\nodd\n")
    data = whole.read_bytes()
    cut_path = tmp_path / ("train-000.tar.gz" if compressed else "train-000.tar")
    cut_path.write_bytes(data[:cut] if cut >= 0 else data[: len(data) + cut])
    ds = ShardDataset(str(cut_path), load_size=4, reader=reader, num_samples=8, shuffle_buffer=0)
    labels = [int(v) for _, y in ds.batches(1) for v in y]  # a shard that runs short is read again
    return labels, list(ds.skips.examples)


@pytest.mark.parametrize("reader", READERS)
def test_a_shard_cut_inside_a_member_names_the_shard_and_the_member(tmp_path: Path, reader: str) -> None:
    members = _shard(tmp_path / "whole.tar")
    png = members[2]  # 00001.png: cut halfway through its data
    labels, reasons = _cut_reasons(tmp_path, png.offset_data + png.size // 2, reader)
    assert labels[:1] == [0]  # the whole sample before the cut is read
    where = "in member 00001.png" if reader == "tarfile" else "after member 00000.cls"
    shard = str(tmp_path / "train-000.tar")
    assert f"{shard} (cut short {where}: ReadError: unexpected end of data)" in reasons, reasons


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("at", ["a member's boundary", "inside a header", "inside the end block"])
def test_a_shard_cut_where_tarfile_ends_quietly_is_named(tmp_path: Path, reader: str, at: str) -> None:
    """``tarfile`` takes a header that is missing or cut short for the end of the archive: a shard
    cut there would read as a shorter one, its lost samples never mentioned."""
    members = _shard(tmp_path / "whole.tar")
    cut, last = {
        "a member's boundary": (members[4].offset, "00001.cls"),  # right before 00002.png's header
        "inside a header": (members[4].offset + 200, "00001.cls"),
        "inside the end block": (members[-1].offset_data + 512 + 100, "00003.cls"),
    }[at]
    labels, reasons = _cut_reasons(tmp_path, cut, reader)
    expected = f"{tmp_path / 'train-000.tar'} (cut short after member {last}: no end-of-archive block"
    assert any(r.startswith(expected) for r in reasons), reasons
    assert labels[:2] == [0, 1]


@pytest.mark.parametrize("reader", READERS)
def test_a_compressed_shard_cut_short_is_named(tmp_path: Path, reader: str) -> None:
    _shard(tmp_path / "whole.tar.gz", compressed=True)
    size = (tmp_path / "whole.tar.gz").stat().st_size
    for cut in (size // 2, size - 100):  # inside the data; inside its last sample
        labels, reasons = _cut_reasons(tmp_path, cut, reader, compressed=True)
        assert labels[:1] == [0]
        shard = str(tmp_path / "train-000.tar.gz")
        assert any(r.startswith(f"{shard} (cut short ") and " member 0000" in r for r in reasons), reasons


@pytest.mark.parametrize("reader", READERS)
def test_a_whole_shard_reports_nothing(tmp_path: Path, reader: str) -> None:
    labels, reasons = _cut_reasons(tmp_path, -1, reader)  # the last padding byte of the record: not needed
    assert reasons == [] and labels == [0, 1, 0, 1, 0, 1, 0, 1]


# -- 5. brace ranges are bounded before they are expanded -------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "count"),
    [
        ("train-{000000..999999999}.tar", 1_000_000_000),
        ("s-{0..1000}-{0..1000}.tar", 1_002_001),
        ("s-{a,b}-{0..999999}.tar", 2_000_000),
        ("s-{{0..999999},{0..9}}.tar", 1_000_010),
    ],
)
def test_a_brace_range_of_too_many_names_is_refused_at_once(pattern: str, count: int) -> None:
    assert brace_count(pattern) == count
    start = time.perf_counter()
    with pytest.raises(DataError) as e:
        expand_braces(pattern)
    assert time.perf_counter() - start < 0.5  # counted, not built
    assert str(e.value) == (
        f"{pattern}: names {count:,} shard files, more than the {MAX_SHARD_NAMES:,} a pattern may name; "
        "check its brace ranges"
    )
    with pytest.raises(DataError, match=f"names {count:,} shard files"):
        ShardDataset(pattern)


def test_brace_counts_agree_with_the_expansion() -> None:
    for pattern in ("a-{000..002}.tar", "{3..1}", "{a,b{1..2}}-{x,y}", "x{1..3}{a,b,{c,d}}y{0..9}", "{,a}", "p"):
        assert brace_count(pattern) == len(expand_braces(pattern))
    assert len(expand_braces("s-{000000..999999}.tar")) == MAX_SHARD_NAMES  # the bound itself is allowed
    assert expand_braces("s-{1..4}.tar", limit=4)[-1] == "s-4.tar"
    with pytest.raises(DataError, match="names 5 shard files, more than the 4"):
        expand_braces("s-{0..4}.tar", limit=4)


def test_a_range_bound_of_thousands_of_digits_is_refused_in_a_short_line() -> None:
    pattern = "s-{0.." + "9" * 5000 + "}.tar"
    with pytest.raises(DataError) as e:
        expand_braces(pattern)
    msg = str(e.value)
    assert msg.endswith("a brace range bound of 5000 digits (at most 18)") and len(msg) < 250


# -- 3. a folder of one class, an empty class, a minival that empties a class -----------------------


def _folder(root: Path, counts: dict[str, int]) -> Path:
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("RGB", (8, 8), (20 * i, 0, 0)).save(root / cls / f"{i}.png")
    return root


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_a_folder_of_one_class_is_refused_naming_it_and_the_class(tmp_path: Path, split: str) -> None:
    root = _folder(tmp_path / "photos", {"images": 12})
    for make in (lambda: ImageFolder(root, split), lambda: build_dataset(str(root), split)):
        with pytest.raises(DataError) as e:
            make()
        assert str(e.value) == (
            f"{root}: one class folder (images); a classifier needs 2 classes at least, one sub-folder each "
            f"({root}/<class>/<image>)"
        )
    assert len(ImageFolder(root, split, min_classes=1, val_fraction=0.5)) == 6  # features of one folder: allowed


def test_a_train_tree_of_one_class_is_refused_even_with_a_val_tree(tmp_path: Path) -> None:
    _folder(tmp_path / "train", {"cat": 3})
    _folder(tmp_path / "val", {"cat": 2})
    for split in ("train", "val"):
        with pytest.raises(DataError, match=r"train: one class folder \(cat\); a classifier needs 2 classes"):
            ImageFolder(tmp_path, split)


@pytest.mark.parametrize("content", ["nothing", "a text file", "a hidden image", "an empty sub-folder"])
def test_a_class_folder_without_images_is_refused_naming_it(tmp_path: Path, content: str) -> None:
    root = _folder(tmp_path / "pets", {"cat": 4, "dog": 4})
    empty = root / "eel"
    empty.mkdir()
    if content == "a text file":
        (empty / "notes.txt").write_text("none yet")
    elif content == "a hidden image":
        Image.new("RGB", (8, 8)).save(empty / ".0.png")
    elif content == "an empty sub-folder":
        (empty / "later").mkdir()
    for split in ("train", "val"):  # the held-out split sees the same tree
        with pytest.raises(DataError) as e:
            ImageFolder(root, split)
        assert str(e.value).startswith(f"{empty}: a class folder with no images (.jpg, .jpeg, .png"), content


def test_a_class_without_images_in_val_only_has_no_score_there(tmp_path: Path) -> None:
    _folder(tmp_path / "train", {"ant": 3, "bee": 3})
    _folder(tmp_path / "val", {"ant": 2})
    (tmp_path / "val" / "bee").mkdir()
    val = ImageFolder(tmp_path, "val")
    assert val.classes == ["ant", "bee"] and val.labels.tolist() == [0, 0]


def test_a_minival_that_would_empty_a_class_is_refused_naming_it(tmp_path: Path) -> None:
    root = _folder(tmp_path / "pets", {"cat": 1, "dog": 10, "eel": 10})
    with pytest.raises(DataError) as e:
        build_dataset(str(root), "train", minival=6, val_fraction=0.0)
    assert str(e.value) == (
        "pets/train: data.minival of 6 images takes every image of class cat (1), leaving none to train on; "
        "lower data.minival or add images"
    )
    with pytest.raises(DataError, match="takes every image of class cat"):  # the minival split says the same
        build_dataset(str(root), "minival", minival=6, val_fraction=0.0)
    with pytest.raises(
        DataError, match="pets/train: data.minival of 2 images cannot hold one of each of its 3 classes"
    ):
        build_dataset(str(root), "train", minival=2, val_fraction=0.0)
    with pytest.raises(DataError, match="pets/train: data.minival of 40 images is more than its 21 images"):
        build_dataset(str(root), "train", minival=40, val_fraction=0.0)
    with pytest.raises(DataError, match="takes every image of class cat"):  # one of each: cat's only image
        build_dataset(str(root), "train", minival=3, val_fraction=0.0)
    _folder(root, {"cat": 2})
    train = build_dataset(str(root), "train", minival=3, val_fraction=0.0)
    held = build_dataset(str(root), "minival", minival=3, val_fraction=0.0)
    assert train.labels.bincount().tolist() == [1, 9, 9] and held.labels.bincount().tolist() == [1, 1, 1]


def test_a_minival_names_the_classes_it_cannot_serve(tmp_path: Path) -> None:
    images = torch.zeros(9, 1, 2, 2, dtype=torch.uint8)
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])  # class "c" has no image
    ds = ArrayDataset(images, labels, ["a", "b", "c"], name="arrays")
    with pytest.raises(DataError) as e:
        carve(ds, "train", minival=3)
    assert str(e.value) == "arrays: no images of class c (0)"
    many = ArrayDataset(torch.zeros(8, 1, 2, 2, dtype=torch.uint8), torch.arange(8), [f"k{i}" for i in range(8)])
    with pytest.raises(
        DataError,
        match=r"takes every image of class k0 \(1\), k1 \(1\), k2 \(1\), k3 \(1\), k4 \(1\) "
        r"and 3 more, leaving none",
    ):
        carve(many, "train", minival=8)


@pytest.mark.parametrize(
    ("options", "listing", "source"),
    [
        ({}, None, "the largest label in"),
        ({"num_classes": 1}, None, "the num_classes option"),
        ({"classes": ["cat"]}, None, "the classes option"),
        ({}, "cat\n", "classes.txt"),
    ],
)
def test_shards_of_one_class_are_refused_saying_where_it_came_from(tmp_path: Path, options, listing, source) -> None:
    _shard(tmp_path / "train-000.tar", n=1)  # one sample, label 0
    if listing is not None:
        (tmp_path / "classes.txt").write_text(listing)
    with pytest.raises(DataError) as e:
        ShardDataset(str(tmp_path / "train-000.tar"), **options)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path.name}/train: 1 class (") and source in msg, msg
    assert msg.endswith(
        "a classifier needs 2 classes at least: write classes.txt next to the shards or pass num_classes"
    )


# -- 2. eval matches the model's outputs to the data's classes by name ------------------------------

VAL_COUNTS = {"cat": 2, "dog": 3, "eel": 5}


def _always_first(path: Path, classes: list[str] | None, k: int = 3) -> Path:
    """A tiny model whose every prediction is its output 0, saved with ``classes`` (None: no names)."""
    model = vitkit.create_model(
        "vit_ti16", img_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=k
    )
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([5.0] + [0.0] * (k - 1)))
    extra = {"classes": json.dumps(classes)} if classes is not None else None
    return vitkit.save_checkpoint(model, path, extra=extra)


def _eval_tree(root: Path, classes: tuple[str, ...] = ("cat", "dog", "eel")) -> Path:
    _folder(root / "train", dict.fromkeys(classes, 1))
    _folder(root / "val", {c: VAL_COUNTS.get(c, 1) for c in classes})
    return root


def _eval(capsys, ckpt: Path, data: Path, tmp_path: Path, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / "eval.json"
    out.unlink(missing_ok=True)
    argv = ["eval", str(ckpt), "--data", str(data), "--split", "val", "--precision", "fp32", "--out", str(tmp_path)]
    rc = main([*argv, "--json", str(out), *extra])
    err = capsys.readouterr().err.strip()
    return rc, json.loads(out.read_text()) if rc == 0 else {}, err


def test_names_in_the_same_order_score_as_before(tmp_path: Path, capsys) -> None:
    data = _eval_tree(tmp_path / "pets")
    rc, m, err = _eval(capsys, _always_first(tmp_path / "m.safetensors", ["cat", "dog", "eel"]), data, tmp_path)
    assert rc == 0 and m["top1"] == 0.2 and m["classes_matched"] == "by position" and "note" not in err


@pytest.mark.parametrize("stored", [["eel", "cat", "dog"], ["eel", "dog", "cat"]])
def test_the_same_names_in_another_order_are_matched_by_name_and_said(tmp_path: Path, capsys, stored) -> None:
    """The model always predicts its output 0, "eel": scored by name that is right for the 5 eels
    of 10 images; scored by position it would be "cat", right for 2."""
    data = _eval_tree(tmp_path / "pets")
    ckpt = _always_first(tmp_path / "m.safetensors", stored)
    rc, m, err = _eval(capsys, ckpt, data, tmp_path)
    assert rc == 0 and m["top1"] == 0.5 and m["classes_matched"] == "by name"
    assert m["classes"] == ["cat", "dog", "eel"] and [r["accuracy"] for r in m["per_class"]] == [0.0, 0.0, 1.0]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"note: {ckpt} stores the classes of {data} val in another order")
    rc, m, err = _eval(capsys, ckpt, data, tmp_path, "--ignore-class-names")
    assert rc == 0 and m["top1"] == 0.2 and m["classes_matched"] == "by position" and "note" not in err


@pytest.mark.parametrize(
    ("stored", "differ"),
    [
        (["ant", "bee", "cow"], "only the model's: ant, bee, cow; only the data's: cat, dog, eel"),
        (["cat", "dog", "emu"], "only the model's: emu; only the data's: eel"),
        (["Cat", "dog", "eel"], "only the model's: Cat; only the data's: cat"),
        (["cat", "cat", "eel"], "only the data's: dog"),
    ],
)
def test_other_names_are_refused_naming_them(tmp_path: Path, capsys, stored, differ) -> None:
    data = _eval_tree(tmp_path / "pets")
    ckpt = _always_first(tmp_path / "m.safetensors", stored)
    rc, _, err = _eval(capsys, ckpt, data, tmp_path)
    assert rc == 2 and "\n" not in err
    assert err.endswith(
        f"{ckpt} was trained on other classes than {data} val ({differ}); "
        "--ignore-class-names scores output i as the data's class i"
    ), err
    rc, m, _ = _eval(capsys, ckpt, data, tmp_path, "--ignore-class-names")
    assert rc == 0 and m["top1"] == 0.2


def test_many_other_names_are_cut_to_the_first_few(tmp_path: Path, capsys) -> None:
    classes = tuple(f"c{i:02d}" for i in range(12))
    data = _eval_tree(tmp_path / "many", classes)
    ckpt = _always_first(tmp_path / "m.safetensors", [f"k{i:02d}" for i in range(12)], k=12)
    rc, _, err = _eval(capsys, ckpt, data, tmp_path)
    assert rc == 2 and "only the model's: k00, k01, k02, k03, k04 and 7 more; only the data's: c00, c01" in err


def test_a_model_without_names_scores_by_position(tmp_path: Path, capsys) -> None:
    data = _eval_tree(tmp_path / "pets")
    rc, m, err = _eval(capsys, _always_first(tmp_path / "m.safetensors", None), data, tmp_path)
    assert rc == 0 and m["top1"] == 0.2 and m["classes_matched"] == "by position" and "note" not in err


def test_shards_that_name_no_classes_score_by_position_and_say_so(tmp_path: Path, capsys) -> None:
    with tarfile.open(tmp_path / "val-000.tar", "w") as tar:
        for i, label in enumerate([0, 0, 1, 2, 2, 2]):
            _member(tar, f"{i:05d}.png", _encoded(Image.new("RGB", (8, 8), (30 * i, 0, 0)), "PNG"))
            _member(tar, f"{i:05d}.cls", str(label).encode())
    ckpt = _always_first(tmp_path / "m.safetensors", ["eel", "cat", "dog"])
    out = tmp_path / "e.json"
    argv = ["eval", str(ckpt), "--data", str(tmp_path / "{split}-000.tar"), "--split", "val", "--json", str(out)]
    assert main([*argv, "--precision", "fp32", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.strip()
    assert "names no classes (class_0... from its labels); output i of" in err and "scores label i" in err
    assert json.loads(out.read_text())["top1"] == pytest.approx(2 / 6)


def test_class_order_matches_names_and_refuses_others() -> None:
    assert class_order(None, ["a", "b"]) == (None, None)
    assert class_order(["a", "b"], ["a", "b"]) == (None, None)
    assert class_order(["a", "b", "c"], ["a", "b"]) == (None, None)  # a count that differs: evaluate's to refuse
    order, note = class_order(["c", "a", "b"], ["a", "b", "c"], model_name="m", data_name="d")
    assert order == [1, 2, 0] and note.startswith("m stores the classes of d in another order (3 of 3")
    with pytest.raises(
        UsageError, match=r"^m was trained on other classes than d \(only the model's: x; only the data's: b\)$"
    ):
        class_order(["a", "x"], ["a", "b"], model_name="m", data_name="d")
    with pytest.raises(UsageError, match=r"cannot be matched one to one with d's \(repeated: a, b\)"):
        class_order(["a", "a", "b"], ["a", "b", "b"], data_name="d")


def test_evaluate_scores_through_a_logit_order() -> None:
    ds = ArrayDataset(torch.zeros(6, 3, 8, 8, dtype=torch.uint8), torch.tensor([0, 1, 1, 2, 2, 2]), ["a", "b", "c"])
    model = vitkit.create_model(
        "vit_ti16", img_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3
    )
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([5.0, 0.0, 0.0]))  # always output 0
    assert evaluate(model, ds, batch_size=6)["top1"] == pytest.approx(1 / 6)
    assert evaluate(model, ds, batch_size=6, logit_order=[1, 2, 0])["top1"] == pytest.approx(3 / 6)  # 0 scores "c"
    with pytest.raises(UsageError, match="logit_order must order the 3 outputs"):
        evaluate(model, ds, logit_order=[0, 0, 1])


def test_eval_of_a_one_class_folder_is_one_line(tmp_path: Path, capsys) -> None:
    _folder(tmp_path / "one" / "train", {"cat": 2})
    _folder(tmp_path / "one" / "val", {"cat": 2})
    rc, _, err = _eval(capsys, _always_first(tmp_path / "m.safetensors", None), tmp_path / "one", tmp_path)
    assert rc == 2 and "\n" not in err and f"{tmp_path / 'one' / 'train'}: one class folder (cat)" in err
