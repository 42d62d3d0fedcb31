"""What the commands share: argument types, loading a model or a dataset with its notes printed,
a progress bar, and number formatting. Nothing here imports torch at module level."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

WEIGHTS_HELP = (
    "weights: vitkit .safetensors, a run folder, official .npz, timm or HF files, or a name "
    "(vitkit models --pretrained), hf-hub:org/name, gs:// or https:// address, downloaded once"
)


def parse_size(text: str) -> int | tuple[int, int]:
    """``224`` or ``384x512`` (height x width), each side positive."""
    try:
        if "x" in text.lower():
            h, w = text.lower().split("x")
            size: int | tuple[int, int] = (int(h), int(w))
        else:
            size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or HxW, got {text!r}") from None
    if min(size if isinstance(size, tuple) else (size,)) < 1:
        raise argparse.ArgumentTypeError(f"sides must be positive, got {text!r}")
    return size


def count(minimum: int = 1, maximum: int = 1_000_000_000) -> Callable[[str], int]:
    """An argument type: a whole number from ``minimum`` to ``maximum``. argparse names the flag in
    the one-line error, so every numeric option is checked where it is read, not deep in a command
    (where a count of billions would become an allocation that fails, or a loop that never ends).

    Args:
        minimum: the smallest value accepted.
        maximum: the largest value accepted.

    Returns:
        The parser argparse calls with the flag's text.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, got {value:,}")
        return value

    parse.__name__ = "count"
    return parse


def count_or_auto(minimum: int = 1, maximum: int = 1_000_000_000) -> Callable[[str], int | str]:
    """An argument type: "auto" (the command decides) or a whole number as :func:`count` checks it.

    Args:
        minimum: the smallest number accepted.
        maximum: the largest number accepted.

    Returns:
        The parser argparse calls with the flag's text: "auto" or the number.
    """
    number = count(minimum, maximum)

    def parse(text: str) -> int | str:
        if text == "auto":
            return text
        if not text.strip().lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"expected auto or a whole number, got {text[:40]!r}")
        return number(text)

    parse.__name__ = "count_or_auto"
    return parse


def index(text: str) -> int:
    """An argument type: a position in a sequence, negative counting from the end (``-1``: the
    last layer); the command checks it against the model."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number (negative counts from the end), got {text!r}"
        ) from None


def real(minimum: float = float("-inf"), above: float | None = None) -> Callable[[str], float]:
    """An argument type: a finite number, at least ``minimum`` (or greater than ``above``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"must be greater than {above:g}, got {value:g}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {value:g}")
        return value

    parse.__name__ = "number"
    return parse


def parse_device(text: str) -> str:
    """An argument type: ``cpu``, ``cuda`` or ``cuda:N`` that this torch can run on (checked when
    the command line is read, not when the first tensor moves; :func:`vitkit.cpu.device_problem`
    names any other device, ``mps`` included, in one line)."""
    if text == "cpu":  # the default: no need to load torch (seconds) to know it
        return text
    from ..cpu import device_problem

    problem = device_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


_ADDRESSES = ("hf-hub:", "gs://", "https://", "http://")
_WEIGHT_SUFFIXES = (".safetensors", ".npz", ".bin", ".pth", ".pt", ".onnx", ".pt2")
_PATH_STARTS = ("/", "./", "../", "~")


def _surely_a_path(text: str, suffixes: tuple[str, ...]) -> bool:
    """Whether ``text`` can only be a path (not a weights or data set name): it ends in one of
    ``suffixes``, starts as a path does, or names a file in a folder that exists."""
    if text.startswith(_ADDRESSES) or any(c in text for c in "{}*?["):
        return False
    if text.lower().endswith(suffixes) or text.startswith(_PATH_STARTS):
        return True
    parent = os.path.dirname(text)
    return bool(parent) and os.path.isdir(parent)


def check_paths(args: argparse.Namespace) -> None:
    """Refuse a path argument that names nothing, before the command loads torch (which takes
    seconds): weights (a file or run folder, where the text cannot be a weights name), image
    files, folders, embedding files, a recipe file and a data folder.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: the first path that does not exist, named.
    """
    from ..errors import UsageError

    def missing(value: object, suffixes: tuple[str, ...] | None) -> bool:
        if not isinstance(value, str) or not value or os.path.exists(os.path.expanduser(value)):
            return False
        return suffixes is None or _surely_a_path(value, suffixes)

    for dest in ("ckpt", "src", "init_from"):
        if missing(value := getattr(args, dest, None), _WEIGHT_SUFFIXES):
            raise UsageError(f"{value}: no such file or folder")
    for dest, what in (("images", "image file"), ("folder", "folder")):
        values = getattr(args, dest, None)
        for value in [values] if isinstance(values, str) else values or []:
            if missing(value, None):
                raise UsageError(f"{value}: no such {what}")
    for dest in ("train_embeddings", "test_embeddings"):
        if missing(value := getattr(args, dest, None), None):
            raise UsageError(f"{value}: no such embeddings file")
    if missing(value := getattr(args, "config", None), (".yaml", ".yml")):
        raise UsageError(f"{value}: no such recipe file")
    if missing(value := getattr(args, "data", None), (".tar",)):
        raise UsageError(f"{value}: no such data folder or file")


