"""The report's statistics against known answers."""

import math

import pytest

from vitkit.reproduce.core.stats import (
    Interval,
    compare,
    mcnemar,
    mean_interval,
    paired_difference,
    slope_interval,
    t_quantile,
    verdict,
)

# Student's sleep data (Cushny and Peebles 1905): extra hours of sleep under two drugs, ten patients.
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_t_quantiles_match_the_tables():
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-6)


def test_paired_difference_matches_the_textbook_sleep_data():
    d = paired_difference(DRUG1, DRUG2)
    assert d is not None and d.n == 10 and d.method == "paired t"
    assert d.estimate == pytest.approx(-1.58)
    assert (d.low, d.high) == (pytest.approx(-2.4598858, abs=1e-6), pytest.approx(-0.7001142, abs=1e-6))
    assert d.excludes_zero


def test_pairs_with_a_diverged_side_are_left_out():
    d = paired_difference([0.8, math.nan, 0.9, 0.85], [0.7, 0.6, None, 0.8])
    assert d is not None and d.n == 2
    assert d.estimate == pytest.approx(0.075)
    assert paired_difference([0.8, math.nan], [0.7, 0.6]) is None  # one complete pair: no interval
    with pytest.raises(ValueError, match="length"):
        paired_difference([0.1], [0.1, 0.2])


def test_mean_interval_of_two_values():
    m = mean_interval([1.0, 3.0])
    assert m is not None
    assert m.estimate == 2.0
    half = 12.706205  # t(0.975, 1) x s / sqrt(n), with s = sqrt(2) and n = 2
    assert (m.low, m.high) == (pytest.approx(2 - half, rel=1e-6), pytest.approx(2 + half, rel=1e-6))
    assert mean_interval([1.0]) is None


def test_mcnemar_exact_two_sided():
    a = [True] * 9 + [False] * 1 + [True] * 5
    b = [False] * 9 + [True] * 1 + [True] * 5
    r = mcnemar(a, b)
    assert (r["a_only"], r["b_only"]) == (9, 1)
    assert r["p"] == pytest.approx(2 * 11 / 1024)  # 2 x P(X <= 1), X ~ Binomial(10, 1/2)
    assert r["difference"] == pytest.approx(8 / 15)
    assert mcnemar([True, False], [True, False])["p"] == 1.0


def test_slope_interval_known_regression():
    s = slope_interval([1, 2, 3, 4, 5], [2, 4, 5, 4, 5])
    assert s is not None and s.n == 5
    assert s.estimate == pytest.approx(0.6)
    half = 3.182446 * math.sqrt(2.4 / 3 / 10)
    assert (s.low, s.high) == (pytest.approx(0.6 - half, abs=1e-5), pytest.approx(0.6 + half, abs=1e-5))
    assert not s.excludes_zero
    assert slope_interval([1, 2], [1, 2]) is None
    assert slope_interval([1, 1, 1], [1, 2, 3]) is None


def test_verdict_claims_only_what_the_interval_shows():
    lead = verdict(Interval(3.1, 1.2, 5.0, 3), "the ViT", "the ResNet")
    assert lead.startswith("the ViT leads the ResNet by 3.1 points") and "95% CI 1.2 to 5.0, 3 seeds" in lead
    behind = verdict(Interval(-2.0, -3.0, -1.0, 3), "the ViT", "the ResNet")
    assert behind.startswith("the ResNet leads the ViT by 2.0 points") and "95% CI 1.0 to 3.0" in behind
    tie = verdict(Interval(0.4, -1.2, 2.0, 3), "the ViT", "the ResNet")
    assert "not distinguishable" in tie and "+0.4 points" in tie
    assert "not weighed" in verdict(None, "a", "b")


def test_compare_in_points():
    text = compare("drug 2", DRUG2, "drug 1", DRUG1, scale=1.0)
    assert text.startswith("drug 2 leads drug 1 by 1.6 points (95% CI 0.7 to 2.5, 10 seeds)")
    assert "not weighed" in compare("a", [0.5, 0.6], "b", [0.4, math.inf])
