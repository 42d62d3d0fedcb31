"""The official JAX ViT (google-research/vision_transformer ``models_vit.py`` / ``models_resnet.py``,
big_vision ``models/vit.py`` for the MAP head) as test material, independent of vitkit's converter:

- :func:`official_arrays`: the array names and shapes the official code gives a config (in either
  block numbering), filled with random values, as a released ``.npz`` holds them;
- :func:`reference_forward`: the official forward pass written out functionally in float64 on
  those arrays (NHWC, HWIO kernels, q/k/v kernels (D, heads, D/heads)), for parity checks.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

BLOCK_NAMES = {  # role -> (pre-Linen numbering of the released files, Linen / big_vision numbering)
    "ln1": ("LayerNorm_0", "LayerNorm_0"),
    "attn": ("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0"),
    "ln2": ("LayerNorm_2", "LayerNorm_1"),
    "mlp": ("MlpBlock_3", "MlpBlock_0"),
}


def official_shapes(
    *,
    width: int,
    depth: int,
    heads: int,
    mlp: int,
    patch: int,
    grid: int,
    num_classes: int = 0,
    classifier: str = "token",
    representation: int | None = None,
    resnet: tuple[int, ...] | None = None,
    resnet_width: int = 64,
    layout: str = "prelinen",
    in_chans: int = 3,
) -> dict[str, tuple[int, ...]]:
    """name -> shape of every parameter of the official model with this config."""
    idx = 0 if layout == "prelinen" else 1
    D, hd = width, width // heads
    s: dict[str, tuple[int, ...]] = {}
    cin = in_chans
    if resnet is not None:  # models_vit.VisionTransformer: root, then ResNetStage "block{i+1}"
        s["conv_root/kernel"] = (7, 7, cin, resnet_width)
        s["gn_root/scale"] = s["gn_root/bias"] = (resnet_width,)
        cin = resnet_width
        for i, units in enumerate(resnet):
            nout = resnet_width * 2**i
            for u in range(units):
                p = f"block{i + 1}/unit{u + 1}"
                stride = 2 if (i > 0 and u == 0) else 1
                if cin != 4 * nout or stride != 1:  # ResidualUnit.needs_projection
                    s[f"{p}/conv_proj/kernel"] = (1, 1, cin, 4 * nout)
                    s[f"{p}/gn_proj/scale"] = s[f"{p}/gn_proj/bias"] = (4 * nout,)
                s[f"{p}/conv1/kernel"] = (1, 1, cin, nout)
                s[f"{p}/conv2/kernel"] = (3, 3, nout, nout)
                s[f"{p}/conv3/kernel"] = (1, 1, nout, 4 * nout)
                for g, c in (("gn1", nout), ("gn2", nout), ("gn3", 4 * nout)):
                    s[f"{p}/{g}/scale"] = s[f"{p}/{g}/bias"] = (c,)
                cin = 4 * nout
    s["embedding/kernel"] = (patch, patch, cin, D)
    s["embedding/bias"] = (D,)
    prefix = 1 if classifier == "token" else 0
    if prefix:
        s["cls"] = (1, 1, D)
    s["Transformer/posembed_input/pos_embedding"] = (1, prefix + grid * grid, D)
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}"
        n = {role: f"{b}/{pair[idx]}" for role, pair in BLOCK_NAMES.items()}
        for ln in ("ln1", "ln2"):
            s[f"{n[ln]}/scale"] = s[f"{n[ln]}/bias"] = (D,)
        s.update(_mha_shapes(n["attn"], D, heads, hd))
        s.update(_mlp_shapes(n["mlp"], D, mlp))
    s["Transformer/encoder_norm/scale"] = s["Transformer/encoder_norm/bias"] = (D,)
    if classifier == "map":  # big_vision MAPHead
        s["MAPHead_0/probe"] = (1, 1, D)
        s.update(_mha_shapes("MAPHead_0/MultiHeadDotProductAttention_0", D, heads, hd))
        s["MAPHead_0/LayerNorm_0/scale"] = s["MAPHead_0/LayerNorm_0/bias"] = (D,)
        s.update(_mlp_shapes("MAPHead_0/MlpBlock_0", D, mlp))
    feat = D
    if representation:
        s["pre_logits/kernel"], s["pre_logits/bias"] = (D, representation), (representation,)
        feat = representation
    if num_classes:
        s["head/kernel"], s["head/bias"] = (feat, num_classes), (num_classes,)
    return s


def _mha_shapes(p: str, D: int, heads: int, hd: int) -> dict[str, tuple[int, ...]]:
    s = {}
    for part in ("query", "key", "value"):
        s[f"{p}/{part}/kernel"], s[f"{p}/{part}/bias"] = (D, heads, hd), (heads, hd)
    s[f"{p}/out/kernel"], s[f"{p}/out/bias"] = (heads, hd, D), (D,)
    return s


def _mlp_shapes(p: str, D: int, mlp: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{p}/Dense_0/kernel": (D, mlp),
        f"{p}/Dense_0/bias": (mlp,),
        f"{p}/Dense_1/kernel": (mlp, D),
        f"{p}/Dense_1/bias": (D,),
    }


def official_arrays(seed: int = 0, **config) -> dict[str, np.ndarray]:
    """Random float32 arrays of :func:`official_shapes`: scales near 1, the rest N(0, 0.1^2)
    (kernels scaled by their fan-in), so that every parameter moves the outputs."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in official_shapes(**config).items():
        if name.endswith("/scale"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("/kernel") and len(shape) >= 2:
            fan_in = math.prod(shape[:-1]) if "out/kernel" not in name else shape[0] * shape[1]
            if "/query/" in name or "/key/" in name or "/value/" in name:
                fan_in = shape[0]
            a = rng.standard_normal(shape) / math.sqrt(fan_in)
        else:
            a = 0.1 * rng.standard_normal(shape)
        out[name] = a.astype(np.float32)
    return out


# ------------------------------------------------------------------------------------------
# The official forward, functionally, float64, NHWC.


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


def _pad_same(x: torch.Tensor, k: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """TF "SAME" for NHWC: the total padding split with the extra pixel after."""
    pads = []
    for n in (x.shape[2], x.shape[1]):  # F.pad on NHWC: (C), W, H from the last dim backwards
        total = max((math.ceil(n / stride) - 1) * stride + k - n, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, (0, 0, *pads), value=value)


def std_conv(x: torch.Tensor, kernel: np.ndarray, stride: int) -> torch.Tensor:
    """models_resnet.StdConv: kernel standardised over (H, W, I) with (w - mean) / (std + 1e-5)."""
    w = _t(kernel)
    w = w - w.mean(dim=(0, 1, 2))
    w = w / (w.std(dim=(0, 1, 2), unbiased=False) + 1e-5)
    return conv(x, w, stride, same=True)


def conv(x: torch.Tensor, w: torch.Tensor, stride: int, same: bool, bias: np.ndarray | None = None) -> torch.Tensor:
    if same:
        x = _pad_same(x, w.shape[0], stride)
    y = F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), stride=stride).permute(0, 2, 3, 1)
    return y if bias is None else y + _t(bias)


