"""The table of released weights vitkit knows by name: where each file lives, what it was trained
on, what its publisher reports, and the preprocessing it expects.

Names are ``MODEL.TAG`` (``vit_b16.augreg_in21k_ft_in1k``), the tag saying what the weights saw:
``in21k`` pre-trained on ImageNet-21k, ``in21k_ft_in1k`` then fine-tuned on ImageNet-1k, the
``augreg_`` ones from "How to train your ViT?" (Steiner et al., 2021). Each entry also answers to
the names of its file in the release: ``imagenet21k/ViT-B_16``, ``imagenet21k+imagenet2012/ViT-B_16``
(the 2020 release of the paper), ``augreg/B_16-i21k-300ep-...`` or the AugReg file name alone, and to
its public address (``gs://``/``https://``).

Later releases of the ViT (DINOv2 with and without registers, DINOv3, OpenAI's CLIP image towers,
SigLIP and SigLIP 2 at 224 px) are named ``MODEL.TAG`` too (``vit_s14_dinov2.lvd142m``,
``vit_s16_dinov3.lvd1689m``, ``vit_b16_clip_quickgelu.openai``, ``vit_b16_siglip.webli``), each
answering to its hub repository (``facebook/dinov2-small``, ``timm/vit_small_patch14_dinov2.lvd142m``,
``facebook/dinov3-vits16-pretrain-lvd1689m``...).

Accuracies are ImageNet-1k top-1 (%) as the publisher reports them, with where: the paper's
Table 5 for the 2020 fine-tuned files (fine-tuned at 384), the release README for the ``-224``
files and the AugReg table. Blank where no number is published for that file (a pre-trained
checkpoint has a 21k-class head, not an ImageNet-1k classifier).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..errors import UsageError
from ..preprocessing import Preprocessing

GCS_VIT = "https://storage.googleapis.com/vit_models"
README = "vision_transformer README"
APACHE = "Apache-2.0"


@dataclass(frozen=True)
class Pretrained:
    """One released weight file and what travels with it.

    ``url``: ``https://``, ``gs://`` or ``hf-hub:org/name``. ``preprocessing``: None for hub
    repositories, which carry their own (timm's ``pretrained_cfg``, a ``preprocessor_config.json``).
    ``sha256`` and ``size`` are checked after a download where known.

    Attributes:
        name: the entry's name, ``model.tag`` (``vit_b16.augreg_in21k_ft_in1k``).
        model: the vitkit model the weights fit (``vitkit.create_model(model)``); None: unchecked.
        url: where the file is.
        resolution: the image side (pixels) the weights were trained or fine-tuned at.
        pretrain: the data set of pre-training.
        finetune: the data set of fine-tuning; "" if none.
        top1: the ImageNet-1k top-1 accuracy (%) the publisher reports, where it does.
        top1_source: where that figure is published.
        licence: the weights' licence.
        source: "official" (the 2020 release), "augreg", "hf-hub" or "user".
        aliases: other spellings of the entry (release file names).
        preprocessing: the inputs the weights expect; None: the repository's own.
        sha256: the file's SHA-256 (hex), where known.
        size: the file's size in bytes, where known.
    """

    name: str
    model: str | None  # the vitkit model the weights fit (``vitkit.create_model(model)``); None: unchecked
    url: str
    resolution: int
    pretrain: str  # data set of pre-training
    finetune: str = ""  # data set of fine-tuning, "" if none
    top1: float | None = None  # ImageNet-1k top-1 (%) the publisher reports
    top1_source: str = ""
    licence: str = APACHE
    source: str = "official"  # official (2020 release) | augreg | hf-hub | user
    aliases: tuple[str, ...] = ()
    preprocessing: Preprocessing | None = None
    sha256: str | None = None
    size: int | None = None

    @property
    def tag(self) -> str:
        """The part of the name after the model: ``in21k_ft_in1k`` of ``vit_b16.in21k_ft_in1k``
        (everything after the first dot; the whole name when it has none)."""
        return self.name.split(".", 1)[1] if "." in self.name else self.name


def _paper_range(resolution: int) -> Preprocessing:
    """The official code's evaluation: resize to the resolution (bilinear, no crop), values in [-1, 1]."""
    return Preprocessing(img_size=(resolution, resolution))


def _official(model: str, tag: str, folder: str, file: str, res: int, top1: float | None, where: str) -> Pretrained:
    ft = "ImageNet-1k" if folder.endswith("imagenet2012") else ""
    return Pretrained(
        f"{model}.{tag}",
        model,
        f"{GCS_VIT}/{folder}/{file}.npz",
        res,
        "ImageNet-21k",
        ft,
        top1,
        where if top1 is not None else "",
        aliases=(f"{folder}/{file}",),
        preprocessing=_paper_range(res),
    )


# The 2020 release (gs://vit_models/imagenet21k and imagenet21k+imagenet2012).
_OFFICIAL = [
    *(
        _official(m, "in21k", "imagenet21k", f, 224, None, "")
        for m, f in [
            ("vit_b16", "ViT-B_16"),
            ("vit_b32", "ViT-B_32"),
            ("vit_l16", "ViT-L_16"),
            ("vit_l32", "ViT-L_32"),
            ("vit_h14", "ViT-H_14"),
            ("r50_vit_b16", "R50+ViT-B_16"),
        ]
    ),
    _official("vit_b16", "in21k_ft_in1k", "imagenet21k+imagenet2012", "ViT-B_16", 384, 84.0, "paper Table 5"),
    _official("vit_b32", "in21k_ft_in1k", "imagenet21k+imagenet2012", "ViT-B_32", 384, None, ""),
    _official("vit_l16", "in21k_ft_in1k", "imagenet21k+imagenet2012", "ViT-L_16", 384, 85.2, "paper Table 5"),
    _official("vit_l32", "in21k_ft_in1k", "imagenet21k+imagenet2012", "ViT-L_32", 384, 81.0, "paper Table 5"),
    _official("vit_b16", "in21k_ft_in1k_224", "imagenet21k+imagenet2012", "ViT-B_16-224", 224, 81.2, README),
    _official("vit_l16", "in21k_ft_in1k_224", "imagenet21k+imagenet2012", "ViT-L_16-224", 224, 82.7, README),
]

# AugReg: the checkpoints the release README recommends (best pre-training metrics), pre-trained
# on ImageNet-21k and fine-tuned on ImageNet-1k at 384, with the README's top-1.
# (model, pre-trained file, fine-tuning suffix, top-1)
_AUGREG_FILES = [
    ("vit_ti16", "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "lr_0.03", 78.22),
    ("vit_s16", "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", "lr_0.03", 83.73),
    ("vit_s32", "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0", "lr_0.01", 79.58),
    ("vit_b16", "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", "lr_0.03", 85.49),
    ("vit_b32", "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "lr_0.01", 83.59),
    ("vit_l16", "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0", "lr_0.01", 85.59),
    ("r26_vit_s32", "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "lr_0.01", 83.85),
    ("r50_vit_l32", "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", "lr_0.01", 85.99),
    ("r_vit_ti16", "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "lr_0.03", 75.40),
]


def _augreg(model: str, file: str, ft_lr: str | None, top1: float | None) -> Pretrained:
    if ft_lr is None:
        tag, res, ft = "augreg_in21k", 224, ""
    else:
        file, tag, res, ft = (
            f"{file}--imagenet2012-steps_20k-{ft_lr}-res_384",
            "augreg_in21k_ft_in1k",
            384,
            "ImageNet-1k",
        )
    return Pretrained(
        f"{model}.{tag}",
        model,
        f"{GCS_VIT}/augreg/{file}.npz",
        res,
        "ImageNet-21k",
        ft,
        top1,
        README + " (AugReg)" if top1 is not None else "",
        source="augreg",
        aliases=(f"augreg/{file}", file),
        preprocessing=_paper_range(res),
    )


_AUGREG = [e for m, f, lr, acc in _AUGREG_FILES for e in (_augreg(m, f, None, None), _augreg(m, f, lr, acc))]

_HUB = [
    Pretrained(
        "hf-hub:google/vit-base-patch16-224",
        "vit_b16",
        "hf-hub:google/vit-base-patch16-224",
        224,
        "ImageNet-21k",
        "ImageNet-1k",
        source="hf-hub",
    ),
    Pretrained(
        "hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
        "vit_b16",
        "hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
        224,
        "ImageNet-21k",
        "ImageNet-1k",
        source="hf-hub",
    ),
]

# Later ViTs, from the Hugging Face hub: each release in its authors' transformers repository and
# in timm's (timm's names, the same weights). Their repositories carry their preprocessing
# (preprocessor_config.json, timm's pretrained_cfg); the values here, the publishers', are used
# where a repository gives none. Accuracies are left blank: these are feature extractors, and
# their publishers report linear-probe and zero-shot numbers, not a classifier's top-1.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
MIT = "MIT"
_DINOV2_SIZES = [("s", "small"), ("b", "base"), ("l", "large"), ("g", "giant")]


def _release(model: str, tag: str, repo: str, res: int, data: str, pre: Preprocessing, licence: str) -> Pretrained:
    return Pretrained(
        f"{model}.{tag}",
        model,
        f"hf-hub:{repo}",
        res,
        data,
        licence=licence,
        source="hf-hub",
        aliases=(repo,),
        preprocessing=pre,
    )


def _dinov2(size: str, word: str, registers: bool) -> list[Pretrained]:
    """A DINOv2 release (Oquab et al., 2023; with registers, Darcet et al., 2024): Meta's
    transformers repository (its processor: shorter side 256, the central 224) and timm's (the
    whole 518 px the position table was trained at)."""
    model = f"vit_{size}14_{'reg4_' if registers else ''}dinov2"
    facebook = f"facebook/dinov2-{'with-registers-' if registers else ''}{word}"
    timm = f"timm/vit_{word}_patch14_{'reg4_' if registers else ''}dinov2.lvd142m"
    crop = Preprocessing(IMAGENET_MEAN, IMAGENET_STD, (224, 224), "bicubic", 224 / 256)
    whole = Preprocessing(IMAGENET_MEAN, IMAGENET_STD, (518, 518), "bicubic", crop_mode="center")
    return [
        _release(model, "lvd142m", facebook, 224, "LVD-142M (DINOv2, self-supervised)", crop, APACHE),
        _release(model, "lvd142m_timm", timm, 518, "LVD-142M (DINOv2, self-supervised)", whole, APACHE),
    ]


# DINOv3 (Simeoni et al., 2025): Meta's transformers repositories (their processor: the whole image
# squashed to 224 px, bilinear) and timm's (the whole image at 256 px, bicubic: timm's evaluation
# of its DINOv3 models). Both repositories are gated behind the DINOv3 License: accept it on the
# hub and log in before the first download.
# (vitkit model, Meta's name in facebook/dinov3-NAME-pretrain-DATA, timm's size word)
_DINOV3_SIZES = [
    ("vit_s16_dinov3", "vits16", "small"),
    ("vit_splus16_dinov3", "vits16plus", "small_plus"),
    ("vit_b16_dinov3", "vitb16", "base"),
    ("vit_l16_dinov3", "vitl16", "large"),
    ("vit_hplus16_dinov3", "vith16plus", "huge_plus"),
    ("vit_7b16_dinov3", "vit7b16", "7b"),
]
DINOV3_LICENCE = "DINOv3 License (gated)"
_LVD = "LVD-1689M (DINOv3, self-supervised)"
_SAT = "SAT-493M (DINOv3, satellite, self-supervised)"
SAT_MEAN, SAT_STD = (0.430, 0.411, 0.296), (0.213, 0.156, 0.143)


def _dinov3(model: str, meta: str, word: str, data: str) -> list[Pretrained]:
    """A DINOv3 release on LVD-1689M (``data`` "lvd1689m") or satellite images ("sat493m"):
    Meta's transformers repository and timm's."""
    mean, std = (SAT_MEAN, SAT_STD) if data == "sat493m" else (IMAGENET_MEAN, IMAGENET_STD)
    squash = Preprocessing(mean, std, (224, 224), "bilinear")
    whole = Preprocessing(mean, std, (256, 256), "bicubic", crop_mode="center")
    what = _SAT if data == "sat493m" else _LVD
    return [
        _release(model, data, f"facebook/dinov3-{meta}-pretrain-{data}", 224, what, squash, DINOV3_LICENCE),
        _release(model, f"{data}_timm", f"timm/vit_{word}_patch16_dinov3.{data}", 256, what, whole, DINOV3_LICENCE),
    ]


_OPENAI_CLIP = Preprocessing(OPENAI_MEAN, OPENAI_STD, (224, 224), "bicubic", crop_mode="center")  # shorter side, crop
_SIGLIP = Preprocessing((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), (224, 224), "bicubic")  # the whole image, squashed
_WIT = "WIT-400M (OpenAI CLIP, image-text)"
_DFN = "DFN-2B (Apple's filtered data, image-text)"
_ASCL = "Apple Sample Code License"


def _openclip(model: str, tag: str) -> Preprocessing:
    """The preprocessing timm gives an OpenCLIP tower: the shorter side, then the centre (all of it,
    but timm's ViT-B/32 on LAION-2B keeps 0.9 of it); OpenAI's mean and std, except the ViT-L/14 on
    LAION-2B (0.5)."""
    half = model == "l14" and tag == "laion2b"
    mean, std = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)) if half else (OPENAI_MEAN, OPENAI_STD)
    crop = 0.9 if (model, tag) == ("b32", "laion2b") else 1.0
    return Preprocessing(mean, std, (224, 224), "bicubic", crop, crop_mode="center")


_WEBLI = "WebLI (SigLIP, image-text)"
_WEBLI2 = "WebLI (SigLIP 2, image-text)"

_RELEASES = [
    *(e for size, word in _DINOV2_SIZES for registers in (False, True) for e in _dinov2(size, word, registers)),
    *(e for model, meta, word in _DINOV3_SIZES for e in _dinov3(model, meta, word, "lvd1689m")),
    *(
        e
        for model, meta, word in _DINOV3_SIZES
        if meta in ("vitl16", "vit7b16")
        for e in _dinov3(model, meta, word, "sat493m")
    ),
    # OpenAI's CLIP image towers (QuickGELU; the image projection is the head: the output is
    # CLIP's image embedding, the pre-logits its pooled token)
    _release("vit_b16_clip_quickgelu", "openai", "openai/clip-vit-base-patch16", 224, _WIT, _OPENAI_CLIP, MIT),
    _release("vit_b32_clip_quickgelu", "openai", "openai/clip-vit-base-patch32", 224, _WIT, _OPENAI_CLIP, MIT),
    _release("vit_l14_clip_quickgelu", "openai", "openai/clip-vit-large-patch14", 224, _WIT, _OPENAI_CLIP, MIT),
    *(
        _release(f"vit_{m}_clip_quickgelu", "openai_timm", f"timm/{arch}.openai", 224, _WIT, _OPENAI_CLIP, MIT)
        for m, arch in (
            ("b16", "vit_base_patch16_clip_224"),
            ("b32", "vit_base_patch32_clip_224"),
            ("l14", "vit_large_patch14_clip_224"),
        )
    ),
    # OpenCLIP's image towers (exact GELU), as timm hosts them; each repository's pretrained_cfg
    # gives the preprocessing, and these values are timm's (its ViT-L/14 on LAION-2B takes mean =
    # std = 0.5, as OpenCLIP trained it)
    *(
        _release(f"vit_{m}_clip", tag, f"timm/{arch}.{tag}", 224, data, _openclip(m, tag), licence)
        for m, arch in (
            ("b32", "vit_base_patch32_clip_224"),
            ("b16", "vit_base_patch16_clip_224"),
            ("l14", "vit_large_patch14_clip_224"),
        )
        for tag, data, licence in (
            ("laion2b", "LAION-2B (OpenCLIP, image-text)", MIT),
            ("datacompxl", "DataComp-1B (OpenCLIP, image-text)", MIT),
        )
    ),
    _release("vit_b16_clip", "dfn2b", "timm/vit_base_patch16_clip_224.dfn2b", 224, _DFN, _openclip("b16", ""), _ASCL),
    # SigLIP and SigLIP 2 image towers at a fixed 224 px (attention pooling; no head)
    _release("vit_b16_siglip", "webli", "google/siglip-base-patch16-224", 224, _WEBLI, _SIGLIP, APACHE),
    _release("vit_so400m14_siglip", "webli", "google/siglip-so400m-patch14-224", 224, _WEBLI, _SIGLIP, APACHE),
    _release("vit_b16_siglip", "v2_webli", "google/siglip2-base-patch16-224", 224, _WEBLI2, _SIGLIP, APACHE),
    _release("vit_so400m14_siglip", "v2_webli", "google/siglip2-so400m-patch14-224", 224, _WEBLI2, _SIGLIP, APACHE),
    _release("vit_b16_siglip", "webli_timm", "timm/vit_base_patch16_siglip_224.webli", 224, _WEBLI, _SIGLIP, APACHE),
    _release(
        "vit_so400m14_siglip", "webli_timm", "timm/vit_so400m_patch14_siglip_224.webli", 224, _WEBLI, _SIGLIP, APACHE
    ),
]

_TABLE: dict[str, Pretrained] = {}
_INDEX: dict[str, str] = {}  # every accepted spelling, lower-cased -> the entry's name


def register_pretrained(entry: Pretrained) -> None:
    """Add (or replace) an entry, so that its name, aliases and address resolve: a team's own
    weights on an internal server, a mirror with other file names.

    An entry of the same name is replaced, and the spellings that named it are forgotten first.
    Spellings are matched without regard to case; each alias also answers with ``.npz`` appended,
    and a ``https://storage.googleapis.com/`` address also as its ``gs://`` path. A spelling that
    another entry already answered to names the new entry from then on.

    Args:
        entry: the weights to register. Its ``name``, ``url`` and ``aliases`` become names that
            :func:`find`, :func:`vitkit.load_pretrained` and :func:`vitkit.create_model` accept;
            its tag (the part of the name after the model) is what ``create_model(model,
            pretrained=TAG)`` takes when ``entry.model`` is set.
    """
    old = _TABLE.pop(entry.name, None)
    if old is not None:
        for key in [k for k, v in _INDEX.items() if v == old.name]:
            del _INDEX[key]
    _TABLE[entry.name] = entry
    for spelling in (entry.name, entry.url, *entry.aliases, *(f"{a}.npz" for a in entry.aliases)):
        _INDEX[spelling.lower()] = entry.name
    if entry.url.startswith("https://storage.googleapis.com/"):
        _INDEX["gs://" + entry.url[len("https://storage.googleapis.com/") :].lower()] = entry.name


for _entry in (*_OFFICIAL, *_AUGREG, *_HUB, *_RELEASES):
    register_pretrained(_entry)


def list_pretrained(model: str | None = None) -> list[Pretrained]:
    """The known weights, all or those of one vitkit model name.

    Args:
        model: a vitkit model name as the entries record it (``"vit_b16"``), compared exactly;
            None: every entry.

    Returns:
        The entries, in the order they were registered (a replacement comes last, not where the
        entry it replaced was).
    """
    return [e for e in _TABLE.values() if model is None or e.model == model]


def find(name: str) -> Pretrained | None:
    """The entry a name, alias or address stands for, or None.

    Args:
        name: an entry's name (``vit_b16.augreg_in21k_ft_in1k``), one of its aliases (a release
            file name such as ``imagenet21k/ViT-B_16``, with or without ``.npz``) or its address
            (``https://``, ``gs://`` or ``hf-hub:``). Case and surrounding spaces are ignored.

    Returns:
        The entry, or None when nothing is known by that spelling.
    """
    key = _INDEX.get(name.strip().lower())
    return _TABLE[key] if key is not None else None


def for_model(model: str, tag: str | bool) -> Pretrained:
    """The weights ``create_model(model, pretrained=tag)`` means: a tag of that model (``True``:
    its default, the ImageNet-1k fine-tuned AugReg file where there is one).

    Args:
        model: a vitkit model name as the entries record it (``"vit_b16"``).
        tag: the tag (``"in21k"``) or the full name of one of the model's entries; ``True``: the
            first of the tags ``augreg_in21k_ft_in1k``, ``in21k_ft_in1k``, ``augreg_in21k`` and
            ``in21k`` the model has, else its first entry.

    Returns:
        The entry.

    Raises:
        UsageError: no weights are known for ``model``, or none with that tag (the message
            lists the model's tags).
    """
    own = list_pretrained(model)
    if tag is True:
        for preferred in ("augreg_in21k_ft_in1k", "in21k_ft_in1k", "augreg_in21k", "in21k"):
            for e in own:
                if e.tag == preferred:
                    return e
        if own:
            return own[0]
        raise UsageError(f"no pretrained weights known for {model}; `vitkit models --pretrained` lists them")
    for e in own:
        if e.tag == tag or e.name == tag:
            return e
    tags = ", ".join(e.tag for e in own) or "none"
    raise UsageError(f"{model} has no pretrained tag {tag!r} (known: {tags})")


def suggestions(name: str) -> list[str]:
    """Names close to ``name``: the variants of a release file name (``ViT-B_16`` ->
    ``imagenet21k/ViT-B_16``...), else the closest spellings.

    Args:
        name: the name that resolved to nothing.

    Returns:
        The first alias of every entry with a spelling that ends in ``/`` and ``name`` (case
        ignored), sorted; when there is none, up to three entry names or first aliases that
        :func:`difflib.get_close_matches` finds close to ``name`` (cutoff 0.5). Possibly empty.
    """
    key = name.strip().lower()
    variants = sorted({_TABLE[v].aliases[0] for k, v in _INDEX.items() if k.endswith("/" + key) and _TABLE[v].aliases})
    spellings = [*_TABLE, *(a for e in _TABLE.values() for a in e.aliases[:1])]
    return variants or difflib.get_close_matches(name.strip(), spellings, n=3, cutoff=0.5)


def unknown(name: str) -> UsageError:
    """The error for a name nothing resolves, with close names suggested.

    Args:
        name: the name that resolved to nothing.

    Returns:
        A :class:`~vitkit.errors.UsageError`, for the caller to raise: one line naming ``name``,
        the :func:`suggestions` if any, and the names and addresses that are accepted.
    """
    close = suggestions(name)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return UsageError(
        f"{name!r}: no such file or folder, nor known pretrained weights{hint} (`vitkit models --pretrained` "
        "lists the names; hf-hub:org/name, gs:// and http(s):// addresses work too)"
    )


def rows(entries: list[Pretrained]) -> list[dict[str, object]]:
    """The table ``vitkit models --pretrained`` prints (and writes as JSON).

    Args:
        entries: the entries to list, such as :func:`list_pretrained` gives.

    Returns:
        One JSON-ready dict an entry, in the order given, with the keys ``name``, ``model``,
        ``source``, ``resolution`` (pixels a side), ``data`` (``"PRETRAIN -> FINETUNE"``, or the
        pre-training data alone), ``top1`` (%, or None), ``top1_source``, ``licence``, ``url``,
        ``aliases`` (a list) and ``preprocessing`` (:meth:`Preprocessing.to_dict`, or None where the
        entry carries none).
    """
    return [
        {
            "name": e.name,
            "model": e.model,
            "source": e.source,
            "resolution": e.resolution,
            "data": e.pretrain + (f" -> {e.finetune}" if e.finetune else ""),
            "top1": e.top1,
            "top1_source": e.top1_source,
            "licence": e.licence,
            "url": e.url,
            "aliases": list(e.aliases),
            "preprocessing": e.preprocessing.to_dict() if e.preprocessing is not None else None,
        }
        for e in entries
    ]


__all__ = [
    "Pretrained",
    "find",
    "for_model",
    "list_pretrained",
    "register_pretrained",
    "rows",
    "suggestions",
    "unknown",
]
