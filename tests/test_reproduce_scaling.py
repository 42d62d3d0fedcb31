"""The scaling-law fits of data-scaling (E = a·n^-b + c per family, bootstrapped): a known power
law is recovered, a crossover inside the measured range is told from one beyond it (said as an
extrapolation, with how far), curves that do not cross are said not to, and too few sizes or
seeds fit or bootstrap nothing."""

from __future__ import annotations

import numpy as np
import pytest

from vitkit.reproduce.core.scaling import PowerLaw, crossover, fit_families, fit_power_law
from vitkit.reproduce.experiments.data_scaling_fits import fits_text
from vitkit.reproduce.experiments.data_scaling_text import NAMES

SIZES = [580, 1740, 5800, 17400, 58000]
CNN = PowerLaw(0.8, 0.2, 0.03)


def _noisy(law: PowerLaw, seeds: int = 3, noise: float = 0.02, seed: int = 1) -> dict[int, list[float]]:
    rng = np.random.default_rng(seed)
    return {n: [float(law(n)) * (1 + noise * rng.standard_normal()) for _ in range(seeds)] for n in SIZES}


def _text(fits: dict) -> str:
    return fits_text({"fits": fits, "models": {r: {"sizes": SIZES} for r in fits["families"]}}, NAMES)


def test_a_power_law_is_recovered():
    law = PowerLaw(2.0, 0.4, 0.05)
    fit = fit_power_law(SIZES, [law(n) for n in SIZES])
    assert fit.a == pytest.approx(2.0, rel=1e-3) and fit.b == pytest.approx(0.4, rel=1e-3)
    assert fit.c == pytest.approx(0.05, rel=1e-3)
    no_floor = fit_power_law(SIZES, [PowerLaw(1.5, 0.3, 0.0)(n) for n in SIZES])
    assert no_floor.c == pytest.approx(0.0, abs=1e-4) and no_floor.b == pytest.approx(0.3, rel=1e-3)
    assert fit_power_law([580, 1740, 580], [0.3, 0.2, 0.31]) is None  # two distinct sizes
    assert fit_power_law(SIZES, [0.3, float("nan"), 0.2, None, 0.1]) is not None  # three finite sizes left


@pytest.mark.parametrize(("scale", "inside"), [(6.0, True), (20.0, False)])
def test_a_crossover_beyond_the_range_is_said_as_an_extrapolation(scale, inside):
    vit = PowerLaw(scale, 0.45, 0.02)
    truth = crossover(vit, CNN, SIZES[0])
    assert (truth <= SIZES[-1]) == inside
    fits = fit_families({"vit": _noisy(vit), "cnn": _noisy(CNN, seed=2)}, [("vit", "cnn")], resamples=300)
    c = fits["crossovers"]["vit-cnn"]
    assert c["at"] == pytest.approx(truth, rel=0.15) and c["crossing_share"] > 0.9
    assert c["interval"]["low"] < c["at"] < c["interval"]["high"]
    text = _text(fits)
    assert "The fitted curves of the ViT and the ResNet cross at " in text
    if inside:
        assert "within the measured range" in text and "extrapolation" not in text.split("The fits describe")[0]
    else:
        assert f"{c['beyond']:,.1f} times the largest size measured: an extrapolation" in text
        assert c["beyond"] > 1
    assert "a reading of the fits, not a measurement" in text


def test_curves_that_do_not_cross_are_said_not_to():
    vit = PowerLaw(20.0, 0.45, 0.1)  # a higher floor: the ViT never catches up
    fits = fit_families({"vit": _noisy(vit), "cnn": _noisy(CNN, seed=2)}, [("vit", "cnn")], resamples=200)
    assert fits["crossovers"]["vit-cnn"]["at"] is None
    text = _text(fits)
    assert "The fitted curves of the ViT and the ResNet do not cross before 1.0e12 images; " in text
    assert "% of the resamples cross before 1.0e12 images." in text
    vit_fit = fits["families"]["vit"]
    assert vit_fit["b"]["low"] < vit_fit["fit"]["b"] < vit_fit["b"]["high"]


def test_too_few_sizes_or_seeds_fit_or_bootstrap_nothing():
    two_ends = {n: v for n, v in _noisy(PowerLaw(6.0, 0.45, 0.02)).items() if n in (580, 58000)}
    fits = fit_families({"larger_vit": two_ends, "vit": _noisy(CNN)}, [("larger_vit", "vit")], resamples=50)
    assert fits["families"]["larger_vit"] is None and fits["crossovers"]["larger_vit-vit"] is None
    text = fits_text({"fits": fits, "models": {"larger_vit": {"sizes": [580, 58000]}, "vit": {"sizes": SIZES}}}, NAMES)
    assert "the larger ViT not fitted (2 sizes; 3 needed)" in text
    one = fit_families({"vit": _noisy(CNN, seeds=1)}, [], resamples=50)
    assert one["resamples"] == 0 and one["families"]["vit"]["b"] is None
    assert "no interval (one seed)" in fits_text({"fits": one, "models": {"vit": {"sizes": SIZES}}}, NAMES)


def test_the_bootstrap_is_reproducible():
    data = {"vit": _noisy(PowerLaw(6.0, 0.45, 0.02)), "cnn": _noisy(CNN, seed=2)}
    assert fit_families(data, [("vit", "cnn")], resamples=100) == fit_families(data, [("vit", "cnn")], resamples=100)
