"""The report's figures, drawn like the paper's: accuracy against data (Figure 4), against
compute (Figure 5), per position embedding (Table 8), against the learning rate per pooling
(Figure 9) and against the fine-tuning rate per resolution (the attention experiment's are in
:mod:`.attention_figures`). Error bars are the standard deviation over seeds."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...analysis.figures import _new_figure, _save
from ..core.experiment import mean_std
from ..core.stats import Interval
from .frontier import frontier

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
    from matplotlib.ticker import NullFormatter  # matplotlib is optional (the reproduce extra)

    if ticks:
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _scaling_line(ax: Any, by_size: dict[int, list[Any]], label: str, scale: float = 100.0, **style: Any) -> Any:
    """One line of means over seeds (error bars: the spread) against the subset size; its
    matplotlib line, or None where no point is finite."""
    pts = []
    for n in sorted(by_size):
        m, s = mean_std(by_size[n])
        pts.append((n, scale * m, scale * s))
    pts = _drawn(pts)
    if not pts:
        return None
    bars = ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                       label=label, **style)  # fmt: skip
    return bars[0]


def _error_panel(ax: Any, numbers: dict[str, Any]) -> None:
    """Test error per model against images, log-log, each with its slope and interval."""
    models, sizes = numbers["models"], numbers["sizes"]
    drawn = False
    for role, entry in models.items():
        slope = numbers["slopes"].get(role)
        tail = f", slope {slope['estimate']:+.2f} [{slope['low']:+.2f}, {slope['high']:+.2f}]" if slope else ""
        errors = {n: [1.0 - v if isinstance(v, float | int) else math.nan for v in entry["test_top1"][n]]
                  for n in entry["test_top1"]}  # fmt: skip
        drawn = _scaling_line(ax, errors, entry["title"] + tail) is not None or drawn
    _log_x(ax, drawn, sizes)
    if drawn:
        from matplotlib.ticker import FuncFormatter  # optional, as above

        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    ax.set_ylabel("test error (%), log scale")
    ax.set_title("test error (slopes: least squares, 95% interval)", fontsize=9)
    if drawn:
        ax.legend(fontsize=7)


def _ratio_panel(ax: Any, numbers: dict[str, Any]) -> None:
    """The ViT/ResNet error ratio per size with its 95% interval."""
    sizes = numbers["sizes"]
    pts = []
    for n in sizes:
        iv = numbers["error_ratio"][n]["interval"]
        if iv is not None:
            i = Interval(**iv)
            pts.append((n, i.estimate, i.estimate - i.low, i.high - i.estimate))
        else:
            m, _ = mean_std(numbers["error_ratio"][n]["per_seed"])
            pts.append((n, m, 0.0, 0.0))
    pts = _drawn(pts)
    if pts:
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[[p[2] for p in pts], [p[3] for p in pts]],
                    marker="o", capsize=3, color="tab:purple")  # fmt: skip
        ax.axhline(1.0, ls="--", lw=1, color="grey")
    _log_x(ax, bool(pts), sizes)
    ax.set_ylabel("ViT test error / ResNet test error")
    ax.set_title("error ratio (95% interval over seeds; 1: equal)", fontsize=9)


def _transfer_panel(ax: Any, models: dict[str, Any], sizes: list[int], key: str, ylabel: str, title: str) -> None:
    """A few-shot measure per model against the training images, each model's untrained value
    (``KEY_untrained``) as a dashed line of its colour."""
    drawn = False
    for entry in models.values():
        line = _scaling_line(ax, entry.get(key) or {}, entry["title"])
        drawn = line is not None or drawn
        untrained = _ms(entry.get(f"{key}_untrained") or [])[0]
        if line is not None and math.isfinite(untrained):
            ax.axhline(untrained, ls="--", lw=1, color=line.get_color())
    _log_x(ax, drawn, sizes)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)


def plot_scaling(numbers: dict[str, Any], path: Path, shots: str) -> Path:
    """The data-scaling study (after Figure 4): against the number of training images, test error
    per model (log-log, with each family's slope), the ViT/ResNet error ratio with its 95% interval,
    the generalisation gap, the ViT's attention locality and class-token share, in-domain few-shot
    transfer on width-matched features and the few-shot transfer control, each beside the same
    models untrained.

    Args:
        numbers: :meth:`vitkit.reproduce.data_scaling.DataScaling.measure`'s numbers.
        path: where the PNG goes.
        shots: the transfer metric's name ("10-shot").

    Returns:
        ``path``.
    """
    fig = _new_figure(20.0, 8.0)
    axes = fig.subplots(2, 4)
    models, sizes = numbers["models"], numbers["sizes"]
    xlabel = "training images (class-balanced subsets)"

    _error_panel(axes[0][0], numbers)
    _ratio_panel(axes[0][1], numbers)

    ax = axes[0][2]
    drawn = False
    for entry in models.values():
        drawn = _scaling_line(ax, entry["gap"], entry["title"]) is not None or drawn
    _log_x(ax, drawn, sizes)
    ax.set_ylabel("train − test top-1 (points)")
    ax.set_title("generalisation gap of the best checkpoint", fontsize=9)
    if drawn:
        ax.legend(fontsize=7)

    att = numbers["attention"]
    ax = axes[1][0]
    first = _scaling_line(ax, {n: att[n]["distance_first"] for n in sizes}, "first layer", scale=1.0)
    last = _scaling_line(ax, {n: att[n]["distance_last"] for n in sizes}, "last layer", scale=1.0)
    drawn = first is not None or last is not None
    _log_x(ax, drawn, sizes)
    ax.set_ylabel("mean attention distance (px)")
    ax.set_title(f"ViT attention locality ({numbers['attention_images']} test images)", fontsize=9)
    if drawn:
        ax.legend(fontsize=7)

    ax = axes[1][1]
    share = _scaling_line(ax, {n: att[n]["cls_share"] for n in sizes}, "class token", color="tab:green")
    _log_x(ax, share is not None, sizes)
    ax.set_ylabel("patch attention on the class token (%)")
    ax.set_title("ViT class-token share", fontsize=9)

    _transfer_panel(axes[1][2], models, sizes, "fewshot", f"{shots} transfer accuracy (%)",
                    "control: transfer to digits (dashed: the same model untrained)")  # fmt: skip
    setup = numbers.get("in_domain_setup")
    if setup:
        _transfer_panel(axes[0][3], models, sizes, "in_domain", f"{setup['shots']}-shot in-domain accuracy (%)",
                        f"in-domain transfer, features of width {setup['width']} (dashed: untrained)")  # fmt: skip
    else:
        axes[0][3].set_visible(False)
    axes[1][3].set_visible(False)

    for ax in (a for row in axes for a in row):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    fig.suptitle("Data scaling (after Figures 3 and 4)")
    return _save(fig, path)


def plot_compute(numbers: dict[str, Any], path: Path, shots: str) -> Path:
    """Accuracy against total training FLOPs and against training seconds, one colour per family
    (Figure 5): a point per model and training length (filled: the longest), with the spread over
    seeds, and the family's frontier of the means (no cheaper run is as accurate) as a line."""
    fig = _new_figure(10.0, 7.5)
    axes = fig.subplots(2, 2)
    costs = (("train_flops", "total training FLOPs (3 x forward x images seen)"),
             ("train_seconds", "training seconds on this machine"))  # fmt: skip
    longest = max(numbers["lengths"])
    for row, (metric, label) in enumerate(_METRICS):
        for col, (cost, xlabel) in enumerate(costs):
            ax, drawn = axes[row][col], False
            for i, fam in enumerate(numbers["families"].values()):
                color = f"C{i}"
                pts = _drawn((mean_std(e[cost])[0], *_ms(e[metric]), e["length"] == longest) for e in fam["entries"])
                drawn = drawn or bool(pts)
                for x, m, s, full in pts:
                    ax.errorbar([x], [m], yerr=[s], marker="o", capsize=3, color=color,
                                markerfacecolor=color if full else "white")  # fmt: skip
                front = frontier((x, m) for x, m, _, _ in pts)
                lr = fam["entries"][0].get("lr") if fam["entries"] else None
                legend = fam["title"] if lr is None else f"{fam['title']} (lr {lr:g})"
                ax.plot([p[0] for p in front], [p[1] for p in front], color=color, label=legend)
            _log_x(ax, drawn, None)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label.format(shots=shots))
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, title="open: shorter training", title_fontsize=7)
    fig.suptitle("Accuracy against training compute (after Figure 5)")
    return _save(fig, path)


