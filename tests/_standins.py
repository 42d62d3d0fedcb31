"""Small stand-ins for what the documentation's examples take as given: the data sets, run folders,
checkpoints and images a reader would have, each at the path the text uses and small enough for
the examples to run in seconds on a CPU. ``StandIns(...).setups()`` maps each name a page's
``<!-- example: setup=NAME -->`` note may use to the function that prepares it in the page's
folder (see ``_examples.py``)."""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from _examples import Setup
from _hub import HubStandIn, random_fill

CLASSES = 10  # Fashion-MNIST's
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket"]  # the tutorial's


def write_idx(path: Path, array: np.ndarray) -> None:
    """``array`` (uint8) as a gzipped IDX file, the format of (Fashion-)MNIST."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + array.astype(np.uint8).tobytes())


def tiny_fashion_mnist(root: Path, train_per_class: int = 30, test_per_class: int = 5) -> None:
    """Fashion-MNIST's four files under ``root`` with 28x28 images a model can tell apart: each
    class a bright bar of its own place on noise."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    bars = np.zeros((CLASSES, 28, 28), np.uint8)
    for c in range(CLASSES):
        row, col = 2 + 13 * (c // 5), 1 + 5 * (c % 5)
        bars[c, row : row + 12, col : col + 5] = 150
    for prefix, per_class in (("train", train_per_class), ("t10k", test_per_class)):
        labels = rng.permutation(np.repeat(np.arange(CLASSES, dtype=np.uint8), per_class))
        images = rng.integers(0, 80, (len(labels), 28, 28), dtype=np.uint8) + bars[labels]
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)


def photo(name: str) -> Image.Image:
    """One of scikit-image's photographs as an RGB image."""
    import skimage.data

    x = np.asarray(getattr(skimage.data, name)())
    return Image.fromarray(np.stack([x] * 3, -1) if x.ndim == 2 else x[..., :3])


def image_folder(root: Path, per_class: int, size: int = 32, seed: int = 0) -> None:
    """``root/<photo>/NNN.jpg``: random crops of scikit-image's photographs, one class a photo."""
    rng = np.random.default_rng(seed)
    for name in PHOTOS[:3]:
        img = photo(name)
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            side = min(img.size) // 3
            x, y = (int(rng.integers(0, s - side)) for s in img.size)
            img.crop((x, y, x + side, y + side)).resize((size, size)).save(root / name / f"{i:03d}.jpg")


