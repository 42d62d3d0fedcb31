"""``vitkit eval``: top-1/top-5, per-class accuracy and the confusion matrix of a classifier."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError, writing
from ..files import slug
from .common import (
    adapter_argument,
    backend_argument,
    backend_of,
    chosen_backend,
    chosen_precision,
    count,
    describe,
    load_model,
    merge_argument,
    model_arguments,
    naflex_argument,
    naflex_of,
    pct,
    precision_argument,
    progress,
    real,
    size_of,
    with_merging,
)

HELP = "top-1/top-5, per-class accuracy and confusion matrix of a classifier"
MAX_CLASS_ROWS = 50  # longer per-class tables print only the weakest classes


def add_arguments(p: argparse.ArgumentParser) -> None:
    model_arguments(p)
    text = (
        "auto (default): bf16 where this device computes it natively and fast, else fp32; fp32; bf16 (autocast, "
        "or bf16 weights with --serve); int8 (served, CPU only)"
    )
    precision_argument(p, "int8", help=text)
    backend_argument(p)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    p.add_argument("--serve", action="store_true", help="evaluate the model as prepare_inference serves it")
    p.add_argument("--calib", type=count(0), default=512, help="int8: images that calibrate static scales (0: dynamic)")
    p.add_argument("--calib-split", default="train", help="int8: the split the calibration images come from")
    p.add_argument(
        "--smooth",
        type=real(0.0),
        default=None,
        metavar="ALPHA",
        help="static int8: smooth the activations first (SmoothQuant; ALPHA in [0, 1], 0.5 typical)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model (its 10-20 s are in the throughput)")
    merge_argument(p)
    naflex_argument(p)
    p.add_argument("--split", default="test")
    adapter_argument(p)
    p.add_argument("--max-images", type=count(1), default=None, help="a random subset of the split")
    p.add_argument("--out", default=None, help="folder for the confusion matrix (default: RUN/eval or ./eval_out)")
    p.add_argument(
        "--ignore-class-names",
        action="store_true",
        help="score output i as the data's class i, whatever class names the model stores (by default its "
        "outputs are matched to the data's classes by name, and other names are refused)",
    )


def _calibration(model: Any, args: argparse.Namespace) -> list[Any] | None:
    """int8 under a runtime backend: the ``--calib`` images of ``--calib-split`` (None otherwise)."""
    if args.precision != "int8" or backend_of(args) == "torch" or not args.calib:
        return None
    from ..data import build_dataset
    from ..eval import model_inputs

    source = build_dataset(args.data, args.calib_split)
    return [x for x, _ in model_inputs(model, source, batch_size=args.batch_size, max_images=args.calib)]


def _served(model: Any, args: argparse.Namespace) -> Any:
    """The model as ``prepare_inference`` serves it; int8 calibrated on ``--calib`` images of
    ``--calib-split`` (0: dynamic quantisation)."""
    from ..eval import served_model
    from ..inference import onednn_int8_available

    static = args.precision == "int8" and args.calib > 0 and onednn_int8_available()
    calib = args.calib if static else 0
    if args.smooth is not None and args.smooth > 1:
        raise UsageError(f"--smooth: alpha must be in [0, 1], got {args.smooth:g}")
    if args.smooth is not None and not static:
        raise UsageError("--smooth needs static int8: --precision int8 with --calib above 0, on oneDNN's int8 kernels")
    served, used = served_model(
        model, args.precision, args.data, args.calib_split, calib, args.batch_size, args.device, args.smooth
    )
    if static:
        smoothed = f", after smoothing (alpha {args.smooth:g})" if args.smooth is not None else ""
        print(
            f"int8: activation scales calibrated on {used} images of {args.data} {args.calib_split}{smoothed}",
            file=sys.stderr,
        )
    elif args.precision == "int8":
        why = "--calib 0" if not args.calib else "this torch build has no oneDNN int8 kernels"
        print(f"int8: dynamic quantisation (activation scales from each batch; {why})", file=sys.stderr)
    return served


def _class_order(model: Any, dataset: Any, args: argparse.Namespace) -> list[int] | None:
    """Which output of the model scores each of the data's classes: matched by the names the
    checkpoint stores, unless it stores none, the data names none (shards without classes.txt)
    or ``--ignore-class-names``; a reordering is said in one line, other names are refused."""
    from ..eval import class_order, stored_class_names

    stored = None if args.ignore_class_names else stored_class_names(model)
    if stored is None:
        return None
    data = f"{args.data} {args.split}"
    if not getattr(dataset, "classes_named", True):
        if stored != list(dataset.classes):
            print(
                f"note: {data} names no classes ({dataset.classes[0]}... from its labels); output i of "
                f"{args.ckpt} scores label i",
                file=sys.stderr,
            )
        return None
    hint = "--ignore-class-names scores output i as the data's class i"
    order, note = class_order(stored, dataset.classes, model_name=str(args.ckpt), data_name=data, hint=hint)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return order


def _decoding(model: Any, data: str) -> dict[str, Any]:
    """A folder or labels file decoded as the run that made the weights decoded its validation
    images, so that the top-1 is the run's own on the same images."""
    from ..data.labels import is_labels_file
    from ..eval.predict import stored_decoding

    return stored_decoding(model) if Path(data).is_dir() or is_labels_file(data) else {}


