"""The paper's experiments: for each, the runs it needs and what their numbers say.

Each experiment reads its YAML file (``configs/reproduce/<name>.yaml``: the figure or table it
follows, the paper's claim and numbers, its models and sizes), asks for runs
(:meth:`Experiment.runs`) and, once they are finished, turns their results into a
:class:`Section` of the report: a table, the numbers, a figure and one sentence on whether the
measurement agrees with the paper. The sentence is computed from the numbers, never written in
advance: a difference is claimed only where its interval (:mod:`.stats`, paired by seed) excludes
zero, and said to be not distinguishable otherwise.

An experiment may plan in phases: a learning rate chosen on the minival by a first set of runs
fixes the runs that follow. :meth:`Experiment.runs` then returns what can be planned from the
finished results, and :meth:`Experiment.planned` says whether that is the whole plan.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...models.registry import model_config
from .results import load_result, nonfinite_fields
from .spec import RunSpec, Suite, load_experiment
from .stats import compare

GridArms = Callable[[list[float]], list[dict[float, list[RunSpec]]]]
"""The runs of each arm of a learning-rate grid (a family, a pooling, a size) by rate, for a grid."""


def grid_arms(grid: dict[str, dict[float, RunSpec]]) -> list[dict[float, list[RunSpec]]]:
    """A grid of one run a rate per arm, as :meth:`Experiment.bracketed` takes its arms."""
    return [{lr: [spec] for lr, spec in cells.items()} for cells in grid.values()]


def _next_rate(edge: list[float]) -> float:
    """The grid's rate one step past an edge, its pattern continued: with ``edge`` the rates from
    that edge inwards, the edge rate times the ratio between the next two (a 1-3-10 grid goes on
    to 30, a doubling one doubles), to one significant digit; from a grid of two, their ratio.

    Args:
        edge: the edge rate and the one or two rates next to it, in order from the edge.

    Returns:
        The new rate.
    """
    step = edge[1] / edge[2] if len(edge) > 2 else edge[0] / edge[1]
    return float(f"{edge[0] * step:.1g}")


@dataclass
class Section:
    """One experiment's part of the report."""

    name: str
    follows: str
    claim: str
    paper: str
    header: list[str]
    rows: list[list[str]]
    numbers: dict[str, Any]
    verdict: str
    figures: list[Path] = field(default_factory=list)
    caption: str = "Measured (mean ± standard deviation over seeds, in percent)"
    headline: str = ""  # the sentence the report's summary shows (its agreement with the paper); "": the first
    # more tables after the main one: (caption, header, rows)
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    runs: int = 0  # training runs the experiment needs
    wall_seconds: float = 0.0  # their wall time, training and scoring: what running it alone costs


def finite(values: list[Any]) -> list[float]:
    """The values that are finite numbers: a diverged run's nan or inf (or a missing value) is left out.

    Args:
        values: numbers, one per run.

    Returns:
        The finite ones, in order.
    """
    return [float(v) for v in values if _is_finite(v)]


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def mean_std(values: list[Any]) -> tuple[float, float]:
    """Mean and sample standard deviation of the finite values (0 for one value; nan for none,
    which only a figure may take: every claim goes through :func:`mean_of`).

    Args:
        values: numbers, one per run.

    Returns:
        ``(mean, standard deviation)``.
    """
    ok = finite(values)
    if not ok:
        return math.nan, math.nan
    return statistics.fmean(ok), statistics.stdev(ok) if len(ok) > 1 else 0.0


def mean_of(values: list[Any]) -> float | None:
    """The mean of the finite values, or None when no value is finite (nothing to compare).

    Args:
        values: numbers, one per run.

    Returns:
        The mean, or None.
    """
    ok = finite(values)
    return statistics.fmean(ok) if ok else None


def dropped(values: list[Any]) -> str:
    """How many values a statistic left out, for the text after it.

    Args:
        values: numbers, one per run.

    Returns:
        `` (1 of 3 not finite, left out)`` when some are not finite numbers, else ``""``.
    """
    n = len(values) - len(finite(values))
    return f" ({n} of {len(values)} not finite, left out)" if n else ""


