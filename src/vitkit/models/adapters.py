"""Low-rank adapters on a frozen ViT: LoRA (Hu et al., ICLR 2022) and DoRA (Liu et al., ICML 2024).

LoRA learns, for a linear layer ``y = W0 x + b`` (W0: out x in), a low-rank update
``W = W0 + s B A`` with ``A`` (r x in), ``B`` (out x r) and ``s = alpha / r``; ``A`` starts as
``nn.Linear``'s default draw and ``B`` at zero, so the adapted model starts equal to its base.
DoRA splits the weight into a magnitude and a direction,
``W = m * (W0 + s B A) / ||W0 + s B A||`` with the norm of each output unit's row (the paper's
column-wise norm, for its d x k layout) and ``m`` starting at ``||W0||``; the norm is treated as a
constant in the backward pass, as the paper's section 4.3 does to save memory.

vitkit's attention has one fused ``qkv`` layer, (3D x D) rows q, k, v: the targets ``q``, ``k`` and
``v`` each adapt their own D rows with their own ``A``, ``B`` (and ``m``), exactly as an adapter
on a separate query, key or value layer would (Hugging Face's ``q_proj`` ...). The other targets
are the attention's output projection ``proj`` and the MLP's ``fc1`` and ``fc2``.

:func:`apply_adapters` replaces the targeted layers by :class:`AdaptedLinear` (same ``weight`` and
``bias`` names, so the base's state-dict keys are unchanged), freezes everything else but the
head and the norms the spec trains, and records a checksum of the frozen base weights;
:func:`adapter_state_dict` is what to save; :func:`merge_adapters` folds the adapters into plain
``nn.Linear`` weights for serving and export. The file format lives in
:mod:`vitkit.checkpoint.adapters`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, RecipeError

ADAPTER_KINDS = ("lora", "dora")
TARGETS = ("q", "k", "v", "proj", "fc1", "fc2")
"""Where an adapter may go: the query, key and value rows of the fused qkv layer, the attention's
output projection, the MLP's first and second layers."""
TARGET_GROUPS = {"qkv": ("q", "k", "v"), "attn": ("q", "k", "v", "proj"), "mlp": ("fc1", "fc2"), "all": TARGETS}
"""Shorthands a spec's ``targets`` may use."""
HEAD_MODULES = ("head", "head_dist")
SPEC_KEYS = ("kind", "rank", "alpha", "dropout", "targets", "train_head", "train_norms")


@dataclass(frozen=True)
class AdapterSpec:
    """What to adapt and how (the recipe's ``finetune.adapter``).

    Attributes:
        kind: "lora" or "dora".
        rank: r, the rank of each update B A.
        alpha: the update's scale is ``alpha / rank``.
        dropout: dropout on the adapter's input (training only), in [0, 1).
        targets: the layers adapted, of :data:`TARGETS`, in that order.
        train_head: train the classifier head(s) too (saved with the adapters).
        train_norms: train every LayerNorm too (saved with the adapters).
    """

    kind: str = "lora"
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q", "v")
    train_head: bool = True
    train_norms: bool = False

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor of every update."""
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON values.

        Returns:
            The fields by name, ``targets`` a list: what :func:`adapter_spec_from_dict` reads back.
        """
        d = asdict(self)
        d["targets"] = list(self.targets)
        return d


