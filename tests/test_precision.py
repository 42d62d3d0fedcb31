"""The precision policy (vitkit.precision): what auto resolves to with native bf16 and without it,
on any CPU (VITKIT_BF16 overrides the CPU's report), and that every user of it asks it."""

from __future__ import annotations

import platform

import pytest
import torch
import yaml

import vitkit.precision as P
from _recipes import tiny_recipe
from vitkit.errors import UsageError
from vitkit.train import find_recipe, load_recipe
from vitkit.train.config import CONFIG_DIR

BRANCHES = {"native": "bf16", "emulated": "fp32"}


@pytest.fixture(params=sorted(BRANCHES))
def branch(request, monkeypatch):
    """Each test runs once as on a CPU with native bf16 and once as on one that emulates it."""
    monkeypatch.setenv(P.OVERRIDE_ENV, request.param)
    return request.param


@pytest.fixture(autouse=True)
def _fresh_policy():
    P.clear_cache()
    yield
    P.clear_cache()


def test_auto_resolves_by_the_cpu_report_and_explicit_choices_win(branch):
    choice = P.resolve_precision("auto")
    assert choice.name == BRANCHES[branch] and choice.requested == "auto"
    assert f"precision: auto -> {choice.name} (" in choice.describe() and P.OVERRIDE_ENV in choice.reason
    assert choice.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[choice.name]
    assert P.resolve_precision("fp32").name == "fp32" and P.resolve_precision("fp32").warning is None
    assert P.resolve_precision("bf16").name == "bf16"


def test_an_explicit_bf16_where_it_is_emulated_warns_once_with_its_measured_cost(monkeypatch):
    monkeypatch.setenv(P.OVERRIDE_ENV, "emulated")
    monkeypatch.setattr(P, "bf16_slowdown", lambda device="cpu": 117.0)
    choice = P.resolve_precision("bf16")
    assert choice.name == "bf16" and "117x slower than fp32" in choice.warning
    assert P.take_warning(choice) == choice.warning
    assert P.take_warning(P.resolve_precision("bf16")) is None  # once a process
    monkeypatch.setenv(P.OVERRIDE_ENV, "native")
    assert P.resolve_precision("bf16").warning is None


def test_bad_names_are_one_clear_line(monkeypatch):
    with pytest.raises(UsageError, match=r"precision must be one of auto, fp32, bf16; got 'fp16'"):
        P.resolve_precision("fp16")
    monkeypatch.setenv(P.OVERRIDE_ENV, "sometimes")
    with pytest.raises(UsageError, match=r"VITKIT_BF16='sometimes': use 'native' or 'emulated'"):
        P.resolve_precision("auto")


def test_the_real_report_on_this_machine_agrees_with_onednn(monkeypatch):
    """Without the override: on x86, no oneDNN bf16 means fp32; oneDNN bf16 with the CPU's bf16
    flags means bf16 (what this machine is, either way)."""
    monkeypatch.delenv(P.OVERRIDE_ENV, raising=False)
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86 branch")
    onednn = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    flags = P.cpu_info()["flags"]
    support = P.bf16_support("cpu")
    if not onednn:
        assert not support.native and "no native bf16" in support.reason
    elif flags.get("avx512_bf16") or flags.get("amx_bf16"):
        assert support.native


