"""The paper's analyses of one model on a few images, as one :class:`Report` (section 4.5,
Figures 6 and 7): attention rollout, per-head attention maps, mean attention distance,
position-embedding similarity and the principal components of the patch filters. The numbers
need only torch; the pictures (:meth:`Report.write`) need matplotlib."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import UsageError
from ..files import slug, write_json
from ..models.config import ROPE_POS_EMBEDS
from ..preprocessing import LoadedImages
from .attention import (
    attention_rollout,
    collect_attention,
    mean_attention_distance,
    rollout_map,
    token_attention_maps,
)
from .embeddings import FilterPCA, embedding_filter_components, pos_embed_similarity, pos_embed_similarity_summary

# Real photographs shipped with scikit-image, the images to analyse when none are given.
SAMPLE_IMAGES = ("astronaut", "chelsea", "coffee")


def sample_images() -> list[tuple[str, Any]]:
    """scikit-image's sample photographs as named Pillow images (for :func:`vitkit.preprocessing.prepare_images`).

    Returns:
        (name, image) pairs: the astronaut, the cat Chelsea and a coffee cup.

    Raises:
        UsageError: scikit-image is not installed.
    """
    from PIL import Image

    try:
        from skimage import data
    except ImportError:
        raise UsageError(
            "no images given and scikit-image (which ships the default sample photographs) is not "
            "installed; pass image files or pip install scikit-image"
        ) from None
    return [(name, Image.fromarray(getattr(data, name)())) for name in SAMPLE_IMAGES]


def model_name(cfg: Any) -> str:
    """A paper-style name: "ViT-B/16", "R50+ViT-B/16" (the number is input pixels per token).

    Args:
        cfg: a ViT or hybrid config.

    Returns:
        The name; a size that is not a standard one is written out (``ViT-custom/16 (D=...)``).
    """
    from ..models.config import VIT_SIZES

    sizes = {v: k for k, v in VIT_SIZES.items()}
    size = sizes.get((cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim))
    sh, sw = cfg.total_stride
    patch = str(sh) if sh == sw else f"{sh}x{sw}"
    body = (
        f"ViT-{size}/{patch}" if size else f"ViT-custom/{patch} (D={cfg.width}, L={cfg.depth}, heads={cfg.num_heads})"
    )
    if cfg.resnet_units:
        body = f"R{3 * sum(cfg.resnet_units) + 2}+{body}"  # bottleneck ResNet depth: 3 convs a unit + stem + head
    elif cfg.resnet_units is not None:
        body = f"R+{body}"  # the ResNet root alone (R+ViT-Ti/16)
    return body


@dataclass
class Report:
    """What :func:`analyze` measured. Tensors are float32 on the CPU.

    Attributes:
        name: the paper-style model name (:func:`model_name`).
        config: the model's config, as a dict.
        images: the images analysed.
        layers: the layers of the per-head maps.
        rollout: the head-mean rollout over all layers (B, gh, gw), scaled to [0, 1] per image.
        head_maps: the attention of the class token (or the mean patch) per layer and head
            (B, L, H, gh, gw).
        distances: the mean attention distance in input pixels (L, H), averaged over the images.
        pos_similarity: the position embeddings' cosine similarity (gh, gw, gh, gw); None for a
            model without an absolute position embedding.
        pos_summary: :func:`pos_embed_similarity_summary` with the grid and kind, or why it was
            skipped.
        filters: the principal components of the patch-embedding filters.
        grid: the token grid (rows, cols).
        stride: input pixels per token (h, w).
        query: what the maps are of: "class token" or "mean over patch tokens".
        figures: the pictures :meth:`write` drew.
    """

    name: str  # paper-style model name
    config: dict[str, Any]
    images: LoadedImages
    layers: list[int]  # the layers of the per-head maps
    rollout: torch.Tensor  # (B, gh, gw) head-mean rollout over all layers, scaled to [0, 1] per image
    head_maps: torch.Tensor  # (B, L, H, gh, gw) attention of the class token (or mean patch) per head
    distances: torch.Tensor  # (L, H) mean attention distance in input pixels, mean over the images
    pos_similarity: torch.Tensor | None  # (gh, gw, gh, gw) cosine similarity, None without embedding
    pos_summary: dict[str, Any]
    filters: FilterPCA
    grid: tuple[int, int]
    stride: tuple[int, int]
    query: str  # what the maps are of: "class token" or "mean over patch tokens"
    figures: list[Path] = field(default_factory=list)

    def to_dict(self, sources: list[str] | None = None) -> dict[str, Any]:
        """The numbers as JSON-ready values (6 decimals); ``sources`` names where each image came from.

        Args:
            sources: where each image came from (a path), in order; None: the images' names.

        Returns:
            The model, the images, the grid and stride, and each measurement with its unit and
            a note, and the figures' file names.
        """
        C = self.filters.components.shape[1]
        filter_info: dict[str, Any] = {
            "filter_shape": list(self.filters.components.shape[1:]),
            "explained_variance_ratio": _rounded(self.filters.explained_variance_ratio),
        }
        if C not in (1, 3):
            filter_info["figure"] = f"not drawn: the filters act on {C} ResNet feature channels, not pixels"
        names = self.images.names
        return {
            "model": {"name": self.name, "config": self.config},
            "images": [{"name": n, "path": p} for n, p in zip(names, sources or names)],
            "grid": list(self.grid),
            "stride_pixels": list(self.stride),
            "mean_attention_distance": {
                "unit": "input pixels",
                "note": "per layer, one value per head; class token excluded, weights renormalised over patches",
                "values": _rounded(self.distances),
            },
            "pos_embed_similarity": self.pos_summary,
            "filter_pca": filter_info,
            "rollout": {
                "query": self.query,
                "note": "head-mean rollout over all layers, patch columns, scaled to [0, 1] per image",
                "maps": [_rounded(m) for m in self.rollout],  # one (gh, gw) map per image, in image order
            },
            "figures": [p.name for p in self.figures],
        }

    def write(self, out: str | Path, extra: dict[str, Any] | None = None, sources: list[str] | None = None) -> Path:
        """Draw every figure into ``out`` and write ``analysis.json`` (``extra`` keys first);
        returns the JSON path. The figures are listed in :attr:`figures`.

        Args:
            out: the folder to write in (made if missing).
            extra: more keys for the JSON, put first.
            sources: where each image came from, for the JSON (:meth:`to_dict`).

        Returns:
            The path of ``analysis.json``.

        Raises:
            ImportError: matplotlib is not installed.
        """
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.figures = _draw(self, out)
        path = out / "analysis.json"
        write_json(path, {**(extra or {}), **self.to_dict(sources)})
        return path


def _rounded(t: torch.Tensor, digits: int = 6) -> list:
    return np.round(t.double().numpy(), digits).tolist()


def _check_model(model: nn.Module) -> None:
    if not hasattr(model, "forward_intermediates"):
        raise UsageError(f"the model is a {type(model).__name__}; the analyses need a Vision Transformer")


def _layers(depth: int, layers: list[int] | None) -> list[int]:
    chosen = sorted({0, depth // 2, depth - 1}) if layers is None else list(layers)
    for i in chosen:
        if not -depth <= i < depth:
            raise UsageError(f"layer {i}: the model has {depth} layers (0..{depth - 1})")
    return chosen


def analyze(
    model: nn.Module, images: LoadedImages, layers: list[int] | None = None, components: int = 28, batch_size: int = 8
) -> Report:
    """Every analysis of ``model`` (a vitkit ViT or hybrid) on ``images``
    (:func:`vitkit.load_images`), in batches of ``batch_size``; ``layers``: those of the per-head
    maps (default: first, middle, last); ``components``: principal components of the filters.

    Args:
        model: a vitkit ViT or hybrid.
        images: the images, as :func:`vitkit.load_images` prepares them for the model.
        layers: the layers of the per-head maps (negative ones count from the last); None:
            the first, middle and last.
        components: the most principal components of the filters to keep.
        batch_size: images run at once.

    Returns:
        The measurements; :meth:`Report.write` draws and writes them.

    Raises:
        UsageError: a model that is not a Vision Transformer, or a layer it does not have.
    """
    _check_model(model)
    cfg = model.cfg
    chosen = _layers(cfg.depth, layers)
    grid, stride, prefix = cfg.grid_size, cfg.total_stride, cfg.num_prefix_tokens
    maps, head_maps, distance_sum = [], [], None
    for start in range(0, len(images), batch_size):
        batch = images.inputs[start : start + batch_size]
        attentions = collect_attention(model, batch)
        maps.append(rollout_map(attention_rollout(attentions), grid, prefix))  # (b, gh, gw)
        head_maps.append(token_attention_maps(attentions, grid, prefix))  # (b, L, H, gh, gw)
        dist = mean_attention_distance(attentions, grid, stride, prefix) * len(batch)  # (L, H)
        distance_sum = dist if distance_sum is None else distance_sum + dist
    if cfg.pos_embed not in ("none", "relative", *ROPE_POS_EMBEDS):
        sim = pos_embed_similarity(model)
        pos_summary: dict[str, Any] = {"grid": list(grid), "kind": cfg.pos_embed, **pos_embed_similarity_summary(sim)}
    else:
        kind = "" if cfg.pos_embed == "none" else "absolute "  # relative and rotary positions live in the attention
        sim, pos_summary = None, {"skipped": f"the model has no {kind}position embedding"}
    return Report(
        name=model_name(cfg),
        config=cfg.to_dict(),
        images=images,
        layers=chosen,
        rollout=torch.cat(maps),
        head_maps=torch.cat(head_maps),
        distances=distance_sum / len(images),
        pos_similarity=sim,
        pos_summary=pos_summary,
        filters=embedding_filter_components(model, k=components),
        grid=tuple(grid),
        stride=tuple(stride),
        query="class token" if prefix else "mean over patch tokens",
    )


def _draw(report: Report, out: Path) -> list[Path]:
    from . import figures

    title, pixels = report.name, report.images.pixels
    written = [figures.plot_rollout_overlay(pixels, report.rollout, out / "rollout.png", titles=report.images.names)]
    query = "class token" if report.query == "class token" else "mean over patches"
    for i, name in enumerate(report.images.names):
        written.append(
            figures.plot_attention_maps(
                report.head_maps[i],
                out / f"attention_{i + 1:02d}_{slug(name, 'image')}.png",
                layers=report.layers,
                image=pixels[i],
                title=f"{title}: attention of the {query} to each patch ({name})",
            )
        )
    dist_title = f"{title}: mean attention distance"
    written.append(
        figures.plot_mean_attention_distance(report.distances, out / "mean_attention_distance.png", title=dist_title)
    )
    if report.pos_similarity is not None:
        pos_title = f"{title}: position embedding similarity"
        written.append(
            figures.plot_pos_embed_similarity(report.pos_similarity, out / "pos_embed_similarity.png", title=pos_title)
        )
    pca = report.filters
    if pca.components.shape[1] in (1, 3):
        written.append(
            figures.plot_filter_components(
                pca.components,
                out / "embedding_filters.png",
                pca.explained_variance_ratio,
                title=f"{title}: embedding filters, principal components (variance explained)",
            )
        )
    return written
