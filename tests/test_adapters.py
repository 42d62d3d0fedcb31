"""LoRA and DoRA adapters: the layer's maths, merging, the adapter file with its base checksum, the
peft round trip with the real packages, bad input in one line, and a small adapter fine-tune."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest
import torch

from vitkit.checkpoint import save_checkpoint
from vitkit.checkpoint.adapters import export_peft, load_adapters, read_adapters, save_adapters
from vitkit.checkpoint.load import load_pretrained
from vitkit.errors import CheckpointError, RecipeError, UsageError, VitkitError
from vitkit.export import export_weights
from vitkit.models.adapters import (
    AdaptedLinear,
    AdapterSpec,
    adapted_layers,
    adapter_parameters,
    adapter_spec_from_dict,
    adapter_state_dict,
    apply_adapters,
    merge_adapters,
)
from vitkit.models.registry import create_model

TINY = {"img_size": 16, "patch_size": 8, "width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def _base(num_classes: int = 3, seed: int = 0, **over):
    torch.manual_seed(seed)
    model = create_model("vit_s16", num_classes=num_classes, **(TINY | over)).eval()
    if model.head is not None:
        with torch.no_grad():  # a head that is not zero, so that the outputs say something
            model.head.weight.normal_()
    return model


def _trained(model, seed: int = 1):
    """Adapters whose updates are not zero, as after training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "magnitude" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _spec(kind="lora", **over):
    return adapter_spec_from_dict({"kind": kind, "rank": 4, "alpha": 8, "targets": ["q", "v", "proj", "mlp"]} | over)


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_adapters_start_equal_to_the_base_and_train_only_themselves(kind):
    base = _base()
    model = apply_adapters(copy.deepcopy(base), _spec(kind))
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(model(x), base(x), atol=1e-6, rtol=1e-5)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(("lora_" in n or "magnitude" in n or n.startswith("head.")) for n in trained)
    assert set(adapter_state_dict(model)) == trained
    assert len(adapter_parameters(model)) == len(trained)
    qkv = model.blocks[0].attn.qkv
    assert isinstance(qkv, AdaptedLinear) and set(qkv.parts) == {"q", "v"}  # k left alone
    assert {k for k in model.state_dict() if "lora" not in k and "magnitude" not in k} == set(base.state_dict())


def test_lora_is_the_low_rank_update_of_each_slice_of_the_fused_qkv():
    base = _base()
    model = _trained(apply_adapters(copy.deepcopy(base), _spec("lora", targets=["q", "v"])))
    layer, d = model.blocks[0].attn.qkv, 32
    s = 8 / 4
    expected = base.blocks[0].attn.qkv.weight.detach().clone()
    for part, rows in (("q", slice(0, d)), ("v", slice(2 * d, 3 * d))):
        expected[rows] += s * layer.lora_B[part] @ layer.lora_A[part]
    x = torch.randn(5, d)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, expected, layer.bias))
    k_rows = slice(d, 2 * d)  # the key rows are the base's, exactly
    assert torch.equal(layer(x)[:, k_rows], base.blocks[0].attn.qkv(x)[:, k_rows])


