"""Which precision a device computes fast: the one policy training, the optimisers, evaluation,
``reproduce``, ``bench`` and serving ask.

bf16 is native on CPUs with AVX-512 bf16 or AMX tiles and on recent GPUs; on other CPUs (AVX2-only
x86 such as AMD Zen 2/3 and most client Intel chips) oneDNN emulates it, about 100x slower than
fp32. ``"auto"`` resolves to bf16 where the device computes it natively and fast, fp32 elsewhere:

- a CUDA device: bf16 where ``torch.cuda.is_bf16_supported()`` says so;
- an x86 CPU: bf16 when oneDNN has bf16 kernels for it (``torch.ops.mkldnn._is_mkldnn_bf16_supported``,
  which honours ``ONEDNN_MAX_CPU_ISA``) and the CPU reports bf16 instructions (the AVX-512 bf16 or
  AMX bf16 flags); oneDNN's bf16 without those flags (AVX-512 CPUs of before bf16) is not
  conclusive, and neither is a CPU of another architecture (aarch64, Apple silicon): there a short
  measured probe decides, bf16 only when its matrix multiply is at least as fast as fp32's;
- any other device: fp32.

The answer is cached for the process. ``VITKIT_BF16=native`` or ``VITKIT_BF16=emulated`` in the
environment overrides what the CPU reports (tests use it to cover both branches on any machine).
An explicit "fp32" or "bf16" always wins; an explicit bf16 on a device that emulates it carries a
warning with the measured cost (:attr:`Precision.warning`, handed out once a process by
:func:`take_warning`).
"""

from __future__ import annotations

import os
import platform
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch

from .cpu import best_seconds, cpu_info
from .errors import UsageError
from .runtime import record_choice

PRECISIONS = ("auto", "fp32", "bf16")
"""The precisions a run, an evaluation or a benchmark may ask for."""
OVERRIDE_ENV = "VITKIT_BF16"
"""The environment variable that overrides what the CPU reports: "native" or "emulated"."""
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Bf16Support:
    """Whether a device computes bf16 natively and fast, and why the policy thinks so.

    Attributes:
        native: whether it does.
        reason: why, in a few words (e.g. "AVX-512 bf16 on this CPU").
    """

    native: bool
    reason: str  # e.g. "AVX-512 bf16 on this CPU", "no native bf16 on this CPU (AVX2)"


@dataclass(frozen=True)
class Precision:
    """What a requested precision resolved to on a device.

    Attributes:
        requested: "auto", "fp32" or "bf16", as asked.
        name: "fp32" or "bf16", what computes.
        reason: why, in a few words.
        warning: set when an explicit bf16 runs on a device that emulates it: what it costs.
    """

    requested: str
    name: str
    reason: str
    warning: str | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of :attr:`name`."""
        return _DTYPES[self.name]

    @property
    def bf16(self) -> bool:
        """Whether the step computes in bf16."""
        return self.name == "bf16"

    def autocast(self, device: str | torch.device) -> AbstractContextManager[object]:
        """The context a forward pass computes in: none for fp32, bf16 autocast for bf16.

        Args:
            device: where the forward pass runs.

        Returns:
            A context manager.
        """
        if not self.bf16:
            return nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)

    def describe(self) -> str:
        """One line for a run's first messages and its run folder, e.g.
        ``precision: auto -> fp32 (no native bf16 on this CPU (AVX2))``.

        Returns:
            ``precision: NAME (as asked; REASON)`` when the precision was asked for explicitly,
            ``precision: REQUESTED -> NAME (REASON)`` when "auto" resolved it.
        """
        if self.requested == self.name:
            return f"precision: {self.name} (as asked; {self.reason})"
        return f"precision: {self.requested} -> {self.name} ({self.reason})"


PrecisionChoice = Precision
"""The former name of :class:`Precision`."""

PrecisionLike = Precision | Literal["auto", "fp32", "bf16"]
"""What the library's functions take for a precision: a resolved :class:`Precision` (what the
commands and a run's plan pass), or a name that :func:`as_precision` resolves once on entry."""

