"""Accuracy against cost as a frontier: the best accuracy reached for at most a cost, linear in log
cost between the runs on it; two families compared on their frontiers at matched cost, seed by
seed; a frontier's slope (the exponent of error in cost); the Pareto front of named points
(Figure 5's reading)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from typing import Any

from ..core.experiment import finite

GRID = 33  # log-spaced costs at which two frontiers are compared over their shared range


def pareto_front(points: Iterable[tuple[float, float, str]]) -> list[str]:
    """The names of the points that no point of at most the same cost matches or beats.

    Args:
        points: ``(cost, accuracy, name)``, finite numbers.

    Returns:
        The names on the front, cheapest first.
    """
    front, best = [], -math.inf
    for _, acc, name in sorted(points, key=lambda p: (p[0], -p[1])):
        if acc > best:
            front.append(name)
            best = acc
    return front


def frontier(points: Iterable[tuple[Any, Any]]) -> list[tuple[float, float]]:
    """The ``(cost, accuracy)`` points that no cheaper (or equally cheap) point matches, cheapest
    first; points with a cost or accuracy that is not a finite number (or a cost of 0) are left out.

    Args:
        points: ``(cost, accuracy)`` of the runs of one family in one seed.

    Returns:
        The frontier's points.
    """
    ok = [(float(c), float(a)) for c, a in points if len(finite([c, a])) == 2 and c > 0]
    out: list[tuple[float, float]] = []
    for c, a in sorted(ok, key=lambda p: (p[0], -p[1])):
        if not out or a > out[-1][1]:
            out.append((c, a))
    return out


def _span(points: Iterable[tuple[Any, Any]]) -> tuple[float, float] | None:
    costs = [float(c) for c, a in points if len(finite([c, a])) == 2 and c > 0]
    return (min(costs), max(costs)) if costs else None


def accuracy_at(points: Iterable[tuple[Any, Any]], cost: float) -> float | None:
    """The best accuracy for at most ``cost``, linear in log cost between the frontier's points.

    Args:
        points: ``(cost, accuracy)`` of one family's runs in one seed.
        cost: where to read the frontier.

    Returns:
        The accuracy, or None outside the runs' range of cost (no extrapolation).
    """
    points = list(points)
    span, front = _span(points), frontier(points)
    if span is None or not span[0] * (1 - 1e-9) <= cost <= span[1] * (1 + 1e-9):
        return None
    if cost >= front[-1][0]:
        return front[-1][1]
    (c0, a0) = front[0]
    for c1, a1 in front[1:]:
        if cost < c1:
            t = (math.log(max(cost, c0)) - math.log(c0)) / (math.log(c1) - math.log(c0))
            return a0 + t * (a1 - a0)
        c0, a0 = c1, a1
    return front[-1][1]


def cost_to_reach(points: Iterable[tuple[Any, Any]], target: float) -> tuple[float | None, str]:
    """The cost at which a family's frontier first reaches ``target``, interpolated in log cost.

    Args:
        points: ``(cost, accuracy)`` of the family's runs.
        target: the accuracy to reach.

    Returns:
        ``(cost, how)``: how is ``interpolated``; ``cheapest`` when the cheapest run already reaches
        it (the cost is then an upper bound); ``not reached`` (cost None) when no run does.
    """
    front = frontier(points)
    if not front or front[-1][1] < target:
        return None, "not reached"
    if front[0][1] >= target:
        return front[0][0], "cheapest"
    for (c0, a0), (c1, a1) in itertools.pairwise(front):
        if a0 < target <= a1:
            t = (target - a0) / (a1 - a0)
            return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0))), "interpolated"
    return None, "not reached"  # unreachable: the front rises to at least target


def matched(a: list[list[tuple[Any, Any]]], b: list[list[tuple[Any, Any]]]) -> dict[str, Any]:
    """Two families compared at matched cost, seed by seed: each seed's frontiers read on a
    log-spaced grid over the range of cost both span in that seed.

    Args:
        a: per seed, the ``(cost, accuracy)`` points of family A's runs.
        b: the same for family B, in the same seed order.

    Returns:
        Per seed (nan where a seed has no shared range): ``a_mean`` and ``b_mean`` (each frontier's
        mean accuracy over the shared range), ``a_low``/``b_low`` and ``a_high``/``b_high`` (at its
        cheap and costly end), ``low`` and ``high`` (the ends).
    """
    keys = ("a_mean", "b_mean", "a_low", "b_low", "a_high", "b_high", "low", "high")
    out: dict[str, list[float]] = {k: [] for k in keys}
    for pa, pb in zip(a, b, strict=True):
        sa, sb = _span(pa), _span(pb)
        lo, hi = (max(sa[0], sb[0]), min(sa[1], sb[1])) if sa and sb else (math.nan, math.nan)
        if not lo <= hi:
            for k in keys:
                out[k].append(math.nan)
            continue
        grid = [math.exp(math.log(lo) + i / (GRID - 1) * (math.log(hi) - math.log(lo))) for i in range(GRID)]
        ya = [accuracy_at(pa, c) for c in grid]
        yb = [accuracy_at(pb, c) for c in grid]
        row = {
            "a_mean": statistics.fmean(ya), "b_mean": statistics.fmean(yb), "a_low": ya[0], "b_low": yb[0],
            "a_high": ya[-1], "b_high": yb[-1], "low": lo, "high": hi,
        }  # fmt: skip
        for k in keys:
            out[k].append(row[k])
    return out


def frontier_slope(points: list[tuple[Any, Any]]) -> float:
    """The exponent ``b`` of test error against training FLOPs on one seed's frontier of a family
    (error ~ FLOPs^b): the least-squares slope of log error on log cost through the frontier's
    points (:func:`frontier`). A more negative ``b`` is a frontier still gaining faster; 0 is one
    that has stopped.

    Args:
        points: ``(cost, accuracy)`` of the family's runs in one seed.

    Returns:
        ``b``, or nan where the frontier has fewer than two points or an accuracy of 1.
    """
    front = [(math.log(c), math.log(1 - a)) for c, a in frontier(points) if a < 1]
    if len(front) < 2:
        return math.nan
    mx = sum(x for x, _ in front) / len(front)
    my = sum(y for _, y in front) / len(front)
    sxx = sum((x - mx) ** 2 for x, _ in front)
    return sum((x - mx) * (y - my) for x, y in front) / sxx


def error_cut(b: float) -> float:
    """The share of the test error that a doubling of training FLOPs removes on a frontier of
    exponent ``b`` (:func:`frontier_slope`), in percent: ``100 * (1 - 2^b)``.

    Args:
        b: the exponent (nan stays nan).

    Returns:
        The percent.
    """
    return 100 * (1 - 2**b) if math.isfinite(b) else math.nan
