"""Recipes: YAML files with ``--set key=value`` overrides, validated against dataclasses.

Every value is checked when the recipe is read, not when the run gets to it: its type (from the
field's annotation; a ``float`` is a finite number), and what the field declares next to its
default (:func:`checked`: a range such as ``"[0, 1)"`` or ``">= 1"``, or the names it may take).
Unknown keys are an error that suggests the close ones; the model's overrides are checked against
the model's config. The resolved recipe is saved with every run (``config.yaml``), so a run folder
always says exactly what produced it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import RecipeError
from ..files import check_yaml_text
from ..models.adapters import adapter_spec_from_dict
from ..models.attention import ATTENTION_IMPLS
from ..precision import PRECISIONS
from .trackers import TRACKERS

_RANGE = re.compile(r"([\[(])\s*(\S+?)\s*,\s*(\S+?)\s*([\])])|(>=|>)\s*(\S+)")


@dataclass(frozen=True)
class Check:
    """What a recipe value must be beyond its type: a range of numbers, written as in mathematics
    (``"[0, 1)"``, ``"(0, 1]"``, ``">= 1"``, ``"> 0"``), or one of ``choices``. ``counts``: a
    number above 1 must be whole (a count of images; below 1 it is a fraction). Applies to every
    element of a pair (``optim.betas``); None passes (an optional field left unset)."""

    spec: str = ""
    choices: tuple[str, ...] = ()
    ignore_case: bool = False
    counts: bool = False

    def bounds(self) -> tuple[float, float, bool, bool]:
        """(low, high, low included, high included) of the range."""
        m = _RANGE.fullmatch(self.spec.strip())
        if m is None:
            raise ValueError(f"not a range: {self.spec!r}")
        if m.group(5):
            return float(m.group(6)), math.inf, m.group(5) == ">=", False
        return float(m.group(2)), float(m.group(3)), m.group(1) == "[", m.group(4) == "]"

    def __call__(self, value: Any, where: str) -> None:
        if value is None:
            return
        if isinstance(value, (tuple, list)):
            for v in value:
                self(v, where)
            return
        if self.choices:
            self._check_choice(value, where)
        if self.spec:
            lo, hi, lo_in, hi_in = self.bounds()
            inside = (lo <= value if lo_in else lo < value) and (value <= hi if hi_in else value < hi)
            if not inside:
                what = f"in {self.spec}" if self.spec[0] in "[(" else self.spec
                raise RecipeError(f"{where} must be {what}, got {_shown(value)}")
        if self.counts and value > 1 and value != int(value):
            raise RecipeError(f"{where} must be a whole number of images or a fraction in (0, 1], got {_shown(value)}")

    def _check_choice(self, value: Any, where: str) -> None:
        names = [c.lower() for c in self.choices] if self.ignore_case else list(self.choices)
        key = value.lower() if self.ignore_case and isinstance(value, str) else value
        if key in names:
            return
        close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise RecipeError(f"{where} must be one of {', '.join(self.choices)}, got {_shown(value)}{hint}")


def checked(default: Any, spec: str = "", choices: tuple[str, ...] = (), **options: Any) -> Any:
    """A dataclass field with its :class:`Check` declared next to its default."""
    return field(default=default, metadata={"check": Check(spec, tuple(choices), **options)})


SEEDS = "[0, 4294967296)"  # what every generator seed takes (numpy's range too)
OPTIMIZERS = ("adamw", "adam", "sgd", "muon")
SCHEDULES = ("cosine", "linear", "constant")
LOSSES = ("softmax", "sigmoid")
ON_NONFINITE = ("stop", "skip")
CROPS = ("inception", "pad", "none")
INITS = ("default", "mimetic")
POS_EMBED_MODES = ("bilinear", "bicubic")
DISTILL = ("none", "hard", "soft")
MIX_MODES = ("batch", "pair", "elem")
ERASE_MODES = ("pixel", "rand", "const")


@dataclass
class ModelSection:
    name: str = "vit_s16"  # any registered name; the fields below override its config
    overrides: dict[str, Any] = field(default_factory=dict)  # config fields: width, depth, img_size, num_classes...
    init_from: str | None = None  # weights to start from (fine-tuning): any format load_pretrained reads
    init: str = checked("default", choices=INITS)  # attention initialisation of a model trained from scratch
    pos_embed_mode: str = checked("bilinear", choices=POS_EMBED_MODES)  # resizing when init_from's size differs


@dataclass
class DataSection:
    # --data: fashion-mnist, mnist, cifar10, cifar100, synthetic, a folder, a labels file (.csv, .jsonl), shards
    name: str = "fashion-mnist"
    # a labels file of the validation images (data.name a labels file); "": a minival of the training
    # file (a tenth, stratified by label) is held out instead
    val: str = ""
    train_split: str = "train"  # the split training reads ("minival": the held-out part)
    eval_split: str = "test"  # the split evaluations read ("" for none; "minival" to keep the test set unseen)
    num_workers: int = checked(0, "[0, 256]")  # processes decoding images (folders, shards); 0: the main one
    eval_max_images: int | None = checked(None, ">= 1")  # a fixed random subset of the evaluation split
    minival: float = checked(0, ">= 0", counts=True)  # training images held out as the split "minival"
    subset: float | None = checked(None, "> 0", counts=True)  # train on a class-balanced subset of the rest
    subset_seed: int = checked(0, SEEDS)  # fixes which images the minival and the subsets take (nested)
    options: dict[str, Any] = field(default_factory=dict)  # passed to the source (e.g. load_size)
    # NaFlex: each image at its own aspect ratio, cut into at most max_tokens patches, e.g. {max_tokens: 64};
    # seq_lens: the patch budgets a training batch draws one of (default [max_tokens]); batch_tokens:
    # the patches a training batch holds, its images batch_tokens // the budget drawn (default: batch_size
    # images); {}: every image resized to the model's square size
    naflex: dict[str, Any] = field(default_factory=dict)


@dataclass
class AugmentSection:
    crop: str = checked("inception", choices=CROPS)  # inception: random area and aspect; pad: pad and crop
    pad: int = checked(4, "[0, 4096]")  # pixels of padding of crop "pad"
    flip: bool = True  # random horizontal flips
    area_min: float = checked(0.05, "(0, 1]")  # crop "inception": the smallest fraction of the image kept
    eval_crop: float = checked(1.0, "(0, 1]")  # evaluation: the central fraction kept before resizing
    randaugment: str = ""  # timm's spelling, e.g. "rand-m9-n2-mstd0.5" (m: magnitude 0-10, n: ops); "": off
    mixup_alpha: float = checked(0.0, "[0, 1000]")  # Beta(alpha, alpha) of the mixing weight; 0: off
    cutmix_alpha: float = checked(0.0, "[0, 1000]")  # Beta(alpha, alpha) of CutMix's box area; 0: off
    mix_prob: float = checked(1.0, "[0, 1]")  # chance that a batch (image, pair) is mixed at all
    mix_switch_prob: float = checked(0.5, "[0, 1]")  # chance of CutMix when both alphas are above 0
    mix_mode: str = checked("batch", choices=MIX_MODES)  # one draw per batch, per pair (i, B-1-i), per image
    erase_prob: float = checked(0.0, "[0, 1]")  # random erasing, after normalisation; 0: off
    erase_area: tuple[float, float] = checked((0.02, 1 / 3), "(0, 1]")  # fraction of the image, low and high
    erase_aspect: tuple[float, float] = checked((0.3, 1 / 0.3), "> 0")  # height / width, low and high
    erase_count: int = checked(1, "[1, 64]")  # boxes an erased image gets: 1 to this many
    erase_mode: str = checked("pixel", choices=ERASE_MODES)  # N(0, 1) per pixel, one N(0, 1) colour a box, zeros
    repeats: int = checked(1, "[1, 64]")  # repeated augmentation: each image this many times in a row (DeiT: 3)


@dataclass
class OptimSection:
    # muon: Muon for the encoder's weight matrices, AdamW for the rest
    name: str = checked("adamw", choices=OPTIMIZERS, ignore_case=True)
    lr: float = checked(1e-3, ">= 0")  # peak learning rate, after the warm-up
    betas: tuple[float, float] = checked((0.9, 0.999), "[0, 1)")  # Adam's moment decays
    eps: float = checked(1e-8, ">= 0")  # Adam's denominator term
    momentum: float = checked(0.9, "[0, 1)")  # SGD's momentum
    nesterov: bool = False  # SGD: Nesterov momentum
    muon_momentum: float = checked(0.95, "[0, 1)")  # muon: the encoder matrices' momentum (Nesterov)
    muon_lr_scale: float = checked(1.0, "> 0")  # muon: the encoder matrices' lr is lr times this
    muon_split_qkv: bool = False  # muon: orthogonalise a fused qkv weight as q, k and v apart
    # decoupled (AdamW); on weight matrices and kernels only: never on biases, norm scales, position
    # embeddings, relative-position tables, class or distillation tokens (optim.decays)
    weight_decay: float = checked(0.1, ">= 0")
    layer_decay: float = checked(1.0, "(0, 1]")  # layer-wise lr decay (BEiT): layer l gets lr * decay^(L+1-l)
    schedule: str = checked("cosine", choices=SCHEDULES)  # after the warm-up, down to min_lr at the last step
    warmup_steps: int = checked(0, "[0, 1000000000]")  # linear warm-up from 0 (section 4.1)
    min_lr: float = checked(0.0, ">= 0")  # the rate the schedule ends at


@dataclass
class TrainSection:
    steps: int = checked(1000, "[1, 1000000000]")  # optimiser steps of the whole run
    batch_size: int = checked(128, "[1, 16777216]")  # global batch (all processes, all accumulation micro-steps)
    accum_steps: int = checked(1, "[1, 65536]")  # micro-batches a step adds up (same update, less memory)
    # auto: bf16 where the device computes it natively and fast, else fp32 (vitkit.precision);
    # bf16: autocast with fp32 weights
    precision: str = checked("auto", choices=PRECISIONS)
    bf16_weights: bool = False  # when the step computes in bf16: forward and backward on a bf16 copy of the weights
    compile: bool = False  # torch.compile what computes the step
    grad_clip: float = checked(1.0, ">= 0")  # global norm; 0 disables
    label_smoothing: float = checked(0.0, "[0, 1)")  # mass moved from the label to every class
    loss: str = checked("softmax", choices=LOSSES)  # softmax cross-entropy, or sigmoid (per-class BCE)
    head_bias_init: float | None = None  # default: 0 (softmax) / -log(K) (sigmoid)
    ema_decay: float = checked(0.0, "[0, 1)")  # Polyak averaging of the weights; 0 disables
    on_nonfinite: str = checked("stop", choices=ON_NONFINITE)  # skip: leave out a step whose loss is not finite
    fsdp: bool = False  # shard parameters with FSDP2 (torch.distributed.fsdp.fully_shard)
    patch_drop: float = checked(0.0, "[0, 1)")  # fraction of patch tokens dropped per training image
    patch_drop_until: float = checked(1.0, "[0, 1]")  # ... during this fraction of the steps; all tokens after
    patch_drop_flat_weight: float = checked(1.0, "(0, 1]")  # a flat patch's chance to be kept, against one with content
    # later stages, [[until, rate], ...]: each from where the one before ends (patch_drop_until for the
    # first) to this fraction of the steps, dropping this fraction; every patch after the last
    patch_drop_stages: tuple[tuple[float, float], ...] = ()
    attention: str = checked("auto", choices=ATTENTION_IMPLS)  # Attention's docstring says which runs where
    grad_checkpointing: bool = False  # recompute each encoder block in the backward pass (less memory)
    teacher: str | None = None  # DeiT distillation: a checkpoint load_pretrained reads (CNN or ViT)
    distill: str = checked("none", choices=DISTILL)  # hard: CE to the teacher's argmax; soft: KL at the temperature
    distill_alpha: float = checked(0.5, "[0, 1]")  # loss = (1 - alpha) * label loss + alpha * teacher loss
    distill_temperature: float = checked(1.0, "(0, 1000]")  # soft only; the KL is scaled by T^2
    device: str = "auto"  # auto | cpu | cuda | cuda:N


@dataclass
class LogSection:
    log_every: int = checked(50, ">= 0")  # 0: only after the last step (as eval_every, checkpoint_every)
    eval_every: int = checked(500, ">= 0")  # steps between evaluations (best.safetensors keeps the best)
    checkpoint_every: int = checked(500, ">= 0")  # steps between resumable checkpoints
    keep_last: int = checked(2, "[1, 100000]")  # checkpoints kept; older ones are removed
    tensorboard: bool = True  # when the tensorboard package is installed
    plot: bool = True  # curves.png of the metrics, rewritten at each evaluation (needs matplotlib)
    # a checkpoint also when this many minutes of training passed since the last (0: by steps only),
    # so that a stopped run loses at most that much
    checkpoint_minutes: float = checked(5.0, ">= 0")
    trackers: tuple[str, ...] = checked((), choices=TRACKERS)  # tensorboard, mlflow (local SQLite), wandb (offline)


@dataclass
class FinetuneSection:
    # LoRA / DoRA adapters on the frozen weights of model.init_from, e.g. {kind: lora, rank: 8,
    # alpha: 16, dropout: 0, targets: [q, v], train_head: true, train_norms: false}; {}: every weight trains
    adapter: dict[str, Any] = field(default_factory=dict)


@dataclass
class Recipe:
    """A whole training recipe. The reference's "Recipe keys" page lists every key of each
    section with its type, default, allowed values and meaning.

    Attributes:
        description: what the recipe trains and why, in words.
        seed: the seed of initialisation, data order and augmentation draws.
        model: the model: its name, overrides and the weights to start from.
        data: the data: the source, its options, the splits and the loading.
        augment: the augmentation.
        optim: the optimiser and its schedule.
        train: the length, batch, precision and device of training.
        log: how often to log, evaluate and checkpoint.
        finetune: adapters (LoRA, DoRA) instead of training every weight.
    """

    description: str = ""  # what the recipe trains and why, in words
    seed: int = checked(0, SEEDS)  # initialisation, data order and augmentation draws
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    augment: AugmentSection = field(default_factory=AugmentSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    log: LogSection = field(default_factory=LogSection)
    finetune: FinetuneSection = field(default_factory=FinetuneSection)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain data, as YAML writes it (tuples as lists).

        Returns:
            Each section as a dict of its keys.
        """
        d = dataclasses.asdict(self)
        d["optim"]["betas"] = list(self.optim.betas)
        d["augment"]["erase_area"] = list(self.augment.erase_area)
        d["augment"]["erase_aspect"] = list(self.augment.erase_aspect)
        d["train"]["patch_drop_stages"] = [list(s) for s in self.train.patch_drop_stages]
        d["log"]["trackers"] = list(self.log.trackers)
        return d


