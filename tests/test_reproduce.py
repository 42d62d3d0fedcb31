"""``vitkit reproduce``: the carved splits it trains on, the smoke budget end to end (every
experiment in the report), resume after a kill, another kind of data, and its clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vitkit.data import ArrayDataset, ImageFolder, build_dataset, carve
from vitkit.data.carve import balanced_quota, class_orders
from vitkit.errors import DataError, UsageError
from vitkit.reproduce import EXPERIMENTS, reproduce
from vitkit.reproduce.core.scoring import ScoreSettings, check_fewshot_data
from vitkit.reproduce.core.spec import DataInfo, Suite, check_experiments

pytest.importorskip("sklearn")  # the few-shot transfer task (scikit-learn's digits)
pytest.importorskip("matplotlib")


def _arrays(per_class: list[int]) -> ArrayDataset:
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(per_class)])
    images = torch.arange(len(labels), dtype=torch.int64).remainder(256).to(torch.uint8).view(-1, 1, 1, 1)
    images = images.expand(-1, 1, 4, 4).contiguous()
    return ArrayDataset(images, labels, [f"c{c}" for c in range(len(per_class))], name="toy")


# -- carved splits -------------------------------------------------------------------------------


def test_minival_and_subsets_are_balanced_nested_and_disjoint():
    ds = _arrays([50, 50, 50])
    val = carve(ds, "minival", minival=30, seed=0)
    assert val.labels.bincount().tolist() == [10, 10, 10]
    small = carve(ds, "train", minival=30, subset=12, seed=0)
    large = carve(ds, "train", minival=30, subset=60, seed=0)
    assert small.labels.bincount().tolist() == [4, 4, 4]
    assert large.labels.bincount().tolist() == [20, 20, 20]
    orders = class_orders(ds.labels, 3, 0)
    val_idx = {int(i) for o in orders for i in o[:10]}
    small_idx = {int(i) for o in orders for i in o[10:14]}
    large_idx = {int(i) for o in orders for i in o[10:30]}
    assert small_idx <= large_idx and not (large_idx & val_idx)
    # the carved datasets hold exactly those images
    assert sorted(small.images[:, 0, 0, 0].tolist()) == sorted(ds.images[sorted(small_idx), 0, 0, 0].tolist())
    assert sorted(val.images[:, 0, 0, 0].tolist()) == sorted(ds.images[sorted(val_idx), 0, 0, 0].tolist())
    everything = carve(ds, "train", minival=30, subset=1.0, seed=0)
    assert len(everything) == 120
    assert len(carve(ds, "train", minival=30, subset=0.5, seed=0)) == 60


def test_balanced_quota_spreads_what_a_small_class_cannot_fill():
    assert balanced_quota([2, 10, 10], 12) == [2, 5, 5]
    assert sum(balanced_quota([3, 7, 1], 11)) == 11
    with pytest.raises(DataError):
        balanced_quota([1, 1], 3)


def test_carve_errors_name_the_problem():
    ds = _arrays([10, 10])
    with pytest.raises(DataError, match="larger than the 16 training images"):
        carve(ds, "train", minival=4, subset=17)
    with pytest.raises(DataError, match="one of each"):
        carve(_arrays([5, 5, 5]), "train", subset=2)
    assert len(carve(ds, "train", subset=1)) == 20  # 1 (or 1.0): the whole split
    with pytest.raises(DataError, match="needs data.minival"):
        carve(ds, "minival")
    with pytest.raises(DataError, match="whole number"):
        carve(ds, "train", subset=2.5)


def test_build_dataset_carves_and_digits_are_a_source():
    train = build_dataset("digits", "train", minival=100, subset=200)
    val = build_dataset("digits", "minival", minival=100)
    assert len(train) == 200 and len(val) == 100
    assert train.labels.bincount().tolist() == [20] * 10
    test = build_dataset("digits", "test")
    assert len(test) + len(build_dataset("digits", "train")) == 1797
    assert test.image_size == (8, 8) and test.in_chans == 1
    with pytest.raises(DataError, match="minival"):
        build_dataset("digits", "minival")


def _rgb_folder(root: Path, classes: int, per_class: int, size: tuple[int, int]) -> Path:
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = torch.zeros(size[0], size[1], 3)
            base[..., c % 3] = 0.3 + 0.2 * (c // 3)  # classes differ in colour
            img = (base + 0.3 * torch.rand(size[0], size[1], 3, generator=g)).clamp(0, 1)
            Image.fromarray((img * 255).to(torch.uint8).numpy()).save(root / f"class{c}" / f"{i}.png")
    return root


def test_image_folder_subsets(tmp_path):
    root = _rgb_folder(tmp_path / "imgs", 3, 12, (10, 12))
    train = ImageFolder(root, "train", load_size=(10, 12))
    part = carve(train, "train", minival=6, subset=9)
    assert isinstance(part, ImageFolder) and len(part) == 9
    assert part.labels.bincount().tolist() == [3, 3, 3]
    x, y = next(part.batches(9))
    assert x.shape == (9, 3, 10, 12) and sorted(y.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


# -- the suite ----------------------------------------------------------------------------------


def test_unknown_experiment_suggests_the_close_one():
    with pytest.raises(UsageError, match="did you mean pos-embed"):
        check_experiments(["pos-embd"])
    assert check_experiments(["pooling", "compute"]) == ["compute", "pooling"]
    assert check_experiments([]) == list(EXPERIMENTS)


def test_a_budget_that_cannot_fit_the_data_is_one_clear_error(tmp_path):
    info = DataInfo("tiny", (28, 28), 1, [str(i) for i in range(10)], 1000)
    suite = Suite(tmp_path, "tiny", "smoke", None, info)
    with pytest.raises(DataError, match="larger than the 900 training images"):
        suite.subset_size(5000)
    with pytest.raises(DataError, match="cannot spare a minival"):
        Suite(tmp_path, "tiny", "desktop", None, DataInfo("tiny", (28, 28), 1, ["a", "b"], 1500))
    with pytest.raises(UsageError, match="unknown budget"):
        Suite(tmp_path, "tiny", "huge", None, info)


def test_fewshot_task_with_too_few_images_per_class(tmp_path):
    folder = _rgb_folder(tmp_path / "few", 2, 12, (8, 8))  # ~11 training images a class < 2 x 10 shots
    settings = ScoreSettings(data="x", test_images=None, fewshot_data=str(folder), shots=10, fewshot_seeds=1)
    with pytest.raises(DataError, match="needs 20 training images of every class"):
        check_fewshot_data(settings)


def _numbers(report: dict) -> dict[str, tuple[float, float]]:
    return {k: (r["test_top1"], r["fewshot"]["mean"]) for k, r in report["runs"].items()}


@pytest.mark.slow
def test_smoke_budget_end_to_end(tmp_path):
    """Every experiment of the smoke budget, on data that is neither 28 px nor grey: the report,
    its JSON and a figure per experiment; a second call trains nothing and gives the same numbers."""
    lines: list[str] = []
    md = reproduce(out=tmp_path, data="synthetic", budget="smoke", report=lines.append)
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["experiments"]) == list(EXPERIMENTS)
    text = md.read_text()
    for name in EXPERIMENTS:
        section = report["experiments"][name]
        assert f"## `{name}`" in text and section["verdict"] and section["table"]["rows"]
        assert all((tmp_path / f).is_file() for f in section["figures"]) and section["figures"]
    assert report["meta"]["img_size"] == [28, 28]  # synthetic 32 px, capped by the smoke budget
    assert any(line.startswith("[1/") and "ETA" in line for line in lines)
    for run in report["runs"].values():
        assert 0.0 <= run["test_top1"] <= 1.0 and 0.0 <= run["fewshot"]["mean"] <= 1.0
        assert (tmp_path / "runs" / run["key"] / "best.safetensors").is_file()
    again: list[str] = []
    reproduce(out=tmp_path, data="synthetic", budget="smoke", report=again.append)
    assert again[0].endswith("; 0 to run")
    assert _numbers(json.loads((tmp_path / "report.json").read_text())) == _numbers(report)
    _the_eta_counts_the_phases_not_yet_planned(tmp_path)


def _the_eta_counts_the_phases_not_yet_planned(out: Path) -> None:
    """The ETA's cost of a call counts the runs a grid's choice adds later: before the choice it
    exceeds what is planned; once every grid has chosen it is exactly the call's runs."""
    from vitkit.reproduce.app import _classes, _planned_cost, _unique, data_info
    from vitkit.reproduce.core.runner import Runner

    def call_cost(folder: Path) -> tuple[float, float]:
        suite = Suite(folder, "synthetic", "smoke", None, data_info("synthetic"))
        runner = Runner(suite, 1, lambda line: None)
        specs = _unique([s for e in _classes().values() for s in e(suite).runs()])
        return _planned_cost(list(EXPERIMENTS), suite, runner), sum(runner.cost(s) for s in specs)

    planned, now = call_cost(out)
    assert planned == pytest.approx(now)  # every phase is planned in a finished suite
    planned, now = call_cost(out / "fresh")
    assert planned > now * 1.1  # data-scaling's runs at the chosen rate, resolution's fine-tunes


