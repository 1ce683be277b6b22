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

The code, one concern a module: `corpus_config` (the config, limits, what a file name says),
`corpus_streams` (a source's bytes: in place or copied, decompressed, capped),
`corpus_documents` (a source's documents and the UTF-8 policy), `corpus_sources` (the
download stage: globs, fingerprints, copies, references), `corpus_plan` (shard boundaries
and source groups), this module (the shard stage: batches of documents into Parquet shards,
published), and `corpus_reads` (reading published shards). The names are all here.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib import cancel, source_ranges
from pipeline_lib.corpus_config import (
    _BIG_DOC,
    CORPUS_KIND,
    DEFAULT_CORPUS,
    DEFAULT_SOURCE_GROUP_BYTES,
    DEFAULT_TASK_BYTES,
    MAX_DOCUMENT_BYTES,
    MAX_SHARDS,
    MIN_TASKS,
    RAW_KIND,
    CorpusConfig,
    _split_name,
)
from pipeline_lib.corpus_documents import (
    _SNIFF_BYTES,
    DecodeStats,
    _check_utf8,
    _document_too_big,
    _iter_docs,
    _sniff_binary,
    _source_extent,
    iter_documents,
)
from pipeline_lib.corpus_plan import (
    _ShardPlan,
    format_balance,
    group_shard_counts,
    group_shard_name,
    shard_balance,
    shard_name,
    source_groups,
)
from pipeline_lib.corpus_reads import DOC_BATCH_BYTES, DocBatch, iter_shard_batches, iter_shard_buffers
from pipeline_lib.corpus_sources import (
    _user_label,
    expand_sources,
    fetch_sources,
    reference_sources,
    source_fingerprint,
    stage_sources,
)
from pipeline_lib.corpus_streams import _InPlace, _RawSources, _redact, open_source
from pipeline_lib.fsio import InputError
from pipeline_lib.store import ArtifactStore, FileInfo, Staging, VersionRef

# The corpus API, whichever module below implements it.
__all__ = [
    "CORPUS_KIND",
    "DEFAULT_CORPUS",
    "DEFAULT_SOURCE_GROUP_BYTES",
    "DEFAULT_TASK_BYTES",
    "DOC_BATCH_BYTES",
    "MAX_DOCUMENT_BYTES",
    "MAX_SHARDS",
    "MIN_TASKS",
    "RAW_KIND",
    "SHARD_SCHEMA",
    "CorpusConfig",
    "DecodeStats",
    "DocBatch",
    "SourceBatch",
    "corpus_groups",
    "expand_sources",
    "fetch_sources",
    "format_balance",
    "group_shard_counts",
    "group_shard_name",
    "iter_documents",
    "iter_shard_batches",
    "iter_shard_buffers",
    "open_source",
    "publish_shards",
    "raw_source_sizes",
    "reference_sources",
    "shard_balance",
    "shard_group",
    "shard_name",
    "source_fingerprint",
    "source_groups",
    "stage_sources",
    "write_shards",
]

log = logging.getLogger(__name__)


_BATCH_BYTES = 8 << 20  # Parquet row group / write batch
_BATCH_DOCS = 1 << 16


_BLOCK_BYTES = 16 << 20  # text read per native scan (more while one document spans blocks)


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


def _scan_text(
    scan: Any, path: str | _InPlace, name: str, config: CorpusConfig, stats: DecodeStats
) -> Iterator[SourceBatch]:
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
                _, offsets, ends, consumed, n_lines, chars, empty, invalid, invalid_lines = scan(
                    view[:filled], mode, final, True
                )
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


def _apply_policy(
    batch: SourceBatch, invalid: np.ndarray, linenos: np.ndarray, name: str, errors: str, stats: DecodeStats
) -> SourceBatch:
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


SHARD_SCHEMA = pa.schema([("text", pa.large_string()), ("source", pa.string())])


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
        """The source column of `n` documents: a slice of one array of copies of the name, grown
        by doubling up to `_BATCH_DOCS` (a corpus of many small files makes one per file)."""
        cached = self._source_column
        if cached is None or cached[0] != source or len(cached[1]) < n:
            size = n if cached is None or cached[0] != source else min(_BATCH_DOCS, 2 * len(cached[1]))
            self._source_column = cached = (source, pa.repeat(pa.scalar(source, pa.string()), max(n, size)))
        return cached[1].slice(0, n)

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


def _in_place_sources(raw: VersionRef, records: list[dict[str, Any]], config: CorpusConfig) -> list[_InPlace]:
    """The referenced sources of a raw version, matched with the config's sources (which
    carry what the records leave out: credentials, query strings)."""
    assert config.sources is not None  # __post_init__ fills in the default
    urls = expand_sources(config.sources, **config.storage_options)
    if [_redact(u) for u in urls] != [r["url"] for r in records]:
        raise InputError(
            f"{raw.key} refers to the sources {[r['url'] for r in records][:5]}, the corpus config names "
            f"{[_redact(u) for u in urls][:5]}: "
            "shard a referenced raw version with the --corpus sources it was recorded from"
        )
    return [_InPlace(url, record, config.storage_options) for url, record in zip(urls, records)]


def _raw_sources(
    store: ArtifactStore, raw: VersionRef, config: CorpusConfig, group: range | None = None
) -> _RawSources:
    raw_manifest = store.manifest(raw.kind, raw.version)
    raw_sources = raw_manifest["meta"]["sources"]
    picked = range(len(raw_sources)) if group is None else group
    sources: list[tuple[str | _InPlace, str]]
    if raw_manifest["meta"].get("mode") == "reference":
        in_place = _in_place_sources(raw, raw_sources, config)
        sources = [(in_place[i], raw_sources[i]["name"]) for i in picked]
    else:
        # Each source this unit reads, hash-checked against the manifest (once per process while
        # unchanged; on an object store, downloaded alone): a unit never reads, or hashes, the
        # rest of the raw version, which at a terabyte every worker would otherwise do.
        names = [raw_sources[i]["name"] for i in picked]
        paths = store.local_files(raw.kind, raw.version, [f"sources/{name}" for name in names])
        sources = list(zip(paths, names))
    records = [raw_sources[i] for i in picked]
    # Messages name the file the user gave, not the store's copy (`00000_x.txt`), where the
    # two agree on the format; the shards' source column keeps the copy's name.
    labels = [_user_label(smeta, name) for (_, name), smeta in zip(sources, records)]
    return _RawSources(sources, records, labels)


def raw_source_sizes(store: ArtifactStore, raw: VersionRef) -> list[int]:
    """The stored (or referenced) size of each source of a raw version, in source order."""
    return [int(r["size"]) for r in store.manifest(raw.kind, raw.version)["meta"]["sources"]]


def corpus_groups(store: ArtifactStore, raw: VersionRef, config: CorpusConfig) -> list[range]:
    """The sources of each unit of the corpus stage (a source group, or one large source per range of it), by
    `source_group_bytes`."""
    return [unit.sources for unit in source_ranges.corpus_units(store, raw, config)]


def shard_group(
    store: ArtifactStore, staging: Staging, raw: VersionRef, config: CorpusConfig, group: int
) -> dict[str, Any]:
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
    per_source = source_ranges.merge_ranges(per_source)  # a split source: one record
    urls = [s["url"] for s in per_source][:5]
    if sum(int(r["extent"]) for r in records) == 0:
        raise InputError(f"the corpus {raw.key} is empty (sources: {urls})")
    if stats.documents == 0:
        raise InputError(
            f"the corpus {raw.key} has no documents ({stats.empty_documents} empty, {stats.skipped_documents} skipped "
            f"for invalid UTF-8; sources: {urls})"
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
    log.info(
        "corpus %s: %d shards from %d source group(s), %s",
        version[:12],
        len(shards),
        len(groups),
        format_balance(meta["balance"]),
    )
    return files, meta


def write_shards(
    store: ArtifactStore, staging: Staging, raw: VersionRef, config: CorpusConfig
) -> tuple[dict[str, FileInfo], dict[str, Any]]:
    """Every source group of a `raw` version sharded into `staging`, one after the other,
    then the corpus version's (files, meta) (what the mapped corpus stage does in parallel)."""
    records = [shard_group(store, staging, raw, config, g) for g in range(len(corpus_groups(store, raw, config)))]
    return publish_shards(raw, records, config, staging.version)
