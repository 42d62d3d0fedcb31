"""``pos-embed`` (Table 8, appendix D.4): the same ViT with no position embedding, learned 1-D,
learned 2-D (row and column tables), relative (a 1-D attention bias) and fixed 2-D sin-cos; some
of them again at several times the steps, to tell learning speed from capacity.

Every comparison is paired by seed (:mod:`vitkit.reproduce.core.stats`): each kind against the learned 1-D (the
paper's default), the learned 1-D against none, and, across the two lengths, the change of a gap
(the difference of the per-seed differences).
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import UsageError
from ..core.experiment import Experiment, Section, lead, pct, sentence_from, shots_label
from ..core.registry import register
from ..core.spec import RunSpec
from ..core.stats import Interval, paired_difference
from .compute import scaled_length
from .figures import plot_pos_embed


def _diff(a: list[Any], b: list[Any]) -> dict[str, Any] | None:
    """The paired interval of ``a - b`` in points, as JSON-ready numbers (None below two pairs)."""
    d = paired_difference(a, b)
    return None if d is None else d.scaled(100).to_dict()


def _sign(d: dict[str, Any] | None) -> int | None:
    """1 or -1 when the interval excludes zero on that side, 0 when it holds zero, None unweighed."""
    if d is None:
        return None
    return 0 if not Interval(**d).excludes_zero else (1 if d["estimate"] > 0 else -1)


def gaps(a: list[Any], b: list[Any]) -> list[float]:
    """Per seed, ``a - b`` (nan where either is not a finite number).

    Args:
        a: one arm's accuracies, one per seed.
        b: the other's, in the same seed order.

    Returns:
        The differences.
    """

    def ok(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    return [float(x) - float(y) if ok(x) and ok(y) else math.nan for x, y in zip(a, b, strict=True)]


def change(name: str, diff: dict[str, Any] | None, short: int, long: int) -> str:
    """The clause for how a gap moves from ``short`` to ``long`` steps.

    Args:
        name: the gap (``learned 1-D minus none``).
        diff: the paired interval (points) of the gap at ``long`` minus the gap at ``short``.
        short: the shorter run's steps.
        long: the longer run's steps.

    Returns:
        ``learned 1-D minus none falls by 1.2 points from 800 to 3200 steps (95% CI ...)``, or says
        the change is not distinguishable, or not weighed.
    """
    span = f"from {short} to {long} steps"
    if diff is None:
        return f"{name} is not weighed {span} (fewer than 2 seeds with finite results at both lengths)"
    ci = f"{100 * diff['level']:.0f}% CI {diff['low']:.1f} to {diff['high']:.1f}, {diff['n']} seeds"
    if _sign(diff) == 0:
        return f"{name} does not change distinguishably {span} ({diff['estimate']:+.1f} points; {ci})"
    return f"{name} {'rises' if diff['estimate'] > 0 else 'falls'} by {abs(diff['estimate']):.1f} points {span} ({ci})"


def reading(
    name_a: str,
    name_b: str,
    at_short: dict[str, Any] | None,
    at_long: dict[str, Any] | None,
    moved: dict[str, Any] | None,
    factor: float,
) -> str:
    """What a gap at two lengths says: a lead that closes with more steps was learning speed; one
    that holds is more than that.

    Args:
        name_a: one arm.
        name_b: the other.
        at_short: the paired interval of ``a - b`` at the shorter length.
        at_long: the same at the longer.
        moved: the paired interval of the change (long minus short).
        factor: the longer length against the shorter.

    Returns:
        A clause.
    """
    s1, s4, moves = _sign(at_short), _sign(at_long), _sign(moved)
    more = f"{factor:g}x the steps"
    if s1 is None or s4 is None:
        return f"whether the gap between {name_a} and {name_b} lasts cannot be weighed (too few seeds)"
    if s1 == 0:
        if s4 == 0:
            return f"{name_a} and {name_b} are not distinguishable at either length"
        leader, other = (name_a, name_b) if s4 > 0 else (name_b, name_a)
        return f"{leader} leads {other} only at {more}"
    leader, other = (name_a, name_b) if s1 > 0 else (name_b, name_a)
    if s4 == s1:
        narrows = " though it narrows" if moves == -s1 else ""
        return f"{leader}'s lead over {other} holds at {more}{narrows}: not learning speed alone"
    if s4 == 0:
        if moves == -s1:
            return f"{leader}'s lead over {other} closes at {more}: it was learning speed"
        return (
            f"{leader}'s lead over {other} is not distinguishable at {more}, but its change is not either: "
            "learning speed and capacity are not told apart"
        )
    return f"{other} overtakes {leader} at {more}"


@register
class PosEmbed(Experiment):
    name = "pos-embed"

    def variants(self) -> dict[str, dict[str, Any]]:
        """The variants that run (``include``), by name: ``{"pos_embed", "title", "paper"}``."""
        defs = self.cfg["variants"]
        names = list(self.cfg.get("include") or defs)
        if unknown := [v for v in names if v not in defs]:
            raise UsageError(f"pos-embed: include names {', '.join(unknown)}, not among its variants")
        return {v: dict(defs[v]) for v in names}

    def reference(self) -> str:
        """The variant every other is compared with (the paper's default, learned 1-D)."""
        ref = str(self.cfg.get("reference", "learned"))
        if ref not in self.variants():
            raise UsageError(f"pos-embed: the reference {ref!r} is not among the variants that run")
        return ref

    def long_factor(self) -> float:
        """How many times the budget's steps the long runs train."""
        return float(self.cfg.get("long_factor", 4))

    def long_variants(self) -> list[str]:
        """The variants that also run at :meth:`long_factor` times the steps."""
        names = list(self.cfg.get("long_variants") or [])
        if unknown := [v for v in names if v not in self.variants()]:
            raise UsageError(f"pos-embed: long_variants names {', '.join(unknown)}, not among the variants that run")
        return names

    def steps(self, factor: float = 1.0) -> int:
        """The steps of a run ``factor`` times the budget's length."""
        recipe = self.suite.recipe(self.cfg["model"], 0)
        return int(recipe["train"]["steps"] if factor == 1.0 else scaled_length(recipe, factor)["train"]["steps"])

    def variant_spec(self, variant: str, seed: int, factor: float = 1.0) -> RunSpec:
        """``variant``'s run of ``seed``, ``factor`` times the budget's steps.

        Args:
            variant: a name of ``variants`` in pos_embed.yaml.
            seed: the run's seed.
            factor: the length against the budget's (1.0: the learned 1-D run is the shared one).

        Returns:
            The run.
        """
        model = self.cfg["model"]
        kind = self.cfg["variants"][variant]["pos_embed"]
        default = kind == self.default_of(model, "pos_embed")
        if default and factor == 1.0:
            return self.base_spec(model, seed)  # the shared baseline run
        overrides = {} if default else {"pos_embed": kind}
        extra = {} if factor == 1.0 else scaled_length(self.suite.recipe(model, seed), factor)
        length = "" if factor == 1.0 else f", {extra['train']['steps']} steps"
        return self.spec(
            model, seed, f"{model}, pos_embed {kind}{length}, seed {seed}", overrides=overrides, extra=extra
        )

    def runs(self) -> list[RunSpec]:
        short = [self.variant_spec(v, s) for v in self.variants() for s in self.seeds]
        return short + [self.variant_spec(v, s, self.long_factor()) for v in self.long_variants() for s in self.seeds]

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        shots, factor = shots_label(results), self.long_factor()
        header = ["position embedding", "steps", "test top-1", shots, "paper (Table 8, 5-shot ImageNet)"]
        numbers: dict[str, Any] = {
            "steps": self.steps(), "long_steps": self.steps(factor), "long_factor": factor,
            "reference": self.reference(), "variants": {}, "long": {},
        }  # fmt: skip
        rows = []
        for group, names, f in (("variants", self.variants(), 1.0), ("long", self.long_variants(), factor)):
            for v in names:
                info = self.cfg["variants"][v]
                res = [results[self.variant_spec(v, s, f).key] for s in self.seeds]
                paper = info.get("paper") if f == 1.0 else None
                numbers[group][v] = {"title": info["title"], "paper": paper,
                                     "test_top1": self.top1(res), "fewshot": self.fewshot(res)}  # fmt: skip
                rows.append([info["title"], str(self.steps(f)), pct(self.top1(res)), pct(self.fewshot(res)),
                             "—" if paper is None else f"{100 * paper:.1f}"])  # fmt: skip
        numbers["comparisons"] = self.comparisons(numbers)
        figure = plot_pos_embed(numbers, self.suite.out / "figures" / "pos_embed.png", shots)
        section = self.section(header, rows, numbers, self.verdict(numbers, shots))
        section.headline = sentence_from(section.verdict, "Table 8 finds")
        section.figures.append(figure)
        return section

    def comparisons(self, numbers: dict[str, Any]) -> dict[str, Any]:
        """Every paired interval the verdict rests on.

        Args:
            numbers: the section's numbers (``variants``, ``long``, ``reference``).

        Returns:
            Intervals of test top-1 in points (None where fewer than two seeds weigh them), by name:
            ``KIND-REF`` at the budget's steps; for each pair the long arm compares (each kind
            against none, the relative against the reference) ``short:A-B`` and ``long:A-B`` at
            the two lengths and ``moved:A-B``, the change of the gap per seed (long minus short).
        """
        v, lv, ref = numbers["variants"], numbers["long"], numbers["reference"]
        out: dict[str, Any] = {}
        for k in v:
            if k != ref:
                out[f"{k}-{ref}"] = _diff(v[k]["test_top1"], v[ref]["test_top1"])
        pairs = [(k, "none") for k in lv if k != "none" and "none" in lv]
        pairs += [(k, ref) for k in lv if k not in (ref, "none") and ref in lv]
        for a, b in pairs:
            out[f"long:{a}-{b}"] = _diff(lv[a]["test_top1"], lv[b]["test_top1"])
            out[f"short:{a}-{b}"] = _diff(v[a]["test_top1"], v[b]["test_top1"])
            out[f"moved:{a}-{b}"] = _diff(
                gaps(lv[a]["test_top1"], lv[b]["test_top1"]), gaps(v[a]["test_top1"], v[b]["test_top1"])
            )
        return out

    def verdict(self, numbers: dict[str, Any], shots: str) -> str:
        v, lv, ref, cmp = numbers["variants"], numbers["long"], numbers["reference"], numbers["comparisons"]
        steps, long_steps, factor = numbers["steps"], numbers["long_steps"], numbers["long_factor"]

        def name(k: str) -> str:
            return str(self.cfg["variants"][k]["title"]).split(" (")[0]

        parts = []
        if "none" in v and ref != "none":
            parts.append(
                f"At {steps} steps, on test top-1 "
                + lead(name(ref), v[ref]["test_top1"], name("none"), v["none"]["test_top1"])
                + " (Table 8: 2.8 points on 5-shot ImageNet); on "
                + f"{shots} transfer "
                + lead(name(ref), v[ref]["fewshot"], name("none"), v["none"]["fewshot"])
            )
        kinds = [k for k in v if k not in (ref, "none")]
        if kinds:
            each = "; ".join(lead(name(k), v[k]["test_top1"], name(ref), v[ref]["test_top1"]) for k in kinds)
            parts.append(
                f"against {name(ref)} on test top-1 {each} (Table 8: learned 2-D and relative 0.2 points below)"
            )
        pairs = [key.split(":")[1].split("-") for key in cmp if key.startswith("long:")]
        if pairs:
            at_long = "; ".join(lead(name(a), lv[a]["test_top1"], name(b), lv[b]["test_top1"]) for a, b in pairs)
            moved = "; ".join(change(f"{name(a)} minus {name(b)}", cmp[f"moved:{a}-{b}"], steps, long_steps)
                              for a, b in pairs)  # fmt: skip
            read = "; ".join(
                reading(name(a), name(b), cmp[f"short:{a}-{b}"], cmp[f"long:{a}-{b}"], cmp[f"moved:{a}-{b}"], factor)
                for a, b in pairs
            )
            unsaid = [(a, b) for a, b in pairs if b != ref and not (a == ref and b == "none")]  # not compared above
            if unsaid:
                each = "; ".join(lead(name(a), v[a]["test_top1"], name(b), v[b]["test_top1"]) for a, b in unsaid)
                parts.append(f"at {steps} steps {each}")
            parts.append(f"at {long_steps} steps ({factor:g}x) {at_long}; per seed, {moved}. So: {read}")
        text = "; ".join(parts) + ". " if parts else "Too few variants ran to compare. "
        return text + self.agreement(numbers)

    def agreement(self, numbers: dict[str, Any]) -> str:
        """Whether the measurement agrees with Table 8's two findings, each said on its own."""
        v, ref, cmp = numbers["variants"], numbers["reference"], numbers["comparisons"]
        title = str(self.cfg["variants"][ref]["title"]).split(" (")[0]
        paper = "Table 8 finds that having positions matters (2.8 points) and the kind barely does (0.2 points)"
        said = []
        if "none" in v and ref != "none":
            s = _sign(cmp[f"none-{ref}"])  # none minus the reference
            said.append("on positions this " + {
                None: "cannot be weighed (too few seeds with finite results)",
                -1: f"agrees: {title} leads none here too",
                1: f"disagrees: here none leads {title}",
                0: f"does not show the effect: {title} and none are not distinguishable here",
            }[s])  # fmt: skip
        kinds = [k for k in v if k not in (ref, "none")]
        signs = {k: _sign(cmp[f"{k}-{ref}"]) for k in kinds}
        if kinds and all(s is None for s in signs.values()):
            said.append("on the kind it cannot be weighed (too few seeds with finite results)")
        elif kinds:
            apart = [self.cfg["variants"][k]["title"] for k, s in signs.items() if s]
            unweighed = [self.cfg["variants"][k]["title"] for k, s in signs.items() if s is None]
            if apart:
                verb = "differs" if len(apart) == 1 else "differ"
                said.append(
                    f"on the kind it differs: {', '.join(apart)} {verb} from {title} by intervals that exclude zero"
                )
            elif unweighed:
                said.append(
                    f"on the kind no other is distinguishable from {title}, and {', '.join(unweighed)} not weighed"
                )
            else:
                said.append(
                    f"on the kind it is consistent: no kind is distinguishable from {title} (every interval holds zero)"
                )
        return f"{paper}; " + ("; ".join(said) or "neither can be weighed with these variants") + "."
