"""Inference runtimes beside vitkit's own serving path: OpenVINO and ONNX Runtime, fed from
vitkit's ONNX export (:func:`vitkit.export.export_onnx`), and the choice between them.

One exported file holds the whole model with three outputs (:data:`OUTPUTS`): the token sequence
(``forward_features``), the pooled representation the head reads (pre-logits) and the logits, so
that a runtime serves predictions, pooled embeddings and patch tokens alike, each from one call of
the runtime and without handing tensors back and forth to PyTorch (on 2 cores, a head in PyTorch
after the runtime cost 4-12% of a small model's time: the two thread pools take turns).
:class:`RuntimeModel` wraps such a runtime as a module that ``predict``, ``evaluate``,
``embed_folder`` and ``vitkit serve`` call as they call a vitkit model.

``backend="auto"`` (:func:`choose_backend`) measures once per model and machine whether an
installed runtime beats vitkit's own path (:func:`vitkit.inference.prepare_inference`) at the same
precision, with outputs within :data:`TOLERANCE` of fp32 eager, and records the decision in a JSON
file beside the weights (or in vitkit's cache folder where that is not writable): the next run
reads it and measures nothing. Where no runtime is installed, ``auto`` is vitkit's own path and
nothing is measured.

What each runtime runs in each precision:

- OpenVINO: fp32 (``INFERENCE_PRECISION_HINT`` f32); bf16 where the CPU computes it natively
  (:func:`vitkit.precision.bf16_support`); int8 by NNCF's post-training quantisation (transformer
  mode: SmoothQuant and bias correction) on calibration images.
- ONNX Runtime: fp32 after its transformer optimiser (fused LayerNorm, GELU, attention where its
  pattern matches); int8 by its dynamic quantisation of the products (weights int8, activations
  per batch); no bf16 on the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import UsageError
from .files import write_json
from .precision import ServingName

BACKENDS = ("auto", "torch", "openvino", "onnxruntime")
"""The choices of ``--backend``."""
RUNTIMES = ("openvino", "onnxruntime")
"""The inference runtimes vitkit can hand a model to."""
BACKEND_ENV = "VITKIT_BACKEND"
"""The environment variable that pins the commands' default backend (e.g. ``torch``)."""
_PACKAGES = {"openvino": "openvino", "onnxruntime": "onnxruntime"}
TOLERANCE = {"fp32": 1e-3, "bf16": 0.99, "int8": 0.98}
"""What a runtime's output must meet against fp32 eager to be chosen: fp32, the largest absolute
difference (times the largest output where that is above 1); bf16 and int8, the smallest cosine
similarity between one image's outputs."""
DECISION_VERSION = 2
AUTO_MAX_BATCH = 32
"""The largest batch ``auto`` measures on (a command that serves larger batches is measured at it)."""
OUTPUTS = ("tokens", "pooled", "logits")
"""What the exported file computes, in its order: the token sequence (B, N, D), the pooled
representation the head reads (B, F) and the logits (B, K)."""


def runtime_available(name: str) -> bool:
    """Whether the runtime's Python package is installed (and, for both, the ONNX exporter's).

    Args:
        name: "openvino" or "onnxruntime".

    Returns:
        True when the runtime can be used here.
    """
    needed = [_PACKAGES[name], "onnx", "onnxscript"]
    return all(importlib.util.find_spec(p) is not None for p in needed)


def runtime_precisions(name: str, calibrated: bool) -> tuple[str, ...]:
    """The precisions a runtime serves on this CPU.

    Args:
        name: "openvino" or "onnxruntime".
        calibrated: whether calibration images are at hand (OpenVINO's int8 needs them).

    Returns:
        A subset of ("fp32", "bf16", "int8").
    """
    from .precision import bf16_support

    if name == "onnxruntime":
        return ("fp32", "int8")
    out = ["fp32"]
    if bf16_support("cpu").native:
        out.append("bf16")
    if calibrated:
        out.append("int8")
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# The exported file


