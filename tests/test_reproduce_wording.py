"""The rules that turn the report's numbers into words, each fed synthetic numbers on both sides
of its threshold: a direction over a range only where every step shows it, "not a test" for an
arm that had not converged, Holm's correction of the secondary contrasts, and effects attributed
to training only beyond the untrained control."""

from __future__ import annotations

import re

import pytest

from vitkit.reproduce.core import stats
from vitkit.reproduce.core.wording import (
    RISING,
    beyond_control,
    convergence,
    not_a_test,
    primary_and_holm,
    stepwise,
)


def _iv(estimate: float, low: float, high: float, n: int = 3) -> stats.Interval:
    return stats.Interval(estimate, low, high, n, method="paired t")


def test_a_direction_is_claimed_over_the_range_only_where_every_step_shows_it():
    every = stepwise([("1,450", "5,800", _iv(-0.15, -0.2, -0.1)), ("5,800", "17,400", _iv(-0.05, -0.08, -0.02))],
                     "the ratio")  # fmt: skip
    assert every.startswith("the ratio falls at every step from 1,450 to 17,400 (paired by seed; 1,450 to 5,800: ")
    # the data-scaling case: all of the fall is in the first step
    first_only = stepwise([("1,450", "5,800", _iv(-0.15, -0.2, -0.1)), ("5,800", "17,400", _iv(0.0, -0.05, 0.05))],
                          "the ratio")  # fmt: skip
    assert first_only.startswith(
        "the ratio falls from 1,450 to 5,800 and is not distinguishable from 5,800 to 17,400 (paired by seed; "
    )
    assert first_only.endswith("): not a trend over the range.") and "falls at every step" not in first_only
    flat = stepwise([("a", "b", _iv(0.01, -0.01, 0.03)), ("b", "c", None)], "the ratio")
    assert flat.startswith("no step of the ratio is distinguishable from no change (a to b: +0.01 (95% CI")
    assert "b to c: not weighed" in flat
    mixed = stepwise([("a", "b", _iv(-0.1, -0.2, -0.05)), ("b", "c", _iv(0.1, 0.05, 0.2))], "the ratio")
    assert "falls from a to b and rises from b to c" in mixed and "not a trend" in mixed


def _curve(values: list[float], every: int = 100) -> list[list[float]]:
    return [[every * (i + 1), v] for i, v in enumerate(values)]


def test_an_arm_still_improving_is_not_a_test():
    plateau = _curve([0.5, 0.7, 0.8, 0.85, 0.86, 0.87, 0.868, 0.869])  # best before the end, flat last quarter
    late_best = _curve([0.5, 0.7, 0.8, 0.85, 0.86, 0.86, 0.86, 0.861])  # best at the end, but flat
    rising = _curve([0.5, 0.6, 0.7, 0.75, 0.8, 0.84, 0.85 + RISING, 0.849 + 2 * RISING])
    done = convergence([plateau, plateau, late_best])
    assert done.runs == 3 and done.best_at_end == 1 and done.rising == 0 and done.converged
    assert not_a_test("the ViT", done, "Figure 4") is None
    open_ = convergence([rising, rising, plateau])
    assert open_.rising == 2 and not open_.converged
    said = not_a_test("the ViT at 17,400 images", open_, "Figure 4's trend at the top of the range")
    assert said == (
        "the ViT at 17,400 images had not converged (best minival checkpoint at the last evaluation in 2 of 3 "
        "runs, minival still rising over the last quarter of the steps in 2 of 3): this is not a test of "
        "Figure 4's trend at the top of the range."
    )
    # just under and just over the threshold of "still rising"
    under = _curve([0.5, 0.7, 0.8, 0.85, 0.86, 0.86, 0.86, 0.86 + 0.9 * RISING])
    over = _curve([0.5, 0.7, 0.8, 0.85, 0.86, 0.86, 0.86, 0.86 + 1.1 * RISING])
    assert convergence([under]).rising == 0 and convergence([over]).rising == 1
    assert convergence([None, []]).runs == 0 and not_a_test("x", convergence([]), "y") is None


def test_holm_adjusts_the_secondary_contrasts():
    adjusted = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    assert adjusted["a"] == pytest.approx(0.03) and adjusted["c"] == pytest.approx(0.06)
    assert adjusted["b"] == pytest.approx(0.06) and adjusted["d"] is None  # monotone: not below c's
    assert stats.holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    # the p-value agrees with the interval: p < 0.05 exactly where the 95% interval excludes zero
    a, b = [0.80, 0.82, 0.81], [0.78, 0.79, 0.785]
    assert (stats.paired_p(a, b) < 0.05) == stats.paired_difference(a, b).excludes_zero


def test_a_secondary_difference_is_claimed_only_after_the_correction():
    base = [0.80, 0.81, 0.79, 0.80, 0.805]
    clear = [x + d for x, d in zip(base, [0.020, 0.022, 0.019, 0.021, 0.020])]  # p far below 0.05
    marginal = [x + d for x, d in zip(base, [0.010, 0.002, 0.015, 0.004, 0.009])]  # p ~0.02 raw
    p_marginal = stats.paired_p(marginal, base)
    assert 0.05 / 3 < p_marginal < 0.05  # significant alone, not after three comparisons
    said = primary_and_holm(("learned 1-D against none", clear, base),
                            {"2-D": (clear, base), "relative": (marginal, base), "other": (base, base)})  # fmt: skip
    assert said.startswith("Primary contrast, learned 1-D against none: +2.0 points (95% CI")
    assert ": a difference." in said and "The other 3 contrasts, Holm-corrected: " in said
    assert "relative: +0.8 points (95% CI " in said and "5 seeds; p 0.0" in said.split("relative: ")[1]

    def word(name: str) -> str:
        return re.search(name + r": [^;]*; p [0-9.]+, Holm-adjusted [0-9.]+: ([a-z ]+)", said).group(1)

    assert word("relative") == "not distinguishable after the correction" and word("2-D") == "a difference"


def test_an_effect_is_put_down_to_training_only_beyond_the_untrained_control():
    grows = beyond_control("attention distance's growth with depth", [0.30, 0.28, 0.33], [0.06, 0.05, 0.07],
                           unit=" px a layer")  # fmt: skip
    assert "more in the trained models than in the untrained control" in grows and "training shaped it" in grows
    # the attention case: +0.11 trained against +0.06 untrained, with seeds that do not separate them
    same = beyond_control("attention distance's growth with depth", [0.11, 0.02, 0.20], [0.06, 0.07, 0.05])
    assert "the untrained control shows it as well" in same and "not shown to come from training" in same
    assert "not weighed" in beyond_control("x", [0.1], [0.2])