def plot_pos_embed(numbers: dict[str, Any], path: Path, shots: str) -> Path:
    """One bar per position embedding at the budget's steps and, beside it, one at the long
    length for the kinds that also ran there, with the spread over seeds (Table 8)."""
    fig = _new_figure(10.0, 4.0)
    axes = fig.subplots(1, 2)
    names = list(numbers["variants"])
    lengths = (("variants", f"{numbers['steps']} steps", "tab:blue", -0.2),
               ("long", f"{numbers['long_steps']} steps", "tab:orange", 0.2))  # fmt: skip
    for ax, (metric, label) in zip(axes, _METRICS):
        drawn = []
        for group, legend, color, shift in lengths:
            here = [(i, _ms(numbers[group][n][metric])) for i, n in enumerate(names) if n in numbers[group]]
            if not here:
                continue
            ax.bar([i + shift for i, _ in here], [m for _, (m, _) in here], width=0.4, yerr=[s for _, (_, s) in here],
                   capsize=3, color=color, label=legend)  # fmt: skip
            drawn += [(m, s) for _, (m, s) in here if math.isfinite(m)]  # a kind whose every run diverged: no bar
        ax.set_xticks(range(len(names)), [numbers["variants"][n]["title"] for n in names], rotation=20, ha="right",
                      fontsize=8)  # fmt: skip
        if drawn:
            low, high = min(m - s for m, s in drawn), max(m + s for m, s in drawn)
            ax.set_ylim(max(0.0, low - 5), min(100.0, high + 2))
        ax.set_ylabel(label.format(shots=shots))
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle("Position embeddings (after Table 8)")
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


