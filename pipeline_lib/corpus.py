"""Corpus ingestion: fetch sources through fsspec, read documents, split into Parquet shards.

Sources are URLs or globs (``file://``, ``https://``, ``s3://``, ``gs://``, ``memory://``,
plain paths) of ``.txt``, ``.jsonl`` or ``.parquet`` files; text and JSONL files may be
``.gz``, ``.bz2``, ``.xz`` or ``.zst`` compressed (by extension). Everything streams:
memory is bounded by the largest document (a few times its size), not by the corpus.

The download stage (`fetch_sources` + `stage_sources`, run by `pipeline_lib.stages.download_corpus`)
copies the sources byte for byte into a ``raw`` version whose id is the
hash of their contents (each source's size and sha256 are in the manifest), so a retried
or repeated download lands on the same version. With ``source_mode="reference"`` (corpora
already on durable storage: s3, gs, https with an ETag) nothing is copied: the ``raw``
version records each source's URL, size and ETag (or modification time), `shard_corpus`
reads the sources in place, computing their sha256 as it streams them (recorded in the
corpus manifest), and refuses a source whose size or ETag is no longer what was recorded
(checked before and after each read, with the count of bytes read). The shard stage
(`pipeline_lib.stages.shard_corpus`) splits the raw version's sources into groups of up to
``source_group_bytes`` (`source_groups`), shards each group in a unit of its own
(`shard_group`: Parquet text shards of about equal bytes, or of about ``shard_bytes``, split
at document boundaries, ``n_shards`` shared among the groups by their bytes), and publishes
them as a ``corpus`` version (`publish_shards`); `write_shards` does all of it in one call.

A document is a line, a paragraph or a whole file for text files (`CorpusConfig.documents`),
a record for JSONL (`text_field`) and a row for Parquet (`text_field` column). Documents
are handled as UTF-8 bytes: NUL and other control bytes are kept (the tokenizer is
byte-level). Bytes that are not UTF-8 are replaced by U+FFFD, or skip their document, or
fail the run (`CorpusConfig.errors`); the counts go in the manifest. A source that looks
binary, a truncated or corrupt archive, or one that decompresses past `max_source_bytes`
(a decompression bomb) stops the run with an `InputError` naming the file, and nothing
is published.

Plain text files are split into line or paragraph documents by the compiled core's
scanner, a block at a time (`_scan_text`), and reach the shards in batches (`SourceBatch`)
with no per-document Python work. `_iter_docs` reads every format document by document and
defines the rules: the scanner follows them, and `_iter_docs` takes its place when the core
is not built.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import errno
import gzip
import hashlib
import importlib
import io
import json
import logging
import lzma
import math
import os
import re
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, BinaryIO, Literal, Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib import cancel
from pipeline_lib.config import STRICT, doc
from pipeline_lib.fsio import InputError, filesystem, hash_stream, is_local, protocol_of
from pipeline_lib.store import ArtifactStore, FileInfo, Staging, VersionRef

log = logging.getLogger(__name__)

RAW_KIND = "raw"
CORPUS_KIND = "corpus"
DEFAULT_CORPUS = os.path.join(os.path.dirname(__file__), "data", "tinyshakespeare.txt")
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
_FORMATS = (".txt", ".text", ".md", ".jsonl", ".ndjson", ".json", ".parquet")
_SNIFF_BYTES = 1 << 16
_BATCH_BYTES = 8 << 20  # Parquet row group / write batch
_BATCH_DOCS = 1 << 16
MAX_SHARDS = 100_000
MAX_DOCUMENT_BYTES = 256 << 20  # default cap on one document (--max-document-bytes)
# ~1-2 s of counting or encoding per task on one core: an orchestrator's ~30 ms per task run is a few percent.
DEFAULT_TASK_BYTES = 64 << 20
# Sources per sharding task (one unit of the corpus stage): a corpus below this is one
# group, sharded exactly as by a single sharder.
DEFAULT_SOURCE_GROUP_BYTES = 256 << 20
# Grouping never leaves fewer tasks than this (one per shard when there are fewer shards), so
# that a small corpus keeps one task per shard and a cluster has work for its workers.
MIN_TASKS = 64
_BIG_DOC = 4 << 20  # documents above this are validated in slices and written on their own
_BLOCK_BYTES = 16 << 20  # text read per native scan (more while one document spans blocks)
# Magic numbers of common binary formats that are not text (compressed ones are handled
# by extension; a compressed file without its extension is refused here).
_BINARY_MAGIC = {
    b"\x7fELF": "an ELF executable",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"%PDF": "a PDF document",
    b"PK\x03\x04": "a ZIP archive",
    b"\x1f\x8b": "gzip data (name it .gz)",
    b"BZh": "bzip2 data (name it .bz2)",
    b"\xfd7zXZ\x00": "xz data (name it .xz)",
    b"\x28\xb5\x2f\xfd": "zstd data (name it .zst)",
    b"PAR1": "a Parquet file (name it .parquet)",
    b"\x93NUMPY": "a NumPy array",
    b"SQLite format 3\x00": "an SQLite database",
}


@dataclass(frozen=True)
class CorpusConfig:
    """How to read and shard a corpus."""

    __pydantic_config__ = STRICT

    sources: Annotated[
        tuple[str, ...] | None, doc("corpus file URLs, globs or directories (.txt, .jsonl, .parquet, plain or compressed); none: the bundled tiny Shakespeare")
    ] = (DEFAULT_CORPUS,)
    # "line" is the default everywhere (the CLI and tokenmill_pipeline used to say
    # "paragraph"): every text has lines, not every text has blank lines between documents,
    # and a file without them would become one document (one shard, one huge encode call).
    # Corpora with paragraphs may gain ~3 % compression with --documents paragraph.
    documents: Annotated[Literal["line", "paragraph", "file"], doc("what a document is in a text file")] = "line"
    text_field: Annotated[str, doc("JSONL field / Parquet column holding the text")] = "text"
    errors: Annotated[Literal["replace", "skip-document", "fail"], doc("invalid UTF-8 policy")] = "replace"
    n_shards: Annotated[int, doc("corpus shards of about equal bytes, split at document boundaries, processed in parallel")] = 2
    shard_bytes: Annotated[int, doc("target bytes per shard instead of a count (0: n_shards shards); the count becomes ceil(corpus bytes / shard_bytes)")] = 0
    max_source_bytes: Annotated[int, doc("cap on one source's decompressed size in bytes (bomb guard)")] = 64 << 30
    max_document_bytes: Annotated[
        int, doc("cap on one document's bytes (a line, a paragraph, a whole file, a JSONL line, a Parquet value): memory stays a few times this")
    ] = MAX_DOCUMENT_BYTES
    source_mode: Annotated[
        Literal["copy", "reference"],
        doc(
            "copy: sources are copied into the store first; reference: sources on durable storage (s3, gs, https with an ETag) "
            "are read in place, the raw version records their URL, size and ETag, and a changed source is refused"
        ),
    ] = "copy"
    task_bytes: Annotated[
        int,
        doc(
            "corpus bytes per task of the per-shard stages (count, encode): consecutive shards are grouped into tasks of about this size, "
            f"never fewer than {MIN_TASKS} tasks (one per shard below that); 0: one task per shard"
        ),
    ] = DEFAULT_TASK_BYTES
    source_group_bytes: Annotated[
        int,
        doc(
            "source bytes per sharding task: consecutive sources are grouped up to this size; a larger source is split at document "
            "boundaries into ranges of about this size (text and JSONL by bytes, Parquet by row groups; a compressed one stays whole), "
            "each group sharded by a task of its own; 0: one task per source"
        ),
    ] = DEFAULT_SOURCE_GROUP_BYTES
    storage_options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # fsspec options; given by the flow, not a stage parameter

    def __post_init__(self):
        sources = (DEFAULT_CORPUS,) if self.sources is None else self.sources
        if isinstance(sources, (str, os.PathLike)):
            sources = (sources,)
        try:
            sources = tuple(os.fspath(s) for s in sources)
        except TypeError:
            raise InputError(f"sources={self.sources!r}: give a path, URL or glob, or a list of them") from None
        object.__setattr__(self, "sources", sources)
        if not self.sources or not all(self.sources):
            raise InputError("no corpus sources given")
        if self.documents not in ("line", "paragraph", "file"):
            raise InputError(f"documents={self.documents!r}: choose line, paragraph or file")
        if self.source_mode not in ("copy", "reference"):
            raise InputError(f"source_mode={self.source_mode!r}: choose copy or reference")
        if self.errors not in ("replace", "skip-document", "fail"):
            raise InputError(f"errors={self.errors!r}: choose replace, skip-document or fail")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise InputError(f"text_field={self.text_field!r}: give the JSONL field / Parquet column with the text (--text-field)")
        if not isinstance(self.n_shards, int) or not 1 <= self.n_shards <= MAX_SHARDS:
            raise InputError(f"n_shards={self.n_shards}: must be between 1 and {MAX_SHARDS}")
        if not isinstance(self.max_source_bytes, int) or self.max_source_bytes <= 0:
            raise InputError("max_source_bytes must be a positive number of bytes")
        if not isinstance(self.max_document_bytes, int) or self.max_document_bytes <= 0:
            raise InputError("max_document_bytes must be a positive number of bytes (--max-document-bytes)")
        if not isinstance(self.shard_bytes, int) or self.shard_bytes < 0:
            raise InputError(f"shard_bytes={self.shard_bytes}: give a positive number of bytes, or 0 to use n_shards")
        if not isinstance(self.source_group_bytes, int) or self.source_group_bytes < 0:
            raise InputError(f"source_group_bytes={self.source_group_bytes}: give a positive number of bytes, or 0 for one sharding task per source")
        if not isinstance(self.task_bytes, int) or self.task_bytes < 0:
            raise InputError(f"task_bytes={self.task_bytes}: give a positive number of bytes, or 0 for one task per shard")

    def planned_shards(self, total_bytes: int) -> int:
        """How many shards a corpus of `total_bytes` is cut into (fewer if it has fewer documents)."""
        if self.shard_bytes:
            return max(1, min(MAX_SHARDS, -(-total_bytes // self.shard_bytes)))
        return self.n_shards

    def shard_params(self) -> dict[str, Any]:
        """The parameters that decide the shards' content (part of their version id).

        `max_source_bytes` and `max_document_bytes` are not among them: a run either stays
        under them and writes the same shards, or fails; nor is `task_bytes`, which only groups shards into tasks, nor
        `source_mode` (the raw version, a parent, says how the sources were read).
        """
        p = asdict(self)
        del p["sources"], p["storage_options"], p["max_source_bytes"], p["max_document_bytes"], p["task_bytes"], p["source_mode"]
        return p


# --------------------------------------------------------------------------- sources
def _split_name(name: str) -> tuple[str, str]:
    """(format extension, compression extension) of a file name."""
    lower = name.lower()
    comp = next((c for c in _COMPRESSIONS if lower.endswith(c)), "")
    base = lower[: len(lower) - len(comp)] if comp else lower
    fmt = next((f for f in _FORMATS if base.endswith(f)), ".txt")
    return fmt, comp


def _redact(url: str) -> str:
    """A URL without credentials or query string, for manifests and messages."""
    if "://" not in url:
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def expand_sources(sources: tuple[str, ...], **storage_options: Any) -> list[str]:
    """Expand globs; each source must name at least one file."""
    if isinstance(sources, str):
        sources = (sources,)
    urls: list[str] = []
    for src in sources:
        fs, path = filesystem(src, **storage_options)
        globbing = protocol_of(fs) not in ("http", "https") and any(ch in path for ch in "*?[")
        if globbing:
            try:
                hits = sorted(h for h in fs.glob(path) if not fs.isdir(h))
            except OSError as e:
                raise InputError(f"corpus source {_redact(src)!r}: cannot list it ({e})") from e
            if not hits:
                raise InputError(f"corpus source {_redact(src)!r} matches no files")
            urls.extend(fs.unstrip_protocol(h) if "://" in src else h for h in hits)
        else:
            try:
                info = fs.info(path)
            except FileNotFoundError:
                raise InputError(f"corpus source {_redact(src)!r}: no such file") from None
            except PermissionError as e:  # an HTTP 401/403 (pipeline_lib.fsio.http_status_error)
                raise InputError(f"corpus source {_redact(src)!r}: {e}") from e
            except OSError as e:
                raise InputError(f"corpus source {_redact(src)!r}: cannot reach it ({e})") from e
            if info.get("type") == "directory":
                urls.extend(_directory_files(fs, path, src))
                continue
            urls.append(src)
    return urls


def _directory_files(fs: Any, path: str, src: str) -> list[str]:
    """The files under a directory source, all levels down, in path order (a corpus layout like
    FineWeb's ``data/<dump>/*.parquet``); names starting with "." or "_" (``_SUCCESS``, ``.crc``) are left out."""
    try:
        hits = sorted(h for h in fs.find(path) if not os.path.basename(h).startswith((".", "_")))
    except OSError as e:
        raise InputError(f"corpus source {_redact(src)!r}: cannot list it ({e})") from e
    if not hits:
        raise InputError(
            f"corpus source {_redact(src)!r} is a directory with no files; give files, a glob like {src.rstrip('/')}/*.txt, or a directory holding them"
        )
    return [fs.unstrip_protocol(h) if "://" in src else h for h in hits]


def _stamp(info: Mapping[str, Any]) -> str:
    """What changes when a file does, from fsspec's `info`: its ETag, else its modification time."""
    for key in ("ETag", "etag", "mtime", "LastModified", "Last-Modified", "last_modified", "updated"):
        if info.get(key):
            return str(info[key])
    return ""


def source_fingerprint(sources: tuple[str, ...], **storage_options: Any) -> list[dict[str, Any]]:
    """Cheap identity of the sources (size, mtime / ETag) for cache keys, without reading them."""
    out = []
    for url in expand_sources(sources, **storage_options):
        fs, path = filesystem(url, **storage_options)
        info = fs.info(path)
        out.append({"url": _redact(url), "size": info.get("size"), "stamp": _stamp(info)})
    return out


def _source_name(url: str, i: int) -> str:
    """A store-safe file name for source number `i` that keeps its extensions."""
    path = urllib.parse.urlsplit(url).path if "://" in url else url
    base = os.path.basename(path.rstrip("/")) or "source"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", base)
    safe = re.sub(r"\.{2,}", ".", safe).strip(".") or "source"
    if len(safe) > 150:  # keep the tail: it holds the format and compression extensions
        safe = safe[-150:].lstrip(".")
    return f"{i:05d}_{safe}"


@contextlib.contextmanager
def fetch_sources(store: ArtifactStore, config: CorpusConfig) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Copy mode: fetch the sources into the store's scratch area, hashing them; yields the
    `raw` version's params (``{"content": [name, sha256 per source]}``, what its id hashes)
    and the fetched files, for `stage_sources`. The fetched files are removed on exit.

    Streams each source in bounded chunks while hashing it. Idempotent: a retry (or a
    second run) downloads again and lands on the same version id, which is published
    once; a killed download leaves only temp files that `gc` removes.
    """
    sources = config.sources
    assert sources is not None  # __post_init__ fills in the default
    urls = expand_sources(sources, **config.storage_options)
    try:
        tmpdir = tempfile.mkdtemp(prefix="download-", dir=store.scratch_dir(RAW_KIND))
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        # A read-only store (a published copy on a read-only mount): the sources are hashed
        # beside it, and reusing their raw version needs no write; publishing a new one fails.
        tmpdir = tempfile.mkdtemp(prefix="tokenmill-download-")
    try:
        fetched: list[dict[str, Any]] = []
        for i, url in enumerate(urls):
            fs, path = filesystem(url, **config.storage_options)
            local = os.path.join(tmpdir, f"{i:05d}")
            try:
                with fs.open(path, "rb") as src, open(local, "wb") as dst:
                    size, digest = hash_stream(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())
            except FileNotFoundError:
                raise InputError(f"corpus source {_redact(url)!r}: no such file") from None
            except IsADirectoryError:
                raise InputError(f"corpus source {_redact(url)!r} is a directory") from None
            fetched.append({"url": _redact(url), "local": local, "name": _source_name(url, i), "size": size, "sha256": digest})
        if sum(f["size"] for f in fetched) == 0:
            shown = ", ".join(repr(_redact(u)) for u in urls[:5]) + (" ..." if len(urls) > 5 else "")
            raise InputError(f"the corpus is empty: {shown} hold 0 bytes")
        for f in fetched:  # refuse what is not text before it becomes a raw version nobody wants
            _check_looks_like_text(f["local"], _user_label(f, f["name"]), config)
        yield {"content": [{"name": f["name"], "sha256": f["sha256"]} for f in fetched]}, fetched
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def stage_sources(staging: Staging, fetched: list[dict[str, Any]], config: CorpusConfig) -> tuple[dict[str, FileInfo], dict[str, Any]]:
    """The fetched sources moved into a `raw` version's staging area: (files, meta)."""
    assert config.sources is not None  # __post_init__ fills in the default
    files: dict[str, FileInfo] = {}
    for f in fetched:
        files[f"sources/{f['name']}"] = staging.put_file(f"sources/{f['name']}", f["local"], move=True)
        if files[f"sources/{f['name']}"] != FileInfo(f["size"], f["sha256"]):
            raise InputError(f"corpus source {f['url']!r} changed on local disk while it was being stored")
    meta = {
        "sources": [{k: f[k] for k in ("url", "name", "size", "sha256")} for f in fetched],
        "n_bytes": sum(f["size"] for f in fetched),
        "fingerprint": source_fingerprint(config.sources, **config.storage_options),
    }
    return files, meta


def reference_sources(config: CorpusConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reference mode (``source_mode="reference"``): the `raw` version's params and meta
    for sources read in place.

    Nothing is read: the version records each source's URL (without credentials or query),
    size and ETag / modification time, and its id hashes them, so a changed source is a new
    version. A source without an ETag or modification time cannot be referenced.
    """
    assert config.sources is not None  # __post_init__ fills in the default
    urls = expand_sources(config.sources, **config.storage_options)
    records: list[dict[str, Any]] = []
    for i, url in enumerate(urls):
        info = _source_info(url, config.storage_options)
        if not _stamp(info) or info.get("size") is None:
            raise InputError(
                f"corpus source {_redact(url)!r} has no ETag or modification time (or no size): it cannot be read in place safely; use --source-mode copy"
            )
        record = {"url": _redact(url), "name": _source_name(url, i), "size": int(info["size"]), "stamp": _stamp(info)}
        fs, path = filesystem(url, **config.storage_options)
        if is_local(fs):
            # A local file's size and mtime are easy to keep while its bytes change (and
            # mtime is easy to set): its content is recorded too, and sharding refuses
            # bytes that hash otherwise. Object stores' ETags change with the content.
            with fs.open(path, "rb") as f:
                record["sha256"] = hash_stream(f)[1]
        records.append(record)
    n_bytes = sum(int(r["size"]) for r in records)
    if n_bytes == 0:
        raise InputError(f"the corpus is empty: {', '.join(repr(r['url']) for r in records[:5])} hold 0 bytes")
    params = {"reference": [{k: r[k] for k in ("url", "size", "stamp", "sha256") if k in r} for r in records]}
    return params, {"mode": "reference", "sources": records, "n_bytes": n_bytes}


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
            raise InputError(f"corpus source {self.record['url']!r} is gone (it was recorded in place, --source-mode reference)") from None
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
                "run the corpus stage again to record the new content, or copy the sources into the store with --source-mode copy"
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
                f"corpus source {self.record['url']!r} changed since it was recorded in place (same size and modification time, "
                "other bytes: sha256 differs): run the corpus stage again to record the new content, or use --source-mode copy"
            )
        return digest


# --------------------------------------------------------------------------- reading sources
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
                f"{self.name}: decompresses to more than {self.cap:,} bytes; refusing a possible decompression bomb (raise --max-source-bytes to allow it)"
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


@dataclass
class DecodeStats:
    documents: int = 0
    bytes: int = 0
    chars: int = 0
    replaced_documents: int = 0
    invalid_bytes: int = 0  # bytes replaced by U+FFFD (policy "replace")
    skipped_documents: int = 0  # documents dropped for invalid UTF-8 (policy "skip-document")
    empty_documents: int = 0

    def add(self, other: DecodeStats) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


_INVALID = threading.local()  # bytes replaced by the running decode, per thread


def _count_replace(e: UnicodeError) -> tuple[str, int]:
    if not isinstance(e, UnicodeDecodeError):  # registered for decoding only
        raise e
    _INVALID.n = getattr(_INVALID, "n", 0) + e.end - e.start
    return "\ufffd", e.end


codecs.register_error("tokenmill-count-replace", _count_replace)


def _decode_policy(data: bytes, errors: str, where: str, stats: DecodeStats) -> str | None:
    """`data` as text, applying the invalid-UTF-8 policy (counts replaced / skipped)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if errors == "fail":
            raise InputError(f"{where}: invalid UTF-8 at byte {e.start} ({e.reason}); use errors='replace' or 'skip-document' to go on") from None
        if errors == "skip-document":
            stats.skipped_documents += 1
            return None
        _INVALID.n = 0
        text = data.decode("utf-8", "tokenmill-count-replace")
        stats.replaced_documents += 1
        stats.invalid_bytes += _INVALID.n
        return text


def _check_utf8(data: bytes, errors: str, where: str, stats: DecodeStats) -> bytes | None:
    """`data` if it is UTF-8; else per the policy: repaired bytes, None (skip) or an error."""
    n_chars = _utf8_chars(data)
    if n_chars is None:
        text = _decode_policy(data, errors, where, stats)
        if text is None:
            return None
        data = text.encode("utf-8")
        n_chars = len(text)
    return _counted(data, n_chars, stats)


def _utf8_chars(data: bytes) -> int | None:
    """Characters in `data` if it is valid UTF-8, else None; big documents are checked in
    slices so no str of their full size is ever built."""
    if len(data) <= _BIG_DOC:
        try:
            return len(data.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    n = 0
    try:
        for start in range(0, len(data), _BIG_DOC):
            n += len(decoder.decode(view[start : start + _BIG_DOC], final=start + _BIG_DOC >= len(data)))
    except UnicodeDecodeError:
        return None
    return n


def _check_str(text: str, errors: str, where: str, stats: DecodeStats) -> bytes | None:
    """UTF-8 bytes of a str from JSON (which can hold lone surrogates UTF-8 cannot carry)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        if errors == "fail":
            raise InputError(
                f"{where}: lone surrogate {text[e.start]!r} at character {e.start}, not encodable as UTF-8; use errors='replace' or 'skip-document'"
            ) from None
        if errors == "skip-document":
            stats.skipped_documents += 1
            return None
        # Join valid surrogate pairs, replace lone ones with U+FFFD (the tokenizer's rule).
        fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        stats.replaced_documents += 1
        stats.invalid_bytes += sum(1 for ch in text if "\ud800" <= ch <= "\udfff") - 2 * (len(text) - len(fixed))
        text, data = fixed, fixed.encode("utf-8")
    return _counted(data, len(text), stats)


def _counted(data: bytes, n_chars: int, stats: DecodeStats) -> bytes | None:
    if not data or data.isspace():  # nothing but ASCII whitespace: no content, no document
        stats.empty_documents += 1
        return None
    stats.documents += 1
    stats.bytes += len(data)
    stats.chars += n_chars
    return data


def _sniff_binary(head: bytes, name: str) -> None:
    """Refuse a file that is not text: a known binary signature, many NULs or non-UTF-8.

    A few NUL or control bytes in text are fine (kept, the tokenizer is byte-level).
    """
    if not head:
        return
    for magic, what in _BINARY_MAGIC.items():
        if head.startswith(magic):
            raise InputError(f"{name}: looks like {what}, not text")
    nul = head.count(0)
    invalid = len(head) - len(head.decode("utf-8", "ignore").encode("utf-8"))
    if len(head) >= 4 and (invalid > len(head) // 10 + 4 or nul > len(head) * 3 // 10):
        hint = " (UTF-16 text? convert it to UTF-8)" if head[:2] in (b"\xff\xfe", b"\xfe\xff") or head[1::2].count(0) > len(head) // 4 else ""
        raise InputError(f"{name}: looks like a binary file, not text ({nul} NUL and {invalid} non-UTF-8 bytes in the first {len(head):,} bytes){hint}")


def _check_looks_like_text(path: str, label: str, config: CorpusConfig) -> None:
    """The sniff `_iter_docs` does, on a fetched source's first bytes (decompressed)."""
    fmt, comp = _split_name(label)
    if fmt == ".parquet":
        return  # binary by nature; its text column is checked when it is read
    with open_source(path, label, config.max_source_bytes) as f:
        _sniff_binary(f.peek(_SNIFF_BYTES)[:_SNIFF_BYTES], label)


def _document_too_big(name: str, where: str, cap: int) -> InputError:
    return InputError(
        f"{name}{where}: a document of more than {cap:,} bytes; raise --max-document-bytes to allow it (memory grows to a few times it), "
        "or cut the text into smaller documents (--documents line / paragraph)"
    )


def _iter_docs(path: str | _InPlace, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[tuple[bytes, int]]:
    """(document UTF-8 bytes, source bytes consumed so far) for one local source file (or a referenced one)."""
    fmt, comp = _split_name(name)
    if fmt == ".parquet":
        if comp:
            raise InputError(f"{name}: a compressed Parquet file; Parquet compresses internally, store it as plain .parquet")
        yield from _iter_parquet(path, name, config, stats)
        return
    errors = config.errors
    pos = 0
    with open_source(path, name, config.max_source_bytes) as f:
        if not getattr(path, "offset", 0):  # a range inside a file starts at an arbitrary line
            _sniff_binary(f.peek(_SNIFF_BYTES)[:_SNIFF_BYTES], name)
        cap = config.max_document_bytes
        if fmt in (".jsonl", ".ndjson", ".json"):
            field = config.text_field
            lineno = 0
            while line := f.readline(cap + 1):
                lineno += 1
                if len(line) > cap:
                    raise _document_too_big(name, f":{lineno}", cap)
                pos += len(line)
                if lineno == 1 and line.startswith(codecs.BOM_UTF8) and not getattr(path, "offset", 0):  # the file's first line only
                    line = line[len(codecs.BOM_UTF8) :]
                if not line.strip():
                    continue
                text = _decode_policy(line, errors, f"{name}:{lineno}", stats)
                if text is None:
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as e:
                    raise InputError(f"{name}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(record, dict):
                    raise InputError(f"{name}:{lineno}: expected a JSON object per line, found {type(record).__name__}")
                if field not in record:
                    raise InputError(
                        f"{name}:{lineno}: record has no {field!r} field (fields: {sorted(record)[:10]}); name the field holding the text with --text-field"
                    )
                value = record[field]
                if value is None:
                    stats.empty_documents += 1
                    continue
                if not isinstance(value, str):
                    raise InputError(f"{name}:{lineno}: field {field!r} is {type(value).__name__}, not text")
                data = _check_str(value, errors, f"{name}:{lineno}", stats)
                if data is not None:
                    yield data, pos
        elif config.documents == "file":
            raw = f.read(cap + 1)
            if len(raw) > cap:
                raise _document_too_big(name, "", cap)
            data = _check_utf8(raw, errors, name, stats)
            if data is not None:
                yield data, len(raw)
        elif config.documents == "line":
            lineno = 0
            while line := f.readline(cap + 1):
                lineno += 1
                if len(line) > cap:
                    raise _document_too_big(name, f":{lineno}", cap)
                pos += len(line)
                stripped = line.rstrip(b"\r\n")
                del line  # drop the unstripped copy before checking (a huge line counts twice otherwise)
                data = _check_utf8(stripped, errors, f"{name}:{lineno}", stats)
                del stripped
                if data is not None:
                    yield data, pos
                data = None
        else:  # paragraph: blank-line separated
            para: list[bytes] = []
            para_bytes = 0
            start = 1
            lineno = 0
            while line := f.readline(cap + 1):
                lineno += 1
                if line.strip():
                    if not para:
                        start = lineno
                    para.append(line)
                    para_bytes += len(line)
                    if para_bytes > cap:
                        raise _document_too_big(name, f":{start}", cap)
                    pos += len(line)
                    continue
                if para:
                    data = _check_utf8(b"".join(para).rstrip(b"\r\n"), errors, f"{name}:{start}", stats)
                    para, para_bytes = [], 0
                    if data is not None:
                        yield data, pos
                pos += len(line)
            if para:
                data = _check_utf8(b"".join(para).rstrip(b"\r\n"), errors, f"{name}:{start}", stats)
                if data is not None:
                    yield data, pos


def iter_documents(path: str, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[str]:
    """Yield the documents of one local source file as text."""
    for data, _ in _iter_docs(path, name, config, stats):
        yield data.decode("utf-8")


def _native_scanner() -> Any:
    """The compiled core's `scan_documents`, or None (not built, or TOKENMILL_PURE_PYTHON)."""
    if os.environ.get("TOKENMILL_PURE_PYTHON"):
        return None
    try:
        _tokcore = importlib.import_module("pipeline_lib._tokcore")
    except ImportError:
        return None
    if not hasattr(_tokcore, "scan_documents"):
        return None
    cancel.watch(_tokcore)
    return _tokcore.scan_documents


# Read at call time, so a test can swap it; without it the sharder packs `_iter_docs`'s documents.
_SCAN = _native_scanner()


@dataclass
class SourceBatch:
    """Consecutive documents of one source: document k is ``data[offsets[k]:offsets[k + 1]]``
    (valid UTF-8, not blank) and ``ends[k]`` the source bytes walked through its end, as
    `_iter_docs` yields them one at a time."""

    data: Any  # a buffer: bytes or a uint8 array
    offsets: np.ndarray  # int64, n + 1
    ends: np.ndarray  # int64, n

    def __len__(self) -> int:
        return len(self.ends)


def _iter_batches(path: str | _InPlace, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[SourceBatch]:
    """`_iter_docs`'s documents in batches: text files in line or paragraph mode are scanned
    natively a block at a time, the other sources document by document."""
    fmt, _ = _split_name(name)
    if _SCAN is not None and fmt not in (".parquet", ".jsonl", ".ndjson", ".json") and config.documents != "file":
        yield from _scan_text(_SCAN, path, name, config, stats)
    else:
        yield from _pack(_iter_docs(path, name, config, stats))


def _pack(docs: Iterator[tuple[bytes, int]]) -> Iterator[SourceBatch]:
    """Batches of (document, position) pairs, of about `_BATCH_BYTES`; a big document alone (not copied)."""
    datas: list[bytes] = []
    ends: list[int] = []
    size = 0

    def batch() -> SourceBatch:
        offsets = np.zeros(len(datas) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, datas), dtype=np.int64, count=len(datas)), out=offsets[1:])
        return SourceBatch(b"".join(datas), offsets, np.array(ends, dtype=np.int64))

    for data, pos in docs:
        if len(data) > _BIG_DOC and datas:
            yield batch()
            datas, ends, size = [], [], 0
        datas.append(data)
        ends.append(pos)
        size += len(data)
        if size >= _BATCH_BYTES or len(datas) >= _BATCH_DOCS or len(data) > _BIG_DOC:
            yield batch()
            datas, ends, size = [], [], 0
        del data
    if datas:
        yield batch()


def _scan_text(scan: Any, path: str | _InPlace, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[SourceBatch]:
    """The line or paragraph documents of a text source, read `_BLOCK_BYTES` at a time.

    A block's incomplete last line (or paragraph) is carried into the next one; while a
    single document spans blocks the reads grow with it, so memory stays a small multiple
    of the largest document and each byte is scanned a bounded number of times.
    """
    mode = 0 if config.documents == "line" else 1
    base = 0  # source position of the block's first byte
    lines = 0  # lines before it
    carry = np.empty(0, dtype=np.uint8)  # the end of the last block: an incomplete line or paragraph
    with open_source(path, name, config.max_source_bytes) as f:
        if not getattr(path, "offset", 0):  # a range inside a file starts at an arbitrary line
            _sniff_binary(f.peek(_SNIFF_BYTES)[:_SNIFF_BYTES], name)
        while True:
            # uninitialized (pages cost only once read into); doubles while one document goes on
            block = np.empty(len(carry) + max(_BLOCK_BYTES, len(carry)), dtype=np.uint8)
            filled = len(carry)
            block[:filled] = carry
            del carry
            with block.data as view:
                while filled < len(block) and (got := f.readinto(view[filled:])):
                    filled += got
                final = filled < len(block) or not f.peek(1)
                # the documents are packed at the start of the block, the rest left as it is
                _, offsets, ends, consumed, n_lines, chars, empty, invalid, invalid_lines = scan(view[:filled], mode, final, True)
            carry = block[consumed:filled]  # a view: copied into the next block
            cap = config.max_document_bytes
            if len(carry) > cap or (len(offsets) > 1 and int(np.diff(offsets).max()) > cap):
                where = f":{lines + n_lines + 1}" if len(carry) > cap else ""
                raise _document_too_big(name, where, cap)
            ends += base
            stats.empty_documents += empty
            stats.documents += len(ends) - len(invalid)
            stats.bytes += int(offsets[-1]) - int((offsets[invalid + 1] - offsets[invalid]).sum())
            stats.chars += chars
            batch = SourceBatch(block, offsets, ends)
            if len(invalid):
                batch = _apply_policy(batch, invalid, invalid_lines + (lines + 1), name, config.errors, stats)
            if len(batch):
                yield batch
            del batch, block, offsets, ends
            base += consumed
            lines += n_lines
            if final:
                assert not len(carry), "the final scan consumes everything"
                return


def _apply_policy(batch: SourceBatch, invalid: np.ndarray, linenos: np.ndarray, name: str, errors: str, stats: DecodeStats) -> SourceBatch:
    """`batch` with its invalid-UTF-8 documents repaired or dropped (`_check_utf8`, which counts them)."""
    offsets = batch.offsets
    view = memoryview(batch.data).cast("B")
    lengths = np.diff(offsets)
    keep = np.ones(len(lengths), dtype=bool)
    pieces: list[Any] = []
    start = 0
    for k, lineno in zip(invalid.tolist(), linenos.tolist()):
        pieces.append(view[offsets[start] : offsets[k]])
        data = _check_utf8(bytes(view[offsets[k] : offsets[k + 1]]), errors, f"{name}:{lineno}", stats)
        if data is None:
            keep[k] = False
        else:
            pieces.append(data)
            lengths[k] = len(data)
        start = k + 1
    pieces.append(view[offsets[start] : offsets[-1]])
    lengths = lengths[keep]
    new_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    return SourceBatch(b"".join(pieces), new_offsets, batch.ends[keep])


def _text_column(pf: pq.ParquetFile, name: str, field: str) -> None:
    names = pf.schema_arrow.names
    if field not in names:
        raise InputError(f"{name}: no column {field!r} (columns: {names[:20]}); name the column holding the text with --text-field")
    typ = pf.schema_arrow.field(field).type
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    ok = (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or getattr(pa.types, "is_string_view", lambda t: False)(typ)
        or getattr(pa.types, "is_binary_view", lambda t: False)(typ)
    )
    if not ok:
        raise InputError(f"{name}: column {field!r} has type {typ}, not text")


def _binary_values(col: pa.Array) -> tuple[np.ndarray, memoryview, np.ndarray | None]:
    """(int64 offsets, data buffer, validity or None) of a string/binary array."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if not pa.types.is_large_binary(col.type):
        col = col.cast(pa.large_binary())
    _, offsets, data = col.buffers()
    off = np.frombuffer(offsets, dtype=np.int64, count=len(col) + 1, offset=col.offset * 8)
    valid = None if col.null_count == 0 else col.is_valid().to_numpy(zero_copy_only=False)
    return off, (memoryview(data) if data is not None else memoryview(b"")), valid


def _parquet_file(path: str | _InPlace) -> pq.ParquetFile:
    return pq.ParquetFile(path.open(seekable=True) if isinstance(path, _InPlace) else path)


def _iter_parquet(path: str | _InPlace, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[tuple[bytes, int]]:
    try:
        pf = _parquet_file(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{name}: not a readable Parquet file ({e})") from e
    _text_column(pf, name, config.text_field)
    pos = row = 0
    try:
        for batch in pf.iter_batches(columns=[config.text_field], batch_size=4096, row_groups=getattr(path, "row_groups", None)):
            off, buf, valid = _binary_values(batch.column(0))
            for i in range(len(off) - 1):
                row += 1
                if valid is not None and not valid[i]:
                    stats.empty_documents += 1
                    continue
                n = int(off[i + 1] - off[i])
                if n > config.max_document_bytes:
                    raise _document_too_big(name, f": row {row}", config.max_document_bytes)
                pos += n
                if pos > config.max_source_bytes:
                    raise InputError(f"{name}: holds more than {config.max_source_bytes:,} bytes of text ; raise --max-source-bytes to allow it")
                data = _check_utf8(bytes(buf[off[i] : off[i + 1]]), config.errors, f"{name}: row {row}", stats)
                if data is not None:
                    yield data, pos
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        raise InputError(f"{name}: corrupt Parquet file ({e})") from e


def _source_extent(path: str | _InPlace, name: str, config: CorpusConfig) -> int:
    """Bytes `_iter_docs` will walk through for this source (decompressed).

    Free for uncompressed files; one decompression pass for compressed ones (which also
    finds a truncated archive or a bomb before anything is written); the text column's
    byte length for Parquet.
    """
    fmt, comp = _split_name(name)
    if fmt == ".parquet":
        if comp:
            raise InputError(f"{name}: a compressed Parquet file; Parquet compresses internally, store it as plain .parquet")
        try:
            pf = _parquet_file(path)
            _text_column(pf, name, config.text_field)
            total = 0
            for batch in pf.iter_batches(columns=[config.text_field], batch_size=65536, row_groups=getattr(path, "row_groups", None)):
                off, _, valid = _binary_values(batch.column(0))
                lengths = np.diff(off)
                total += int(lengths.sum() if valid is None else lengths[valid].sum())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
            raise InputError(f"{name}: not a readable Parquet file ({e})") from e
        if total > config.max_source_bytes:
            raise InputError(f"{name}: holds more than {config.max_source_bytes:,} bytes of text ; raise --max-source-bytes to allow it")
        return total
    if not comp:
        size = path.record["size"] if isinstance(path, _InPlace) else os.path.getsize(path)
        if size > config.max_source_bytes:
            raise InputError(f"{name}: {size:,} bytes, more than the {config.max_source_bytes:,}-byte cap; raise --max-source-bytes to allow it")
        return size
    total = 0
    with open_source(path, name, config.max_source_bytes) as f:
        while n := len(f.read(1 << 20)):
            total += n
    return total


# --------------------------------------------------------------------------- sharding
SHARD_SCHEMA = pa.schema([("text", pa.large_string()), ("source", pa.string())])


def shard_name(i: int) -> str:
    return f"shard_{i:06d}"


class _ShardPlan:
    """Where the shard boundaries fall, decided one document at a time (streaming, deterministic;
    `place_batch` decides a batch of documents at once, with the same result).

    Each shard aims at the bytes still to come divided by the shards still to make, so a
    big early shard does not starve the later ones (cutting at fixed k/n marks of the
    running total made a 12-byte shard after a 6 MB document). The current shard is closed
    before a document when adding it would overshoot the target by more than leaving it out
    falls short, and after a document that brings it to the target. A document at least as
    large as a shard's share gets a shard of its own (flagged ``oversize`` in the manifest;
    documents are never split). The last shard takes what is left, so there are at most
    `n` shards. Sizes are source bytes walked, the unit of `total`, separators included.
    """

    def __init__(self, total: int, n: int):
        self.share = total / n
        self.remaining = total  # bytes not in a closed shard yet
        self.left = n  # shards still to make, the current one included
        self.current = 0  # bytes in the current shard
        self.oversize = False  # the current shard is one document larger than a shard's share

    def _close(self) -> None:
        self.remaining -= self.current
        self.left -= 1
        self.current = 0

    def place(self, size: int) -> tuple[bool, bool]:
        """(close the current shard before this document, close it after)."""
        before = after = False
        if self.current and self.left > 1:
            target = self.remaining / self.left
            if size >= target or self.current + size - target > target - self.current:
                self._close()
                before = True
        # a document alone in its shard and larger than a shard's share of the corpus (until another joins it)
        self.oversize = self.current == 0 and size > self.share
        target = self.remaining / self.left
        self.current += size
        if self.left > 1 and self.current >= target:
            self._close()
            after = True
        return before, after

    def place_batch(self, sizes: np.ndarray) -> list[tuple[int, bool, bool, bool]]:
        """`place` for consecutive documents of these sizes: (index, close before, close after,
        oversize) for each document where a shard closes (the others just join the current one).

        Only the document at which the current shard first reaches its target can close it:
        below the target, adding a document of size s < target - current neither overshoots
        by more than it falls short nor reaches it. So each close is one `searchsorted` over
        the cumulative sizes, then `place` on that document.
        """
        events: list[tuple[int, bool, bool, bool]] = []
        n = len(sizes)
        if n == 0:
            return events
        cum = np.cumsum(sizes, dtype=np.int64)
        i = 0  # next document
        walked = 0  # cum[i - 1]
        while i < n and self.left > 1:
            # first k with current + cum[k] - walked >= target (an int reaches a float at its ceiling)
            need = walked + math.ceil(self.remaining / self.left) - self.current
            k = max(i, int(np.searchsorted(cum, need, side="left")))
            if k >= n:
                break
            self.current += int(cum[k - 1]) - walked if k > i else 0
            before, after = self.place(int(sizes[k]))
            events.append((k, before, after, self.oversize))
            walked, i = int(cum[k]), k + 1
        if i < n:  # the rest joins the current shard
            before_last = self.current + (int(cum[n - 2]) - walked if n - 1 > i else 0)
            self.oversize = before_last == 0 and int(sizes[n - 1]) > self.share
            self.current += int(cum[n - 1]) - walked
        return events

    def skip(self, size: int) -> None:
        """Source bytes after the last document of a source (they belong to the current shard)."""
        self.current += size


def shard_balance(shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The shard-size spread of a corpus version (bytes of text per shard)."""
    sizes = [int(s["n_bytes"]) for s in shards]
    mean = sum(sizes) / len(sizes) if sizes else 0.0
    return {
        "n_shards": len(sizes),
        "min_bytes": min(sizes, default=0),
        "max_bytes": max(sizes, default=0),
        "mean_bytes": round(mean),
        "max_over_mean": round(max(sizes) / mean, 3) if mean else None,
        "oversize_shards": [s["name"] for s in shards if s.get("oversize")],
    }


def format_balance(balance: Mapping[str, Any]) -> str:
    text = f"shard bytes min {balance['min_bytes']:,} / mean {balance['mean_bytes']:,} / max {balance['max_bytes']:,} (max/mean {balance['max_over_mean']})"
    if balance["oversize_shards"]:
        text += f", {len(balance['oversize_shards'])} holding one oversize document"
    return text


class _ShardWriter:
    """Writes one Parquet text shard through `Staging.open_write`, in bounded row groups.

    Documents come in batches (`SourceBatch`) and go into Arrow arrays without a copy; row
    groups hold about `_BATCH_BYTES` or `_BATCH_DOCS` documents, a document larger than
    `_BIG_DOC` one of its own.
    """

    def __init__(self, staging, name: str):
        self.name = name
        self.file = f"{self.name}.parquet"
        self.staging = staging
        self._ctx = staging.open_write(self.file)
        self.path = self._ctx.__enter__()
        self.writer = pq.ParquetWriter(
            self.path,
            SHARD_SCHEMA,
            compression="zstd",
            use_dictionary=["source"],
            write_statistics=False,
        )
        self.pending: list[pa.RecordBatch] = []
        self.pending_bytes = self.pending_docs = 0
        self.n_docs = self.n_bytes = 0
        self._source_column: tuple[str, pa.Array] | None = None

    def add(self, batch: SourceBatch, start: int, stop: int, source: str) -> None:
        """Documents ``start:stop`` of `batch`, from `source`."""
        if start >= stop:
            return
        offsets = batch.offsets
        self.n_docs += stop - start
        self.n_bytes += int(offsets[stop] - offsets[start])
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(batch.data)]
        big = (np.flatnonzero(np.diff(offsets[start : stop + 1]) > _BIG_DOC) + start).tolist()
        i = start
        for b in [*big, stop]:
            while i < b:  # documents i:b are small: fill the pending row group
                room = offsets[i] + (_BATCH_BYTES - self.pending_bytes)
                j = min(b, i + _BATCH_DOCS - self.pending_docs, int(np.searchsorted(offsets, room, side="left")))
                self._append(buffers, i, j, int(offsets[j] - offsets[i]), source)
                if self.pending_bytes >= _BATCH_BYTES or self.pending_docs >= _BATCH_DOCS:
                    self.flush()
                i = j
            if b < stop:  # a huge document goes out on its own
                self.flush()
                self._append(buffers, b, b + 1, int(offsets[b + 1] - offsets[b]), source)
                self.flush()
                i = b + 1

    def _append(self, buffers: list[Any], i: int, j: int, n_bytes: int, source: str) -> None:
        binary = pa.Array.from_buffers(pa.large_binary(), j - i, buffers, offset=i)
        # Bytes were validated as UTF-8 already; the cast re-checks it in C, zero-copy.
        text = binary.cast(pa.large_string())
        self.pending.append(pa.record_batch([text, self._sources(source, j - i)], schema=SHARD_SCHEMA))
        self.pending_bytes += n_bytes
        self.pending_docs += j - i

    def _sources(self, source: str, n: int) -> pa.Array:
        """The source column of `n` documents: a slice of one array of `_BATCH_DOCS` copies of the name."""
        if self._source_column is None or self._source_column[0] != source:
            self._source_column = (source, pa.repeat(pa.scalar(source, pa.string()), _BATCH_DOCS))
        return self._source_column[1].slice(0, n)

    def flush(self) -> None:
        if not self.pending:
            return
        table = pa.Table.from_batches(self.pending, schema=SHARD_SCHEMA)
        self.pending, self.pending_bytes, self.pending_docs = [], 0, 0
        self.writer.write_table(table, row_group_size=table.num_rows)  # one row group

    def close(self) -> dict[str, Any]:
        self.flush()
        self.writer.close()
        self._ctx.__exit__(None, None, None)  # publishes the file into the staging area, hashing it
        self.info: FileInfo = self.staging.written[self.file]
        return {"name": self.name, "file": self.file, "n_docs": self.n_docs, "n_bytes": self.n_bytes}

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(Exception):
            self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)


def _user_label(smeta: Mapping[str, Any], name: str) -> str:
    """What to call a source in messages: the (redacted) path or URL the user gave, when it
    has the same format and compression extensions as the stored name, else that name."""
    url = smeta.get("url")
    if isinstance(url, str) and url and _split_name(url) == _split_name(name):
        return url
    return name


def _in_place_sources(raw: VersionRef, records: list[dict[str, Any]], config: CorpusConfig) -> list[_InPlace]:
    """The referenced sources of a raw version, matched with the config's sources (which
    carry what the records leave out: credentials, query strings)."""
    assert config.sources is not None  # __post_init__ fills in the default
    urls = expand_sources(config.sources, **config.storage_options)
    if [_redact(u) for u in urls] != [r["url"] for r in records]:
        raise InputError(
            f"{raw.key} refers to the sources {[r['url'] for r in records][:5]}, the corpus config names {[_redact(u) for u in urls][:5]}: "
            "shard a referenced raw version with the --corpus sources it was recorded from"
        )
    return [_InPlace(url, record, config.storage_options) for url, record in zip(urls, records)]


def source_groups(sizes: Sequence[int], group_bytes: int) -> list[range]:
    """Consecutive sources in groups of at most `group_bytes` bytes (a larger source alone);
    `group_bytes` 0: one group per source.

    >>> source_groups([10, 10, 10, 50, 5], 25)
    [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    """
    groups: list[range] = []
    start, current = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (group_bytes == 0 or current + size > group_bytes):
            groups.append(range(start, i))
            start, current = i, 0
        current += int(size)
    if len(sizes):
        groups.append(range(start, len(sizes)))
    return groups


def group_shard_counts(group_sizes: Sequence[int], n_shards: int) -> list[int]:
    """`n_shards` shared among source groups in proportion to their bytes (largest
    remainders, ties to the earlier group), at least one shard per group."""
    total = sum(group_sizes)
    if total == 0:
        return [1] * len(group_sizes)
    quotas = [n_shards * size / total for size in group_sizes]
    counts = [max(1, math.floor(q)) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda g: (-(quotas[g] - math.floor(quotas[g])), g))
    for g in order[: max(0, n_shards - sum(counts))]:
        counts[g] += 1
    return counts


def group_shard_name(group: int, k: int, n_groups: int) -> str:
    """Shard `k` of source group `group`: ``shard_<k>`` when the corpus is one group (as a
    single sharder names them), else ``shard_<group>_<k>``."""
    return shard_name(k) if n_groups == 1 else f"shard_{group:06d}_{k:06d}"


@dataclass(frozen=True)
class _RawSources:
    """A raw version's sources as the sharder reads them: (path or in-place reader, stored name), their raw records and message labels."""

    sources: list[tuple[str | _InPlace, str]]
    records: list[dict[str, Any]]
    labels: list[str]

    @property
    def sizes(self) -> list[int]:
        return [int(r["size"]) for r in self.records]


def _raw_sources(store: ArtifactStore, raw: VersionRef, config: CorpusConfig, group: range | None = None) -> _RawSources:
    raw_manifest = store.manifest(raw.kind, raw.version)
    raw_sources = raw_manifest["meta"]["sources"]
    picked = range(len(raw_sources)) if group is None else group
    sources: list[tuple[str | _InPlace, str]]
    if raw_manifest["meta"].get("mode") == "reference":
        in_place = _in_place_sources(raw, raw_sources, config)
        sources = [(in_place[i], raw_sources[i]["name"]) for i in picked]
    else:
        raw_dir = store.local_dir(raw.kind, raw.version)
        sources = [(os.path.join(raw_dir, "sources", raw_sources[i]["name"]), raw_sources[i]["name"]) for i in picked]
    records = [raw_sources[i] for i in picked]
    # Messages name the file the user gave, not the store's copy (`00000_x.txt`), where the
    # two agree on the format; the shards' source column keeps the copy's name.
    labels = [_user_label(smeta, name) for (_, name), smeta in zip(sources, records)]
    return _RawSources(sources, records, labels)


def raw_source_sizes(store: ArtifactStore, raw: VersionRef) -> list[int]:
    """The stored (or referenced) size of each source of a raw version, in source order."""
    return [int(r["size"]) for r in store.manifest(raw.kind, raw.version)["meta"]["sources"]]


def corpus_groups(store: ArtifactStore, raw: VersionRef, config: CorpusConfig) -> list[range]:
    """The sources of each unit of the corpus stage (a source group, or one large source per range of it), by `source_group_bytes`."""
    from pipeline_lib import source_ranges  # it builds on this module

    return [unit.sources for unit in source_ranges.corpus_units(store, raw, config)]


def shard_group(store: ArtifactStore, staging: Staging, raw: VersionRef, config: CorpusConfig, group: int) -> dict[str, Any]:
    """Shard source group `group` of a raw version into `staging`: its completion record
    (the group's shards with their files, its sources, its decode counts).

    The group's bytes are cut into shards of about equal bytes at document boundaries
    (`_ShardPlan`: each shard aims at the bytes left over the shards left; a document
    larger than a shard's share gets a shard of its own, flagged ``oversize``): `n_shards`
    shared among the groups by their size (`group_shard_counts`), or shards of about
    `shard_bytes`. Two streaming passes: the first measures (free for uncompressed
    sources), the second writes; memory stays bounded by the largest document.
    Deterministic: the same raw version and config give byte-identical shards.
    """
    from pipeline_lib import source_ranges  # it builds on this module

    units = source_ranges.corpus_units(store, raw, config)  # source groups, and ranges of large sources
    if not 0 <= group < len(units):
        raise InputError(f"{raw.key}: source group {group} does not exist ({len(units)} groups)")
    src = source_ranges.unit_sources(_raw_sources(store, raw, config, units[group].sources), units[group], config)
    extents = [_source_extent(path, label, config) for (path, _), label in zip(src.sources, src.labels)]
    total = sum(extents)
    if config.shard_bytes:
        n_planned = config.planned_shards(total)
    else:
        n_planned = group_shard_counts([unit.n_bytes for unit in units], config.n_shards)[group]

    shards: list[dict[str, Any]] = []
    per_source: list[dict[str, Any]] = []
    stats = DecodeStats()
    plan = _ShardPlan(max(total, 1), n_planned)
    writer: _ShardWriter | None = None

    def close(oversize: bool = False) -> None:
        nonlocal writer
        assert writer is not None
        record = writer.close()
        if oversize:
            record["oversize"] = True  # one document larger than a shard's share, alone
        record["info"] = asdict(writer.info)
        writer = None
        shards.append(record)

    def write(batch: SourceBatch, start: int, stop: int, source: str) -> None:
        nonlocal writer
        if start < stop:
            if writer is None:
                writer = _ShardWriter(staging, group_shard_name(group, len(shards), len(units)))
            writer.add(batch, start, stop, source)

    try:
        for (path, name), smeta, extent, label in zip(src.sources, src.records, extents, src.labels):
            sstats = DecodeStats()
            last = 0  # source bytes walked through in this source
            for batch in _iter_batches(path, label, config, sstats):
                sizes_ = np.diff(batch.ends, prepend=last)
                last = int(batch.ends[-1])
                start = 0  # first document of the batch not written yet
                for k, close_before, close_after, oversize in plan.place_batch(sizes_):
                    if close_before:
                        write(batch, start, k, name)
                        if writer is not None:
                            close()
                        start = k
                    if close_after:
                        write(batch, start, k + 1, name)
                        close(oversize)
                        start = k + 1
                write(batch, start, len(batch), name)
                del batch
            plan.skip(extent - last)  # bytes after the last document (blank lines, a torn tail)
            stats.add(sstats)
            per_source.append(
                {
                    "name": name,
                    "url": smeta.get("url"),
                    "size": smeta.get("size"),
                    # a referenced source's sha256 is the one of the bytes just read (and checked unchanged)
                    "sha256": path.finish() if isinstance(path, _InPlace) else smeta.get("sha256"),
                    **({"stamp": smeta["stamp"]} if "stamp" in smeta else {}),
                    "n_docs": sstats.documents,
                    "n_bytes": sstats.bytes,
                    "replaced_documents": sstats.replaced_documents,
                    "skipped_documents": sstats.skipped_documents,
                    **(path.range_record() if isinstance(path, source_ranges.SourceRange) else {}),
                }
            )
        if writer is not None:
            close(plan.oversize)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return {"group": group, "extent": total, "shards": shards, "sources": per_source, "stats": asdict(stats)}


def publish_shards(
    raw: VersionRef, records: Sequence[Mapping[str, Any]], config: CorpusConfig, version: str = ""
) -> tuple[dict[str, FileInfo], dict[str, Any]]:
    """The corpus version's (files, meta) from its source groups' completion records, in group order."""
    files: dict[str, FileInfo] = {}
    shards: list[dict[str, Any]] = []
    per_source: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    stats = DecodeStats()
    for record in records:
        group_shards = [{k: v for k, v in s.items() if k != "info"} for s in record["shards"]]
        for s in record["shards"]:
            files[s["file"]] = FileInfo(**s["info"])
        shards.extend(group_shards)
        per_source.extend(record["sources"])
        stats.add(DecodeStats(**record["stats"]))
        groups.append(
            {
                "group": record["group"],
                "sources": [s["name"] for s in record["sources"]],
                "n_bytes": record["stats"]["bytes"],
                "balance": shard_balance(group_shards),
            }
        )
    from pipeline_lib import source_ranges  # it builds on this module

    per_source = source_ranges.merge_ranges(per_source)  # a split source: one record
    urls = [s["url"] for s in per_source][:5]
    if sum(int(r["extent"]) for r in records) == 0:
        raise InputError(f"the corpus {raw.key} is empty (sources: {urls})")
    if stats.documents == 0:
        raise InputError(
            f"the corpus {raw.key} has no documents ({stats.empty_documents} empty, {stats.skipped_documents} skipped for invalid UTF-8; sources: {urls})"
        )
    meta: dict[str, Any] = {
        "shards": shards,
        "n_docs": stats.documents,
        "n_bytes": stats.bytes,
        "n_chars": stats.chars,
        "replaced_documents": stats.replaced_documents,
        "invalid_bytes": stats.invalid_bytes,
        "skipped_documents": stats.skipped_documents,
        "empty_documents": stats.empty_documents,
        "errors_policy": config.errors,
        "sources": per_source,
        "balance": shard_balance(shards),
        "groups": groups,
    }
    log.info("corpus %s: %d shards from %d source group(s), %s", version[:12], len(shards), len(groups), format_balance(meta["balance"]))
    return files, meta


def write_shards(store: ArtifactStore, staging: Staging, raw: VersionRef, config: CorpusConfig) -> tuple[dict[str, FileInfo], dict[str, Any]]:
    """Every source group of a `raw` version sharded into `staging`, one after the other,
    then the corpus version's (files, meta) (what the mapped corpus stage does in parallel)."""
    records = [shard_group(store, staging, raw, config, g) for g in range(len(corpus_groups(store, raw, config)))]
    return publish_shards(raw, records, config, staging.version)


def _open_shard(path: str, with_source: bool) -> pq.ParquetFile:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a readable corpus shard ({e})") from e
    names = pf.schema_arrow.names
    if "text" not in names or (with_source and "source" not in names):
        raise InputError(f"{path}: not a corpus shard (columns {names})")
    return pf


def iter_shard_batches(path: str, rows: int = 2048, with_source: bool = False) -> Iterator[Any]:
    """Yield a Parquet text shard's documents as UTF-8 bytes, `rows` at a time.

    Slices the Arrow string buffer directly: no str objects are built on the way. With
    `with_source`, yields ``(docs, sources)`` pairs. The stages read shards with
    `iter_shard_buffers` instead, which builds no object per document.
    """
    pf = _open_shard(path, with_source)
    columns = ["text", "source"] if with_source else ["text"]
    try:
        for batch in pf.iter_batches(columns=columns, batch_size=rows):
            off, buf, valid = _binary_values(batch.column(0))
            if valid is not None:
                raise InputError(f"{path}: null documents in a corpus shard")
            docs = [bytes(buf[off[i] : off[i + 1]]) for i in range(len(off) - 1)]
            sources = batch.column(1).to_pylist() if with_source else None
            del batch, off, buf  # hold the documents once, not twice
            yield (docs, sources) if with_source else docs
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: corrupt corpus shard ({e})") from e


# Bytes of text per `DocBatch`: big enough that per-batch costs (a native call, its threads'
# start) vanish, small enough that a batch and its token ids stay in memory a few times over.
DOC_BATCH_BYTES = 4 << 20


@dataclass(frozen=True)
class DocBatch:
    """Documents as one UTF-8 buffer and int64 offsets: document k is
    ``data[offsets[k]:offsets[k + 1]]`` (`iter_shard_buffers` gives an Arrow column's own
    buffers, uncopied; ``offsets[0]`` need not be 0). `sources`, when read, holds each
    document's source file."""

    data: memoryview
    offsets: np.ndarray
    sources: pa.Array | None = None

    @classmethod
    def from_docs(cls, docs: Sequence[bytes], sources: Sequence[str] | None = None) -> DocBatch:
        """A batch holding a copy of `docs` (and their `sources`)."""
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, docs), dtype=np.int64, count=len(docs)), out=offsets[1:])
        return cls(memoryview(b"".join(docs)), offsets, None if sources is None else pa.array(sources, pa.string()))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_bytes(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])

    def lengths(self) -> np.ndarray:
        """Each document's length in bytes (int64)."""
        return np.diff(self.offsets)

    def docs(self) -> list[bytes]:
        """The documents as bytes objects, one per document (for callers that need them)."""
        bounds = self.offsets.tolist()
        return [bytes(self.data[a:b]) for a, b in zip(bounds, bounds[1:])]


