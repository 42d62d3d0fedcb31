"""``data-scaling`` (Figures 3 and 4): a ResNet and a ViT of the same cost per image, and a
larger ViT, each trained on class-balanced subsets of the training split of growing size.

The plan has up to three phases. First each family's learning rate is chosen on the minival from
a small grid at one mid size (seed 0); the larger ViT has a grid of its own (``tune_larger``) or
takes the ViT's. Then every size trains at that rate for every seed, each seed on its own subset
draw, for the budget's steps or ``min_epochs`` passes over the subset, whichever is longer. Last,
the plateau rule: a (model, size) whose runs had not finished improving
(:func:`vitkit.reproduce.core.wording.convergence`) trains again at twice the steps, up to
``longer`` doublings, and the longest runs stand for it. The grid's run at the chosen rate is the
first seed's run at its size (the same recipe, trained once).

What the numbers are asked: the ViT/ResNet test-error ratio at each size and the log-log slopes of
test error against images (does the ViT's disadvantage shrink with data, as in Figure 4?), the
larger ViT against the ViT at every size it trains at (Figure 3: does it overtake the smaller one
as data grows?), scaling-law fits per family and where they cross, each family's generalisation
gap, and the ViT's attention locality by subset size. Few-shot transfer is a control, beside the
same models untrained.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

from ...analysis.attention import collect_attention, grid_of, mean_attention_distance, prefix_attention_share
from ...checkpoint.load import load_pretrained
from ...train.config import recipe_from_dict
from ..core import stats
from ..core.experiment import Experiment, Section, finite, mean_of, sentence_from, shots_label
from ..core.registry import register
from ..core.scaling import fit_families
from ..core.scoring import ScoreSettings, fewshot_in_domain, fewshot_transfer, initial_model
from ..core.spec import RunSpec, deep_merge
from ..core.wording import convergence
from .attention_measure import load_test_images
from .data_scaling_text import FAMILIES, PAPER_CROSSOVER, control_table, grid_table, in_domain_table, rows, verdict
from .figures import plot_scaling

ATTENTION_BATCH = 16  # test images a forward pass takes when attention is measured
ATTENTION_KEYS = ("distance_first", "distance_last", "cls_share")


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


def _interval_dict(interval: stats.Interval | None) -> dict[str, Any] | None:
    return None if interval is None else interval.to_dict()


def _per_seed(values: list[float]) -> dict[str, Any]:
    """Per-seed values with the t interval of their mean."""
    return {"per_seed": values, "interval": _interval_dict(stats.mean_interval(values))}


@register
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
        """The sizes ``role`` trains at: every size, or only the two ends for the larger ViT where
        ``larger_sizes`` is ``ends``."""
        sizes = self.sizes()
        ends = role == "larger_vit" and self.cfg.get("larger_sizes", "all") == "ends"
        return sorted({sizes[0], sizes[-1]}) if ends else sizes

    def tuned(self) -> tuple[str, ...]:
        """The roles with a learning-rate grid of their own: the two families, and the larger ViT
        where ``tune_larger`` is set (otherwise it takes the ViT's rate)."""
        return (*FAMILIES, "larger_vit") if self.cfg.get("tune_larger", False) else FAMILIES

    def rate_of(self, role: str) -> str:
        """The role whose grid chooses ``role``'s rate."""
        return role if role in self.tuned() else "vit"

    def lr_size(self) -> int:
        """The subset size of the learning-rate grid."""
        return self.suite.subset_size(float(self.cfg["lr_size"]))

    def learning_rates(self) -> list[float]:
        """The grid's rates, ascending: the configured ones and those it gained past an edge."""
        return self.bracketed(self.cfg["learning_rates"], lambda rates: list(self.grid(rates).values()))

    @cached_property
    def _base(self) -> Any:
        """The recipe every run starts from: the budget's steps, batch, warm-up and evaluation."""
        return recipe_from_dict(self.suite.recipe(self.roles()["vit"], 0, experiment=self.cfg))

    def steps(self, n: int, factor: int = 1) -> int:
        """Optimiser steps of a run on ``n`` images: the budget's, or ``min_epochs`` passes over
        the subset where that is longer; ``factor`` times that for a run the plateau rule lengthened."""
        train = self._base.train
        return factor * max(train.steps, math.ceil(float(self.cfg["min_epochs"]) * n / train.batch_size))

    def schedule(self, n: int, factor: int = 1) -> dict[str, Any]:
        """The recipe keys of a run on ``n`` images that follow its length: steps, and warm-up and
        evaluation in the budget's proportion to them (the budget's own values where the length is)."""
        r = self._base
        steps = self.steps(n, factor)
        scale = steps / r.train.steps
        return {
            "train": {"steps": steps},
            "optim": {"warmup_steps": round(r.optim.warmup_steps * scale)},
            "log": {
                "eval_every": math.ceil(r.log.eval_every * scale),
                "checkpoint_every": math.ceil(r.log.checkpoint_every * scale),
            },
        }

    def run_spec(self, role: str, n: int, seed: int, lr: float, factor: int = 1) -> RunSpec:
        """The run of ``role`` on ``n`` images of seed ``seed``'s draw at learning rate ``lr``,
        ``factor`` times its length (the plateau rule's longer runs)."""
        model = self.roles()[role]
        extra = deep_merge(self.schedule(n, factor), {"optim": {"lr": lr}})
        longer = "" if factor == 1 else f", {self.steps(n, factor):,} steps"
        label = f"{model}, {n:,} images, lr {lr:g}{longer}, seed {seed}"
        return self.spec(model, seed, label, subset=n, extra=extra)

    def grid(self, rates: list[float] | None = None) -> dict[str, dict[float, list[RunSpec]]]:
        """Phase 1: per family, per learning rate, its run at the grid's size (seed 0); the rates
        are :meth:`learning_rates` unless given."""
        n = self.lr_size()
        rates = self.learning_rates() if rates is None else rates
        return {role: {lr: [self.run_spec(role, n, 0, lr)] for lr in rates} for role in self.tuned()}

    def rate(self, role: str) -> tuple[float | None, bool]:
        """The learning rate of ``role``'s family, chosen on the minival.

        Args:
            role: ``cnn``, ``vit`` or ``larger_vit`` (which takes the ViT's unless tuned).

        Returns:
            ``(rate, fallback)``: rate None until the family's grid is finished; fallback True
            when every grid run diverged (the grid's smallest rate is taken).
        """
        options = self.grid()[self.rate_of(role)]
        chosen = self.choose_on_minival(options)
        if chosen is not None:
            return float(chosen), False
        if all(self.result_of(s) is not None for specs in options.values() for s in specs):
            return min(options), True
        return None, False

    def lengths(self, role: str, n: int, lr: float) -> list[int]:
        """The plateau rule: the length factors ``role`` trains at on ``n`` images, shortest first.
        A factor joins once every run of the one before it is finished and they had not converged
        (:func:`vitkit.reproduce.core.wording.convergence`), up to ``longer`` doublings; the last
        factor's runs stand for the (model, size). A planning suite counts the first length only.

        Args:
            role: the model's role.
            n: the subset size.
            lr: its learning rate.

        Returns:
            ``[1]``, ``[1, 2]``, ...
        """
        factors = [1]
        if self.suite.planning:
            return factors
        for _ in range(int(self.cfg.get("longer", 0))):
            got = [self.result_of(self.run_spec(role, n, seed, lr, factors[-1])) for seed in self.seeds]
            if any(r is None for r in got) or convergence([r.get("minival_curve") for r in got]).converged:
                break
            factors.append(2 * factors[-1])
        return factors

    def cells(self, every: bool = False) -> dict[tuple[str, int], list[RunSpec]]:
        """Phase 2 (and the plateau rule's longer runs): per role and size, its runs in seed order,
        for the roles whose rate is chosen; the longest length's runs, or with ``every`` the runs
        of every length."""
        out = {}
        for role in self.roles():
            lr = self.rate(role)[0]
            if lr is None:
                continue
            for n in self.sizes_of(role):
                factors = self.lengths(role, n, lr)
                out[(role, n)] = [
                    self.run_spec(role, n, seed, lr, f)
                    for f in (factors if every else factors[-1:])
                    for seed in self.seeds
                ]
        return out

    def runs(self) -> list[RunSpec]:
        specs = [s for options in self.grid().values() for runs in options.values() for s in runs]
        specs += [s for runs in self.cells(every=True).values() for s in runs]
        return list({s.key: s for s in specs}.values())  # the grid's run at the chosen rate is seed 0's

    def planned(self) -> bool:
        return all(self.rate(role)[0] is not None for role in self.tuned())

    # -- the numbers -----------------------------------------------------------------------------

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        cells = self.cells()
        got = {cell: [results[s.key] for s in specs] for cell, specs in cells.items()}
        shots = shots_label(results)
        numbers = self.measure(cells, got)
        numbers["learning_rate"] = self.grid_numbers()
        numbers["shots"] = shots
        header = ["quantity", *[f"{n:,} images" for n in numbers["sizes"]]]
        section = self.section(header, rows(numbers), numbers, verdict(numbers, shots, len(self.seeds)))
        section.headline = sentence_from(section.verdict, "Against Figure 4:")
        section.caption = (
            "Measured (test top-1 and gaps: mean ± standard deviation over seeds, in percent or points; "
            "ratios and differences: mean over seeds with its 95% t interval, paired by seed)"
        )
        section.tables = [grid_table(numbers), control_table(numbers, shots)]
        if own := in_domain_table(numbers):
            section.tables.insert(1, own)
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
            entry["steps"] = {n: cells[(role, n)][0].recipe["train"]["steps"] for n in entry["sizes"]}
            best = [
                (b, entry["steps"][n])
                for n in entry["sizes"]
                for b, t in zip(entry["best_step"][n], entry["test_top1"][n])
                if len(finite([b, t])) == 2  # diverged runs left out
            ]
            entry["best_before_last"] = [sum(1 for b, steps in best if b < steps), len(best)]
            entry["convergence"] = {
                n: asdict(convergence([r.get("minival_curve") for r in got[(role, n)]])) for n in entry["sizes"]
            }  # whether each size's runs had finished improving (wording.convergence)
            models[role] = entry
        cnn, vit, big = (models[r]["test_top1"] for r in ("cnn", "vit", "larger_vit"))
        ratios = {n: error_ratios(vit[n], cnn[n]) for n in sizes}
        xs = [math.log(n) for n in sizes for _ in self.seeds]
        log_err = {r: [y for n in sizes for y in log_errors(models[r]["test_top1"][n])] for r in FAMILIES}
        log_ratio = [a - b for a, b in zip(log_err["vit"], log_err["cnn"])]  # nan where a side is
        gaps = {n: [a - b for a, b in zip(models["vit"]["gap"][n], models["cnn"]["gap"][n])] for n in sizes}
        ends = models["larger_vit"]["sizes"]  # the sizes the larger ViT trains at (all, or the two ends)
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
            "error_ratio_steps": [
                [a, b, _interval_dict(stats.paired_difference(ratios[b], ratios[a]))]
                for a, b in itertools.pairwise(sizes)
            ],  # the change over each step of the range: a trend is said only where every step shows it
            "slopes": {
                "cnn": _interval_dict(stats.slope_interval(xs, log_err["cnn"])),
                "vit": _interval_dict(stats.slope_interval(xs, log_err["vit"])),
                "vit_minus_cnn": _interval_dict(stats.slope_interval(xs, log_ratio)),
            },
            "larger_minus_vit": {n: _per_seed(bigger[n]) for n in ends},
            "larger_minus_vit_change": _interval_dict(
                stats.paired_difference(bigger[ends[-1]], bigger[ends[0]]) if len(ends) > 1 else None
            ),
            "gap_vit_minus_cnn": {n: _per_seed(gaps[n]) for n in sizes},
            **self.in_domain_numbers(models, got, sizes),
            "attention": {n: {**att[n], "layers": [a["layers"] for a in attention[n]]} for n in sizes},
            "attention_change": {
                k: _interval_dict(stats.paired_difference(att[large][k], att[small][k]) if two_ends else None)
                for k in ATTENTION_KEYS
            },
            "fits": fit_families(
                {r: {n: [1 - _num(t) for t in models[r]["test_top1"][n]] for n in models[r]["sizes"]} for r in roles},
                [("vit", "cnn"), ("larger_vit", "vit")],
            ),  # E = a·n^-b + c per family, bootstrapped (core.scaling)
            "attention_images": int(self.cfg["attention_images"]),
            "paper_crossover_images": list(PAPER_CROSSOVER),
        }

    def grid_numbers(self) -> dict[str, Any]:
        """The learning-rate grid: each family's minival top-1 per rate and the rate chosen."""
        grid = self.grid()
        out: dict[str, Any] = {"size": self.lr_size(), "rates": self.learning_rates(), "minival_top1": {}}
        out["chosen"], out["fallback"] = {}, {}
        for role in self.tuned():
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
        spec = self.base_spec(model, seed)
        net = initial_model(spec.recipe, self.suite.info)
        return fewshot_transfer(net, ScoreSettings.of(self.suite), spec.recipe["train"]["precision"])["mean"]

    def in_domain_numbers(
        self, models: dict[str, Any], got: dict[tuple[str, int], list[dict[str, Any]]], sizes: list[int]
    ) -> dict[str, Any]:
        """The in-domain few-shot numbers: each model's entry gains ``in_domain`` (per size, per
        seed) and ``in_domain_untrained``; returned are the ViT minus the ResNet per size, its
        change over each step of the range, and the task's setup (None, and nothing added, where
        the results were scored without it)."""
        setup = _in_domain_setup(got)
        if setup is None:
            return {"in_domain_setup": None, "in_domain_vit_minus_cnn": {}, "in_domain_steps": []}
        for role, entry in models.items():
            entry["in_domain"] = {n: [_in_domain(r) for r in got[(role, n)]] for n in entry["sizes"]}
            entry["in_domain_untrained"] = [self.untrained_in_domain(entry["model"], seed) for seed in self.seeds]
        vit, cnn = models["vit"]["in_domain"], models["cnn"]["in_domain"]
        own = {n: [_num(v) - _num(c) for v, c in zip(vit[n], cnn[n])] for n in sizes}
        return {
            "in_domain_setup": setup,
            "in_domain_vit_minus_cnn": {n: _per_seed(own[n]) for n in sizes},
            "in_domain_steps": [
                [a, b, _interval_dict(stats.paired_difference(own[b], own[a]))] for a, b in itertools.pairwise(sizes)
            ],  # how the ViT's lead (or deficit) changes over each step of the range
        }

    def untrained_in_domain(self, model: str, seed: int) -> float:
        """The in-domain few-shot accuracy of ``model`` as its run starts (random features,
        projected to the same width)."""
        spec = self.base_spec(model, seed)
        net = initial_model(spec.recipe, self.suite.info)
        recipe = recipe_from_dict(copy.deepcopy(spec.recipe))
        return fewshot_in_domain(net, recipe, ScoreSettings.of(self.suite), spec.recipe["train"]["precision"])["mean"]


def _in_domain(result: dict[str, Any]) -> float:
    """A run's in-domain few-shot accuracy (nan where its result has none: a diverged run)."""
    own = result.get("fewshot_in_domain")
    return math.nan if not own else _num(own.get("mean"))


def _in_domain_setup(got: dict[tuple[str, int], list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The shots and the width of the in-domain few-shot task, as the runs record them (None
    where no run does), with each model's own feature width."""
    found = [r["fewshot_in_domain"] for rs in got.values() for r in rs if r.get("fewshot_in_domain")]
    if not found:
        return None
    return {"shots": min(f["shots"] for f in found), "width": min(f["width"] for f in found),
            "features": sorted({f.get("features", f["width"]) for f in found})}  # fmt: skip


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
