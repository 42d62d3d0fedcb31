"""Embeddings of a folder of images: one vector per image, or its patch tokens, in a file.

:func:`embed_folder` walks a folder for image files, reads them with the model's own preprocessing
(``model.preprocessing``: value range, resolution, crop and interpolation, as
:func:`vitkit.load_images` prepares them), runs the model in batches and writes the result to a
``.safetensors`` file (or ``.parquet`` with pyarrow): a tensor ``embeddings`` of (N, D), or
(N, tokens, D) for patch tokens, float32, whose rows follow the image paths stored in the
metadata. :func:`read_embeddings` reads it back, and :func:`labelled_embeddings` turns a train and
a test file into the features and labels that few-shot and probe evaluation take: the label of
an image is the first folder of its path (``FOLDER/<class>/...``).

What one vector is (``pool``):

- ``"cls"``: the class token after the final LayerNorm;
- ``"pooled"``: the model's own pre-logits, what its head reads (``forward_head(...,
  pre_logits=True)``: the class token, the mean of the patch tokens, attention pooling, or the
  mean of the class and distillation tokens, after the pre-logits layer when there is one);
- ``"patch"``: the patch tokens after the final LayerNorm, (tokens, D): the prefix tokens
  (class, distillation, registers: ``model.num_prefix_tokens``) left out. A ResNet's final
  feature map gives its positions in raster order.

Files are read folder by folder, files before sub-folders, each sorted by name (the order of
:class:`vitkit.data.ImageFolder`). A file that cannot be read (damaged, truncated, not an image,
a decompression bomb, values outside its format's range) is skipped, and listed with the reason
in the result and in the file's metadata (``skipped``).

Writing is resumable: each finished batch is written at once to ``OUT.parts/NNNNN.safetensors``
(atomically, with the paths it holds); a later call with the same model, arguments and folder
reads those parts back instead of computing them again, and refuses parts of another model, pool,
preprocessing, precision, batch size or file list. The complete file is assembled from the parts,
one at a time, written atomically, and the parts are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from ..checkpoint.io import CHECKSUM_KEY, read_safetensors, read_safetensors_metadata, write_safetensors
from ..checkpoint.values import printable
from ..data.folder import IMAGE_EXTENSIONS
from ..errors import CheckpointError, DataError, UsageError
from ..files import atomic_write, temporary_target, write_json
from ..models.naflex import NaflexBatch, collate, fit_grid, forward_naflex, naflex_features, naflex_patch
from ..precision import Precision, PrecisionLike, as_precision
from ..preprocessing import Preprocessing, prepare_images, read_image
from .features import model_preprocessing

Pool = Literal["cls", "pooled", "patch"]
POOLS = ("cls", "pooled", "patch")
FORMAT = "vitkit.embeddings"
FORMAT_VERSION = "1"
TENSOR = "embeddings"
SUFFIXES = (".safetensors", ".parquet")
MAX_PATHS_JSON = 64 << 20  # the paths are kept in the safetensors header, which readers cap at 100 MB
_MANIFEST = "run.json"
Batch = tuple[torch.Tensor, list[str], list[tuple[str, str]]]  # vectors, their paths, (path, why) skipped
_JSON_KEYS = ("config", "preprocessing", "paths", "skipped", "shape")  # metadata stored as JSON; the rest is text


@dataclass
class Embeddings:
    """Embeddings of the images of a folder: what :func:`read_embeddings` returns.

    Attributes:
        vectors: the embeddings, float32: (N, D), or (N, tokens, D) for the "patch" pool; None
            when they were only written to a file.
        paths: the image of each row, relative to the folder, "/"-separated.
        skipped: (path, why) of each file that could not be read.
        metadata: what made them: the model, its weights' SHA-256, the pool, the preprocessing,
            the precision, the folder...
        file: where they were read from or written to, if anywhere.
    """

    vectors: torch.Tensor | None  # (N, D) or (N, tokens, D) float32; None when only written to a file
    paths: list[str]  # one per row, relative to the folder, "/"-separated
    skipped: list[tuple[str, str]]  # (path, why) of each file that could not be read
    metadata: dict[str, Any]  # model, weights_sha256, pool, preprocessing, precision, folder...
    file: Path | None = None  # where they were read from or written to

    @property
    def pool(self) -> str:
        """Which vectors they are: "cls", "pooled" or "patch" ("" when the metadata does not say)."""
        return str(self.metadata.get("pool", ""))

    @property
    def model(self) -> str:
        """The name of the model that made them ("" when the metadata does not say)."""
        return str(self.metadata.get("model", ""))


@dataclass
class EmbeddingResult(Embeddings):
    """What :func:`embed_folder` returns: the embeddings, and how many batches were computed and
    how many read back from the parts of an earlier, interrupted call.

    Attributes:
        vectors: the embeddings, float32: (N, D), or (N, tokens, D) for the "patch" pool; None
            when they were only written to a file.
        paths: the image of each row, relative to the folder, "/"-separated.
        skipped: (path, why) of each file that could not be read.
        metadata: what made them: the model, its weights' SHA-256, the pool, the preprocessing,
            the precision, the folder...
        file: where they were read from or written to, if anywhere.
        computed_batches: the batches computed by this call.
        reused_batches: the batches read back from an earlier, interrupted call's parts.
    """

    computed_batches: int = 0
    reused_batches: int = 0


# ----------------------------------------------------------------------------------------------
# The files of a folder


def image_files(folder: str | Path) -> list[str]:
    """The image files under ``folder``, at any depth, relative to it ("/"-separated).

    Args:
        folder: the folder to walk. Hidden files and folders (a leading ".") are left out.

    Returns:
        The paths, folder by folder (files before sub-folders, each sorted by name), with the
        suffixes of :data:`vitkit.data.folder.IMAGE_EXTENSIONS`.

    Raises:
        DataError: ``folder`` is not a folder, a folder under it cannot be listed, or it holds
            no image file.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder" if root.exists() else f"{root}: no such folder")

    def refuse(e: OSError) -> None:
        raise DataError(f"{e.filename}: cannot list the folder ({e.strerror})")

    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=refuse):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(root)
        for name in sorted(filenames):
            if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS):
                found.append((rel / name).as_posix())
    if not found:
        raise DataError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in it or its sub-folders")
    return found