def pct(values: list[Any]) -> str:
    """A table cell: mean and spread over seeds in percent, of the finite values alone.

    Args:
        values: accuracies, one per seed.

    Returns:
        ``71.23 ± 0.40`` (the spread when there are several), followed by how many were left out
        if any were; ``diverged (not finite)`` when none is finite.
    """
    ok = finite(values)
    if not ok:
        return "diverged (not finite)"
    m, s = mean_std(ok)
    text = f"{100 * m:.2f} ± {100 * s:.2f}" if len(ok) > 1 else f"{100 * m:.2f}"
    return text + dropped(values)


def points(value: float | None) -> str:
    """A difference for a sentence.

    Args:
        value: points (from :func:`gap`), or None where a side had no finite result.

    Returns:
        ``+1.2 points``, or ``no comparison (a side diverged)``.
    """
    return "no comparison (a side diverged)" if value is None else f"{value:+.1f} points"


def gap(a: list[Any], b: list[Any]) -> float | None:
    """The difference of two means in points, each over its finite values.

    Args:
        a: accuracies, one per seed.
        b: likewise.

    Returns:
        ``a``'s mean minus ``b``'s times 100, or None if either has no finite value.
    """
    ma, mb = mean_of(a), mean_of(b)
    return None if ma is None or mb is None else 100 * (ma - mb)


def lead(name_a: str, a: list[Any], name_b: str, b: list[Any]) -> str:
    """Which of two arms is ahead, paired by seed: a lead is said only when the 95% t interval
    of the per-seed differences excludes zero (:mod:`.stats`), "not distinguishable" otherwise.
    Only pairs with finite values on both sides count, and the ones left out are said.

    Args:
        name_a: what ``a`` measures, for the sentence.
        a: its accuracies, one per seed.
        name_b: likewise for ``b``.
        b: its accuracies, in the same seed order.

    Returns:
        A clause: ``the ViT leads the ResNet by 1.2 points (95% CI 0.3 to 2.1, 3 seeds)``.
    """
    fa, fb = finite(a), finite(b)
    if not fa or not fb:
        empty = " and ".join(n for n, f in ((name_a, fa), (name_b, fb)) if not f)
        return f"{name_a} is not compared with {name_b} ({empty}: no finite result, every run diverged)"
    text = compare(name_a, a, name_b, b)
    left_out = len(a) + len(b) - len(fa) - len(fb)
    if left_out:
        text += f" ({left_out} of {len(a) + len(b)} results not finite, left out)"
    return text


def sentence_from(text: str, *starts: str) -> str:
    """The sentence of ``text`` that begins with one of ``starts`` (the first found), or "".

    Args:
        text: a verdict.
        starts: the openings to look for, e.g. ``"Against Figure 9:"``.

    Returns:
        That sentence, up to its full stop.
    """
    for start in starts:
        i = text.find(start)
        if i >= 0:
            return first_sentence(text[i:])
    return ""


def note_diverged(section: Section, specs: list[RunSpec], results: dict[str, dict[str, Any]]) -> None:
    """Name, at the head of the verdict and in the numbers, the runs whose accuracies are not
    finite numbers: the tables and claims leave those numbers out.

    Args:
        section: the experiment's section, changed in place.
        specs: the experiment's runs.
        results: their results by key.
    """
    bad = {}
    for spec in specs:
        fields = nonfinite_fields(results[spec.key])
        if fields and spec.key not in bad:
            bad[spec.key] = {"label": spec.label, "file": f"runs/{spec.key}/result.json", "not_finite": fields}
    if not bad:
        return
    names = "; ".join(f"{b['label']} (`{b['file']}`: {', '.join(b['not_finite'])})" for b in bad.values())
    section.verdict = (
        f"{len(bad)} run(s) diverged or failed, their numbers left out of every mean and comparison: {names}. "
        + section.verdict
    )
    section.numbers["diverged"] = list(bad.values())