def mosaics(root: Path, rows: int, seed: int) -> list[tuple[str, list[str]]]:
    """``rows`` 2x2 mosaics of 16 px tiles of the tutorial's photographs under ``root/images``,
    each labelled with the photographs it shows: the first half of one photograph each, the
    others of two or three."""
    rng = np.random.default_rng(seed)
    tiles = {name: photo(name).resize((16, 16)) for name in PHOTOS}
    (root / "images").mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(rows):
        names = [PHOTOS[i % 4]] * 4
        if i >= rows // 2:
            names[1], names[3] = PHOTOS[(i + 1) % 4], PHOTOS[int(rng.integers(4))]
        canvas = Image.new("RGB", (32, 32))
        for k, name in enumerate(names):
            canvas.paste(tiles[name], (16 * (k % 2), 16 * (k // 2)))
        rel = f"images/{'test' if seed else ''}{i:03d}.png"
        canvas.save(root / rel)
        out.append((rel, sorted(set(names))))
    return out


def labels_csv(path: Path, rows: list[tuple[str, list[str]]]) -> None:
    path.write_text("path,labels\n" + "".join(f"{rel},{' '.join(labels)}\n" for rel, labels in rows))


class StandIns:
    """The stand-ins, built once a test session under ``shared`` where they are costly, then
    copied into each page's folder; ``env`` is the examples' environment (``VITKIT_DATA``...)."""

    def __init__(self, shared: Path, env: dict[str, str], hub: HubStandIn | None = None) -> None:
        self.shared, self.env, self.hub_server = shared, env, hub
        self.shared_env = {**env, "VITKIT_DATA": str(shared / "data")}  # what the shared builds read

    def setups(self) -> dict[str, Setup]:
        return {
            "fashion-mnist": self.fashion_mnist,
            "fashion-mnist-full": self.fashion_mnist_full,
            "demo-run": self.demo_run,
            "demo-model": self.demo_model,
            "my-images": self.my_images,
            "photo": self.photo,
            "pretrain": self.pretrain,
            "mosaics": self.mosaics,
            "weight-files": self.weight_files,
            "images": self.images,
            "images-518": self.images_518,
            "hub": self.hub,
            "backbone-files": self.backbone_files,
            "imagenet-val": self.imagenet_val,
        }

    def vitkit(self, *args: str) -> None:
        """Run ``vitkit ARGS`` as the examples do, on the shared data; a failure shows its output."""
        result = subprocess.run(
            [sys.executable, "-m", "vitkit", *args], env=self.shared_env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, f"vitkit {' '.join(args)}:\n{(result.stdout + result.stderr)[-3000:]}"

    def fashion_mnist(self, folder: Path) -> str:
        """A Fashion-MNIST of 300 training and 50 test images where vitkit looks first
        (``$VITKIT_DATA/fashion-mnist``)."""
        root = Path(self.env["VITKIT_DATA"]) / "fashion-mnist"
        if not root.is_dir():
            tiny_fashion_mnist(root)
        return ""

    def fashion_mnist_full(self, folder: Path) -> str:
        """A Fashion-MNIST of the real one's size (60,000 training and 10,000 test images) in its
        place, for what plans by the data's size."""
        tiny_fashion_mnist(Path(self.env["VITKIT_DATA"]) / "fashion-mnist", 6000, 1000)
        return ""

    def demo_run(self, folder: Path) -> str:
        """``runs/demo``: the demo's recipe, two blocks deep, trained for 8 steps on the tiny
        Fashion-MNIST (which it brings along)."""
        self.fashion_mnist(folder)
        built = self.shared / "demo"
        if not built.is_dir():  # trained beside, then renamed: a run that failed is not taken for one
            tiny_fashion_mnist(self.shared / "data" / "fashion-mnist")
            shutil.rmtree(partial := self.shared / "demo.partial", ignore_errors=True)
            sets = ["--set", "model.overrides.depth=2", "--set", "log.plot=false"]
            self.vitkit(
                "train", "--config", "fmnist_vit", "--out", str(partial), "--steps", "8", "--batch-size", "32", *sets
            )
            partial.rename(built)
        if not (folder / "runs" / "demo").exists():  # another stand-in of the page brought it
            shutil.copytree(built, folder / "runs" / "demo", ignore=shutil.ignore_patterns(".lock"))
        return ""

    def demo_model(self, folder: Path) -> str:
        """``runs/demo`` and the names a notebook working on it has: ``model``, ``train_set`` and
        a batch of its ``images``."""
        self.demo_run(folder)
        return (
            "import torch\n\nimport vitkit\nfrom vitkit.data import build_dataset\n\n"
            'model = vitkit.load_pretrained("runs/demo")\ntrain_set = build_dataset("fashion-mnist", "train")\n'
            "images = torch.rand(8, model.cfg.in_chans, *model.cfg.img_size)\n\n"
        )

    def my_images(self, folder: Path) -> str:
        """``my_images/train/<class>/*.jpg`` (8 a class) and ``my_images/val/`` (3 a class)."""
        image_folder(folder / "my_images" / "train", 8)
        image_folder(folder / "my_images" / "val", 3, seed=1)
        return ""

    def photo(self, folder: Path) -> str:
        """``cat.jpg`` and ``image.png``: scikit-image's cat."""
        img = photo("chelsea")
        img.save(folder / "cat.jpg")
        img.resize((64, 42)).save(folder / "image.png")
        return ""

    def pretrain(self, folder: Path) -> str:
        """``runs/pretrain/best.safetensors``: a ViT smaller still than the tutorial's (width 32, one
        block; 32 px, patch 4, 10 classes), untrained."""
        import vitkit

        model = vitkit.create_model(
            "vit_ti16", img_size=32, patch_size=4, width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=10
        )
        (folder / "runs" / "pretrain").mkdir(parents=True, exist_ok=True)
        vitkit.save_checkpoint(model, folder / "runs" / "pretrain" / "best.safetensors")
        return ""

    def mosaics(self, folder: Path) -> str:
        """``mosaics/train.csv`` (24 rows) and ``mosaics/test.csv`` (8), as the multi-label tutorial's."""
        labels_csv(folder / "mosaics" / "train.csv", mosaics(folder / "mosaics", 24, seed=0))
        labels_csv(folder / "mosaics" / "test.csv", mosaics(folder / "mosaics", 8, seed=1))
        return ""

    def weight_files(self, folder: Path) -> str:
        """The files the weights guide loads, of a tiny ViT (width 48, 12 heads, 32 px, patch 16):
        ``ViT-B_16.npz`` (official), ``hf_folder/`` (Hugging Face), ``timm_vit.safetensors`` (timm);
        and ``runs/demo``."""
        import vitkit
        from vitkit.export import export_weights

        self.demo_run(folder)
        model = vitkit.create_model("vit_b16", img_size=32, width=48, depth=1, num_heads=12, mlp_dim=96)
        export_weights(model, folder / "ViT-B_16.npz", "official")
        export_weights(model, folder / "hf_folder", "hf")
        export_weights(model, folder / "timm_vit.safetensors", "timm")
        return "import vitkit\n\n"

    def images(self, folder: Path) -> str:
        """``images``: a batch of two 224 px images in [-1, 1]."""
        return "import torch\n\nimages = torch.rand(2, 3, 224, 224) * 2 - 1\n\n"

    def images_518(self, folder: Path) -> str:
        """``images``: one 518 px image in [-1, 1], the size of DINOv2's position table."""
        return "import torch\n\nimages = torch.rand(1, 3, 518, 518) * 2 - 1\n\n"

    def hub(self, folder: Path) -> str:
        """Downloads by name, and ``vitkit`` imported: the examples from here on are online, their
        Google Cloud Storage and Hugging Face hub downloads answered by the local stand-in of both
        (``_hub.py``: real-shaped random weights, made once a session), every other address
        refused. An address the stand-in cannot answer for (``https://example.org/...``) has its
        file in the cache already, as a download before these examples left it: a small ViT."""
        import vitkit

        assert self.hub_server is not None, "the hub stand-in needs the test's HubStandIn"
        for name in ("VITKIT_OFFLINE", "HF_HUB_OFFLINE"):
            self.env.pop(name, None)
        self.env.update(self.hub_server.env())
        for url in PREFILLED:
            host, path = url.split("://", 1)[1].split("/", 1)
            cached = Path(self.env["VITKIT_CACHE"]) / host / path  # the cache's layout: CACHE/HOST/PATH
            cached.parent.mkdir(parents=True, exist_ok=True)
            small = vitkit.create_model("vit_ti16", img_size=32, width=32, depth=1, num_heads=2, mlp_dim=64)
            vitkit.save_checkpoint(small, cached)
        return "import vitkit\n\n"

    def backbone_files(self, folder: Path) -> str:
        """The files the guide's backbones load by path, small: ``clip_folder/`` (a CLIPVisionModel
        as transformers saves it, with OpenAI's processor; width 32, one block, 224 px, patch 32)
        and ``vit_base_patch16_siglip_224.safetensors`` (a SigLIP tower's timm state dict, without
        a config: width 64, one block, 224 px, patch 16)."""
        import json

        import torch
        import transformers as t
        from safetensors.torch import save_file

        import vitkit
        from vitkit.checkpoint import to_timm

        torch.manual_seed(0)
        small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
        clip = t.CLIPVisionModel(t.CLIPVisionConfig(**small, image_size=224, patch_size=32))
        clip.save_pretrained(folder / "clip_folder")
        openai = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
        processor = {"image_processor_type": "CLIPImageProcessor", **openai, "resample": 3, "do_center_crop": True}
        processor |= {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}
        (folder / "clip_folder" / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
        siglip = vitkit.create_model("vit_b16_siglip", width=64, depth=1, num_heads=1, mlp_dim=128)
        random_fill(siglip)
        sd = {k: v.contiguous() for k, v in to_timm(siglip.state_dict()).items()}
        save_file(sd, folder / "vit_base_patch16_siglip_224.safetensors")
        return ""

    def imagenet_val(self, folder: Path) -> str:
        """``imagenet_val/<synset>/ILSVRC2012_val_*.JPEG``: ImageNet's validation set as class folders,
        its 1000 classes (folders named like synsets) of one small photograph each, and of two in
        the first three, so that the split vitkit holds out of a folder has three images."""
        root = folder / "imagenet_val"
        small = [photo(name).resize((24, 24)) for name in PHOTOS[:3]]
        for c in range(1000):
            img = small[c % 3]
            (root / f"n{c:08d}").mkdir(parents=True)
            for i in range(2 if c < 3 else 1):
                img.save(root / f"n{c:08d}" / f"ILSVRC2012_val_{2 * c + i:08d}.JPEG")
        return ""


# Addresses the stand-in cannot serve (they are not on 127.0.0.1): their files are in the cache.
PREFILLED = ["https://example.org/weights.safetensors"]
