"""The training loop: one process or many (torchrun), CPU or CUDA, resumable bit-for-bit.

What makes a resumed run equal an uninterrupted one: the data order is a function of
(seed, epoch) and the run resumes at the batch it stopped at; augmentation randomness is a
function of (seed, rank, step); the optimiser, EMA and the global RNG (dropout) are restored; the
learning rate is a function of the step.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint.native import save_weights
from ..cpu import cpu_info
from ..data import Dataset, TransformConfig, build_dataset, is_labels_file, step_generator, train_transform
from ..data.mix import MixConfig, mix_batch
from ..data.randaugment import RandAugmentConfig
from ..data.streaming import StreamingDataset
from ..data.transforms import EraseConfig, match_channels
from ..errors import DataError, RecipeError, TrainingError, VitkitError
from ..eval import evaluate
from ..eval.classify import NonFiniteOutputs
from ..eval.multilabel import evaluate_multilabel
from ..files import write_text
from ..models.attention import choose_training_path
from ..models.config import ATTENTION_POS_EMBEDS, ViTConfig
from ..models.flops import check_memory
from ..models.init import mimetic_init_
from ..models.registry import create_model
from ..models.vit import kept_patches
from ..precision import PrecisionChoice, resolve_precision, take_warning
from ..preprocessing import Preprocessing
from . import dist as D
from .advice import chance_warning, few_images_warning, nonfinite_loss_advice, second_evaluation_step
from .compute import StepCompute, step_compute
from .config import (
    Recipe,
    diff_recipes,
    dump_recipe,
    patch_drop_at,
    patch_drop_schedule,
    read_yaml_mapping,
    recipe_from_dict,
)
from .distill import Teacher, distillation_loss
from .optim import build_optimizer, lr_at, set_lr
from .process import configure_process
from .runfolder import RunFolder
from .state import TrainState, latest_loadable, list_checkpoints, nonfinite_names, save_train_state
from .summary import RunReport, write_run_report
from .timing import Stopwatch, Window, due


class Progress:
    """What the loop reports to; the CLI passes a progress bar, the library default is silent."""

    def start(self, total: int, initial: int) -> None:
        """The run starts.

        Args:
            total: the run's steps in all.
            initial: the step it starts from (above 0 when it resumes).
        """

    def update(self, steps: int, **postfix: Any) -> None:
        """Steps were done, or new numbers are to be shown.

        Args:
            steps: steps done since the last update (0: only new numbers).
            **postfix: numbers to show by name (``loss``, ``lr``, ``ips``: images per second).
        """

    def message(self, text: str) -> None:
        """Say one line (a warning, an evaluation's result).

        Args:
            text: the line.
        """

    def close(self) -> None:
        """The run ended, however it ended."""


@dataclass
class RunResult:
    """What a run ended with. ``final_top1`` and ``best_top1`` are the evaluation's score: top-1,
    or for a multi-label model the mAP (macro); ``report`` holds the per-epoch table, the per-class
    scores, the warnings and the files written (:mod:`vitkit.train.summary`).

    Attributes:
        out_dir: the run folder.
        step: the last step trained.
        final_top1: the last evaluation's score (a fraction in [0, 1]); None without an
            evaluation split.
        best_top1: the best evaluation's score.
        best_step: the step of the best evaluation.
        train_seconds: the time spent training, evaluations left out.
        images_per_second: the training throughput, all processes together.
        resumed_from: the step the run resumed from; None for a fresh start.
        report: the run's report; None where it was not written (not the main process).
        multilabel: whether the scores are mAPs (a multi-label run).
    """

    out_dir: Path
    step: int
    final_top1: float | None
    best_top1: float | None
    best_step: int | None
    train_seconds: float
    images_per_second: float
    resumed_from: int | None
    report: RunReport | None = None
    multilabel: bool = False


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


class EMA:
    """Polyak averaging of the weights (fp32 shadow copy), used for evaluation when enabled."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if v.dtype.is_floating_point:
                s.mul_(self.decay).add_(v.detach().float(), alpha=1 - self.decay)
            else:
                s.copy_(v)

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        backup = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict({k: v.to(backup[k].dtype) for k, v in self.shadow.items()})
        try:
            yield
        finally:
            model.load_state_dict(backup)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, kind: str, smoothing: float) -> torch.Tensor:
    """Softmax cross-entropy, or sigmoid cross-entropy (summed over classes) as big_vision.

    ``labels``: class indices (B,), or soft targets (B, K) from Mixup / CutMix, which already hold
    the label smoothing (``smoothing`` is then not applied again).
    """
    logits = logits.float()
    if labels.is_floating_point():
        if kind == "softmax":
            return F.cross_entropy(logits, labels)
        if kind == "sigmoid":
            return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / logits.shape[0]
    if kind == "softmax":
        return F.cross_entropy(logits, labels, label_smoothing=smoothing)
    if kind == "sigmoid":
        k = logits.shape[-1]
        target = F.one_hot(labels, k).float()
        if smoothing:
            target = target * (1 - smoothing) + smoothing / k
        return F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / logits.shape[0]
    raise ValueError(f"loss must be softmax or sigmoid, got {kind!r}")


