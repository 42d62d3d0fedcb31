"""Pictures of the analyses, in the style of the paper's Figures 6 and 7.

Every function takes arrays or tensors and a path, writes a PNG there and returns the path. The
figures are drawn on matplotlib ``Figure`` objects with the Agg canvas directly, so pyplot's
global state and backend (e.g. in a notebook) are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ArrayLike = np.ndarray | torch.Tensor

_DPI = 120


def _new_figure(width: float, height: float) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("the analysis figures need matplotlib: pip install 'vitkit[plot]'") from e
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` atomically (a full disk leaves no half picture); a failure names ``path``."""
    from ..errors import writing
    from ..files import atomic_write

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    with writing(path):
        atomic_write(path, lambda f: fig.savefig(f, format=fmt, dpi=_DPI, bbox_inches="tight"))
    return path


def _numpy(x: ArrayLike) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().float().numpy()
    return np.asarray(x)


def _cmap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name]


def _as_display_images(images: ArrayLike) -> np.ndarray:
    """(B, H, W, 3) or (B, H, W) in uint8 or [0, 1] floats -> float (B, H, W, 3) in [0, 1]."""
    imgs = _numpy(images)
    if imgs.ndim == 4 and imgs.shape[-1] == 1:
        imgs = imgs[..., 0]
    if imgs.ndim == 3:
        imgs = np.repeat(imgs[..., None], 3, axis=-1)  # (B, H, W, 3)
    if imgs.ndim != 4 or imgs.shape[-1] != 3:
        raise ValueError(f"images must be (B, H, W, 3) or (B, H, W) arrays, got shape {imgs.shape}")
    imgs = imgs.astype(np.float32)
    if imgs.max(initial=0.0) > 1.0:
        imgs = imgs / 255.0
    return np.clip(imgs, 0.0, 1.0)


# ----------------------------------------------------------------------------------------------
# Figure 6: attention rollout over the input.


def upsample_map(heat: ArrayLike, size: tuple[int, int]) -> np.ndarray:
    """A (gh, gw) map bilinearly resized to ``size`` (H, W)."""
    t = torch.as_tensor(_numpy(heat), dtype=torch.float32)[None, None]  # (1, 1, gh, gw)
    return F.interpolate(t, size=size, mode="bilinear", align_corners=False)[0, 0].numpy()  # (H, W)


def plot_rollout_overlay(
    images: ArrayLike,
    maps: ArrayLike,
    path: str | Path,
    titles: Sequence[str] | None = None,
    alpha: float = 0.5,
    cmap: str = "jet",
    per_row: int = 3,
) -> Path:
    """Each input image next to its rollout map (B, gh, gw), upsampled and blended over it.

    ``images`` are what the model saw, for display: (B, H, W, 3) or (B, H, W), uint8 or floats
    in [0, 1]. ``maps`` should be scaled to [0, 1] (as :func:`~vitkit.analysis.cls_rollout_map`
    returns them).

    Args:
        images: the images for display, (B, H, W, 3) or (B, H, W).
        maps: the rollout maps (B, gh, gw), in [0, 1].
        path: the picture to write (its suffix picks the format; PNG without one).
        titles: one title per image; None: "image 1", "image 2"...
        alpha: the map's opacity over the image.
        cmap: the matplotlib colour map of the maps.
        per_row: the images (each with its map) in a row.

    Returns:
        ``path``.

    Raises:
        ValueError: images or maps of other shapes, maps or titles not one per image.
        ImportError: matplotlib is not installed.
    """
    imgs = _as_display_images(images)
    heat = _numpy(maps)
    if heat.ndim != 3 or heat.shape[0] != imgs.shape[0]:
        raise ValueError(f"maps must be (B, gh, gw) with B = {imgs.shape[0]} images, got shape {heat.shape}")
    if titles is not None and len(titles) != imgs.shape[0]:
        raise ValueError(f"got {len(titles)} titles for {imgs.shape[0]} images")
    B, H, W, _ = imgs.shape
    cols = min(B, per_row)
    rows = math.ceil(B / cols)
    fig = _new_figure(2 * cols * 2.4 + 1.0, rows * (2.4 * H / W + 0.35) + 0.5)
    axes = fig.subplots(rows, 2 * cols, squeeze=False)
    colours = _cmap(cmap)
    for ax in axes.flat:
        ax.set_axis_off()
    for b in range(B):
        r, c = divmod(b, cols)
        name = titles[b] if titles is not None else f"image {b + 1}"
        ax_img, ax_map = axes[r, 2 * c], axes[r, 2 * c + 1]
        ax_img.imshow(imgs[b])
        ax_img.set_title(name, fontsize=9)
        up = np.clip(upsample_map(heat[b], (H, W)), 0.0, 1.0)
        ax_map.imshow(imgs[b])
        ax_map.imshow(up, cmap=colours, vmin=0.0, vmax=1.0, alpha=alpha)
        ax_map.set_title(f"{name}: rollout", fontsize=9)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    bar = fig.colorbar(ScalarMappable(Normalize(0.0, 1.0), colours), ax=axes, shrink=min(1.0, 0.6 + 0.2 * rows))
    bar.set_label("rollout (scaled per image)")
    fig.suptitle("Attention rollout (Abnar & Zuidema, 2020), as in ViT Figure 6")
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------
# Raw attention of the class token, per layer and head.


