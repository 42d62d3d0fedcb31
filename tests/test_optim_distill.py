"""Optimisation and memory (layer-wise lr decay, no weight decay on embeddings and norms, gradient
checkpointing) and DeiT distillation (the distillation token, its losses, teachers, timm's files)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import vitkit
from _recipes import stopped, stopped_and_resumed, tiny_recipe
from vitkit.checkpoint import save_checkpoint
from vitkit.errors import CheckpointError, RecipeError, TrainingError
from vitkit.export import export_weights
from vitkit.models.config import ResNetConfig
from vitkit.models.registry import build_model
from vitkit.preprocessing import Preprocessing
from vitkit.train import load_recipe, train
from vitkit.train.config import OptimSection
from vitkit.train.distill import Teacher, distillation_loss, soft_distillation_loss
from vitkit.train.optim import build_optimizer, decays, layer_id, param_groups, set_lr
from vitkit.train.state import list_checkpoints, load_train_state

SMALL = dict(img_size=16, patch_size=4, width=32, depth=3, num_heads=2, mlp_dim=64, num_classes=5)


def tiny(**overrides) -> torch.nn.Module:
    return vitkit.create_model("vit_ti16", **(SMALL | overrides))


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (the heads start at zero, which would hide a swapped head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


# ---------------------------------------------------------------------------------------------
# Layer-wise learning-rate decay and the weight-decay groups


def _scale_of(groups: list[dict], model: torch.nn.Module) -> dict[str, float]:
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    return {n: scale[id(p)] for n, p in model.named_parameters()}


def test_layer_decay_scales_of_a_three_layer_model_by_hand():
    model = tiny(distill_token=True)
    scales = _scale_of(param_groups(model, 0.05, layer_decay=0.5), model)
    # 3 blocks: layer 0 = embeddings, 1..3 = blocks, 4 = norm and heads; scale = 0.5 ** (4 - layer)
    want = {"cls_token": 1 / 16, "dist_token": 1 / 16, "pos_embed": 1 / 16, "patch_embed.proj.weight": 1 / 16}
    want |= {"blocks.0.attn.qkv.weight": 1 / 8, "blocks.1.norm1.bias": 1 / 4, "blocks.2.mlp.fc2.weight": 1 / 2}
    want |= {"norm.weight": 1.0, "head.weight": 1.0, "head_dist.bias": 1.0}
    assert {k: scales[k] for k in want} == want
    assert {layer_id(n, 3) for n in scales} == {0, 1, 2, 3, 4}

    opt = build_optimizer(model, OptimSection(lr=0.2, weight_decay=0.05, layer_decay=0.5))
    set_lr(opt, 0.1)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert lr_of[id(model.cls_token)] == pytest.approx(0.1 / 16)
    assert lr_of[id(model.blocks[1].attn.proj.weight)] == pytest.approx(0.1 / 4)
    assert lr_of[id(model.head.weight)] == pytest.approx(0.1)


def test_layer_decay_puts_a_hybrids_stem_in_layer_zero():
    model = vitkit.create_model(
        "r26_vit_s32", img_size=32, width=32, depth=2, num_heads=2, mlp_dim=64, resnet_units=(1, 1), num_classes=3
    )
    scales = _scale_of(param_groups(model, 0.1, layer_decay=0.9), model)
    stem = [n for n in scales if n.startswith("patch_embed.backbone.")]
    assert stem and all(scales[n] == pytest.approx(0.9**3) for n in stem)
    assert scales["blocks.1.attn.qkv.weight"] == pytest.approx(0.9)


def test_registers_and_the_pre_norm_are_embeddings_without_decay():
    sizes = {"img_size": 32, "patch_size": 8, "width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}
    model = vitkit.create_model("vit_ti16", **sizes, num_registers=4, pre_norm=True)
    assert not decays("reg_token", model.reg_token)
    scales = _scale_of(param_groups(model, 0.1, layer_decay=0.9), model)
    for name in ("reg_token", "norm_pre.weight", "norm_pre.bias", "cls_token"):
        assert scales[name] == pytest.approx(0.9**3), name  # layer 0, with the class token


def test_no_weight_decay_on_norms_biases_positions_and_tokens():
    """The default, as before this change: weight decay on weight matrices and kernels only."""
    model = tiny(distill_token=True)
    no_decay = {n for n, p in model.named_parameters() if not decays(n, p)}
    block = {f"blocks.{i}.{m}" for i in range(3) for m in ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias")}
    block |= {f"blocks.{i}.{m}.bias" for i in range(3) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
    tops = {"cls_token", "dist_token", "pos_embed", "patch_embed.proj.bias", "norm.weight", "norm.bias"}
    assert no_decay == block | tops | {"head.bias", "head_dist.bias"}
    decay_ids = {id(p) for p in param_groups(model, 0.3)[0]["params"]}
    assert {n for n, p in model.named_parameters() if id(p) in decay_ids} == {
        n for n, p in model.named_parameters() if n not in no_decay
    }
    groups = param_groups(model, 0.3)  # without layer decay the two groups of before, as checkpoints hold them
    assert [g["weight_decay"] for g in groups] == [0.3, 0.0] and not any("lr_scale" in g for g in groups)
    for kind, names in (("relative", {"blocks.0.attn.rel_embed"}), ("learned2d", {"pos_embed_row", "pos_embed_col"})):
        other = tiny(pos_embed=kind)
        assert names <= {n for n, p in other.named_parameters() if not decays(n, p)}


def test_layer_decay_settings_are_checked():
    with pytest.raises(RecipeError, match=r"optim.layer_decay must be in \(0, 1\], got 1.5"):
        load_recipe(None, [("optim.layer_decay", 1.5)])
    with pytest.raises(RecipeError, match=r"optim.layer_decay must be in \(0, 1\], got 0"):
        load_recipe(None, [("optim.layer_decay", 0)])
    resnet = build_model(ResNetConfig(units=(1, 1), num_classes=3))
    with pytest.raises(RecipeError, match="optim.layer_decay needs a ViT's encoder blocks"):
        param_groups(resnet, 0.1, layer_decay=0.8)


# ---------------------------------------------------------------------------------------------
# Gradient checkpointing


def _loss_and_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    after = torch.rand(1)  # the global RNG after the step: the same on both paths
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, after


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_checkpointed_gradients_equal_the_plain_ones_with_dropout_and_drop_path(impl):
    torch.manual_seed(0)
    model = randomise(tiny(drop_rate=0.2, attn_drop_rate=0.2, drop_path_rate=0.3)).train()
    model.set_attention_impl(impl)
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    loss_a, grads_a, rng_a = _loss_and_grads(model, x, y, seed=7)
    calls = []
    model.blocks[0].register_forward_pre_hook(lambda *_: calls.append(1))
    model.set_grad_checkpointing(True)
    loss_b, grads_b, rng_b = _loss_and_grads(model, x, y, seed=7)
    assert len(calls) == 2  # the block ran again in the backward pass: checkpointing did happen
    assert abs(loss_a.item() - loss_b.item()) <= 1e-6 and torch.equal(rng_a, rng_b)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) <= 1e-6
    _, grads_c, _ = _loss_and_grads(model, x, y, seed=8)  # another seed, other masks: dropout is on
    assert max((grads_a[n] - grads_c[n]).abs().max().item() for n in grads_a) > 1e-4


# ---------------------------------------------------------------------------------------------
# Distillation losses


def test_distillation_losses_against_hand_computation():
    student = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    teacher = torch.tensor([[0.0, 3.0, 0.0], [1.0, 0.0, 2.0]])  # argmax: 1, 2
    hard = (-math.log(math.exp(0) / sum(map(math.exp, (2, 0, -1))))) + (
        -math.log(math.exp(0) / sum(map(math.exp, (0.5, 1.5, 0))))
    )
    hard /= 2
    label_loss = torch.tensor(0.7)
    got = distillation_loss(label_loss, student, teacher, "hard", alpha=0.25)
    assert got.item() == pytest.approx(0.75 * 0.7 + 0.25 * hard, abs=1e-6)

    T = 2.0

    def softmax(row: list[float]) -> list[float]:
        e = [math.exp(v / T) for v in row]
        return [v / sum(e) for v in e]

    kl = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist()):
        ps, pt = softmax(s_row), softmax(t_row)
        kl += sum(t * math.log(t / s) for s, t in zip(ps, pt))
    soft = kl / 2 * T * T
    assert soft_distillation_loss(student, teacher, T).item() == pytest.approx(soft, abs=1e-6)
    got = distillation_loss(label_loss, student, teacher, "soft", alpha=0.5, temperature=T)
    assert got.item() == pytest.approx(0.5 * 0.7 + 0.5 * soft, abs=1e-6)
    assert soft_distillation_loss(teacher, teacher, 3.0).item() == pytest.approx(0.0, abs=1e-7)


# ---------------------------------------------------------------------------------------------
# The distillation token


def test_distilled_model_averages_its_two_heads_in_eval_and_returns_both_in_training():
    model = randomise(tiny(distill_token=True)).eval()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(x)  # (B, 2 + 16, D)
        assert tokens.shape == (3, 2 + 16, 32)
        want = (model.head(tokens[:, 0]) + model.head_dist(tokens[:, 1])) / 2
        torch.testing.assert_close(model(x), want, atol=0, rtol=0)
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), (tokens[:, 0] + tokens[:, 1]) / 2)
        model.train()
        assert isinstance(model(x), torch.Tensor)  # no teacher: the mean trains (as timm)
        model.set_distilled_training(True)
        cls, dist = model(x)
        torch.testing.assert_close(cls, model.head(tokens[:, 0]))
        torch.testing.assert_close(dist, model.head_dist(tokens[:, 1]))
    from vitkit.models.flops import vit_flops

    D, M, K, L, N = 32, 64, 5, 3, 17  # N: 16 patches and the class token
    per_token = 2 * D * 3 * D + 2 * D * D + 2 * 2 * D * M  # qkv, proj and the MLP of one more token
    attention = 2 * 2 * ((N + 1) ** 2 - N**2) * D  # q k^T and the weighted sum over one more key
    assert vit_flops(model.cfg) - vit_flops(tiny().cfg) == L * (per_token + attention) + 2 * D * K
    with pytest.raises(ValueError, match="distilled training needs a distillation token"):
        tiny().set_distilled_training(True)
    with pytest.raises(ValueError, match="distill_token .* needs classifier='token'"):
        tiny(distill_token=True, classifier="gap")


@pytest.mark.parametrize(
    "extra",
    [{}, {"pos_embed": "learned2d"}, {"pos_embed": "sincos2d"}, {"pos_embed": "relative"}, {"cls_pos_embed": False}],
    ids=["learned", "learned2d", "sincos2d", "relative", "no-cls-pos"],
)
def test_distillation_token_works_with_every_position_embedding(extra):
    model = randomise(tiny(distill_token=True, **extra)).train()
    model.set_distilled_training(True)
    x = torch.randn(2, 3, 16, 16)
    cls, dist = model(x)
    (cls.sum() + dist.sum()).backward()
    assert model.dist_token.grad.abs().sum() > 0 and model.head_dist.weight.grad.abs().sum() > 0
    if extra.get("pos_embed") != "relative":
        seen = []
        model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
        model.set_patch_drop(0.5)
        with torch.no_grad():
            model(x)
        assert seen == [2 + 8]  # both prefix tokens kept, half of the 16 patches
        if extra.get("pos_embed") in (None, "learned"):
            model.set_patch_drop(0.0)
            model.set_img_size(24)  # the prefix rows (two, none without cls_pos_embed) kept, the grid's resized
            assert model.pos_embed.shape == (1, (2 if extra.get("cls_pos_embed", True) else 0) + 36, 32)
            assert model.eval()(torch.randn(1, 3, 24, 24)).shape == (1, 5)
    model.reset_classifier(0)
    assert model.head is None and model.head_dist is None
    assert model.eval()(torch.randn(1, 3, *model.cfg.img_size)).shape == (1, 32)


def _timm_deit_state_dict(depth: int = 2, width: int = 32, classes: int = 4, grid: int = 4) -> dict:
    """A state dict in the layout of timm's ``deit_*_distilled_patch16_224`` (patch 16), by hand."""
    g = torch.Generator().manual_seed(1)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.2
    sd = {
        "cls_token": r(1, 1, width),
        "dist_token": r(1, 1, width),
        "pos_embed": r(1, 2 + grid * grid, width),
        "patch_embed.proj.weight": r(width, 3, 16, 16),
        "patch_embed.proj.bias": r(width),
        "norm.weight": 1 + r(width),
        "norm.bias": r(width),
        "head.weight": r(classes, width),
        "head.bias": r(classes),
        "head_dist.weight": r(classes, width),
        "head_dist.bias": r(classes),
    }
    for i in range(depth):
        b = f"blocks.{i}."
        sd |= {b + "norm1.weight": 1 + r(width), b + "norm1.bias": r(width)}
        sd |= {b + "attn.qkv.weight": r(3 * width, width), b + "attn.qkv.bias": r(3 * width)}
        sd |= {b + "attn.proj.weight": r(width, width), b + "attn.proj.bias": r(width)}
        sd |= {b + "norm2.weight": 1 + r(width), b + "norm2.bias": r(width)}
        sd |= {b + "mlp.fc1.weight": r(4 * width, width), b + "mlp.fc1.bias": r(4 * width)}
        sd |= {b + "mlp.fc2.weight": r(width, 4 * width), b + "mlp.fc2.bias": r(width)}
    return sd


