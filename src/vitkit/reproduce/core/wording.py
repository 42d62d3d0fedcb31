"""Rules that turn the report's numbers into words, each a template over named numbers that says
what its evidence is, so that no sentence claims more than its numbers show:

- :func:`stepwise`: a direction over a range of sizes is claimed for the whole range only where
  every step of it shows that direction by its own interval; otherwise the sentence says at
  which steps it holds and at which it is not distinguishable.
- :func:`convergence` and :func:`not_a_test`: an arm whose runs had not finished improving (the
  best minival checkpoint at the last evaluation, or the minival still rising over the last
  quarter of the steps) cannot agree or disagree with the paper: the comparison that rests on
  it is "not a test".
- :func:`primary_and_holm`: one primary contrast per experiment at the plain level; the others
  are said with Holm-adjusted p-values, and a difference among them is claimed only where the
  adjusted p stays below the level.
- :func:`beyond_control`: an effect seen in trained models is attributed to training only
  where it exceeds the same measure on the untrained control by an interval that excludes zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import stats

RISING = 0.005  # minival top-1 gained over the last quarter of the steps that counts as still rising


def _fmt(iv: stats.Interval, digits: int, unit: str) -> str:
    return iv.text(digits, unit) + f", {iv.n} seeds"


def step_directions(
    steps: Sequence[tuple[str, str, stats.Interval | None]], down: str = "falls", up: str = "rises"
) -> list[str]:
    """What each step of a range shows: ``down`` or ``up`` where its interval excludes zero,
    "not distinguishable" where it holds zero, "not weighed" where there is no interval.

    Args:
        steps: each step as (from, to, the paired change over it).
        down: the word for a change below zero.
        up: the word for a change above zero.

    Returns:
        One word a step.
    """
    return [
        "not weighed" if iv is None
        else (down if iv.estimate < 0 else up) if iv.excludes_zero
        else "not distinguishable"
        for _, _, iv in steps
    ]  # fmt: skip


def stepwise(
    steps: Sequence[tuple[str, str, stats.Interval | None]],
    quantity: str,
    down: str = "falls",
    up: str = "rises",
    digits: int = 2,
    unit: str = "",
) -> str:
    """A quantity's direction over a range of sizes, claimed for the range only where each step
    shows it.

    Args:
        steps: each step in order as (from, to, the paired change over it), the change None where
            it is not weighed.
        quantity: what changes ("the ViT/ResNet error ratio").
        down: the word for a change below zero.
        up: the word for a change above zero.
        digits: decimals of the changes.
        unit: the changes' unit.

    Returns:
        One sentence: "X falls at every step from A to C (A to B: ...; B to C: ...)", or "X
        falls from A to B (...) and is not distinguishable from B to C (...)", or "no step of X
        is distinguishable from no change (...)".
    """
    if not steps:
        return f"{quantity} is not weighed over a range (one size only)."
    words = step_directions(steps, down, up)
    evidence = "; ".join(
        f"{a} to {b}: " + ("not weighed" if iv is None else _fmt(iv, digits, unit)) for a, b, iv in steps
    )
    first, last = steps[0][0], steps[-1][1]
    if len(set(words)) == 1 and words[0] in (down, up):
        every = "at every step" if len(steps) > 1 else "over the step"
        return f"{quantity} {words[0]} {every} from {first} to {last} (paired by seed; {evidence})."
    if all(w in ("not distinguishable", "not weighed") for w in words):
        return f"no step of {quantity} is distinguishable from no change ({evidence})."
    parts = []
    for (a, b, _), w in zip(steps, words):
        clause = f"{w} from {a} to {b}" if w in (down, up) else f"is {w} from {a} to {b}"
        parts.append(clause)
    return (
        f"{quantity} {', '.join(parts[:-1])} and {parts[-1]} (paired by seed; {evidence}): not a trend over the range."
    )


@dataclass(frozen=True)
class Convergence:
    """Whether an arm's runs had finished improving.

    Attributes:
        runs: the runs with a minival curve.
        best_at_end: runs whose best minival came at their last evaluation.
        rising: runs whose minival rose by more than :data:`RISING` over the last quarter.
    """

    runs: int
    best_at_end: int
    rising: int

    @property
    def converged(self) -> bool:
        """Fewer than half the runs either ended on their best evaluation or were still rising."""
        return self.runs > 0 and 2 * max(self.best_at_end, self.rising) < self.runs

    def evidence(self) -> str:
        """The counts behind the verdict, for the sentence.

        Returns:
            "best minival checkpoint at the last evaluation in B of N runs, minival still rising
            over the last quarter of the steps in R of N".
        """
        return (
            f"best minival checkpoint at the last evaluation in {self.best_at_end} of {self.runs} runs, "
            f"minival still rising over the last quarter of the steps in {self.rising} of {self.runs}"
        )


def convergence(curves: Sequence[Any]) -> Convergence:
    """Read an arm's minival curves (each a list of ``[step, top1]``, as ``result.json`` keeps them).

    Args:
        curves: one per run; a run without a curve (an older result) is left out.

    Returns:
        The counts (:class:`Convergence`).
    """
    runs = best_at_end = rising = 0
    for curve in curves:
        pts = [(int(s), float(v)) for s, v in (curve or []) if stats._finite(v)]
        if len(pts) < 2:
            continue
        runs += 1
        last_step, last = pts[-1]
        best_at_end += last >= max(v for _, v in pts)
        quarter = [v for s, v in pts if s <= 0.75 * last_step]
        rising += bool(quarter) and last - quarter[-1] > RISING
    return Convergence(runs, best_at_end, rising)


def not_a_test(arm: str, status: Convergence, claim: str) -> str | None:
    """The sentence that replaces agreement or disagreement where an arm had not converged.

    Args:
        arm: the arm ("the ViT at 17,400 images").
        status: its :func:`convergence`.
        claim: what the comparison would test ("Figure 4's trend at the top of the range").

    Returns:
        The sentence, or None where the arm had converged (the comparison stands).
    """
    if status.converged or status.runs == 0:
        return None
    return f"{arm} had not converged ({status.evidence()}): this is not a test of {claim}."


@dataclass(frozen=True)
class Contrast:
    """One paired comparison of a family: its interval, its p-value and the p-value that a claim
    rests on (Holm-adjusted for a secondary contrast; the plain one for the primary).

    Attributes:
        name: what is compared ("relative against learned 1-D").
        diff: the paired interval of a - b in the report's units (None below two pairs).
        p: the paired t test's p-value.
        adjusted: the p-value a claim rests on.
    """

    name: str
    diff: stats.Interval | None
    p: float | None
    adjusted: float | None

    @property
    def claimed(self) -> bool:
        """Whether a difference is claimed: the p-value it rests on is below the test's level."""
        return self.adjusted is not None and self.adjusted < 1 - stats.LEVEL

    def to_dict(self) -> dict[str, Any]:
        """The contrast as JSON-ready numbers (for report.json, where a reader can recompute it).

        Returns:
            ``{"interval", "p", "adjusted", "claimed"}``.
        """
        interval = None if self.diff is None else self.diff.to_dict()
        return {"interval": interval, "p": self.p, "adjusted": self.adjusted, "claimed": self.claimed}


