"""Weights out of vitkit: to the official .npz, timm, Hugging Face and vitkit files, and ONNX for
serving with the outputs checked against PyTorch in onnxruntime."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import CheckpointError, ExportError, UsageError, writing
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
    try:
        import onnx  # noqa: F401  (the exporter writes through it)
    except ImportError:
        raise ExportError(f"{path}: writing ONNX needs the onnx package: pip install 'vitkit[onnx]'") from None
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
    result: dict[str, float | str | None] = {"max_abs_diff": None, "onnxruntime": None}
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if check and ort is not None:  # checked before it is written: a file that fails is not left behind
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        probe = torch.randn(batch + 1, cfg.in_chans, *cfg.img_size)  # another batch size than traced
        got = sess.run(["logits"], {"pixels": probe.numpy()})[0]
        with torch.no_grad():
            want = model(probe).numpy()
        diff = float(np.abs(got - want).max())
        result.update(max_abs_diff=diff, onnxruntime=ort.__version__)
        if not diff <= atol:
            raise ExportError(f"{path}: onnxruntime logits differ from PyTorch by {diff:.3g} (> {atol}); not written")
    with writing(path):
        atomic_write(path, lambda f: f.write(data))
    return result


# What each format writes: one file of this suffix, or a folder ("hf").
SUFFIXES = {"vitkit": ".safetensors", "official": ".npz", "timm": ".safetensors", "onnx": ".onnx"}
_FILE_SUFFIXES = (".safetensors", ".npz", ".onnx", ".bin", ".pth", ".pt", ".json")


def format_for(dst: str | Path) -> str:
    """The format a destination's name asks for: ``.safetensors`` vitkit, ``.npz`` official,
    ``.onnx`` ONNX; any other name is a :class:`UsageError` (a Hugging Face folder needs
    ``to="hf"`` said; vitkit writes no pickled ``.pth``/``.bin``)."""
    dst = Path(dst)
    suffix = dst.suffix.lower()
    for fmt in ("vitkit", "official", "onnx"):
        if suffix == SUFFIXES[fmt]:
            return fmt
    if suffix in (".pth", ".pt", ".bin"):
        raise UsageError(
            f"{dst}: vitkit writes no pickled PyTorch files ({suffix}); name it {dst.stem}.safetensors "
            "(--to timm for a timm state dict)"
        )
    raise UsageError(
        f"{dst}: cannot tell the format from the name: use .safetensors (vitkit), .npz (official) or .onnx, "
        "or say --to (hf writes a folder)"
    )


def check_destination(dst: str | Path, to: str) -> None:
    """Refuse a destination whose name does not fit format ``to`` (a file vitkit could not read
    back, such as an .npz named .safetensors), naming the one expected."""
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
    (one that would load back as another model); see :func:`export_weights`."""
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
    if to in ("official", "hf") and pre is not None:
        default = Preprocessing.for_config(cfg)
        if (tuple(pre.mean), tuple(pre.std), pre.interpolation) != (default.mean, default.std, default.interpolation):
            raise CheckpointError(
                f"the {to} format does not record preprocessing (mean {list(pre.mean)}, std {list(pre.std)}, "
                f"{pre.interpolation}): it reads back as the paper's [-1, 1] range; export to vitkit or timm instead"
            )


def export_weights(
    model: nn.Module, dst: str | Path, to: str, layout: str = "prelinen"
) -> dict[str, float | str | None]:
    """Write a loaded vitkit model's weights to ``dst`` in format ``to``: "vitkit" (safetensors
    with config), "official" (``.npz``, key ``layout`` "prelinen" or "linen"), "timm"
    (safetensors state dict, with vitkit's config in its metadata for vitkit to read back), "hf"
    (a Hugging Face folder: ``model.safetensors`` and ``config.json``) or "onnx" (checked in
    onnxruntime, :func:`export_onnx`). Returns the ONNX check (``{"max_abs_diff",
    "onnxruntime"}``, both None for the other formats).

    What a format cannot hold is refused before anything is written, so that what is written
    loads back (:func:`vitkit.load_pretrained`) as the same model: the official ``.npz`` records
    no config (no sin-cos or 2-D or relative positions, square grids only, tanh GELU, LayerNorm
    epsilon 1e-6), timm and Hugging Face hold one learned 1-D position table, Hugging Face only
    class-token ViTs whose class token has a position. A name that does not fit the format
    (``.pth``, an ``.npz`` called ``.safetensors``) is refused too. A failed write names ``dst``
    and leaves no partial file.
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
    check_exportable(model, to)
    check_destination(dst, to)
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
        _write_hf(dst, to_hf(sd, model.cfg), hf_config_for(model.cfg), model.cfg.num_classes)
    else:
        return export_onnx(model, dst)
    return {"max_abs_diff": None, "onnxruntime": None}


def _write_hf(dst: Path, tensors: dict[str, torch.Tensor], cfg: dict[str, Any], num_classes: int) -> None:
    """The two files of a Hugging Face folder; if the second cannot be written, the first is
    removed again (a folder of weights without config.json does not load)."""
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
    except BaseException:
        if not had_weights:
            weights.unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                dst.rmdir()
        raise