def group_norm(x: torch.Tensor, scale: np.ndarray, bias: np.ndarray, groups: int = 32) -> torch.Tensor:
    n, h, w, c = x.shape
    g = x.reshape(n, h, w, groups, c // groups)
    mean = g.mean(dim=(1, 2, 4), keepdim=True)
    var = g.var(dim=(1, 2, 4), unbiased=False, keepdim=True)
    g = (g - mean) / torch.sqrt(var + 1e-6)
    return g.reshape(n, h, w, c) * _t(scale).reshape(-1) + _t(bias).reshape(-1)


def max_pool_same(x: torch.Tensor) -> torch.Tensor:
    x = _pad_same(x, 3, 2, value=-math.inf)
    return F.max_pool2d(x.permute(0, 3, 1, 2), 3, 2).permute(0, 2, 3, 1)


def layer_norm(x: torch.Tensor, a: dict, p: str) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-6) * _t(a[f"{p}/scale"]) + _t(a[f"{p}/bias"])


def mha(xq: torch.Tensor, xkv: torch.Tensor, a: dict, p: str) -> torch.Tensor:
    """flax MultiHeadDotProductAttention: per-head kernels (D, H, hd), softmax(q k / sqrt(hd)) v."""
    q = torch.einsum("bnd,dhk->bnhk", xq, _t(a[f"{p}/query/kernel"])) + _t(a[f"{p}/query/bias"])
    k = torch.einsum("bnd,dhk->bnhk", xkv, _t(a[f"{p}/key/kernel"])) + _t(a[f"{p}/key/bias"])
    v = torch.einsum("bnd,dhk->bnhk", xkv, _t(a[f"{p}/value/kernel"])) + _t(a[f"{p}/value/bias"])
    w = torch.softmax(torch.einsum("bqhk,bnhk->bhqn", q / math.sqrt(q.shape[-1]), k), dim=-1)
    y = torch.einsum("bhqn,bnhk->bqhk", w, v)
    return torch.einsum("bqhk,hkd->bqd", y, _t(a[f"{p}/out/kernel"])) + _t(a[f"{p}/out/bias"])


