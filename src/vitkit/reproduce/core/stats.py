"""The statistics every verdict of the report goes through, in one place.

Two arms of an experiment are compared run for run: seed ``i`` of one arm against seed ``i``
of the other (the same subset draw, the same minival), so the difference is taken per seed and
its mean gets a Student t interval (:func:`paired_difference`). One pair of models scored on the
same test images can be compared image by image instead (:func:`mcnemar`). A trend over a
continuous variable (error against data size on log-log axes) is a least-squares slope with its
t interval (:func:`slope_interval`). :func:`compare` turns a paired interval into the clause the
report prints: a lead only when the interval excludes zero, "not distinguishable" otherwise, and
"not weighed" below two pairs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

LEVEL = 0.95  # the confidence level of every interval in the report


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom.

    Args:
        p: a probability in (0, 1).
        df: degrees of freedom, at least 1.

    Returns:
        The quantile (``t_quantile(0.975, 2)`` is 4.303).
    """
    from scipy.stats import t  # scipy (with scikit-learn, the reproduce extra) is heavy and optional: loaded on use

    return float(t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided confidence interval.

    Attributes:
        estimate: the point estimate (a mean difference, a mean, a slope).
        low: the interval's lower end.
        high: its upper end.
        n: how many values (pairs, points) it rests on.
        level: its confidence level.
        method: how it was computed, for the report (``paired t``, ``t``, ``OLS slope``).
    """

    estimate: float
    low: float
    high: float
    n: int
    level: float = LEVEL
    method: str = "t"

    @property
    def excludes_zero(self) -> bool:
        """Whether zero lies outside the interval (the difference is claimed)."""
        return self.low > 0 or self.high < 0

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (fractions to points: ``factor=100``).

        Args:
            factor: what the estimate and both ends are multiplied by (positive, so the ends keep
                their order).

        Returns:
            A new :class:`Interval`; ``n``, ``level`` and ``method`` are kept.
        """
        return Interval(self.estimate * factor, self.low * factor, self.high * factor, self.n, self.level, self.method)

    def to_dict(self) -> dict[str, Any]:
        """The interval as JSON-ready numbers.

        Returns:
            ``estimate``, ``low``, ``high``, ``n``, ``level`` and ``method`` by name.
        """
        return asdict(self)

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``+1.2 points (95% CI 0.4 to 2.0)``.

        Args:
            digits: decimals of the numbers.
            unit: what follows the estimate (`` points``, ``x``).

        Returns:
            The estimate and its interval.
        """
        f = f"{{:+.{digits}f}}"
        g = f"{{:.{digits}f}}"
        ci = f"{100 * self.level:.0f}% CI {g.format(self.low)} to {g.format(self.high)}"
        return f"{f.format(self.estimate)}{unit} ({ci})"


def mean_interval(values: Sequence[Any], level: float = LEVEL) -> Interval | None:
    """The mean of the finite values with its t interval.

    Args:
        values: numbers; any that are not finite (a diverged run) are left out.
        level: confidence level.

    Returns:
        The interval, or None with fewer than two finite values.
    """
    ok = [float(v) for v in values if _finite(v)]
    if len(ok) < 2:
        return None
    m, s = statistics.fmean(ok), statistics.stdev(ok)
    half = t_quantile(0.5 + level / 2, len(ok) - 1) * s / math.sqrt(len(ok))
    return Interval(m, m - half, m + half, len(ok), level, "t")


def paired_difference(a: Sequence[Any], b: Sequence[Any], level: float = LEVEL) -> Interval | None:
    """The mean of ``a[i] - b[i]`` over the pairs where both are finite, with its t interval.

    Args:
        a: one arm's numbers, one per seed.
        b: the other arm's, in the same seed order.
        level: confidence level.

    Returns:
        The interval (method ``paired t``), or None with fewer than two complete pairs.

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    out = mean_interval(_paired_diffs(a, b), level)
    return None if out is None else Interval(out.estimate, out.low, out.high, out.n, level, "paired t")


def _paired_diffs(a: Sequence[Any], b: Sequence[Any]) -> list[float]:
    """``a[i] - b[i]`` over the pairs where both are finite; a ValueError where the arms differ in length."""
    if len(a) != len(b):
        raise ValueError(f"paired arms differ in length: {len(a)} and {len(b)}")
    return [float(x) - float(y) for x, y in zip(a, b) if _finite(x) and _finite(y)]


def paired_p(a: Sequence[Any], b: Sequence[Any]) -> float | None:
    """The two-sided p-value of the paired t test of ``a`` against ``b`` (the test behind
    :func:`paired_difference`'s interval: the interval excludes zero exactly when p < 1 - level).

    Args:
        a: one arm's numbers, one per seed.
        b: the other arm's, in the same seed order.

    Returns:
        p, or None with fewer than two complete pairs; 1.0 where every difference is zero, 0.0
        where they are all equal and not zero.

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    from scipy.stats import t  # optional, as t_quantile

    diffs = _paired_diffs(a, b)
    if len(diffs) < 2:
        return None
    m, s = statistics.fmean(diffs), statistics.stdev(diffs)
    if s == 0:
        return 1.0 if m == 0 else 0.0
    stat = abs(m) / (s / math.sqrt(len(diffs)))
    return float(2 * t.sf(stat, len(diffs) - 1))


def holm(pvalues: dict[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment of a family of p-values (the family-wise error rate held at the
    test's level over all of them); None (not tested) stays None and does not count.

    Args:
        pvalues: each comparison's p-value by name.

    Returns:
        The adjusted p-values by the same names, each at most 1 and none below the one before it
        in the order of the raw p-values.
    """
    tested = sorted(((p, k) for k, p in pvalues.items() if p is not None), key=lambda pk: pk[0])
    out: dict[str, float | None] = {k: None for k in pvalues}
    running, m = 0.0, len(tested)
    for i, (p, k) in enumerate(tested):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> dict[str, Any]:
    """McNemar's exact test of two classifiers scored on the same images.

    Args:
        correct_a: per image, whether model A got it right.
        correct_b: the same for model B, in the same image order.

    Returns:
        ``a_only`` and ``b_only`` (the discordant counts), ``difference`` (A's accuracy minus
        B's) and ``p`` (two-sided, from the binomial distribution of the discordant pairs).

    Raises:
        ValueError: the two sequences differ in length.
    """
    from scipy.stats import binomtest  # optional, as above

    if len(correct_a) != len(correct_b):
        raise ValueError(f"McNemar needs the same images for both models: {len(correct_a)} and {len(correct_b)}")
    a_only = sum(1 for x, y in zip(correct_a, correct_b) if x and not y)
    b_only = sum(1 for x, y in zip(correct_a, correct_b) if y and not x)
    n = a_only + b_only
    p = 1.0 if n == 0 else float(binomtest(a_only, n, 0.5).pvalue)
    return {"a_only": a_only, "b_only": b_only, "difference": (a_only - b_only) / max(len(correct_a), 1), "p": p}


def slope_interval(x: Sequence[float], y: Sequence[Any], level: float = LEVEL) -> Interval | None:
    """The least-squares slope of ``y`` on ``x`` with its t interval (``n - 2`` degrees of freedom).

    Args:
        x: the predictor (e.g. log image count), one per point.
        y: the response (e.g. log test error); points whose ``y`` is not finite are left out.
        level: confidence level.

    Returns:
        The interval (method ``OLS slope``), or None with fewer than three points or one ``x``.
    """
    pts = [(float(u), float(v)) for u, v in zip(x, y) if _finite(v)]
    if len(pts) < 3 or len({u for u, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = statistics.fmean(u for u, _ in pts)
    my = statistics.fmean(v for _, v in pts)
    sxx = sum((u - mx) ** 2 for u, _ in pts)
    slope = sum((u - mx) * (v - my) for u, v in pts) / sxx
    resid = sum((v - my - slope * (u - mx)) ** 2 for u, v in pts)
    se = math.sqrt(resid / (n - 2) / sxx)
    half = t_quantile(0.5 + level / 2, n - 2) * se
    return Interval(slope, slope - half, slope + half, n, level, "OLS slope")


def verdict(diff: Interval | None, name_a: str, name_b: str, *, unit: str = " points", digits: int = 1) -> str:
    """The clause for a paired difference ``a - b``.

    Args:
        diff: from :func:`paired_difference` (already in the report's units), or None.
        name_a: what ``a`` measures ("the ViT").
        name_b: what ``b`` measures.
        unit: the estimate's unit.
        digits: decimals.

    Returns:
        ``the ViT leads the ResNet by 3.1 points (95% CI 1.2 to 5.0, 3 seeds)``; ``the ViT and
        the ResNet are not distinguishable: ...`` when the interval holds zero; ``... not weighed
        (fewer than 2 seeds with finite results on both sides)`` when there is no interval.
    """
    if diff is None:
        return f"{name_a} and {name_b} are not weighed (fewer than 2 seeds with finite results on both sides)"
    f = f"{{:.{digits}f}}"
    ci = f"{100 * diff.level:.0f}% CI {f.format(diff.low)} to {f.format(diff.high)}, {diff.n} seeds"
    est = f"{{:+.{digits}f}}".format(diff.estimate)
    if not diff.excludes_zero:
        return f"{name_a} and {name_b} are not distinguishable ({name_a} minus {name_b}: {est}{unit}; {ci})"
    if diff.estimate < 0:  # said from the side that leads: the interval of b - a
        name_a, name_b = name_b, name_a
        diff = Interval(-diff.estimate, -diff.high, -diff.low, diff.n, diff.level, diff.method)
        ci = f"{100 * diff.level:.0f}% CI {f.format(diff.low)} to {f.format(diff.high)}, {diff.n} seeds"
    return f"{name_a} leads {name_b} by {f.format(diff.estimate)}{unit} ({ci})"


def compare(name_a: str, a: Sequence[Any], name_b: str, b: Sequence[Any], scale: float = 100.0) -> str:
    """Compare two arms paired by seed and say it as :func:`verdict` does.

    Args:
        name_a: what ``a`` measures.
        a: its numbers, one per seed (fractions: ``scale`` turns them into points).
        name_b: likewise for ``b``.
        b: its numbers, in the same seed order.
        scale: the factor to the report's units (100: fractions to points).

    Returns:
        The clause.
    """
    diff = paired_difference(a, b)
    return verdict(None if diff is None else diff.scaled(scale), name_a, name_b)


__all__ = [
    "LEVEL",
    "Interval",
    "compare",
    "holm",
    "mcnemar",
    "mean_interval",
    "paired_difference",
    "paired_p",
    "slope_interval",
    "t_quantile",
    "verdict",
]