_SUPPORT: dict[tuple[str, str | None], Bf16Support] = {}
_COST: dict[str, float] = {}
_WARNED: set[str] = set()


def _mm_seconds(dtype: torch.dtype, device: torch.device, n: int = 256, repeats: int = 3) -> float:
    """The best of ``repeats`` timings of an n x n matrix multiply in ``dtype`` on ``device``."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)

    def mm() -> None:
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return best_seconds(mm, repeats, untimed=1)


def bf16_slowdown(device: str | torch.device = "cpu") -> float:
    """How many times longer a bf16 matrix multiply takes than an fp32 one on ``device``,
    measured once a process (256 x 256, the best of three).

    Args:
        device: a torch device or its name ("cpu", "cuda", "cuda:1").

    Returns:
        bf16's time over fp32's: above 1 where bf16 is slower.
    """
    dev = torch.device(device)
    key = str(dev)
    if key not in _COST:
        _COST[key] = _mm_seconds(torch.bfloat16, dev) / max(_mm_seconds(torch.float32, dev), 1e-9)
    return _COST[key]


def _override() -> bool | None:
    value = os.environ.get(OVERRIDE_ENV, "").strip().lower()
    if not value:
        return None
    if value in ("native", "1", "yes", "true"):
        return True
    if value in ("emulated", "0", "no", "false"):
        return False
    raise UsageError(f"{OVERRIDE_ENV}={value!r}: use 'native' or 'emulated' (or leave it unset to detect)")


def _cpu_support() -> Bf16Support:
    """The CPU's answer (see the module docstring), before any override."""
    machine = platform.machine().lower()
    mkldnn_bf16 = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    if machine in ("x86_64", "amd64", "i386", "i686"):
        capability = str(getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")())
        if not mkldnn_bf16:
            return Bf16Support(False, f"no native bf16 on this CPU ({capability})")
        flags = cpu_info()["flags"]
        if isinstance(flags, dict) and (flags.get("amx_bf16") or flags.get("avx512_bf16")):
            kind = "AMX bf16" if flags.get("amx_bf16") else "AVX-512 bf16"
            return Bf16Support(True, f"{kind} on this CPU")
    # oneDNN's bf16 on an AVX-512 CPU without bf16 instructions, or a CPU of another kind: measure
    slowdown = bf16_slowdown("cpu")
    native = slowdown <= 1.0
    verdict = "as fast as" if native else f"{slowdown:.1f}x slower than"
    return Bf16Support(native, f"bf16 matrix multiply measured {verdict} fp32 on this {machine} CPU")


def bf16_support(device: str | torch.device = "cpu") -> Bf16Support:
    """Whether ``device`` computes bf16 natively and fast (cached for the process; the CPU's
    report may be overridden by ``VITKIT_BF16``, see the module docstring).

    Args:
        device: a torch device or its name ("cpu", "cuda", "cuda:1").

    Returns:
        A :class:`Bf16Support` with the answer and its reason.
    """
    dev = torch.device(device)
    override = _override() if dev.type == "cpu" else None
    key = (dev.type if dev.type == "cpu" else str(dev), None if override is None else str(override))
    if key in _SUPPORT:
        return _SUPPORT[key]
    if dev.type == "cpu" and override is not None:
        state = "native" if override else "emulated"
        found = Bf16Support(override, f"bf16 taken as {state} on this CPU ({OVERRIDE_ENV})")
    elif dev.type == "cpu":
        found = _cpu_support()
    elif dev.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        found = Bf16Support(bool(ok), "bf16 supported on this GPU" if ok else "no bf16 on this GPU")
    else:
        found = Bf16Support(False, f"bf16 not known to be fast on {dev.type}")
    _SUPPORT[key] = found
    return found


def resolve_precision(requested: str, device: str | torch.device = "cpu") -> Precision:
    """The precision that computes for ``requested`` on ``device``.

    Args:
        requested: "auto" (bf16 where the device computes it natively and fast, fp32 elsewhere),
            "fp32" or "bf16" (both win over the policy).
        device: where the computation runs.

    Returns:
        A :class:`Precision`; its ``warning`` is set when an explicit bf16 runs on a device
        that only emulates it.

    Raises:
        UsageError: for a precision other than these three.
    """
    if requested not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}; got {requested!r}")
    dev = torch.device(device)
    support = bf16_support(dev)
    how = "measured" if "measured" in support.reason else "reported by the device"
    if OVERRIDE_ENV in support.reason:
        how = f"pinned by {OVERRIDE_ENV}"
    record_choice(
        "precision", f"bf16 on {dev.type}", "native" if support.native else "emulated", how, reason=support.reason
    )
    if requested == "auto":
        return Precision("auto", "bf16" if support.native else "fp32", support.reason)
    if requested == "fp32" or support.native:
        return Precision(requested, requested, support.reason)
    warning = None
    if dev.type == "cpu":
        slowdown = bf16_slowdown(dev)
        cost = (
            f"a bf16 matrix multiply measured {slowdown:.0f}x slower than fp32 here"
            if slowdown > 1.5
            else (f"a bf16 matrix multiply measured {slowdown:.2f}x the time of fp32's here")
        )
        warning = (
            f"bf16 is emulated on this device ({support.reason}): {cost}; precision auto or fp32 runs at full speed"
        )
    return Precision(requested, requested, support.reason, warning)


