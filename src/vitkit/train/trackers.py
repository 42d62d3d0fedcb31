"""Opt-in experiment trackers on the loop's event stream (``log.trackers``):

- ``tensorboard``: TensorBoard event files under ``<run>/tb`` (also on by ``log.tensorboard``);
- ``mlflow``: an MLflow run in the tracking store ``MLFLOW_TRACKING_URI`` names, by default a
  local SQLite file ``<run>/mlflow.db`` (no server) with its artifacts in ``<run>/mlflow-artifacts``
  (never the working directory's ``mlruns``): the recipe as parameters, the curves as metrics, the
  run folder's summary and card as artifacts at the end;
- ``wandb``: a Weights & Biases run in offline mode (``WANDB_MODE`` unless set otherwise) under
  ``<run>/wandb``, to upload later with ``wandb sync``.

Each tracker runs on a thread of its own behind a bounded queue (:class:`~vitkit.train.events.Background`),
on the main process only: a tracker that is slow or fails is switched off with a warning and never
stops or slows the run. A tracker whose package is not installed is refused before the run starts.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import RecipeError
from .events import END, Background, Event, Sink, TensorBoard

TRACKERS = ("tensorboard", "mlflow", "wandb")
_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def check_trackers(names: tuple[str, ...]) -> None:
    """Refuse a tracker whose package is not installed, before the run starts.

    Args:
        names: the recipe's ``log.trackers``.

    Raises:
        RecipeError: a tracker's package is missing (the line says how to install it).
    """
    for name in names:
        package = _PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            pip = "mlflow-skinny sqlalchemy alembic" if name == "mlflow" else package
            raise RecipeError(f"log.trackers: {name} needs the {package} package (pip install {pip})")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:500]  # MLflow caps a parameter's value
    return out


class MLflow(Sink):
    """An MLflow run (see the module's docstring).

    Args:
        out: the run folder.
        recipe: the recipe as plain data (logged as parameters).
        files: the run folder's files to attach at the end, when they exist.
    """

    def __init__(self, out: Path, recipe: dict[str, Any], files: tuple[str, ...]) -> None:
        self.out, self.recipe, self.files = out, recipe, files
        self.mlflow: Any = None
        self.run: Any = None

    def _start(self) -> None:
        import mlflow

        self.mlflow = mlflow
        given = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(given or f"sqlite:///{(self.out / 'mlflow.db').resolve()}")
        experiment = self.out.resolve().parent.name or "vitkit"
        if not given and mlflow.get_experiment_by_name(experiment) is None:
            # a SQLite store keeps artifacts under ./mlruns unless told: keep them in the run folder
            artifacts = (self.out / "mlflow-artifacts").resolve().as_uri()
            mlflow.create_experiment(experiment, artifact_location=artifacts)
        mlflow.set_experiment(experiment)
        self.run = mlflow.start_run(run_name=self.out.name)
        mlflow.log_params(_flat(self.recipe))

    def on_event(self, event: Event) -> None:
        """Take one event (see :meth:`Sink.on_event`).

        Args:
            event: what happened.
        """
        if self.run is None:
            self._start()
        if event.kind == END:
            for name in self.files:
                if (self.out / name).is_file():
                    self.mlflow.log_artifact(str(self.out / name))
            return
        scalars = event.scalars()
        if scalars:
            self.mlflow.log_metrics(scalars, step=event.step)

    def close(self) -> None:
        """The run ended: flush and let go (see :meth:`Sink.close`)."""
        if self.run is not None:
            self.mlflow.end_run()


class Wandb(Sink):
    """A Weights & Biases run, offline unless ``WANDB_MODE`` says otherwise.

    Args:
        out: the run folder.
        recipe: the recipe as plain data (the run's config).
    """

    def __init__(self, out: Path, recipe: dict[str, Any]) -> None:
        self.out, self.recipe = out, recipe
        self.run: Any = None

    def on_event(self, event: Event) -> None:
        """Take one event (see :meth:`Sink.on_event`).

        Args:
            event: what happened.
        """
        if self.run is None:
            import wandb

            mode = os.environ.get("WANDB_MODE", "offline")
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "vitkit"),
                name=self.out.name,
                dir=str(self.out),
                config=self.recipe,
                mode=mode,
                reinit="create_new",
            )
        if event.kind != END and event.scalars():
            self.run.log(event.scalars(), step=event.step)

    def close(self) -> None:
        """The run ended: flush and let go (see :meth:`Sink.close`)."""
        if self.run is not None:
            self.run.finish()


def build_trackers(
    names: tuple[str, ...], out: Path, recipe: dict[str, Any], warn: Callable[[str], None]
) -> list[Sink]:
    """The sinks of the recipe's trackers, each behind its own thread (TensorBoard writes local
    files and runs in line).

    Args:
        names: the recipe's ``log.trackers`` (and "tensorboard" when ``log.tensorboard``).
        out: the run folder.
        recipe: the recipe as plain data.
        warn: says a warning (a tracker that failed or fell behind).

    Returns:
        The sinks, in the order named, each tracker once.
    """
    sinks: list[Sink] = []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            sinks.append(TensorBoard(out))
        elif name == "mlflow":
            files = ("summary.json", "README.md", "epochs.csv", "curves.png", "best.safetensors")
            sinks.append(Background(MLflow(out, recipe, files), "mlflow", warn))
        elif name == "wandb":
            sinks.append(Background(Wandb(out, recipe), "wandb", warn))
    return sinks


__all__ = ["TRACKERS", "MLflow", "Wandb", "build_trackers", "check_trackers"]
