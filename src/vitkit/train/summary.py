"""What a training run ends with: the per-epoch table, per-class scores, the confusion matrix, the
worst-predicted validation images and a model card, written to the run folder.

- ``summary.json``: the epochs, the best one, the per-class precision / recall / F1 (and, for a
  multi-label model, the per-class AP, mAP and thresholds), the warnings, the machine and time;
- ``epochs.csv``: one row an epoch (epoch, last step, train loss, validation loss, score, seconds);
- ``confusion.json`` / ``confusion.png`` (single-label): rows true, columns predicted;
- ``worst.png``: the validation images with the highest loss, with their true and predicted labels;
- ``README.md``: a model card (model, the weights it started from, data and counts per class, the
  recipe's key settings, results, machine and training time).

The per-class scores, confusion matrix and worst images are of ``best.safetensors`` (the weights
the run keeps to use), on the evaluation split. Every file is written atomically.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..cpu import cpu_info
from ..eval.classify import (
    ScoredImages,
    confusion_matrix,
    per_class_prf,
    scored_images,
    write_confusion_matrix,
    write_image_grid,
)
from ..eval.multilabel import frequency_baseline, multilabel_metrics
from ..files import write_text
from ..models.adapters import adapted_layers, merge_adapters
from .advice import class_counts, never_predicted_warning
from .plan import RunPlan
from .runfolder import METRICS, read_metrics
from .state import TrainState

WORST_IMAGES = 16


@dataclass
class RunReport:
    """What :func:`write_run_report` measured and wrote.

    Attributes:
        epochs: one row an epoch (:func:`epoch_table`).
        best_epoch: the epoch of the best evaluation, from 1; None without one.
        per_class: precision, recall and F1 (and AP for a multi-label run) of each class.
        confusion: a single-label run's confusion matrix, rows true, columns predicted.
        multilabel: a multi-label run's mAP macro and micro, the frequency baseline's, and the
            thresholds.
        warnings: every warning of the run, in order.
        files: what was written.
    """

    epochs: list[dict[str, Any]] = field(default_factory=list)  # one row an epoch (epoch_table)
    best_epoch: int | None = None  # 1-based, the epoch of the best evaluation
    per_class: list[dict[str, Any]] = field(default_factory=list)  # precision, recall, F1 (and AP) a class
    confusion: list[list[int]] | None = None  # single-label: rows true, columns predicted
    multilabel: dict[str, Any] | None = None  # mAP macro / micro, the frequency baseline's, thresholds
    warnings: list[str] = field(default_factory=list)  # every warning of the run, in order
    files: list[Path] = field(default_factory=list)  # what was written


@dataclass
class RunOutcome:
    """How a run ended, as the summary, the model card and the report read it.

    Attributes:
        plan: the run's plan (recipe, data, model set-up, precision, device).
        out: the run folder.
        model: the trained model itself (out of its wrappers), with its last weights.
        state: the step, the best evaluation and its step.
        train_seconds: the training time, evaluations and checkpoints left out.
        warnings: every warning of the run said so far, in order.
        start_warnings: how many of them were said when the run started (the log's come after).
        can_score_alone: whether this process holds whole weights to score the validation split.
        warn: says (and keeps) one more warning.
        choices: the measured choices of the process (:func:`vitkit.runtime.measured_choices`).
    """

    plan: RunPlan
    out: Path
    model: nn.Module
    state: TrainState
    train_seconds: float
    warnings: list[str]
    start_warnings: int
    can_score_alone: bool
    warn: Callable[[str], None]
    choices: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metrics(self) -> Path:
        """The run's log, ``metrics.jsonl``."""
        return self.out / METRICS


def epoch_table(metrics: Path) -> list[dict[str, Any]]:
    """One row an epoch from a run's ``metrics.jsonl``: ``epoch`` (1-based), ``step`` (its last
    logged step), ``train_loss`` (the mean of its logged losses), ``val_loss``, ``top1`` or
    ``map`` (its last evaluation; None without one) and ``seconds`` (its training time).

    Args:
        metrics: the log.

    Returns:
        The rows, in epoch order.
    """
    rows: dict[int, dict[str, Any]] = {}
    if not metrics.is_file():
        return []
    for _, rec in read_metrics(metrics, strict=False):
        if "epoch" not in rec:
            continue
        row = rows.setdefault(int(rec["epoch"]), {"losses": [], "val_loss": None, "top1": None, "map": None})
        if rec.get("loss") is not None:
            row["losses"].append(rec["loss"])
        if "val_nll" in rec:  # an evaluation
            row.update(val_loss=rec["val_nll"], top1=rec.get("top1"), map=rec.get("map"))
        row["step"] = rec["step"]
        row["end_s"] = max(row.get("end_s", 0.0), rec.get("train_s", 0.0))
    out, before = [], 0.0
    for epoch in sorted(rows):
        row = rows[epoch]
        losses = row.pop("losses")
        end = row.pop("end_s")
        out.append(
            {
                "epoch": epoch + 1,
                "step": row["step"],
                "train_loss": sum(losses) / len(losses) if losses else None,
                "val_loss": row["val_loss"],
                "top1": row["top1"],
                "map": row["map"],
                "seconds": max(end - before, 0.0),
            }
        )
        before = end
    return out


def logged_warnings(metrics: Path) -> list[str]:
    """The warnings the evaluations of a run recorded in its log, in order."""
    if not metrics.is_file():
        return []
    return [rec["warning"] for _, rec in read_metrics(metrics, strict=False) if isinstance(rec.get("warning"), str)]


def format_epoch_table(epochs: list[dict[str, Any]], best_epoch: int | None = None) -> str:
    """The per-epoch table as aligned text (the best epoch marked with ``*``).

    Args:
        epochs: the rows of :func:`epoch_table`.
        best_epoch: the 1-based epoch to mark (None: none).

    Returns:
        A header line and one line an epoch: epoch, last step, train loss, validation loss, top-1
        (or mAP, when any row has one) in percent, and seconds; a missing number shows as ``-``.
    """
    multilabel = any(r["map"] is not None for r in epochs)
    score = "mAP" if multilabel else "top-1"
    lines = [f"{'epoch':>5}  {'step':>6}  {'train loss':>10}  {'val loss':>8}  {score:>7}  {'time':>7}"]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in epochs:
        value = r["map"] if multilabel else r["top1"]
        mark = "*" if r["epoch"] == best_epoch else " "
        lines.append(
            f"{r['epoch']:>5}{mark} {r['step']:>6}  {num(r['train_loss'], '.4f'):>10}  {num(r['val_loss'], '.4f'):>8}  "
            f"{num(None if value is None else 100 * value, '.2f') + ('%' if value is not None else ''):>7}  "
            f"{r['seconds']:>6.1f}s"
        )
    return "\n".join(lines)


def _epochs_csv(epochs: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = ["epoch", "step", "train_loss", "val_loss", "top1", "map", "seconds"]
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for r in epochs:
        writer.writerow({k: "" if r[k] is None else r[k] for k in keys})
    return buf.getvalue()


def machine(device: torch.device) -> str:
    """What the run trained on, in words."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA)"
    info = cpu_info()
    return f"{info['model']} ({info['cores']} cores)"


@contextlib.contextmanager
def best_weights(model: nn.Module, path: Path) -> Iterator[bool]:
    """The weights of ``path`` (a vitkit file) in ``model`` for the block, its own after; yields
    whether they were loaded (False without the file)."""
    if not path.is_file():
        yield False
        return
    from ..checkpoint.native import read_native

    tensors = read_native(path)[0]
    backup = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.to(backup[k].dtype) for k, v in tensors.items()})
    try:
        yield True
    finally:
        model.load_state_dict(backup)


def _per_image_loss(multilabel: bool):
    if multilabel:
        return lambda z, y: nn.functional.binary_cross_entropy_with_logits(z, y.float(), reduction="none").sum(1)
    return lambda z, y: nn.functional.cross_entropy(z, y.long(), reduction="none")


def _caption(scored: ScoredImages, row: int, classes: list[str], thresholds: list[float] | None) -> str:
    z, y = scored.logits[row], scored.targets[row]
    loss = float(scored.losses[row])
    if thresholds is None:
        return f"true: {classes[int(y)]}\npred: {classes[int(z.argmax())]} (loss {loss:.2f})"
    predicted = [classes[c] for c in range(len(classes)) if z[c].sigmoid() >= thresholds[c]]
    true = [classes[c] for c in range(len(classes)) if y[c] > 0.5]
    return f"true: {' '.join(true)[:40]}\npred: {' '.join(predicted)[:40] or '-'} (loss {loss:.2f})"


def _thresholds(path: Path) -> list[float] | None:
    if not path.is_file():
        return None
    from ..checkpoint.io import read_safetensors_metadata

    try:
        stored = json.loads(read_safetensors_metadata(path).get("thresholds") or "null")
    except (ValueError, RecursionError):
        return None
    return [float(t) for t in stored] if isinstance(stored, list) else None


def _score_validation(o: RunOutcome, report: RunReport) -> None:
    """The best weights over the evaluation split: per-class scores, the confusion matrix and the
    worst images, into ``report`` and the run folder."""
    model, ds, classes = o.model, o.plan.eval_ds, o.plan.eval_ds.classes
    if adapted_layers(model):  # best.safetensors holds the adapters merged into the weights
        model = merge_adapters(copy.deepcopy(model))
    best = o.out / "best.safetensors"
    with best_weights(model, best):
        scored = scored_images(
            model,
            ds,
            _per_image_loss(o.plan.multilabel),
            transform=o.plan.transform,
            worst=WORST_IMAGES,
            device=o.plan.env.device,
            precision=o.plan.precision.name,
            max_images=o.plan.recipe.data.eval_max_images,
            num_workers=o.plan.recipe.data.num_workers,
            naflex=o.plan.naflex,
        )
    thresholds = None
    if o.plan.multilabel:
        thresholds = _thresholds(best)
        m = multilabel_metrics(scored.logits, scored.targets, classes, thresholds)
        base = frequency_baseline(o.plan.train_ds.label_rows, scored.targets.float())
        report.per_class = m["per_class"]
        predicted = [r["predicted"] for r in m["per_class"]]
        thresholds = m["thresholds"]
        report.multilabel = {
            "map_macro": m["map_macro"],
            "map_micro": m["map_micro"],
            "baseline_map_macro": base["map_macro"],
            "baseline_map_micro": base["map_micro"],
            "f1_macro": m["f1_macro"],
            "thresholds": thresholds,
        }
    else:
        conf = confusion_matrix(scored.logits.argmax(1), scored.targets.long(), len(classes))
        report.confusion = conf.tolist()
        report.per_class = per_class_prf(conf, classes)
        predicted = conf.sum(0).tolist()
        report.files += list(write_confusion_matrix(conf, classes, o.out, "confusion", "confusion (best weights)"))
    never = never_predicted_warning(predicted, classes)
    if never:
        o.warn(never)
    captions = [_caption(scored, int(r), classes, thresholds) for r in scored.worst_index]
    title = f"the {len(captions)} validation images with the highest loss (best weights)"
    report.files.append(write_image_grid(scored.worst_images, captions, o.out / "worst.png", title))


def write_run_report(o: RunOutcome) -> RunReport:
    """Measure and write what a run ends with (the module's docstring lists the files).

    Args:
        o: how the run ended.

    Returns:
        The :class:`RunReport`.
    """
    out = o.out
    report = RunReport(epochs=epoch_table(o.metrics))
    best_step = o.state.best_step
    report.best_epoch = next((r["epoch"] for r in report.epochs if r["step"] == best_step), None)
    if report.best_epoch is None and best_step is not None:  # an evaluation that is not an epoch's last
        report.best_epoch = next((r["epoch"] for r in report.epochs if r["step"] >= best_step), None)
    if o.plan.eval_ds is not None and o.can_score_alone:
        _score_validation(o, report)
    report.warnings = [*o.warnings[: o.start_warnings], *logged_warnings(o.metrics)]
    report.warnings += o.warnings[o.start_warnings :]
    summary = {
        "epochs": report.epochs,
        "best_epoch": report.best_epoch,
        "best_step": best_step,
        "best_score": o.state.best_metric,
        "score": "map" if o.plan.multilabel else "top1",
        "per_class": report.per_class,
        "confusion": report.confusion,
        "multilabel": report.multilabel,
        "warnings": report.warnings,
        "machine": machine(o.plan.env.device),
        "train_seconds": o.train_seconds,
        "steps": o.state.step,
        "measured_choices": o.choices,
    }
    written = {
        out / "summary.json": json.dumps(summary, indent=1, default=_finite),
        out / "epochs.csv": _epochs_csv(report.epochs),
        out / "README.md": model_card(o, report, o.train_seconds),
    }
    for path, text in written.items():
        write_text(path, text)
        report.files.append(path)
    return report


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _model_line(o: RunOutcome) -> str:
    model = o.model
    cfg = model.cfg
    params = sum(p.numel() for p in model.parameters())
    size = "x".join(str(s) for s in cfg.img_size)
    if hasattr(cfg, "patch_size") and hasattr(cfg, "width"):
        shape = f"ViT, width {cfg.width}, depth {cfg.depth}, {cfg.num_heads} heads, patch {cfg.patch_size[0]}"
    else:
        shape = type(cfg).__name__.removesuffix("Config")
    return f"{shape}, {size} px, {params / 1e6:.2f}M parameters, {cfg.num_classes} classes"


def _data_lines(o: RunOutcome) -> list[str]:
    classes = o.plan.train_ds.classes
    train_counts = class_counts(o.plan.train_ds)
    val_counts = class_counts(o.plan.eval_ds) if o.plan.eval_ds is not None else None
    n_val = len(o.plan.eval_ds) if o.plan.eval_ds is not None else 0
    lines = [
        f"- Data: `{o.plan.recipe.data.name}`: {len(o.plan.train_ds)} training images ({o.plan.train_ds.name}), "
        f"{n_val} validation images ({o.plan.eval_ds.name if o.plan.eval_ds is not None else 'none'}), "
        f"{len(classes)} classes{', multi-label' if o.plan.multilabel else ''}",
        "",
    ]
    if train_counts is not None and len(classes) <= 100:
        lines += ["| class | training images | validation images |", "|---|---:|---:|"]
        for c, name in enumerate(classes):
            val = "-" if val_counts is None else str(val_counts[c])
            lines.append(f"| {_cell(name)} | {train_counts[c]} | {val} |")
        lines.append("")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _recipe_lines(o: RunOutcome) -> list[str]:
    r, precision = o.plan.recipe, o.plan.precision.name
    o, tr, a = r.optim, r.train, r.augment
    mix = f", Mixup {a.mixup_alpha:g} / CutMix {a.cutmix_alpha:g}" if a.mixup_alpha or a.cutmix_alpha else ""
    return [
        f"- Optimiser: {o.name}, lr {o.lr:g} ({o.schedule}, {o.warmup_steps} warm-up steps), weight decay "
        f"{o.weight_decay:g}, layer decay {o.layer_decay:g}",
        f"- Schedule: {tr.steps} steps of batch {tr.batch_size}, loss {tr.loss}, label smoothing "
        f"{tr.label_smoothing:g}, precision {precision}, seed {r.seed}",
        f"- Augmentation: crop {a.crop} (area from {a.area_min:g}), flip {a.flip}{mix}",
        "",
    ]


def _result_lines(o: RunOutcome, report: RunReport, train_seconds: float) -> list[str]:
    score = "mAP" if o.plan.multilabel else "top-1"
    lines = [
        f"Best validation {score}: {_pct(o.state.best_metric)} at step {o.state.best_step} "
        f"(epoch {report.best_epoch}); `best.safetensors` holds those weights.",
        "",
    ]
    if report.multilabel:
        m = report.multilabel
        lines += [
            f"mAP macro {_pct(m['map_macro'])}, micro {_pct(m['map_micro'])}; scoring each class by its training "
            f"frequency gets {_pct(m['baseline_map_macro'])} and {_pct(m['baseline_map_micro'])}. "
            f"F1 (macro) at the per-class thresholds: {_pct(m['f1_macro'])}.",
            "",
        ]
    lines += ["```text", format_epoch_table(report.epochs, report.best_epoch), "```", ""]
    if report.per_class:
        ap = " AP | threshold |" if o.plan.multilabel else ""
        lines += [
            f"| class | precision | recall | F1 | images |{ap}",
            "|---|---:|---:|---:|---:|" + "---:|" * (2 * bool(ap)),
        ]
        for r in report.per_class:
            extra = f" {_pct(r['ap'])} | {r['threshold']:.3f} |" if o.plan.multilabel else ""
            lines.append(
                f"| {_cell(r['class'])} | {_pct(r['precision'])} | {_pct(r['recall'])} | {_pct(r['f1'])} | "
                f"{r['support']} |{extra}"
            )
        lines.append("")
    lines += [f"Trained on {machine(o.plan.env.device)} in {train_seconds:.0f} s ({o.state.step} steps).", ""]
    return lines


def model_card(o: RunOutcome, report: RunReport, train_seconds: float) -> str:
    """The run's model card (``README.md``), in Markdown with a Hugging Face metadata header.

    Args:
        o: how the run ended.
        report: what the run measured.
        train_seconds: its training time.

    Returns:
        The card's text.
    """
    r = o.plan.recipe
    started = f"`{r.model.init_from}`" if r.model.init_from else "none (trained from scratch)"
    lines = [
        "---",
        "library_name: vitkit",
        "pipeline_tag: image-classification",
        "tags: [vision-transformer, image-classification" + (", multi-label" if o.plan.multilabel else "") + "]",
        "---",
        "",
        f"# {o.out.name}",
        "",
        r.description.strip() or "An image classifier trained with vitkit.",
        "",
        f"- Model: {_model_line(o)}",
        f"- Started from: {started}",
        *_data_lines(o),
        "## Recipe",
        "",
        *_recipe_lines(o),
        "## Results (validation split)",
        "",
        *_result_lines(o, report, train_seconds),
    ]
    if report.warnings:
        lines += ["## Warnings", "", *[f"- {w}" for w in report.warnings], ""]
    lines += [
        "## Use",
        "",
        "```bash",
        f"vitkit predict {o.out / 'best.safetensors'} IMAGE.jpg",
        "```",
        "",
        "The run folder also holds `config.yaml` (the whole recipe), `metrics.jsonl`, `epochs.csv`, "
        "`summary.json`" + (", `confusion.png`" if report.confusion is not None else "") + " and `worst.png`.",
        "",
    ]
    return "\n".join(lines)


__all__ = ["RunOutcome", "RunReport", "epoch_table", "format_epoch_table", "model_card", "write_run_report"]
