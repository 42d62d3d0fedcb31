"""The official JAX checkpoints (google-research/vision_transformer and big_vision) as ``.npz``.

Accepted layouts:
- the released files: flat ``/``-joined keys, pre-Linen module numbering inside a block
  (``LayerNorm_0``, ``MultiHeadDotProductAttention_1``, ``LayerNorm_2``, ``MlpBlock_3``);
- the Linen / big_vision numbering (``LayerNorm_0``, ``MultiHeadDotProductAttention_0``,
  ``LayerNorm_1``, ``MlpBlock_0``), and big_vision's scanned blocks (``Transformer/encoderblock/``
  with a leading layer axis) and top-level ``pos_embedding`` without a class-token row;
- hybrids (``conv_root``, ``gn_root``, ``block{s}/unit{u}/...``), the ResNet root alone too (no
  ``block*`` arrays: AugReg's R+Ti/16);
- big_vision's attention-pooling head (``MAPHead_0/...``, or inlined at the top level as during
  ViT-G's development) as ``classifier="map"``;
- the prefixes of whole training states: big_vision's ``params/`` (``params/img/`` for the image
  tower of LiT and SigLIP) and old flax optimisers' ``opt/target/``; the position embedding in
  the encoder (``Transformer/pos_embedding``, big_vision before 2022).

Layout conversion (flax -> torch): conv kernels HWIO -> OIHW, dense kernels (in, out) -> (out, in),
attention q/k/v kernels (D, heads, D/heads) -> (D, D) rows fused into one qkv weight.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..models.config import ViTConfig, hybrid_stem_stride
from ..models.posembed import square_side

_BLOCK_NAMES = {
    # module role -> (pre-Linen name, Linen name)
    "norm1": ("LayerNorm_0", "LayerNorm_0"),
    "attn": ("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0"),
    "norm2": ("LayerNorm_2", "LayerNorm_1"),
    "mlp": ("MlpBlock_3", "MlpBlock_0"),
}


def _block_layers(i: int, layout: int) -> list[tuple[str, str, str]]:
    """(kind, vitkit name, official name) of the layers of block ``i`` in the official ``layout``
    (0: pre-Linen, 1: Linen numbering), in the order both directions convert them."""
    blk = f"Transformer/encoderblock_{i}"
    names = {role: f"{blk}/{pair[layout]}" for role, pair in _BLOCK_NAMES.items()}
    dst = f"blocks.{i}"
    return [
        ("norm", f"{dst}.norm1", names["norm1"]),
        ("norm", f"{dst}.norm2", names["norm2"]),
        ("qkv", f"{dst}.attn.qkv", names["attn"]),
        ("out", f"{dst}.attn.proj", f"{names['attn']}/out"),
        ("dense", f"{dst}.mlp.fc1", f"{names['mlp']}/Dense_0"),
        ("dense", f"{dst}.mlp.fc2", f"{names['mlp']}/Dense_1"),
    ]


# (kind, vitkit name, official name, optional) of what follows the blocks: the encoder norm, then
# the pre-logits layer and the head where the source has them.
_TOP_LAYERS = (
    ("norm", "norm", "Transformer/encoder_norm", False),
    ("dense", "pre_logits", "pre_logits", True),
    ("dense", "head", "head", True),
)


# Prefixes under which a whole training state keeps the ViT's parameters (the rest, optimiser
# state or a text tower, is skipped unread): LiT/SigLIP image towers, big_vision, old flax optimisers.
_PREFIXES = ("params/img/", "params/", "opt/target/")

# MAP head arrays by their name inside ``MAPHead_0/`` (also found inlined at the top level).
_MAP_NAMES = (
    r"probe|LayerNorm_0/(scale|bias)|MultiHeadDotProductAttention_0/(query|key|value|out)/(kernel|bias)"
    r"|MlpBlock_0/Dense_[01]/(kernel|bias)"
)


def is_official(keys: set[str]) -> bool:
    return any(f"{p}embedding/kernel" in keys for p in ("", *_PREFIXES))


def _prefix(names: list[str] | set[str]) -> str:
    """The prefix of the ViT's parameters among ``names`` ("" for the released files)."""
    return next((p for p in _PREFIXES if f"{p}embedding/kernel" in names), "")


