"""``data-scaling`` (Figures 3 and 4): a ResNet and a ViT of the same cost per image, and a
larger ViT, each trained on class-balanced subsets of the training split of growing size.

The plan has two phases. First each family's learning rate is chosen on the minival from a small
grid at one mid size (seed 0); the larger ViT takes the ViT's. Then every size trains at that rate
for every seed, each seed on its own subset draw, for the budget's steps or ``min_epochs`` passes
over the subset, whichever is longer: the data limits every run, not the steps. The grid's run at
the chosen rate is the first seed's run at its size (the same recipe, trained once).

What the numbers are asked: the ViT/ResNet test-error ratio at each size and the log-log slopes of
test error against images (does the ViT's disadvantage shrink with data, as in Figure 4?), the
larger ViT against the ViT at the two ends (Figure 3), each family's generalisation gap, and the
ViT's attention locality by subset size. Few-shot transfer is a control, beside the same models
untrained.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from . import stats
from .experiments import Experiment, Section, finite, lead, mean_of, mean_std, pct, sentence_from, shots_label
from .pooling import grid_position, position_clause
from .spec import RunSpec, deep_merge

FAMILIES = ("cnn", "vit")  # the roles with a learning-rate grid; the larger ViT takes the ViT's rate
NAMES = {"cnn": "the ResNet", "vit": "the ViT", "larger_vit": "the larger ViT"}
SHORT = {"cnn": "ResNet", "vit": "ViT", "larger_vit": "larger ViT"}
PAPER_CROSSOVER = (30e6, 90e6)  # JFT images between which ViT-B/32 passes ResNet50x1 (Figure 4)
ATTENTION_BATCH = 16  # test images a forward pass takes when attention is measured
ATTENTION_KEYS = ("distance_first", "distance_last", "cls_share")
_NOT = {"flat": "not distinguishable", "not weighed (too few finite results)": "not weighed"}  # for figure4


def _num(value: Any) -> float:
    """``value`` as a float; nan where it is not a finite number (a diverged run, a missing value)."""
    ok = finite([value])
    return ok[0] if ok else math.nan


def error_ratios(vit: list[Any], cnn: list[Any]) -> list[float]:
    """The ViT's test error over the ResNet's, seed by seed.

    Args:
        vit: the ViT's test top-1, one per seed.
        cnn: the ResNet's, in the same seed order.

    Returns:
        One ratio per seed; nan where a side is not finite or the ResNet made no error.
    """
    out = []
    for a, b in zip(vit, cnn, strict=True):
        ea, eb = 1.0 - _num(a), 1.0 - _num(b)
        out.append(ea / eb if eb > 0 else math.nan)  # nan compares False: a diverged side stays nan
    return out


def log_errors(top1: list[Any]) -> list[float]:
    """``log(1 - top1)`` of each value; nan where it is not finite or the error is zero.

    Args:
        top1: test top-1 accuracies.

    Returns:
        The log test errors, in order.
    """
    return [math.log(1.0 - t) if (t := _num(v)) < 1.0 else math.nan for v in top1]


def direction(interval: stats.Interval | None, down: str, up: str, flat: str) -> str:
    """Which way an interval points, said only where it excludes zero.

    Args:
        interval: an estimate with its interval, or None (too few finite values).
        down: what to say when it lies below zero.
        up: what to say when it lies above zero.
        flat: what to say when it holds zero.

    Returns:
        The clause.
    """
    if interval is None:
        return "not weighed (too few finite results)"
    if not interval.excludes_zero:
        return flat
    return down if interval.estimate < 0 else up


def _interval_dict(interval: stats.Interval | None) -> dict[str, Any] | None:
    return None if interval is None else interval.to_dict()


def _per_seed(values: list[float]) -> dict[str, Any]:
    """Per-seed values with the t interval of their mean."""
    return {"per_seed": values, "interval": _interval_dict(stats.mean_interval(values))}


def _ci_cell(entry: dict[str, Any], digits: int, scale: float = 1.0) -> str:
    """A table cell for per-seed values (:func:`_per_seed`): their mean with its 95% interval, or
    the plain mean when there is no interval (one seed)."""
    interval = _iv(entry["interval"])
    if interval is not None:
        iv = interval.scaled(scale)
        f = f"{{:.{digits}f}}"
        return f"{f.format(iv.estimate)} ({f.format(iv.low)} to {f.format(iv.high)})"
    m = mean_of(entry["per_seed"])
    return "—" if m is None else f"{m * scale:.{digits}f} (no interval: 1 seed)"


def _cells(cell: Callable[[list[Any]], str], by_size: dict[int, list[Any]]) -> Callable[[int], str]:
    return lambda n: cell(by_size[n])


def _spread_cell(values: list[Any], digits: int, scale: float = 1.0) -> str:
    ok = finite(values)
    if not ok:
        return "—"
    m, s = mean_std(ok)
    return f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}" if len(ok) > 1 else f"{m * scale:.{digits}f}"


def _interval_text(interval: stats.Interval | None, digits: int, unit: str) -> str:
    return "not weighed (too few finite results)" if interval is None else interval.text(digits, unit)


def _ratio_text(interval: stats.Interval | None) -> str:
    """A ratio with its interval, unsigned: ``1.42 (95% CI 1.30 to 1.55)``."""
    if interval is None:
        return "not weighed (too few finite results)"
    return f"{interval.estimate:.2f} ({100 * interval.level:.0f}% CI {interval.low:.2f} to {interval.high:.2f})"


def _g(lr: float) -> str:
    return f"{lr:g}"


class DataScaling(Experiment):
    name = "data-scaling"

    # -- the plan --------------------------------------------------------------------------------

    def roles(self) -> dict[str, str]:
        """The models by role: ``cnn``, ``vit`` and ``larger_vit``."""
        return dict(self.cfg["roles"])

    def sizes(self) -> list[int]:
        """The subset sizes, as image counts, smallest first."""
        return sorted({self.suite.subset_size(float(s)) for s in self.cfg["sizes"]})

    def sizes_of(self, role: str) -> list[int]:
        """The sizes ``role`` trains at: every size, or the two ends for the larger ViT."""
        sizes = self.sizes()
        return sorted({sizes[0], sizes[-1]}) if role == "larger_vit" else sizes

    def lr_size(self) -> int:
        """The subset size of the learning-rate grid."""
        return self.suite.subset_size(float(self.cfg["lr_size"]))

    def learning_rates(self) -> list[float]:
        """The grid's rates, ascending: the configured ones and those it gained past an edge."""
        return self.bracketed(self.cfg["learning_rates"], lambda rates: list(self.grid(rates).values()))

    @cached_property
    def _base(self) -> Any:
        """The recipe every run starts from: the budget's steps, batch, warm-up and evaluation."""
        from ..train.config import recipe_from_dict

        return recipe_from_dict(self.suite.recipe(self.roles()["vit"], 0, experiment=self.cfg))

    def steps(self, n: int) -> int:
        """Optimiser steps of a run on ``n`` images: the budget's, or ``min_epochs`` passes over
        the subset where that is longer."""
        train = self._base.train
        return max(train.steps, math.ceil(float(self.cfg["min_epochs"]) * n / train.batch_size))

    def schedule(self, n: int) -> dict[str, Any]:
        """The recipe keys of a run on ``n`` images that follow its length: steps, and warm-up and
        evaluation in the budget's proportion to them (the budget's own values where the length is)."""
        r = self._base
        steps = self.steps(n)
        scale = steps / r.train.steps
        return {
            "train": {"steps": steps},
            "optim": {"warmup_steps": round(r.optim.warmup_steps * scale)},
            "log": {
                "eval_every": math.ceil(r.log.eval_every * scale),
                "checkpoint_every": math.ceil(r.log.checkpoint_every * scale),
            },
        }

    def run_spec(self, role: str, n: int, seed: int, lr: float) -> RunSpec:
        """The run of ``role`` on ``n`` images of seed ``seed``'s draw at learning rate ``lr``."""
        model = self.roles()[role]
        extra = deep_merge(self.schedule(n), {"optim": {"lr": lr}})
        return self.spec(model, seed, f"{model}, {n:,} images, lr {lr:g}, seed {seed}", subset=n, extra=extra)

    def grid(self, rates: list[float] | None = None) -> dict[str, dict[float, list[RunSpec]]]:
        """Phase 1: per family, per learning rate, its run at the grid's size (seed 0); the rates
        are :meth:`learning_rates` unless given."""
        n = self.lr_size()
        rates = self.learning_rates() if rates is None else rates
        return {role: {lr: [self.run_spec(role, n, 0, lr)] for lr in rates} for role in FAMILIES}

    def rate(self, role: str) -> tuple[float | None, bool]:
        """The learning rate of ``role``'s family, chosen on the minival.

        Args:
            role: ``cnn``, ``vit`` or ``larger_vit`` (which takes the ViT's).

        Returns:
            ``(rate, fallback)``: rate None until the family's grid is finished; fallback True
            when every grid run diverged (the grid's smallest rate is taken).
        """
        options = self.grid()["vit" if role == "larger_vit" else role]
        chosen = self.choose_on_minival(options)
        if chosen is not None:
            return float(chosen), False
        if all(self.result_of(s) is not None for specs in options.values() for s in specs):
            return min(options), True
        return None, False

    def cells(self) -> dict[tuple[str, int], list[RunSpec]]:
        """Phase 2: per role and size, its runs in seed order, for the families whose rate is chosen."""
        rates = {role: self.rate(role)[0] for role in FAMILIES}
        out = {}
        for role in self.roles():
            lr = rates["vit" if role == "larger_vit" else role]
            if lr is not None:
                for n in self.sizes_of(role):
                    out[(role, n)] = [self.run_spec(role, n, seed, lr) for seed in self.seeds]
        return out

    def runs(self) -> list[RunSpec]:
        specs = [s for options in self.grid().values() for runs in options.values() for s in runs]
        specs += [s for runs in self.cells().values() for s in runs]
        return list({s.key: s for s in specs}.values())  # the grid's run at the chosen rate is seed 0's

    def planned(self) -> bool:
        return all(self.rate(role)[0] is not None for role in FAMILIES)

    # -- the numbers -----------------------------------------------------------------------------

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        from .figures import plot_scaling

        cells = self.cells()
        got = {cell: [results[s.key] for s in specs] for cell, specs in cells.items()}
        shots = shots_label(results)
        numbers = self.measure(cells, got)
        numbers["learning_rate"] = self.grid_numbers()
        numbers["shots"] = shots
        header = ["quantity", *[f"{n:,} images" for n in numbers["sizes"]]]
        section = self.section(header, self.rows(numbers), numbers, self.verdict(numbers, shots))
        section.headline = sentence_from(section.verdict, "Against Figure 4:")
        section.caption = (
            "Measured (test top-1 and gaps: mean ± standard deviation over seeds, in percent or points; "
            "ratios and differences: mean over seeds with its 95% t interval, paired by seed)"
        )
        section.tables = [self.grid_table(numbers), self.control_table(numbers, shots)]
        section.figures.append(plot_scaling(numbers, self.suite.out / "figures" / "data_scaling.png", shots))
        return section

    def measure(
        self, cells: dict[tuple[str, int], list[RunSpec]], got: dict[tuple[str, int], list[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Every number of the section.

        Args:
            cells: the runs of each (role, size), in seed order (:meth:`cells`).
            got: their results, in the same order.

        Returns:
            The section's numbers (intervals as dicts: they go to ``report.json``).
        """
        sizes, roles = self.sizes(), self.roles()
        small, large = sizes[0], sizes[-1]
        models: dict[str, Any] = {}
        for role, model in roles.items():
            entry: dict[str, Any] = {
                "model": model,
                "title": self.suite.model_title(model),
                "sizes": self.sizes_of(role),
            }
            for key in ("test_top1", "train_top1", "best_step"):
                entry[key] = {n: [r.get(key) for r in got[(role, n)]] for n in entry["sizes"]}
            entry["gap"] = {
                n: [_num(tr) - _num(te) for tr, te in zip(entry["train_top1"][n], entry["test_top1"][n])]
                for n in entry["sizes"]
            }  # the generalisation gap of the best checkpoint, per seed
            entry["fewshot"] = {n: self.fewshot(got[(role, n)]) for n in entry["sizes"]}
            entry["fewshot_untrained"] = [self.untrained_fewshot(model, seed) for seed in self.seeds]
            best = [
                (b, self.steps(n))
                for n in entry["sizes"]
                for b, t in zip(entry["best_step"][n], entry["test_top1"][n])
                if len(finite([b, t])) == 2  # diverged runs left out
            ]
            entry["best_before_last"] = [sum(1 for b, steps in best if b < steps), len(best)]
            models[role] = entry
        cnn, vit, big = (models[r]["test_top1"] for r in ("cnn", "vit", "larger_vit"))
        ratios = {n: error_ratios(vit[n], cnn[n]) for n in sizes}
        xs = [math.log(n) for n in sizes for _ in self.seeds]
        log_err = {r: [y for n in sizes for y in log_errors(models[r]["test_top1"][n])] for r in FAMILIES}
        log_ratio = [a - b for a, b in zip(log_err["vit"], log_err["cnn"])]  # nan where a side is
        gaps = {n: [a - b for a, b in zip(models["vit"]["gap"][n], models["cnn"]["gap"][n])] for n in sizes}
        ends = sorted({small, large})
        bigger = {n: [_num(b) - _num(v) for b, v in zip(big[n], vit[n])] for n in ends}
        attention = {n: [self.attention(s, r) for s, r in zip(cells[("vit", n)], got[("vit", n)])] for n in sizes}
        att = {n: {k: [a[k] for a in attention[n]] for k in ATTENTION_KEYS} for n in sizes}
        two_ends = large != small
        return {
            "sizes": sizes,
            "steps": {n: self.steps(n) for n in sizes},
            "epochs": {n: self.steps(n) * self._base.train.batch_size / n for n in sizes},
            "models": models,
            "error_ratio": {n: _per_seed(ratios[n]) for n in sizes},
            "error_ratio_change": _interval_dict(
                stats.paired_difference(ratios[large], ratios[small]) if two_ends else None
            ),
            "slopes": {
                "cnn": _interval_dict(stats.slope_interval(xs, log_err["cnn"])),
                "vit": _interval_dict(stats.slope_interval(xs, log_err["vit"])),
                "vit_minus_cnn": _interval_dict(stats.slope_interval(xs, log_ratio)),
            },
            "larger_minus_vit": {n: _per_seed(bigger[n]) for n in ends},
            "larger_minus_vit_change": _interval_dict(
                stats.paired_difference(bigger[large], bigger[small]) if two_ends else None
            ),
            "gap_vit_minus_cnn": {n: _per_seed(gaps[n]) for n in sizes},
            "attention": {n: {**att[n], "layers": [a["layers"] for a in attention[n]]} for n in sizes},
            "attention_change": {
                k: _interval_dict(stats.paired_difference(att[large][k], att[small][k]) if two_ends else None)
                for k in ATTENTION_KEYS
            },
            "attention_images": int(self.cfg["attention_images"]),
            "paper_crossover_images": list(PAPER_CROSSOVER),
        }

    def grid_numbers(self) -> dict[str, Any]:
        """The learning-rate grid: each family's minival top-1 per rate and the rate chosen."""
        grid = self.grid()
        out: dict[str, Any] = {"size": self.lr_size(), "rates": self.learning_rates(), "minival_top1": {}}
        out["chosen"], out["fallback"] = {}, {}
        for role in FAMILIES:
            out["minival_top1"][role] = {
                f"{lr:g}": mean_of([(self.result_of(s) or {}).get("minival_top1") for s in specs])
                for lr, specs in grid[role].items()
            }
            out["chosen"][role], out["fallback"][role] = self.rate(role)
        return out

    def attention(self, spec: RunSpec, result: dict[str, Any]) -> dict[str, Any]:
        """The ViT's attention at its best checkpoint on the first test images: mean attention
        distance (mean over heads) of the first and last layer in pixels, and the share of patch
        attention that goes to the class token (mean over layers and heads). nan for a diverged
        run or one without its checkpoint."""
        path = self.suite.run_dir(spec) / "best.safetensors"
        if not math.isfinite(_num(result.get("test_top1"))) or not path.is_file():
            return {"distance_first": math.nan, "distance_last": math.nan, "cls_share": math.nan, "layers": None}
        return attention_summary(path, self.suite, int(self.cfg["attention_images"]))

    def untrained_fewshot(self, model: str, seed: int) -> float:
        """The transfer task's few-shot accuracy of ``model`` as its run starts (the control:
        what pre-training adds to random features)."""
        from .runner import ScoreSettings, fewshot_transfer, initial_model

        spec = self.base_spec(model, seed)
        net = initial_model(spec.recipe, self.suite.info)
        return fewshot_transfer(net, ScoreSettings.of(self.suite), spec.recipe["train"]["precision"])["mean"]

    # -- the tables ------------------------------------------------------------------------------

    def rows(self, num: dict[str, Any]) -> list[list[str]]:
        """The headline table: one row per quantity, one column per size."""
        sizes, models, att = num["sizes"], num["models"], num["attention"]

        def row(label: str, cell: Callable[[int], str], where: Iterable[int] = sizes) -> list[str]:
            return [label, *(cell(n) if n in where else "—" for n in sizes)]

        def ci(numbers: dict[int, Any], digits: int, scale: float = 1.0) -> Callable[[int], str]:
            return lambda n: _ci_cell(numbers[n], digits, scale)

        rows = [row(f"{m['title']}: test top-1 (%)", _cells(pct, m["test_top1"]), m["sizes"]) for m in models.values()]
        rows += [
            row("ViT / ResNet test error (ratio)", ci(num["error_ratio"], 2)),
            row("larger ViT − ViT, test top-1 (points)", ci(num["larger_minus_vit"], 1, 100), num["larger_minus_vit"]),
            row("steps (passes over the subset)", lambda n: f"{num['steps'][n]:,} ({num['epochs'][n]:.0f})"),
        ]
        rows += [
            row(f"best step: {SHORT[r]}", _cells(lambda v: _spread_cell(v, 0), m["best_step"]), m["sizes"])
            for r, m in models.items()
        ]
        rows += [row(f"train − test top-1: {SHORT[r]} (points)", _cells(pct, models[r]["gap"])) for r in FAMILIES]
        rows += [
            row("train − test top-1, ViT − ResNet (points)", ci(num["gap_vit_minus_cnn"], 1, 100)),
            row("ViT attention distance, layer 1 (px)", lambda n: _spread_cell(att[n]["distance_first"], 2)),
            row("ViT attention distance, last layer (px)", lambda n: _spread_cell(att[n]["distance_last"], 2)),
            row("ViT patch attention to the class token (%)", lambda n: _spread_cell(att[n]["cls_share"], 1, 100)),
        ]
        return rows

    def grid_table(self, num: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
        """The learning-rate grid as a secondary table."""
        g = num["learning_rate"]
        header = ["model", *[f"lr {lr:g}" for lr in g["rates"]]]
        rows = []
        for role in FAMILIES:
            cells = []
            for lr in g["rates"]:
                v = g["minival_top1"][role][f"{lr:g}"]
                mark = " (chosen)" if lr == g["chosen"][role] else ""
                cells.append(("diverged" if v is None else f"{100 * v:.2f}") + mark)
            rows.append([num["models"][role]["title"], *cells])
        caption = f"Learning-rate grid: minival top-1 (%) at {g['size']:,} images, seed 0 (the test split is not used)"
        return caption, header, rows

    def control_table(self, num: dict[str, Any], shots: str) -> tuple[str, list[str], list[list[str]]]:
        """Few-shot transfer beside the same models untrained: a control, not a headline result."""
        sizes = num["sizes"]
        header = ["model", "untrained (control)", *[f"{n:,} images" for n in sizes]]
        rows = [
            [
                m["title"],
                pct(m["fewshot_untrained"]),
                *[pct(m["fewshot"][n]) if n in m["fewshot"] else "—" for n in sizes],
            ]
            for m in num["models"].values()
        ]
        caption = (
            f"Control, not a headline result: {shots} linear transfer to the digits task (%), after pre-training "
            "on each subset and for the same models untrained (random features)"
        )
        return caption, header, rows

    # -- the sentences ---------------------------------------------------------------------------

    def verdict(self, num: dict[str, Any], shots: str) -> str:
        """The section's sentences, each computed from ``num``."""
        sizes, models, g = num["sizes"], num["models"], num["learning_rate"]
        small, large = sizes[0], sizes[-1]
        top1 = {r: m["test_top1"] for r, m in models.items()}
        fallback = " (every rate of its grid diverged: the smallest is used)"
        rates = "; ".join(
            f"{NAMES[r]} {g['chosen'][r]:g}{fallback}"
            if g["fallback"][r]
            else position_clause(NAMES[r], g["chosen"][r], grid_position(g["chosen"][r], g["rates"]), g["rates"], _g)
            for r in FAMILIES
        )
        leads = "; ".join(
            f"at {n:,} images {lead('the ViT', top1['vit'][n], 'the ResNet', top1['cnn'][n])}" for n in sizes
        )
        ratio_iv = {n: _iv(num["error_ratio"][n]["interval"]) for n in sizes}
        ratios = (
            ", ".join(f"{_ratio_text(ratio_iv[n])} at {n:,}" for n in sizes) + " images"
            if any(ratio_iv.values())
            else "not weighed at any size (too few finite results)"
        )
        change = _iv(num["error_ratio_change"])
        sl = {k: _iv(v) for k, v in num["slopes"].items()}
        faster = direction(
            sl["vit_minus_cnn"],
            "the ViT's error falls faster with data",
            "the ViT's error falls more slowly with data",
            "the two slopes are not distinguishable",
        )
        best = ", ".join(
            f"{NAMES[r]} {m['best_before_last'][0]} of {m['best_before_last'][1]}" for r, m in models.items()
        )
        moves = (
            f"; from {small:,} to {large:,} images it changes by {_interval_text(change, 2, '')}, "
            + direction(change, "so it falls", "so it rises", "not distinguishable from no change")
            if change is not None
            else ""
        )
        paired = len(self.seeds) >= 2
        out = [
            f"Learning rates chosen on the minival at {g['size']:,} images (seed 0): {rates}; the larger ViT trains "
            "at the ViT's."
        ]
        if paired:
            out += [
                f"Test top-1, ViT against ResNet (paired by seed): {leads}.",
                f"The ViT/ResNet test-error ratio (mean of the per-seed ratios): {ratios}{moves}.",
            ]
        else:
            out.append(
                "With one seed no paired comparison is weighed (each needs two seeds): the table gives single runs, "
                "and only the slopes, fitted over the sizes, carry an interval."
            )
        if all(v is None for v in sl.values()):
            out.append("The log-log slopes of test error against images are not weighed (fewer than 3 finite points).")
        else:
            out.append(
                "Log-log slopes of test error against images (least squares over every seed's point): the ResNet "
                f"{_interval_text(sl['cnn'], 3, '')}, the ViT {_interval_text(sl['vit'], 3, '')}; their difference "
                "(ViT minus ResNet: the slope of the per-seed log error ratio) "
                f"{_interval_text(sl['vit_minus_cnn'], 3, '')}: {faster}."
            )
        out.append(self.figure4(sl["vit_minus_cnn"], change, large))
        if paired:
            out += [self.larger(num), self.overfitting(num)]
        out += [
            "Runs whose best minival checkpoint came before their last step (limited by their data, not their "
            f"steps): {best}.",
            self.attention_text(num),
        ]
        if paired:
            out.append(self.control(num, shots))
        return " ".join(out)

    def figure4(self, slope: stats.Interval | None, ratio: stats.Interval | None, large: int) -> str:
        """The sentences against Figure 4: does the ViT's error relative to the ResNet's fall with data?

        Args:
            slope: the difference of the log-log slopes, ViT minus ResNet.
            ratio: the change of the error ratio from the smallest to the largest size.
            large: the largest size.

        Returns:
            The verdict, then where the paper's crossover lies.
        """
        said = {
            "the slopes": direction(slope, "falls", "rises", "flat"),
            "the ratio at the two ends": direction(ratio, "falls", "rises", "flat"),
        }
        weighed = {k: v for k, v in said.items() if v in ("falls", "rises", "flat")}
        falls = [k for k, v in weighed.items() if v == "falls"]
        rises = [k for k, v in weighed.items() if v == "rises"]
        relative = "the ViT's test error relative to the ResNet's"
        if not weighed:
            text = "the trend is not weighed (too few seeds with finite results)"
        elif falls and rises:
            text = f"the measures disagree ({relative} falls by {falls[0]} and rises by {rises[0]})"
        elif falls or rises:
            moved = falls or rises
            other = next((k for k in said if k not in moved), None)
            by = "both measures" if other is None else f"{moved[0]} (by {other}: {_NOT[said[other]]})"
            text = (
                f"{relative} falls with data by {by}: Figure 4's direction"
                if falls
                else f"{relative} rises with data by {by}: against Figure 4's direction"
            )
        else:
            text = (
                f"no change of {relative} with data is distinguishable (slopes and end-to-end ratio): "
                "Figure 4's direction is not shown at this scale"
            )
        low, high = PAPER_CROSSOVER
        return (
            f"Against Figure 4: {text}. The paper's crossover (ViT-B/32 past ResNet50x1) lies between "
            f"{low / 1e6:.0f}M and {high / 1e6:.0f}M pre-training images, {low / large:,.0f} times the largest subset "
            "here or more: these runs speak to the direction of the trend, not to a crossover."
        )

    def larger(self, num: dict[str, Any]) -> str:
        """The larger ViT against the ViT at the two ends, and whether the difference grows with data (Figure 3)."""
        top1 = {r: num["models"][r]["test_top1"] for r in ("vit", "larger_vit")}
        ends = sorted(num["larger_minus_vit"])
        said = "; ".join(
            f"at {n:,} images {lead('the larger ViT', top1['larger_vit'][n], 'the ViT', top1['vit'][n])}" for n in ends
        )
        change = _iv(num["larger_minus_vit_change"])
        if change is None:
            return f"The larger ViT against the ViT: {said}."
        scaled = change.scaled(100)
        trend = direction(
            scaled,
            "the larger ViT gains less from the data than the ViT, unlike Figure 3",
            "the larger ViT gains more from the data than the ViT, as in Figure 3",
            "no change is distinguishable",
        )
        return (
            f"The larger ViT against the ViT: {said}; the difference (larger ViT minus ViT) from {ends[0]:,} to "
            f"{ends[-1]:,} images (the difference of the differences, paired by seed) changes by "
            f"{_interval_text(scaled, 1, ' points')}: {trend}."
        )

    def overfitting(self, num: dict[str, Any]) -> str:
        """The generalisation gap, ViT minus ResNet, at each size (the paper: ViTs overfit more)."""
        parts, tally = [], {"the ViT": 0, "the ResNet": 0, "neither": 0}
        for n in num["sizes"]:
            iv = _iv(num["gap_vit_minus_cnn"][n]["interval"])
            scaled = None if iv is None else iv.scaled(100)
            who = direction(scaled, "the ResNet", "the ViT", "neither")
            if who in tally:
                tally[who] += 1
            parts.append(f"{_interval_text(scaled, 1, ' points')} at {n:,}")
        head = "Generalisation gap (train minus test top-1 of the best checkpoint), ViT minus ResNet, paired by seed"
        if not sum(tally.values()):
            return f"{head}: not weighed at any size (fewer than 2 seeds with finite results on both sides)."
        return (
            f"{head}: {'; '.join(parts)} images: the ViT's gap is the larger at {tally['the ViT']} of "
            f"{len(num['sizes'])} sizes, the ResNet's at {tally['the ResNet']}, not distinguishable at "
            f"{tally['neither']}."
        )

    def attention_text(self, num: dict[str, Any]) -> str:
        """The ViT's attention locality and class-token share at the smallest and the largest size."""
        sizes = num["sizes"]
        small, large = sizes[0], sizes[-1]
        att, change = num["attention"], num["attention_change"]

        def ends(key: str, scale: float, unit: str, difference_unit: str) -> str:
            a, b = mean_of(att[small][key]), mean_of(att[large][key])
            if a is None or b is None:
                return "not measured (no finite run at an end)"
            said = f"{scale * a:.2f}{unit} at {small:,} images and {scale * b:.2f}{unit} at {large:,}"
            iv = _iv(change[key])
            if iv is None:
                return said
            scaled = iv.scaled(scale)
            trend = direction(scaled, "it falls", "it rises", "no change is distinguishable")
            moved = _interval_text(scaled, 2, difference_unit)
            return f"{said} (larger minus smaller subset, paired by seed: {moved}; {trend})"

        return (
            f"The ViT's attention at its best checkpoint ({num['attention_images']} test images): mean attention "
            f"distance of the first layer {ends('distance_first', 1, ' px', ' px')}; of the last layer "
            f"{ends('distance_last', 1, ' px', ' px')}; share of patch attention on the class token "
            f"{ends('cls_share', 100, '%', ' points')}."
        )

    def control(self, num: dict[str, Any], shots: str) -> str:
        """The transfer control: what pre-training on the largest subset adds to the same models untrained."""
        large = num["sizes"][-1]
        parts, no_gain = [], []
        for role, m in num["models"].items():
            trained, untrained = m["fewshot"][large], m["fewshot_untrained"]
            parts.append(lead(f"the pre-trained {SHORT[role]}", trained, f"the untrained {SHORT[role]}", untrained))
            gain = stats.paired_difference(trained, untrained)
            if gain is not None and not (gain.excludes_zero and gain.estimate > 0):
                no_gain.append(NAMES[role])
        tail = (
            f"; for {' and '.join(no_gain)} pre-training adds nothing distinguishable to random features on this task"
            if no_gain
            else ""
        )
        return (
            f"Control (its own table, not part of the comparison): {shots} transfer to the digits task after "
            f"pre-training on {large:,} images against the same models untrained: {'; '.join(parts)}{tail}."
        )


def _iv(data: dict[str, Any] | None) -> stats.Interval | None:
    """An interval back from its :meth:`~.stats.Interval.to_dict` form."""
    return None if data is None else stats.Interval(**data)


def attention_summary(path: Path, suite: Any, images: int) -> dict[str, Any]:
    """Attention locality and class-token share of the ViT checkpoint at ``path``.

    Args:
        path: a ``best.safetensors`` of a vitkit ViT.
        suite: the suite (its test split gives the images).
        images: how many of the first test images to average over.

    Returns:
        ``distance_first`` and ``distance_last`` (mean attention distance in input pixels of the
        first and the last layer, mean over heads), ``cls_share`` (the share of patch queries'
        attention on the prefix tokens, mean over layers and heads) and ``layers`` (both per layer).
    """
    from ..analysis.attention import collect_attention, grid_of, mean_attention_distance, prefix_attention_share
    from ..checkpoint.load import load_pretrained
    from .attention import load_test_images

    model = load_pretrained(path)
    loaded = load_test_images(suite, model, images)
    prefix, stride = model.cfg.num_prefix_tokens, model.cfg.total_stride
    distance, share, count = None, None, 0
    for start in range(0, len(loaded), ATTENTION_BATCH):
        batch = loaded.inputs[start : start + ATTENTION_BATCH]
        weights = collect_attention(model, batch)  # depth x (B, heads, N, N)
        d = mean_attention_distance(weights, grid_of(model, batch), stride, prefix) * len(batch)  # (L, H)
        s = prefix_attention_share(weights, prefix) * len(batch)  # (L, H)
        distance = d if distance is None else distance + d
        share = s if share is None else share + s
        count += len(batch)
    if distance is None or share is None:
        raise ValueError(f"{suite.data}: no test images to measure attention on")
    per_layer = (distance / count).mean(dim=1)  # (L,) mean over heads
    share_layer = (share / count).mean(dim=1)  # (L,)
    return {
        "distance_first": float(per_layer[0]),
        "distance_last": float(per_layer[-1]),
        "cls_share": float(share_layer.mean()),
        "layers": {"distance": per_layer.tolist(), "cls_share": share_layer.tolist()},
    }