class Experiment:
    """The common part: the experiment's file, the suite, and the results by run."""

    name = ""

    def __init__(self, suite: Suite) -> None:
        self.suite = suite
        self.cfg = load_experiment(self.name, suite.budget)
        self.seeds = list(range(suite.seeds_given or int(self.cfg.get("seeds", suite.seeds))))

    def runs(self) -> list[RunSpec]:
        """The runs the experiment needs, as far as the finished ones let it plan."""
        raise NotImplementedError

    def planned(self) -> bool:
        """Whether :meth:`runs` is the whole plan (a phased experiment: once its first phase is finished)."""
        return True

    def finished(self, specs: Iterable[RunSpec]) -> bool:
        """Whether every run of ``specs`` has a result (always, when only counting runs: ``--plan``)."""
        return self.suite.planning or all(self.result_of(s) is not None for s in specs)

    def result_of(self, spec: RunSpec) -> dict[str, Any] | None:
        """The finished result of ``spec``, or None (not run, not finished, or damaged)."""
        return load_result(self.suite.run_dir(spec) / "result.json")[0]

    def choose_on_minival(self, specs: dict[Any, list[RunSpec]]) -> Any | None:
        """The option whose runs have the best mean minival top-1 (never the test split), or None
        until all of them are finished or if none has a finite result.

        Args:
            specs: the runs of each option (e.g. each learning rate of a grid).

        Returns:
            The chosen option.
        """
        if self.suite.planning:  # counting runs: which option wins changes no count or cost
            return next(iter(specs), None)
        means = {}
        for option, runs in specs.items():
            results = [self.result_of(s) for s in runs]
            if any(r is None for r in results):
                return None
            m = mean_of([r.get("minival_top1") for r in results if r is not None])
            if m is not None:
                means[option] = m
        return max(means, key=means.__getitem__) if means else None

    def bracketed(self, rates: Iterable[float], arms: GridArms) -> list[float]:
        """A learning-rate grid extended past an edge where the minival's best sits on it: once
        every run of the grid is finished, the next rate beyond (:func:`_next_rate`) joins it on
        the side of any arm whose choice is the grid's lowest or highest rate, at most
        ``extend_grid`` steps each way (0: never). A planning suite counts the configured grid.

        Args:
            rates: the configured grid.
            arms: the runs of each arm (a family, a pooling, a size) by rate, for a given grid;
                each arm chooses its own rate.

        Returns:
            The grid, ascending, with the rates it gained.
        """
        grid = sorted({float(r) for r in rates})
        steps = int(self.cfg.get("extend_grid", 0))
        if self.suite.planning or len(grid) < 2 or steps < 1:
            return grid
        below = above = 0
        while below < steps or above < steps:
            chosen = [self.choose_on_minival(options) for options in arms(grid)]
            if any(c is None for c in chosen):  # unfinished, or every run of an arm diverged
                break
            low = below < steps and any(math.isclose(c, grid[0]) for c in chosen)
            high = above < steps and any(math.isclose(c, grid[-1]) for c in chosen)
            if not (low or high):
                break
            if low:
                grid.insert(0, _next_rate(grid[:3]))
                below += 1
            if high:
                grid.append(_next_rate(grid[::-1][:3]))
                above += 1
        return grid

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        raise NotImplementedError

    def section(self, header: list[str], rows: list[list[str]], numbers: dict[str, Any], verdict: str) -> Section:
        c = self.cfg
        return Section(self.name, c["follows"], " ".join(c["claim"].split()), " ".join(c["paper"].split()),
                       header, rows, numbers, verdict)  # fmt: skip

    def spec(self, model: str, seed: int, label: str, **recipe: Any) -> RunSpec:
        """A run of ``model`` (a role of common.yaml) with the suite's recipe and ``recipe``'s extras."""
        tree = self.suite.recipe(model, seed, experiment=self.cfg, **recipe)
        return RunSpec(label=label, model=model, recipe=tree)

    def base_spec(self, model: str, seed: int) -> RunSpec:
        """``model`` trained on the whole split with the common recipe alone: the run that the
        experiments share (the compute study's longer length, the learned 1-D and class-token
        baselines, the models the attention study analyses)."""
        tree = self.suite.recipe(model, seed)
        return RunSpec(label=f"{model}, all images, seed {seed}", model=model, recipe=tree)

    def default_of(self, model: str, option: str) -> Any:
        section = self.suite.model_section(model)
        return getattr(model_config(section["name"], **section["overrides"]), option)

    @staticmethod
    def fewshot(results: list[dict[str, Any]]) -> list[float]:
        return [r["fewshot"]["mean"] for r in results]

    @staticmethod
    def top1(results: list[dict[str, Any]]) -> list[float]:
        return [r["test_top1"] for r in results]


def shots_label(results: dict[str, dict[str, Any]]) -> str:
    first = next(iter(results.values()), None)
    return f"{first['fewshot']['shots']}-shot" if first else "few-shot"


def first_sentence(text: str) -> str:
    """The first sentence of a verdict (up to the first full stop that ends a sentence)."""
    match = re.search(r"(?<!\d)\.(\s|$)", text)
    return text if match is None else text[: match.start() + 1]
