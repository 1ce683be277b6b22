"""A corpus source's bytes: opened where it lives (a referenced source, checked against its
record and hashed as it streams: `_InPlace`) or from a local copy, decompressed by
extension, and capped at ``max_source_bytes`` decompressed (`open_source`)."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import lzma
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, cast

from pipeline_lib.corpus_config import _split_name
from pipeline_lib.fsio import InputError, filesystem


def _redact(url: str) -> str:
    """A URL without credentials or query string, for manifests and messages."""
    if "://" not in url:
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _stamp(info: Mapping[str, Any]) -> str:
    """What changes when a file does, from fsspec's `info`: its ETag, else its modification time."""
    for key in ("ETag", "etag", "mtime", "LastModified", "Last-Modified", "last_modified", "updated"):
        if info.get(key):
            return str(info[key])
    return ""


def _source_info(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    fs, path = filesystem(url, **storage_options)
    try:
        return fs.info(path)
    except FileNotFoundError:
        raise InputError(f"corpus source {_redact(url)!r}: no such file") from None
    except PermissionError as e:
        raise InputError(f"corpus source {_redact(url)!r}: {e}") from e
    except OSError as e:
        raise InputError(f"corpus source {_redact(url)!r}: cannot reach it ({e})") from e


class _HashingReader(io.RawIOBase):
    """A binary stream that hashes (sha256) and counts what is read through it."""

    def __init__(self, inner: BinaryIO):
        self.inner, self.sha256, self.n = inner, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.inner.read(len(b))
        n = len(data)
        b[:n] = data
        self.sha256.update(data)
        self.n += n
        return n

    def close(self) -> None:
        self.inner.close()
        super().close()


class _InPlace:
    """A referenced source, read where it lives: each read checks it against what the raw
    version recorded, and the sha256 of a whole streaming read is kept (`finish`)."""

    def __init__(self, url: str, record: Mapping[str, Any], storage_options: Mapping[str, Any]):
        self.url, self.record, self.storage_options = url, record, dict(storage_options)
        self.hasher: _HashingReader | None = None

    def open(self, seekable: bool = False) -> BinaryIO:
        """The source, hashed as it is read (`seekable`: a plain random-access file, for Parquet)."""
        self.check_unchanged()
        fs, path = filesystem(self.url, **self.storage_options)
        try:
            f = fs.open(path, "rb")
        except FileNotFoundError:
            raise InputError(
                f"corpus source {self.record['url']!r} is gone (it was recorded in place, --source-mode reference)"
            ) from None
        if seekable:
            return f
        self.hasher = _HashingReader(f)
        return io.BufferedReader(self.hasher, buffer_size=1 << 20)  # type: ignore[return-value]

    def check_unchanged(self, read: int | None = None) -> None:
        """Refuse the source if its size or ETag (or the bytes just `read`) differ from the record."""
        info = _source_info(self.url, self.storage_options)
        changes = []
        if info.get("size") is not None and int(info["size"]) != self.record["size"]:
            changes.append(f"size {self.record['size']:,} -> {int(info['size']):,} bytes")
        if _stamp(info) != self.record["stamp"]:
            changes.append(f"ETag/modified {self.record['stamp']} -> {_stamp(info)}")
        if read is not None and read != self.record["size"]:
            changes.append(f"{read:,} bytes read where {self.record['size']:,} were recorded")
        if changes:
            raise InputError(
                f"corpus source {self.record['url']!r} changed since it was recorded in place ({'; '.join(changes)}): "
                "run the corpus stage again to record the new content, or copy the sources into the store with "
                "--source-mode copy"
            )

    def finish(self) -> str:
        """The sha256 of the source, from the last streaming read when it read it whole (else
        one more pass), after checking the source did not change while it was read."""
        if self.hasher is None or self.hasher.n != self.record["size"]:
            with self.open() as f:
                while f.read(1 << 20):
                    pass
        assert self.hasher is not None  # set by open()
        self.check_unchanged(read=self.hasher.n)
        digest = self.hasher.sha256.hexdigest()
        if self.record.get("sha256") is not None and digest != self.record["sha256"]:
            raise InputError(
                f"corpus source {self.record['url']!r} changed since it was recorded in place (same size and "
                "modification time, "
                "other bytes: sha256 differs): run the corpus stage again to record the new content, or use "
                "--source-mode copy"
            )
        return digest


class _ByteSource(Protocol):
    def readinto(self, buffer: Any, /) -> int | None: ...


class _CappedReader(io.RawIOBase):
    """Counts decompressed bytes and refuses to go past the cap (zip-bomb guard)."""

    def __init__(self, inner: _ByteSource, cap: int, name: str):
        self.inner, self.cap, self.name, self.n = inner, cap, name, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            n = self.inner.readinto(b)  # straight into the reader's buffer: no copy for a plain file
            assert n is not None  # None only comes from a non-blocking raw stream
        except InputError:
            raise
        except (EOFError, OSError, lzma.LZMAError, ValueError) as e:
            raise InputError(f"{self.name}: corrupt or truncated archive ({e})") from e
        self.n += n
        if self.n > self.cap:
            raise InputError(
                f"{self.name}: decompresses to more than {self.cap:,} bytes; refusing a possible decompression bomb "
                "(raise --max-source-bytes to allow it)"
            )
        return n


class _ZstdReader(io.RawIOBase):
    """Streaming zstd decompression that notices truncation (zstandard's reader does not).

    Compressed input goes in 1 KiB pieces so one step can never inflate far past the cap:
    a 1 KiB piece of RLE blocks expands to at most ~32 MB.
    """

    def __init__(self, raw: BinaryIO, name: str):
        import zstandard

        self._zstd = zstandard
        self.raw, self.name = raw, name
        self.d = zstandard.ZstdDecompressor().decompressobj()
        self.pending = memoryview(b"")
        self.started = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not len(self.pending):
            chunk = self.raw.read(1024)
            if not chunk:
                if self.started and not self.d.eof:
                    raise InputError(f"{self.name}: truncated zstd archive (the last frame is incomplete)")
                return 0
            self.started = True
            try:
                out = self.d.decompress(chunk)
                while self.d.eof and self.d.unused_data:
                    rest = self.d.unused_data
                    self.d = self._zstd.ZstdDecompressor().decompressobj()
                    out += self.d.decompress(rest)
            except self._zstd.ZstdError as e:
                raise InputError(f"{self.name}: corrupt zstd archive ({e})") from e
            if self.d.eof:
                self.d = self._zstd.ZstdDecompressor().decompressobj()
                self.started = False
            self.pending = memoryview(out)
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


@contextlib.contextmanager
def open_source(path: str | _InPlace, name: str, cap: int) -> Iterator[io.BufferedReader]:
    """Open a local source file (or a referenced one), decompressing by extension, with the size cap."""
    _, comp = _split_name(name)
    try:
        raw = path.open() if isinstance(path, _InPlace) else open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{name}: missing ({path})") from None
    with raw:
        if comp == ".gz":
            inner: _ByteSource = gzip.GzipFile(fileobj=raw)
        elif comp == ".bz2":
            inner = bz2.BZ2File(raw)
        elif comp == ".xz":
            inner = lzma.LZMAFile(raw)
        elif comp == ".zst":
            inner = _ZstdReader(raw, name)
        else:
            inner = cast(_ByteSource, raw)  # typing.BinaryIO declares no readinto; every binary file has it
        yield io.BufferedReader(_CappedReader(inner, cap, name), buffer_size=1 << 20)


@dataclass(frozen=True)
class _RawSources:
    """A raw version's sources as the sharder reads them: (path or in-place reader, stored name), their raw records and
    message labels."""

    sources: list[tuple[str | _InPlace, str]]
    records: list[dict[str, Any]]
    labels: list[str]

    @property
    def sizes(self) -> list[int]:
        return [int(r["size"]) for r in self.records]
