"""Corpus ingestion: fetch sources through fsspec, read documents, split into Parquet shards.

Sources are URLs or globs (``file://``, ``https://``, ``s3://``, ``memory://``, plain
paths) of ``.txt``, ``.jsonl`` or ``.parquet`` files, optionally ``.gz``, ``.bz2``, ``.xz``
or ``.zst`` compressed. Everything streams: memory is bounded by the largest document,
not by the corpus.

A document is a line, a paragraph or a whole file for text files (`CorpusConfig.documents`),
a record for JSONL and a row for Parquet. Bytes that are not UTF-8 are replaced, or skip
their document, or fail the run (`CorpusConfig.errors`); the counts go in the manifest.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.fsio import InputError, filesystem
from pipeline_lib.store import ArtifactStore, FileInfo, VersionRef, version_id
from pipeline_lib.version import code_version

RAW_KIND = "raw"
CORPUS_KIND = "corpus"
DEFAULT_CORPUS = os.path.join(os.path.dirname(__file__), "data", "tinyshakespeare.txt")
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
_FORMATS = (".txt", ".text", ".md", ".jsonl", ".json", ".parquet")
_SNIFF_BYTES = 1 << 16
_BATCH_BYTES = 8 << 20


@dataclass(frozen=True)
class CorpusConfig:
    """How to read and shard a corpus."""

    sources: tuple[str, ...] = (DEFAULT_CORPUS,)  # URLs or globs
    documents: str = "line"  # text files: "line" | "paragraph" | "file"
    text_field: str = "text"  # JSONL field / Parquet column holding the text
    errors: str = "replace"  # invalid UTF-8: "replace" | "skip-document" | "fail"
    n_shards: int = 2  # output shards of about equal bytes, split at document boundaries
    max_source_bytes: int = 64 << 30  # cap on one source's decompressed size (bomb guard)
    storage_options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if not self.sources:
            raise InputError("no corpus sources given")
        if self.documents not in ("line", "paragraph", "file"):
            raise InputError(f"documents={self.documents!r}: choose line, paragraph or file")
        if self.errors not in ("replace", "skip-document", "fail"):
            raise InputError(f"errors={self.errors!r}: choose replace, skip-document or fail")
        if not 1 <= self.n_shards <= 100_000:
            raise InputError(f"n_shards={self.n_shards}: must be between 1 and 100000")
        if self.max_source_bytes <= 0:
            raise InputError("max_source_bytes must be positive")

    def shard_params(self) -> dict[str, Any]:
        """The parameters that decide the shards' content (part of their version id)."""
        p = asdict(self)
        del p["sources"], p["storage_options"]
        return p


# --------------------------------------------------------------------------- sources
def _split_name(name: str) -> tuple[str, str]:
    """(format extension, compression extension) of a file name."""
    lower = name.lower()
    comp = next((c for c in _COMPRESSIONS if lower.endswith(c)), "")
    base = lower[: len(lower) - len(comp)] if comp else lower
    fmt = next((f for f in _FORMATS if base.endswith(f)), ".txt")
    return fmt, comp


def expand_sources(sources: tuple[str, ...], **storage_options: Any) -> list[str]:
    """Expand globs; each source must name at least one file."""
    urls: list[str] = []
    for src in sources:
        fs, path = filesystem(src, **storage_options)
        if any(ch in path for ch in "*?["):
            hits = sorted(fs.glob(path))
            if not hits:
                raise InputError(f"corpus source {src!r} matches no files")
            urls.extend(fs.unstrip_protocol(h) if "://" in src else h for h in hits)
        else:
            try:
                info = fs.info(path)
            except FileNotFoundError:
                raise InputError(f"corpus source {src!r}: no such file") from None
            except OSError as e:
                raise InputError(f"corpus source {src!r}: cannot reach it ({e})") from e
            if info.get("type") == "directory":
                raise InputError(f"corpus source {src!r} is a directory; give files or a glob like {src.rstrip('/')}/*.txt")
            urls.append(src)
    return urls


def source_fingerprint(sources: tuple[str, ...], **storage_options: Any) -> list[dict[str, Any]]:
    """Cheap identity of the sources (size, mtime / ETag) for cache keys, without reading them."""
    out = []
    for url in expand_sources(sources, **storage_options):
        fs, path = filesystem(url, **storage_options)
        info = fs.info(path)
        out.append({
            "url": url,
            "size": info.get("size"),
            "stamp": str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or info.get("last_modified") or ""),
        })
    return out


