"""The numbers of ``attention`` (Figures 6 and 7, appendix D.7): what the ViT and the hybrid attend to, measured
on every seed's trained model and, as the control, on the same model untrained (its run's
initialisation, seeded as the run is).

Per seed and model, over the experiment's test images (:func:`measure`):

* per head, the mean attention distance (:func:`vitkit.analysis.attention.mean_attention_distance`)
  next to the share of attention patch queries give the class token
  (:func:`~vitkit.analysis.attention.prefix_attention_share`), and the distance uniform
  attention over the token grid would give;
* the depth trend: the least-squares slope of the layer-mean distance on the layer index;
* the learned position embeddings' similarity of neighbouring patches minus that of far ones;
* the variance share of the patch-embedding filters' top principal components;
* attention rollout judged by a number: the class token's rollout mass on the object's pixels
  against the object's share of the image (1: spread evenly; above 1: on the object). The object
  is where the raw test image is not blank (Fashion-MNIST's background is zero); data without a
  blank background is not measured so.

Across seeds (:func:`summarise_numbers`; the sentences are :mod:`.attention`'s): each quantity's mean with its t
interval, trained against untrained and the hybrid against the ViT paired by seed
(:mod:`vitkit.reproduce.core.stats`). A statement is made only where an interval excludes zero.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from ...analysis.attention import (
    attention_rollout,
    collect_attention,
    mean_attention_distance,
    patch_distances,
    prefix_attention_share,
    rollout_object_ratio,
    rollout_patch_weights,
)
from ...analysis.embeddings import embedding_filter_components, pos_embed_similarity, pos_embed_similarity_summary
from ...data import TransformConfig, build_dataset, eval_transform
from ...data.transforms import match_channels, resize
from ...eval.features import model_preprocessing
from ...preprocessing import LoadedImages
from ..core.experiment import finite
from ..core.stats import mean_interval, paired_difference

ROLES = ("vit", "hybrid")  # the models, by their key in attention.yaml
STATES = ("trained", "untrained")
NAMES = {"vit": "ViT", "hybrid": "hybrid"}  # for sentences: "the trained ViT"


def load_test_images(suite: Any, model: Any, count: int) -> Any:
    """The first ``count`` test images as :class:`vitkit.preprocessing.LoadedImages` for ``model``.

    Args:
        suite: the :class:`~vitkit.reproduce.core.spec.Suite` (its data and data options).
        model: the model whose preprocessing (size, normalisation, channels) the inputs follow.
        count: how many images (fewer if the test split is smaller).

    Returns:
        The images: ``pixels`` (uint8 at the model's size, for pictures and the object mask)
        and ``inputs`` (normalised, for the model).
    """
    test = build_dataset(suite.data, "test", **suite.data_options())
    x, _ = next(test.batches(count))
    pre = model_preprocessing(model)
    cfg = TransformConfig(img_size=pre.img_size, crop="none", flip=False, mean=pre.mean, std=pre.std)
    inputs = eval_transform(match_channels(x, model.cfg.in_chans).to(torch.uint8), cfg)
    pixels = resize(x.float(), pre.img_size).round().clamp(0, 255).to(torch.uint8)  # (B, C, H, W)
    pixels = pixels[:, 0] if pixels.shape[1] == 1 else pixels.permute(0, 2, 3, 1)  # (B, H, W[, C])
    return LoadedImages([f"test {i}" for i in range(len(x))], pixels.numpy(), inputs)


# ----------------------------------------------------------------------------------------------
# One model, one seed.


def layer_slope(values: list[float]) -> float:
    """The least-squares slope of ``values`` on their index (0, 1, ...): the depth trend.

    Args:
        values: one number per layer.

    Returns:
        The slope per layer; nan with fewer than two layers or a value that is not finite.
    """
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return math.nan
    mx, my = (len(values) - 1) / 2, statistics.fmean(values)
    sxx = sum((i - mx) ** 2 for i in range(len(values)))
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sxx


def seed_numbers(
    distances: torch.Tensor,
    class_share: torch.Tensor,
    uniform: float,
    *,
    pos: dict[str, Any] | None = None,
    filter_variance: list[float] | None = None,
    top_components: int = 4,
    object_share: float | None = None,
    rollout_ratios: list[float] | None = None,
) -> dict[str, Any]:
    """One model's numbers for one seed, JSON-ready, from what :func:`measure` collected.

    Args:
        distances: mean attention distance per layer and head, (L, H), in input pixels.
        class_share: share of attention patch queries give the class token, (L, H).
        uniform: the distance uniform attention over the token grid gives.
        pos: :func:`vitkit.analysis.embeddings.pos_embed_similarity_summary`, or None (no
            position embedding).
        filter_variance: the explained variance ratios of the filters' principal components.
        top_components: how many of them :data:`filter_top` adds up.
        object_share: the mean object fraction of the images, or None (not measured).
        rollout_ratios: per image, rollout mass on the object over the object's share, or None.

    Returns:
        ``distances``, ``class_share`` (lists), ``uniform``, ``layer_mean``, ``layer_offset``
        (layer mean minus uniform), ``depth_slope`` (px a layer), ``first_layer`` and
        ``first_layer_offset`` (its mean, and that minus uniform),
        ``first_layer_nearest``/``_farthest``/``_range`` (its heads), ``max_deviation`` (the
        head farthest from uniform, absolute px), ``class_share_mean``, ``pos``,
        ``pos_contrast`` (neighbours minus far), ``filter_variance``, ``filter_top``,
        ``object_share`` and ``rollout_ratio`` (mean over images).
    """
    d = distances.double()
    layer_mean = d.mean(dim=1).tolist()
    first = d[0]
    contrast = None
    if pos and pos.get("neighbours") is not None and pos.get("far") is not None:
        contrast = float(pos["neighbours"]) - float(pos["far"])
    variance = [float(v) for v in (filter_variance or [])]
    ratios = finite(rollout_ratios or [])
    return {
        "distances": [[float(v) for v in row] for row in d.tolist()],
        "class_share": [[float(v) for v in row] for row in class_share.double().tolist()],
        "uniform": float(uniform),
        "layer_mean": layer_mean,
        "layer_offset": [m - uniform for m in layer_mean],
        "depth_slope": layer_slope(layer_mean),
        "first_layer": layer_mean[0],
        "first_layer_offset": layer_mean[0] - uniform,
        "first_layer_nearest": float(first.min()),
        "first_layer_farthest": float(first.max()),
        "first_layer_range": float(first.max() - first.min()),
        "max_deviation": float((d - uniform).abs().max()),
        "class_share_mean": float(class_share.double().mean()),
        "pos": pos,
        "pos_contrast": contrast,
        "filter_variance": variance,
        "filter_top": sum(variance[:top_components]) if variance else None,
        "object_share": object_share,
        "rollout_ratio": statistics.fmean(ratios) if ratios else None,
    }


@dataclass
class Measured:
    """One model's analysis on one seed: the numbers and what the pictures need."""

    numbers: dict[str, Any]  # from :func:`seed_numbers`
    rollout: torch.Tensor  # (k, gh, gw) the first images' class-token rollout, scaled to [0, 1] per image
    ratios: list[float]  # their rollout mass on the object over its share (empty when not measured)
    similarity: torch.Tensor | None  # (gh, gw, gh, gw) position-embedding cosine similarity
    filters: Any  # :class:`vitkit.analysis.embeddings.FilterPCA`, or None where it failed (diverged weights)


def measure(
    model: Any,
    images: Any,
    fraction: torch.Tensor | None,
    top_components: int = 4,
    keep: int = 0,
    batch_size: int = 32,
) -> Measured:
    """Every analysis of ``model`` (a vitkit ViT or hybrid) on ``images``.

    Args:
        model: the model, trained or not.
        images: :class:`vitkit.preprocessing.LoadedImages`.
        fraction: the object fraction per token of each image (:func:`vitkit.analysis.attention.object_fraction`),
            or None to leave the rollout-on-object measure out.
        top_components: principal components of the filters whose variance share is reported.
        keep: rollout maps kept for pictures (the first images).
        batch_size: images per forward pass.

    Returns:
        The numbers (:func:`seed_numbers`) and the pictures' material.
    """
    cfg = model.cfg
    grid, stride, prefix = tuple(cfg.grid_size), tuple(cfg.total_stride), cfg.num_prefix_tokens
    dist_sum: torch.Tensor | None = None
    share_sum: torch.Tensor | None = None
    ratios, maps = [], []
    for start in range(0, len(images), batch_size):
        x = images.inputs[start : start + batch_size]
        att = collect_attention(model, x)  # L x (b, H, N, N)
        d = mean_attention_distance(att, grid, stride, prefix) * len(x)  # (L, H)
        s = prefix_attention_share(att, prefix) * len(x)  # (L, H)
        dist_sum = d if dist_sum is None else dist_sum + d
        share_sum = s if share_sum is None else share_sum + s
        weights = rollout_patch_weights(attention_rollout(att), grid, prefix)  # (b, P)
        if fraction is not None:
            ratios += rollout_object_ratio(weights, fraction[start : start + len(x)]).tolist()
        if start < keep:
            maps.append(weights[: keep - start])
    if dist_sum is None or share_sum is None:
        raise ValueError("no images to analyse")
    rollout = torch.cat(maps) if maps else torch.zeros(0, grid[0] * grid[1], dtype=torch.float64)  # (k, P)
    lo, hi = rollout.amin(dim=-1, keepdim=True), rollout.amax(dim=-1, keepdim=True)
    rollout = ((rollout - lo) / (hi - lo).clamp_min(1e-12)).reshape(-1, *grid).float()  # (k, gh, gw)
    similarity, pos = None, None
    if cfg.pos_embed not in ("none", "relative"):
        similarity = pos_embed_similarity(model)
        pos = pos_embed_similarity_summary(similarity)
    try:
        filters = embedding_filter_components(model)
        variance = filters.explained_variance_ratio.tolist()
    except (ValueError, RuntimeError):  # weights that are not finite (a diverged run) have no decomposition
        filters, variance = None, [math.nan]
    share = None if fraction is None else float(fraction.double().mean())
    numbers = seed_numbers(
        dist_sum / len(images), share_sum / len(images), float(patch_distances(grid, stride).mean()),
        pos=pos, filter_variance=variance, top_components=top_components, object_share=share,
        rollout_ratios=ratios if fraction is not None else None,
    )  # fmt: skip
    numbers["grid"], numbers["stride"] = list(grid), list(stride)
    return Measured(numbers, rollout, ratios[:keep], similarity, filters)


# ----------------------------------------------------------------------------------------------
# Across seeds.


def state_values(entry: dict[str, Any], state: str, key: str) -> list[Any]:
    """One number per seed of ``entry`` (a model of ``numbers["models"]``)."""
    return [s.get(key) for s in entry[state]]


def _iv(values: list[Any]) -> dict[str, Any] | None:
    iv = mean_interval(values)
    return None if iv is None else iv.to_dict()


def _paired_iv(a: list[Any], b: list[Any]) -> dict[str, Any] | None:
    iv = paired_difference(a, b)
    return None if iv is None else iv.to_dict()


_SCALARS = ("depth_slope", "first_layer", "first_layer_offset", "first_layer_range", "max_deviation",
            "class_share_mean", "pos_contrast", "filter_top", "rollout_ratio")  # fmt: skip


def _ranked(entry: dict[str, Any], state: str) -> tuple[list[list[float]], list[list[float]]]:
    """Per layer, the heads ordered nearest to farthest within each seed, then averaged over seeds
    by rank (heads have no identity across seeds); the class-token share of the same heads."""
    seeds = entry[state]
    layers, heads = len(seeds[0]["distances"]), len(seeds[0]["distances"][0])
    dist = [[[] for _ in range(heads)] for _ in range(layers)]
    share = [[[] for _ in range(heads)] for _ in range(layers)]
    for s in seeds:
        for layer in range(layers):
            d, c = s["distances"][layer], s["class_share"][layer]
            order = sorted(range(heads), key=lambda h: d[h] if math.isfinite(d[h]) else math.inf)
            for rank, h in enumerate(order):
                dist[layer][rank].append(d[h])
                share[layer][rank].append(c[h])

    def means(cells: list[list[list[float]]]) -> list[list[float]]:
        return [[statistics.fmean(finite(v)) if finite(v) else math.nan for v in row] for row in cells]

    return means(dist), means(share)


def summarise_numbers(models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Intervals over seeds for every model and state, trained against untrained, and the
    hybrid against the ViT, all paired by seed.

    Args:
        models: per role (``vit``, ``hybrid``), ``title`` and the per-seed numbers
            (:func:`seed_numbers`) of the ``trained`` and ``untrained`` model, in seed order.

    Returns:
        ``models`` with, per role, ``summary`` (per state: the interval of each scalar, of each
        layer's offset from uniform and of the rollout ratio minus 1; the heads ranked by
        distance) and ``trained_minus_untrained`` (paired intervals); and ``hybrid_minus_vit``
        (the first layer's mean distance minus uniform, per state). Intervals are
        :meth:`vitkit.reproduce.core.stats.Interval.to_dict`, or None below two seeds.
    """
    out: dict[str, Any] = {"models": models}
    for entry in models.values():
        summary = {}
        for state in STATES:
            seeds = entry[state]
            layers = len(seeds[0]["layer_offset"])
            ranked_d, ranked_s = _ranked(entry, state)
            summary[state] = {
                **{k: _iv(state_values(entry, state, k)) for k in _SCALARS},
                "layer_offset": [_iv([s["layer_offset"][i] for s in seeds]) for i in range(layers)],
                "rollout_above_even": _iv(
                    [None if r is None else r - 1 for r in state_values(entry, state, "rollout_ratio")]
                ),
                "ranked_distances": ranked_d,
                "ranked_class_share": ranked_s,
            }
        entry["summary"] = summary
        entry["trained_minus_untrained"] = {
            k: _paired_iv(state_values(entry, "trained", k), state_values(entry, "untrained", k)) for k in _SCALARS
        }
    if all(r in models for r in ROLES):
        out["hybrid_minus_vit"] = {
            state: _paired_iv(
                state_values(models["hybrid"], state, "first_layer_offset"),
                state_values(models["vit"], state, "first_layer_offset"),
            )
            for state in STATES
        }
    return out