def plot_attention_maps(
    maps: ArrayLike,
    path: str | Path,
    layers: Sequence[int] | None = None,
    image: ArrayLike | None = None,
    title: str | None = None,
    cmap: str = "inferno",
) -> Path:
    """A grid of small attention maps: one row per chosen layer, one column per head.

    ``maps`` is (layers, heads, gh, gw) for one image (one entry of
    :func:`~vitkit.analysis.token_attention_maps`); ``layers`` picks rows by index (negative
    indices count from the end; default: all). With ``image`` ((H, W, 3) or (H, W)) the input is
    shown at the start of each row. Each row shares one colour scale, from 0 to its largest weight.

    Args:
        maps: one image's attention maps (layers, heads, gh, gw).
        path: the picture to write.
        layers: the layers shown, by index; None: all.
        image: the input to show at the start of each row; None: none.
        title: the picture's title; None: one saying what the maps are.
        cmap: the matplotlib colour map.

    Returns:
        ``path``.

    Raises:
        ValueError: maps not of 4 dimensions, or a layer out of range.
        ImportError: matplotlib is not installed.
    """
    m = _numpy(maps)
    if m.ndim != 4:
        raise ValueError(f"maps must be (layers, heads, gh, gw), got shape {m.shape}")
    L, H = m.shape[:2]
    chosen = list(range(L)) if layers is None else [int(i) for i in layers]
    for i in chosen:
        if not -L <= i < L:
            raise ValueError(f"layer {i} is out of range for {L} layers")
    chosen = [i % L for i in chosen]
    shown = _as_display_images(_numpy(image)[None])[0] if image is not None else None
    first = 1 if shown is not None else 0
    cols = H + first
    aspect = m.shape[2] / m.shape[3]
    fig = _new_figure(1.5 * cols + 1.2, (1.5 * aspect + 0.3) * len(chosen) + 0.6)
    axes = fig.subplots(len(chosen), cols, squeeze=False)
    colours = _cmap(cmap)
    for r, layer in enumerate(chosen):
        row = m[layer]  # (H, gh, gw)
        vmax = float(row.max()) or 1.0
        if shown is not None:
            axes[r, 0].imshow(shown)
            axes[r, 0].set_xticks([])
            axes[r, 0].set_yticks([])
            axes[r, 0].set_ylabel(f"layer {layer + 1}", fontsize=9)
            if r == 0:
                axes[r, 0].set_title("input", fontsize=9)
        im = None
        for h in range(H):
            ax = axes[r, first + h]
            im = ax.imshow(row[h], cmap=colours, vmin=0.0, vmax=vmax, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {h + 1}", fontsize=9)
            if h == 0 and shown is None:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=9)
        bar = fig.colorbar(im, ax=list(axes[r]), fraction=0.02, pad=0.01)
        bar.ax.tick_params(labelsize=7)
    fig.suptitle(title or "Attention of the class token to each patch, per layer and head")
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------
# Figure 7: filters, position embeddings, attention distance.


def plot_mean_attention_distance(
    distances: ArrayLike,
    path: str | Path,
    title: str | None = None,
    max_distance: float | None = None,
) -> Path:
    """Mean attention distance (layers, heads) as in Figure 7 right: one dot per head, network
    depth on x, distance in input pixels on y. ``max_distance`` (e.g. the image diagonal) fixes
    the top of the y axis.

    Args:
        distances: the distances in pixels (layers, heads) of
            :func:`~vitkit.analysis.mean_attention_distance`.
        path: the picture to write.
        title: the picture's title; None: "Mean attention distance per head".
        max_distance: the top of the y axis, in pixels; None: a tenth above the largest distance.

    Returns:
        ``path``.

    Raises:
        ValueError: distances not of 2 dimensions.
        ImportError: matplotlib is not installed.
    """
    d = _numpy(distances)
    if d.ndim != 2:
        raise ValueError(f"distances must be (layers, heads), got shape {d.shape}")
    L, H = d.shape
    fig = _new_figure(5.5, 4.0)
    ax = fig.subplots()
    colours = _cmap("tab20" if H > 10 else "tab10")
    depth = np.arange(1, L + 1)
    for h in range(H):
        ax.scatter(depth, d[:, h], s=18, color=colours(h % colours.N), label=f"head {h + 1}", alpha=0.85)
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(depth if L <= 16 else np.linspace(1, L, 9).round().astype(int))
    ax.set_xlim(0.5, L + 0.5)
    top = max_distance if max_distance is not None else float(np.nanmax(d)) * 1.1
    ax.set_ylim(0.0, max(top, 1e-6))
    ax.grid(alpha=0.3)
    if H <= 16:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title(title or "Mean attention distance per head")
    return _save(fig, path)


