"""``report.md`` and ``report.json``: per experiment the paper's claim and numbers, the measured
numbers (mean and spread over seeds), the figure, and one sentence on whether they agree."""

from __future__ import annotations

import datetime
import math
import platform
from pathlib import Path
from typing import Any

from ..files import write_json, write_text
from .experiments import Section


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    from ..cpu import cpu_info

    cpu = cpu_info()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu["model"],
        "cpu_flags": [f for f, on in cpu["flags"].items() if on],
        "cores": cpu["cores"],
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _section_md(s: Section, out: Path) -> str:
    figs = "\n".join(f"![{s.name}]({f.relative_to(out).as_posix()})" for f in s.figures)
    return "\n\n".join(
        [
            f"## `{s.name}`: {s.follows}",
            f"{s.runs} training runs; run alone, this experiment takes {s.wall_seconds / 60:.1f} min "
            "(the sum of its runs' wall times, training and scoring).",
            f"**The paper's claim.** {s.claim}",
            f"**The paper's numbers.** {s.paper}",
            f"**{s.caption}:**\n\n" + _table(s.header, s.rows),
            figs,
            f"**Agreement.** {s.verdict}",
        ]
    )


def write_report(out: Path, sections: list[Section], meta: dict[str, Any], runs: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``out/report.md`` and ``out/report.json`` (atomically; a number that is not finite is
    ``null`` in the JSON).

    Args:
        out: the suite's folder.
        sections: one per experiment whose runs are finished.
        meta: the command, date, budget, data, machine and timing of the call.
        runs: every reported run's result by key.

    Returns:
        The paths of ``report.md`` and ``report.json``.
    """
    m = meta["machine"]
    minutes = sum(r.get("wall_seconds") or 0 for r in runs.values()) / 60
    size = "x".join(map(str, meta["img_size"]))
    gpu = f", {m['gpu']}" if m["gpu"] else ""
    head = [
        '# Reproducing "An Image is Worth 16x16 Words" with vitkit',
        f"Made by `{meta['command']}` on {meta['date']}: budget `{meta['budget']}`, data `{meta['data']}` "
        f"(models at {size} px), {meta['seeds']} seed(s) where seeds are compared. "
        f"Machine: {m['cpu']}, {m['cores']} cores{gpu}, torch {m['torch']}.",
        f"{len(runs)} training runs, {minutes:.1f} min in all (the sum of the runs' wall times, training and "
        "scoring, as the call that finished each measured it); "
        f"this call took {meta['seconds'] / 60:.1f} min. Every run is a vitkit run folder under `runs/`; its "
        "`result.json` holds the numbers below.",
        "Protocol: each run keeps its best checkpoint by a minival carved from the training split (the paper's early "
        f"stopping); that checkpoint alone is scored on the test split and by {meta['fewshot']} linear transfer "
        "(closed-form ridge, its l2 chosen on the transfer task's training images). Nothing is chosen on a test split.",
    ]
    body = [_section_md(s, out) for s in sections]
    md = out / "report.md"
    write_text(md, "\n\n".join(head + body) + "\n")
    payload = {
        "meta": meta,
        "experiments": {
            s.name: {
                "runs": s.runs,
                "wall_seconds": s.wall_seconds,
                "follows": s.follows,
                "claim": s.claim,
                "paper": s.paper,
                "numbers": s.numbers,
                "verdict": s.verdict,
                "table": {"header": s.header, "rows": s.rows},
                "figures": [f.relative_to(out).as_posix() for f in s.figures],
            }
            for s in sections
        },
        "runs": runs,
    }
    js = out / "report.json"
    write_json(js, json_safe(payload))
    return md, js


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite (a diverged run's nan or inf) as None: strict
    JSON has no NaN, and a reader must not take it for a number.

    Args:
        value: nested dicts, lists and scalars.

    Returns:
        The same structure, copied.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")
