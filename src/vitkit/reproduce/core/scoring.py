"""Training and scoring one run: its recipe trained (or resumed) into its folder, then its best
checkpoint scored once and the numbers written to ``result.json``.

Scoring uses only the checkpoint the minival chose (``best.safetensors``): top-1 on the test
split, few-shot linear accuracy on a task the model never saw (:func:`fewshot_transfer`), and
few-shot linear accuracy on the pre-training task itself, on features of one width for every
model (:func:`fewshot_in_domain`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...checkpoint.io import read_safetensors_metadata
from ...checkpoint.load import load_pretrained
from ...data import build_dataset
from ...data.carve import class_orders
from ...errors import DataError, TrainingError
from ...eval import evaluate, extract_features
from ...eval.fewshot import DEFAULT_L2_GRID, fewshot_eval
from ...files import temporary_target, write_json
from ...models.flops import count_params, model_flops
from ...precision import Precision, as_precision
from ...train import train
from ...train.build import build_model
from ...train.config import recipe_from_dict
from ...train.runfolder import LOCK, MARKER, read_metrics
from .provenance import run_provenance
from .results import SCORE_VERSION
from .spec import RunSpec, Suite

TRAIN_IMAGES = 10000  # training images (a seeded sample) the best checkpoint is scored on: the generalisation gap


@dataclass(frozen=True)
class ScoreSettings:
    """How every run is scored (the same for all of a suite's runs).

    Attributes:
        data: the suite's data source (a ``--data`` value).
        test_images: the test images scored (a seeded sample); None: all of them.
        fewshot_data: the data of the few-shot transfer task.
        shots: the training images per class of the few-shot task.
        fewshot_seeds: the seeds of the few-shot samples.
        data_options: the data source's options, as (name, value) pairs.
        in_domain_shots: the images per class of the in-domain few-shot task (fewer where a
            run's minival has fewer than twice as many of a class).
        in_domain_width: the width every model's features are projected to for it.
    """

    data: str
    test_images: int | None
    fewshot_data: str
    shots: int
    fewshot_seeds: int
    data_options: tuple[tuple[str, Any], ...] = ()  # how the data source loads (hashable: cached per process)
    in_domain_shots: int = 10
    in_domain_width: int = 64

    @classmethod
    def of(cls, suite: Suite) -> ScoreSettings:
        """The scoring the suite's shared settings (``common.yaml`` at its budget) ask for.

        Args:
            suite: the suite.

        Returns:
            The settings; the few-shot task defaults to "digits", 10 shots, 5 seeds; the
            in-domain task to 10 shots on features of width 64.
        """
        fs = suite.common.get("fewshot") or {}
        own = fs.get("in_domain") or {}
        return cls(
            data=suite.data,
            test_images=suite.common.get("test_images"),
            fewshot_data=str(fs.get("data", "digits")),
            shots=int(fs.get("shots", 10)),
            fewshot_seeds=int(fs.get("seeds", 5)),
            data_options=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in suite.data_options().items()),
            in_domain_shots=int(own.get("shots", 10)),
            in_domain_width=int(own.get("width", 64)),
        )


def check_fewshot_data(settings: ScoreSettings) -> None:
    """The few-shot task must have ``2 x shots`` training images of every class (half hold the
    shots, half choose the l2 strength) and a test split.

    Args:
        settings: the suite's scoring, whose ``fewshot_data`` and ``shots`` are checked.

    Raises:
        DataError: a class has fewer than ``2 x shots`` training images, or the task's data or
            its test split cannot be found.
    """

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

    key = (name, split, options)
    if key not in _CACHE:
        _CACHE[key] = build_dataset(name, split, **dict(options))
    return _CACHE[key]


def fewshot_transfer(model: Any, settings: ScoreSettings, precision: Precision) -> dict[str, Any]:
    """Few-shot linear accuracy (the closed form of :mod:`vitkit.eval.fewshot`) on the transfer
    task. The l2 strength is chosen on the task's training images alone: half of each class
    holds the shots, the other half scores them; then the shots come from all training images
    and the test split scores them.

    Args:
        model: the model whose pre-logits features are scored.
        settings: the suite's scoring (the task, the shots, the seeds).
        precision: what the features are extracted in (the run's resolved precision).

    Returns:
        ``shots``, ``l2`` (the strength chosen), and the test accuracy over the seeds as ``mean``,
        ``std`` and ``per_seed`` (fractions in [0, 1]).
    """

    train, test = _split(settings.fewshot_data, "train"), _split(settings.fewshot_data, "test")
    train_x, train_y = extract_features(model, train, precision=precision)
    test_x, test_y = extract_features(model, test, precision=precision)
    return _ridge_transfer(train_x, train_y, test_x, test_y, train.num_classes, settings.shots, settings.fewshot_seeds)


def _ridge_transfer(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    num_classes: int,
    shots: int,
    seeds: int,
) -> dict[str, Any]:
    """The closed-form few-shot score with its l2 strength chosen on the training pool alone:
    half of each class holds the shots, the other half scores them; then the shots come from the
    whole pool and the test features score them."""

    halves = [o[: len(o) // 2] for o in class_orders(train_y, num_classes, seed=1)]
    a = torch.cat(halves)
    b = torch.ones(len(train_y), dtype=torch.bool)
    b[a] = False
    k = num_classes
    pick = fewshot_eval(train_x[a], train_y[a], train_x[b], train_y[b], [shots], seeds, DEFAULT_L2_GRID, num_classes=k)
    l2 = pick["best"][0]["l2"]
    res = fewshot_eval(train_x, train_y, test_x, test_y, [shots], seeds, l2, num_classes=k)["results"][0]
    return {"shots": shots, "l2": l2, "mean": res["mean"], "std": res["std"], "per_seed": res["per_seed"]}


def width_matched(pool: torch.Tensor, others: Sequence[torch.Tensor], width: int) -> list[torch.Tensor]:
    """Features brought to one width: centred on the pool's mean and projected onto the pool's
    ``width`` leading principal directions (all of them where the features are narrower), so that
    models of different widths are read by linear classifiers of the same size.

    Args:
        pool: the features the projection is fitted on (N, F): unlabelled use only.
        others: more features (M, F) projected the same way.
        width: the width wanted.

    Returns:
        ``pool`` and each of ``others`` projected, (N, w) and (M, w) float32, with
        ``w = min(width, F, N)``.
    """

    mean = pool.mean(0, dtype=torch.float64)
    centred = pool.double() - mean
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    basis = vh[: min(width, vh.shape[0])].T
    return [((x.double() - mean) @ basis).float() for x in (pool, *others)]


def fewshot_in_domain(model: Any, recipe: Any, settings: ScoreSettings, precision: Precision) -> dict[str, Any]:
    """Few-shot linear accuracy on the pre-training task itself, on width-matched features.

    The shots, and the images that choose the l2 strength, come from the run's own minival
    (images it never trained on); the suite's test split scores them. Every model's pre-logits
    features are first projected to ``settings.in_domain_width`` dimensions
    (:func:`width_matched`, fitted on the minival's features), so that a wider representation
    does not win by its width alone.

    Args:
        model: the model whose pre-logits features are scored.
        recipe: the run's recipe (a :class:`vitkit.train.Recipe`): its data and minival.
        settings: the suite's scoring (the test split, the in-domain shots and width, the seeds).
        precision: what the features are extracted in.

    Returns:
        ``shots`` (the configured count, or half the minival's smallest class where that is
        fewer), ``width`` (of the projected features), ``features`` (the model's own width),
        ``l2``, and the test accuracy over the seeds as ``mean``, ``std`` and ``per_seed``.

    Raises:
        DataError: the run has no minival, or its minival has fewer than two images of a class.
    """

    d = recipe.data
    if not d.minival:
        raise DataError(f"{d.name}: in-domain few-shot takes its shots from the minival, and data.minival is 0")
    pool = build_dataset(d.name, "minival", minival=d.minival, subset=d.subset, subset_seed=d.subset_seed,
                         **d.options)  # fmt: skip
    test = _split(settings.data, "test", settings.data_options)
    pool_x, pool_y = extract_features(model, pool, precision=precision)
    test_x, test_y = extract_features(model, test, precision=precision, max_images=settings.test_images)
    smallest = int(pool_y.bincount(minlength=pool.num_classes).min())
    shots = min(settings.in_domain_shots, smallest // 2)
    if shots < 1:
        raise DataError(
            f"{d.name}: in-domain few-shot needs two minival images of every class; a class has {smallest} "
            f"(raise data.minival above {d.minival})"
        )
    if not (torch.isfinite(pool_x).all() and torch.isfinite(test_x).all()):  # a diverged run: nothing to project
        nan, wide = float("nan"), int(pool_x.shape[1])
        return {"width": min(settings.in_domain_width, wide), "features": wide, "shots": shots, "l2": None,
                "mean": nan, "std": nan, "per_seed": [nan] * settings.fewshot_seeds}  # fmt: skip
    pool_w, test_w = width_matched(pool_x, [test_x], settings.in_domain_width)
    out = _ridge_transfer(pool_w, pool_y, test_w, test_y, pool.num_classes, shots, settings.fewshot_seeds)
    return {"width": int(pool_w.shape[1]), "features": int(pool_x.shape[1]), **out}


def initial_model(tree: dict[str, Any], info: Any) -> torch.nn.Module:
    """The model a run's recipe starts from, before any step: what the trainer builds
    (:func:`vitkit.train.build.build_model`, seeded by the recipe's seed), in eval mode.

    Args:
        tree: the run's recipe tree (:attr:`RunSpec.recipe`).
        info: the suite's :class:`~vitkit.reproduce.core.spec.DataInfo` (classes and channels).

    Returns:
        The model.
    """
    recipe = recipe_from_dict(copy.deepcopy(tree))
    torch.manual_seed(recipe.seed)  # as the run plan seeds before it builds
    return build_model(recipe, info.num_classes, info.in_chans).eval()


def minival_curve(run_dir: Path) -> list[list[float]]:
    """A run's minival top-1 at each evaluation, as ``[step, top1]`` pairs from its ``metrics.jsonl``."""
    recs = read_metrics(run_dir / "metrics.jsonl", strict=False)
    return [[int(r["step"]), float(r["top1"])] for _, r in recs if "top1" in r and "step" in r]


def train_accuracy(model: Any, recipe: Any, precision: Precision) -> float:
    """Top-1 of ``model`` on the images its run trained on (its subset, without the minival; a
    seeded sample of :data:`TRAIN_IMAGES` where there are more), as the training split is read
    for evaluation: no augmentation."""

    d = recipe.data
    train = build_dataset(d.name, d.train_split, minival=d.minival, subset=d.subset, subset_seed=d.subset_seed,
                          **d.options)  # fmt: skip
    return float(evaluate(model, train, precision=precision, max_images=TRAIN_IMAGES)["top1"])


def score(run_dir: Path, settings: ScoreSettings, precision: Precision, recipe: Any = None) -> dict[str, Any]:
    """Test top-1 and few-shot transfer of a finished run's best (minival) checkpoint; with the
    run's ``recipe``, also its top-1 on its own training images (``train_top1``).

    Args:
        run_dir: the run's folder, holding ``best.safetensors`` and ``metrics.jsonl``.
        settings: the suite's scoring.
        precision: what the model is evaluated in (the run's resolved precision).
        recipe: the run's recipe (a :class:`vitkit.train.Recipe`), or None to leave out
            ``train_top1``.

    Returns:
        ``test_top1`` and ``test_images``, ``fewshot`` (:func:`fewshot_transfer`), ``best_step``
        and ``minival_top1`` (of the checkpoint, None where it does not say), ``flops_per_image``,
        ``params``, ``img_size``, ``train_top1`` and ``fewshot_in_domain``
        (:func:`fewshot_in_domain`; both None without ``recipe``) and ``minival_curve``
        (``[step, top1]`` pairs). Accuracies are fractions in [0, 1].

    Raises:
        TrainingError: the run has no ``best.safetensors``.
    """

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
        "train_top1": None if recipe is None else train_accuracy(model, recipe, precision),
        "fewshot_in_domain": None if recipe is None else fewshot_in_domain(model, recipe, settings, precision),
        "minival_curve": minival_curve(run_dir),
    }


def train_and_score(
    spec: RunSpec,
    run_dir: Path,
    init_from: str | None,
    settings: ScoreSettings,
    runs_at_once: int = 1,
    call: str | None = None,
) -> dict[str, Any]:
    """Train (or resume, or find finished) one run, score it and write its ``result.json``;
    ``runs_at_once`` (the runs the suite trains beside it, itself included) and torch's threads
    are written with its wall time, which they shape, and what made the run (commit, code, the
    call ``call``, machine, precision, torch). The wall time counts every call that trained the
    run: the training seconds of earlier calls (its metrics log) and all of this call's."""

    tree = copy.deepcopy(spec.recipe)
    if init_from is not None:
        tree["model"]["init_from"] = init_from
    recipe = recipe_from_dict(tree)
    precision = as_precision(recipe.train.precision, "cpu")  # scoring runs on the CPU
    start = time.perf_counter()
    _clear_interrupted_start(run_dir)
    earlier = (_train_seconds(run_dir) or 0.0) if (run_dir / "metrics.jsonl").is_file() else 0.0
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
        **score(run_dir, settings, precision, recipe),
    }
    out["train_flops"] = 3 * out["flops_per_image"] * out["steps"] * out["batch_size"]  # forward + backward ~ 3x
    out["wall_seconds"] = earlier + time.perf_counter() - start
    out["runs_at_once"], out["threads"] = runs_at_once, torch.get_num_threads()
    out["made_by"] = run_provenance(recipe.train.precision, call)  # what training computed in, on its device
    write_json(run_dir / "result.json", out)
    return out


def _clear_interrupted_start(run_dir: Path) -> None:
    """A run stopped while it claimed its folder leaves the lock file alone there (with at most the
    temporary of the folder's marker), which a run refuses as not a run folder. Under a suite's
    ``runs/`` nothing else makes such a folder: it is emptied, unless a live run holds the lock."""

    try:
        names = {p.name for p in run_dir.iterdir()}
    except OSError:
        return
    if LOCK not in names or any(n != LOCK and temporary_target(n) != MARKER for n in names):
        return
    try:
        fd = os.open(run_dir / LOCK, os.O_RDWR)
    except OSError:
        return
    try:
        try:
            import fcntl  # POSIX only: elsewhere the lock is not checked

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:
            pass
        except OSError:
            return  # held: a live run is starting there, and says so itself
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (run_dir / name).unlink()
    finally:
        os.close(fd)


def _train_seconds(run_dir: Path) -> float | None:
    """Training time of the whole run, over every call that resumed it (the last ``train_s`` logged)."""
    logged = [rec["train_s"] for _, rec in read_metrics(run_dir / "metrics.jsonl", strict=False) if "train_s" in rec]
    return float(logged[-1]) if logged else None
