"""``vitkit predict``: the top-k classes of image files (a multi-label model: the classes above their thresholds)."""

from __future__ import annotations

import argparse

from .common import (
    WEIGHTS_HELP,
    adapter_argument,
    backend_argument,
    chosen_backend,
    chosen_precision,
    count,
    describe,
    load_model,
    merge_argument,
    naflex_argument,
    naflex_of,
    parse_device,
    precision_argument,
    with_merging,
)

HELP = "top-k classes of image files (a multi-label model: every class above its threshold)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt", help=f"{WEIGHTS_HELP}; or an .onnx or .pt2 file vitkit exported")
    p.add_argument("images", nargs="+", help="image files (anything Pillow reads)")
    p.add_argument("--top-k", type=count(1, 1_000_000), default=5)
    p.add_argument("--device", type=parse_device, default="cpu")
    precision_argument(p)
    merge_argument(p)
    naflex_argument(p)
    backend_argument(p)
    p.add_argument("--json", help="also write the predictions to this JSON file")
    adapter_argument(p)


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..eval import predict
    from ..eval.predict import stored_thresholds
    from ..export import load_exported
    from ..preprocessing import load_images

    exported = args.ckpt.lower().endswith((".onnx", ".pt2"))
    model = load_exported(args.ckpt) if exported else load_model(args.ckpt, adapter=args.adapter_weights)
    model = model if exported else with_merging(model, args.merge)
    if not model.cfg.num_classes:
        raise UsageError(f"{args.ckpt}: the model has no classification head; nothing to predict")
    if args.naflex and exported:
        raise UsageError(f"--naflex runs on vitkit's own path; {args.ckpt} is an export of square inputs")
    args.naflex = None if exported else naflex_of(args, model)
    # every file read before any work
    images = load_images(args.images, model.preprocessing, model.cfg.in_chans) if not args.naflex else None
    precision = chosen_precision(args.precision, args.device)
    thresholds = stored_thresholds(model)  # a multi-label model's, chosen on its minival
    runner = None if exported and args.backend is None else chosen_backend(args, model, precision)
    predictions = predict(
        runner if runner is not None else model,
        images.inputs if images is not None else args.images,
        top_k=args.top_k,
        device=args.device,
        precision=precision if runner is None else "fp32",  # a runtime carries its precision
        thresholds=thresholds,
        naflex=args.naflex or 0,
    )
    for path, preds in zip(args.images, predictions):
        print(path)
        for r in preds:
            above = f"  (threshold {100 * r['threshold']:.1f}%)" if "threshold" in r else ""
            print(f"  {100 * r['prob']:6.2f}%  {r['class']}{above}")
        if not preds:
            print("  no class reaches its threshold")
    if args.json:
        from ..errors import writing
        from ..files import write_json

        results = [{"image": path, "top_k": preds} for path, preds in zip(args.images, predictions)]
        with writing(args.json):
            write_json(args.json, {**describe(model), "predictions": results})
    return 0
