"""Small fsspec helpers: open any URL, read with a size cap, write atomically.

Local files are written to a temporary name in the destination directory, flushed,
fsynced and `os.replace`d, and the directory is fsynced after the rename (fsspec's own
local transaction moves from the system temp dir, which is a copy across devices and
not atomic). Object stores get one PUT per object, which is atomic by nature (a
multipart upload appears when it completes), and create-only writes use the store's
conditional PUT (s3fs mode ``"xb"`` -> ``IfNoneMatch="*"``) where it has one.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gzip
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from pipeline_lib.errors import (
    InputError,  # re-exported: callers import it from here too
)
from pipeline_lib.storage_secrets import resolve as resolve_secrets

if TYPE_CHECKING:  # fsspec is imported on first use (~60 ms with asyncio): not by a command reading local files only
    import fsspec

CHUNK = 8 << 20


# Remote filesystems: every request gets a connect timeout, a read timeout and a bounded
# number of retries, so a hung endpoint ends in an error naming it instead of a run that
# waits (with the libraries' own defaults a paused S3 endpoint held a read here for more
# than 3 minutes without an answer). The defaults are generous for real stores; each key
# can be overridden with --storage-option (what the caller passes wins, key by key).
#
# S3 (botocore's Config, through s3fs's `config_kwargs`): a request that gets no byte for
# `read_timeout` seconds is tried again by botocore, `total_max_attempts` tries in all with
# backoff (botocore's `max_attempts`, if you pass it, counts the retries only); s3fs retries
# a timed-out call up to 4 more times on top (its `S3FileSystem.retries`, 5), so a paused
# endpoint fails a call after about 5 x 3 x 20 s + backoff, ~5 minutes, and one that refuses
# connections within seconds. S3 answers in well under a second (it keeps a long
# CompleteMultipartUpload alive with whitespace), so 20 s of silence means trouble. Shorter:
#   --storage-option config_kwargs='{"read_timeout": 5, "retries": {"total_max_attempts": 1}}'
# AWS_MAX_ATTEMPTS / AWS_RETRY_MODE in the environment keep their say over retries.
S3_CONFIG_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10,  # seconds to open a connection
    "read_timeout": 20,  # seconds without a byte from the server, per attempt
    "retries": {"total_max_attempts": 3, "mode": "standard"},  # tries per request, the first included
}
# HTTP(S) sources (an aiohttp.ClientTimeout in client_kwargs["timeout"]; pass a dict of its
# fields, e.g. client_kwargs='{"timeout": {"sock_read": 300}}'): no limit on a whole
# download (a big corpus file may take long), but connecting and every read are bounded.
HTTP_TIMEOUT_DEFAULTS: dict[str, float | None] = {"total": None, "sock_connect": 10, "sock_read": 60}


def filesystem(url: str, **storage_options: Any) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve a URL or plain path into (filesystem, path inside it).

    ``s3://`` URLs get `S3_CONFIG_DEFAULTS` and ``http(s)://`` URLs `HTTP_TIMEOUT_DEFAULTS`
    for whatever the options leave unset; an http(s) source that cannot be reached raises
    `ConnectionError` / `TimeoutError` naming its host, not fsspec's `FileNotFoundError`.

    >>> fs, path = filesystem("memory://bucket/a.txt")
    >>> path
    '/bucket/a.txt'
    """
    if not isinstance(url, str) or not url:
        raise InputError(f"cannot open {url!r}: expected a non-empty path or URL")
    protocol = url.split("://", 1)[0].lower() if "://" in url and "::" not in url else None
    storage_options = resolve_secrets(storage_options)  # secrets travel redacted (pipeline_lib.storage_secrets)
    try:
        if protocol in ("s3", "s3a"):
            storage_options = _with_s3_defaults(storage_options)
        elif protocol in ("http", "https"):
            fs = _http_filesystem(**_with_http_defaults(storage_options))
            return fs, fs._strip_protocol(url)
        from fsspec.core import url_to_fs

        return url_to_fs(url, **storage_options)
    except ImportError as e:
        raise InputError(f"cannot open {url!r}: the filesystem for it is not installed ({e})") from e
    except (ValueError, TypeError) as e:
        raise InputError(f"cannot open {url!r}: {e}") from e