def test_timm_distilled_deit_state_dict_loads_and_round_trips(tmp_path):
    sd = _timm_deit_state_dict()
    save_file(sd, tmp_path / "deit.safetensors")
    model = vitkit.load_pretrained(tmp_path / "deit.safetensors", num_heads=2)
    cfg = model.cfg
    assert (cfg.distill_token, cfg.num_prefix_tokens, cfg.img_size, cfg.num_classes) == (True, 2, (64, 64), 4)
    assert cfg.act == "gelu" and model.load_report.source == "timm"
    own = model.state_dict()
    assert set(own) == set(sd) and all(torch.equal(own[k], sd[k]) for k in sd)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():  # DeiT's prediction, from the tensors by hand
        tokens = model.forward_features(x)
        want = (tokens[:, 0] @ sd["head.weight"].T + sd["head.bias"] + tokens[:, 1] @ sd["head_dist.weight"].T) / 2
        want = want + sd["head_dist.bias"] / 2
        torch.testing.assert_close(model(x), want, atol=1e-5, rtol=1e-5)
        # the distillation token's position is the second row of pos_embed
        emb = model.embed(x)
        patches = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=16)
        torch.testing.assert_close(emb[:, 1], (sd["dist_token"][0, 0] + sd["pos_embed"][0, 1]).expand(2, -1))
        torch.testing.assert_close(emb[:, 2:], patches.flatten(2).transpose(1, 2) + sd["pos_embed"][:, 2:])

    export_weights(model, tmp_path / "back.safetensors", "timm")
    back = load_file(tmp_path / "back.safetensors")
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    again = vitkit.load_pretrained(tmp_path / "back.safetensors")  # the metadata gives the heads
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), atol=0, rtol=0)


