"""A run plan: every value a run derives from its recipe and its environment, computed once, and
every check of the recipe against the data, the model and the machine, made before the first step.

A run that could fail for a reason knowable at its start fails at its start, in one line;
``vitkit train --plan`` prints the plan (:meth:`RunPlan.describe`) and trains nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..data import Dataset, TransformConfig, batch_choice, build_dataset, is_labels_file
from ..data.mix import MixConfig
from ..data.randaugment import RandAugmentConfig
from ..data.transforms import EraseConfig
from ..errors import RecipeError, UsageError
from ..eval.naflex import naflex_source
from ..models.attention import choose_training_path
from ..models.config import ATTENTION_POS_EMBEDS, ViTConfig
from ..models.flops import check_memory
from ..models.naflex import naflex_patch
from ..models.vit import kept_patches
from ..precision import PrecisionChoice, resolve_precision
from ..preprocessing import Preprocessing
from . import dist as D
from .build import build_model
from .config import Recipe, patch_drop_schedule
from .distill import Teacher
from .objectives import Objective, objective_for
from .trackers import check_trackers


@dataclass(frozen=True)
class Environment:
    """Where a run computes: this process's device and its place among torchrun's processes.

    Attributes:
        device: the device of this process.
        info: rank, world size and local rank.
    """

    device: torch.device
    info: D.DistInfo

    @classmethod
    def for_recipe(cls, recipe: Recipe) -> Environment:
        """The device the recipe names (``train.device``), and the process group torchrun set up.

        Args:
            recipe: the recipe.

        Returns:
            The environment.
        """
        device = D.resolve_device(recipe.train.device)
        info = D.init_distributed(device)
        if info.enabled and device.type == "cuda":
            device = D.resolve_device("cuda", info.local_rank)
        return cls(device, info)


def micro_batch(recipe: Recipe, world_size: int) -> int:
    """The images one process computes at once: the global batch over the processes and the
    accumulation steps (the one formula of it).

    Args:
        recipe: the recipe.
        world_size: the processes.

    Returns:
        The micro-batch, at least 1.
    """
    return max(1, recipe.train.batch_size // (world_size * recipe.train.accum_steps))


def _dataset(r: Recipe, split: str) -> Dataset:
    """A split of the recipe's data, carved (``data.minival``, ``data.subset``) as the recipe says."""
    d = r.data
    extra: dict[str, Any] = {"val": d.val} if d.val else {}
    if r.train.loss == "sigmoid" and is_labels_file(d.name):
        extra["multilabel"] = True  # a sigmoid model of a labels file predicts each label on its own
    return build_dataset(
        d.name, split, minival=d.minival, subset=d.subset, subset_seed=d.subset_seed, **extra, **d.options
    )


def _check_batch(r: Recipe, info: D.DistInfo, ds: Dataset) -> None:
    if r.train.batch_size % (info.world_size * r.train.accum_steps):
        raise RecipeError(
            f"train.batch_size {r.train.batch_size} is not divisible by processes x accum_steps "
            f"({info.world_size} x {r.train.accum_steps})"
        )
    try:
        n = len(ds)
    except (NotImplementedError, TypeError):  # a stream of unknown length: the epoch itself tells
        return
    if n < r.train.batch_size:  # every epoch drops its short last batch: it would have none
        raise RecipeError(
            f"train.batch_size {r.train.batch_size} is larger than the {n} training images of {ds.name}; "
            "lower --batch-size"
        )


def _check_labels(r: Recipe, ds: Dataset) -> bool:
    """Whether the run is multi-label (rows of several labels): it needs the sigmoid loss."""
    multilabel = bool(getattr(ds, "multilabel", False))
    if multilabel and r.train.loss != "sigmoid":
        raise RecipeError(
            f"{ds.name}: rows with several labels need train.loss=sigmoid (a softmax picks one class an image)"
        )
    if multilabel and r.train.distill != "none":
        raise RecipeError(f"{ds.name}: distillation (train.distill) takes one class an image, not multi-label rows")
    wanted = r.model.overrides.get("num_classes")
    if wanted is not None and wanted < ds.num_classes:
        raise RecipeError(
            f"model.overrides.num_classes {wanted} is smaller than the {ds.num_classes} classes of {ds.name}"
        )
    return multilabel