def _section_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _section_checks(cls: type) -> dict[str, Check]:
    return {f.name: f.metadata["check"] for f in dataclasses.fields(cls) if "check" in f.metadata}


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the type ``hint`` names (a YAML or ``--set`` value: "3" for 3 is fine)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _coerce(value, options[0], where)
        for a in options:
            try:
                return _coerce(value, a, where)
            except RecipeError:
                continue
        raise RecipeError(f"{where}: {_shown(value)} does not fit {hint}")
    if value is None:
        raise RecipeError(f"{where}: null is not allowed")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise RecipeError(f"{where}: expected true/false, got {_shown(value)}")
    if hint is int:
        return _integer(value, where)
    if hint is float:
        return _number(value, where)
    if hint is str:
        if isinstance(value, (dict, list, tuple)):
            raise RecipeError(f"{where}: expected a string, got {_shown(value)}")
        return str(value)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # any number of one kind
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"{where}: expected a list, got {_shown(value)}")
        return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise RecipeError(f"{where}: expected {len(args)} values, got {_shown(value)}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if origin is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{where}: expected a mapping, got {_shown(value)}")
        odd = [k for k in value if not isinstance(k, str)]
        if odd:
            raise RecipeError(f"{where}: keys must be names, got {_shown(odd[0])}")
        return dict(value)
    return value


