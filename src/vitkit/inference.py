"""Serving: a model's weights prepared once for inference.

:func:`prepare_inference` returns an inference-only copy of a model in fp32, bf16 or int8. On x86
CPUs its fp32 and bf16 linear layers run through oneDNN with the weights reordered once into the
kernel's blocked layout (:class:`PackedLinear`), and the MLP's GELU is fused into the first dense
layer. Why: ``nn.Linear`` in fp32 calls MKL's sgemm, which on AMD processors takes its AVX2 code
path even where the CPU has AVX-512, while oneDNN's kernel uses AVX-512; in bf16 ``nn.Linear``
reorders the weight into oneDNN's blocked layout on every call, where the packed weight was
reordered once. ``benchmarks/RESULTS.md`` has the measurements. Elsewhere (CUDA, builds without
oneDNN) the layers are left as they are.

Which library is fast depends on the CPU (MKL takes AMX or AVX-512 paths on Intel, AVX2 on AMD;
oneDNN's kernels differ again), so by default no assumption is kept: :func:`prepare_inference`
times both candidates on each distinct layer shape of the model (:func:`choose_linear_kernel`)
and keeps the faster, remembering the decision per CPU model and shape for the process.
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import math
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .cpu import cpu_info
from .models.adapters import adapted_layers, merge_adapters
from .models.vit import Attention, Block, Mlp
from .precision import SERVING_PRECISIONS, Precision, ServingName, ServingPrecision, bf16_support, serving_precision
from .runtime import PINS, fastest, pinned, record_choice

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
log = logging.getLogger("vitkit")


def onednn_linear_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU have oneDNN's packed linear kernels in ``dtype`` (bf16
    needs AVX-512 on x86).

    Args:
        dtype: the dtype the layers would compute in, ``torch.float32`` or ``torch.bfloat16``.

    Returns:
        True when :class:`PackedLinear` can run in ``dtype`` here.
    """
    mkldnn = torch.ops.mkldnn
    ok = (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_linear_pointwise")
        and hasattr(mkldnn, "_reorder_linear_weight")
    )
    if ok and dtype == torch.bfloat16:
        ok = bool(getattr(mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    return ok


def _check_serving_input(layer: str, x: torch.Tensor) -> None:
    if x.device.type != "cpu":
        raise ValueError(f"{layer} runs on the CPU only; got an input on {x.device}")
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError(
            f"{layer} is inference-only (no gradient flows through it); take gradients through the "
            "original model, not the one prepare_inference returned"
        )


def _epilogue(act: str | None) -> tuple[str, str]:
    """oneDNN's (post-op, algorithm) for a fused activation: None, "gelu" or "gelu_tanh"."""
    if act is None:
        return "none", ""
    if act in ("gelu", "gelu_tanh"):
        return "gelu", "tanh" if act == "gelu_tanh" else "none"
    raise ValueError(f"act must be None, 'gelu' or 'gelu_tanh', got {act!r}")


# ----------------------------------------------------------------------------------------------
# torch.compile: the packed weights are opaque oneDNN tensors that Inductor cannot trace, so under
# compilation each serving layer is one custom operator that names its layer by a handle. Inductor
# calls it as it is and fuses everything between two such calls (LayerNorm with the int8
# quantisation that follows it, softmax, residual adds, layout copies). The handle, like a static
# int8 scale, is a (non-persistent) buffer: a graph input rather than a constant Dynamo guards on,
# so one compiled graph serves every prepared model of an architecture instead of recompiling per
# model. Handles are local to the process: do not ``torch.export`` a served model to save it.

_LAYERS: weakref.WeakValueDictionary[int, nn.Module] = weakref.WeakValueDictionary()
_HANDLES = itertools.count()


def _register(layer: nn.Module) -> torch.Tensor:
    handle = next(_HANDLES)
    _LAYERS[handle] = layer
    return torch.tensor(handle)


def _layer(handle: torch.Tensor) -> PackedLinear | Int8Linear:
    layer = _LAYERS.get(int(handle))
    if layer is None:
        raise RuntimeError(
            f"serving layer {int(handle)} does not exist in this process: a compiled or exported model outlived "
            "the model it was made from"
        )
    return layer  # type: ignore[return-value]


@torch.library.custom_op("vitkit::serving_linear", mutates_args=())
def _serving_linear(x: torch.Tensor, handle: torch.Tensor, out_features: int, out_dtype: torch.dtype) -> torch.Tensor:
    return _layer(handle).run(x, out_dtype)


@_serving_linear.register_fake
def _(x: torch.Tensor, handle: torch.Tensor, out_features: int, out_dtype: torch.dtype) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features, dtype=out_dtype)


class PackedLinear(nn.Module):
    """``nn.Linear`` for CPU inference with its weight reordered once for oneDNN.

    ``act`` ("gelu" or "gelu_tanh") fuses that activation into the kernel's epilogue. The packed
    weight is an opaque oneDNN tensor: it is not part of ``state_dict`` (save the original
    model), has no gradient, and lives on the CPU only.

    Args:
        weight: the weight (out_features, in_features), in the dtype the layer computes in.
        bias: the bias (out_features,), cast to that dtype; None: none.
        act: the activation fused after the product: "gelu", "gelu_tanh" or None.
        rows_hint: the number of input rows oneDNN chooses the packed layout for; None: no hint.

    Raises:
        ValueError: an unknown ``act``.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None = None, rows_hint: int | None = None
    ) -> None:
        super().__init__()
        self.post = _epilogue(act)
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.act = act
        self.rows_hint = rows_hint
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows_hint)
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()
        self.register_buffer("handle", _register(self), persistent=False)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, dtype: torch.dtype, act: str | None = None, rows_hint: int | None = None
    ) -> PackedLinear:
        """The packed counterpart of ``linear``.

        Args:
            linear: the layer whose weight and bias to pack (left as it is).
            dtype: the dtype the packed layer computes in (``torch.float32`` or ``torch.bfloat16``).
            act: the activation fused after the product: "gelu", "gelu_tanh" or None.
            rows_hint: the number of input rows oneDNN chooses the packed layout for; None: no hint.

        Returns:
            The new layer.

        Raises:
            ValueError: an unknown ``act``.
        """
        return cls(linear.weight.to(dtype), linear.bias, act, rows_hint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer (and its fused activation).

        Args:
            x: inputs of shape (..., in_features), on the CPU, in the layer's dtype, not requiring
                gradients.

        Returns:
            The outputs, of shape (..., out_features), in the layer's dtype.

        Raises:
            ValueError: ``x`` is not on the CPU.
            RuntimeError: ``x`` requires gradients while gradients are enabled.
            TypeError: ``x`` is not in the layer's dtype.
        """
        _check_serving_input("PackedLinear", x)
        if x.dtype != self.dtype:
            raise TypeError(f"PackedLinear holds {self.dtype} weights but got a {x.dtype} input")
        if torch.compiler.is_compiling():
            return _serving_linear(x, self.handle, self.out_features, x.dtype)
        return self.run(x)

    def run(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The kernel itself, without the checks of ``forward``. The output is always in ``x``'s
        dtype; ``out_dtype`` is there because the compiled op calls every serving layer alike.

        Args:
            x: inputs of shape (..., in_features) in the layer's dtype.
            out_dtype: ignored.

        Returns:
            The outputs, of shape (..., out_features), in ``x``'s dtype.
        """
        post, algorithm = self.post
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, post, [], algorithm)

    def __deepcopy__(self, memo: dict[int, Any]) -> PackedLinear:
        bias = None if self.bias is None else self.bias.clone()
        return PackedLinear(self.packed.to_dense(), bias, self.act, self.rows_hint).train(self.training)

    def extra_repr(self) -> str:
        """The layer's sizes, dtype and fused activation, for ``repr``.

        Returns:
            E.g. ``in_features=768, out_features=3072, dtype=torch.bfloat16, act=gelu``.
        """
        act = f", act={self.act}" if self.act else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}{act}"


def onednn_int8_available() -> bool:
    """Whether this torch build has oneDNN's int8 linear kernels.

    Returns:
        True when :class:`Int8Linear` can run here.
    """
    onednn = getattr(torch.ops, "onednn", None)
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(onednn, "qlinear_pointwise")
        and hasattr(onednn, "qlinear_prepack")
        and hasattr(torch, "quantize_per_tensor")
    )


def _quantize_activations(
    x: torch.Tensor, scale: float | None = None, zero_point: int | None = None
) -> tuple[torch.Tensor, float, int]:
    """Asymmetric uint8 codes of ``x``, one scale per tensor: the given (static) scale and zero
    point, or this batch's range (dynamic quantisation)."""
    if scale is None or zero_point is None:
        scale, zero_point = _range_to_qparams(*_finite_range(x))
    with warnings.catch_warnings():  # quantized tensors are deprecated; only the fused kernel is used
        warnings.simplefilter("ignore")
        qt = torch.quantize_per_tensor(x.float(), scale, zero_point, torch.quint8)
    # The kernel takes plain uint8: alias the quantised tensor's bytes (``int_repr`` would copy them).
    q = torch.empty(0, dtype=torch.uint8).set_(qt.untyped_storage(), qt.storage_offset(), qt.shape, qt.stride())
    return q, scale, zero_point


def _fp32_reciprocal(scale: float) -> float:
    """``1.0f / scale`` in fp32, as the quantisation kernel computes it."""
    return (torch.ones((), dtype=torch.float32) / scale).item()


def _quantize_traceable(
    x: torch.Tensor, inverse_scale: float | torch.Tensor, zero_point: int | torch.Tensor
) -> torch.Tensor:
    """What ``torch.quantize_per_tensor`` computes, as ops that ``torch.compile`` fuses: ``x`` times
    the fp32 reciprocal of the scale (:func:`_fp32_reciprocal`) plus the zero point, rounded half
    to even, clamped to uint8. The kernel does the multiply-add in one rounding (FMA); here it may
    take two, which can move a value that lands within an ulp of a half by one code."""
    return torch.clamp(torch.round(x.float() * inverse_scale + zero_point), 0, 255).to(torch.uint8)


def _finite_range(x: torch.Tensor) -> tuple[float, float]:
    lo, hi = torch.aminmax(x)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"Int8Linear got a non-finite input (range {lo} .. {hi}); it cannot be quantised")
    return lo, hi


def _range_to_qparams(lo: float, hi: float) -> tuple[float, int]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / 255.0, 1e-8)
    return scale, min(max(round(-lo / scale), 0), 255)


