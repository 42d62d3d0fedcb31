"""Where downloaded weights live, and the environment that steers fetching them.

- ``VITKIT_CACHE``: vitkit's cache folder (default ``$XDG_CACHE_HOME/vitkit``, else
  ``~/.cache/vitkit``). A file from ``https://HOST/PATH`` is kept at ``CACHE/HOST/PATH``.
- ``VITKIT_OFFLINE=1``: use the cache only; a missing file is an error naming it and its address.
- ``VITKIT_MIRROR``: a base address that serves the Google Cloud Storage buckets' layout (the
  official and AugReg releases, ``gs://`` paths), for machines behind a proxy or air-gapped
  networks: ``https://storage.googleapis.com/B/P`` is fetched from ``$VITKIT_MIRROR/B/P``. The
  cache keeps the original address, so a file is the same wherever it came from.
- ``VITKIT_DOWNLOAD_TIMEOUT``: seconds without an answer before a download is abandoned (30; from
  0.1 to 3600).
- The Hugging Face hub keeps its own cache, as ``huggingface_hub`` places it (``HF_HUB_CACHE``,
  else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``); ``HF_HUB_OFFLINE=1`` keeps the
  hub offline. Both are read on every call, not once at import, so a process can change them.
"""

from __future__ import annotations

import hashlib
import math
import os
import urllib.parse
from pathlib import Path

from ..errors import UsageError
from ..files import slug

GCS = "https://storage.googleapis.com"
DEFAULT_TIMEOUT = 30.0
MIN_TIMEOUT = 0.1  # seconds; less gives up on a server that is merely busy
MAX_TIMEOUT = 3600.0  # an hour without a byte is a server that will not answer
_TRUE = ("1", "true", "yes", "on")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _xdg_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()


