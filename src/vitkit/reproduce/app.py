"""The application: :func:`plan` and :func:`reproduce` put the core (:mod:`.core`) and the
experiments (:mod:`.experiments`, registered when imported here) together. ``vitkit reproduce``
calls them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from PIL import Image

from ..data import StreamingDataset, build_dataset
from ..errors import VitkitError
from . import experiments as _experiments  # noqa: F401  (importing it registers every experiment)
from .core.experiment import Experiment, note_diverged
from .core.pool import resolve_jobs
from .core.provenance import machine, new_call_id
from .core.registry import registered
from .core.report import now, write_report
from .core.report import publish as publish_report
from .core.results import load_result, machine_seconds
from .core.runner import Runner
from .core.scoring import ScoreSettings, check_fewshot_data
from .core.signals import stop_after as stop_after_limit
from .core.signals import stop_on_signals
from .core.spec import DataInfo, RunSpec, Suite, check_experiments
from .names import EXPERIMENTS

# A sustained training rate, for the plan's GPU-hours only: 40% of one H100's dense bf16 peak.
# Reading and decoding ImageNet-scale images often bounds a run below it.
ASSUMED_GPU_FLOPS = 4e14


def _classes() -> dict[str, type[Experiment]]:
    """The experiment classes by name (every experiment module is imported above: registered)."""
    return registered()


def data_info(data: str) -> DataInfo:
    """What the suite must know of ``data`` before planning (its test split must exist too)."""
    train = build_dataset(data, "train")
    build_dataset(data, "test")
    size, streaming = tuple(train.image_size), isinstance(train, StreamingDataset)
    samples = getattr(train, "samples", None)
    if streaming and samples:  # an image folder decodes to a load size: take the files' own instead
        with Image.open(samples[0][0]) as im:
            size = (im.height, im.width)
    return DataInfo(data, size, train.in_chans, list(train.classes), len(train), streaming)


def _unique(specs: list[RunSpec]) -> list[RunSpec]:
    out: dict[str, RunSpec] = {}
    for s in specs:
        out.setdefault(s.key, s)  # runs that experiments share are trained once
    return list(out.values())


def plan(
    experiments: Sequence[str] = (),
    out: str | Path = "runs/reproduce",
    data: str = "fashion-mnist",
    budget: str = "desktop",
    seeds: int | None = None,
) -> dict[str, object]:
    """Every run a call would train, without training: per experiment its runs and training
    FLOPs, and the suite's (runs shared between experiments counted once). A learning rate
    that a grid chooses later is taken as the grid's first for counting: the counts and FLOPs
    do not depend on it.

    Args:
        experiments: names of :data:`EXPERIMENTS` (all when empty).
        out: the suite's folder (runs already finished there are counted as finished).
        data: the training data, as ``vitkit train`` takes it.
        budget: one of :data:`BUDGETS`.
        seeds: as for :func:`reproduce`.

    Returns:
        ``experiments`` (name to ``runs`` and ``train_flops``), ``runs``, ``finished``,
        ``train_flops`` and ``gpu_hours`` (at :data:`ASSUMED_GPU_FLOPS`).
    """
    names = check_experiments(list(experiments))
    suite = Suite(out, data, budget, seeds, data_info(data))
    suite.planning = True
    classes = _classes()
    runner = Runner(suite, 1, lambda line: None)
    per, every = {}, {}
    for name in names:
        specs = _unique(classes[name](suite).runs())
        per[name] = {"runs": len(specs), "train_flops": sum(runner.train_flops(s) for s in specs)}
        every.update({s.key: s for s in specs})
    flops = sum(runner.train_flops(s) for s in every.values())
    finished = sum(load_result(suite.run_dir(s) / "result.json")[0] is not None for s in every.values())
    return {"experiments": per, "runs": len(every), "finished": finished, "train_flops": flops,
            "gpu_hours": flops / ASSUMED_GPU_FLOPS / 3600}  # fmt: skip


def reproduce(
    experiments: Sequence[str] = (),
    out: str | Path = "runs/reproduce",
    data: str = "fashion-mnist",
    budget: str = "desktop",
    seeds: int | None = None,
    jobs: int | str = 1,
    report: Callable[[str], None] = print,
    command: str = "vitkit reproduce",
    publish: str | Path | None = None,
    stop_after: float | None = None,
) -> Path:
    """Run ``experiments`` (all by default) at ``budget`` on ``data`` into ``out``; returns the
    path of ``report.md``. Finished runs are skipped and interrupted ones resumed. The report
    covers every experiment whose runs are all finished, from this call or earlier ones.

    Args:
        experiments: names of :data:`EXPERIMENTS` (all when empty).
        out: the suite's folder: ``runs/``, ``report.md``, ``report.json``, ``figures/``.
        data: the training data, as ``vitkit train`` takes it.
        budget: one of :data:`BUDGETS`.
        seeds: seeds of the experiments that compare across seeds (None: the budget's).
        jobs: training runs at once, each in its own process with its share of the cores;
            "auto": :func:`~vitkit.reproduce.core.pool.auto_jobs` (one a core for the desktop
            budget on a CPU). ``vitkit reproduce`` takes "auto" by default.
        report: called with each line of progress.
        command: the command line the report names (and that resumes the suite).
        publish: a folder (e.g. ``docs/reproduce``) to copy the report and figures into.
        stop_after: minutes after which the call stops as SIGINT stops it (finished runs kept,
            the running ones resumable, no report); the next call goes on. None: no limit.

    Returns:
        The path of ``report.md``.

    Raises:
        vitkit.reproduce.core.signals.Interrupted: SIGINT, SIGTERM or ``stop_after`` stopped the
            call; finished runs are kept and the next call resumes the others.
    """
    with stop_on_signals():  # SIGTERM stops the call as Ctrl-C does, with the runs kept
        md = _reproduce(experiments, out, data, budget, seeds, jobs, report, command, stop_after)
    if publish is not None:
        report(f"published: {publish_report(md.parent, Path(publish))}")
    return md


def _planned_cost(names: list[str], suite: Suite, runner: Runner) -> float:
    """The cost (:meth:`Runner.cost`) of every run of ``names``, phases not yet planned included
    (each grid's choice taken as its first value, which changes no cost)."""
    planning = Suite(suite.out, suite.data, suite.budget, suite.seeds, suite.info)
    planning.planning = True
    classes = _classes()
    return sum(runner.cost(s) for s in _unique([s for n in names for s in classes[n](planning).runs()]))


def _reproduce(
    experiments: Sequence[str],
    out: str | Path,
    data: str,
    budget: str,
    seeds: int | None,
    jobs: int | str,
    report: Callable[[str], None],
    command: str,
    stop_after: float | None = None,
) -> Path:
    start = time.perf_counter()
    jobs = resolve_jobs(jobs, budget, report)
    names = check_experiments(list(experiments))
    suite = Suite(out, data, budget, seeds, data_info(data))
    settings = ScoreSettings.of(suite)
    check_fewshot_data(settings)
    classes = _classes()
    chosen = [classes[n](suite) for n in names]
    call = new_call_id()
    runner = Runner(suite, jobs, report, call)
    planned = _planned_cost(names, suite, runner)
    seen: set[str] = set()
    if stop_after is not None:
        report(f"stops after {stop_after:g} min (--stop-after) with its finished runs kept; the next call goes on")
    with stop_after_limit(stop_after):
        while True:  # a phased experiment plans its next runs once the earlier ones are finished
            specs = _unique([s for e in chosen for s in e.runs()])
            if not {s.key for s in specs} - seen:
                break
            runner.run(specs, later_cost=planned - sum(runner.cost(s) for s in specs))
            seen |= {s.key for s in specs}
    sections, runs = [], {}
    told: set[Path] = set()  # damaged files already named
    for name in EXPERIMENTS:  # every experiment whose runs are finished, asked for now or before
        try:
            exp = chosen[names.index(name)] if name in names else classes[name](suite)
            specs = exp.runs()
        except VitkitError:
            if name in names:
                raise
            continue  # an experiment not asked for that this data or budget cannot plan
        results = {}
        for s in specs:
            path = suite.run_dir(s) / "result.json"
            res, damaged = load_result(path)
            if damaged and path not in told:
                told.add(path)
                report(
                    f"{path}: {damaged}; the {name} section is left out until `vitkit reproduce {name}` runs it again"
                )
            results[s.key] = res
        if all(results.values()) and exp.planned():
            section = exp.summarise(results)
            note_diverged(section, specs, results)
            section.runs = len(results)
            section.wall_seconds = sum(machine_seconds(r) for r in results.values())
            sections.append(section)
            runs.update(results)
    meta = {
        "command": command, "call": call, "date": now(), "budget": budget, "data": data, "seeds": suite.seeds,
        "img_size": list(suite.img_size), "fewshot": f"{settings.shots}-shot {settings.fewshot_data}",
        "in_domain": {"shots": settings.in_domain_shots, "width": settings.in_domain_width},
        "machine": machine(), "seconds": time.perf_counter() - start, "experiments": [s.name for s in sections],
    }  # fmt: skip
    md, _ = write_report(suite.out, sections, meta, runs)
    report(f"report: {md}")
    return md
