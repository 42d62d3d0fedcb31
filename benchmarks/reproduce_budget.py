"""How long each ``make reproduce-N`` call takes on this machine, estimated from measured rates.

``vitkit reproduce --budget desktop`` trains more than a hundred small runs; timing a whole call
takes hours. This benchmark measures what a call is made of instead, on the machine at hand and
with the suite's own settings (``--jobs auto``: as many runs at once as it would train, each on
its share of the cores, in the precision ``auto`` resolves to):

- for each kind of run (model role, image size, relative attention or not), ``jobs`` copies of
  one of the suite's own recipes, shortened to ``--steps`` steps (evaluation every 100 steps as
  in the suite), trained at once in separate processes; the seconds of ``train`` and of the
  suite's scoring (test split, few-shot transfer, training-subset accuracy) of each;
- each call's minutes: per run of the call (those an earlier call trains are left out) its kind's
  training seconds scaled to the run's steps, plus its scoring seconds, summed and divided by the
  runs at once. Scaling the short run's whole training time counts its start-up (model, data)
  once per 200 steps rather than once per run, so the estimate errs long by a few percent;
- ``longest``: the same with every run the plateau rule may add (data-scaling's runs again at
  twice the steps, where they had not converged) trained: the most a call can take.

The calls are read from the Makefile (``reproduce-N: ...`` and its ``$(REPRODUCE) [--stop-after
MINUTES] EXPERIMENTS`` line); a call with ``--stop-after`` takes at most that, and what it leaves
goes to the next call. Every figure names the CPU and the precision it ran in.

    python benchmarks/reproduce_budget.py                       # this CPU as it is
    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 \\
        python benchmarks/reproduce_budget.py --json benchmarks/out/reproduce_budget_avx2.json
    python benchmarks/reproduce_budget.py --steps 20            # a check that it runs
    python benchmarks/reproduce_budget.py --rates benchmarks/results/reproduce_budget_zen5.json \\
        --json benchmarks/out/again.json                         # the same rates, the calls planned again

Run it alone: two processes that each use both cores make each other crawl.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _call_lines(makefile: Path) -> list[tuple[str, list[str]]]:
    text = makefile.read_text()
    found = re.findall(r"^(reproduce-\d+):[^\n]*\n\t\$\(REPRODUCE\)\s+([^\n]+)$", text, flags=re.M)
    return [(name, line.split()) for name, line in found]


def make_calls(makefile: Path = ROOT / "Makefile") -> dict[str, list[str]]:
    """The ``reproduce-N`` targets of the Makefile and the experiments each names (an experiment
    may be named by consecutive calls, the earlier ones stopped by ``--stop-after``).

    Args:
        makefile: the Makefile to read.

    Returns:
        Target name to its experiments, in the Makefile's order.
    """
    calls = {}
    for name, words in _call_lines(makefile):
        flag_value = [i > 0 and words[i - 1].startswith("--") for i in range(len(words))]
        calls[name] = [w for w, value in zip(words, flag_value, strict=True) if not w.startswith("--") and not value]
    return calls


def make_limits(makefile: Path = ROOT / "Makefile") -> dict[str, float]:
    """The ``--stop-after`` minutes of the ``reproduce-N`` calls that have one.

    Args:
        makefile: the Makefile to read.

    Returns:
        Target name to its limit in minutes.
    """
    return {
        name: float(words[words.index("--stop-after") + 1])
        for name, words in _call_lines(makefile)
        if "--stop-after" in words
    }


def kind_of(spec: Any) -> str:
    """The kind of run whose speed ``spec`` shares: model role, image size, relative attention."""
    m = spec.recipe["model"]
    over = m.get("overrides", {})
    size = "x".join(str(s) for s in over.get("img_size", ["?"]))
    rel = " relative" if (over.get("pos_embed") or m.get("pos_embed")) == "relative" else ""
    return f"{spec.model} {size} px{rel}"


def planned(data: str, calls: dict[str, list[str]]) -> tuple[Any, dict[str, list[Any]], dict[str, list[Any]]]:
    """Every run of each call on a fresh suite (those an earlier call trains left out).

    Args:
        data: the training data, as ``vitkit reproduce --data`` takes it.
        calls: target name to experiments (:func:`make_calls`).

    Returns:
        The suite; per call, its runs' specs; per call, the runs the plateau rule may train
        again (:func:`plateau_runs`), each with the factor of its steps.
    """
    from vitkit.reproduce.app import _classes, _unique, data_info
    from vitkit.reproduce.core.spec import Suite

    suite = Suite(tempfile.mkdtemp(prefix="budget-plan-"), data, "desktop", None, data_info(data))
    suite.planning = True  # a grid's choice is taken as its first value: costs do not depend on it
    classes, seen, per, longer = _classes(), set(), {}, {}
    for name, experiments in calls.items():
        chosen = [classes[e](suite) for e in experiments]
        specs = [s for s in _unique([s for e in chosen for s in e.runs()]) if s.key not in seen]
        keys = {s.key for s in specs}
        longer[name] = [pair for e in chosen for pair in plateau_runs(e) if pair[0].key not in seen]
        seen |= keys
        per[name] = specs
    return suite, per, longer


def plateau_runs(e: Any) -> list[tuple[Any, int]]:
    """The runs an experiment's plateau rule may add, as ``(run, factor)``: the run trained again
    at ``factor`` times its steps in all (every doubling up to ``longer`` made; a negative factor
    is a planned run that the longest case replaces).

    Args:
        e: an experiment of a planning suite.

    Returns:
        The pairs; none where the experiment has no plateau rule.
    """
    doublings = int(e.cfg.get("longer", 0))
    if doublings < 1:
        return []
    factor = sum(2**k for k in range(1, doublings + 1))  # 2, then 2 + 4, ...
    if hasattr(e, "cells"):  # data-scaling: each model and size
        return [(s, factor) for cell in e.cells().values() for s in cell]
    if hasattr(e, "finetune"):  # resolution: each size's fine-tunings, and the scratch arm they set
        lr = e.rates()[0]  # a planning suite's choice
        out = [(e.finetune(w, lr, s), factor) for w in e.sizes() for s in e.seeds]
        steps = int(e.finetune("native", lr, 0).recipe["train"]["steps"])
        for s in e.seeds:
            out += [(e.scratch(s, steps * 2**doublings), 1), (e.scratch(s, steps), -1)]
        return out
    return []


def short_recipe(spec: Any, steps: int) -> dict[str, Any]:
    """``spec``'s recipe cut to ``steps`` steps: warm-up within them, evaluation every 100 steps
    (the suite's cadence), one checkpoint, no initial weights (they change no cost)."""
    tree = copy.deepcopy(spec.recipe)
    tree["model"]["init_from"] = None
    tree["train"]["steps"] = steps
    tree.setdefault("optim", {})["warmup_steps"] = max(1, min(steps // 10, tree["optim"].get("warmup_steps", 1)))
    tree.setdefault("log", {}).update(eval_every=min(100, steps), checkpoint_every=steps)
    return tree


def worker(tree_json: str, out: str, settings_json: str) -> None:
    """In a process of its own: train the recipe, score it as the suite does, print the seconds."""
    import torch

    from vitkit.reproduce.core.scoring import ScoreSettings, score
    from vitkit.train import train
    from vitkit.train.config import recipe_from_dict

    recipe = recipe_from_dict(json.loads(tree_json))
    start = time.perf_counter()
    train(recipe, Path(out))
    trained = time.perf_counter()
    fields = json.loads(settings_json)
    fields["data_options"] = tuple(tuple(pair) for pair in fields.get("data_options", ()))  # hashable, as the suite's
    score(Path(out), ScoreSettings(**fields), recipe.train.precision, recipe)
    done = time.perf_counter()
    print(json.dumps({"train_s": trained - start, "score_s": done - trained, "threads": torch.get_num_threads()}))


def measure(tree: dict[str, Any], settings: Any, jobs: int, threads: int, work: Path) -> dict[str, float]:
    """``jobs`` copies of ``tree`` trained and scored at once, each on ``threads`` threads: their mean seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    settings_json = json.dumps({k: getattr(settings, k) for k in settings.__dataclass_fields__})
    procs = []
    for i in range(jobs):
        out = work / f"run{i}"
        cmd = [sys.executable, __file__, "--worker", json.dumps(tree), str(out), settings_json]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    answers = []
    for p in procs:
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a measuring process failed:\n{stderr[-2000:]}")
        answers.append(json.loads(stdout.strip().splitlines()[-1]))
    return {k: sum(a[k] for a in answers) / len(answers) for k in ("train_s", "score_s")}


def _cpu_line() -> dict[str, Any]:
    from vitkit.reproduce.core.provenance import machine

    m = machine()
    m["isa_env"] = {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if k in os.environ}
    return m


def estimate(
    per: dict[str, list[Any]],
    calls: dict[str, list[str]],
    rates: dict[str, Any],
    steps: int,
    jobs: int,
    longer: dict[str, list[Any]] | None = None,
    limits: dict[str, float] | None = None,
) -> list:
    """Each call's runs and minutes: per run its kind's training seconds scaled from ``steps`` to
    the run's, plus its scoring seconds; summed and divided by the runs trained at once.
    ``minutes_longest`` adds the plateau rule's runs where every one of them trains (``longer``:
    per call, ``(run, factor)``: the runs it may train again, at ``factor`` times their steps in
    all). A call with a ``--stop-after`` limit (``limits``) ends there; what it leaves goes on in
    the next call."""
    longer, limits = longer or {}, limits or {}

    def minutes(specs: list[Any]) -> float:
        seconds = 0.0
        for s in specs:
            s, factor = s if isinstance(s, tuple) else (s, 1)
            kind = rates[kind_of(s)]
            seconds += factor * (kind["train_s"] * s.recipe["train"]["steps"] / steps + kind["score_s"])
        return seconds / jobs / 60

    rows, carry, carry_longest = [], 0.0, 0.0
    for name, specs in per.items():
        planned = minutes(specs) + carry
        longest = planned + minutes(longer.get(name, [])) + carry_longest - carry
        limit = limits.get(name)
        carry = max(0.0, planned - limit) if limit else 0.0
        carry_longest = max(0.0, longest - limit) if limit else 0.0
        row = {"call": name, "experiments": calls[name], "runs": len(specs),
               "minutes": planned - carry, "minutes_longest": longest - carry_longest}  # fmt: skip
        if limit:
            row["stop_after"] = limit
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="steps of each measuring run")
    ap.add_argument("--data", default="fashion-mnist")
    ap.add_argument("--json", default="benchmarks/out/reproduce_budget.json")
    ap.add_argument(
        "--rates",
        metavar="JSON",
        help="take the rates of an earlier run's JSON (same machine) instead of measuring them: the calls "
        "estimated again after the Makefile or the plan changed (a kind of run the JSON lacks is measured)",
    )
    args = ap.parse_args()

    from vitkit.files import write_json
    from vitkit.reproduce.core.pool import auto_jobs, usable_cores
    from vitkit.reproduce.core.scoring import ScoreSettings

    calls, limits = make_calls(), make_limits()
    suite, per, longer = planned(args.data, calls)
    settings = ScoreSettings.of(suite)
    jobs = auto_jobs("desktop")
    threads = max(1, usable_cores() // jobs)
    kinds: dict[str, Any] = {}
    for specs in per.values():
        for s in specs:
            kinds.setdefault(kind_of(s), s)
    cpu = _cpu_line()
    if args.rates:
        earlier = json.loads(Path(args.rates).read_text())
        cpu = {**earlier["meta"], "rates_from": args.rates}
        jobs, threads, args.steps = cpu["jobs"], cpu["threads"], cpu["steps"]
        missing = sorted(set(kinds) - set(earlier["kinds"]))
        if missing:  # a kind the plan gained since: measured now, beside the earlier rates
            print(f"{args.rates} has no rates for {', '.join(missing)}: measuring them")
            cpu["measured_now"] = missing
    print(f"{cpu['cpu']}, {cpu['cores']} cores, precision auto -> {cpu['precision']} ({cpu['bf16']});", end=" ")
    print(f"{jobs} runs at once, {threads} thread(s) each", flush=True)
    rates: dict[str, dict[str, float]] = {}
    if args.rates:
        rates = {k: earlier["kinds"][k] for k in sorted(kinds) if k in earlier["kinds"]}
        print(f"  rates of {args.rates}: " + ", ".join(f"{k} {v['img_per_s']:.0f} img/s" for k, v in rates.items()))
    with tempfile.TemporaryDirectory(prefix="budget-") as tmp:
        for i, (kind, spec) in enumerate(k for k in sorted(kinds.items()) if k[0] not in rates):
            tree = short_recipe(spec, args.steps)
            m = measure(tree, settings, jobs, threads, Path(tmp) / str(i))
            rates[kind] = {**m, "img_per_s": args.steps * tree["train"]["batch_size"] / m["train_s"]}
            print(f"  {kind:<28} {rates[kind]['img_per_s']:7.0f} img/s a run", end="  ")
            print(f"(train {m['train_s']:.1f} s, score {m['score_s']:.1f} s)", flush=True)
    rows = estimate(per, calls, rates, args.steps, jobs, longer, limits)
    print(f"\n{'call':<13} {'runs':>4} {'minutes':>8} {'longest':>8}  experiments")
    for r in rows:
        limit = f"  (stops after {r['stop_after']:g} min; the next call goes on)" if "stop_after" in r else ""
        print(f"{r['call']:<13} {r['runs']:>4} {r['minutes']:>8.1f} {r['minutes_longest']:>8.1f}  "
              f"{' '.join(r['experiments'])}{limit}")  # fmt: skip
    total, longest = sum(r["minutes"] for r in rows), sum(r["minutes_longest"] for r in rows)
    print(f"{'suite':<13} {sum(r['runs'] for r in rows):>4} {total:>8.1f} {longest:>8.1f}")
    print("longest: every run the plateau rules may add, trained at every length they allow")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    record = {"meta": {**cpu, "jobs": jobs, "threads": threads, "steps": args.steps}, "kinds": rates, "calls": rows}
    write_json(args.json, record)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        main()