def test_timm_distilled_deit_logits_match_timm(tmp_path):
    timm = pytest.importorskip("timm", reason="timm is not installed (it needs torchvision)", exc_type=ImportError)
    peer = timm.create_model(
        "deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=6
    ).eval()
    randomise(peer)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "deit.safetensors")
    ours = vitkit.load_pretrained(tmp_path / "deit.safetensors", num_heads=3)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (peer(x) - ours(x)).abs().max() < 1e-5


def test_distilled_vitkit_checkpoint_round_trips_exactly_and_replaces_both_heads(tmp_path):
    model = randomise(tiny(distill_token=True, pos_embed="learned")).eval()
    save_checkpoint(model, tmp_path / "m.safetensors")
    back = vitkit.load_pretrained(tmp_path / "m.safetensors")
    assert back.cfg == model.cfg
    a, b = model.state_dict(), back.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    new = vitkit.load_pretrained(tmp_path / "m.safetensors", num_classes=7)
    assert new.head.weight.shape == new.head_dist.weight.shape == (7, 32)
    assert not new.head_dist.weight.any() and torch.equal(new.dist_token, model.dist_token)
    assert any("head replaced: 5 -> 7" in n for n in new.load_report.notes)


@pytest.mark.parametrize("to,suffix", [("official", ".npz"), ("hf", "")])
def test_formats_without_a_distillation_token_refuse_it(tmp_path, to, suffix):
    model = tiny(distill_token=True, ln_eps=1e-6)
    with pytest.raises(CheckpointError, match="distillation token") as e:
        export_weights(model, tmp_path / f"out{suffix or '_hf'}", to)
    assert "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# Teachers and training


