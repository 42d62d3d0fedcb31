"""``vitkit embed`` and the embeddings files that ``vitkit fewshot`` and ``vitkit probe`` read:
the vectors are the model's own, unreadable files are listed, a killed run resumes without
computing a finished batch again, and a probe on embeddings scores as the probe on model and data."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.eval import model_preprocessing
from vitkit.eval.embed import embed_folder, image_files, labelled_embeddings, read_embeddings

TINY = {"img_size": 32, "patch_size": 8, "depth": 2, "width": 32, "num_heads": 2, "mlp_dim": 64}
CLASSES = ("cat", "dog", "owl")


def _tiny(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return vitkit.create_model("vit_ti16", **{**TINY, **overrides})


def _images(root, per_class: int, seed: int) -> None:
    """Noisy images whose colour leans to their class: a probe scores well, not perfectly."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = np.full((32, 32, 3), 110.0)
            base[..., c] += 35
            pixels = np.clip(base + rng.normal(0, 70, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i:02d}.png")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.safetensors"
    vitkit.save_checkpoint(_tiny(), path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """data/train/<class>/*.png and data/val/<class>/*.png."""
    root = tmp_path_factory.mktemp("data")
    _images(root / "train", 8, seed=1)
    _images(root / "val", 5, seed=2)
    return root


def _forward(model, folder, paths, pool):
    """The model's own forward on the files as vitkit.load_images prepares them."""
    x = vitkit.load_images([folder / p for p in paths], model_preprocessing(model), model.cfg.in_chans).inputs
    with torch.no_grad():
        tokens = model.forward_features(x)
        if pool == "cls":
            return tokens[:, 0]
        if pool == "patch":
            return tokens[:, model.num_prefix_tokens :]
        return model.forward_head(tokens, pre_logits=True)


@pytest.mark.parametrize(("pool", "shape"), [("pooled", (24, 32)), ("cls", (24, 32)), ("patch", (24, 16, 32))])
def test_each_pool_is_the_models_own_forward(ckpt, data, tmp_path, pool, shape):
    model = vitkit.load_pretrained(ckpt)
    out = tmp_path / f"{pool}.safetensors"
    res = embed_folder(model, data / "train", pool=pool, batch_size=5, out=out)
    assert res.vectors is None and res.computed_batches == 5 and not out.with_name(out.name + ".parts").exists()
    emb = read_embeddings(out)
    assert tuple(emb.vectors.shape) == shape and emb.pool == pool and emb.paths[:2] == ["cat/00.png", "cat/01.png"]
    assert emb.metadata["preprocessing"] == model.preprocessing.to_dict() and emb.model == str(ckpt)
    torch.testing.assert_close(emb.vectors, _forward(model, data / "train", emb.paths, pool), atol=1e-6, rtol=0)
    in_memory = embed_folder(model, data / "train", pool=pool, batch_size=7)
    assert torch.equal(in_memory.vectors, emb.vectors) and in_memory.paths == emb.paths


def test_patch_tokens_leave_out_every_prefix_token(tmp_path):
    _images(tmp_path / "imgs", 1, seed=3)
    distilled = _tiny(distill_token=True)
    assert distilled.num_prefix_tokens == 2
    res = embed_folder(distilled, tmp_path / "imgs", pool="patch")
    assert tuple(res.vectors.shape) == (3, 16, 32)
    torch.testing.assert_close(
        res.vectors, _forward(distilled, tmp_path / "imgs", res.paths, "patch"), atol=1e-6, rtol=0
    )
    fields = {f.name for f in dataclasses.fields(vitkit.ViTConfig)}
    if "num_registers" in fields:  # registers (DINOv2 with registers) sit between the class token and the patches
        with_registers = _tiny(num_registers=4)
        assert with_registers.num_prefix_tokens == 5
        res = embed_folder(with_registers, tmp_path / "imgs", pool="patch")
        expected = _forward(with_registers, tmp_path / "imgs", res.paths, "patch")  # tokens[:, 5:]
        assert tuple(res.vectors.shape) == (3, 16, 32)
        torch.testing.assert_close(res.vectors, expected, atol=1e-6, rtol=0)
    gap = _tiny(classifier="gap")
    with pytest.raises(vitkit.UsageError, match="no class token"):
        embed_folder(gap, tmp_path / "imgs", pool="cls")
    assert embed_folder(gap, tmp_path / "imgs", pool="patch").vectors.shape == (3, 16, 32)


def test_unreadable_files_are_skipped_and_listed(ckpt, tmp_path, capsys):
    folder = tmp_path / "imgs"
    _images(folder, 2, seed=4)
    (folder / "cat" / "garbage.png").write_bytes(b"not an image at all")
    whole = (folder / "dog" / "00.png").read_bytes()
    (folder / "dog" / "cut.png").write_bytes(whole[: len(whole) // 2])
    deep = (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) * 60).astype(np.uint16)
    Image.fromarray(deep).save(folder / "owl" / "sixteen_bit.png")  # 16 bits: read, scaled by its range
    (folder / "notes.txt").write_text("not an image file: not listed")
    out = tmp_path / "e.safetensors"
    assert main(["embed", str(ckpt), str(folder), "--out", str(out), "--batch-size", "3"]) == 0
    captured = capsys.readouterr()
    assert "skipped 2 unreadable file(s)" in captured.err and "cat/garbage.png" in captured.err
    emb = read_embeddings(out)
    assert [p for p, _ in emb.skipped] == ["cat/garbage.png", "dog/cut.png"]
    assert all(why and "\n" not in why for _, why in emb.skipped)
    assert "owl/sixteen_bit.png" in emb.paths and len(emb.paths) == emb.vectors.shape[0] == 7
    assert emb.metadata["shape"] == [7, 32]


_KILLABLE = textwrap.dedent(
    """
    import os, signal, sys
    import vitkit.cli.embed as command
    from vitkit.cli import main

    kill_at, calls, load = int(sys.argv[1]), [0], command.load_model

    def counted(*args, **kwargs):  # the model, its forward passes counted; SIGKILL at pass kill_at
        model = load(*args, **kwargs)
        forward = model.forward_features

        def forward_features(x):
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return forward(x)

        model.forward_features = forward_features
        return model

    command.load_model = counted
    try:
        rc = main(sys.argv[2:])
    finally:
        print(f"forward passes: {calls[0]}")
    sys.exit(rc)
    """
)


def test_a_killed_run_resumes_without_computing_a_finished_batch_again(ckpt, data, tmp_path):
    out = tmp_path / "out" / "train.safetensors"
    out.parent.mkdir()
    argv = ["embed", str(ckpt), str(data / "train"), "--out", str(out), "--batch-size", "5", "--precision", "fp32"]
    script = tmp_path / "killable.py"
    script.write_text(_KILLABLE)

    def run(kill_at: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), str(kill_at), *argv], capture_output=True, text=True)

    killed = run(kill_at=3)  # SIGKILL in the third batch's forward pass
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    parts = out.with_name(out.name + ".parts")
    assert sorted(p.name for p in parts.iterdir()) == ["00000.safetensors", "00001.safetensors", "run.json"]
    assert not out.exists()

    resumed = run(kill_at=0)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed      2 of 5 batches" in resumed.stdout and "forward passes: 3" in resumed.stdout
    assert not parts.exists()

    clean = tmp_path / "clean.safetensors"
    assert main([*argv[:4], str(clean), *argv[5:]]) == 0
    assert out.read_bytes() == clean.read_bytes()


def test_parts_of_another_model_pool_or_file_list_are_refused(ckpt, data, tmp_path):
    folder = tmp_path / "imgs"
    _images(folder, 3, seed=5)
    out = tmp_path / "e.safetensors"
    model = vitkit.load_pretrained(ckpt)
    done = []

    def interrupt(n: int) -> None:
        done.append(n)
        if len(done) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embed_folder(model, folder, batch_size=2, out=out, progress=interrupt)
    refusals = [
        ({"model": _tiny(seed=1)}, "another model"),
        ({"pool": "cls"}, 'pool "pooled", not "cls"'),
        ({"batch_size": 3}, "batch_size 2, not 3"),
    ]
    for change, message in refusals:
        args = {"model": model, "pool": "pooled", "batch_size": 2, **change}
        with pytest.raises(vitkit.UsageError, match=message):
            embed_folder(args.pop("model"), folder, out=out, **args)
    extra = folder / "cat" / "zz.png"
    extra.write_bytes((folder / "cat" / "00.png").read_bytes())
    with pytest.raises(vitkit.UsageError, match="another list of files"):
        embed_folder(model, folder, batch_size=2, out=out)
    extra.unlink()
    res = embed_folder(model, folder, batch_size=2, out=out)
    assert (res.reused_batches, res.computed_batches) == (2, 3)


def test_probe_and_fewshot_on_embeddings_score_as_on_model_and_data(ckpt, data, tmp_path, capsys):
    from vitkit.data.folder import ImageFolder
    from vitkit.eval import evaluate_fewshot, evaluate_probe, extract_features, fewshot_eval
    from vitkit.eval.probe import probe_features

    model = vitkit.load_pretrained(ckpt)
    train = ImageFolder(data, "train", load_size=32, resize="plain")  # the files at their size: no resampling
    test = ImageFolder(data, "val", load_size=32, resize="plain")
    probe_options = {"max_iter": 100, "knn_k": 3}
    direct = evaluate_probe(model, train, test, max_train=None, batch_size=7, **probe_options)
    shots = {"shots": (1, 3), "seeds": 2}
    direct_fewshot = evaluate_fewshot(model, train, test, batch_size=7, **shots)

    tr, va = tmp_path / "tr.safetensors", tmp_path / "va.safetensors"
    for split, out in (("train", tr), ("val", va)):
        assert main(["embed", str(ckpt), str(data / split), "--out", str(out), "--precision", "fp32"]) == 0
    labelled = labelled_embeddings(tr, va)
    assert labelled.classes == list(CLASSES) and labelled.train_y.tolist() == train.labels.tolist()
    features = (labelled.train_x, labelled.train_y, labelled.test_x, labelled.test_y)
    torch.testing.assert_close(labelled.train_x, extract_features(model, train)[0], atol=1e-6, rtol=0)
    from_files = probe_features(*features, 3, **probe_options)
    for method in ("linear_probe", "knn"):
        assert from_files[method]["top1"] == direct[method]["top1"]
    assert 0.4 < direct["knn"]["top1"] < 1.0  # the scores compared are not trivially equal
    fewshot = fewshot_eval(*features, num_classes=3, **shots)
    assert [r["per_seed"] for r in fewshot["results"]] == [r["per_seed"] for r in direct_fewshot["results"]]

    capsys.readouterr()
    report = tmp_path / "probe.json"
    argv = ["probe", "--train-embeddings", str(tr), "--test-embeddings", str(va), "--max-iter", "100"]
    assert main([*argv, "--knn-k", "3", "--json", str(report)]) == 0
    assert "classes      3: cat, dog, owl" in capsys.readouterr().out
    written = json.loads(report.read_text())
    assert written["linear_probe"]["top1"] == direct["linear_probe"]["top1"] and written["pool"] == "pooled"
    argv = ["fewshot", "--train-embeddings", str(tr), "--test-embeddings", str(va), "--shots", "1", "3"]
    assert main([*argv, "--seeds", "2", "--json", str(report)]) == 0
    assert [r["mean"] for r in json.loads(report.read_text())["results"]] == [
        r["mean"] for r in direct_fewshot["results"]
    ]


def _one_line_error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_bad_input_is_one_line(ckpt, data, tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    embed = ["embed", str(ckpt)]
    assert "no image files" in _one_line_error([*embed, str(tmp_path / "empty"), "--out", "x.safetensors"], capsys)
    missing = str(tmp_path / "nowhere" / "e.safetensors")
    assert "does not exist" in _one_line_error([*embed, str(data / "val"), "--out", missing], capsys)
    assert "name the file so" in _one_line_error([*embed, str(data / "val"), "--out", str(tmp_path / "e.npy")], capsys)
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("a.png", "b.jpg"):
        (broken / name).write_bytes(b"\x89PNG not really")
    unread = _one_line_error([*embed, str(broken), "--out", str(tmp_path / "b.safetensors")], capsys)
    assert "none of its 2 image files could be read" in unread and "a.png" in unread
    assert not (tmp_path / "b.safetensors.parts").exists()

    files = {}
    for name, pool, weights in [("va", "pooled", ckpt), ("patch", "patch", ckpt), ("cls", "cls", ckpt)]:
        files[name] = tmp_path / f"{name}.safetensors"
        assert main([*embed[:1], str(weights), str(data / "val"), "--out", str(files[name]), "--pool", pool]) == 0
    for name, model in [("other", _tiny(seed=7)), ("wide", _tiny(width=48, num_heads=2))]:
        files[name] = tmp_path / f"{name}.safetensors"
        embed_folder(model, data / "val", out=files[name])
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.png").write_bytes((data / "val" / "cat" / "00.png").read_bytes())
    files["flat"] = tmp_path / "flat.safetensors"
    embed_folder(vitkit.load_pretrained(ckpt), flat, out=files["flat"])

    def probe(train: str, test: str = "va") -> str:
        argv = ["probe", "--train-embeddings", str(files[train]), "--test-embeddings", str(files[test])]
        return _one_line_error(argv, capsys)

    assert "patch tokens (pool patch)" in probe("patch")
    assert "different pool" in probe("cls")
    assert "different models" in probe("other")
    assert "48-dimensional" in probe("va", "wide")
    assert "in no class folder" in probe("flat")
    assert "give both" in _one_line_error(["probe", "--train-embeddings", str(files["va"])], capsys)
    both = ["fewshot", str(ckpt), "--train-embeddings", str(files["va"]), "--test-embeddings", str(files["va"])]
    assert "leave out the model" in _one_line_error(both, capsys)
    assert "give a model and --data" in _one_line_error(["fewshot", str(ckpt)], capsys)
    assert "not an embeddings file" in _one_line_error(
        ["fewshot", "--train-embeddings", str(ckpt), "--test-embeddings", str(files["va"])], capsys
    )

    # vectors that are not finite are named, not fitted (a probe of NaNs scores 0% and says nothing)
    from vitkit.checkpoint.io import CHECKSUM_KEY, read_safetensors, write_safetensors

    tensors, meta = read_safetensors(files["va"])
    tensors["embeddings"][3] = float("nan")
    files["nan"] = tmp_path / "nan.safetensors"
    write_safetensors(files["nan"], tensors, {k: v for k, v in meta.items() if k != CHECKSUM_KEY})
    assert "1 of its 15 vectors are not finite (NaN or infinity), the first of cat/03.png" in probe("nan")
    few = ["fewshot", "--train-embeddings", str(files["va"]), "--test-embeddings", str(files["nan"])]
    assert "not finite" in _one_line_error(few, capsys)
    # an existing file that is not an embeddings file (the model's own weights) is never overwritten
    before = ckpt.read_bytes()
    assert "is not an embeddings file of vitkit embed; it is not overwritten" in _one_line_error(
        [*embed, str(data / "val"), "--out", str(ckpt)], capsys
    )
    assert ckpt.read_bytes() == before


def test_parquet_without_pyarrow_is_one_line_and_with_it_round_trips(ckpt, data, tmp_path, capsys):
    out = tmp_path / "e.parquet"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        err = _one_line_error(["embed", str(ckpt), str(data / "val"), "--out", str(out)], capsys)
        assert "pip install pyarrow" in err and not out.exists()
        return
    assert (
        main(["embed", str(ckpt), str(data / "val"), "--out", str(out), "--pool", "patch", "--precision", "fp32"]) == 0
    )
    emb, ref = read_embeddings(out), embed_folder(vitkit.load_pretrained(ckpt), data / "val", pool="patch")
    assert emb.paths == ref.paths and torch.equal(emb.vectors, ref.vectors) and emb.pool == "patch"


def test_files_are_walked_in_the_image_folder_order(tmp_path):
    for rel in ["b.png", "a/z.png", "a.png", "a/b/c.png", ".hidden/x.png", "a/.x.png", "c.JPG", "d.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert image_files(tmp_path) == ["a.png", "b.png", "c.JPG", "a/z.png", "a/b/c.png"]


@pytest.mark.parametrize("name", ["vit", "bit_r50x1"])
def test_bf16_on_the_cpu_computes_with_the_serving_copy_and_leaves_the_model_alone(data, name):
    from vitkit.inference import prepare_inference

    torch.manual_seed(0)
    model = _tiny() if name == "vit" else vitkit.create_model(name, img_size=32, num_classes=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = embed_folder(model, data / "val", pool="pooled", batch_size=4, precision="bf16")
    assert res.metadata["precision"] == "bf16" and res.metadata.get("computed_by", "bf16 weights") == "bf16 weights"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "the model was changed"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    if name != "vit":  # a random BiT in bf16 amplifies an input's last bit to whole units: shapes only
        assert res.vectors.shape == (15, model.num_features) and res.vectors.isfinite().all()
        return
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "the model was changed"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    if name != "vit":  # a random BiT in bf16 amplifies an input's last bit to whole units: shapes only
        assert res.vectors.shape == (15, model.num_features) and res.vectors.isfinite().all()
        return
    x = vitkit.load_images([data / "val" / p for p in res.paths], model_preprocessing(model), 3).inputs
    served = prepare_inference(model.eval(), "bf16")  # as embed_folder prepares it: from the eval-mode model
    model.train()
    with torch.inference_mode():
        own = torch.cat(
            [served.forward_head(served.forward_features(b.bfloat16()), pre_logits=True) for b in x.split(4)]
        )
    torch.testing.assert_close(res.vectors, own.float(), atol=0, rtol=0)
    fp32 = embed_folder(model, data / "val", pool="pooled", batch_size=4).vectors
    torch.testing.assert_close(res.vectors, fp32, atol=0.05 * float(fp32.abs().max()), rtol=0)


def test_parquet_columns_open_in_pandas_and_pyarrow(ckpt, data, tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    pd = pytest.importorskip("pandas")
    out = tmp_path / "e.parquet"
    argv = ["embed", str(ckpt), str(data / "val"), "--out", str(out), "--format", "parquet", "--precision", "fp32"]
    assert main(argv) == 0
    table = pq.read_table(out)
    assert table.column_names == ["path", "label", "prediction", "vector"]
    frame = pd.read_parquet(out)
    assert list(frame["label"]) == [p.split("/")[0] for p in frame["path"]]
    model = vitkit.load_pretrained(ckpt)
    ref = embed_folder(model, data / "val", pool="pooled")
    assert list(frame["path"]) == ref.paths
    assert np.allclose(np.stack(frame["vector"].to_numpy()), ref.vectors.numpy())
    expected = model.head(ref.vectors).argmax(-1).tolist()  # the classes have no names: their indices
    assert list(frame["prediction"]) == [str(i) for i in expected]
    # patch tokens have no prediction; a --format that the name contradicts is refused
    assert main([*argv[:-4], "--pool", "patch", "--precision", "fp32"]) == 0
    assert pd.read_parquet(out)["prediction"].isna().all()
    assert "--format parquet writes a .parquet file" in _one_line_error(
        [*argv[:4], str(tmp_path / "e.safetensors"), *argv[5:]], capsys
    )