def mlp_block(x: torch.Tensor, a: dict, p: str) -> torch.Tensor:
    y = x @ _t(a[f"{p}/Dense_0/kernel"]) + _t(a[f"{p}/Dense_0/bias"])
    y = F.gelu(y, approximate="tanh")  # flax.linen.gelu
    return y @ _t(a[f"{p}/Dense_1/kernel"]) + _t(a[f"{p}/Dense_1/bias"])


def residual_unit(x: torch.Tensor, a: dict, p: str, stride: int) -> torch.Tensor:
    residual = x
    if f"{p}/conv_proj/kernel" in a:
        residual = std_conv(x, a[f"{p}/conv_proj/kernel"], stride)
        residual = group_norm(residual, a[f"{p}/gn_proj/scale"], a[f"{p}/gn_proj/bias"])
    y = F.relu(group_norm(std_conv(x, a[f"{p}/conv1/kernel"], 1), a[f"{p}/gn1/scale"], a[f"{p}/gn1/bias"]))
    y = F.relu(group_norm(std_conv(y, a[f"{p}/conv2/kernel"], stride), a[f"{p}/gn2/scale"], a[f"{p}/gn2/bias"]))
    y = group_norm(std_conv(y, a[f"{p}/conv3/kernel"], 1), a[f"{p}/gn3/scale"], a[f"{p}/gn3/bias"])
    return F.relu(residual + y)


def reference_stem(a: dict, x: torch.Tensor) -> torch.Tensor:
    """The (possibly partial) ResNet of models_vit.VisionTransformer, NHWC in and out."""
    x = std_conv(x, a["conv_root/kernel"], 2)
    x = F.relu(group_norm(x, a["gn_root/scale"], a["gn_root/bias"]))
    x = max_pool_same(x)
    stage = 1
    while f"block{stage}/unit1/conv1/kernel" in a:
        unit = 1
        while f"block{stage}/unit{unit}/conv1/kernel" in a:
            x = residual_unit(x, a, f"block{stage}/unit{unit}", 2 if (stage > 1 and unit == 1) else 1)
            unit += 1
        stage += 1
    return x


def reference_forward(a: dict, images_nhwc: np.ndarray, layout: str = "prelinen") -> dict[str, torch.Tensor]:
    """models_vit.VisionTransformer.__call__ (train=False), and big_vision's MAPHead when the
    arrays hold one: ``{"tokens": encoder output before the pool, "pre_logits", "logits"}``."""
    idx = 0 if layout == "prelinen" else 1
    x = _t(images_nhwc)
    if "conv_root/kernel" in a:
        x = reference_stem(a, x)
    patch = a["embedding/kernel"].shape[0]
    x = conv(x, _t(a["embedding/kernel"]), patch, same=False, bias=a["embedding/bias"])
    n, h, w, c = x.shape
    x = x.reshape(n, h * w, c)
    if "cls" in a:
        x = torch.cat([_t(a["cls"]).expand(n, 1, c), x], dim=1)
    x = x + _t(a["Transformer/posembed_input/pos_embedding"])
    i = 0
    while f"Transformer/encoderblock_{i}/LayerNorm_0/scale" in a:
        b = f"Transformer/encoderblock_{i}"
        names = {role: f"{b}/{pair[idx]}" for role, pair in BLOCK_NAMES.items()}
        y = layer_norm(x, a, names["ln1"])
        x = x + mha(y, y, a, names["attn"])
        x = x + mlp_block(layer_norm(x, a, names["ln2"]), a, names["mlp"])
        i += 1
    tokens = layer_norm(x, a, "Transformer/encoder_norm")
    if "MAPHead_0/probe" in a:
        pooled = reference_map_head(a, tokens)
    elif "cls" in a:
        pooled = tokens[:, 0]
    else:
        pooled = tokens.mean(dim=1)
    pre = pooled
    if "pre_logits/kernel" in a:
        pre = torch.tanh(pooled @ _t(a["pre_logits/kernel"]) + _t(a["pre_logits/bias"]))
    out = {"tokens": tokens, "pre_logits": pre}
    if "head/kernel" in a:
        out["logits"] = pre @ _t(a["head/kernel"]) + _t(a["head/bias"])
    return out


def reference_map_head(a: dict, tokens: torch.Tensor) -> torch.Tensor:
    """big_vision MAPHead: probe attends over the tokens, then x + MLP(LN(x)); token 0."""
    probe = _t(a["MAPHead_0/probe"]).expand(tokens.shape[0], 1, tokens.shape[-1])
    x = mha(probe, tokens, a, "MAPHead_0/MultiHeadDotProductAttention_0")
    x = x + mlp_block(layer_norm(x, a, "MAPHead_0/LayerNorm_0"), a, "MAPHead_0/MlpBlock_0")
    return x[:, 0]


def nchw(images_nhwc: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images_nhwc)).permute(0, 3, 1, 2).float()
