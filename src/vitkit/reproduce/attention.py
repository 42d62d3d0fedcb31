"""``attention`` (Figures 6 and 7): what the trained ViT and hybrid attend to, with the
existing :mod:`vitkit.analysis` functions: mean attention distance per head and layer, the
learned 1-D position embeddings' similarity, the embedding filters' principal components, and
attention rollout on a few test images."""

from __future__ import annotations

from typing import Any

import torch

from .experiments import Experiment, Section
from .spec import RunSpec


def rank_correlation(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties broken by order; enough for a trend over layers)."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r

    rx, ry = ranks(x), ranks(y)
    n = len(x)
    if n < 2:
        return 0.0
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def test_images(suite: Any, model: Any, count: int) -> Any:
    """The first ``count`` test images as :class:`vitkit.preprocessing.LoadedImages` for ``model``."""
    from ..data import TransformConfig, build_dataset, eval_transform
    from ..data.transforms import match_channels, resize
    from ..eval.features import model_preprocessing
    from ..preprocessing import LoadedImages

    test = build_dataset(suite.data, "test", **suite.data_options())
    x, _ = next(test.batches(count))
    pre = model_preprocessing(model)
    cfg = TransformConfig(img_size=pre.img_size, crop="none", flip=False, mean=pre.mean, std=pre.std)
    inputs = eval_transform(match_channels(x, model.cfg.in_chans).to(torch.uint8), cfg)
    pixels = resize(x.float(), pre.img_size).round().clamp(0, 255).to(torch.uint8)  # (B, C, H, W)
    pixels = pixels[:, 0] if pixels.shape[1] == 1 else pixels.permute(0, 2, 3, 1)
    return LoadedImages([f"test {i}" for i in range(len(x))], pixels.numpy(), inputs)


class Attention(Experiment):
    name = "attention"

    def runs(self) -> list[RunSpec]:
        return [self.base_spec(self.cfg["vit"], 0), self.base_spec(self.cfg["hybrid"], 0)]

    def analyse(self, results: dict[str, dict[str, Any]], role: str) -> tuple[Any, Any]:
        from ..analysis import analyze
        from ..checkpoint.load import load_pretrained

        spec = self.base_spec(self.cfg[role], 0)
        model = load_pretrained(self.suite.run_dir(spec) / "best.safetensors")
        return model, analyze(model, test_images(self.suite, model, int(self.cfg["images"])))

    def summarise(self, results: dict[str, dict[str, Any]]) -> Section:
        from ..analysis.attention import patch_distances
        from .figures import plot_attention

        numbers: dict[str, Any] = {}
        reports = {}
        for role in ("vit", "hybrid"):
            _, rep = self.analyse(results, role)
            reports[role] = rep
            d = rep.distances  # (L, H) pixels
            layer_mean = d.mean(dim=1).tolist()
            numbers[role] = {
                "title": self.suite.model_title(self.cfg[role]),
                "distances": [[round(v, 3) for v in row] for row in d.tolist()],
                "layer_mean": layer_mean,
                "first_layer_min": float(d[0].min()),
                "first_layer_max": float(d[0].max()),
                "last_layer_mean": layer_mean[-1],
                "depth_correlation": rank_correlation(list(range(len(layer_mean))), layer_mean),
                "uniform": float(patch_distances(rep.grid, rep.stride).mean()),
                "max_from_uniform": float((d - patch_distances(rep.grid, rep.stride).mean()).abs().max()),
                "pos_similarity": rep.pos_summary,
                "filters_variance_top": [float(v) for v in rep.filters.explained_variance_ratio[:6]],
            }
        out = self.suite.out / "figures"
        figures = plot_attention(reports, out, int(self.cfg["rollout_images"]))
        header = [
            "model",
            "layer 1: nearest head",
            "layer 1: farthest head",
            "last layer (mean)",
            "rank correlation with depth",
            "uniform attention would give",
        ]
        rows = [
            [n["title"], *(f"{n[k]:.1f} px" for k in ("first_layer_min", "first_layer_max", "last_layer_mean")),
             f"{n['depth_correlation']:+.2f}", f"{n['uniform']:.1f} px"]
            for n in numbers.values()
        ]  # fmt: skip
        section = self.section(header, rows, numbers, self.verdict(numbers))
        section.figures.extend(figures)
        section.caption = f"Mean attention distance in input pixels, over {self.cfg['images']} test images"
        return section

    def verdict(self, n: dict[str, Any]) -> str:
        v, h = n["vit"], n["hybrid"]
        grows = "grows" if v["depth_correlation"] > 0.3 else "does not clearly grow"
        spread = v["first_layer_max"] / max(v["first_layer_min"], 1e-6)
        parts = [
            f"In the ViT the mean attention distance {grows} with depth "
            f"(rank correlation {v['depth_correlation']:+.2f})",
            f"its first layer's heads range from {v['first_layer_min']:.1f} to {v['first_layer_max']:.1f} px "
            f"({spread:.1f}x; uniform attention over the image would give {v['uniform']:.1f} px)",
            f"the hybrid's first layer averages {h['layer_mean'][0]:.1f} px against the ViT's "
            f"{v['layer_mean'][0]:.1f} px ("
            + (
                "less local, as in appendix D.7)"
                if h["layer_mean"][0] > v["layer_mean"][0]
                else "not less local, unlike appendix D.7)"
            ),
        ]
        pos = v["pos_similarity"]
        if "neighbours" in pos and "far" in pos and pos["neighbours"] is not None and pos["far"] is not None:
            parts.append(
                "the learned 1-D position embeddings are more alike for neighbouring patches "
                f"({pos['neighbours']:.2f}) than for distant ones ({pos['far']:.2f})"
                if pos["neighbours"] > pos["far"]
                else "the learned 1-D position embeddings show no 2-D neighbourhood structure at this training length"
            )
        text = "; ".join(parts) + "."
        if v["max_from_uniform"] < 1.0:
            text += (
                f" Every head of the ViT is within {v['max_from_uniform']:.1f} px of uniform attention: at this "
                "scale (a small model, minutes of training on small images) the local heads of Figure 7 did not "
                "form, so the trends above are small."
            )
        return text
