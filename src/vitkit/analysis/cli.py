"""``vitkit analyze``: the paper's analyses of a checkpoint, as PNG figures and one JSON file."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitkit.cli import _EXTRA_PARSERS, UserError, _parse_size, command

# Real photographs shipped with scikit-image, used when no --images are given.
SAMPLE_IMAGES = ("astronaut", "chelsea", "coffee")
BATCH = 8


def _model_name(cfg: Any) -> str:
    """A paper-style name: "ViT-B/16", "R50+ViT-B/16" (the number is input pixels per token)."""
    from vitkit.models.config import VIT_SIZES

    sizes = {v: k for k, v in VIT_SIZES.items()}
    size = sizes.get((cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim))
    sh, sw = cfg.total_stride
    patch = str(sh) if sh == sw else f"{sh}x{sw}"
    body = (
        f"ViT-{size}/{patch}" if size else f"ViT-custom/{patch} (D={cfg.width}, L={cfg.depth}, heads={cfg.num_heads})"
    )
    if cfg.resnet_units:
        body = f"R{3 * sum(cfg.resnet_units) + 2}+{body}"  # bottleneck ResNet depth: 3 convs a unit + stem + head
    return body


def _read_images(paths: list[str] | None, mode: str) -> list[tuple[str, Any]]:
    """(name, PIL image in ``mode``) for each file, or for scikit-image's sample photographs."""
    from PIL import Image, UnidentifiedImageError

    images = []
    if paths:
        for p in paths:
            try:
                with Image.open(p) as im:
                    images.append((Path(p).stem, im.convert(mode)))
            except (FileNotFoundError, IsADirectoryError):
                raise UserError(f"{p}: no such image file") from None
            except UnidentifiedImageError:
                raise UserError(f"{p}: not an image Pillow can read") from None
        return images
    try:
        from skimage import data
    except ImportError:
        raise UserError(
            "no --images given and scikit-image (which ships the default sample photographs) is not "
            "installed; pass image files with --images or pip install scikit-image"
        ) from None
    for name in SAMPLE_IMAGES:
        images.append((name, Image.fromarray(getattr(data, name)()).convert(mode)))
    return images


def _prepare(images: list[tuple[str, Any]], model: Any) -> tuple[np.ndarray, torch.Tensor]:
    """Resize to the model's resolution; return display pixels (B, H, W[, 3]) uint8 and normalised
    model inputs (B, C, H, W)."""
    from PIL import Image

    resample = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
    pre = model.preprocessing
    h, w = model.cfg.img_size
    method = resample.get(pre.interpolation, Image.Resampling.BILINEAR)
    pixels = np.stack([np.asarray(im.resize((w, h), method)) for _, im in images])  # (B, H, W[, C])
    x = torch.from_numpy(pixels).float() / 255.0
    x = x[..., None] if x.ndim == 3 else x  # (B, H, W, C)
    x = x.permute(0, 3, 1, 2)  # (B, C, H, W)
    mean = torch.tensor(pre.mean, dtype=torch.float32)[None, :, None, None]
    std = torch.tensor(pre.std, dtype=torch.float32)[None, :, None, None]
    return pixels, (x - mean) / std


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "image"


def _rounded(t: torch.Tensor, digits: int = 6) -> list:
    return np.round(t.double().numpy(), digits).tolist()


