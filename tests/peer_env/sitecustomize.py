"""Loaded by ``make test-peers`` (on PYTHONPATH beside timm and torchvision): lets torchvision's
Python parts import beside vitkit's CPU-only torch.

timm imports torchvision; the torchvision wheels on PyPI are built against CUDA torch, so their
C++ ops (``torchvision/_C.so``, which links ``libc10_cuda.so``) cannot load here. torchvision then
still registers fake kernels for two of those ops at import, which fails on an undefined operator.
Defining the two schemas first is enough for timm's models, which use none of torchvision's ops:
only the timm parity tests run in this environment.
"""

import contextlib

import torch

for _name in ("nms", "qnms"):
    with contextlib.suppress(RuntimeError):  # defined already: torchvision's own ops did load
        torch.library.define(f"torchvision::{_name}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
