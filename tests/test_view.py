"""``vitkit view``: one offline HTML page whose numbers are ``vitkit analyze``'s, opened and
clicked in a real (headless) Chromium."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.analysis import analyze
from vitkit.analysis.attention import register_attention_share
from vitkit.analysis.view import embedded_data, patch_pca_rgb
from vitkit.cli import main
from vitkit.preprocessing import load_images

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "docs" / "figures" / "view_page.png"
FASHION = Path("/usr/share/datasets/fashion-mnist")
READY = "document.body && document.body.dataset.ready === '1'"
PANELS = ("attention", "rollout", "similarity", "pca", "distance", "posembed", "filters")


def _tiny(**overrides):
    kw = dict(img_size=32, patch_size=8, depth=3, width=32, num_heads=2, mlp_dim=64, num_classes=3)
    kw.update(overrides)
    torch.manual_seed(0)
    return vitkit.create_model("vit_ti16", **kw).eval()


def _folder(root: Path, per_class: int = 4, size: int = 40) -> Path:
    rng = np.random.default_rng(0)
    for c in ("cat", "dog", "owl"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A page of a tiny model with two registers over a folder of 12 images."""
    root = tmp_path_factory.mktemp("view")
    ckpt = vitkit.save_checkpoint(_tiny(num_registers=2), root / "reg.safetensors")
    folder = _folder(root / "images")
    out = root / "view.html"
    assert main(["view", str(ckpt), str(folder), "--out", str(out), "--max-images", "3", "--workers", "0"]) == 0
    return out, ckpt, folder


# ----------------------------------------------------------------------------------------------
# The numbers


def test_the_page_carries_analyze_numbers(page):
    out, ckpt, _ = page
    data = embedded_data(out.read_text())
    paths = [im["path"] for im in data["images"]]
    assert len(paths) == 3 and all(Path(p).is_file() for p in paths)
    model = vitkit.load_pretrained(ckpt)
    images = load_images(paths, model.preprocessing, model.cfg.in_chans)
    analysis = analyze(model, images).to_dict(paths)  # what vitkit analyze writes to analysis.json
    assert [im["rollout"] for im in data["images"]] == analysis["rollout"]["maps"]  # the same rollout
    assert data["panels"]["distance"] == analysis["mean_attention_distance"]["values"]  # the same distances
    assert data["model"]["pos_summary"] == analysis["pos_embed_similarity"]
    assert data["panels"]["filters"]["variance"] == pytest.approx(
        analysis["filter_pca"]["explained_variance_ratio"], abs=1e-4
    )
    m = data["model"]
    assert (m["depth"], m["heads"], m["grid"], m["registers"]) == (3, 2, [4, 4], 2)
    first = data["images"][0]
    assert len(first["top5"]) == 3 and abs(sum(r["prob"] for r in first["top5"]) - 1) < 1e-4
    assert len(first["registers"]) == 3 and all(0 <= s <= 1 for s in first["registers"])
    import base64

    attn = np.frombuffer(base64.b64decode(first["attention"]), np.float32)
    assert attn.size == 3 * 2 * 16  # every layer and head over the 4x4 patches
    sim = np.frombuffer(base64.b64decode(first["similarity"]), np.uint8).reshape(3, 16, 16)
    assert (np.diagonal(sim, axis1=1, axis2=2) == 255).all()  # a patch is itself
    s = data["scatter"]
    assert s["count"] == 12 and s["classes"][3:] == ["cat", "dog", "owl"] and len(s["coords"]["pca"][0]) == 12
    assert sorted(set(s["labels"])) == [3, 4, 5] and all(0 <= p < 3 for p in s["predictions"])


