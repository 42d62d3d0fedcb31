"""``vitkit bench``: images/s of a model, and how close that is to the machine's own ceiling.

The ceiling is measured, not looked up: the best of a few large square matrix multiplies in the
same precision on the same device. A model's achieved GFLOP/s is its analytic FLOPs per image
(:mod:`vitkit.models.flops`; training counts 3x the forward) times images/s. Times are medians
of timed iterations after warm-up; ``torch.compile`` time is reported separately.
"""

from __future__ import annotations

import functools
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .allocator import keep_freed_memory
from .inference import (
    _DTYPES,
    Int8Linear,
    PackedLinear,
    _quantize_activations,
    calibrate_int8,
    onednn_int8_available,
    onednn_linear_available,
    prepare_inference,
)
from .models.flops import check_memory, count_params, model_flops
from .models.registry import create_model
from .precision import ServingPrecision, bf16_support, serving_precision


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(
    precision: ServingPrecision = "fp32", device: str | torch.device = "cpu", sizes: tuple[int, ...] | None = None
) -> float:
    """The machine's matrix-multiply GFLOP/s in ``precision`` (int8: GOP/s of oneDNN's int8 kernel
    where there is one, else the bf16 figure): the best over large square matrices of
    ``torch.mm`` and, on a CPU with oneDNN, of oneDNN's packed linear kernel. Both count: on AMD
    processors ``torch.mm`` in fp32 goes through MKL's AVX2 path and reaches about half of what
    oneDNN's AVX-512 kernel does, so ``torch.mm`` alone would understate the machine. Sizes
    default to 2048 and 4096 on a CPU, 4096 and 8192 on a GPU (smaller ones do not fill it), and
    to 512 for bf16 on a CPU that emulates it (:func:`vitkit.precision.bf16_support`: a hundred
    times slower, it is as slow at any size, and 4096 would take minutes).

    Args:
        precision: "fp32", "bf16" or "int8".
        device: where to measure.
        sizes: the sides of the square matrices; None: the defaults above.

    Returns:
        The best GFLOP/s (GOP/s for int8) measured, counting a multiply-add as two.
    """
    device = torch.device(device)
    precision = serving_precision(precision, device)
    int8 = precision == "int8" and device.type == "cpu" and onednn_int8_available()
    dtype = _DTYPES.get(precision, torch.bfloat16)
    emulated = device.type == "cpu" and dtype == torch.bfloat16 and not int8 and not bf16_support(device).native
    sizes = sizes or ((512,) if emulated else (2048, 4096) if device.type == "cpu" else (4096, 8192))
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        if int8:
            kernels = [_int8_kernel(a)]
        else:
            kernels = [functools.partial(torch.mm, a, b)]
            if device.type == "cpu" and onednn_linear_available(dtype):
                kernels.append(functools.partial(PackedLinear(b, None), a))
        for kernel in kernels:
            kernel()
            _sync(device)
            times = []
            for _ in range(3 if device.type == "cpu" else 20):
                t = time.perf_counter()
                kernel()
                _sync(device)
                times.append(time.perf_counter() - t)
            best = max(best, 2 * n**3 / min(times) / 1e9)
    return best


def _int8_kernel(a: torch.Tensor) -> Callable[[], torch.Tensor]:
    """oneDNN's int8 linear kernel alone (uint8 x int8, fp32 out) on ``a``, quantised beforehand."""
    n = a.shape[1]
    layer = Int8Linear(nn.Linear(n, n, bias=False), out_dtype=torch.float32)
    q, scale, zp = _quantize_activations(a)
    weights = (layer.packed, layer.w_scale, layer.w_zero_point)
    return functools.partial(
        torch.ops.onednn.qlinear_pointwise, q, scale, zp, *weights, None, 1.0, 0, torch.float32, "none", [], ""
    )