recipe = tiny_recipe


@pytest.fixture
def teacher_file(tmp_path) -> Path:
    """A tiny ViT teacher of the synthetic data's 10 classes, at another resolution and value range."""
    model = randomise(vitkit.create_model("vit_ti16", **(SMALL | {"img_size": 24, "num_classes": 10})), seed=3)
    path = tmp_path / "teacher.safetensors"
    save_checkpoint(model, path, Preprocessing((0.4, 0.45, 0.5), (0.2, 0.25, 0.3), (24, 24)))
    return path


def test_teacher_sees_the_batch_in_its_own_range_and_size(teacher_file):
    pre = Preprocessing((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), (16, 16))
    teacher = Teacher(teacher_file, 10, 3, pre, torch.device("cpu"))
    x = torch.rand(2, 3, 16, 16) * 2 - 1  # the student's [-1, 1]
    pixels = x * 0.5 + 0.5  # [0, 1]
    mean, std = torch.tensor([0.4, 0.45, 0.5]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    theirs = F.interpolate((pixels - mean) / std, size=(24, 24), mode="bilinear", antialias=True)
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), teacher.model(theirs), atol=1e-5, rtol=1e-5)
    assert not teacher.model.training and not any(p.requires_grad for p in teacher.model.parameters())


def test_a_cnn_teacher_works(tmp_path):
    cnn = randomise(build_model(ResNetConfig(units=(1, 1), img_size=(16, 16), num_classes=10)))
    save_checkpoint(cnn, tmp_path / "cnn.safetensors")
    teacher = Teacher(tmp_path / "cnn.safetensors", 10, 3, Preprocessing.for_config(cnn.cfg), torch.device("cpu"))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), cnn.eval()(x))


