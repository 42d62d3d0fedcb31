"""``attention`` (Figures 6 and 7, appendix D.7): what the ViT and the hybrid attend to, on every
seed's trained model and, as the control, on the same model untrained (its run's initialisation).

The runs are the shared baselines of each model and seed; the numbers come from
:mod:`.attention_measure` (per model and seed, then across seeds); this module turns them into the
section: a sentence per finding, each claimed only where its interval excludes zero
(:func:`verdict`), the table (:func:`table`) and the figures (:mod:`.attention_figures`).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from ...analysis.attention import object_fraction
from ...checkpoint.load import load_pretrained
from ..core.experiment import Experiment, Section, finite
from ..core.registry import register
from ..core.scoring import initial_model
from ..core.spec import RunSpec
from ..core.stats import Interval, mean_interval, paired_difference
from .attention_figures import plot_attention
from .attention_measure import NAMES, ROLES, STATES, load_test_images, measure, state_values, summarise_numbers

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
    meaning = _side(iv, reference, above, below) or neither
    return f"{subject}: {iv.estimate:{signed}.{digits}f}{unit} ({_ci(iv, digits)}), {meaning}"


def _side(iv: Interval | None, reference: float, above: str, below: str) -> str | None:
    """``above`` or ``below`` where the interval excludes ``reference`` on that side, else None."""
    return None if iv is None else above if iv.low > reference else below if iv.high < reference else None


def paired_claim(
    subject: str, a: list[Any], b: list[Any], name_a: str, name_b: str, unit: str, digits: int, scale: float = 1.0
) -> str:
    """A paired comparison by seed (:func:`vitkit.reproduce.core.stats.paired_difference`): a
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


def controlled_claim(
    subject: str,
    noun: str,
    trained: list[Any],
    untrained: list[Any],
    unit: str,
    digits: int,
    above: str,
    below: str,
    neither: str,
    reference: float = 0.0,
) -> str:
    """:func:`sign_claim` on the trained models, with its label conditioned on the untrained
    control: an effect (``above`` or ``below``) is put down to training only where the trained
    models show more of it than their own initialisations, paired by seed, by an interval that
    excludes zero; where the control is not distinguishable, the sentence says the control shows
    it as well.

    Args:
        subject: what the values are ("the ViT's depth trend (...)"); ", trained" is added.
        noun: what to call it when trained and untrained are compared ("the slope").
        trained: one value per seed of the trained models.
        untrained: the same measure of each seed's initialisation, in the same order.
        unit: the unit after each number.
        digits: decimals.
        above: what a trained interval above ``reference`` means.
        below: what one below it means.
        neither: what one that holds it means.
        reference: no effect (0 for a slope or a difference, 1 for a ratio against even spread).

    Returns:
        ``the ViT's depth trend, trained: +0.11 px a layer (95% CI ...), growing with depth;
        untrained +0.06 px a layer; trained minus untrained +0.05 px a layer (95% CI ...): the
        untrained control shows it as well, so it is not shown to come from training``; without a
        label to condition, the paired comparison of ``noun`` (:func:`paired_claim`).
    """
    own = sign_claim(f"{subject}, trained", trained, unit, digits, above, below, neither, reference)
    control = f"untrained {_fmt(_mean(untrained), digits, unit)}"
    label = _side(mean_interval(finite(trained)), reference, above, below)
    diff = paired_difference(trained, untrained)
    if label is None or diff is None:
        return f"{own}; {control}; " + paired_claim(noun, trained, untrained, TRAINED, UNTRAINED, unit, digits)
    against = f"trained minus untrained {diff.estimate:+.{digits}f}{unit} ({_ci(diff, digits)})"
    if diff.excludes_zero and (diff.estimate > 0) == (label == above):
        return f"{own}; {control}; {against}: beyond the untrained control, so training shaped it"
    if diff.excludes_zero:
        return f"{own}; {control}; {against}: less so than the untrained control, so it is not from training"
    return (
        f"{own}; {control}; {against}: the untrained control shows it as well, so it is not shown to come from training"
    )


TRAINED, UNTRAINED = "the trained model", "the untrained one"