def adapter_spec_from_dict(d: dict[str, Any], where: str = "finetune.adapter") -> AdapterSpec:
    """Parse the recipe's ``finetune.adapter`` mapping (or a file's stored spec) into a checked
    :class:`AdapterSpec`. Missing keys take the defaults; ``targets`` may be a list or a
    comma-separated string of :data:`TARGETS` and the shorthands of :data:`TARGET_GROUPS`.

    Args:
        d: ``{kind: lora|dora, rank, alpha, dropout, targets, train_head, train_norms}``.
        where: the key's name, for messages.

    Returns:
        The spec.

    Raises:
        RecipeError: one line naming the key at fault: an unknown key, kind or target, a rank below
            one, a negative alpha, a dropout outside [0, 1), a flag that is not a boolean.
    """
    if not isinstance(d, dict):
        raise RecipeError(f"{where}: expected a mapping of {', '.join(SPEC_KEYS)}, got {type(d).__name__}")
    unknown = sorted(set(d) - set(SPEC_KEYS))
    if unknown:
        raise RecipeError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(SPEC_KEYS)})")
    base = AdapterSpec()
    kind = d.get("kind", base.kind)
    if kind not in ADAPTER_KINDS:
        raise RecipeError(f"{where}.kind must be one of {', '.join(ADAPTER_KINDS)}, got {kind!r}")
    rank = d.get("rank", base.rank)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise RecipeError(f"{where}.rank must be a whole number of at least 1, got {rank!r}")
    alpha = _number(d.get("alpha", base.alpha), f"{where}.alpha", 0.0, math.inf)
    if alpha <= 0:
        raise RecipeError(f"{where}.alpha must be greater than 0, got {alpha:g}")
    dropout = _number(d.get("dropout", base.dropout), f"{where}.dropout", 0.0, 1.0)
    if dropout >= 1.0:
        raise RecipeError(f"{where}.dropout must be in [0, 1), got {dropout:g}")
    flags = {}
    for key in ("train_head", "train_norms"):
        flags[key] = d.get(key, getattr(base, key))
        if not isinstance(flags[key], bool):
            raise RecipeError(f"{where}.{key} must be true or false, got {flags[key]!r}")
    targets = _targets(d.get("targets", list(base.targets)), f"{where}.targets")
    return AdapterSpec(kind, rank, alpha, dropout, targets, **flags)


