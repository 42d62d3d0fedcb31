"""One self-contained HTML page that looks inside a ViT (``vitkit view``).

The page shows, for a few images, the prediction, the attention of every layer and head, the
rollout, the share of attention that registers take, a click-a-patch cosine similarity of the
patch features at any layer and the principal components of the patch features as colours; for
the model, the paper's Figure 7 panels (mean attention distance, position-embedding similarity,
embedding filters); and for many images a scatter of their embeddings.

The numbers are those of :func:`vitkit.analysis.analyze` (rollout, per-head attention, attention
distance, position embeddings, filters) and of :mod:`vitkit.eval.embed` (the pooled vectors of
the scatter): this module only adds what a page needs on top (features per layer, predictions,
thumbnails) and writes everything, scripts and data, into one HTML file that needs no network.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import UsageError
from ..files import write_text
from ..preprocessing import LoadedImages
from .attention import collect_attention, register_attention_share
from .report import Report, analyze

TEMPLATE = "view.html"
DATA_MARK = "/*VITKIT_VIEW_DATA*/null"
THUMB = 32  # pixels on the longer side of a scatter point's picture
DETAIL_PIXELS = 224  # the longer side of a detail image as embedded
PROJECTIONS = ("pca", "umap", "tsne")


@dataclass
class Points:
    """The images of the scatter: their embeddings and what the page says of each.

    Attributes:
        vectors: the pooled embeddings (N, D), as :func:`vitkit.eval.embed.embed_folder` makes them.
        paths: where each image came from.
        labels: each image's label (its class folder), or None.
        predictions: the index of each image's predicted class, or None for a model without a head.
        thumbnails: each image as uint8 pixels (h, w) or (h, w, 3), at most :data:`THUMB` a side.
        skipped: (path, why) of each file that could not be read.
    """

    vectors: torch.Tensor
    paths: list[str]
    labels: list[str | None]
    predictions: list[int] | None
    thumbnails: list[np.ndarray] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# What the page adds to the analyses


def patch_pca_rgb(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The patch features of a few images as colours, as DINO shows them: the first principal
    component over every patch of every image separates foreground from background, and the
    first three components of the foreground patches alone become red, green and blue.

    The foreground is the side of the first component (above or below zero, after centring)
    that holds fewer patches; each colour channel is scaled to [0, 1] over the foreground.

    Args:
        features: patch features (B, P, D).

    Returns:
        The colours (B, P, 3) in [0, 1], background black, and the foreground mask (B, P).

    Raises:
        ValueError: features not of shape (B, P, D), or fewer than two patches in all.
    """
    if features.ndim != 3:
        raise ValueError(f"patch features must have shape (B, P, D), got {tuple(features.shape)}")
    B, P, D = features.shape
    x = features.reshape(B * P, D).to(torch.float64)  # (B*P, D)
    if x.shape[0] < 2:
        raise ValueError("need at least two patches for principal components")
    first = _components(x, 1)[:, 0]  # (B*P,)
    fg = first > 0
    if int(fg.sum()) * 2 > fg.numel():
        fg = ~fg
    if int(fg.sum()) < 3:  # no clear foreground: colour every patch
        fg = torch.ones_like(fg)
    rgb = torch.zeros(B * P, 3, dtype=torch.float64)
    comps = _components(x[fg], 3)  # (F, <=3)
    lo, hi = comps.amin(dim=0), comps.amax(dim=0)
    rgb[fg, : comps.shape[1]] = (comps - lo) / (hi - lo).clamp_min(1e-12)
    return rgb.reshape(B, P, 3).float(), fg.reshape(B, P)


def _components(x: torch.Tensor, k: int) -> torch.Tensor:
    """The projections of the rows of ``x`` (N, D) on their first ``k`` principal components,
    each component's sign fixed so that its largest-magnitude loading is positive: (N, min(k, N, D))."""
    x = x - x.mean(dim=0, keepdim=True)
    _, _, vt = torch.linalg.svd(x, full_matrices=False)  # vt (r, D)
    vt = vt[:k]
    biggest = vt.abs().argmax(dim=1, keepdim=True)
    vt = vt * torch.sign(vt.gather(1, biggest))
    return x @ vt.T  # (N, k)


