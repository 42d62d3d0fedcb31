"""Running a suite's training runs: skip the finished, resume the interrupted, score each once.

A run is finished when its folder holds ``result.json`` (written atomically, last). Until then
the folder is an ordinary vitkit run that :func:`vitkit.train.train` resumes bit for bit from its
last checkpoint, so a suite killed at any moment ends, on the next call, with the numbers an
uninterrupted one would have given.

Scoring uses only the checkpoint the minival chose (``best.safetensors``): top-1 on the test
split, and few-shot linear accuracy on a task the model never saw (:func:`fewshot_transfer`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from ..errors import DataError, TrainingError
from ..files import write_json
from .spec import RunSpec, Suite

# Bump when the scoring changes: results of an older scoring are scored again (not retrained).
SCORE_VERSION = 2
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
    """

    data: str
    test_images: int | None
    fewshot_data: str
    shots: int
    fewshot_seeds: int
    data_options: tuple[tuple[str, Any], ...] = ()  # how the data source loads (hashable: cached per process)

    @classmethod
    def of(cls, suite: Suite) -> ScoreSettings:
        """The scoring the suite's shared settings (``common.yaml`` at its budget) ask for.

        Args:
            suite: the suite.

        Returns:
            The settings; the few-shot task defaults to "digits", 10 shots, 5 seeds.
        """
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
    shots, half choose the l2 strength) and a test split.

    Args:
        settings: the suite's scoring, whose ``fewshot_data`` and ``shots`` are checked.

    Raises:
        DataError: a class has fewer than ``2 x shots`` training images, or the task's data or
            its test split cannot be found.
    """
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
    and the test split scores them.

    Args:
        model: the model whose pre-logits features are scored.
        settings: the suite's scoring (the task, the shots, the seeds).
        precision: what the features are extracted in: "auto", "fp32" or "bf16".

    Returns:
        ``shots``, ``l2`` (the strength chosen), and the test accuracy over the seeds as ``mean``,
        ``std`` and ``per_seed`` (fractions in [0, 1]).
    """
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


def minival_curve(run_dir: Path) -> list[list[float]]:
    """A run's minival top-1 at each evaluation, as ``[step, top1]`` pairs from its ``metrics.jsonl``."""
    from ..train.runfolder import read_metrics

    recs = read_metrics(run_dir / "metrics.jsonl", strict=False)
    return [[int(r["step"]), float(r["top1"])] for _, r in recs if "top1" in r and "step" in r]


def train_accuracy(model: Any, recipe: Any, precision: str) -> float:
    """Top-1 of ``model`` on the images its run trained on (its subset, without the minival; a
    seeded sample of :data:`TRAIN_IMAGES` where there are more), as the training split is read
    for evaluation: no augmentation."""
    from ..data import build_dataset
    from ..eval import evaluate

    d = recipe.data
    train = build_dataset(d.name, d.train_split, minival=d.minival, subset=d.subset, subset_seed=d.subset_seed,
                          **d.options)  # fmt: skip
    return float(evaluate(model, train, precision=precision, max_images=TRAIN_IMAGES)["top1"])


def score(run_dir: Path, settings: ScoreSettings, precision: str, recipe: Any = None) -> dict[str, Any]:
    """Test top-1 and few-shot transfer of a finished run's best (minival) checkpoint; with the
    run's ``recipe``, also its top-1 on its own training images (``train_top1``).

    Args:
        run_dir: the run's folder, holding ``best.safetensors`` and ``metrics.jsonl``.
        settings: the suite's scoring.
        precision: what the model is evaluated in: "auto", "fp32" or "bf16".
        recipe: the run's recipe (a :class:`vitkit.train.Recipe`), or None to leave out
            ``train_top1``.

    Returns:
        ``test_top1`` and ``test_images``, ``fewshot`` (:func:`fewshot_transfer`), ``best_step``
        and ``minival_top1`` (of the checkpoint, None where it does not say), ``flops_per_image``,
        ``params``, ``img_size``, ``train_top1`` (None without ``recipe``) and ``minival_curve``
        (``[step, top1]`` pairs). Accuracies are fractions in [0, 1].

    Raises:
        TrainingError: the run has no ``best.safetensors``.
    """
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
        "train_top1": None if recipe is None else train_accuracy(model, recipe, precision),
        "minival_curve": minival_curve(run_dir),
    }