@functools.cache
def int8_pairs_saturate() -> bool:
    """Whether oneDNN's int8 kernel on this CPU adds pairs of uint8 x int8 products in 16 bits
    with saturation, as it does without the VNNI dot-product instructions (AVX2-only CPUs, or
    AVX-512 ones of before VNNI): 255 x 127 x 2 overflows int16, so 8-bit weights would clip
    sums. Measured once a process on a product whose pairs overflow (64 inputs of code 255 times
    weights of 127); where it saturates :class:`Int8Linear` quantises weights to 7 bits, which
    cannot overflow (255 x 64 x 2 < 32768), as oneDNN's guide advises."""
    w = torch.full((1, 64), 127, dtype=torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(w, None)
    x = torch.full((1, 64), 255, dtype=torch.uint8)
    one, zero = torch.ones(1), torch.zeros(1, dtype=torch.int64)
    y = torch.ops.onednn.qlinear_pointwise(
        x, 1.0, 0, packed, one, zero, None, 1.0, 0, torch.float32, "none", [], ""
    )  # fmt: skip
    return float(y.flatten()[0]) != 64 * 255 * 127


class Int8Linear(nn.Module):
    """``nn.Linear`` for CPU inference in int8 on oneDNN's int8 dot-product kernels (VNNI).

    Weights: symmetric int8, one scale per output channel, packed once (7-bit codes where the
    CPU's kernel would saturate 8-bit ones, :func:`int8_pairs_saturate`). Activations: asymmetric
    uint8 with one scale per tensor, either taken from each batch's range (dynamic quantisation,
    as ``torch.ao.quantization.quantize_dynamic``) or fixed by :func:`calibrate_int8` (static).
    The output is dequantised to the input's dtype with ``act`` ("gelu", "gelu_tanh") fused into
    the kernel, or, where the next layer's input scale is known (``output_qparams``), written
    directly as that layer's uint8 codes; such an input (dtype uint8) is taken as it is.

    Args:
        linear: the layer to quantise (left as it is).
        act: the activation fused after the product: "gelu", "gelu_tanh" or None.
        out_dtype: the dtype of the dequantised output; None: the input's.

    Raises:
        ValueError: an unknown ``act``.
    """

    def __init__(self, linear: nn.Linear, act: str | None = None, out_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.post = _epilogue(act)
        w = linear.weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.act = act
        self.out_dtype = out_dtype  # None: the input's dtype
        top = 63 if int8_pairs_saturate() else 127
        scale = (w.abs().amax(dim=1) / top).clamp(min=1e-12)
        wq = torch.round(w / scale[:, None]).clamp(-top - 1, top).to(torch.int8)
        self.w_scale = scale
        self.w_zero_point = torch.zeros(self.out_features, dtype=torch.int64)
        self.packed = torch.ops.onednn.qlinear_prepack(wq, None)
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.register_buffer("handle", _register(self), persistent=False)
        # under torch.compile: (1 / scale, zero point) of a static input scale, as a graph input
        self.register_buffer("_quant", None, persistent=False)
        self.input_qparams = None  # static input scale and zero point (a property)
        self.output_qparams = None  # uint8 output with this scale and zero point (a property)
        self.observed: tuple[float, float] | None = None  # input range seen while calibrating
        self.observing = False

    @property
    def input_qparams(self) -> tuple[float, int] | None:
        """The static input (scale, zero point) :func:`calibrate_int8` set; None: each batch's own
        range (dynamic quantisation)."""
        return self._input_qparams

    @input_qparams.setter
    def input_qparams(self, qparams: tuple[float, int] | None) -> None:
        self._input_qparams = qparams
        self._quant = None if qparams is None else torch.tensor([_fp32_reciprocal(qparams[0]), qparams[1]])

    @property
    def output_qparams(self) -> tuple[float, int] | None:
        """The (scale, zero point) of the uint8 codes the layer writes for the next layer; None:
        the output is dequantised."""
        return self._output_qparams

    @output_qparams.setter
    def output_qparams(self, qparams: tuple[float, int] | None) -> None:
        self._output_qparams = qparams
        self._writes_codes = qparams is not None  # what a compiled graph may depend on: not the values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Quantise ``x`` and apply the layer (and its fused activation).

        Args:
            x: inputs of shape (..., in_features) on the CPU, not requiring gradients: floats, or
                uint8 codes of the static input scale (what a calibrated layer before it writes).

        Returns:
            The outputs, of shape (..., out_features), in :meth:`output_dtype`.

        Raises:
            ValueError: ``x`` is not on the CPU, or holds a non-finite value (dynamic scale).
            RuntimeError: ``x`` requires gradients while gradients are enabled.
            TypeError: ``x`` is uint8 codes but the layer has no static input scale.
        """
        _check_serving_input("Int8Linear", x)
        if not torch.compiler.is_compiling():
            return self.run(x)
        out_dtype = self.output_dtype(x.dtype)
        if x.dtype != torch.uint8 and self._quant is not None and not self.observing:
            if self._quant.dtype != torch.float32:
                raise TypeError(
                    f"the int8 model was converted to {self._quant.dtype} after calibration; prepare it again"
                )
            # static scale: the quantisation is plain arithmetic that fuses into the op before it
            x = _quantize_traceable(x, self._quant[0], self._quant[1])
        return _serving_linear(x, self.handle, self.out_features, out_dtype)

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        """The dtype of the output for an input of ``input_dtype`` (float, or uint8 codes).

        Args:
            input_dtype: the dtype of the layer's input.

        Returns:
            uint8 where the layer writes the next layer's codes (``output_qparams`` set), else the
            layer's ``out_dtype``, else ``input_dtype``.

        Raises:
            TypeError: ``input_dtype`` is uint8 and the layer has neither ``out_dtype`` nor
                ``output_qparams``.
        """
        if self._writes_codes:
            return torch.uint8
        if self.out_dtype is not None:
            return self.out_dtype
        if input_dtype == torch.uint8:
            raise TypeError("an Int8Linear without out_dtype cannot tell the output dtype from uint8 codes")
        return input_dtype

    def run(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Quantise ``x`` (unless it is uint8 codes already) and call the kernel; the output in
        ``out_dtype``, by default :meth:`output_dtype`. While :func:`calibrate_int8` observes the
        layer, the range of ``x`` is recorded too.

        Args:
            x: inputs of shape (..., in_features): floats, or uint8 codes of the static input scale.
            out_dtype: the dtype of the output (None: :meth:`output_dtype`).

        Returns:
            The outputs, of shape (..., out_features).

        Raises:
            TypeError: ``x`` is uint8 codes but the layer has no static input scale.
            ValueError: ``x`` holds a non-finite value (dynamic scale, or while calibrating).
        """
        out_dtype = out_dtype or self.output_dtype(x.dtype)
        if x.numel() == 0:
            return x.new_empty(*x.shape[:-1], self.out_features, dtype=out_dtype)
        if x.dtype == torch.uint8:
            if self.input_qparams is None:
                raise TypeError("Int8Linear got uint8 codes but has no static input scale (calibrate_int8 sets it)")
            q, (scale, zp) = x, self.input_qparams
        else:
            if self.observing:
                lo, hi = _finite_range(x)
                if self.observed is not None:
                    lo, hi = min(lo, self.observed[0]), max(hi, self.observed[1])
                self.observed = (lo, hi)
            q, scale, zp = _quantize_activations(x, *(self.input_qparams or (None, None)))
        y_scale, y_zp = self.output_qparams or (1.0, 0)
        post, algorithm = self.post
        return torch.ops.onednn.qlinear_pointwise(
            q, scale, zp, self.packed, self.w_scale, self.w_zero_point, self.bias, y_scale, y_zp,
            out_dtype, post, [], algorithm,
        )  # fmt: skip

    def __deepcopy__(self, memo: dict[int, Any]) -> Int8Linear:
        raise TypeError("an Int8Linear cannot be copied; prepare the original model again")

    def extra_repr(self) -> str:
        """The layer's sizes, quantisation mode (static or dynamic) and fused activation, for ``repr``.

        Returns:
            E.g. ``in_features=768, out_features=3072, int8 dynamic, act=gelu``.
        """
        act = f", act={self.act}" if self.act else ""
        mode = "static" if self.input_qparams is not None else "dynamic"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 {mode}{act}"


def _require_finite_input(module: nn.Module, args: tuple[Any, ...]) -> None:
    x = args[0] if args else None
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return
    if torch.compiler.is_compiling():  # a check inside the graph (RuntimeError), no graph break
        torch._assert_async(torch.isfinite(x).all(), "the int8 model got a non-finite input; it cannot be quantised")
    elif not torch.isfinite(x).all():
        raise ValueError(f"the int8 model got a non-finite input (shape {tuple(x.shape)}); it cannot be quantised")


def calibrate_int8(model: nn.Module, batches: torch.Tensor | Iterable[torch.Tensor | tuple[torch.Tensor, Any]]) -> int:
    """Fix the input scale of every :class:`Int8Linear` in ``model`` (prepared with
    ``prepare_inference(..., "int8")``) from the range its input takes on ``batches``: images, or
    an iterable of image batches or of (images, labels) pairs such as
    :func:`vitkit.eval.model_inputs` gives, a few hundred images in all (static quantisation).
    Where an MLP's first layer feeds its second, the first then writes the second's uint8 codes
    directly, so the widest activation of the block is never quantised on its own. Inputs outside
    the calibrated range are clamped to it; a non-finite input is refused (``ValueError``, or
    ``RuntimeError`` from inside a ``torch.compile`` graph). Returns the number of layers calibrated. If it fails,
    the model is left as it was. Not to be called while another thread runs the model.

    Args:
        model: a model :func:`prepare_inference` returned with precision "int8" on oneDNN; changed
            in place.
        batches: one tensor of images (N, C, H, W), or an iterable of such tensors or of
            (images, labels) pairs; the images are converted to the model's ``input_dtype``.

    Returns:
        The number of :class:`Int8Linear` layers calibrated.

    Raises:
        ValueError: ``model`` has no :class:`Int8Linear` layer, ``batches`` holds no image, a layer
            saw no input, or an input was not finite.
    """
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    if not layers:
        raise ValueError("calibrate_int8 needs a model prepared with prepare_inference(model, 'int8')")
    if isinstance(batches, torch.Tensor):
        batches = [batches]
    before = [(layer.input_qparams, layer.output_qparams) for layer in layers]
    for layer in layers:
        layer.input_qparams = layer.output_qparams = layer.observed = None
        layer.observing = True
    seen = 0
    try:
        with torch.inference_mode():
            for images in batches:
                images = images[0] if isinstance(images, (tuple, list)) else images
                model(images.to(getattr(model, "input_dtype", torch.float32)))
                seen += len(images)
        if not seen:
            raise ValueError("calibrate_int8 got no images")
        for layer in layers:
            if layer.observed is None:
                raise ValueError(f"calibrate_int8: {layer} saw no input; is it used by the model's forward?")
    except BaseException:
        for layer, (inp, out) in zip(layers, before, strict=True):
            layer.input_qparams, layer.output_qparams = inp, out
        raise
    finally:
        for layer in layers:
            layer.observing = False
    for layer in layers:
        layer.input_qparams = _range_to_qparams(*layer.observed)
    for mlp in model.modules():
        # exactly vitkit's Mlp, whose forward goes fc1 -> (fused GELU) -> dropout (eval: none) -> fc2
        fused = type(mlp) is Mlp and isinstance(mlp.act, nn.Identity) and not mlp.drop1.training
        if fused and isinstance(mlp.fc1, Int8Linear) and isinstance(mlp.fc2, Int8Linear):
            mlp.fc1.output_qparams = mlp.fc2.input_qparams  # fc1 writes fc2's codes
    if not hasattr(model, "_finite_input_check"):
        # Static scales no longer look at each batch's range, which is where a non-finite input
        # used to be caught; quantised, a NaN would become an ordinary code and a wrong answer.
        model._finite_input_check = model.register_forward_pre_hook(_require_finite_input)
    return len(layers)


def _smoothable(model: nn.Module) -> list[tuple[nn.LayerNorm, nn.Linear]]:
    """The (LayerNorm, linear layer) pairs of vitkit's blocks where the norm's output feeds only
    that layer: qkv after ``norm1``, an MLP's first layer after ``norm2``."""
    pairs = []
    for block in model.modules():
        if type(block) is not Block:
            continue
        candidates = [(block.norm1, getattr(block.attn, "qkv", None))]
        if type(block.mlp) is Mlp:
            candidates.append((block.norm2, block.mlp.fc1))
        for norm, linear in candidates:
            if type(norm) is nn.LayerNorm and norm.elementwise_affine and type(linear) is nn.Linear:
                pairs.append((norm, linear))
    return pairs


@torch.inference_mode()
def smooth_activations(
    model: nn.Module, batches: torch.Tensor | Iterable[torch.Tensor | tuple[torch.Tensor, Any]], alpha: float = 0.5
) -> int:
    """Activation smoothing (SmoothQuant, Xiao et al. 2023) of an fp32 model in place, before its
    linear layers are quantised: the few input channels of a layer with outliers make one
    per-tensor activation scale coarse for all the others. Each input channel ``j`` of a layer
    that reads a LayerNorm's output is divided by ``s_j = max|x_j|^alpha / max|w_j|^(1 - alpha)``
    (folded into the norm's scale and shift) and its weight column multiplied by it: the product
    is unchanged in exact arithmetic, and the outliers move into the weights, which are quantised
    per output channel. ``max|x_j|`` is taken over ``batches``.

    Args:
        model: a vitkit ViT in fp32 (not prepared for inference yet); changed in place.
        batches: calibration images, as :func:`calibrate_int8` takes them.
        alpha: how much of the range moves to the weights (0: none, 1: all).

    Returns:
        The number of linear layers smoothed.

    Raises:
        ValueError: ``alpha`` outside [0, 1], or ``batches`` holds no image.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    pairs = _smoothable(model)
    peaks: dict[int, torch.Tensor] = {}

    def observe(layer: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        peak = args[0].detach().abs().float().reshape(-1, args[0].shape[-1]).amax(dim=0)
        peaks[id(layer)] = torch.maximum(peaks[id(layer)], peak) if id(layer) in peaks else peak

    hooks = [linear.register_forward_pre_hook(observe) for _, linear in pairs]
    seen = 0
    try:
        for images in [batches] if isinstance(batches, torch.Tensor) else batches:
            images = images[0] if isinstance(images, (tuple, list)) else images
            model(images.float())
            seen += len(images)
    finally:
        for hook in hooks:
            hook.remove()
    if not seen:
        raise ValueError("smooth_activations got no images")
    for norm, linear in pairs:
        x_peak = peaks[id(linear)].clamp(min=1e-5)
        w_peak = linear.weight.abs().amax(dim=0).float().clamp(min=1e-5)
        scale = (x_peak.pow(alpha) / w_peak.pow(1 - alpha)).clamp(min=1e-5)  # (in_features,)
        norm.weight.div_(scale)
        norm.bias.div_(scale)
        linear.weight.mul_(scale[None, :])
    return len(pairs)


def _act_name(module: nn.Module) -> str | None:
    if isinstance(module, nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    return None


def fold_attention_scale(model: nn.Module, where: Callable[[nn.Linear], bool] | None = None) -> int:
    """Fold each attention layer's ``1/sqrt(head_dim)`` into the query rows of its qkv projection
    (with ``qk_norm``, into its query norm's scale and shift, which come after it) in place, and
    set its scale to 1, which the attention kernel does not multiply by
    (:mod:`vitkit.models.attention`): serving saves that pass over q. Exact when the scale is a
    power of two (head_dim 64 or 16). ``where`` (default: all) picks the qkv layers: serving folds
    only into the ones it packs, whose weights leave ``state_dict``. Returns the number changed.

    Args:
        model: the model, changed in place; only vitkit's attention layers whose qkv projection is
            exactly ``nn.Linear`` and whose scale is not 1 already are changed.
        where: a test of an attention layer's qkv projection; the scale is folded only where it
            returns True (None: everywhere).

    Returns:
        The number of attention layers changed.
    """
    count = 0
    for attn in model.modules():
        if isinstance(attn, Attention) and type(attn.qkv) is nn.Linear and attn.scale != 1.0:
            if where is not None and not where(attn.qkv):
                continue
            d = attn.qkv.out_features // 3
            with torch.no_grad():
                if attn.q_norm is not None:  # the queries are normed after qkv: scale the norm's output
                    attn.q_norm.weight *= attn.scale
                    attn.q_norm.bias *= attn.scale
                else:
                    attn.qkv.weight[:d] *= attn.scale
                    if attn.qkv.bias is not None:
                        attn.qkv.bias[:d] *= attn.scale
            attn.scale = 1.0
            count += 1
    return count


# (CPU model, dtype, in, out, act, bias, rows) -> "onednn" | "torch": the decisions of
# choose_linear_kernel in this process, so that preparing a model again times nothing.
_KERNEL_CHOICES: dict[tuple[Any, ...], str] = {}
_DECISION_ROWS = 512  # rows of the input a decision is timed on: a few images' tokens


@functools.cache
def _cpu_model() -> str:
    """The CPU's model name, read once (every layer's decision is keyed by it)."""
    return str(cpu_info()["model"])


@torch.inference_mode()
def choose_linear_kernel(
    linear: nn.Linear, dtype: torch.dtype, act: str | None = None, rows: int = _DECISION_ROWS
) -> str:
    """ "onednn" (:class:`PackedLinear`) or "torch" (``nn.Linear``, then ``act``), whichever runs
    this layer's shape faster on this CPU, timed on a ``rows`` x ``in_features`` input. Decided
    once per CPU model, dtype and shape in a process; the same weights are not needed, only the
    shape, so the layers of a Transformer's blocks share a handful of decisions.

    Args:
        linear: the layer; only its shape and whether it has a bias matter.
        dtype: the dtype it would compute in, ``torch.float32`` or ``torch.bfloat16``.
        act: the activation that follows it: None, "gelu" or "gelu_tanh" (fused into the packed
            kernel, applied after ``nn.Linear``).
        rows: rows of the input it is timed on.

    Returns:
        "onednn" or "torch".

    Raises:
        ValueError: ``act`` is not one of those three.
    """
    key = (_cpu_model(), dtype, linear.in_features, linear.out_features, act, linear.bias is not None, rows)
    if key in _KERNEL_CHOICES:
        return _KERNEL_CHOICES[key]
    shape = f"linear {linear.in_features}x{linear.out_features} {str(dtype).removeprefix('torch.')}" + (
        f" +{act}" if act else ""
    )
    if (pin := pinned("kernel")) is not None:
        record_choice("kernel", shape, pin, f"pinned by {PINS['kernel']}")
        _KERNEL_CHOICES[key] = pin
        return pin
    x = torch.randn(rows, linear.in_features).to(dtype)
    packed = PackedLinear.from_linear(linear, dtype, act)
    w = linear.weight.detach().to(dtype)
    b = None if linear.bias is None else linear.bias.detach().to(dtype)
    post = {None: lambda y: y, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[act]
    choice, times = fastest({"onednn": lambda: packed.run(x), "torch": lambda: post(F.linear(x, w, b))}, untimed=2)
    onednn, plain = times["onednn"], times["torch"]
    record_choice("kernel", shape, choice, "measured", seconds=times)
    log.debug(
        "linear %dx%d %s%s: oneDNN packed %.3f ms, torch %.3f ms -> %s",
        linear.in_features,
        linear.out_features,
        dtype,
        f" +{act}" if act else "",
        1e3 * onednn,
        1e3 * plain,
        choice,
    )
    _KERNEL_CHOICES[key] = choice
    return choice


def pack_linears(
    model: nn.Module, dtype: torch.dtype, rows_hint: int | None = None, int8: bool = False, choose: bool = False
) -> int:
    """Replace the linear layers of ``model`` (in place; those whose type is exactly
    ``nn.Linear``: subclasses, such as ``nn.MultiheadAttention``'s projection, are left alone)
    by :class:`PackedLinear` in ``dtype``, or :class:`Int8Linear` when ``int8``. In vitkit's
    Transformer MLP the GELU after the first dense layer is fused into it. With ``choose`` (fp32
    and bf16), only the layers :func:`choose_linear_kernel` finds faster packed are replaced; the
    others stay ``nn.Linear`` (and their GELU unfused). Returns the number of layers replaced.

    Args:
        model: the model, changed in place.
        dtype: the dtype of the packed layers (``torch.float32`` or ``torch.bfloat16``); with
            ``int8``, the dtype of the int8 layers' outputs (an MLP's fused first layer outputs fp32).
        rows_hint: the number of input rows oneDNN chooses the packed weights' layout for (None: no
            hint; not used with ``int8``).
        int8: replace by :class:`Int8Linear` instead of :class:`PackedLinear`.
        choose: replace only the layers that run faster packed (fp32 and bf16; ignored with ``int8``).

    Returns:
        The number of layers replaced (an MLP's first layer with its fused GELU counts once).
    """

    def make(linear: nn.Linear, act: str | None, out_dtype: torch.dtype = dtype) -> nn.Module:
        return Int8Linear(linear, act, out_dtype) if int8 else PackedLinear.from_linear(linear, dtype, act, rows_hint)

    def wanted(linear: nn.Linear, act: str | None) -> bool:
        return int8 or not choose or choose_linear_kernel(linear, dtype, act) == "onednn"

    count = 0
    for module in list(model.modules()):
        fusable = isinstance(module, Mlp) and type(module.fc1) is nn.Linear and type(module.fc2) is nn.Linear
        if fusable and _act_name(module.act) is not None and wanted(module.fc1, _act_name(module.act)):
            # in int8, fc1's output goes straight to fc2's quantisation, which reads fp32
            module.fc1 = make(module.fc1, _act_name(module.act), torch.float32)
            module.act = nn.Identity()
            count += 1
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and wanted(child, None):
                setattr(module, name, make(child, None))
                count += 1
    return count


def _serving_dtypes(model: nn.Module, asked: ServingPrecision, on_cpu: bool) -> tuple[ServingName, torch.dtype, bool]:
    """(the precision ``asked`` resolves to on the model's device, the dtype of everything but
    int8 layers, whether oneDNN has the packed kernels for it)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    precision = serving_precision(asked, device)
    if precision == "int8" and not on_cpu:
        device = next(p.device for p in model.parameters() if p.device.type != "cpu")
        raise ValueError(f"int8 serving runs on the CPU's int8 kernels; the model is on {device} (use bf16 there)")
    if precision == "int8":
        native = bf16_support("cpu").native and onednn_linear_available(torch.bfloat16)
        return precision, torch.bfloat16 if native else torch.float32, onednn_int8_available()
    return precision, _DTYPES[precision], onednn_linear_available(_DTYPES[precision])


def prepare_inference(
    model: nn.Module,
    precision: ServingPrecision = "fp32",
    pack: bool | None = None,
    copy_model: bool = True,
    calibration: torch.Tensor | Iterable[torch.Tensor | tuple[torch.Tensor, Any]] | None = None,
    merge: int = 0,
    smooth: float | None = None,
) -> nn.Module:
    """An inference-only model prepared once for serving: a copy, or ``model`` itself converted
    in place when ``copy_model`` is False (saves memory when the original is not needed).

    int8 is dynamic quantisation of the linear layers (int8 weights per output channel,
    activations per batch; with oneDNN the rest runs in bf16 where the CPU has it natively).
    By default, on a CPU whose oneDNN has the kernels, int8 layers are packed and, in fp32 and
    bf16, each layer whose shape runs faster packed (:func:`choose_linear_kernel`, timed once per
    process). Packed models fold attention's query scale into the qkv weights; the result cannot
    be trained and its ``state_dict`` lacks the packed weights (keep the original to save or
    fine-tune). ``torch.compile`` of it works, ``fullgraph`` too. Adapters (LoRA, DoRA) are merged
    into their layers first (:func:`vitkit.models.adapters.merge_adapters`).

    Args:
        model: the model to serve (left unchanged unless ``copy_model`` is False).
        precision: "auto" (bf16 where the device computes it natively and fast, else fp32:
            :mod:`vitkit.precision`), "fp32", "bf16" (bf16 weights), "int8", or a resolved
            :class:`~vitkit.precision.Precision`.
        pack: True to pack every linear layer (:class:`PackedLinear`, :class:`Int8Linear`), False
            none (int8 then uses ``quantize_dynamic``), None (the default) to decide as above.
        copy_model: convert a deep copy (True) or ``model`` itself (False).
        calibration: images to fix static int8 scales from (int8 on oneDNN only; saves finding
            each activation's range per batch), as :func:`calibrate_int8` takes; None: dynamic.
        merge: token merging (:func:`vitkit.models.merge.apply_token_merging`): patch tokens
            merged in each block of a ViT; 0: none.
        smooth: with ``calibration``, first smooth the activations of the layers that read a
            LayerNorm (:func:`smooth_activations`) with this ``alpha`` (0.5 is SmoothQuant's);
            None: no smoothing.

    Returns:
        The prepared model, in eval mode; ``input_dtype`` is the dtype its
        inputs must have and (except for int8 without packing) ``kernel_choices`` counts the
        linear layers left to oneDNN and to torch.

    Raises:
        ValueError: an unknown ``precision``; a model prepared already; int8 or ``pack=True`` for a
            model not on the CPU; ``calibration`` without int8 on oneDNN; or what
            :func:`calibrate_int8` or :func:`~vitkit.models.merge.apply_token_merging` refuses.
        RuntimeError: ``pack=True`` where this torch build or CPU lacks oneDNN's kernels.
    """
    if not isinstance(precision, Precision) and precision not in SERVING_PRECISIONS:
        raise ValueError(f"precision must be auto, fp32, bf16 or int8, got {precision!r}")
    if any(isinstance(m, (PackedLinear, Int8Linear)) for m in model.modules()):
        raise ValueError("this model was prepared for inference already; prepare the original model instead")
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    precision, rest, available = _serving_dtypes(model, precision, on_cpu)
    choose = pack is None and precision != "int8"
    if pack is None:
        pack = on_cpu and available
    if pack and not on_cpu:
        raise ValueError("pack=True needs a model on the CPU (oneDNN kernels)")
    if pack and not available:
        raise RuntimeError(f"pack=True needs oneDNN's {precision} linear kernels; this torch build or CPU has none")
    if calibration is not None and not (precision == "int8" and pack):
        raise ValueError("calibration sets static int8 scales: it needs precision='int8' on oneDNN (pack)")
    if smooth is not None and calibration is None:
        raise ValueError("smooth needs calibration images (static int8)")
    if copy_model:
        model = copy.deepcopy(model)
    if adapted_layers(model):  # LoRA/DoRA: served as plain weights, which every kernel below takes
        merge_adapters(model)
    if smooth is not None:
        if not isinstance(calibration, torch.Tensor):
            calibration = list(calibration)  # read twice: smoothing, then the scales
        smooth_activations(model.float().eval(), calibration, smooth)
    if merge:
        from .models.merge import apply_token_merging

        apply_token_merging(model, merge)
    if precision == "int8" and not pack:
        from torch.ao.quantization import quantize_dynamic

        model = quantize_dynamic(model.eval(), {nn.Linear}, dtype=torch.qint8, inplace=True)
        model.input_dtype = torch.float32
        return model
    if pack:
        # Folded only where the packed layers keep the weights out of state_dict anyway: a model
        # of plain nn.Linear could be saved, and its saved scale would no longer match.
        # only into the qkv layers that will be packed (the decision is cached: pack_linears asks again)
        fold_attention_scale(model, lambda qkv: not choose or choose_linear_kernel(qkv, rest) == "onednn")
        pack_linears(model, rest, int8=precision == "int8", choose=choose)  # from the fp32 weights
    model = model.to(rest).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    model.input_dtype = rest
    model.kernel_choices = {
        "onednn": sum(isinstance(m, (PackedLinear, Int8Linear)) for m in model.modules()),
        "torch": sum(type(m) is nn.Linear for m in model.modules()),
    }
    if calibration is not None:
        calibrate_int8(model, calibration)
    return model


__all__ = [
    "Int8Linear",
    "PackedLinear",
    "calibrate_int8",
    "choose_linear_kernel",
    "fold_attention_scale",
    "int8_pairs_saturate",
    "onednn_int8_available",
    "onednn_linear_available",
    "pack_linears",
    "prepare_inference",
    "smooth_activations",
]
