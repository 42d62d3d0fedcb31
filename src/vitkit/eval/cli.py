"""``vitkit eval | fewshot | probe | predict``: evaluation commands, tables for humans, JSON on request."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from vitkit.cli import _EXTRA_PARSERS, UserError, _parse_size, command

MAX_CLASS_ROWS = 50  # longer per-class tables print only the weakest classes


# ---------------------------------------------------------------------------------------------
# shared helpers


def _load(args: argparse.Namespace) -> Any:
    import vitkit

    overrides = {"img_size": args.img_size} if getattr(args, "img_size", None) else {}
    model = vitkit.load_pretrained(args.ckpt, **overrides)
    for note in model.load_report.notes:
        print(f"note: {note}", file=sys.stderr)
    return model


def _dataset(spec: str, split: str) -> Any:
    from vitkit.data import build_dataset

    return build_dataset(spec, split)


def _size(dataset: Any, cap: int | None) -> int | None:
    try:
        n = len(dataset)
    except (NotImplementedError, TypeError):
        return cap
    return min(n, cap) if cap else n


@contextmanager
def _progress(desc: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A tqdm bar on stderr (silent when stderr is not a terminal); yields its update function."""
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit="img", disable=None, leave=False, file=sys.stderr) as bar:
        yield bar.update


def _features(model: Any, dataset: Any, args: argparse.Namespace, desc: str, max_images: int | None) -> tuple:
    from vitkit.eval import extract_features

    with _progress(desc, _size(dataset, max_images)) as update:
        return extract_features(
            model,
            dataset,
            batch_size=args.batch_size,
            device=args.device,
            precision=args.precision,
            max_images=max_images,
            progress=update,
        )


def _write_json(path: str | Path, payload: Any) -> None:
    from vitkit.checkpoint.io import atomic_write

    atomic_write(Path(path), lambda f: f.write(json.dumps(payload, indent=2)), mode="w")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e9 else f"{x:g}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.") or "data"


def _describe(model: Any) -> dict[str, Any]:
    return {
        "checkpoint": model.load_report.path,
        "source": model.load_report.source,
        "img_size": list(model.cfg.img_size),
    }


# ---------------------------------------------------------------------------------------------
# eval


