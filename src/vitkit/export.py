"""Models and weights out of vitkit: to the official .npz, timm, Hugging Face and vitkit files, and
for serving to a ``torch.export`` program (``.pt2``, optionally compiled ahead of time by
AOTInductor) or ONNX, each checked against the PyTorch model before it is written.

The serving formats are traced for a dynamic batch dimension and checked on batch sizes other
than the one traced: the ``.pt2`` program as :func:`torch.export.load` reads it back, the ONNX
file in onnxruntime. A file that fails its check, or a model the exporter cannot trace, is
refused in one line and nothing is written.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import CheckpointError, ExportError, UsageError, writing
from .files import RUN_MARKER, atomic_write, write_text
from .models.adapters import adapted_layers, merge_adapters

FORMATS = ("vitkit", "official", "timm", "hf", "onnx", "pt2")
"""The formats :func:`export_weights` writes."""

# The ONNX opset written: the dynamo exporter's own (onnxscript's torchlib is written for 18;
# a later one is reached by converting the graph, an earlier one not at all). onnxruntime reads it
# from 1.14 on.
ONNX_OPSET = 18
"""The ONNX opset written (the dynamo exporter's own; onnxruntime reads it from 1.14 on)."""
# Outputs of a .pt2 program run the same kernels as the model; onnxruntime's kernels (MatMul,
# LayerNormalization, Softmax) sum in other orders, measured at a few 1e-6 on small ViTs. Both
# tolerances are absolute for outputs within [-1, 1] and scale with the largest output beyond.
PT2_ATOL = 1e-5
"""The tolerance of the check of a ``.pt2`` program against the model (absolute, for outputs in
[-1, 1]; scaled by the largest output beyond)."""
ONNX_ATOL = 1e-4
"""The tolerance of the check of an ONNX file in onnxruntime against the model, likewise."""
# One ONNX file holds at most 2 GB (a protobuf message); larger models need external data.
ONNX_MAX_BYTES = 2**31 - 1

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _reason(e: BaseException) -> str:
    """The first line of the innermost cause of an exporter's error: the exporters wrap the error
    that says what failed (an operator without a translation, a data-dependent branch) in one
    that says which step failed."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [line.strip() for line in _ANSI.sub("", str(e)).splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 240 else text[:237] + "..."


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the exporters' progress lines, graph dumps, logged warnings and Python warnings
    (about the deprecated TorchScript exporter, tracer shape checks) out of the caller's output;
    what failed is in the exception, which :func:`_reason` reads."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def describe_model(model: nn.Module) -> str:
    """A model in a few words for a message: its class and the config fields that make its
    family (pooling, positions, a hybrid's stem), e.g. ``VisionTransformer (width 192, depth 2,
    patch 8x8, classifier 'token', pos_embed 'learned')``.

    Args:
        model: any module; a vitkit model's config is described.

    Returns:
        One line.
    """
    from .models import ResNetConfig, ViTConfig

    cfg = getattr(model, "cfg", None)
    name = type(model).__name__
    if isinstance(cfg, ViTConfig):
        parts = [f"width {cfg.width}", f"depth {cfg.depth}", f"patch {cfg.patch_size[0]}x{cfg.patch_size[1]}"]
        if cfg.resnet_units is not None:
            parts.append(f"ResNet stem {list(cfg.resnet_units)}")
        parts += [f"classifier {cfg.classifier!r}", f"pos_embed {cfg.pos_embed!r}"]
        if cfg.distill_token:
            parts.append("distillation token")
        return f"{name} ({', '.join(parts)})"
    if isinstance(cfg, ResNetConfig):
        return f"{name} (units {list(cfg.units)}, width x{cfg.width_factor})"
    return name


def _example_input(model: nn.Module, batch: int) -> torch.Tensor:
    """A random fp32 image batch of the model's input shape."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "img_size"):
        raise UsageError(f"exporting needs a vitkit model (its .cfg gives the input size), got {type(model).__name__}")
    if batch < 1:
        raise UsageError(f"export batch must be at least 1, got {batch}")
    device = next(iter(model.parameters()), torch.empty(0)).device
    return torch.randn(batch, cfg.in_chans, *cfg.img_size, device=device)


def _batch_dim() -> Any:
    return torch.export.Dim("batch", min=1)


def _check_batches(batch: int) -> tuple[int, int]:
    """The batch sizes an export is checked on: one image (what serving sees most, and the size
    tracers like to specialise on) and one more than the batch traced."""
    return (1, batch + 1)


def _leaves(out: Any) -> list[np.ndarray]:
    """The tensors of a model's output (logits, a tuple, a list of maps) as fp32 arrays, in order."""
    leaves = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(t.detach().float().cpu().numpy() if isinstance(t, torch.Tensor) else t) for t in leaves]


