"""``data-scaling`` (Figures 3 and 4): a ViT, a ResNet of the same cost and a larger ViT, each
pre-trained on nested class-balanced subsets of the training split."""

from __future__ import annotations

from typing import Any

from .experiments import Experiment, Section, gap, lead, pct, points, shots_label
from .spec import RunSpec


class DataScaling(Experiment):
    name = "data-scaling"

    def roles(self) -> dict[str, str]:
        return dict(self.cfg["roles"])

    def sizes(self) -> list[int]:
        return sorted({self.suite.subset_size(float(s)) for s in self.cfg["sizes"]})

    def runs(self) -> list[RunSpec]:
        out = []
        for model in self.roles().values():
            for n in self.sizes():
                for seed in self.seeds:
                    if n == self.suite.num_pool:
                        out.append(self.base_spec(model, seed))
                    else:
                        out.append(self.spec(model, seed, f"{model}, {n} images, seed {seed}", subset=n))
        return out

    def grouped(self, results: dict[str, dict[str, Any]]) -> dict[str, dict[int, list[dict[str, Any]]]]:
        """Results by model and subset size."""
        specs = self.runs()
        out: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for spec in specs:
            n = spec.recipe["data"]["subset"] or self.suite.num_pool
            out.setdefault(spec.model, {}).setdefault(n, []).append(results[spec.key])
        return out

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        from .figures import plot_scaling

        by = self.grouped(results)
        roles, sizes, shots = self.roles(), self.sizes(), shots_label(results)
        header = ["model", "untrained", *[f"{n:,} images" for n in sizes]]
        rows, numbers = [], {"sizes": sizes, "models": {}}
        for role, model in roles.items():
            title = self.suite.model_title(model)
            untrained = [self.untrained_fewshot(model, s) for s in self.seeds]
            rows.append([f"{title}: test top-1", "", *[pct(self.top1(by[model][n])) for n in sizes]])
            rows.append([f"{title}: {shots}", pct(untrained), *[pct(self.fewshot(by[model][n])) for n in sizes]])
            numbers["models"][model] = {
                "role": role,
                "title": title,
                "test_top1": {n: self.top1(by[model][n]) for n in sizes},
                "fewshot": {n: self.fewshot(by[model][n]) for n in sizes},
                "fewshot_untrained": untrained,
            }
        figure = plot_scaling(numbers, self.suite.out / "figures" / "data_scaling.png", shots)
        verdict = self.verdict(by, sizes, shots) + " " + self.control(numbers, sizes[-1], shots)
        section = self.section(header, rows, numbers, verdict)
        section.figures.append(figure)
        return section

    def untrained_fewshot(self, model: str, seed: int) -> float:
        """The transfer task's few-shot accuracy of ``model`` as its run starts (the control:
        what pre-training adds to random features)."""
        from .runner import ScoreSettings, fewshot_transfer, initial_model

        spec = self.base_spec(model, seed)
        net = initial_model(spec.recipe, self.suite.info)
        return fewshot_transfer(net, ScoreSettings.of(self.suite), spec.recipe["train"]["precision"])["mean"]

    def control(self, numbers: dict[str, Any], large: int, shots: str) -> str:
        parts = []
        for entry in numbers["models"].values():
            parts.append(f"{entry['title']} {points(gap(entry['fewshot'][large], entry['fewshot_untrained']))}")
        return (
            f"Control: against the same models untrained, pre-training on all {large:,} images changes {shots} "
            f"transfer by {', '.join(parts)}; where that is small or negative, the transfer task measures "
            "how generic random features are more than what pre-training taught."
        )

    def verdict(self, by: dict[str, dict[int, list[dict[str, Any]]]], sizes: list[int], shots: str) -> str:
        r = self.roles()
        cnn, vit, big = by[r["cnn"]], by[r["vit"]], by[r["larger_vit"]]
        small, large = sizes[0], sizes[-1]
        top1 = self.top1

        def top1_gap(a: dict[int, list[dict[str, Any]]], b: dict[int, list[dict[str, Any]]], n: int) -> float | None:
            return gap(top1(a[n]), top1(b[n]))

        gaps = {n: g for n in sizes if (g := top1_gap(vit, cnn, n)) is not None}  # sizes where both have numbers
        parts = [
            f"On test top-1, at {small:,} images {lead('the ViT', top1(vit[small]), 'the ResNet', top1(cnn[small]))}, "
            f"and at {large:,} {lead('the ViT', top1(vit[large]), 'the ResNet', top1(cnn[large]))}",
        ]
        trend_up: bool | None = None
        if len(gaps) >= 2:
            first, last = gaps[min(gaps)], gaps[max(gaps)]
            trend_up = last > first
            ahead = [f"{n:,}" for n, g in gaps.items() if g > 0]
            trend = "in the ViT's favour" if trend_up else "against the ViT"
            left_out = len(sizes) - len(gaps)
            skipped = f" ({left_out} size(s) with no finite result on a side left out)" if left_out else ""
            parts.append(
                f"the difference (ViT minus ResNet) moves {trend} as the data grows, {first:+.1f} to {last:+.1f} points"
                + (f", the ViT ahead at {', '.join(ahead)} images" if ahead else ", the ResNet ahead at every size")
                + skipped
            )
        else:
            parts.append("the difference (ViT minus ResNet) cannot be followed across sizes: too many runs diverged")
        parts += [
            f"on {shots} transfer at {large:,} images "
            f"{lead('the ViT', self.fewshot(vit[large]), 'the ResNet', self.fewshot(cnn[large]))}",
            f"the larger ViT against the smaller: {points(top1_gap(big, vit, small))} at {small:,} images and "
            f"{points(top1_gap(big, vit, large))} at {large:,}",
        ]
        if trend_up is None:
            agree = "The trend cannot be compared with Figure 4's direction"
        else:
            agree = f"The trend {'agrees with' if trend_up else 'does not show'} Figure 4's direction"
        return (
            "; ".join(parts) + f". {agree}; the paper's crossover (ViT-B/32 past "
            "ResNet50x1 between 30M and 90M images) lies far beyond a desktop's data and minutes of training."
        )