def test_register_share_and_pca_colours_by_hand():
    N, prefix, registers = 6, 3, 2  # class token, two registers, three patches
    uniform = [torch.full((2, 1, N, N), 1 / N)]
    assert torch.allclose(
        register_attention_share(uniform, prefix, registers), torch.full((2, 1), 2 / 6, dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="register"):
        register_attention_share(uniform, 1, 2)
    # two images of 8 patches: three "object" patches far from five alike background ones
    feats = torch.zeros(2, 8, 4)
    feats[:, :3] = torch.tensor([[5.0, 1, 0, 0], [5, 0, 1, 0], [5, 0, 0, 1]])
    feats += 0.01 * torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0))
    rgb, fg = patch_pca_rgb(feats)
    assert fg[:, :3].all() and not fg[:, 3:].any()
    assert (rgb[:, 3:] == 0).all() and rgb.min() >= 0 and rgb.max() <= 1


def test_cli_caps_points_and_images_and_prints_the_size(tmp_path, capsys):
    ckpt = vitkit.save_checkpoint(_tiny(classifier="gap", in_chans=1, num_classes=0), tmp_path / "g.safetensors")
    folder = _folder(tmp_path / "images", per_class=3, size=20)
    out = tmp_path / "v.html"
    argv = ["view", str(ckpt), str(folder), "--out", str(out), "--max-points", "5", "--max-images", "2"]
    assert main([*argv, "--workers", "0"]) == 0
    text = capsys.readouterr().out
    assert "5 of 9 images (raise with --max-points)" in text and "2 of them shown" in text
    size = re.search(r"wrote .* \(([\d.]+) MB\)", text)
    assert size and abs(float(size.group(1)) - out.stat().st_size / 1e6) < 0.051
    data = embedded_data(out.read_text())
    assert data["scatter"]["count"] == 5 and len(data["images"]) == 2
    assert data["scatter"]["predictions"] is None and data["images"][0]["top5"] is None  # no head
    assert data["model"]["query"] == "mean over patch tokens"
    html = out.read_text()
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", html)  # nothing fetched from anywhere
    assert main(["view", str(ckpt), str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "nothing: no such image file" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# In a real browser


def _browser():
    from _browser import Browser, chromium

    pytest.importorskip("websocket", reason="the browser tests drive Chromium with websocket-client")
    binary = chromium()
    if binary is None:
        pytest.skip("no chromium (apt-get install chromium; .ci/run installs it)")
    return Browser(binary)


def _pixels(browser, canvas: str) -> str:
    return browser.evaluate(f"document.getElementById('{canvas}').toDataURL()")


def _centre_of(browser, element: str, fx: float = 0.5, fy: float = 0.5) -> tuple[float, float]:
    r = browser.evaluate(
        f"(() => {{ const r = document.getElementById('{element}').getBoundingClientRect(); "
        "return [r.left, r.top, r.width, r.height]; })()"
    )
    return r[0] + fx * r[2], r[1] + fy * r[3]


def _slide(browser, slider: str, value: int) -> None:
    browser.evaluate(
        f"(() => {{ const s = document.getElementById('{slider}'); s.value = {value}; "
        "s.dispatchEvent(new Event('input')); })()"
    )


def test_the_page_in_chromium_offline(page):
    out, _, folder = page
    with _browser() as b:
        b.open(out, READY)
        for canvas in (*PANELS, "registers", "scatter"):
            assert b.evaluate(f"document.getElementById('{canvas}').dataset.drawn") == "1", canvas
        # a slider and a patch click change what is drawn
        before = _pixels(b, "attention")
        _slide(b, "layer", 0)
        assert _pixels(b, "attention") != before
        before = _pixels(b, "attention")
        _slide(b, "head", 1)
        assert _pixels(b, "attention") != before
        b.evaluate("document.getElementById('similarity').scrollIntoView()")
        before = _pixels(b, "similarity")
        b.click(*_centre_of(b, "similarity", 0.1, 0.1))
        assert _pixels(b, "similarity") != before
        # the scatter: hovering a point shows its image and file; a box around all lists every file
        b.evaluate("document.getElementById('scatter').scrollIntoView()")
        x0, y0 = _centre_of(b, "scatter", 0.0, 0.0)
        px, py = b.evaluate("window.vitkitView.point(0)")
        b.mouse("mouseMoved", x0 + px, y0 + py)
        assert b.evaluate("document.getElementById('tooltip').style.display") == "block"
        assert b.evaluate("document.getElementById('tip-text').textContent").startswith(str(folder))
        x0, y0 = _centre_of(b, "scatter", 0.0, 0.0)
        x1, y1 = _centre_of(b, "scatter", 1.0, 1.0)
        b.mouse("mousePressed", x0 + 1, y0 + 1)
        b.mouse("mouseMoved", x1 - 1, y1 - 1)
        b.mouse("mouseReleased", x1 - 1, y1 - 1)
        assert b.evaluate("document.getElementById('selection-count').textContent") == "(12)"
        assert b.errors() == [] and b.evaluate("window.vitkitErrors") == []
        assert all(u.startswith(("file:", "data:")) for u in b.requests())


@pytest.mark.slow
def test_a_fashion_mnist_page_in_chromium_and_its_screenshot(tmp_path, monkeypatch):
    """The docs' screenshot: a demo-sized model (random weights) on Fashion-MNIST test images."""
    if not FASHION.is_dir():
        pytest.skip(f"no Fashion-MNIST at {FASHION}")
    from vitkit.data.idx import load_idx_dataset

    test = load_idx_dataset("fashion-mnist", "test", allow_download=False)
    monkeypatch.chdir(tmp_path)  # the page names the files as the command line did
    for i in range(300):
        path = Path("images") / test.classes[int(test.labels[i])].replace("/", "-") / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(test.images[i, 0].numpy()).save(path)
    torch.manual_seed(0)
    demo = dict(img_size=28, patch_size=4, width=128, depth=6, num_heads=4, mlp_dim=256, in_chans=1)
    model = vitkit.create_model("vit_s16", **demo, classifier="gap", pos_embed="sincos2d", num_classes=10)
    ckpt = vitkit.save_checkpoint(model, tmp_path / "demo.safetensors", extra={"classes": json.dumps(test.classes)})
    out = tmp_path / "view.html"
    assert main(["view", str(ckpt), "images", "--out", str(out), "--max-images", "6"]) == 0
    with _browser() as b:
        seconds = b.open(out, READY)
        assert seconds < 5
        _slide(b, "layer", 2)
        b.click(*_centre_of(b, "similarity", 0.55, 0.6))
        assert b.errors() == [] and b.evaluate("window.vitkitErrors") == []
        if os.environ.get("VITKIT_WRITE_SCREENSHOT", "1") == "1":
            b.screenshot(SCREENSHOT)
    assert SCREENSHOT.stat().st_size > 10_000


def test_an_unreadable_file_in_a_folder_is_left_out(tmp_path, capsys):
    ckpt = vitkit.save_checkpoint(_tiny(), tmp_path / "t.safetensors")
    folder = _folder(tmp_path / "images", per_class=2, size=20)
    (folder / "cat" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "v.html"
    assert main(["view", str(ckpt), str(folder), "--out", str(out), "--max-images", "10", "--workers", "0"]) == 0
    data = embedded_data(out.read_text())
    assert data["scatter"]["count"] == 6 and len(data["images"]) == 6
    assert not any("broken" in p for p in data["scatter"]["paths"] + [im["path"] for im in data["images"]])
    assert "skipped 1 unreadable file(s): " in capsys.readouterr().err


def _two_groups() -> torch.Tensor:
    x = torch.randn(20, 8, generator=torch.Generator().manual_seed(0))
    x[:10, 0] += 10  # two groups along the first axis
    return x


def test_pca_projection_separates_groups_and_a_missing_umap_is_one_line(monkeypatch):
    import sys

    from vitkit.analysis.view import project
    from vitkit.errors import UsageError

    xy = project(_two_groups(), "pca")
    first, second = xy[:10, 0], xy[10:, 0]
    assert xy.shape == (20, 2) and (first.min() > second.max() or first.max() < second.min())
    monkeypatch.setitem(sys.modules, "umap", None)
    with pytest.raises(UsageError, match="pip install umap-learn"):
        project(_two_groups(), "umap")


@pytest.mark.slow
def test_tsne_projection():
    pytest.importorskip("sklearn")
    from vitkit.analysis.view import project

    assert project(_two_groups(), "tsne").shape == (20, 2)