def _compare(
    model: nn.Module,
    run: Callable[[torch.Tensor], Any],
    example: torch.Tensor,
    batches: tuple[int, ...],
    atol: float,
    path: Path,
    what: str,
) -> tuple[float, float]:
    """Run the exported model (``run``) and the eager one on random batches of each size and
    raise :class:`ExportError` naming ``path`` when they differ by more than the tolerance:
    ``atol`` times the largest eager output where that is above 1. Returns (max abs difference,
    tolerance)."""
    worst, tol = 0.0, atol
    for b in batches:
        x = torch.randn(b, *example.shape[1:], device=example.device)
        with torch.no_grad():
            want, got = _leaves(model(x)), _leaves(run(x))
        if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
            shapes = [g.shape for g in got], [w.shape for w in want]
            raise ExportError(f"{path}: {what} gives outputs of shapes {shapes[0]} at batch {b}, PyTorch {shapes[1]}")
        scale = max([1.0] + [float(np.abs(w).max()) for w in want if w.size])
        tol = max(tol, atol * scale)
        diff = max([0.0] + [float(np.abs(g - w).max()) if w.size else 0.0 for g, w in zip(got, want)])
        if not diff <= atol * scale:  # NaN fails too
            raise ExportError(
                f"{path}: {what} outputs differ from PyTorch by {diff:.3g} at batch {b} "
                f"(tolerance {atol * scale:.3g}); not written"
            )
        worst = max(worst, diff)
    return worst, tol


def _metadata(model: nn.Module) -> dict[str, str]:
    """What a serving file records of the model besides its graph: its architecture and config,
    the preprocessing its inputs need (``vitkit.preprocessing``, JSON) and, where the weights
    stored them, its class names (``vitkit.classes``, a JSON list) and a multi-label model's
    per-class thresholds (``vitkit.multilabel``, ``vitkit.thresholds``): what
    :func:`load_exported` reads back."""
    from .checkpoint.native import config_to_meta
    from .eval.predict import stored_class_names, stored_thresholds
    from .preprocessing import Preprocessing

    meta = config_to_meta(model.cfg)
    pre = getattr(model, "preprocessing", None) or Preprocessing.for_config(model.cfg)
    out = {
        "vitkit.arch": meta["arch"],
        "vitkit.config": meta["config"],
        "vitkit.preprocessing": json.dumps(pre.to_dict(), sort_keys=True),
    }
    names = stored_class_names(model)
    if names is not None:
        out["vitkit.classes"] = json.dumps(names, ensure_ascii=False)
    thresholds = stored_thresholds(model)
    if thresholds is not None:
        out.update({"vitkit.multilabel": "true", "vitkit.thresholds": json.dumps(thresholds)})
    return out


def _prepare(model: nn.Module) -> nn.Module:
    if any(p.is_meta for p in model.parameters()):
        raise UsageError(f"{describe_model(model)} has no weights (built on the meta device): nothing to export")
    return model.eval().float()


def aoti_available() -> str | None:
    """Why AOTInductor packaging cannot run here (no ``torch._inductor.aoti_compile_and_package``
    in this torch, or no C++ compiler on the PATH), or None when it can.

    Returns:
        The reason, in one line; None when AOTInductor can package a model.
    """
    import os

    try:
        import torch._inductor as inductor
    except ImportError:
        return "this torch has no Inductor"
    if not hasattr(inductor, "aoti_compile_and_package"):
        return f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package"
    cxx = os.environ.get("CXX") or "c++"
    if not any(shutil.which(c) for c in (cxx, "g++", "clang++")):
        return "AOTInductor compiles C++: no compiler found (install g++ or set CXX)"
    return None


def _pt2_bytes(model: nn.Module, x: torch.Tensor, path: Path, aoti: bool) -> bytes:
    """The model traced by ``torch.export`` on ``x`` with a dynamic batch dimension, as the bytes
    of a ``.pt2`` file: the program with vitkit's metadata, or its AOTInductor package. A model
    that cannot be traced or compiled is an :class:`ExportError` of one line naming it."""
    try:
        with _quiet(), torch.no_grad():
            program = torch.export.export(model, (x,), dynamic_shapes=({0: _batch_dim()},))
    except MemoryError:
        raise
    except Exception as e:
        raise ExportError(f"{path}: torch.export cannot export {describe_model(model)}: {_reason(e)}") from None
    buf = io.BytesIO()
    try:
        with _quiet():
            if aoti:
                import torch._inductor as inductor

                inductor.aoti_compile_and_package(program, package_path=buf)
            else:
                meta = json.dumps(_metadata(model), sort_keys=True)
                torch.export.save(program, buf, extra_files={"vitkit.json": meta})
    except MemoryError:
        raise
    except Exception as e:
        step = "AOTInductor cannot compile" if aoti else "torch.export cannot save"
        raise ExportError(f"{path}: {step} {describe_model(model)}: {_reason(e)}") from None
    return buf.getvalue()


