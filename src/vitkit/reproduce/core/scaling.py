"""Scaling-law fits in the style of Zhai et al. (2022): test error against training images as
E(n) = a·n^-b + c, fitted per family, with bootstrap intervals on the exponent b, the floor c and
the size at which two families' fitted curves cross.

The fit minimises the squared error of log E (relative errors weigh alike at every size): for a
given floor c, log(E - c) is linear in log n, so a and b come from least squares and c from a
search over [0, min E) refined twice. The bootstrap resamples the seeds within each size, the
same seeds for both families of a comparison (their runs share the subset of that seed), and
refits. A crossover is found on the fitted curves between the smallest size and a horizon; where
it lies beyond the largest size measured it is an extrapolation, and the report says so and by
how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import stats

HORIZON = 1e12  # images: the farthest a crossover is looked for
RESAMPLES = 1000  # bootstrap resamples
MIN_SIZES = 3  # distinct sizes a three-parameter fit needs


@dataclass(frozen=True)
class PowerLaw:
    """E(n) = a·n^-b + c.

    Attributes:
        a: the scale.
        b: the exponent (positive: the error falls with data).
        c: the floor the error tends to.
    """

    a: float
    b: float
    c: float

    def __call__(self, n: float | np.ndarray) -> float | np.ndarray:
        """The fitted error at ``n`` images.

        Args:
            n: images (a number or an array).

        Returns:
            E(n).
        """
        return self.c + self.a * np.power(n, -self.b)


def _profile(x: np.ndarray, y: np.ndarray, floors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each floor c: least squares of log(E - c) on log n, and the squared error of log E."""
    z = np.log(np.exp(y)[None, :] - floors[:, None])  # (K, m)
    xm, zm = x.mean(), z.mean(axis=1, keepdims=True)
    sxx = ((x - xm) ** 2).sum()
    slope = ((x - xm)[None, :] * (z - zm)).sum(axis=1) / sxx
    intercept = zm[:, 0] - slope * xm
    fitted = np.log(floors[:, None] + np.exp(intercept[:, None] + slope[:, None] * x[None, :]))
    return ((y[None, :] - fitted) ** 2).sum(axis=1), intercept, slope


def fit_power_law(sizes: Sequence[float], errors: Sequence[Any]) -> PowerLaw | None:
    """Fit E = a·n^-b + c to points (n, E), repeats of a size allowed (one a seed).

    Args:
        sizes: images of each point.
        errors: test error of each point (a fraction in (0, 1]); non-finite or non-positive
            points are left out.

    Returns:
        The fit, or None with fewer than :data:`MIN_SIZES` distinct sizes left.
    """
    pts = [(float(n), float(e)) for n, e in zip(sizes, errors, strict=True) if stats._finite(e) and float(e) > 0]
    if len({n for n, _ in pts}) < MIN_SIZES:
        return None
    x = np.log([n for n, _ in pts])
    y = np.log([e for _, e in pts])
    top = float(np.exp(y).min())
    low, high = 0.0, top
    best = None
    for _ in range(3):  # a coarse search over the floor, then two finer ones around the best
        floors = np.linspace(low, high, 201)[:-1] if high == top else np.linspace(low, high, 201)
        sse, intercept, slope = _profile(x, y, floors)
        i = int(np.nanargmin(sse))
        best = (float(floors[i]), float(intercept[i]), float(slope[i]))
        step = floors[1] - floors[0]
        low, high = max(0.0, floors[i] - step), min(top * (1 - 1e-9), floors[i] + step)
    c, intercept, slope = best
    return PowerLaw(a=math.exp(intercept), b=-slope, c=c)


def crossover(f: PowerLaw, g: PowerLaw, start: float, horizon: float = HORIZON) -> float | None:
    """The smallest size from ``start`` at which the sign of f - g changes.

    Args:
        f: one family's fit.
        g: the other's.
        start: the smallest size measured (the sign there is the one that changes).
        horizon: the farthest size looked at.

    Returns:
        The size, or None where the curves do not cross before ``horizon``.
    """
    grid = np.geomspace(start, horizon, 2000)
    d = f(grid) - g(grid)
    sign = np.sign(d[0])
    changed = np.nonzero(np.sign(d) != sign)[0]
    if sign == 0 or not len(changed):
        return None
    lo, hi = math.log(grid[changed[0] - 1]), math.log(grid[changed[0]])
    for _ in range(60):  # bisection in log n
        mid = (lo + hi) / 2
        if np.sign(f(math.exp(mid)) - g(math.exp(mid))) == sign:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)


