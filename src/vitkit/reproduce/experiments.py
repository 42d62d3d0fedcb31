"""The paper's experiments: for each, the runs it needs and what their numbers say.

Each experiment reads its YAML file (``configs/reproduce/<name>.yaml``: the figure or table it
follows, the paper's claim and numbers, its models and sizes), asks for runs
(:meth:`Experiment.runs`) and, once they are finished, turns their results into a
:class:`Section` of the report: a table, the numbers, a figure and one sentence on whether the
measurement agrees with the paper. The sentence is computed from the numbers, never written in
advance: where the spread over seeds is as large as a difference, it says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.registry import model_config
from .spec import RunSpec, Suite, load_experiment


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
    runs: int = 0  # training runs the experiment needs
    wall_seconds: float = 0.0  # their wall time, training and scoring: what running it alone costs


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def pct(values: list[float]) -> str:
    """``71.23 ± 0.40`` (percent; the spread over seeds when there are several)."""
    m, s = mean_std(values)
    return f"{100 * m:.2f} ± {100 * s:.2f}" if len(values) > 1 else f"{100 * m:.2f}"


def lead(name_a: str, a: list[float], name_b: str, b: list[float]) -> str:
    """Which of two sets of accuracies is ahead, by how many points, and whether that is more
    than the spread over seeds (the larger of the two standard deviations)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    diff = 100 * (ma - mb)
    first, second = (name_a, name_b) if diff >= 0 else (name_b, name_a)
    text = f"{first} leads {second} by {abs(diff):.1f} points"
    spread = 100 * max(sa, sb)
    if len(a) > 1 and len(b) > 1 and abs(diff) <= spread:
        text += f" (within the spread over seeds, {spread:.1f})"
    return text


class Experiment:
    """The common part: the experiment's file, the suite, and the results by run."""

    name = ""

    def __init__(self, suite: Suite) -> None:
        self.suite = suite
        self.cfg = load_experiment(self.name, suite.budget)
        self.seeds = list(range(int(self.cfg.get("seeds", suite.seeds))))

    def runs(self) -> list[RunSpec]:
        raise NotImplementedError

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
        experiments share (the data-scaling study's largest size, the learned 1-D and class-token
        baselines)."""
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