def test_bad_distillation_settings_get_one_line(tmp_path, teacher_file):
    from vitkit.train.loop import Trainer

    cases = [
        ({"train__distill": "hard"}, r"train.distill=hard needs a teacher: set train.teacher"),
        ({"train__teacher": str(teacher_file)}, r"train.teacher is set but train.distill is none"),
        (
            {"train__distill": "soft", "train__teacher": "x", "train__distill_temperature": 0},
            r"must be in \(0, 1000\], got 0",
        ),
        ({"train__distill_alpha": 1.5}, r"train.distill_alpha must be in \[0, 1\], got 1.5"),
        ({"train__distill": "kd"}, r"train.distill must be one of none, hard, soft"),
        ({"model__overrides__distill_token": "yes"}, r"model.overrides.distill_token must be true or false"),
    ]
    for changes, message in cases:
        with pytest.raises(RecipeError, match=message):
            recipe(tmp_path, **changes)
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    other = randomise(vitkit.create_model("vit_ti16", **(SMALL | {"num_classes": 7})))
    save_checkpoint(other, tmp_path / "seven.safetensors")
    for teacher, message in [
        (tmp_path / "missing.safetensors", r"^train.teacher: .*missing.safetensors: no such file"),
        (tmp_path / "junk.safetensors", r"^train.teacher: .*junk.safetensors: not a readable safetensors file"),
        (tmp_path / "seven.safetensors", r"the teacher predicts 7 classes, the model 10"),
    ]:
        r = recipe(tmp_path, train__distill="hard", train__teacher=str(teacher))
        with pytest.raises(RecipeError, match=message) as e:
            Trainer(r, tmp_path / "run").close()
        assert "\n" not in str(e.value)


def test_alpha_one_trains_only_the_distillation_head(tmp_path, teacher_file):
    """With alpha 1 the labels carry no weight: the zero-initialised class head gets no gradient and
    stays zero, while the distillation head learns the teacher."""
    r = recipe(
        tmp_path,
        model__overrides__distill_token=True,
        train__distill="hard",
        train__teacher=str(teacher_file),
        train__distill_alpha=1.0,
        train__steps=4,
    )
    train(r, tmp_path / "run")
    sd = load_train_state(list_checkpoints(tmp_path / "run" / "checkpoints")[-1]).model_state
    assert not sd["head.weight"].any() and sd["head_dist.weight"].abs().sum() > 0


