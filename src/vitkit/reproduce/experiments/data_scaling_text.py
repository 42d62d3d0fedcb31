"""The prose and tables of ``data-scaling`` (Figures 3 and 4), from its numbers alone
(:meth:`vitkit.reproduce.experiments.data_scaling.DataScaling.measure`): the headline table, the
learning-rate grid and the control's tables, and the verdict, each claim made only where its
interval (paired by seed) excludes zero."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..core import stats
from ..core.experiment import finite, lead, mean_of, mean_std, pct
from ..core.wording import Convergence, not_a_test, step_directions, stepwise
from .data_scaling_fits import fits_text
from .pooling import grid_position, position_clause

FAMILIES = ("cnn", "vit")  # the roles with a learning-rate grid; the larger ViT takes the ViT's rate
NAMES = {"cnn": "the ResNet", "vit": "the ViT", "larger_vit": "the larger ViT"}
SHORT = {"cnn": "ResNet", "vit": "ViT", "larger_vit": "larger ViT"}
PAPER_CROSSOVER = (30e6, 90e6)  # JFT images between which ViT-B/32 passes ResNet50x1 (Figure 4)


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


def _iv(data: dict[str, Any] | None) -> stats.Interval | None:
    """An interval back from its :meth:`~.stats.Interval.to_dict` form."""
    return None if data is None else stats.Interval(**data)


def rows(num: dict[str, Any]) -> list[list[str]]:
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
    longer = {  # the plateau rule's longer runs, where any trained longer than the floor
        r: m["steps"] for r, m in models.items() if any(m.get("steps", {}).get(n, num["steps"][n]) != num["steps"][n]
                                                         for n in m["sizes"])
    }  # fmt: skip
    rows += [row(f"steps trained: {SHORT[r]}", lambda n, st=st: f"{st[n]:,}", models[r]["sizes"])
             for r, st in longer.items()]  # fmt: skip
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


def grid_table(num: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The learning-rate grid as a secondary table."""
    g = num["learning_rate"]
    header = ["model", *[f"lr {lr:g}" for lr in g["rates"]]]
    rows = []
    for role in g["chosen"]:
        cells = []
        for lr in g["rates"]:
            v = g["minival_top1"][role][f"{lr:g}"]
            mark = " (chosen)" if lr == g["chosen"][role] else ""
            cells.append(("diverged" if v is None else f"{100 * v:.2f}") + mark)
        rows.append([num["models"][role]["title"], *cells])
    caption = f"Learning-rate grid: minival top-1 (%) at {g['size']:,} images, seed 0 (the test split is not used)"
    return caption, header, rows


def control_table(num: dict[str, Any], shots: str) -> tuple[str, list[str], list[list[str]]]:
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


def in_domain_label(num: dict[str, Any]) -> str | None:
    """How the in-domain few-shot task is set, for a caption or a sentence (None where no run
    recorded it)."""
    setup = num.get("in_domain_setup")
    if not setup:
        return None
    own = ", ".join(str(f) for f in setup["features"])
    return (
        f"{setup['shots']}-shot linear accuracy on the pre-training task's own classes (the shots and the l2 "
        f"strength from each run's minival, scored on the test split), every model's features projected to "
        f"their {setup['width']} leading principal directions (the models' own widths: {own})"
    )


def in_domain_table(num: dict[str, Any]) -> tuple[str, list[str], list[list[str]]] | None:
    """The in-domain few-shot transfer per model and size, beside the same models untrained, and
    the ViT minus the ResNet paired by seed (None where no run recorded it)."""
    label = in_domain_label(num)
    if label is None:
        return None
    sizes = num["sizes"]
    header = ["model", "untrained (control)", *[f"{n:,} images" for n in sizes]]
    rows = [
        [m["title"], pct(m["in_domain_untrained"]), *[pct(m["in_domain"][n]) if n in m["in_domain"] else "—"
                                                       for n in sizes]]
        for m in num["models"].values()
    ]  # fmt: skip
    diff = num["in_domain_vit_minus_cnn"]
    rows.append(["ViT − ResNet (points)", "", *[_ci_cell(diff[n], 1, 100) for n in sizes]])
    return f"In-domain transfer (%): {label}", header, rows