@dataclass
class BenchResult:
    """What :func:`bench_model` measured.

    Attributes:
        model: the model's name.
        mode: "infer" or "train".
        precision: the precision that ran.
        batch: images per step.
        img_size: the input (height, width) in pixels.
        device: the device it ran on.
        threads: torch's intra-op threads.
        compiled: whether the step was compiled with ``torch.compile``.
        params: the model's parameters.
        gflops_per_image: the forward's GFLOPs per image (a training step does about 3x this).
        images_per_s: images per second, from the median step time.
        achieved_gflops: the GFLOP/s achieved (training counting 3x the forward).
        ceiling_gflops: the machine's matrix-multiply GFLOP/s (:func:`matmul_ceiling`); None if
            not measured.
        fraction_of_ceiling: ``achieved_gflops / ceiling_gflops``; None without a ceiling.
        step_ms_median: the median step time, in milliseconds.
        compile_s: the seconds the first (compiling) step took; None without compilation.
        peak_memory_mb: the peak memory of the run in MiB: CUDA's allocated peak, or on a CPU
            the rise of the process's peak resident memory.
    """

    model: str
    mode: str
    precision: str  # the name of what ran: "fp32", "bf16" or "int8"
    batch: int
    img_size: list[int]
    device: str
    threads: int
    compiled: bool
    params: int
    gflops_per_image: float  # forward; training does ~3x this
    images_per_s: float
    achieved_gflops: float
    ceiling_gflops: float | None
    fraction_of_ceiling: float | None
    step_ms_median: float
    compile_s: float | None
    peak_memory_mb: float


