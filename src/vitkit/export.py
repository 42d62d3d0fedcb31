"""Weights out of vitkit: to the official .npz, timm, Hugging Face and vitkit files, and ONNX for
serving with the outputs checked against PyTorch in onnxruntime."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .errors import ExportError, UsageError
from .files import atomic_write, write_text

FORMATS = ("vitkit", "official", "timm", "hf", "onnx")


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


def export_weights(
    model: nn.Module, dst: str | Path, to: str, layout: str = "prelinen"
) -> dict[str, float | str | None]:
    """Write a loaded vitkit model's weights to ``dst`` in format ``to``: "vitkit" (safetensors
    with config), "official" (``.npz``, key ``layout`` "prelinen" or "linen"), "timm"
    (safetensors state dict), "hf" (a Hugging Face folder: ``model.safetensors`` and
    ``config.json``) or "onnx" (checked in onnxruntime, :func:`export_onnx`). Returns the ONNX
    check (``{"max_abs_diff", "onnxruntime"}``, both None for the other formats)."""
    from .checkpoint import hf_config_for, save_checkpoint, to_hf, to_official, to_timm
    from .checkpoint.io import write_safetensors

    dst = Path(dst)
    sd = model.state_dict()
    if to == "vitkit":
        save_checkpoint(model, dst)
    elif to == "official":
        arrays = to_official(sd, model.cfg, layout=layout)
        atomic_write(dst, lambda f: np.savez(f, **arrays))
    elif to == "timm":
        write_safetensors(dst, to_timm(sd), {"format": "pt"})
    elif to == "hf":
        write_safetensors(dst / "model.safetensors", to_hf(sd, model.cfg), {"format": "pt"})
        cfg = hf_config_for(model.cfg)
        cfg["architectures"] = ["ViTForImageClassification" if model.cfg.num_classes else "ViTModel"]
        write_text(dst / "config.json", json.dumps(cfg, indent=2))
    elif to == "onnx":
        return export_onnx(model, dst)
    else:
        raise UsageError(f"unknown export format {to!r}: one of {', '.join(FORMATS)}")
    return {"max_abs_diff": None, "onnxruntime": None}