def _devices(r: Recipe) -> tuple[torch.device, D.DistInfo]:
    """The device of this process and its place among the processes ``torchrun`` started."""
    device = D.resolve_device(r.train.device)
    info = D.init_distributed(device)
    if info.enabled and device.type == "cuda":
        device = D.resolve_device("cuda", info.local_rank)
    if r.train.batch_size % (info.world_size * r.train.accum_steps):
        raise RecipeError(
            f"train.batch_size {r.train.batch_size} is not divisible by processes x accum_steps "
            f"({info.world_size} x {r.train.accum_steps})"
        )
    return device, info


def _dataset(r: Recipe, split: str) -> Dataset:
    """A split of the recipe's data, carved (``data.minival``, ``data.subset``) as the recipe says."""
    d = r.data
    extra: dict[str, Any] = {"val": d.val} if d.val else {}
    if r.train.loss == "sigmoid" and is_labels_file(d.name):
        extra["multilabel"] = True  # a sigmoid model of a labels file predicts each label on its own
    return build_dataset(
        d.name, split, minival=d.minival, subset=d.subset, subset_seed=d.subset_seed, **extra, **d.options
    )


def _check_multilabel(r: Recipe, ds: Dataset) -> bool:
    """Whether the run is multi-label (rows of several labels): it needs the sigmoid loss."""
    multilabel = bool(getattr(ds, "multilabel", False))
    if multilabel and r.train.loss != "sigmoid":
        raise RecipeError(
            f"{ds.name}: rows with several labels need train.loss=sigmoid (a softmax picks one class an image)"
        )
    if multilabel and r.train.distill != "none":
        raise RecipeError(f"{ds.name}: distillation (train.distill) takes one class an image, not multi-label rows")
    return multilabel


def _check_batch_fits(r: Recipe, ds: Dataset) -> None:
    """Every epoch drops its short last batch: with fewer images than a batch it would have none."""
    try:
        n = len(ds)
    except (NotImplementedError, TypeError):  # a stream of unknown length: the epoch itself tells
        return
    if n < r.train.batch_size:
        raise RecipeError(
            f"train.batch_size {r.train.batch_size} is larger than the {n} training images of {ds.name}; "
            "lower --batch-size"
        )


def _check_patch_drop(r: Recipe, model: nn.Module) -> None:
    if r.train.patch_drop and not hasattr(model, "set_patch_drop"):
        raise RecipeError(f"train.patch_drop needs a ViT; {r.model.name} has no patch tokens to drop")
    kind = getattr(getattr(model, "cfg", None), "pos_embed", None)
    if r.train.patch_drop and kind in ATTENTION_POS_EMBEDS:
        raise RecipeError(
            f"train.patch_drop needs absolute position embeddings; with pos_embed={kind!r} the positions act "
            "in attention and the kept patches would lose their places (set train.patch_drop to 0)"
        )


def _set_model_modes(r: Recipe, model: nn.Module) -> None:
    """Gradient checkpointing of the encoder blocks, and a distilled model's two outputs."""
    if r.train.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise RecipeError(f"train.grad_checkpointing needs a ViT; {r.model.name} has no encoder blocks")
        model.set_grad_checkpointing(True)
    if r.train.distill != "none" and getattr(model, "dist_token", None) is not None:
        model.set_distilled_training(True)