@pytest.mark.parametrize("slowdown, native", [(130.0, False), (1.3, False), (0.6, True), (1.0, True)])
def test_an_unknown_cpu_kind_takes_bf16_only_when_the_probe_finds_it_as_fast(monkeypatch, slowdown, native):
    monkeypatch.delenv(P.OVERRIDE_ENV, raising=False)
    monkeypatch.setattr(P.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(P, "bf16_slowdown", lambda device="cpu": slowdown)
    support = P.bf16_support("cpu")
    assert support.native is native and "aarch64" in support.reason
    assert P.resolve_precision("auto").name == ("bf16" if native else "fp32")


def test_avx512_without_bf16_instructions_is_decided_by_the_probe(monkeypatch):
    """oneDNN runs bf16 on any AVX-512 CPU, by conversion where the CPU has no bf16 instructions:
    not conclusive, so measured."""
    monkeypatch.delenv(P.OVERRIDE_ENV, raising=False)
    monkeypatch.setattr(P.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(P, "cpu_info", lambda: {"flags": {"avx512f": True, "avx512_bf16": False}})
    monkeypatch.setattr(P, "bf16_slowdown", lambda device="cpu": 1.8)
    assert not P.bf16_support("cpu").native
    monkeypatch.setattr(P, "cpu_info", lambda: {"flags": {"avx512f": True, "amx_bf16": True}})
    P.clear_cache()
    assert P.bf16_support("cpu").native and "AMX" in P.bf16_support("cpu").reason


def test_the_probe_measures_a_ratio():
    assert P.bf16_slowdown("cpu") > 0


def test_every_shipped_recipe_says_auto_and_resolves_by_the_cpu(branch):
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    assert "fmnist_vit" in names
    for name in names:
        recipe = load_recipe(find_recipe(name))
        assert recipe.train.precision == "auto", name
        assert P.resolve_precision(recipe.train.precision).name == BRANCHES[branch], name


@pytest.mark.parametrize("budget", ["smoke", "desktop", "full"])
def test_every_reproduce_run_resolves_by_the_cpu(tmp_path, monkeypatch, budget):
    from vitkit.reproduce.app import _classes
    from vitkit.reproduce.core.spec import DataInfo, Suite

    info = DataInfo("imagenet-like", (256, 256), 3, [str(i) for i in range(100)], 130_000)
    suite = Suite(tmp_path, "imagenet-like", budget, None, info)
    for state, name in BRANCHES.items():
        monkeypatch.setenv(P.OVERRIDE_ENV, state)
        for cls in _classes().values():
            for spec in cls(suite).runs():
                assert P.resolve_precision(spec.recipe["train"]["precision"]).name == name, spec.key


def test_the_demo_recipe_trains_as_the_cpu_computes(tmp_path, branch):
    """The demo recipe with a tiny model: the step computes through a bf16 copy where bf16 is
    native, in fp32 with no copy elsewhere, and Muon iterates in the same precision; the choice
    heads config.yaml and is kept in the checkpoint."""
    from vitkit.train.compute import AutocastCompute, Bf16CopyCompute
    from vitkit.train.loop import Trainer
    from vitkit.train.state import list_checkpoints, load_train_state

    sets = [
        ("data.name", "synthetic"),
        ("data.eval_split", ""),
        ("data.options", {"img_size": 28, "n": 64, "in_chans": 1}),
        ("model.overrides.width", 32),
        ("model.overrides.depth", 2),
        ("model.overrides.mlp_dim", 64),
        ("model.overrides.num_heads", 2),
        ("train.steps", 2),
        ("train.batch_size", 16),
        ("log.checkpoint_every", 2),
        ("log.plot", False),
    ]
    recipe = load_recipe(find_recipe("fmnist_vit"), sets)
    messages: list[str] = []
    trainer = Trainer(recipe, tmp_path / "run", progress=_Progress(messages))
    try:
        want = BRANCHES[branch]
        assert trainer.precision.name == want
        assert type(trainer.compute) is (Bf16CopyCompute if want == "bf16" else AutocastCompute)
        assert trainer.optimizer.ns_dtype(torch.device("cpu")) == trainer.precision.dtype
        result = trainer.run()
    finally:
        trainer.close()
    assert result.step == 2
    assert any(m.startswith(f"precision: auto -> {want} (") for m in messages), messages
    header = (tmp_path / "run" / "config.yaml").read_text().splitlines()[0]
    assert header.startswith(f"# precision: auto -> {want} (")
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["precision"] == "auto"
    assert load_train_state(list_checkpoints(tmp_path / "run" / "checkpoints")[-1]).state.precision == want


class _Progress:
    def __init__(self, messages: list[str]) -> None:
        self.messages = messages

    def start(self, total: int, initial: int) -> None: ...

    def update(self, steps: int, **postfix: object) -> None: ...

    def message(self, text: str) -> None:
        self.messages.append(text)

    def close(self) -> None: ...


def test_resuming_where_the_cpu_chooses_otherwise_is_allowed_and_said(tmp_path, monkeypatch):
    """A run begun where bf16 is emulated (fp32 steps) resumes where it is native (bf16 steps):
    the weights on disk are fp32 either way, so it is allowed, and the change is said."""
    from _recipes import stopped
    from vitkit.train import train
    from vitkit.train.state import list_checkpoints, load_train_state

    recipe = tiny_recipe(tmp_path, train__precision="auto", train__steps=4, log__checkpoint_every=2)
    monkeypatch.setenv(P.OVERRIDE_ENV, "emulated")
    stopped(recipe, tmp_path / "run", 3, monkeypatch)
    assert load_train_state(list_checkpoints(tmp_path / "run" / "checkpoints")[-1]).state.precision == "fp32"
    monkeypatch.setenv(P.OVERRIDE_ENV, "native")
    messages: list[str] = []
    result = train(recipe, tmp_path / "run", _Progress(messages))
    assert result.step == 4 and result.resumed_from == 2
    assert any("resuming in bf16 a run whose steps so far computed in fp32" in m for m in messages), messages
    assert load_train_state(list_checkpoints(tmp_path / "run" / "checkpoints")[-1]).state.precision == "bf16"


def test_muon_iterates_in_the_resolved_precision(branch):
    from vitkit.train.muon import MuonAdamW

    w = torch.nn.Parameter(torch.randn(8, 16))
    opt = MuonAdamW([{"params": [w], "muon": True}], lr=0.01)
    assert opt.ns_dtype(torch.device("cpu")) == {"bf16": torch.bfloat16, "fp32": torch.float32}[BRANCHES[branch]]
    assert MuonAdamW([{"params": [w], "muon": True}], precision="fp32").ns_dtype(torch.device("cpu")) == torch.float32
    with pytest.raises(UsageError):
        MuonAdamW([{"params": [w], "muon": True}], precision="fp8")


def test_bench_and_serving_resolve_auto(branch):
    from vitkit.bench import bench_model
    from vitkit.inference import prepare_inference
    from vitkit.models.registry import create_model

    def tiny():
        return create_model("vit_ti16", img_size=16, patch_size=8, depth=1, width=32, num_heads=2, mlp_dim=64)

    r = bench_model("tiny", batch=2, precision="auto", warmup=1, iters=1, measure_ceiling=False, model=tiny())
    assert r.precision == BRANCHES[branch]
    served = prepare_inference(tiny(), "auto")
    assert served.input_dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[BRANCHES[branch]]


def test_a_name_is_resolved_once_on_entry_and_a_precision_passes_as_it_is(branch):
    choice = P.resolve_precision("auto")
    assert P.as_precision(choice) is choice
    assert P.as_precision("auto").name == BRANCHES[branch]
    assert P.as_precision("fp32").name == "fp32"
    with pytest.raises(UsageError, match="precision must be one of"):
        P.as_precision("fp16")


def test_serving_takes_int8_beside_the_compute_precisions(branch):
    assert P.serving_precision("int8") == "int8"
    assert P.serving_precision("auto") == BRANCHES[branch]
    assert P.serving_precision(P.resolve_precision("fp32")) == "fp32"
    with pytest.raises(UsageError, match="auto, fp32, bf16, int8"):
        P.serving_precision("int4")


def test_a_precision_gives_its_forward_context():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with P.Precision("fp32", "fp32", "asked").autocast("cpu"):
        assert (x @ w).dtype == torch.float32
    with P.Precision("bf16", "bf16", "asked").autocast("cpu"):
        assert (x @ w).dtype == torch.bfloat16