# Every array name the conversion below maps (after the prefix of a training state is dropped),
# the scanned blocks of big_vision included. Others are refused from the zip directory, before
# anything is decompressed (:func:`select_arrays`).
_ARRAY_NAMES = re.compile(
    r"embedding/(kernel|bias)|cls|pos_embedding|Transformer/(posembed_input/)?pos_embedding"
    r"|Transformer/encoder_norm/(scale|bias)|(pre_logits|head)/(kernel|bias)"
    r"|Transformer/encoderblock(_\d+)?/(LayerNorm_\d+/(scale|bias)"
    r"|MultiHeadDotProductAttention_\d+/(query|key|value|out)/(kernel|bias)|MlpBlock_\d+/Dense_[01]/(kernel|bias))"
    r"|conv_root/kernel|gn_root/(scale|bias)"
    r"|block\d+/unit\d+/(conv[123]/kernel|conv_proj/kernel|gn[123]/(scale|bias)|gn_proj/(scale|bias))"
    rf"|(MAPHead_0/)?({_MAP_NAMES})"
)


def select_arrays(names: list[str], path: str | Path = "<npz>") -> list[str]:
    """The names of an official ``.npz`` to read, from its directory alone: those under the
    prefix of the ViT's parameters (:data:`_PREFIXES`; optimiser state and other towers are
    skipped, unread), refusing files that are not a ViT and arrays vitkit would not map, before
    any of them is decompressed (:func:`vitkit.checkpoint.io.read_npz`)."""
    prefix = _prefix(names)
    keep = [n for n in names if n.startswith(prefix)]
    bare = {n: n[len(prefix) :] for n in keep}
    if "embedding/kernel" not in bare.values():
        raise CheckpointError(f"{path}: no 'embedding/kernel': not an official ViT checkpoint")
    unknown = sorted(b for b in bare.values() if not _ARRAY_NAMES.fullmatch(b))
    if unknown:
        raise CheckpointError(f"{path}: arrays vitkit does not know how to map: {unknown[:10]}")
    return keep