def test_dora_is_magnitude_times_the_row_normalised_direction():
    base = _base()
    model = _trained(apply_adapters(copy.deepcopy(base), _spec("dora", targets=["proj"])))
    layer = model.blocks[1].attn.proj
    w0 = base.blocks[1].attn.proj.weight.detach()
    v = w0 + 2.0 * layer.lora_B["proj"] @ layer.lora_A["proj"]
    expected = layer.magnitude["proj"][:, None] * v / v.norm(dim=1, keepdim=True)
    x = torch.randn(5, 32)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, expected, layer.bias), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_merged_equals_unmerged_in_fp32_and_within_bf16_rounding_in_bf16(kind):
    base = _base()
    model = _trained(apply_adapters(copy.deepcopy(base), _spec(kind, train_norms=True)))
    x = torch.randn(4, 3, 16, 16)
    unmerged = model(x)
    merged = merge_adapters(copy.deepcopy(model))
    assert not adapted_layers(merged) and not hasattr(merged, "adapter_info")
    assert set(merged.state_dict()) == set(base.state_dict())
    torch.testing.assert_close(merged(x), unmerged, atol=1e-5, rtol=1e-5)
    assert (unmerged - base(x)).abs().max() > 1e-2  # the adapters changed the outputs
    with torch.autocast("cpu", torch.bfloat16):
        bf16_unmerged, bf16_merged = model(x).float(), merged(x).float()
    scale = unmerged.abs().max()
    assert (bf16_merged - unmerged).abs().max() < 0.05 * scale
    assert (bf16_unmerged - bf16_merged).abs().max() < 0.05 * scale


