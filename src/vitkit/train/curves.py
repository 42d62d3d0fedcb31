"""Training curves (loss and evaluation top-1, or a multi-label run's mAP, against steps) as a PNG,
from ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path

from ..files import atomic_write
from .runfolder import read_metrics


def plot_curves(metrics: Path, out: Path) -> Path | None:
    """Draw loss and top-1 curves; returns None when matplotlib is not installed. Lines of the log
    that do not parse (a torn last line, a damaged one) and skipped steps' null losses are left out."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps, losses, esteps, top1 = [], [], [], []
    score = "top-1"
    for _, rec in read_metrics(metrics, strict=False):
        if rec.get("loss") is not None:
            steps.append(rec["step"])
            losses.append(rec["loss"])
        for key, name in (("top1", "top-1"), ("map", "mAP")):
            if rec.get(key) is not None:
                esteps.append(rec["step"])
                top1.append(100 * rec[key])
                score = name
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(steps, losses, color="tab:blue")
    a.set_xlabel("step")
    a.set_ylabel("training loss")
    a.set_yscale("log")
    a.grid(alpha=0.3)
    b.plot(esteps, top1, marker="o", color="tab:green")
    b.set_xlabel("step")
    b.set_ylabel(f"evaluation {score} (%)")
    b.grid(alpha=0.3)
    if top1:
        b.set_title(f"last {top1[-1]:.2f}%, best {max(top1):.2f}%")
    fig.tight_layout()
    try:  # through a temporary: a run killed while drawing leaves the previous picture whole
        atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
    return out
