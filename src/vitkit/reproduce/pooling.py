"""``pooling`` (Figure 9, appendix D.3): class token against global average pooling, each at
the paper's two learning rates scaled to this recipe."""

from __future__ import annotations

from typing import Any

from .experiments import Experiment, Section, lead, mean_of, pct, shots_label
from .spec import RunSpec

POOLINGS = {"token": "class token", "gap": "global average pooling"}


class Pooling(Experiment):
    name = "pooling"

    def base_lr(self) -> float:
        return float(self.suite.recipe(self.cfg["model"], 0)["optim"]["lr"])

    def cell_spec(self, pooling: str, rate: str, seed: int) -> RunSpec:
        model = self.cfg["model"]
        factor = float(self.cfg["learning_rates"][rate])
        if pooling == self.default_of(model, "classifier") and factor == 1.0:
            return self.base_spec(model, seed)
        overrides = {} if pooling == self.default_of(model, "classifier") else {"classifier": pooling}
        extra = {} if factor == 1.0 else {"optim": {"lr": self.base_lr() * factor}}
        label = f"{model}, {pooling}, lr {self.base_lr() * factor:.2g}, seed {seed}"
        return self.spec(model, seed, label, overrides=overrides, extra=extra)

    def cells(self) -> list[tuple[str, str]]:
        return [(p, r) for p in POOLINGS for r in self.cfg["learning_rates"]]

    def runs(self) -> list[RunSpec]:
        return [self.cell_spec(p, r, s) for p, r in self.cells() for s in self.seeds]

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        from .figures import plot_pooling

        shots, lr0 = shots_label(results), self.base_lr()
        header = ["pooling", "learning rate (paper's)", "minival top-1", "test top-1", shots]
        rows, cells = [], {}
        for p, r in self.cells():
            res = [results[self.cell_spec(p, r, s).key] for s in self.seeds]
            lr = lr0 * float(self.cfg["learning_rates"][r])
            paper_lr = self.cfg["paper_learning_rates"][r]
            cells[f"{p}@{r}"] = {"pooling": p, "rate": r, "lr": lr, "paper_lr": paper_lr,
                                 "minival_top1": [x["minival_top1"] for x in res],
                                 "test_top1": self.top1(res), "fewshot": self.fewshot(res)}  # fmt: skip
            rows.append([POOLINGS[p], f"{lr:.2e} ({paper_lr:.0e})", pct(cells[f"{p}@{r}"]["minival_top1"]),
                         pct(self.top1(res)), pct(self.fewshot(res))])  # fmt: skip
        figure = plot_pooling(cells, self.suite.out / "figures" / "pooling.png")
        section = self.section(header, rows, {"cells": cells}, self.verdict(cells))
        section.figures.append(figure)
        return section

    def verdict(self, cells: dict[str, Any]) -> str:
        def own_rate(p: str) -> str | None:  # chosen on the minival, never on the test split
            rates = self.cfg["learning_rates"]
            means = {r: m for r in rates if (m := mean_of(cells[f"{p}@{r}"]["minival_top1"])) is not None}
            return max(means, key=means.__getitem__) if means else None

        tok, gap = own_rate("token"), own_rate("gap")
        if tok is None or gap is None:
            which = " and ".join(n for n, r in (("the class token", tok), ("GAP", gap)) if r is None)
            text = f"No learning rate can be chosen for {which} by the minival (no finite minival result)"
        else:
            t, g = cells[f"token@{tok}"], cells[f"gap@{gap}"]
            text = (
                f"By the minival the class token does best at the {tok} rate and GAP at the {gap} rate (the paper: "
                f"high and low); each at its own rate, on test top-1 "
                + lead("the class token", t["test_top1"], "GAP", g["test_top1"])
            )
        if "gap@high" in cells and "gap@low" in cells:
            low, high = cells["gap@low"]["test_top1"], cells["gap@high"]["test_top1"]
            text += "; " + lead("GAP at the low rate", low, "GAP at the high rate", high)
        return text + "."