@command("eval")
def cmd_eval(args: argparse.Namespace) -> int:
    from vitkit.eval import evaluate, write_confusion_matrix

    model = _load(args)
    dataset = _dataset(args.data, args.split)
    precision, mode = args.precision, "autocast" if args.precision == "bf16" else "eager"
    if args.serve or precision == "int8":
        model, mode = _served(model, args), "served"
        precision = "fp32"  # the served model carries its precision; no autocast around it
    if args.compile:
        model, mode = torch.compile(model), f"{mode}, compiled"  # the throughput includes compiling
    with _progress(f"eval {args.split}", _size(dataset, args.max_images)) as update:
        m = evaluate(
            model,
            dataset,
            batch_size=args.batch_size,
            device=args.device,
            precision=precision,
            max_images=args.max_images,
            progress=update,
        )

    if args.out:
        out = Path(args.out)
    else:
        out = Path(args.ckpt) / "eval" if Path(args.ckpt).is_dir() else Path("eval_out")
    stem = f"confusion_{_slug(args.data)}_{_slug(args.split)}"
    title = f"{args.data} ({args.split}): top-1 {_pct(m['top1'])}"
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
    try:
        write_confusion_matrix(m["confusion"], m["classes"], out, stem=stem, title=title)
    except ImportError as e:
        print(f"note: {e}; wrote {json_path} only", file=sys.stderr)
        png_path = None

    print(f"checkpoint   {model.load_report.path} ({model.load_report.source})")
    print(f"data         {args.data} {args.split}: {m['num_images']} images, {m['num_classes']} classes")
    print(f"top-1        {_pct(m['top1'])}")
    print(f"top-5        {_pct(m['top5'])}")
    print(f"per-class    {_pct(m['mean_per_class'])} (mean over classes)")
    print(f"throughput   {m['images_per_s']:.1f} images/s ({args.device}, {args.precision} {mode}, data included)")
    rows = m["per_class"]
    if len(rows) > MAX_CLASS_ROWS:
        print(f"\n{MAX_CLASS_ROWS // 5} weakest of {len(rows)} classes (all of them in the JSON):")
        scored = [r for r in rows if r["accuracy"] is not None]
        rows = sorted(scored, key=lambda r: r["accuracy"])[: MAX_CLASS_ROWS // 5]
    width = max(12, *(len(r["class"]) for r in rows))
    print(f"\n{'class':<{width}}  {'images':>7}  {'top-1':>8}")
    for r in rows:
        print(f"{r['class']:<{width}}  {r['count']:>7}  {_pct(r['accuracy']):>8}")
    print(f"\nconfusion matrix: {json_path}" + (f", {png_path}" if png_path else ""))

    if args.json:
        payload = {**_describe(model), "data": args.data, "split": args.split, "precision": args.precision}
        payload["mode"] = mode
        payload.update({k: v for k, v in m.items() if k != "confusion"})
        payload["confusion_json"] = str(json_path)
        payload["confusion_png"] = str(png_path) if png_path else None
        _write_json(args.json, payload)
    return 0


def _served(model: Any, args: argparse.Namespace) -> Any:
    """The model as ``prepare_inference`` serves it; int8 calibrated on ``--calib`` images of
    ``--calib-split`` (0: dynamic quantisation)."""
    from vitkit.eval import model_inputs
    from vitkit.inference import onednn_int8_available, prepare_inference

    if args.calib < 0:
        raise SystemExit(f"error: --calib must be 0 (dynamic int8) or a number of images, got {args.calib}")
    if args.precision == "int8" and not args.device.startswith("cpu"):
        raise SystemExit(f"error: --precision int8 runs on the CPU's int8 kernels, not on {args.device}")
    calibration = None
    if args.precision == "int8" and args.calib and onednn_int8_available():
        calib_data = _dataset(args.data, args.calib_split)
        calibration = list(model_inputs(model, calib_data, batch_size=args.batch_size, max_images=args.calib))
        n = sum(len(x) for x, _ in calibration)
        print(f"int8: activation scales calibrated on {n} images of {args.data} {args.calib_split}", file=sys.stderr)
    elif args.precision == "int8":
        why = "--calib 0" if not args.calib else "this torch build has no oneDNN int8 kernels"
        print(f"int8: dynamic quantisation (activation scales from each batch; {why})", file=sys.stderr)
    return prepare_inference(model.to(args.device), args.precision, calibration=calibration)


# ---------------------------------------------------------------------------------------------
# fewshot


@command("fewshot")
def cmd_fewshot(args: argparse.Namespace) -> int:
    from vitkit.data import ArrayDataset
    from vitkit.eval import DEFAULT_L2_GRID, fewshot_eval, fewshot_needed_indices

    if min(args.shots) < 1 or args.seeds < 1:
        raise UserError("--shots and --seeds must be positive")
    model = _load(args)
    train = _dataset(args.data, args.train_split)
    test = _dataset(args.data, args.test_split)
    num_classes = train.num_classes
    if isinstance(train, ArrayDataset) and args.max_train is None:
        # Labels are in memory: embed only the examples some (shots, seed) sample uses.
        rows = fewshot_needed_indices(train.labels, args.shots, args.seeds, num_classes)
        subset = train.subset(torch.as_tensor(rows), name=train.name)
        train_x, _ = _features(model, subset, args, f"{args.train_split} features", None)
        train_y = train.labels
    else:
        rows = None
        train_x, train_y = _features(model, train, args, f"{args.train_split} features", args.max_train)
    test_x, test_y = _features(model, test, args, f"{args.test_split} features", args.max_test)
    l2 = list(DEFAULT_L2_GRID) if args.l2_grid else args.l2
    res = fewshot_eval(
        train_x,
        train_y,
        test_x,
        test_y,
        shots=args.shots,
        seeds=args.seeds,
        l2=l2,
        num_classes=num_classes,
        train_rows=rows,
    )

    print(f"checkpoint   {model.load_report.path} ({model.load_report.source})")
    print(
        f"data         {args.data}: {num_classes} classes; samples from {args.train_split}, "
        f"accuracy on {test_x.shape[0]} {args.test_split} images; {train_x.shape[1]} features"
    )
    print(f"few-shot linear accuracy, mean ± std over {args.seeds} seed(s)\n")
    if len(res["l2"]) == 1:
        print(f"{'shots':>5}  {'l2':>8}  {'accuracy':>17}  {'train images':>12}")
        for r in res["results"]:
            acc = f"{100 * r['mean']:.2f} ± {100 * r['std']:.2f}%"
            print(f"{r['shots']:>5}  {_num(r['l2']):>8}  {acc:>17}  {r['train_examples']:>12}")
    else:
        cells = {(r["l2"], r["shots"]): f"{100 * r['mean']:.1f}±{100 * r['std']:.1f}" for r in res["results"]}
        print(f"{'l2':>9}" + "".join(f"  {f'{s}-shot':>11}" for s in res["shots"]))
        for reg in res["l2"]:
            print(f"{_num(reg):>9}" + "".join(f"  {cells[(reg, s)]:>11}" for s in res["shots"]))
        best = "  ".join(f"{b['shots']}-shot: l2 {_num(b['l2'])} ({100 * b['mean']:.2f}%)" for b in res["best"])
        print(f"\nbest l2 (chosen on the test images, so optimistic): {best}")
    short = [r for r in res["results"] if r["train_examples"] < r["shots"] * num_classes]
    if short:
        print(f"note: some classes have fewer than {short[0]['shots']} training images; they gave all they have")

    if args.json:
        payload = {**_describe(model), "data": args.data, "train_split": args.train_split}
        payload.update({"test_split": args.test_split, "num_test": int(test_x.shape[0]), **res})
        _write_json(args.json, payload)
    return 0


# ---------------------------------------------------------------------------------------------
# probe


@command("probe")
def cmd_probe(args: argparse.Namespace) -> int:
    from vitkit.eval import DEFAULT_WD_GRID, knn_eval, linear_probe

    if args.knn_k < 1:
        raise UserError("--knn-k must be positive")
    model = _load(args)
    train = _dataset(args.data, args.train_split)
    test = _dataset(args.data, args.test_split)
    train_x, train_y = _features(model, train, args, f"{args.train_split} features", args.max_train)
    test_x, test_y = _features(model, test, args, f"{args.test_split} features", args.max_test)
    wd = list(DEFAULT_WD_GRID) if args.wd_grid else args.weight_decay
    k = train.num_classes
    lin = linear_probe(
        train_x, train_y, test_x, test_y, weight_decay=wd, num_classes=k, max_iter=args.max_iter, device=args.device
    )
    knn = knn_eval(
        train_x,
        train_y,
        test_x,
        test_y,
        k=args.knn_k,
        weighting=args.knn_weighting,
        temperature=args.temperature,
        num_classes=k,
        device=args.device,
    )

    print(f"checkpoint   {model.load_report.path} ({model.load_report.source})")
    print(
        f"data         {args.data}: {k} classes; {lin['num_train']} {args.train_split} and "
        f"{lin['num_test']} {args.test_split} images; {train_x.shape[1]} features\n"
    )
    votes = f"exp(s/{args.temperature:g})" if args.knn_weighting == "distance" else "majority"
    rows = [
        (f"linear probe (weight decay {lin['weight_decay']:g})", lin),
        (f"{knn['k']}-NN (cosine, {votes} votes)", knn),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'method':<{width}}  {'top-1':>8}  {'top-5':>8}")
    for name, r in rows:
        print(f"{name:<{width}}  {_pct(r['top1']):>8}  {_pct(r['top5']):>8}")
    if lin["grid"]:
        grid = ", ".join(f"{g['weight_decay']:g}: {_pct(g['val_accuracy'])}" for g in lin["grid"])
        print(f"\nweight decay chosen on a held-out 20% of the train features: {grid}")

    if args.json:
        payload = {**_describe(model), "data": args.data, "train_split": args.train_split}
        payload.update({"test_split": args.test_split, "linear_probe": lin, "knn": knn})
        _write_json(args.json, payload)
    return 0


# ---------------------------------------------------------------------------------------------
# predict


def class_names(path: str | Path, num_classes: int) -> list[str]:
    """Class names stored with a vitkit checkpoint (metadata key "classes"), else the indices."""
    from vitkit.checkpoint import resolve_checkpoint
    from vitkit.checkpoint.io import CheckpointError, read_safetensors_metadata

    fallback = [str(i) for i in range(num_classes)]
    p = resolve_checkpoint(path)
    if p.suffix.lower() != ".safetensors":
        return fallback
    try:
        names = json.loads(read_safetensors_metadata(p).get("classes") or "null")
    except (CheckpointError, json.JSONDecodeError):
        return fallback
    if isinstance(names, list) and len(names) == num_classes and all(isinstance(n, str) for n in names):
        return names
    return fallback


def _read_image(path: str, model: Any) -> torch.Tensor:
    """Decode with Pillow, convert to the model's channels, resize, normalise: (1, C, H, W)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    pre = model.preprocessing
    mode = "L" if model.cfg.in_chans == 1 else "RGB"
    h, w = model.cfg.img_size
    resample = Image.Resampling.BICUBIC if pre.interpolation == "bicubic" else Image.Resampling.BILINEAR
    try:
        with Image.open(path) as im:
            pixels = np.asarray(im.convert(mode).resize((w, h), resample))  # (H, W[, C]) uint8
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{path}: no such image file") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise UserError(f"{path}: not an image Pillow can read ({type(e).__name__})") from None
    x = torch.from_numpy(pixels.copy()).float()
    x = x[:, :, None] if x.ndim == 2 else x
    x = x.permute(2, 0, 1)[None]  # (1, C, H, W)
    mean = torch.tensor(pre.mean).view(1, -1, 1, 1) * 255.0
    std = torch.tensor(pre.std).view(1, -1, 1, 1) * 255.0
    return (x - mean) / std


@command("predict")
def cmd_predict(args: argparse.Namespace) -> int:
    if args.top_k < 1:
        raise UserError("--top-k must be positive")
    model = _load(args)
    if not model.cfg.num_classes:
        raise UserError(f"{args.ckpt}: the model has no classification head; nothing to predict")
    names = class_names(args.ckpt, model.cfg.num_classes)
    inputs = [_read_image(p, model) for p in args.images]  # every file is checked before any work
    device = torch.device(args.device)
    model.to(device)
    k = min(args.top_k, model.cfg.num_classes)
    results = []
    with torch.inference_mode():
        for path, x in zip(args.images, inputs):
            probs = model(x.to(device)).float().softmax(dim=1)[0].cpu()  # (K,)
            top = probs.topk(k)
            preds = [
                {"class": names[i], "index": int(i), "prob": float(p)}
                for p, i in zip(top.values.tolist(), top.indices.tolist())
            ]
            results.append({"image": path, "top_k": preds})
            print(path)
            for r in preds:
                print(f"  {100 * r['prob']:6.2f}%  {r['class']}")
    if args.json:
        _write_json(args.json, {**_describe(model), "predictions": results})
    return 0


# ---------------------------------------------------------------------------------------------
# parsers


def _common(p: argparse.ArgumentParser, data: bool = True, serving: bool = False) -> None:
    p.add_argument("ckpt", help="weights: vitkit .safetensors, a run folder, official .npz, timm or HF files")
    if data:
        p.add_argument("--data", required=True, help="dataset: fashion-mnist, mnist, synthetic, a folder...")
    p.add_argument("--img-size", type=_parse_size, default=None, help="evaluate at this size, N or HxW")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1...")
    if serving:  # eval also scores the serving path, int8 included
        text = "fp32; bf16 (autocast, or bf16 weights with --serve); int8 (served, CPU only)"
        p.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32", help=text)
    else:
        p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--json", help="also write the numbers to this JSON file")


def _splits(p: argparse.ArgumentParser, max_train: int | None, max_train_help: str) -> None:
    p.add_argument("--train-split", default="train")
    p.add_argument("--test-split", default="test")
    p.add_argument("--max-train", type=int, default=max_train, help=max_train_help)
    p.add_argument("--max-test", type=int, default=None, help="a random subset of the test split (default: all)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="top-1/top-5, per-class accuracy and confusion matrix of a classifier")
    _common(p, serving=True)
    p.add_argument("--serve", action="store_true", help="evaluate the model as prepare_inference serves it")
    p.add_argument("--calib", type=int, default=512, help="int8: images that calibrate static scales (0: dynamic)")
    p.add_argument("--calib-split", default="train", help="int8: the split the calibration images come from")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (its 10-20 s are in the throughput)")
    p.add_argument("--split", default="test")
    p.add_argument("--max-images", type=int, default=None, help="a random subset of the split")
    p.add_argument("--out", default=None, help="folder for the confusion matrix (default: RUN/eval or ./eval_out)")

    p = sub.add_parser("fewshot", help="few-shot linear accuracy (closed-form least squares, as the paper)")
    _common(p)
    _splits(p, None, "a random subset of the train split (default: all; in-memory data embeds only the sampled images)")
    p.add_argument("--shots", type=int, nargs="+", default=[1, 5, 10, 25])
    p.add_argument("--seeds", type=int, default=3, help="number of random samples per shot count")
    p.add_argument("--l2", type=float, default=1024.0, help="ridge regulariser (big_vision's default 2**10)")
    p.add_argument("--l2-grid", action="store_true", help="report a grid of l2 values 1 ... 2**20")

    p = sub.add_parser("probe", help="linear-probe (logistic regression) and k-NN accuracy of frozen features")
    _common(p)
    _splits(p, 10000, "a random subset of the train split (default: 10000)")
    p.add_argument("--weight-decay", type=float, nargs="+", default=[1e-4], help="one value, or several to choose from")
    p.add_argument("--wd-grid", action="store_true", help="choose the weight decay from 1e-6 ... 1e-2")
    p.add_argument("--max-iter", type=int, default=500, help="L-BFGS iterations")
    p.add_argument("--knn-k", type=int, default=20)
    p.add_argument("--knn-weighting", choices=["distance", "majority"], default="distance")
    p.add_argument("--temperature", type=float, default=0.07, help="kNN vote temperature (DINO)")

    p = sub.add_parser("predict", help="top-k classes of image files")
    p.add_argument("ckpt", help="weights: vitkit .safetensors, a run folder, official .npz, timm or HF files")
    p.add_argument("images", nargs="+", help="image files (anything Pillow reads)")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="also write the predictions to this JSON file")


_EXTRA_PARSERS.append(add_parsers)
