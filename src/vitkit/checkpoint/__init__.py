"""Weights in and out: vitkit's safetensors format, official JAX .npz, timm and Hugging Face."""

from ..errors import CheckpointError
from ..preprocessing import Preprocessing
from .load import LoadReport, load_pretrained, read_any, resolve_checkpoint
from .native import save_checkpoint
from .official import convert_official, to_official
from .peers import convert_hf, convert_timm, hf_config_for, to_hf, to_timm

__all__ = [
    "CheckpointError",
    "LoadReport",
    "Preprocessing",
    "convert_hf",
    "convert_official",
    "convert_timm",
    "hf_config_for",
    "load_pretrained",
    "read_any",
    "resolve_checkpoint",
    "save_checkpoint",
    "to_hf",
    "to_official",
    "to_timm",
]