def note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


ADAPTER_HELP = (
    "LoRA/DoRA adapters (an adapter .safetensors file written by a fine-tune) to apply onto the weights "
    "they were trained on; refused for other weights"
)


def adapter_argument(p: argparse.ArgumentParser) -> None:
    """``--adapter-weights FILE``: adapters to apply onto the loaded base weights."""
    p.add_argument("--adapter-weights", metavar="FILE", default=None, help=ADAPTER_HELP)


def load_model(
    path: str, img_size: Any = None, adapter: str | None = None, merge: bool = False, **overrides: Any
) -> Any:
    """``vitkit.load_pretrained`` (files and names) with a download bar and its notes (resized
    embeddings, dropped head) on stderr; with ``adapter``, the adapters of that file applied onto
    it (merged into plain weights with ``merge``), then the resize to ``img_size``, so that the
    base is checked at the size it was trained at."""
    from ..hub import load_pretrained

    if img_size and not adapter:
        overrides["img_size"] = img_size
    with download_bar(path) as bar:
        model = load_pretrained(path, progress=bar, **overrides)
    for text in model.load_report.notes:
        note(text)
    if adapter:
        from ..checkpoint.adapters import load_adapters

        load_adapters(model, adapter, merge=merge)
        spec = model.adapter_info.spec if hasattr(model, "adapter_info") else None
        what = f"{spec.kind} rank {spec.rank} on {', '.join(spec.targets)}" if spec else "merged"
        note(f"applied adapters {adapter} ({what})")
        if img_size:
            model.set_img_size(img_size)
    return model


@contextmanager
def download_bar(name: str) -> Iterator[Callable[[int, int | None], None]]:
    """A byte bar on stderr while ``name`` downloads: made on the first bytes, so a file already in
    the cache shows none (nor does a stderr that is not a terminal)."""
    from tqdm import tqdm

    bars: list[Any] = []

    def update(done: int, total: int | None) -> None:
        if not bars:
            bars.append(
                tqdm(
                    desc=f"download {name}",
                    total=total,
                    unit="B",
                    unit_scale=True,
                    disable=None,
                    leave=False,
                    file=sys.stderr,
                )
            )
        bars[0].update(done - bars[0].n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()


def size_of(dataset: Any, cap: int | None) -> int | None:
    """How many images a pass over ``dataset`` reads (``cap`` at most); None if unknown."""
    try:
        n = len(dataset)
    except (NotImplementedError, TypeError):
        return cap
    return min(n, cap) if cap else n


@contextmanager
def progress(desc: str, total: int | None, unit: str = "img") -> Iterator[Callable[[int], None]]:
    """A tqdm bar on stderr (silent when stderr is not a terminal); yields its update function."""
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=unit, disable=None, leave=False, file=sys.stderr) as bar:
        yield bar.update


def describe(model: Any) -> dict[str, Any]:
    """Which weights a JSON report is about."""
    return {
        "checkpoint": model.load_report.path,
        "source": model.load_report.source,
        "img_size": list(model.cfg.img_size),
    }


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e9 else f"{x:g}"


def model_arguments(p: argparse.ArgumentParser, data: bool = True) -> None:
    """The checkpoint, data and run arguments that eval, fewshot and probe share."""
    p.add_argument("ckpt", help=WEIGHTS_HELP)
    if data:
        p.add_argument("--data", required=True, help="dataset: fashion-mnist, mnist, synthetic, a folder...")
    p.add_argument("--img-size", type=parse_size, default=None, help="evaluate at this size, N or HxW")
    p.add_argument("--batch-size", type=count(1, 1 << 24), default=256)
    p.add_argument("--device", type=parse_device, default="cpu", help="cpu, cuda, cuda:1...")


def precision_argument(p: argparse.ArgumentParser, *extra: str, help: str | None = None) -> None:
    """``--precision``: auto (the default: bf16 where the device computes it natively and fast,
    fp32 elsewhere), fp32, bf16, and the command's ``extra`` choices."""
    text = help or "auto: bf16 where this device computes it natively and fast, else fp32; fp32; bf16 (autocast)"
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", *extra], default="auto", help=text)


def merge_argument(p: argparse.ArgumentParser) -> None:
    """``--merge R``: token merging (ToMe), R tokens merged in each block."""
    p.add_argument(
        "--merge",
        type=count(0, 4096),
        default=0,
        metavar="R",
        help="token merging (ToMe): merge R patch tokens in each block; faster, a little less accurate (0: off)",
    )