def download_corpus(store: ArtifactStore, config: CorpusConfig) -> VersionRef:
    """Copy the sources into the store as a `raw` version, content-addressed by their sha256."""
    urls = expand_sources(config.sources, **config.storage_options)
    tmpdir = tempfile.mkdtemp(prefix="tokenmill-download-")
    try:
        fetched = []
        for i, url in enumerate(urls):
            fs, path = filesystem(url, **config.storage_options)
            local = os.path.join(tmpdir, f"{i:05d}")
            h, size = hashlib.sha256(), 0
            try:
                with fs.open(path, "rb") as src, open(local, "wb") as dst:
                    while chunk := src.read(8 << 20):
                        h.update(chunk)
                        size += len(chunk)
                        dst.write(chunk)
            except FileNotFoundError:
                raise InputError(f"corpus source {url!r}: no such file") from None
            base = os.path.basename(path.rstrip("/")) or "source"
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base).strip(".") or "source"
            fetched.append({"url": url, "local": local, "name": f"{i:05d}_{safe}", "size": size, "sha256": h.hexdigest()})
        if sum(f["size"] for f in fetched) == 0:
            raise InputError(f"the corpus {list(config.sources)} is empty (0 bytes)")
        content = [{"name": f["name"], "sha256": f["sha256"]} for f in fetched]
        code = code_version("pipeline_lib.corpus")
        version = version_id(RAW_KIND, {}, {"content": content}, code)
        if store.exists(RAW_KIND, version):
            return store.ref(RAW_KIND, version)
        staging = store.stage(RAW_KIND, version)
        files: dict[str, FileInfo] = {}
        for f in fetched:
            files[f"sources/{f['name']}"] = staging.put_file(f"sources/{f['name']}", f["local"], move=True)
        sources_meta = [{k: f[k] for k in ("url", "name", "size", "sha256")} for f in fetched]
        return store.publish(
            staging, files=files, params={"content": content}, code_version=code,
            meta={
                "sources": sources_meta,
                "n_bytes": sum(f["size"] for f in fetched),
                "fingerprint": source_fingerprint(config.sources, **config.storage_options),
            },
        )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


# --------------------------------------------------------------------------- documents
class _CappedReader(io.RawIOBase):
    """Counts decompressed bytes and refuses to go past the cap (zip-bomb guard)."""

    def __init__(self, inner: BinaryIO, cap: int, name: str):
        self.inner, self.cap, self.name, self.n = inner, cap, name, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            data = self.inner.read(len(b))
        except (EOFError, OSError, lzma.LZMAError) as e:
            raise InputError(f"{self.name}: corrupt or truncated archive ({e})") from e
        n = len(data)
        self.n += n
        if self.n > self.cap:
            raise InputError(f"{self.name}: decompresses to more than {self.cap:,} bytes (max_source_bytes); refusing a possible decompression bomb")
        b[:n] = data
        return n


class _ZstdReader(io.RawIOBase):
    """Streaming zstd decompression that notices truncation (zstandard's reader does not).

    Compressed input goes in small pieces so one read can never inflate far past the cap:
    a 1 KiB piece of RLE blocks expands to at most tens of MB.
    """

    def __init__(self, raw: BinaryIO, name: str):
        import zstandard

        self._zstd = zstandard
        self.raw, self.name = raw, name
        self.d = zstandard.ZstdDecompressor().decompressobj()
        self.pending = b""
        self.started = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.pending:
            chunk = self.raw.read(1024)
            if not chunk:
                if self.started and not self.d.eof:
                    raise InputError(f"{self.name}: truncated zstd archive (the last frame is incomplete)")
                return 0
            self.started = True
            try:
                self.pending = self.d.decompress(chunk)
                while self.d.eof and self.d.unused_data:
                    rest = self.d.unused_data
                    self.d = self._zstd.ZstdDecompressor().decompressobj()
                    self.pending += self.d.decompress(rest)
            except self._zstd.ZstdError as e:
                raise InputError(f"{self.name}: corrupt zstd archive ({e})") from e
            if self.d.eof:
                self.d = self._zstd.ZstdDecompressor().decompressobj()
                self.started = False
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


