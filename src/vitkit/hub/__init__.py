"""Pretrained weights by name, downloaded once into a cache.

``vitkit.load_pretrained(NAME)`` and ``vitkit.create_model(name, pretrained=TAG)`` take, besides
files: the names of :func:`list_pretrained` (the official 2020 release, AugReg, hub models),
``hf-hub:org/name`` ids (through ``huggingface_hub`` and its cache), ``gs://bucket/path`` (read
from its public address) and any ``http(s)://`` address. Downloads are atomic, resume, and are
verified (:mod:`vitkit.hub.download`); the environment that steers them is in
:mod:`vitkit.hub.cache` (``VITKIT_CACHE``, ``VITKIT_OFFLINE``, ``VITKIT_MIRROR``, ``HF_HOME``...).
"""

from .cache import cache_dir, cache_path, hf_cache_dir
from .names import Pretrained, find, list_pretrained, register_pretrained
from .resolve import Resolved, create_model, load_pretrained, resolve

__all__ = [
    "Pretrained",
    "Resolved",
    "cache_dir",
    "cache_path",
    "create_model",
    "find",
    "hf_cache_dir",
    "list_pretrained",
    "load_pretrained",
    "register_pretrained",
    "resolve",
]
