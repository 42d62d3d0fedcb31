"""The suite's shared machinery: seeds honoured by every experiment, each seed's own subsets,
choices made on the minival, the plan, and publishing the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vitkit.data import ArrayDataset, carve
from vitkit.reproduce import EXPERIMENTS
from vitkit.reproduce.app import _classes
from vitkit.reproduce.core.experiment import Experiment
from vitkit.reproduce.core.provenance import source_commit
from vitkit.reproduce.core.report import publish
from vitkit.reproduce.core.results import SCORE_VERSION
from vitkit.reproduce.core.spec import DataInfo, Suite

INFO = DataInfo("fmnist-like", (28, 28), 1, [str(i) for i in range(10)], 60_000)


def _suite(tmp_path: Path, seeds: int | None = None, budget: str = "desktop", planning: bool = True) -> Suite:
    suite = Suite(tmp_path, "fmnist-like", budget, seeds, INFO)
    suite.planning = planning
    return suite


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_seeds_are_honoured_by_every_experiment(tmp_path, name):
    exp = _classes()[name](_suite(tmp_path, seeds=4))
    assert exp.seeds == [0, 1, 2, 3]
    seeds = {s.recipe["seed"] for s in exp.runs()}
    assert seeds == {0, 1, 2, 3}, f"{name} plans seeds {sorted(seeds)} with --seeds 4"


def test_the_desktop_budget_compares_three_seeds(tmp_path):
    for cls in _classes().values():
        assert len(cls(_suite(tmp_path)).seeds) >= 3


def test_each_seed_draws_its_own_subsets(tmp_path):
    suite = _suite(tmp_path)
    a, b = (suite.recipe("vit-tiny", seed, subset=580) for seed in (0, 1))
    assert (a["data"]["subset_seed"], b["data"]["subset_seed"]) == (0, 1)
    labels = torch.arange(600).remainder(3)
    ids = torch.arange(600)  # each image's index, in two bytes of its pixels
    images = torch.stack([ids // 256, ids % 256], 1).to(torch.uint8).view(-1, 1, 1, 2)
    ds = ArrayDataset(images, labels, ["a", "b", "c"], name="toy")

    def drawn(subset: int, seed: int) -> set[int]:
        x = carve(ds, "train", minival=30, subset=subset, seed=seed).images.view(-1, 2).to(torch.int64)
        return set((x[:, 0] * 256 + x[:, 1]).tolist())

    assert drawn(60, 0) != drawn(60, 1)
    assert drawn(30, 1) <= drawn(60, 1)  # one seed's subsets stay nested


def _finish(suite: Suite, spec, minival: float) -> None:
    folder = suite.run_dir(spec)
    folder.mkdir(parents=True)
    result = {"score_version": SCORE_VERSION, "test_top1": 0.5, "minival_top1": minival,
              "fewshot": {"mean": 0.5, "shots": 10}, "wall_seconds": 1.0, "train_flops": 1e9}  # fmt: skip
    (folder / "result.json").write_text(json.dumps(result))


def test_a_choice_waits_for_its_runs_and_takes_the_best_minival(tmp_path):
    suite = _suite(tmp_path, planning=False)
    exp = Experiment.__new__(Experiment)
    exp.suite = suite
    grid = {lr: [suite_spec(suite, lr, s)] for s in (0,) for lr in (5e-4, 1e-3, 2e-3)}
    assert exp.choose_on_minival(grid) is None  # nothing finished
    for (_lr, [spec]), acc in zip(grid.items(), (0.71, 0.78, float("nan"))):
        _finish(suite, spec, acc)
    assert exp.choose_on_minival(grid) == 1e-3  # a diverged option is never chosen
    suite.planning = True
    assert exp.choose_on_minival({"x": [], "y": []}) == "x"


def suite_spec(suite: Suite, lr: float, seed: int):
    from vitkit.reproduce.core.spec import RunSpec

    tree = suite.recipe("vit-tiny", seed, extra={"optim": {"lr": lr}})
    return RunSpec(label=f"lr {lr}", model="vit-tiny", recipe=tree)


def test_publish_copies_the_report_and_replaces_old_figures(tmp_path):
    out, dest = tmp_path / "suite", tmp_path / "docs"
    (out / "figures").mkdir(parents=True)
    (out / "report.md").write_text("# report\n![x](figures/a.png)\n")
    (out / "report.json").write_text("{}")
    (out / "figures" / "a.png").write_bytes(b"png")
    (dest / "figures").mkdir(parents=True)
    (dest / "figures" / "stale.png").write_bytes(b"old")
    md = publish(out, dest)
    assert md.read_text().startswith("# report")
    assert sorted(p.name for p in (dest / "figures").iterdir()) == ["a.png"]
    assert (dest / "report.json").read_text() == "{}"


def test_a_grid_goes_on_past_an_edge_in_its_own_pattern():
    from vitkit.reproduce.core.experiment import _next_rate

    paper = [0.001, 0.003, 0.01, 0.03]  # the fine-tuning grid: 1-3-10
    assert _next_rate(paper[::-1][:3]) == 0.1 and _next_rate([0.1, 0.03, 0.01]) == 0.3
    assert _next_rate(paper[:3]) == 3e-4
    assert _next_rate([4e-3, 2e-3, 1e-3]) == 8e-3 and _next_rate([8e-3, 4e-3, 2e-3]) == 2e-2  # 1.6e-2, one digit
    assert _next_rate([3e-3, 1e-3]) == 9e-3 and _next_rate([1e-3, 3e-3]) == 3e-4  # a grid of two: its ratio


def test_the_report_names_the_commit_that_made_it():
    commit = source_commit()
    if commit is None:
        pytest.skip("not a git checkout")
    assert len(commit.split("+")[0]) == 12


def test_the_full_budget_plans_gpu_sized_pairs(tmp_path):
    """The full budget pairs models by cost as the paper does (ViT-B/32 with ResNet50x1)."""
    from vitkit.models.flops import resnet_flops, vit_flops
    from vitkit.models.registry import model_config

    info = DataInfo("imagenet-like", (256, 256), 3, [str(i) for i in range(1000)], 1_281_167)
    suite = Suite(tmp_path, "imagenet-like", "full", None, info)
    costs = {}
    for role in ("vit-tiny", "bit-r8", "vit-large"):
        m = suite.model_section(role)
        cfg = model_config(m["name"], **m["overrides"])
        costs[role] = resnet_flops(cfg) if hasattr(cfg, "units") else vit_flops(cfg)
    assert 0.8 < costs["vit-tiny"] / costs["bit-r8"] < 1.25
    assert costs["vit-large"] / costs["vit-tiny"] >= 3.5


def test_the_summary_shows_each_experiment_s_agreement_sentence():
    from vitkit.reproduce.core.experiment import sentence_from
    from vitkit.reproduce.core.report import headline_table

    verdict = "By the minival, 2e-3. Against Figure 9: GAP's rate is not lower, unlike the paper. More follows."
    said = sentence_from(verdict, "Against Figure 9:")
    assert said == "Against Figure 9: GAP's rate is not lower, unlike the paper."
    assert sentence_from(verdict, "Against Figure 4:") == ""
    table = headline_table(
        {
            "pooling": {"follows": "Figure 9", "runs": 18, "verdict": verdict, "headline": said},
            "attention": {"follows": "Figure 7", "runs": 6, "verdict": "Heads span 13.9 to 14.3 px. Then more."},
        }
    )
    assert "| `pooling` | Figure 9 | 18 | Against Figure 9: GAP's rate is not lower, unlike the paper. |" in table
    assert "| `attention` | Figure 7 | 6 | Heads span 13.9 to 14.3 px. |" in table


def test_every_experiment_registers_itself_in_order():
    from vitkit.reproduce.core.registry import registered

    assert list(registered()) == list(EXPERIMENTS)
    assert all(cls.name == name for name, cls in registered().items())


def test_the_published_report_renders_again_byte_for_byte():
    """``report.md`` is a function of ``report.json`` alone: the published report regenerates
    identical from its JSON (runs, numbers, prose), without training or scoring anything."""
    from vitkit.reproduce.core.report import render

    docs = Path(__file__).resolve().parent.parent / "docs" / "reproduce"
    report = json.loads((docs / "report.json").read_bytes())
    assert render(report).encode("utf-8") == (docs / "report.md").read_bytes()


def test_a_written_report_renders_again_from_its_json(tmp_path):
    """What :func:`write_report` writes reads back to the same markdown, a diverged run's nan
    (``null`` in the JSON) included."""
    from vitkit.reproduce.core.experiment import Section
    from vitkit.reproduce.core.report import render, write_report

    section = Section("pooling", "Figure 9", "claim", "paper", ["a", "b"], [["1", "2"]], {"x": float("nan")},
                      "verdict. More.", caption="Measured (custom)", tables=[("more", ["c"], [["3"]])],
                      runs=2, wall_seconds=90.0)  # fmt: skip
    run = {"test_top1": float("nan"), "fewshot": {"mean": 0.5}, "wall_seconds": 60.0, "runs_at_once": 2}
    meta = {"command": "vitkit reproduce", "date": "today", "budget": "smoke", "data": "synthetic", "seeds": 1,
            "img_size": [28, 28], "fewshot": "10-shot digits", "seconds": 12.0,
            "machine": {"cpu": "cpu", "cores": 2, "gpu": None, "torch": "2", "commit": None}}  # fmt: skip
    md, js = write_report(tmp_path, [section], meta, {"k": run})
    report = json.loads(js.read_text())
    assert (
        report["runs"]["k"]["test_top1"] is None and report["experiments"]["pooling"]["caption"] == "Measured (custom)"
    )
    assert render(report).encode("utf-8") == md.read_bytes()
    assert "**Measured (custom):**" in md.read_text() and "**more:**" in md.read_text()


def test_width_matched_features_share_one_width():
    from vitkit.reproduce.core.scoring import width_matched

    g = torch.Generator().manual_seed(0)
    wide = torch.randn(300, 256, generator=g) @ torch.randn(256, 256, generator=g) + 5.0
    test = torch.randn(50, 256, generator=g)
    pool_w, test_w = width_matched(wide, [test], 64)
    assert pool_w.shape == (300, 64) and test_w.shape == (50, 64)
    assert pool_w.mean(0).abs().max() < 1e-3  # centred on the pool
    var = pool_w.var(0)
    assert (var[:-1] >= var[1:] - 1e-3).all()  # leading directions first
    (narrow,) = width_matched(torch.randn(100, 32, generator=g), [], 64)
    assert narrow.shape == (100, 32)  # narrower features keep their width
    (few,) = width_matched(torch.randn(10, 256, generator=g), [], 64)
    assert few.shape == (10, 10)  # no more directions than pool images


def test_in_domain_fewshot_scores_a_model_on_its_own_task(tmp_path):
    from vitkit.errors import DataError
    from vitkit.reproduce.core.scoring import ScoreSettings, fewshot_in_domain, initial_model
    from vitkit.reproduce.core.spec import DataInfo, Suite
    from vitkit.reproduce.experiments.data_scaling import DataScaling
    from vitkit.train.config import recipe_from_dict

    info = DataInfo("synthetic", (32, 32), 3, [str(i) for i in range(10)], 2048)
    suite = Suite(tmp_path, "synthetic", "smoke", None, info)
    tree = DataScaling(suite).runs()[0].recipe
    net = initial_model(tree, suite.info)
    settings = ScoreSettings.of(suite)
    assert settings.in_domain_shots == 10 and settings.in_domain_width == 64
    got = fewshot_in_domain(net, recipe_from_dict(tree), settings, "fp32")
    assert got["shots"] == 5  # a minival of 100 holds 10 of each class: half the shots, half the l2 choice
    assert got["width"] == min(64, got["features"]) and 0.0 <= got["mean"] <= 1.0 and len(got["per_seed"]) == 5
    tree["data"]["minival"] = 0
    with pytest.raises(DataError, match="data.minival is 0"):
        fewshot_in_domain(net, recipe_from_dict(tree), settings, "fp32")
