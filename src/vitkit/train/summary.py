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
import csv
import io
import json
import math
from collections.abc import Iterator
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
from .advice import class_counts, never_predicted_warning
from .runfolder import read_metrics

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

    stored = json.loads(read_safetensors_metadata(path).get("thresholds") or "null")
    return [float(t) for t in stored] if isinstance(stored, list) else None


def _score_validation(t: Any, report: RunReport) -> None:
    """The best weights over the evaluation split: per-class scores, the confusion matrix and the
    worst images, into ``report`` and the run folder."""
    model, ds, classes = t.unwrapped_model, t.eval_ds, t.eval_ds.classes
    best = t.out / "best.safetensors"
    with best_weights(model, best):
        scored = scored_images(
            model,
            ds,
            _per_image_loss(t.multilabel),
            transform=t.tcfg,
            worst=WORST_IMAGES,
            device=t.device,
            precision=t.precision.name,
            max_images=t.recipe.data.eval_max_images,
            num_workers=t.recipe.data.num_workers,
        )
    thresholds = None
    if t.multilabel:
        thresholds = _thresholds(best)
        m = multilabel_metrics(scored.logits, scored.targets, classes, thresholds)
        base = frequency_baseline(t.train_label_rows(), scored.targets.float())
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
        report.files += list(write_confusion_matrix(conf, classes, t.out, "confusion", "confusion (best weights)"))
    never = never_predicted_warning(predicted, classes)
    if never:
        t.warn(never)
    captions = [_caption(scored, int(r), classes, thresholds) for r in scored.worst_index]
    title = f"the {len(captions)} validation images with the highest loss (best weights)"
    report.files.append(write_image_grid(scored.worst_images, captions, t.out / "worst.png", title))


def write_run_report(t: Any, train_seconds: float) -> RunReport:
    """Measure and write what a run ends with (the module's docstring lists the files).

    Args:
        t: the :class:`~vitkit.train.loop.Trainer` whose run ended.
        train_seconds: the run's training time.

    Returns:
        The :class:`RunReport`.
    """
    out = t.out
    report = RunReport(epochs=epoch_table(t.folder.metrics))
    best_step = t.state.best_step
    report.best_epoch = next((r["epoch"] for r in report.epochs if r["step"] == best_step), None)
    if report.best_epoch is None and best_step is not None:  # an evaluation that is not an epoch's last
        report.best_epoch = next((r["epoch"] for r in report.epochs if r["step"] >= best_step), None)
    if t.eval_ds is not None and t.can_score_alone:
        _score_validation(t, report)
    report.warnings = [*t.warnings[: t.start_warnings], *logged_warnings(t.folder.metrics)]
    report.warnings += t.warnings[t.start_warnings :]
    summary = {
        "epochs": report.epochs,
        "best_epoch": report.best_epoch,
        "best_step": best_step,
        "best_score": t.state.best_metric,
        "score": "map" if t.multilabel else "top1",
        "per_class": report.per_class,
        "confusion": report.confusion,
        "multilabel": report.multilabel,
        "warnings": report.warnings,
        "machine": machine(t.device),
        "train_seconds": train_seconds,
        "steps": t.state.step,
    }
    written = {
        out / "summary.json": json.dumps(summary, indent=1, default=_finite),
        out / "epochs.csv": _epochs_csv(report.epochs),
        out / "README.md": model_card(t, report, train_seconds),
    }
    for path, text in written.items():
        write_text(path, text)
        report.files.append(path)
    return report


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _model_line(t: Any) -> str:
    model = t.unwrapped_model
    cfg = model.cfg
    params = sum(p.numel() for p in model.parameters())
    size = "x".join(str(s) for s in cfg.img_size)
    if hasattr(cfg, "patch_size") and hasattr(cfg, "width"):
        shape = f"ViT, width {cfg.width}, depth {cfg.depth}, {cfg.num_heads} heads, patch {cfg.patch_size[0]}"
    else:
        shape = type(cfg).__name__.removesuffix("Config")
    return f"{shape}, {size} px, {params / 1e6:.2f}M parameters, {cfg.num_classes} classes"