def train_and_score(
    spec: RunSpec, run_dir: Path, init_from: str | None, settings: ScoreSettings, runs_at_once: int = 1
) -> dict[str, Any]:
    """Train (or resume, or find finished) one run, score it and write its ``result.json``;
    ``runs_at_once`` (the runs the suite trains beside it, itself included) and torch's threads
    are written with its wall time, which they shape, and what made the run (commit, machine,
    precision, torch)."""
    import torch

    from ..train import train
    from ..train.config import recipe_from_dict
    from .report import run_provenance

    tree = copy.deepcopy(spec.recipe)
    if init_from is not None:
        tree["model"]["init_from"] = init_from
    recipe = recipe_from_dict(tree)
    start = time.perf_counter()
    _clear_interrupted_start(run_dir)
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
        **score(run_dir, settings, recipe.train.precision, recipe),
    }
    out["train_flops"] = 3 * out["flops_per_image"] * out["steps"] * out["batch_size"]  # forward + backward ~ 3x
    out["wall_seconds"] = time.perf_counter() - start
    out["runs_at_once"], out["threads"] = runs_at_once, torch.get_num_threads()
    out["made_by"] = run_provenance(recipe.train.precision)
    write_json(run_dir / "result.json", out)
    return out


def _clear_interrupted_start(run_dir: Path) -> None:
    """A run stopped while it claimed its folder leaves the lock file alone there (with at most the
    temporary of the folder's marker), which a run refuses as not a run folder. Under a suite's
    ``runs/`` nothing else makes such a folder: it is emptied, unless a live run holds the lock."""
    from ..files import temporary_target
    from ..train.runfolder import LOCK, MARKER

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
            import fcntl

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
    from ..train.runfolder import read_metrics

    logged = [rec["train_s"] for _, rec in read_metrics(run_dir / "metrics.jsonl", strict=False) if "train_s" in rec]
    return float(logged[-1]) if logged else None


def machine_seconds(res: dict[str, Any]) -> float:
    """The share of the machine's time a run took: its wall time over the runs trained at once
    beside it (``runs_at_once``, 1 where the result does not say). Summed over runs, the time
    the runs take whatever ``--jobs`` trained them.

    Args:
        res: a run's result (``result.json``).

    Returns:
        Seconds, 0 where the result has no wall time.
    """
    at_once = res.get("runs_at_once")
    return float(res.get("wall_seconds") or 0.0) / (at_once if _is_count(at_once) and at_once >= 1 else 1)


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a JSON number (a bool is not), else None. A number too large
    for a float (``1e999`` reads as inf; a 400-digit integer does not fit) is ``inf``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _check_accuracy(where: str, value: Any, optional: bool = False) -> str | None:
    """Why ``value`` cannot be an accuracy (a number in [0, 1]), or None if it can. A float that is
    not finite is accepted: it is what a diverged run measures, and the report leaves it out."""
    if value is None and optional:
        return None
    x = _number(value)
    if x is None:
        return f"{where} is {type(value).__name__} {_short(value)}, not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not 0.0 <= x <= 1.0:
        return f"{where} is {_short(value)}, not an accuracy between 0 and 1"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_result(res: Any) -> str | None:
    """Why ``res`` (a parsed ``result.json``) is not a result this scoring could have written, or
    None if it is one. Only the numbers the report reads are checked: each present, of its type,
    and in its range.

    Args:
        res: what ``json.loads`` gave for the file.

    Returns:
        One clause naming the key at fault, or None.
    """
    if not isinstance(res, dict):
        return f"holds a JSON {_json_kind(res)}, not an object"
    missing = [k for k in ("score_version", "test_top1", "fewshot", "wall_seconds", "train_flops") if k not in res]
    if missing:
        return f"has no {', '.join(missing)}"
    version = res["score_version"]
    if not _is_count(version) or version != SCORE_VERSION:
        return f"score_version is {_short(version)}, not {SCORE_VERSION}"
    fewshot = res["fewshot"]
    if not isinstance(fewshot, dict):
        return f"fewshot is {_short(fewshot)}, not an object"
    if "mean" not in fewshot or "shots" not in fewshot:
        return f"fewshot has no {' or '.join(k for k in ('mean', 'shots') if k not in fewshot)}"
    problems = [
        _check_accuracy("test_top1", res["test_top1"]),
        _check_accuracy("minival_top1", res.get("minival_top1"), optional=True),
        _check_accuracy("fewshot.mean", fewshot["mean"]),
        None if _is_count(fewshot["shots"]) else f"fewshot.shots is {_short(fewshot['shots'])}, not a count",
    ]
    for key, low in (("wall_seconds", 0.0), ("train_flops", 1.0)):
        x = _number(res[key])
        if x is None or not math.isfinite(x) or x < low:
            problems.append(f"{key} is {_short(res[key])}, not a finite number of at least {low:g}")
    return next((p for p in problems if p is not None), None)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000


