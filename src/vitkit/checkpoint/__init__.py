"""Weights in and out: vitkit's safetensors format, official JAX .npz, timm and Hugging Face; LoRA/DoRA
adapter files, and their export for Hugging Face peft."""

from ..errors import CheckpointError
from ..preprocessing import Preprocessing
from .adapters import export_peft, load_adapters, save_adapters
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
    "export_peft",
    "hf_config_for",
    "load_adapters",
    "load_pretrained",
    "read_any",
    "resolve_checkpoint",
    "save_adapters",
    "save_checkpoint",
    "to_hf",
    "to_official",
    "to_timm",
]