def peak_rss_kb() -> int:
    """This process's peak resident memory (KB). ``VmHWM`` belongs to the process's own address
    space; ``ru_maxrss``, the fallback, also counts the parent's peak from before ``exec``.

    Returns:
        The peak, in KiB.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def make_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    mode: str,
    precision: ServingPrecision,
    compile: bool = False,
    pack: bool | None = None,
) -> Callable[[], None]:
    """One timed unit of work: an inference forward (weights prepared with
    :func:`prepare_inference`; int8 with static scales calibrated on ``x``), or a training step
    (forward, backward, AdamW) with bf16 autocast and fp32 weights when ``precision`` is bf16
    ("auto": what :mod:`vitkit.precision` resolves on ``x``'s device). Shared with
    ``benchmarks/peers.py``.

    Args:
        model: the model; for "infer" it is prepared in place (:func:`prepare_inference`).
        x: the batch of images (B, C, H, W) every step computes, on the device.
        y: its labels (B,), for the training loss.
        mode: "infer" or "train".
        precision: "auto", "fp32", "bf16" or (inference only) "int8".
        compile: ``torch.compile`` the model.
        pack: whether inference packs the linear layers for oneDNN; None: where it is faster
            (:func:`prepare_inference`).

    Returns:
        The step, a function of no arguments.

    Raises:
        ValueError: an unknown mode, a training precision other than fp32 or bf16, or what
            :func:`prepare_inference` refuses.
    """
    precision = serving_precision(precision, x.device)
    if mode == "infer":
        model = prepare_inference(model, precision, pack=pack, copy_model=False)
        if any(isinstance(m, Int8Linear) for m in model.modules()):
            calibrate_int8(model, x)  # int8 on oneDNN: static scales from the benchmark's own input
        x = x.to(model.input_dtype)
        fn = torch.compile(model) if compile else model

        def infer_step() -> None:
            with torch.inference_mode():
                fn(x)

        return infer_step
    if mode != "train":
        raise ValueError(f"mode must be infer or train, got {mode!r}")
    if precision not in ("fp32", "bf16"):
        raise ValueError("training runs in fp32 or bf16 (autocast with fp32 weights)")
    model.train()
    if x.device.type == "cpu":
        keep_freed_memory()  # as vitkit's trainer does (vitkit/train/allocator.py)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=x.is_cuda or None)  # one kernel on CUDA
    fn = torch.compile(model) if compile else model

    def train_step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = fn(x)
        loss = nn.functional.cross_entropy(out.float(), y) if out.shape[-1] > 1 else out.float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return train_step


def _peak_memory_mb(device: torch.device, baseline_kb: int) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return max(peak_rss_kb() - baseline_kb, 0) / 1024


def time_steps(step: Callable[[], None], device: torch.device, warmup: int, iters: int) -> list[float]:
    """Time ``step``: ``warmup`` untimed calls, then ``iters`` timed ones, each waited for on a GPU.

    Args:
        step: the unit of work (:func:`make_step`).
        device: where it runs (a CUDA device is synchronised around each call).
        warmup: untimed calls first.
        iters: timed calls.

    Returns:
        The seconds of each timed call.
    """
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t)
    return times


def bench_model(
    name: str,
    batch: int = 8,
    mode: str = "infer",
    precision: ServingPrecision = "fp32",
    img_size: int | tuple[int, int] | None = None,
    compile: bool = False,
    device: str = "cpu",
    warmup: int = 3,
    iters: int = 10,
    ceiling: float | None = None,
    measure_ceiling: bool = True,
    model: nn.Module | None = None,
) -> BenchResult:
    """Benchmark a named vitkit model (or ``model``) in inference or training. ``precision``:
    "auto" (what :mod:`vitkit.precision` resolves on ``device``), "fp32", "bf16" or "int8"; the
    result names the precision that ran.

    Args:
        name: the model's name (built with random weights unless ``model`` is given).
        batch: images per step.
        mode: "infer" or "train".
        precision: "auto", "fp32", "bf16" or (inference only) "int8".
        img_size: the input size; None: the model's.
        compile: ``torch.compile`` the step (its first call is timed apart, ``compile_s``).
        device: where to run.
        warmup: untimed steps first.
        iters: timed steps.
        ceiling: the machine's matrix-multiply GFLOP/s, measured already; None: measured here
            unless ``measure_ceiling`` is False.
        measure_ceiling: measure the ceiling when none is given.
        model: the model to time instead of building ``name`` (``name`` then only labels it).

    Returns:
        What was measured.

    Raises:
        ValueError: an unknown model, mode or precision.
        UsageError: a model and batch that would not fit the memory left.
    """
    dev = torch.device(device)
    precision = serving_precision(precision, dev)
    if dev.type == "cpu":
        torch.set_flush_denormal(True)
    baseline_kb = peak_rss_kb()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if model is None:
        overrides = {"img_size": img_size} if img_size else {}
        model = create_model(name, **overrides)
    cfg = model.cfg
    check_memory(cfg, f"batch {batch}", batch, training=mode == "train", device=device)
    fwd_flops = flops = model_flops(model)
    params = count_params(model)
    model = model.to(dev)
    x = torch.randn(batch, cfg.in_chans, *cfg.img_size, device=dev)
    compile_s = None
    y = torch.randint(0, max(cfg.num_classes, 1), (batch,), device=dev)
    step = make_step(model, x, y, mode, precision, compile)
    if mode == "train":
        flops *= 3
    if compile:
        t = time.perf_counter()
        step()
        _sync(dev)
        compile_s = time.perf_counter() - t
    times = time_steps(step, dev, warmup, iters)
    med = statistics.median(times)
    ips = batch / med
    achieved = flops * ips / 1e9
    if ceiling is None and measure_ceiling:
        ceiling = matmul_ceiling(precision, dev)
    return BenchResult(
        model=name,
        mode=mode,
        precision=precision,
        batch=batch,
        img_size=list(cfg.img_size),
        device=str(dev),
        threads=torch.get_num_threads(),
        compiled=compile,
        params=params,
        gflops_per_image=fwd_flops / 1e9,
        images_per_s=ips,
        achieved_gflops=achieved,
        ceiling_gflops=ceiling,
        fraction_of_ceiling=achieved / ceiling if ceiling else None,
        step_ms_median=1000 * med,
        compile_s=compile_s,
        peak_memory_mb=_peak_memory_mb(dev, baseline_kb),
    )


__all__ = ["BenchResult", "bench_model", "make_step", "matmul_ceiling", "peak_rss_kb", "time_steps"]