def _number(value: Any, key: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecipeError(f"{key} must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise RecipeError(f"{key} must be in [{lo:g}, {hi:g}], got {value:g}")
    return float(value)


def _targets(value: Any, key: str) -> tuple[str, ...]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise RecipeError(f"{key} must be a non-empty list of {', '.join(TARGETS)}, got {value!r}")
    wanted: set[str] = set()
    for name in (n.strip() for n in names):
        if name in TARGET_GROUPS:
            wanted.update(TARGET_GROUPS[name])
        elif name in TARGETS:
            wanted.add(name)
        else:
            known = ", ".join((*TARGETS, *TARGET_GROUPS))
            raise RecipeError(f"{key}: unknown target {name!r} (known: {known})")
    return tuple(t for t in TARGETS if t in wanted)


# ----------------------------------------------------------------------------------------------
# The adapted layer.


class AdaptedLinear(nn.Module):
    """A frozen linear layer plus low-rank updates of slices of its output rows.

    ``parts`` maps each adapted part's name to its rows ``(start, stop)``: the whole layer for
    ``proj``, ``fc1`` and ``fc2``; D rows each for ``q``, ``k`` and ``v`` on the fused qkv layer.
    The base's ``weight`` and ``bias`` keep their names (and may be in another dtype than the
    adapters, e.g. bf16 while the adapters train in fp32); each part has ``lora_A[part]``
    (r x in), ``lora_B[part]`` (rows x r) and, for DoRA, ``magnitude[part]`` (rows,).

    Args:
        base: the layer to adapt (its parameters are taken, not copied).
        parts: part name -> (first row, row after the last).
        spec: rank, alpha, dropout and kind.
    """

    def __init__(self, base: nn.Linear, parts: dict[str, tuple[int, int]], spec: AdapterSpec) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.parts = dict(parts)
        self.kind, self.scale = spec.kind, spec.scale
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()
        w = base.weight.detach().float()
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        self.magnitude = nn.ParameterDict()
        for name, (start, stop) in self.parts.items():
            a = torch.empty(spec.rank, self.in_features, device=w.device)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # nn.Linear's default draw
            self.lora_A[name] = nn.Parameter(a)
            self.lora_B[name] = nn.Parameter(torch.zeros(stop - start, spec.rank, device=w.device))
            if spec.kind == "dora":
                self.magnitude[name] = nn.Parameter(torch.linalg.vector_norm(w[start:stop], dim=1))

    def extra_repr(self) -> str:
        """What ``print(model)`` shows of the layer.

        Returns:
            Its shape, kind, scale and adapted rows.
        """
        parts = ", ".join(f"{n}: rows {a}-{b}" for n, (a, b) in self.parts.items())
        return f"{self.in_features} -> {self.out_features}, {self.kind} x{self.scale:g} on {parts}"

    def _update(self, name: str) -> torch.Tensor:
        """s B A of one part, (rows, in), in the adapters' dtype."""
        return self.scale * (self.lora_B[name] @ self.lora_A[name])

    def _dora_scale(self, name: str) -> torch.Tensor:
        """m / ||W0 + s B A|| of one part, (rows,); the norm detached (DoRA's section 4.3)."""
        start, stop = self.parts[name]
        w = self.weight[start:stop].to(self.lora_A[name].dtype) + self._update(name)
        return self.magnitude[name] / torch.linalg.vector_norm(w, dim=1).detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``W0 x`` plus each part's update (DoRA: rescaled), then the bias.

        Args:
            x: the input (..., in), in any float dtype; the base computes in its own dtype, the
                adapters in theirs.

        Returns:
            (..., out), in ``x``'s dtype (under autocast: as autocast leaves it).
        """
        base = F.linear(x.to(self.weight.dtype), self.weight)  # (..., out), no bias yet
        xd = self.dropout(x)
        pieces, row = [], 0
        for name, (start, stop) in sorted(self.parts.items(), key=lambda kv: kv[1]):
            if start > row:
                pieces.append(base[..., row:start])
            a = self.lora_A[name]
            delta = F.linear(F.linear(xd.to(a.dtype), a), self.lora_B[name]) * self.scale  # (..., rows)
            part = base[..., start:stop].to(delta.dtype) + delta
            if self.kind == "dora":
                part = part * self._dora_scale(name).to(part.dtype)
            pieces.append(part)
            row = stop
        if row < self.out_features:
            pieces.append(base[..., row:])
        dtype = functools.reduce(torch.promote_types, (p.dtype for p in pieces))
        out = torch.cat([p.to(dtype) for p in pieces], dim=-1)  # (..., out)
        if self.bias is not None:
            out = out + self.bias.to(dtype)
        return out.to(x.dtype) if not torch.is_autocast_enabled(x.device.type) else out

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` computing what this layer computes, in the base's dtype: each
        part's rows ``W0 + s B A`` (LoRA) or ``m * (W0 + s B A) / ||W0 + s B A||`` (DoRA),
        computed in fp32.

        Returns:
            The merged layer, its parameters frozen.
        """
        w = self.weight.detach().float().clone()
        for name, (start, stop) in self.parts.items():
            rows = w[start:stop] + self._update(name).float()
            if self.kind == "dora":
                rows = rows * (self.magnitude[name].float() / torch.linalg.vector_norm(rows, dim=1))[:, None]
            w[start:stop] = rows
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=w.device)
        out.weight = nn.Parameter(w.to(self.weight.dtype), requires_grad=False)
        if self.bias is not None:
            out.bias = nn.Parameter(self.bias.detach().clone(), requires_grad=False)
        return out


# ----------------------------------------------------------------------------------------------
# Putting adapters on a model, and taking them off.


@dataclass
class AdapterInfo:
    """What :func:`apply_adapters` left on a model (``model.adapter_info``).

    Attributes:
        spec: the spec applied.
        base_name: the base weights' name (their file or pretrained name).
        base_sha256: the checksum of the frozen base tensors (:func:`base_checksum`).
        metadata: extra string metadata a loaded adapter file carried (class names...).
    """

    spec: AdapterSpec
    base_name: str
    base_sha256: str
    metadata: dict[str, str] = field(default_factory=dict)


def _target_layers(model: nn.Module, targets: tuple[str, ...]) -> dict[str, tuple[nn.Module, str, dict]]:
    """Qualified layer name -> (parent module, attribute, parts) of every layer ``targets`` adapt."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "attn") and hasattr(b, "mlp") for b in blocks):
        raise RecipeError(f"adapters go on a ViT's encoder blocks; {type(model).__name__} has none")
    out: dict[str, tuple[nn.Module, str, dict]] = {}
    for i, blk in enumerate(blocks):
        qkv = [t for t in ("q", "k", "v") if t in targets]
        if qkv:
            d = blk.attn.qkv.out_features // 3
            rows = {"q": (0, d), "k": (d, 2 * d), "v": (2 * d, 3 * d)}
            out[f"blocks.{i}.attn.qkv"] = (blk.attn, "qkv", {t: rows[t] for t in qkv})
        for target, parent, attr in (("proj", blk.attn, "proj"), ("fc1", blk.mlp, "fc1"), ("fc2", blk.mlp, "fc2")):
            if target in targets:
                layer = getattr(parent, attr)
                prefix = "attn" if target == "proj" else "mlp"
                out[f"blocks.{i}.{prefix}.{attr}"] = (parent, attr, {target: (0, layer.out_features)})
    return out


def _trained_extras(model: nn.Module, spec: AdapterSpec) -> list[str]:
    """Names of the base's modules the spec trains whole (the head(s), the LayerNorms)."""
    heads = [n for n, _ in model.named_modules() if spec.train_head and n in HEAD_MODULES]
    norms = [n for n, m in model.named_modules() if spec.train_norms and isinstance(m, nn.LayerNorm)]
    return heads + norms


def _is_extra(key: str, extras: list[str]) -> bool:
    return any(key == m or key.startswith(m + ".") for m in extras)


def base_checksum(model: nn.Module, spec: AdapterSpec) -> str:
    """SHA-256 of the base tensors an adapter of ``spec`` leaves frozen (every state-dict tensor but
    the head and norms the spec trains, and adapters already applied), as fp32, with their names
    and shapes: the same for a base kept in bf16 after the checksum was taken.

    Args:
        model: the plain base model, or one with adapters of ``spec`` applied.
        spec: which modules the adapters train whole (their tensors are not part of the base's sum).

    Returns:
        64 hex digits.
    """
    info = getattr(model, "adapter_info", None)
    if info is not None:
        return info.base_sha256
    extras = _trained_extras(model, spec)
    h = hashlib.sha256()
    for key, t in sorted(model.state_dict().items()):
        if _is_extra(key, extras):
            continue
        t = t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype).contiguous()
        h.update(f"{key}:{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def apply_adapters(
    model: nn.Module, spec: AdapterSpec, base_name: str | None = None, base_dtype: torch.dtype | None = None
) -> nn.Module:
    """Put adapters of ``spec`` on ``model`` (in place): every targeted layer becomes an
    :class:`AdaptedLinear`, every base parameter is frozen except the head and norms the spec
    trains, and ``model.adapter_info`` records the spec, the base's name and checksum.

    Args:
        model: a vitkit ViT, without adapters.
        spec: what to adapt.
        base_name: the base weights' name, saved with the adapters; None: the file the model was
            loaded from (``model.load_report``), else its config's description.
        base_dtype: cast the frozen base parameters to this dtype (bf16: the serving precision,
            half the memory) after the checksum is taken; the adapters and the trained head and
            norms stay fp32. None: leave them as they are.

    Returns:
        ``model``.

    Raises:
        RecipeError: a model without ViT blocks, adapters applied already, or a rank larger than
            a targeted layer (the line names the layer and its size).
    """
    if getattr(model, "adapter_info", None) is not None:
        raise RecipeError("the model has adapters already; merge them (merge_adapters) or start from the base")
    layers = _target_layers(model, spec.targets)
    for name, (parent, attr, parts) in layers.items():
        layer = getattr(parent, attr)
        if type(layer) is not nn.Linear:
            raise RecipeError(f"{name} is a {type(layer).__name__}, not a linear layer adapters can go on")
        for part, (start, stop) in parts.items():
            if spec.rank > min(stop - start, layer.in_features):
                raise RecipeError(
                    f"adapter rank {spec.rank} is larger than {name} ({part}: {stop - start} x {layer.in_features})"
                )
    digest = base_checksum(model, spec)
    if base_name is None:
        report = getattr(model, "load_report", None)
        base_name = str(getattr(report, "name", None) or getattr(report, "path", "") or "an unsaved model")
    for p in model.parameters():
        p.requires_grad_(False)
    extras = _trained_extras(model, spec)
    if base_dtype is not None:
        _cast_frozen(model, base_dtype, extras)
    for _, (parent, attr, parts) in layers.items():
        setattr(parent, attr, AdaptedLinear(getattr(parent, attr), parts, spec))
    for name in extras:
        for p in model.get_submodule(name).parameters():
            p.data = p.data.float()
            p.requires_grad_(True)
    model.adapter_info = AdapterInfo(spec, base_name, digest)
    return model