def naflex_argument(p: argparse.ArgumentParser) -> None:
    """``--naflex N``: each image at its own aspect ratio, in at most N patches (NaFlex)."""
    p.add_argument(
        "--naflex",
        type=count(0, 16384),
        default=None,
        metavar="N",
        help="NaFlex: see each image at its own aspect ratio, resized whole to at most N patches, instead of "
        "squashed or cropped to the model's square (models with learned, sin-cos or rotary positions); "
        "default: as the model was trained (its stored preprocessing); 0: squares",
    )


def naflex_of(args: argparse.Namespace, model: Any) -> int | None:
    """The NaFlex budget a command runs with: ``--naflex``, else the model's stored one; 0: none."""
    given = getattr(args, "naflex", None)
    if given is None:
        given = getattr(getattr(model, "preprocessing", None), "naflex", None)
    return given or None


def with_merging(model: Any, r: int) -> Any:
    """``model`` merging ``r`` tokens a block (:func:`vitkit.models.merge.apply_token_merging`), or
    as it is for 0."""
    if not r:
        return model
    from ..models.merge import apply_token_merging

    return apply_token_merging(model, r)


def chosen_precision(requested: str, device: Any) -> str:
    """What ``requested`` computes in on ``device`` ("fp32" or "bf16"; other choices, int8, pass
    through), saying on stderr, once, when an explicit bf16 is emulated here."""
    from ..precision import resolve_precision, take_warning

    if requested not in ("auto", "fp32", "bf16"):
        return requested
    choice = resolve_precision(requested, device)
    warning = take_warning(choice)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return choice.name


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """How fewshot and probe run the model: ``batch_size``, ``device``, ``precision`` (resolved)."""
    precision = chosen_precision(args.precision, args.device)
    return {"batch_size": args.batch_size, "device": args.device, "precision": precision}


def split_arguments(p: argparse.ArgumentParser, max_train: int | None, max_train_help: str) -> None:
    p.add_argument("--train-split", default="train")
    p.add_argument("--test-split", default="test")
    p.add_argument("--max-train", type=count(1), default=max_train, help=max_train_help)
    p.add_argument("--max-test", type=count(1), default=None, help="a random subset of the test split (default: all)")


BACKEND_HELP = (
    "what computes the model on the CPU: auto (the default; VITKIT_BACKEND pins another): whichever of "
    "vitkit's own path and the installed runtimes is fastest here with outputs within tolerance, measured "
    "once per model and machine and recorded beside the weights (vitkit's own where no runtime is "
    "installed); torch: vitkit's own path; openvino or onnxruntime: vitkit's ONNX export run by that package"
)


def backend_argument(p: argparse.ArgumentParser) -> None:
    """``--backend``: auto (the default, or what ``VITKIT_BACKEND`` pins), torch, openvino or
    onnxruntime (:mod:`vitkit.backends`)."""
    p.add_argument("--backend", choices=["auto", "torch", "openvino", "onnxruntime"], default=None, help=BACKEND_HELP)


def backend_of(args: argparse.Namespace) -> str:
    """The backend asked for: ``--backend``, else :func:`vitkit.backends.default_backend` (set on
    ``args`` once, with ``args.backend_given`` saying which)."""
    if getattr(args, "backend", None) is None:
        from ..backends import default_backend

        args.backend, args.backend_given = default_backend(), False
    return args.backend


def chosen_backend(args: argparse.Namespace, model: Any, precision: str, calibration: Any = None) -> Any:
    """The runtime model ``--backend`` asks for (None: vitkit's own path), with what ``auto``
    measured, or read from its record, said on stderr."""
    from ..backends import serving_backend
    from ..errors import UsageError

    backend = backend_of(args)
    asked = getattr(args, "backend_given", True)
    for flag, on in (("--merge", getattr(args, "merge", 0)), ("--naflex", naflex_of(args, model))):
        if on and backend != "torch":
            if asked and backend != "auto":
                raise UsageError(f"{flag} runs on vitkit's own path; --backend {backend} runs a runtime without it")
            return None  # token merging and NaFlex are vitkit's own path
    batch = getattr(args, "max_batch", None) or getattr(args, "batch_size", None)  # what one call computes
    runner, decision = serving_backend(model, backend, precision, args.device, calibration, batch=batch)
    if decision is not None and decision.reason is None:
        speeds = ", ".join(f"{name} {ips:,.1f}" for name, ips in decision.images_per_s.items())
        how = "as recorded in" if decision.cached else "measured now, recorded in"
        measured = f"images/s at batch {decision.batch}: {speeds}"
        note(f"backend auto: {decision.backend} for {precision} ({measured}; {how} {decision.file})")
    elif decision is not None and asked:  # the default says nothing where it changes nothing
        note(f"backend auto: torch ({decision.reason})")
    elif runner is not None:
        note(f"backend {runner.backend} ({precision})")
    return runner
