"""WebDataset tar shards, streamed: for data that does not fit in memory.

A shard is a tar whose members form samples by key, as WebDataset writes them: ``<key>.jpg``
(or ``.jpeg``, ``.png``, ``.webp``...) with ``<key>.cls``, the class index as text. Shards are
named by a pattern with brace ranges, ``shards/train-{000..099}.tar``. Class names come from a
``classes.txt`` (one a line) next to the shards, else ``num_classes`` gives ``class_<i>``, else
the largest label in the first shard does.

An epoch, for one rank:
1. the shard list is permuted by (seed, epoch) when shuffling, and the rank takes every
   ``world_size``-th shard (there must be at least as many shards as ranks);
2. its shards are read in that order, in the main process (reading a tar is cheap), through a
   shuffle buffer of ``shuffle_buffer`` samples seeded by (seed, epoch, rank);
3. each global batch of ``batch_size`` gives this rank its share (as for in-memory data), and
   DataLoader workers decode those images with Pillow.
So the order is a pure function of (seed, epoch, rank, world_size), not of ``num_workers``, and
``start_batch`` resumes exactly (the skipped samples are read but not decoded).

Length: an epoch is ``num_samples`` samples (global); every rank yields the same number of
batches, ``num_samples / batch_size``, rounded down with ``drop_last``, else up. A rank whose
shards run out first starts over them (reshuffled), one with more stops early: what DDP needs so
that no rank waits for another. Without ``num_samples`` the length is counted once from the tar
headers (samples with both an image and a ``.cls``), which reads headers only for plain ``.tar``.
For exact evaluation over shards use one process: with several, ranks repeat or leave samples.

Tars are parsed by the ``webdataset`` package when it is installed (``pip install vitkit[shards]``)
and by the standard library's ``tarfile`` otherwise; both group members by key the same way.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import logging
import os
import random
import re
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import DataError
from .plan import BatchPlan, epoch_order
from .streaming import Item, StreamingDataset

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "tif", "tiff")
SPLIT_NAMES = {"train": ("train",), "val": ("val", "test"), "test": ("test", "val")}

# WebDataset's conventions: the key is the path up to the first dot of the file name, the rest
# (lower-cased) is the field; names like ``__meta__`` are skipped.
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
log = logging.getLogger("vitkit")
_META = re.compile(r"__[^/]*__($|/)")

Sample = dict[str, Any]
ErrorSink = Callable[[str], None]


MAX_SHARD_NAMES = 1_000_000  # the most file names one pattern may expand to
_MAX_RANGE_DIGITS = 18


def _shown(text: str, most: int = 120) -> str:
    """``text`` for an error message, its middle cut out when it is longer than ``most``."""
    return text if len(text) <= most else f"{text[: most // 2]}...{text[-most // 2 :]}"


def _first_group(pattern: str) -> tuple[str, list[str] | tuple[int, int, int], str] | None:
    """The first brace group of ``pattern``: (head, alternatives, tail), where a numeric range is
    given as (first, last, zero-padded width) rather than as its list; None without braces."""
    start = pattern.find("{")
    if start < 0:
        return None
    depth, parts, last, end = 0, [], start + 1, -1
    for i in range(start, len(pattern)):
        c = pattern[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                end = i
                break
        elif c == "," and depth == 1:
            parts.append(pattern[last:i])
            last = i + 1
    if end < 0:
        raise DataError(f"{pattern}: unbalanced '{{' in the shard pattern")
    parts.append(pattern[last:end])
    head, tail = pattern[:start], pattern[end + 1 :]
    if len(parts) > 1:
        return head, parts, tail
    bounds = re.fullmatch(r"(\d+)\.\.(\d+)", parts[0])
    if bounds is None:
        raise DataError(f"{pattern}: '{{{parts[0]}}}' is neither a range like {{000..099}} nor a list like {{a,b}}")
    lo, hi = bounds.group(1), bounds.group(2)
    if max(len(lo), len(hi)) > _MAX_RANGE_DIGITS:
        digits = max(len(lo), len(hi))
        raise DataError(f"{_shown(pattern)}: a brace range bound of {digits} digits (at most {_MAX_RANGE_DIGITS})")
    padded = any(len(b) > 1 and b.startswith("0") for b in (lo, hi))
    return head, (int(lo), int(hi), max(len(lo), len(hi)) if padded else 0), tail


def brace_count(pattern: str) -> int:
    """How many names :func:`expand_braces` makes of ``pattern``, counted without making them.

    Args:
        pattern: a shard pattern, with or without brace groups.

    Returns:
        The number of names (1 for a pattern without braces).
    """
    group = _first_group(pattern)
    if group is None:
        return 1
    _, alternatives, tail = group  # the head has no braces; each alternative is balanced
    if isinstance(alternatives, tuple):
        first, last, _ = alternatives
        here = abs(last - first) + 1
    else:
        here = sum(brace_count(a) for a in alternatives)
    return here * brace_count(tail) if here else 0


def expand_braces(pattern: str, limit: int = MAX_SHARD_NAMES) -> list[str]:
    """Expand shell-style braces: ``a-{000..002}.tar`` -> a-000.tar, a-001.tar, a-002.tar.

    Supports numeric ranges (zero padding kept, ascending or descending) and comma lists
    (``{train,val}``), nested and several per pattern, expanded left to right as bash does.

    Args:
        pattern: the pattern to expand.
        limit: the most names it may expand to; counted before any is made.

    Returns:
        The names, in order.

    Raises:
        DataError: unbalanced or malformed braces, or more than ``limit`` names (a range such as
            ``{000000..999999999}`` would otherwise take the memory of a billion strings).
    """
    n = brace_count(pattern)
    if n > limit:
        raise DataError(
            f"{pattern}: names {n:,} shard files, more than the {limit:,} a pattern may name; check its brace ranges"
        )
    return _expand_braces(pattern)


def _expand_braces(pattern: str) -> list[str]:
    group = _first_group(pattern)
    if group is None:
        return [pattern]
    head, alternatives, tail = group
    if isinstance(alternatives, tuple):
        first, last, width = alternatives
        step = 1 if last >= first else -1
        alternatives = [str(n).zfill(width) for n in range(first, last + step, step)]
    out: list[str] = []
    for alternative in alternatives:
        out.extend(_expand_braces(head + alternative + tail))
    return out


def _expand(pattern: str) -> list[str]:
    out = []
    for name in expand_braces(pattern):
        out.extend(sorted(glob.glob(name)) if glob.has_magic(name) else [name])
    return out


def shard_paths(pattern: str, split: str = "train") -> list[Path]:
    """The shard files of ``split`` named by ``pattern``.

    ``{split}`` in the pattern is replaced by the split. Without it, the pattern names the train
    shards and other splits swap "train" in the file name for "val" (or "test"): of such derived
    names, those that exist are used (or, if none, whatever matches with each brace group as
    ``*``). A pattern used as given must match existing files, all of them.

    Args:
        pattern: a shard pattern with brace ranges and lists (:func:`expand_braces`) and shell
            wildcards, optionally with ``{split}``.
        split: "train", "val" or "test". For "val", ``{split}`` is tried as "val", then
            "test"; for "test", the other way round.

    Returns:
        The shard files, in the pattern's order (names a wildcard matches sorted).

    Raises:
        DataError: an unknown split, a malformed pattern or one that names too many files, a
            pattern used as given that names missing files, or no shards for the split.
    """
    if split not in SPLIT_NAMES:
        raise DataError(f"{pattern}: unknown split {split!r} (train, val or test)")
    head, tail = os.path.split(pattern)
    if "{split}" in pattern:
        candidates = [pattern.replace("{split}", s) for s in SPLIT_NAMES[split]]
        strict = split == "train"
    elif split != "train" and "train" in tail:
        candidates = [os.path.join(head, s.join(tail.rsplit("train", 1))) for s in SPLIT_NAMES[split]]
        strict = False
    else:
        candidates, strict = [pattern], True
    for candidate in candidates:
        paths = [Path(p) for p in _expand(candidate)]
        if strict:
            missing = [p for p in paths if not p.is_file()]
            if not paths or missing:
                first = missing[0] if missing else candidate
                raise DataError(f"{candidate}: {len(missing)} of {len(paths)} shards not found (first: {first})")
            return paths
        existing = [p for p in paths if p.is_file()]
        if not existing:
            existing = [Path(p) for p in sorted(glob.glob(re.sub(r"\{[^{}]*\}", "*", candidate))) if Path(p).is_file()]
        if existing:
            return existing
    raise DataError(
        f"{pattern}: no {split} shards (looked for {', '.join(candidates)}); name the splits with "
        "'{split}' in the pattern, e.g. shards/{split}-{000..009}.tar"
    )


# -- reading one shard ---------------------------------------------------------------------------


_TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:160] if lines else type(e).__name__


def _cut_short(e: BaseException, text: str) -> bool:
    """Whether an error of reading a tar says that the file ends too soon."""
    text = text.lower()
    return isinstance(e, EOFError) or any(s in text for s in ("unexpected end", "ended before", "truncated", "empty"))


def _damage(e: BaseException, where: str) -> str:
    """Why a shard stopped being read, and where: "cut short in member 00012.jpg: ReadError: ..."."""
    return f"{'cut short' if _cut_short(e, str(e)) else 'damaged'} {where}: {type(e).__name__}: {_first_line(e)}"


def _position(reading: str | None, last: str | None) -> str:
    """Where in a tar the reading stopped: in the member being read, else after the last one read."""
    if reading is not None:
        return f"in member {reading}"
    return f"after member {last}" if last is not None else "before its first member"


def _ends_cleanly(tar: tarfile.TarFile) -> bool:
    """Whether the header read that ended ``tar``'s members was a whole end-of-archive block.

    ``tarfile`` ends a tar quietly at a header that is missing or cut short, so a shard cut at a
    member's boundary reads like a shorter one; only the end-of-archive block tells them apart.
    """
    tell = getattr(tar.fileobj, "tell", None)
    if tell is None:
        return True
    try:
        return tell() - tar.offset >= tarfile.BLOCKSIZE
    except (OSError, ValueError):
        return True


def _no_end_block(last: str | None) -> str:
    return f"cut short {_position(None, last)}: no end-of-archive block, so any samples after it are lost"


def _tarfile_samples(path: Path, on_error: ErrorSink) -> Iterator[Sample]:
    """Group the members of a tar into samples, with the standard library only. A shard that is
    damaged or cut short gives the samples before the damage, and ``on_error`` names the shard
    and the member at fault."""
    current: Sample | None = None
    reading: str | None = None  # the member whose data is being read
    last: str | None = None  # the last member read whole
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                if not member.isreg() or _META.match(member.name):
                    last = member.name
                    continue
                match = _KEY.match(member.name)
                if match is None:
                    last = member.name
                    continue
                key, field = match.group(1), match.group(2).lower()
                reading = member.name
                data = tar.extractfile(member).read()
                reading, last = None, member.name
                tar.members = []  # a streamed tar otherwise keeps every header it has seen
                if current is not None and current["__key__"] != key:
                    yield current
                    current = None
                if current is None:
                    current = {"__key__": key}
                if field in current:
                    on_error(f"{path} (duplicate member {member.name})")
                    break
                current[field] = data
            else:
                if not _ends_cleanly(tar):
                    on_error(f"{path} ({_no_end_block(last)})")
    except _TAR_ERRORS as e:
        on_error(f"{path} ({_damage(e, _position(reading, last))})")
    if current is not None:
        yield current


def _end_problem(path: Path) -> str | None:
    """Why the tar at ``path`` ends early, read from its headers alone (plus decompression), or
    None: what the webdataset reader, which ends quietly at a header cut short, does not say."""
    last: str | None = None
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                last = member.name
            return None if _ends_cleanly(tar) else _no_end_block(last)
    except _TAR_ERRORS as e:
        return _damage(e, _position(None, last))


def _webdataset_samples(path: Path, on_error: ErrorSink) -> Iterator[Sample]:
    """Group the members of a tar into samples with webdataset's own tar iterators. A shard that
    is damaged or cut short gives the samples before the damage, and ``on_error`` names the
    shard and the last member read whole before it (the damage is in the next)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    last: list[str | None] = [None]
    reported = [False]

    def stop(exc: Exception) -> bool:
        detail = str(exc.args[0] if exc.args else exc).split(" @ ")[0]  # webdataset appends the stream
        kind = "cut short" if _cut_short(exc, detail) else "damaged"
        on_error(f"{path} ({kind} {_position(None, last[0])}: {type(exc).__name__}: {detail})")
        reported[0] = True
        return False  # give up on this shard, keep what it gave

    def tracked(files: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for f in files:
            last[0] = f.get("fname", last[0])
            yield f

    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below, after the generator is done
    except OSError as e:
        on_error(f"{path} ({type(e).__name__}: {e})")
        return
    with stream:
        files = tar_file_expander([{"url": str(path), "stream": stream}], handler=stop)
        yield from group_by_keys(tracked(files), handler=stop)
    if not reported[0] and (problem := _end_problem(path)):
        on_error(f"{path} ({problem})")


def _reader(name: str) -> Callable[[Path, ErrorSink], Iterator[Sample]]:
    if name not in ("auto", "webdataset", "tarfile"):
        raise ValueError(f"reader must be 'auto', 'webdataset' or 'tarfile', got {name!r}")
    if name == "tarfile":
        return _tarfile_samples
    try:
        import webdataset.tariterators  # noqa: F401
    except ImportError:
        if name == "webdataset":
            raise DataError(
                "reader='webdataset' but the package is not installed: pip install 'vitkit[shards]'"
            ) from None
        return _tarfile_samples
    return _webdataset_samples


def scan_shard(path: Path, read_labels: bool = False) -> tuple[int, int]:
    """(samples with an image and a ``.cls``, largest label or -1) of one shard.

    Reads the tar headers only, plus the ``.cls`` members when ``read_labels``. A damaged
    shard gives what precedes the damage.

    Args:
        path: a tar shard (compressed or not).
        read_labels: also read every ``.cls`` member, for the largest label.

    Returns:
        The number of samples that have both an image and a ``.cls``, and the largest label
        (-1 without ``read_labels``, or when no ``.cls`` holds an integer).
    """
    fields: dict[str, set[str]] = {}
    top = -1
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                match = _KEY.match(member.name) if member.isreg() and not _META.match(member.name) else None
                if match is None:
                    continue
                key, field = match.group(1), match.group(2).lower()
                fields.setdefault(key, set()).add(field)
                if read_labels and field == "cls":
                    with contextlib.suppress(ValueError):  # a bad label is reported when the epoch reads it
                        top = max(top, int(tar.extractfile(member).read().decode("ascii").strip()))
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        pass  # a damaged shard counts what it has; reading it in an epoch reports the damage
    count = sum(1 for f in fields.values() if "cls" in f and not f.isdisjoint(IMAGE_SUFFIXES))
    return count, top


def _shuffle_buffer(items: Iterable[Item], size: int, rng: random.Random) -> Iterator[Item]:
    """Approximate shuffling of a stream: hold ``size`` items, emit a random one per arrival."""
    buffer: list[Item] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        yield buffer[j]
        buffer[j] = item
    rng.shuffle(buffer)
    yield from buffer


def _repeated(stream: Iterator[Item], repeats: int) -> Iterator[Item]:
    """Each sample ``repeats`` times in a row: repeated augmentation on a stream, whose copies
    stay on this rank (the epoch keeps its length, so it reads 1 / repeats of the samples)."""
    if repeats == 1:
        return stream
    return (item for item in stream for _ in range(repeats))


def _cut(stream: Iterator[Item], sizes: list[int], start_batch: int) -> Iterator[list[Item]]:
    """Cut a stream into batches of ``sizes``, the first ``start_batch`` read but not kept."""
    for _ in itertools.islice(stream, sum(sizes[:start_batch])):
        pass  # resuming: read past the batches already seen, without decoding them
    for size in sizes[start_batch:]:
        if size:
            yield list(itertools.islice(stream, size))


class ShardDataset(StreamingDataset):
    """WebDataset shards named by ``pattern`` (or a list of patterns), streamed and decoded to
    ``load_size`` (H, W) uint8; see the module docstring for order, length and classes.

    ``num_samples``: the epoch's length in samples (default: counted from the shards).
    ``shuffle_buffer``: samples held for shuffling within the stream (0 or 1: none).
    ``classes`` / ``num_classes``: class names, or their number, when no ``classes.txt``.
    ``reader``: "auto" (webdataset if installed), "webdataset" or "tarfile".

    Args:
        pattern: a shard pattern (:func:`shard_paths`), or several.
        split: "train", "val" or "test".
        load_size: the (height, width) images are decoded to, in pixels; an int means a square.
        resize: "shorter" (scale the shorter side to fit, crop the centre) or "plain" (stretch).
        mode: "RGB" or "L" (grey).
        num_samples: the epoch's length in samples, at least 1; None: counted from the shards.
        shuffle_buffer: samples held for shuffling within the stream (0 or 1: none).
        classes: the class names, when there is no ``classes.txt``.
        num_classes: the number of classes, when there is neither ``classes.txt`` nor ``classes``.
        reader: "auto", "webdataset" or "tarfile".

    Raises:
        DataError: no shards for the split, fewer than 2 classes, no labels to count them from,
            or the "webdataset" reader asked for but not installed.
        ValueError: an unknown ``mode``, ``resize`` or ``reader``, or ``num_samples`` below 1.
    """

    def __init__(
        self,
        pattern: str | Sequence[str],
        split: str = "train",
        *,
        load_size: int | tuple[int, int] = 256,
        resize: str = "shorter",
        mode: str = "RGB",
        num_samples: int | None = None,
        shuffle_buffer: int = 1000,
        classes: Sequence[str] | None = None,
        num_classes: int | None = None,
        reader: str = "auto",
    ) -> None:
        patterns = [pattern] if isinstance(pattern, str | os.PathLike) else list(pattern)
        first = str(patterns[0])
        super().__init__(load_size, mode, resize, name=f"{Path(first).parent.name or 'shards'}/{split}")
        self.shards = [p for pat in patterns for p in shard_paths(str(pat), split)]
        if num_samples is not None and num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {num_samples}")
        self.num_samples = num_samples
        self.shuffle_buffer = max(0, int(shuffle_buffer))
        self._read = _reader(reader)
        self._warned: set[str] = set()  # the damaged shards already said
        self.classes, self.classes_from = self._find_classes(classes, num_classes)
        if len(self.classes) < 2:
            raise DataError(
                f"{self.name}: {len(self.classes)} class ({', '.join(self.classes) or 'none'}, from "
                f"{self.classes_from}); a classifier needs 2 classes at least: write classes.txt next to the "
                "shards or pass num_classes"
            )

    @property
    def classes_named(self) -> bool:
        """Whether the class names say what the classes are (from ``classes.txt`` or the classes
        option), rather than ``class_<i>`` made up from a number of classes."""
        return self.classes_from == "the classes option" or self.classes_from.endswith("classes.txt")

    def _find_classes(self, classes: Sequence[str] | None, num_classes: int | None) -> tuple[list[str], str]:
        if classes is not None:
            return list(classes), "the classes option"
        listing = self.shards[0].parent / "classes.txt"
        if listing.is_file():
            names = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
            if not names:
                raise DataError(f"{listing}: empty")
            return names, str(listing)
        if num_classes is not None:
            return [f"class_{i}" for i in range(num_classes)], "the num_classes option"
        _, top = scan_shard(self.shards[0], read_labels=True)
        if top < 0:
            raise DataError(f"{self.shards[0]}: no .cls labels found; write classes.txt next to it or pass num_classes")
        return [f"class_{i}" for i in range(top + 1)], f"the largest label in {self.shards[0]}"

    def __len__(self) -> int:
        if self.num_samples is None:
            counted = sum(scan_shard(path)[0] for path in self.shards)
            if counted == 0:
                raise DataError(f"{self.name}: no samples with an image and a .cls in {len(self.shards)} shards")
            self.num_samples = counted
        return self.num_samples

    def epoch_batches(self, plan: BatchPlan, num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of decoded batches; see the module docstring for how the plan is streamed.

        Args:
            plan: the epoch's batches for this rank.
            num_workers: decoding processes (0: decode in this process); the order does not
                depend on it.

        Returns:
            An iterator of (uint8 images (B, C, H, W), int64 labels (B,)), this rank's share of
            each global batch from ``plan.start_batch`` on. Samples without an image or a
            readable ``.cls``, images that fail to decode and damaged shards are left out and
            counted in ``skips``.

        Raises:
            DataError: at once, fewer shards than ranks, or (without ``num_samples``) no
                samples to count in the shards; while iterating, a label outside the classes,
                an image whose values are outside the range of its format, or a rank whose
                shards hold no readable sample.
        """
        if len(self.shards) < plan.world_size:
            raise DataError(f"{self.name}: {len(self.shards)} shards cannot be split among {plan.world_size} ranks")
        sizes = plan.local_sizes(len(self))  # this rank's share of every global batch (the last may be short)
        stream = _repeated(self._rank_stream(plan), plan.repeats)
        return self.decode_batches(_cut(stream, sizes, plan.start_batch), num_workers, keep_empty=plan.world_size > 1)

    def _rank_stream(self, plan: BatchPlan) -> Iterator[Item]:
        """This rank's samples for the epoch, endless: the shards are started over when done."""
        shuffle, seed, epoch, rank = plan.shuffle, plan.seed, plan.epoch, plan.rank
        order = epoch_order(len(self.shards), shuffle, seed, epoch)  # the shards once each, whatever the repeats
        mine = [self.shards[i] for i in order.tolist()][rank :: plan.world_size]
        for pass_index in itertools.count():
            rng = random.Random(f"{seed}/{epoch}/{rank}/{pass_index}")
            shards = rng.sample(mine, len(mine)) if shuffle and pass_index else mine
            items = (item for path in shards for item in self._items(path))
            if shuffle and self.shuffle_buffer > 1:
                items = _shuffle_buffer(items, self.shuffle_buffer, rng)
            empty = True
            for item in items:
                empty = False
                yield item
            if empty:
                raise DataError(f"{self.name}: rank {rank} found no readable samples in {', '.join(map(str, mine))}")

    def _damaged(self, problem: str) -> None:
        """A shard that is damaged or cut short (``problem`` names it and where): counted with the
        skipped samples, and said once, as a warning of its own, the first time a run reads it,
        for the samples after the damage are lost on every pass, not one image."""
        self.skips.add(problem)
        if problem not in self._warned:
            self._warned.add(problem)
            log.warning("warning: shard %s", problem)

    def _items(self, path: Path) -> Iterator[Item]:
        """(image bytes, label, name) for each well-formed sample of one shard."""
        for sample in self._read(path, self._damaged):
            name = f"{path}:{sample['__key__']}"
            image = next((sample[s] for s in IMAGE_SUFFIXES if s in sample), None)
            if image is None or "cls" not in sample:
                self.skips.add(f"{name} (no {'image' if image is None else '.cls'})")
                continue
            try:
                label = int(sample["cls"].decode("ascii").strip())
            except (UnicodeDecodeError, ValueError):
                self.skips.add(f"{name} (.cls is not an integer: {sample['cls'][:20]!r})")
                continue
            if not 0 <= label < len(self.classes):
                raise DataError(
                    f"{name}: class {label}, but there are {len(self.classes)} classes (from {self.classes_from}); "
                    "write classes.txt next to the shards or pass num_classes"
                )
            yield image, label, name


__all__ = ["MAX_SHARD_NAMES", "ShardDataset", "brace_count", "expand_braces", "scan_shard", "shard_paths"]
