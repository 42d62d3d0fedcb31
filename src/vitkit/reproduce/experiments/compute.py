"""``compute`` (Figure 5): accuracy against total training compute for BiT ResNets, ViTs and
R+ViT hybrids, each model trained on the whole split at two lengths (the paper: 7 and 14 epochs).

Compute is counted two ways: training FLOPs (3 x forward FLOPs x images seen) and training
seconds on the machine at hand. Each seed's runs of a family make a frontier (the best accuracy
reached for at most a cost, linear in log cost between the runs on it); two families are compared
on those frontiers at matched cost, seed by seed, over the range of cost both span.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import UsageError
from ..core.experiment import Experiment, Section, finite, lead, mean_of, pct, sentence_from, shots_label
from ..core.registry import register
from ..core.spec import RunSpec
from ..core.stats import Interval, paired_difference
from .figures import plot_compute
from .frontier import cost_to_reach, matched, pareto_front


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


def si(value: float, unit: str) -> str:
    """``2.4 TFLOPs``: a number with the SI prefix that keeps it between 1 and 1000.

    Args:
        value: the number (FLOPs).
        unit: the unit after the prefix.

    Returns:
        The text.
    """
    prefixes = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
    for scale, p in prefixes:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {p}{unit}"
    return f"{value:.3g} {unit}"


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


def _seconds_cell(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:,.0f}" if seconds >= 10 else f"{seconds:.1f}"


def _diff(a: list[float], b: list[float]) -> dict[str, Any] | None:
    """The paired interval of ``a - b`` in points, as JSON-ready numbers (None below two pairs)."""
    d = paired_difference(a, b)
    return None if d is None else d.scaled(100).to_dict()


def _sign(d: dict[str, Any] | None) -> int | None:
    """1 or -1 when the interval (:func:`_diff`) excludes zero on that side, 0 when it holds zero,
    None when it was not weighed."""
    if d is None:
        return None
    return 0 if not Interval(**d).excludes_zero else (1 if d["estimate"] > 0 else -1)


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

    def run_spec(self, model: str, length: float, seed: int) -> RunSpec:
        """``model`` trained on every image for ``length`` times the budget's steps.

        Args:
            model: a role of common.yaml.
            length: a fraction of the budget's steps (1.0: the shared run of the common recipe).
            seed: the run's seed.

        Returns:
            The run.
        """
        if length == 1.0:
            return self.base_spec(model, seed)  # the shared run
        extra = scaled_length(self.suite.recipe(model, seed), length)
        label = f"{model}, all images, {extra['train']['steps']} steps, seed {seed}"
        return self.spec(model, seed, label, extra=extra)

    def runs(self) -> list[RunSpec]:
        return [
            self.run_spec(m, length, s)
            for f in self.families().values()
            for m in f["models"]
            for length in self.lengths()
            for s in self.seeds
        ]

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        shots = shots_label(results)
        header = ["family", "model", "steps", "training GFLOPs", "training s", "test top-1", shots]
        rows, families = [], {}
        for role, fam in self.families().items():
            entries = []
            for m in fam["models"]:
                for length in self.lengths():
                    specs = [self.run_spec(m, length, s) for s in self.seeds]
                    res = [results[s.key] for s in specs]
                    steps = int(specs[0].recipe["train"]["steps"])
                    e = {
                        "model": m, "title": self.suite.model_title(m), "length": length, "steps": steps,
                        "label": f"{m} at {steps} steps",
                        "train_flops": [float(r["train_flops"]) for r in res],
                        "train_seconds": _fastest([_seconds(r) for r in res]),
                        "test_top1": self.top1(res), "fewshot": self.fewshot(res),
                    }  # fmt: skip
                    entries.append(e)
                    flops, secs = mean_of(e["train_flops"]), mean_of(e["train_seconds"])
                    rows.append([
                        fam["title"], e["title"], str(steps), "—" if flops is None else f"{flops / 1e9:,.0f}",
                        _seconds_cell(secs), pct(e["test_top1"]), pct(e["fewshot"]),
                    ])  # fmt: skip
            families[role] = {"title": fam["title"], "entries": entries}
        numbers: dict[str, Any] = {"lengths": self.lengths(), "families": families}
        numbers["fronts"] = {cost: self.front(families, cost) for cost in ("train_flops", "train_seconds")}
        numbers["matched"] = {
            cost: {f"{a}-{b}": self.compare(families, a, b, cost) for a, b in self.pairs(families)}
            for cost in ("train_flops", "train_seconds")
        }
        numbers["target"] = self.target(families)
        figure = plot_compute(numbers, self.suite.out / "figures" / "compute.png", shots)
        section = self.section(header, rows, numbers, self.verdict(numbers))
        section.headline = sentence_from(section.verdict, "Figure 5 finds")
        section.caption = (
            "Measured (mean ± standard deviation over seeds, in percent; training s: the machine's training time, "
            "the fastest of the seeds', as other work on the machine only adds to it)"
        )
        section.figures.append(figure)
        return section

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
        title = {role: f"the {f['title']} family" for role, f in fams.items()}
        fronts = numbers["fronts"]
        parts = [
            "The Pareto front of mean test top-1 (no run at most as costly is as accurate) is, by training FLOPs, "
            + (", ".join(fronts["train_flops"]) or "empty (no finite result)")
            + "; by training seconds on this machine, "
            + (", ".join(fronts["train_seconds"]) or "empty (no finite result)")
        ]
        flops = numbers["matched"]["train_flops"]
        for pair, cmp in flops.items():
            a, b = pair.split("-")
            parts.append(
                f"at matched training FLOPs ({self._range(cmp)}) {self._lead(cmp, 'mean', title[a], title[b])}"
            )
        if "hybrid-vit" in flops:
            cmp = flops["hybrid-vit"]
            parts.append(
                f"at the cheap end of that range {self._lead(cmp, 'low', title['hybrid'], title['vit'])}, "
                f"at the costly end {self._lead(cmp, 'high', title['hybrid'], title['vit'])}"
            )
        secs = numbers["matched"]["train_seconds"]
        if "vit-cnn" in secs:
            cmp = secs["vit-cnn"]
            vit_cnn = self._lead(cmp, "mean", title["vit"], title["cnn"])
            parts.append(f"at matched training seconds ({self._range(cmp, 's')}) {vit_cnn}")
        parts.append(self._target_text(numbers["target"], title))
        text = "; ".join(parts) + ". " + self._leader(flops, title) + " " + self._agreement(flops)
        return text + " " + self._scale(fams)

    @staticmethod
    def _range(cmp: dict[str, Any], unit: str = "FLOPs") -> str:
        lo, hi = mean_of(cmp["low"]), mean_of(cmp["high"])
        if lo is None or hi is None:
            return "no cost range both families span"
        ends = f"{si(lo, 'FLOPs')} to {si(hi, 'FLOPs')}" if unit == "FLOPs" else f"{lo:,.0f} to {hi:,.0f} s"
        return f"each seed's frontiers averaged over {ends}, the range both span"

    @staticmethod
    def _lead(cmp: dict[str, Any], where: str, name_a: str, name_b: str) -> str:
        return lead(name_a, cmp[f"a_{where}"], name_b, cmp[f"b_{where}"])

    @staticmethod
    def _target_text(target: dict[str, Any], title: dict[str, str]) -> str:
        if target["top1"] is None:
            return "no target accuracy can be set (a family has no finite result)"
        need = []
        for role, (cost, how) in target["flops"].items():
            if how == "cheapest":
                need.append(f"{title[role]} needs at most {si(cost, 'FLOPs')} (its cheapest run reaches it)")
            elif cost is None:
                need.append(f"{title[role]} does not reach it")
            else:
                need.append(f"{title[role]} needs {si(cost, 'FLOPs')}")
        text = (
            f"to reach {100 * target['top1']:.2f}% test top-1 (the best mean that every family reaches; "
            f"means over seeds, interpolated on log FLOPs, no interval) {', '.join(need)}"
        )
        f = target["flops"]
        if "vit" in f and "cnn" in f and f["vit"][1] == f["cnn"][1] == "interpolated":
            ratio = f["cnn"][0] / f["vit"][0]
            text += (
                f": the ViTs need {ratio:.1f}x less compute than the ResNets"
                if ratio >= 1
                else f": the ViTs need {1 / ratio:.1f}x more compute than the ResNets"
            ) + " (the paper: 2-4x less)"
        return text

    @staticmethod
    def _leader(flops: dict[str, Any], title: dict[str, str]) -> str:
        """Which family leads every other at matched FLOPs, by intervals that exclude zero."""
        roles = {r for pair in flops for r in pair.split("-")}
        if len(roles) < 2:
            return "Only one family ran, so no family is compared at equal compute."
        if all(cmp["mean"] is None for cmp in flops.values()):
            return "Which family is ahead at equal training compute cannot be weighed here (too few seeds)."
        wins = {r: 0 for r in roles}
        for pair, cmp in flops.items():
            a, b = pair.split("-")
            s = _sign(cmp["mean"])
            if s:
                wins[a if s > 0 else b] += 1
        ahead = [r for r in roles if wins[r] == len(roles) - 1]
        if ahead:
            return f"Ahead at equal training compute here: {title[ahead[0]]}, which leads every other family."
        return "No family leads every other at equal training compute here (intervals that exclude zero)."

    @staticmethod
    def _agreement(flops: dict[str, Any]) -> str:
        """Whether the comparisons at matched FLOPs agree with Figure 5's, said for each."""
        parts = []
        if "vit-cnn" in flops:
            parts.append("on ViTs against ResNets this " + {
                None: "cannot be weighed (too few seeds with finite results)",
                1: "agrees with it: the ViTs are ahead here too",
                -1: "disagrees with it: here the ResNets are ahead",
                0: "does not show its ViT lead: here the two are not distinguishable",
            }[_sign(flops["vit-cnn"]["mean"])])  # fmt: skip
        if "hybrid-vit" in flops:
            low, high = _sign(flops["hybrid-vit"]["at_low"]), _sign(flops["hybrid-vit"]["at_high"])
            if low is None or high is None:
                parts.append("on hybrids against ViTs it cannot be weighed (too few seeds with finite results)")
            elif low == 1 and high != 1:
                parts.append(
                    "on hybrids against ViTs it agrees: the hybrids lead at the cheap end and not at the costly end"
                )
            elif low == 1:
                parts.append(
                    "on hybrids against ViTs it agrees in part: the hybrids lead at the cheap end, but also at the "
                    "costly end, where Figure 5's hybrid lead closes"
                )
            else:
                parts.append("on hybrids against ViTs it does not show the hybrids' lead at the cheap end")
        paper = "Figure 5 finds ViTs ahead of ResNets at equal compute, and hybrids ahead of ViTs at small budgets only"
        return f"{paper}; " + ("; ".join(parts) or "none of its comparisons can be made here") + "."

    def _scale(self, fams: dict[str, Any]) -> str:
        costs = [c for f in fams.values() for e in f["entries"] for c in finite(e["train_flops"])]
        low = float(self.cfg.get("paper_exaflops", [50, 5000])[0]) * 1e18
        if not costs:
            return ""
        ratio = low / max(costs)
        if ratio < 10:
            return "The costliest runs here come within 10x of Figure 5's cheapest."
        big = [(1e12, "trillion"), (1e9, "billion"), (1e6, "million")]
        words = next((f"{ratio / n:,.0f} {w}" for n, w in big if ratio >= n), f"{ratio:,.0f}")
        return f"Figure 5's cheapest run costs about {words} times the costliest here."
