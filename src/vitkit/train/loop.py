"""The training loop: one process or many (torchrun), CPU or CUDA, resumable bit-for-bit.

The loop only loops: the run's plan (:mod:`vitkit.train.plan`) derived and checked everything
before the first step, the objective (:mod:`vitkit.train.objectives`) owns the loss and the
targets, the keeper (:mod:`vitkit.train.keeper`) writes and resumes the checkpoints, and what
happens goes out as events (:mod:`vitkit.train.events`) that the log and the trackers consume.

What makes a resumed run equal an uninterrupted one: the data order is a function of
(seed, epoch) and the run resumes at the batch it stopped at; augmentation randomness is a
function of (seed, rank, step); the optimiser, EMA and the global RNG (dropout) are restored; the
learning rate is a function of the step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..cpu import cpu_info
from ..data import step_generator, train_transform
from ..data.streaming import StreamingDataset
from ..data.transforms import match_channels
from ..errors import DataError, RecipeError, RunStopped, TrainingError
from ..eval import evaluate
from ..eval.classify import NonFiniteOutputs
from ..eval.multilabel import evaluate_multilabel
from ..eval.naflex import to_naflex
from ..files import write_text
from ..models.config import ViTConfig
from ..models.naflex import NaflexBatch
from ..precision import Precision, take_warning
from ..runtime import measured_choices, wait_policy_line
from . import dist as D
from .advice import chance_warning, few_images_warning, nonfinite_loss_advice, second_evaluation_step
from .compute import StepCompute, step_compute
from .config import Recipe, diff_recipes, dump_recipe, patch_drop_at, read_yaml_mapping, recipe_from_dict
from .events import CHECKPOINT, END, EVALUATION, STEP, Events, MetricsLog, TensorBoard
from .keeper import EMA, Keeper, unwrap
from .objectives import loss_fn
from .optim import build_optimizer, lr_at, set_lr
from .plan import RunPlan
from .process import configure_process
from .runfolder import RunFolder, check_saved_recipe
from .state import TrainState, list_checkpoints
from .summary import RunOutcome, RunReport, write_run_report
from .timing import Stopwatch, Window, due
from .trackers import build_trackers


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


class _Stops:
    """Ctrl-C and SIGTERM during a run: the first asks the loop to write a checkpoint and stop at
    the end of the step; a second Ctrl-C stops at once. Handlers are set only from the main thread."""

    def __init__(self) -> None:
        self.signum = 0
        self.saved: dict[int, Any] = {}

    def _ask(self, signum: int, frame: Any) -> None:
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Stops]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for s in (signal.SIGINT, signal.SIGTERM):
            self.saved[s] = signal.signal(s, self._ask)
        try:
            yield self
        finally:
            for s, handler in self.saved.items():
                signal.signal(s, handler)


def _agreed(flags: list[bool], info: D.DistInfo, device: torch.device) -> list[bool]:
    """Each flag set on any process, as every process sees it (one collective for all)."""
    if info.world_size == 1:
        return flags
    t = D.all_reduce_sum(torch.tensor([float(f) for f in flags], device=device), info)
    return [bool(v > 0) for v in t.tolist()]


def _model_input(
    x: torch.Tensor | list[torch.Tensor],
    g: torch.Generator,
    plan: RunPlan,
    cfg: ViTConfig,
    device: torch.device,
    budget: int | None = None,
) -> torch.Tensor | NaflexBatch:
    """A micro-batch as the data gives it -> the model's input: the recipe's augmentation of the
    square batch, or of each image at its own size for NaFlex, at most ``budget`` patches (then
    cut into patches)."""
    if plan.naflex is None:
        return train_transform(match_channels(x.to(device, non_blocking=True), cfg.in_chans), plan.transform, g)

    def per_image(im: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        return train_transform(match_channels(im, cfg.in_chans), replace(plan.transform, img_size=size), g)

    on_dev = x.to(device) if isinstance(x, torch.Tensor) else [im.to(device) for im in x]
    return to_naflex(on_dev, int(cfg.patch_size[0]), budget or plan.naflex, per_image)


class Trainer:
    """Build what a recipe's plan names, then :meth:`run` it to the end (resuming if possible).

    The process-wide settings of CPU training (:func:`vitkit.train.process.configure_process`)
    are :func:`train`'s to make, before a Trainer is built.

    Args:
        recipe: the recipe, checked as one read from YAML.
        out_dir: the run folder: made if missing, resumed if it holds the run's checkpoints.
        progress: what the loop reports to; None: nothing.
        plan: the recipe's plan, when already made; None: made here.

    Raises:
        RecipeError: a recipe value that cannot be used with this data, model or device, or a
            resume whose recipe differs.
        DataError: data that cannot be read.
        UsageError: a run folder that is a file or holds other files.
        TrainingError: another run holds the folder, or a checkpoint cannot be resumed.
    """

    def __init__(
        self, recipe: Recipe, out_dir: str | Path, progress: Progress | None = None, plan: RunPlan | None = None
    ) -> None:
        recipe_from_dict(recipe.to_dict())  # the checks of a recipe read from YAML, for one built in Python
        self.recipe = recipe
        self.folder = RunFolder(out_dir)  # refuses an empty name before it becomes "."
        self.out = self.folder.out
        self.progress = progress or Progress()
        self.warnings: list[str] = []  # every warning of this run, printed and kept for the summary
        self.start_warnings = 0  # how many of them were said when the run started (the log's come after)
        _check_resume_recipe(self.out, recipe)
        self.plan = plan or RunPlan.from_recipe(recipe)
        self.device, self.info, self.precision = self.plan.env.device, self.plan.env.info, self.plan.precision
        if self.info.is_main:
            self.folder.acquire()  # held until run() ends (or the process does)
        try:
            self._set_up()
        except BaseException:
            self.folder.release(failed_start=True)
            raise

    def _set_up(self) -> None:
        r, plan = self.recipe, self.plan
        if self.info.is_main and (removed := self.folder.remove_stale_temporaries()):
            self.progress.message(
                f"{self.out}: removed {len(removed)} temporary files a killed run left ({', '.join(removed[:3])})"
            )
        for note in plan.notes:
            self.progress.message(note)
        self.model = plan.model.to(self.device)
        self.train_ds, self.eval_ds, self.multilabel = plan.train_ds, plan.eval_ds, plan.multilabel
        self.last_eval: dict[str, Any] = {}
        # what computes a step in the chosen precision (the model under autocast, or a bf16 copy of
        # it); FSDP shards the parameters in place, so the optimiser is built after, on the shards
        self.compute: StepCompute = step_compute(
            self.model, self.precision, r.train.bf16_weights, self.info, self.device, r.train.fsdp, r.train.compile
        )
        fused = self.device.type == "cuda" and not r.train.fsdp  # FSDP's sharded parameters: foreach
        # data parallel (not FSDP's shards): every process steps on the same averaged gradients
        group = torch.distributed.group.WORLD if self.info.enabled and not r.train.fsdp else None
        self.optimizer = build_optimizer(
            self.model, r.optim, fused=fused, process_group=group, precision=self.precision
        )
        self.ema = EMA(self.model, r.train.ema_decay) if r.train.ema_decay else None
        self.keeper = Keeper(plan, self.folder, self.model, self.optimizer, self.ema, self.progress.message)
        digest = plan.teacher.digest if plan.teacher is not None else None
        fresh = TrainState(teacher_digest=digest, precision=self.precision.name)
        self.state = self.keeper.resume(fresh)
        self.resumed_from = None if self.state is fresh else self.state.step
        self.compute.weights_loaded(self.info)
        self.events = Events()
        self._saved_at = time.monotonic()

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
        return unwrap(self.model)

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
        with _overflow_stops(self.state, self.folder):
            self.last_eval = _scores(self.plan, self.model, self.ema, self.compute)
        return self.last_eval["map_macro" if self.multilabel else "top1"]

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, budget: int | None = None) -> float | None:
        """One optimiser step on a local batch; returns the loss, or None if it was skipped.

        Args:
            images: this process's share of the global batch, uint8 (B, C, H, W), as the data
                gives it (the step augments it).
            labels: their class indices (B,), or multi-hot rows (B, K).
            budget: NaFlex's most patches an image (its drawn budget); None: ``max_tokens``.

        Returns:
            The loss of the global batch (the mean over the processes); None when a non-finite
            loss was skipped (``train.on_nonfinite: skip``).

        Raises:
            TrainingError: a non-finite loss (unless skipped), or weights no longer finite.
        """
        r, step, objective = self.recipe, self.state.step, self.plan.objective
        lr = lr_at(step, r.train.steps, r.optim)
        set_lr(self.optimizer, lr)
        if r.train.patch_drop:
            share = (self.info.rank, self.info.world_size)  # the processes draw as one would (set_patch_drop)
            self.compute.net.set_patch_drop(patch_drop_at(r.train, step), r.train.patch_drop_flat_weight, share)
        n = r.train.accum_steps
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(zip(_micro_batches(images, n), labels.chunk(n))):
            g = step_generator(r.seed * 1009 + self.info.rank, step * n + i, self.device)
            x = _model_input(x, g, self.plan, self.model.cfg, self.device, budget)
            x, y = objective.targets(x, y.to(self.device, non_blocking=True), g)
            with self.compute.no_sync(last=i == n - 1):
                loss = objective.loss(x, self.compute.forward(x), y) / n
                loss.backward()
            total += loss.detach()
        self.compute.gradients_ready(self.info)
        D.all_reduce_sum(total, self.info)  # the mean over processes is the loss of the global batch
        total /= self.info.world_size
        if not torch.isfinite(total).item():
            self.optimizer.zero_grad(set_to_none=True)
            if r.train.on_nonfinite == "skip":
                self.keeper.stop_if_nonfinite(
                    self.state, f"skipping the step of a non-finite loss at step {step} cannot help"
                )
                self.state.nonfinite_skipped += 1
                return None
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

    def run(self) -> RunResult:
        """Train to the last step; the run folder is let go when it ends, however it ends. Ctrl-C
        or SIGTERM writes a checkpoint at the end of the step and stops (:class:`RunStopped`).

        Returns:
            What the run ended with.

        Raises:
            RunStopped: a signal stopped the run; the same command resumes it.
        """
        try:
            with _Stops().installed() as stops:
                return self._run(stops)
        finally:
            self.events.close()
            self.folder.release()

    def close(self) -> None:
        """Let the run folder go without running (a Trainer built only to look at)."""
        self.folder.release()

    def _run(self, stops: _Stops) -> RunResult:
        r, total = self.recipe, self.recipe.train.steps
        for line in _first_lines(self.precision, self.device):
            self.progress.message(line)
        if few := few_images_warning(self.train_ds):
            self.warn(few)
        self.start_warnings = len(self.warnings)
        self._open_run()
        self.model.train()
        self.compute.net.train()
        self.progress.start(total, self.state.step)
        watch, window = Stopwatch(), Window()
        try:  # a run that stops closes its progress bar before the error is printed
            for index, (images, labels) in _epochs(self.plan, self.state, self.progress):
                budget = self.plan.naflex_budget(self.state.epoch, index)  # None: squares
                loss = self.train_step(images, labels) if budget is None else self.train_step(images, labels, budget)
                window.add(loss, self.plan.batch_images(self.state.epoch, index), watch.lap())  # data's time too
                self.state.step, self.state.batch_in_epoch = self.state.step + 1, index + 1
                step = self.state.step
                if due(step, r.log.log_every, total):
                    self._log_window(window, self.state.train_seconds + watch.unbanked)
                    window.reset()
                self.progress.update(1)
                if due(step, r.log.eval_every, total):
                    with watch.paused():
                        self._evaluate_and_keep_best(self.state.train_seconds + watch.unbanked)
                self._checkpoint_if_due(watch, stops)
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
            images_per_second=window.total_images / max(watch.total, 1e-9),
            resumed_from=self.resumed_from,
            report=report,
            multilabel=self.multilabel,
        )

    def _checkpoint_if_due(self, watch: Stopwatch, stops: _Stops) -> None:
        """A checkpoint every ``log.checkpoint_every`` steps, every ``log.checkpoint_minutes`` of
        wall time and when a signal asks the run to stop (then :class:`RunStopped`)."""
        r, step = self.recipe, self.state.step
        minutes = r.log.checkpoint_minutes
        late = bool(minutes) and time.monotonic() - self._saved_at >= 60 * minutes
        late, stop = _agreed([late, bool(stops.signum)], self.info, self.device)
        if not (due(step, r.log.checkpoint_every, r.train.steps) or late or stop):
            return
        with watch.paused():
            self.state.train_seconds += watch.bank()
            path = self.keeper.save(self.state)
            self._saved_at = time.monotonic()
            self.events.publish(CHECKPOINT, step, {"path": str(path)} if path else {})
        if stop and step < r.train.steps:
            name = signal.Signals(stops.signum or signal.SIGTERM).name
            raise RunStopped(
                f"stopped by {name} at step {step}; checkpoint step_{step:07d} written: run the same command to resume",
                stops.signum or signal.SIGTERM,
            )

    def _report(self) -> RunReport | None:
        """What the run ends with, written to the run folder by the main process (the others wait)."""
        report = None
        if self.info.is_main:
            outcome = RunOutcome(
                plan=self.plan,
                out=self.out,
                model=unwrap(self.model),
                state=self.state,
                train_seconds=self.state.train_seconds,
                warnings=self.warnings,
                start_warnings=self.start_warnings,
                can_score_alone=not self.recipe.train.fsdp,
                warn=self.warn,
                choices=measured_choices(),
            )
            step, best = self.state.step, self.state.best_step
            with (
                self.folder.writing(self.out, "write the run's summary", step, best),
                _overflow_stops(self.state, self.folder),
            ):
                report = write_run_report(outcome)
            self.events.publish(END, step, {"best": self.state.best_metric, "train_s": self.state.train_seconds})
        D.barrier(self.info)
        return report

    def _open_run(self) -> None:
        """The run folder's recipe and log, and the event stream's sinks (on the main process)."""
        if not self.info.is_main:
            return
        step, best, log = self.state.step, self.state.best_step, self.recipe.log
        self.out.mkdir(parents=True, exist_ok=True)
        with self.folder.writing(self.out / "config.yaml", "write the recipe", step, best):
            # the recipe, headed by what its precision resolved to on this machine
            where = cpu_info()["model"] if self.device.type == "cpu" else self.device
            header = f"# {self.precision.describe()}; on {where}\n"
            write_text(self.out / "config.yaml", header + dump_recipe(self.recipe))
        with self.folder.writing(self.folder.metrics, "cut the log back to the resumed step", step, best):
            self.folder.truncate_metrics(step)

        def append(record: dict[str, Any]) -> None:
            with self.folder.writing(self.folder.metrics, "append to the log", self.state.step, self.state.best_step):
                self.folder.append_metrics(record)

        sinks = [MetricsLog(append)]
        if log.tensorboard and "tensorboard" not in log.trackers:
            sinks.append(TensorBoard(self.out))
        sinks += build_trackers(log.trackers, self.out, self.recipe.to_dict(), self.warn)
        self.events = Events(sinks)

    def _close_run(self) -> None:
        if self.info.is_main and self.recipe.log.plot:
            from .curves import plot_curves

            with self.folder.writing(self.out / "curves.png", "draw the curves", self.state.step, self.state.best_step):
                plot_curves(self.folder.metrics, self.out / "curves.png")

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
        self.events.publish(STEP, step, rec)
        loss = "skipped" if rec["loss"] is None else f"{rec['loss']:.4f}"
        self.progress.update(0, loss=loss, lr=f"{rec['lr']:.2e}", ips=f"{rec['img_per_s']:.0f}")

    def _evaluate_and_keep_best(self, train_seconds: float) -> None:
        if self.eval_ds is None:
            return
        self.keeper.stop_if_nonfinite(self.state, "they were not evaluated and best.safetensors was not written")
        score = self.evaluate()
        if score is None:
            return
        step, r = self.state.step, self.recipe
        self.state.last_metric = score
        # the validation loss is logged as "val_nll" (softmax or sigmoid cross-entropy: a negative
        # log-likelihood), so that the log's "loss" stays the training loss, by key and by name
        key = "map" if self.multilabel else "top1"
        record = {"step": step, key: score, "val_nll": self.last_eval["loss"], "epoch": self.state.epoch}
        record["train_s"] = train_seconds
        if step == second_evaluation_step(r.log.eval_every, r.train.steps):  # as a run never interrupted says it
            baseline = self.last_eval.get("baseline_map_macro")
            if warning := chance_warning(score, self.eval_ds.num_classes, step, self.multilabel, baseline):
                record["warning"] = warning
        self.events.publish(EVALUATION, step, record)
        if "warning" in record:
            self.progress.message(f"warning: {record['warning']}")
        name = "mAP" if self.multilabel else "top-1"
        self.progress.message(f"step {step}: {name} {100 * score:.2f}%, validation loss {self.last_eval['loss']:.4f}")
        if self.state.best_metric is None or score > self.state.best_metric:
            self.state.best_metric, self.state.best_step = score, step
            self.keeper.save_best(self.state, self.last_eval.get("thresholds"))


def _first_lines(precision: Precision, device: torch.device) -> list[str]:
    """A run's first messages: the precision, how OpenMP's threads wait (on a CPU), a warning of
    an emulated bf16."""
    lines = [precision.describe()]
    if device.type == "cpu" and (waiting := wait_policy_line()):
        lines.append(waiting)
    if warning := take_warning(precision):
        lines.append(f"warning: {warning}")
    return lines


def _micro_batches(images: torch.Tensor | list[torch.Tensor], n: int) -> list[Any]:
    """A local batch in ``n`` micro-batches, as ``Tensor.chunk`` cuts it (a NaFlex list too)."""
    if isinstance(images, torch.Tensor):
        return list(images.chunk(n))
    size = -(-len(images) // n)  # chunk's size: the ceiling
    return [images[i : i + size] for i in range(0, len(images), size)]


def _epochs(
    plan: RunPlan, state: TrainState, progress: Progress
) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
    """(index in the epoch, batch) from the resume point until the last step: each epoch in the
    order (seed, epoch) fixes, starting at the batch the run stopped at. A batch that came out empty
    on some process (none of its images could be read) is dropped by every process, so that all take
    the same steps (one small collective a step, for sources that decode only)."""
    r, info, ds = plan.recipe, plan.env.info, plan.train_ds
    streaming = info.world_size > 1 and isinstance(ds, StreamingDataset)
    while state.step < r.train.steps:
        start = state.batch_in_epoch
        batches = ds.batches(
            r.train.batch_size,
            shuffle=True,
            seed=r.seed,
            epoch=state.epoch,
            start_batch=start,
            rank=info.rank,
            world_size=info.world_size,
            drop_last=True,
            num_workers=r.data.num_workers,
            repeats=r.augment.repeats,
            sizes=plan.naflex_sizes,
        )
        yielded = False
        for index, batch in enumerate(batches, start=start):
            if streaming and _agreed([len(batch[1]) == 0], info, plan.env.device)[0]:
                continue
            yielded = True
            yield index, batch
            if state.step >= r.train.steps:
                return
        skipped, examples = ds.skips.reset()
        if not yielded and start == 0:  # the next epoch would give none either: stop, do not spin
            why = f"{skipped} images could not be read, e.g. {'; '.join(examples)}" if skipped else "no images"
            raise DataError(f"{ds.name}: epoch {state.epoch} gave no batch to train on ({why})")
        if skipped:
            progress.message(f"epoch {state.epoch}: skipped {skipped} unreadable images, e.g. {examples}")
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0


def _scores(plan: RunPlan, model: nn.Module, ema: EMA | None, compute: StepCompute) -> dict[str, Any]:
    """The evaluation split's metrics (of the EMA weights when kept), over all processes."""
    r, info, device = plan.recipe, plan.env.info, plan.env.device
    score = evaluate_multilabel if plan.multilabel else evaluate
    with ema.applied(model) if ema else contextlib.nullcontext():
        return score(
            unwrap(model),
            plan.eval_ds,
            device=device,
            precision=plan.precision.name,
            max_images=r.data.eval_max_images,
            forward=compute.evaluation_forward(),
            transform=plan.transform,
            rank=info.rank,
            world_size=info.world_size,
            num_workers=r.data.num_workers,
            reduce=lambda t: D.all_reduce_sum(t.to(device), info).cpu(),
            loss_of=lambda z, y: loss_fn(z, y, r.train.loss, 0.0) * z.shape[0],
            **({"naflex": plan.naflex} if plan.naflex else {}),
        )