def _byte_cuts(offsets: np.ndarray, batch_bytes: int) -> list[int]:
    """Document indices that cut `offsets` into runs of about `batch_bytes` (first 0, last the count)."""
    n, total = len(offsets) - 1, int(offsets[-1] - offsets[0])
    pieces = max(1, round(total / batch_bytes))
    if pieces == 1:
        return [0, n]
    targets = offsets[0] + np.arange(1, pieces, dtype=np.int64) * total // pieces
    return sorted({0, n, *np.searchsorted(offsets, targets).tolist()})


def iter_shard_buffers(path: str, batch_bytes: int = DOC_BATCH_BYTES, with_source: bool = False) -> Iterator[DocBatch]:
    """Yield a Parquet text shard's documents in `DocBatch` batches of about `batch_bytes` of
    text each (a bigger document still comes whole), with their sources if `with_source`.

    No object per document: each batch is the Arrow column's data buffer and offsets, read a
    row group at a time in slices of about `batch_bytes` (the row group's metadata gives its
    size), so memory is bounded by about a batch, not by the row group.
    """
    pf = _open_shard(path, with_source)
    columns = ["text", "source"] if with_source else ["text"]
    text_column = pf.metadata.schema.names.index("text")
    try:
        for group in range(pf.num_row_groups):
            meta = pf.metadata.row_group(group)
            pieces = max(1, round(meta.column(text_column).total_uncompressed_size / batch_bytes))
            rows = max(1, -(-meta.num_rows // pieces))
            for batch in pf.iter_batches(columns=columns, batch_size=rows, row_groups=[group]):
                off, buf, valid = _binary_values(batch.column(0))
                if valid is not None:
                    raise InputError(f"{path}: null documents in a corpus shard")
                cuts = _byte_cuts(off, batch_bytes)
                for a, b in zip(cuts, cuts[1:]):
                    yield DocBatch(buf, off[a : b + 1], batch.column(1).slice(a, b - a) if with_source else None)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: corrupt corpus shard ({e})") from e
