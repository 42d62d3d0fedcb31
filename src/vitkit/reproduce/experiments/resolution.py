"""``resolution`` (section 3.2): pre-train at a reduced resolution, then fine-tune at the data's
own size (same patch size, so a longer sequence; position embeddings interpolated on load)
against the same fine-tuning at the pre-training size. Each model is scored at its own size.

The pre-training sees the images downsampled far enough to lose detail (28 px to 12 px: 3x3
tokens instead of 7x7), so fine-tuning at 28 px meets detail the pre-training never saw, as
384 px after 224 px does in the paper. Phase 1 pre-trains every seed and fine-tunes the first
over the paper's grid of fine-tuning rates, for each size; phase 2 fine-tunes the other seeds at
each size's rate, chosen on the minival. Then the plateau rule: a size whose fine-tunings had not
finished improving (:func:`vitkit.reproduce.core.wording.convergence`) fine-tunes again at twice
the steps, up to ``longer`` doublings, and the longest stand for it. Last, once the data's size
has its length, a from-scratch arm trains at the data's size with the common recipe for as many
training FLOPs as pre-training plus that fine-tuning cost: whether the detour through the low
resolution pays at equal compute. A zero-step control scores each pre-trained model at the
data's size with its position embeddings interpolated and no fine-tuning: what the
interpolation alone gives.
"""

from __future__ import annotations

import math
from typing import Any

from ...checkpoint.load import load_pretrained
from ...data import build_dataset
from ...eval import evaluate
from ...models.flops import vit_flops
from ...models.registry import model_config
from ..core.experiment import Experiment, Section, finite, grid_arms, lead, pct, sentence_from, shots_label
from ..core.registry import register
from ..core.scoring import ScoreSettings
from ..core.spec import RunSpec, deep_merge
from ..core.stats import paired_difference
from ..core.wording import contrasts, convergence, not_a_test, said_with_holm
from .figures import plot_resolution
from .pooling import best_on_minival, grid_position, position_clause

SIZES = ("low", "native")  # the pre-training size, the data's own


