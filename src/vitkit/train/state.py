"""Training checkpoints: everything a killed run needs to resume bit-for-bit, in one safetensors file.

The file is also a plain vitkit model checkpoint: model tensors under their own names (so
``vitkit.load_pretrained`` reads it), and the training state under ``__train__/``: optimiser
state, EMA weights, random-number-generator state; counters and optimiser hyper-parameters in
the metadata as JSON. Files are written atomically, and only with finite weights; a newest file
that is damaged (or holds non-finite values, written by an older vitkit) is skipped in favour of
the previous one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import values
from ..checkpoint.io import read_safetensors, write_safetensors
from ..checkpoint.native import FORMAT, FORMAT_VERSION, config_to_meta
from ..errors import CheckpointError
from ..preprocessing import Preprocessing

PREFIX = "__train__/"
_STEP_FILE = re.compile(r"step_(\d+)\.safetensors$")


@dataclass
class TrainState:
    step: int = 0  # optimiser steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # global batches of `epoch` already consumed
    best_metric: float | None = None
    best_step: int | None = None
    nonfinite_skipped: int = 0
    train_seconds: float = 0.0  # optimiser-step time so far (evaluation and checkpoints excluded)
    last_metric: float | None = None  # the latest evaluation's top-1
    teacher_digest: str | None = None  # sha256 of the distillation teacher's weights (distill.Teacher)
    precision: str | None = None  # what the steps computed in ("fp32", "bf16"; None: not recorded)


def _flatten_optim(osd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{PREFIX}optim/{fqn}/{k}"] = v
            elif v is not None:
                scalars.setdefault(fqn, {})[k] = v
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in osd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optim(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {}
    pre = f"{PREFIX}optim/"
    for key, v in tensors.items():
        if key.startswith(pre):
            fqn, k = key[len(pre) :].rsplit("/", 1)
            state.setdefault(fqn, {})[k] = v
    for fqn, d in meta.get("scalars", {}).items():
        state.setdefault(fqn, {}).update(d)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def save_train_state(
    path: Path,
    model_cfg: Any,
    model_state: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
    state: TrainState,
    recipe_yaml: str,
    preprocessing: Preprocessing,
    classes: list[str],
    ema_state: dict[str, torch.Tensor] | None = None,
) -> None:
    tensors = {k: v for k, v in model_state.items()}
    opt_tensors, opt_meta = _flatten_optim(optim_state)
    tensors.update(opt_tensors)
    if ema_state is not None:
        tensors.update({f"{PREFIX}ema/{k}": v for k, v in ema_state.items()})
    tensors[f"{PREFIX}rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors[f"{PREFIX}rng/cuda"] = torch.cuda.get_rng_state()
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **config_to_meta(model_cfg),
        "preprocessing": json.dumps(preprocessing.to_dict()),
        "classes": json.dumps(classes),
        "train_state": json.dumps(
            {
                "step": state.step,
                "epoch": state.epoch,
                "batch_in_epoch": state.batch_in_epoch,
                "best_metric": state.best_metric,
                "best_step": state.best_step,
                "nonfinite_skipped": state.nonfinite_skipped,
                "train_seconds": state.train_seconds,
                "last_metric": state.last_metric,
                "teacher_digest": state.teacher_digest,
                "precision": state.precision,
                "optimizer": opt_meta,
            }
        ),
        "recipe": recipe_yaml,
    }
    write_safetensors(path, tensors, meta)


@dataclass
class LoadedTrainState:
    path: Path
    model_state: dict[str, torch.Tensor]
    optim_state: dict[str, Any]
    ema_state: dict[str, torch.Tensor] | None
    rng: dict[str, torch.Tensor]
    state: TrainState
    recipe_yaml: str


def load_train_state(path: Path) -> LoadedTrainState:
    tensors, meta = read_safetensors(path)
    if "train_state" not in meta:
        raise CheckpointError(f"{path}: a model checkpoint without training state; cannot resume from it")
    try:
        return _train_state(path, tensors, meta)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{path}: damaged training state ({type(e).__name__}: {e})") from None


def _train_state(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> LoadedTrainState:
    ts = values.loads(meta["train_state"], f"{path}: train_state")
    model_state = {k: v for k, v in tensors.items() if not k.startswith(PREFIX)}
    ema = {k[len(PREFIX) + 4 :]: v for k, v in tensors.items() if k.startswith(f"{PREFIX}ema/")} or None
    rng = {k[len(PREFIX) + 4 :]: v for k, v in tensors.items() if k.startswith(f"{PREFIX}rng/")}
    state = TrainState(
        step=ts["step"],
        epoch=ts["epoch"],
        batch_in_epoch=ts["batch_in_epoch"],
        best_metric=ts.get("best_metric"),
        best_step=ts.get("best_step"),
        nonfinite_skipped=ts.get("nonfinite_skipped", 0),
        train_seconds=ts.get("train_seconds", 0.0),
        last_metric=ts.get("last_metric"),
        teacher_digest=ts.get("teacher_digest"),
        precision=ts.get("precision"),
    )
    return LoadedTrainState(
        path, model_state, _unflatten_optim(tensors, ts["optimizer"]), ema, rng, state, meta.get("recipe", "")
    )


def list_checkpoints(folder: Path) -> list[Path]:
    """Training checkpoints in ``folder``, oldest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def nonfinite_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors that hold a NaN or an infinity."""
    named = [(k, v) for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not named:
        return []
    flags = [torch.isfinite(v).all() for _, v in named]
    finite = torch.stack([f.to(flags[0].device) for f in flags]).tolist()  # one transfer, not one a tensor
    return [k for (k, _), ok in zip(named, finite) if not ok]


def _other_model(state: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> str | None:
    """How a checkpoint's weights differ from the model's names and shapes, or None if they match."""
    missing = [k for k in shapes if k not in state]
    if missing:
        return f"another model: no {missing[0]}"
    extra = [k for k in state if k not in shapes]
    if extra:
        return f"another model: {extra[0]} is not this model's"
    for k, shape in shapes.items():
        if tuple(state[k].shape) != tuple(shape):
            return f"another model: {k} is {tuple(state[k].shape)}, this model's {tuple(shape)}"
    return None


def latest_loadable(
    folder: Path, skipped: list[str] | None = None, shapes: dict[str, tuple[int, ...]] | None = None
) -> LoadedTrainState | None:
    """The newest checkpoint that reads back with finite weights (and, given ``shapes``, the
    parameter names and shapes of the model it resumes: a checkpoint of another run, another
    width, say, copied into the folder); the others are skipped, each noted in ``skipped`` as
    "NAME (why)" for the caller to report.

    Args:
        folder: the run's ``checkpoints/``.
        skipped: a list to note the skipped checkpoints in.
        shapes: the model's state names and shapes (None: not checked).

    Returns:
        The loaded checkpoint, or None when none qualifies.
    """
    for path in reversed(list_checkpoints(folder)):
        try:
            loaded = load_train_state(path)
        except CheckpointError as e:  # "PATH: what is wrong; what to do": what is wrong
            why = str(e).removeprefix(f"{path}: ").split("; ")[0]
        else:
            bad = nonfinite_names(loaded.model_state) + nonfinite_names(loaded.ema_state or {})
            optim = loaded.optim_state["state"]
            bad += nonfinite_names({f"optimizer {fqn}/{k}": v for fqn, st in optim.items() for k, v in st.items()})
            other = _other_model(loaded.model_state, shapes) if shapes is not None else None
            if not bad and other is None:
                return loaded
            why = other or f"non-finite values in {', '.join(bad[:3])}"
        if skipped is not None:
            skipped.append(f"{path.name} ({why})")
    return None
