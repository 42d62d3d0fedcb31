"""``pos-embed`` (Table 8, appendix D.4): the same ViT with no position embedding, learned 1-D,
learned 2-D (row and column tables), relative (a 1-D attention bias) and fixed 2-D sin-cos; some
of them again at several times the steps, to tell learning speed from capacity.

Every comparison is paired by seed (:mod:`vitkit.reproduce.core.stats`). The primary contrast is
Table 8's first finding, the learned 1-D (the paper's default) against none at the budget's steps.
The kind's contrasts (each kind against the learned 1-D, at each length it ran) are one family,
Holm-corrected (:func:`vitkit.reproduce.core.wording.contrasts`): a kind is said to differ only
where the adjusted p-value is below 0.05 and, where it also ran longer, only if the difference
lasts. The rest (the long arm against none, and the change of a gap across the two lengths, the
difference of the per-seed differences) are readings of learning speed against capacity, said with
their plain intervals.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import UsageError
from ..core.experiment import Experiment, Section, lead, pct, sentence_from, shots_label
from ..core.registry import register
from ..core.spec import RunSpec
from ..core.stats import Interval, paired_difference
from ..core.wording import Contrast, contrast_clause, contrasts
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
    corrected: bool | None = None,
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
        corrected: for a gap of a Holm-corrected family, whether the gap at the shorter length
            survives the correction (False: it counts as not distinguishable); None outside one.

    Returns:
        A clause.
    """
    s1, s4, moves = _sign(at_short), _sign(at_long), _sign(moved)
    if corrected is False and s1:
        s1 = 0
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
        primary, family = self.contrasts(numbers)
        numbers["primary"] = {"key": f"none-{self.reference()}", **primary.to_dict()}
        numbers["holm"] = {key: c.to_dict() for key, c in family.items()}
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

    def contrasts(self, numbers: dict[str, Any]) -> tuple[Contrast, dict[str, Contrast]]:
        """The primary contrast and the kind's family, Holm-corrected.

        Args:
            numbers: the section's numbers (``variants``, ``long``, ``reference``, ``steps``).

        Returns:
            The primary (the reference against none at the budget's steps; its interval is not
            weighed without a none arm) and the family by comparison key: ``KIND-REF`` for each
            kind at the budget's steps and ``long:KIND-REF`` for each that also ran longer.
        """
        v, lv, ref = numbers["variants"], numbers["long"], numbers["reference"]

        def title(k: str) -> str:
            return str(self.cfg["variants"][k]["title"]).split(" (")[0]

        none = v["none"]["test_top1"] if "none" in v and ref != "none" else []
        primary = (f"{title(ref)} against {title('none') if none else 'none'}", v[ref]["test_top1"], none)
        family: dict[str, tuple[Any, Any]] = {}
        names: dict[str, str] = {}
        for arms, steps, prefix in (
            (v, numbers["steps"], ""),
            (lv, numbers["long_steps"], "long:"),
        ):
            if ref not in arms:
                continue
            for k in arms:
                if k not in (ref, "none"):
                    key = f"{prefix}{k}-{ref}"
                    family[key] = (arms[k]["test_top1"], arms[ref]["test_top1"])
                    names[key] = f"{title(k)} against {title(ref)} at {steps} steps"
        first, rest = contrasts(primary, {names[k]: family[k] for k in family})
        return first, dict(zip(family, rest, strict=True))

    def verdict(self, numbers: dict[str, Any], shots: str) -> str:
        v, lv, ref, cmp = numbers["variants"], numbers["long"], numbers["reference"], numbers["comparisons"]
        steps, long_steps, factor = numbers["steps"], numbers["long_steps"], numbers["long_factor"]

        def name(k: str) -> str:
            return str(self.cfg["variants"][k]["title"]).split(" (")[0]

        parts = []
        if "none" in v and ref != "none":
            parts.append(
                f"Primary contrast, at {steps} steps on test top-1: "
                + lead(name(ref), v[ref]["test_top1"], name("none"), v["none"]["test_top1"])
                + " (Table 8: 2.8 points on 5-shot ImageNet); on "
                + f"{shots} transfer "
                + lead(name(ref), v[ref]["fewshot"], name("none"), v["none"]["fewshot"])
            )
        family = [self._holm_clause(k, c) for k, c in numbers.get("holm", {}).items()]
        if family:
            parts.append(
                f"the kind, on test top-1 against {name(ref)}, Holm-corrected over its {len(family)} contrasts: "
                + "; ".join(family)
                + " (Table 8: learned 2-D and relative 0.2 points below)"
            )
        pairs = [key.split(":")[1].split("-") for key in cmp if key.startswith("long:")]
        if pairs:
            at_long = "; ".join(lead(name(a), lv[a]["test_top1"], name(b), lv[b]["test_top1"]) for a, b in pairs)
            moved = "; ".join(change(f"{name(a)} minus {name(b)}", cmp[f"moved:{a}-{b}"], steps, long_steps)
                              for a, b in pairs)  # fmt: skip
            holm = numbers.get("holm", {})
            read = "; ".join(
                reading(
                    name(a), name(b), cmp[f"short:{a}-{b}"], cmp[f"long:{a}-{b}"], cmp[f"moved:{a}-{b}"], factor,
                    holm[f"{a}-{b}"]["claimed"] if f"{a}-{b}" in holm else None,
                )
                for a, b in pairs
            )  # fmt: skip
            unsaid = [(a, b) for a, b in pairs if b != ref and not (a == ref and b == "none")]  # not compared above
            if unsaid:
                each = "; ".join(lead(name(a), v[a]["test_top1"], name(b), v[b]["test_top1"]) for a, b in unsaid)
                parts.append(f"at {steps} steps {each}")
            parts.append(
                f"at {long_steps} steps ({factor:g}x; plain intervals, readings of learning speed) {at_long}; "
                f"per seed, {moved}. So: {read}"
            )
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
            text = "on positions this " + {
                None: "cannot be weighed (too few seeds with finite results)",
                -1: f"agrees: {title} leads none here too",
                1: f"disagrees: here none leads {title}",
                0: f"does not show the effect: {title} and none are not distinguishable here",
            }[s]  # fmt: skip
            longer = cmp.get(f"long:{ref}-none", "absent")
            if s in (-1, 1) and longer != "absent" and _sign(longer) != -s:
                text += f" at {numbers['steps']} steps, but not at {numbers['long_steps']} steps, where " + (
                    "it cannot be weighed" if longer is None else f"the lead is {Interval(**longer).text(1, ' points')}"
                )
            said.append(text)
        kinds = [k for k in v if k not in (ref, "none")]
        family = numbers.get("holm", {})
        weighed = {k: c for k, c in family.items() if c["adjusted"] is not None}
        if kinds and not weighed:
            said.append("on the kind it cannot be weighed (too few seeds with finite results)")
        elif kinds:
            said.append("on the kind " + self._kind_agreement(numbers, kinds, weighed))
        return f"{paper}; " + ("; ".join(said) or "neither can be weighed with these variants") + "."

    def _holm_clause(self, key: str, c: dict[str, Any]) -> str:
        """One contrast of the kind's family, from its numbers in report.json."""
        kind = key.removeprefix("long:").split("-")[0]
        name = str(self.cfg["variants"][kind]["title"]).split(" (")[0]
        head = f"{name} at {self.steps(self.long_factor() if key.startswith('long:') else 1.0)} steps"
        diff = None if c["interval"] is None else Interval(**c["interval"])
        return contrast_clause(Contrast(head, diff, c["p"], c["adjusted"]))

    def _kind_agreement(self, numbers: dict[str, Any], kinds: list[str], weighed: dict[str, dict[str, Any]]) -> str:
        """Table 8's second finding (the kind barely matters) against the Holm-corrected family: a
        kind differs only where its adjusted p is below the level at the budget's steps and, where it
        also ran longer, at the longer length too, on the same side."""
        ref, long_steps = numbers["reference"], numbers["long_steps"]
        title = str(self.cfg["variants"][ref]["title"]).split(" (")[0]

        def side(c: dict[str, Any] | None) -> int:
            return 0 if c is None or not c["claimed"] else (1 if c["interval"]["estimate"] > 0 else -1)

        lasting, passing = [], []
        for k in kinds:
            short, longer = weighed.get(f"{k}-{ref}"), weighed.get(f"long:{k}-{ref}")
            if side(short) == 0:
                continue
            full = self.cfg["variants"][k]["title"]
            if longer is None:
                lasting.append(full)
            elif side(longer) == side(short):
                lasting.append(f"{full} (at both lengths)")
            else:
                iv = Interval(**longer["interval"])
                passing.append(
                    f"{full} differs at {numbers['steps']} steps but not at {long_steps} steps, where the difference "
                    f"is {iv.text(1, ' points')}, Holm-adjusted p {longer['adjusted']:.3f}"
                )
        if lasting:
            verb = "differs" if len(lasting) == 1 else "differ"
            return (
                f"it differs: {', '.join(lasting)} {verb} from {title} after Holm's correction over "
                f"{len(weighed)} contrasts" + ("; " + "; ".join(passing) if passing else "")
            )
        if passing:
            return (
                "it shows no lasting difference: " + "; ".join(passing) + ", after Holm's correction over "
                f"{len(weighed)} contrasts"
            )
        key, smallest = min(weighed.items(), key=lambda kc: kc[1]["adjusted"])
        kind, at = key.removeprefix("long:").split("-")[0], long_steps if key.startswith("long:") else numbers["steps"]
        unweighed = [self.cfg["variants"][k]["title"] for k in kinds if f"{k}-{ref}" not in weighed]
        tail = f", and {', '.join(unweighed)} not weighed" if unweighed else ""
        return (
            f"it is consistent: no kind is distinguishable from {title} after Holm's correction over "
            f"{len(weighed)} contrasts (smallest adjusted p {smallest['adjusted']:.3f}: "
            f"{self.cfg['variants'][kind]['title']} at {at} steps){tail}"
        )
