"""Adapter files: LoRA/DoRA adapters saved alone (:mod:`vitkit.models.adapters`), and written
for Hugging Face peft.

vitkit's adapter file is a safetensors file whose name says ``adapter`` (``adapter.safetensors``,
``cats.adapter.safetensors``...) holding :func:`~vitkit.models.adapters.adapter_state_dict` and,
as metadata, the spec, the base weights' name and the SHA-256 of the frozen base tensors
(:func:`~vitkit.models.adapters.base_checksum`): :func:`load_adapters` refuses, in one line, a base
the adapters were not trained on.

:func:`export_peft` writes the same adapters as a peft folder (``adapter_model.safetensors`` and
``adapter_config.json``) for the transformers ``ViTForImageClassification`` (or ``ViTModel``) that
``vitkit convert --to hf`` writes from the base: vitkit's fused qkv layer holds q, k and v apart,
so its ``q``, ``k`` and ``v`` adapters become peft's adapters on ``q_proj``, ``k_proj`` and
``v_proj``; ``proj`` becomes ``o_proj``, ``fc1`` and ``fc2`` the MLP's; a trained head is peft's
``modules_to_save`` ``classifier``, trained norms its ``layernorm_before``, ``layernorm_after``
and ``layernorm``. The module names are those of transformers 5 (``vit.layers.{i}.attention.q_proj``)
or, on request, of earlier versions (``vit.encoder.layer.{i}.attention.attention.query``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, RecipeError, UsageError
from ..files import write_json
from ..models.adapters import (
    AdapterSpec,
    adapted_layers,
    adapter_spec_from_dict,
    adapter_state_dict,
    apply_adapters,
    check_base,
    merge_adapters,
    spec_json,
)
from .io import read_safetensors, write_safetensors
from .peers import check_hf

FORMAT_KEY = "format"
FORMAT = "vitkit-adapter/1"
SPEC_KEY = "adapter_spec"
BASE_NAME_KEY = "base_name"
BASE_SHA256_KEY = "base_sha256"
_OWN_KEYS = (FORMAT_KEY, SPEC_KEY, BASE_NAME_KEY, BASE_SHA256_KEY)


def check_adapter_name(path: str | Path) -> Path:
    """An adapter file's path, refused unless its name says ``adapter`` and ends in ``.safetensors``.

    Args:
        path: the file.

    Returns:
        ``path`` as a Path.

    Raises:
        UsageError: naming the file.
    """
    path = Path(path)
    if "adapter" not in path.name.lower() or path.suffix.lower() != ".safetensors":
        raise UsageError(
            f"{path}: an adapter file's name says adapter and ends in .safetensors (e.g. adapter.safetensors)"
        )
    return path


def save_adapters(model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the adapters of ``model`` alone (atomically): the tensors of
    :func:`~vitkit.models.adapters.adapter_state_dict`, the spec, the base's name and checksum.

    Args:
        model: a model with adapters applied (:func:`~vitkit.models.adapters.apply_adapters`).
        path: the file; its name must say ``adapter`` and end in ``.safetensors``.
        metadata: more string metadata to keep (class names under "classes", the step...).

    Returns:
        The path written.

    Raises:
        UsageError: a name that does not say adapter.
        RecipeError: a model without adapters.
    """
    path = check_adapter_name(path)
    info = getattr(model, "adapter_info", None)
    if info is None:
        raise RecipeError("the model has no adapters to save (apply_adapters first)")
    tensors = {k: v.float() for k, v in adapter_state_dict(model).items()}
    meta = {**(metadata or {}), **info.metadata}
    meta.update(
        {FORMAT_KEY: FORMAT, SPEC_KEY: spec_json(info.spec), BASE_NAME_KEY: info.base_name}
        | {BASE_SHA256_KEY: info.base_sha256}
    )
    write_safetensors(path, tensors, meta)
    return path