def _strip(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop the prefix of a training state (:data:`_PREFIXES`) and what is not under it; move a
    MAP head inlined at the top level (big_vision's ``fix_old_checkpoints``) under ``MAPHead_0/``."""
    prefix = _prefix(set(arrays))
    out = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    if "probe" in out:
        inlined = re.compile(_MAP_NAMES)
        out = {(f"MAPHead_0/{k}" if inlined.fullmatch(k) else k): v for k, v in out.items()}
    return out


def _unscan(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """big_vision ``scan=True`` stores all blocks stacked under ``Transformer/encoderblock/``."""
    prefix = "Transformer/encoderblock/"
    if not any(k.startswith(prefix) for k in arrays):
        return arrays
    out = {k: v for k, v in arrays.items() if not k.startswith(prefix)}
    for k, v in arrays.items():
        if k.startswith(prefix):
            for i in range(v.shape[0]):
                out[f"Transformer/encoderblock_{i}/{k[len(prefix) :]}"] = v[i]
    return out


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def infer_config(arrays: dict[str, np.ndarray], path: str | Path = "<npz>") -> ViTConfig:
    """Read the architecture off the arrays: width, patch, depth, heads, MLP size, classifier,
    representation layer, hybrid stages and width, image size (square unless posemb says else)."""
    a = arrays
    try:
        kernel = a["embedding/kernel"]  # (ph, pw, C, D)
    except KeyError:
        raise CheckpointError(f"{path}: no 'embedding/kernel': not an official ViT checkpoint") from None
    ph, pw, cin, width = kernel.shape
    depth = len({m.group(1) for k in a if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    if depth == 0:
        raise CheckpointError(f"{path}: no 'Transformer/encoderblock_*' arrays")
    blk = "Transformer/encoderblock_0/"
    attn = next((n for n in _BLOCK_NAMES["attn"] if f"{blk}{n}/query/kernel" in a), None)
    mlp = next((n for n in _BLOCK_NAMES["mlp"] if f"{blk}{n}/Dense_0/kernel" in a), None)
    if attn is None or mlp is None:
        raise CheckpointError(f"{path}: block 0 has no attention or MLP arrays under names known to vitkit")
    heads = a[f"{blk}{attn}/query/kernel"].shape[1]
    mlp_dim = a[f"{blk}{mlp}/Dense_0/kernel"].shape[1]

    resnet_units = None
    resnet_width = 64
    if "conv_root/kernel" in a:  # a hybrid; without block* arrays, the ResNet root alone (units ())
        resnet_width = a["conv_root/kernel"].shape[-1]
        units = []
        for s in range(1, 10):
            n = len({m.group(1) for k in a if (m := re.match(rf"block{s}/unit(\d+)/", k))})
            if n == 0:
                break
            units.append(n)
        resnet_units = tuple(units)
        cin = a["conv_root/kernel"].shape[2]

    classifier = "token" if "cls" in a else "gap"
    if "MAPHead_0/probe" in a:
        if "cls" in a:
            raise CheckpointError(f"{path}: both a class token and a MAP head; vitkit pools with one of them")
        classifier = "map"
        _check_map_head(a, heads, mlp_dim, path)
    prefix = 1 if classifier == "token" else 0
    pos_key = _posemb_key(a)
    pos_embed = "learned" if pos_key else "none"
    cls_pos_embed = True
    stride = hybrid_stem_stride(resnet_units)
    img = (224, 224)
    if pos_key:
        num_pos = a[pos_key].shape[1]
        if prefix and square_side(num_pos - prefix) is None and square_side(num_pos) is not None:
            cls_pos_embed = False  # big_vision: the class token is added after the position embedding
        side = square_side(num_pos - (prefix if cls_pos_embed else 0))
        if side is None:
            raise CheckpointError(
                f"{path}: {num_pos} position embeddings do not form a square grid (with {prefix} class token)"
            )
        img = (side * ph * stride, side * pw * stride)
    rep = a["pre_logits/kernel"].shape[1] if "pre_logits/kernel" in a else None
    num_classes = a["head/kernel"].shape[1] if "head/kernel" in a else 0
    return ViTConfig(
        img_size=img,
        patch_size=(ph, pw),
        in_chans=cin,
        num_classes=num_classes,
        width=width,
        depth=depth,
        num_heads=heads,
        mlp_dim=mlp_dim,
        classifier=classifier,
        representation_size=rep,
        pos_embed=pos_embed,
        cls_pos_embed=cls_pos_embed,
        act="gelu_tanh",
        ln_eps=1e-6,
        resnet_units=resnet_units,
        resnet_width=resnet_width,
    )


def _check_map_head(a: dict[str, np.ndarray], heads: int, mlp_dim: int, path: str | Path) -> None:
    """vitkit's MAP head has the encoder's heads and MLP size, as big_vision's; refuse others."""
    m = "MAPHead_0/"
    got_heads = a[f"{m}MultiHeadDotProductAttention_0/query/kernel"].shape[1]
    got_mlp = a[f"{m}MlpBlock_0/Dense_0/kernel"].shape[1]
    if (got_heads, got_mlp) != (heads, mlp_dim):
        raise CheckpointError(
            f"{path}: the MAP head has {got_heads} heads and MLP size {got_mlp}, the encoder {heads} and "
            f"{mlp_dim}; vitkit's MAP head uses the encoder's"
        )


def _posemb_key(a: dict[str, np.ndarray]) -> str | None:
    for k in ("Transformer/posembed_input/pos_embedding", "Transformer/pos_embedding", "pos_embedding"):
        if k in a:
            return k
    return None


def convert_official(arrays: dict[str, np.ndarray], path: str | Path = "<npz>") -> tuple[dict, ViTConfig]:
    """Official arrays -> (vitkit state dict, inferred config). Every array must be used.

    Args:
        arrays: the arrays of an official ``.npz`` by key, in any of the layouts above.
        path: the file's name, for the messages.

    Returns:
        The state dict in vitkit's names (torch tensors) and the config the arrays imply.

    Raises:
        CheckpointError: an array missing, one vitkit cannot map, or arrays that form no config.
    """
    a = _unscan(_strip(arrays))
    cfg = infer_config(a, path)
    used: set[str] = set()
    sd: dict[str, torch.Tensor] = {}
    D = cfg.width

    def take(key: str) -> np.ndarray:
        if key not in a:
            raise CheckpointError(f"{path}: missing array {key!r}")
        used.add(key)
        return a[key]

    def dense(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = _t(take(f"{src}/kernel").T)
        sd[f"{dst}.bias"] = _t(take(f"{src}/bias"))

    def norm(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = _t(take(f"{src}/scale").reshape(-1))
        sd[f"{dst}.bias"] = _t(take(f"{src}/bias").reshape(-1))

    def conv(dst: str, src: str, bias: bool = False) -> None:
        sd[f"{dst}.weight"] = _t(take(f"{src}/kernel").transpose(3, 2, 0, 1))  # HWIO -> OIHW
        if bias:
            sd[f"{dst}.bias"] = _t(take(f"{src}/bias"))

    def qkv(dst: str, src: str, parts: tuple[str, ...] = ("query", "key", "value")) -> None:
        qkv_w = [take(f"{src}/{p}/kernel").reshape(D, D).T for p in parts]  # (D, H, hd) -> (D, D)
        qkv_b = [take(f"{src}/{p}/bias").reshape(D) for p in parts]
        sd[f"{dst}.weight"] = _t(np.concatenate(qkv_w, axis=0))  # (len(parts) D, D)
        sd[f"{dst}.bias"] = _t(np.concatenate(qkv_b))

    def proj(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = _t(take(f"{src}/kernel").reshape(D, D).T)  # (H, hd, D) -> (D, D)
        sd[f"{dst}.bias"] = _t(take(f"{src}/bias"))

    convert = {"norm": norm, "dense": dense, "qkv": qkv, "out": proj}
    conv("patch_embed.proj", "embedding", bias=True)
    if cfg.resnet_units is not None:
        bb = "patch_embed.backbone"
        conv(f"{bb}.conv_root", "conv_root")
        norm(f"{bb}.gn_root", "gn_root")
        for s, n in enumerate(cfg.resnet_units):
            for u in range(n):
                src, dst = f"block{s + 1}/unit{u + 1}", f"{bb}.stages.{s}.{u}"
                for c in ("conv1", "conv2", "conv3"):
                    conv(f"{dst}.{c}", f"{src}/{c}")
                for g in ("gn1", "gn2", "gn3"):
                    norm(f"{dst}.{g}", f"{src}/{g}")
                if f"{src}/conv_proj/kernel" in a:
                    conv(f"{dst}.conv_proj", f"{src}/conv_proj")
                    norm(f"{dst}.gn_proj", f"{src}/gn_proj")
    if "cls" in a:
        sd["cls_token"] = _t(take("cls"))
    pos_key = _posemb_key(a)
    if pos_key:
        sd["pos_embed"] = _t(take(pos_key))

    for i in range(cfg.depth):
        layout = 0 if f"Transformer/encoderblock_{i}/{_BLOCK_NAMES['attn'][0]}/query/kernel" in a else 1
        for kind, dst, src in _block_layers(i, layout):
            convert[kind](dst, src)
    for kind, dst, src, optional in _TOP_LAYERS:
        if not optional or f"{src}/kernel" in a:
            convert[kind](dst, src)
    if cfg.classifier == "map":
        m = "MAPHead_0/MultiHeadDotProductAttention_0"
        sd["attn_pool.latent"] = _t(take("MAPHead_0/probe"))
        qkv("attn_pool.q", m, parts=("query",))
        qkv("attn_pool.kv", m, parts=("key", "value"))
        proj("attn_pool.proj", f"{m}/out")
        norm("attn_pool.norm", "MAPHead_0/LayerNorm_0")
        dense("attn_pool.mlp.fc1", "MAPHead_0/MlpBlock_0/Dense_0")
        dense("attn_pool.mlp.fc2", "MAPHead_0/MlpBlock_0/Dense_1")
    unused = sorted(set(a) - used)
    if unused:
        raise CheckpointError(f"{path}: arrays vitkit does not know how to map: {unused[:10]}")
    return sd, cfg


def check_official(cfg: ViTConfig) -> None:
    """Refuse, in one line, a model whose official ``.npz`` would read back as another model.

    The arrays give the widths, depth, heads (the q/k/v kernels are (D, heads, D/heads)), the
    classifier (a ``cls`` array, a ``MAPHead_0`` or neither), the representation layer, the hybrid stem and, from
    the learned position table, a square image size and whether the class token has a position.
    They do not give the activation (always tanh-approximated GELU), the LayerNorm epsilon
    (always 1e-6), a fixed or absent position table, or a grid that is not square.
    """

    def refuse(why: str) -> None:
        raise CheckpointError(f"the official .npz format {why}; export to vitkit instead")

    if not isinstance(cfg, ViTConfig):
        refuse(f"holds ViTs, not a {type(cfg).__name__}")
    if cfg.pos_embed not in ("learned", "none"):
        refuse(f"holds one learned 1-D position table, not pos_embed={cfg.pos_embed!r}")
    gh, gw = cfg.grid_size
    if cfg.pos_embed == "learned" and gh != gw:
        refuse(
            f"reads the image size back from a square grid of position embeddings; this model's grid is "
            f"{gh}x{gw} (img_size {cfg.img_size[0]}x{cfg.img_size[1]})"
        )
    if cfg.pos_embed == "none" and tuple(cfg.img_size) != (224, 224):
        refuse(
            "does not record the image size of a model without position embeddings (it reads back as "
            f"224x224, this model's is {cfg.img_size[0]}x{cfg.img_size[1]})"
        )
    if cfg.distill_token:
        refuse("has no distillation token (DeiT's, distill_token=True)")
    if cfg.has_class_token and cfg.classifier != "token":
        refuse(f"reads a class token as the classifier's; this model pools with classifier={cfg.classifier!r}")
    if cfg.act != "gelu_tanh":
        refuse(f"does not record the activation (it reads back as act='gelu_tanh'), this model's is act={cfg.act!r}")
    if cfg.ln_eps != 1e-6:
        refuse(f"does not record the LayerNorm epsilon (it reads back as 1e-06), this model's is {cfg.ln_eps:g}")


def to_official(sd: dict[str, torch.Tensor], cfg: ViTConfig, layout: str = "prelinen") -> dict[str, np.ndarray]:
    """vitkit state dict -> official flat arrays (``layout`` "prelinen" or "linen"); the inverse
    of :func:`convert_official` for plain ViTs and hybrids. The file holds no config: what
    :func:`infer_config` would not read back from the arrays is refused (:func:`check_official`).

    Args:
        sd: the model's state dict.
        cfg: the model's config.
        layout: "prelinen" (the released files' numbering inside a block) or "linen" (Linen
            and big_vision's).

    Returns:
        The arrays by official key, float32, ready for ``np.savez``.

    Raises:
        CheckpointError: an unknown ``layout``, or a model the format would read back as another.
    """
    check_official(cfg)
    if layout not in ("prelinen", "linen"):
        raise CheckpointError(f"official layout must be 'prelinen' or 'linen', got {layout!r}")
    idx = 0 if layout == "prelinen" else 1
    D, H = cfg.width, cfg.num_heads
    out: dict[str, np.ndarray] = {}

    def n(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().float().numpy()

    def dense(dst: str, src: str) -> None:
        out[f"{dst}/kernel"] = n(sd[f"{src}.weight"]).T
        out[f"{dst}/bias"] = n(sd[f"{src}.bias"])

    def norm(dst: str, src: str) -> None:
        out[f"{dst}/scale"] = n(sd[f"{src}.weight"])
        out[f"{dst}/bias"] = n(sd[f"{src}.bias"])

    def conv(dst: str, src: str) -> None:
        out[f"{dst}/kernel"] = n(sd[f"{src}.weight"]).transpose(2, 3, 1, 0)  # OIHW -> HWIO

    def qkv(dst: str, src: str, parts: tuple[str, ...] = ("query", "key", "value")) -> None:
        w, b = n(sd[f"{src}.weight"]), n(sd[f"{src}.bias"])  # (len(parts) D, D), (len(parts) D,)
        for j, p in enumerate(parts):
            out[f"{dst}/{p}/kernel"] = w[j * D : (j + 1) * D].T.reshape(D, H, D // H)
            out[f"{dst}/{p}/bias"] = b[j * D : (j + 1) * D].reshape(H, D // H)

    def proj(dst: str, src: str) -> None:
        out[f"{dst}/kernel"] = n(sd[f"{src}.weight"]).T.reshape(H, D // H, D)
        out[f"{dst}/bias"] = n(sd[f"{src}.bias"])

    convert = {"norm": norm, "dense": dense, "qkv": qkv, "out": proj}
    conv("embedding", "patch_embed.proj")
    out["embedding/bias"] = n(sd["patch_embed.proj.bias"])
    if cfg.resnet_units is not None:
        bb = "patch_embed.backbone"
        conv("conv_root", f"{bb}.conv_root")
        norm("gn_root", f"{bb}.gn_root")
        for s, units in enumerate(cfg.resnet_units):
            for u in range(units):
                src, dst = f"{bb}.stages.{s}.{u}", f"block{s + 1}/unit{u + 1}"
                for name in ("conv1", "conv2", "conv3", "conv_proj"):
                    if f"{src}.{name}.weight" in sd:
                        conv(f"{dst}/{name}", f"{src}.{name}")
                for name in ("gn1", "gn2", "gn3", "gn_proj"):
                    if f"{src}.{name}.weight" in sd:
                        norm(f"{dst}/{name}", f"{src}.{name}")
    if "cls_token" in sd:
        out["cls"] = n(sd["cls_token"])
    if "pos_embed" in sd:
        out["Transformer/posembed_input/pos_embedding"] = n(sd["pos_embed"])
    for i in range(cfg.depth):
        for kind, src, dst in _block_layers(i, idx):
            convert[kind](dst, src)
    for kind, src, dst, optional in _TOP_LAYERS:
        if not optional or f"{src}.weight" in sd:
            convert[kind](dst, src)
    if cfg.classifier == "map":  # big_vision's MAPHead names
        m = "MAPHead_0/MultiHeadDotProductAttention_0"
        out["MAPHead_0/probe"] = n(sd["attn_pool.latent"])
        qkv(m, "attn_pool.q", parts=("query",))
        qkv(m, "attn_pool.kv", parts=("key", "value"))
        proj(f"{m}/out", "attn_pool.proj")
        norm("MAPHead_0/LayerNorm_0", "attn_pool.norm")
        dense("MAPHead_0/MlpBlock_0/Dense_0", "attn_pool.mlp.fc1")
        dense("MAPHead_0/MlpBlock_0/Dense_1", "attn_pool.mlp.fc2")
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