def in_domain_text(num: dict[str, Any]) -> str | None:
    """The in-domain few-shot sentences: the ViT against the ResNet at each size, how that
    difference changes over each step of the range, and what pre-training adds to the same models
    untrained at the largest size (None where no run recorded the task)."""
    setup = num.get("in_domain_setup")
    if not setup:
        return None
    models, sizes = num["models"], num["sizes"]
    large = sizes[-1]
    own = {r: m["in_domain"] for r, m in models.items()}
    leads = "; ".join(f"at {n:,} images {lead('the ViT', own['vit'][n], 'the ResNet', own['cnn'][n])}" for n in sizes)
    steps = [(f"{a:,}", f"{b:,}", None if iv is None else _iv(iv).scaled(100)) for a, b, iv in num["in_domain_steps"]]
    change = stepwise(steps, "the ViT-minus-ResNet difference", digits=1, unit=" points")
    added = "; ".join(
        lead(f"the pre-trained {SHORT[r]}", models[r]["in_domain"][large], f"the untrained {SHORT[r]}",
             models[r]["in_domain_untrained"])
        for r in FAMILIES
    )  # fmt: skip
    return (
        f"In-domain transfer ({setup['shots']}-shot on the pre-training task's classes, features of width "
        f"{setup['width']}, paired by seed): {leads}. Step by step, {change} Against the same models untrained, "
        f"at {large:,} images: {added}."
    )