def test_distillation_run_with_checkpointing_and_layer_decay_resumes_bit_exact(tmp_path, teacher_file, monkeypatch):

    r = recipe(
        tmp_path,
        model__overrides__distill_token=True,
        model__overrides__drop_rate=0.1,
        model__overrides__drop_path_rate=0.1,
        train__distill="soft",
        train__distill_temperature=2.0,
        train__teacher=str(teacher_file),
        train__grad_checkpointing=True,
        optim__layer_decay=0.8,
        log__eval_every=8,
    )
    result = train(r, tmp_path / "a")
    assert result.final_top1 is not None  # evaluation ran on the mean of the two heads
    records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    losses = [rec["loss"] for rec in records if "loss" in rec]
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses)

    resumed = stopped_and_resumed(r, tmp_path / "b", 6, monkeypatch, seed=12345)
    assert resumed.resumed_from == 4
    a = load_train_state(list_checkpoints(tmp_path / "a" / "checkpoints")[-1])
    b = load_train_state(list_checkpoints(tmp_path / "b" / "checkpoints")[-1])
    assert a.state.step == b.state.step == 8
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    scales = sorted({g["lr_scale"] for g in b.optim_state["param_groups"]})
    assert scales == pytest.approx([0.8**3, 0.8**2, 0.8, 1.0])  # 2 blocks: layers 0..3 kept their scales


def test_a_resumed_run_refuses_a_teacher_whose_weights_changed(tmp_path, teacher_file, monkeypatch):
    """The recipe names the same file, but another teacher sits there now: one line, nothing
    trained; with the first teacher back the run resumes to the uninterrupted run's weights."""
    from vitkit.train.distill import weights_digest

    r = recipe(tmp_path, train__distill="hard", train__teacher=str(teacher_file))
    first = teacher_file.read_bytes()
    train(r, tmp_path / "a")
    a = load_train_state(list_checkpoints(tmp_path / "a" / "checkpoints")[-1])
    assert a.state.teacher_digest == weights_digest(vitkit.load_pretrained(teacher_file))

    stopped(r, tmp_path / "b", 6, monkeypatch)
    other = randomise(vitkit.create_model("vit_ti16", **(SMALL | {"img_size": 24, "num_classes": 10})), seed=4)
    save_checkpoint(other, teacher_file, Preprocessing((0.4, 0.45, 0.5), (0.2, 0.25, 0.3), (24, 24)))
    with pytest.raises(TrainingError, match=r"^train.teacher .*teacher.safetensors: its weights changed since") as e:
        train(r, tmp_path / "b")
    assert "\n" not in str(e.value)
    assert load_train_state(list_checkpoints(tmp_path / "b" / "checkpoints")[-1]).state.step == 4
    teacher_file.write_bytes(first)
    resumed = train(r, tmp_path / "b")
    assert resumed.resumed_from == 4
    b = load_train_state(list_checkpoints(tmp_path / "b" / "checkpoints")[-1])
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)


@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d"])
def test_a_plain_vit_file_fine_tunes_into_a_distilled_student_and_back(tmp_path, pos_embed):
    """DeiT from a non-distilled checkpoint: the distillation token starts as a copy of the class
    token (with its position row) and the distillation head as a copy of the head, so the two
    heads start out identical and near the file's model (every token now also attends to the
    copy: not exactly equal); dropping the token again gives the file's weights back."""
    plain = randomise(tiny(pos_embed=pos_embed)).eval()
    save_checkpoint(plain, tmp_path / "plain.safetensors")
    student = vitkit.load_pretrained(tmp_path / "plain.safetensors", distill_token=True)
    assert student.cfg.distill_token and any("distillation token added" in n for n in student.load_report.notes)
    x = torch.randn(2, 3, *plain.cfg.img_size)
    with torch.no_grad():
        want = plain(x)
        student.set_distilled_training(True)
        student.train()
        cls, dist = student(x)  # dropout is 0 in the tiny model: train mode changes nothing else
    torch.testing.assert_close(cls, dist, atol=0, rtol=0)
    assert (cls - want).norm() / want.norm() < 0.1
    save_checkpoint(student.eval(), tmp_path / "student.safetensors")
    back = vitkit.load_pretrained(tmp_path / "student.safetensors", distill_token=False)
    assert not back.cfg.distill_token and any("removed" in n for n in back.load_report.notes)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, atol=0, rtol=0)


def test_switching_the_distillation_token_on_a_relative_position_model_is_refused(tmp_path):
    save_checkpoint(tiny(pos_embed="relative"), tmp_path / "rel.safetensors")
    with pytest.raises(vitkit.errors.UsageError, match="pos_embed='relative'"):
        vitkit.load_pretrained(tmp_path / "rel.safetensors", distill_token=True)


