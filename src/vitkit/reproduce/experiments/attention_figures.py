"""The attention experiment's figures: every head's mean attention distance and class-token share,
trained against untrained, and, through :mod:`vitkit.analysis.figures`, the position-embedding
similarity, the embedding filters (Figure 7) and the rollout (Figure 6)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ...analysis import figures as F
from ...analysis.figures import _new_figure, _save


def _jitter(count: int, width: float) -> list[float]:
    """``count`` offsets spread evenly over ``width``, centred on zero."""
    return [0.0] * count if count < 2 else [width * (i / (count - 1) - 0.5) for i in range(count)]


_STATE_STYLE = {"trained": ("tab:blue", -0.18), "untrained": ("0.6", 0.18)}


def plot_attention_heads(numbers: dict[str, Any], path: Path) -> Path:
    """Every head of every seed by layer, trained and untrained: its mean attention distance (with
    uniform attention's) next to the share of attention patch queries give the class token
    (Figure 7 right, Figure 11).

    Args:
        numbers: the attention experiment's numbers (``models`` with per-seed ``distances``
            and ``class_share`` per state).
        path: the PNG to write.

    Returns:
        ``path``.
    """
    models = numbers["models"]
    fig = _new_figure(10.0, 3.2 * len(models))
    axes = fig.subplots(len(models), 2, squeeze=False)
    for row, entry in zip(axes, models.values()):
        for state, (colour, shift) in _STATE_STYLE.items():
            for k, (key, ax) in enumerate((("distances", row[0]), ("class_share", row[1]))):
                xs, ys = [], []
                for seed in entry[state]:
                    for layer, heads in enumerate(seed[key]):
                        for dx, value in zip(_jitter(len(heads), 0.25), heads):
                            xs.append(layer + 1 + shift + dx)
                            ys.append(value if key == "distances" else 100 * value)
                label = f"{state} ({len(entry[state])} seed{'s' if len(entry[state]) > 1 else ''})"
                ax.scatter(xs, ys, s=14, color=colour, alpha=0.8, label=label if k == 0 else None)
        uniform = entry["trained"][0]["uniform"]
        row[0].axhline(uniform, ls="--", lw=1, color="k", label=f"uniform attention ({uniform:.1f} px)")
        layers = len(entry["trained"][0]["distances"])
        for ax, label in zip(row, ("mean attention distance (px)", "class-token share of attention (%)")):
            ax.set_xticks(range(1, layers + 1))
            ax.set_xlabel("layer")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        row[0].set_title(f"{entry['title']}: every head of every seed", fontsize=9)
        row[1].set_title("share of the patch queries' attention on the class token", fontsize=9)
        row[0].legend(fontsize=7)
    fig.suptitle("Mean attention distance and class-token share per head (after Figure 7 right and Figure 11)")
    return _save(fig, path)


_CONTROLS = (
    ("depth_slope", "depth slope of the layer-mean\ndistance (px a layer)", 1.0, 0.0),
    ("first_layer_range", "first layer: farthest minus\nnearest head (px)", 1.0, None),
    ("rollout_ratio", "rollout mass on the object\nover the object's share", 1.0, 1.0),
    ("pos_contrast", "position embeddings: neighbours'\nminus far patches' similarity", 1.0, 0.0),
    ("filter_top", "filters: variance share of the\ntop principal components (%)", 100.0, None),
)


def plot_attention_controls(numbers: dict[str, Any], path: Path) -> Path:
    """Trained against untrained, seed by seed (one line per seed), for each summary of the
    attention experiment; a dashed line marks no effect (no trend, even spread).

    Args:
        numbers: the attention experiment's numbers.
        path: the PNG to write.

    Returns:
        ``path``.
    """
    models = numbers["models"]
    fig = _new_figure(3.0 * len(_CONTROLS), 3.4)
    axes = fig.subplots(1, len(_CONTROLS))
    for ax, (key, label, scale, reference) in zip(axes, _CONTROLS):
        ticks, names, drawn = [], [], False
        for i, entry in enumerate(models.values()):
            x0 = 2.5 * i
            pairs = [(u.get(key), t.get(key)) for u, t in zip(entry["untrained"], entry["trained"])]
            for u, t in pairs:
                pts = [(x0 + j, scale * v) for j, v in enumerate((u, t)) if v is not None and math.isfinite(v)]
                if pts:
                    drawn = True
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i}", alpha=0.7)
            ticks += [x0, x0 + 1]
            short = entry["title"].split(" (")[0]
            names += [f"{short}\nuntrained", f"{short}\ntrained"]
        if not drawn:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        elif reference is not None:
            ax.axhline(reference, ls="--", lw=1, color="k")
        ax.set_xticks(ticks, names, fontsize=7)
        ax.set_title(label, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Trained against untrained, paired by seed (one line per seed)")
    return _save(fig, path)


def plot_attention(numbers: dict[str, Any], pictures: dict[str, Any], out: Path) -> list[Path]:
    """The attention experiment's figures: every head's distance and class-token share
    (:func:`plot_attention_heads`), trained against untrained (:func:`plot_attention_controls`),
    and for the first seed's trained ViT the position-embedding similarity and the filters'
    principal components (Figure 7) and the rollout on a few test images (Figure 6).

    Args:
        numbers: the experiment's numbers.
        pictures: ``measured`` (:class:`vitkit.reproduce.experiments.attention_measure.Measured`), ``images`` and
            ``title`` of the model drawn.
        out: the folder of the figures.

    Returns:
        The paths written.
    """
    written = [
        plot_attention_heads(numbers, out / "attention_distance.png"),
        plot_attention_controls(numbers, out / "attention_controls.png"),
    ]
    m, images, title = pictures["measured"], pictures["images"], pictures["title"]
    if m.similarity is not None:
        written.append(
            F.plot_pos_embed_similarity(
                m.similarity, out / "pos_embed_similarity.png", title=f"{title}: position embedding similarity"
            )
        )
    if m.filters is not None and m.filters.components.shape[1] in (1, 3):
        written.append(
            F.plot_filter_components(m.filters.components, out / "embedding_filters.png",
                                     m.filters.explained_variance_ratio,
                                     title=f"{title}: embedding filters (principal components)")
        )  # fmt: skip
    k = len(m.rollout)
    if k:
        names = images.names[:k]
        if m.ratios:
            names = [f"{n}: {r:.2f}x on object" for n, r in zip(names, m.ratios)]
        written.append(F.plot_rollout_overlay(images.pixels[:k], m.rollout, out / "rollout.png", titles=names))
    return written