def _check_classes(k: int | None, eval_ds: Dataset | None) -> None:
    """The model must predict the evaluation split's ``k`` classes, or every evaluation would fail."""
    if eval_ds is None or k is None or k == eval_ds.num_classes:
        return
    raise RecipeError(
        f"the model predicts {k} classes (model.overrides.num_classes) but {eval_ds.name} has "
        f"{eval_ds.num_classes}; set --set model.overrides.num_classes={eval_ds.num_classes} "
        "or train on data with as many classes"
    )


def _check_model_modes(r: Recipe, model: nn.Module) -> None:
    """Patch dropping, gradient checkpointing and a distilled model's two outputs."""
    t = r.train
    if t.patch_drop and not hasattr(model, "set_patch_drop"):
        raise RecipeError(f"train.patch_drop needs a ViT; {r.model.name} has no patch tokens to drop")
    kind = getattr(getattr(model, "cfg", None), "pos_embed", None)
    if t.patch_drop and kind in ATTENTION_POS_EMBEDS:
        raise RecipeError(
            f"train.patch_drop needs absolute position embeddings; with pos_embed={kind!r} the positions act "
            "in attention and the kept patches would lose their places (set train.patch_drop to 0)"
        )
    if t.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise RecipeError(f"train.grad_checkpointing needs a ViT; {r.model.name} has no encoder blocks")
        model.set_grad_checkpointing(True)
    if t.distill != "none" and getattr(model, "dist_token", None) is not None:
        model.set_distilled_training(True)
    if t.fsdp and t.ema_decay:
        raise RecipeError("train.ema_decay is not supported with train.fsdp yet; use DDP for EMA runs")
    if hasattr(model, "set_attention_impl"):
        model.set_attention_impl(t.attention)


def _check_naflex(r: Recipe, model: nn.Module, mix: MixConfig, max_tokens: int) -> int:
    """What NaFlex training cannot be combined with, refused before the first step; the patch side."""
    try:
        patch = naflex_patch(model)
    except UsageError as e:
        raise RecipeError(f"data.naflex: {e}") from None
    t = r.train
    clashes = [
        ("augment.mixup_alpha / augment.cutmix_alpha", mix.enabled),
        ("train.patch_drop", bool(t.patch_drop)),
        ("train.distill", t.distill != "none"),
        ("train.compile", bool(t.compile)),
    ]
    for name, on in clashes:
        if on:
            raise RecipeError(
                f"data.naflex (images of their own shapes) cannot be combined with {name} yet; turn one of them off"
            )
    return patch


