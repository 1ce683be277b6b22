"""Token shards: the encoded corpus, one flat `.npy` per shard, loadable in two lines.

Per shard ``shard_000000``:

* ``shard_000000.npy``: 1-D little-endian ``<u2`` when the vocabulary has at most 65,536
  ids, else ``<u4`` — ``np.load(path, mmap_mode="r", allow_pickle=False)``;
* ``shard_000000.idx.npy``: ``<u8`` cumulative document *end* offsets (last = n_tokens);
* ``shard_000000.docs.parquet`` (optional, `EncodeConfig.doc_table`): one row per
  document — shard, start, n_tokens, n_bytes, source file, sha256 of the text — to trace
  tokens back to their text and to deduplicate;

and the version's manifest ``meta`` (`build_meta`) carries the format version, dtype,
vocabulary size, separator token (id and placement), tokenizer version and ranks sha256,
the sources with their size and sha256, the encoder's code version and parameters,
per-shard counts and hashes, the train/validation split (each shard's ``val_start``: its
last whole documents, `EncodeConfig.val_fraction` of its tokens, decided here once and
used by the LM trainer and every export), and totals. `check_shards` is the one integrity checker;
`open_tokens` the memory-mapped reader (it checks the file size against the header
first); `export_nanogpt` / `export_llmc` write the flat ``.bin`` files those trainers read
(and nanoGPT's ``meta.pkl``), with the separator on either side of each document.

This module writes shards (`encode_documents`, `encode_shard_file`, `build_meta`) and is
where the whole API is imported from; the reads and the split are in `token_reads`, the
checker in `token_checks`, the exports in `token_exports`.

Verified reads: a directory holding the store's ``manifest.json`` is a published version
(or a hash-checked cache copy of one), and every reader here checks each file it reads
against that manifest's size and sha256 before using it (`verify_file`), hashing a file
once per process while it is unchanged (`fsio.check_local_file`). A directory without
one (your own files) gets the header and size checks only. ``verify=False`` (``deep=False``
for `check_shards`) skips the hash, for callers that verified already.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.config import STRICT, doc
from pipeline_lib.formats import npy_header
from pipeline_lib.fsio import InputError
from pipeline_lib.token_checks import check_shards
from pipeline_lib.token_exports import (
    LLMC_MAGIC,
    LLMC_VERSION,
    NANOGPT_META,
    NANOGPT_VOCAB_MULTIPLE,
    Placement,
    export_llmc,
    export_nanogpt,
    nanogpt_meta,
)
from pipeline_lib.token_files import (
    DEFAULT_VAL_FRACTION,
    _search,
    check_version_file,
    published_files,
    split_record,
    val_start,
)
from pipeline_lib.token_reads import (
    _CHECK_CHUNK,
    DOC_TABLE_SCHEMA,
    MAX_SHARD_TOKENS,
    TOKENS_FORMAT,
    TOKENS_KIND,
    open_index,
    open_tokens,
    read_doc_table,
    split_points,
    token_dtype,
    verify_file,
    version_files,
)

# The token-shard API, whichever module below implements it (the LM reads token files
# through token_files alone, without pyarrow or pydantic).
__all__ = [
    "DEFAULT_VAL_FRACTION",
    "DOC_TABLE_SCHEMA",
    "EncodeConfig",
    "LLMC_MAGIC",
    "LLMC_VERSION",
    "MAX_SHARD_TOKENS",
    "NANOGPT_META",
    "NANOGPT_VOCAB_MULTIPLE",
    "NpyStreamWriter",
    "Placement",
    "ShardStats",
    "TOKENS_FORMAT",
    "TOKENS_KIND",
    "build_meta",
    "check_shards",
    "check_version_file",
    "encode_documents",
    "encode_shard_file",
    "export_llmc",
    "export_nanogpt",
    "nanogpt_meta",
    "open_index",
    "open_tokens",
    "published_files",
    "read_doc_table",
    "sha256_documents",
    "split_points",
    "split_record",
    "token_dtype",
    "val_start",
    "verify_file",
    "version_files",
]

_DOC_ROWS = 1 << 16


@dataclass(frozen=True)
class EncodeConfig:
    __pydantic_config__ = STRICT

    separator: Annotated[
        str | None, doc("document separator, a special token of the tokenizer; none (or '') for no separator")
    ] = "<|endoftext|>"
    placement: Annotated[
        Literal["append", "prepend"],
        doc("separator after each document (nanoGPT, datatrove) or before it (llm.c, nanochat)"),
    ] = "append"
    # 1: the flows already encode the shards in parallel (one task each).
    workers: Annotated[int, doc("native encoding threads per shard (0 = all cores)")] = 1
    doc_table: Annotated[bool, doc("also write <shard>.docs.parquet (one row per document)")] = True
    val_fraction: Annotated[
        float,
        doc(
            "validation share: each shard's last whole documents nearest this fraction of its tokens; "
            "recorded in the manifest, the one split the LM and every export use"
        ),
    ] = 0.1

    def __post_init__(self):
        if self.placement not in ("append", "prepend"):
            raise InputError(f"placement={self.placement!r}: choose append or prepend")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise InputError(f"workers={self.workers!r}: a number of threads >= 0")
        if (
            not isinstance(self.val_fraction, (int, float))
            or isinstance(self.val_fraction, bool)
            or not 0 <= self.val_fraction < 1
        ):
            raise InputError(f"val_fraction={self.val_fraction!r}: a fraction in [0, 1)")

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        del p["workers"]  # does not change the output
        return p


class NpyStreamWriter:
    """Append 1-D chunks to a `.npy` file whose length is unknown until the end."""

    def __init__(self, path: str, dtype: np.dtype):
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self.f = open(path, "wb")
        self.f.write(npy_header(self.dtype.str, 0))

    def write(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        self.f.write(arr.data.cast("B"))
        self.n += len(arr)

    def close(self) -> None:
        if self.f.closed:
            return
        self.f.seek(0)
        self.f.write(npy_header(self.dtype.str, self.n))
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


@dataclass(frozen=True)
class ShardStats:
    name: str
    n_tokens: int
    n_docs: int
    n_bytes: int
    val_start: int | None = None  # tokens [val_start, n_tokens) are validation (`val_start`)
    val_docs: int | None = None  # the documents in them


def _separator_id(tokenizer, config: EncodeConfig) -> int | None:
    if config.separator is None:
        return None
    if config.separator not in tokenizer.special_tokens:
        raise InputError(f"separator {config.separator!r} is not a special token of {tokenizer!r}")
    sep = int(tokenizer.special_tokens[config.separator])
    if not 0 <= sep < tokenizer.vocab_size:
        raise InputError(f"separator id {sep} is outside the vocabulary (size {tokenizer.vocab_size})")
    return sep


def sha256_documents(batch: Any) -> bytes:
    """The sha256 digest of each document of a `DocBatch`, concatenated (32 bytes each):
    computed by the compiled core when it is built, no Python object per document."""
    from pipeline_lib.tokenizer import native

    if native._CORE is not None:
        return native._CORE.sha256_documents(batch.data, batch.offsets)
    bounds = batch.offsets.tolist()
    return b"".join([hashlib.sha256(batch.data[a:b]).digest() for a, b in zip(bounds, bounds[1:])])


def _doc_rows(batch: Any, shard: int, starts: np.ndarray, n_tokens: np.ndarray) -> pa.RecordBatch:
    """The doc table's rows of a `DocBatch`: lengths from its offsets, a sha256 per document."""
    if batch.sources is None:
        raise ValueError("a doc table needs each document's source: read the batches with_source=True")
    digests = sha256_documents(batch)
    columns = [
        pa.array(np.full(len(batch), shard, dtype=np.int32)),
        pa.array(starts),
        pa.array(n_tokens),
        pa.array(batch.lengths()),
        batch.sources,
        pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), len(batch), [None, pa.py_buffer(digests)]),
    ]
    return pa.record_batch(columns, schema=DOC_TABLE_SCHEMA)


