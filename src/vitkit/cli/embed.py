"""``vitkit embed``: one vector per image of a folder (or its patch tokens), written to a file;
and the arguments with which ``vitkit fewshot`` and ``vitkit probe`` read such files instead of
running a model over a dataset."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .common import (
    WEIGHTS_HELP,
    adapter_argument,
    backend_argument,
    chosen_backend,
    chosen_precision,
    count,
    load_model,
    merge_argument,
    naflex_argument,
    parse_device,
    parse_size,
    precision_argument,
    with_merging,
)
from .common import progress as progress_bar

if TYPE_CHECKING:
    from ..eval.embed import LabelledEmbeddings

HELP = "embeddings of every image file under a folder, written to .safetensors (or .parquet)"

POOL_HELP = (
    "pooled: the model's pre-logits, what its head reads (default); cls: the class token after the "
    "final norm; patch: the patch tokens (N, tokens, D), class, distillation and register tokens left out"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt", metavar="MODEL", help=WEIGHTS_HELP)
    p.add_argument("folder", metavar="FOLDER", help="image files in it and its sub-folders, at any depth")
    p.add_argument(
        "--out",
        required=True,
        help="the .safetensors (or .parquet, with pyarrow) file to write; finished batches wait in "
        "OUT.parts/, so that the same command run again after an interruption resumes",
    )
    p.add_argument(
        "--format",
        choices=["safetensors", "parquet"],
        default=None,
        help="the file's format (default: from the --out name); parquet (needs pyarrow) has the columns path, "
        "label (the class folder), prediction (the head's class, for --pool pooled) and vector, for pandas, "
        "FiftyOne or Embedding Atlas",
    )
    p.add_argument("--pool", choices=["pooled", "cls", "patch"], default="pooled", help=POOL_HELP)
    p.add_argument("--batch-size", type=count(1, 1 << 16), default=64, help="images per batch and per part")
    p.add_argument("--device", type=parse_device, default="cpu", help="cpu, cuda, cuda:1...")
    precision_argument(p)
    merge_argument(p)
    naflex_argument(p)
    backend_argument(p)
    p.add_argument("--workers", type=count(0, 256), default=4, help="threads that decode images (0: none)")
    adapter_argument(p)


def run(args: argparse.Namespace) -> int:
    from ..eval.embed import check_output, embed_folder, image_files

    if args.format and not str(args.out).lower().endswith(f".{args.format}"):
        raise UsageError(f"{args.out}: --format {args.format} writes a .{args.format} file; name it so")
    if args.merge and args.pool == "patch":
        raise UsageError("--merge leaves merged tokens, not a patch grid; use --pool pooled or cls with it")
    out = check_output(args.out)  # before the model loads (or downloads)
    files = image_files(args.folder)
    model = with_merging(load_model(args.ckpt, adapter=args.adapter_weights), args.merge)
    precision = chosen_precision(args.precision, args.device)
    runner = chosen_backend(args, model, precision)
    try:
        with progress_bar("embed", len(files)) as update:
            res = embed_folder(
                model,
                args.folder,
                pool=args.pool,
                batch_size=args.batch_size,
                out=out,
                device=args.device,
                precision=precision,
                files=files,
                workers=args.workers,
                progress=update,
                runner=runner,
                naflex=args.naflex,
            )
    except KeyboardInterrupt:
        print(f"note: finished batches are kept in {out}.parts; the same command resumes", file=sys.stderr)
        raise
    shape = "x".join(str(n) for n in res.metadata["shape"][1:])
    print(f"embedded     {len(res.paths)} images of {args.folder} ({args.pool}, {shape} each, {precision})")
    print(f"model        {res.model} ({res.metadata['weights_sha256'][:12]})")
    print(f"wrote        {out}")
    if res.reused_batches:
        total = res.reused_batches + res.computed_batches
        print(f"resumed      {res.reused_batches} of {total} batches read back from {out}.parts")
    if res.skipped:
        listed = "; ".join(f"{p} ({why})" for p, why in res.skipped[:5])
        more = f"; and {len(res.skipped) - 5} more" if len(res.skipped) > 5 else ""
        print(
            f"warning: skipped {len(res.skipped)} unreadable file(s), all listed in {out}'s metadata "
            f"(key 'skipped'): {listed}{more}",
            file=sys.stderr,
        )
    return 0


# ----------------------------------------------------------------------------------------------
# fewshot and probe: a model and a dataset, or two embeddings files


def source_arguments(p: argparse.ArgumentParser) -> None:
    """The model and data arguments of fewshot and probe, and the embeddings files that can
    replace them (``--train-embeddings`` and ``--test-embeddings``, written by ``vitkit embed``)."""
    p.add_argument("ckpt", nargs="?", help=f"{WEIGHTS_HELP}; or give --train-embeddings and --test-embeddings")
    p.add_argument("--data", help="dataset: fashion-mnist, mnist, synthetic, a folder...")
    p.add_argument("--img-size", type=parse_size, default=None, help="evaluate at this size, N or HxW")
    p.add_argument("--batch-size", type=count(1, 1 << 24), default=256)
    p.add_argument("--device", type=parse_device, default="cpu", help="cpu, cuda, cuda:1...")
    p.add_argument(
        "--train-embeddings",
        metavar="FILE",
        help="instead of a model and --data: features to fit on, from vitkit embed (the label of each "
        "image is its class folder, the first folder of its path)",
    )
    p.add_argument("--test-embeddings", metavar="FILE", help="the features to score, from vitkit embed alike")


def reads_embeddings(args: argparse.Namespace) -> bool:
    """Whether the command reads embeddings files (else it runs a model over ``--data``); one
    source or the other, whole, or a :class:`UsageError`."""
    if args.train_embeddings or args.test_embeddings:
        if not (args.train_embeddings and args.test_embeddings):
            raise UsageError("give both --train-embeddings and --test-embeddings")
        model_side = ((f"the model {args.ckpt}", args.ckpt), ("--data", args.data), ("--img-size", args.img_size))
        given = [name for name, v in model_side if v]
        if given:
            raise UsageError(f"embeddings files replace a model and its data; leave out {', '.join(given)}")
        return True
    if not args.ckpt or not args.data:
        raise UsageError("give a model and --data, or --train-embeddings and --test-embeddings (from vitkit embed)")
    return False


def embeddings_lines(data: LabelledEmbeddings) -> list[str]:
    """What fewshot and probe print about the embeddings they read."""
    tr, te = data.train, data.test
    classes = ", ".join(data.classes[:8]) + (", ..." if len(data.classes) > 8 else "")
    return [
        f"embeddings   {tr.file} ({len(data.train_y)} used) and {te.file} ({len(data.test_y)} used)",
        f"model        {tr.model} ({tr.metadata.get('weights_sha256', '')[:12]}), pool {tr.pool}",
        f"classes      {len(data.classes)}: {classes}",
    ]


def embeddings_json(data: LabelledEmbeddings, args: argparse.Namespace) -> dict[str, Any]:
    """Which embeddings a JSON report of fewshot or probe is about."""
    tr = data.train
    return {
        "train_embeddings": str(args.train_embeddings),
        "test_embeddings": str(args.test_embeddings),
        "model": tr.model,
        "weights_sha256": tr.metadata.get("weights_sha256"),
        "pool": tr.pool,
        "classes": list(data.classes),
    }
