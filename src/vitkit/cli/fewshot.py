"""``vitkit fewshot``: few-shot linear accuracy of a model's representation, as the paper measures."""

from __future__ import annotations

import argparse

from .common import (
    count,
    describe,
    load_model,
    num,
    precision_argument,
    progress,
    real,
    run_options,
    split_arguments,
)
from .embed import embeddings_json, embeddings_lines, reads_embeddings, source_arguments

HELP = "few-shot linear accuracy (closed-form least squares, as the paper)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    source_arguments(p)
    precision_argument(p)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    split_arguments(
        p, None, "a random subset of the train split (default: all; in-memory data embeds only the sampled images)"
    )
    p.add_argument("--shots", type=count(1, 100_000), nargs="+", default=[1, 5, 10, 25])
    p.add_argument("--seeds", type=count(1, 1000), default=3, help="number of random samples per shot count")
    p.add_argument("--l2", type=real(0), default=1024.0, help="ridge regulariser (big_vision's default 2**10)")
    p.add_argument("--l2-grid", action="store_true", help="report a grid of l2 values 1 ... 2**20")


def run(args: argparse.Namespace) -> int:
    if reads_embeddings(args):
        return _run_embeddings(args)
    from ..data import build_dataset
    from ..eval import DEFAULT_L2_GRID, evaluate_fewshot

    model = load_model(args.ckpt, args.img_size)
    train = build_dataset(args.data, args.train_split)
    test = build_dataset(args.data, args.test_split)
    l2 = list(DEFAULT_L2_GRID) if args.l2_grid else args.l2
    with progress("features", None) as update:
        res = evaluate_fewshot(
            model,
            train,
            test,
            shots=args.shots,
            seeds=args.seeds,
            l2=l2,
            max_train=args.max_train,
            max_test=args.max_test,
            progress=update,
            **run_options(args),
        )
    source = [
        f"checkpoint   {model.load_report.path} ({model.load_report.source})",
        f"data         {args.data}: {res['num_classes']} classes; samples from {args.train_split}, "
        f"accuracy on {res['num_test']} {args.test_split} images; {res['num_features']} features",
    ]
    _print(res, source, args)
    if args.json:
        from ..files import write_json

        payload = {**describe(model), "data": args.data, "train_split": args.train_split}
        payload.update({"test_split": args.test_split, **res})
        write_json(args.json, payload)
    return 0


def _run_embeddings(args: argparse.Namespace) -> int:
    """Few-shot accuracy on two embeddings files (vitkit embed): labels from the class folder of
    each path, samples drawn from the train file as from a dataset in the same order."""
    from ..eval import DEFAULT_L2_GRID, fewshot_eval
    from ..eval.embed import labelled_embeddings

    data = labelled_embeddings(args.train_embeddings, args.test_embeddings, args.max_train, args.max_test)
    l2 = list(DEFAULT_L2_GRID) if args.l2_grid else args.l2
    k = len(data.classes)
    res = fewshot_eval(data.train_x, data.train_y, data.test_x, data.test_y, args.shots, args.seeds, l2, num_classes=k)
    res = {**res, "num_features": int(data.train_x.shape[1]), "num_test": int(data.test_x.shape[0])}
    source = [*embeddings_lines(data), f"features     {res['num_features']}"]
    _print(res, source, args)
    if args.json:
        from ..files import write_json

        write_json(args.json, {**embeddings_json(data, args), **res})
    return 0


def _print(res: dict, source: list[str], args: argparse.Namespace) -> None:
    print("\n".join(source))
    k = res["num_classes"]
    print(f"few-shot linear accuracy, mean ± std over {args.seeds} seed(s)\n")
    if len(res["l2"]) == 1:
        print(f"{'shots':>5}  {'l2':>8}  {'accuracy':>17}  {'train images':>12}")
        for r in res["results"]:
            acc = f"{100 * r['mean']:.2f} ± {100 * r['std']:.2f}%"
            print(f"{r['shots']:>5}  {num(r['l2']):>8}  {acc:>17}  {r['train_examples']:>12}")
    else:
        cells = {(r["l2"], r["shots"]): f"{100 * r['mean']:.1f}±{100 * r['std']:.1f}" for r in res["results"]}
        print(f"{'l2':>9}" + "".join(f"  {f'{s}-shot':>11}" for s in res["shots"]))
        for reg in res["l2"]:
            print(f"{num(reg):>9}" + "".join(f"  {cells[(reg, s)]:>11}" for s in res["shots"]))
        best = "  ".join(f"{b['shots']}-shot: l2 {num(b['l2'])} ({100 * b['mean']:.2f}%)" for b in res["best"])
        print(f"\nbest l2 (chosen on the test images, so optimistic): {best}")
    short = [r for r in res["results"] if r["train_examples"] < r["shots"] * k]
    if short:
        print(f"note: some classes have fewer than {short[0]['shots']} training images; they gave all they have")
