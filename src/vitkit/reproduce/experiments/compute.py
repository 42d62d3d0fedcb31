"""``compute`` (Figure 5): accuracy against total training compute for BiT ResNets, ViTs and
R+ViT hybrids, each model trained on the whole split at three lengths (the paper: 7 and 14 epochs)
at its family's learning rate, chosen on the minival of the family's cheapest model.

Compute is counted two ways: training FLOPs (3 x forward FLOPs x images seen) and training
seconds on the machine at hand. Each seed's runs of a family make a frontier (the best accuracy
reached for at most a cost, linear in log cost between the runs on it); two families are compared
on those frontiers at matched cost, seed by seed, over the range of cost both span.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import UsageError
from ..core.experiment import (
    Experiment,
    Section,
    finite,
    grid_arms,
    mean_of,
    pct,
    sentence_from,
    shots_label,
)
from ..core.registry import register
from ..core.spec import RunSpec
from ..core.stats import mean_interval, paired_difference
from ..core.wording import Contrast
from ..core.wording import contrasts as weigh_contrasts
from .compute_text import (
    agreement,
    contrast_name,
    contrast_text,
    leader,
    primary_text,
    rates_text,
    scale_text,
    target_text,
)
from .figures import plot_compute
from .frontier import cost_to_reach, error_cut, frontier_slope, matched, pareto_front
from .pooling import grid_position, rate_text


def scaled_length(recipe: dict[str, Any], factor: float) -> dict[str, Any]:
    """The ``extra`` of a run ``factor`` times as long as ``recipe``'s: its steps, warm-up and the
    steps between evaluations, checkpoints and log lines scaled alike (a whole schedule of its own,
    evaluated as often).

    Args:
        recipe: a run's whole recipe tree (``Suite.recipe``).
        factor: the length against the recipe's (0.5: half the steps).

    Returns:
        ``{"train": {"steps": ...}, "optim": {"warmup_steps": ...}, "log": {...}}``.
    """
    train, optim, log = recipe.get("train", {}), recipe.get("optim", {}), recipe.get("log", {})
    if "steps" not in train:
        raise UsageError("a run's length can be scaled only when the recipe names its train.steps")
    extra: dict[str, Any] = {"train": {"steps": max(1, round(train["steps"] * factor))}}
    if "warmup_steps" in optim:
        extra["optim"] = {"warmup_steps": round(optim["warmup_steps"] * factor)}
    every = {k: max(1, round(log[k] * factor)) for k in ("eval_every", "checkpoint_every", "log_every") if log.get(k)}
    if every:  # 0 (only after the last step) stays 0
        extra["log"] = every
    return extra


def _seconds(res: dict[str, Any]) -> float:
    """A run's training time (the wall time with scoring where the training time was not logged)."""
    t = res.get("train_seconds")
    return float(t) if finite([t]) else float(res.get("wall_seconds") or math.nan)


def _fastest(seconds: list[float]) -> list[float]:
    """Each seed's training time replaced by the fastest seed's. The seeds of a model at a length
    do the same computation (only the order of the images differs), and time taken from the run by
    other work on a shared machine only adds: the fastest is the best estimate of the run's cost."""
    finite_times = [s for s in seconds if math.isfinite(s)]
    return [min(finite_times)] * len(seconds) if finite_times else seconds


def _points_of(values: list[Any]) -> list[float]:
    """Fractions as points (nan stays nan)."""
    return [100 * float(v) for v in values]


def _minival(results: dict[str, dict[str, Any]], spec: RunSpec) -> float | None:
    return (results.get(spec.key) or {}).get("minival_top1")


def _seconds_cell(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:,.0f}" if seconds >= 10 else f"{seconds:.1f}"


def _diff(a: list[float], b: list[float]) -> dict[str, Any] | None:
    """The paired interval of ``a - b`` in points, as JSON-ready numbers (None below two pairs)."""
    d = paired_difference(a, b)
    return None if d is None else d.scaled(100).to_dict()


