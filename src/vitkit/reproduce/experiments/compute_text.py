"""The words of the ``compute`` experiment's verdict (Figure 5): each sentence a template over
the numbers :class:`~.compute.Compute` computes, the contrasts it weighs named with the range of
cost they cover."""

from __future__ import annotations

from typing import Any

from ..core.experiment import finite, lead, mean_of
from ..core.wording import Contrast, contrast_clause
from .pooling import position_clause, rate_text


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


def contrast_name(key: str, numbers: dict[str, Any]) -> str:
    """A contrast's name in the sentence: what is compared, and where (the range of cost)."""
    fams = numbers["families"]
    kind, pair, *where = key.split(":")
    if kind == "slope0":
        return f"the {fams[pair]['title']} family's frontier slope, against a flat frontier"
    a, b = pair.split("-")
    names = f"the {fams[a]['title']} family against the {fams[b]['title']} family"
    if kind == "slope":
        return f"{names}, frontier slope"
    cmp = numbers["matched"][kind][pair]
    cost = "training FLOPs" if kind == "train_flops" else "training seconds"
    if where[0] == "mean":
        return f"{names} at matched {cost} ({span_text(cmp, 'FLOPs' if kind == 'train_flops' else 's')})"
    end = mean_of(cmp[where[0]])
    at = "—" if end is None else si(end, "FLOPs")
    return f"{names} at the {'cheap' if where[0] == 'low' else 'costly'} end of that range ({at})"


def rates_text(grid: dict[str, Any], title: dict[str, str]) -> str:
    """Phase 1 in words: the configured grid, and each family's choice in its own grid (which
    gains a rate past an edge where the family's best sits)."""
    said = []
    for role, g in grid["families"].items():
        own = g.get("rates", grid["rates"])
        clause = position_clause(f"{title.get(role, role)} ({g['model']})", g["chosen"], g["position"], own)
        if own != grid["rates"] and g["position"] == "interior":
            clause += f", its grid extended to span {rate_text(min(own))} to {rate_text(max(own))}"
        said.append(clause)
    return (
        "Each family's learning rate, chosen on the minival of its cheapest model from "
        f"{', '.join(map(rate_text, grid['rates']))} (seed {grid['seed']}), a rate added past an edge "
        "where the family's best sat on it: " + "; ".join(said)
    )


def primary_text(numbers: dict[str, Any], title: dict[str, str]) -> str:
    """The primary contrast, at the plain level: the ViTs against the ResNets at matched FLOPs."""
    cmp = numbers["matched"]["train_flops"].get("vit-cnn")
    if cmp is None:
        return "There is no primary contrast (the ViT or the ResNet family did not run)."
    said = lead(title["vit"], cmp["a_mean"], title["cnn"], cmp["b_mean"])
    return f"Primary contrast, at matched training FLOPs ({span_text(cmp)}): {said}."


def contrast_text(head: str, others: dict[str, Contrast]) -> str:
    """The primary contrast's sentence, then the rest Holm-corrected together, the frontier
    slopes (as the share of the error a doubling of training FLOPs removes) among them."""
    if not others:
        return head
    pts = [contrast_clause(c) for k, c in others.items() if not k.startswith("slope")]
    slopes = [contrast_clause(c, "% of the error a doubling") for k, c in others.items() if k.startswith("slope")]
    text = f"{head} The other {len(others)} contrasts, Holm-corrected together: " + "; ".join(pts)
    if slopes:
        text += (
            ("; " if pts else "")
            + "and the frontiers' slopes, as the share of the test error that a doubling of training FLOPs "
            "removes (a least-squares line through each seed's frontier, log error on log FLOPs): " + "; ".join(slopes)
        )
    return text + "."


def span_text(cmp: dict[str, Any], unit: str = "FLOPs") -> str:
    lo, hi = mean_of(cmp["low"]), mean_of(cmp["high"])
    if lo is None or hi is None:
        return "no cost range both families span"
    ends = f"{si(lo, 'FLOPs')} to {si(hi, 'FLOPs')}" if unit == "FLOPs" else f"{lo:,.0f} to {hi:,.0f} s"
    return f"each seed's frontiers averaged over {ends}, the range both span"


def target_text(target: dict[str, Any], title: dict[str, str]) -> str:
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


def leader(primary: Contrast | None, others: dict[str, Contrast], fams: dict[str, Any], title: dict[str, str]) -> str:
    """Which family leads every other at matched FLOPs: the primary contrast at the plain
    level, the other pairs after Holm's correction."""
    if len(fams) < 2:
        return "Only one family ran, so no family is compared at equal compute."
    pairs = {"vit-cnn": primary} if primary is not None else {}
    pairs |= {k.split(":")[1]: c for k, c in others.items() if k.startswith("train_flops:") and k.endswith(":mean")}
    if all(c.diff is None for c in pairs.values()):
        return "Which family is ahead at equal training compute cannot be weighed here (too few seeds)."
    wins = {r: 0 for r in fams}
    for pair, c in pairs.items():
        a, b = pair.split("-")
        if c.claimed and c.diff is not None:
            wins[a if c.diff.estimate > 0 else b] += 1
    ahead = [r for r in fams if wins[r] == len(fams) - 1]
    if ahead:
        return f"Ahead at equal training compute here: {title[ahead[0]]}, which leads every other family."
    return "No family leads every other at equal training compute here (the contrasts above)."


def agreement(primary: Contrast | None, others: dict[str, Contrast]) -> str:
    """Whether the comparisons at matched FLOPs agree with Figure 5's, said for each."""

    def sign(c: Contrast | None) -> int | None:
        if c is None or c.diff is None or c.adjusted is None:
            return None
        return (1 if c.diff.estimate > 0 else -1) if c.claimed else 0

    parts = []
    if primary is not None:
        parts.append("on ViTs against ResNets this " + {
            None: "cannot be weighed (too few seeds with finite results)",
            1: "agrees with it: the ViTs are ahead here too",
            -1: "disagrees with it: here the ResNets are ahead",
            0: "does not show its ViT lead: here the two are not distinguishable",
        }[sign(primary)])  # fmt: skip
    if "train_flops:hybrid-vit:low" in others:
        low, high = sign(others["train_flops:hybrid-vit:low"]), sign(others["train_flops:hybrid-vit:high"])
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


def scale_text(fams: dict[str, Any], paper_exaflops: list[float]) -> str:
    costs = [c for f in fams.values() for e in f["entries"] for c in finite(e["train_flops"])]
    low = float(paper_exaflops[0]) * 1e18
    if not costs:
        return ""
    ratio = low / max(costs)
    if ratio < 10:
        return "The costliest runs here come within 10x of Figure 5's cheapest."
    big = [(1e12, "trillion"), (1e9, "billion"), (1e6, "million")]
    words = next((f"{ratio / n:,.0f} {w}" for n, w in big if ratio >= n), f"{ratio:,.0f}")
    return f"Figure 5's cheapest run costs about {words} times the costliest here."
