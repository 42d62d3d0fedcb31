"""``vitkit probe``: linear-probe and kNN accuracy of a model's frozen representation."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from .common import (
    count,
    describe,
    load_model,
    pct,
    precision_argument,
    progress,
    real,
    run_options,
    split_arguments,
)
from .embed import embeddings_json, embeddings_lines, reads_embeddings, source_arguments

HELP = "linear-probe (logistic regression) and k-NN accuracy of frozen features"


def add_arguments(p: argparse.ArgumentParser) -> None:
    source_arguments(p)
    precision_argument(p)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    split_arguments(p, 10000, "a random subset of the train split (default: 10000)")
    p.add_argument(
        "--weight-decay", type=real(0), nargs="+", default=[1e-4], help="one value, or several to choose from"
    )
    p.add_argument("--wd-grid", action="store_true", help="choose the weight decay from 1e-6 ... 1e-2")
    p.add_argument("--max-iter", type=count(1, 1_000_000), default=500, help="L-BFGS iterations")
    p.add_argument("--knn-k", type=count(1, 100_000), default=20)
    p.add_argument("--knn-weighting", choices=["distance", "majority"], default="distance")
    p.add_argument("--temperature", type=real(above=0), default=0.07, help="kNN vote temperature (DINO)")


def run(args: argparse.Namespace) -> int:
    if args.knn_k < 1:
        raise UsageError("--knn-k must be positive")
    if reads_embeddings(args):
        return _run_embeddings(args)
    from ..data import build_dataset
    from ..eval import DEFAULT_WD_GRID, evaluate_probe

    model = load_model(args.ckpt, args.img_size)
    train = build_dataset(args.data, args.train_split)
    test = build_dataset(args.data, args.test_split)
    with progress("features", None) as update:
        res = evaluate_probe(
            model,
            train,
            test,
            weight_decay=list(DEFAULT_WD_GRID) if args.wd_grid else args.weight_decay,
            max_iter=args.max_iter,
            knn_k=args.knn_k,
            knn_weighting=args.knn_weighting,
            temperature=args.temperature,
            max_train=args.max_train,
            max_test=args.max_test,
            progress=update,
            **run_options(args),
        )
    lin = res["linear_probe"]
    source = [
        f"checkpoint   {model.load_report.path} ({model.load_report.source})",
        f"data         {args.data}: {train.num_classes} classes; {lin['num_train']} {args.train_split} and "
        f"{lin['num_test']} {args.test_split} images; {res['num_features']} features",
    ]
    _print(res, source, args)
    if args.json:
        from ..files import write_json

        payload = {**describe(model), "data": args.data, "train_split": args.train_split}
        payload.update({"test_split": args.test_split, "linear_probe": lin, "knn": res["knn"]})
        write_json(args.json, payload)
    return 0


def _run_embeddings(args: argparse.Namespace) -> int:
    """The probe on two embeddings files (vitkit embed): labels from the class folder of each path."""
    from ..eval import DEFAULT_WD_GRID
    from ..eval.embed import labelled_embeddings
    from ..eval.probe import probe_features

    data = labelled_embeddings(args.train_embeddings, args.test_embeddings, args.max_train, args.max_test)
    res = probe_features(
        data.train_x,
        data.train_y,
        data.test_x,
        data.test_y,
        len(data.classes),
        weight_decay=list(DEFAULT_WD_GRID) if args.wd_grid else args.weight_decay,
        max_iter=args.max_iter,
        knn_k=args.knn_k,
        knn_weighting=args.knn_weighting,
        temperature=args.temperature,
        device=args.device,
    )
    source = [*embeddings_lines(data), f"features     {res['num_features']}"]
    _print(res, source, args)
    if args.json:
        from ..files import write_json

        write_json(args.json, {**embeddings_json(data, args), "linear_probe": res["linear_probe"], "knn": res["knn"]})
    return 0


def _print(res: dict, source: list[str], args: argparse.Namespace) -> None:
    lin, knn = res["linear_probe"], res["knn"]
    print("\n".join(source) + "\n")
    votes = f"exp(s/{args.temperature:g})" if args.knn_weighting == "distance" else "majority"
    rows = [
        (f"linear probe (weight decay {lin['weight_decay']:g})", lin),
        (f"{knn['k']}-NN (cosine, {votes} votes)", knn),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'method':<{width}}  {'top-1':>8}  {'top-5':>8}")
    for name, r in rows:
        print(f"{name:<{width}}  {pct(r['top1']):>8}  {pct(r['top5']):>8}")
    if lin["grid"]:
        grid = ", ".join(f"{g['weight_decay']:g}: {pct(g['val_accuracy'])}" for g in lin["grid"])
        print(f"\nweight decay chosen on a held-out 20% of the train features: {grid}")
