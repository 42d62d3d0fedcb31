"""One file over HTTP(S) into the cache: atomic, resumable, verified.

The body goes to ``.NAME.download.tmp`` beside the final file and is renamed to ``NAME`` only
when it is verified: whole (the size the server announced, and the table's), not text (an HTML
error page served with status 200 is refused as a web page), matching every checksum known for
it (the table's sha256, and the MD5 that Google Cloud Storage publishes in ``x-goog-hash``; it
also publishes a CRC32C there, which the standard library cannot compute), and a valid file of
the format its name gives (:mod:`vitkit.hub.verify`: a safetensors header that covers the file,
a zip of arrays whose CRC32s match...). A body of unknown length is accepted only if its format
checks it. So a file under its final name is always complete; a partial or refused one is never
mistaken for it, and a later call downloads again. A cached file is checked again (its format and
size) each time it is used; one that fails is an error naming it and saying to delete it.

An interrupted download keeps its partial file and continues with an HTTP ``Range`` request
(guarded by ``If-Range`` with the ETag of the first answer, so a file that changed on the server
starts over), within the same call (a few attempts) and in a later one.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import http.client
import json
import os
import re
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DownloadError
from ..files import write_json
from . import cache, verify

CHUNK = 1 << 20
ATTEMPTS = 3
USER_AGENT = "vitkit"

Progress = Callable[[int, int | None], None]  # (bytes so far, total or None)


@dataclass
class _Answer:
    """What one request got: how much of the file is now on disk and what the server said of it."""

    total: int | None
    etag: str | None
    md5: str | None  # base64, from x-goog-hash
    complete: bool
    content_type: str | None = None


def partial_path(dest: Path) -> Path:
    """The partial download of ``dest`` (a name :func:`vitkit.files.temporary_target` recognises).

    Args:
        dest: the cache file a download is for.

    Returns:
        ``.NAME.download.tmp`` in the folder of ``dest``, where ``NAME`` is the file name of
        ``dest``: the body received so far, which a later download resumes from.
    """
    return dest.parent / f".{dest.name}.download.tmp"


def _state_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.state.tmp"


def _write(f, chunk: bytes) -> None:
    """Every byte of a download is written here (one place, so tests can fill the disk)."""
    f.write(chunk)


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    size: int | None = None,
    timeout: float | None = None,
    attempts: int = ATTEMPTS,
    progress: Progress | None = None,
) -> Path:
    """Fetch ``url`` (its :func:`cache.fetch_address`, so ``VITKIT_MIRROR`` applies) to ``dest``
    unless ``dest`` is already there.

    The body is verified before it is renamed to ``dest`` (see the module's description); a body
    that fails is deleted and refused, and nothing is cached under ``dest``. A ``dest`` already
    there is checked again (format and size) and refused, naming it, if it fails. A dropped
    connection resumes up to ``attempts`` times. Offline (``VITKIT_OFFLINE``), a missing ``dest``
    is an error naming it and ``url``.

    Args:
        url: an ``http(s)://`` or ``gs://`` address (a query string is sent as given).
        dest: the cache file; its suffix names the format the body must have.
        sha256: the file's sha256 (hex), where known.
        size: the file's size in bytes, where known.
        timeout: seconds to wait for the server (default ``VITKIT_DOWNLOAD_TIMEOUT``, else 30).
        attempts: requests made before a broken download is left to resume in a later call.
        progress: called with (bytes so far, total or None) as the body arrives.

    Returns:
        ``dest``.

    Raises:
        DownloadError: one line naming the address and the cache file.
        UsageError: a timeout out of range (``VITKIT_DOWNLOAD_TIMEOUT`` or ``timeout``).
    """
    address = cache.fetch_address(url)
    wait = cache.timeout() if timeout is None else cache.check_timeout(timeout)
    if dest.is_file():
        _check_cached(address, dest, size)
        return dest
    if cache.offline():
        raise DownloadError(
            f"{dest}: not in the cache and VITKIT_OFFLINE is set; it would be downloaded from {address}"
        )
    part = partial_path(dest)
    try:
        _prepare(address, dest)
        with _locked(dest):  # ranks of one torchrun job asking for the same file: one downloads, the others wait
            if dest.is_file():  # verified by the process that downloaded it
                return dest
            for attempt in range(max(1, attempts)):
                last = attempt == max(1, attempts) - 1
                answer = _attempt(address, part, _state_path(dest), wait, progress, last=last)
                if answer.complete:
                    break
            else:
                raise DownloadError(
                    f"{address}: the download did not complete in {attempts} attempts; nothing cached at {dest} "
                    "(run again to resume)"
                )
            _verify(address, dest, part, answer, sha256, size)
            os.replace(part, dest)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_state_path(dest))
    except OSError as e:  # the network's errors are DownloadErrors by now: this is the cache folder
        raise _cache_error(address, dest, e) from None
    return dest


def _check_cached(address: str, dest: Path, size: int | None) -> None:
    """A cached file is still what was verified when it was downloaded: its size (where the table
    gives one), not text, and a valid file of its format (headers and directories only, so this
    is cheap; the checksums were checked when it was downloaded)."""
    try:
        actual = dest.stat().st_size
        problem = f"{actual} bytes, the table gives {size}" if size is not None and actual != size else None
        problem = (
            problem
            or verify.text_body(dest)
            or verify.format_problem(dest, dest.suffix, length_known=True, members=False)
        )
    except OSError as e:
        problem = f"it cannot be read ({e.strerror or type(e).__name__})"
    if problem:
        raise DownloadError(
            f"{dest}: the cached copy of {address} fails verification: {problem}; delete it (rm '{dest}') "
            "to download it again"
        )


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """An exclusive lock on ``.NAME.lock`` beside ``dest`` (kept, so every process locks the same
    file); without ``fcntl`` (Windows), no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(dest.parent / f".{dest.name}.lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _prepare(address: str, dest: Path) -> None:
    """The cache folder exists and takes files, and no folder stands where ``dest`` goes; else
    one line naming ``dest`` (see :func:`_cache_error`)."""
    if dest.is_dir():
        raise _cache_error(address, dest, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    os.unlink(probe)


def _cache_error(address: str, dest: Path, e: OSError) -> DownloadError:
    """A failure to write the cache, as one line naming the cache file (never a temporary beside
    it) and what stands in the way."""
    blocker = _file_in_the_way(dest)
    if blocker is not None:
        why, fix = f"{blocker} is a file, not a folder", f"remove {blocker}, or set VITKIT_CACHE to another folder"
    elif dest.is_dir():
        why, fix = "a folder is there", f"remove the folder {dest}, or set VITKIT_CACHE to another folder"
    else:
        why, fix = e.strerror or type(e).__name__, "set VITKIT_CACHE to a folder you can write"
    return DownloadError(f"{address}: cannot keep the download at {dest} ({why}); {fix}")


def _file_in_the_way(dest: Path) -> Path | None:
    """The nearest folder of ``dest`` that exists as something other than a folder, if any."""
    for parent in dest.parents:
        if parent.exists() or parent.is_symlink():
            return None if parent.is_dir() else parent
    return None


def _attempt(address: str, part: Path, state: Path, wait: float, progress: Progress | None, last: bool) -> _Answer:
    """One request: from the start, or from the end of ``part``. A dropped connection returns an
    incomplete answer (``last``: raises instead); HTTP errors and timeouts raise at once."""
    have = part.stat().st_size if part.is_file() else 0
    known = _read_state(state) if have else {}
    if have and not known.get("etag"):
        # Nothing can tell whether the file on the server is the one the partial bytes came from
        # (If-Range needs a validator): appending could splice two versions. Start over.
        _discard(part, state)
        have = 0
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        headers["If-Range"] = known["etag"]
    answer = _Answer(None, None, None, complete=False)
    try:
        with urllib.request.urlopen(urllib.request.Request(address, headers=headers), timeout=wait) as resp:
            offset, answer.total = _span(resp, have)
            answer.etag, answer.md5 = resp.headers.get("ETag"), _goog_md5(resp.headers)
            answer.content_type = resp.headers.get("Content-Type")
            if offset == 0:
                write_json(state, {"url": address, "etag": answer.etag, "total": answer.total})
            got = _receive(resp, part, offset, answer.total, progress)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the partial file is longer than this file: start over
            _discard(part, state)
            return answer
        why = "not found" if e.code == 404 else (e.reason or "error")
        raise DownloadError(f"{address}: HTTP {e.code} ({why})") from None
    except TimeoutError:  # socket.timeout: waiting for the answer or for the next bytes
        raise DownloadError(
            f"{address}: no answer for {wait:g} s, the server stalled (a partial download is kept and resumes; "
            "raise VITKIT_DOWNLOAD_TIMEOUT or use VITKIT_MIRROR)"
        ) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise DownloadError(f"{address}: no answer for {wait:g} s (raise VITKIT_DOWNLOAD_TIMEOUT)") from None
        raise DownloadError(
            f"cannot reach {address} ({_reason(e.reason)}); without a network, VITKIT_OFFLINE=1 uses the cache only"
        ) from None
    except (http.client.HTTPException, ConnectionError) as e:  # dropped mid-body: what arrived is in `part`
        if not last:
            return answer
        dest = part.parent / _final_name(part)
        got = part.stat().st_size if part.is_file() else 0
        if isinstance(e, http.client.IncompleteRead) and answer.total is not None:
            why = f"the server announced {answer.total} bytes and sent {got}"
        else:
            why = f"the connection broke ({type(e).__name__}) after {got} bytes"
        raise DownloadError(f"{address}: {why}; nothing cached at {dest} (run again to resume)") from None
    total = answer.total
    answer.complete = total is None or got == total
    if not answer.complete and last:
        dest = part.parent / _final_name(part)
        raise DownloadError(
            f"{address}: the server announced {total} bytes and sent {got}; nothing cached at {dest} "
            "(run again to resume)"
        )
    return answer


def _span(resp, have: int) -> tuple[int, int | None]:
    """Where this answer's body starts in the file, and the file's size (None if not announced)."""
    length = resp.headers.get("Content-Length")
    if resp.status == 206:
        m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", (resp.headers.get("Content-Range") or "").strip())
        if not m or int(m.group(1)) != have:
            raise DownloadError(f"{resp.url}: the server resumed at an unexpected place ({m and m.group(0)})")
        return have, int(m.group(3)) if m.group(3) != "*" else None
    return 0, int(length) if length and length.isdigit() else None


def _receive(resp, part: Path, offset: int, total: int | None, progress: Progress | None) -> int:
    """Append (``offset`` > 0) or write the body to ``part``, fsynced; the bytes now in ``part``.
    A full disk removes the partial file (it would only hold the space the user needs back)."""
    got = offset
    try:
        with open(part, "ab" if offset else "wb") as f:
            while chunk := resp.read(CHUNK):
                _write(f, chunk)
                got += len(chunk)
                if progress is not None:
                    progress(got, total)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        _discard(part, _state_path_of(part))
        need = f" (the file is {total} bytes)" if total else ""
        raise DownloadError(
            f"{part.parent / _final_name(part)}: no space left on device while downloading {resp.url}{need}; "
            "the partial file was removed"
        ) from None
    return got


def _final_name(part: Path) -> str:
    return part.name[1 : -len(".download.tmp")]


def _state_path_of(part: Path) -> Path:
    return _state_path(part.parent / _final_name(part))


def _verify(address: str, dest: Path, part: Path, answer: _Answer, sha256: str | None, size: int | None) -> None:
    """Everything known of the finished ``part`` before it may become ``dest``: its size, that it
    is not text, its checksums, its format (from ``dest``'s suffix). A failure deletes it and
    refuses the file in one line naming the address and ``dest``."""
    actual = part.stat().st_size
    sizes = []
    for what, expected in (("the server announced", answer.total), ("the table gives", size)):
        if expected is not None and actual != expected:
            sizes.append(f"{actual} bytes, {what} {expected}")
    problem = f"the download is damaged ({'; '.join(sizes)})" if sizes else None
    problem = problem or verify.text_body(part, answer.content_type)
    if problem is None and (sha256 or answer.md5):
        digests = _digests(part)
        sums = []
        if sha256 and digests["sha256"].hexdigest() != sha256.lower():
            sums.append(f"sha256 {digests['sha256'].hexdigest()}, the table gives {sha256.lower()}")
        md5 = base64.b64encode(digests["md5"].digest()).decode()
        if answer.md5 and md5 != answer.md5:
            sums.append(f"MD5 {md5}, the server's x-goog-hash gives {answer.md5}")
        problem = f"the download is damaged ({'; '.join(sums)})" if sums else None
    if problem is None:
        length_known = answer.total is not None or size is not None or bool(sha256) or bool(answer.md5)
        problem = verify.format_problem(part, dest.suffix, length_known=length_known)
        if problem is not None and answer.total is None:
            problem += " (the server announced no length: the body may have been cut short)"
    if problem is not None:
        _discard(part, _state_path(dest))
        raise DownloadError(f"{address}: {problem}; refused, nothing cached at {dest}")


def _digests(path: Path) -> dict[str, Any]:
    out = {"sha256": hashlib.sha256(), "md5": hashlib.md5(usedforsecurity=False)}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for h in out.values():
                h.update(chunk)
    return out


def _goog_md5(headers) -> str | None:
    """The base64 MD5 of the whole object from Google Cloud Storage's ``x-goog-hash`` headers
    (``crc32c=...,md5=...``; absent for composite objects, which carry only the CRC32C)."""
    for value in headers.get_all("x-goog-hash") or []:
        for item in value.split(","):
            key, _, digest = item.strip().partition("=")
            if key == "md5" and digest:
                return digest
    return None


def _read_state(state: Path) -> dict:
    try:
        d = json.loads(state.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return d if isinstance(d, dict) else {}


def _discard(part: Path, state: Path) -> None:
    for p in (part, state):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _reason(reason: object) -> str:
    if isinstance(reason, socket.gaierror):
        return "the host name does not resolve"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason)


__all__ = ["download", "partial_path"]
