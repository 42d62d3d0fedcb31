"""data-scaling's sentences on the scaling-law fits (:mod:`vitkit.reproduce.core.scaling`): each
model's exponent and floor with bootstrap intervals, and where two fitted curves cross, said as an
extrapolation where it lies beyond the largest size measured."""

from __future__ import annotations

from typing import Any


def _images(n: float) -> str:
    return f"{n:,.0f}" if n < 1e7 else f"{n:.1e}".replace("e+", "e")


def _fit_interval(iv: dict[str, Any] | None, digits: int) -> str:
    if iv is None:
        return "no interval (one seed)"
    return f"{iv['low']:.{digits}f} to {iv['high']:.{digits}f}"


def fits_text(num: dict[str, Any], names: dict[str, str]) -> str:
    """The scaling-law fits (:mod:`vitkit.reproduce.core.scaling`): each family's exponent and floor
    with bootstrap intervals, and where the fitted curves cross, said as an extrapolation when it
    lies beyond the largest size measured.

    Args:
        num: the section's numbers (``fits``; absent in reports made before the fits).
        names: each model's name in a sentence, by role ("the ViT").

    Returns:
        The sentences, or "" where there are no fits.
    """
    fits = num.get("fits")
    if not fits:
        return ""
    level = f"{100 * fits['level']:.0f}%"
    said = []
    for role in ("cnn", "vit", "larger_vit"):
        f = fits["families"].get(role)
        if role not in num["models"]:
            continue
        if f is None:
            n = len(num["models"][role]["sizes"])
            said.append(f"{names[role]} not fitted ({n} sizes; 3 needed)")
            continue
        said.append(
            f"{names[role]} b = {f['fit']['b']:.2f} ({_fit_interval(f['b'], 2)}), floor c = "
            f"{f['fit']['c']:.3f} ({_fit_interval(f['c'], 3)})"
        )
    out = (
        "Fits of test error E = a·n^-b + c per family (least squares on log error over every seed's point; "
        f"{level} intervals from {fits['resamples']} bootstrap resamples of the seeds within each size): "
        + "; ".join(said)
        + "."
    )
    horizon = _images(fits["horizon"])
    for key, (a, b) in {"vit-cnn": ("vit", "cnn"), "larger_vit-vit": ("larger_vit", "vit")}.items():
        c = fits["crossovers"].get(key)
        if c is None:
            continue
        pair = f"{names[a]} and {names[b]}"
        share = (
            ""
            if c["crossing_share"] is None
            else f"; {c['crossing_share']:.0%} of the resamples cross before {horizon} images"
        )
        if c["at"] is None:
            out += f" The fitted curves of {pair} do not cross before {horizon} images{share}."
            continue
        iv = c["interval"]
        ends = (
            ""
            if iv is None
            else f" ({level} interval {_images(iv['low']) if iv['low'] else 'beyond ' + horizon} to "
            f"{_images(iv['high']) if iv['high'] else 'beyond ' + horizon}{share})"
        )
        where = (
            "within the measured range"
            if c["beyond"] <= 1
            else f"{c['beyond']:,.1f} times the largest size measured: an extrapolation"
        )
        out += f" The fitted curves of {pair} cross at {_images(c['at'])} images{ends}, {where}."
    return out + (
        " The fits describe the measured range; beyond it they extend a form that a few sizes barely constrain "
        "(three parameters), and the floor c takes up whatever the schedule left unlearned, so a crossover they "
        "place or rule out beyond the range is a reading of the fits, not a measurement."
    )