def _mean_minival_curve(curves: list[list[list[float]]]) -> tuple[list[int], list[float]]:
    """The mean over runs of minival top-1 (percent) at each step that some run evaluated; the
    values that are not finite (a diverged run) are left out of each step's mean."""
    at: dict[int, list[float]] = {}
    for curve in curves:
        for step, top1 in curve:
            if isinstance(top1, (int, float)) and math.isfinite(top1):
                at.setdefault(int(step), []).append(100 * float(top1))
    steps = sorted(at)
    return steps, [sum(at[s]) / len(at[s]) for s in steps]


def _no_result(ax: Any) -> None:
    ax.text(0.5, 0.5, "no finite result: every run diverged", ha="center", va="center", transform=ax.transAxes)


def _minival_against_rate(ax: Any, lines: dict[str, list[tuple[float, float, bool]]]) -> None:
    """Minival top-1 against the learning rate, one line per label; the chosen point starred."""
    drawn = False
    for label, pts in lines.items():
        pts = [(lr, 100 * v, c) for lr, v, c in pts if isinstance(v, (int, float)) and math.isfinite(v)]
        if not pts:
            continue
        drawn = True
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        for lr, v, c in pts:
            if c:
                ax.plot([lr], [v], marker="*", ms=14, color=line[0].get_color())
    _log_x(ax, drawn, None)
    if drawn:
        rates = sorted({lr for pts in lines.values() for lr, _, _ in pts})
        ax.set_xticks(rates, [f"{lr:g}" for lr in rates], fontsize=7)
        ax.legend(fontsize=8)
    ax.set_xlabel("learning rate (star: chosen)")
    ax.grid(alpha=0.3)


