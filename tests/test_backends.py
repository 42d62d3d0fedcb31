"""``--backend``: OpenVINO and ONNX Runtime fed from vitkit's ONNX export, and ``auto``'s measured,
recorded choice, on a tiny random model. OpenVINO's tests skip where it is not installed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitkit
from vitkit import backends
from vitkit.backends import agreement, choose_backend, runtime_available, serving_backend
from vitkit.cli import main
from vitkit.errors import UsageError

# exporting even the tiny model takes seconds: the tests that run a runtime are slow ones
needs_ort = [
    pytest.mark.skipif(not runtime_available("onnxruntime"), reason="onnxruntime or onnxscript not installed"),
    pytest.mark.slow,
]
needs_ov = [pytest.mark.skipif(not runtime_available("openvino"), reason="openvino not installed"), pytest.mark.slow]


def with_ort(test):
    for mark in needs_ort:
        test = mark(test)
    return test


CLASSES = [f"class_{i}" for i in range(10)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One cache for the module: the tiny model is exported once (a few seconds), then reused."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def cache(cache_dir, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(cache_dir))


def tiny(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = vitkit.create_model(
        "vit_ti16", img_size=32, patch_size=8, depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=10
    )
    with torch.no_grad():  # a head that is not all zeros, so logits differ between images
        model.head.weight.normal_(std=0.5)
    return model.eval()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    vitkit.save_checkpoint(tiny(), run / "best.safetensors", extra={"classes": json.dumps(CLASSES)})
    return run


@pytest.mark.parametrize(
    "name", [pytest.param("onnxruntime", marks=needs_ort), pytest.param("openvino", marks=needs_ov)]
)
def test_runtime_model_gives_the_models_logits_and_embeddings(name):
    model = tiny()
    runner, decision = serving_backend(model, name, "fp32")
    assert decision is None and runner.backend == name
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(runner(x), model(x), atol=1e-4, rtol=1e-4)
        pooled = runner.forward_head(runner.forward_features(x), pre_logits=True)
        torch.testing.assert_close(
            pooled, model.forward_head(model.forward_features(x), pre_logits=True), atol=1e-4, rtol=0
        )
    assert runner.cfg is model.cfg and runner.num_classes == 10  # the commands read the source's attributes


@with_ort
def test_onnxruntime_dynamic_int8_stays_close_to_fp32():
    model = tiny()
    runner, _ = serving_backend(model, "onnxruntime", "int8")
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        report = agreement(runner.forward_features(x).numpy(), model.forward_features(x).numpy(), "int8")
    assert report["within"] and report["min_cosine"] > 0.98


@with_ort
def test_auto_measures_once_records_beside_the_weights_and_reads_the_record(run_dir):
    model = vitkit.load_pretrained(str(run_dir))
    first, _ = choose_backend(model, "fp32")
    assert not first.cached and set(first.images_per_s) >= {"torch", "onnxruntime"}
    assert first.file == str(run_dir / "backend.json")
    assert first.backend in first.images_per_s
    assert all(first.agreement[r]["within"] for r in first.agreement)
    again, runner = choose_backend(model, "fp32")
    assert again.cached and again.backend == first.backend and runner is None
    record = json.loads((run_dir / "backend.json").read_text())
    assert record["weights_sha256"] == backends.model_key(model) and len(record["decisions"]) == 1


@with_ort
def test_auto_never_picks_a_runtime_whose_outputs_disagree(monkeypatch):
    model = tiny()
    real = backends.runtime_session

    def broken(name, path, precision, calibration=None):  # fast and wrong
        run = real(name, path, precision, calibration)
        return lambda x, which=(0,): [o + 1.0 for o in run(x, which)]

    monkeypatch.setattr(backends, "runtime_session", broken)
    decision, runner = choose_backend(model, "fp32", remeasure=True)
    assert decision.backend == "torch" and runner is None
    assert not any(q["within"] for q in decision.agreement.values())


def test_auto_without_a_runtime_changes_nothing(monkeypatch):
    monkeypatch.setattr(backends, "runtime_available", lambda name: False)
    runner, decision = serving_backend(tiny(), "auto", "fp32")
    assert runner is None and decision.backend == "torch" and decision.reason
    with pytest.raises(UsageError, match="not installed"):
        serving_backend(tiny(), "onnxruntime", "fp32")


def test_agreement_tests_fp32_by_difference_and_int8_by_cosine():
    want = np.ones((2, 8), dtype=np.float32)
    assert agreement(want + 1e-5, want, "fp32")["within"]
    assert not agreement(want + 1e-2, want, "fp32")["within"]
    assert agreement(want * 1.5, want, "int8")["within"]  # the same direction: cosine 1
    assert not agreement(-want, want, "int8")["within"]
    assert not agreement(want[:, :4], want, "fp32")["within"]


@with_ort
def test_predict_and_eval_take_backend(run_dir, tmp_path, capsys):
    img = tmp_path / "a.png"
    from PIL import Image

    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)).save(img)
    outs = {}
    for backend in ("torch", "onnxruntime"):
        out = tmp_path / f"{backend}.json"
        assert (
            main(["predict", str(run_dir), str(img), "--backend", backend, "--precision", "fp32", "--json", str(out)])
            == 0
        )
        outs[backend] = json.loads(out.read_text())["predictions"][0]["top_k"]
    assert [r["class"] for r in outs["torch"]] == [r["class"] for r in outs["onnxruntime"]]
    assert np.allclose([r["prob"] for r in outs["torch"]], [r["prob"] for r in outs["onnxruntime"]], atol=1e-5)
    assert "backend onnxruntime" in capsys.readouterr().err
    args = ["eval", str(run_dir), "--data", "synthetic", "--max-images", "32", "--precision", "fp32"]
    tops = {}
    for backend in ("torch", "onnxruntime"):
        out = tmp_path / f"eval-{backend}.json"
        assert main([*args, "--backend", backend, "--json", str(out)]) == 0
        tops[backend] = json.loads(out.read_text())
    assert tops["torch"]["top1"] == tops["onnxruntime"]["top1"] and tops["onnxruntime"]["mode"] == "onnxruntime"


@with_ort
def test_embed_takes_backend(run_dir, tmp_path):
    from PIL import Image

    from vitkit.eval.embed import read_embeddings

    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray((rng.random((32, 32, 3)) * 255).astype(np.uint8)).save(folder / f"{i}.png")
    vecs = {}
    for backend in ("torch", "onnxruntime"):
        out = tmp_path / f"{backend}.safetensors"
        assert (
            main(
                [
                    "embed",
                    str(run_dir),
                    str(folder),
                    "--out",
                    str(out),
                    "--backend",
                    backend,
                    "--precision",
                    "fp32",
                    "--workers",
                    "0",
                ]
            )
            == 0
        )
        vecs[backend] = read_embeddings(out)
    assert torch.allclose(
        torch.as_tensor(vecs["torch"].vectors), torch.as_tensor(vecs["onnxruntime"].vectors), atol=1e-4
    )


def test_backend_on_a_gpu_is_refused_and_auto_is_torch_there():
    assert serving_backend(tiny(), "auto", "fp32", device="cuda") == (None, None)
    with pytest.raises(UsageError, match="runs on the CPU"):
        serving_backend(tiny(), "openvino", "fp32", device="cuda")


@with_ort
def test_the_commands_default_is_auto_unless_pinned(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    vitkit.save_checkpoint(tiny(3), run / "best.safetensors", extra={"classes": json.dumps(CLASSES)})
    args = ["eval", str(run), "--data", "synthetic", "--max-images", "16", "--precision", "fp32"]
    monkeypatch.setenv(backends.BACKEND_ENV, "torch")
    assert main(args) == 0
    assert not (run / "backend.json").exists() and "backend" not in capsys.readouterr().err
    monkeypatch.delenv(backends.BACKEND_ENV)
    assert main(args) == 0  # no --backend: auto measures, says what it chose, and records it
    assert "backend auto: " in capsys.readouterr().err and (run / "backend.json").exists()
    monkeypatch.setenv(backends.BACKEND_ENV, "tensorrt")
    assert main(args) == 2
    assert "VITKIT_BACKEND='tensorrt': must be one of auto, torch, openvino, onnxruntime" in capsys.readouterr().err


def test_token_merging_stays_on_vitkits_own_path(run_dir, tmp_path, capsys):
    img = tmp_path / "a.png"
    from PIL import Image

    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)).save(img)
    args = ["predict", str(run_dir), str(img), "--merge", "2", "--precision", "fp32"]
    assert main([*args, "--backend", "auto"]) == 0  # auto: merging is vitkit's own path, no runtime measured
    assert not (run_dir / "backend.json").exists() or "merge" not in (run_dir / "backend.json").read_text()
    assert main([*args, "--backend", "onnxruntime"]) == 2
    assert "--merge runs on vitkit's own path; --backend onnxruntime" in capsys.readouterr().err


@with_ort
def test_serve_answers_from_a_runtime(run_dir):
    from vitkit.serve import ModelService

    model = vitkit.load_pretrained(str(run_dir))
    runner, _ = serving_backend(model, "onnxruntime", "fp32")
    service = ModelService(model, "fp32", served=runner)
    x = torch.randn(3, 3, 32, 32)
    out = service.run_batch(x, frozenset({"logits", "embedding"}))
    with torch.no_grad():
        torch.testing.assert_close(out["logits"], model(x), atol=1e-4, rtol=1e-4)
    assert service.backend == "onnxruntime" and 'backend="onnxruntime"' in service.metrics.render()
    with pytest.raises(UsageError, match="token merging runs on vitkit's own path"):
        ModelService(model, "fp32", served=runner, merge=2)


@pytest.mark.parametrize(
    "name", [pytest.param("onnxruntime", marks=needs_ort), pytest.param("openvino", marks=needs_ov)]
)
def test_one_call_of_the_runtime_gives_tokens_representation_and_logits(name):
    model = tiny(1)
    runner, _ = serving_backend(model, name, "fp32")
    x = torch.randn(5, 3, 32, 32)
    got = runner.outputs(x, ["logits", "pooled", "tokens"])
    with torch.no_grad():
        tokens = model.forward_features(x)
        want = {"tokens": tokens, "pooled": model.forward_head(tokens, pre_logits=True), "logits": model(x)}
    for part, value in want.items():
        torch.testing.assert_close(got[part], value, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(runner.forward_pre_logits(x), want["pooled"], atol=1e-4, rtol=1e-4)
    assert list(runner.outputs(x, ["pooled"])) == ["pooled"]
    with pytest.raises(UsageError, match="not probabilities"):
        runner.outputs(x, ["probabilities"])


@with_ort
def test_serve_takes_both_answers_from_one_runtime_call(run_dir, monkeypatch):
    from vitkit.serve import ModelService

    model = vitkit.load_pretrained(str(run_dir))
    runner, _ = serving_backend(model, "onnxruntime", "fp32")
    calls = []
    real = runner.run
    runner.run = lambda x, which: calls.append(tuple(which)) or real(x, which)
    service = ModelService(model, "fp32", served=runner)
    x = torch.randn(2, 3, 32, 32)
    out = service.run_batch(x, frozenset({"logits", "embedding"}))
    assert len(calls) == 1 and sorted(calls[0]) == [1, 2]  # pooled and logits, no tokens copied out
    with torch.no_grad():
        torch.testing.assert_close(
            out["embedding"], model.forward_head(model.forward_features(x), pre_logits=True), atol=1e-4, rtol=0
        )


def test_zero_outputs_on_both_sides_agree_and_zero_against_nonzero_does_not():
    zero = np.zeros((2, 8), dtype=np.float32)
    assert agreement(zero, zero, "int8")["within"]  # a head still at its zero init
    assert not agreement(zero, np.ones_like(zero), "int8")["within"]


@with_ort
def test_auto_measures_on_the_batch_the_command_computes_up_to_its_cap(monkeypatch):
    seen = []
    real = backends.choose_backend

    def spy(model, precision, calibration=None, batch=8, remeasure=False):
        seen.append(batch)
        return real(model, precision, calibration, batch=batch, remeasure=remeasure)

    monkeypatch.setattr(backends, "choose_backend", spy)
    for batch in (None, 3, 500):
        serving_backend(tiny(), "auto", "fp32", batch=batch)
    assert seen == [8, 3, backends.AUTO_MAX_BATCH]


@with_ort
def test_auto_checks_the_logits_as_well_as_the_tokens(monkeypatch):
    model = tiny()
    real = backends.runtime_session

    def wrong_head(name, path, precision, calibration=None):  # right tokens, wrong logits
        run = real(name, path, precision, calibration)
        return lambda x, which=(0,): [o if i == 0 else -o for i, o in zip(which, run(x, which), strict=True)]

    monkeypatch.setattr(backends, "runtime_session", wrong_head)
    decision, runner = choose_backend(model, "fp32", remeasure=True)
    assert decision.backend == "torch" and runner is None
    for name, q in decision.agreement.items():
        assert q["outputs"]["tokens"]["within"] and not q["outputs"]["logits"]["within"] and not q["within"], name