@pytest.mark.slow
def test_rgb_folder_of_another_size(tmp_path):
    folder = _rgb_folder(tmp_path / "rgb", 4, 70, (20, 20))
    reproduce(["pooling"], out=tmp_path / "out", data=str(folder), budget="smoke", report=lambda s: None)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["meta"]["img_size"] == [20, 20]
    assert "pooling" in report["experiments"]
    run = next(iter(report["runs"].values()))
    assert run["img_size"] == [20, 20]


@pytest.mark.slow
def test_killed_suite_resumes_to_the_same_numbers(tmp_path):
    """SIGKILL while a run is training (a checkpoint written, no result yet), run again: the
    numbers equal an uninterrupted suite's."""
    cmd = [sys.executable, "-m", "vitkit", "reproduce", "pooling", "--budget", "smoke", "--data", "synthetic"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    subprocess.run([*cmd, "--out", str(tmp_path / "whole")], check=True, env=env, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    finished: list[Path] = []
    mid: list[Path] = []
    try:
        while time.time() < deadline and proc.poll() is None:
            runs = list((killed / "runs").glob("*")) if (killed / "runs").is_dir() else []
            finished = [r for r in runs if (r / "result.json").is_file()]
            mid = [r for r in runs if list(r.glob("checkpoints/*.safetensors")) and not (r / "result.json").is_file()]
            if finished and mid:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert finished and mid, "the suite ended before it could be killed mid-run"
    subprocess.run([*cmd, "--out", str(killed)], check=True, env=env, capture_output=True)
    whole = json.loads((tmp_path / "whole" / "report.json").read_text())
    resumed = json.loads((killed / "report.json").read_text())
    assert _numbers(resumed) == _numbers(whole)


@pytest.mark.parametrize("budget", ["smoke", "desktop", "full"])
def test_every_budget_plans_valid_runs(tmp_path, budget):
    """Each budget's recipes validate and its models build (no training): the full budget is
    sized for a GPU, so this is what a CPU-only test suite can check of it."""
    from vitkit.models.registry import model_config
    from vitkit.reproduce.app import _classes

    info = DataInfo("imagenet-like", (256, 256), 3, [str(i) for i in range(100)], 130_000)
    suite = Suite(tmp_path, "imagenet-like", budget, None, info)
    keys = set()
    for name, cls in _classes().items():
        specs = cls(suite).runs()
        assert specs, name
        for spec in specs:
            m = spec.recipe["model"]
            cfg = model_config(m["name"], **m["overrides"])
            if name != "resolution":  # the resolution study pre-trains at a reduced size, fine-tunes at the data's
                assert tuple(cfg.img_size) == suite.img_size
            keys.add(spec.key)
    assert len(keys) > 10


def test_auto_jobs_trains_one_run_a_core_on_a_cpu_for_the_desktop_budget(monkeypatch):
    """``--jobs auto``: the desktop budget's small models train one run a core on a CPU (the
    cores reported are overridden here); a GPU, the smoke budget and the full budget get 1."""
    from vitkit.reproduce.core import pool

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4}, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pool.usable_cores() == 5
    assert pool.auto_jobs("desktop") == 5
    assert pool.auto_jobs("smoke") == 1 and pool.auto_jobs("full") == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pool.auto_jobs("desktop") == 1


def test_the_cli_takes_jobs_auto_by_default_and_the_api_refuses_a_bad_value(tmp_path):
    from vitkit.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["reproduce", "--out", "o"]).jobs == "auto"
    assert parser.parse_args(["reproduce", "--out", "o", "--jobs", "3"]).jobs == 3
    with pytest.raises(ValueError, match="jobs must be a whole number or 'auto', got 'two'"):
        reproduce(["pooling"], out=tmp_path, data="synthetic", budget="smoke", jobs="two", report=lambda s: None)