def encode_documents(
    tokenizer,
    batches: Iterable[Any],
    tokens_path: str,
    index_path: str,
    config: EncodeConfig,
    name: str,
    doc_table_path: str | None = None,
    shard: int = 0,
) -> ShardStats:
    """Encode documents into a token `.npy`, its document index and optionally a doc table.

    `batches` yields `corpus.DocBatch` es (read with their sources when `doc_table_path` is
    given), or lists of UTF-8 document bytes, or ``(docs, sources)`` pairs when
    `doc_table_path` is given (copied into a `DocBatch` each). Nothing is done per document
    in Python. Memory is bounded by one batch. Every file is written to
    exactly the path given.
    """
    from pipeline_lib.corpus import DocBatch

    sep = _separator_id(tokenizer, config)
    dtype = token_dtype(tokenizer.vocab_size)
    writer = NpyStreamWriter(tokens_path, dtype)
    table = (
        pq.ParquetWriter(
            doc_table_path, DOC_TABLE_SCHEMA, compression="zstd", use_dictionary=["source"], write_statistics=False
        )
        if doc_table_path
        else None
    )
    rows: list[pa.RecordBatch] = []
    ends = NpyStreamWriter(index_path, np.dtype("<u8"))  # streamed too: nothing grows with the shard
    n_docs = n_bytes = 0

    def flush_rows() -> None:
        if table is not None and rows:
            table.write_table(pa.Table.from_batches(rows, schema=DOC_TABLE_SCHEMA))
            rows.clear()

    try:
        for batch in batches:
            if not isinstance(batch, DocBatch):
                batch = DocBatch.from_docs(*batch) if doc_table_path is not None else DocBatch.from_docs(batch)
            n = len(batch)
            if not n:
                continue
            flat, offsets = tokenizer.encode_ordinary_buffer_to_numpy(batch.data, batch.offsets, config.workers)
            flat = np.asarray(flat)
            offsets = np.asarray(offsets, dtype=np.int64)
            lengths = np.diff(offsets)
            if len(flat) and int(flat.max()) >= tokenizer.vocab_size:
                raise InputError(
                    f"{name}: the tokenizer produced id {int(flat.max())}, outside its vocabulary "
                    f"({tokenizer.vocab_size})"
                )
            base = writer.n
            if base + len(flat) + (n if sep is not None else 0) > MAX_SHARD_TOKENS:
                raise InputError(
                    f"{name}: more than {MAX_SHARD_TOKENS:,} tokens in one shard; shard the corpus into "
                    "more pieces (n_shards)"
                )
            if sep is not None and n <= 64:
                # Few (maybe huge) documents: stream them with their separators, no copy of the batch.
                sep_arr = np.array([sep], dtype=dtype)
                for i in range(n):
                    if config.placement == "prepend":
                        writer.write(sep_arr)
                    for a in range(int(offsets[i]), int(offsets[i + 1]), _CHECK_CHUNK):
                        writer.write(flat[a : min(int(offsets[i + 1]), a + _CHECK_CHUNK)])
                    if config.placement == "append":
                        writer.write(sep_arr)
                lengths = lengths + 1
            elif sep is not None:
                # Interleave one separator per document, before or after its tokens.
                out = np.empty(len(flat) + n, dtype=dtype)
                starts = offsets[:-1] + np.arange(n)
                sep_pos = starts if config.placement == "prepend" else starts + lengths
                mask = np.ones(len(out), dtype=bool)
                mask[sep_pos] = False
                out[sep_pos] = sep
                out[mask] = flat
                del mask
                lengths = lengths + 1
                writer.write(out)
                del out
            else:
                for a in range(0, len(flat), _CHECK_CHUNK):
                    writer.write(flat[a : a + _CHECK_CHUNK])
            del flat
            doc_ends = base + np.cumsum(lengths, dtype=np.int64)
            ends.write(doc_ends)
            if table is not None:
                rows.append(_doc_rows(batch, shard, doc_ends - lengths, lengths))
                if sum(map(len, rows)) >= _DOC_ROWS:
                    flush_rows()
            n_docs += n
            n_bytes += batch.n_bytes
        flush_rows()
    finally:
        writer.close()
        ends.close()
        if table is not None:
            table.close()
    doc_ends = np.load(index_path, mmap_mode="r", allow_pickle=False) if n_docs else np.zeros(0, np.int64)
    start = val_start(doc_ends, writer.n, config.val_fraction)
    n_val_docs = n_docs - _search(doc_ends, start, side="right")
    return ShardStats(
        name=name, n_tokens=writer.n, n_docs=n_docs, n_bytes=n_bytes, val_start=start, val_docs=n_val_docs
    )