def _interval(values: list[float], level: float) -> dict[str, float | None] | None:
    """Percentiles of the resamples (no interpolation, so an end may be infinite: None then)."""
    if len(values) < 2:
        return None
    ends = np.quantile(np.asarray(values, dtype=float), [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    lo, hi = (float(v) if math.isfinite(v) else None for v in ends)
    return {"low": lo, "high": hi}


def fit_families(
    errors: dict[str, dict[int, list[Any]]],
    pairs: Sequence[tuple[str, str]],
    resamples: int = RESAMPLES,
    level: float = stats.LEVEL,
    seed: int = 0,
) -> dict[str, Any]:
    """Fit every family and bootstrap the exponents, the floors and the crossovers of ``pairs``.

    Args:
        errors: per family, per size, the test error of each seed (in seed order; a family may
            run at fewer sizes than another).
        pairs: (family, family) whose crossover is wanted, e.g. ("vit", "cnn").
        resamples: bootstrap resamples.
        level: the intervals' level (percentile intervals).
        seed: the bootstrap's random seed (the numbers are reproducible).

    Returns:
        ``{"families": {name: {"fit", "sizes", "b", "c"} or None}, "crossovers": {"A-B": {...}},
        "resamples", "level", "horizon"}``: ``fit`` the point fit; ``b`` and ``c`` their intervals;
        a crossover's ``at`` (None: no crossing before the horizon), ``largest`` (the largest size
        both ran), ``beyond`` (``at`` over ``largest``), ``crossing_share`` (the resamples with a
        crossing before the horizon) and ``interval`` (percentiles over the resamples, those with
        no crossing counted as beyond the horizon: an end of None lies beyond it).
    """
    rng = np.random.default_rng(seed)
    sizes = sorted({n for by in errors.values() for n in by})
    seeds = max((len(v) for by in errors.values() for v in by.values()), default=0)

    def points(family: str, pick: dict[int, np.ndarray] | None) -> tuple[list[float], list[Any]]:
        xs, ys = [], []
        for n, values in errors[family].items():
            idx = pick[n] if pick is not None else range(len(values))
            for i in idx:
                if i < len(values):
                    xs.append(n)
                    ys.append(values[i])
        return xs, ys

    def fits(pick: dict[int, np.ndarray] | None) -> dict[str, PowerLaw | None]:
        return {f: fit_power_law(*points(f, pick)) for f in errors}

    point = fits(None)
    boot: list[dict[str, PowerLaw | None]] = []
    if seeds >= 2:
        for _ in range(resamples):
            pick = {n: rng.integers(0, seeds, seeds) for n in sizes}  # the same seeds for every family
            boot.append(fits(pick))
    families: dict[str, Any] = {}
    for f, fit in point.items():
        if fit is None:
            families[f] = None
            continue
        bs = [b[f] for b in boot if b[f] is not None]
        families[f] = {
            "fit": asdict(fit),
            "sizes": sorted(errors[f]),
            "b": _interval([p.b for p in bs], level),
            "c": _interval([p.c for p in bs], level),
        }
    crossovers: dict[str, Any] = {}
    for a, b in pairs:
        if point.get(a) is None or point.get(b) is None:
            crossovers[f"{a}-{b}"] = None
            continue
        common = sorted(set(errors[a]) & set(errors[b]))
        start, largest = common[0], common[-1]
        at = crossover(point[a], point[b], start)
        found = [crossover(r[a], r[b], start) if r[a] is not None and r[b] is not None else None for r in boot]
        spread = [math.inf if x is None else x for x in found]
        iv = _interval(spread, level)  # an end of None: beyond the horizon
        crossovers[f"{a}-{b}"] = {
            "at": at,
            "largest": largest,
            "beyond": None if at is None else at / largest,
            "crossing_share": (sum(x is not None for x in found) / len(found)) if found else None,
            "interval": iv,
        }
    return {"families": families, "crossovers": crossovers, "resamples": len(boot), "level": level,
            "horizon": HORIZON}  # fmt: skip


__all__ = ["HORIZON", "MIN_SIZES", "RESAMPLES", "PowerLaw", "crossover", "fit_families", "fit_power_law"]
