"""The report's figures, drawn like the paper's: accuracy against data (Figure 4), against
compute (Figure 5), per position embedding (Table 8), against the learning rate per pooling
(Figure 9), and the attention analyses (Figures 6 and 7, through :mod:`vitkit.analysis.figures`).
Error bars are the standard deviation over seeds."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..analysis.figures import _new_figure, _save
from .experiments import mean_std

_METRICS = (("test_top1", "test top-1 (%)"), ("fewshot", "{shots} accuracy on the transfer task (%)"))


def _ms(values: list[float]) -> tuple[float, float]:
    """Mean and spread over seeds, in percent, of the finite values (nan when none is: the point
    is not drawn)."""
    m, s = mean_std(values)
    return 100 * m, 100 * s


def _drawn(points: Iterable[tuple[float, ...]]) -> list[tuple[float, ...]]:
    """The points whose mean is a finite number (a group whose every run diverged is not drawn)."""
    return [p for p in points if math.isfinite(p[1])]


def _log_x(ax: Any, drawn: bool, ticks: list[int] | None) -> None:
    """A log x axis; an axis with nothing drawn (every run diverged) says so instead."""
    if not drawn:
        ax.text(0.5, 0.5, "no finite result: every run diverged", ha="center", va="center", transform=ax.transAxes)
        return
    ax.set_xscale("log")
    _plain_log_ticks(ax, ticks)


def _plain_log_ticks(ax: Any, ticks: list[int] | None) -> None:
    """A log axis without the clutter of labelled minor ticks; ``ticks`` labelled as plain numbers."""
    from matplotlib.ticker import NullFormatter

    if ticks:
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_scaling(numbers: dict[str, Any], path: Path, shots: str) -> Path:
    """Accuracy against the number of pre-training images, one line per model (Figure 4)."""
    fig = _new_figure(10.0, 4.0)
    axes = fig.subplots(1, 2)
    for ax, (metric, label) in zip(axes, _METRICS):
        drawn = False
        for entry in numbers["models"].values():
            pts = _drawn((n, *_ms(entry[metric][n])) for n in sorted(entry[metric]))
            drawn = drawn or bool(pts)
            line = ax.errorbar(
                [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                label=entry["title"],
            )  # fmt: skip
            untrained = _ms(entry.get("fewshot_untrained") or [])[0] if metric == "fewshot" else math.nan
            if math.isfinite(untrained):
                ax.axhline(untrained, ls="--", lw=1, color=line[0].get_color())
        _log_x(ax, drawn, sorted({n for e in numbers["models"].values() for n in e[metric]}))
        ax.set_xlabel("pre-training images (nested class-balanced subsets)")
        ax.set_ylabel(label.format(shots=shots))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].set_title("dashed: the same models untrained", fontsize=8)
    fig.suptitle("Data scaling (after Figure 4)")
    return _save(fig, path)


def plot_compute(numbers: dict[str, Any], path: Path, shots: str) -> Path:
    """Accuracy against total training FLOPs, one line per family (Figure 5)."""
    fig = _new_figure(10.0, 4.0)
    axes = fig.subplots(1, 2)
    for ax, (metric, label) in zip(axes, _METRICS):
        drawn = False
        for family, entries in numbers["families"].items():
            pts = _drawn(sorted((e["train_flops"], _ms(e[metric])[0]) for e in entries))
            drawn = drawn or bool(pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=family)
        _log_x(ax, drawn, None)
        ax.set_xlabel("total training FLOPs (3 x forward x images seen)")
        ax.set_ylabel(label.format(shots=shots))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Accuracy against training compute (after Figure 5)")
    return _save(fig, path)


def plot_bars(groups: dict[str, Any], path: Path, shots: str, title: str) -> Path:
    """One bar per variant for each metric, with the spread over seeds."""
    fig = _new_figure(10.0, 4.0)
    axes = fig.subplots(1, 2)
    names = list(groups)
    for ax, (metric, label) in zip(axes, _METRICS):
        ms = [_ms(groups[n][metric]) for n in names]
        ax.bar(range(len(names)), [m for m, _ in ms], yerr=[s for _, s in ms], capsize=3, color="tab:blue")
        ax.set_xticks(range(len(names)), [groups[n]["title"] for n in names], rotation=20, ha="right", fontsize=8)
        drawn = [(m, s) for m, s in ms if math.isfinite(m)]  # a variant whose every run diverged has no bar
        if drawn:
            low, high = min(m - s for m, s in drawn), max(m + s for m, s in drawn)
            ax.set_ylim(max(0.0, low - 5), min(100.0, high + 2))
        ax.set_ylabel(label.format(shots=shots))
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    return _save(fig, path)


def plot_pooling(cells: dict[str, Any], path: Path) -> Path:
    """Test top-1 against the learning rate for the class token and GAP (Figure 9)."""
    fig = _new_figure(5.5, 4.0)
    ax = fig.subplots()
    drawn = False
    for pooling, label in (("token", "class token"), ("gap", "global average pooling")):
        pts = _drawn(sorted((c["lr"], *_ms(c["test_top1"])) for c in cells.values() if c["pooling"] == pooling))
        drawn = drawn or bool(pts)
        ax.errorbar(
            [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=label
        )
    _log_x(ax, drawn, None)
    ax.set_xlabel("learning rate")
    ax.set_ylabel("test top-1 (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Class token against GAP (after Figure 9)")
    return _save(fig, path)


def plot_attention(reports: dict[str, Any], out: Path, rollout_images: int) -> list[Path]:
    """Figure 7 (mean attention distance of the ViT and the hybrid, position-embedding
    similarity, embedding filters) and Figure 6 (rollout) for the analysed models."""
    from ..analysis import figures as F

    written = []
    for role, rep in reports.items():
        written.append(
            F.plot_mean_attention_distance(
                rep.distances, out / f"attention_distance_{role}.png", title=f"{rep.name}: mean attention distance"
            )
        )
    vit = reports["vit"]
    if vit.pos_similarity is not None:
        written.append(
            F.plot_pos_embed_similarity(
                vit.pos_similarity, out / "pos_embed_similarity.png", title=f"{vit.name}: position embedding similarity"
            )
        )
    pca = vit.filters
    if pca.components.shape[1] in (1, 3):
        written.append(
            F.plot_filter_components(pca.components, out / "embedding_filters.png", pca.explained_variance_ratio,
                                     title=f"{vit.name}: embedding filters (principal components)")
        )  # fmt: skip
    k = min(rollout_images, len(vit.images))
    written.append(
        F.plot_rollout_overlay(vit.images.pixels[:k], vit.rollout[:k], out / "rollout.png", titles=vit.images.names[:k])
    )
    return written