def cache_dir() -> Path:
    """vitkit's download cache: ``VITKIT_CACHE``, else ``$XDG_CACHE_HOME/vitkit`` or ``~/.cache/vitkit``.

    Returns:
        The folder, with ``~`` expanded; read from the environment on every call, and not created
        here.
    """
    given = os.environ.get("VITKIT_CACHE")
    return Path(given).expanduser() if given else _xdg_cache() / "vitkit"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache as ``huggingface_hub`` finds it, read now rather than at its import.

    Returns:
        ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (or
        ``~/.cache/huggingface/hub``), with ``~`` expanded.
    """
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else _xdg_cache() / "huggingface") / "hub"


def offline() -> bool:
    """``VITKIT_OFFLINE`` is set: nothing is fetched, the caches are all there is.

    Returns:
        True when ``VITKIT_OFFLINE`` is ``1``, ``true``, ``yes`` or ``on`` (case and surrounding
        spaces ignored).
    """
    return _flag("VITKIT_OFFLINE")


def hf_offline() -> bool:
    """The hub is offline: ``VITKIT_OFFLINE``, ``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``).

    Returns:
        True when any of the three is ``1``, ``true``, ``yes`` or ``on`` (case and surrounding
        spaces ignored).
    """
    return offline() or _flag("HF_HUB_OFFLINE") or _flag("TRANSFORMERS_OFFLINE")


def timeout() -> float:
    """Seconds a download may wait for the server: ``VITKIT_DOWNLOAD_TIMEOUT``, default 30.

    Returns:
        The value, checked by :func:`check_timeout`.

    Raises:
        UsageError: the variable is not a number of seconds in the allowed range.
    """
    text = os.environ.get("VITKIT_DOWNLOAD_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    return check_timeout(value, "VITKIT_DOWNLOAD_TIMEOUT", text)


def check_timeout(value: float, name: str = "timeout", given: str | None = None) -> float:
    """``value`` if it is a finite number of seconds from ``MIN_TIMEOUT`` to ``MAX_TIMEOUT``.

    Args:
        value: seconds.
        name: what the error calls the setting (an environment variable, an argument).
        given: the text the value was read from, quoted in the error (default: ``value``).

    Returns:
        ``value`` as a float.

    Raises:
        UsageError: one line naming ``name``, the allowed range and what was given (infinity,
            NaN, zero, negative or huge values are all refused).
    """
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and MIN_TIMEOUT <= seconds <= MAX_TIMEOUT):
        shown = given if given is not None else value
        raise UsageError(f"{name} must be a number of seconds from {MIN_TIMEOUT:g} to {MAX_TIMEOUT:g}, got {shown!r}")
    return seconds


def https_address(url: str) -> str:
    """``gs://bucket/path`` -> its public address ``https://storage.googleapis.com/bucket/path``;
    other addresses unchanged.

    Args:
        url: any address.

    Returns:
        The ``https://`` address of a ``gs://`` path; ``url`` itself otherwise.
    """
    if url.startswith("gs://"):
        return f"{GCS}/{url[len('gs://') :]}"
    return url


def fetch_address(url: str) -> str:
    """The address a download really asks: ``VITKIT_MIRROR`` stands in for Google Cloud Storage;
    the path is percent-encoded (``+`` in ``imagenet21k+imagenet2012`` becomes ``%2B``).

    Args:
        url: an ``http(s)://`` or ``gs://`` address.

    Returns:
        The address to request: ``gs://`` as ``https://storage.googleapis.com/``, that prefix
        replaced by ``VITKIT_MIRROR`` when it is set, the path percent-encoded (letters, digits,
        ``/%:@~-._`` kept, so an address already encoded stays as it is), the query string kept
        and the fragment left out.
    """
    url = https_address(url)
    mirror = os.environ.get("VITKIT_MIRROR", "").strip().rstrip("/")
    if mirror and url.startswith(GCS + "/"):
        url = mirror + url[len(GCS) :]
    parts = urllib.parse.urlsplit(url)
    path = urllib.parse.quote(parts.path, safe="/%:@~-._")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def file_name(url: str) -> str:
    """The last part of the address's path, without its query string or fragment: what names the
    file and its format (``https://h/w.npz?token=abc#x`` -> ``w.npz``).

    Args:
        url: an ``http(s)://`` or ``gs://`` address.

    Returns:
        The file name as the server's path gives it (percent-decoded); ``""`` if the path ends in ``/``.
    """
    path = urllib.parse.urlsplit(https_address(url)).path
    return urllib.parse.unquote(path.rsplit("/", 1)[-1])


def weight_suffix(url: str) -> str:
    """The lower-cased suffix of :func:`file_name` (``.npz``, ``.safetensors``...; ``""`` if none),
    which tells the weight format of a download.

    Args:
        url: an ``http(s)://`` or ``gs://`` address.

    Returns:
        The suffix, with its dot.
    """
    return Path(file_name(url)).suffix.lower()


def cache_path(url: str) -> Path:
    """Where the file from ``url`` is kept: ``CACHE/HOST/PATH``, each part a safe file name (no
    ``..``).

    A query string is part of the address a file is kept for (two presigned links to different
    files are two entries), folded into the name before its suffix as a digest
    (``w.npz?token=abc`` -> ``w_q1a2b3c4d5e6f.npz``), so the suffix still tells the format and no
    token is written into a file name. A fragment (``#...``) is never sent to the server and is
    left out.

    Args:
        url: an ``http(s)://`` or ``gs://`` address.

    Returns:
        The cache file for it.

    Raises:
        UsageError: not such an address, or one that names no file.
    """
    parts = urllib.parse.urlsplit(https_address(url))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{url}: not an http(s):// or gs:// address")
    names = [slug(urllib.parse.unquote(p), "_") for p in parts.path.split("/") if p not in ("", ".", "..")]
    if not names:
        raise UsageError(f"{url}: the address names no file")
    if parts.query:
        last = Path(names[-1])
        digest = hashlib.sha256(parts.query.encode()).hexdigest()[:12]
        names[-1] = f"{last.stem}_q{digest}{last.suffix}"
    return cache_dir().joinpath(slug(parts.netloc.lower(), "host"), *names)


__all__ = [
    "cache_dir",
    "cache_path",
    "check_timeout",
    "fetch_address",
    "file_name",
    "hf_cache_dir",
    "hf_offline",
    "https_address",
    "offline",
    "timeout",
    "weight_suffix",
]