def run(args: argparse.Namespace) -> int:
    import torch

    from ..data import build_dataset
    from ..data.labels import is_labels_file
    from ..eval import evaluate, write_confusion_matrix
    from ..eval.predict import stored_thresholds

    args.precision = chosen_precision(args.precision, args.device)  # auto: what this device computes fast
    model = with_merging(load_model(args.ckpt, args.img_size, adapter=args.adapter_weights), args.merge)
    if is_labels_file(args.data) and stored_thresholds(model) is not None:
        return run_multilabel(args, model)
    dataset = build_dataset(args.data, args.split, **_decoding(model, args.data))
    if getattr(dataset, "multilabel", False):
        raise UsageError(
            f"{args.data}: rows with several labels need a multi-label model (trained with train.loss=sigmoid on "
            f"a labels file); {args.ckpt} picks one class an image"
        )
    order = _class_order(model, dataset, args)
    precision, mode = args.precision, "autocast" if args.precision == "bf16" else "eager"
    args.naflex = naflex_of(args, model)
    if args.naflex and (args.serve or precision == "int8" or args.compile):
        raise UsageError("--naflex runs vitkit's eager path; leave out --serve, --precision int8 and --compile")
    if args.compile and backend_of(args) not in ("torch", "auto"):
        raise UsageError(f"--compile compiles vitkit's own path; --backend {args.backend} runs a runtime instead")
    runner = chosen_backend(args, model, precision, _calibration(model, args))
    if runner is not None:
        model, mode, precision = runner, runner.backend, "fp32"  # the runtime carries its precision
    elif args.serve or precision == "int8":
        model, mode = _served(model, args), "served"
        precision = "fp32"  # the served model carries its precision; no autocast around it
    if args.compile and runner is None:
        model, mode = torch.compile(model), f"{mode}, compiled"  # the throughput includes compiling
    if args.naflex:
        mode = f"{mode}, NaFlex: at most {args.naflex} patches an image"
    with progress(f"eval {args.split}", size_of(dataset, args.max_images)) as update:
        m = evaluate(
            model,
            dataset,
            args.batch_size,
            args.device,
            precision,
            max_images=args.max_images,
            progress=update,
            logit_order=order,
            naflex=args.naflex or 0,
        )

    if m["skipped"]:
        examples = "; ".join(m["skipped_examples"][:3])
        print(f"note: skipped {m['skipped']} unreadable image(s), not counted (e.g. {examples})", file=sys.stderr)
    out = Path(args.out) if args.out else Path(args.ckpt) / "eval" if Path(args.ckpt).is_dir() else Path("eval_out")
    stem = f"confusion_{slug(args.data)}_{slug(args.split)}"
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
    try:
        title = f"{args.data} ({args.split}): top-1 {pct(m['top1'])}"
        with writing(out):
            write_confusion_matrix(m["confusion"], m["classes"], out, stem=stem, title=title)
    except ImportError as e:
        print(f"note: {e}; wrote {json_path} only", file=sys.stderr)
        png_path = None
    _print_metrics(m, model, args, mode)
    print(f"\nconfusion matrix: {json_path}" + (f", {png_path}" if png_path else ""))
    if args.json:
        from ..files import write_json

        payload = {**describe(model), "data": args.data, "split": args.split, "precision": args.precision}
        payload["mode"] = mode
        payload["classes_matched"] = "by name" if order is not None else "by position"
        payload.update({k: v for k, v in m.items() if k != "confusion"})
        payload["confusion_json"] = str(json_path)
        payload["confusion_png"] = str(png_path) if png_path else None
        with writing(args.json):
            write_json(args.json, payload)
    return 0