def export_program(
    model: nn.Module,
    path: str | Path,
    batch: int = 2,
    check: bool = True,
    atol: float = PT2_ATOL,
    aoti: bool = False,
) -> dict[str, Any]:
    """Write ``model`` (fp32, eval mode; it is put in both) to ``path`` as a ``torch.export``
    program with a dynamic batch dimension, saved by :func:`torch.export.save` and read back by
    :func:`torch.export.load` (``ep.module()(pixels)`` gives the model's outputs); with ``aoti``,
    compiled ahead of time by AOTInductor instead and packaged for
    ``torch._inductor.aoti_load_package`` (C++ compiler needed, :func:`aoti_available`; a
    minute or more on a CPU). The file records the model's config and preprocessing
    (``extra_files={"vitkit.json": ...}`` for a program).

    With ``check``, the bytes written are first read back and run on two batch sizes other than
    the traced one (:func:`_check_batches`), and an output that differs from the eager model's by
    more than ``atol`` (times the largest output, where that is above 1) is an
    :class:`ExportError` naming ``path`` and the difference, with nothing written. A model
    ``torch.export`` cannot trace (data-dependent control flow, an unsupported operator) is an
    :class:`ExportError` of one line naming the model and what failed.

    Args:
        model: a vitkit model (its ``cfg`` gives the input shape).
        path: the ``.pt2`` file to write, atomically.
        batch: the batch size traced.
        check: compare the program with the model before writing.
        atol: the tolerance of the check.
        aoti: write an AOTInductor package instead of a program.

    Returns:
        ``{"format": "pt2", "exporter": "torch.export" or "aoti", "torch": version,
        "max_abs_diff": float or None, "tolerance": float, "batch_sizes": the sizes checked,
        "dynamic_batch": True}``.

    Raises:
        ExportError: AOTInductor asked for where it cannot run, a model that cannot be traced
            or compiled, or a program whose outputs differ from the model's.
        UsageError: a model without weights (built on the meta device).
    """
    path = Path(path)
    model = _prepare(model)
    if aoti and (why := aoti_available()):
        raise ExportError(f"{path}: cannot package with AOTInductor: {why}")
    x = _example_input(model, batch)
    data = _pt2_bytes(model, x, path, aoti)
    result: dict[str, Any] = {
        "format": "pt2",
        "exporter": "aoti" if aoti else "torch.export",
        "torch": torch.__version__,
        "max_abs_diff": None,
        "tolerance": atol,
        "batch_sizes": [],
        "dynamic_batch": True,
    }
    if check:
        batches = _check_batches(batch)
        with _quiet():
            if aoti:
                import torch._inductor as inductor

                run = inductor.aoti_load_package(io.BytesIO(data))
            else:
                run = torch.export.load(io.BytesIO(data)).module()
        what = "the AOTInductor package" if aoti else "the exported program"
        diff, tol = _compare(model, run, x, batches, atol, path, what)
        result.update(max_abs_diff=diff, tolerance=tol, batch_sizes=list(batches))
    with writing(path):
        atomic_write(path, lambda f: f.write(data))
    return result


def _onnx_dynamo(model: nn.Module, x: torch.Tensor, opset: int) -> Any:
    """The model as an ONNX ``ModelProto`` by the dynamo exporter (``torch.export``, then
    onnxscript's translations), the batch dimension dynamic."""
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            model,
            (x,),
            None,
            dynamo=True,
            input_names=["pixels"],
            output_names=["logits"],
            dynamic_shapes=({0: _batch_dim()},),
            opset_version=opset,
            external_data=False,
            verbose=False,
        )
    return program.model_proto


def _onnx_torchscript(model: nn.Module, x: torch.Tensor, opset: int) -> Any:
    """The model as an ONNX ``ModelProto`` by the TorchScript exporter, which PyTorch deprecates
    and which needs no onnxscript: what :func:`export_onnx` falls back to."""
    import onnx

    buf = io.BytesIO()
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            model,
            (x,),
            buf,
            input_names=["pixels"],
            output_names=["logits"],
            dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=opset,
            dynamo=False,
        )
    return onnx.load_from_string(buf.getvalue())


def _weight_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _onnx_proto(model: nn.Module, x: torch.Tensor, opset: int, path: Path) -> tuple[Any, str | None]:
    """The model as an ONNX ``ModelProto`` by the dynamo exporter, else by the TorchScript one,
    and why the dynamo exporter did not write it (None when it did). A model neither exporter
    handles is an :class:`ExportError` of one line naming it and both failures."""
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter translates through it)
    except ImportError:
        fallback = "onnxscript is not installed (pip install 'vitkit[onnx]')"
    else:
        try:
            return _onnx_dynamo(model, x, opset), None
        except MemoryError:
            raise
        except Exception as e:
            fallback = f"the dynamo exporter failed: {_reason(e)}"
    try:
        return _onnx_torchscript(model, x, opset), fallback
    except MemoryError:
        raise
    except Exception as e:
        raise ExportError(
            f"{path}: ONNX cannot hold {describe_model(model)}: {fallback}; the TorchScript exporter "
            f"failed too: {_reason(e)}"
        ) from None


