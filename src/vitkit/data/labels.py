"""Labels files: a CSV or JSON-lines file that names each image and its labels.

A CSV file has a header with the columns ``path`` and ``labels`` (others are ignored); a JSON-lines
file (``.jsonl``) has one object a line with the same keys (``labels`` a string or a list of
strings). Several labels are separated by spaces::

    path,labels
    photos/001.jpg,cat
    photos/002.jpg,cat dog

Paths are relative to the file's folder (absolute ones are kept). The classes are the labels of
the training file, sorted. A file where a row has several labels is multi-label: its batches carry
multi-hot rows (B, K) float instead of class indices (B,). Images are decoded while the epoch runs,
as an image folder's are (:class:`~vitkit.data.folder.FileImages`).

Every problem of a file is one :class:`~vitkit.errors.DataError` naming the file and the line: a
missing column, a malformed row, a row without labels, an image that does not exist, a label of a
validation file that the training file does not have.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch

from ..errors import DataError
from .folder import FileImages

SUFFIXES = (".csv", ".jsonl")
MAX_ROWS = 50_000_000


def is_labels_file(spec: str) -> bool:
    """Whether a ``--data`` value names a labels file (an existing ``.csv`` or ``.jsonl`` file).

    Args:
        spec: a ``--data`` value.

    Returns:
        True when it ends in ``.csv`` or ``.jsonl`` (any case) and is an existing file; its
        contents are not read.
    """
    return spec.lower().endswith(SUFFIXES) and os.path.isfile(spec)


def _csv_rows(path: Path) -> list[tuple[int, str, list[str]]]:
    rows = []
    # utf-8-sig: a byte-order mark (what spreadsheets write as "CSV UTF-8") is not part of the header
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty; expected a header line with the columns path and labels")
        names = [h.strip().lower() for h in header]
        missing = [c for c in ("path", "labels") if c not in names]
        if missing:
            raise DataError(f"{path} line 1: no column {' or '.join(missing)} in the header ({', '.join(header)})")
        ip, il = names.index("path"), names.index("labels")
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            if len(row) != len(names):
                raise DataError(f"{path} line {line}: {len(row)} fields where the header has {len(names)}")
            rows.append((line, row[ip].strip(), row[il].split()))
    return rows


def _jsonl_rows(path: Path) -> list[tuple[int, str, list[str]]]:
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except (json.JSONDecodeError, RecursionError):
                raise DataError(f"{path} line {line}: not a JSON object") from None
            if not isinstance(rec, dict) or "path" not in rec or "labels" not in rec:
                raise DataError(f"{path} line {line}: expected an object with the keys path and labels")
            labels = rec["labels"]
            if isinstance(labels, str):
                labels = labels.split()
            if not isinstance(rec["path"], str) or not (
                isinstance(labels, list) and all(isinstance(x, str) and x and not x.isspace() for x in labels)
            ):
                raise DataError(f"{path} line {line}: path must be a string and labels a string or a list of strings")
            rows.append((line, rec["path"].strip(), [x.strip() for x in labels]))
    return rows


def read_labels_file(path: str | Path) -> list[tuple[int, str, list[str]]]:
    """The rows of a labels file: (line number, image path resolved against the file's folder,
    labels), each checked.

    Args:
        path: a ``.csv`` or ``.jsonl`` file.

    Returns:
        The rows, in file order.

    Raises:
        DataError: the file cannot be read, or a row is malformed, has no labels or names an
            image that does not exist (one line naming the file and line).
    """
    path = Path(path)
    try:
        rows = _jsonl_rows(path) if path.suffix.lower() == ".jsonl" else _csv_rows(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read the labels file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except csv.Error as e:
        raise DataError(f"{path}: not a CSV file ({e})") from None
    if not rows:
        raise DataError(f"{path}: no rows of images")
    if len(rows) > MAX_ROWS:
        raise DataError(f"{path}: {len(rows)} rows, more than {MAX_ROWS}")
    out = []
    for line, rel, labels in rows:
        if not rel:
            raise DataError(f"{path} line {line}: no image path")
        if not labels:
            raise DataError(f"{path} line {line}: {rel} has no labels")
        full = rel if os.path.isabs(rel) else str(path.parent / rel)
        if not os.path.isfile(full):
            raise DataError(f"{path} line {line}: {full} does not exist")
        out.append((line, full, labels))
    return out


class LabelsFile(FileImages):
    """The images of a labels file, decoded with Pillow to ``load_size`` (H, W) uint8.

    Args:
        path: the ``.csv`` or ``.jsonl`` file.
        split: what to call it ("train", "val"...), in its name.
        classes: the class names (a validation file takes the training file's); None: the
            labels of this file, sorted.
        multilabel: whether batches carry multi-hot rows; None: whether a row has several labels.
        load_size: (H, W) or N the images are decoded to.
        resize: "shorter" (scale the shorter side, crop the centre) or "plain".
        mode: "RGB" or "L".

    Labels: class indices (B,) int64 for a single-label file, multi-hot rows (B, K) float32 for a
    multi-label one; :attr:`label_rows` holds every image's row either way (a multi-label minival is
    carved from them, every label counted: :func:`vitkit.data.carve.multilabel_minival`), and
    :attr:`strata` the class each image counts as when a training subset is carved (its rarest
    label; also :attr:`labels` of a multi-label file).
    """

    def __init__(
        self,
        path: str | Path,
        split: str = "train",
        *,
        classes: list[str] | None = None,
        multilabel: bool | None = None,
        load_size: int | tuple[int, int] = 256,
        resize: str = "shorter",
        mode: str = "RGB",
    ) -> None:
        path = Path(path)
        super().__init__(load_size, mode, resize, name=f"{path.name}/{split}")
        self.path = path
        rows = read_labels_file(path)
        found = sorted({x for _, _, labels in rows for x in labels})
        if classes is None:
            if len(found) < 2:
                raise DataError(f"{path}: one class ({', '.join(found)}); a classifier needs 2 classes at least")
            classes = found
        index = {name: i for i, name in enumerate(classes)}
        for line, _, labels in rows:
            unknown = [x for x in labels if x not in index]
            if unknown:
                raise DataError(
                    f"{path} line {line}: label {unknown[0]!r} is not a class of the training file "
                    f"({', '.join(classes[:8])}{' ...' if len(classes) > 8 else ''})"
                )
        self.classes = list(classes)
        self.multilabel = any(len(set(labels)) > 1 for _, _, labels in rows) if multilabel is None else multilabel
        if not self.multilabel:
            several = next(((line, labels) for line, _, labels in rows if len(set(labels)) > 1), None)
            if several is not None:
                raise DataError(
                    f"{path} line {several[0]}: {len(set(several[1]))} labels ({', '.join(several[1])}) "
                    "in a single-label dataset (each image takes one class here)"
                )
        k = len(self.classes)
        targets = torch.zeros(len(rows), k)
        for i, (_, _, labels) in enumerate(rows):
            targets[i, [index[x] for x in labels]] = 1.0
        self._rows = targets  # (N, K) multi-hot, in file order
        counts = targets.sum(0)
        # the class each image counts as when a training subset is carved: its rarest label
        rarest = [min((index[x] for x in labels), key=lambda c: (counts[c], c)) for _, _, labels in rows]
        if self.multilabel:
            self.samples = [(full, i) for i, (_, full, _) in enumerate(rows)]
            self._strata = rarest
        else:
            self.samples = [(full, index[labels[0]]) for _, full, labels in rows]

    @property
    def labels(self) -> torch.Tensor:
        """The class of every image (a multi-label file: its rarest label), in the order of :attr:`samples`."""
        return self.strata

    @property
    def strata(self) -> torch.Tensor:
        """The class each image counts as when a subset is carved (a single-label minival too)."""
        if not self.multilabel:
            return torch.tensor([label for _, label in self.samples], dtype=torch.int64)
        return torch.tensor([self._strata[i] for _, i in self.samples], dtype=torch.int64)

    @property
    def label_rows(self) -> torch.Tensor:
        """The multi-hot row (N, K) of every image, in the order of :attr:`samples`."""
        if not self.multilabel:
            return torch.nn.functional.one_hot(self.strata, self.num_classes).float()
        return self._rows[[i for _, i in self.samples]]

    def targets_of(self, labels: torch.Tensor) -> torch.Tensor:
        """A multi-label file's batches: the multi-hot rows of the images (B, K).

        Args:
            labels: the int64 labels (B,) of a batch, as :attr:`samples` holds them: class
                indices for a single-label file, row numbers of the file for a multi-label one.

        Returns:
            float32 multi-hot rows (B, K) for a multi-label file; ``labels`` itself otherwise.
        """
        return self._rows[labels] if self.multilabel else labels


__all__ = ["SUFFIXES", "LabelsFile", "is_labels_file", "read_labels_file"]
