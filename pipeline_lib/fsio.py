"""Small fsspec helpers: open any URL, read with a size cap, write atomically.

Local files are written to a temporary name in the destination directory, fsynced and
`os.replace`d (fsspec's own local transaction moves from the system temp dir, which is a
copy across devices). Object stores get one PUT per object, which is atomic by nature.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import fsspec
from fsspec.core import url_to_fs


class InputError(ValueError):
    """Bad user input (a file, a URL, a parameter), with a message naming it."""


def filesystem(url: str, **storage_options: Any) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve a URL or plain path into (filesystem, path inside it)."""
    try:
        return url_to_fs(url, **storage_options)
    except (ImportError, ValueError) as e:
        raise InputError(f"cannot open {url!r}: {e}") from e


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def read_bytes(url: str, max_bytes: int | None = None, **storage_options: Any) -> bytes:
    """Read a whole (decompressed) file, refusing files larger than `max_bytes`."""
    fs, path = filesystem(url, **storage_options)
    try:
        with fs.open(path, "rb", compression="infer") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except FileNotFoundError as e:
        raise InputError(f"{url}: no such file") from e
    except (OSError, EOFError) as e:
        raise InputError(f"{url}: cannot read ({e})") from e
    if max_bytes is not None and len(data) > max_bytes:
        raise InputError(f"{url}: larger than the {max_bytes:,}-byte limit for this kind of file")
    return data


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Publish `data` at `path` all at once: readers see the old state or the whole file."""
    if is_local(fs):
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    else:
        fs.pipe_file(path, data)
