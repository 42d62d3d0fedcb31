"""Recipes: YAML files with ``--set key=value`` overrides, validated against dataclasses.

Unknown keys are an error that suggests the close ones; the resolved recipe is saved with every
run (``config.yaml``), so a run folder always says exactly what produced it.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import RecipeError


@dataclass
class ModelSection:
    name: str = "vit_s16"  # any registered name; the fields below override its config
    overrides: dict[str, Any] = field(default_factory=dict)
    init_from: str | None = None  # weights to start from (fine-tuning): any format load_pretrained reads
    init: str = "default"  # default | mimetic (attention initialisation of a model trained from scratch)
    pos_embed_mode: str = "bilinear"  # how position embeddings are resized when init_from's size differs


@dataclass
class DataSection:
    name: str = "fashion-mnist"  # --data: fashion-mnist, mnist, cifar10, cifar100, synthetic, a folder, shards
    train_split: str = "train"
    eval_split: str = "test"
    num_workers: int = 0
    eval_max_images: int | None = None
    minival: float = 0  # training images held out as the split "minival" (a count, or a fraction)
    subset: float | None = None  # train on a class-balanced subset of the rest (a count or a fraction)
    subset_seed: int = 0  # fixes which images the minival and the subsets take (nested subsets)
    options: dict[str, Any] = field(default_factory=dict)  # passed to the source (e.g. load_size)


@dataclass
class AugmentSection:
    crop: str = "inception"  # inception | pad | none
    pad: int = 4
    flip: bool = True
    area_min: float = 0.05
    eval_crop: float = 1.0


@dataclass
class OptimSection:
    name: str = "adamw"  # adamw | adam | sgd
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.1  # decoupled (AdamW); on weight matrices only
    schedule: str = "cosine"  # cosine | linear | constant
    warmup_steps: int = 0
    min_lr: float = 0.0


@dataclass
class TrainSection:
    steps: int = 1000
    batch_size: int = 128  # global batch (all processes, all accumulation micro-steps)
    accum_steps: int = 1
    precision: str = "fp32"  # fp32 | bf16 (autocast, fp32 weights)
    compile: bool = False
    grad_clip: float = 1.0  # global norm; 0 disables
    label_smoothing: float = 0.0
    loss: str = "softmax"  # softmax | sigmoid
    head_bias_init: float | None = None  # default: 0 (softmax) / -log(K) (sigmoid)
    ema_decay: float = 0.0  # Polyak averaging of the weights; 0 disables
    on_nonfinite: str = "stop"  # stop | skip
    fsdp: bool = False  # shard parameters with FSDP2 (torch.distributed.fsdp.fully_shard)
    patch_drop: float = 0.0  # fraction of patch tokens dropped per training image (PatchDropout)
    patch_drop_until: float = 1.0  # ... during this fraction of the steps; all tokens afterwards
    attention: str = "auto"  # auto | sdpa | math | recompute (Attention's docstring says which runs where)
    device: str = "auto"  # auto | cpu | cuda | cuda:N


@dataclass
class LogSection:
    log_every: int = 50
    eval_every: int = 500
    checkpoint_every: int = 500
    keep_last: int = 2
    tensorboard: bool = True  # when the tensorboard package is installed
    plot: bool = True


@dataclass
class Recipe:
    """A whole training recipe."""

    description: str = ""
    seed: int = 0
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    augment: AugmentSection = field(default_factory=AugmentSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    log: LogSection = field(default_factory=LogSection)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["optim"]["betas"] = list(self.optim.betas)
        return d


def _section_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if value is None:
        if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in args:
            return None
        raise RecipeError(f"{where}: null is not allowed")
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except RecipeError:
                continue
        raise RecipeError(f"{where}: {value!r} does not fit {hint}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise RecipeError(f"{where}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise RecipeError(f"{where}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except ValueError:
            raise RecipeError(f"{where}: expected an integer, got {value!r}") from None
        if f != int(f):
            raise RecipeError(f"{where}: expected an integer, got {value!r}")
        return int(f)
    if hint is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise RecipeError(f"{where}: expected a number, got {value!r}") from None
    if hint is str:
        return str(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise RecipeError(f"{where}: expected {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if origin is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise RecipeError(f"{where or 'recipe'}: expected a mapping, got {data!r}")
    types = _section_types(cls)
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in types:
            close = difflib.get_close_matches(key, list(types), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(types)}"
            raise RecipeError(f"unknown recipe key {path!r}{hint}")
        hint = types[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value or {}, path)
        else:
            kwargs[key] = _coerce(value, hint, path)
    return cls(**kwargs)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise RecipeError(f"--set {dotted}: {p} is not a section")
    node[parts[-1]] = value


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    """``["train.steps=100", "model.overrides.depth=4"]`` -> [(key, YAML-parsed value)]."""
    out = []
    for item in items:
        if "=" not in item:
            raise RecipeError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        out.append((key.strip(), yaml.safe_load(raw) if raw.strip() else ""))
    return out


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def find_recipe(name: str | Path) -> Path:
    """A recipe path, or the name of one shipped with vitkit (``fmnist_vit`` or ``fmnist_vit.yaml``,
    also under a sub-folder: ``reproduce/pos_embed``)."""
    p = Path(name)
    if p.is_file():
        return p
    for cand in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if cand.is_file():
            return cand
    shipped = ", ".join(
        sorted(q.relative_to(CONFIG_DIR).with_suffix("").as_posix() for q in CONFIG_DIR.rglob("*.yaml"))
    )
    raise RecipeError(f"recipe {str(name)!r} not found (a YAML path, or one of: {shipped})")


def load_recipe(path: str | Path | None = None, sets: list[tuple[str, Any]] | None = None) -> Recipe:
    """Read a YAML recipe (or the defaults) and apply ``sets`` (dotted keys)."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except OSError as e:
            raise RecipeError(f"{p}: cannot read the recipe ({e.strerror})") from None
        except yaml.YAMLError as e:
            raise RecipeError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(tree, dict):
            raise RecipeError(f"{p}: a recipe is a mapping of sections")
    for key, value in sets or []:
        _set_path(tree, key, value)
    return _build(Recipe, tree, "")


def recipe_from_dict(d: dict[str, Any]) -> Recipe:
    return _build(Recipe, d, "")


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)


def diff_recipes(a: Recipe, b: Recipe) -> list[str]:
    """Dotted keys whose values differ."""

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(d, dict):
            out = {}
            for k, v in d.items():
                out.update(flat(v, f"{prefix}{k}."))
            return out
        return {prefix[:-1]: d}

    fa, fb = flat(a.to_dict()), flat(b.to_dict())
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
