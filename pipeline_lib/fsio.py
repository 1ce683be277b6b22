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
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

import fsspec
from fsspec.core import url_to_fs

from pipeline_lib.errors import InputError  # re-exported: callers import it from here too

CHUNK = 8 << 20


def filesystem(url: str, **storage_options: Any) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve a URL or plain path into (filesystem, path inside it)."""
    if not isinstance(url, str) or not url:
        raise InputError(f"cannot open {url!r}: expected a non-empty path or URL")
    try:
        return url_to_fs(url, **storage_options)
    except ImportError as e:
        raise InputError(f"cannot open {url!r}: the filesystem for it is not installed ({e})") from e
    except (ValueError, TypeError) as e:
        raise InputError(f"cannot open {url!r}: {e}") from e


def protocol_of(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return protocol_of(fs) in ("file", "local")


def read_bytes(url: str, max_bytes: int | None = None, **storage_options: Any) -> bytes:
    """Read a whole (decompressed) file, refusing files larger than `max_bytes`."""
    fs, path = filesystem(url, **storage_options)
    try:
        with fs.open(path, "rb", compression="infer") as f:
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


def _write_local_temp(directory: str, data: bytes) -> str:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


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