def pos_embed_mosaic(similarity: ArrayLike) -> np.ndarray:
    """A (gh, gw, gh, gw) similarity laid out as one image: tile (i, j) is patch (i, j)'s map, tiles
    one NaN row/column apart. Shape (gh * (gh + 1) - 1, gw * (gw + 1) - 1)."""
    s = _numpy(similarity)
    if s.ndim != 4 or s.shape[:2] != s.shape[2:]:
        raise ValueError(f"expected a (gh, gw, gh, gw) similarity, got shape {s.shape}")
    gh, gw = s.shape[:2]
    out = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan, dtype=np.float32)
    for i in range(gh):
        for j in range(gw):
            out[i * (gh + 1) : i * (gh + 1) + gh, j * (gw + 1) : j * (gw + 1) + gw] = s[i, j]
    return out


def plot_pos_embed_similarity(similarity: ArrayLike, path: str | Path, title: str | None = None) -> Path:
    """Position-embedding similarity as in Figure 7 centre: a gh x gw grid of small gh x gw maps,
    the tile at (row i, column j) showing the cosine similarity of patch (i, j)'s embedding to
    every patch's, on one colour scale from -1 to 1.

    Args:
        similarity: the similarities (gh, gw, gh, gw) of :func:`~vitkit.analysis.pos_embed_similarity`.
        path: the picture to write.
        title: the picture's title; None: "Position embedding similarity".

    Returns:
        ``path``.

    Raises:
        ValueError: a similarity not of shape (gh, gw, gh, gw).
        ImportError: matplotlib is not installed.
    """
    mosaic = pos_embed_mosaic(similarity)
    gh, gw = _numpy(similarity).shape[:2]
    side = float(np.clip(0.45 * max(gh, gw), 3.5, 9.0))
    mh, mw = mosaic.shape
    fig = _new_figure(side * mw / max(mh, mw) + 1.6, side * mh / max(mh, mw) + 0.9)
    ax = fig.subplots()
    colours = _cmap("viridis").with_extremes(bad="white")
    im = ax.imshow(mosaic, cmap=colours, vmin=-1.0, vmax=1.0, interpolation="nearest")
    step_r = max(1, math.ceil(gh / 16))
    step_c = max(1, math.ceil(gw / 16))
    ax.set_yticks(
        [i * (gh + 1) + (gh - 1) / 2 for i in range(0, gh, step_r)], [str(i + 1) for i in range(0, gh, step_r)]
    )
    ax.set_xticks(
        [j * (gw + 1) + (gw - 1) / 2 for j in range(0, gw, step_c)], [str(j + 1) for j in range(0, gw, step_c)]
    )
    ax.tick_params(length=0, labelsize=8)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    bar = fig.colorbar(im, ax=ax, shrink=0.8)
    bar.set_label("cosine similarity")
    ax.set_title(title or "Position embedding similarity")
    return _save(fig, path)


def plot_filter_components(
    components: ArrayLike,
    path: str | Path,
    explained_variance_ratio: ArrayLike | None = None,
    ncols: int = 7,
    title: str | None = None,
) -> Path:
    """Principal components of the patch-embedding filters (k, C, ph, pw) as images, as in
    Figure 7 left: RGB for C = 3, grey for C = 1, each scaled to [0, 1] on its own.

    Args:
        components: the components (k, C, ph, pw) of
            :func:`~vitkit.analysis.embedding_filter_components`.
        path: the picture to write.
        explained_variance_ratio: the share of variance of each (k,), printed under it; None: not
            printed.
        ncols: the components in a row.
        title: the picture's title; None: one saying what the components are.

    Returns:
        ``path``.

    Raises:
        ValueError: components not of 4 dimensions, or with other than 1 or 3 channels.
        ImportError: matplotlib is not installed.
    """
    c = _numpy(components)
    if c.ndim != 4:
        raise ValueError(f"components must be (k, C, ph, pw), got shape {c.shape}")
    k, C = c.shape[:2]
    if C not in (1, 3):
        raise ValueError(
            f"filters with {C} input channels cannot be shown as images (a hybrid's filters act on "
            "ResNet features, not pixels); plot components of a plain ViT"
        )
    ratios = None if explained_variance_ratio is None else _numpy(explained_variance_ratio)
    cols = min(k, ncols)
    rows = math.ceil(k / cols)
    fig = _new_figure(1.3 * cols, 1.45 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for i in range(k):
        comp = c[i]
        comp = (comp - comp.min()) / max(float(comp.max() - comp.min()), 1e-12)
        ax = axes[i // cols, i % cols]
        if C == 3:
            ax.imshow(comp.transpose(1, 2, 0), interpolation="nearest")  # (ph, pw, 3)
        else:
            ax.imshow(comp[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
        label = f"PC {i + 1}"
        if ratios is not None:
            label += f"\n{100 * float(ratios[i]):.1f}%"
        ax.set_title(label, fontsize=8)
    fig.suptitle(title or "RGB embedding filters: principal components (variance explained)")
    return _save(fig, path)