def run_multilabel(args: argparse.Namespace, model: Any) -> int:
    """``vitkit eval`` of a multi-label model on a labels file: every row of the file is scored;
    mAP (macro, micro, and the label-frequency baseline), and F1 at the thresholds the model
    stored (chosen on its minival, never on this file).

    Args:
        args: the parsed command line (``--data`` is the labels file).
        model: the loaded multi-label model.

    Returns:
        The exit status.
    """
    from ..data.labels import LabelsFile
    from ..eval.multilabel import evaluate_multilabel
    from ..eval.predict import stored_class_names, stored_thresholds

    classes = stored_class_names(model)
    if classes is None:
        raise UsageError(f"{args.ckpt}: a multi-label model must store its class names to score a labels file")
    size = model.cfg.img_size
    dataset = LabelsFile(args.data, "test", classes=classes, multilabel=True, load_size=tuple(size))
    with progress("eval", size_of(dataset, args.max_images)) as update:
        m = evaluate_multilabel(
            model, dataset, args.batch_size, args.device, args.precision, max_images=args.max_images,
            thresholds=stored_thresholds(model), progress=update,
        )  # fmt: skip
    print(f"checkpoint   {model.load_report.path} ({model.load_report.source})")
    print(f"data         {args.data}: {m['num_images']} images, {len(classes)} labels")
    print(f"mAP          {pct(m['map_macro'])} macro, {pct(m['map_micro'])} micro")
    print(f"baseline     {pct(m['baseline_map_macro'])} mAP (each label scored by its frequency)")
    print(f"F1           {pct(m['f1_macro'])} macro, at the thresholds chosen on the model's minival")
    width = max(12, *(len(r["class"]) for r in m["per_class"]))
    print(f"\n{'label':<{width}}  {'images':>7}  {'AP':>8}  {'precision':>9}  {'recall':>8}  {'F1':>8}")
    for r in m["per_class"]:
        cells = [pct(r.get(k)) for k in ("ap", "precision", "recall", "f1")]
        ap, precision, recall, f1 = cells
        print(f"{r['class']:<{width}}  {r.get('support', 0):>7}  {ap:>8}  {precision:>9}  {recall:>8}  {f1:>8}")
    if args.json:
        from ..files import write_json

        payload = {**describe(model), "data": args.data, "precision": args.precision, "multilabel": True, **m}
        with writing(args.json):
            write_json(args.json, payload)
    return 0


def _print_metrics(m: dict[str, Any], model: Any, args: argparse.Namespace, mode: str) -> None:
    print(f"checkpoint   {model.load_report.path} ({model.load_report.source})")
    print(f"data         {args.data} {args.split}: {m['num_images']} images, {m['num_classes']} classes")
    print(f"top-1        {pct(m['top1'])}")
    print(f"top-5        {pct(m['top5'])}")
    print(f"per-class    {pct(m['mean_per_class'])} (mean over classes)")
    print(f"throughput   {m['images_per_s']:.1f} images/s ({args.device}, {args.precision} {mode}, data included)")
    rows = m["per_class"]
    if len(rows) > MAX_CLASS_ROWS:
        print(f"\n{MAX_CLASS_ROWS // 5} weakest of {len(rows)} classes (all of them in the JSON):")
        scored = [r for r in rows if r["accuracy"] is not None]
        rows = sorted(scored, key=lambda r: r["accuracy"])[: MAX_CLASS_ROWS // 5]
    width = max(12, *(len(r["class"]) for r in rows))
    print(f"\n{'class':<{width}}  {'images':>7}  {'top-1':>8}")
    for r in rows:
        print(f"{r['class']:<{width}}  {r['count']:>7}  {pct(r['accuracy']):>8}")
