"""``crop_mode``: at crop fraction 1, "center" keeps a photo's aspect ratio (the shorter side to
the model's size, then the centre), as CLIP's and timm's eval transforms do; "squash" resizes
the whole image, as the official code does."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitkit.checkpoint.peers import hf_preprocessing, timm_preprocessing
from vitkit.errors import CheckpointError
from vitkit.preprocessing import Preprocessing, load_images


def _wide(tmp_path):
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :10] = 255  # a white band on the left quarter: a centre crop drops it, a squash keeps it
    path = tmp_path / "wide.png"
    Image.fromarray(a).save(path)
    return path


def test_center_keeps_the_aspect_ratio_and_squash_does_not(tmp_path):
    path = _wide(tmp_path)
    squash = load_images([path], Preprocessing(img_size=(20, 20)), 3)
    center = load_images([path], Preprocessing(img_size=(20, 20), crop_mode="center"), 3)
    assert squash.pixels[0][:, :4].mean() > 200  # the band, squashed to the left fifth
    assert center.pixels[0].max() == 0  # the centre 20 x 20 of the 20 x 40 image holds no band


def test_crop_mode_round_trips_and_is_checked():
    pre = Preprocessing(img_size=(224, 224), crop_mode="center")
    assert pre.to_dict()["crop_mode"] == "center" and Preprocessing.from_dict(pre.to_dict()) == pre
    assert "crop_mode" not in Preprocessing().to_dict()  # files without the key read as before
    with pytest.raises(CheckpointError, match="crop_mode"):
        hf_like = {"mean": [0.5] * 3, "std": [0.5] * 3, "img_size": [224, 224], "crop_mode": "zoom"}
        from vitkit.checkpoint import values

        values.check_preprocessing(hf_like, 3, "x.json")


def test_peers_preprocessing_says_how_they_crop():
    clip = {"image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28], "size": {"shortest_edge": 224},
            "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "resample": 3}  # fmt: skip
    assert hf_preprocessing(clip, "preprocessor_config.json").crop_mode == "center"
    siglip = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "size": {"height": 224, "width": 224}}
    assert hf_preprocessing(siglip, "preprocessor_config.json").crop_mode == "squash"
    timm = {"mean": [0.5] * 3, "std": [0.5] * 3, "input_size": [3, 224, 224], "crop_pct": 1.0}
    assert timm_preprocessing(timm, "config.json").crop_mode == "center"
    assert timm_preprocessing({**timm, "crop_mode": "squash"}, "config.json").crop_mode == "squash"