# ----------------------------------------------------------------------------------------------
# What one image becomes


def pool_function(model: nn.Module, pool: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function from a preprocessed batch (B, C, H, W) to its embeddings under ``pool``.

    Args:
        model: a vitkit model (``forward_features`` and ``forward_head``).
        pool: "cls", "pooled" or "patch" (see the module doc).

    Returns:
        The function: (B, D) for "cls" and "pooled", (B, tokens, D) for "patch".

    Raises:
        UsageError: an unknown pool, or "cls" for a model without a class token.
    """
    if pool == "pooled":

        def pooled(x: torch.Tensor | NaflexBatch) -> torch.Tensor:
            if isinstance(x, NaflexBatch):
                return forward_naflex(model, x, pre_logits=True)
            if (whole := getattr(model, "forward_pre_logits", None)) is not None:
                return whole(x)  # an inference runtime's model: the representation in one call
            return model.forward_head(model.forward_features(x), pre_logits=True)

        return pooled
    if pool == "cls":
        if getattr(model, "cls_token", None) is None:
            how = getattr(getattr(model, "cfg", None), "classifier", type(model).__name__)
            raise UsageError(f"the model has no class token (it pools by {how}); use --pool pooled or patch")

        def cls(x: torch.Tensor | NaflexBatch) -> torch.Tensor:
            if isinstance(x, NaflexBatch):
                return naflex_features(model, x)[0][:, 0]
            return model.forward_features(x)[:, 0]  # (B, D)

        return cls
    if pool == "patch":
        prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)

        def patches(x: torch.Tensor) -> torch.Tensor:
            tokens = model.forward_features(x)
            if tokens.ndim == 4:  # a ResNet's map (B, C, h, w) -> (B, h*w, C), raster order
                return tokens.flatten(2).transpose(1, 2)
            return tokens[:, prefix:]  # (B, N, D): class, distillation and register tokens left out

        return patches
    raise UsageError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")


def head_predictions(model: nn.Module, pooled: torch.Tensor) -> torch.Tensor | None:
    """The class the model predicts from its pooled embeddings (pool "pooled", what the head
    reads): the head applied to them, argmax.

    Args:
        model: a vitkit model.
        pooled: its pre-logits (N, F), as :func:`pool_function` makes them for "pooled".

    Returns:
        (N,) int64 class indices; None for a model without a head, or one whose prediction is not
        a function of the pooled vector alone (a distillation token's second head).

    Raises:
        UsageError: vectors whose width the head does not take.
    """
    if not _has_head(model):
        return None
    head = model.head
    width = getattr(head, "in_features", None)
    if width is not None and (pooled.ndim != 2 or pooled.shape[1] != width):
        raise UsageError(f"pooled vectors of shape {tuple(pooled.shape)}; the head takes {width} values")
    param = next(head.parameters(), None)
    x = pooled.to(param.device, param.dtype) if param is not None else pooled
    with torch.inference_mode():
        return head(x).argmax(dim=-1).cpu()


def model_digest(model: nn.Module) -> str:
    """The SHA-256 of a model's weights (names, dtypes, shapes and bytes of its state dict), so
    that embeddings name the exact weights that made them.

    Args:
        model: any module.

    Returns:
        64 hex digits.
    """
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{list(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _model_name(model: nn.Module) -> str:
    report = getattr(model, "load_report", None)
    if report is not None:
        return str(report.name or report.path)
    return type(model).__name__


def _config(model: nn.Module) -> dict[str, Any] | None:
    cfg = getattr(model, "cfg", None)
    return asdict(cfg) if is_dataclass(cfg) and not isinstance(cfg, type) else None


def _read_one(folder: Path, rel: str, pre: Preprocessing, in_chans: int, patch: int = 0) -> torch.Tensor | str:
    """One file as the model takes it, (C, H, W) (NaFlex, ``patch`` > 0: at its grid's size), or why
    it could not be read."""
    full = folder / rel
    try:
        image = read_image(full)
        if pre.naflex:  # whole, at its own aspect ratio: the largest grid of patches the budget allows
            rows, cols = fit_grid(image.size[1], image.size[0], patch, pre.naflex)
            grid_pre = dataclasses.replace(pre, img_size=(rows * patch, cols * patch))
            return prepare_images([(rel, image)], grid_pre, in_chans).inputs[0]
        return prepare_images([(rel, image)], pre, in_chans).inputs[0]
    except DataError as e:
        text = str(e)
        return text[len(str(full)) + 2 :] if text.startswith(f"{full}: ") else text


# ----------------------------------------------------------------------------------------------
# Parts: the finished batches of a run, on disk


@dataclass
class _Run:
    """What one call of :func:`embed_folder` computes, and how."""

    model: nn.Module
    folder: Path
    files: list[str]
    pool: str
    pre: Preprocessing
    in_chans: int
    batch_size: int
    device: torch.device
    precision: Precision
    metadata: dict[str, Any]  # what the file's metadata says of the run
    key: dict[str, Any]  # what must be the same for parts of an earlier call to be used
    patch: int = 0  # NaFlex's patch side (pre.naflex set); 0: squares

    @property
    def served(self) -> bool:
        """Whether a bf16 serving copy computes the run (:func:`_served`), not autocast."""
        return _serves_bf16(self.precision, self.device)

    def chunks(self) -> Iterator[tuple[int, list[str]]]:
        for i, start in enumerate(range(0, len(self.files), self.batch_size)):
            yield i, self.files[start : start + self.batch_size]


class _Parts:
    """``OUT.parts/``: one safetensors file per finished batch and ``run.json``, the key of the run."""

    def __init__(self, out: Path, key: dict[str, Any]) -> None:
        self.dir = out.with_name(out.name + ".parts")
        self.key = key
        self.key_sha256 = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    def open(self) -> None:
        """Check that parts left here belong to this run (or start the folder)."""
        manifest = self.dir / _MANIFEST
        if manifest.is_file():
            try:
                stored = json.loads(manifest.read_text())["key"]
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                raise UsageError(f"{manifest}: damaged; remove {self.dir} to start again") from None
            _same_run(stored, self.key, self.dir)
        elif self.dir.is_dir() and any(_part_index(p.name) is not None for p in self.dir.iterdir()):
            raise UsageError(f"{self.dir}: parts without {_MANIFEST}, not of this run; remove the folder")
        elif self.dir.exists() and not self.dir.is_dir():
            raise UsageError(f"{self.dir}: a file where the folder of finished batches goes; remove it")
        else:
            write_json(manifest, {"format": f"{FORMAT}.parts", "key": self.key})
        for p in self.dir.iterdir():  # what a killed write left behind
            if temporary_target(p.name) is not None:
                p.unlink(missing_ok=True)

    def path(self, index: int) -> Path:
        return self.dir / f"{index:05d}.safetensors"

    def load(self, index: int, chunk: list[str]) -> Batch | None:
        """Part ``index`` if it is there, whole, and holds exactly ``chunk``; else None."""
        p = self.path(index)
        if not p.is_file():
            return None
        try:
            tensors, meta = read_safetensors(p)
            paths, skipped = json.loads(meta["paths"]), [tuple(s) for s in json.loads(meta["skipped"])]
            unread = {path for path, _ in skipped}
        except (CheckpointError, KeyError, ValueError, TypeError, RecursionError):
            return None  # damaged: computed again
        if meta.get("run") != self.key_sha256 or paths != [c for c in chunk if c not in unread]:
            return None
        if len(paths) + len(skipped) != len(chunk):
            return None
        return tensors[TENSOR], paths, skipped

    def write(self, index: int, vectors: torch.Tensor, paths: list[str], skipped: list[tuple[str, str]]) -> None:
        meta = {"paths": json.dumps(paths), "skipped": json.dumps(skipped), "run": self.key_sha256}
        write_safetensors(self.path(index), {TENSOR: vectors}, meta)

    def remove(self, count: int) -> None:
        for i in range(count):
            self.path(i).unlink(missing_ok=True)
        (self.dir / _MANIFEST).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # something else was put there: left as it is
            self.dir.rmdir()


def _part_index(name: str) -> int | None:
    stem, dot, suffix = name.partition(".")
    return int(stem) if stem.isdigit() and dot and suffix == "safetensors" else None


def _same_run(stored: dict[str, Any], key: dict[str, Any], folder: Path) -> None:
    """Refuse, in one line, parts made by another model, with other arguments or of other files."""
    again = f"remove {folder} to start again"
    if stored.get("weights_sha256") != key["weights_sha256"]:
        raise UsageError(f"{folder}: batches of another model (other weights); give the same model, or {again}")
    if stored.get("files_sha256") != key["files_sha256"]:
        raise UsageError(
            f"{folder}: batches of another list of files ({stored.get('files')} files then, {key['files']} now: "
            f"the folder changed); {again}"
        )
    for name in ("pool", "preprocessing", "precision", "computed_by", "batch_size"):
        if stored.get(name) != key[name]:
            was = json.dumps(stored.get(name))
            raise UsageError(f"{folder}: batches computed with {name} {was}, not {json.dumps(key[name])}; {again}")


# ----------------------------------------------------------------------------------------------
# The loop


def embed_folder(
    model: nn.Module,
    folder: str | Path,
    pool: Pool = "pooled",
    batch_size: int = 64,
    out: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    precision: PrecisionLike = "fp32",
    files: Sequence[str] | None = None,
    workers: int = 0,
    progress: Callable[[int], None] | None = None,
    runner: nn.Module | None = None,
    naflex: int | None = None,
) -> EmbeddingResult:
    """Embed every image file under ``folder`` with ``model`` (see the module doc).

    Args:
        model: a vitkit model; it is put in eval mode, moved to ``device`` and left there.
        folder: the folder to walk, at any depth.
        pool: "cls", "pooled" (the model's pre-logits) or "patch".
        batch_size: images per forward pass, and per part written.
        out: a ``.safetensors`` (or, with pyarrow, ``.parquet``) file to write; its folder must
            exist. Finished batches go to ``OUT.parts/`` first, so that a call interrupted (even
            killed) and made again computes only the batches not yet written. None: nothing is
            written and the vectors are returned.
        device: where the model runs.
        precision: a :class:`~vitkit.precision.Precision`, or "fp32", "bf16" or "auto"
            (:func:`vitkit.precision.resolve_precision`). bf16 on
            the CPU computes with a copy of the model prepared for serving in bf16
            (:func:`vitkit.inference.prepare_inference`, faster than autocast); elsewhere, autocast.
        files: the images to embed, relative to ``folder`` (default: :func:`image_files`).
        workers: threads that decode images while others wait (0: decode in this thread).
        progress: called with the number of images of each batch, computed or read back.
        runner: what computes the embeddings instead of ``model`` (a
            :class:`vitkit.backends.RuntimeModel`, which carries its own precision); None: ``model``
            as ``precision`` says.
        naflex: see each image whole at its own aspect ratio, in at most this many patches
            (NaFlex); None: as the model's ``preprocessing.naflex`` says; 0: resized to its size.

    Returns:
        An :class:`EmbeddingResult`. Its ``vectors`` are None when ``out`` is given (the file
        holds them: :func:`read_embeddings`), so a folder larger than memory can be embedded.

    Raises:
        UsageError: a bad pool, batch size or output path; parts of another run at ``OUT.parts``.
        DataError: a folder without images, or of which no image could be read.
    """
    if batch_size < 1:
        raise UsageError(f"batch_size must be positive, got {batch_size}")
    out_path = check_output(out)
    pool_fn = pool_function(model, pool)
    dev = torch.device(device)
    listed = list(files) if files is not None else None
    run = _prepare_run(model, Path(folder), listed, pool, batch_size, dev, as_precision(precision, dev), naflex)
    if run.pre.naflex and (pool == "patch" or runner is not None):
        what = "--pool patch (each image has its own number of patches)" if pool == "patch" else "a runtime"
        raise UsageError(f"NaFlex embeddings cannot be computed with {what}; embed with squares (naflex 0)")
    if runner is not None:  # it carries its precision (no autocast); batches of another backend are not reused
        run = dataclasses.replace(run, precision=Precision("fp32", "fp32", f"computed by {runner.backend}"))
        run.key["computed_by"] = run.metadata["backend"] = f"{runner.backend} {runner.precision}"
    parts = _Parts(out_path, run.key) if out_path is not None else None
    if parts is not None:
        parts.open()
    was_training = model.training
    model.eval().to(run.device)
    net = runner if runner is not None else _served(model, run)
    if net is not model:
        pool_fn = pool_function(net, pool)
    with contextlib.ExitStack() as stack:
        stack.callback(model.train, was_training)
        threads = None
        if workers > 0:
            threads = stack.enter_context(ThreadPoolExecutor(workers))
            stack.enter_context(_bomb_guard())
        kept, computed, reused = _run_batches(run, parts, pool_fn, threads, progress)
    del net
    result = _finish(run, parts, out_path, kept)
    result.computed_batches, result.reused_batches = computed, reused
    return result


def _serves_bf16(precision: Precision, device: torch.device) -> bool:
    """bf16 on the CPU is computed by a serving copy of the model (:func:`_served`)."""
    return precision.bf16 and device.type == "cpu"


def _served(model: nn.Module, run: _Run) -> nn.Module:
    """What computes the run: for bf16 on the CPU, a copy of ``model`` prepared for serving
    (:func:`vitkit.inference.prepare_inference`: bf16 weights cast once, linear layers packed
    where faster), which is faster than autocast; otherwise ``model`` itself."""
    if not run.served:
        return model
    from ..inference import prepare_inference

    return prepare_inference(model, "bf16")


@contextlib.contextmanager
def _bomb_guard() -> Iterator[None]:
    """Keep Pillow's decompression-bomb warning an error while threads decode:
    :func:`vitkit.preprocessing.read_image` makes it one for each file, but the warning filters are
    one global list, which threads save and restore over one another."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        yield


def _run_batches(
    run: _Run,
    parts: _Parts | None,
    pool_fn: Callable[[torch.Tensor], torch.Tensor],
    threads: ThreadPoolExecutor | None,
    progress: Callable[[int], None] | None,
) -> tuple[list[Batch], int, int]:
    """Every batch, computed or read back from ``parts``: (the batches when nothing is written,
    how many were computed, how many read back)."""
    kept: list[Batch] = []
    computed = reused = 0
    for index, chunk in run.chunks():
        batch = parts.load(index, chunk) if parts is not None else None
        if batch is None:
            batch = _embed_batch(run, chunk, pool_fn, threads)
            computed += 1
            if parts is not None:
                parts.write(index, *batch)
        else:
            reused += 1
        if parts is None:
            kept.append(batch)
        if progress is not None:
            progress(len(chunk))
    return kept, computed, reused


def check_output(out: str | Path | None) -> Path | None:
    """Check, before any work, that embeddings can be written to ``out``.

    Args:
        out: the file to write, or None (nothing is written).

    Returns:
        ``out`` as a path, or None.

    Raises:
        UsageError: a suffix other than .safetensors or .parquet, .parquet without pyarrow, a
            folder that does not exist, a folder where the file goes, or an existing file that
            is not an embeddings file (a model's weights, say), which is never overwritten.
    """
    if out is None:
        return None
    path = Path(out)
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(f"{path}: embeddings are written as {' or '.join(SUFFIXES)}; name the file so")
    if path.suffix.lower() == ".parquet":
        _pyarrow(path)
    if not path.parent.is_dir():
        raise UsageError(f"{path}: the folder {path.parent} does not exist; create it first")
    if path.is_dir():
        raise UsageError(f"{path}: a folder; give a file name")
    if path.is_file() and not _is_embeddings_file(path):
        raise UsageError(
            f"{path}: exists and is not an embeddings file of vitkit embed; it is not overwritten: give another --out"
        )
    return path


def _is_embeddings_file(path: Path) -> bool:
    """Whether ``path``'s header says vitkit embed wrote it (the header only: nothing else is read)."""
    if path.stat().st_size == 0:
        return True  # an empty file (touched, or torn before its header): nothing to lose
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            raw = pq.read_schema(path).metadata or {}
            return raw.get(b"format", b"").decode(errors="replace") == FORMAT
        return read_safetensors_metadata(path).get("format") == FORMAT
    except (CheckpointError, OSError, ValueError):
        return False


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UsageError(
            f"{path}: .parquet embeddings need pyarrow: pip install pyarrow (or use .safetensors)"
        ) from None
    return pyarrow


def _prepare_run(
    model: nn.Module,
    folder: Path,
    files: list[str] | None,
    pool: str,
    batch_size: int,
    device: torch.device,
    precision: Precision,
    naflex: int | None = None,
) -> _Run:
    """The run's files, preprocessing (NaFlex's budget in it), metadata and key."""
    files = image_files(folder) if files is None else files
    if not files:
        raise DataError(f"{folder}: no image files to embed")
    listing = json.dumps(files)
    if len(listing) > MAX_PATHS_JSON:
        raise UsageError(
            f"{folder}: {len(files):,} files, more paths than one embeddings file holds; embed its sub-folders apart"
        )
    pre = model_preprocessing(model)
    naflex = pre.naflex if naflex is None else naflex or None
    pre = dataclasses.replace(pre, naflex=naflex)
    patch = naflex_patch(model) if naflex else 0
    cfg = getattr(model, "cfg", None)
    in_chans = int(getattr(cfg, "in_chans", len(pre.mean)))
    digest = model_digest(model)
    key = {
        "weights_sha256": digest,
        "pool": pool,
        "preprocessing": pre.to_dict(),
        "precision": precision.name,
        "computed_by": "bf16 weights"
        if _serves_bf16(precision, device)
        else ("bf16 autocast" if precision.bf16 else precision.name),
        "batch_size": batch_size,
        "files": len(files),
        "files_sha256": hashlib.sha256(listing.encode()).hexdigest(),
    }
    report = getattr(model, "load_report", None)
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": _model_name(model),
        "source": getattr(report, "source", None),
        "weights_sha256": digest,
        "config": _config(model),
        "pool": pool,
        "preprocessing": pre.to_dict(),
        "precision": precision.name,
        "folder": str(folder.resolve()),
    }
    return _Run(model, folder, files, pool, pre, in_chans, batch_size, device, precision, metadata, key, patch)


def _embed_batch(
    run: _Run, chunk: list[str], pool_fn: Callable[[torch.Tensor], torch.Tensor], threads: ThreadPoolExecutor | None
) -> Batch:
    """One batch of files -> (vectors of the readable ones, their paths, (path, why) of the others)."""

    def read(rel: str) -> torch.Tensor | str:
        return _read_one(run.folder, rel, run.pre, run.in_chans, run.patch)

    loaded = list(threads.map(read, chunk) if threads is not None else map(read, chunk))
    paths = [rel for rel, x in zip(chunk, loaded) if isinstance(x, torch.Tensor)]
    skipped = [(rel, x) for rel, x in zip(chunk, loaded) if isinstance(x, str)]
    if not paths:
        return torch.empty(0), paths, skipped
    images = [t for t in loaded if isinstance(t, torch.Tensor)]
    if run.pre.naflex:  # each at its own grid, padded to the longest
        x = collate(images, run.patch, run.pre.naflex, fitted=True).to(run.device)
    else:
        x = torch.stack(images).to(run.device)  # (B, C, H, W)
    with torch.inference_mode(), contextlib.nullcontext() if run.served else run.precision.autocast(run.device):
        x = x.to(torch.bfloat16) if run.served else x  # bf16 weights (_served): bf16 inputs
        vectors = pool_fn(x).float().cpu().contiguous()  # (B, D) or (B, tokens, D)
    return vectors, paths, skipped


# ----------------------------------------------------------------------------------------------
# Assembly


def _finish(run: _Run, parts: _Parts | None, out: Path | None, kept: list[Batch]) -> EmbeddingResult:
    """The result: from the batches kept in memory, or assembled from the parts into ``out``."""
    n_batches = sum(1 for _ in run.chunks())

    def batches() -> Iterator[Batch]:
        if parts is None:
            yield from kept
            return
        for index, chunk in run.chunks():
            batch = parts.load(index, chunk)
            if batch is None:
                raise UsageError(f"{parts.path(index)}: missing or damaged while assembling {out}; run again")
            yield batch

    paths: list[str] = []
    skipped: list[tuple[str, str]] = []
    tail: tuple[int, ...] | None = None
    crc = 0  # of every row's bytes in order: the whole tensor's CRC32, from one batch at a time
    for vectors, p, s in batches():
        paths += p
        skipped += s
        if p:
            tail = tail or tuple(vectors.shape[1:])
            crc = zlib.crc32(vectors.reshape(-1).view(torch.uint8).numpy(), crc)
    meta = {**run.metadata, "shape": [len(paths), *(tail or ())], "skipped": skipped}
    if tail is None:
        if parts is not None:
            parts.remove(n_batches)
        why = "; ".join(f"{p}: {w}" for p, w in skipped[:3])
        raise DataError(f"{run.folder}: none of its {len(run.files)} image files could be read ({why})")
    if out is None or parts is None:
        return EmbeddingResult(torch.cat([v for v, p, _ in kept if p]), paths, skipped, meta)
    stored = {**meta, "paths": paths}
    if out.suffix.lower() == ".parquet":
        _write_parquet(out, batches, tail, stored, _parquet_predictor(run))
    else:
        _write_safetensors(out, lambda: (v for v, p, _ in batches() if p), (len(paths), *tail), crc, stored)
    parts.remove(n_batches)
    return EmbeddingResult(None, paths, skipped, meta, out)


def _string_metadata(meta: dict[str, Any]) -> dict[str, str]:
    """Metadata as a file stores it: text as it is, :data:`_JSON_KEYS` as JSON, None left out."""
    return {k: json.dumps(v) if k in _JSON_KEYS else str(v) for k, v in meta.items() if v is not None}


def _write_safetensors(
    out: Path, vectors: Callable[[], Iterator[torch.Tensor]], shape: tuple[int, ...], crc: int, meta: dict[str, Any]
) -> None:
    """The safetensors file of a float32 tensor of ``shape``, written from its batches one at a
    time (memory: one batch), with the CRC32 (``crc``) that
    :func:`vitkit.checkpoint.io.read_safetensors` checks."""
    nbytes = int(np.prod(shape)) * 4
    header_meta = {**_string_metadata(meta), CHECKSUM_KEY: json.dumps({TENSOR: f"{crc:08x}"}, separators=(",", ":"))}
    tensor = {"dtype": "F32", "shape": list(shape), "data_offsets": [0, nbytes]}
    header = json.dumps({"__metadata__": header_meta, TENSOR: tensor}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as safetensors writes it

    def write(f: Any) -> None:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        written = 0
        for v in vectors():
            data = v.reshape(-1).view(torch.uint8).numpy()
            f.write(data)
            written += data.size
        if written != nbytes:  # a part changed between the two passes
            raise UsageError(f"{out}: {written} bytes of embeddings where {nbytes} were expected; run again")

    atomic_write(out, write)


def _parquet_predictor(run: _Run) -> Callable[[torch.Tensor], list[str | None]]:
    """The predicted class name of each row of a batch: the head on pooled vectors; None for
    the other pools and for models without a head."""
    if run.pool != "pooled" or not _has_head(run.model):
        return lambda v: [None] * len(v)
    from .predict import class_names

    names = class_names(run.model)

    def predict(vectors: torch.Tensor) -> list[str | None]:
        found = head_predictions(run.model, vectors)
        return [None] * len(vectors) if found is None else [names[i] for i in found.tolist()]

    return predict


def _has_head(model: nn.Module) -> bool:
    return isinstance(getattr(model, "head", None), nn.Module) and getattr(model, "dist_token", None) is None


def _label(path: str) -> str | None:
    head, sep, _ = path.partition("/")
    return head if sep else None


def _write_parquet(
    out: Path,
    batches: Callable[[], Iterator[Batch]],
    tail: tuple[int, ...],
    meta: dict[str, Any],
    predict: Callable[[torch.Tensor], list[str | None]],
) -> None:
    """A parquet table of columns ``path``, ``label`` (the class folder: the first folder of the
    path, null for a file directly in the folder), ``prediction`` (the class the head predicts
    from a pooled vector, else null) and ``vector`` (each row's values flattened, float32; its
    shape in the metadata ``shape``), the other metadata in the schema's; one row group per
    batch, so memory holds one batch."""
    pa = _pyarrow(out)
    import pyarrow.parquet as pq

    width = int(np.prod(tail))
    stored = {k: v for k, v in _string_metadata(meta).items() if k != "paths"}
    columns = [("path", pa.string()), ("label", pa.string()), ("prediction", pa.string())]
    schema = pa.schema([*columns, ("vector", pa.list_(pa.float32(), width))], metadata=stored)

    def write(f: Any) -> None:
        with pq.ParquetWriter(f, schema) as writer:
            for vectors, paths, _ in batches():
                if paths:
                    flat = pa.array(vectors.reshape(-1).numpy(), type=pa.float32())  # (B * width,)
                    table = {
                        "path": pa.array(paths, pa.string()),
                        "label": pa.array([_label(p) for p in paths], pa.string()),
                        "prediction": pa.array(predict(vectors), pa.string()),
                        "vector": pa.FixedSizeListArray.from_arrays(flat, width),
                    }
                    writer.write_table(pa.table(table, schema))

    atomic_write(out, write)


# ----------------------------------------------------------------------------------------------
# Reading back


def read_embeddings(path: str | Path) -> Embeddings:
    """An embeddings file written by :func:`embed_folder` (``.safetensors`` or ``.parquet``).

    Args:
        path: the file.

    Returns:
        :class:`Embeddings` with the vectors (float32), the paths, the skipped files and the
        metadata (JSON values decoded).

    Raises:
        UsageError: a file that is missing, damaged or not an embeddings file, naming it.
    """
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such embeddings file")
    if p.suffix.lower() == ".parquet":
        vectors, meta, paths = _read_parquet(p)
    else:
        try:
            tensors, raw = read_safetensors(p)
        except CheckpointError as e:
            raise UsageError(str(e)) from None
        meta = _decoded(p, raw)
        if TENSOR not in tensors:
            raise UsageError(f"{p}: no {TENSOR!r} tensor; not an embeddings file of vitkit embed")
        vectors, paths = tensors[TENSOR].float(), meta.pop("paths", None)
    if not isinstance(paths, list) or len(paths) != vectors.shape[0] or not all(isinstance(s, str) for s in paths):
        raise UsageError(f"{p}: its paths do not match its {vectors.shape[0]} rows; write it again with vitkit embed")
    skipped = [tuple(s) for s in meta.pop("skipped", []) or []]
    return Embeddings(vectors, paths, skipped, meta, p)


def _decoded(path: Path, raw: dict[str, str]) -> dict[str, Any]:
    if raw.get("format") != FORMAT:
        raise UsageError(f"{path}: not an embeddings file of vitkit embed (no format {FORMAT!r} in its metadata)")
    meta: dict[str, Any] = {}
    for k, v in raw.items():
        if k == CHECKSUM_KEY:
            continue  # checked when the file was read
        try:
            meta[k] = json.loads(v) if k in _JSON_KEYS else v
        except (ValueError, RecursionError):
            meta[k] = v
    return meta


def _read_parquet(path: Path) -> tuple[torch.Tensor, dict[str, Any], list[str]]:
    _pyarrow(path)
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        raw = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a readable parquet file ({e})") from None
    meta = _decoded(path, raw)
    shape = meta.pop("shape", None)
    column = next((c for c in ("vector", "embedding") if c in table.column_names), None)  # "embedding": older files
    if column is None or "path" not in table.column_names or not isinstance(shape, list):
        raise UsageError(f"{path}: no path and vector columns with a shape; not an embeddings file")
    flat = table.column(column).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    try:
        vectors = torch.from_numpy(np.array(flat, dtype=np.float32).reshape(shape))  # a copy torch may write
    except ValueError:
        raise UsageError(f"{path}: its embedding column does not have the shape {shape} it states") from None
    return vectors, meta, table.column("path").to_pylist()


# ----------------------------------------------------------------------------------------------
# Labelled features for few-shot and probes


@dataclass
class LabelledEmbeddings:
    """Train and test features with labels from the class folder of each path: what
    :func:`labelled_embeddings` returns.

    Attributes:
        train_x: the training features (N_train, D).
        train_y: their labels (N_train,), int64 indices into ``classes``.
        test_x: the test features (N_test, D).
        test_y: their labels (N_test,), int64 indices into ``classes``.
        classes: the class folders of the training file, sorted.
        train: the training file's embeddings, as read.
        test: the test file's embeddings, as read.
    """

    train_x: torch.Tensor  # (N_train, D)
    train_y: torch.Tensor  # (N_train,) int64, indices into classes
    test_x: torch.Tensor  # (N_test, D)
    test_y: torch.Tensor  # (N_test,)
    classes: list[str]  # the class folders of the train file, sorted
    train: Embeddings
    test: Embeddings


def labels_from_paths(paths: Sequence[str], where: str) -> list[str]:
    """The class of each path: its first folder (``<class>/.../<image>``).

    Args:
        paths: paths relative to the embedded folder.
        where: the file they come from, for the error.

    Returns:
        One class name per path.

    Raises:
        UsageError: a path directly in the folder, which has no class folder.
    """
    classes = []
    for p in paths:
        head, sep, _ = p.partition("/")
        if not sep:
            raise UsageError(
                f"{where}: {p!r} is in no class folder; labels are the first folder of each path "
                "(embed a folder of FOLDER/<class>/<image>)"
            )
        classes.append(head)
    return classes


def _subset(n: int, cap: int | None, seed: int) -> np.ndarray | None:
    """A seeded random ``cap`` of ``n`` rows, in their order; None for all of them."""
    if cap is None or cap >= n:
        return None
    return np.sort(np.random.default_rng(seed).permutation(n)[:cap])


def _check_pair(train: Embeddings, test: Embeddings) -> None:
    for e in (train, test):
        assert e.vectors is not None
        if e.pool == "patch" or e.vectors.ndim != 2:
            raise UsageError(
                f"{e.file}: patch tokens (pool {e.pool}), not one vector per image; embed with --pool pooled or cls"
            )
    a, b = train.vectors, test.vectors
    assert a is not None and b is not None
    if a.shape[1] != b.shape[1]:
        raise UsageError(f"{train.file} has {a.shape[1]}-dimensional vectors, {test.file} {b.shape[1]}-dimensional")
    for name in ("weights_sha256", "pool", "preprocessing"):
        x, y = train.metadata.get(name), test.metadata.get(name)
        if x != y:
            what = f"models ({train.model} and {test.model})" if name == "weights_sha256" else f"{name} ({x} and {y})"
            raise UsageError(f"{train.file} and {test.file} were embedded with different {what}; embed both alike")


def _check_finite(e: Embeddings) -> None:
    """Refuse, naming the file and the first image, vectors holding NaN or infinity (a classifier
    fitted to them predicts nothing meaningful, and says nothing)."""
    x = e.vectors
    if x is None:
        return
    bad = (~torch.isfinite(x.reshape(x.shape[0], -1))).any(dim=1).nonzero().flatten()
    if len(bad):
        first = int(bad[0])
        raise UsageError(
            f"{e.file}: {len(bad)} of its {x.shape[0]} vectors are not finite (NaN or infinity), the first of "
            f"{printable(e.paths[first], 80)}; embed the images again (the model's outputs were not finite?)"
        )


def labelled_embeddings(
    train: str | Path | Embeddings,
    test: str | Path | Embeddings,
    max_train: int | None = None,
    max_test: int | None = None,
    seed: int = 0,
) -> LabelledEmbeddings:
    """Train and test embeddings as labelled features: the label of an image is its class folder
    (the first folder of its path), indexed in the sorted class folders of ``train``.

    Args:
        train: the embeddings to fit on (a file, or what :func:`read_embeddings` returned).
        test: the embeddings to score; their classes must all be in ``train``.
        max_train: keep a seeded random subset of this many train rows (in their order).
        max_test: the same for the test rows.
        seed: the seed of those subsets.

    Returns:
        :class:`LabelledEmbeddings`.

    Raises:
        UsageError: patch embeddings, files of different models, pools, preprocessing or widths,
            vectors that are not finite, a path without a class folder, fewer than two classes,
            or test classes not in train.
    """
    tr = train if isinstance(train, Embeddings) else read_embeddings(train)
    te = test if isinstance(test, Embeddings) else read_embeddings(test)
    _check_pair(tr, te)
    for e in (tr, te):
        _check_finite(e)
    tr_names, te_names = labels_from_paths(tr.paths, str(tr.file)), labels_from_paths(te.paths, str(te.file))
    classes = sorted(set(tr_names))
    if len(classes) < 2:
        raise UsageError(f"{tr.file}: one class folder ({classes[0]}); a classifier needs two at least")
    unknown = sorted(set(te_names) - set(classes))
    if unknown:
        raise UsageError(f"{te.file}: class folders not in {tr.file}: {', '.join(unknown[:5])}")
    index = {c: i for i, c in enumerate(classes)}
    tr_y = torch.tensor([index[c] for c in tr_names], dtype=torch.int64)
    te_y = torch.tensor([index[c] for c in te_names], dtype=torch.int64)
    tr_x, te_x = tr.vectors, te.vectors
    assert tr_x is not None and te_x is not None
    keep = _subset(len(tr_y), max_train, seed)
    if keep is not None:
        tr_x, tr_y = tr_x[keep], tr_y[keep]
    keep = _subset(len(te_y), max_test, seed)
    if keep is not None:
        te_x, te_y = te_x[keep], te_y[keep]
    return LabelledEmbeddings(tr_x, tr_y, te_x, te_y, classes, tr, te)


__all__ = [
    "POOLS",
    "EmbeddingResult",
    "Embeddings",
    "LabelledEmbeddings",
    "check_output",
    "embed_folder",
    "head_predictions",
    "image_files",
    "labelled_embeddings",
    "labels_from_paths",
    "model_digest",
    "pool_function",
    "read_embeddings",
]