@register
class Resolution(Experiment):
    name = "resolution"

    def rates(self) -> list[float]:
        """The fine-tuning learning rates of the grid, ascending: the configured ones and those it
        gained past an edge."""
        return self.bracketed(self.cfg["learning_rates"], lambda rates: grid_arms(self.grid(rates)))

    def sizes(self) -> dict[str, tuple[int, int]]:
        """The pre-training size (``low``: ``pretrain_scale`` of the data's, in whole patches) and
        the data's own (``native``), as (height, width)."""
        h, w = self.suite.img_size
        ph, pw = self.default_of(self.cfg["model"], "patch_size")
        scale = float(self.cfg["pretrain_scale"])

        def shrink(side: int, patch: int) -> int:
            return max(patch, round(side * scale / patch) * patch)

        return {"low": (shrink(h, ph), shrink(w, pw)), "native": (h, w)}

    def tokens(self, which: str) -> int:
        """Patch tokens of the model at ``which`` size."""
        (h, w), (ph, pw) = self.sizes()[which], self.default_of(self.cfg["model"], "patch_size")
        return (h // ph) * (w // pw)

    def size_text(self, which: str) -> str:
        h, w = self.sizes()[which]
        return f"{h}x{w} px"

    def pretrain(self, seed: int) -> RunSpec:
        """The common recipe and steps, at the reduced size: the images are resized to the model's."""
        model, (h, w) = self.cfg["model"], self.sizes()["low"]
        tree = self.suite.recipe(model, seed, overrides={"img_size": [h, w]})
        return RunSpec(label=f"{model}, pre-trained at {h}x{w} px, seed {seed}", model=model, recipe=tree)

    @staticmethod
    def schedule(recipe: dict[str, Any], steps: int) -> dict[str, Any]:
        """The recipe keys of ``recipe`` run for ``steps`` steps: its warm-up, evaluation and
        checkpoints in the same proportion to them."""
        scale = steps / int(recipe["train"]["steps"])
        log = recipe["log"]
        return {
            "train": {"steps": steps},
            "optim": {"warmup_steps": round(int(recipe["optim"]["warmup_steps"]) * scale)},
            "log": {"eval_every": math.ceil(int(log["eval_every"]) * scale),
                    "checkpoint_every": math.ceil(int(log["checkpoint_every"]) * scale)},
        }  # fmt: skip

    def finetune(self, which: str, lr: float, seed: int, factor: int = 1) -> RunSpec:
        """Fine-tuning of the seed's pre-trained model at ``which`` size, learning rate ``lr``,
        ``factor`` times the budget's fine-tuning steps (the plateau rule's longer runs)."""
        model, base = self.cfg["model"], self.pretrain(seed)
        h, w = self.sizes()[which]
        extra: dict[str, Any] = {"model": {"init_from": f"run:{base.key}"}, "optim": {"lr": lr}}
        spec = self.spec(model, seed, "", overrides={"img_size": [h, w]}, extra=extra)
        longer = ""
        if factor > 1:
            steps = factor * int(spec.recipe["train"]["steps"])
            extra = deep_merge(self.schedule(spec.recipe, steps), extra)
            spec = self.spec(model, seed, "", overrides={"img_size": [h, w]}, extra=extra)
            longer = f", {steps:,} steps"
        low = self.size_text("low")
        spec.label = f"{model}, fine-tuned at {h}x{w} px (pre-trained at {low}), lr {lr:g}{longer}, seed {seed}"
        spec.after = base.key
        return spec

    def lengths(self, which: str, lr: float) -> list[int]:
        """The plateau rule: the length factors ``which`` size fine-tunes at, shortest first. A
        factor joins once every run of the one before it is finished and they had not converged
        (:func:`vitkit.reproduce.core.wording.convergence`), up to ``longer`` doublings; the last
        factor's runs stand for the size. A planning suite counts the first length only.

        Args:
            which: ``low`` or ``native``.
            lr: the size's chosen fine-tuning rate.

        Returns:
            ``[1]``, ``[1, 2]``, ...
        """
        factors = [1]
        if self.suite.planning:
            return factors
        for _ in range(int(self.cfg.get("longer", 0))):
            got = [self.result_of(self.finetune(which, lr, s, factors[-1])) for s in self.seeds]
            if any(r is None for r in got) or convergence([r.get("minival_curve") for r in got]).converged:
                break
            factors.append(2 * factors[-1])
        return factors

    def settled(self, which: str, lr: float) -> bool:
        """Whether the plateau rule has its last length for ``which``: that length's runs are all
        finished (always, when only counting runs)."""
        return self.finished(self.finetune(which, lr, s, self.lengths(which, lr)[-1]) for s in self.seeds)

    def image_flops(self, which: str) -> int:
        """Forward FLOPs of one image through the model at ``which`` size."""
        m = self.pretrain(0).recipe["model"] if which == "low" else self.base_spec(self.cfg["model"], 0).recipe["model"]
        over = {**m.get("overrides", {}), "in_chans": self.suite.info.in_chans,
                "num_classes": self.suite.info.num_classes}  # fmt: skip
        return vit_flops(model_config(m["name"], **over))

    def scratch_steps(self, finetune_steps: int) -> int:
        """Steps of the from-scratch arm at the data's size: as many training FLOPs as the
        pre-training at the low size plus ``finetune_steps`` of fine-tuning at the data's, at the
        common batch size (both recipes use it)."""
        pre = self.pretrain(0).recipe["train"]
        ratio = self.image_flops("low") / self.image_flops("native")
        return math.ceil(int(pre["steps"]) * ratio + finetune_steps)

    def scratch(self, seed: int, finetune_steps: int) -> RunSpec:
        """The from-scratch arm: the common recipe at the data's size, no pre-training, for
        :meth:`scratch_steps`."""
        model, base = self.cfg["model"], self.base_spec(self.cfg["model"], seed)
        steps = self.scratch_steps(finetune_steps)
        tree = self.suite.recipe(model, seed, extra=self.schedule(base.recipe, steps))
        native = self.size_text("native")
        label = f"{model}, from scratch at {native}, {steps:,} steps (equal training FLOPs), seed {seed}"
        return RunSpec(label=label, model=model, recipe=tree)

    def grid(self, rates: list[float] | None = None) -> dict[str, dict[float, RunSpec]]:
        """Phase 1's fine-tuning runs: each size at every rate (:meth:`rates` unless given), at the
        first seed."""
        rates = self.rates() if rates is None else rates
        return {w: {lr: self.finetune(w, lr, self.seeds[0]) for lr in rates} for w in SIZES}

    def planned(self) -> bool:
        return self.finished(s for cells in self.grid().values() for s in cells.values())

    def chosen_rates(self) -> dict[str, float]:
        """Each size's fine-tuning rate, chosen on the first seed's minival (sizes not yet chosen
        are left out)."""
        out = {}
        for which, cells in self.grid().items():
            lr = self.choose_on_minival({lr: [s] for lr, s in cells.items()})
            if lr is not None:
                out[which] = float(lr)
        return out

    def runs(self) -> list[RunSpec]:
        out = [self.pretrain(s) for s in self.seeds]
        out += [s for cells in self.grid().values() for s in cells.values()]
        if self.planned():
            chosen = self.chosen_rates()
            for which, lr in chosen.items():
                for f in self.lengths(which, lr):
                    out += [self.finetune(which, lr, s, f) for s in (self.seeds[1:] if f == 1 else self.seeds)]
            native = chosen.get("native")
            if native is not None and self.settled("native", native):
                steps = self.finetune("native", native, 0, self.lengths("native", native)[-1]).recipe["train"]["steps"]
                out += [self.scratch(s, int(steps)) for s in self.seeds]
        return list({s.key: s for s in out}.values())

    def zero_step_top1(self, seed: int, pretrained: dict[str, Any]) -> float | None:
        """The control: test top-1 of the seed's pre-trained model at the data's size, its position
        embeddings interpolated as fine-tuning's start interpolates them, and no step taken. The
        test images are the ones every run is scored on.

        Args:
            seed: the pre-training run's seed.
            pretrained: that run's result.

        Returns:
            The top-1; nan when the pre-training diverged; None when its run folder holds no
            checkpoint.
        """
        if not finite([pretrained.get("test_top1")]):
            return math.nan
        spec = self.pretrain(seed)
        best = self.suite.run_dir(spec) / "best.safetensors"
        if not best.is_file():
            return None
        settings = ScoreSettings.of(self.suite)
        model = load_pretrained(best, img_size=list(self.sizes()["native"]))  # as model.init_from loads it
        test = build_dataset(settings.data, "test", **dict(settings.data_options))
        metrics = evaluate(model, test, precision=spec.recipe["train"]["precision"], max_images=settings.test_images)
        return float(metrics["top1"])

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        shots, rates, first = shots_label(results), self.rates(), self.seeds[0]
        grid = self.grid()
        chosen = {w: best_on_minival({lr: results.get(s.key) for lr, s in cells.items()}) for w, cells in grid.items()}
        picked = {w: lr for w, lr in chosen.items() if lr is not None}
        final = {w: self.lengths(w, lr)[-1] for w, lr in picked.items()}  # the plateau rule's last lengths
        seeds = [  # the seeds whose runs at the chosen rates are finished (all, once the plan is)
            s for s in self.seeds if all(self.finetune(w, lr, s, final[w]).key in results for w, lr in picked.items())
        ]
        low, native = self.size_text("low"), self.size_text("native")
        pre = [results[self.pretrain(s).key] for s in seeds]
        zero = [self.zero_step_top1(s, r) for s, r in zip(seeds, pre)]
        arms: dict[str, Any] = {
            "pretrained": {"title": f"pre-trained at {low}, no fine-tuning", "short": f"pre-trained, {low}",
                           "size": "low", "test_top1": self.top1(pre), "fewshot": self.fewshot(pre)},
            "zero_step": {"title": f"pre-trained at {low}, scored at {native} (interpolated), no fine-tuning",
                          "short": f"zero-step control, {native}", "size": "native", "test_top1": zero, "fewshot": []},
        }  # fmt: skip
        arms.update(self.trained_arms(results, seeds, picked, chosen))
        cells = [
            {"size": w, "lr": lr, "rate": f"{lr:g}", "chosen": lr == chosen[w],
             "minival_top1": results[s.key].get("minival_top1"), "test_top1": results[s.key].get("test_top1")}
            for w, by_rate in grid.items() for lr, s in by_rate.items()
        ]  # fmt: skip
        numbers: dict[str, Any] = {
            "sizes": {w: list(self.sizes()[w]) for w in SIZES}, "tokens": {w: self.tokens(w) for w in SIZES},
            "rates": rates, "grid_seed": first, "seeds": seeds, "chosen": chosen,
            "position": {w: grid_position(chosen[w], rates) for w in SIZES}, "arms": arms, "grid": cells,
        }  # fmt: skip
        header = ["model", "tokens", "fine-tuning rate", f"minival top-1, seed {first}", "test top-1", shots]
        pre_arm, zero_arm = arms["pretrained"], arms["zero_step"]
        rows = [
            [pre_arm["title"], str(self.tokens("low")), "—", "", pct(pre_arm["test_top1"]), pct(pre_arm["fewshot"])],
            [zero_arm["title"], str(self.tokens("native")), "—", "", control_cell(zero_arm["test_top1"]), "—"],
        ]
        for which in SIZES:
            a = arms[f"finetuned_{which}"]
            rate = "none chosen" if a["lr"] is None else f"{a['lr']:g}"
            rows.append([a["title"], str(self.tokens(which)), rate, "", pct(a["test_top1"]), pct(a["fewshot"])])
        a = arms["scratch_native"]
        rows.append([a["title"], str(self.tokens("native")), "the common recipe's", "", pct(a["test_top1"]),
                     pct(a["fewshot"])])  # fmt: skip
        for c in cells:
            mark = " (chosen)" if c["chosen"] else ""
            rows.append([f"grid: fine-tuned at {self.size_text(c['size'])}, seed {first}", str(self.tokens(c["size"])),
                         c["rate"] + mark, pct([c["minival_top1"]]), pct([c["test_top1"]]), ""])  # fmt: skip
        verdict, numbers["comparisons"] = self.verdict(numbers)
        section = self.section(header, rows, numbers, verdict)
        section.headline = sentence_from(
            verdict, "This agrees", "This does not agree", "Section 3.2's gain", "Fine-tuning at"
        )
        section.caption = (
            "Measured (in percent; each model scored at its own size): mean ± standard deviation over the seeds of "
            f"the chosen rates; the grid rows are seed {first}, whose minival top-1 chooses each size's rate"
        )
        section.figures.append(plot_resolution(numbers, self.suite.out / "figures" / "resolution.png"))
        return section

    def trained_arms(
        self, results: dict[str, dict[str, Any]], seeds: list[int], picked: dict[str, float], chosen: dict[str, Any]
    ) -> dict[str, dict[str, Any]]:
        """The arms that train after the pre-training: each size's fine-tuning at its chosen rate
        and the plateau rule's last length, and the from-scratch arm at that length's FLOPs.

        Args:
            results: the finished runs' results by key.
            seeds: the seeds whose fine-tunings are all finished.
            picked: each size's chosen rate, for the sizes that have one.
            chosen: each size's chosen rate or None.

        Returns:
            ``{"finetuned_low", "finetuned_native", "scratch_native"}``, each its title, rate,
            steps, test top-1, few-shot accuracy, minival top-1 and minival curves per seed.
        """
        native = self.size_text("native")
        out: dict[str, dict[str, Any]] = {}
        steps: dict[str, int | None] = {}
        for which in SIZES:
            res: list[dict[str, Any]] = []
            steps[which] = None
            if which in picked:
                factor = self.lengths(which, picked[which])[-1]
                specs = [self.finetune(which, picked[which], s, factor) for s in seeds]
                res = [results[sp.key] for sp in specs if sp.key in results]
                res = res if len(res) == len(specs) else []
                steps[which] = int(self.finetune(which, picked[which], self.seeds[0], factor).recipe["train"]["steps"])
            out[f"finetuned_{which}"] = {
                "title": f"fine-tuned at {self.size_text(which)}"
                + ("" if steps[which] is None else f" ({steps[which]:,} steps)"),
                "short": f"fine-tuned, {self.size_text(which)}",
                "size": which, "lr": chosen[which], "steps": steps[which],
                "test_top1": self.top1(res), "fewshot": self.fewshot(res),
                "minival_top1": [r.get("minival_top1") for r in res],
                "curves": [r.get("minival_curve") or [] for r in res],
            }  # fmt: skip
        scratch: list[dict[str, Any]] = []
        scratch_steps = None if steps["native"] is None else self.scratch_steps(steps["native"])
        if steps["native"] is not None:
            specs = [self.scratch(s, steps["native"]) for s in seeds]
            scratch = [results[sp.key] for sp in specs if sp.key in results]
            scratch = scratch if len(scratch) == len(specs) else []
        out["scratch_native"] = {
            "title": f"from scratch at {native}, equal training FLOPs"
            + ("" if scratch_steps is None else f" ({scratch_steps:,} steps)"),
            "short": f"from scratch, {native}", "size": "native", "lr": None, "steps": scratch_steps,
            "test_top1": self.top1(scratch), "fewshot": self.fewshot(scratch),
            "minival_top1": [r.get("minival_top1") for r in scratch],
            "curves": [r.get("minival_curve") or [] for r in scratch],
        }  # fmt: skip
        return out

    def verdict(self, numbers: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The verdict sentence and the paired intervals it rests on (points of test top-1).

        Args:
            numbers: the section's numbers (arms, chosen rates, their places in the grid).

        Returns:
            The sentence and ``{comparison: interval or None}``.
        """
        low, native = self.size_text("low"), self.size_text("native")
        chosen, position, rates, arms = numbers["chosen"], numbers["position"], numbers["rates"], numbers["arms"]
        choice = "; ".join(
            position_clause(f"fine-tuning at {self.size_text(w)}", chosen[w], position[w], rates, "{:g}".format)
            for w in SIZES
        )
        text = f"By the minival of seed {numbers['grid_seed']}, the fine-tuning rate is: {choice}."
        if chosen["low"] is None or chosen["native"] is None:
            return text + " Without a rate for each size there is nothing to compare.", {}
        up, same = arms["finetuned_native"]["test_top1"], arms["finetuned_low"]["test_top1"]
        zero, pre = arms["zero_step"]["test_top1"], arms["pretrained"]["test_top1"]

        def interval(a: list[Any], b: list[Any]) -> dict[str, Any] | None:
            diff = paired_difference(a, b)
            return None if diff is None else diff.scaled(100).to_dict()

        scratch = arms["scratch_native"]["test_top1"]
        comparisons = {
            "native_minus_low": interval(up, same),
            "native_minus_zero_step": interval(up, zero),
            "pretrained_minus_zero_step": interval(pre, zero),
            "native_minus_scratch": interval(up, scratch) if scratch else None,
        }
        at_native, at_low = f"fine-tuning at {native}", f"fine-tuning at {low}"
        parts = [
            "each scored at its own size, on test top-1 " + lead(at_native, up, at_low, same),
            f"against the zero-step control ({low} model at {native}, position embeddings interpolated, no "
            "fine-tuning) " + lead(at_native, up, "the zero-step control", zero),
            "and without fine-tuning, the interpolation alone against the pre-training size: "
            + lead(f"the pre-trained model at {low}", pre, "the zero-step control", zero),
        ]
        if scratch:
            parts.append(
                f"at equal training FLOPs, {at_native} after pre-training at {low} against training from scratch at "
                f"{native} ({arms['scratch_native']['steps']:,} steps): "
                + lead(at_native, up, "training from scratch", scratch)
            )
        said = "; ".join(parts)
        first, rest = contrasts(
            (f"{at_native} against {at_low}", up, same),
            {f"{at_native} against training from scratch at {native}": (up, scratch)} if scratch else {},
        )
        comparisons["contrasts"] = {c.name: c.to_dict() for c in (first, *rest)}
        holm = said_with_holm(first, rest)
        unfinished = [
            sentence
            for which in reversed(SIZES)  # the data's own size first: the arm section 3.2's gain rests on
            if (
                sentence := not_a_test(
                    f"Fine-tuning at {self.size_text(which)}",
                    convergence(arms[f"finetuned_{which}"].get("curves") or []),
                    "section 3.2's gain",
                )
            )
        ]
        scratch_unfinished = scratch and not_a_test(
            f"Training from scratch at {native}",
            convergence(arms["scratch_native"].get("curves") or []),
            "the equal-compute comparison",
        )
        tail = f" {scratch_unfinished}" if scratch_unfinished else ""
        return text + " " + said[0].upper() + said[1:] + ". " + holm + " " + self.agreement(
            comparisons["native_minus_low"], unfinished
        ) + tail, comparisons

    @staticmethod
    def agreement(diff: dict[str, Any] | None, unfinished: list[str] | None = None) -> str:
        """Whether fine-tuning at the data's size paid, as section 3.2 finds; not a test where an arm
        had not finished improving (:func:`vitkit.reproduce.core.wording.not_a_test`).

        Args:
            diff: the paired interval of native minus low, in points (None: not weighed).
            unfinished: the sentences of the fine-tuning arms that had not converged.

        Returns:
            One or more sentences.
        """
        if unfinished:
            return " ".join(unfinished)
        if diff is None:
            return "Section 3.2's gain is not weighed here (fewer than 2 seeds with finite results on both sides)."
        if diff["low"] > 0:
            return "This agrees with section 3.2: fine-tuning at the higher resolution pays."
        if diff["high"] < 0:
            return "This does not agree with section 3.2: fine-tuning at the pre-training size does better here."
        return "Section 3.2's gain is not shown here: the two fine-tunings are not distinguishable."


def control_cell(values: list[Any]) -> str:
    """The zero-step control's table cell: :func:`pct`, or a note when no checkpoint was there to score.

    Args:
        values: test top-1 per seed; None where the pre-training run left no checkpoint.

    Returns:
        The cell.
    """
    if values and all(v is None for v in values):
        return "no checkpoint to score"
    return pct(values)
