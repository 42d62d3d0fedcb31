"""ONNX export for serving, with the outputs checked against PyTorch in onnxruntime."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .errors import ExportError
from .files import atomic_write


def export_onnx(
    model: nn.Module,
    path: str | Path,
    batch: int = 2,
    opset: int = 17,
    check: bool = True,
    atol: float = 1e-4,
) -> dict[str, float | str | None]:
    """Write ``model`` (fp32, eval) to ``path`` as ONNX with a dynamic batch dimension.

    With ``check`` and onnxruntime installed, runs both on the same random batch and raises
    :class:`ExportError` when the logits differ by more than ``atol`` (max abs). Returns
    ``{"max_abs_diff": ..., "onnxruntime": version or None}``.
    """
    model = model.eval().float()
    cfg = model.cfg
    x = torch.randn(batch, cfg.in_chans, *cfg.img_size)
    buf = io.BytesIO()
    # The TorchScript exporter handles scaled_dot_product_attention and needs no extra package.
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python-side shape checks
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
    data = buf.getvalue()
    atomic_write(path, lambda f: f.write(data))
    result: dict[str, float | str | None] = {"max_abs_diff": None, "onnxruntime": None}
    if not check:
        return result
    try:
        import onnxruntime as ort
    except ImportError:
        return result
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    probe = torch.randn(batch + 1, cfg.in_chans, *cfg.img_size)  # another batch size than traced
    got = sess.run(["logits"], {"pixels": probe.numpy()})[0]
    with torch.no_grad():
        want = model(probe).numpy()
    diff = float(np.abs(got - want).max())
    result.update(max_abs_diff=diff, onnxruntime=ort.__version__)
    if not diff <= atol:
        raise ExportError(f"{path}: onnxruntime logits differ from PyTorch by {diff:.3g} (> {atol})")
    return result
