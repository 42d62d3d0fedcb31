"""Names to files: a path stays a path; a known name, an ``hf-hub:`` id, a ``gs://`` path or an
``http(s)://`` address becomes a file in a cache, downloaded once. Then the file goes through
:func:`vitkit.checkpoint.load_pretrained`, the same safe readers as a file given by path."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, UsageError
from ..preprocessing import Preprocessing
from . import cache, verify
from .download import Progress, download
from .hf import PREFIX as HF_PREFIX
from .hf import fetch_hub
from .names import Pretrained, find, for_model, list_pretrained, suggestions, unknown

if TYPE_CHECKING:
    from torch import nn

WEIGHT_SUFFIXES = (".npz", ".safetensors", ".bin", ".pth", ".pt")
ADDRESS_PREFIXES = (HF_PREFIX, "gs://", "https://", "http://")


@dataclass
class Resolved:
    """Where a name's weights are on disk, and what the name says about them.

    Attributes:
        path: the weight file on disk.
        name: the name asked for; None: a plain path.
        address: where the file came from (None for a plain path).
        entry: the known entry the name stands for, if any (:func:`vitkit.hub.find`).
        model: the vitkit model the weights fit, where known.
        preprocessing: the inputs the weights expect, where the entry or the repository says.
    """

    path: Path
    name: str | None = None  # the name asked for; None: a plain path
    address: str | None = None  # where the file came from
    entry: Pretrained | None = None
    model: str | None = None  # the vitkit model the weights fit, where known
    preprocessing: Preprocessing | None = None


def is_address(text: str) -> bool:
    """Whether ``text`` is an address rather than a name or a path.

    Args:
        text: a ``--weights`` value, a name or a path.

    Returns:
        True when it starts with ``hf-hub:``, ``gs://``, ``https://`` or ``http://`` (case matters).
    """
    return text.startswith(ADDRESS_PREFIXES)


def _is_file_name(text: str) -> bool:
    return text.lower().endswith(WEIGHT_SUFFIXES)


def _looks_like_path(text: str) -> bool:
    return _is_file_name(text) or "/" in text or os.sep in text or text.startswith((".", "~"))


def _names_weights(text: str) -> bool:
    """``text`` is a known name, an address or a file, rather than a tag of a model."""
    return find(text) is not None or is_address(text) or _is_file_name(text) or Path(text).exists()


def resolve(name_or_path: str | os.PathLike[str], *, progress: Progress | None = None) -> Resolved:
    """The local file for a path, name or address, downloading it into the cache if need be.

    An address's format is the suffix of its file name, query string and fragment aside
    (``https://h/w.npz?token=abc`` is an ``.npz`` file, fetched with its query); an address whose
    name has no weight suffix is refused before anything is downloaded.

    An existing path, a :class:`~pathlib.Path`, or a string that looks like one (a folder
    separator, a leading ``.`` or ``~``, a weight suffix such as ``.npz``) and names nothing known
    is a path, as before names existed: a missing one is the reader's "no such file or folder"
    (with close names, if any). Any other unknown name is a :class:`~vitkit.errors.UsageError`
    suggesting close ones.

    Args:
        name_or_path: a file or folder, a known name, an ``hf-hub:`` id, a ``gs://`` path or an
            ``http(s)://`` address.
        progress: called with (bytes so far, total or None) during a download.

    Returns:
        The file on disk, with what the name says about it.

    Raises:
        DownloadError: a download that failed or was refused, or a cached file that fails its
            checks (naming the cache file).
        UsageError: an unknown name, or an address whose file name has no weight suffix.
    """
    text = os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or Path(text).exists():
        return Resolved(Path(text))
    entry = find(text)
    if entry is None and not is_address(text):
        if not _looks_like_path(text):
            raise unknown(text)
        close = suggestions(text)
        if close:
            raise CheckpointError(f"{text}: no such file or folder; or did you mean {', '.join(close)}?")
        return Resolved(Path(text))  # a missing file: the reader says so, as it always did
    url = entry.url if entry is not None else text
    model = entry.model if entry is not None else None
    pre = entry.preprocessing if entry is not None else None
    if url.startswith(HF_PREFIX):
        files = fetch_hub(url)
        return Resolved(files.weights, text, url, entry, model or files.model, files.preprocessing or pre)
    if cache.weight_suffix(url) not in verify.SUFFIXES:
        raise UsageError(
            f"{url}: the file name {cache.file_name(url)!r} ends in none of {', '.join(verify.SUFFIXES)}, "
            "the suffixes that tell the weight format; nothing was downloaded"
        )
    sha256, size = (entry.sha256, entry.size) if entry is not None else (None, None)
    path = download(url, cache.cache_path(url), sha256=sha256, size=size, progress=progress)
    return Resolved(path, text, cache.https_address(url), entry, model, pre)


def _cached_note(target: Resolved) -> str:
    """What an error about a downloaded file adds: which cache it is in, and how to refresh it."""
    if target.address is not None and target.address.startswith(HF_PREFIX):
        return (
            f"the file is in the Hugging Face cache for {target.address}: if it is damaged, delete "
            f"{target.path.resolve()} to download it again"
        )
    return f"the file is the cached copy of {target.address}: if it is damaged, delete it to download it again"


def load_pretrained(
    path: str | os.PathLike[str],
    name: str | None = None,
    pos_embed_mode: str = "bilinear",
    num_heads: int | None = None,
    *,
    allow_nonfinite: bool = False,
    progress: Progress | None = None,
    **overrides: Any,
) -> nn.Module:
    """:func:`vitkit.checkpoint.load_pretrained` for names too: ``path`` may be a file or folder
    (read exactly as before), a known name (``vit_b16.augreg_in21k_ft_in1k``,
    ``imagenet21k/ViT-B_16``, an AugReg file name; ``vitkit models --pretrained`` lists them), an
    ``hf-hub:org/name`` id, a ``gs://`` path or an ``http(s)://`` address. Named weights are
    downloaded once into the cache (:mod:`vitkit.hub.cache`) and come with their preprocessing
    (mean/std, crop fraction, interpolation) as ``model.preprocessing``; the model they fit is
    checked (``name`` overrides it). ``progress(bytes, total)`` follows a download.

    Args:
        path: a file or folder, a known name, an ``hf-hub:org/name[@revision]`` id, a ``gs://``
            path or an ``http(s)://`` address (see :func:`resolve`).
        name: the vitkit model the weights must fit (``"vit_b16"``); None: the model the name
            stands for, else the architecture read from the file.
        pos_embed_mode: how the position embeddings are resized when ``img_size`` is overridden:
            "bilinear" (the official method) or "bicubic".
        num_heads: the attention heads, for files that do not record them (timm tensors, Hugging
            Face weights without ``config.json``); a file that records them must agree.
        allow_nonfinite: load weights that hold NaN or inf instead of refusing them.
        progress: called with (bytes so far, total or None) during a download.
        **overrides: config fields, as for :func:`vitkit.checkpoint.load_pretrained`:
            ``img_size`` resizes the position embeddings, ``num_classes`` replaces the head with a
            zero-initialised one, ``features_only`` (with ``out_indices``) returns feature maps;
            others (dropout rates...) are set as given.

    Returns:
        The model, in eval mode, with ``.load_report`` (whose ``name`` is the name asked for,
        for named weights) and ``.preprocessing``: the named entry's or the hub repository's
        where known, at the model's ``img_size``; otherwise what the file records, else the
        paper's [-1, 1] range.

    Raises:
        UsageError: an unknown name, or an address whose file name has no weight suffix.
        DownloadError: a download that failed or was refused, or a damaged file in a cache.
        CheckpointError: a file that cannot be read or does not fit; for a downloaded one, the
            message says which cache holds it and to delete it to download it again.
    """
    from ..checkpoint import load_pretrained as load_file

    target = resolve(path, progress=progress)
    options = {"pos_embed_mode": pos_embed_mode, "num_heads": num_heads, "allow_nonfinite": allow_nonfinite}
    if target.name is None:
        return load_file(target.path, name, **options, **overrides)
    try:
        model = load_file(target.path, name or target.model, **options, **overrides)
    except CheckpointError as e:
        raise CheckpointError(f"{e} ({_cached_note(target)})") from None
    if target.preprocessing is not None:
        model.preprocessing = dataclasses.replace(target.preprocessing, img_size=tuple(model.cfg.img_size))
    model.load_report.name = target.name
    return model


def create_model(name: str, pretrained: bool | str = False, **overrides: Any) -> nn.Module:
    """:func:`vitkit.models.create_model`, with weights when ``pretrained`` is given: ``True``
    (the model's default weights, the ImageNet-1k fine-tuned AugReg file where there is one), a tag
    of the model (``"in21k"``, ``"augreg_in21k_ft_in1k"``...), or any name, address or file
    :func:`load_pretrained` takes (checked to fit ``name``). ``overrides`` as for
    :func:`load_pretrained` (``img_size`` resizes the position embeddings, ``num_classes``
    replaces the head).

    Args:
        name: a vitkit model name or a paper spelling (``"vit_b16"``, ``"ViT-B/16"``).
        pretrained: False or None for random weights; ``True``, a tag of the model, or a name,
            address or file as above.
        **overrides: config fields: for random weights, as :func:`vitkit.models.create_model`
            takes them; with weights, as :func:`load_pretrained` takes them.

    Returns:
        The model: with random weights as :func:`vitkit.models.create_model` builds it, or
        loaded (in eval mode, with ``.load_report`` and ``.preprocessing``) as
        :func:`load_pretrained` returns it.

    Raises:
        ValueError: an unknown model name (suggesting close ones).
        UsageError: a ``pretrained`` string that is neither weights nor a tag of the model (the
            message lists its tags), or ``True`` for a model without known weights.
        DownloadError: a download that failed or was refused.
        CheckpointError: weights that cannot be read or do not fit ``name``.
    """
    from ..models import canonical_name, model_config
    from ..models import create_model as create_random

    if pretrained is False or pretrained is None:
        return create_random(name, **overrides)
    key = canonical_name(name)
    model_config(key)  # an unknown model name fails here, with its suggestions
    is_tag = isinstance(pretrained, str) and any(e.tag == pretrained for e in list_pretrained(key))
    if isinstance(pretrained, str) and not is_tag and _names_weights(pretrained):
        return load_pretrained(pretrained, name=key, **overrides)
    entry = for_model(key, pretrained)
    return load_pretrained(entry.name, name=key, **overrides)


__all__ = ["Resolved", "create_model", "is_address", "load_pretrained", "resolve"]