def _cast_frozen(model: nn.Module, dtype: torch.dtype, extras: list[str]) -> None:
    for name, module in model.named_modules():
        if _is_extra(name, extras):
            continue
        for p in module.parameters(recurse=False):
            if p.is_floating_point():
                p.data = p.data.to(dtype)


def adapted_layers(model: nn.Module) -> dict[str, AdaptedLinear]:
    """Qualified name -> every :class:`AdaptedLinear` of ``model``.

    Args:
        model: a model.

    Returns:
        The adapted layers, in module order (empty for a model without adapters).
    """
    return {n: m for n, m in model.named_modules() if isinstance(m, AdaptedLinear)}


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimiser of an adapter fine-tune updates: the adapters' and those of the
    head and norms the spec trains (the model's parameters with ``requires_grad``, in order).

    Args:
        model: a model with adapters applied.

    Returns:
        The parameters.

    Raises:
        RecipeError: a model without adapters.
    """
    _info(model)
    return [p for p in model.parameters() if p.requires_grad]


def _info(model: nn.Module) -> AdapterInfo:
    info = getattr(model, "adapter_info", None)
    if info is None:
        raise RecipeError("the model has no adapters (apply_adapters, or load_adapters from a file)")
    return info


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """What an adapter fine-tune changed, by the model's state-dict names: every adapter's
    ``lora_A``, ``lora_B`` (and DoRA's ``magnitude``) and the tensors of the head and norms the
    spec trains. Detached, on their device, in their dtype.

    Args:
        model: a model with adapters applied.

    Returns:
        The tensors by name.

    Raises:
        RecipeError: a model without adapters.
    """
    info = _info(model)
    extras = _trained_extras(model, info.spec)
    out = {}
    for key, t in model.state_dict().items():
        adapter = any(f".{kind}." in key for kind in ("lora_A", "lora_B", "magnitude"))
        if adapter or _is_extra(key, extras):
            out[key] = t.detach()
    return out


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fold every adapter into its layer (in place): plain ``nn.Linear`` layers computing what the
    adapted ones did (equal in fp32 up to rounding; within bf16's rounding for a bf16 base), with
    the base's state-dict keys; ``model.adapter_info`` is removed, every parameter left as
    ``requires_grad`` was. A model without adapters is returned unchanged.

    Args:
        model: a model with adapters applied (or none).

    Returns:
        ``model``.
    """
    for name, layer in adapted_layers(model).items():
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, layer.merged())
    if hasattr(model, "adapter_info"):
        del model.adapter_info
    return model


def check_base(model: nn.Module, spec: AdapterSpec, base_name: str, base_sha256: str, where: str) -> str:
    """Refuse a base other than the one the adapters were trained on.

    Args:
        model: the base model, without adapters.
        spec: the adapters' spec (which tensors the checksum leaves out).
        base_name: the name the adapters recorded for their base.
        base_sha256: the checksum they recorded.
        where: the adapter file, for the message.

    Returns:
        The checksum of ``model``'s base (equal to ``base_sha256``).

    Raises:
        CheckpointError: one line naming the file, its base and both checksums.
    """
    got = base_checksum(model, spec)
    if got != base_sha256:
        raise CheckpointError(
            f"{where}: adapters made for base {base_name!r} (sha256 {base_sha256[:12]}), not for these weights "
            f"(sha256 {got[:12]}): load them onto {base_name}"
        )
    return got


def spec_json(spec: AdapterSpec) -> str:
    """The spec as compact JSON, as adapter files store it.

    Args:
        spec: the spec.

    Returns:
        One line of JSON.
    """
    return json.dumps(spec.to_dict(), separators=(",", ":"))


__all__ = [
    "ADAPTER_KINDS",
    "TARGETS",
    "TARGET_GROUPS",
    "AdaptedLinear",
    "AdapterInfo",
    "AdapterSpec",
    "adapted_layers",
    "adapter_parameters",
    "adapter_spec_from_dict",
    "adapter_state_dict",
    "apply_adapters",
    "base_checksum",
    "check_base",
    "merge_adapters",
    "spec_json",
]