def _integer(value: Any, where: str) -> int:
    """An int, or a string or float that is a whole number ("1e3", 1000.0)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, (float, str)) and not isinstance(value, bool):
        try:
            f = float(value)
        except ValueError:
            f = math.nan
        if math.isfinite(f) and f == int(f):
            return int(f)
    raise RecipeError(f"{where}: expected an integer, got {_shown(value)}")


def _number(value: Any, where: str) -> float:
    """A finite float: nan and inf are not numbers a recipe can use."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RecipeError(f"{where}: expected a number, got {_shown(value)}")
    try:
        f = float(value)
    except (ValueError, OverflowError):
        raise RecipeError(f"{where}: expected a number, got {_shown(value)}") from None
    if not math.isfinite(f):
        raise RecipeError(f"{where}: expected a finite number, got {_shown(value)}")
    return f


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise RecipeError(f"{where or 'recipe'}: expected a mapping, got {_shown(data)}")
    hints, checks = _section_types(cls), _section_checks(cls)
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(hints)}"
            raise RecipeError(f"unknown recipe key {path!r}{hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value or {}, path)
        else:
            kwargs[key] = _coerce(value, hint, path)
            if key in checks:
                checks[key](kwargs[key], path)
    section = cls(**kwargs)
    if isinstance(section, ModelSection):
        check_model_section(section, where)
    if isinstance(section, DataSection):
        check_data_section(section, where)
    if isinstance(section, TrainSection):
        check_distillation(section, where)
        check_bf16_weights(section, where)
        check_patch_drop_stages(section, where)
    if isinstance(section, AugmentSection):
        check_augment_section(section, where)
    optim = section if isinstance(section, OptimSection) else None
    if optim is not None and optim.nesterov and optim.name.lower() == "sgd" and optim.momentum == 0:
        raise RecipeError(f"{where}.nesterov needs {where}.momentum above 0, got 0")
    if isinstance(section, FinetuneSection) and section.adapter:
        adapter_spec_from_dict(section.adapter, f"{where}.adapter")
    if isinstance(section, Recipe) and section.finetune.adapter:
        check_adapter_recipe(section)
    if isinstance(section, Recipe) and section.optim.name.lower() == "muon" and section.train.fsdp:
        # FSDP holds a slice of each matrix per process; Muon's orthogonalisation needs it whole
        raise RecipeError("optim.name muon orthogonalises whole matrices, which train.fsdp splits: use adamw with fsdp")
    return section


def check_adapter_recipe(r: Recipe) -> None:
    """Adapters adapt weights that exist, and are saved alone: a model from scratch, or an EMA
    (whose average would need merging) cannot take them."""
    if not r.model.init_from:
        raise RecipeError("finetune.adapter adapts pretrained weights: set model.init_from (vitkit finetune --from)")
    if r.train.ema_decay:
        raise RecipeError("finetune.adapter does not take train.ema_decay: set one of them")


def check_distillation(t: TrainSection, where: str = "train") -> None:
    """A teacher and a kind of distillation come together: one without the other is a mistake."""
    if t.distill != "none" and not t.teacher:
        raise RecipeError(f"{where}.distill={t.distill} needs a teacher: set {where}.teacher to a checkpoint")
    if t.teacher and t.distill == "none":
        raise RecipeError(f"{where}.teacher is set but {where}.distill is none: set {where}.distill to hard or soft")


def check_patch_drop_stages(t: TrainSection, where: str = "train") -> None:
    """Later patch-drop stages follow the first (``patch_drop`` until ``patch_drop_until``) in
    order: each ends after the one before, within the run, and drops a fraction in [0, 1).
    ``patch_drop`` 0 turns patch dropout off, later stages included: they are not checked."""
    if not t.patch_drop_stages or not t.patch_drop:
        return
    start, name = t.patch_drop_until, f"{where}.patch_drop_until"
    for i, (until, rate) in enumerate(t.patch_drop_stages):
        at = f"{where}.patch_drop_stages[{i}]"
        if not start < until <= 1:
            raise RecipeError(f"{at} ends at {_shown(until)}: it must end after {name} ({start!r}) and by 1")
        if not 0 <= rate < 1:
            raise RecipeError(f"{at} drops {_shown(rate)} of the patches: it must be in [0, 1)")
        start, name = until, at


def patch_drop_schedule(t: TrainSection) -> tuple[tuple[float, float], ...]:
    """The patch-drop stages in order, (until, rate) each: ``patch_drop`` until
    ``patch_drop_until``, then ``patch_drop_stages``; none without ``patch_drop``."""
    return ((t.patch_drop_until, t.patch_drop), *t.patch_drop_stages) if t.patch_drop else ()


def patch_drop_at(t: TrainSection, step: int) -> float:
    """The fraction of patch tokens dropped at ``step`` (0-based): the rate of the first stage of
    :func:`patch_drop_schedule` that ends after it, 0 after the last."""
    return next((rate for until, rate in patch_drop_schedule(t) if step < until * t.steps), 0.0)


def check_bf16_weights(t: TrainSection, where: str = "train") -> None:
    """A bf16 copy of the weights computes in bf16 and hands its gradients to the fp32 weights
    once a step: it needs bf16 or auto (which computes with the copy where it resolves to bf16),
    one micro-step (gradients summed over micro-steps would add up in bf16) and whole parameters
    (FSDP's are sharded)."""
    if not t.bf16_weights:
        return
    if t.precision == "fp32":  # auto: a copy when auto resolves to bf16, none when to fp32
        raise RecipeError(
            f"{where}.bf16_weights needs {where}.precision bf16 or auto, got {t.precision}; "
            f"set {where}.bf16_weights=false for {t.precision}"
        )
    if t.accum_steps > 1:
        raise RecipeError(
            f"{where}.bf16_weights would sum {where}.accum_steps={t.accum_steps} micro-steps' gradients in bf16; "
            f"set {where}.accum_steps=1 or {where}.bf16_weights=false"
        )
    if t.fsdp:
        raise RecipeError(f"{where}.bf16_weights copies whole parameters, which {where}.fsdp shards: set one of them")


def check_augment_section(a: AugmentSection, where: str = "augment") -> None:
    """What one field's check cannot see: the RandAugment spec, and ranges given as (low, high)."""
    if a.randaugment:
        from ..data.randaugment import RandAugmentConfig

        try:
            RandAugmentConfig.parse(a.randaugment)
        except ValueError as e:
            raise RecipeError(f"{where}.randaugment: {e}") from None
    for key in ("erase_area", "erase_aspect"):
        low, high = getattr(a, key)
        if low > high:
            raise RecipeError(f"{where}.{key} must be [low, high] with low <= high, got [{low:g}, {high:g}]")


# Model overrides (fields of ViTConfig and ResNetConfig) whose nonsense values the model would take
# or fail on late: (kind, check). Kinds: "int" (a whole number), "number", "size" (an int or an
# (h, w) pair), "ints" (a list of them), "bool"; "?" after a kind: None allowed.
# Upper bounds far above any released model (ViT-22B: width 6144, depth 48, MLP 24576; 21k and
# JFT classes; gigapixel inputs are tiled), so that a typo is one line instead of an allocation
# that fails deep in torch; what fits this machine's memory is checked when the model is built.
MODEL_OVERRIDES: dict[str, tuple[str, Check]] = {
    "img_size": ("size", Check("[1, 16384]")),
    "patch_size": ("size", Check("[1, 1024]")),
    "in_chans": ("int", Check("[1, 1024]")),
    "num_classes": ("int", Check("[1, 1000000]")),
    "width": ("int", Check("[1, 65536]")),
    "depth": ("int", Check("[1, 1024]")),
    "num_heads": ("int", Check("[1, 1024]")),
    "mlp_dim": ("int", Check("[1, 262144]")),
    "resnet_width": ("int", Check("[1, 8192]")),
    "width_factor": ("int", Check("[1, 64]")),
    "representation_size": ("int?", Check("[1, 65536]")),
    **{k: ("number", Check("[0, 1)")) for k in ("drop_rate", "attn_drop_rate", "drop_path_rate")},
    "ln_eps": ("number", Check("(0, 1)")),
    "resnet_units": ("ints?", Check("[1, 256]")),
    "units": ("ints", Check("[1, 256]")),
    **{k: ("bool", Check()) for k in ("cls_pos_embed", "dynamic_img_size", "distill_token")},
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fits_kind(value: Any, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _fits_kind(value, kind[:-1])
    if kind == "int":
        return _is_int(value)
    if kind == "number":
        return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
    if kind == "size":
        return _is_int(value) or (isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_int, value)))
    if kind == "ints":
        # an empty list too: resnet_units=[] is a hybrid with the ResNet root alone (the config refuses empty units)
        return isinstance(value, (list, tuple)) and all(map(_is_int, value))
    return isinstance(value, bool)


_KIND_NAMES = {
    "int": "a whole number",
    "number": "a finite number",
    "size": "a whole number or a pair [h, w] of them",
    "ints": "a list of whole numbers",
    "bool": "true or false",
}


def check_model_section(m: ModelSection, where: str = "model") -> None:
    """Every override the model knows a range for, then (without ``init_from``, whose file gives the
    config) the whole config as the model builds it: one line naming ``model.overrides.KEY``."""
    for key, value in m.overrides.items():
        if key in MODEL_OVERRIDES:
            kind, check = MODEL_OVERRIDES[key]
            if not _fits_kind(value, kind):
                kind_name = _KIND_NAMES[kind.rstrip("?")]
                raise RecipeError(f"{where}.overrides.{key} must be {kind_name}, got {_shown(value)}")
            if not isinstance(value, bool):
                check(value, f"{where}.overrides.{key}")
    if m.init_from is not None:
        return
    from ..models.registry import model_config

    try:
        model_config(m.name)
    except ValueError as e:
        raise RecipeError(f"{where}.name: {e}") from None
    try:
        cfg = model_config(m.name, **m.overrides)
    except (ValueError, TypeError) as e:
        raise RecipeError(f"{where}.overrides: {e}") from None
    from ..models.config import ViTConfig, token_grid_problem

    if isinstance(cfg, ViTConfig) and (problem := token_grid_problem(cfg)):
        raise RecipeError(f"{where}.overrides: {problem}")


NAFLEX_MAX_TOKENS = 16384  # patches an image may have under NaFlex (a 2048 px square of 16 px patches)


def check_data_section(d: DataSection, where: str = "data") -> None:
    """The options the named source takes, each of the kind it takes (:mod:`vitkit.data.options`);
    a folder that does not exist yet is checked when it is read."""
    from ..data import source_kind
    from ..data.options import option_problem

    kind = source_kind(d.name)
    if kind is not None and (bad := option_problem(kind, d.options)):
        raise RecipeError(f"{where}.options.{bad[0]} {bad[1]}")
    from ..data.labels import SUFFIXES

    _check_naflex_section(d.naflex, where)
    if d.val and not d.name.lower().endswith(SUFFIXES):
        raise RecipeError(f"{where}.val is the validation file of a labels file; {where}.name {d.name!r} is not one")
    if d.val and not d.val.lower().endswith(SUFFIXES):
        raise RecipeError(f"{where}.val must be a labels file ({', '.join(SUFFIXES)}), got {d.val!r}")


NAFLEX_KEYS = ("max_tokens", "seq_lens", "batch_tokens")


def _check_naflex_section(naflex: dict[str, Any], where: str) -> None:
    """``data.naflex``: a patch budget, the budgets training batches draw from (each at most the
    budget) and the patches a batch holds (enough for one image of the largest budget)."""
    unknown = sorted(set(naflex) - set(NAFLEX_KEYS))
    if unknown:
        raise RecipeError(f"{where}.naflex.{unknown[0]} is not a NaFlex option (they: {', '.join(NAFLEX_KEYS)})")
    if not naflex:
        return

    def patches(value: Any, key: str, hi: int = NAFLEX_MAX_TOKENS) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
            raise RecipeError(
                f"{where}.naflex.{key} must be a whole number of patches in [1, {hi}], got {_shown(value)}"
            )
        return value

    tokens = patches(naflex.get("max_tokens"), "max_tokens")
    lens = naflex.get("seq_lens", [tokens])
    if not isinstance(lens, list) or not lens:
        raise RecipeError(f"{where}.naflex.seq_lens must be a list of patch budgets, e.g. [64, 144, {tokens}]")
    for i, n in enumerate(lens):
        patches(n, f"seq_lens[{i}]", tokens)  # at most max_tokens: what evaluation and serving use
    if "batch_tokens" in naflex:
        patches(naflex["batch_tokens"], "batch_tokens", NAFLEX_MAX_TOKENS * 4096)
        if naflex["batch_tokens"] < max(lens):
            raise RecipeError(
                f"{where}.naflex.batch_tokens ({naflex['batch_tokens']}) holds no image of the largest budget "
                f"({max(lens)} patches); give at least that"
            )


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise RecipeError(f"--set {dotted}: {p} is not a section")
    node[parts[-1]] = value


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    """``["train.steps=100", "model.overrides.depth=4"]`` -> [(key, YAML-parsed value)], each
    value read by :func:`load_yaml` (its limits, and a bad value is one line naming the key).

    Args:
        items: ``key=value`` strings, as ``--set`` takes them; an empty value is "".

    Returns:
        (dotted key, value) pairs, in order, for :func:`load_recipe`'s ``sets``.

    Raises:
        RecipeError: an item without ``=``, or a value that is not valid YAML.
    """
    out = []
    for item in items:
        if "=" not in item:
            raise RecipeError(f"--set expects key=value, got {_shown(item)}")
        key, raw = item.split("=", 1)
        out.append((key.strip(), load_yaml(raw, f"--set {key.strip()}") if raw.strip() else ""))
    return out


# What one recipe (a file or one --set value) may hold: recipes are a few hundred lines of settings.
YAML_MAX_CHARS = 1_000_000
YAML_MAX_NODES = 100_000  # values, counting each use of an alias (&anchor / *alias) in full
YAML_MAX_DEPTH = 50


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages that quote a value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _measure(node: yaml.Node, memo: dict[int, tuple[int, int]], depth: int = 0) -> tuple[int, int]:
    """(values, nesting depth) of a composed YAML node, an alias counted in full at each use;
    stops with ``OverflowError`` beyond :data:`YAML_MAX_NODES` or :data:`YAML_MAX_DEPTH`."""
    if depth > YAML_MAX_DEPTH:
        raise OverflowError(f"nested more than {YAML_MAX_DEPTH} deep")
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, yaml.MappingNode):
        children = [c for pair in node.value for c in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    count, height = 1, 0
    for child in children:
        n, h = _measure(child, memo, depth + 1)
        count, height = count + n, max(height, h + 1)
        if count > YAML_MAX_NODES:
            raise OverflowError(f"more than {YAML_MAX_NODES} values once its aliases are expanded")
    if depth + height > YAML_MAX_DEPTH:
        raise OverflowError(f"nested more than {YAML_MAX_DEPTH} deep")
    memo[id(node)] = (count, height)
    return count, height


def load_yaml(text: str, source: str, error: type[Exception] = RecipeError) -> Any:
    """YAML ``text`` read safely, with limits: plain data only (no ``!!python`` or other tags that
    build objects), at most :data:`YAML_MAX_CHARS` characters, :data:`YAML_MAX_NODES` values with
    every alias expanded (a few lines of nested aliases would otherwise stand for billions of
    values) and :data:`YAML_MAX_DEPTH` levels.

    Args:
        text: the YAML.
        source: what it came from (a file, ``--set key``), to name in the message.
        error: the exception class to raise.

    Returns:
        The value (None for an empty document).

    Raises:
        error: one line naming ``source`` and what is wrong.
    """
    if len(text) > YAML_MAX_CHARS:
        raise error(f"{source}: {len(text)} characters of YAML, more than a recipe holds ({YAML_MAX_CHARS})")
    check_yaml_text(text, source, error)  # a character YAML refuses, named with its line
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, {})
        return loader.construct_document(node)
    except OverflowError as e:
        raise error(f"{source}: {e}") from None
    except RecursionError:
        raise error(f"{source}: nested more than {YAML_MAX_DEPTH} deep") from None
    except yaml.YAMLError as e:
        raise error(f"{source}: not valid YAML ({str(e).splitlines()[0]})") from None
    finally:
        loader.dispose()


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def find_recipe(name: str | Path) -> Path:
    """A recipe path, or the name of one shipped with vitkit (``fmnist_vit`` or ``fmnist_vit.yaml``).
    ``configs/reproduce/`` holds the experiments of ``vitkit reproduce``, which are not training
    recipes: they are not listed.

    Args:
        name: a path to a YAML file, or the name of a shipped recipe (with or without ``.yaml``).

    Returns:
        The recipe's path.

    Raises:
        RecipeError: neither a file nor a shipped recipe (the message lists those).
    """
    p = Path(name)
    if p.is_file():
        return p
    for cand in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if cand.is_file():
            return cand
    shipped = ", ".join(sorted(q.stem for q in CONFIG_DIR.glob("*.yaml")))
    raise RecipeError(f"recipe {str(name)!r} not found (a YAML path, or one of: {shipped})")