@contextlib.contextmanager
def _overflow_stops(state: TrainState, folder: RunFolder) -> Iterator[None]:
    """Finite weights whose logits overflow stop the run as non-finite weights do, saying what is kept."""
    try:
        yield
    except NonFiniteOutputs as e:
        raise TrainingError(
            f"evaluation at step {state.step}: {e}; {folder.kept(state.best_step)}. "
            "Lower the learning rate (optim.lr, optim.warmup_steps)"
        ) from None


def _check_resume_recipe(out: Path, recipe: Recipe) -> None:
    """A run folder holding another recipe's checkpoints is not resumed with this one."""
    saved = out / "config.yaml"
    if not (saved.is_file() and list_checkpoints(out / "checkpoints")):
        return
    check_saved_recipe(saved)  # an emptied or cut file is named as such, not read as another recipe
    try:
        old = recipe_from_dict(read_yaml_mapping(saved, "recipe"))
    except RecipeError as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainingError(
            f"{saved}: the recipe of the run in this folder does not read back ({why}); fix it, or use another --out"
        ) from None
    # logging and the description's prose change nothing the weights depend on
    changed = [k for k in diff_recipes(old, recipe) if not k.startswith("log.") and k != "description"]
    if changed:
        raise TrainingError(
            f"{out} holds a run with a different recipe (changed: {', '.join(changed[:6])}); "
            "use another --out, or the same settings to resume"
        )


def train(recipe: Recipe, out_dir: str | Path, progress: Progress | None = None) -> RunResult:
    """Run (or resume) ``recipe`` into ``out_dir``.

    Args:
        recipe: the recipe (:func:`vitkit.train.load_recipe`).
        out_dir: the run folder: made if missing, resumed if it holds the run's checkpoints.
        progress: what the loop reports to; None: nothing.

    Returns:
        What the run ended with.

    Raises:
        RunStopped: Ctrl-C or SIGTERM stopped the run after a checkpoint.
    """
    configure_process(D.resolve_device(recipe.train.device))
    trainer = Trainer(recipe, out_dir, progress)
    try:
        return trainer.run()
    finally:
        D.cleanup(trainer.info)


__all__ = ["Progress", "RunResult", "Trainer", "TrainingError", "loss_fn", "train"]