def _finish_curves(ax: Any, drawn: bool, xlabel: str, title: str, legend_size: int) -> None:
    """Labels, title and grid of a panel of minival curves; its legend, or a note that no run has a result."""
    if drawn:
        ax.legend(fontsize=legend_size)
    else:
        _no_result(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("minival top-1 (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def plot_pooling(numbers: dict[str, Any], path: Path) -> Path:
    """Figure 9's view: minival top-1 against training steps for the class token and for GAP, one
    line per learning rate (the mean over the seeds run at it; the chosen rate bold), and the
    grid's minival top-1 against the learning rate, on which each pooling's rate is chosen."""
    fig = _new_figure(15.0, 4.2)
    axes = fig.subplots(1, 3)
    colours = {c["rate"]: f"C{i}" for i, c in enumerate(c for c in numbers["cells"] if c["pooling"] == "token")}
    for ax, (pooling, title) in zip(axes[:2], (("token", "class token"), ("gap", "global average pooling"))):
        drawn = False
        for c in numbers["cells"]:
            steps, mean = _mean_minival_curve(c["curves"]) if c["pooling"] == pooling else ([], [])
            if not steps:
                continue
            drawn = True
            n = len(c["seeds"])
            label = f"lr {c['rate']} ({n} seed{'s' if n > 1 else ''})" + (", chosen" if c["chosen"] else "")
            ax.plot(steps, mean, marker="o", ms=3, lw=2.5 if c["chosen"] else 1.0, color=colours.get(c["rate"]),
                    label=label)  # fmt: skip
        _finish_curves(ax, drawn, "training step", title, 7)
    lines = {
        title: [(c["lr"], c["minival_seed0"], c["chosen"]) for c in numbers["cells"] if c["pooling"] == pooling]
        for pooling, title in (("token", "class token"), ("gap", "GAP"))
    }
    _minival_against_rate(axes[2], lines)
    axes[2].set_ylabel(f"minival top-1, seed {numbers['grid_seed']} (%)")
    axes[2].set_title("the grid", fontsize=9)
    fig.suptitle("Class token against global average pooling (after Figure 9)")
    return _save(fig, path)


def plot_resolution(numbers: dict[str, Any], path: Path) -> Path:
    """Section 3.2's comparison: test top-1 of the pre-trained model, the zero-step control, the
    two fine-tunings and the from-scratch arm (each scored at its own size; spread over seeds),
    their minival top-1 against steps (the fine-tunings at the chosen rates), and the grid of
    fine-tuning rates."""
    fig = _new_figure(15.0, 4.2)
    axes = fig.subplots(1, 3)
    arms = numbers["arms"]
    order = ("pretrained", "zero_step", "finetuned_low", "finetuned_native", "scratch_native")
    order = tuple(a for a in order if a in arms)
    ms = [_ms([v for v in arms[a]["test_top1"] if v is not None]) for a in order]
    ax = axes[0]
    ax.bar(range(len(order)), [m for m, _ in ms], yerr=[s for _, s in ms], capsize=3, color="tab:blue")
    ax.set_xticks(range(len(order)), [arms[a]["short"] for a in order], rotation=15, ha="right", fontsize=8)
    drawn = [(m, s) for m, s in ms if math.isfinite(m)]
    if drawn:
        ax.set_ylim(max(0.0, min(m - s for m, s in drawn) - 5), min(100.0, max(m + s for m, s in drawn) + 2))
    else:
        _no_result(ax)
    ax.set_ylabel("test top-1 (%)")
    ax.grid(alpha=0.3, axis="y")
    ax = axes[1]
    curves = False
    for which in ("low", "native"):
        arm = arms[f"finetuned_{which}"]
        steps, mean = _mean_minival_curve(arm["curves"])
        if steps:
            curves = True
            h, w = numbers["sizes"][which]
            n = len(arm["curves"])
            label = f"{h}x{w} px, lr {arm['lr']:g} ({n} seed{'s' if n > 1 else ''})"
            ax.plot(steps, mean, marker="o", ms=3, label=label)
    scratch = arms.get("scratch_native") or {}
    steps, mean = _mean_minival_curve(scratch.get("curves") or [])
    if steps:
        curves = True
        n = len(scratch["curves"])
        ax.plot(steps, mean, marker="s", ms=3, ls="--", label=f"from scratch ({n} seed{'s' if n > 1 else ''})")
    _finish_curves(ax, curves, "step", "fine-tuning at the chosen rates, and from scratch", 8)
    lines = {}
    for which in ("low", "native"):
        h, w = numbers["sizes"][which]
        cells = [c for c in numbers["grid"] if c["size"] == which]
        lines[f"{h}x{w} px"] = [(c["lr"], c["minival_top1"], c["chosen"]) for c in cells]
    _minival_against_rate(axes[2], lines)
    axes[2].set_ylabel(f"minival top-1, seed {numbers['grid_seed']} (%)")
    axes[2].set_title("the fine-tuning rate grid", fontsize=9)
    fig.suptitle("Fine-tuning at the pre-training size or at the data's (after section 3.2)")
    return _save(fig, path)