@contextlib.contextmanager
def open_source(path: str, name: str, cap: int) -> Iterator[BinaryIO]:
    """Open a local source file, decompressing by extension, with the size cap."""
    _, comp = _split_name(name)
    with open(path, "rb") as raw:
        if comp == ".gz":
            inner: BinaryIO = gzip.GzipFile(fileobj=raw)
        elif comp == ".bz2":
            inner = bz2.BZ2File(raw)
        elif comp == ".xz":
            inner = lzma.LZMAFile(raw)
        elif comp == ".zst":
            inner = _ZstdReader(raw, name)
        else:
            inner = raw
        yield io.BufferedReader(_CappedReader(inner, cap, name), buffer_size=1 << 20)


@dataclass
class DecodeStats:
    documents: int = 0
    bytes: int = 0
    chars: int = 0
    replaced_documents: int = 0
    skipped_documents: int = 0
    empty_documents: int = 0


def _decode(data: bytes, errors: str, where: str, stats: DecodeStats) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if errors == "fail":
            raise InputError(f"{where}: invalid UTF-8 at byte {e.start} ({e.reason}); use errors='replace' or 'skip-document' to go on") from None
        if errors == "skip-document":
            stats.skipped_documents += 1
            return None
        stats.replaced_documents += 1
        return data.decode("utf-8", "replace")


def _sniff_binary(head: bytes, name: str) -> None:
    if not head:
        return
    nul = head.count(0)
    invalid = len(head) - len(head.decode("utf-8", "ignore").encode("utf-8"))
    if nul > len(head) // 100 + 1 or invalid > len(head) // 10 + 4:
        raise InputError(f"{name}: looks like a binary file, not text ({nul} NUL and {invalid} non-UTF-8 bytes in the first {len(head)} bytes)")