SERVING_PRECISIONS = ("auto", "fp32", "bf16", "int8")
"""The precisions a model may be served in: the compute precisions and int8 (quantised weights)."""
ServingName = Literal["fp32", "bf16", "int8"]
"""A serving precision once resolved: what :func:`serving_precision` returns."""
ServingPrecision = Precision | Literal["auto", "fp32", "bf16", "int8"]
"""What serving, export and the benchmarks take: a compute precision, or int8."""


def serving_precision(value: ServingPrecision, device: str | torch.device = "cpu") -> ServingName:
    """The precision a model is served in: "int8" as asked, else the resolved compute precision.

    Args:
        value: a :class:`Precision`, or "auto", "fp32", "bf16" or "int8".
        device: where the model runs ("auto" is resolved there).

    Returns:
        "fp32", "bf16" or "int8".

    Raises:
        UsageError: for a name other than these four.
    """
    if isinstance(value, Precision):
        return value.name  # type: ignore[return-value]
    if value == "int8":
        return "int8"
    if value not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(SERVING_PRECISIONS)}; got {value!r}")
    return resolve_precision(value, device).name  # type: ignore[return-value]


def as_precision(value: PrecisionLike, device: str | torch.device = "cpu") -> Precision:
    """``value`` as a :class:`Precision`: itself when it is one, else the name resolved on ``device``.

    Args:
        value: a :class:`Precision`, or "auto", "fp32" or "bf16".
        device: where the computation runs (for a name only).

    Returns:
        The resolved precision.

    Raises:
        UsageError: for a name other than these three.
    """
    if isinstance(value, Precision):
        return value
    return resolve_precision(value, device)


def take_warning(choice: Precision) -> str | None:
    """``choice.warning`` the first time a process asks for it, None after (one line, once).

    Args:
        choice: what :func:`resolve_precision` returned.

    Returns:
        The warning to print, or None.
    """
    if choice.warning is None or choice.warning in _WARNED:
        return None
    _WARNED.add(choice.warning)
    return choice.warning


def clear_cache() -> None:
    """Forget the cached answers and measurements (tests that change ``VITKIT_BF16`` need not:
    the override is part of the cache key)."""
    _SUPPORT.clear()
    _COST.clear()
    _WARNED.clear()


__all__ = [
    "OVERRIDE_ENV",
    "PRECISIONS",
    "SERVING_PRECISIONS",
    "Bf16Support",
    "Precision",
    "PrecisionChoice",
    "PrecisionLike",
    "ServingName",
    "ServingPrecision",
    "as_precision",
    "bf16_slowdown",
    "bf16_support",
    "clear_cache",
    "resolve_precision",
    "serving_precision",
    "take_warning",
]