def _json_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def load_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A run's ``result.json``, checked.

    Args:
        path: the file (``OUT/runs/KEY/result.json``).

    Returns:
        ``(result, None)`` for a finished run; ``(None, None)`` if there is no file or it is of an
        older scoring (the run is scored again); ``(None, why)`` if the file is damaged (torn,
        not JSON, or a value of the wrong type, range or size), ``why`` one clause naming what.

    Raises:
        OSError: the file exists but cannot be read (its permissions, a folder in its place).
    """
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        res = json.loads(text, parse_float=_parse_float)
    except _TooLarge as e:
        return None, f"holds a number too large for a float ({_short(str(e))})"
    except RecursionError:
        return None, "is nested too deeply to be a result"
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        return None, f"is not valid JSON ({str(e).splitlines()[0]})" if text.strip() else "is empty"
    version = res.get("score_version") if isinstance(res, dict) else None
    if _is_count(version) and version != SCORE_VERSION:
        return None, None  # another scoring's numbers: scored again, not damaged
    why = check_result(res)
    return (None, why) if why else (res, None)


class _TooLarge(ValueError):
    """A JSON number literal beyond a float's range (``1e999``), which would read as inf."""


def _parse_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise _TooLarge(literal)
    return value


def read_result(path: Path) -> dict[str, Any] | None:
    """A finished run's result, or None if it is missing, damaged or of an older scoring.

    Args:
        path: the run's ``result.json``.

    Returns:
        The result, or None.
    """
    return load_result(path)[0]


def nonfinite_fields(res: dict[str, Any]) -> list[str]:
    """The accuracies of a result that are not finite numbers (what a diverged run measures).

    Args:
        res: a result that :func:`check_result` accepts.

    Returns:
        Each as ``test top-1 not a number`` or ``few-shot mean infinite``.
    """
    fields = (("test top-1", res.get("test_top1")), ("minival top-1", res.get("minival_top1")),
              ("few-shot mean", (res.get("fewshot") or {}).get("mean")))  # fmt: skip
    return [
        f"{name} {'not a number' if math.isnan(value) else 'infinite'}"
        for name, value in fields
        if isinstance(value, float) and not math.isfinite(value)
    ]


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


# -- stopping on a signal --------------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_SECONDS = 5.0  # how long runs told to stop may take before they are killed