def test_the_make_targets_run_every_experiment_once():
    """``make reproduce`` is its ``reproduce-N`` calls, which name every experiment; one named by
    several calls is named by consecutive ones, each but the last stopped by ``--stop-after``
    (benchmarks/reproduce_budget.py reads the same lines to estimate each call's time)."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    try:
        from reproduce_budget import make_calls, make_limits
    finally:
        sys.path.pop(0)
    calls, limits = make_calls(), make_limits()
    names = list(calls)
    assert sorted({e for experiments in calls.values() for e in experiments}) == sorted(EXPERIMENTS), calls
    for e in EXPERIMENTS:
        at = [i for i, n in enumerate(names) if e in calls[n]]
        assert at == list(range(at[0], at[-1] + 1)), f"{e} is named by calls that are not consecutive"
        assert all(names[i] in limits for i in at[:-1]), f"{e}: a call before its last has no --stop-after"
    assert all(0 < m <= 120 for m in limits.values()) and len(calls) >= 2, (calls, limits)
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    assert f"reproduce: {' '.join(calls)}\n" in makefile


@pytest.mark.slow  # ten kinds of run, each trained for 3 steps and scored twice at once: minutes
def test_the_budget_benchmark_estimates_every_make_target(tmp_path, monkeypatch):
    """benchmarks/reproduce_budget.py measures every kind of desktop run and writes each make
    target's runs and minutes (on a Fashion-MNIST of the real one's size)."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from _standins import tiny_fashion_mnist
    finally:
        sys.path.pop(0)
    tiny_fashion_mnist(tmp_path / "data" / "fashion-mnist", 6000, 1000)
    out = tmp_path / "budget.json"
    script = Path(__file__).parent.parent / "benchmarks" / "reproduce_budget.py"
    env = {**os.environ, "VITKIT_DATA": str(tmp_path / "data")}
    done = subprocess.run(
        [sys.executable, str(script), "--steps", "3", "--json", str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert [c["call"] for c in data["calls"]] == ["reproduce-1", "reproduce-2", "reproduce-3", "reproduce-4"]
    # the calls split the whole desktop suite (its --plan count), each run in one call
    from vitkit.reproduce.app import _classes, _unique, data_info

    monkeypatch.setenv("VITKIT_DATA", str(tmp_path / "data"))
    suite = Suite(tmp_path / "plan", "fashion-mnist", "desktop", None, data_info("fashion-mnist"))
    suite.planning = True
    every = _unique([s for cls in _classes().values() for s in cls(suite).runs()])
    assert sum(c["runs"] for c in data["calls"]) == len(every) > 150
    assert all(c["minutes_longest"] >= c["minutes"] > 0 for c in data["calls"] if c["runs"])
    assert data["calls"][0]["stop_after"] == 110 and data["calls"][0]["minutes_longest"] <= 110
    assert "vit-tiny 28x28 px relative" in data["kinds"] and data["meta"]["jobs"] >= 1


def test_runs_trained_at_once_start_costliest_first(tmp_path):
    """Several runs at once start with the costliest, so that a phase does not end on one long
    run while the other cores idle; equal costs keep their order."""
    from vitkit.reproduce.app import _classes, _unique, data_info
    from vitkit.reproduce.core.runner import Runner

    suite = Suite(tmp_path, "synthetic", "smoke", None, data_info("synthetic"))
    runner = Runner(suite, 2, lambda line: None)
    specs = _unique([s for s in _classes()["compute"](suite).runs()])
    ordered = runner.longest_first(specs)
    costs = [runner.cost(s) for s in ordered]
    assert sorted(s.key for s in ordered) == sorted(s.key for s in specs)
    assert costs == sorted(costs, reverse=True) and costs[0] > costs[-1]
    ties = [s for s in specs if runner.cost(s) == costs[-1]]
    assert [s for s in ordered if runner.cost(s) == costs[-1]] == ties