def read_adapters(path: str | Path) -> tuple[dict[str, torch.Tensor], AdapterSpec, dict[str, str]]:
    """The tensors, spec and metadata of an adapter file, checked.

    Args:
        path: the file.

    Returns:
        (tensors by the model's state-dict names, the spec, the metadata).

    Raises:
        CheckpointError: a file that is not a readable vitkit adapter file, naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such adapter file")
    tensors, meta = read_safetensors(path)
    if meta.get(FORMAT_KEY) != FORMAT or any(k not in meta for k in _OWN_KEYS):
        raise CheckpointError(
            f"{path}: not a vitkit adapter file (no {FORMAT!r} metadata); write one with save_adapters "
            "or train with finetune.adapter"
        )
    try:
        spec = adapter_spec_from_dict(json.loads(meta[SPEC_KEY]), f"{path}: {SPEC_KEY}")
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: its {SPEC_KEY} metadata does not read ({e})") from None
    return tensors, spec, meta


def load_adapters(model: nn.Module, path: str | Path, merge: bool = False) -> nn.Module:
    """Apply the adapters of ``path`` onto ``model`` (in place), after checking that ``model`` is
    the base they were trained on. A trained head of another number of classes than the base's
    replaces the base's. Extra metadata of the file (class names) is kept as
    ``model.adapter_metadata`` and in ``model.load_report.metadata``, which a saved or exported
    model carries.

    Args:
        model: the base model (vitkit's ViT), without adapters.
        path: the adapter file.
        merge: fold the adapters into plain weights afterwards
            (:func:`~vitkit.models.adapters.merge_adapters`), for serving and export.

    Returns:
        ``model``, with the adapters applied (or merged).

    Raises:
        CheckpointError: one line naming the file: not an adapter file, another base (its
            checksum differs), or tensors that do not fit the model.
    """
    path = Path(path)
    tensors, spec, meta = read_adapters(path)
    check_base(model, spec, meta[BASE_NAME_KEY], meta[BASE_SHA256_KEY], str(path))
    head = tensors.get("head.weight")
    if spec.train_head and head is not None and getattr(model, "num_classes", None) != head.shape[0]:
        model.reset_classifier(head.shape[0])
    try:
        apply_adapters(model, spec, base_name=meta[BASE_NAME_KEY])
    except RecipeError as e:
        raise CheckpointError(f"{path}: {e}") from None
    _copy_into(model, tensors, path)
    extra = {k: v for k, v in meta.items() if k not in _OWN_KEYS and not k.startswith("vitkit_")}
    model.adapter_info.metadata = extra
    model.adapter_metadata = extra
    model.adapter_source = str(path)  # named in messages about that metadata
    report = getattr(model, "load_report", None)
    if report is not None and extra:  # saved again with the model: a merged export keeps the class names
        report.metadata = {**report.metadata, **extra}
    return merge_adapters(model) if merge else model


def _copy_into(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    want = adapter_state_dict(model)
    missing, unexpected = sorted(want.keys() - tensors.keys()), sorted(tensors.keys() - want.keys())
    if missing or unexpected:
        what = f"lacks {missing[:3]}" if missing else f"has tensors this model has no place for: {unexpected[:3]}"
        raise CheckpointError(f"{path}: the file {what}")
    for key, target in want.items():
        if tuple(tensors[key].shape) != tuple(target.shape):
            raise CheckpointError(
                f"{path}: tensor {key!r} is {tuple(tensors[key].shape)}, the model's is {tuple(target.shape)}"
            )
        with torch.no_grad():
            target.copy_(tensors[key].to(target.dtype))


# ----------------------------------------------------------------------------------------------
# Hugging Face peft


# transformers' ViT module names, by its major version: the layers' container and each target.
PEFT_LAYOUTS = ("v5", "v4")
_HF_BLOCKS = {"v5": "layers", "v4": "encoder.layer"}
_HF_LAYERS = {
    "v5": {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj", "proj": "attention.o_proj"}
    | {"fc1": "mlp.fc1", "fc2": "mlp.fc2"},
    "v4": {"q": "attention.attention.query", "k": "attention.attention.key", "v": "attention.attention.value"}
    | {"proj": "attention.output.dense", "fc1": "intermediate.dense", "fc2": "output.dense"},
}
_HF_NORMS = {"norm1": "layernorm_before", "norm2": "layernorm_after"}


def _check_layout(layout: str) -> None:
    if layout not in PEFT_LAYOUTS:
        raise UsageError(
            f"peft layout must be one of {', '.join(PEFT_LAYOUTS)} (transformers' major version), got {layout!r}"
        )


def peft_key(key: str, has_head: bool, layout: str = "v5") -> str:
    """A vitkit adapter tensor's name -> peft's, for the transformers ViT of :func:`to_hf`'s names.

    Args:
        key: a key of :func:`~vitkit.models.adapters.adapter_state_dict`.
        has_head: whether the transformers model is ``ViTForImageClassification`` (its encoder
            under ``vit.``), not ``ViTModel``.
        layout: "v5" for transformers 5's module names (``layers.{i}.attention.q_proj``), "v4"
            for earlier versions' (``encoder.layer.{i}.attention.attention.query``).

    Returns:
        The name in peft's ``adapter_model.safetensors``.

    Raises:
        CheckpointError: a tensor peft's ViT has no place for.
    """
    _check_layout(layout)
    p = ("vit." if has_head else "") + _HF_BLOCKS[layout]
    if m := re.fullmatch(
        r"blocks\.(\d+)\.(?:attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(lora_A|lora_B|magnitude)\.(\w+)", key
    ):
        i, kind, part = m.groups()
        tail = {"lora_A": "lora_A.weight", "lora_B": "lora_B.weight", "magnitude": "lora_magnitude_vector"}[kind]
        return f"base_model.model.{p}.{i}.{_HF_LAYERS[layout][part]}.{tail}"
    if m := re.fullmatch(r"blocks\.(\d+)\.(norm1|norm2)\.(weight|bias)", key):
        i, norm, t = m.groups()
        return f"base_model.model.{p}.{i}.{_HF_NORMS[norm]}.{t}"
    if m := re.fullmatch(r"(head|norm)\.(weight|bias)", key):
        name, t = m.groups()
        encoder = "vit." if has_head else ""
        return f"base_model.model.{'classifier' if name == 'head' else encoder + 'layernorm'}.{t}"
    raise CheckpointError(f"Hugging Face's ViT has no place for adapter tensor {key!r}; keep the vitkit adapter file")


def peft_config(spec: AdapterSpec, base_name: str, has_head: bool, layout: str = "v5") -> dict[str, Any]:
    """The ``adapter_config.json`` peft reads for adapters of ``spec`` on transformers' ViT.

    Args:
        spec: the adapters' spec.
        base_name: the base model's name or folder (``base_model_name_or_path``).
        has_head: whether the model is ``ViTForImageClassification``.
        layout: transformers' module names, as :func:`peft_key` takes them.

    Returns:
        The config's keys and values.
    """
    _check_layout(layout)
    layers = sorted({_HF_LAYERS[layout][t] for t in spec.targets})
    blocks = re.escape(_HF_BLOCKS[layout])
    save = (["classifier"] if spec.train_head and has_head else []) + (
        ["layernorm_before", "layernorm_after", "layernorm"] if spec.train_norms else []
    )
    return {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_name,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "use_dora": spec.kind == "dora",
        "target_modules": rf"(.*\.)?{blocks}\.\d+\.({'|'.join(re.escape(n) for n in layers)})",
        "modules_to_save": save or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def export_peft(model: nn.Module, folder: str | Path, layout: str = "v5") -> Path:
    """Write ``model``'s adapters as a Hugging Face peft folder: ``adapter_model.safetensors``
    and ``adapter_config.json``, for the transformers ViT of the same base weights
    (``vitkit convert BASE DIR --to hf``; ``PeftModel.from_pretrained(vit, folder)``).

    Args:
        model: a model with adapters applied (not merged).
        folder: the folder to write (made if missing).
        layout: "v5" (transformers 5 and later) or "v4" (earlier versions): the module names
            peft finds the layers by.

    Returns:
        The folder.

    Raises:
        RecipeError: a model without adapters.
        CheckpointError: a base Hugging Face's ViT cannot hold (:func:`~vitkit.checkpoint.peers.check_hf`).
    """
    info = getattr(model, "adapter_info", None)
    if info is None or not adapted_layers(model):
        raise RecipeError("the model has no adapters to export (apply_adapters or load_adapters first)")
    has_head = getattr(model, "head", None) is not None
    check_hf(model.cfg, has_head, getattr(model, "pre_logits", None) is not None)
    tensors = {peft_key(k, has_head, layout): v.float() for k, v in adapter_state_dict(model).items()}
    folder = Path(folder)
    write_safetensors(folder / "adapter_model.safetensors", tensors, {"format": "pt"})
    write_json(folder / "adapter_config.json", peft_config(info.spec, info.base_name, has_head, layout))
    return folder


__all__ = [
    "PEFT_LAYOUTS",
    "check_adapter_name",
    "export_peft",
    "load_adapters",
    "merge_adapters",
    "peft_config",
    "peft_key",
    "read_adapters",
    "save_adapters",
]