class Interrupted(KeyboardInterrupt):
    """The suite was stopped by SIGINT (Ctrl-C) or SIGTERM. Finished runs are kept; the runs that
    were training stopped where they were and resume from their last checkpoint on the next call.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
        finished: runs of the suite with a result when it stopped (None if it stopped before the
            runner looked).
        total: runs the suite asked for (None likewise).

    Args:
        signal_name: the signal that stopped the suite.
    """

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.finished: int | None = None
        self.total: int | None = None


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (a signal
    the process was started to ignore stays ignored). Outside the main thread it does nothing.

    Yields:
        Nothing; the previous handlers are back on leaving.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _raise_interrupted)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back in this thread, delivered on leaving (to the handlers of
    :func:`stop_on_signals`): a process started inside is registered before a stop can look."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _signal_run(pid: int, sig: int) -> None:
    """Send ``sig`` to a run's process and every process it started (its process group)."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError, AttributeError):
        pass  # its group is gone (its own process may still be a zombie), or no process groups here
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _watch_parent(parent: int) -> None:
    """Interrupt this process if the suite's process goes away (killed with SIGKILL): a run must
    not go on training into a folder that the next call resumes."""
    if hasattr(signal, "pthread_sigmask"):  # signals go to the main thread, which may be waiting on a read
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGINT)
            return


def _worker(fd: int, threads: int) -> None:
    """A run process (``python -c``, started by :class:`_Processes` in a process group of its
    own, so a terminal's Ctrl-C reaches the suite's process alone, which stops the runs itself).
    It trains and scores the runs the suite sends over the socket ``fd``, one at a time, answering
    ``("ok", result)`` or ``("error", exception)``; ``None`` or a closed socket ends it. SIGINT to
    its group stops the run as Ctrl-C would stop ``vitkit train``: from its last checkpoint on.

    Args:
        fd: its end of the socket pair.
        threads: torch's intra-op threads.
    """
    code = 1
    conn = Connection(fd)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if hasattr(signal, "pthread_sigmask"):  # started while the suite held them back
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        conn.send(("ready", None))  # from now on SIGINT stops it cleanly
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
        _threads(threads)
        while (job := conn.recv()) is not None:
            try:
                res = train_and_score(*job)
            except Exception as e:
                conn.send(("error", _portable(e, job[1])))
            else:
                conn.send(("ok", res))
        code = 0
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()  # the suite names the run whose process ended
    finally:
        # Every file is written and closed by now: leave without the interpreter's teardown of
        # torch, which takes seconds and would hold up a stop.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# A run process imports vitkit from where the suite's process found it (its sys.path, as
# multiprocessing's spawn passes it), then serves runs.
_WORKER = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[3]); "
    "from vitkit.reproduce.runner import _worker; _worker(int(sys.argv[1]), int(sys.argv[2]))"
)
PARALLEL = hasattr(os, "killpg") and os.name == "posix"  # run processes need process groups


def usable_cores() -> int:
    """The CPU cores this process may run on.

    Returns:
        The count of its CPU affinity where the system reports one, else of the machine's cores.
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_jobs(budget: str) -> int:
    """How many runs ``--jobs auto`` trains at once: one a core, each on one thread, for the
    desktop budget on a CPU. Its models are small, so two runs on one thread each train about
    1.2-1.6x more images a second than one run on two threads. The smoke budget's runs last
    seconds (a run process's start-up would dominate), the full budget's models are large, and
    a GPU trains one run at a time: those get 1.

    Args:
        budget: the suite's budget, one of :data:`~vitkit.reproduce.BUDGETS`.

    Returns:
        The number of runs at once, at least 1.
    """
    if budget != "desktop" or not PARALLEL:
        return 1
    import torch

    return 1 if torch.cuda.is_available() else usable_cores()


