"""``hf-hub:org/name[@revision]``: weights from the Hugging Face hub through ``huggingface_hub``,
kept in the hub's own cache (so files transformers and timm downloaded are reused, and the other
way round).

A repository gives its weights (``model.safetensors``, else ``pytorch_model.bin``, read with
``weights_only``) and ``config.json``, and the preprocessing it documents: timm's
``pretrained_cfg`` in ``config.json``, or transformers' ``preprocessor_config.json``. The hub
names each large file by its sha256 (the blob of the cache); that is checked before the file is used.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint import values
from ..checkpoint.peers import hf_preprocessing, timm_model_name, timm_preprocessing
from ..errors import CheckpointError, DownloadError, UsageError
from ..preprocessing import Preprocessing
from . import cache

PREFIX = "hf-hub:"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ENDPOINT = "https://huggingface.co"


@dataclass
class HubFiles:
    """What a hub repository holds for vitkit.

    Attributes:
        weights: the weight file in the hub cache (``model.safetensors``, else
            ``pytorch_model.bin``).
        model: the vitkit model of a timm repository's architecture (timm files do not record
            their heads); None for other repositories.
        preprocessing: the preprocessing the repository documents, or None.
    """

    weights: Path
    model: str | None  # the vitkit model of a timm architecture (timm files do not record their heads)
    preprocessing: Preprocessing | None


def parse(spec: str) -> tuple[str, str | None]:
    """``hf-hub:org/name@rev`` -> (``org/name``, ``rev`` or None).

    Args:
        spec: ``hf-hub:org/name``, optionally followed by ``@revision`` (a branch, tag or commit).

    Returns:
        The repository id and the revision (None without one).

    Raises:
        UsageError: the repository is not ``org/name`` (letters, digits, ``_``, ``.`` and ``-``),
            or the revision is not a name git allows (``..`` in it, say).
    """
    repo, _, revision = spec[len(PREFIX) :].strip().partition("@")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise UsageError(f"{spec}: a hub name is hf-hub:org/name (optionally @revision)")
    if revision and not _is_git_ref(revision):
        shown = revision.encode("unicode_escape").decode()[:80]
        raise UsageError(
            f"hf-hub:{repo}: the revision {shown!r} is not a branch, tag or commit name "
            "(git's rules: no '..', spaces, control characters or ~^:?*[\\)"
        )
    return repo, revision or None


def _is_git_ref(name: str) -> bool:
    """Whether ``name`` may name a git branch, tag or commit (``git check-ref-format``'s rules):
    a revision is joined into paths of the hub cache, so ``..`` must not reach past it."""
    if name.startswith(("/", "-")) or name.endswith(("/", ".", ".lock")):
        return False
    if any(bad in name for bad in ("..", "//", "@{", "/.")) or name.startswith("."):
        return False
    return not any(c.isspace() or ord(c) < 32 or ord(c) == 127 or c in "~^:?*[\\" for c in name)


def fetch_hub(spec: str) -> HubFiles:
    """Download (or find in the hub cache) what ``spec`` names; offline (``HF_HUB_OFFLINE`` or
    ``VITKIT_OFFLINE``) the cache only, a missing file being one line naming it and its address.

    Args:
        spec: ``hf-hub:org/name``, optionally ``@revision``.

    Returns:
        The weights (``model.safetensors``, else ``pytorch_model.bin``) in the hub cache, checked
        against the sha256 the cache names them by; for a timm repository (its ``config.json``
        has an ``architecture``) the vitkit model of that architecture, else None; and the
        preprocessing the repository documents (timm's ``pretrained_cfg``, or transformers'
        ``preprocessor_config.json``), or None.

    Raises:
        UsageError: a malformed ``spec``.
        DownloadError: no weight file (offline: none cached), a gated or missing repository, a
            missing revision, another failure of the hub or the network, or a cached file whose
            sha256 does not match (the message says which file to delete).
        CheckpointError: a ``config.json`` or ``preprocessor_config.json`` that is not JSON, or
            whose preprocessing values are not valid.
    """
    repo, revision = parse(spec)
    why: list[str] = []
    config_path = _get(repo, "config.json", revision, why)
    weights = None
    for filename in WEIGHT_FILES:
        weights = _get(repo, filename, revision, why)
        if weights is not None:
            break
    if weights is None:
        address = f"{ENDPOINT}/{repo}/resolve/{revision or 'main'}/{WEIGHT_FILES[0]}"
        if cache.hf_offline():
            raise DownloadError(
                f"{spec}: {WEIGHT_FILES[0]} is not in the Hugging Face cache ({cache.hf_cache_dir()}) and the hub is "
                f"offline (HF_HUB_OFFLINE / VITKIT_OFFLINE); it would come from {address}"
            )
        raise DownloadError(f"{spec}: no {' or '.join(WEIGHT_FILES)} at {address} ({why[-1] if why else 'not found'})")
    _check_blob(weights, spec)
    config = _json(config_path) if config_path is not None else None
    model, pre = None, None
    if config is not None and "architecture" in config:  # a timm repository
        model = timm_model_name(str(config["architecture"]))
        pre = timm_preprocessing(config.get("pretrained_cfg"), config_path)
    elif config is not None:
        proc = _get(repo, "preprocessor_config.json", revision, why)
        pre = hf_preprocessing(_json(proc), proc) if proc is not None else None
    return HubFiles(weights, model, pre)


def _get(repo: str, filename: str, revision: str | None, why: list[str]) -> Path | None:
    """One file of the repository, or None if it has none (or offline, none cached); other
    failures (no such repository, no network and nothing cached) are one line."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(
            hf_hub_download(
                repo,
                filename,
                revision=revision,
                cache_dir=cache.hf_cache_dir(),
                local_files_only=cache.hf_offline(),
            )
        )
    except LocalEntryNotFoundError as e:  # offline, or the hub unreachable, and not cached
        why.append(_first_line(e))
        return None
    except EntryNotFoundError:
        return None
    except GatedRepoError:
        raise DownloadError(f"hf-hub:{repo} is gated: accept its terms on the hub and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise DownloadError(f"hf-hub:{repo}: no such repository on the hub (or it is private)") from None
    except RevisionNotFoundError:
        raise DownloadError(f"hf-hub:{repo}: no revision {revision!r}") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise DownloadError(f"hf-hub:{repo}/{filename}: {_first_line(e)}") from None


def _check_blob(path: Path, spec: str) -> None:
    """The weight file is whole before anything reads it: first its format's own structure (a
    safetensors header that covers the file, a zip directory: a truncated download fails here at
    once, whatever its size), then, for a large (LFS) file the hub stores as ``blobs/<sha256>``,
    that it hashes to its name."""
    from . import verify

    try:
        problem = verify.text_body(path) or verify.format_problem(path, path.suffix, length_known=True, members=False)
    except OSError as e:
        problem = f"it cannot be read ({e.strerror or type(e).__name__})"
    if problem is not None:
        raise DownloadError(
            f"{spec}: {path.name} in the hub cache is damaged or incomplete ({problem}); "
            f"delete {path.resolve()} to download it again"
        )
    blob = path.resolve()
    if not re.fullmatch(r"[0-9a-f]{64}", blob.name):
        return
    h = hashlib.sha256()
    with open(blob, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if h.hexdigest() != blob.name:
        raise DownloadError(
            f"{spec}: {path.name} in the hub cache is damaged (sha256 {h.hexdigest()}, expected {blob.name}); "
            f"delete {blob} to download it again"
        )


def _json(path: Path) -> dict[str, Any]:
    """A JSON object from the repository, read as every config file is (bounded in size and
    nesting: :func:`vitkit.checkpoint.values.read_json_file`); anything else is one line."""
    try:
        d = values.read_json_file(path)
    except OSError as e:
        raise CheckpointError(f"{path}: not a JSON file ({_first_line(e)})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else type(e).__name__


__all__ = ["HubFiles", "fetch_hub", "parse", "timm_model_name"]
