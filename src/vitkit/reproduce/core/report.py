"""``report.md`` and ``report.json``: per experiment the paper's claim and numbers, the measured
numbers (mean and spread over seeds), the figure, and one sentence on whether they agree.

The markdown is rendered from the JSON alone (:func:`render`): the same ``report.json`` gives the
same ``report.md``, byte for byte."""

from __future__ import annotations

import datetime
import math
import shutil
from pathlib import Path
from typing import Any

from ...files import atomic_write, write_json, write_text
from .experiment import Section, first_sentence
from .results import machine_seconds


def provenance(runs: dict[str, Any], code: str | None = None) -> str:
    """What made the runs: how many runs each call, commit, code version, machine, precision and
    thread layout made, and how many do not say; where ``code`` is given (the code of the call
    that wrote the report), how many runs other code made, by version.

    Args:
        runs: the reported runs' results by key.
        code: the report's own code version (:func:`.provenance.code_hash`), or None.

    Returns:
        The sentences (empty without runs).
    """
    groups: dict[str, int] = {}
    unknown, other = 0, {}
    for res in runs.values():
        made = res.get("made_by")
        if not isinstance(made, dict):
            unknown += 1
            continue
        at_once, threads = res.get("runs_at_once", 1), res.get("threads")
        layout = f"{at_once} run{'s' * (at_once != 1)} at once"
        if isinstance(threads, int):
            layout += f", {threads} thread{'s' * (threads != 1)} each"
        gpu = f", {made['gpu']}" if made.get("gpu") else ""
        call = f"call `{made['call']}`, " if made.get("call") else ""
        version = f" (code `{made['code']}`)" if made.get("code") else " (code not recorded)"
        what = (
            f"{call}vitkit commit `{made.get('commit') or 'unknown'}`{version} on {made.get('cpu')}{gpu} in "
            f"{made.get('precision')}, torch {made.get('torch')}, {layout}"
        )
        groups[what] = groups.get(what, 0) + 1
        if code is not None and made.get("code") != code:
            key = made.get("code") or "not recorded"
            other[key] = other.get(key, 0) + 1
    parts = [f"{n} run{'s' * (n != 1)} by {what}" for what, n in sorted(groups.items(), key=lambda kv: -kv[1])]
    if unknown:
        parts.append(f"{unknown} run{'s' * (unknown != 1)} whose result.json does not say")
    if not parts:
        return ""
    out = f"What made the runs: {'; '.join(parts)}."
    if code is not None and (other or unknown):
        versions = ", ".join(f"{n} by code `{c}`" if c != "not recorded" else f"{n} with its code not recorded"
                             for c, n in sorted(other.items()))  # fmt: skip
        extra = [versions] if versions else []
        extra += [f"{unknown} that do not say"] if unknown else []
        out += (f" Reused from other code than this report's (`{code}`): {'; '.join(extra)}: their numbers come "
                "from that code, not this one.")  # fmt: skip
    elif code is not None:
        out += f" Every run was made by this report's code (`{code}`)."
    return out


