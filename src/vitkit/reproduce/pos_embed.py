"""``pos-embed`` (Table 8, appendix D.4): the same ViT with no position embedding, learned 1-D,
learned 2-D (row and column tables), relative (a 1-D attention bias) and fixed 2-D sin-cos."""

from __future__ import annotations

from typing import Any

from .experiments import Experiment, Section, finite, lead, mean_of, mean_std, pct, shots_label
from .spec import RunSpec


class PosEmbed(Experiment):
    name = "pos-embed"

    def variants(self) -> dict[str, dict[str, Any]]:
        return dict(self.cfg["variants"])

    def variant_spec(self, variant: str, seed: int) -> RunSpec:
        model = self.cfg["model"]
        kind = self.variants()[variant]["pos_embed"]
        if kind == self.default_of(model, "pos_embed"):
            return self.base_spec(model, seed)  # the shared baseline run
        return self.spec(model, seed, f"{model}, pos_embed {kind}, seed {seed}", overrides={"pos_embed": kind})

    def runs(self) -> list[RunSpec]:
        return [self.variant_spec(v, s) for v in self.variants() for s in self.seeds]

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        from .figures import plot_bars

        shots = shots_label(results)
        header = ["position embedding", "test top-1", shots, "paper (Table 8, 5-shot ImageNet)"]
        rows, numbers = [], {"variants": {}}
        for v, info in self.variants().items():
            res = [results[self.variant_spec(v, s).key] for s in self.seeds]
            paper = info.get("paper")
            rows.append(
                [
                    info["title"],
                    pct(self.top1(res)),
                    pct(self.fewshot(res)),
                    "—" if paper is None else f"{100 * paper:.1f}",
                ]
            )
            numbers["variants"][v] = {
                "title": info["title"],
                "paper": paper,
                "test_top1": self.top1(res),
                "fewshot": self.fewshot(res),
            }
        figure = plot_bars(numbers["variants"], self.suite.out / "figures" / "pos_embed.png", shots,
                           "Position embeddings (after Table 8)")  # fmt: skip
        section = self.section(header, rows, numbers, self.verdict(numbers["variants"]))
        section.figures.append(figure)
        return section

    def verdict(self, v: dict[str, Any]) -> str:
        kinds = [k for k in ("learned", "learned2d", "relative") if k in v]
        with_pos = [x for k in kinds for x in v[k]["test_top1"]]
        parts = []
        if "none" in v and kinds:
            gap = lead("having positions (learned 1-D, 2-D, relative)", with_pos, "having none", v["none"]["test_top1"])
            parts.append(f"On test top-1 {gap} (the paper: 2.8 points on 5-shot ImageNet)")
        means = {k: m for k in kinds if (m := mean_of(v[k]["test_top1"])) is not None}  # a kind that diverged: out
        if len(means) > 1:
            hi, lo = max(means, key=means.__getitem__), min(means, key=means.__getitem__)
            spread = max(mean_std(v[k]["test_top1"])[1] for k in means)
            span = 100 * (means[hi] - means[lo])
            if len(finite(v[hi]["test_top1"])) < 2:
                within = "with one seed, so no spread to weigh it against"
            elif span <= 100 * spread:
                within = f"within the spread over seeds ({100 * spread:.1f})"
            else:
                within = f"more than the spread over seeds ({100 * spread:.1f})"
            left_out = [v[k]["title"] for k in kinds if k not in means]
            without = f" ({', '.join(left_out)} left out: no finite result)" if left_out else ""
            parts.append(
                f"the learned 1-D, 2-D and relative kinds span {span:.1f} points ({v[hi]['title']} highest), "
                f"{within}; the paper's span is 0.2 points{without}"
            )
        return ("; ".join(parts) or "Too few variants were run to compare") + "."