@command("analyze")
def cmd_analyze(args: argparse.Namespace) -> int:
    import vitkit
    from vitkit.analysis import (
        attention_rollout,
        collect_attention,
        embedding_filter_components,
        figures,
        mean_attention_distance,
        pos_embed_similarity,
        pos_embed_similarity_summary,
        rollout_map,
        token_attention_maps,
    )

    overrides = {"img_size": args.img_size} if args.img_size else {}
    model = vitkit.load_pretrained(args.ckpt, **overrides)
    if not hasattr(model, "forward_intermediates"):
        raise UserError(f"{args.ckpt}: holds a {type(model).__name__}; analyze needs a Vision Transformer")
    for note in model.load_report.notes:
        print(f"note: {note}")
    cfg = model.cfg
    if cfg.in_chans not in (1, 3):
        raise UserError(f"analyze reads RGB or greyscale images; the model takes {cfg.in_chans} channels")
    depth = cfg.depth
    layers = sorted({0, depth // 2, depth - 1}) if args.layers is None else list(args.layers)
    for i in layers:
        if not -depth <= i < depth:
            raise UserError(f"--layers {i}: the model has {depth} layers (0..{depth - 1})")

    images = _read_images(args.images, "RGB" if cfg.in_chans == 3 else "L")
    names = [name for name, _ in images]
    pixels, inputs = _prepare(images, model)
    grid, stride, prefix = cfg.grid_size, cfg.total_stride, cfg.num_prefix_tokens

    maps, head_maps, distance_sum = [], [], None
    for start in range(0, len(inputs), BATCH):
        batch = inputs[start : start + BATCH]
        attentions = collect_attention(model, batch)
        maps.append(rollout_map(attention_rollout(attentions), grid, prefix))  # (b, gh, gw)
        head_maps.append(token_attention_maps(attentions, grid, prefix))  # (b, L, H, gh, gw)
        dist = mean_attention_distance(attentions, grid, stride, prefix) * len(batch)  # (L, H)
        distance_sum = dist if distance_sum is None else distance_sum + dist
    maps_t = torch.cat(maps)  # (B, gh, gw)
    head_maps_t = torch.cat(head_maps)  # (B, L, H, gh, gw)
    distances = distance_sum / len(inputs)  # (L, H)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    title = _model_name(cfg)
    written.append(figures.plot_rollout_overlay(pixels, maps_t, out / "rollout.png", titles=names))
    for i, name in enumerate(names):
        path = out / f"attention_{i + 1:02d}_{_slug(name)}.png"
        query = "class token" if prefix else "mean over patches"
        written.append(
            figures.plot_attention_maps(
                head_maps_t[i],
                path,
                layers=layers,
                image=pixels[i],
                title=f"{title}: attention of the {query} to each patch ({name})",
            )
        )
    written.append(
        figures.plot_mean_attention_distance(
            distances, out / "mean_attention_distance.png", title=f"{title}: mean attention distance"
        )
    )

    if model.pos_embed is not None:
        sim = pos_embed_similarity(model)
        pos_summary: dict[str, Any] = {"grid": list(grid), "kind": cfg.pos_embed, **pos_embed_similarity_summary(sim)}
        written.append(
            figures.plot_pos_embed_similarity(
                sim, out / "pos_embed_similarity.png", title=f"{title}: position embedding similarity"
            )
        )
    else:
        pos_summary = {"skipped": "the model has no position embedding"}

    pca = embedding_filter_components(model, k=args.components)
    C = pca.components.shape[1]
    filter_info: dict[str, Any] = {
        "filter_shape": list(pca.components.shape[1:]),
        "explained_variance_ratio": _rounded(pca.explained_variance_ratio),
    }
    if C in (1, 3):
        written.append(
            figures.plot_filter_components(
                pca.components,
                out / "embedding_filters.png",
                pca.explained_variance_ratio,
                title=f"{title}: embedding filters, principal components (variance explained)",
            )
        )
    else:
        filter_info["figure"] = f"not drawn: the filters act on {C} ResNet feature channels, not pixels"

    report = {
        "checkpoint": str(args.ckpt),
        "source": model.load_report.source,
        "model": {"name": title, "config": cfg.to_dict()},
        "preprocessing": model.preprocessing.to_dict(),
        "images": [
            {"name": name, "path": path}
            for name, path in zip(names, args.images or [f"skimage.data.{n}()" for n in names])
        ],
        "grid": list(grid),
        "stride_pixels": list(stride),
        "mean_attention_distance": {
            "unit": "input pixels",
            "note": "per layer, one value per head; class token excluded, weights renormalised over patches",
            "values": _rounded(distances),
        },
        "pos_embed_similarity": pos_summary,
        "filter_pca": filter_info,
        "rollout": {
            "query": "class token" if prefix else "mean over patch tokens",
            "note": "head-mean rollout over all layers, patch columns, scaled to [0, 1] per image",
            "maps": [_rounded(m) for m in maps_t],  # one (gh, gw) map per image, in the order of "images"
        },
        "figures": [p.name for p in written],
    }
    json_path = out / "analysis.json"
    json_path.write_text(json.dumps(report, indent=2))

    print(f"analyzed {title} ({model.load_report.source}) on {len(names)} image(s): {', '.join(names)}")
    for p in [*written, json_path]:
        print(f"  wrote {p}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="attention rollout, attention distance, embeddings: figures and JSON")
    p.add_argument("ckpt", help="weights: a run folder, official .npz, timm/HF files or a vitkit .safetensors")
    p.add_argument("--images", nargs="+", default=None, help="image files (default: scikit-image's sample photos)")
    p.add_argument("--out", required=True, help="folder for the PNG figures and analysis.json")
    p.add_argument("--img-size", type=_parse_size, default=None, help="resolution, N or HxW (resizes positions)")
    p.add_argument(
        "--layers", type=int, nargs="+", default=None, help="layers (0-based) of the per-head attention maps"
    )
    p.add_argument("--components", type=int, default=28, help="principal components of the filters to keep")


_EXTRA_PARSERS.append(add_parsers)