def contrasts(
    primary: tuple[str, Sequence[Any], Sequence[Any]],
    others: dict[str, tuple[Sequence[Any], Sequence[Any]]],
    scale: float = 100.0,
) -> tuple[Contrast, list[Contrast]]:
    """An experiment's primary contrast at the plain level and the rest Holm-adjusted.

    Args:
        primary: (its name, arm a, arm b), per seed.
        others: the secondary contrasts by name, each (arm a, arm b).
        scale: to the report's units.

    Returns:
        The primary and the secondaries, in the order given.
    """

    def interval(a: Sequence[Any], b: Sequence[Any]) -> stats.Interval | None:
        d = stats.paired_difference(a, b)
        return None if d is None else d.scaled(scale)

    name, a, b = primary
    p = stats.paired_p(a, b)
    raw = {k: stats.paired_p(x, y) for k, (x, y) in others.items()}
    adjusted = stats.holm(raw)
    return Contrast(name, interval(a, b), p, p), [
        Contrast(k, interval(x, y), raw[k], adjusted[k]) for k, (x, y) in others.items()
    ]


def primary_and_holm(
    primary: tuple[str, Sequence[Any], Sequence[Any]],
    others: dict[str, tuple[Sequence[Any], Sequence[Any]]],
    scale: float = 100.0,
    unit: str = " points",
) -> str:
    """The primary contrast at the plain level, then the rest with Holm-adjusted p-values.

    Args:
        primary: (its name, arm a, arm b), per seed.
        others: the secondary contrasts by name, each (arm a, arm b).
        scale: to the report's units.
        unit: their name.

    Returns:
        Sentences: the primary's paired difference and interval; each secondary's difference, its
        interval, raw and Holm-adjusted p, and whether a difference is claimed after the adjustment.
    """
    first, rest = contrasts(primary, others, scale)
    return said_with_holm(first, rest, unit)


