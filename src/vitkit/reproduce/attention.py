"""``attention`` (Figures 6 and 7, appendix D.7): what the ViT and the hybrid attend to, measured
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

Across seeds (:func:`summarise_numbers`, :func:`verdict`): each quantity's mean with its t
interval, trained against untrained and the hybrid against the ViT paired by seed
(:mod:`.stats`). A statement is made only where an interval excludes zero.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from .experiments import Experiment, Section, finite
from .spec import RunSpec
from .stats import Interval, mean_interval, paired_difference

ROLES = ("vit", "hybrid")  # the models, by their key in attention.yaml
STATES = ("trained", "untrained")
NAMES = {"vit": "ViT", "hybrid": "hybrid"}  # for sentences: "the trained ViT"


def load_test_images(suite: Any, model: Any, count: int) -> Any:
    """The first ``count`` test images as :class:`vitkit.preprocessing.LoadedImages` for ``model``.

    Args:
        suite: the :class:`~vitkit.reproduce.spec.Suite` (its data and data options).
        model: the model whose preprocessing (size, normalisation, channels) the inputs follow.
        count: how many images (fewer if the test split is smaller).

    Returns:
        The images: ``pixels`` (uint8 at the model's size, for pictures and the object mask)
        and ``inputs`` (normalised, for the model).
    """
    from ..data import TransformConfig, build_dataset, eval_transform
    from ..data.transforms import match_channels, resize
    from ..eval.features import model_preprocessing
    from ..preprocessing import LoadedImages

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
    from ..analysis.attention import (
        attention_rollout,
        collect_attention,
        mean_attention_distance,
        patch_distances,
        prefix_attention_share,
        rollout_object_ratio,
        rollout_patch_weights,
    )
    from ..analysis.embeddings import embedding_filter_components, pos_embed_similarity, pos_embed_similarity_summary

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


def _values(entry: dict[str, Any], state: str, key: str) -> list[Any]:
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
        :meth:`vitkit.reproduce.stats.Interval.to_dict`, or None below two seeds.
    """
    out: dict[str, Any] = {"models": models}
    for entry in models.values():
        summary = {}
        for state in STATES:
            seeds = entry[state]
            layers = len(seeds[0]["layer_offset"])
            ranked_d, ranked_s = _ranked(entry, state)
            summary[state] = {
                **{k: _iv(_values(entry, state, k)) for k in _SCALARS},
                "layer_offset": [_iv([s["layer_offset"][i] for s in seeds]) for i in range(layers)],
                "rollout_above_even": _iv(
                    [None if r is None else r - 1 for r in _values(entry, state, "rollout_ratio")]
                ),
                "ranked_distances": ranked_d,
                "ranked_class_share": ranked_s,
            }
        entry["summary"] = summary
        entry["trained_minus_untrained"] = {
            k: _paired_iv(_values(entry, "trained", k), _values(entry, "untrained", k)) for k in _SCALARS
        }
    if all(r in models for r in ROLES):
        out["hybrid_minus_vit"] = {
            state: _paired_iv(
                _values(models["hybrid"], state, "first_layer_offset"),
                _values(models["vit"], state, "first_layer_offset"),
            )
            for state in STATES
        }
    return out


# ----------------------------------------------------------------------------------------------
# The sentences.


def _ci(iv: Interval, digits: int) -> str:
    f = f"{{:.{digits}f}}"
    seeds = "seed" if iv.n == 1 else "seeds"
    return f"{100 * iv.level:.0f}% CI {f.format(iv.low)} to {f.format(iv.high)}, {iv.n} {seeds}"


def _mean(values: list[Any]) -> float | None:
    ok = finite(values)
    return statistics.fmean(ok) if ok else None


def sign_claim(
    subject: str,
    values: list[Any],
    unit: str,
    digits: int,
    above: str,
    below: str,
    neither: str,
    reference: float = 0.0,
) -> str:
    """A clause on whether the mean of ``values`` lies above or below ``reference``: said only
    when its 95% t interval over seeds excludes the reference.

    Args:
        subject: what the values are ("the trained ViT's depth trend").
        values: one per seed (non-finite ones left out).
        unit: the unit after each number (`` px a layer``).
        digits: decimals.
        above: what an interval above the reference means ("growing with depth").
        below: what one below it means.
        neither: what one that holds it means ("no trend distinguishable").
        reference: no effect (0 for a difference or a slope, 1 for a ratio against even spread).

    Returns:
        ``the trained ViT's depth trend: +1.20 px a layer (95% CI 0.40 to 2.00, 3 seeds), growing
        with depth``; with fewer than two seeds the value alone, said to be too few.
    """
    ok = finite(values)
    signed = "+" if reference == 0 else ""
    iv = mean_interval(ok)
    if iv is None:
        if not ok:
            return f"{subject}: no finite value"
        return f"{subject}: {ok[0]:{signed}.{digits}f}{unit} from 1 seed, too few for an interval"
    meaning = above if iv.low > reference else below if iv.high < reference else neither
    return f"{subject}: {iv.estimate:{signed}.{digits}f}{unit} ({_ci(iv, digits)}), {meaning}"


def paired_claim(
    subject: str, a: list[Any], b: list[Any], name_a: str, name_b: str, unit: str, digits: int, scale: float = 1.0
) -> str:
    """A paired comparison by seed (:func:`vitkit.reproduce.stats.paired_difference`): a
    difference is said only when its 95% interval excludes zero, "not distinguishable" otherwise.

    Args:
        subject: what is compared ("the slope").
        a: one arm's values, one per seed.
        b: the other's, in the same seed order.
        name_a: the first arm ("the trained model").
        name_b: the second ("the untrained one").
        unit: the unit after each number.
        digits: decimals.
        scale: the factor to the sentence's units (100: shares to points).

    Returns:
        ``the slope is higher in the trained model than in the untrained one by 1.10 px a layer
        (95% CI 0.30 to 1.90, 3 seeds)``, or ``the slope is not distinguishable between ...``.
    """
    diff = paired_difference(a, b)
    if diff is None:
        return f"{subject} is not weighed between {name_a} and {name_b} (fewer than 2 seeds with values on both)"
    diff = diff.scaled(scale)
    if diff.excludes_zero:
        more = "higher" if diff.estimate > 0 else "lower"
        size = f"{abs(diff.estimate):.{digits}f}{unit}"
        return f"{subject} is {more} in {name_a} than in {name_b} by {size} ({_ci(diff, digits)})"
    return (
        f"{subject} is not distinguishable between {name_a} and {name_b} "
        f"(difference {diff.estimate:+.{digits}f}{unit}; {_ci(diff, digits)})"
    )


def _fmt(value: float | None, digits: int, unit: str = "", scale: float = 1.0) -> str:
    return "—" if value is None else f"{scale * value:.{digits}f}{unit}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


TRAINED, UNTRAINED = "the trained model", "the untrained one"


def model_sentences(role: str, entry: dict[str, Any]) -> list[str]:
    """The sentences on one model: locality against uniform attention, the head spread, the
    depth trend, the class token's share and the rollout on the object, trained against untrained.

    Args:
        role: ``vit`` or ``hybrid``.
        entry: the model's numbers (``title``, per-seed ``trained`` and ``untrained``).

    Returns:
        One sentence per topic, without the final full stop.
    """
    noun = NAMES.get(role, role)
    name = f"the {noun}"

    def v(state: str, key: str) -> list[Any]:
        return _values(entry, state, key)

    def both(key: str, subject: str, unit: str, digits: int, scale: float = 1.0) -> str:
        return paired_claim(subject, v("trained", key), v("untrained", key), TRAINED, UNTRAINED, unit, digits, scale)

    uniform = entry["trained"][0]["uniform"]
    span = [
        f"{_fmt(_mean(v(state, 'first_layer_nearest')), 1)} to {_fmt(_mean(v(state, 'first_layer_farthest')), 1)} px"
        for state in STATES
    ]
    out = [
        f"{entry['title']}, first layer: "
        + sign_claim(f"the mean attention distance minus uniform attention's {uniform:.1f} px, trained",
                     [s["layer_offset"][0] for s in entry["trained"]], " px", 1, "farther than uniform",
                     "more local than uniform", "not distinguishable from uniform")
        + f"; its heads span {span[0]} trained and {span[1]} untrained, and "
        + both("first_layer_range", "that span", " px", 1)
        + "; "
        + both("max_deviation", "the largest distance of any head from uniform", " px", 1),
        _capital(
            sign_claim(f"{name}'s depth trend (slope of the layer-mean distance on the layer), trained",
                       v("trained", "depth_slope"), " px a layer", 2, "growing with depth", "shrinking with depth",
                       "no trend distinguishable")
        )
        + f"; untrained {_fmt(_mean(v('untrained', 'depth_slope')), 2, ' px a layer')}; "
        + both("depth_slope", "the slope", " px a layer", 2),
        f"Patch queries give the class token {_fmt(_mean(v('trained', 'class_share_mean')), 1, '%', 100)} of their "
        f"attention in the trained {noun} (mean over heads and layers) and "
        f"{_fmt(_mean(v('untrained', 'class_share_mean')), 1, '%', 100)} in the untrained one; "
        + both("class_share_mean", "that share", " points", 1, scale=100),
    ]  # fmt: skip
    if any(r is not None for r in v("trained", "rollout_ratio")):
        out.append(
            _capital(
                sign_claim(f"{name}'s class-token rollout mass on the object over the object's share of the image "
                           "(1: spread evenly), trained", v("trained", "rollout_ratio"), "", 2,
                           "concentrated on the object", "away from the object", "not distinguishable from even",
                           reference=1.0)
            )
            + f"; untrained {_fmt(_mean(v('untrained', 'rollout_ratio')), 2)}; "
            + both("rollout_ratio", "the ratio", "", 2)
        )  # fmt: skip
    return out


def verdict(numbers: dict[str, Any]) -> str:
    """The section's sentences, computed from :func:`summarise_numbers`'s numbers.

    Args:
        numbers: as :func:`summarise_numbers` returns them, with ``top_components`` and
            ``object_note`` (why the rollout on the object was not measured, or None).

    Returns:
        The text of the verdict.
    """
    models = numbers["models"]
    parts = [s for role in ROLES if role in models for s in model_sentences(role, models[role])]
    if "vit" in models and "hybrid" in models:
        h, vt = models["hybrid"], models["vit"]
        a, b = _values(h, "trained", "first_layer_offset"), _values(vt, "trained", "first_layer_offset")
        diff = paired_difference(a, b)
        paper = ""
        if diff is not None and diff.excludes_zero:
            paper = (
                ": the hybrid's first layer is less local, as in appendix D.7"
                if diff.estimate > 0
                else ": the hybrid's first layer is more local, unlike appendix D.7"
            )
        parts.append(
            paired_claim("The first layer's mean attention distance minus uniform attention's, trained,", a, b,
                         "the hybrid", "the ViT", " px", 1)
            + paper
            + "; "
            + paired_claim("untrained, it", _values(h, "untrained", "first_layer_offset"),
                           _values(vt, "untrained", "first_layer_offset"), "the hybrid", "the ViT", " px", 1)
        )  # fmt: skip
    if "vit" in models:
        vt = models["vit"]
        if any(c is not None for c in _values(vt, "trained", "pos_contrast")):
            parts.append(
                sign_claim("The ViT's position embeddings, trained: neighbouring patches' cosine similarity minus "
                           "far patches'", _values(vt, "trained", "pos_contrast"), "", 2, "the 2-D grid encoded",
                           "neighbours less alike than far patches", "no 2-D structure distinguishable")
                + f"; untrained {_fmt(_mean(_values(vt, 'untrained', 'pos_contrast')), 2)}; "
                + paired_claim("the contrast", _values(vt, "trained", "pos_contrast"),
                               _values(vt, "untrained", "pos_contrast"), TRAINED, UNTRAINED, "", 2)
            )  # fmt: skip
        k = numbers.get("top_components", 4)
        trained, untrained = (_fmt(_mean(_values(vt, s, "filter_top")), 1, "%", 100) for s in STATES)
        parts.append(
            f"The top {k} principal components explain {trained} of the variance of the ViT's patch-embedding "
            f"filters trained and {untrained} untrained; "
            + paired_claim("that share", _values(vt, "trained", "filter_top"), _values(vt, "untrained", "filter_top"),
                           TRAINED, UNTRAINED, " points", 1, scale=100)
        )  # fmt: skip
    if numbers.get("object_note"):
        parts.append(numbers["object_note"])
    return ". ".join(parts) + "."


def table(numbers: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The section's table: per model, weights and layer, each head's distance next to its
    class-token share (heads ranked by distance), and the layer mean's offset from uniform.

    Args:
        numbers: from :func:`summarise_numbers`.

    Returns:
        The header and the rows.
    """
    header = [
        "model",
        "weights",
        "layer",
        "distance per head, nearest to farthest (px)",
        "class-token share of those heads (%)",
        "layer mean minus uniform (px)",
    ]
    rows = []
    for entry in numbers["models"].values():
        for state in STATES:
            summary = entry["summary"][state]
            for layer, (dist, share) in enumerate(zip(summary["ranked_distances"], summary["ranked_class_share"])):
                iv = summary["layer_offset"][layer]
                if iv is None:
                    m = _mean([s["layer_offset"][layer] for s in entry[state]])
                    offset = "—" if m is None else f"{m:+.1f} (1 seed, no interval)"
                else:
                    offset = f"{iv['estimate']:+.1f} ({_ci(Interval(**iv), 1)})"
                rows.append(
                    [
                        entry["title"],
                        state,
                        str(layer + 1),
                        " / ".join(f"{d:.1f}" for d in dist),
                        " / ".join(f"{100 * c:.0f}" for c in share),
                        offset,
                    ]
                )
    return header, rows


# ----------------------------------------------------------------------------------------------
# The experiment.


class Attention(Experiment):
    name = "attention"

    def runs(self) -> list[RunSpec]:
        return [self.base_spec(self.cfg[role], seed) for role in ROLES for seed in self.seeds]

    def models_of(self, role: str, seed: int) -> tuple[Any, Any]:
        """The ``role``'s model of ``seed`` trained (its best minival checkpoint) and untrained
        (its run's initialisation)."""
        from ..checkpoint.load import load_pretrained
        from .runner import initial_model

        spec = self.base_spec(self.cfg[role], seed)
        trained = load_pretrained(self.suite.run_dir(spec) / "best.safetensors", allow_nonfinite=True)
        return trained, initial_model(spec.recipe, self.suite.info)

    def object_mask(self, images: Any, grid: tuple[int, int]) -> tuple[torch.Tensor | None, str | None]:
        """The images' object fraction per token, or None and the reason when the data has no blank background."""
        from ..analysis.attention import object_fraction

        fraction = object_fraction(images.pixels, grid, float(self.cfg["object_threshold"]))
        share = float(fraction.mean())
        if 0 < share <= float(self.cfg["max_object_share"]):
            return fraction, None
        return None, (
            f"The rollout's mass on the object is not measured: pixels above {self.cfg['object_threshold']} "
            f"cover {100 * share:.0f}% of these test images, so they have no blank background to tell the "
            "object from"
        )

    def measure_all(self) -> tuple[dict[str, Any], dict[str, Any], str | None]:
        """Every model of every seed, trained and untrained; the pictures' material of the first
        seed's trained ViT; why the rollout on the object was not measured (or None)."""
        count, keep, k = int(self.cfg["images"]), int(self.cfg["rollout_images"]), int(self.cfg["top_components"])
        models: dict[str, Any] = {}
        pictures: dict[str, Any] = {}
        note = None
        for role in ROLES:
            entry: dict[str, Any] = {"title": self.suite.model_title(self.cfg[role]), "trained": [], "untrained": []}
            images = fraction = None
            for seed in self.seeds:
                trained, untrained = self.models_of(role, seed)
                if images is None:
                    images = load_test_images(self.suite, trained, count)
                    fraction, why = self.object_mask(images, tuple(trained.cfg.grid_size))
                    note = note or why
                for state, model in (("trained", trained), ("untrained", untrained)):
                    shown = role == "vit" and state == "trained" and not pictures  # the first seed's trained ViT
                    m = measure(model, images, fraction, k, keep=keep if shown else 0)
                    entry[state].append({"seed": seed, **m.numbers})
                    if shown:
                        pictures = {"measured": m, "images": images, "title": entry["title"]}
            models[role] = entry
        return models, pictures, note

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        from .figures import plot_attention

        models, pictures, note = self.measure_all()
        numbers = summarise_numbers(models)
        numbers.update(
            images=int(self.cfg["images"]),
            top_components=int(self.cfg["top_components"]),
            object_threshold=self.cfg["object_threshold"],
            object_note=note,
            seeds=list(self.seeds),
        )
        header, rows = table(numbers)
        section = self.section(header, rows, numbers, verdict(numbers))
        section.figures.extend(plot_attention(numbers, pictures, self.suite.out / "figures"))
        vit = models["vit"]["trained"][0]
        gh, gw = vit["grid"]
        section.caption = (
            f"Mean attention distance per head in input pixels over {len(pictures['images'])} test images, heads "
            f"ranked by distance within each seed and averaged over {len(self.seeds)} seed(s), next to the share of "
            f"attention patch queries give the class token; uniform attention over the {gh}x{gw} token grid would give "
            f"{vit['uniform']:.1f} px; untrained: the same models at their runs' initialisation"
        )
        return section