def encode_shard_file(
    tokenizer,
    src_path: str,
    tokens_path: str,
    index_path: str,
    config: EncodeConfig,
    name: str,
    shard: int = 0,
    doc_table_path: str | None = None,
) -> ShardStats:
    """Encode one Parquet text shard (from `shard_corpus`) into token files, a `DocBatch` at a time."""
    from pipeline_lib.corpus import iter_shard_buffers

    batches = iter_shard_buffers(src_path, with_source=doc_table_path is not None)
    return encode_documents(
        tokenizer, batches, tokens_path, index_path, config, name, doc_table_path=doc_table_path, shard=shard
    )


# --------------------------------------------------------------------------- manifest
def build_meta(
    records: Sequence[Mapping[str, Any]],
    tokenizer_meta: Mapping[str, Any],
    tokenizer_key: str,
    config: EncodeConfig,
    *,
    code_version: str = "",
    corpus_key: str | None = None,
    corpus_meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The tokens manifest's ``meta`` from the per-shard records of `encode_shard`."""
    vocab_size = int(tokenizer_meta["vocab_size"])
    sep = None
    if config.separator is not None:
        sep = {
            "token": config.separator,
            "id": int(tokenizer_meta["special_tokens"][config.separator]),
            "placement": config.placement,
        }
    shards = []
    for r in records:
        entry = {k: r[k] for k in ("name", "n_tokens", "n_docs", "n_bytes", "sha256")}
        files = r.get("files", {})
        idx = files.get(f"{r['name']}.idx.npy")
        if idx:
            entry["index_sha256"] = idx["sha256"]
        docs = files.get(f"{r['name']}.docs.parquet")
        if docs:
            entry["doc_table"] = f"{r['name']}.docs.parquet"
            entry["doc_table_sha256"] = docs["sha256"]
        if r.get("val_start") is not None:  # the split, decided at encoding (`val_start`)
            entry["val_start"], entry["val_docs"] = int(r["val_start"]), int(r["val_docs"])
        shards.append(entry)
    sources = [{k: s.get(k) for k in ("name", "url", "size", "sha256")} for s in (corpus_meta or {}).get("sources", [])]
    return {
        "format": TOKENS_FORMAT,
        "dtype": token_dtype(vocab_size).name,
        "vocab_size": vocab_size,
        "separator": sep,
        "tokenizer": {
            "version": tokenizer_key,
            "ranks_sha256": tokenizer_meta.get("ranks_sha256"),
            "pattern": tokenizer_meta.get("pattern"),
        },
        "encoder": {"code_version": code_version, "params": config.params()},
        "corpus": corpus_key,
        "sources": sources,
        "doc_table": bool(config.doc_table),
        "shards": shards,
        "totals": {k: int(sum(r[k] for r in records)) for k in ("n_tokens", "n_docs", "n_bytes")},
        **(
            {"split": split_record(config.val_fraction)} if all(r.get("val_start") is not None for r in records) else {}
        ),
    }