class _Outputs(nn.Module):
    """What is exported: the model's :data:`OUTPUTS` in one graph."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.cfg = model.cfg
        self.preprocessing = getattr(model, "preprocessing", None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = self.inner.forward_features(x)
        return tokens, self.inner.forward_head(tokens, pre_logits=True), self.inner.forward_head(tokens)


def model_key(model: nn.Module) -> str:
    """The identity of a model's weights (sha256 of its state dict), which keys its exported file
    and its decisions.

    Args:
        model: a vitkit model.

    Returns:
        64 hex digits.
    """
    from .eval.embed import model_digest

    return model_digest(model)


def runtime_dir() -> Path:
    """Where exported and converted files are kept: ``<vitkit cache>/runtimes``.

    Returns:
        The folder (created).
    """
    from .hub.cache import cache_dir

    folder = cache_dir() / "runtimes"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def exported_outputs(model: nn.Module, key: str | None = None) -> Path:
    """The model as an ONNX file of its :data:`OUTPUTS` (exported once, kept in :func:`runtime_dir`).

    Args:
        model: a vitkit model with ``cfg`` and ``forward_features``, on the CPU.
        key: :func:`model_key` of the model, if known.

    Returns:
        The ``.onnx`` file.

    Raises:
        ExportError: the model cannot be exported.
    """
    from .export import export_onnx

    key = key or model_key(model)
    path = runtime_dir() / f"{key[:32]}-outputs.onnx"
    if not path.exists():
        export_onnx(_Outputs(model.float().eval()), path, check=False)
    return path


# ----------------------------------------------------------------------------------------------
# Sessions: a function from an fp32 NCHW array and the outputs wanted (indices into OUTPUTS) to
# those outputs

Session = Callable[[np.ndarray, Sequence[int]], list[np.ndarray]]
"""A runtime's compiled model: ``run(images, which)`` gives the outputs ``which`` (indices into
:data:`OUTPUTS`) of images (B, C, H, W) fp32, as arrays the caller owns."""


def _threads() -> int:
    return torch.get_num_threads()


def onnxruntime_session(path: Path, precision: ServingName, threads: int | None = None) -> Session:
    """An ONNX Runtime session of ``path`` in ``precision`` ("fp32": the transformer optimiser's
    graph; "int8": dynamic quantisation of its products), on the CPU.

    Args:
        path: vitkit's ONNX export (input ``pixels``).
        precision: "fp32" or "int8".
        threads: intra-op threads (None: torch's).

    Returns:
        The :data:`Session`; ONNX Runtime computes only what the outputs asked for need.

    Raises:
        UsageError: a precision other than fp32 and int8.
    """
    import onnxruntime as ort

    model_path = _ort_optimized(path)
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # Without an 8-bit dot product (VNNI), x86 kernels add pairs of uint8 x int8 products in
        # 16 bits, which saturate on full-range weights: 7-bit weights there (ONNX Runtime's
        # reduce_range), as vitkit's own int8 does (vitkit.inference.int8_pairs_saturate).
        seven = cpu_saturates_int8_pairs()
        q = path.with_name(path.stem + f"-ort-dynamic-int8{'-7bit' if seven else ''}.onnx")
        if not q.exists():
            tmp = q.with_name(q.name + f".{os.getpid()}.tmp")
            with _quiet_root_logger():  # it advises its pre-processing step on every call
                quantize_dynamic(str(model_path), str(tmp), weight_type=QuantType.QInt8, reduce_range=seven)
            tmp.replace(q)
        model_path = q
    elif precision != "fp32":
        raise UsageError(f"onnxruntime serves fp32 and int8 on the CPU, not {precision}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or _threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    names = [o.name for o in session.get_outputs()]

    def run(x: np.ndarray, which: Sequence[int] = (0,)) -> list[np.ndarray]:
        return session.run([names[i] for i in which], {name: x})

    return run


def cpu_saturates_int8_pairs() -> bool:
    """Whether the runtimes' int8 kernels add uint8 x int8 pairs in 16 bits here, saturating on
    full-range weights: an x86 CPU without VNNI (an 8-bit dot-product instruction).

    Returns:
        True on such a CPU: quantise weights to 7 bits there.
    """
    from .cpu import cpu_info

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    flags = cpu_info()["flags"]
    return not (flags.get("avx512_vnni") or flags.get("avx_vnni") or flags.get("amx_int8"))


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _ort_optimized(path: Path) -> Path:
    """ONNX Runtime's transformer optimiser applied to ``path`` (once; kept beside it)."""
    out = path.with_name(path.stem + "-ort-opt.onnx")
    if out.exists():
        return out
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model

    graph = onnx.load(str(path))
    meta = {p.key: p.value for p in graph.metadata_props}
    try:
        cfg = json.loads(meta.get("vitkit.config", "{}"))
    except (ValueError, RecursionError):
        cfg = {}  # no heads or width known: the optimizer fuses without them
    cfg = cfg if isinstance(cfg, dict) else {}
    heads, width = int(cfg.get("num_heads", 0) or 0), int(cfg.get("width", 0) or 0)
    optimized = optimize_model(str(path), model_type="vit", num_heads=heads, hidden_size=width, opt_level=1)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    optimized.save_model_to_file(str(tmp))
    tmp.replace(out)
    return out


@functools.cache
def _openvino_core() -> Any:
    """The process's one ``openvino.Core``, which every session compiles on (OpenVINO's own
    advice: a Core holds the loaded device plugins, and ``auto`` builds and discards sessions)."""
    import openvino as ov

    return ov.Core()


def openvino_session(
    path: Path, precision: ServingName, calibration: np.ndarray | None = None, threads: int | None = None
) -> Session:
    """An OpenVINO compiled model of ``path`` on the CPU in ``precision``: "fp32", "bf16" (the
    CPU's native bf16) or "int8" (NNCF's post-training quantisation on ``calibration``, transformer
    mode: SmoothQuant and fast bias correction).

    Args:
        path: vitkit's ONNX export.
        precision: "fp32", "bf16" or "int8".
        calibration: int8: the calibration images (N, C, H, W) fp32.
        threads: inference threads (None: torch's).

    Returns:
        The :data:`Session`.

    Raises:
        UsageError: int8 without calibration images, or an unknown precision.
    """
    core = _openvino_core()
    model = core.read_model(str(path))
    if precision == "int8":
        if calibration is None or not len(calibration):
            raise UsageError("OpenVINO's int8 (NNCF) needs calibration images")
        model = nncf_int8(model, calibration)
    elif precision not in ("fp32", "bf16"):
        raise UsageError(f"OpenVINO serves fp32, bf16 and int8, not {precision}")
    config = {
        "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
        "INFERENCE_NUM_THREADS": threads or _threads(),
        "PERFORMANCE_HINT": "LATENCY",
    }
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()

    def run(x: np.ndarray, which: Sequence[int] = (0,)) -> list[np.ndarray]:
        out = request.infer({0: x}, share_inputs=True, share_outputs=True)  # copied below: only what is asked
        return [np.array(out[i], copy=True) for i in which]

    return run


def nncf_int8(model: Any, calibration: np.ndarray, batch: int = 8) -> Any:
    """NNCF's post-training int8 quantisation of an OpenVINO model in transformer mode.

    Args:
        model: an ``openvino.Model``.
        calibration: the calibration images (N, C, H, W) fp32.
        batch: images per calibration batch.

    Returns:
        The quantised ``openvino.Model``.
    """
    import nncf

    logging.getLogger("nncf").setLevel(logging.ERROR)
    batches = [calibration[i : i + batch] for i in range(0, len(calibration), batch)]
    return nncf.quantize(model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(batches))


def _check_runtime(name: str) -> None:
    if name not in RUNTIMES:
        raise UsageError(f"backend must be one of {', '.join(RUNTIMES)}, got {name!r}")
    if not runtime_available(name):
        raise UsageError(f"--backend {name}: the {_PACKAGES[name]} package is not installed (pip install {name})")


def runtime_session(name: str, path: Path, precision: ServingName, calibration: np.ndarray | None = None) -> Session:
    """:func:`openvino_session` or :func:`onnxruntime_session` by name.

    Args:
        name: "openvino" or "onnxruntime".
        path: vitkit's ONNX export.
        precision: "fp32", "bf16" or "int8".
        calibration: int8 on OpenVINO: the calibration images.

    Returns:
        The :data:`Session`.

    Raises:
        UsageError: a runtime that is not installed or does not serve ``precision`` here.
    """
    _check_runtime(name)
    if precision not in runtime_precisions(name, calibration is not None):
        why = " (its int8 needs calibration images)" if name == "openvino" and precision == "int8" else ""
        raise UsageError(f"--backend {name} does not serve {precision} on this machine{why}")
    if name == "openvino":
        return openvino_session(path, precision, calibration)
    return onnxruntime_session(path, precision)


# ----------------------------------------------------------------------------------------------
# The module the commands call


class RuntimeModel(nn.Module):
    """A vitkit model computed by a runtime: logits, the pooled representation and the token
    sequence each come from one call of the runtime's session of the whole model.

    Attributes the commands read (``cfg``, ``preprocessing``, ``load_report``, ``num_classes``,
    ``cls_token``...) are the source model's. ``input_dtype`` is fp32: the runtime carries its
    precision, so no autocast is put around it.

    Args:
        source: the vitkit model (its attributes are used; left unchanged).
        run: the runtime's :data:`Session` of the source's :data:`OUTPUTS`.
        backend: the runtime's name.
        precision: the precision it runs in.
    """

    def __init__(self, source: nn.Module, run: Session, backend: str, precision: ServingName) -> None:
        super().__init__()
        object.__setattr__(self, "source", source)  # not a submodule: its weights are not this module's
        self.run = run
        self.backend = backend
        self.precision = precision
        self.input_dtype = torch.float32

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "source"), name)

    def outputs(self, x: torch.Tensor, wanted: Sequence[str]) -> dict[str, torch.Tensor]:
        """Some of :data:`OUTPUTS` of a batch, from one call of the runtime.

        Args:
            x: images (B, C, H, W) on the CPU.
            wanted: names from :data:`OUTPUTS`.

        Returns:
            Each wanted output by name, fp32.

        Raises:
            UsageError: an input not on the CPU, or a name not in :data:`OUTPUTS`.
        """
        if x.device.type != "cpu":
            raise UsageError(f"the {self.backend} backend runs on the CPU; got an input on {x.device}")
        unknown = [w for w in wanted if w not in OUTPUTS]
        if unknown:
            raise UsageError(f"a runtime computes {', '.join(OUTPUTS)}, not {', '.join(unknown)}")
        names = list(dict.fromkeys(wanted))
        array = np.ascontiguousarray(x.detach().float().numpy())
        got = self.run(array, [OUTPUTS.index(n) for n in names])
        return {n: torch.from_numpy(a) for n, a in zip(names, got, strict=True)}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The token sequence, computed by the runtime.

        Args:
            x: images (B, C, H, W) on the CPU.

        Returns:
            The tokens (B, N, D), fp32.
        """
        return self.outputs(x, ["tokens"])["tokens"]

    def forward_pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled representation the head reads (``forward_head(forward_features(x),
        pre_logits=True)`` of the source), computed by the runtime.

        Args:
            x: images (B, C, H, W) on the CPU.

        Returns:
            The representation (B, F), fp32.
        """
        return self.outputs(x, ["pooled"])["pooled"]

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """The source model's head on tokens already computed, in PyTorch (for callers that hold
        tokens; :meth:`forward` and :meth:`forward_pre_logits` run the whole model in the runtime).

        Args:
            tokens: what :meth:`forward_features` returned.
            pre_logits: the pooled representation instead of the logits.

        Returns:
            Logits (B, K) or the representation (B, F).
        """
        return self.source.forward_head(tokens, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch, computed by the runtime.

        Args:
            x: images (B, C, H, W) on the CPU.

        Returns:
            The logits (B, K), fp32.
        """
        return self.outputs(x, ["logits"])["logits"]

    def extra_repr(self) -> str:
        """Which runtime, in which precision.

        Returns:
            E.g. ``backend=openvino, precision=fp32``.
        """
        return f"backend={self.backend}, precision={self.precision}"


def runtime_model(
    model: nn.Module,
    backend: str,
    precision: ServingName,
    calibration: torch.Tensor | None = None,
    key: str | None = None,
) -> RuntimeModel:
    """``model`` served by a runtime (exported once, then converted or quantised as the runtime needs).

    Args:
        model: a vitkit model on the CPU.
        backend: "openvino" or "onnxruntime".
        precision: "fp32", "bf16" or "int8".
        calibration: images (N, C, H, W) for OpenVINO's int8.
        key: :func:`model_key` of the model, if known.

    Returns:
        The :class:`RuntimeModel`.

    Raises:
        UsageError: a runtime not installed, or a precision it does not serve here.
        ExportError: the model cannot be exported to ONNX.
    """
    _check_runtime(backend)
    path = exported_outputs(model, key)
    calib = None if calibration is None else calibration.detach().float().cpu().numpy()
    run = runtime_session(backend, path, precision, calib)
    return RuntimeModel(model, run, backend, precision)


# ----------------------------------------------------------------------------------------------
# auto: measured once per model and machine, recorded beside the weights


@dataclass
class Decision:
    """What ``backend="auto"`` chose for a model, precision and machine, and why.

    Attributes:
        backend: "torch" (vitkit's own path), "openvino" or "onnxruntime".
        precision: the precision compared.
        machine: the CPU, threads and package versions the decision holds for.
        images_per_s: per candidate, images a second of the logits on the measured batch.
        agreement: per runtime, ``max_abs_diff`` and ``min_cosine`` against fp32 eager (of the
            output further from it), ``within`` (:data:`TOLERANCE`, tokens and logits both), and
            ``outputs``: the same for the tokens and the logits apart.
        batch: the images per batch measured.
        file: the JSON file the decision is recorded in (None: not recorded).
        cached: read from that file rather than measured now.
        reason: why nothing was measured (no runtime installed), else None.
        measured_at: when it was measured (UTC).
    """

    backend: str
    precision: ServingName
    machine: str
    images_per_s: dict[str, float]
    agreement: dict[str, dict[str, Any]]
    batch: int
    file: str | None = None
    cached: bool = False
    reason: str | None = None
    measured_at: str | None = None


def machine_key() -> str:
    """The machine a decision holds for: the CPU model, torch's threads and the versions of torch
    and of the runtimes installed.

    Returns:
        One line.
    """
    from importlib.metadata import PackageNotFoundError, version

    from .cpu import cpu_info

    parts = [str(cpu_info()["model"]), f"{_threads()} threads", f"torch {torch.__version__}"]
    for name in RUNTIMES:
        with contextlib.suppress(PackageNotFoundError):
            parts.append(f"{name} {version(name)}")
    return "; ".join(parts)


def decision_file(model: nn.Module, key: str) -> Path:
    """Where decisions about ``model`` are recorded: ``<weights file>.backend.json`` (a run
    folder: ``backend.json`` in it) where that folder is writable, else vitkit's cache folder.

    Args:
        model: a model loaded by vitkit (its ``load_report`` names the file), or any model.
        key: :func:`model_key` of the model.

    Returns:
        The JSON file (it may not exist yet).
    """
    report = getattr(model, "load_report", None)
    path = Path(report.path) if report is not None and getattr(report, "path", None) else None
    if path is not None and path.exists():
        target = path / "backend.json" if path.is_dir() else path.with_name(path.name + ".backend.json")
        if os.access(target.parent, os.W_OK) and (not target.exists() or os.access(target, os.W_OK)):
            return target
    return runtime_dir() / f"{key[:32]}-backend.json"


def _read_decisions(path: Path, key: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}  # damaged: measured again
    ok = isinstance(data, dict) and data.get("version") == DECISION_VERSION and data.get("weights_sha256") == key
    return data.get("decisions", {}) if ok and isinstance(data.get("decisions"), dict) else {}


def agreement(got: np.ndarray, want: np.ndarray, precision: ServingName) -> dict[str, Any]:
    """How closely a runtime's outputs follow fp32 eager's, and whether within :data:`TOLERANCE`.

    Args:
        got: the runtime's outputs (B, ...).
        want: fp32 eager's (B, ...).
        precision: the precision the runtime ran in (which test applies).

    Returns:
        ``{"max_abs_diff", "min_cosine", "within"}``.
    """
    g, w = got.reshape(len(got), -1).astype(np.float64), want.reshape(len(want), -1).astype(np.float64)
    if g.shape != w.shape:
        return {"max_abs_diff": None, "min_cosine": None, "within": False}
    diff = float(np.abs(g - w).max()) if g.size else 0.0
    ng, nw = np.linalg.norm(g, axis=1), np.linalg.norm(w, axis=1)
    # an image whose outputs are zero on both sides (a head still at its zero init) agrees
    rows = np.where((ng == 0) & (nw == 0), 1.0, np.sum(g * w, axis=1) / np.maximum(ng * nw, 1e-30))
    cos = float(np.min(rows)) if g.size else 1.0
    if precision == "fp32":
        within = diff <= TOLERANCE["fp32"] * max(1.0, float(np.abs(w).max()))
    else:
        within = cos >= TOLERANCE[precision]
    return {"max_abs_diff": diff, "min_cosine": cos, "within": bool(within and np.isfinite(g).all())}


def _candidates(precision: ServingName, calibrated: bool) -> list[str]:
    return [r for r in RUNTIMES if runtime_available(r) and precision in runtime_precisions(r, calibrated)]


def _seconds(fn: Callable[[], object], repeats: int) -> float:
    from .cpu import best_seconds

    return best_seconds(fn, repeats=repeats, untimed=1)


def _measure(
    model: nn.Module,
    precision: ServingName,
    runtimes: Sequence[str],
    calibration: torch.Tensor | None,
    batch: int,
    key: str,
) -> tuple[dict[str, float], dict[str, dict[str, Any]], dict[str, RuntimeModel]]:
    """Images a second of the logits of vitkit's own path and of each runtime on one random batch
    (what ``predict``, ``eval`` and ``serve`` compute), and each runtime's agreement with fp32 eager
    in its tokens and its logits (both must be within :data:`TOLERANCE`). Returns (images a second,
    agreement, the runtime models)."""
    from .inference import onednn_int8_available, prepare_inference

    cfg = model.cfg
    x = torch.randn(batch, cfg.in_chans, *cfg.img_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        eager = model.float().eval()
        tokens = eager.forward_features(x)
        want = {"tokens": tokens.numpy(), "logits": eager.forward_head(tokens).numpy()}
        static = precision == "int8" and calibration is not None and onednn_int8_available()
        own = prepare_inference(model, precision, calibration=calibration if static else None)
        xo = x.to(own.input_dtype)
        speed = {"torch": batch / _seconds(lambda m=own, a=xo: m(a), 3)}
        quality: dict[str, dict[str, Any]] = {}
        built: dict[str, RuntimeModel] = {}
        for name in runtimes:
            runner = runtime_model(model, name, precision, calibration, key)
            got = runner.outputs(x, ["tokens", "logits"])
            parts = {part: agreement(got[part].numpy(), want[part], precision) for part in want}
            worst = parts["tokens"] if not parts["tokens"]["within"] else parts["logits"]
            quality[name] = {**worst, "within": all(p["within"] for p in parts.values()), "outputs": parts}
            speed[name] = batch / _seconds(lambda r=runner, a=x: r(a), 3)
            built[name] = runner
    return speed, quality, built


def choose_backend(
    model: nn.Module,
    precision: ServingName,
    calibration: torch.Tensor | None = None,
    batch: int = 8,
    remeasure: bool = False,
) -> tuple[Decision, RuntimeModel | None]:
    """What ``backend="auto"`` serves ``model`` with in ``precision`` on this machine: the fastest
    of vitkit's own path and each installed runtime whose outputs are within :data:`TOLERANCE`
    of fp32 eager. Measured once per model (its weights), precision, batch and machine
    (:func:`machine_key`) and recorded in :func:`decision_file`; later calls read the record.

    Args:
        model: a vitkit model on the CPU, in fp32.
        precision: "fp32", "bf16" or "int8".
        calibration: images (N, C, H, W) for static int8 (vitkit's and OpenVINO's); None: int8
            is dynamic (vitkit's and ONNX Runtime's only).
        batch: the images per batch it is measured on.
        remeasure: measure again even where a decision is recorded.

    Returns:
        (the decision, the runtime model where a runtime won and was built now, else None).
    """
    runtimes = _candidates(precision, calibration is not None)
    if not runtimes:
        reason = "no inference runtime installed serves this precision here"
        return Decision("torch", precision, machine_key(), {}, {}, batch, reason=reason), None
    key = model_key(model)
    path = decision_file(model, key)
    calibrated = " calibrated" if precision == "int8" and calibration is not None else ""
    entry = f"{precision} batch {batch}{calibrated} | {machine_key()}"
    decisions = _read_decisions(path, key)
    if entry in decisions and not remeasure:
        return Decision(**{**decisions[entry], "file": str(path), "cached": True}), None
    speed, quality, built = _measure(model, precision, runtimes, calibration, batch, key)
    fair = ["torch"] + [r for r in runtimes if quality[r]["within"]]
    best = max(fair, key=lambda name: speed[name])
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    decision = Decision(best, precision, machine_key(), speed, quality, batch, file=str(path), measured_at=now)
    decisions[entry] = {k: v for k, v in asdict(decision).items() if k not in ("file", "cached")}
    try:
        write_json(path, {"version": DECISION_VERSION, "weights_sha256": key, "decisions": decisions})
    except OSError:
        decision.file = None
    return decision, built.get(best)


def default_backend() -> str:
    """The backend a command uses when none is asked for: :data:`BACKEND_ENV` where it is set,
    else "auto" (the fastest installed path here, measured once; vitkit's own where no runtime
    is installed).

    Returns:
        "auto", "torch", "openvino" or "onnxruntime".

    Raises:
        UsageError: :data:`BACKEND_ENV` set to another value.
    """
    pinned = os.environ.get(BACKEND_ENV, "").strip()
    if pinned and pinned not in BACKENDS:
        raise UsageError(f"{BACKEND_ENV}={pinned!r}: must be one of {', '.join(BACKENDS)}")
    return pinned or "auto"


def serving_backend(
    model: nn.Module,
    backend: str,
    precision: ServingName,
    device: str | torch.device = "cpu",
    calibration: torch.Tensor | Iterable[torch.Tensor] | None = None,
    batch: int | None = None,
) -> tuple[RuntimeModel | None, Decision | None]:
    """What a command computes with under ``--backend``: a runtime model, or None for vitkit's own
    path (the command then runs as without the option).

    Args:
        model: the loaded vitkit model.
        backend: "auto", "torch", "openvino" or "onnxruntime".
        precision: "fp32", "bf16" or "int8" (resolved).
        device: where the command runs; runtimes serve the CPU only ("auto" is "torch" elsewhere).
        calibration: images for static int8 (a tensor or batches of them); None: none.
        batch: the images one call of the command computes, which ``auto`` measures on (at most
            :data:`AUTO_MAX_BATCH`); None: 8.

    Returns:
        (the runtime model or None, the decision of "auto", None otherwise).

    Raises:
        UsageError: an unknown backend, a runtime on a GPU, not installed, or not serving
            ``precision``; ExportError: a model ONNX cannot hold.
    """
    if backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    on_cpu = torch.device(device).type == "cpu"
    if backend == "torch" or (backend == "auto" and not on_cpu):
        return None, None
    if not on_cpu:
        raise UsageError(f"--backend {backend} runs on the CPU; use --backend torch (or auto) on {device}")
    calib = calibration
    if calib is not None and not isinstance(calib, torch.Tensor):
        calib = torch.cat([b[0] if isinstance(b, (tuple, list)) else b for b in calib])
    model = model.float().eval()
    if backend != "auto":
        return runtime_model(model, backend, precision, calib), None
    measured = 8 if batch is None else max(1, min(int(batch), AUTO_MAX_BATCH))
    decision, runner = choose_backend(model, precision, calib, batch=measured)
    if decision.backend == "torch":
        return None, decision
    return runner or runtime_model(model, decision.backend, precision, calib), decision


__all__ = [
    "AUTO_MAX_BATCH",
    "BACKENDS",
    "BACKEND_ENV",
    "OUTPUTS",
    "RUNTIMES",
    "TOLERANCE",
    "Decision",
    "RuntimeModel",
    "Session",
    "agreement",
    "choose_backend",
    "cpu_saturates_int8_pairs",
    "decision_file",
    "default_backend",
    "exported_outputs",
    "machine_key",
    "model_key",
    "nncf_int8",
    "onnxruntime_session",
    "openvino_session",
    "runtime_available",
    "runtime_model",
    "runtime_precisions",
    "runtime_session",
    "serving_backend",
]