def verdict(num: dict[str, Any], shots: str, seeds: int) -> str:
    """The section's sentences, each computed from ``num``."""
    sizes, models, g = num["sizes"], num["models"], num["learning_rate"]
    large = sizes[-1]
    top1 = {r: m["test_top1"] for r, m in models.items()}
    fallback = " (every rate of its grid diverged: the smallest is used)"
    rates = "; ".join(
        f"{NAMES[r]} {g['chosen'][r]:g}{fallback}"
        if g["fallback"][r]
        else position_clause(NAMES[r], g["chosen"][r], grid_position(g["chosen"][r], g["rates"]), g["rates"], _g)
        for r in g["chosen"]
    )
    larger_rate = "" if "larger_vit" in g["chosen"] else "; the larger ViT trains at the ViT's"
    leads = "; ".join(f"at {n:,} images {lead('the ViT', top1['vit'][n], 'the ResNet', top1['cnn'][n])}" for n in sizes)
    ratio_iv = {n: _iv(num["error_ratio"][n]["interval"]) for n in sizes}
    ratios = (
        ", ".join(f"{_ratio_text(ratio_iv[n])} at {n:,}" for n in sizes) + " images"
        if any(ratio_iv.values())
        else "not weighed at any size (too few finite results)"
    )
    steps = [(f"{a:,}", f"{b:,}", _iv(iv)) for a, b, iv in num.get("error_ratio_steps", [])]
    sl = {k: _iv(v) for k, v in num["slopes"].items()}
    faster = direction(
        sl["vit_minus_cnn"],
        "the ViT's error falls faster with data",
        "the ViT's error falls more slowly with data",
        "the two slopes are not distinguishable",
    )
    top_open = [r for r in FAMILIES if not _converged(models[r], large)]
    paired = seeds >= 2
    out = [f"Learning rates chosen on the minival at {g['size']:,} images (seed 0): {rates}{larger_rate}."]
    if paired:
        out += [
            f"Test top-1, ViT against ResNet (paired by seed): {leads}.",
            f"The ViT/ResNet test-error ratio (mean of the per-seed ratios): {ratios}. Step by step, "
            + stepwise(steps, "the ratio"),
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
    out.append(figure4(sl["vit_minus_cnn"], steps if paired else [], large, bool(top_open)))
    if fitted := fits_text(num, NAMES):
        out.append(fitted)
    if paired:
        out += [larger(num), overfitting(num)]
    out += [convergence_text(num), attention_text(num)]
    if paired:
        if own := in_domain_text(num):
            out.append(own)
        out.append(control(num, shots))
    return " ".join(out)


def _converged(model: dict[str, Any], n: int) -> bool:
    """Whether a model's runs at size ``n`` had finished improving (True where not recorded)."""
    c = (model.get("convergence") or {}).get(n)
    return not c or not c["runs"] or Convergence(**c).converged


def convergence_text(num: dict[str, Any]) -> str:
    """Whether the families' runs at the largest size had finished improving: where they had not,
    the comparisons at the top of the range are not a test (:func:`.wording.not_a_test`)."""
    large = num["sizes"][-1]
    parts, open_ = [], []
    claims = {"cnn": "Figure 4's trend at the top of the range", "vit": "Figure 4's trend at the top of the range",
              "larger_vit": "Figure 3's question at the top of the range"}  # fmt: skip
    for role, claim in claims.items():
        c = (num["models"].get(role, {}).get("convergence") or {}).get(large)
        if not c or not c["runs"]:
            continue
        status = Convergence(**c)
        parts.append(f"{NAMES[role]}: {status.evidence()}")
        said = not_a_test(f"{NAMES[role][0].upper()}{NAMES[role][1:]} at {large:,} images", status, claim)
        if said:
            open_.append(said)
    if not parts:
        return "Whether the runs had finished improving is not recorded (their results keep no minival curve)."
    longer = [
        f"{NAMES[r]} at {n:,} images to {m['steps'][n]:,} steps"
        for r, m in num["models"].items()
        for n in m["sizes"]
        if m.get("steps", {}).get(n, num["steps"][n]) != num["steps"][n]
    ]
    rule = (
        " Lengthened by the plateau rule (runs that had not converged train again at twice the steps): "
        + "; ".join(longer)
        + "."
        if longer
        else ""
    )
    return f"Convergence at {large:,} images: {'; '.join(parts)}.{rule}" + "".join(f" {t}" for t in open_)


def _steps_direction(steps: list[tuple[str, str, stats.Interval | None]]) -> str:
    """ "falls" or "rises" where every step shows it, "flat" where none does, "mixed" otherwise,
    "not weighed" where no step is (:func:`.wording.step_directions`)."""
    words = ["flat" if w == "not distinguishable" else w for w in step_directions(steps)]
    weighed = [w for w in words if w != "not weighed"]
    if not weighed:
        return "not weighed"
    if len(weighed) == len(words) and len(set(weighed)) == 1:
        return weighed[0]
    return "flat" if set(weighed) == {"flat"} else "mixed"


def figure4(
    slope: stats.Interval | None,
    steps: list[tuple[str, str, stats.Interval | None]],
    large: int,
    top_open: bool = False,
) -> str:
    """The sentences against Figure 4: does the ViT's error relative to the ResNet's fall with data?

    A direction is claimed for the range where the slopes (a fit over every size) and every step
    of the ratio show it; where only the fit does, the sentence says so.

    Args:
        slope: the difference of the log-log slopes, ViT minus ResNet.
        steps: the change of the error ratio over each step of the range (from, to, interval).
        large: the largest size.
        top_open: whether a family's runs at the largest size had not converged.

    Returns:
        The verdict, then where the paper's crossover lies.
    """
    by_slope = direction(slope, "falls", "rises", "flat")
    by_steps = _steps_direction(steps)
    relative = "the ViT's test error relative to the ResNet's"
    agree = {"falls": "Figure 4's direction", "rises": "against Figure 4's direction"}
    steps_said = {
        "mixed": "not at every step of the ratio",
        "flat": "at no step of the ratio distinguishably",
        "not weighed": "the steps of the ratio not weighed",
        "falls": "while the ratio falls at every step",
        "rises": "while the ratio rises at every step",
    }
    if by_slope not in agree and by_steps not in ("falls", "rises"):
        if by_slope.startswith("not weighed") and by_steps == "not weighed":
            text = "the trend is not weighed (too few seeds with finite results)"
        else:
            flat_steps = {
                "mixed": "the ratio's steps go one way and another (above)",
                "flat": "no step of the ratio shows one",
                "not weighed": "the steps of the ratio are not weighed",
            }
            text = (
                f"no change of {relative} with data is distinguishable by the slopes, and {flat_steps[by_steps]}: "
                "Figure 4's direction is not shown at this scale"
            )
    elif by_slope in agree and by_steps == by_slope:
        text = f"{relative} {by_slope} with data by the slopes and at every step of the ratio: {agree[by_slope]}"
    elif by_slope in agree:
        text = (
            f"{relative} {by_slope} with data by the slopes, {steps_said[by_steps]}: {agree[by_slope]} as a fit over "
            "the range, not shown step by step"
        )
    else:  # every step shows a direction the slopes do not
        slope_said = "not weighed" if by_slope.startswith("not weighed") else "not distinguishable"
        text = f"{relative} {by_steps} at every step of the ratio (by the slopes: {slope_said}): {agree[by_steps]}"
    top = " The top of the range is not a test of it (see convergence below)." if top_open else ""
    low, high = PAPER_CROSSOVER
    return (
        f"Against Figure 4: {text}.{top} The paper's crossover (ViT-B/32 past ResNet50x1) lies between "
        f"{low / 1e6:.0f}M and {high / 1e6:.0f}M pre-training images, {low / large:,.0f} times the largest subset "
        "here or more: these runs speak to the direction of the trend, not to a crossover."
    )


def larger(num: dict[str, Any]) -> str:
    """The larger ViT against the ViT at every size it trains at, and whether the difference grows with data
    (Figure 3)."""
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


def overfitting(num: dict[str, Any]) -> str:
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


def attention_text(num: dict[str, Any]) -> str:
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


def control(num: dict[str, Any], shots: str) -> str:
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
