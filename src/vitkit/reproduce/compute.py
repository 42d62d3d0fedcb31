"""``compute`` (Figure 5): accuracy against total training compute for three sizes each of
BiT ResNet, ViT and R+ViT hybrid, all on the whole training split."""

from __future__ import annotations

from typing import Any

from .experiments import Experiment, Section, mean_of, pct, shots_label
from .spec import RunSpec


def pareto_front(points: list[tuple[float, float, str]]) -> list[str]:
    """The names of the points (cost, accuracy, name) that no cheaper point beats or equals."""
    front, best = [], float("-inf")
    for _, acc, name in sorted(points):
        if acc > best:
            front.append(name)
            best = acc
    return front


class Compute(Experiment):
    name = "compute"

    def families(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.cfg["families"].items()}

    def runs(self) -> list[RunSpec]:
        return [self.base_spec(m, s) for models in self.families().values() for m in models for s in self.seeds]

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        from .figures import plot_compute

        shots = shots_label(results)
        by_model: dict[str, list[dict[str, Any]]] = {}
        for spec in self.runs():
            by_model.setdefault(spec.model, []).append(results[spec.key])
        header = ["family", "model", "training GFLOPs", "test top-1", shots]
        rows, numbers = [], {"families": {}}
        for family, models in self.families().items():
            numbers["families"][family] = []
            for m in models:
                res = by_model[m]
                flops = res[0]["train_flops"]
                rows.append(
                    [
                        family,
                        self.suite.model_title(m),
                        f"{flops / 1e9:,.0f}",
                        pct(self.top1(res)),
                        pct(self.fewshot(res)),
                    ]
                )
                numbers["families"][family].append(
                    {"model": m, "title": self.suite.model_title(m), "train_flops": flops,
                     "test_top1": self.top1(res), "fewshot": self.fewshot(res)}
                )  # fmt: skip
        figure = plot_compute(numbers, self.suite.out / "figures" / "compute.png", shots)
        section = self.section(header, rows, numbers, self.verdict(numbers, shots))
        section.figures.append(figure)
        return section

    def verdict(self, numbers: dict[str, Any], shots: str) -> str:
        fam = numbers["families"]
        parts = []
        for metric, name in (("test_top1", "test top-1"), ("fewshot", shots)):
            means = [(e["train_flops"], mean_of(e[metric]), e["title"]) for es in fam.values() for e in es]
            points = [(c, m, t) for c, m, t in means if m is not None]  # a model whose every run diverged: left out
            family_of = {e["title"]: f for f, es in fam.items() for e in es}
            front = pareto_front(points)
            if not front:
                parts.append(f"on {name} no model has a finite result to compare")
                continue
            families = sorted({family_of[t] for t in front})
            left_out = [t for _, m, t in means if m is None]
            without = f" (left out, no finite result: {', '.join(left_out)})" if left_out else ""
            parts.append(
                f"on {name} the models no cheaper model beats are {', '.join(front)} ({', '.join(families)}){without}"
            )
        if "ViT" in fam and "BiT ResNet" in fam:
            parts.append(_compute_ratio(fam["ViT"], fam["BiT ResNet"]))
        text = "; ".join(parts)
        return (
            text[0].upper() + text[1:] + ". The paper finds ViTs ahead of ResNets at equal compute and hybrids ahead "
            "of ViTs at small compute only, at budgets about a million times larger than these."
        )


def compute_to_reach(entries: list[dict[str, Any]], target: float, metric: str = "test_top1") -> float | None:
    """The training FLOPs at which a family first reaches ``target`` accuracy, interpolated
    log-linearly between its models (ordered by compute); None if none of them reaches it. A
    model with no finite result is left out.

    Args:
        entries: the family's models (``train_flops`` and the metric's accuracies per seed).
        target: the accuracy to reach.
        metric: ``test_top1`` or ``fewshot``.

    Returns:
        The FLOPs, or None.
    """
    import itertools
    import math

    pts = sorted((e["train_flops"], m) for e in entries if (m := mean_of(e[metric])) is not None)
    if not pts:
        return None
    if pts[0][1] >= target:
        return pts[0][0]
    for (c0, a0), (c1, a1) in itertools.pairwise(pts):
        if a0 < target <= a1:
            t = (target - a0) / (a1 - a0)
            return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
    return None


def _compute_ratio(vit: list[dict[str, Any]], cnn: list[dict[str, Any]]) -> str:
    """How much compute the ViTs need for the best ResNet's test top-1, against what it took."""
    scored = [(m, e) for e in cnn if (m := mean_of(e["test_top1"])) is not None]
    if not scored:
        return "no ResNet has a finite test top-1 to compare the ViTs' compute with"
    target, best = max(scored, key=lambda me: me[0])
    need = compute_to_reach(vit, target)
    if need is None:
        return f"no ViT reaches the best ResNet's test top-1 ({100 * target:.2f}%)"
    ratio = best["train_flops"] / need
    more_less = f"{ratio:.1f}x less" if ratio >= 1 else f"{1 / ratio:.1f}x more"
    return (
        f"the ViTs reach the best ResNet's test top-1 ({100 * target:.2f}%) with {more_less} "
        "training compute than it took (the paper: 2-4x less)"
    )