@register
class Compute(Experiment):
    name = "compute"

    def families(self) -> dict[str, dict[str, Any]]:
        """The families with a model that runs: ``{role: {"title", "models"}}``, models in cost order."""
        fams = self.cfg["families"]
        chosen = self.cfg.get("models") or [m for f in fams.values() for m in f["models"]]
        known = {m for f in fams.values() for m in f["models"]}
        if unknown := [m for m in chosen if m not in known]:
            raise UsageError(f"compute: models {', '.join(unknown)} belong to no family of compute.yaml")
        out = {}
        for role, f in fams.items():
            models = [m for m in f["models"] if m in chosen]
            if models:
                out[role] = {"title": str(f["title"]), "models": models}
        return out

    def lengths(self) -> list[float]:
        """The training lengths, as fractions of the budget's steps, shortest first."""
        return sorted({float(x) for x in self.cfg["lengths"]})

    def base_lr(self) -> float:
        """The common recipe's learning rate (the runs at it and the common length are shared)."""
        return float(self.suite.recipe(next(iter(self.families().values()))["models"][0], 0)["optim"]["lr"])

    def run_spec(self, model: str, length: float, seed: int, lr: float | None = None) -> RunSpec:
        """``model`` trained on every image for ``length`` times the budget's steps at rate ``lr``.

        Args:
            model: a role of common.yaml.
            length: a fraction of the budget's steps (1.0 at the common rate: the shared run of
                the common recipe).
            seed: the run's seed.
            lr: the learning rate (None: the common recipe's).

        Returns:
            The run.
        """
        at_base = lr is None or math.isclose(lr, self.base_lr())
        if length == 1.0 and at_base:
            return self.base_spec(model, seed)  # the shared run
        recipe = self.suite.recipe(model, seed)
        extra = {} if length == 1.0 else scaled_length(recipe, length)
        if not at_base:
            extra["optim"] = {**extra.get("optim", {}), "lr": lr}
        steps = extra.get("train", {}).get("steps", recipe["train"]["steps"])
        rate = "" if at_base else f", lr {rate_text(float(lr))}"
        return self.spec(model, seed, f"{model}, all images, {steps} steps{rate}, seed {seed}", extra=extra)

    def rates(self, role: str) -> list[float]:
        """One family's learning rates, ascending: the configured grid and the rates it gained
        past an edge where that family's best sat (each family brackets its own optimum, so that a
        family whose best lies far from the others' costs no runs of theirs)."""
        return self.bracketed(self.cfg["learning_rates"], lambda rates: grid_arms({role: self.cells(role, rates)}))

    def cells(self, role: str, rates: list[float]) -> dict[float, RunSpec]:
        """A family's cheapest model at each of ``rates``, at the common length and the first seed."""
        model = self.families()[role]["models"][0]
        return {lr: self.run_spec(model, 1.0, self.seeds[0], lr) for lr in rates}

    def grid(self) -> dict[str, dict[float, RunSpec]]:
        """Phase 1: each family's cheapest model at every rate of its grid (:meth:`rates`)."""
        return {role: self.cells(role, self.rates(role)) for role in self.families()}

    def planned(self) -> bool:
        return self.finished(s for cells in self.grid().values() for s in cells.values())

    def chosen(self) -> dict[str, float | None] | None:
        """Each family's rate, chosen on its grid's minival once the grid is finished (else None);
        None for a family none of whose grid runs has a finite minival."""
        if not self.planned():
            return None
        grid = self.grid()
        return {role: self.choose_on_minival({lr: [s] for lr, s in cells.items()}) for role, cells in grid.items()}

    def family_runs(self, role: str, lr: float) -> list[RunSpec]:
        """Phase 2: every model of a family at every length and seed, at the family's rate."""
        models = self.families()[role]["models"]
        return [self.run_spec(m, length, s, lr) for m in models for length in self.lengths() for s in self.seeds]

    def runs(self) -> list[RunSpec]:
        out = [s for cells in self.grid().values() for s in cells.values()]
        for role, lr in (self.chosen() or {}).items():
            if lr is not None:
                out += self.family_runs(role, lr)
        return list({s.key: s for s in out}.values())

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        shots = shots_label(results)
        header = ["family", "model", "lr", "steps", "training GFLOPs", "training s", "test top-1", shots]
        rows, families = [], {}
        chosen = self.chosen() or {}
        for role, fam in self.families().items():
            lr = chosen.get(role)
            if lr is None:  # every grid run diverged: the family has no rate, and no runs
                continue
            entries = []
            for m in fam["models"]:
                for length in self.lengths():
                    specs = [self.run_spec(m, length, s, lr) for s in self.seeds]
                    res = [results[s.key] for s in specs]
                    steps = int(specs[0].recipe["train"]["steps"])
                    e = {
                        "model": m, "title": self.suite.model_title(m), "length": length, "steps": steps, "lr": lr,
                        "label": f"{m} at {steps} steps",
                        "train_flops": [float(r["train_flops"]) for r in res],
                        "train_seconds": _fastest([_seconds(r) for r in res]),
                        "test_top1": self.top1(res), "fewshot": self.fewshot(res),
                    }  # fmt: skip
                    entries.append(e)
                    flops, secs = mean_of(e["train_flops"]), mean_of(e["train_seconds"])
                    rows.append([
                        fam["title"], e["title"], rate_text(lr), str(steps),
                        "—" if flops is None else f"{flops / 1e9:,.0f}", _seconds_cell(secs),
                        pct(e["test_top1"]), pct(e["fewshot"]),
                    ])  # fmt: skip
            families[role] = {"title": fam["title"], "entries": entries}
        numbers: dict[str, Any] = {"lengths": self.lengths(), "grid": self.grid_numbers(results), "families": families}
        numbers["fronts"] = {cost: self.front(families, cost) for cost in ("train_flops", "train_seconds")}
        numbers["matched"] = {
            cost: {f"{a}-{b}": self.compare(families, a, b, cost) for a, b in self.pairs(families)}
            for cost in ("train_flops", "train_seconds")
        }
        numbers["slopes"] = self.slopes(families)
        numbers["target"] = self.target(families)
        numbers["contrasts"] = self.contrast_numbers(self.contrasts(numbers))
        figure = plot_compute(numbers, self.suite.out / "figures" / "compute.png", shots)
        section = self.section(header, rows, numbers, self.verdict(numbers))
        section.headline = sentence_from(section.verdict, "Figure 5 finds")
        section.caption = (
            "Measured (mean ± standard deviation over seeds, in percent; lr: the family's rate, chosen on the "
            "minival; training s: the machine's training time, the fastest of the seeds', as other work on the "
            "machine only adds to it)"
        )
        section.figures.append(figure)
        return section

    def grid_numbers(self, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Phase 1 as numbers: the configured rates, each family's model, its grid (the configured
        rates and those it gained), its minival top-1 at each rate, the rate chosen and where it
        lies in the family's grid.

        Args:
            results: the finished runs by key.

        Returns:
            ``{"rates", "seed", "families": {role: {"model", "rates", "minival_top1", "chosen",
            "position"}}}``.
        """
        chosen = self.chosen() or {}
        rates = sorted(float(r) for r in self.cfg["learning_rates"])
        out: dict[str, Any] = {"rates": rates, "seed": self.seeds[0], "families": {}}
        for role, cells in self.grid().items():
            lr, own = chosen.get(role), sorted(cells)
            out["families"][role] = {
                "model": self.families()[role]["models"][0],
                "rates": own,
                "minival_top1": {rate_text(r): _minival(results, s) for r, s in cells.items()},
                "chosen": lr,
                "position": grid_position(lr, own),
            }
        return out

    def slopes(self, families: dict[str, Any]) -> dict[str, Any]:
        """Each family's frontier slope per seed (:func:`frontier_slope` on training FLOPs), their
        mean with its interval, and the paired difference of each pair of families.

        Args:
            families: ``numbers["families"]`` of :meth:`summarise`.

        Returns:
            ``{"families": {role: {"per_seed", "mean"}}, "pairs": {"a-b": interval or None}}``.
        """
        per = {role: [frontier_slope(pts) for pts in self._points(f["entries"], "train_flops")]
               for role, f in families.items()}  # fmt: skip
        out: dict[str, Any] = {"families": {}, "pairs": {}}
        for role, values in per.items():
            iv = mean_interval(values)
            out["families"][role] = {"per_seed": values, "mean": None if iv is None else iv.to_dict()}
        for a, b in self.pairs(families):
            d = paired_difference(per[a], per[b])
            out["pairs"][f"{a}-{b}"] = None if d is None else d.to_dict()
        return out

    def contrasts(self, numbers: dict[str, Any]) -> dict[str, Any]:
        """The primary contrast (the ViTs against the ResNets at matched training FLOPs, over the
        range both span) at the plain level, and every other comparison the verdict makes
        Holm-adjusted together: the other pairs at matched FLOPs, the hybrids against the ViTs at
        each end of their range, the ViTs against the ResNets at matched seconds, and the pairs'
        frontier slopes.

        Args:
            numbers: :meth:`summarise`'s numbers so far (``families``, ``matched``, ``slopes``).

        Returns:
            ``{"primary": Contrast or None, "others": {name: Contrast}}``; a contrast's ``diff`` in
            points (slopes: in exponent units).
        """
        fams = numbers["families"]
        points: dict[str, tuple[list[Any], list[Any], float]] = {}
        for cost in ("train_flops", "train_seconds"):
            for pair, cmp in numbers["matched"][cost].items():
                for where in ("mean", "low", "high"):
                    if cost == "train_seconds" and (pair != "vit-cnn" or where != "mean"):
                        continue
                    if where != "mean" and pair != "hybrid-vit":
                        continue
                    points[f"{cost}:{pair}:{where}"] = (_points_of(cmp[f"a_{where}"]), _points_of(cmp[f"b_{where}"]))
        slopes = numbers["slopes"]["families"]
        cuts = {role: [error_cut(b) for b in f["per_seed"]] for role, f in slopes.items()}
        for role, values in cuts.items():
            points[f"slope0:{role}"] = (values, [0.0 if math.isfinite(v) else math.nan for v in values])
        for a, b in self.pairs(fams):
            points[f"slope:{a}-{b}"] = (cuts[a], cuts[b])
        names = {k: contrast_name(k, numbers) for k in points}
        primary_key = "train_flops:vit-cnn:mean"
        first = (names[primary_key], *points.pop(primary_key)) if primary_key in points else ("", [], [])
        weighed, rest = weigh_contrasts(first, {names[k]: ab for k, ab in points.items()}, scale=1.0)
        primary = weighed if primary_key in names else None
        others = dict(zip(points, rest, strict=True))
        return {"primary": primary, "others": others}

    @staticmethod
    def contrast_numbers(weighed: dict[str, Any]) -> dict[str, Any]:
        """:meth:`contrasts` as JSON-ready numbers, each with its name.

        Args:
            weighed: :meth:`contrasts`' result.

        Returns:
            ``{"primary": {...} or None, "others": {key: {...}}}``.
        """

        def one(c: Contrast | None) -> dict[str, Any] | None:
            return None if c is None else {"name": c.name, **c.to_dict()}

        return {"primary": one(weighed["primary"]), "others": {k: one(c) for k, c in weighed["others"].items()}}

    @staticmethod
    def pairs(families: dict[str, Any]) -> list[tuple[str, str]]:
        """The comparisons Figure 5 makes, of the families present: ViT against ResNet, the hybrid
        against the ViT and against the ResNet."""
        return [
            (a, b) for a, b in (("vit", "cnn"), ("hybrid", "vit"), ("hybrid", "cnn")) if a in families and b in families
        ]

    def _points(self, entries: list[dict[str, Any]], cost: str, metric: str = "test_top1") -> list[list[tuple]]:
        """Per seed, the ``(cost, accuracy)`` of each of a family's runs."""
        return [[(e[cost][i], e[metric][i]) for e in entries] for i in range(len(self.seeds))]

    @staticmethod
    def front(families: dict[str, Any], cost: str) -> list[str]:
        """The runs on the Pareto front of mean test top-1 against mean ``cost``.

        Args:
            families: ``numbers["families"]`` of :meth:`summarise`.
            cost: ``train_flops`` or ``train_seconds``.

        Returns:
            The runs' labels, cheapest first.
        """
        pts = []
        for fam in families.values():
            for e in fam["entries"]:
                c, a = mean_of(e[cost]), mean_of(e["test_top1"])
                if c is not None and a is not None:
                    pts.append((c, a, e["label"]))
        return pareto_front(pts)

    def compare(self, families: dict[str, Any], a: str, b: str, cost: str) -> dict[str, Any]:
        """Family ``a`` against ``b`` on test top-1 at matched ``cost``.

        Args:
            families: ``numbers["families"]`` of :meth:`summarise`.
            a: a family's role (``vit``).
            b: another's (``cnn``).
            cost: ``train_flops`` or ``train_seconds``.

        Returns:
            :func:`matched`'s numbers per seed, and the paired intervals (points, ``a - b``) of the
            mean over the shared range (``mean``) and at its ends (``at_low``, ``at_high``).
        """
        m = matched(self._points(families[a]["entries"], cost), self._points(families[b]["entries"], cost))
        return {
            **m,
            "mean": _diff(m["a_mean"], m["b_mean"]),
            "at_low": _diff(m["a_low"], m["b_low"]),
            "at_high": _diff(m["a_high"], m["b_high"]),
        }

    def target(self, families: dict[str, Any]) -> dict[str, Any]:
        """The compute each family needs for the best mean test top-1 that every family reaches,
        on the frontiers of the means over seeds.

        Args:
            families: ``numbers["families"]`` of :meth:`summarise`.

        Returns:
            ``{"top1": target or None, "flops": {role: (FLOPs, how)}}`` (:func:`cost_to_reach`).
        """
        means = {
            role: [(mean_of(e["train_flops"]), mean_of(e["test_top1"])) for e in fam["entries"]]
            for role, fam in families.items()
        }
        means = {role: [(c, a) for c, a in pts if c is not None and a is not None] for role, pts in means.items()}
        if not means or not all(means.values()):
            return {"top1": None, "flops": {}}
        top1 = min(max(a for _, a in pts) for pts in means.values())
        return {"top1": top1, "flops": {role: cost_to_reach(pts, top1) for role, pts in means.items()}}

    def verdict(self, numbers: dict[str, Any]) -> str:
        fams = numbers["families"]
        title = {role: f"the {f['title']} family" for role, f in self.families().items()}
        weighed = self.contrasts(numbers)
        primary, others = weighed["primary"], weighed["others"]
        fronts = numbers["fronts"]
        parts = [rates_text(numbers["grid"], title)]
        if missing := [title[r] for r in numbers["grid"]["families"] if r not in fams]:
            parts.append(f"{', '.join(missing)} had no rate to train at and is left out")
        parts.append(
            "the Pareto front of mean test top-1 (no run at most as costly is as accurate) is, by training FLOPs, "
            + (", ".join(fronts["train_flops"]) or "empty (no finite result)")
            + "; by training seconds on this machine, "
            + (", ".join(fronts["train_seconds"]) or "empty (no finite result)")
        )
        parts.append(target_text(numbers["target"], title))
        text = "; ".join(parts) + ". " + contrast_text(primary_text(numbers, title), others)
        text += " " + leader(primary, others, fams, title) + " " + agreement(primary, others)
        return text + " " + scale_text(fams, self.cfg.get("paper_exaflops", [50, 5000]))