def _with_s3_defaults(options: dict[str, Any]) -> dict[str, Any]:
    config = options.get("config_kwargs")
    if config is not None and not isinstance(config, dict):
        raise InputError(f"config_kwargs={config!r}: expected a JSON object of botocore Config fields")
    # Copies: botocore rewrites the retries dict it is given in place (max_attempts ->
    # total_max_attempts), which would leak into the defaults and the caller's options.
    merged = copy.deepcopy({**S3_CONFIG_DEFAULTS, **(config or {})})
    retries = (config or {}).get("retries")
    if isinstance(retries, dict):
        # The caller's own count (either spelling) replaces ours; the mode defaults to standard.
        merged["retries"] = {"mode": S3_CONFIG_DEFAULTS["retries"]["mode"], **copy.deepcopy(retries)}
        if not {"max_attempts", "total_max_attempts"} & retries.keys():
            merged["retries"]["total_max_attempts"] = S3_CONFIG_DEFAULTS["retries"]["total_max_attempts"]
    elif retries is None and (os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE")):
        del merged["retries"]  # the environment's retry settings, which an explicit Config would override
    return {**options, "config_kwargs": merged}


def _with_http_defaults(options: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    client_kwargs = dict(options.get("client_kwargs") or {})
    timeout = client_kwargs.get("timeout")
    if timeout is None or isinstance(timeout, dict):
        timeout = aiohttp.ClientTimeout(**{**HTTP_TIMEOUT_DEFAULTS, **(timeout or {})})
    elif isinstance(timeout, (int, float)):
        timeout = aiohttp.ClientTimeout(total=timeout)
    client_kwargs["timeout"] = timeout
    return {**options, "client_kwargs": client_kwargs}


def _http_filesystem(*args: Any, **options: Any) -> fsspec.AbstractFileSystem:
    """fsspec's HTTPFileSystem, telling an unreachable server from a missing file."""
    return _http_filesystem_class()(*args, **options)


@functools.cache
def _http_filesystem_class() -> type:
    # Built on first use: fsspec's HTTP filesystem imports aiohttp (an optional dependency).
    import asyncio

    import aiohttp
    from fsspec.implementations.http import HTTPFileSystem

    class _HTTPFileSystem(HTTPFileSystem):
        async def _info(self, url, **kwargs):
            # fsspec turns every failure of its HEAD/GET probe into FileNotFoundError, so a
            # refused connection or an HTTP 503 would read "no such file": keep the network
            # errors and classify the status codes (`http_status_error`).
            try:
                return await super()._info(url, **kwargs)
            except FileNotFoundError as e:
                raise _network_error(e.__cause__, url) or e from e.__cause__

        def __reduce__(self):  # the class is built at run time: unpickle through the factory
            return _unpickle_http_filesystem, (self.storage_args, self.storage_options)

    def _network_error(cause: BaseException | None, url: str) -> OSError | None:
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        host = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"  # no credentials
        if isinstance(cause, aiohttp.ClientResponseError):
            return http_status_error(cause.status, cause.message, host)
        if isinstance(cause, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            return TimeoutError(f"no response from {host} in time (connect/read timeout)")
        os_error = getattr(cause, "os_error", None)
        if isinstance(os_error, ConnectionRefusedError):
            return ConnectionRefusedError(f"connection refused by {host}")
        if isinstance(cause, aiohttp.ClientConnectionError):
            reason = os_error.strerror if isinstance(os_error, OSError) and os_error.strerror else type(cause).__name__
            return ConnectionError(f"cannot connect to {host}: {reason}")
        return None

    return _HTTPFileSystem


class HTTPStatusTransient(ConnectionError):
    """An HTTP 5xx or 429 answer: the server is failing or busy, a later try may succeed
    (a ConnectionError, so the download task's retries take it)."""


def http_status_error(status: int, reason: str | None, host: str) -> OSError | None:
    """The exception for an HTTP error `status` from `host`, one per class of cause:
    5xx / 429 transient (`HTTPStatusTransient`), 404 / 410 `FileNotFoundError`, 401 / 403
    `PermissionError`; None for the other codes (fsspec's "no such file" stands)."""
    said = f"HTTP {status}" + (f" {reason}" if reason else "") + f" from {host}"
    if status == 429:
        return HTTPStatusTransient(f"{said}: too many requests (transient, retried with backoff)")
    if 500 <= status <= 599:
        return HTTPStatusTransient(f"{said}: the server failed or is unavailable (transient, retried with backoff)")
    if status in (404, 410):
        return FileNotFoundError(f"{said}: no such file")
    if status in (401, 403):
        return PermissionError(
            f"{said}: no permission to read it (give credentials in the URL or --storage-option "
            f"client_kwargs='{{\"headers\": {{...}}}}')"
        )
    return None


def _unpickle_http_filesystem(args: tuple, options: dict[str, Any]) -> fsspec.AbstractFileSystem:
    return _http_filesystem(*args, **options)


def protocol_of(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return protocol_of(fs) in ("file", "local")


# A plain local path ending so is read without importing fsspec, as its compression="infer"
# reads it: as it is (a saved tokenizer's files, GPT-2's), or through gzip (.gz, the
# production encodings' ranks as packages ship them).
_PLAIN_SUFFIXES = (".json", ".tiktoken", ".txt", ".bpe", ".gz")


def plain_local_path(url: Any, storage_options: dict[str, Any]) -> str | None:
    """The local path `url` names when it is a plain path (no protocol, no chained URL, no
    storage options): such a path needs no fsspec. None otherwise."""
    if storage_options or not isinstance(url, str) or "://" in url or "::" in url:
        return None
    return os.path.expanduser(url)


def read_bytes(url: str, max_bytes: int | None = None, **storage_options: Any) -> bytes:
    """Read a whole (decompressed) file, refusing files larger than `max_bytes`."""
    local = plain_local_path(url, storage_options)
    if local is not None and local.endswith(_PLAIN_SUFFIXES):
        fs, path = None, local
    else:
        fs, path = filesystem(url, **storage_options)
    try:
        if fs is not None:
            opened = fs.open(path, "rb", compression="infer")
        else:
            opened = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
        with opened as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except FileNotFoundError as e:
        raise InputError(f"{url}: no such file") from e
    except IsADirectoryError as e:
        raise InputError(f"{url}: is a directory, not a file") from e
    except (OSError, EOFError) as e:
        raise InputError(f"{url}: cannot read ({e})") from e
    if max_bytes is not None and len(data) > max_bytes:
        raise InputError(f"{url}: larger than the {max_bytes:,}-byte limit for this kind of file")
    return data


def fsync_dir(path: str) -> None:
    """Make a rename or a new entry in the local directory `path` durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_stream(f: BinaryIO, copy_to: BinaryIO | None = None) -> tuple[int, str]:
    """(size, sha256 hex) of what is left in a binary stream, read in bounded chunks;
    each chunk is also written to `copy_to` if given (copy and hash in one pass)."""
    h, n = hashlib.sha256(), 0
    while chunk := f.read(CHUNK):
        h.update(chunk)
        n += len(chunk)
        if copy_to is not None:
            copy_to.write(chunk)
    return n, h.hexdigest()


def hash_file(path: str) -> tuple[int, str]:
    with open(path, "rb") as f:
        return hash_stream(f)


_VERIFIED: dict[tuple[str, int, int, int, int], str] = {}
_VERIFIED_LOCK = threading.Lock()


def check_local_file(path: str, size: int, sha256: str, label: str | None = None) -> None:
    """Check a local file against an expected size and sha256, hashing it at most once per
    process while it is unchanged (the memo is keyed by inode, size, mtime and ctime, so any
    write to the file, even one that restores its mtime, makes the next call hash it again).

    Raises `StoreError` naming `label` (default: the path) when the file is missing, has
    another size or another hash.
    """
    from pipeline_lib.errors import StoreError

    label = label or path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise StoreError(f"{label}: missing") from None
    if st.st_size != size:
        raise StoreError(f"{label}: {st.st_size:,} bytes, manifest says {size:,}: truncated or altered")
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _VERIFIED_LOCK:
        if _VERIFIED.get(key) == sha256:
            return
    got = hash_file(path)[1]
    if got != sha256:
        raise StoreError(f"{label}: sha256 mismatch: the file is corrupt or was altered")
    with _VERIFIED_LOCK:
        _VERIFIED[key] = sha256


@contextlib.contextmanager
def local_temp(directory: str, suffix: str = ".part") -> Iterator[str]:
    """A temporary file name in `directory`, removed on the way out unless it was moved."""
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@functools.cache
def _umask() -> int:
    """The process umask, read once. `os.umask` can only be read by setting it, which
    races with threads creating files, so read Linux's /proc/self/status (4.7+); elsewhere
    set 0o077 for an instant (a file created meanwhile is private, never more open)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def user_file_mode() -> int:
    """The mode `open` gives a new file (0o666 & ~umask): for files written for the user,
    where mkstemp's 0o600 would hide them from the user's group."""
    return 0o666 & ~_umask()


def _write_local_temp(directory: str, data: bytes) -> str:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), user_file_mode())
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


@contextlib.contextmanager
def atomic_user_file(path: str) -> Iterator[BinaryIO]:
    """A file written for the user (outside the store), in place of `path` only once whole: a
    temp name beside it, fsync, rename, with the mode `open` would give it (0o666 & ~umask), not
    mkstemp's 0o600. On an error the temp file goes and whatever was at `path` stays."""
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            # fchmod before the rename rather than chmod after it: the name never shows a
            # 0o600 file, and no path is looked up twice (nothing to swap in between).
            os.fchmod(f.fileno(), user_file_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Publish `data` at `path` all at once: readers see the old state or the whole file."""
    if is_local(fs):
        directory = os.path.dirname(path) or "."
        tmp = _write_local_temp(directory, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        fsync_dir(directory)
    else:
        fs.pipe_file(path, data)


def write_bytes_create_only(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> bool:
    """Write `data` at `path` only if nothing is there yet, atomically; True if we wrote it.

    Local: temp file + `os.link` (fails with EEXIST if the name exists, and the file
    appears whole). Object stores: a conditional PUT (``IfNoneMatch: *``) through mode
    ``"xb"``; stores without one fall back to check-then-PUT, which has a small race
    that the caller must tolerate (two writers of the same deterministic content).
    """
    if is_local(fs):
        directory = os.path.dirname(path) or "."
        tmp = _write_local_temp(directory, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_dir(directory)
        return True
    try:
        with fs.open(path, "xb") as f:
            f.write(data)
        return True
    except FileExistsError:
        return False
    except (NotImplementedError, ValueError, TypeError):
        pass
    if fs.exists(path):
        return False
    fs.pipe_file(path, data)
    return True