def resolve_jobs(jobs: int | str, budget: str, report: Callable[[str], None]) -> int:
    """``jobs`` as a number: "auto" becomes :func:`auto_jobs`, said in one line where it trains
    more than one run at once.

    Args:
        jobs: a whole number, or "auto".
        budget: the suite's budget.
        report: called with the line.

    Returns:
        The runs trained at once.

    Raises:
        ValueError: ``jobs`` is neither "auto" nor a whole number.
    """
    if jobs == "auto":
        jobs = auto_jobs(budget)
        if jobs > 1:
            threads = max(1, usable_cores() // jobs)
            report(f"--jobs auto: {jobs} runs at once, {threads} thread{'s' * (threads > 1)} each")
        return jobs
    if not isinstance(jobs, int) or isinstance(jobs, bool):
        raise ValueError(f"jobs must be a whole number or 'auto', got {jobs!r}")
    return jobs


def _portable(e: Exception, run_dir: Path) -> Exception:
    """``e`` as the suite's process can unpickle it (else a :class:`TrainingError` that names the
    run and says what it was), with the run's traceback as a note (``vitkit -v`` shows it)."""
    import pickle
    import traceback

    try:
        pickle.loads(pickle.dumps(e))
    except Exception:
        e = TrainingError(f"{run_dir}: {type(e).__name__}: {e}")
    e.add_note("".join(traceback.format_exception(e)).rstrip())
    return e


@dataclass
class _Process:
    """A run process of the suite and the run it is on (None: idle)."""

    proc: subprocess.Popen[bytes]
    conn: Connection
    job: tuple[Any, ...] | None = None
    started: float = 0.0
    ready: bool = False  # past its start-up: SIGINT stops it cleanly


_PENDING = object()  # no answer yet


class _Processes:
    """``jobs`` run processes fed from a queue. Leaving the ``with`` block by an error or a signal
    stops them at once: no queued run starts, the running ones get SIGINT (their run folders keep
    the last checkpoint, from which the next call resumes) and, after a grace period, SIGKILL."""

    def __init__(self, jobs: int, threads: int) -> None:
        self.jobs, self.threads = jobs, threads
        self.procs: list[_Process] = []

    def __enter__(self) -> _Processes:
        # A signal may be taken by any of this process's threads; its handler runs in the main
        # thread, which may be waiting for a run to answer. The wake-up socket ends that wait.
        self.wake, self._wake_in = socket.socketpair()
        self.wake.setblocking(False)
        self._wake_in.setblocking(False)
        self._old_wake = None
        if threading.current_thread() is threading.main_thread():
            self._old_wake = signal.set_wakeup_fd(self._wake_in.fileno(), warn_on_full_buffer=False)
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: Any) -> None:
        try:
            if kind is None:
                for p in self.procs:
                    with contextlib.suppress(OSError):
                        p.conn.send(None)
                self._join(timeout=STOP_GRACE_SECONDS)
            else:
                for p in self.procs:
                    with contextlib.suppress(Exception):
                        self._receive(p)  # has it said it is ready?
                    # A process still starting has nothing to keep: it is killed. A ready one stops
                    # as Ctrl-C stops a run, leaving its folder to resume from.
                    _signal_run(p.proc.pid, signal.SIGINT if p.ready else signal.SIGKILL)
                    p.conn.close()  # an idle process reads the end of its queue
                with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: kill them now
                    self._join(timeout=STOP_GRACE_SECONDS)
        finally:
            self._kill()
            if self._old_wake is not None:
                signal.set_wakeup_fd(self._old_wake)
            self.wake.close()
            self._wake_in.close()

    def start(self, job: tuple[Any, ...]) -> None:
        """Send ``job`` to an idle process, starting one if fewer than ``jobs`` are running."""
        idle = next((p for p in self.procs if p.job is None), None)
        if idle is None:
            parent, child = socket.socketpair()
            with _signals_held(), child:  # a signal now is handled once the process is in self.procs
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER, str(child.fileno()), str(self.threads), json.dumps(sys.path)],
                    pass_fds=(child.fileno(),),
                    process_group=0,  # its own group from the start: a terminal's Ctrl-C never reaches it
                )
                idle = _Process(proc, Connection(parent.detach()))
                self.procs.append(idle)
        idle.job, idle.started = job, time.perf_counter()
        with contextlib.suppress(OSError):  # the process is gone: wait() reports it
            idle.conn.send(job)

    def busy(self) -> list[_Process]:
        return [p for p in self.procs if p.job is not None]

    def has_room(self) -> bool:
        return len(self.busy()) < self.jobs

    def wait(self) -> list[tuple[_Process, Any]]:
        """Block until a run answers or a process ends: ``(process, message)`` pairs, the message
        None for a process that ended without answering."""
        busy = self.busy()
        ready = set(wait([p.conn for p in busy] + [self.wake], timeout=1.0))
        if self.wake in ready:
            with contextlib.suppress(BlockingIOError):
                self.wake.recv(4096)  # a signal came: its handler runs as this returns
        out = []
        for p in busy:
            if p.conn in ready or p.proc.poll() is not None:
                message = self._receive(p)
                if message is not _PENDING:
                    out.append((p, message))
        return out

    @staticmethod
    def _receive(p: _Process) -> Any:
        """``p``'s next answer without waiting: the message, None if the process ended without
        one, or ``_PENDING``. A ``ready`` message is noted, not returned."""
        try:
            while p.conn.poll():
                message = p.conn.recv()
                if message[0] != "ready":
                    return message
                p.ready = True
        except (EOFError, OSError):
            return None
        return _PENDING if p.proc.poll() is None else None

    def _join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(max(0.0, deadline - time.monotonic()))

    def _kill(self) -> None:
        with _signals_ignored():
            for p in self.procs:
                if p.proc.poll() is None:
                    _signal_run(p.proc.pid, signal.SIGKILL)
                p.proc.wait()
                p.conn.close()
        self.procs.clear()


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored (in the main thread): the last clean-up must not be cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Runner:
    """Runs specs (dependencies first), ``jobs`` at a time, reporting a line per run and an ETA.

    SIGINT (Ctrl-C) or SIGTERM stops it within seconds (:class:`Interrupted`): no queued run
    starts, the running ones stop where they are (their checkpoints resume them bit for bit on the
    next call) and every finished run's ``result.json`` is kept.

    Args:
        suite: the shared settings of the call.
        jobs: the runs trained at once, at least 1.
        report: called with each line to say.

    Raises:
        ValueError: ``jobs`` below 1.
    """

    def __init__(self, suite: Suite, jobs: int = 1, report: Callable[[str], None] = print) -> None:
        if jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {jobs}")
        self.suite, self.jobs, self.report = suite, jobs, report
        self.settings = ScoreSettings.of(suite)
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, specs: list[RunSpec], later_cost: float = 0.0) -> dict[str, dict[str, Any]]:
        """Train and score the runs of ``specs`` that have no result yet.

        Args:
            specs: the runs, each once.
            later_cost: the :meth:`cost` of runs a later call of this method will train (the
                phases not yet planned), counted in the ETA.

        Returns:
            Every run's result by key, finished now or before.

        Raises:
            Interrupted: SIGINT or SIGTERM stopped the runs.
        """
        self._later_cost = max(0.0, later_cost)
        with stop_on_signals():
            try:
                return self._run(specs)
            except Interrupted as e:
                e.finished, e.total = self._finished(specs), len(specs)
                raise

    def _finished(self, specs: list[RunSpec]) -> int:
        """How many of ``specs`` have a result on disk (a run process may have written its result
        and been stopped before it said so)."""
        n = 0
        for spec in specs:
            with contextlib.suppress(OSError):
                n += read_result(self.suite.run_dir(spec) / "result.json") is not None
        return n

    def _run(self, specs: list[RunSpec]) -> dict[str, dict[str, Any]]:
        todo = []
        for spec in specs:
            path = self.suite.run_dir(spec) / "result.json"
            res, damaged = load_result(path)
            if res is not None:
                self.results[spec.key] = res
            else:
                if damaged:
                    self.report(
                        f"{path}: {damaged}; the run counts as not finished: it resumes from its checkpoints "
                        "and is scored again"
                    )
                todo.append(spec)
        if specs:
            self.report(f"{len(specs) - len(todo)} of {len(specs)} runs already finished; {len(todo)} to run")
        self._cost_done = self._seconds_done = 0.0
        self._total_cost = sum(self.cost(s) for s in todo)
        self._count, self._total = 0, len(todo)
        for phase in (
            [s for s in todo if s.after is None],
            [s for s in todo if s.after is not None],
        ):
            self._run_phase(phase)
        return self.results

    def train_flops(self, spec: RunSpec) -> float:
        """A run's training FLOPs as its result counts them (3 x forward FLOPs x images), before it runs.

        Args:
            spec: the run; its recipe's model, ``train.steps`` and ``train.batch_size`` are read
                (1 for a missing one).

        Returns:
            3 x the model's forward FLOPs per image x steps x batch size.
        """
        from ..models.flops import resnet_flops, vit_flops
        from ..models.registry import model_config

        m, t = spec.recipe["model"], spec.recipe.get("train", {})
        over = {**m.get("overrides", {}), "in_chans": self.suite.info.in_chans,
                "num_classes": self.suite.info.num_classes}  # fmt: skip
        cfg = model_config(m["name"], **over)
        flops = resnet_flops(cfg) if hasattr(cfg, "units") else vit_flops(cfg)
        return 3.0 * float(flops) * int(t.get("steps", 1)) * int(t.get("batch_size", 1))

    def cost(self, spec: RunSpec) -> float:
        """Relative cost of a run, for the ETA.

        Args:
            spec: the run.

        Returns:
            Its model's forward FLOPs x the images it trains on, plus a constant for start-up and scoring.
        """
        from ..models.flops import resnet_flops, vit_flops
        from ..models.registry import model_config

        m, t = spec.recipe["model"], spec.recipe.get("train", {})
        cfg = model_config(m["name"], **{**m.get("overrides", {}), "in_chans": self.suite.info.in_chans})
        flops = resnet_flops(cfg) if hasattr(cfg, "units") else vit_flops(cfg)
        return float(flops) * int(t.get("steps", 1)) * int(t.get("batch_size", 1)) + 1e9

    def longest_first(self, specs: list[RunSpec]) -> list[RunSpec]:
        """The order runs start in when several train at once: the costliest first (:meth:`cost`;
        equals keep their order), so that the phase does not end on one long run with the other
        cores idle.

        Args:
            specs: the runs of a phase.

        Returns:
            The same runs, costliest first.
        """
        return sorted(specs, key=lambda s: -self.cost(s))

    def _init_from(self, spec: RunSpec) -> str | None:
        if spec.after is None:
            return None
        return str((self.suite.out / "runs" / spec.after / "best.safetensors").resolve())

    def _run_phase(self, specs: list[RunSpec]) -> None:
        if not specs:
            return
        if self.jobs > 1 and not PARALLEL:
            self.report(f"--jobs {self.jobs}: runs go one at a time on this system (no process groups)")
            self.jobs = 1
        at_once = min(self.jobs, len(specs))  # what each result records beside its wall time
        args = [(s, self.suite.run_dir(s), self._init_from(s), self.settings, at_once) for s in specs]
        if self.jobs == 1:  # in this process: a signal interrupts the training where it is
            for a in args:
                start = time.perf_counter()
                self._done(a[0], train_and_score(*a), time.perf_counter() - start)
            return
        order = {s.key: i for i, s in enumerate(self.longest_first(specs))}
        queue = deque(sorted(args, key=lambda a: order[a[0].key]))
        threads = max(1, usable_cores() // self.jobs)
        with _Processes(self.jobs, threads) as procs:
            while queue or procs.busy():
                while queue and procs.has_room():
                    procs.start(queue.popleft())
                for p, message in procs.wait():
                    job, p.job = p.job, None
                    assert job is not None
                    if message is None:
                        raise TrainingError(
                            f"{job[1]}: the run's process ended (exit code {p.proc.returncode}) before the run "
                            "finished; run the same command again to resume it"
                        )
                    kind, payload = message
                    if kind == "error":
                        raise payload
                    self._done(job[0], payload, (time.perf_counter() - p.started) / self.jobs)

    def _done(self, spec: RunSpec, res: dict[str, Any], seconds: float) -> None:
        self.results[spec.key] = res
        self._count += 1
        self._cost_done += self.cost(spec)
        self._seconds_done += seconds
        left = (self._total_cost + self._later_cost - self._cost_done) * self._seconds_done / max(self._cost_done, 1.0)
        fs = res["fewshot"]
        bad = nonfinite_fields(res)
        numbers = (
            f"diverged ({', '.join(bad)})"
            if bad
            else f"test top-1 {100 * res['test_top1']:.2f}%, {fs['shots']}-shot {100 * fs['mean']:.2f}%"
        )
        self.report(
            f"[{self._count}/{self._total}] {spec.label}: {numbers} ({res['wall_seconds']:.0f} s); "
            f"ETA {_duration(left)}"
        )


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = [
    "SCORE_VERSION",
    "Interrupted",
    "Runner",
    "ScoreSettings",
    "auto_jobs",
    "check_fewshot_data",
    "check_result",
    "fewshot_transfer",
    "load_result",
    "machine_seconds",
    "nonfinite_fields",
    "read_result",
    "resolve_jobs",
    "score",
    "stop_on_signals",
    "usable_cores",
]