def _time_attention_paths(
    r: Recipe, model: nn.Module, device: torch.device, info: D.DistInfo, precision: PrecisionChoice
) -> None:
    """On the CPU with ``train.attention: auto``, time the two explicit attention paths (weights
    kept or recomputed: the same numbers bit for bit) on the shapes this run trains on, full and
    patch-dropped sequences, so that ``auto`` takes the faster on this CPU (choose_training_path)."""
    cfg = getattr(model, "cfg", None)
    if r.train.attention != "auto" or device.type != "cpu" or not isinstance(cfg, ViTConfig):
        return
    if cfg.attn_drop_rate > 0 or cfg.pos_embed == "relative":
        return  # dropout on the weights or a logits bias: the explicit path keeps the weights anyway
    micro = max(1, r.train.batch_size // (info.world_size * r.train.accum_steps))
    patches = cfg.grid_size[0] * cfg.grid_size[1]
    counts = {patches} | {kept_patches(patches, rate) for _, rate in patch_drop_schedule(r.train)}
    for n in sorted(counts):
        choose_training_path(
            micro, cfg.num_heads, cfg.num_prefix_tokens + n, cfg.width // cfg.num_heads, precision.dtype
        )


def _transform_config(r: Recipe, pre: Preprocessing) -> TransformConfig:
    """The recipe's augmentation at the model's resolution and value range."""
    a = r.augment
    erase = EraseConfig(a.erase_prob, a.erase_area, a.erase_aspect, a.erase_count, a.erase_mode)
    return TransformConfig(
        img_size=pre.img_size,
        crop=r.augment.crop,
        pad=r.augment.pad,
        flip=r.augment.flip,
        area_min=r.augment.area_min,
        eval_crop=r.augment.eval_crop,
        mean=pre.mean,
        std=pre.std,
        randaugment=RandAugmentConfig.parse(a.randaugment) if a.randaugment else None,
        erase=erase if a.erase_prob else None,
    )


def _mix_config(r: Recipe, info: D.DistInfo) -> MixConfig:
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
    micro = r.train.batch_size // (info.world_size * r.train.accum_steps)
    if mix.enabled and mix.mode == "pair" and micro % 2:
        raise RecipeError(
            f"augment.mix_mode 'pair' needs an even batch on each process and micro-step, got {micro} "
            "(train.batch_size / processes / train.accum_steps)"
        )
    return mix


class Trainer:
    """Build everything a recipe names, then :meth:`run` it to the end (resuming if possible).

    The process-wide settings of CPU training (:func:`vitkit.train.process.configure_process`)
    are :func:`train`'s to make, before a Trainer is built.

    Args:
        recipe: the recipe, checked as one read from YAML.
        out_dir: the run folder: made if missing, resumed if it holds the run's checkpoints.
        progress: what the loop reports to; None: nothing.

    Raises:
        RecipeError: a recipe value that cannot be used with this data, model or device, or a
            resume whose recipe differs.
        DataError: data that cannot be read.
        UsageError: a run folder that is a file or holds other files.
        TrainingError: another run holds the folder, or a checkpoint cannot be resumed.
    """

    def __init__(self, recipe: Recipe, out_dir: str | Path, progress: Progress | None = None) -> None:
        recipe_from_dict(recipe.to_dict())  # the checks of a recipe read from YAML, for one built in Python
        self.recipe = recipe
        self.folder = RunFolder(out_dir)  # refuses an empty name before it becomes "."
        self.out = self.folder.out
        self.progress = progress or Progress()
        self.device, self.info = _devices(recipe)
        if self.info.is_main:
            self.folder.acquire()  # held until run() ends (or the process does)
        try:
            self._set_up()
        except BaseException:
            self.folder.release(failed_start=True)
            raise

    def _set_up(self) -> None:
        r = self.recipe
        if self.info.is_main:
            removed = self.folder.remove_stale_temporaries()
            if removed:
                self.progress.message(
                    f"{self.out}: removed {len(removed)} temporary files a killed run left ({', '.join(removed[:3])})"
                )
        self._check_resume_recipe()
        # what the step computes in: the recipe's precision as this device resolves it
        self.precision = resolve_precision(r.train.precision, self.device)
        torch.manual_seed(r.seed)
        self.train_ds = _dataset(r, r.data.train_split)
        _check_batch_fits(r, self.train_ds)
        self.eval_ds = _dataset(r, r.data.eval_split) if r.data.eval_split else None
        self.multilabel = _check_multilabel(r, self.train_ds)
        self.warnings: list[str] = []  # every warning of this run, printed and kept for the summary
        self.start_warnings = 0  # how many of them were said when the run started (the log's come after)
        self.last_eval: dict[str, Any] = {}
        self.model = self._build_model().to(self.device)
        if hasattr(self.model, "set_attention_impl"):
            self.model.set_attention_impl(r.train.attention)
        _check_patch_drop(r, self.model)
        _set_model_modes(r, self.model)
        _time_attention_paths(r, self.model, self.device, self.info, self.precision)
        self.preprocessing = Preprocessing.for_config(self.model.cfg)
        self.tcfg = _transform_config(r, self.preprocessing)
        self.teacher = self._build_teacher()
        self.mix = _mix_config(r, self.info)
        if r.train.fsdp and r.train.ema_decay:
            raise RecipeError("train.ema_decay is not supported with train.fsdp yet; use DDP for EMA runs")
        # what computes a step in the chosen precision (the model under autocast, or a bf16 copy of
        # it); FSDP shards the parameters in place, so the optimiser is built after, on the shards
        self.compute: StepCompute = step_compute(
            self.model, self.precision, r.train.bf16_weights, self.info, self.device, r.train.fsdp, r.train.compile
        )
        fused = self.device.type == "cuda" and not r.train.fsdp  # FSDP's sharded parameters: foreach
        # data parallel (not FSDP's shards): every process steps on the same averaged gradients
        group = torch.distributed.group.WORLD if self.info.enabled and not r.train.fsdp else None
        self.optimizer = build_optimizer(
            self.model, r.optim, fused=fused, process_group=group, precision=self.precision.name
        )
        self.ema = EMA(self.model, r.train.ema_decay) if r.train.ema_decay else None
        digest = self.teacher.digest if self.teacher is not None else None
        self.state = TrainState(teacher_digest=digest, precision=self.precision.name)
        self.resumed_from: int | None = None
        self._resume()
        self.compute.weights_loaded(self.info)
        self._tb: Any = None

    def warn(self, text: str) -> None:
        """Say a warning (one line, through the progress messages) and keep it for the summary.

        Args:
            text: the warning, without the ``warning:`` the message puts before it.
        """
        self.warnings.append(text)
        self.progress.message(f"warning: {text}")

    @property
    def unwrapped_model(self) -> nn.Module:
        """The model itself, out of DDP and torch.compile's wrappers."""
        return _unwrap(self.model)

    @property
    def can_score_alone(self) -> bool:
        """Whether the main process holds whole weights to score the validation split on its own
        (not under FSDP, whose processes hold shards)."""
        return self.info.is_main and not self.recipe.train.fsdp

    def train_label_rows(self) -> torch.Tensor:
        """The training images' multi-hot rows (N, K) (a multi-label source).

        Returns:
            The rows (N, K), one per training image.
        """
        return self.train_ds.label_rows

    # -- set-up ---------------------------------------------------------------------------------
    def _build_model(self) -> nn.Module:
        r = self.recipe
        overrides = dict(r.model.overrides)
        overrides.setdefault("num_classes", self.train_ds.num_classes)
        if overrides["num_classes"] < self.train_ds.num_classes:
            raise RecipeError(
                f"model.overrides.num_classes {overrides['num_classes']} is smaller than the "
                f"{self.train_ds.num_classes} classes of {self.train_ds.name}"
            )
        try:
            if r.model.init_from:
                from ..hub import load_pretrained  # files, and names downloaded once (vitkit.hub)

                model = load_pretrained(r.model.init_from, pos_embed_mode=r.model.pos_embed_mode, **overrides)
                for note in model.load_report.notes:
                    self.progress.message(f"{r.model.init_from}: {note}")
                model.train()
            else:
                overrides.setdefault("in_chans", self.train_ds.in_chans)
                model = create_model(r.model.name, **overrides)
                if r.model.init == "mimetic":
                    mimetic_init_(model, seed=r.seed)
        except ValueError as e:  # the model's own checks, of the overrides with the file's or the data's values
            if isinstance(e, VitkitError):
                raise
            raise RecipeError(f"model.overrides: {e}") from None
        micro = max(1, r.train.batch_size // (self.info.world_size * r.train.accum_steps))
        check_memory(model.cfg, "model and train.batch_size", micro, training=True, device=str(self.device))
        bias = r.train.head_bias_init
        if bias is None and r.train.loss == "sigmoid":
            bias = -math.log(model.num_classes)
        for head in (getattr(model, "head", None), getattr(model, "head_dist", None)):
            if bias is not None and head is not None:
                nn.init.constant_(head.bias, bias)
        return model

    def _build_teacher(self) -> Teacher | None:
        r = self.recipe
        if r.train.distill == "none":
            return None
        cfg, t = self.model.cfg, r.train
        return Teacher(t.teacher, cfg.num_classes, cfg.in_chans, self.preprocessing, self.device, self.precision.name)

    def _check_resume_recipe(self) -> None:
        saved = self.out / "config.yaml"
        if saved.is_file() and list_checkpoints(self.out / "checkpoints"):
            try:
                old = recipe_from_dict(read_yaml_mapping(saved, "recipe"))
            except RecipeError as e:
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise TrainingError(
                    f"{saved}: the recipe of the run in this folder does not read back ({why}); "
                    "fix it, or use another --out"
                ) from None
            # logging and the description's prose change nothing the weights depend on
            changed = [k for k in diff_recipes(old, self.recipe) if not k.startswith("log.") and k != "description"]
            if changed:
                raise TrainingError(
                    f"{self.out} holds a run with a different recipe (changed: {', '.join(changed[:6])}); "
                    "use another --out, or the same settings to resume"
                )

    def _check_same_teacher(self, saved: str | None) -> None:
        """A resumed distillation run must learn from the teacher it started with: the recipe
        names the teacher (checked by :meth:`_check_resume_recipe`), this its weights (the digest
        ``self.state`` holds from the start). A checkpoint from before the digest was kept (None)
        cannot be checked."""
        now = self.state.teacher_digest
        if saved is None or saved == now:
            return
        raise TrainingError(
            f"train.teacher {self.recipe.train.teacher}: its weights changed since this run started "
            f"(sha256 {saved[:12]}... then, {str(now)[:12]}... now); put the first teacher back "
            "to resume, or use another --out to start afresh"
        )

    def _resume(self) -> None:
        if not list_checkpoints(self.out / "checkpoints"):
            return
        skipped: list[str] = []
        shapes = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}
        loaded = latest_loadable(self.out / "checkpoints", skipped, shapes)
        if loaded is None:
            raise TrainingError(
                f"{self.out / 'checkpoints'}: no checkpoint of this model reads back with finite weights "
                f"({'; '.join(skipped[:3])}); cannot resume. Move the folder away to start afresh"
            )
        if skipped:
            self.progress.message(f"skipped checkpoint {', '.join(skipped)}; resuming from {loaded.path.name}")
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(  # full (unsharded) tensors in the file; sharded again under FSDP
            self.model,
            self.optimizer,
            model_state_dict=loaded.model_state,
            optim_state_dict=loaded.optim_state,
            options=StateDictOptions(full_state_dict=True),
        )
        if self.ema is not None and loaded.ema_state is not None:
            self.ema.shadow = {k: v.float().to(self.device) for k, v in loaded.ema_state.items()}
        if "torch" in loaded.rng:
            torch.set_rng_state(loaded.rng["torch"])
        if "cuda" in loaded.rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(loaded.rng["cuda"])
        self._check_same_teacher(loaded.state.teacher_digest)
        loaded.state.teacher_digest = self.state.teacher_digest  # an older checkpoint's None too
        before = loaded.state.precision
        if before is not None and before != self.precision.name:  # the weights on disk are fp32 either way
            self.progress.message(
                f"resuming in {self.precision.name} a run whose steps so far computed in {before} "
                f"({self.precision.describe()})"
            )
        loaded.state.precision = self.precision.name
        self.state = loaded.state
        self.resumed_from = loaded.state.step
        self.progress.message(f"resuming {self.out} from step {loaded.state.step}")

    # -- checkpoints and logs ---------------------------------------------------------------------
    def _full_state(self) -> tuple[dict, dict]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def _nonfinite(self) -> list[str]:
        """The weights, EMA weights and optimiser state holding a NaN or an infinity (this process's
        shard of them under FSDP); every process gets the same answer (a collective)."""

        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if hasattr(t, "to_local") else t  # an FSDP shard

        names = {p: n for n, p in self.model.named_parameters()}
        tensors = {n: local(p.detach()) for n, p in self.model.named_parameters()}
        tensors.update({f"buffer {n}": local(b) for n, b in self.model.named_buffers()})
        if self.ema is not None:
            tensors.update({f"EMA {k}": v for k, v in self.ema.shadow.items()})
        for p, st in self.optimizer.state.items():
            name = names.get(p, "?")
            tensors.update({f"optimizer {name}/{k}": local(v) for k, v in st.items() if torch.is_tensor(v)})
        bad = nonfinite_names(tensors)
        count = D.all_reduce_sum(torch.tensor(float(len(bad)), device=self.device), self.info)
        return bad or (["the weights of another process"] if count.item() else [])

    def _stop_if_nonfinite(self, consequence: str) -> None:
        """Stop before non-finite weights are evaluated, saved or trained on further."""
        bad = self._nonfinite()
        if bad:
            r, step = self.recipe, self.state.step
            raise TrainingError(
                f"the weights are not finite at step {step} ({', '.join(bad[:3])}; lr "
                f"{lr_at(max(step - 1, 0), r.train.steps, r.optim):.3g}): {consequence}; "
                f"{self.folder.kept(self.state.best_step)}. Lower the learning rate (optim.lr, optim.warmup_steps)"
            )

    def save(self) -> Path | None:
        """Write a resumable checkpoint of this step into ``checkpoints/``, and remove those
        beyond the recipe's ``log.keep_last``. Every process calls it (FSDP gathers the shards).

        Returns:
            The checkpoint written; None on the processes other than the main one.

        Raises:
            TrainingError: the weights are not finite (nothing is written), or the file cannot
                be written.
        """
        step = self.state.step
        self._stop_if_nonfinite(f"checkpoint step_{step:07d} was not written")
        model_sd, optim_sd = self._full_state()  # collective under FSDP: every rank calls it
        if not self.info.is_main:
            return None
        path = self.out / "checkpoints" / f"step_{step:07d}.safetensors"
        with self.folder.writing(path, "write the checkpoint", step, self.state.best_step):
            save_train_state(
                path,
                self.model.cfg,
                model_sd,
                optim_sd,
                self.state,
                dump_recipe(self.recipe),
                self.preprocessing,
                self.train_ds.classes,
                ema_state=self.ema.shadow if self.ema else None,
            )
        for old in list_checkpoints(self.out / "checkpoints")[: -self.recipe.log.keep_last]:
            with self.folder.writing(old, "remove the old checkpoint", step, self.state.best_step):
                old.unlink(missing_ok=True)
        return path

    def _save_best(self) -> None:
        model_sd, _ = self._full_state()
        if not self.info.is_main:
            return
        if self.ema is not None:
            model_sd = {k: v.to(model_sd[k].dtype).cpu() for k, v in self.ema.shadow.items()}
        extra = {
            "classes": json.dumps(self.train_ds.classes),
            "step": str(self.state.step),
            "top1": f"{self.state.best_metric:.6f}",
        }
        if self.multilabel:  # what vitkit predict needs to name an image's labels
            extra.update(multilabel="true", thresholds=json.dumps(self.last_eval.get("thresholds")))
            extra["map"] = extra.pop("top1")
        path = self.out / "best.safetensors"
        with self.folder.writing(path, "write the best weights", self.state.step, self.state.best_step):
            save_weights(model_sd, _unwrap(self.model).cfg, path, self.preprocessing, extra)

    def _log(self, record: dict[str, Any]) -> None:
        if not self.info.is_main:
            return
        with self.folder.writing(self.folder.metrics, "append to the log", self.state.step, self.state.best_step):
            self.folder.append_metrics(record)
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, record["step"])

    @contextlib.contextmanager
    def _overflow_stops(self) -> Iterator[None]:
        """Finite weights whose logits overflow stop the run as non-finite weights do, saying what is kept."""
        try:
            yield
        except NonFiniteOutputs as e:
            raise TrainingError(
                f"evaluation at step {self.state.step}: {e}; {self.folder.kept(self.state.best_step)}. "
                "Lower the learning rate (optim.lr, optim.warmup_steps)"
            ) from None

    def evaluate(self) -> float | None:
        """Top-1 on the evaluation split (of the EMA weights when kept), over all processes; for a
        multi-label run the mAP (macro). All the metrics are kept in ``last_eval``.

        Returns:
            The score, a fraction in [0, 1]; None without an evaluation split.

        Raises:
            TrainingError: the model's outputs are not finite.
        """
        if self.eval_ds is None:
            return None
        r, t = self.recipe, self.recipe.train
        score = evaluate_multilabel if self.multilabel else evaluate
        with self.ema.applied(self.model) if self.ema else contextlib.nullcontext(), self._overflow_stops():
            metrics = score(
                _unwrap(self.model),
                self.eval_ds,
                device=self.device,
                precision=self.precision.name,
                max_images=r.data.eval_max_images,
                forward=self.compute.evaluation_forward(),
                transform=self.tcfg,
                rank=self.info.rank,
                world_size=self.info.world_size,
                num_workers=r.data.num_workers,
                reduce=lambda t: D.all_reduce_sum(t.to(self.device), self.info).cpu(),
                loss_of=lambda z, y: loss_fn(z, y, t.loss, 0.0) * z.shape[0],
            )
        self.last_eval = metrics
        return metrics["map_macro" if self.multilabel else "top1"]

    # -- the loop ---------------------------------------------------------------------------------
    def _micro_batches(self, images: torch.Tensor, labels: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        n = self.recipe.train.accum_steps
        return list(zip(images.chunk(n), labels.chunk(n)))

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> float | None:
        """One optimiser step on a local batch; returns the loss, or None if it was skipped.

        Args:
            images: this process's share of the global batch, uint8 (B, C, H, W), as the data
                gives it (the step augments it).
            labels: their class indices (B,), or multi-hot rows (B, K).

        Returns:
            The loss of the global batch (the mean over the processes); None when a non-finite
            loss was skipped (``train.on_nonfinite: skip``).

        Raises:
            TrainingError: a non-finite loss (unless skipped), or weights no longer finite.
        """
        r = self.recipe
        step = self.state.step
        set_lr(self.optimizer, lr_at(step, r.train.steps, r.optim))
        if r.train.patch_drop:
            share = (self.info.rank, self.info.world_size)  # the processes draw as one would (set_patch_drop)
            self.compute.net.set_patch_drop(patch_drop_at(r.train, step), r.train.patch_drop_flat_weight, share)
        micro = self._micro_batches(images, labels)
        total = torch.zeros((), device=self.device)
        in_chans = self.model.cfg.in_chans
        for i, (x, y) in enumerate(micro):
            g = step_generator(r.seed * 1009 + self.info.rank, step * len(micro) + i, self.device)
            x = train_transform(match_channels(x.to(self.device, non_blocking=True), in_chans), self.tcfg, g)
            y = y.to(self.device, non_blocking=True)
            x, y = self._mixed(x, y, g)
            with self.compute.no_sync(last=i == len(micro) - 1):
                logits = self.compute.forward(x)
                loss = self._loss(x, logits, y) / len(micro)
                loss.backward()
            total += loss.detach()
        self.compute.gradients_ready(self.info)
        D.all_reduce_sum(total, self.info)  # the mean over processes is the loss of the global batch
        total /= self.info.world_size
        if not torch.isfinite(total).item():
            self.optimizer.zero_grad(set_to_none=True)
            if r.train.on_nonfinite == "skip":
                self._stop_if_nonfinite(f"skipping the step of a non-finite loss at step {step} cannot help")
                self.state.nonfinite_skipped += 1
                return None
            lr = lr_at(step, r.train.steps, r.optim)
            raise TrainingError(
                f"non-finite loss at step {step} (lr {lr:.3g}): "
                f"{nonfinite_loss_advice(lr, r.train.batch_size, r.optim.warmup_steps)}; "
                f"{self.folder.kept(self.state.best_step)}"
            )
        if r.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), r.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        self.compute.weights_changed()
        return float(total.item())

    def _mixed(self, x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixup / CutMix of a micro-batch, and its targets: soft (B, K), holding the label
        smoothing, when mixing is on or the labels are multi-hot rows; else the class indices."""
        k = self.model.num_classes
        if y.ndim == 1:
            return mix_batch(x, y, k, self.mix, g)[:2] if self.mix.enabled else (x, y)
        s = self.mix.label_smoothing  # multi-hot rows (B, K_data), padded to the model's classes
        rows = F.pad(y.float(), (0, k - y.shape[1])) * (1 - s) + s / k
        if not self.mix.enabled:
            return x, rows
        # mix_batch draws the weights and mixes the images; the rows mix with the same weights
        x, _, lam = mix_batch(x, torch.zeros(len(y), dtype=torch.int64, device=y.device), k, self.mix, g)
        lam = lam.view(-1, 1).float()
        return x, lam * rows + (1 - lam) * rows.flip(0)

    def _loss(
        self, x: torch.Tensor, out: torch.Tensor | tuple[torch.Tensor, torch.Tensor], y: torch.Tensor
    ) -> torch.Tensor:
        """The loss of a micro-batch: against the labels, and with a teacher DeiT's objective, the
        teacher seeing the same augmented images ``x`` (a model without a distillation head is
        distilled through its one head)."""
        t = self.recipe.train
        if self.teacher is None:
            return loss_fn(out, y, t.loss, t.label_smoothing)
        cls, dist = out if isinstance(out, tuple) else (out, out)
        label_loss = loss_fn(cls, y, t.loss, t.label_smoothing)
        teacher = self.teacher(x)
        hard = lambda logits, labels: loss_fn(logits, labels, t.loss, 0.0)
        return distillation_loss(label_loss, dist, teacher, t.distill, t.distill_alpha, t.distill_temperature, hard)

    def run(self) -> RunResult:
        """Train to the last step; the run folder is let go when it ends, however it ends.

        Returns:
            What the run ended with.
        """
        try:
            return self._run()
        finally:
            self.folder.release()

    def close(self) -> None:
        """Let the run folder go without running (a Trainer built only to look at)."""
        self.folder.release()

    def _run(self) -> RunResult:
        r, total = self.recipe, self.recipe.train.steps
        self.progress.message(self.precision.describe())
        warning = take_warning(self.precision)
        if warning:
            self.progress.message(f"warning: {warning}")
        if few := few_images_warning(self.train_ds):
            self.warn(few)
        self.start_warnings = len(self.warnings)
        self._open_run()
        self.model.train()
        self.compute.net.train()
        self.progress.start(total, self.state.step)
        watch, window = Stopwatch(), Window()
        global_batch = (r.train.batch_size // self.info.world_size) * self.info.world_size
        try:  # a run that stops closes its progress bar before the error is printed
            for index, (images, labels) in self._epochs():
                loss = self.train_step(images, labels)
                window.add(loss, global_batch, watch.lap())  # step time includes waiting for data
                self.state.step, self.state.batch_in_epoch = self.state.step + 1, index + 1
                step = self.state.step
                if due(step, r.log.log_every, total):
                    self._log_window(window, self.state.train_seconds + watch.unbanked)
                    window.reset()
                self.progress.update(1)
                if due(step, r.log.eval_every, total):
                    with watch.paused():
                        self._evaluate_and_keep_best(self.state.train_seconds + watch.unbanked)
                if due(step, r.log.checkpoint_every, total):
                    with watch.paused():
                        self.state.train_seconds += watch.bank()
                        self.save()
        finally:
            self.progress.close()
        if self.state.nonfinite_skipped:
            n = self.state.nonfinite_skipped
            self.progress.message(f"skipped {n} steps whose loss was not finite (train.on_nonfinite=skip)")
        D.barrier(self.info)
        self._close_run()
        report = self._report()
        return RunResult(
            out_dir=self.out,
            step=self.state.step,
            final_top1=self.state.last_metric,
            best_top1=self.state.best_metric,
            best_step=self.state.best_step,
            train_seconds=watch.total,
            images_per_second=global_batch * (self.state.step - (self.resumed_from or 0)) / max(watch.total, 1e-9),
            resumed_from=self.resumed_from,
            report=report,
            multilabel=self.multilabel,
        )

    def _report(self) -> RunReport | None:
        """What the run ends with, written to the run folder by the main process (the others wait)."""
        report = None
        if self.info.is_main:
            step, best = self.state.step, self.state.best_step
            with self.folder.writing(self.out, "write the run's summary", step, best), self._overflow_stops():
                report = write_run_report(self, self.state.train_seconds)
        D.barrier(self.info)
        return report

    def _epochs(self) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
        """(index in the epoch, batch) from the resume point until the last step: each epoch in
        the order (seed, epoch) fixes, starting at the batch the run stopped at."""
        r = self.recipe
        while self.state.step < r.train.steps:
            start = self.state.batch_in_epoch
            batches = self.train_ds.batches(
                r.train.batch_size,
                shuffle=True,
                seed=r.seed,
                epoch=self.state.epoch,
                start_batch=start,
                rank=self.info.rank,
                world_size=self.info.world_size,
                drop_last=True,
                num_workers=r.data.num_workers,
                repeats=r.augment.repeats,
            )
            yielded = False
            for index, batch in enumerate(batches, start=start):
                if self._empty_on_a_process(batch):
                    continue
                yielded = True
                yield index, batch
                if self.state.step >= r.train.steps:
                    return
            skipped, examples = self.train_ds.skips.reset()
            if not yielded and start == 0:  # the next epoch would give none either: stop, do not spin
                why = f"{skipped} images could not be read, e.g. {'; '.join(examples)}" if skipped else "no images"
                raise DataError(f"{self.train_ds.name}: epoch {self.state.epoch} gave no batch to train on ({why})")
            if skipped:
                self.progress.message(f"epoch {self.state.epoch}: skipped {skipped} unreadable images, e.g. {examples}")
            self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0

    def _empty_on_a_process(self, batch: tuple[torch.Tensor, torch.Tensor]) -> bool:
        """Whether some process's share of this batch came out empty (none of its images could
        be read): then every process drops the batch, so that all take the same steps; one rank
        stepping alone would wait for the others' gradients forever. One small collective a step,
        for sources that decode only (an in-memory split never empties a batch)."""
        if self.info.world_size == 1 or not isinstance(self.train_ds, StreamingDataset):
            return False  # a lone process is never handed an empty batch (decode_batches' keep_empty)
        empty = torch.tensor(float(len(batch[1]) == 0), device=self.device)
        return D.all_reduce_sum(empty, self.info).item() > 0

    def _open_run(self) -> None:
        if not self.info.is_main:
            return
        step, best = self.state.step, self.state.best_step
        self.out.mkdir(parents=True, exist_ok=True)
        with self.folder.writing(self.out / "config.yaml", "write the recipe", step, best):
            # the recipe, headed by what its precision resolved to on this machine
            where = cpu_info()["model"] if self.device.type == "cpu" else self.device
            header = f"# {self.precision.describe()}; on {where}\n"
            write_text(self.out / "config.yaml", header + dump_recipe(self.recipe))
        with self.folder.writing(self.folder.metrics, "cut the log back to the resumed step", step, best):
            self.folder.truncate_metrics(step)
        self._tb = _tensorboard(self.out) if self.recipe.log.tensorboard else None

    def _close_run(self) -> None:
        if self.info.is_main and self.recipe.log.plot:
            from .curves import plot_curves

            with self.folder.writing(self.out / "curves.png", "draw the curves", self.state.step, self.state.best_step):
                plot_curves(self.folder.metrics, self.out / "curves.png")
        if self._tb is not None:
            self._tb.close()

    def _log_window(self, window: Window, train_seconds: float) -> None:
        step, r = self.state.step, self.recipe
        rec = {
            "step": step,
            "loss": window.mean_loss,  # null when every step of the window was skipped
            "lr": lr_at(step - 1, r.train.steps, r.optim),
            "epoch": self.state.epoch,
            "img_per_s": window.images_per_s,
            "train_s": train_seconds,
        }
        if window.skipped:
            rec["skipped"] = window.skipped  # steps of the window left out for a non-finite loss
        self._log(rec)
        loss = "skipped" if rec["loss"] is None else f"{rec['loss']:.4f}"
        self.progress.update(0, loss=loss, lr=f"{rec['lr']:.2e}", ips=f"{rec['img_per_s']:.0f}")

    def _evaluate_and_keep_best(self, train_seconds: float) -> None:
        if self.eval_ds is None:
            return
        self._stop_if_nonfinite("they were not evaluated and best.safetensors was not written")
        top1 = self.evaluate()
        if top1 is None:
            return
        step = self.state.step
        self.state.last_metric = top1
        record = self._evaluation_record(top1, train_seconds)
        self._log(record)
        if "warning" in record:
            self.progress.message(f"warning: {record['warning']}")
        name = "mAP" if self.multilabel else "top-1"
        self.progress.message(f"step {step}: {name} {100 * top1:.2f}%, validation loss {self.last_eval['loss']:.4f}")
        if self.state.best_metric is None or top1 > self.state.best_metric:
            self.state.best_metric, self.state.best_step = top1, step
            self._save_best()

    def _evaluation_record(self, score: float, train_seconds: float) -> dict[str, Any]:
        """The log's record of an evaluation, with the warning of a score near chance at the run's
        second evaluation (a function of the step, so that a resumed run says it as one never
        interrupted)."""
        r, step = self.recipe, self.state.step
        key = "map" if self.multilabel else "top1"
        # the validation loss is logged as "val_nll" (softmax or sigmoid cross-entropy: a negative
        # log-likelihood), so that the log's "loss" stays the training loss, by key and by name
        record = {"step": step, key: score, "val_nll": self.last_eval["loss"], "epoch": self.state.epoch}
        record["train_s"] = train_seconds
        if step == second_evaluation_step(r.log.eval_every, r.train.steps):
            baseline = self.last_eval.get("baseline_map_macro")
            warning = chance_warning(score, self.eval_ds.num_classes, step, self.multilabel, baseline)
            if warning:
                record["warning"] = warning
        return record


def _tensorboard(out: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(out / "tb"))


def train(recipe: Recipe, out_dir: str | Path, progress: Progress | None = None) -> RunResult:
    """Run (or resume) ``recipe`` into ``out_dir``.

    Args:
        recipe: the recipe (:func:`vitkit.train.load_recipe`).
        out_dir: the run folder: made if missing, resumed if it holds the run's checkpoints.
        progress: what the loop reports to; None: nothing.

    Returns:
        What the run ended with.
    """
    configure_process(D.resolve_device(recipe.train.device))
    trainer = Trainer(recipe, out_dir, progress)
    try:
        return trainer.run()
    finally:
        D.cleanup(trainer.info)