def project(vectors: torch.Tensor, method: str, seed: int = 0) -> np.ndarray:
    """The embeddings on a plane: ``"pca"`` (the first two principal components), ``"umap"``
    (needs umap-learn) or ``"tsne"`` (needs scikit-learn).

    Args:
        vectors: the embeddings (N, D).
        method: "pca", "umap" or "tsne".
        seed: the seed of UMAP and t-SNE.

    Returns:
        (N, 2) float32 coordinates.

    Raises:
        UsageError: an unknown method, or one whose package is not installed.
    """
    x = vectors.reshape(vectors.shape[0], -1).to(torch.float64)
    if method == "pca":
        xy = _components(x, 2).numpy()
        return np.pad(xy, ((0, 0), (0, 2 - xy.shape[1]))).astype(np.float32)
    if method == "umap":
        try:
            import umap
        except ImportError:
            raise UsageError("--projections umap needs umap-learn: pip install umap-learn") from None
        reducer = umap.UMAP(n_components=2, random_state=seed)
        return np.asarray(reducer.fit_transform(x.numpy()), dtype=np.float32)
    if method == "tsne":
        try:
            from sklearn.manifold import TSNE
        except ImportError:
            raise UsageError("--projections tsne needs scikit-learn: pip install scikit-learn") from None
        perplexity = float(min(30, max(2, (x.shape[0] - 1) // 3)))
        tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed)
        return np.asarray(tsne.fit_transform(x.numpy()), dtype=np.float32)
    raise UsageError(f"projection must be one of {', '.join(PROJECTIONS)}, got {method!r}")


def available_projections() -> list[str]:
    """The projections this machine can compute: PCA, and UMAP or t-SNE where installed.

    Returns:
        "pca", then "umap" if umap-learn imports, then "tsne" if scikit-learn does.
    """
    import importlib.util

    found = ["pca"]
    found += [name for name, module in (("umap", "umap"), ("tsne", "sklearn")) if importlib.util.find_spec(module)]
    return found


def _per_layer_features(model: nn.Module, inputs: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The patch tokens after every block (residual stream) and the final normed patch tokens."""
    prefix = model.cfg.num_prefix_tokens
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            out = model.forward_intermediates(inputs)
    finally:
        model.train(was_training)
    per_layer = [t[:, prefix:].float() for t in out["tokens"]]  # L x (B, P, D)
    return per_layer, out["normed"][:, prefix:].float()


def cosine_maps(features: torch.Tensor) -> torch.Tensor:
    """Every patch's cosine similarity to every other: (B, P, P) from features (B, P, D).

    Args:
        features: patch features (B, P, D).

    Returns:
        The similarities (B, P, P), float32, in [-1, 1].
    """
    f = features.to(torch.float64)
    f = f / f.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (f @ f.transpose(1, 2)).float()


# ----------------------------------------------------------------------------------------------
# The page's data


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def _png(pixels: np.ndarray, longest: int | None = None, fmt: str = "PNG") -> str:
    """uint8 pixels (h, w) or (h, w, 3) as a data URL, downsampled to ``longest`` a side."""
    from PIL import Image

    im = Image.fromarray(np.ascontiguousarray(pixels))
    if longest is not None and max(im.size) > longest:
        im.thumbnail((longest, longest), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, format=fmt, **({"quality": 85} if fmt == "JPEG" else {"optimize": True}))
    mime = "jpeg" if fmt == "JPEG" else "png"
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _rounded(t: torch.Tensor | np.ndarray, digits: int = 6) -> list:
    a = t.double().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)
    return np.round(a, digits).tolist()


def _model_panels(report: Report) -> dict[str, Any]:
    """Figure 7's three panels: distances (L, H), position similarity, filter components."""
    panels: dict[str, Any] = {"distance": _rounded(report.distances), "pos_similarity": None}
    if report.pos_similarity is not None:
        gh, gw = report.grid
        sim = report.pos_similarity.reshape(gh * gw, gh * gw).numpy()
        panels["pos_similarity"] = _b64(np.round((sim.clip(-1, 1) + 1) * 127.5).astype(np.uint8))
    comps = report.filters.components  # (k, C, ph, pw)
    k, C, ph, pw = comps.shape
    tiles = None
    if C in (1, 3):  # filters over pixels: shown as pictures; over ResNet features: not
        lo = comps.amin(dim=(1, 2, 3), keepdim=True)
        hi = comps.amax(dim=(1, 2, 3), keepdim=True)
        scaled = ((comps - lo) / (hi - lo).clamp_min(1e-12) * 255).round().to(torch.uint8)
        rgb = scaled.permute(0, 2, 3, 1).expand(k, ph, pw, 3)  # (k, ph, pw, 3); grey filters repeat their channel
        tiles = _b64(rgb.numpy())
    panels["filters"] = {
        "count": k,
        "size": [ph, pw],
        "rgb": tiles,
        "variance": _rounded(report.filters.explained_variance_ratio, 4),
    }
    return panels


def _top5(model: nn.Module, inputs: torch.Tensor) -> list[list[dict[str, Any]]] | None:
    """Each image's five most probable classes, named as the model's checkpoint names them."""
    if not int(getattr(model, "num_classes", 0) or 0):
        return None
    from ..eval.predict import predict

    return [
        [{"class": r["class"], "prob": round(float(r["prob"]), 6)} for r in rows]
        for rows in predict(model, inputs, top_k=min(5, int(model.num_classes)))
    ]


def _image_details(model: nn.Module, report: Report, sources: list[str], batch_size: int) -> list[dict[str, Any]]:
    """Per image: its picture, prediction, rollout, attention of each layer and head, the
    registers' share, the cosine similarity of its patches at each layer, the PCA colours."""
    cfg, images = model.cfg, report.images
    prefix, registers = cfg.num_prefix_tokens, cfg.num_registers
    sims, finals, shares = [], [], []
    for start in range(0, len(images), batch_size):
        batch = images.inputs[start : start + batch_size]
        per_layer, final = _per_layer_features(model, batch)
        sims.append(torch.stack([cosine_maps(f) for f in per_layer], dim=1))  # (b, L, P, P)
        finals.append(final)
        if registers:
            shares.append(register_attention_share(collect_attention(model, batch), prefix, registers))  # (b, L)
    sim = torch.cat(sims)
    rgb, fg = patch_pca_rgb(torch.cat(finals))
    top5 = _top5(model, images.inputs)
    details = []
    for i, name in enumerate(images.names):
        maps = report.head_maps[i].float().numpy()  # (L, H, gh, gw)
        details.append(
            {
                "name": name,
                "path": sources[i],
                "src": _png(images.pixels[i], DETAIL_PIXELS, "JPEG" if images.pixels.ndim == 4 else "PNG"),
                "top5": top5[i] if top5 is not None else None,
                "rollout": _rounded(report.rollout[i]),
                "attention": _b64(maps.astype(np.float32)),
                "registers": _rounded(torch.cat(shares)[i], 6) if registers else None,
                "similarity": _b64(np.round((sim[i].clamp(-1, 1).numpy() + 1) * 127.5).astype(np.uint8)),
                "pca": _b64(np.round(rgb[i].numpy() * 255).astype(np.uint8)),
                "foreground": int(fg[i].sum()),
            }
        )
    return details


def _atlas(thumbs: list[np.ndarray], per_row: int = 64) -> tuple[list[str], list[int]]:
    """Thumbnails packed into PNG sheets of ``per_row`` x ``per_row`` cells (far smaller than
    one picture each): the sheets as data URLs, and the cell size (h, w)."""
    if not thumbs:
        return [], [0, 0]
    ch = max(t.shape[0] for t in thumbs)
    cw = max(t.shape[1] for t in thumbs)
    rgb = any(t.ndim == 3 for t in thumbs)
    per_sheet = per_row * per_row
    sheets = []
    for start in range(0, len(thumbs), per_sheet):
        chunk = thumbs[start : start + per_sheet]
        rows = -(-len(chunk) // per_row)
        sheet = np.zeros((rows * ch, per_row * cw, 3) if rgb else (rows * ch, per_row * cw), np.uint8)
        for j, t in enumerate(chunk):
            if rgb and t.ndim == 2:
                t = np.repeat(t[..., None], 3, axis=2)
            r, c = divmod(j, per_row)
            sheet[r * ch : r * ch + t.shape[0], c * cw : c * cw + t.shape[1]] = t
        sheets.append(_png(sheet))
    return sheets, [ch, cw]


def _scatter(points: Points, class_names: list[str] | None, projections: list[str]) -> dict[str, Any]:
    """The scatter's data: coordinates per projection, labels, predictions, paths, thumbnails."""
    labels = sorted({lab for lab in points.labels if lab is not None})
    names = list(class_names or [])
    # labels that are class names share the model's colours; others follow them
    legend = names + [lab for lab in labels if lab not in names]
    index = {name: i for i, name in enumerate(legend)}
    coords = {}
    for method in projections:
        xy = project(points.vectors, method)
        coords[method] = [_rounded(xy[:, 0], 4), _rounded(xy[:, 1], 4)]
    sheets, cell = _atlas(points.thumbnails)
    return {
        "count": len(points.paths),
        "paths": points.paths,
        "classes": legend,
        "labels": [index[lab] if lab is not None else -1 for lab in points.labels],
        "predictions": points.predictions,
        "coords": coords,
        "sheets": sheets,
        "cell": cell,
        "per_row": 64,
    }


# ----------------------------------------------------------------------------------------------
# Building and writing the page


def collect_points(
    model: nn.Module, items: list[tuple[Path, str, str | None]], batch_size: int = 64, workers: int = 0
) -> Points:
    """Embed images for the scatter with :func:`vitkit.eval.embed.embed_folder` (pool "pooled",
    what the head reads) and predict their class from those vectors.

    Args:
        model: a vitkit model.
        items: (folder, path relative to it, label or None) per image, in the order to keep.
        batch_size: images per forward pass.
        workers: threads that decode images.

    Returns:
        The points; files that could not be read are left out and listed in ``skipped``.
    """
    from ..eval.embed import embed_folder, head_predictions
    from ..preprocessing import read_image

    groups: dict[Path, list[tuple[str, str | None]]] = {}
    for root, rel, label in items:
        groups.setdefault(root, []).append((rel, label))
    vectors, paths, labels, thumbs, skipped = [], [], [], [], []
    gray = model.cfg.in_chans == 1 if hasattr(model, "cfg") else False
    for root, entries in groups.items():
        label_of = dict(entries)
        res = embed_folder(
            model, root, pool="pooled", batch_size=batch_size, files=[r for r, _ in entries], workers=workers
        )
        assert res.vectors is not None
        vectors.append(res.vectors)
        skipped += [(str(root / rel), why) for rel, why in res.skipped]
        for rel in res.paths:
            paths.append(str(root / rel))
            labels.append(label_of[rel])
            im = read_image(root / rel).convert("L" if gray else "RGB")
            im.thumbnail((THUMB, THUMB))
            thumbs.append(np.asarray(im))
    pooled = torch.cat(vectors)
    predicted = head_predictions(model, pooled)
    return Points(pooled, paths, labels, predicted.tolist() if predicted is not None else None, thumbs, skipped)


def view_data(
    model: nn.Module,
    images: LoadedImages,
    sources: list[str],
    points: Points | None = None,
    projections: list[str] | None = None,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready values: the analyses of
    :func:`vitkit.analysis.analyze` on ``images`` (every layer), what the page adds per image,
    and the scatter of ``points``.

    Args:
        model: a vitkit ViT or hybrid.
        images: the images shown one by one, as :func:`vitkit.load_images` prepares them.
        sources: where each of ``images`` came from.
        points: the images of the scatter (:func:`collect_points`); None: no scatter.
        projections: the scatter's projections (default: :func:`available_projections`).
        batch_size: images run at once.

    Returns:
        The page's data: ``model``, ``panels``, ``images`` and ``scatter`` (or None).

    Raises:
        UsageError: a model that is not a Vision Transformer.
    """
    from ..eval.predict import class_names

    report = analyze(model, images, layers=list(range(model.cfg.depth)), batch_size=batch_size)
    cfg = model.cfg
    classes = class_names(model) if int(getattr(model, "num_classes", 0) or 0) else None
    scatter = None
    if points is not None and len(points.paths) >= 3:
        scatter = _scatter(points, classes, projections or available_projections())
    return {
        "model": {
            "name": report.name,
            "depth": cfg.depth,
            "heads": cfg.num_heads,
            "grid": list(report.grid),
            "stride": list(report.stride),
            "prefix": cfg.num_prefix_tokens,
            "registers": cfg.num_registers,
            "query": report.query,
            "pos_summary": report.pos_summary,
        },
        "panels": _model_panels(report),
        "images": _image_details(model, report, sources, batch_size),
        "scatter": scatter,
    }


def render_html(data: dict[str, Any]) -> str:
    """The page: the template shipped with vitkit with ``data`` written into it.

    Args:
        data: what :func:`view_data` returns.

    Returns:
        One HTML document, scripts and data inline.
    """
    template = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("</", "<\\/").replace("<!--", "\\u003c!--")  # nothing in it ends the script
    if DATA_MARK not in template:
        raise RuntimeError(f"the page template {TEMPLATE} has no data mark")
    return template.replace(DATA_MARK, payload, 1)


def write_view(path: str | Path, data: dict[str, Any]) -> int:
    """Write the page (:func:`render_html`) to ``path``, atomically.

    Args:
        path: the HTML file to write.
        data: what :func:`view_data` returns.

    Returns:
        The file's size in bytes.
    """
    html = render_html(data)
    write_text(path, html)
    return len(html.encode("utf-8"))


def embedded_data(html: str) -> dict[str, Any]:
    """The data a page written by :func:`write_view` carries, read back (for tests and tools).

    Args:
        html: the page's text.

    Returns:
        The data, as :func:`view_data` returned it.

    Raises:
        ValueError: a page without vitkit's data.
    """
    start_tag = '<script id="vitkit-data" type="application/json">'
    start = html.find(start_tag)
    end = html.find("</script>", start)
    if start < 0 or end < 0:
        raise ValueError("not a page of vitkit view: no vitkit-data script")
    try:
        return json.loads(html[start + len(start_tag) : end])
    except RecursionError:
        raise ValueError("the page's vitkit-data is nested too deeply to be vitkit view's data") from None
