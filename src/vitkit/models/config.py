"""Model configuration: one frozen dataclass for every ViT, hybrid and BiT ResNet vitkit builds.

Sizes are data (paper Table 1 plus the Ti and S sizes of later work from the same group); names
such as ``"B/16"`` or ``"R50+ViT-B/16"`` are parsed into a :class:`ViTConfig`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

# token: the class token (section 3.1); gap: the mean of the patch tokens; map: a learned probe
# attending over the patch tokens (big_vision's MAPHead, timm's global_pool="map"; heads.MAPHead).
Pooling = Literal["token", "gap", "map"]
POOLINGS: tuple[str, ...] = ("token", "gap", "map")
# learned: one 1-D table (section 3.1); learned2d: a row and a column table, each D/2 wide, and
# relative: a learned bias per query-key offset inside attention (appendix D.4, Table 8);
# sincos2d: fixed 2-D sine-cosine (big_vision); rope_axial and rope_dinov3: 2-D rotary embeddings
# of the patches' queries and keys inside attention (RoPE, Su et al. 2021, on both image axes), at
# the patches' row and column indices (axial, Heo et al. 2024) or at their centres in [-1, 1]
# (DINOv3, Simeoni et al. 2025; posembed.rope_angles); none.
PosEmbed = Literal["learned", "learned2d", "sincos2d", "relative", "rope_axial", "rope_dinov3", "none"]
POS_EMBEDS: tuple[str, ...] = ("learned", "learned2d", "sincos2d", "relative", "rope_axial", "rope_dinov3", "none")
ROPE_POS_EMBEDS: tuple[str, ...] = ("rope_axial", "rope_dinov3")
# the kinds whose positions act in attention, not on the tokens: patch dropout would lose them
ATTENTION_POS_EMBEDS: tuple[str, ...] = ("relative", *ROPE_POS_EMBEDS)
# gelu_tanh: GELU's tanh approximation (the official JAX code, SigLIP); gelu: the exact GELU (timm,
# Hugging Face, DINOv2); quick_gelu: x * sigmoid(1.702 x) (OpenAI's CLIP).
Activation = Literal["gelu_tanh", "gelu", "quick_gelu"]
ACTIVATIONS: tuple[str, ...] = ("gelu_tanh", "gelu", "quick_gelu")
# mlp: Linear -> activation -> Linear (eq. 3); swiglu: the gated MLP of DINOv2's giant model,
# SiLU(x W_gate) * (x W_value) -> Linear, the two input projections packed in one layer.
MlpType = Literal["mlp", "swiglu"]
# How a learned position table is resampled for another token grid: "bilinear" with aligned corners and
# no antialiasing (the official code's and vitkit's own); "bilinear_aa" with antialiasing, corners not
# aligned (SigLIP 2); "bicubic_aa" likewise, bicubic (timm's NaFlexVit)
PosResize = Literal["bilinear", "bilinear_aa", "bicubic_aa"]
POS_RESIZES: tuple[str, ...] = ("bilinear", "bilinear_aa", "bicubic_aa")
MLP_TYPES: tuple[str, ...] = ("mlp", "swiglu")
MAX_REGISTERS = 1 << 10  # register tokens a model may have (DINOv2's have 4, the paper tries up to 16)

# name -> (width D, depth L, heads, MLP size); Table 1 of the paper, Ti and S from later work.
VIT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "M": (512, 12, 8, 2048),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}

# ResNet depth -> units per stage (bottleneck units). The hybrids drop stage 4 (R50: 3, 4, 9).
RESNET_UNITS: dict[int, tuple[int, ...]] = {
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


MAX_TOKENS = 1 << 16  # patches of the token grid vitkit builds a model for
MAX_RELATIVE_TOKENS = 1 << 12  # "relative" keeps a (tokens x tokens) index per block


def token_grid_problem(cfg: ViTConfig) -> str | None:
    """Why a config's token grid is too large to build, or None. A sin-cos table or no table
    leaves the image size free of any tensor a file holds, so without a bound a typo in a size
    (or a hostile file) asks for a table of tens of gigabytes."""
    gh, gw = cfg.grid_size
    limit = MAX_RELATIVE_TOKENS if cfg.pos_embed == "relative" else MAX_TOKENS
    if gh * gw <= limit:
        return None
    return (
        f"img_size {cfg.img_size[0]}x{cfg.img_size[1]} makes a {gh}x{gw} token grid, more than the "
        f"{limit} tokens vitkit builds (pos_embed={cfg.pos_embed!r})"
    )


def to_2tuple(value: int | tuple[int, int] | list[int], what: str = "size") -> tuple[int, int]:
    """``7 -> (7, 7)``; ``(h, w)`` unchanged; anything else is a clear ``ValueError``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"{what} must be an int or a pair of ints, got {value!r}")