def _naflex_batches(r: Recipe, world_size: int, train_ds: Dataset) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """NaFlex training's patch budgets and, under ``data.naflex.batch_tokens``, the global batch
    of each, checked: a multiple of the processes times the micro-steps (each computes as many
    images, so the mean over them is the batch's), and the data holds the largest batch."""
    lens = tuple(r.data.naflex.get("seq_lens") or [r.data.naflex["max_tokens"]])
    budget = r.data.naflex.get("batch_tokens")
    if budget is None:
        return lens, ()
    least = world_size * r.train.accum_steps
    sizes = tuple(budget // n // least * least for n in lens)
    if min(sizes) < least:
        raise RecipeError(
            f"data.naflex.batch_tokens {budget} holds {budget // max(lens)} images of {max(lens)} patches, and a "
            f"step needs at least {least} ({world_size} processes x train.accum_steps {r.train.accum_steps}): raise it"
        )
    try:
        n = len(train_ds)
    except (NotImplementedError, TypeError):
        return lens, sizes
    if max(sizes) > n:
        raise RecipeError(
            f"data.naflex.batch_tokens {budget} makes batches of up to {max(sizes)} images of {min(lens)} patches, "
            f"more than the {n} training images; lower it"
        )
    return lens, sizes


def _transform_config(r: Recipe, pre: Preprocessing) -> TransformConfig:
    """The recipe's augmentation at the model's resolution and value range."""
    a = r.augment
    erase = EraseConfig(a.erase_prob, a.erase_area, a.erase_aspect, a.erase_count, a.erase_mode)
    return TransformConfig(
        img_size=pre.img_size,
        crop=a.crop,
        pad=a.pad,
        flip=a.flip,
        area_min=a.area_min,
        eval_crop=a.eval_crop,
        mean=pre.mean,
        std=pre.std,
        randaugment=RandAugmentConfig.parse(a.randaugment) if a.randaugment else None,
        erase=erase if a.erase_prob else None,
    )


def _mix_config(r: Recipe, micro: int) -> MixConfig:
    """The recipe's Mixup / CutMix, with the label smoothing folded into its targets."""
    a = r.augment
    mix = MixConfig(
        mixup_alpha=a.mixup_alpha,
        cutmix_alpha=a.cutmix_alpha,
        prob=a.mix_prob,
        switch_prob=a.mix_switch_prob,
        mode=a.mix_mode,
        label_smoothing=r.train.label_smoothing,
    )
    if mix.enabled and mix.mode == "pair" and micro % 2:
        raise RecipeError(
            f"augment.mix_mode 'pair' needs an even batch on each process and micro-step, got {micro} "
            "(train.batch_size / processes / train.accum_steps)"
        )
    return mix


def _time_attention_paths(r: Recipe, model: nn.Module, env: Environment, micro: int, dtype: torch.dtype) -> None:
    """On the CPU with ``train.attention: auto``, time the two explicit attention paths (the same
    numbers bit for bit) on the shapes this run trains on, full and patch-dropped sequences, so
    that ``auto`` takes the faster on this CPU (:func:`~vitkit.models.attention.choose_training_path`,
    which records each choice and honours its pin)."""
    cfg = getattr(model, "cfg", None)
    if r.train.attention != "auto" or env.device.type != "cpu" or not isinstance(cfg, ViTConfig):
        return
    if cfg.attn_drop_rate > 0 or cfg.pos_embed == "relative":
        return  # dropout on the weights or a logits bias: the explicit path keeps the weights anyway
    patches = cfg.grid_size[0] * cfg.grid_size[1]
    counts = {patches} | {kept_patches(patches, rate) for _, rate in patch_drop_schedule(r.train)}
    for n in sorted(counts):
        choose_training_path(micro, cfg.num_heads, cfg.num_prefix_tokens + n, cfg.width // cfg.num_heads, dtype)


@dataclass
class RunPlan:
    """Everything a run derives from its recipe and environment, once (see the module's docstring).

    Attributes:
        recipe: the recipe.
        env: the device and the processes.
        precision: what the step computes in, as the policy resolved the recipe's precision.
        micro_batch: images a process computes at once.
        train_ds: the training split.
        eval_ds: the evaluation split; None without one.
        multilabel: whether the rows have several labels (scored by mAP).
        model: the model at step 0, on the CPU (:func:`~vitkit.train.build.build_model`).
        preprocessing: the model's value range and resolution.
        transform: the training augmentation and the evaluation's resizing.
        mix: Mixup / CutMix.
        teacher: a distillation run's teacher, on the device; else None.
        objective: what the run minimises.
        notes: lines about what was loaded, for the run's first messages.
        naflex: NaFlex's most patches an image (``data.naflex.max_tokens``); None: square images.
        naflex_lens: the patch budgets a NaFlex training batch draws one of (``data.naflex.seq_lens``).
        naflex_sizes: the global batch (images) of each budget, ``data.naflex.batch_tokens`` over
            it; empty: every batch ``train.batch_size`` images.
    """

    recipe: Recipe
    env: Environment
    precision: PrecisionChoice
    micro_batch: int
    train_ds: Dataset
    eval_ds: Dataset | None
    multilabel: bool
    model: nn.Module
    preprocessing: Preprocessing
    transform: TransformConfig
    mix: MixConfig
    teacher: Teacher | None
    objective: Objective
    notes: list[str] = field(default_factory=list)
    naflex: int | None = None
    naflex_lens: tuple[int, ...] = ()
    naflex_sizes: tuple[int, ...] = ()

    @classmethod
    def from_recipe(cls, recipe: Recipe, env: Environment | None = None) -> RunPlan:
        """Plan ``recipe``: read the data, build the model, resolve the precision and check
        everything against everything, before any step.

        Args:
            recipe: the recipe (checked as one read from YAML).
            env: where it computes; None: :meth:`Environment.for_recipe`.

        Returns:
            The plan.

        Raises:
            RecipeError: a recipe value that cannot be used with this data, model or machine.
            DataError: data that cannot be read.
        """
        r = recipe
        env = env or Environment.for_recipe(r)
        check_trackers(r.log.trackers)
        precision = resolve_precision(r.train.precision, env.device)
        micro = micro_batch(r, env.info.world_size)
        torch.manual_seed(r.seed)  # the weights are a function of the seed (and the data set-up before them)
        train_ds = _dataset(r, r.data.train_split)
        _check_batch(r, env.info, train_ds)
        eval_ds = _dataset(r, r.data.eval_split) if r.data.eval_split else None
        multilabel = _check_labels(r, train_ds)
        _check_classes(r.model.overrides.get("num_classes", train_ds.num_classes), eval_ds)  # before building it
        notes: list[str] = []
        model = build_model(r, train_ds.num_classes, train_ds.in_chans, notes)
        _check_classes(model.num_classes, eval_ds)  # a file's head too
        check_memory(model.cfg, "model and train.batch_size", micro, training=True, device=str(env.device))
        _check_model_modes(r, model)
        _time_attention_paths(r, model, env, micro, precision.dtype)
        pre = Preprocessing.for_config(model.cfg)
        mix = _mix_config(r, micro)
        teacher = None
        if r.train.distill != "none":
            cfg, t = model.cfg, r.train
            teacher = Teacher(t.teacher, cfg.num_classes, cfg.in_chans, pre, env.device, precision)
        objective = objective_for(r.train, model.num_classes, mix, teacher)
        naflex = r.data.naflex.get("max_tokens")
        lens: tuple[int, ...] = ()
        sizes: tuple[int, ...] = ()
        if naflex is not None:  # stored with the weights: eval, predict and embed see images so too
            train_ds = naflex_source(train_ds, _check_naflex(r, model, mix, naflex), naflex)
            pre = replace(pre, naflex=naflex)
            lens, sizes = _naflex_batches(r, env.info.world_size, train_ds)
            if sizes:  # a micro-step's patches, as the images of the model's square grid they equal
                grid = model.cfg.grid_size[0] * model.cfg.grid_size[1]
                tokens = -(-r.data.naflex["batch_tokens"] // (env.info.world_size * r.train.accum_steps))
                check_memory(model.cfg, "data.naflex.batch_tokens", -(-tokens // max(grid, 1)), True, str(env.device))
        return cls(
            r, env, precision, micro, train_ds, eval_ds, multilabel, model, pre, _transform_config(r, pre), mix,
            teacher, objective, notes, naflex, lens, sizes,
        )  # fmt: skip

    def _describe_batch(self, w: int) -> str:
        t = self.recipe.train
        if self.naflex_sizes:  # the size follows the budget each batch draws
            sizes = " or ".join(str(s) for s in sorted(set(self.naflex_sizes), reverse=True))
            return (
                f"batch: {sizes} images a step, by the patch budget it draws (data.naflex.batch_tokens), "
                f"split among {w} processes x {t.accum_steps} micro-steps"
            )
        return f"batch: {self.global_batch} a step = {w} processes x {t.accum_steps} micro-steps x {self.micro_batch}"

    def _describe_naflex(self) -> str:
        line = f"naflex: each image at its own aspect ratio, at most {self.naflex} patches (no square resize)"
        if len(self.naflex_lens) > 1:
            line += f"; a training batch draws its budget from {', '.join(map(str, self.naflex_lens))} patches"
        if self.naflex_sizes:
            budget = self.recipe.data.naflex["batch_tokens"]
            pairs = ", ".join(f"{s} of {n}" for s, n in zip(self.naflex_sizes, self.naflex_lens))
            line += f"; {budget} patches a batch: {pairs} patches"
        return line

    def naflex_budget(self, epoch: int, batch: int) -> int | None:
        """The patch budget of NaFlex training batch ``batch`` of ``epoch`` (one of
        ``data.naflex.seq_lens``, drawn as the data draws its size: :func:`vitkit.data.batch_choice`).

        Args:
            epoch: the epoch, from 0.
            batch: the batch's index in the epoch.

        Returns:
            The most patches each image of the batch may have; None without NaFlex.
        """
        if self.naflex is None:
            return None
        return self.naflex_lens[batch_choice(self.recipe.seed, epoch, batch, len(self.naflex_lens))]

    def batch_images(self, epoch: int, batch: int) -> int:
        """Images the global batch ``batch`` of ``epoch`` holds: ``global_batch``, or under a NaFlex
        token budget the size drawn with its patch budget.

        Args:
            epoch: the epoch, from 0.
            batch: the batch's index in the epoch.

        Returns:
            The images of all processes and micro-steps together.
        """
        if not self.naflex_sizes:
            return self.global_batch
        return self.naflex_sizes[batch_choice(self.recipe.seed, epoch, batch, len(self.naflex_sizes))]

    @property
    def global_batch(self) -> int:
        """Images a step trains on, all processes and micro-steps together."""
        return self.micro_batch * self.env.info.world_size * self.recipe.train.accum_steps

    def describe(self) -> list[str]:
        """The plan for a human, a line a value.

        Returns:
            The lines.
        """
        r, t, m = self.recipe, self.recipe.train, self.model
        params = sum(p.numel() for p in m.parameters())
        size = "x".join(str(s) for s in self.preprocessing.img_size)
        try:
            n_train = f"{len(self.train_ds)} images"
        except (NotImplementedError, TypeError):
            n_train = "a stream"
        n_eval = "none" if self.eval_ds is None else f"{self.eval_ds.name}, {len(self.eval_ds)} images"
        epochs = ""
        if n_train != "a stream":
            batch = sum(self.naflex_sizes) / len(self.naflex_sizes) if self.naflex_sizes else self.global_batch
            per_epoch = max(1, int(len(self.train_ds) // batch))  # a short last batch is left out
            epochs = f" ({t.steps / per_epoch:.1f} epochs)"
        started = r.model.init_from or "scratch"
        w = self.env.info.world_size
        lines = [
            f"model: {r.model.name}, {params / 1e6:.2f}M parameters, {m.num_classes} classes, {size} px "
            f"(from {started})",
            f"data: {r.data.name}: training {self.train_ds.name}, {n_train}, {self.train_ds.num_classes} classes"
            f"{', multi-label' if self.multilabel else ''}; evaluation: {n_eval}",
            f"device: {self.env.device}, {w} process{'es' if w > 1 else ''}",
            self._describe_batch(w),
            self.precision.describe(),
            f"objective: {self.objective.describe()}",
            f"schedule: {t.steps} steps{epochs}, {r.optim.name} lr {r.optim.lr:g} ({r.optim.schedule}, "
            f"{r.optim.warmup_steps} warm-up steps)",
            *([self._describe_naflex()] if self.naflex else []),
            f"logging: every {r.log.log_every} steps; evaluation every {r.log.eval_every}; checkpoints every "
            f"{r.log.checkpoint_every} steps and {r.log.checkpoint_minutes:g} minutes"
            + (f"; trackers: {', '.join(r.log.trackers)}" if r.log.trackers else ""),
        ]
        return lines + self.notes


__all__ = ["Environment", "RunPlan", "micro_batch"]