def _fmt(value: float | None, digits: int, unit: str = "", scale: float = 1.0) -> str:
    return "—" if value is None else f"{scale * value:.{digits}f}{unit}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


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
        return state_values(entry, state, key)

    def both(key: str, subject: str, unit: str, digits: int, scale: float = 1.0) -> str:
        return paired_claim(subject, v("trained", key), v("untrained", key), TRAINED, UNTRAINED, unit, digits, scale)

    uniform = entry["trained"][0]["uniform"]
    span = [
        f"{_fmt(_mean(v(state, 'first_layer_nearest')), 1)} to {_fmt(_mean(v(state, 'first_layer_farthest')), 1)} px"
        for state in STATES
    ]
    out = [
        f"{entry['title']}, first layer: "
        + controlled_claim(f"the mean attention distance minus uniform attention's {uniform:.1f} px", "that offset",
                           v("trained", "first_layer_offset"), v("untrained", "first_layer_offset"), " px", 1,
                           "farther than uniform", "more local than uniform", "not distinguishable from uniform")
        + f"; its heads span {span[0]} trained and {span[1]} untrained, and "
        + both("first_layer_range", "that span", " px", 1)
        + "; "
        + both("max_deviation", "the largest distance of any head from uniform", " px", 1),
        _capital(
            controlled_claim(f"{name}'s depth trend (slope of the layer-mean distance on the layer)", "the slope",
                             v("trained", "depth_slope"), v("untrained", "depth_slope"), " px a layer", 2,
                             "growing with depth", "shrinking with depth", "no trend distinguishable")
        ),
        f"Patch queries give the class token {_fmt(_mean(v('trained', 'class_share_mean')), 1, '%', 100)} of their "
        f"attention in the trained {noun} (mean over heads and layers) and "
        f"{_fmt(_mean(v('untrained', 'class_share_mean')), 1, '%', 100)} in the untrained one; "
        + both("class_share_mean", "that share", " points", 1, scale=100),
    ]  # fmt: skip
    if any(r is not None for r in v("trained", "rollout_ratio")):
        out.append(
            _capital(
                controlled_claim(f"{name}'s class-token rollout mass on the object over the object's share of the "
                                 "image (1: spread evenly)", "the ratio", v("trained", "rollout_ratio"),
                                 v("untrained", "rollout_ratio"), "", 2, "concentrated on the object",
                                 "away from the object",
                                 "not distinguishable from even", reference=1.0)
            )
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
        a, b = state_values(h, "trained", "first_layer_offset"), state_values(vt, "trained", "first_layer_offset")
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
            + paired_claim("untrained, it", state_values(h, "untrained", "first_layer_offset"),
                           state_values(vt, "untrained", "first_layer_offset"), "the hybrid", "the ViT", " px", 1)
        )  # fmt: skip
    if "vit" in models:
        vt = models["vit"]
        if any(c is not None for c in state_values(vt, "trained", "pos_contrast")):
            parts.append(
                controlled_claim("The ViT's position embeddings (neighbouring patches' cosine similarity minus far "
                                 "patches')", "the contrast", state_values(vt, "trained", "pos_contrast"),
                                 state_values(vt, "untrained", "pos_contrast"), "", 2, "the 2-D grid encoded",
                                 "neighbours less alike than far patches", "no 2-D structure distinguishable")
            )  # fmt: skip
        k = numbers.get("top_components", 4)
        trained, untrained = (_fmt(_mean(state_values(vt, s, "filter_top")), 1, "%", 100) for s in STATES)
        parts.append(
            f"The top {k} principal components explain {trained} of the variance of the ViT's patch-embedding "
            f"filters trained and {untrained} untrained; "
            + paired_claim("that share", state_values(vt, "trained", "filter_top"),
                           state_values(vt, "untrained", "filter_top"), TRAINED, UNTRAINED, " points", 1, scale=100)
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


@register
class Attention(Experiment):
    name = "attention"

    def runs(self) -> list[RunSpec]:
        return [self.base_spec(self.cfg[role], seed) for role in ROLES for seed in self.seeds]

    def models_of(self, role: str, seed: int) -> tuple[Any, Any]:
        """The ``role``'s model of ``seed`` trained (its best minival checkpoint) and untrained
        (its run's initialisation)."""
        spec = self.base_spec(self.cfg[role], seed)
        trained = load_pretrained(self.suite.run_dir(spec) / "best.safetensors", allow_nonfinite=True)
        return trained, initial_model(spec.recipe, self.suite.info)

    def object_mask(self, images: Any, grid: tuple[int, int]) -> tuple[torch.Tensor | None, str | None]:
        """The images' object fraction per token, or None and the reason when the data has no blank background."""
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
