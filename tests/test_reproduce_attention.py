"""The ``attention`` experiment of ``vitkit reproduce``: the rollout-on-object measure and the
class-token share on synthetic maps with known answers, the analyses of untrained models, the
numbers and sentences across seeds on fabricated inputs, the figures, and the runs per seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vitkit.analysis.attention import (
    object_fraction,
    prefix_attention_share,
    rollout_object_ratio,
    rollout_patch_weights,
)
from vitkit.models.registry import create_model
from vitkit.preprocessing import LoadedImages
from vitkit.reproduce.core.spec import DataInfo, Suite
from vitkit.reproduce.experiments.attention import Attention, controlled_claim, paired_claim, sign_claim, table, verdict
from vitkit.reproduce.experiments.attention_measure import layer_slope, measure, seed_numbers, summarise_numbers

# -- the rollout's mass on the object ------------------------------------------------------------


def _fraction() -> torch.Tensor:
    f = torch.zeros(2, 4, 4, dtype=torch.float64)
    f[0, 1:3, 1:3] = 1.0  # 4 of 16 tokens wholly object: share 0.25
    f[1, 0, :2] = 1.0  # two tokens: share 0.125
    f[1, 3, :] = 0.0
    return f


def test_all_mass_on_the_object_gives_one_over_its_share():
    f = _fraction()
    w = f.clone()  # weights where the object is, spread over it
    ratio = rollout_object_ratio(w, f)
    assert torch.allclose(ratio, torch.tensor([1 / 0.25, 1 / 0.125], dtype=torch.float64))


def test_uniform_rollout_gives_one_and_background_gives_zero():
    f = _fraction()
    assert torch.allclose(rollout_object_ratio(torch.ones(2, 16), f), torch.ones(2, dtype=torch.float64))
    background = (f == 0).to(torch.float64).reshape(2, 16)  # (B, P) layout works too
    assert torch.allclose(rollout_object_ratio(background, f), torch.zeros(2, dtype=torch.float64))
    unnormalised = 7.0 * f  # the weights need not sum to one
    assert torch.allclose(rollout_object_ratio(unnormalised, f), rollout_object_ratio(f, f))


def test_an_image_without_object_has_no_ratio_and_shapes_must_match():
    f = torch.zeros(1, 4, 4)
    assert torch.isnan(rollout_object_ratio(torch.ones(1, 16), f)).all()
    with pytest.raises(ValueError, match="do not match"):
        rollout_object_ratio(torch.ones(1, 9), f)


def test_object_fraction_from_raw_pixels():
    pixels = np.zeros((1, 8, 8), dtype=np.uint8)
    pixels[0, :4, :4] = 200  # the top-left token of a 2x2 grid
    pixels[0, 4, 4:] = 3  # a faint row: a quarter of the bottom-right token
    f = object_fraction(pixels, (2, 2))
    assert torch.allclose(f, torch.tensor([[[1.0, 0.0], [0.0, 0.25]]], dtype=torch.float64))
    assert torch.allclose(
        object_fraction(pixels, (2, 2), threshold=10), torch.tensor([[[1.0, 0.0], [0.0, 0.0]]]).double()
    )
    rgb = np.zeros((1, 8, 8, 3), dtype=np.uint8)
    rgb[0, :4, :4, 2] = 9  # any channel counts
    assert object_fraction(rgb, (2, 2))[0, 0, 0] == 1.0 and object_fraction(rgb, (2, 2)).sum() == 1.0
    with pytest.raises(ValueError, match="pixels must be"):
        object_fraction(np.zeros((8, 8)), (2, 2))


def test_rollout_patch_weights_are_the_class_tokens_row_renormalised():
    rollout = torch.zeros(1, 5, 5)
    rollout[0, 0] = torch.tensor([0.5, 0.25, 0.25, 0.0, 0.0])  # the class token's row: half on itself
    w = rollout_patch_weights(rollout, (2, 2), 1)
    assert torch.allclose(w, torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64))


# -- the class token's share ----------------------------------------------------------------------


def _attention(prefix: int, patches: int, share: float, heads: int = 2) -> torch.Tensor:
    """Softmax-like weights (1, heads, N, N): every patch query puts ``share`` on the prefix
    tokens (split evenly) and the rest evenly on the patches; prefix queries attend anywhere."""
    n = prefix + patches
    w = torch.full((1, heads, n, n), 1.0 / n)
    w[:, :, prefix:, :prefix] = share / prefix
    w[:, :, prefix:, prefix:] = (1 - share) / patches
    return w


def test_prefix_share_on_synthetic_attention():
    layers = [_attention(1, 4, 0.3), _attention(1, 4, 0.0)]
    share = prefix_attention_share(layers, 1)
    assert share.shape == (2, 2)
    assert torch.allclose(share, torch.tensor([[0.3, 0.3], [0.0, 0.0]], dtype=torch.float64))
    two = prefix_attention_share([_attention(2, 4, 0.6)], 2)  # two prefix tokens: their sum
    assert torch.allclose(two, torch.full((1, 2), 0.6, dtype=torch.float64))
    assert prefix_attention_share([_attention(1, 4, 0.3)], 0).abs().max() == 0  # no prefix: nothing


# -- one model, one seed ---------------------------------------------------------------------------


def test_layer_slope():
    assert layer_slope([1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.0)
    assert layer_slope([4.0, 4.0, 4.0]) == 0.0
    assert math.isnan(layer_slope([1.0])) and math.isnan(layer_slope([1.0, math.nan]))


def _images(n: int = 6, size: int = 16) -> LoadedImages:
    g = torch.Generator().manual_seed(0)
    pixels = torch.zeros(n, size, size, dtype=torch.uint8)
    pixels[:, 4:12, 6:10] = torch.randint(1, 255, (n, 8, 4), generator=g, dtype=torch.uint8)  # an object on zeros
    inputs = (pixels.float() / 255 - 0.5)[:, None] / 0.5  # (B, 1, H, W)
    return LoadedImages([f"test {i}" for i in range(n)], pixels.numpy(), inputs)


def _tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = {"img_size": [16, 16], "in_chans": 1, "num_classes": 3, "width": 32, "depth": 3, "num_heads": 2,
              "mlp_dim": 64}  # fmt: skip
    if kind == "vit":
        return create_model("vit_s16", patch_size=4, **common).eval()
    return create_model("r26_vit_s32", resnet_units=[1], patch_size=1, **common).eval()


@pytest.mark.parametrize("kind", ["vit", "hybrid"])
def test_measure_an_untrained_model(kind):
    model, images = _tiny(kind), _images()
    grid = tuple(model.cfg.grid_size)
    fraction = object_fraction(images.pixels, grid)
    m = measure(model, images, fraction, top_components=2, keep=2, batch_size=4)
    n = m.numbers
    depth, heads = model.cfg.depth, model.cfg.num_heads
    assert np.shape(n["distances"]) == np.shape(n["class_share"]) == (depth, heads)
    assert all(0 <= s <= 1 for row in n["class_share"] for s in row)
    assert n["uniform"] > 0 and n["layer_offset"][0] == pytest.approx(n["layer_mean"][0] - n["uniform"])
    assert n["first_layer_nearest"] <= n["first_layer"] <= n["first_layer_farthest"]
    assert n["max_deviation"] >= abs(n["layer_offset"][0]) - 1e-9
    assert n["object_share"] == pytest.approx(float(fraction.mean()))
    assert math.isfinite(n["rollout_ratio"]) and len(m.ratios) == 2
    assert 0 < n["filter_top"] <= 1 and n["pos_contrast"] is not None and math.isfinite(n["depth_slope"])
    assert m.rollout.shape == (2, *grid) and float(m.rollout.max()) == pytest.approx(1.0)
    none = measure(model, images, None, keep=0)  # no object mask: no ratio, the rest the same
    assert none.numbers["rollout_ratio"] is None and np.allclose(none.numbers["distances"], n["distances"])


# -- across seeds: the numbers and the sentences ---------------------------------------------------


def _seed(layer_means: list[float], spread: float, share: float, contrast: float, top: float, ratio: float):
    d = torch.tensor([[m - spread / 2, m - spread / 6, m + spread / 6, m + spread / 2] for m in layer_means])
    pos = {"neighbours": 0.1 + contrast, "far": 0.1}
    return seed_numbers(
        d, torch.full(d.shape, share), 10.0, pos=pos, filter_variance=[top / 2, top / 2, 0.05], top_components=2,
        object_share=0.4, rollout_ratios=[ratio, ratio],
    )  # fmt: skip


def _fabricated(seeds: int = 3, trained_slope: float = 1.0, hybrid_first: float = 2.0) -> dict:
    def model(title: str, first: float) -> dict:
        trained = [
            _seed([first + trained_slope * i + 0.1 * s * (-1) ** i for i in range(4)], 6.0 + 0.3 * s, 0.2 + 0.01 * s,
                  0.3 + 0.02 * s, 0.7 + 0.01 * s, 1.5 + 0.05 * s)
            for s in range(seeds)
        ]  # fmt: skip
        untrained = [
            _seed([10.0 + 0.05 * s * (-1) ** i for i in range(4)], 0.5 + 0.1 * s, 0.02, 0.01 * s - 0.01,
                  0.3 + 0.01 * s, 1.0 + 0.01 * (s - 1))
            for s in range(seeds)
        ]  # fmt: skip
        return {"title": title, "trained": trained, "untrained": untrained}

    numbers = summarise_numbers({"vit": model("ViT (tiny)", 8.0), "hybrid": model("R+ViT (tiny)", 8.0 + hybrid_first)})
    numbers.update(top_components=2, object_note=None)
    return numbers


def test_clear_effects_are_said_with_their_intervals():
    numbers = _fabricated()
    text = verdict(numbers)
    assert "growing with depth; untrained -0.02 px a layer; trained minus untrained +0.98 px a layer (95% CI" in text
    assert "beyond the untrained control, so training shaped it" in text
    assert "more local than uniform" in text  # the ViT's first layer: 8 px against 10
    assert "the hybrid's first layer is less local, as in appendix D.7" in text
    assert "concentrated on the object; untrained 1.00; trained minus untrained +0.55" in text
    assert "the 2-D grid encoded" in text and "that share is higher in the trained model" in text
    assert "shows it as well" not in text
    assert "95% CI" in text and "3 seeds" in text
    vit = numbers["models"]["vit"]
    assert vit["summary"]["trained"]["depth_slope"]["estimate"] == pytest.approx(0.96)  # seed s: 1 - 0.04 s
    assert vit["trained_minus_untrained"]["rollout_ratio"]["low"] > 0
    assert numbers["hybrid_minus_vit"]["trained"]["estimate"] == pytest.approx(2.0)
    header, rows = table(numbers)
    assert len(rows) == 2 * 2 * 4 and len(header) == len(rows[0])
    first = rows[0]  # the ViT trained, layer 1: heads ranked nearest to farthest
    dists = [float(x) for x in first[3].split(" / ")]
    assert dists == sorted(dists) and first[4] == "21 / 21 / 21 / 21" and "95% CI" in first[5]


def test_no_effect_is_not_distinguishable():
    numbers = _fabricated(trained_slope=0.0, hybrid_first=0.0)
    text = verdict(numbers)
    assert "no trend distinguishable" in text
    assert "not distinguishable between the hybrid and the ViT" in text and "appendix D.7" not in text


def test_one_seed_claims_nothing():
    numbers = _fabricated(seeds=1)
    text = verdict(numbers)
    assert "too few for an interval" in text and "not weighed" in text
    assert "growing with depth" not in text and "higher in" not in text
    assert numbers["models"]["vit"]["summary"]["trained"]["depth_slope"] is None
    assert "1 seed" in table(numbers)[1][0][5]


def test_an_effect_is_put_down_to_training_only_beyond_the_untrained_control():
    """The published case: a depth trend of +0.11 px a layer trained against +0.06 untrained, and a
    rollout ratio of 1.06 against 1.05, each labelled on the trained models alone before; the
    control shows them as well. Just beyond the control, the same labels are put down to training."""
    slope = controlled_claim("the depth trend", "the slope", [0.10, 0.12, 0.11], [0.05, 0.07, 0.06], " px a layer", 2,
                             "growing with depth", "shrinking with depth", "no trend")  # fmt: skip
    assert slope.startswith("the depth trend, trained: +0.11 px a layer (95% CI 0.09 to 0.13, 3 seeds), growing")
    assert slope.endswith(
        "trained minus untrained +0.05 px a layer (95% CI 0.05 to 0.05, 3 seeds): beyond the untrained control, "
        "so training shaped it"
    )
    same = controlled_claim("the depth trend", "the slope", [0.10, 0.12, 0.11], [0.09, 0.03, 0.06], " px a layer", 2,
                            "growing with depth", "shrinking with depth", "no trend")  # fmt: skip
    assert "growing with depth; untrained +0.06 px a layer" not in same  # a mean, said without a sign
    assert same.endswith("the untrained control shows it as well, so it is not shown to come from training")
    ratio = controlled_claim("the rollout ratio", "the ratio", [1.06, 1.07, 1.05], [1.04, 1.06, 1.05], "", 2,
                             "concentrated on the object", "away", "even", reference=1.0)  # fmt: skip
    assert "concentrated on the object" in ratio and ratio.endswith("so it is not shown to come from training")
    less = controlled_claim("r", "the ratio", [1.06, 1.07, 1.05], [1.2, 1.21, 1.19], "", 2, "concentrated", "away",
                            "even", reference=1.0)  # fmt: skip
    assert less.endswith("less so than the untrained control, so it is not from training")
    flat = controlled_claim("t", "the slope", [0.1, -0.1, 0.0], [0.0, 0.0, 0.01], "", 2, "up", "down", "no trend")
    assert "no trend" in flat and "the slope is not distinguishable between the trained model" in flat


def test_claims_need_the_interval_to_exclude_zero():
    assert sign_claim("s", [1.0, 1.1, 0.9], "", 1, "grows", "shrinks", "flat").endswith("grows")
    assert sign_claim("s", [1.0, -1.0, 0.1], "", 1, "grows", "shrinks", "flat").endswith("flat")
    assert sign_claim("r", [1.5, 1.6, 1.55], "", 2, "above", "below", "even", reference=2.0).endswith("below")
    assert sign_claim("r", [1.5, 1.6, 1.55], "", 2, "above", "below", "even", reference=1.0).startswith("r: 1.55 (")
    assert sign_claim("r", [1.5], "", 2, "above", "below", "even").endswith("from 1 seed, too few for an interval")
    assert "not distinguishable" in paired_claim("x", [1, 2, 3], [1.1, 1.9, 3.0], "a", "b", "", 1)
    assert "x is lower in a than in b by 1.0" in paired_claim("x", [1, 2, 3], [2, 3.1, 3.9], "a", "b", "", 1)
    diverged = paired_claim("x", [1, math.nan, 3], [2, 3, math.nan], "a", "b", "", 1)
    assert "not weighed" in diverged  # one finite pair left


def test_a_missing_object_mask_is_said():
    numbers = _fabricated()
    for entry in numbers["models"].values():
        for state in ("trained", "untrained"):
            for s in entry[state]:
                s["rollout_ratio"] = None
    numbers["object_note"] = "The rollout's mass on the object is not measured: no blank background"
    text = verdict(numbers)
    assert "concentrated" not in text and text.endswith("no blank background.")


def test_figures_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    from vitkit.reproduce.experiments.attention_figures import plot_attention

    model, images = _tiny("vit"), _images()
    m = measure(model, images, object_fraction(images.pixels, tuple(model.cfg.grid_size)), keep=3)
    paths = plot_attention(_fabricated(), {"measured": m, "images": images, "title": "ViT (tiny)"}, tmp_path)
    names = {p.name for p in paths}
    assert {"attention_distance.png", "attention_controls.png", "pos_embed_similarity.png", "rollout.png"} <= names
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)


# -- the runs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("budget", "given", "expected"), [("desktop", None, 3), ("desktop", 2, 2), ("smoke", None, 1)])
def test_runs_are_the_shared_runs_of_every_seed(tmp_path, budget, given, expected):
    info = DataInfo("fashion-like", (28, 28), 1, [str(i) for i in range(10)], 60_000)
    exp = Attention(Suite(tmp_path, "fashion-like", budget, given, info))
    specs = exp.runs()
    assert exp.seeds == list(range(expected)) and len(specs) == 2 * expected
    for role in ("vit", "hybrid"):
        mine = [s for s in specs if s.model == exp.cfg[role]]
        assert [s.recipe["seed"] for s in mine] == list(range(expected))
        assert [s.key for s in mine] == [exp.base_spec(exp.cfg[role], seed).key for seed in range(expected)]
    assert exp.planned()