def test_init_from_a_plain_vit_trains_a_distilled_student(tmp_path, teacher_file):
    """train.teacher with model.init_from a file that has no distillation token: the trainer's
    load adds it (see above) instead of refusing the file, and both heads train."""
    plain = randomise(tiny(num_classes=10, img_size=16))
    save_checkpoint(plain, tmp_path / "plain.safetensors")
    r = recipe(
        tmp_path,
        model__init_from=str(tmp_path / "plain.safetensors"),
        model__overrides={"distill_token": True},
        train__distill="soft",
        train__teacher=str(teacher_file),
        train__steps=2,
    )
    train(r, tmp_path / "run")
    sd = load_train_state(list_checkpoints(tmp_path / "run" / "checkpoints")[-1]).model_state
    assert not torch.equal(sd["head.weight"], sd["head_dist.weight"])  # the two heads moved apart
    assert not torch.equal(sd["dist_token"], sd["cls_token"])


# ---------------------------------------------------------------------------------------------
# bf16 weights (train.bf16_weights): the step computed by a bf16 copy, the fp32 weights stepped


def test_bf16_weights_settings_are_checked():
    with pytest.raises(RecipeError, match=r"train.bf16_weights needs train.precision bf16 or auto, got fp32"):
        load_recipe(None, [("train.precision", "fp32"), ("train.bf16_weights", True)])
    # auto: a copy where it resolves to bf16, none where to fp32
    assert load_recipe(None, [("train.bf16_weights", True)]).train.precision == "auto"
    base = [("train.precision", "bf16"), ("train.bf16_weights", True)]
    with pytest.raises(RecipeError, match=r"train.bf16_weights would sum train.accum_steps=2 micro-steps"):
        load_recipe(None, [*base, ("train.accum_steps", 2)])
    with pytest.raises(RecipeError, match=r"copies whole parameters, which train.fsdp shards: set one of them"):
        load_recipe(None, [*base, ("train.fsdp", True)])


def test_the_bf16_copys_gradients_reach_the_fp32_weights_close_to_fp32_ones():
    from vitkit.train.compute import bf16_copy, copy_weights, grads_to_weights

    model = randomise(tiny(), seed=3)  # a random head too: a zero one passes no gradient back
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 5, (8,), generator=g)
    F.cross_entropy(model(x), y).backward()
    exact = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    net = bf16_copy(model)
    assert all(q.dtype == torch.bfloat16 for q in net.parameters())
    F.cross_entropy(net(x.to(torch.bfloat16)).float(), y).backward()
    grads_to_weights(net, model)
    assert all(q.grad is None for q in net.parameters())
    for n, p in model.named_parameters():
        assert p.grad.dtype == torch.float32
        cos = F.cosine_similarity(p.grad.flatten(), exact[n].flatten(), dim=0)
        # bf16 keeps about 3 significant digits; how its kernels round differs by CPU (a Zen 5 gives
        # 0.9988 for a LayerNorm bias), so the bound is what bf16 rounding allows, not one CPU's figure
        assert cos > 0.995, (n, float(cos))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-4)  # new weights: the copy takes them, rounded to bf16
    copy_weights(model, net)
    assert all(torch.equal(q, p.detach().to(torch.bfloat16)) for p, q in zip(model.parameters(), net.parameters()))


def test_a_bf16_weights_trainer_steps_the_fp32_weights_and_rounds_them_into_its_copy(tmp_path):
    from vitkit.train.loop import Trainer

    trainer = Trainer(tiny_recipe(tmp_path, train__precision="bf16", train__bf16_weights=True), tmp_path / "run")
    seen: list[torch.dtype] = []
    real_step = trainer.optimizer.step
    trainer.optimizer.step = lambda: (seen.extend(p.grad.dtype for p in trainer.model.parameters()), real_step())
    g = torch.Generator().manual_seed(0)
    trainer.model.train(), trainer.compute.net.train()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    for _ in range(3):
        trainer.train_step(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g))
        trainer.state.step += 1
    trainer.close()
    assert trainer.compute.net is not trainer.model and set(seen) == {torch.float32}
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))  # it did step
    for (n, p), q in zip(trainer.model.named_parameters(), trainer.compute.net.parameters(), strict=True):
        assert p.dtype == torch.float32 and q.dtype == torch.bfloat16
        assert torch.equal(q, p.detach().to(torch.bfloat16)), n  # the copy is the weights rounded
    # the fp32 weights keep what rounding to bf16 would lose
    w = dict(trainer.model.named_parameters())["blocks.0.mlp.fc1.weight"].detach()
    assert not torch.equal(w, w.to(torch.bfloat16).float())