def hybrid_stem_stride(resnet_units: tuple[int, ...] | None) -> int:
    """Downsampling of a hybrid's ResNet stem with these units per stage (1 without a stem).

    The root alone (7x7 convolution of stride 2, then a 3x3 max-pool of stride 2) divides by
    2 * 2 = 4. Stage 1 keeps the resolution; every later stage halves it at its first unit. So
    with S stages the stride is ``4 * 2**(S - 1)``: R50+ViT-B/16 (3, 4, 9) 16, R26+ViT-S/32 and
    R50+ViT-L/32 (four stages) 32. With no stage at all (``()``, the official config's empty
    ``resnet.num_layers``: AugReg's R+Ti/16) the root's 4 is the whole CNN stride, and the patch
    embedding covers the rest: 8x8 patches over the stride-4 map, 32 input pixels per token.
    """
    if resnet_units is None:
        return 1
    root = 2 * 2  # conv_root stride 2, max-pool stride 2
    later_stages = max(len(resnet_units) - 1, 0)  # stage 1 has stride 1
    return root * 2**later_stages


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a Vision Transformer (paper section 3.1) or a hybrid.

    ``resnet_units`` set makes a hybrid: the patches come from a BiT ResNet feature map of stride
    :attr:`stem_stride` and ``patch_size`` is taken over that map (usually 1; 8 for the stem-only
    ``resnet_units=()`` of R+ViT-Ti/16).

    Attributes:
        img_size: the input's (height, width) in pixels; an int means a square. A whole number of
            tokens: divisible by :attr:`total_stride`.
        patch_size: a patch's (height, width), in pixels (over the stem's feature map for a hybrid).
        in_chans: the input's channels (3 for RGB).
        num_classes: the classifier head's outputs; 0 (or None): no head, the model returns the
            pooled features.
        width: the hidden size D of every token.
        depth: the number of Transformer blocks L.
        num_heads: attention heads per block; divides ``width``.
        mlp_dim: the hidden size of each block's MLP.
        classifier: how the tokens are pooled for the head: "token" (the class token), "gap" (the
            mean of the patch tokens) or "map" (a learned attention probe).
        class_token: whether the sequence starts with a class token; None: exactly when
            ``classifier`` is "token". True with "gap" keeps a class token that the pooling leaves
            out (timm's ``class_token=True, global_pool='avg'``: its DINOv3 models).
        representation_size: a tanh pre-logits layer of this size before the head (the paper's
            pre-training head); None: none.
        pos_embed: the position embedding: "learned", "learned2d", "sincos2d", "relative",
            "rope_axial", "rope_dinov3" or "none".
        cls_pos_embed: whether the class (and distillation) token gets a position embedding row.
        drop_rate: dropout on the embedded tokens, the attention's output and in the MLPs.
        attn_drop_rate: dropout on the attention weights.
        drop_path_rate: the stochastic-depth rate of the last block; the rate rises linearly
            from 0 at the first block.
        act: the MLP's activation: "gelu_tanh", "gelu" or "quick_gelu".
        ln_eps: the epsilon of every LayerNorm.
        resnet_units: bottleneck units per stage of a hybrid's BiT ResNet stem; None: a plain ViT;
            ``()``: the stem's root alone.
        resnet_width: the width of a hybrid's ResNet stem (64 times its width factor), a multiple
            of 32.
        dynamic_img_size: resize the position embeddings at run time for inputs of other sizes.
        distill_token: DeiT's distillation token after the class token, with its own head.
        num_registers: register tokens after the class (and distillation) token, without position
            (0 to 1024).
        layer_scale_init: LayerScale on both residual branches starting at this value; None: none.
        pre_norm: a LayerNorm on the embedded tokens before the first block.
        fc_norm: the final LayerNorm after pooling instead of on every token.
        qk_norm: a LayerNorm over each head's queries and keys before their product.
        mlp_type: "mlp" (two linear layers) or "swiglu" (the gated MLP; ``mlp_dim`` is the gated
            width).
        patch_bias: whether the patch embedding has a bias.
        rope_theta: the RoPE base (above 1) of the rotary kinds of ``pos_embed``.
        pos_resize: how a learned position table follows another grid: "bilinear", "bilinear_aa"
            (SigLIP 2's, antialiased) or "bicubic_aa" (timm NaFlexVit's, antialiased).

    Raises:
        ValueError: a field out of its range or choices, a combination vitkit cannot build (such
            as ``distill_token`` with a classifier other than "token"), or an ``img_size`` that is
            not a whole number of tokens.
    """

    img_size: tuple[int, int] = (224, 224)
    patch_size: tuple[int, int] = (16, 16)
    in_chans: int = 3
    num_classes: int = 1000
    width: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    classifier: Pooling = "token"
    representation_size: int | None = None
    pos_embed: PosEmbed = "learned"
    cls_pos_embed: bool = True  # False: the class token gets no position embedding (big_vision); "relative" ignores it
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    act: Activation = "gelu_tanh"
    ln_eps: float = 1e-6
    resnet_units: tuple[int, ...] | None = None
    resnet_width: int = 64  # width of the ResNet stem (64 * width factor)
    dynamic_img_size: bool = False  # resize position embeddings at run time for other input sizes
    distill_token: bool = False  # DeiT: a second prefix token, after the class token, with its own head
    # Pieces of later ViTs, each off by default (the paper's model has none of them):
    num_registers: int = 0  # learned tokens after the class (and distillation) token, no position (DINOv2-reg)
    layer_scale_init: float | None = None  # a number: LayerScale on both residual branches, gammas start there
    pre_norm: bool = False  # a LayerNorm on z0, before the first block (CLIP's ln_pre; timm's norm_pre)
    fc_norm: bool = False  # the final LayerNorm after pooling instead of on every token (timm's fc_norm)
    qk_norm: bool = False  # a LayerNorm over each head's queries and keys before their product
    mlp_type: MlpType = "mlp"  # swiglu: mlp_dim is the gated width, the packed input layer twice that
    patch_bias: bool = True  # False: the patch embedding has no bias (CLIP)
    rope_theta: float = 100.0  # RoPE's base: frequencies theta ** (-4k / head_dim) (both RoPE kinds; DINOv3's 100)
    pos_resize: PosResize = "bilinear"  # how a learned table follows another grid (see PosResize)
    class_token: bool | None = None  # None: a class token exactly when classifier is "token"

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", to_2tuple(self.img_size, "img_size"))
        object.__setattr__(self, "patch_size", to_2tuple(self.patch_size, "patch_size"))
        if self.resnet_units is not None:  # () is a hybrid too: the ResNet root alone, no stage
            object.__setattr__(self, "resnet_units", tuple(int(u) for u in self.resnet_units))
            if any(u < 1 for u in self.resnet_units):
                raise ValueError(f"resnet_units must be positive unit counts per stage, got {list(self.resnet_units)}")
        if self.num_classes is None:
            object.__setattr__(self, "num_classes", 0)
        if self.classifier not in POOLINGS:
            raise ValueError(f"classifier must be 'token', 'gap' or 'map', got {self.classifier!r}")
        if self.pos_embed not in POS_EMBEDS:
            choices = ", ".join(repr(c) for c in POS_EMBEDS[:-1]) + f" or {POS_EMBEDS[-1]!r}"
            raise ValueError(f"pos_embed must be {choices}, got {self.pos_embed!r}")
        if self.pos_resize not in POS_RESIZES:
            raise ValueError(f"pos_resize must be 'bilinear', 'bilinear_aa' or 'bicubic_aa', got {self.pos_resize!r}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"act must be 'gelu_tanh', 'gelu' or 'quick_gelu', got {self.act!r}")
        if self.mlp_type not in MLP_TYPES:
            raise ValueError(f"mlp_type must be 'mlp' or 'swiglu', got {self.mlp_type!r}")
        self._check_optional_pieces()
        if self.pos_embed == "learned2d" and self.width % 2:
            raise ValueError(
                f"pos_embed 'learned2d' needs an even width (a row half and a column half), got width {self.width}"
            )
        for name in ("width", "depth", "num_heads", "mlp_dim", "in_chans"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be 0 (no head) or positive, got {self.num_classes}")
        for name in ("img_size", "patch_size"):
            if min(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
        if self.resnet_units is not None and self.resnet_width % 32:
            raise ValueError(f"resnet_width must be a multiple of 32 (GroupNorm's 32 groups), got {self.resnet_width}")
        if self.distill_token and (self.classifier != "token" or self.representation_size):
            raise ValueError(
                "distill_token (DeiT) needs classifier='token' and no representation_size: the class and "
                f"distillation tokens feed the two linear heads, got classifier={self.classifier!r}, "
                f"representation_size={self.representation_size}"
            )
        check_divisible(self.img_size, self.total_stride, what="img_size")

    def _check_optional_pieces(self) -> None:
        """The later pieces' values (registers, LayerScale) and the combinations vitkit cannot build."""
        registers = self.num_registers
        if isinstance(registers, bool) or not isinstance(registers, int) or not 0 <= registers <= MAX_REGISTERS:
            raise ValueError(f"num_registers must be an integer from 0 to {MAX_REGISTERS}, got {registers!r}")
        scale = self.layer_scale_init
        number = isinstance(scale, (int, float)) and not isinstance(scale, bool)
        if scale is not None and not (number and math.isfinite(scale)):
            raise ValueError(f"layer_scale_init must be a finite number or None (no LayerScale), got {scale!r}")
        if self.distill_token and self.fc_norm:
            raise ValueError("distill_token (DeiT) feeds its two heads from the normed tokens; it takes no fc_norm")
        if not (self.class_token is None or isinstance(self.class_token, bool)):
            raise ValueError(f"class_token must be True, False or None (as classifier says), got {self.class_token!r}")
        if self.class_token is False and self.classifier == "token":
            raise ValueError("classifier 'token' pools the class token: it needs class_token True or None, got False")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not (math.isfinite(theta) and theta > 1):
            raise ValueError(f"rope_theta must be a finite number above 1, got {theta!r}")
        head_dim = self.width // max(self.num_heads, 1)
        if self.pos_embed in ROPE_POS_EMBEDS and head_dim % 4:
            raise ValueError(
                f"pos_embed {self.pos_embed!r} rotates each head's channels in pairs on two axes: it needs a head "
                f"width divisible by 4, got {head_dim} (width {self.width}, {self.num_heads} heads)"
            )

    @property
    def stem_stride(self) -> int:
        """Downsampling of the ResNet stem of a hybrid (1 for a plain ViT): :func:`hybrid_stem_stride`."""
        return hybrid_stem_stride(self.resnet_units)

    @property
    def total_stride(self) -> tuple[int, int]:
        """Input pixels per token along (h, w)."""
        return (self.patch_size[0] * self.stem_stride, self.patch_size[1] * self.stem_stride)

    @property
    def grid_size(self) -> tuple[int, int]:
        """Token grid (rows, cols) at ``img_size``."""
        return self.grid_for(self.img_size)

    def grid_for(self, size: tuple[int, int]) -> tuple[int, int]:
        """Token grid (rows, cols) of an input of ``size`` (h, w) pixels: one token per total stride.

        Args:
            size: the input's (height, width) in pixels.

        Returns:
            The token grid's (rows, columns); a remainder of pixels short of a token is dropped.
        """
        sh, sw = self.total_stride
        return (size[0] // sh, size[1] // sw)

    @property
    def has_class_token(self) -> bool:
        """Whether the sequence starts with a class token: ``class_token``, or when that is None,
        whether the classifier is "token"."""
        return self.classifier == "token" if self.class_token is None else self.class_token

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token (:attr:`has_class_token`), DeiT's distillation
        token (``distill_token``), then the register tokens (``num_registers``)."""
        return (1 if self.has_class_token else 0) + (1 if self.distill_token else 0) + self.num_registers

    @property
    def pos_prefix_rows(self) -> int:
        """Rows of the position embedding before the grid's: one for the class token and one for
        the distillation token, when they get a position (``cls_pos_embed``). Registers never do."""
        if not self.cls_pos_embed:
            return 0
        return self.num_prefix_tokens - self.num_registers

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields. The later pieces (:data:`OPTIONAL_FIELDS`) are written only when
        used, so a model without them is written as before they existed.

        Returns:
            The fields by name, tuples as lists.
        """
        d = _to_json_dict(self)
        for name, default in OPTIONAL_FIELDS.items():
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        """The config :meth:`to_dict` wrote.

        Args:
            d: fields by name (lists for the sizes); absent ones take their defaults.

        Returns:
            The config, checked.

        Raises:
            ValueError: an unknown field, or a value the config refuses.
        """
        return _from_json_dict(cls, d)

    def replace(self, **overrides: Any) -> ViTConfig:
        """A copy with some fields changed, checked as a new config.

        Args:
            **overrides: the fields to change, by name.

        Returns:
            The new config.

        Raises:
            ValueError: an unknown field, or a value the config refuses.
        """
        return _replace_checked(self, overrides)


# The fields of the pieces later ViTs add, with the value that leaves them out.
OPTIONAL_FIELDS: dict[str, Any] = {
    "num_registers": 0,
    "layer_scale_init": None,
    "pre_norm": False,
    "fc_norm": False,
    "qk_norm": False,
    "mlp_type": "mlp",
    "patch_bias": True,
    "rope_theta": 100.0,
    "class_token": None,
}


@dataclass(frozen=True)
class ResNetConfig:
    """BiT ResNet v2 (pre-activation, weight-standardised convolutions, GroupNorm): the paper's CNN
    baseline (Kolesnikov et al., 2020).

    Attributes:
        units: bottleneck units per stage (ResNet-50: 3, 4, 6, 3).
        width_factor: the multiplier of every stage's width (BiT's x1 to x4).
        img_size: the input's (height, width) in pixels; an int means a square.
        in_chans: the input's channels (3 for RGB).
        num_classes: the classifier head's outputs; 0 (or None): no head, the model returns the
            pooled features.

    Raises:
        ValueError: a unit count, ``width_factor``, ``in_chans`` or size below one, or a negative
            ``num_classes``.
    """

    units: tuple[int, ...] = (3, 4, 6, 3)
    width_factor: int = 1
    img_size: tuple[int, int] = (224, 224)
    in_chans: int = 3
    num_classes: int = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", to_2tuple(self.img_size, "img_size"))
        object.__setattr__(self, "units", tuple(int(u) for u in self.units))
        if self.num_classes is None:
            object.__setattr__(self, "num_classes", 0)
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be 0 (no head) or positive, got {self.num_classes}")
        if not self.units or min(self.units) < 1 or self.width_factor < 1 or self.in_chans < 1:
            raise ValueError(
                f"units (per stage), width_factor and in_chans must be positive, got {list(self.units)}, "
                f"{self.width_factor} and {self.in_chans}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields.

        Returns:
            The fields by name, tuples as lists.
        """
        return _to_json_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResNetConfig:
        """The config :meth:`to_dict` wrote.

        Args:
            d: fields by name (lists for the sizes); absent ones take their defaults.

        Returns:
            The config, checked.

        Raises:
            ValueError: an unknown field, or a value the config refuses.
        """
        return _from_json_dict(cls, d)

    def replace(self, **overrides: Any) -> ResNetConfig:
        """A copy with some fields changed, checked as a new config.

        Args:
            **overrides: the fields to change, by name.

        Returns:
            The new config.

        Raises:
            ValueError: an unknown field, or a value the config refuses.
        """
        return _replace_checked(self, overrides)


def _to_json_dict(cfg: Any) -> dict[str, Any]:
    """A config's fields as JSON has them: tuples (sizes, units per stage) as lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def _from_json_dict(cls: type, d: dict[str, Any]) -> Any:
    """The inverse of :func:`_to_json_dict`; unknown fields are an error, absent ones default."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {unknown}; known: {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _replace_checked(cfg: Any, overrides: dict[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown model option(s) {unknown}; valid options: {sorted(known)}")
    return dataclasses.replace(cfg, **overrides)


def check_divisible(size: tuple[int, int], stride: tuple[int, int], what: str = "image size") -> None:
    """Raise a clear error when an image size is not a whole number of patches (of the total
    stride: patch size times the hybrid stem's downsampling)."""
    h, w = size
    sh, sw = stride
    if h < sh or w < sw or h % sh or w % sw:
        raise ValueError(
            f"{what} {h}x{w} is not divisible by the patch size {sh}x{sw} (input pixels per token) "
            f"(nearest valid: {max(sh, round(h / sh) * sh)}x{max(sw, round(w / sw) * sw)})"
        )
