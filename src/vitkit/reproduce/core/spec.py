"""What a reproduction runs: the experiments' YAML files, a budget, the data, and one spec per run.

Every experiment is a YAML file under ``configs/reproduce/`` that says which figure or table it
follows; ``common.yaml`` holds the recipe, the models and the budgets they all share. A budget
(``smoke``, ``desktop``, ``full``) picks the sizes; its keys override the experiment's.

A run is named by its recipe: its folder under ``OUT/runs/`` is the model's label and a hash of
the whole resolved recipe. Two experiments that need the same training (the compute study's
800-step ViT is the position-embedding study's learned 1-D ViT) share one folder, and
running the suite again finds every finished run where it left it.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data.carve import image_count
from ...errors import DataError, UsageError
from ...train.config import CONFIG_DIR, read_yaml_mapping, recipe_from_dict
from ..names import BUDGETS, EXPERIMENTS

REPRODUCE_DIR = CONFIG_DIR / "reproduce"


def check_experiments(names: list[str]) -> list[str]:
    """The experiments asked for, in the suite's order (all when none); a wrong name is a
    :class:`UsageError` that suggests the close ones.

    Args:
        names: experiment names (``data-scaling``, ``compute``, ...), in any order; empty for all.

    Returns:
        The names asked for, each once, in the order of :data:`EXPERIMENTS`.

    Raises:
        UsageError: a name is not an experiment.
    """
    for name in names:
        if name not in EXPERIMENTS:
            close = difflib.get_close_matches(name, EXPERIMENTS, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"unknown experiment {name!r}{hint} (experiments: {', '.join(EXPERIMENTS)})")
    return [e for e in EXPERIMENTS if e in names] if names else list(EXPERIMENTS)


def _read_yaml(path: Path) -> dict[str, Any]:
    return read_yaml_mapping(path, "reproduction config", UsageError)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, mappings merged key by key, anything else replaced.

    Args:
        base: the mapping underneath.
        top: the mapping whose values win.

    Returns:
        A new mapping (deep copies: neither argument is changed).
    """
    out = copy.deepcopy(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def budget_view(tree: dict[str, Any], budget: str) -> dict[str, Any]:
    """A config file as one budget sees it: the budget's keys over the file's. ``models``
    entries are replaced whole (a budget names other models, not other overrides of these);
    ``recipe`` and ``set`` merge.

    Args:
        tree: a reproduction config file's contents, with its ``budgets`` section.
        budget: the budget's name (``smoke``, ``desktop``, ``full``); a budget the file does not
            name changes nothing.

    Returns:
        The file's tree without ``budgets``, with that budget's keys over it.
    """
    over = dict((tree.get("budgets") or {}).get(budget) or {})
    out = {k: v for k, v in tree.items() if k != "budgets"}
    models = over.pop("models", None)
    out = deep_merge(out, over)
    if isinstance(models, dict):
        out["models"] = {**out.get("models", {}), **copy.deepcopy(models)}
    elif models is not None:
        out["models"] = models  # a list of labels (an experiment's choice of models)
    return out


def load_experiment(name: str, budget: str) -> dict[str, Any]:
    """An experiment's config file as one budget sees it (:func:`budget_view`).

    Args:
        name: the experiment (``pos-embed`` reads ``configs/reproduce/pos_embed.yaml``).
        budget: the budget's name.

    Returns:
        The experiment's tree with the budget's keys over it.

    Raises:
        UsageError: the file cannot be read, or is not a YAML mapping.
    """
    return budget_view(_read_yaml(REPRODUCE_DIR / f"{name.replace('-', '_')}.yaml"), budget)


@dataclass(frozen=True)
class DataInfo:
    """What the suite needs to know of the training data before it plans a run.

    Attributes:
        name: the data's name.
        image_size: the images' (height, width) in pixels.
        in_chans: the images' channels.
        classes: the class names.
        num_train: the images of the training split, before the minival is carved out.
        streaming: whether the images are decoded from files while training (a folder, shards),
            loaded at the models' size.
    """

    name: str
    image_size: tuple[int, int]
    in_chans: int
    classes: list[str]
    num_train: int  # images in the training split, before the minival is carved out
    streaming: bool = False  # decoded from files while training (a folder, shards): loaded at the models' size

    @property
    def num_classes(self) -> int:
        """The number of classes."""
        return len(self.classes)


@dataclass
class RunSpec:
    """One training run: its recipe tree (``model.init_from`` may name another run as ``run:KEY``).

    Attributes:
        label: the run for people: "vit-tiny, 580 images, seed 0".
        model: the model's role in ``common.yaml`` ("vit-tiny").
        recipe: the recipe tree, as a YAML recipe holds it.
        after: the key of the run whose weights this one starts from; None: none.
    """

    label: str  # for people: "vit-tiny, 580 images, seed 0"
    model: str  # the model's role in common.yaml ("vit-tiny")
    recipe: dict[str, Any]
    after: str | None = None  # key of the run whose weights this one starts from

    @property
    def key(self) -> str:
        """The run's name on disk: the model's role and a hash of the recipe, so that the same
        recipe is one run however many experiments ask for it."""
        digest = hashlib.sha1(json.dumps(self.recipe, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.model}-{digest}"


class Suite:
    """The shared settings of one ``vitkit reproduce`` call.

    Args:
        out: the folder of the runs and the report.
        data: the training data (a ``--data`` value).
        budget: one of :data:`BUDGETS`.
        seeds: how many seeds every experiment runs (``--seeds``), at least 1; None: each
            experiment's own default.
        info: what the data is (:class:`DataInfo`).

    Raises:
        UsageError: an unknown budget, or ``seeds`` below 1.
        DataError: too few training images or classes for the budget's minival.
    """

    def __init__(self, out: str | Path, data: str, budget: str, seeds: int | None, info: DataInfo) -> None:
        if budget not in BUDGETS:
            raise UsageError(f"unknown budget {budget!r} (budgets: {', '.join(BUDGETS)})")
        if seeds is not None and seeds < 1:
            raise UsageError(f"--seeds must be at least 1, got {seeds}")
        self.out = Path(out)
        self.data = data
        self.budget = budget
        self.info = info
        self.common = budget_view(_read_yaml(REPRODUCE_DIR / "common.yaml"), budget)
        self.seeds_given = seeds  # --seeds: wins over every experiment's own default
        self.planning = False  # counting runs only (vitkit reproduce --plan): a grid's choice is assumed
        self.seeds = seeds or int(self.common.get("seeds", 1))
        self.img_size = self._img_size()
        self.minival = int(self.common.get("minival", 0))
        if self.minival and self.minival < info.num_classes:
            raise DataError(
                f"{data}: a minival of {self.minival} images cannot hold one of each of {info.num_classes} classes"
            )
        if self.minival >= info.num_train:
            raise DataError(f"{data}: {info.num_train} training images cannot spare a minival of {self.minival}")

    @property
    def num_pool(self) -> int:
        """Training images left for the subsets once the minival is held out."""
        return self.info.num_train - self.minival

    def _img_size(self) -> tuple[int, int]:
        """The models' input size: the data's (capped by ``max_img_size``) or the budget's number,
        in whole multiples of 4 (every model's pixels per token divides it at toy scale)."""
        want = self.common.get("img_size", "auto")
        if want != "auto":
            return (int(want), int(want))
        cap = int(self.common.get("max_img_size", 32))
        h, w = (min(s, cap) // 4 * 4 for s in self.info.image_size)
        if min(h, w) < 8:
            size = "x".join(map(str, self.info.image_size))
            raise DataError(f"{self.data}: images of {size} px are too small for the models (8 px at least)")
        return (h, w)

    def model_section(self, label: str, **overrides: Any) -> dict[str, Any]:
        """The recipe's ``model`` section for one of ``common.yaml``'s models, at the suite's input size.

        Args:
            label: the model's role in ``common.yaml`` (``vit-tiny``).
            **overrides: model settings over the entry's own ``overrides`` and the input size.

        Returns:
            ``{"name": ..., "overrides": ...}``.

        Raises:
            UsageError: ``common.yaml`` defines no model ``label``.
        """
        models = self.common.get("models", {})
        if label not in models:
            raise UsageError(f"model {label!r} is not defined in {REPRODUCE_DIR / 'common.yaml'}")
        entry = models[label]
        over = {**(entry.get("overrides") or {}), "img_size": list(self.img_size), **overrides}
        return {"name": entry["name"], "overrides": over}

    def model_title(self, label: str) -> str:
        """The name a report gives a model.

        Args:
            label: the model's role in ``common.yaml``.

        Returns:
            The entry's ``title``, or ``label`` where it has none.
        """
        return str(self.common.get("models", {}).get(label, {}).get("title", label))

    def recipe(
        self,
        model: str,
        seed: int,
        *,
        subset: float | None = None,
        experiment: dict[str, Any] | None = None,
        overrides: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The whole recipe tree of one run: common recipe, the experiment's, the budget's
        ``set`` keys, the model, the data (carved), the seed, and ``extra`` last.

        Args:
            model: the model's role in ``common.yaml``.
            seed: the run's seed; it also draws the minival and the subset.
            subset: the training images to use: a fraction of the pool or a count (None: all).
            experiment: the experiment's config as the budget sees it (its ``recipe`` and ``set``).
            overrides: model settings over the entry's own.
            extra: recipe keys merged over everything else.

        Returns:
            The recipe tree, checked as a recipe.

        Raises:
            UsageError: the model is not defined in ``common.yaml``.
            RecipeError: a key or value of the tree is not a valid recipe.
        """
        experiment = experiment or {}
        tree = deep_merge(self.common.get("recipe", {}), experiment.get("recipe", {}))
        sets = {**(self.common.get("set") or {}), **(experiment.get("set") or {})}
        for key, value in sets.items():  # dotted keys, as --set takes them
            node = tree
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = copy.deepcopy(value)
        tree["model"] = deep_merge(tree.get("model", {}), self.model_section(model, **(overrides or {})))
        tree["data"] = deep_merge(
            tree.get("data", {}),
            {
                "name": self.data,
                "train_split": "train",
                "eval_split": "minival",
                "minival": self.minival,
                "subset": subset,
                "subset_seed": seed,
            },
        )  # fmt: skip  (each seed draws its own minival and subsets; one seed's subsets are nested)
        if self.data_options():
            tree["data"].setdefault("options", {}).update(self.data_options())
        tree["seed"] = seed
        tree = deep_merge(tree, extra or {})
        recipe_from_dict(copy.deepcopy(tree))  # a wrong key or value is an error now, not after an hour
        return tree

    def data_options(self) -> dict[str, Any]:
        """Options of the data source: files are decoded at the models' size (in-memory data needs none).

        Returns:
            ``{"load_size": [h, w]}`` for streaming data, else an empty mapping.
        """
        return {"load_size": list(self.img_size)} if self.info.streaming else {}

    def subset_size(self, size: float) -> int:
        """A subset as an image count: a fraction of the pool, or a count that must fit it.

        Args:
            size: a fraction in (0, 1) of the pool, 1 for all of it, or a whole number of images.

        Returns:
            The number of images.

        Raises:
            DataError: ``size`` is neither, or the count exceeds the pool or is smaller than the
                number of classes.
        """
        n = image_count(size, self.num_pool, "subset")
        if n > self.num_pool:
            raise DataError(
                f"{self.data}: a subset of {n} images is larger than the {self.num_pool} training images "
                f"left after the minival of {self.minival}; use smaller sizes or more data"
            )
        if n < self.info.num_classes:
            raise DataError(
                f"{self.data}: a subset of {n} images cannot hold one of each of {self.info.num_classes} classes"
            )
        return n

    def run_dir(self, spec: RunSpec) -> Path:
        """The folder of a run.

        Args:
            spec: the run.

        Returns:
            ``OUT/runs/KEY``, the key naming the model and a hash of the recipe.
        """
        return self.out / "runs" / spec.key


__all__ = [
    "BUDGETS",
    "EXPERIMENTS",
    "DataInfo",
    "RunSpec",
    "Suite",
    "budget_view",
    "check_experiments",
    "deep_merge",
    "load_experiment",
]