def said_with_holm(first: Contrast, rest: Sequence[Contrast], unit: str = " points") -> str:
    """:func:`primary_and_holm`'s sentences for contrasts already weighed by :func:`contrasts`.

    Args:
        first: the primary contrast.
        rest: the secondaries.
        unit: the report's units.

    Returns:
        The sentences.
    """
    head = (
        f"Primary contrast, {first.name}: not weighed (fewer than 2 seeds)."
        if first.diff is None
        else f"Primary contrast, {first.name}: {_fmt(first.diff, 1, unit)}"
        + (": a difference." if first.diff.excludes_zero else ": not distinguishable.")
    )
    if not rest:
        return head
    parts = [contrast_clause(c, unit) for c in rest]
    return f"{head} The other {len(rest)} contrasts, Holm-corrected: " + "; ".join(parts) + "."


def contrast_clause(c: Contrast, unit: str = " points") -> str:
    """One Holm-corrected contrast: its interval, raw and adjusted p, and whether a difference is
    claimed.

    Args:
        c: the contrast.
        unit: the report's units.

    Returns:
        ``name: -3.0 points (95% CI ...), 3 seeds; p 0.021, Holm-adjusted 0.082: not
        distinguishable after the correction``, or ``name: not weighed``.
    """
    if c.diff is None or c.p is None or c.adjusted is None:
        return f"{c.name}: not weighed"
    word = "a difference" if c.claimed else "not distinguishable after the correction"
    return f"{c.name}: {_fmt(c.diff, 1, unit)}; p {c.p:.3f}, Holm-adjusted {c.adjusted:.3f}: {word}"


def beyond_control(
    effect: str, trained: Sequence[Any], untrained: Sequence[Any], digits: int = 2, unit: str = ""
) -> str:
    """An effect of the trained models said as an effect of training only where it exceeds the
    untrained control's, paired by seed.

    Args:
        effect: what is measured ("attention distance's growth with depth").
        trained: its value per seed in the trained models.
        untrained: the same measure per seed in the untrained (randomly initialised) models.
        digits: decimals.
        unit: the values' unit.

    Returns:
        One sentence: trained against untrained with the paired interval, and whether training
        made the effect.
    """
    diff = stats.paired_difference(trained, untrained)
    if diff is None:
        return f"{effect}: trained against untrained not weighed (fewer than 2 seeds)."
    if diff.excludes_zero:
        more = "more" if diff.estimate > 0 else "less"
        return (
            f"{effect}: {more} in the trained models than in the untrained control "
            f"({_fmt(diff, digits, unit)}): training shaped it."
        )
    return (
        f"{effect}: the untrained control shows it as well ({_fmt(diff, digits, unit)}, trained minus untrained): "
        "it is not shown to come from training."
    )


__all__ = [
    "RISING",
    "Contrast",
    "Convergence",
    "beyond_control",
    "contrast_clause",
    "contrasts",
    "convergence",
    "not_a_test",
    "primary_and_holm",
    "said_with_holm",
    "step_directions",
    "stepwise",
]