def test_a_bf16_base_with_fp32_adapters_trains_and_has_the_fp32_base_checksum():
    base = _base()
    fp32 = apply_adapters(copy.deepcopy(base), _spec("dora"))
    model = apply_adapters(copy.deepcopy(base), _spec("dora"), base_dtype=torch.bfloat16)
    assert model.adapter_info.base_sha256 == fp32.adapter_info.base_sha256
    assert model.blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert model.blocks[0].attn.qkv.lora_A["q"].dtype == torch.float32 and model.head.weight.dtype == torch.float32
    x = torch.randn(2, 3, 16, 16)
    with torch.autocast("cpu", torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    grads = [p.grad for p in adapter_parameters(model)]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert model.blocks[0].attn.qkv.weight.grad is None


def test_the_adapter_file_round_trips_and_refuses_another_base(tmp_path):
    base = _base(num_classes=3)
    base_file = tmp_path / "base.safetensors"
    save_checkpoint(base, base_file)
    model = load_pretrained(base_file)
    model.reset_classifier(5)  # fine-tuned to 5 classes: the new head travels with the adapters
    apply_adapters(model, _spec("dora", train_norms=True))
    _trained(model)
    with torch.no_grad():
        model.head.weight.normal_()
    path = save_adapters(model, tmp_path / "pets.adapter.safetensors", {"classes": json.dumps(list("abcde"))})
    tensors, spec, meta = read_adapters(path)
    assert spec == model.adapter_info.spec and meta["base_name"] == str(base_file)
    assert set(tensors) == set(adapter_state_dict(model))
    x = torch.randn(2, 3, 16, 16)
    again = load_adapters(load_pretrained(base_file).eval(), path)
    torch.testing.assert_close(again(x), model.eval()(x))
    assert again.adapter_metadata["classes"] == json.dumps(list("abcde"))
    merged = load_adapters(load_pretrained(base_file).eval(), path, merge=True)
    assert not adapted_layers(merged)
    torch.testing.assert_close(merged(x), model(x), atol=1e-5, rtol=1e-5)
    other = tmp_path / "other.safetensors"
    save_checkpoint(_base(num_classes=3, seed=7), other)
    with pytest.raises(
        CheckpointError, match=r"pets\.adapter\.safetensors: adapters made for base .*base\.safetensors"
    ):
        load_adapters(load_pretrained(other), path)


def test_bad_input_is_one_line(tmp_path):
    cases = [
        ({"rank": 64}, RecipeError, "rank 64 is larger than blocks.0.attn.qkv"),
        ({"targets": ["q", "query"]}, RecipeError, "unknown target 'query'"),
        ({"kind": "ia3"}, RecipeError, "finetune.adapter.kind"),
        ({"ranks": 4}, RecipeError, "unknown key 'ranks'"),
        ({"dropout": 1.0}, RecipeError, "finetune.adapter.dropout"),
        ({"train_head": "yes"}, RecipeError, "finetune.adapter.train_head"),
    ]
    for d, error, text in cases:
        with pytest.raises(error, match=text) as e:
            apply_adapters(_base(), adapter_spec_from_dict(d))
        assert "\n" not in str(e.value)
    model = apply_adapters(_base(), _spec())
    with pytest.raises(RecipeError, match="has adapters already"):
        apply_adapters(model, _spec())
    with pytest.raises(UsageError, match="says adapter"):
        save_adapters(model, tmp_path / "weights.safetensors")
    plain = tmp_path / "model.safetensors"
    save_checkpoint(_base(), plain)
    with pytest.raises(CheckpointError, match="not a vitkit adapter file"):
        load_adapters(_base(), plain)
    wrong = tmp_path / "wide.adapter.safetensors"
    save_adapters(apply_adapters(_base(width=64, mlp_dim=128), _spec()), wrong)
    with pytest.raises(VitkitError, match="adapters made for base"):
        load_adapters(_base(), wrong)


def test_spec_parsing_expands_groups_and_keeps_defaults():
    spec = adapter_spec_from_dict({"kind": "dora", "targets": "qkv,fc2", "rank": 2})
    assert spec.targets == ("q", "k", "v", "fc2") and spec.alpha == 16.0 and spec.train_head
    assert adapter_spec_from_dict(spec.to_dict()) == spec
    assert adapter_spec_from_dict({}) == AdapterSpec()


# ----------------------------------------------------------------------------------------------
# Hugging Face peft, with the real packages


@pytest.mark.parametrize("kind,head", [("lora", True), ("dora", True), ("lora", False)])
def test_peft_loads_the_adapters_onto_the_transformers_vit_of_the_same_base(tmp_path, kind, head):
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    peft = pytest.importorskip("peft", reason="Hugging Face peft is not installed")
    base = _base(num_classes=3 if head else 0, act="gelu", ln_eps=1e-12)
    export_weights(base, tmp_path / "hf", "hf")
    spec = _spec(kind, targets=["q", "k", "v", "proj", "fc1", "fc2"], train_norms=True, train_head=head)
    model = _trained(apply_adapters(copy.deepcopy(base), spec))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad and ("norm" in n or n.startswith("head.")):
                p.add_(0.1 * torch.randn_like(p))
    layout = "v5" if int(transformers.__version__.split(".")[0]) >= 5 else "v4"
    export_peft(model, tmp_path / "peft", layout)
    cls = transformers.ViTForImageClassification if head else transformers.ViTModel
    hf = cls.from_pretrained(str(tmp_path / "hf")).eval()
    wrapped = peft.PeftModel.from_pretrained(hf, str(tmp_path / "peft")).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        out = wrapped(pixel_values=x)
        ours = model.eval()(x) if head else model.forward_features(x)
    theirs = out.logits if head else out.last_hidden_state
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert (ours - (base(x) if head else base.forward_features(x))).abs().max() > 1e-2


def test_peft_export_refuses_a_base_hugging_face_cannot_hold(tmp_path):
    model = apply_adapters(_base(classifier="gap"), _spec())
    with pytest.raises(CheckpointError, match="Hugging Face's ViT cannot hold"):
        export_peft(model, tmp_path / "peft")


# ----------------------------------------------------------------------------------------------
# A small adapter fine-tune, as the Trainer runs one


def train_adapters_smoke(kind: str = "lora", steps: int = 8) -> dict[str, float]:
    """A few SGD steps of a tiny ViT with adapters on a fixed batch: the optimiser gets
    :func:`adapter_parameters` alone. Returns the first and last loss, how far the frozen and the
    trained tensors moved, and how far the merged model's logits are from the unmerged ones."""
    base = _base(num_classes=4)
    model = apply_adapters(copy.deepcopy(base), _spec(kind, dropout=0.1, train_head=True)).train()
    frozen = {k: v.clone() for k, v in model.state_dict().items() if k not in adapter_state_dict(model)}
    before = {k: v.clone() for k, v in adapter_state_dict(model).items()}
    opt = torch.optim.SGD(adapter_parameters(model), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = model.state_dict()
    model.eval()
    with torch.no_grad():
        unmerged = model(x)
        merged = merge_adapters(copy.deepcopy(model))(x)
    return {
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "frozen_moved": max((after[k] - v).abs().max().item() for k, v in frozen.items()),
        "trained_moved": min((after[k] - v).abs().max().item() for k, v in before.items()),
        "merge_gap": (merged - unmerged).abs().max().item(),
    }


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_train_adapters_smoke(kind):
    r = train_adapters_smoke(kind)
    assert r["frozen_moved"] == 0.0  # the base is untouched
    assert r["trained_moved"] > 0.0  # every adapter tensor and the head learned
    assert r["last_loss"] < 0.7 * r["first_loss"]
    assert r["merge_gap"] < 1e-4


# ----------------------------------------------------------------------------------------------
# The command line: --adapter-weights on predict, eval, embed and convert


@pytest.fixture(scope="module")
def adapted_run(tmp_path_factory):
    """A base file (3 classes) and an adapter file fine-tuned from it to the synthetic data's 10
    classes, with their names; and the adapted model itself."""
    from PIL import Image

    root = tmp_path_factory.mktemp("adapters")
    torch.manual_seed(0)
    base = create_model(
        "vit_ti16", img_size=32, patch_size=8, depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=3
    )
    save_checkpoint(base, root / "base.safetensors")
    model = load_pretrained(root / "base.safetensors")
    model.reset_classifier(10)
    _trained(apply_adapters(model, _spec("dora")))
    with torch.no_grad():
        model.head.weight.normal_(std=0.5)
    names = [f"class_{i}" for i in range(10)]
    save_adapters(model.eval(), root / "synthetic.adapter.safetensors", {"classes": json.dumps(names)})
    images = root / "imgs" / "a"
    images.mkdir(parents=True)
    g = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(g.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(images / f"{i}.png")
    return root, model


def test_predict_and_embed_apply_the_adapters(adapted_run, tmp_path, capsys):
    from vitkit.cli import main
    from vitkit.eval import predict
    from vitkit.eval.embed import read_embeddings
    from vitkit.preprocessing import load_images

    root, model = adapted_run
    base, adapter, img = root / "base.safetensors", root / "synthetic.adapter.safetensors", root / "imgs/a/0.png"
    out_json = tmp_path / "p.json"
    argv = ["predict", str(base), str(img), "--adapter-weights", str(adapter), "--precision", "fp32"]
    assert main([*argv, "--top-k", "2", "--json", str(out_json)]) == 0
    got = json.loads(out_json.read_text())["predictions"][0]["top_k"]
    x = load_images([str(img)], model.preprocessing, 3).inputs
    expected = predict(model, x, top_k=2, precision="fp32")[0]
    assert [r["class"] for r in got] == [f"class_{r['class']}" for r in expected]  # the adapter file's names
    assert got[0]["prob"] == pytest.approx(expected[0]["prob"], abs=1e-5)
    out = tmp_path / "e.safetensors"
    emb = ["embed", str(base), str(root / "imgs"), "--out", str(out), "--adapter-weights", str(adapter)]
    assert main([*emb, "--precision", "fp32"]) == 0
    with torch.no_grad():
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    torch.testing.assert_close(read_embeddings(out).vectors[:1], pooled, atol=1e-5, rtol=1e-5)
    other = tmp_path / "other.safetensors"
    save_checkpoint(
        create_model("vit_ti16", img_size=32, patch_size=8, depth=2, width=32, num_heads=2, mlp_dim=64), other
    )
    capsys.readouterr()
    assert main(["predict", str(other), str(img), "--adapter-weights", str(adapter)]) == 2
    err = capsys.readouterr().err.strip()
    assert "adapters made for base" in err and len(err.splitlines()) == 1


def test_eval_serves_the_merged_adapters(adapted_run, tmp_path):
    from vitkit.cli import main

    root, _ = adapted_run
    base, adapter = root / "base.safetensors", root / "synthetic.adapter.safetensors"
    results = []
    for extra in ([], ["--serve"]):
        out = tmp_path / f"eval{len(extra)}.json"
        argv = ["eval", str(base), "--data", "synthetic", "--max-images", "32", "--precision", "fp32"]
        assert main([*argv, "--adapter-weights", str(adapter), "--out", str(tmp_path), "--json", str(out), *extra]) == 0
        results.append(json.loads(out.read_text()))
    assert results[0]["top1"] == results[1]["top1"] and results[1]["mode"] == "served"


@pytest.mark.slow
def test_eval_at_another_resolution_checks_the_base_at_its_own_size(adapted_run, tmp_path):
    from vitkit.cli import main

    root, _ = adapted_run
    base, adapter = root / "base.safetensors", root / "synthetic.adapter.safetensors"
    argv = ["eval", str(base), "--data", "synthetic", "--max-images", "8", "--img-size", "48", "--out", str(tmp_path)]
    assert main([*argv, "--adapter-weights", str(adapter), "--precision", "fp32"]) == 0


def test_convert_merges_the_adapters_or_writes_them_for_peft(adapted_run, tmp_path):
    from vitkit.cli import main

    root, model = adapted_run
    base, adapter = root / "base.safetensors", root / "synthetic.adapter.safetensors"
    merged = tmp_path / "merged.safetensors"
    assert main(["convert", str(base), str(merged), "--adapter-weights", str(adapter)]) == 0
    back = load_pretrained(merged).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(back(x), model(x), atol=1e-5, rtol=1e-5)
    assert not any("lora" in k for k in back.state_dict())
    assert main(["convert", str(base), str(tmp_path / "peft"), "--to", "peft", "--adapter-weights", str(adapter)]) == 0
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["use_dora"] and config["r"] == 4 and config["modules_to_save"] == ["classifier"]
    assert main(["convert", str(base), str(tmp_path / "peft2"), "--to", "peft"]) == 2


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_serving_merges_the_adapters_first(precision):
    from vitkit.inference import prepare_inference

    model = _trained(apply_adapters(_base(), _spec("lora")))
    served = prepare_inference(model, precision)
    assert not adapted_layers(served) and adapted_layers(model)  # the original keeps its adapters
    x = torch.randn(2, 3, 16, 16)
    tol = {"fp32": 1e-4, "bf16": 0.05, "int8": 0.1}[precision] * model(x).abs().max().item()
    with torch.no_grad():
        assert (served(x.to(served.input_dtype)).float() - model(x)).abs().max() < tol


def test_peft_names_for_transformers_5_and_earlier():
    from vitkit.checkpoint.adapters import peft_config, peft_key

    assert (
        peft_key("blocks.3.attn.qkv.lora_A.k", True) == "base_model.model.vit.layers.3.attention.k_proj.lora_A.weight"
    )
    v4 = peft_key("blocks.3.attn.qkv.magnitude.v", False, "v4")
    assert v4 == "base_model.model.encoder.layer.3.attention.attention.value.lora_magnitude_vector"
    assert peft_key("blocks.0.mlp.fc2.lora_B.fc2", True, "v4").endswith(
        "vit.encoder.layer.0.output.dense.lora_B.weight"
    )
    assert peft_key("norm.weight", True) == "base_model.model.vit.layernorm.weight"
    assert peft_key("head.bias", True) == "base_model.model.classifier.bias"
    pattern = peft_config(_spec(targets=["fc2"]), "base", True, "v4")["target_modules"]
    assert re.fullmatch(pattern, "vit.encoder.layer.0.output.dense")
    assert not re.fullmatch(pattern, "vit.encoder.layer.0.attention.output.dense")  # proj is not a target
    with pytest.raises(UsageError, match="peft layout"):
        peft_key("head.bias", True, "v3")