def read_yaml_mapping(path: str | Path, what: str, error: type[Exception] = RecipeError) -> dict[str, Any]:
    """A YAML file that must hold a mapping (an empty file is an empty one); anything else,
    or a file that cannot be read, is one ``error`` naming the file and ``what`` it should be."""
    p = Path(path)
    try:
        if p.stat().st_size > 4 * YAML_MAX_CHARS:
            raise error(f"{p}: {p.stat().st_size} bytes, more than a {what} holds")
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise error(f"{p}: cannot read the {what} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise error(f"{p}: not UTF-8 text (byte {e.start}): a {what} is a YAML file") from None
    tree = load_yaml(text, str(p), error) or {}
    if not isinstance(tree, dict):
        raise error(f"{p}: a {what} is a mapping of sections")
    return tree


def load_recipe(path: str | Path | None = None, sets: list[tuple[str, Any]] | None = None) -> Recipe:
    """Read a YAML recipe (or the defaults) and apply ``sets`` (dotted keys).

    Args:
        path: the recipe's YAML file; None: the defaults.
        sets: (dotted key, value) pairs applied over the file, in order (:func:`parse_set`).

    Returns:
        The recipe, every key checked.

    Raises:
        RecipeError: a file that cannot be read, an unknown key, or a value of the wrong type
            or out of its range (the message names the key).
    """
    tree: dict[str, Any] = read_yaml_mapping(path, "recipe") if path is not None else {}
    for key, value in sets or []:
        _set_path(tree, key, value)
    return _build(Recipe, tree, "")


def recipe_from_dict(d: dict[str, Any]) -> Recipe:
    return _build(Recipe, d, "")


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)


def diff_recipes(a: Recipe, b: Recipe) -> list[str]:
    """Dotted keys whose values differ."""

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(d, dict):
            out = {}
            for k, v in d.items():
                out.update(flat(v, f"{prefix}{k}."))
            return out
        return {prefix[:-1]: d}

    fa, fb = flat(a.to_dict()), flat(b.to_dict())
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