def _data_lines(t: Any) -> list[str]:
    classes = t.train_ds.classes
    train_counts = class_counts(t.train_ds)
    val_counts = class_counts(t.eval_ds) if t.eval_ds is not None else None
    n_val = len(t.eval_ds) if t.eval_ds is not None else 0
    lines = [
        f"- Data: `{t.recipe.data.name}`: {len(t.train_ds)} training images ({t.train_ds.name}), "
        f"{n_val} validation images ({t.eval_ds.name if t.eval_ds is not None else 'none'}), "
        f"{len(classes)} classes{', multi-label' if t.multilabel else ''}",
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


def _recipe_lines(t: Any) -> list[str]:
    r = t.recipe
    o, tr, a = r.optim, r.train, r.augment
    mix = f", Mixup {a.mixup_alpha:g} / CutMix {a.cutmix_alpha:g}" if a.mixup_alpha or a.cutmix_alpha else ""
    return [
        f"- Optimiser: {o.name}, lr {o.lr:g} ({o.schedule}, {o.warmup_steps} warm-up steps), weight decay "
        f"{o.weight_decay:g}, layer decay {o.layer_decay:g}",
        f"- Schedule: {tr.steps} steps of batch {tr.batch_size}, loss {tr.loss}, label smoothing "
        f"{tr.label_smoothing:g}, precision {t.precision.name}, seed {r.seed}",
        f"- Augmentation: crop {a.crop} (area from {a.area_min:g}), flip {a.flip}{mix}",
        "",
    ]


def _result_lines(t: Any, report: RunReport, train_seconds: float) -> list[str]:
    score = "mAP" if t.multilabel else "top-1"
    lines = [
        f"Best validation {score}: {_pct(t.state.best_metric)} at step {t.state.best_step} "
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
        ap = " AP | threshold |" if t.multilabel else ""
        lines += [
            f"| class | precision | recall | F1 | images |{ap}",
            "|---|---:|---:|---:|---:|" + "---:|" * (2 * bool(ap)),
        ]
        for r in report.per_class:
            extra = f" {_pct(r['ap'])} | {r['threshold']:.3f} |" if t.multilabel else ""
            lines.append(
                f"| {_cell(r['class'])} | {_pct(r['precision'])} | {_pct(r['recall'])} | {_pct(r['f1'])} | "
                f"{r['support']} |{extra}"
            )
        lines.append("")
    lines += [f"Trained on {machine(t.device)} in {train_seconds:.0f} s ({t.state.step} steps).", ""]
    return lines


def model_card(t: Any, report: RunReport, train_seconds: float) -> str:
    """The run's model card (``README.md``), in Markdown with a Hugging Face metadata header.

    Args:
        t: the trainer whose run ended.
        report: what the run measured.
        train_seconds: its training time.

    Returns:
        The card's text.
    """
    r = t.recipe
    started = f"`{r.model.init_from}`" if r.model.init_from else "none (trained from scratch)"
    lines = [
        "---",
        "library_name: vitkit",
        "pipeline_tag: image-classification",
        "tags: [vision-transformer, image-classification" + (", multi-label" if t.multilabel else "") + "]",
        "---",
        "",
        f"# {Path(t.out).name}",
        "",
        r.description.strip() or "An image classifier trained with vitkit.",
        "",
        f"- Model: {_model_line(t)}",
        f"- Started from: {started}",
        *_data_lines(t),
        "## Recipe",
        "",
        *_recipe_lines(t),
        "## Results (validation split)",
        "",
        *_result_lines(t, report, train_seconds),
    ]
    if report.warnings:
        lines += ["## Warnings", "", *[f"- {w}" for w in report.warnings], ""]
    lines += [
        "## Use",
        "",
        "```bash",
        f"vitkit predict {Path(t.out) / 'best.safetensors'} IMAGE.jpg",
        "```",
        "",
        "The run folder also holds `config.yaml` (the whole recipe), `metrics.jsonl`, `epochs.csv`, "
        "`summary.json`" + (", `confusion.png`" if report.confusion is not None else "") + " and `worst.png`.",
        "",
    ]
    return "\n".join(lines)


__all__ = ["RunReport", "epoch_table", "format_epoch_table", "model_card", "write_run_report"]
