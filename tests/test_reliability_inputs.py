"""Outside input checked at the door and against itself: hub files bounded like every config,
truncated weights in the hub cache caught by their structure, YAML with characters it does not
allow, devices that are absent, a Hugging Face config.json that contradicts its weights, class
names and thresholds that do not fit the head, and the minival of multi-label data carved by a
rule that counts every label."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

import vitkit
from _recipes import TINY_VIT, changed
from vitkit.cpu import device_problem
from vitkit.data import build_dataset
from vitkit.data.carve import MINIVAL, carve, multilabel_minival
from vitkit.errors import CheckpointError, DataError, DownloadError, RecipeError, UsageError
from vitkit.export import export_weights
from vitkit.files import check_yaml_text, yaml_text_problem


@pytest.fixture(scope="module")
def tiny():
    return vitkit.create_model(
        "vit_s16", img_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3
    )


# -- the Hugging Face hub cache -------------------------------------------------------------------


def _hub_repo(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    """huggingface_hub's layout: refs/main names a revision whose snapshot links to blobs named
    by their sha256."""
    folder = root / "hub" / f"models--{repo.replace('/', '--')}"
    rev = hashlib.sha1(repo.encode()).hexdigest()
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(rev)
    snap = folder / "snapshots" / rev
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir()
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return folder


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    export_weights(tiny, tmp_path / "hfdir", "hf")
    return {n: (tmp_path / "hfdir" / n).read_bytes() for n in ("config.json", "model.safetensors")}


@pytest.mark.parametrize("config", [b"[" * 5000 + b"]" * 5000, b'{"a": ' * 3000 + b"1" + b"}" * 3000, b"[1, 2]"])
def test_a_hub_config_nested_deep_or_not_an_object_is_one_line(tmp_path, hub, config):
    _hub_repo(tmp_path / "hf", "org/deep", {**hub, "config.json": config})
    with pytest.raises(
        CheckpointError, match=r"config.json: (the JSON is nested \d+ levels deep|expected a JSON object)"
    ):
        vitkit.load_pretrained("hf-hub:org/deep")


def test_a_truncated_weight_file_in_the_hub_cache_is_caught_by_its_structure(tmp_path, hub, monkeypatch):
    cut = hub["model.safetensors"][: len(hub["model.safetensors"]) // 2]
    _hub_repo(tmp_path / "hf", "org/cut", {**hub, "model.safetensors": cut})
    hashed = []
    monkeypatch.setattr(hashlib, "sha256", lambda *a, **k: hashed.append(1) or hashlib.new("sha256", *a, **k))
    with pytest.raises(DownloadError, match=r"model.safetensors in the hub cache is damaged or incomplete .*delete"):
        vitkit.load_pretrained("hf-hub:org/cut")
    assert not hashed  # refused before the whole file is read to hash it


@pytest.mark.parametrize("revision", ["../refs/main", "a b", "x\x01", "main..dev", "refs/heads/", "v1~1", "-x"])
def test_a_revision_git_would_refuse_is_one_line_before_the_cache(revision):
    # a revision is joined into paths of the hub cache: '..' must not walk out of a repository's folder
    with pytest.raises(UsageError, match=r"hf-hub:org/good: the revision .* is not a branch, tag or commit name"):
        vitkit.load_pretrained(f"hf-hub:org/good@{revision}")


def test_revisions_git_allows_are_taken():
    from vitkit.hub.hf import parse

    for rev in ("main", "v1.0", "refs/pr/3", "0123abcd" * 5, "release_2024-01"):
        assert parse(f"hf-hub:org/good@{rev}") == ("org/good", rev)


# -- YAML and devices ------------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["\x07", "\x1b", "\x7f", "\ud800", "\ufffe", "\x00"])
def test_a_character_yaml_refuses_is_named_with_its_line_and_key(char):
    text = f"train:\n  steps: 10\ndescription: caf{char}\n"
    with pytest.raises(yaml.YAMLError):  # what PyYAML does with it: a traceback where it is not caught
        yaml.safe_load(text)
    problem = yaml_text_problem(text, "r.yaml")
    shown = char.encode("unicode_escape").decode()
    assert problem.startswith(f"r.yaml: line 3, key 'description' holds the character {shown}")
    with pytest.raises(RecipeError, match="line 3, key 'description'"):
        check_yaml_text(text, "r.yaml", RecipeError)


def test_text_yaml_takes_passes_the_character_check():
    text = 'description: "café 日本 \U0001f600\ttab"\r\nsteps: 3\n'
    assert yaml_text_problem(text, "r.yaml") is None and yaml.safe_load(text)["steps"] == 3


@pytest.mark.parametrize("name", ["mps", "xpu", "meta", "mps:0"])
def test_an_absent_or_unsupported_device_is_named(name):
    problem = device_problem(name)
    assert problem is not None and problem.startswith(repr(name)) and "use cpu" in problem
    from vitkit.train.dist import resolve_device

    with pytest.raises(RecipeError, match=f"train.device: {name!r}"):
        resolve_device(name)


def test_devices_vitkit_runs_on_pass():
    assert device_problem("cpu") is None
    assert "expected cpu, cuda or cuda:N" in device_problem("tpu")
    assert (device_problem("cuda") is None) == torch.cuda.is_available()


def test_the_command_line_names_an_absent_device_in_one_line(capsys):
    from vitkit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["predict", "w.safetensors", "img.png", "--device", "mps"])
    assert e.value.code == 2 and "'mps': a mps device" in capsys.readouterr().err


# -- a Hugging Face folder against itself ------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_folder(tiny, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    export_weights(tiny, folder, "hf")
    return folder


def _with_config(src: Path, dst: Path, **change) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **change}))
    return dst


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 64}, "hidden_size is 64, but the weights have 32"),
        ({"num_hidden_layers": 12}, "num_hidden_layers is 12, but the weights have 2"),
        ({"patch_size": 0}, "patch_size is 0, but the weights have 4"),
        ({"patch_size": [4, 8]}, r"patch_size is \[4, 8\], but the weights have 4"),
        ({"num_channels": 1}, "num_channels is 1, but the weights have 3"),
        ({"intermediate_size": 3072}, "intermediate_size is 3072, but the weights have 64"),
        ({"id2label": ["a", "b", "c"]}, "id2label must be an object"),
        ({"id2label": {"a": "x", "b": "y", "c": "z"}}, "id2label key 'a' is not a class index"),
        ({"id2label": {"0": "x", "1": "y", "3": "z"}}, "id2label has no class 2"),
        ({"id2label": {"0": "x", "1": "y"}}, "id2label names 2 classes, but the head has 3 outputs"),
        ({"id2label": {"0": "x", "1": 5, "2": "z"}}, r"id2label\['1'\] must be a name"),
        (
            {"vitkit_thresholds": [0.5, float("nan"), 0.5]},
            r"vitkit_thresholds\[1\] must be a number in \[0.0, 1.0\], got nan",
        ),
        ({"vitkit_thresholds": [0.5, -0.1, 0.5]}, r"vitkit_thresholds\[1\] must be .* got -0.1"),
        ({"vitkit_thresholds": [0.5, 0.5]}, "vitkit_thresholds must be a list of 3 numbers .* got 2 values"),
        ({"vitkit_thresholds": ["0.5", 0.5, 0.5]}, r"vitkit_thresholds\[0\] must be .* got '0.5'"),
        ({"vitkit_thresholds": {"0": 0.5}}, "vitkit_thresholds must be a list of 3 numbers .* got a dict"),
    ],
)
def test_a_config_that_contradicts_its_weights_or_head_is_refused(hf_folder, tmp_path, change, message):
    if "vitkit_thresholds" in change:
        change["problem_type"] = "multi_label_classification"
    folder = _with_config(hf_folder, tmp_path / "hf", **change)
    with pytest.raises(CheckpointError, match=f"{folder / 'config.json'}: {message}"):
        vitkit.load_pretrained(folder)


def test_names_and_thresholds_that_fit_the_head_are_used(hf_folder, tmp_path):
    from vitkit.eval.predict import class_names, stored_thresholds

    folder = _with_config(
        hf_folder,
        tmp_path / "hf",
        id2label={"0": "x", "1": "y", "2": "z"},
        problem_type="multi_label_classification",
        vitkit_thresholds=[0.5, 0.25, 1],
    )
    model = vitkit.load_pretrained(folder)
    assert class_names(model) == ["x", "y", "z"] and stored_thresholds(model) == [0.5, 0.25, 1.0]
    # a model without a head: Hugging Face's default id2label of every config is not its classes
    headless = vitkit.create_model(
        "vit_s16", img_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=0
    )
    export_weights(headless, tmp_path / "headless", "hf")
    _with_config(tmp_path / "headless", tmp_path / "h2", id2label={"0": "LABEL_0", "1": "LABEL_1"})
    assert vitkit.load_pretrained(tmp_path / "h2").num_classes == 0


# -- the minival of multi-label data -----------------------------------------------------------------


def test_the_multilabel_minival_gives_every_label_its_share():
    """The rule (iterative stratification): exactly n_val images; each label about n_val/N of its
    images, whichever label of a row it is; a label of one image stays in training; the same
    seed gives the same split."""
    g = torch.Generator().manual_seed(0)
    n, k = 200, 12
    rows = (torch.rand(n, k, generator=g) < torch.linspace(0.02, 0.6, k)).float()
    rows[:, 0] = 0
    rows[torch.arange(n) % 4 == 0, 0] = 1  # a class on a quarter of the images
    rows[:, -1] = 0
    rows[7, -1] = 1  # a tag of one image
    rows[rows.sum(1) == 0, 1] = 1
    val = multilabel_minival(rows, 40, seed=3)
    assert len(val) == 40 and len(set(val.tolist())) == 40
    got, want = rows[val].sum(0), rows.sum(0) * 40 / n
    assert ((got - want).abs() <= 2).all(), (got, want)
    assert got[-1] == 0  # its one image is left to train on
    assert torch.equal(val, multilabel_minival(rows, 40, seed=3))
    assert not torch.equal(val, multilabel_minival(rows, 40, seed=4))


def _image(path: Path, colour: int, g: torch.Generator) -> None:
    img = (torch.rand(16, 16, 3, generator=g) * 60).to(torch.uint8)
    img[..., colour % 3] += 150
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img.numpy()).save(path)


def tags_file(root: Path, n: int = 60) -> Path:
    """A class and attribute tags per row, the tags never the first label (``chelsea warm round``)."""
    g = torch.Generator().manual_seed(0)
    lines = ["path,labels"]
    for i in range(n):
        tags = [t for t, every in (("warm", 2), ("round", 3)) if i % every == 0] or ["plain"]
        _image(root / f"images/{i}.png", i % 3, g)
        lines.append(f"images/{i}.png,{['chelsea', 'tabby', 'siamese'][i % 3]} {' '.join(tags)}")
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    return root / "train.csv"


def test_a_tags_only_labels_file_carves_a_minival_holding_every_tag(tmp_path):
    f = tags_file(tmp_path)
    train = build_dataset(str(f), "train", load_size=16)
    val = build_dataset(str(f), "val", load_size=16)
    assert train.multilabel and len(train) + len(val) == 60
    assert not {p for p, _ in train.samples} & {p for p, _ in val.samples}
    assert (val.label_rows.sum(0) > 0).all() and (train.label_rows.sum(0) > 0).all()
    from vitkit.data.labels import LabelsFile

    whole = LabelsFile(f, load_size=16)
    assert len(carve(whole, MINIVAL, minival=6)) == 6
    with pytest.raises(DataError, match=r"takes every image of label (chelsea|plain|round|siamese|tabby|warm)"):
        carve(whole, MINIVAL, minival=59)


@pytest.mark.slow
def test_a_tags_only_labels_file_trains_evaluates_map_and_resumes(tmp_path):
    from vitkit.train import load_recipe, train

    f = tags_file(tmp_path)
    tree = changed(TINY_VIT, data__name=str(f), train__loss="sigmoid", log__eval_every=4)
    tree["data"].update(options={"load_size": 16}, eval_split="val")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tree))
    result = train(load_recipe(tmp_path / "r.yaml"), tmp_path / "run")
    assert result.multilabel and 0.0 <= result.report.multilabel["map_macro"] <= 1.0
    first = (tmp_path / "run" / "checkpoints" / "step_0000008.safetensors").read_bytes()
    (tmp_path / "run" / "checkpoints" / "step_0000008.safetensors").unlink()  # as if killed before it
    resumed = train(load_recipe(tmp_path / "r.yaml"), tmp_path / "run")
    assert resumed.step == 8 and resumed.report.multilabel is not None
    again = vitkit.load_pretrained(tmp_path / "run" / "checkpoints" / "step_0000008.safetensors")
    assert again.num_classes == 6 and len(first) > 0


# -- run folders and shards --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, said",
    [
        ("", r"is empty \(0 bytes\)"),
        ("# written by vitkit\n\n", "is empty"),
        ("model:\n  name: vit_ti16\n", "has no data, augment, optim, train, log sections"),
    ],
)
def test_an_emptied_or_cut_saved_recipe_is_named(tmp_path, text, said):
    from vitkit.errors import TrainingError
    from vitkit.train.runfolder import check_run_folder

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_0000004.safetensors").write_bytes(b"x")
    (run / ".vitkit-run").write_text("{}")
    (run / "config.yaml").write_text(text)
    with pytest.raises(TrainingError, match=f"{run / 'config.yaml'}: the recipe saved with this run {said}"):
        check_run_folder(run)
    whole = yaml.safe_dump({k: {} for k in ("description", "model", "data", "augment", "optim", "train", "log")})
    (run / "config.yaml").write_text("# vitkit\n" + whole)
    check_run_folder(run)  # a whole one is the resume's to compare


def test_a_damaged_shard_is_said_once_as_a_warning_naming_it(tmp_path, caplog):
    import io
    import tarfile

    from vitkit.data.shards import ShardDataset

    path = tmp_path / "train-000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(6):
            b = io.BytesIO()
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(b, "PNG")
            for name, data in ((f"{i:05d}.png", b.getvalue()), (f"{i:05d}.cls", f"{i % 2}\n".encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    (tmp_path / "classes.txt").write_text("even\nodd\n")
    ds = ShardDataset(str(path), load_size=4, reader="tarfile", num_samples=8, shuffle_buffer=0)
    with caplog.at_level("WARNING", logger="vitkit"):
        for _ in ds.batches(1):
            pass
    said = [r.getMessage() for r in caplog.records if "warning: shard" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"warning: shard {path} (cut short"), said