def _onnxruntime_check(model: nn.Module, data: bytes, x: torch.Tensor, atol: float, path: Path) -> dict[str, Any]:
    """Run the ONNX file ``data`` in onnxruntime against the model (:func:`_compare`); nothing
    when onnxruntime is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {}
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    batches = _check_batches(x.shape[0])

    def run(pixels: torch.Tensor) -> list[np.ndarray]:
        return sess.run(None, {"pixels": pixels.cpu().numpy()})

    diff, tol = _compare(model, run, x, batches, atol, path, f"onnxruntime {ort.__version__}")
    return {"max_abs_diff": diff, "tolerance": tol, "batch_sizes": list(batches), "onnxruntime": ort.__version__}


def export_onnx(
    model: nn.Module,
    path: str | Path,
    batch: int = 2,
    opset: int = ONNX_OPSET,
    check: bool = True,
    atol: float = ONNX_ATOL,
) -> dict[str, Any]:
    """Write ``model`` (fp32, eval mode; it is put in both) to ``path`` as ONNX with a dynamic
    batch dimension (input ``pixels``, output ``logits``), by PyTorch's dynamo exporter
    (``torch.onnx.export(..., dynamo=True)``; needs onnxscript, in the ``onnx`` extra).

    Where the dynamo exporter cannot run (onnxscript is not installed) or fails on the model,
    the TorchScript exporter, which PyTorch deprecates, writes the file instead, and the result
    says so (``exporter`` "torchscript", ``fallback`` why). A model neither can export is an
    :class:`ExportError` of one line naming the model and what failed. The file's metadata
    (``metadata_props``) records the model's config and preprocessing (:func:`_metadata`).

    With ``check`` and onnxruntime installed, the file is run on two batch sizes other than the
    traced one before it is written, and outputs that differ from PyTorch's by more than ``atol``
    (times the largest output, where that is above 1) are an :class:`ExportError` naming ``path``,
    with nothing written. A model of more than 2 GB of weights (one ONNX file's limit) is refused
    before any work: export it to ``.pt2`` instead.

    Args:
        model: a vitkit model (its ``cfg`` gives the input shape).
        path: the ``.onnx`` file to write, atomically.
        batch: the batch size traced.
        opset: the ONNX opset (:data:`ONNX_OPSET`; 18 or later).
        check: run the file in onnxruntime against the model before writing.
        atol: the tolerance of the check.

    Returns:
        ``{"format": "onnx", "exporter": "dynamo" or "torchscript", "fallback": why the dynamo
        exporter did not write it (None when it did), "opset": the file's ai.onnx opset,
        "max_abs_diff": float or None (not checked), "tolerance": float, "batch_sizes": the sizes
        checked, "onnxruntime": its version or None}``.

    Raises:
        UsageError: an opset below :data:`ONNX_OPSET`, or a model without weights.
        ExportError: the onnx package missing, a model over 2 GB of weights or that neither
            exporter can export, or a file whose outputs differ from the model's.
    """
    path = Path(path)
    if opset < ONNX_OPSET:
        raise UsageError(f"ONNX opset {opset}: the dynamo exporter writes opset {ONNX_OPSET} or later")
    model = _prepare(model)
    try:
        import onnx  # noqa: F401  (the TorchScript exporter and the fallback's metadata use it)
    except ImportError:
        raise ExportError(f"{path}: writing ONNX needs the onnx package: pip install 'vitkit[onnx]'") from None
    if (size := _weight_bytes(model)) > ONNX_MAX_BYTES:
        raise ExportError(
            f"{path}: {describe_model(model)} has {size / 2**30:.1f} GiB of weights, more than one ONNX file "
            "holds (2 GB): export it to .pt2 instead"
        )
    x = _example_input(model, batch)
    proto, fallback = _onnx_proto(model, x, opset, path)
    for key, value in _metadata(model).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    data = proto.SerializeToString()
    written_opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    result: dict[str, Any] = {
        "format": "onnx",
        "exporter": "torchscript" if fallback else "dynamo",
        "fallback": fallback,
        "opset": written_opset,
        "max_abs_diff": None,
        "tolerance": atol,
        "batch_sizes": [],
        "onnxruntime": None,
    }
    if check:  # before it is written: a file that fails is not left behind
        result.update(_onnxruntime_check(model, data, x, atol, path))
    with writing(path):
        atomic_write(path, lambda f: f.write(data))
    return result


# What each format writes: one file of this suffix, or a folder ("hf").
SUFFIXES = {"vitkit": ".safetensors", "official": ".npz", "timm": ".safetensors", "onnx": ".onnx", "pt2": ".pt2"}
"""The file suffix of each format that writes one file ("hf" writes a folder)."""
_FILE_SUFFIXES = (".safetensors", ".npz", ".onnx", ".pt2", ".bin", ".pth", ".pt", ".json")


def format_for(dst: str | Path) -> str:
    """The format a destination's name asks for: ``.safetensors`` vitkit, ``.npz`` official,
    ``.onnx`` ONNX, ``.pt2`` a ``torch.export`` program; any other name is a :class:`UsageError`
    (a Hugging Face folder needs ``to="hf"`` said; vitkit writes no pickled ``.pth``/``.bin``).

    Args:
        dst: the destination.

    Returns:
        One of :data:`FORMATS`.

    Raises:
        UsageError: a name of another suffix.
    """
    dst = Path(dst)
    suffix = dst.suffix.lower()
    for fmt in ("vitkit", "official", "onnx", "pt2"):
        if suffix == SUFFIXES[fmt]:
            return fmt
    if suffix in (".pth", ".pt", ".bin"):
        raise UsageError(
            f"{dst}: vitkit writes no pickled PyTorch files ({suffix}); name it {dst.stem}.safetensors "
            "(--to timm for a timm state dict)"
        )
    raise UsageError(
        f"{dst}: cannot tell the format from the name: use .safetensors (vitkit), .npz (official), .onnx "
        "or .pt2 (torch.export), or say --to (hf writes a folder)"
    )


def check_destination(dst: str | Path, to: str) -> None:
    """Refuse a destination whose name does not fit format ``to`` (a file vitkit could not read
    back, such as an .npz named .safetensors), naming the one expected.

    Args:
        dst: the destination: a file, or a folder for "hf".
        to: one of :data:`FORMATS`.

    Raises:
        UsageError: an unknown format, a suffix other than the format's, a file where "hf"
            needs a folder, or a folder where the format writes a file.
    """
    dst = Path(dst)
    if to not in FORMATS:
        raise UsageError(f"unknown export format {to!r}: one of {', '.join(FORMATS)}")
    suffix = dst.suffix.lower()
    if to == "hf":
        if suffix in _FILE_SUFFIXES or dst.is_file():
            raise UsageError(
                f"{dst}: the hf format is a folder (model.safetensors and config.json), not a {suffix or 'plain'} "
                f"file: name a folder, such as {dst.with_suffix('').name}_hf"
            )
        return
    want = SUFFIXES[to]
    if suffix != want:
        raise UsageError(
            f"{dst}: the {to} format is a {want} file, not {suffix or 'a name without suffix'} (vitkit could not "
            f"read it back): name it {dst.stem}{want}"
        )
    if dst.is_dir():
        raise UsageError(f"{dst}: is a folder; the {to} format is a {want} file")


def check_exportable(model: nn.Module, to: str) -> None:
    """Refuse, in one line and before anything is written, a model that format ``to`` cannot hold
    (one that would load back as another model); see :func:`export_weights`.

    Args:
        model: the model to write.
        to: one of :data:`FORMATS`.

    Raises:
        CheckpointError: a model, or a preprocessing, the format cannot record.
    """
    from .checkpoint.official import check_official
    from .checkpoint.peers import check_hf, check_timm
    from .preprocessing import Preprocessing

    cfg = getattr(model, "cfg", None)
    if to == "official":
        check_official(cfg)
    elif to == "timm":
        check_timm(cfg)
    elif to == "hf":
        check_hf(cfg)
    pre = getattr(model, "preprocessing", None)
    if to == "hf" and pre is not None and pre.crop_pct < 1.0 and pre.img_size[0] != pre.img_size[1]:
        raise CheckpointError(
            f"Hugging Face's image processors crop squares: this model's preprocessing crops {pre.crop_pct:g} of a "
            f"{pre.img_size[0]}x{pre.img_size[1]} image; export to vitkit (.safetensors) or ONNX (.onnx) instead"
        )
    if to == "official" and pre is not None:
        default = Preprocessing.for_config(cfg)
        if (tuple(pre.mean), tuple(pre.std), pre.interpolation) != (default.mean, default.std, default.interpolation):
            raise CheckpointError(
                f"the {to} format does not record preprocessing (mean {list(pre.mean)}, std {list(pre.std)}, "
                f"{pre.interpolation}): it reads back as the paper's [-1, 1] range; export to vitkit or timm instead"
            )


def export_weights(
    model: nn.Module, dst: str | Path, to: str, layout: str = "prelinen", aoti: bool = False
) -> dict[str, Any]:
    """Write a loaded vitkit model's weights to ``dst`` in format ``to``: "vitkit" (safetensors
    with config), "official" (``.npz``, key ``layout`` "prelinen" or "linen"), "timm"
    (safetensors state dict, with vitkit's config in its metadata for vitkit to read back), "hf"
    (a Hugging Face folder: ``model.safetensors`` and ``config.json``), "onnx" (checked in
    onnxruntime, :func:`export_onnx`) or "pt2" (a ``torch.export`` program, or with ``aoti`` an
    AOTInductor package, checked against the model, :func:`export_program`).

    What a format cannot hold is refused before anything is written, so that what is written
    loads back (:func:`vitkit.load_pretrained`) as the same model: the official ``.npz`` records
    no config (no sin-cos or 2-D or relative positions, square grids only, tanh GELU, LayerNorm
    epsilon 1e-6), timm and Hugging Face hold one learned 1-D position table, Hugging Face only
    class-token ViTs whose class token has a position. A model with adapters (LoRA, DoRA) is
    written with them merged into its weights (a copy is merged). A name that does not fit the format
    (``.pth``, an ``.npz`` called ``.safetensors``) is refused too. A failed write names ``dst``
    and leaves no partial file.

    Args:
        model: the model to write.
        dst: the file (a folder for "hf").
        to: one of :data:`FORMATS`.
        layout: the official format's key layout.
        aoti: for "pt2", an AOTInductor package instead of a program.

    Returns:
        For "onnx" and "pt2" the check of the file written (:func:`export_onnx`,
        :func:`export_program`); for the others ``{"format": to, "max_abs_diff": None,
        "onnxruntime": None}``.

    Raises:
        UsageError: an unknown format or layout, ``aoti`` for another format than "pt2", or a
            destination whose name does not fit the format.
        CheckpointError: a model the format cannot hold.
        ExportError: an ONNX or ``.pt2`` export that failed or does not match the model.
    """
    from .checkpoint import hf_config_for, save_checkpoint, to_hf, to_official, to_timm
    from .checkpoint.io import write_safetensors
    from .checkpoint.load import TIMM_CONFIG_KEY, TIMM_PREPROCESSING_KEY
    from .checkpoint.native import config_to_meta

    dst = Path(dst)
    if to not in FORMATS:
        raise UsageError(f"unknown export format {to!r}: one of {', '.join(FORMATS)}")
    if to == "official" and layout not in ("prelinen", "linen"):
        raise UsageError(f"official layout must be 'prelinen' or 'linen', got {layout!r}")
    if aoti and to != "pt2":
        raise UsageError(f"AOTInductor packages are .pt2 files: aoti does not apply to the {to} format")
    if adapted_layers(model):  # every format holds plain weights: the adapters are merged into them
        model = merge_adapters(copy.deepcopy(model))
    check_exportable(model, to)
    check_destination(dst, to)
    if to == "onnx":
        return export_onnx(model, dst)
    if to == "pt2":
        return export_program(model, dst, aoti=aoti)
    sd = model.state_dict()
    if to == "vitkit":
        with writing(dst):
            save_checkpoint(model, dst)
    elif to == "official":
        arrays = to_official(sd, model.cfg, layout=layout)
        with writing(dst):
            atomic_write(dst, lambda f: np.savez(f, **arrays))
    elif to == "timm":
        meta = {"format": "pt", TIMM_CONFIG_KEY: config_to_meta(model.cfg)["config"]}
        pre = getattr(model, "preprocessing", None)
        if pre is not None:
            meta[TIMM_PREPROCESSING_KEY] = json.dumps(pre.to_dict())
        tensors = to_timm(sd, model.cfg)
        with writing(dst):
            write_safetensors(dst, tensors, meta)
    elif to == "hf":
        cfg = hf_config_for(model.cfg) | hf_labels(model)
        files = {"preprocessor_config.json": json.dumps(hf_preprocessor_config(model), indent=2)}
        files["README.md"] = run_model_card(model) or weights_card(model)
        _write_hf(dst, to_hf(sd, model.cfg), cfg, model.cfg.num_classes, files)
    return {"format": to, "max_abs_diff": None, "onnxruntime": None}


def hf_labels(model: nn.Module) -> dict[str, Any]:
    """What a Hugging Face ``config.json`` says of a vitkit model's classes: ``id2label`` and
    ``label2id`` from the class names stored with its checkpoint, and for a multi-label model
    ``problem_type`` with the per-class thresholds chosen on its minival (``vitkit_thresholds``).

    Args:
        model: a model loaded by vitkit.

    Returns:
        The keys to add to the config (none for a model that stored no class names).
    """
    from .eval.predict import stored_class_names, stored_thresholds

    out: dict[str, Any] = {}
    names = stored_class_names(model)
    if names and len(set(names)) == len(names):  # label2id needs names that tell the classes apart
        out["id2label"] = {str(i): n for i, n in enumerate(names)}
        out["label2id"] = {n: i for i, n in enumerate(names)}
    thresholds = stored_thresholds(model)
    if thresholds is not None:
        out["problem_type"] = "multi_label_classification"
        out["vitkit_thresholds"] = thresholds
    return out


def run_model_card(model: nn.Module) -> str | None:
    """The model card (``README.md``) of the run folder a model was loaded from: the run folder
    itself, its best or last weights, or a step checkpoint under its ``checkpoints/``; None when
    the weights are not in a vitkit run folder or the run wrote no card.

    Args:
        model: a model loaded by vitkit (``model.load_report.path`` names its file or folder).

    Returns:
        The card's text.
    """
    path = getattr(getattr(model, "load_report", None), "path", None)
    if not path:
        return None
    p = Path(path)
    for folder in (p, p.parent, p.parent.parent):
        card = folder / "README.md"
        if (folder / RUN_MARKER).exists() and card.is_file():
            try:
                return card.read_text(errors="replace")
            except OSError:
                return None
    return None


def weights_card(model: nn.Module) -> str:
    """A short model card for weights that come without a run's: what the model is, the file it
    was loaded from, its classes and its preprocessing.

    Args:
        model: a vitkit model.

    Returns:
        The card, Markdown.
    """
    from .eval.predict import stored_class_names
    from .preprocessing import Preprocessing

    report = getattr(model, "load_report", None)
    pre = getattr(model, "preprocessing", None) or Preprocessing.for_config(model.cfg)
    names = stored_class_names(model)
    lines = ["# vitkit model", "", f"- model: {describe_model(model)}"]
    if report is not None and report.path:
        lines.append(f"- converted from: `{Path(report.path).name}` ({report.source})")
    if names:
        lines.append(f"- classes ({len(names)}): {', '.join(names)}")
    lines.append(
        f"- preprocessing: {pre.img_size[0]}x{pre.img_size[1]} px, {pre.interpolation}, mean {list(pre.mean)}, "
        f"std {list(pre.std)}" + (f", centre crop {pre.crop_pct:g}" if pre.crop_pct < 1.0 else "")
    )
    return "\n".join(lines) + "\n"


_PIL_CODES = {"bilinear": 2, "bicubic": 3}  # Pillow's resampling codes, as transformers writes them


def hf_preprocessor_config(model: nn.Module) -> dict[str, Any]:
    """The ``preprocessor_config.json`` of a Hugging Face folder for a vitkit model: its own
    preprocessing, as ``AutoImageProcessor`` and ``pipeline("image-classification")`` read it. A
    plain resize is a ``ViTImageProcessor``; a centre crop (``crop_pct`` below 1, or
    ``crop_mode`` "center") a ``BitImageProcessor``: the shorter side to ``img_size / crop_pct``,
    then the centre ``img_size``, as :func:`vitkit.preprocessing.prepare_images` does.

    Args:
        model: a vitkit model (its ``preprocessing``, else the paper's [-1, 1] at its size).

    Returns:
        The JSON object.
    """
    import math

    from .preprocessing import Preprocessing

    pre = getattr(model, "preprocessing", None) or Preprocessing.for_config(model.cfg)
    h, w = pre.img_size
    common = {
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(pre.mean),
        "image_std": list(pre.std),
        "resample": _PIL_CODES.get(pre.interpolation, 2),
        "do_resize": True,
    }
    if pre.crop_pct >= 1.0 and pre.crop_mode != "center":
        return {"image_processor_type": "ViTImageProcessor", "size": {"height": h, "width": w}, **common}
    return {
        "image_processor_type": "BitImageProcessor",
        "size": {"shortest_edge": math.floor(h / pre.crop_pct)},
        "do_center_crop": True,
        "crop_size": {"height": h, "width": w},
        "do_convert_rgb": True,
        **common,
    }


def _write_hf(
    dst: Path, tensors: dict[str, torch.Tensor], cfg: dict[str, Any], num_classes: int, files: dict[str, str]
) -> None:
    """The files of a Hugging Face folder: the weights, ``config.json`` and ``files`` (name ->
    text: the preprocessor config, the model card); if a later one cannot be written, the weights
    are removed again (a folder of weights without config.json does not load)."""
    from .checkpoint.io import write_safetensors

    cfg["architectures"] = ["ViTForImageClassification" if num_classes else "ViTModel"]
    created = not dst.exists()
    weights, config = dst / "model.safetensors", dst / "config.json"
    had_weights = weights.exists()
    try:
        with writing(weights):
            write_safetensors(weights, tensors, {"format": "pt"})
        with writing(config):
            write_text(config, json.dumps(cfg, indent=2))
        for name, text in files.items():
            with writing(dst / name):
                write_text(dst / name, text)
    except BaseException:
        if not had_weights:
            weights.unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                dst.rmdir()
        raise


class ExportedModel(nn.Module):
    """An ONNX file or ``torch.export`` program that vitkit wrote, as a module that runs it:
    what :func:`load_exported` returns. It takes the model's input batch (B, C, H, W) and
    returns its logits, and carries what the file records: ``cfg``, ``preprocessing`` and
    ``class_names``, so :func:`vitkit.predict` and ``vitkit predict`` use it as the model.

    Args:
        run: what runs the graph: a batch in, logits out.
        cfg: the model's config, as recorded.
        preprocessing: the preprocessing its inputs need.
        class_names: one name per class, or None where the weights had none.
        report: the file read and its format ("onnx" or "pt2").

    Attributes:
        cfg: the model's config, as recorded.
        preprocessing: the preprocessing its inputs need.
        class_names: one name per class, or None where the weights had none.
        load_report: the file read and its format ("onnx" or "pt2").
        exported_metadata: a multi-label model's ``multilabel`` and ``thresholds``, as the
            weights stored them (:func:`vitkit.eval.predict.stored_thresholds` reads them); {}
            for a single-label model.
    """

    def __init__(self, run: Any, cfg: Any, preprocessing: Any, class_names: list[str] | None, report: Any) -> None:
        super().__init__()
        self._run = run
        self.cfg, self.preprocessing, self.class_names, self.load_report = cfg, preprocessing, class_names, report
        self.exported_metadata: dict[str, str] = {}

    @property
    def num_classes(self) -> int:
        """The outputs of the head."""
        return int(getattr(self.cfg, "num_classes", 0) or 0)

    def train(self, mode: bool = True) -> ExportedModel:
        """An exported graph has no training mode: this records ``mode`` only.

        Args:
            mode: the mode asked for.

        Returns:
            The module.
        """
        self.training = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of a preprocessed batch.

        Args:
            x: (B, C, H, W) float32.

        Returns:
            (B, K) logits.
        """
        return self._run(x.float())


def _exported_metadata(meta: dict[str, str], path: Path) -> tuple[Any, Any, list[str] | None]:
    """(config, preprocessing, class names) of a serving file's vitkit metadata (:func:`_metadata`)."""
    from .checkpoint.load import stored_names
    from .checkpoint.native import config_from_meta
    from .checkpoint.values import check_preprocessing, loads
    from .preprocessing import Preprocessing

    if "vitkit.config" not in meta:
        raise CheckpointError(
            f"{path}: carries no vitkit metadata (its config and preprocessing): not written by vitkit"
        )
    cfg = config_from_meta({"arch": meta.get("vitkit.arch", "vit"), "config": meta["vitkit.config"]}, path)
    if "vitkit.preprocessing" not in meta:  # an export of an older vitkit: the config's own
        pre = Preprocessing.for_config(cfg)
    else:  # damaged is refused, each value checked: other pixels would change every prediction, unsaid
        where = f"{path}: vitkit.preprocessing"
        d = loads(meta["vitkit.preprocessing"], where)
        check_preprocessing(d, int(getattr(cfg, "in_chans", 3)), where)
        pre = Preprocessing.from_dict(d)
    names = stored_names({"classes": meta.get("vitkit.classes", "null")}, int(getattr(cfg, "num_classes", 0) or 0))
    return cfg, pre, names


def load_exported(path: str | Path) -> ExportedModel:
    """An ``.onnx`` file (run in onnxruntime) or a ``.pt2`` ``torch.export`` program that
    :func:`export_weights` wrote, with the config, preprocessing and class names recorded in it.

    Args:
        path: the file.

    Returns:
        The module that runs it (:class:`ExportedModel`).

    Raises:
        CheckpointError: a file that is missing, cannot be read, or carries no vitkit metadata
            (an AOTInductor package does not).
        ExportError: onnxruntime is not installed, for an ONNX file.
    """
    from .checkpoint.load import LoadReport

    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such file")
    fmt = p.suffix.lower().lstrip(".")
    if fmt == "onnx":
        run, meta = _onnx_runner(p)
    elif fmt == "pt2":
        run, meta = _pt2_runner(p)
    else:
        raise UsageError(f"{p}: not an exported model (.onnx or .pt2)")
    cfg, pre, names = _exported_metadata(meta, p)
    model = ExportedModel(run, cfg, pre, names, LoadReport(str(p), fmt)).eval()
    if meta.get("vitkit.multilabel") == "true":  # checked against the head when predict reads them
        model.exported_metadata = {"multilabel": "true", "thresholds": meta.get("vitkit.thresholds") or "null"}
    return model


def _onnx_runner(p: Path) -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, str]]:
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        raise ExportError(
            f"{p}: running ONNX needs onnx and onnxruntime: pip install 'vitkit[onnx]' onnxruntime"
        ) from None
    try:
        proto = onnx.load(str(p), load_external_data=False)
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    except MemoryError:
        raise
    except Exception as e:
        raise CheckpointError(f"{p}: not an ONNX file onnxruntime can run ({_reason(e)})") from None
    name = sess.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(sess.run(None, {name: x.detach().cpu().numpy()})[0])

    return run, {e.key: e.value for e in proto.metadata_props}


def _pt2_runner(p: Path) -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, str]]:
    extra = {"vitkit.json": ""}
    try:
        with _quiet():
            module = torch.export.load(str(p), extra_files=extra).module()
        meta = json.loads(extra["vitkit.json"] or "{}")
    except MemoryError:
        raise
    except Exception as e:
        raise CheckpointError(
            f"{p}: not a torch.export program vitkit can read ({_reason(e)}); an AOTInductor package carries no "
            "vitkit metadata"
        ) from None
    if not isinstance(meta, dict):
        meta = {}
    return module, {str(k): str(v) for k, v in meta.items()}


__all__ = [
    "FORMATS",
    "ONNX_ATOL",
    "ONNX_OPSET",
    "PT2_ATOL",
    "SUFFIXES",
    "ExportedModel",
    "aoti_available",
    "check_destination",
    "check_exportable",
    "describe_model",
    "export_onnx",
    "export_program",
    "export_weights",
    "format_for",
    "load_exported",
]
