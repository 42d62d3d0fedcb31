"""What the CPU is: its model and the instruction sets that decide which kernels are fast. Every
benchmark result and report carries it; choices that depend on the CPU are made from it at run
time, never from one machine's assumptions."""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

# /proc/cpuinfo flags that decide which CPU kernels are fast: AMX tiles (bf16, int8), AVX-512 with
# bf16 and VNNI (int8 dot products), AVX2/FMA (where MKL's fp32 path lands otherwise).
CPU_FLAGS = ("amx_tile", "amx_bf16", "amx_int8", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx2", "fma")
"""The ``/proc/cpuinfo`` flags that decide which CPU kernels are fast, as :func:`cpu_info` reports them."""


def cpu_info() -> dict[str, object]:
    """The CPU a measurement ran on: model name, core count, the :data:`CPU_FLAGS` it reports and
    the vector level torch's own kernels dispatch to. Every benchmark result carries it, so that a
    number is never read as another kind of CPU's.

    Returns:
        ``model`` (the model name, from ``/proc/cpuinfo`` on Linux, else :mod:`platform`),
        ``cores`` (logical cores, :func:`os.cpu_count`), ``flags`` (each of :data:`CPU_FLAGS`
        mapped to whether the CPU reports it; empty where the flags cannot be read) and
        ``torch_capability`` (the vector level torch dispatches to, e.g. "AVX512", or None where
        torch does not say).
    """
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:  # not Linux: the model name from platform, no flags
        pass
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)()
    return {
        "model": name,
        "cores": os.cpu_count(),
        "flags": {f: f in flags for f in CPU_FLAGS} if flags else {},
        "torch_capability": capability,
    }


def best_seconds(fn: Callable[[], object], repeats: int = 5, untimed: int = 2) -> float:
    """The best of ``repeats`` wall-clock timings of ``fn()`` after ``untimed`` warm-up calls: what
    run-time choices between kernels are measured by (a CUDA ``fn`` synchronises itself).

    Args:
        fn: the work to time.
        repeats: timed calls.
        untimed: calls before them, not timed.

    Returns:
        Seconds of the fastest timed call.
    """
    for _ in range(untimed):
        fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def available_memory() -> int | None:
    """Bytes of host memory a new allocation can still get: the kernel's ``MemAvailable``, capped by
    the control group's limit when the process runs in a container. None where neither is known.

    Returns:
        The bytes available, or None.
    """
    free: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit, used = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
            if limit != "max" and int(limit) < 1 << 60:
                free = min(free, max(0, int(limit) - int(used)))
            break
        except (OSError, ValueError):
            continue
    return free


__all__ = ["CPU_FLAGS", "available_memory", "best_seconds", "cpu_info"]


def device_problem(name: str) -> str | None:
    """Why vitkit cannot run on the device ``name`` here, or None when it can: ``cpu``, and
    ``cuda`` or ``cuda:N`` where this torch build and machine have that CUDA device. Any other
    device torch names (``mps``, ``xpu``, ``meta``...) is named as absent from this build or
    machine, or as one vitkit does not run on; text torch does not take is named as such. Asked
    when a command line or a recipe is read, before a tensor moves (where torch's own failure
    would be a traceback from deep inside it).

    Args:
        name: a device as a user writes it (``cpu``, ``cuda:1``, ``mps``).

    Returns:
        One phrase naming the device and what to use instead, or None.
    """
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return f"expected cpu, cuda or cuda:N, got {name!r}"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"{name!r}: this torch build or machine has no CUDA device; use cpu"
        if device.index is not None and device.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            return f"{name!r}: there are {count} CUDA devices (cuda:0 to cuda:{count - 1})"
        return None
    backend = getattr(torch.backends, device.type, None) or getattr(torch, device.type, None)
    try:
        present = bool(backend is not None and backend.is_available())
    except Exception:  # a backend that cannot even say: absent
        present = False
    where = (
        "is present, but vitkit runs on cpu and cuda only" if present else "is absent from this torch build or machine"
    )
    return f"{name!r}: a {device.type} device {where}; use cpu, cuda or cuda:N"
