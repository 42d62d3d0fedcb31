"""Running a suite's training runs: skip the finished, resume the interrupted, score each once.

A run is finished when its folder holds ``result.json`` (written atomically, last). Until then
the folder is an ordinary vitkit run that :func:`vitkit.train.train` resumes bit for bit from its
last checkpoint, so a suite killed at any moment ends, on the next call, with the numbers an
uninterrupted one would have given.

Scoring uses only the checkpoint the minival chose (``best.safetensors``): top-1 on the test
split, and few-shot linear accuracy on a task the model never saw (:func:`fewshot_transfer`).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from ..errors import DataError, TrainingError
from ..files import write_json
from .spec import RunSpec, Suite

# Bump when the scoring changes: results of an older scoring are scored again (not retrained).
SCORE_VERSION = 1


@dataclass(frozen=True)
class ScoreSettings:
    """How every run is scored (the same for all of a suite's runs)."""

    data: str
    test_images: int | None
    fewshot_data: str
    shots: int
    fewshot_seeds: int
    data_options: tuple[tuple[str, Any], ...] = ()  # how the data source loads (hashable: cached per process)

    @classmethod
    def of(cls, suite: Suite) -> ScoreSettings:
        fs = suite.common.get("fewshot") or {}
        return cls(
            data=suite.data,
            test_images=suite.common.get("test_images"),
            fewshot_data=str(fs.get("data", "digits")),
            shots=int(fs.get("shots", 10)),
            fewshot_seeds=int(fs.get("seeds", 5)),
            data_options=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in suite.data_options().items()),
        )


def check_fewshot_data(settings: ScoreSettings) -> None:
    """The few-shot task must have ``2 x shots`` training images of every class (half hold the
    shots, half choose the l2 strength) and a test split."""
    from ..data import build_dataset

    train = build_dataset(settings.fewshot_data, "train")
    build_dataset(settings.fewshot_data, "test")
    counts = train.labels.bincount(minlength=train.num_classes).tolist()
    need = 2 * settings.shots
    short = [train.classes[c] for c, n in enumerate(counts) if n < need]
    if short:
        raise DataError(
            f"{settings.fewshot_data}: {settings.shots}-shot transfer needs {need} training images of every class; "
            f"{len(short)} classes have fewer (e.g. {short[0]!r} has {counts[train.classes.index(short[0])]})"
        )


_CACHE: dict[tuple[Any, ...], Any] = {}


def _split(name: str, split: str, options: tuple[tuple[str, Any], ...] = ()) -> Any:
    from ..data import build_dataset

    key = (name, split, options)
    if key not in _CACHE:
        _CACHE[key] = build_dataset(name, split, **dict(options))
    return _CACHE[key]


