"""``pooling`` (Figure 9, appendix D.3): the class token against global average pooling (GAP),
each at the learning rate its own minival picks.

Phase 1 trains both poolings over one grid of learning rates at the first seed and picks each
pooling's rate on its minival (never on the test split). Phase 2 trains the other seeds at both
chosen rates for both poolings, so that each pooling is measured, seed for seed, at its own rate
and at the other's: the class token against GAP at their own rates, and GAP at its own rate
against GAP at the class token's (the paper: equal, and clearly worse).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..core.experiment import Experiment, Section, grid_arms, lead, mean_of, pct, sentence_from, shots_label
from ..core.registry import register
from ..core.spec import RunSpec
from ..core.stats import paired_difference
from .figures import plot_pooling

POOLINGS = {"token": "class token", "gap": "global average pooling"}
NAMES = {"token": "the class token", "gap": "GAP"}  # in sentences


def rate_text(lr: float) -> str:
    """A learning rate as the paper writes it: ``8e-4``, ``2.5e-3``, ``1``.

    Args:
        lr: the learning rate.

    Returns:
        Mantissa and exponent, without padding.
    """
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"{float(mantissa):g}" + (f"e{int(exponent)}" if int(exponent) else "")


def grid_position(lr: float | None, grid: list[float]) -> str | None:
    """Where a chosen rate lies in its grid.

    Args:
        lr: the chosen rate (None: none could be chosen).
        grid: the rates tried.

    Returns:
        ``"interior"``, ``"low edge"`` or ``"high edge"`` (a grid of one rate is an edge), or None.
    """
    if lr is None:
        return None
    if math.isclose(lr, min(grid)):
        return "low edge"
    if math.isclose(lr, max(grid)):
        return "high edge"
    return "interior"


def best_on_minival(results: dict[float, dict[str, Any] | None]) -> float | None:
    """The option whose result has the best finite minival top-1 (the first of equals), as
    :meth:`Experiment.choose_on_minival` picks from files.

    Args:
        results: one finished result (or None) per option.

    Returns:
        The option, or None when no result has a finite minival top-1.
    """
    means = {k: m for k, r in results.items() if r is not None and (m := mean_of([r.get("minival_top1")])) is not None}
    return max(means, key=means.__getitem__) if means else None


def position_clause(
    name: str, lr: float | None, where: str | None, grid: list[float], fmt: Callable[[float], str] = rate_text
) -> str:
    """How a chosen rate sits in the grid, for the verdict.

    Args:
        name: whose rate (``GAP``).
        lr: the chosen rate, or None.
        where: from :func:`grid_position`.
        grid: the rates tried.
        fmt: how a rate is written.

    Returns:
        ``GAP at 2e-3 (interior to the grid)`` or a clause that says the grid does not bracket it.
    """
    if lr is None:
        return f"no rate can be chosen for {name} (no grid run has a finite minival result)"
    if where == "interior":
        return f"{name} at {fmt(lr)} (interior to the grid)"
    beyond = "lower" if where == "low edge" else "higher"
    return (
        f"{name} at {fmt(lr)}, at the {where} of the grid {fmt(min(grid))} to {fmt(max(grid))}: "
        f"the grid does not bracket its optimum, which may lie {beyond}"
    )


@register
class Pooling(Experiment):
    name = "pooling"

    def rates(self) -> list[float]:
        """The learning rates of the grid, ascending: the configured ones and those it gained past
        an edge."""
        return self.bracketed(self.cfg["learning_rates"], lambda rates: grid_arms(self.grid(rates)))

    def base_lr(self) -> float:
        """The common recipe's learning rate (its class-token run is the shared one)."""
        return float(self.suite.recipe(self.cfg["model"], 0)["optim"]["lr"])

    def cell_spec(self, pooling: str, lr: float, seed: int) -> RunSpec:
        """The run of ``pooling`` at learning rate ``lr`` and ``seed``."""
        model = self.cfg["model"]
        default = pooling == self.default_of(model, "classifier")
        at_base = math.isclose(lr, self.base_lr())
        if default and at_base:
            return self.base_spec(model, seed)
        overrides = {} if default else {"classifier": pooling}
        extra = {} if at_base else {"optim": {"lr": lr}}
        label = f"{model}, {POOLINGS[pooling]}, lr {rate_text(lr)}, seed {seed}"
        return self.spec(model, seed, label, overrides=overrides, extra=extra)

    def grid(self, rates: list[float] | None = None) -> dict[str, dict[float, RunSpec]]:
        """Phase 1: every pooling at every rate (:meth:`rates` unless given), at the first seed."""
        rates = self.rates() if rates is None else rates
        return {p: {lr: self.cell_spec(p, lr, self.seeds[0]) for lr in rates} for p in POOLINGS}

    def planned(self) -> bool:
        return self.finished(s for cells in self.grid().values() for s in cells.values())

    def chosen(self) -> dict[str, float | None] | None:
        """Each pooling's rate, chosen on the minival once the whole grid is finished (else None)."""
        if not self.planned():
            return None
        return {p: self.choose_on_minival({lr: [s] for lr, s in cells.items()}) for p, cells in self.grid().items()}

    @staticmethod
    def arm_rates(chosen: dict[str, float | None]) -> list[float]:
        """The chosen rates, each once: every pooling runs at all of them."""
        return sorted({lr for lr in chosen.values() if lr is not None})

    def runs(self) -> list[RunSpec]:
        out = [s for cells in self.grid().values() for s in cells.values()]
        chosen = self.chosen()
        if chosen:
            rates = self.arm_rates(chosen)
            out += [self.cell_spec(p, lr, s) for s in self.seeds[1:] for p in POOLINGS for lr in rates]
        return out

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        shots, rates, first = shots_label(results), self.rates(), self.seeds[0]
        grid = self.grid()
        chosen = {p: best_on_minival({lr: results.get(s.key) for lr, s in cells.items()}) for p, cells in grid.items()}
        arm_rates = self.arm_rates(chosen)
        seeds = [  # the seeds whose runs at every chosen rate are finished (all, once the plan is)
            s for s in self.seeds if all(self.cell_spec(p, lr, s).key in results for p in POOLINGS for lr in arm_rates)
        ]
        cells = []
        for p in POOLINGS:
            for lr in rates:
                at = seeds if any(math.isclose(lr, c) for c in arm_rates) else [first]
                res = [results[self.cell_spec(p, lr, s).key] for s in at]
                cells.append({
                    "pooling": p, "lr": lr, "rate": rate_text(lr), "seeds": at,
                    "chosen": chosen[p] is not None and math.isclose(lr, chosen[p]),
                    "minival_seed0": res[0].get("minival_top1"),
                    "minival_top1": [r.get("minival_top1") for r in res], "test_top1": self.top1(res),
                    "fewshot": self.fewshot(res), "curves": [r.get("minival_curve") or [] for r in res],
                })  # fmt: skip
        position = {p: grid_position(chosen[p], rates) for p in POOLINGS}
        numbers: dict[str, Any] = {"rates": rates, "grid_seed": first, "seeds": seeds, "chosen": chosen,
                                   "position": position, "cells": cells}  # fmt: skip
        header = ["pooling", "learning rate", "seeds", f"minival top-1, seed {first}", "test top-1", shots]
        rows = []
        for c in cells:
            mark = " (chosen)" if c["chosen"] else ""
            rows.append([POOLINGS[c["pooling"]], c["rate"] + mark, str(len(c["seeds"])), pct([c["minival_seed0"]]),
                         pct(c["test_top1"]), pct(c["fewshot"])])  # fmt: skip
        verdict, numbers["comparisons"] = self.verdict(numbers)
        section = self.section(header, rows, numbers, verdict)
        section.headline = sentence_from(verdict, "Against Figure 9:")
        section.caption = (
            f"Measured (in percent): the minival top-1 of seed {first} chooses each pooling's rate; test top-1 and "
            "transfer are the mean ± standard deviation over the seeds run at that rate"
        )
        section.figures.append(plot_pooling(numbers, self.suite.out / "figures" / "pooling.png"))
        return section

    def verdict(self, numbers: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The verdict sentence and the paired intervals it rests on (points of test top-1).

        Args:
            numbers: the section's numbers (cells, chosen rates, their places in the grid).

        Returns:
            The sentence and ``{comparison: interval or None}``.
        """
        chosen, position, rates = numbers["chosen"], numbers["position"], numbers["rates"]
        choice = "; ".join(position_clause(NAMES[p], chosen[p], position[p], rates) for p in POOLINGS)
        text = f"By the minival of seed {numbers['grid_seed']}, the best rate is: {choice}."
        tok, gap = chosen["token"], chosen["gap"]
        if tok is None or gap is None:
            return text + " Without a rate for each pooling there is nothing to compare.", {}

        def arm(p: str, lr: float) -> list[Any]:
            cell = next(c for c in numbers["cells"] if c["pooling"] == p and math.isclose(c["lr"], lr))
            return cell["test_top1"]

        def interval(a: list[Any], b: list[Any]) -> dict[str, Any] | None:
            diff = paired_difference(a, b)
            return None if diff is None else diff.scaled(100).to_dict()

        own = (arm("token", tok), arm("gap", gap))
        comparisons: dict[str, Any] = {"token_minus_gap_own_rates": interval(*own)}
        order = "lower than" if gap < tok else "higher than" if gap > tok else "the same as"
        parts = [
            f"On the minival of seed {numbers['grid_seed']} alone, GAP's rate is {order} the class token's "
            "(the paper: 3e-4 against 8e-4, lower)"
        ]
        parts.append("each at its own rate, on test top-1 " + lead("the class token", own[0], "GAP", own[1]))
        if math.isclose(tok, gap):
            parts.append("the minival chose one rate for both, so GAP at the class token's rate is GAP at its own")
        else:
            mine, theirs = arm("gap", gap), arm("gap", tok)
            comparisons["gap_own_minus_gap_at_token_rate"] = interval(mine, theirs)
            parts.append(lead("GAP at its own rate", mine, "GAP at the class token's rate", theirs))
            mine, theirs = arm("token", tok), arm("token", gap)
            comparisons["token_own_minus_token_at_gap_rate"] = interval(mine, theirs)
            parts.append(lead("the class token at its own rate", mine, "the class token at GAP's rate", theirs))
        text += " " + "; ".join(parts) + ". " + self.agreement(comparisons, order, numbers["seeds"])
        return text, comparisons

    @staticmethod
    def agreement(comparisons: dict[str, Any], order: str, seeds: list[int]) -> str:
        """How the measured pattern reads against Figure 9's three parts.

        Args:
            comparisons: the paired intervals of :meth:`verdict`, in points (None: not weighed).
            order: GAP's chosen rate against the class token's (``lower than``...).
            seeds: the seeds run at the chosen rates.

        Returns:
            One sentence.
        """
        own = comparisons.get("token_minus_gap_own_rates")
        worse = comparisons.get("gap_own_minus_gap_at_token_rate")
        said = [Pooling.rates_agreement(order, worse, comparisons.get("token_own_minus_token_at_gap_rate"), seeds)]
        if len(seeds) < 2:
            said.append(f"with {len(seeds)} seed at the chosen rates no accuracy difference is weighed (2 at least)")
            return "Against Figure 9: " + "; ".join(said) + "."
        if own is None:
            said.append("the two at their own rates are not weighed")
        elif own["low"] > 0 or own["high"] < 0:
            said.append("at their own rates one pooling leads, where the paper finds them equal")
        else:
            said.append(
                "at their own rates the interval holds zero, as the paper's equal accuracy would give "
                "(not distinguishable is not proof of equality)"
            )
        if "gap_own_minus_gap_at_token_rate" not in comparisons:
            pass  # one rate for both: nothing to say of GAP at the other's
        elif worse is None:
            said.append("GAP at the class token's rate is not weighed against GAP at its own")
        elif worse["low"] > 0:
            said.append("GAP at the class token's rate is worse, as in the paper")
        else:
            said.append("GAP at the class token's rate is not shown worse, unlike the paper")
        return "Against Figure 9: " + "; ".join(said) + "."

    @staticmethod
    def rates_agreement(
        order: str, gap_own: dict[str, Any] | None, token_own: dict[str, Any] | None, seeds: list[int]
    ) -> str:
        """Figure 9's first part (GAP wants a lower rate than the class token) against what the
        seeds show. The rates are chosen on one seed's minival, which carries no interval: the order
        is said to hold only where every seed's test top-1 bears it out, each pooling better at its
        own rate than at the other's by an interval that excludes zero; otherwise the order is one
        seed's choice and not a test of the paper's.

        Args:
            order: GAP's chosen rate against the class token's (``lower than``, ``higher than``,
                ``the same as``).
            gap_own: GAP at its own rate minus GAP at the class token's, paired by seed (points).
            token_own: the class token at its own rate minus at GAP's.
            seeds: the seeds run at the chosen rates.

        Returns:
            A clause.
        """
        if order == "the same as":
            return "one seed's minival chose the same rate for both poolings, where the paper's GAP wants a lower one"
        paper = "as in" if order == "lower than" else "unlike"

        def better(iv: dict[str, Any] | None) -> bool:
            return iv is not None and iv["low"] > 0

        if better(gap_own) and better(token_own):
            return (
                f"GAP's best rate is {order} the class token's, {paper} the paper: chosen on one seed's minival "
                f"and borne out on test top-1 over {len(seeds)} seeds, each pooling better at its own rate than at "
                "the other's"
            )
        unshown = [name for name, iv in (("GAP", gap_own), ("the class token", token_own)) if not better(iv)]
        return (
            f"GAP's chosen rate is {order} the class token's ({paper} the paper) on one seed's minival only: over "
            f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} {' and '.join(unshown)} "
            f"{'is' if len(unshown) == 1 else 'are'} not shown better at its own rate than at the other's, so the "
            "order of the rates is not a test of the paper's"
        )