def publish(out: Path, dest: Path) -> Path:
    """Copy a suite's ``report.md``, ``report.json`` and ``figures/`` into ``dest`` (e.g. the
    documentation's ``docs/reproduce``), replacing what an earlier publication put there; each
    file is written atomically.

    Args:
        out: the suite's folder (where :func:`write_report` wrote).
        dest: the folder to publish into.

    Returns:
        The published ``report.md``.
    """

    dest.mkdir(parents=True, exist_ok=True)
    figures = dest / "figures"
    if figures.is_dir():
        shutil.rmtree(figures)
    for src in [out / "report.md", out / "report.json", *sorted((out / "figures").glob("*.png"))]:
        target = dest / src.relative_to(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = src.read_bytes()
        atomic_write(target, lambda f, data=data: f.write(data), mode="wb")
    return dest / "report.md"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _section_md(name: str, s: dict[str, Any]) -> str:
    figs = "\n".join(f"![{name}]({f})" for f in s["figures"])
    return "\n\n".join(
        [
            f"## `{name}`: {s['follows']}",
            f"{s['runs']} training runs; run alone, this experiment takes {s['wall_seconds'] / 60:.1f} min "
            "(the sum of its runs' wall times, training and scoring, each divided by the runs trained at once).",
            f"**The paper's claim.** {s['claim']}",
            f"**The paper's numbers.** {s['paper']}",
            f"**{s['caption']}:**\n\n" + _table(s["table"]["header"], s["table"]["rows"]),
            *(f"**{t['caption']}:**\n\n" + _table(t["header"], t["rows"]) for t in s["tables"]),
            figs,
            f"**Agreement.** {s['verdict']}",
        ]
    )


def headline_table(experiments: dict[str, Any]) -> str:
    """The report's summary: per experiment what it follows, its runs and its headline (the
    sentence on its agreement with the paper; the verdict's first sentence where it has none).
    The README shows the published report's (``tools/gen_reference.py`` writes it there).

    Args:
        experiments: ``report.json``'s ``experiments`` (name to its entry).

    Returns:
        A markdown table.
    """
    rows = [
        [f"`{name}`", str(e["follows"]), str(e.get("runs", "")),
         (e.get("headline") or first_sentence(str(e["verdict"]))).replace("|", "/")]
        for name, e in experiments.items()
    ]  # fmt: skip
    return _table(["experiment", "follows", "runs", "what came out"], rows)


def write_report(out: Path, sections: list[Section], meta: dict[str, Any], runs: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``out/report.json`` and ``out/report.md`` (atomically; a number that is not finite is
    ``null`` in the JSON). The markdown is rendered from the JSON alone (:func:`render`), so a
    report regenerates identical from its ``report.json``.

    Args:
        out: the suite's folder.
        sections: one per experiment whose runs are finished.
        meta: the command, date, budget, data, machine and timing of the call.
        runs: every reported run's result by key.

    Returns:
        The paths of ``report.md`` and ``report.json``.
    """
    payload = json_safe(
        {
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
                    "headline": s.headline,
                    "caption": s.caption,
                    "table": {"header": s.header, "rows": s.rows},
                    "tables": [{"caption": c, "header": h, "rows": r} for c, h, r in s.tables],
                    "figures": [f.relative_to(out).as_posix() for f in s.figures],
                }
                for s in sections
            },
            "runs": runs,
        }
    )
    js, md = out / "report.json", out / "report.md"
    write_json(js, payload)
    write_text(md, render(payload))
    return md, js


def render(report: dict[str, Any]) -> str:
    """``report.md`` from the contents of ``report.json``: the call's header, the summary table and
    a section per experiment.

    Args:
        report: ``report.json`` as :func:`write_report` wrote it (``meta``, ``experiments``, ``runs``).

    Returns:
        The markdown.
    """
    meta, runs, experiments = report["meta"], report["runs"], report["experiments"]
    m = meta["machine"]

    minutes = sum(machine_seconds(r) for r in runs.values()) / 60
    size = "x".join(map(str, meta["img_size"]))
    gpu = f", {m['gpu']}" if m["gpu"] else ""
    head = [
        '# Reproducing "An Image is Worth 16x16 Words" with vitkit',
        f"Made by `{meta['command']}` on {meta['date']}: budget `{meta['budget']}`, data `{meta['data']}` "
        f"(models at {size} px), {meta['seeds']} seed(s) where seeds are compared. "
        f"This call's machine: {m['cpu']}, {m['cores']} cores{gpu} ({m.get('bf16', 'bf16 not checked')}; "
        f"precision auto computes in {m.get('precision', 'what the CPU reports')}), torch {m['torch']}, vitkit commit "
        f"`{m.get('commit') or 'unknown'}`{_code_and_call(meta)}.",
        f"{len(runs)} training runs, {minutes:.1f} min in all (the sum of the runs' wall times, training and "
        f"scoring, {_whose_time(runs)}, each divided by the runs trained at once); "
        f"this call took {meta['seconds'] / 60:.1f} min{_trained_here(meta, runs)}. Every run is a vitkit run folder "
        "under `runs/`; its `result.json` holds the numbers below.",
        *([provenance(runs, m.get("code"))] if runs else []),
        "Protocol: each run keeps its best checkpoint by a minival carved from the training split (the paper's early "
        f"stopping); that checkpoint alone is scored on the test split and by {meta['fewshot']} linear transfer "
        "(closed-form ridge, its l2 chosen on the transfer task's training images)"
        + (
            f", and by {meta['in_domain']['shots']}-shot linear accuracy on the pre-training task's own classes (the "
            "shots, fewer where a run's minival holds fewer than twice as many of a class, and the l2 from the run's "
            "minival; every model's features projected to their "
            f"{meta['in_domain']['width']} leading principal directions)"
            if meta.get("in_domain")
            else ""
        )
        + ". Nothing is chosen on a test split.",
    ]
    body = ["## Summary\n\n" + headline_table(experiments)] if experiments else []
    body += [_section_md(name, s) for name, s in experiments.items()]
    return "\n\n".join(head + body) + "\n"


def _code_and_call(meta: dict[str, Any]) -> str:
    """`` (code `...`), call `...``` for the header, as far as ``meta`` records them."""
    code, call = meta["machine"].get("code"), meta.get("call")
    return (f" (code `{code}`)" if code else "") + (f", call `{call}`" if call else "")


def _whose_time(runs: dict[str, Any]) -> str:
    """Which calls a run's wall time covers: every call that trained it where each run records its
    code (the results that do, count it so), else as the call that finished each measured it."""
    every = all(isinstance(r.get("made_by"), dict) and r["made_by"].get("code") for r in runs.values())
    return "over every call that trained each" if every else "as the call that finished each measured it"


def _trained_here(meta: dict[str, Any], runs: dict[str, Any]) -> str:
    """`` and trained N of the runs`` (where ``meta`` names the call), for the header."""
    call = meta.get("call")
    if not call:
        return ""
    n = sum(isinstance(r.get("made_by"), dict) and r["made_by"].get("call") == call for r in runs.values())
    return f" and trained {n} of the runs" if n else " and trained none of the runs (all were finished before)"


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