def fewshot_transfer(model: Any, settings: ScoreSettings, precision: str) -> dict[str, Any]:
    """Few-shot linear accuracy (the closed form of :mod:`vitkit.eval.fewshot`) on the transfer
    task. The l2 strength is chosen on the task's training images alone: half of each class
    holds the shots, the other half scores them; then the shots come from all training images
    and the test split scores them."""
    import torch

    from ..data.carve import class_orders
    from ..eval import extract_features
    from ..eval.fewshot import DEFAULT_L2_GRID, fewshot_eval

    train, test = _split(settings.fewshot_data, "train"), _split(settings.fewshot_data, "test")
    train_x, train_y = extract_features(model, train, precision=precision)
    test_x, test_y = extract_features(model, test, precision=precision)
    halves = [o[: len(o) // 2] for o in class_orders(train_y, train.num_classes, seed=1)]
    a = torch.cat(halves)
    b = torch.ones(len(train_y), dtype=torch.bool)
    b[a] = False
    k, shots, seeds = train.num_classes, [settings.shots], settings.fewshot_seeds
    pick = fewshot_eval(train_x[a], train_y[a], train_x[b], train_y[b], shots, seeds, DEFAULT_L2_GRID, num_classes=k)
    l2 = pick["best"][0]["l2"]
    res = fewshot_eval(train_x, train_y, test_x, test_y, shots, seeds, l2, num_classes=k)["results"][0]
    return {"shots": settings.shots, "l2": l2, "mean": res["mean"], "std": res["std"], "per_seed": res["per_seed"]}


def initial_model(tree: dict[str, Any], info: Any) -> Any:
    """The model a run's recipe starts from, before any step: built and initialised as the
    trainer does (seeded by the recipe's seed), in eval mode."""
    import torch

    from ..models.init import mimetic_init_
    from ..models.registry import create_model
    from ..train.config import recipe_from_dict

    r = recipe_from_dict(copy.deepcopy(tree))
    torch.manual_seed(r.seed)
    overrides = {"num_classes": info.num_classes, "in_chans": info.in_chans, **r.model.overrides}
    model = create_model(r.model.name, **overrides)
    if r.model.init == "mimetic":
        mimetic_init_(model, seed=r.seed)
    return model.eval()


def score(run_dir: Path, settings: ScoreSettings, precision: str) -> dict[str, Any]:
    """Test top-1 and few-shot transfer of a finished run's best (minival) checkpoint."""
    from ..checkpoint.io import read_safetensors_metadata
    from ..checkpoint.load import load_pretrained
    from ..eval import evaluate
    from ..models.flops import count_params, model_flops

    best = run_dir / "best.safetensors"
    if not best.is_file():
        raise TrainingError(f"{run_dir}: no best.safetensors (was the minival ever evaluated?)")
    model = load_pretrained(best)
    test = _split(settings.data, "test", settings.data_options)
    metrics = evaluate(model, test, precision=precision, max_images=settings.test_images)
    meta = read_safetensors_metadata(best)
    return {
        "test_top1": metrics["top1"],
        "test_images": metrics["num_images"],
        "fewshot": fewshot_transfer(model, settings, precision),
        "best_step": int(meta["step"]) if "step" in meta else None,
        "minival_top1": float(meta["top1"]) if "top1" in meta else None,
        "flops_per_image": model_flops(model),
        "params": count_params(model),
        "img_size": list(model.cfg.img_size),
    }


def train_and_score(spec: RunSpec, run_dir: Path, init_from: str | None, settings: ScoreSettings) -> dict[str, Any]:
    """Train (or resume, or find finished) one run, score it and write its ``result.json``."""
    from ..train import train
    from ..train.config import recipe_from_dict

    tree = copy.deepcopy(spec.recipe)
    if init_from is not None:
        tree["model"]["init_from"] = init_from
    recipe = recipe_from_dict(tree)
    start = time.perf_counter()
    train(recipe, run_dir)
    out = {
        "key": spec.key,
        "label": spec.label,
        "model": spec.model,
        "score_version": SCORE_VERSION,
        "steps": recipe.train.steps,
        "batch_size": recipe.train.batch_size,
        "seed": recipe.seed,
        "train_seconds": _train_seconds(run_dir),
        **score(run_dir, settings, recipe.train.precision),
    }
    out["train_flops"] = 3 * out["flops_per_image"] * out["steps"] * out["batch_size"]  # forward + backward ~ 3x
    out["wall_seconds"] = time.perf_counter() - start
    write_json(run_dir / "result.json", out)
    return out


def _train_seconds(run_dir: Path) -> float | None:
    """Training time of the whole run, over every call that resumed it (the last ``train_s`` logged)."""
    from ..train.runfolder import read_metrics

    logged = [rec["train_s"] for _, rec in read_metrics(run_dir / "metrics.jsonl", strict=False) if "train_s" in rec]
    return float(logged[-1]) if logged else None


def read_result(path: Path) -> dict[str, Any] | None:
    """A finished run's result, or None if it is missing, torn or of an older scoring."""
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return res if isinstance(res, dict) and res.get("score_version") == SCORE_VERSION else None


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


class Runner:
    """Runs specs (dependencies first), ``jobs`` at a time, reporting a line per run and an ETA."""

    def __init__(self, suite: Suite, jobs: int = 1, report: Callable[[str], None] = print) -> None:
        if jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {jobs}")
        self.suite, self.jobs, self.report = suite, jobs, report
        self.settings = ScoreSettings.of(suite)
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, specs: list[RunSpec]) -> dict[str, dict[str, Any]]:
        todo = []
        for spec in specs:
            res = read_result(self.suite.run_dir(spec) / "result.json")
            if res is not None:
                self.results[spec.key] = res
            else:
                todo.append(spec)
        if specs:
            self.report(f"{len(specs) - len(todo)} of {len(specs)} runs already finished; {len(todo)} to run")
        self._cost_done = self._seconds_done = 0.0
        self._total_cost = sum(self._cost(s) for s in todo)
        self._count, self._total = 0, len(todo)
        for phase in (
            [s for s in todo if s.after is None],
            [s for s in todo if s.after is not None],
        ):
            self._run_phase(phase)
        return self.results

    def _cost(self, spec: RunSpec) -> float:
        """Relative cost of a run: forward FLOPs x images it trains on (for the ETA)."""
        from ..models.flops import resnet_flops, vit_flops
        from ..models.registry import model_config

        m, t = spec.recipe["model"], spec.recipe.get("train", {})
        cfg = model_config(m["name"], **{**m.get("overrides", {}), "in_chans": self.suite.info.in_chans})
        flops = resnet_flops(cfg) if hasattr(cfg, "units") else vit_flops(cfg)
        return float(flops) * int(t.get("steps", 1)) * int(t.get("batch_size", 1)) + 1e9

    def _init_from(self, spec: RunSpec) -> str | None:
        if spec.after is None:
            return None
        return str((self.suite.out / "runs" / spec.after / "best.safetensors").resolve())

    def _run_phase(self, specs: list[RunSpec]) -> None:
        if not specs:
            return
        args = [(s, self.suite.run_dir(s), self._init_from(s), self.settings) for s in specs]
        if self.jobs == 1:
            for a in args:
                start = time.perf_counter()
                self._done(a[0], train_and_score(*a), time.perf_counter() - start)
            return
        threads = max(1, (os.cpu_count() or 1) // self.jobs)
        ctx = get_context("spawn")
        with ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=_threads, initargs=(threads,)) as pool:
            started = {pool.submit(train_and_score, *a): (a[0], time.perf_counter()) for a in args}
            for fut in as_completed(started):
                spec, t0 = started[fut]
                self._done(spec, fut.result(), (time.perf_counter() - t0) / self.jobs)

    def _done(self, spec: RunSpec, res: dict[str, Any], seconds: float) -> None:
        self.results[spec.key] = res
        self._count += 1
        self._cost_done += self._cost(spec)
        self._seconds_done += seconds
        left = (self._total_cost - self._cost_done) * self._seconds_done / max(self._cost_done, 1.0)
        fs = res["fewshot"]
        self.report(
            f"[{self._count}/{self._total}] {spec.label}: test top-1 {100 * res['test_top1']:.2f}%, "
            f"{fs['shots']}-shot {100 * fs['mean']:.2f}% ({res['wall_seconds']:.0f} s); ETA {_duration(left)}"
        )


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = ["SCORE_VERSION", "Runner", "ScoreSettings", "check_fewshot_data", "fewshot_transfer", "read_result", "score"]