def iter_documents(path: str, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[str]:
    """Yield the documents of one local source file as text."""
    fmt, _ = _split_name(name)
    if fmt == ".parquet":
        yield from _iter_parquet(path, name, config, stats)
        return
    with open_source(path, name, config.max_source_bytes) as f:
        _sniff_binary(f.peek(_SNIFF_BYTES)[:_SNIFF_BYTES], name)
        if fmt in (".jsonl", ".json"):
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                text = _decode(line, config.errors, f"{name}:{lineno}", stats)
                if text is None:
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as e:
                    raise InputError(f"{name}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(record, dict) or config.text_field not in record:
                    raise InputError(f"{name}:{lineno}: record has no {config.text_field!r} field (set text_field to the field holding the text)")
                value = record[config.text_field]
                if not isinstance(value, str):
                    raise InputError(f"{name}:{lineno}: field {config.text_field!r} is {type(value).__name__}, not text")
                yield from _emit(value, stats)
        elif config.documents == "file":
            text = _decode(f.read(), config.errors, name, stats)
            if text is not None:
                yield from _emit(text, stats)
        elif config.documents == "line":
            for lineno, line in enumerate(f, start=1):
                text = _decode(line.rstrip(b"\r\n"), config.errors, f"{name}:{lineno}", stats)
                if text is not None:
                    yield from _emit(text, stats)
        else:  # paragraph
            para: list[bytes] = []
            start = 1
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    if not para:
                        start = lineno
                    para.append(line)
                elif para:
                    text = _decode(b"".join(para).rstrip(b"\r\n"), config.errors, f"{name}:{start}", stats)
                    para = []
                    if text is not None:
                        yield from _emit(text, stats)
            if para:
                text = _decode(b"".join(para).rstrip(b"\r\n"), config.errors, f"{name}:{start}", stats)
                if text is not None:
                    yield from _emit(text, stats)


def _emit(text: str, stats: DecodeStats) -> Iterator[str]:
    if not text:
        stats.empty_documents += 1
        return
    stats.documents += 1
    stats.bytes += len(text.encode("utf-8"))
    stats.chars += len(text)
    yield text


def _iter_parquet(path: str, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[str]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{name}: not a readable Parquet file ({e})") from e
    if config.text_field not in pf.schema_arrow.names:
        raise InputError(f"{name}: no column {config.text_field!r} (columns: {pf.schema_arrow.names}); set text_field")
    try:
        for batch in pf.iter_batches(columns=[config.text_field], batch_size=4096):
            col = batch.column(0)
            if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                for i, v in enumerate(col.to_pylist()):
                    if v is not None:
                        text = _decode(v, config.errors, f"{name}: row {i}", stats)
                        if text is not None:
                            yield from _emit(text, stats)
            elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                for v in col.to_pylist():
                    if v is not None:
                        yield from _emit(v, stats)
            else:
                raise InputError(f"{name}: column {config.text_field!r} has type {col.type}, not text")
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{name}: corrupt Parquet file ({e})") from e


# --------------------------------------------------------------------------- sharding
SHARD_SCHEMA = pa.schema([("text", pa.large_string()), ("source", pa.string())])


def shard_name(i: int) -> str:
    return f"shard_{i:06d}"


def shard_corpus(store: ArtifactStore, raw: VersionRef, config: CorpusConfig) -> VersionRef:
    """Split a `raw` version into `n_shards` Parquet shards of about equal bytes."""
    params = config.shard_params()
    code = code_version("pipeline_lib.corpus")
    version = version_id(CORPUS_KIND, {"raw": raw.key}, params, code)
    if store.exists(CORPUS_KIND, version):
        return store.ref(CORPUS_KIND, version)
    raw_manifest = store.manifest(raw.kind, raw.version)
    raw_dir = store.local_dir(raw.kind, raw.version)
    sources = [(os.path.join(raw_dir, "sources", s["name"]), s["name"]) for s in raw_manifest["meta"]["sources"]]

    # Pass 1 sizes the shards; pass 2 writes them. Two streaming passes keep memory flat.
    total = DecodeStats()
    for path, name in sources:
        for _ in iter_documents(path, name, config, total):
            pass
    if total.documents == 0:
        raise InputError(f"the corpus has no documents ({total.empty_documents} empty, {total.skipped_documents} skipped for invalid UTF-8)")

    staging = store.stage(CORPUS_KIND, version)
    target = total.bytes / config.n_shards
    shards: list[dict[str, Any]] = []
    files: dict[str, FileInfo] = {}
    stats = DecodeStats()
    writer_ctx = None
    writer = None
    texts: list[str] = []
    names: list[str] = []
    batch_bytes = 0
    shard_docs = shard_bytes = 0

    def flush():
        nonlocal texts, names, batch_bytes
        if texts:
            writer.write_batch(pa.record_batch([pa.array(texts, pa.large_string()), pa.array(names, pa.string())], schema=SHARD_SCHEMA))
        texts, names, batch_bytes = [], [], 0

    def close_shard():
        nonlocal writer, writer_ctx, shard_docs, shard_bytes
        flush()
        writer.close()
        name = f"{shard_name(len(shards))}.parquet"
        files[name] = staging.put_file(name, writer_ctx, move=True)
        shards.append({"name": shard_name(len(shards)), "file": name, "n_docs": shard_docs, "n_bytes": shard_bytes})
        writer, writer_ctx, shard_docs, shard_bytes = None, None, 0, 0

    tmpdir = staging.path if store.local else tempfile.mkdtemp(prefix="tokenmill-shard-")
    done_bytes = 0
    for path, name in sources:
        for text in iter_documents(path, name, config, stats):
            n = len(text.encode("utf-8"))
            if writer is None:
                fd, writer_ctx = tempfile.mkstemp(dir=tmpdir, prefix=".tmp-", suffix=".parquet")
                os.close(fd)
                writer = pq.ParquetWriter(writer_ctx, SHARD_SCHEMA, compression="zstd")
            texts.append(text)
            names.append(name)
            batch_bytes += n
            shard_docs += 1
            shard_bytes += n
            done_bytes += n
            if batch_bytes >= _BATCH_BYTES:
                flush()
            if len(shards) < config.n_shards - 1 and done_bytes >= target * (len(shards) + 1):
                close_shard()
    if writer is not None:
        close_shard()
    meta = {
        "shards": shards,
        "n_docs": stats.documents,
        "n_bytes": stats.bytes,
        "n_chars": stats.chars,
        "replaced_documents": stats.replaced_documents,
        "skipped_documents": stats.skipped_documents,
        "empty_documents": stats.empty_documents,
        "errors_policy": config.errors,
    }
    return store.publish(staging, files=files, parents={"raw": raw}, params=params, code_version=code, meta=meta)


def iter_shard_batches(path: str, rows: int = 2048) -> Iterator[list[bytes]]:
    """Yield a Parquet text shard's documents as UTF-8 bytes, `rows` at a time.

    Slices the Arrow string buffer directly: no str objects are built on the way.
    """
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(columns=["text"], batch_size=rows):
        col = batch.column(0)
        _, offsets, data = col.buffers()
        off = np.frombuffer(offsets, dtype=np.int64, count=len(col) + 1, offset=col.offset * 8)
        buf = memoryview(data) if data is not None else memoryview(b"")
        yield [bytes(buf[off[i] : off[i + 1]]) for i in range(len(col))]
