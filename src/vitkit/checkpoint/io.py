"""Safe file reading and atomic writing. Nothing here unpickles an untrusted file."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_save

from ..errors import CheckpointError
from ..files import atomic_write


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Atomically write tensors (made contiguous, on the CPU) with string metadata."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    blob = safetensors_save(tensors, metadata=metadata)
    atomic_write(path, lambda f: f.write(blob))


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a damaged file is a :class:`CheckpointError`."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({_one_line(e)})") from None
    return tensors, meta


def read_safetensors_metadata(path: str | Path) -> dict[str, str]:
    """Only the metadata of a safetensors file (the header; no tensor is read)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({_one_line(e)})") from None


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file, with pickled object arrays refused."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        raise CheckpointError(f"{path}: not a readable .npz file ({_one_line(e)})") from None


def read_torch_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A PyTorch ``.bin``/``.pth`` state dict, through ``weights_only=True`` (no arbitrary code)."""
    path = Path(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file; all mean the same here
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({_one_line(e)})") from None
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state dict), got {type(obj).__name__}")
    return obj


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
