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

Verified reads: a directory holding the store's ``manifest.json`` is a published version
(or a hash-checked cache copy of one), and every reader here checks each file it reads
against that manifest's size and sha256 before using it (`verify_file`), hashing a file
once per process while it is unchanged (`fsio.check_local_file`). A directory without
one (your own files) gets the header and size checks only. ``verify=False`` (``deep=False``
for `check_shards`) skips the hash, for callers that verified already.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle  # nanoGPT's meta.pkl, written only (export_nanogpt)
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.config import STRICT, doc
from pipeline_lib.errors import StoreError
from pipeline_lib.fsio import InputError, fsync_dir, hash_file, user_file_mode
from pipeline_lib.store import MANIFEST, MAX_MANIFEST_BYTES
from pipeline_lib.token_files import (  # re-exported: the LM reads token files without pyarrow or pydantic
    DEFAULT_VAL_FRACTION,
    _search,
    check_version_file,
    published_files,
    split_record,
    val_start,
)

TOKENS_KIND = "tokens"
TOKENS_FORMAT = "tokenmill.tokens/1"
MAX_SHARD_TOKENS = (1 << 31) - 1  # int32-indexable loaders (and the DESIGN's limit)
_HEADER_LEN = 128  # fixed .npy header size, so the shape can be filled in after streaming
_MAX_HEADER_LEN = 1 << 16
_CHECK_CHUNK = 1 << 24
DOC_TABLE_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("start", pa.int64()),  # token offset of the document (its separator included) in the shard
        ("n_tokens", pa.int64()),  # tokens of the document, its separator included
        ("n_bytes", pa.int64()),  # UTF-8 bytes of its text
        ("source", pa.string()),  # the raw source file it came from
        ("text_sha256", pa.binary(32)),
    ]
)
_DOC_ROWS = 1 << 16


@dataclass(frozen=True)
class EncodeConfig:
    __pydantic_config__ = STRICT

    separator: Annotated[str | None, doc("document separator, a special token of the tokenizer; none (or '') for no separator")] = "<|endoftext|>"
    placement: Annotated[Literal["append", "prepend"], doc("separator after each document (nanoGPT, datatrove) or before it (llm.c, nanochat)")] = "append"
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
        if not isinstance(self.val_fraction, (int, float)) or isinstance(self.val_fraction, bool) or not 0 <= self.val_fraction < 1:
            raise InputError(f"val_fraction={self.val_fraction!r}: a fraction in [0, 1)")

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        del p["workers"]  # does not change the output
        return p


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32 (the payload nanoGPT / llm.c / datatrove load)."""
    if vocab_size < 1 or vocab_size > 1 << 32:
        raise InputError(f"vocab_size={vocab_size}: must be between 1 and 2**32")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (dtype.str, n)
    body = header.ljust(_HEADER_LEN - 10 - 1) + "\n"
    out = b"\x93NUMPY\x01\x00" + (len(body)).to_bytes(2, "little") + body.encode("latin1")
    assert len(out) == _HEADER_LEN
    return out


class NpyStreamWriter:
    """Append 1-D chunks to a `.npy` file whose length is unknown until the end."""

    def __init__(self, path: str, dtype: np.dtype):
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self.f = open(path, "wb")
        self.f.write(_npy_header(self.dtype, 0))

    def write(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        self.f.write(arr.data.cast("B"))
        self.n += len(arr)

    def close(self) -> None:
        if self.f.closed:
            return
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, self.n))
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
    from pipeline_lib.tokenizer import core

    if core._CORE is not None:
        return core._CORE.sha256_documents(batch.data, batch.offsets)
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
        pq.ParquetWriter(doc_table_path, DOC_TABLE_SCHEMA, compression="zstd", use_dictionary=["source"], write_statistics=False) if doc_table_path else None
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
                raise InputError(f"{name}: the tokenizer produced id {int(flat.max())}, outside its vocabulary ({tokenizer.vocab_size})")
            base = writer.n
            if base + len(flat) + (n if sep is not None else 0) > MAX_SHARD_TOKENS:
                raise InputError(f"{name}: more than {MAX_SHARD_TOKENS:,} tokens in one shard; shard the corpus into more pieces (n_shards)")
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
    return ShardStats(name=name, n_tokens=writer.n, n_docs=n_docs, n_bytes=n_bytes, val_start=start, val_docs=n_val_docs)


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
    return encode_documents(tokenizer, batches, tokens_path, index_path, config, name, doc_table_path=doc_table_path, shard=shard)


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
        sep = {"token": config.separator, "id": int(tokenizer_meta["special_tokens"][config.separator]), "placement": config.placement}
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
        **({"split": split_record(config.val_fraction)} if all(r.get("val_start") is not None for r in records) else {}),
    }


# --------------------------------------------------------------------------- verified reads
# The fix a corrupt published file asks for: `store.usable` (which every stage calls before
# reusing a version) finds the mismatch too, moves the version aside and lets it be recomputed.
# manifest.json stat key -> its file list (None: not a store manifest). Manifests are
# write-once, so a reader opening shard after shard parses a big one once, not per shard.
_MANIFESTS: dict[tuple[str, int, int, int, int], dict[str, tuple[int, str]] | None] = {}
_MANIFESTS_LOCK = threading.Lock()


def version_files(directory: str) -> dict[str, tuple[int, str]] | None:
    """The file list of the published version at `directory`, from the store's
    ``manifest.json`` there; None when there is none (or it is not the store's).

    Raises:
        StoreError: ``manifest.json`` is there but unreadable, too large or corrupt (a
            damaged manifest must not silently turn verification off).
    """
    path = os.path.join(directory, MANIFEST)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _MANIFESTS_LOCK:
        if key in _MANIFESTS:
            return _MANIFESTS[key]
    if st.st_size > MAX_MANIFEST_BYTES:
        raise StoreError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES:,} bytes: refusing to parse it")
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read(MAX_MANIFEST_BYTES + 1))
    except OSError as e:
        raise StoreError(f"{path}: cannot read ({e})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{path}: corrupt manifest ({e}); pass verify=False to read the files beside it unchecked") from e
    files = published_files(manifest, path)
    with _MANIFESTS_LOCK:
        _MANIFESTS[key] = files
    return files


def verify_file(path: str, verify: bool = True) -> bool:
    """If `path` belongs to a published version (the store's ``manifest.json`` beside it),
    check its size and sha256 against that manifest; True when it was checked, False when
    there is no store manifest beside it or `verify` is False.

    >>> verify_file("artifacts/tokens/<version>/shard_000000.npy")  # doctest: +SKIP
    True

    Raises:
        StoreError: naming the file, as `check_version_file`.
    """
    if not verify:
        return False
    directory, name = os.path.split(os.path.abspath(path))
    files = version_files(directory)
    if files is None:
        return False
    check_version_file(directory, name, files)
    return True


# --------------------------------------------------------------------------- reading
def _npy_layout(path: str) -> tuple[tuple[int, ...], np.dtype, int, bool]:
    """(shape, dtype, data offset, fortran) from a .npy header, without trusting it."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=_MAX_HEADER_LEN)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=_MAX_HEADER_LEN)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = f.tell()
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except (ValueError, OSError, SyntaxError, TypeError) as e:
        raise InputError(f"{path}: not a valid .npy file ({e})") from e
    return shape, dtype, offset, fortran


def _checked_npy(path: str, dtypes: Sequence[np.dtype], what: str) -> tuple[int, np.dtype, int]:
    """(length, dtype, data offset) of a 1-D .npy whose file size agrees with its header."""
    shape, dtype, offset, fortran = _npy_layout(path)
    if len(shape) != 1 or fortran or dtype not in dtypes or dtype.hasobject:
        raise InputError(f"{path}: expected a 1-D {' or '.join(d.str for d in dtypes)} array of {what}, found shape {shape} dtype {dtype}")
    expected = offset + shape[0] * dtype.itemsize
    actual = os.path.getsize(path)
    if actual != expected:
        raise InputError(
            f"{path}: header says {shape[0]:,} {what} ({expected:,} bytes) but the file has {actual:,} bytes: "
            f"{'truncated' if actual < expected else 'trailing data'} or corrupt"
        )
    return int(shape[0]), dtype, offset


def _open_npy(path: str, dtypes: Sequence[np.dtype], what: str, verify: bool) -> np.ndarray:
    n, dtype, offset = _checked_npy(path, dtypes, what)
    verify_file(path, verify)
    if n == 0:
        return np.zeros(0, dtype=dtype)  # an empty file region cannot be mapped
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(n,))


def _read_chunks(path: str, dtype: np.dtype, offset: int, start: int, stop: int, hasher=None):
    """Yield (position, array) for elements [start, stop) of a .npy, read (not mapped) in
    bounded chunks, so a full scan does not leave the file resident in this process."""
    with open(path, "rb") as f:
        if hasher is not None:
            hasher.update(f.read(offset))
        f.seek(offset + start * dtype.itemsize)
        pos = start
        while pos < stop:
            data = f.read(min(_CHECK_CHUNK, stop - pos) * dtype.itemsize)
            if hasher is not None:
                hasher.update(data)
            chunk = np.frombuffer(data, dtype=dtype)
            if not len(chunk):
                raise InputError(f"{path}: ended early at element {pos:,}")
            yield pos, chunk
            pos += len(chunk)


def open_tokens(path: str, verify: bool = True) -> np.ndarray:
    """Memory-map a token `.npy`, after checking that its size agrees with its header.

    When the file belongs to a published version (the store's ``manifest.json`` beside
    it), its size and sha256 are checked against that manifest first, hashing it once per
    process while it is unchanged. A file with no store manifest beside it (your own
    files) gets the size check only. `verify=False` skips the hash, for callers that
    verified the version already (e.g. ``ArtifactStore.local_dir(..., verify="full")``).

    >>> tokens = open_tokens("artifacts/tokens/<version>/shard_000000.npy")  # doctest: +SKIP

    Raises:
        InputError: not a 1-D ``<u2``/``<u4`` ``.npy`` whose size agrees with its header.
        StoreError: a published file that does not match its manifest.
    """
    return _open_npy(path, (np.dtype("<u2"), np.dtype("<u4")), "tokens", verify)


def open_index(path: str, verify: bool = True) -> np.ndarray:
    """Memory-map a document index (`<u8` cumulative document ends), size-checked, and
    hash-checked against its version's manifest as `open_tokens` (opt out: `verify=False`)."""
    return _open_npy(path, (np.dtype("<u8"),), "document ends", verify)


def read_doc_table(path: str, verify: bool = True) -> pa.Table:
    """Read a document table, hash-checked against its version's manifest as `open_tokens`
    (opt out: `verify=False`)."""
    verify_file(path, verify)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a readable document table ({e})") from e
    if table.schema.names != DOC_TABLE_SCHEMA.names:
        raise InputError(f"{path}: expected columns {DOC_TABLE_SCHEMA.names}, found {table.schema.names}")
    return table


_INDEX_CHUNK = 1 << 20


def _strictly_increasing_from_one(index: np.ndarray) -> bool:
    """Document ends > 0 and strictly increasing, checked a chunk at a time."""
    previous = 0
    for a in range(0, len(index), _INDEX_CHUNK):
        chunk = np.asarray(index[a : a + _INDEX_CHUNK], dtype=np.int64)
        if chunk[0] <= previous or np.any(np.diff(chunk) <= 0):
            return False
        previous = int(chunk[-1])
    return True


def _separator_positions(index: np.ndarray, placement: str, start: int, stop: int) -> np.ndarray:
    """Where the separators of documents ending at `index` are, among tokens [start, stop):
    the last token of each document ("append"), or the first ("prepend")."""
    if placement == "append":  # a document ending at e has its separator at e - 1
        lo, hi = _search(index, start + 1), _search(index, stop + 1)
        return np.asarray(index[lo:hi], dtype=np.int64) - 1
    lo, hi = _search(index[:-1], start), _search(index[:-1], stop)  # documents start at 0 and at every end but the last
    starts = np.asarray(index[lo:hi], dtype=np.int64)
    return np.concatenate([[0], starts]) if start == 0 < stop else starts


def _check_doc_table(path: str, index: np.ndarray, shard: int, index_path: str) -> None:
    """The document table agrees with the index, row for row (streamed by batches)."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a readable document table ({e})") from e
    if pf.schema_arrow.names != DOC_TABLE_SCHEMA.names:
        raise InputError(f"{path}: expected columns {DOC_TABLE_SCHEMA.names}, found {pf.schema_arrow.names}")
    if pf.metadata.num_rows != len(index):
        raise InputError(f"{path}: {pf.metadata.num_rows:,} rows for {len(index):,} documents")
    pos = 0
    try:
        for batch in pf.iter_batches(columns=["shard", "start", "n_tokens"], batch_size=1 << 16):
            sh, st, ln = (batch.column(k).to_numpy(zero_copy_only=False) for k in range(3))
            ends = index[pos : pos + len(st)]
            starts = np.concatenate([[index[pos - 1] if pos else 0], ends[:-1]])
            if len(ends) != len(st) or not np.array_equal(st + ln, ends) or not np.array_equal(st, starts) or np.any(sh != shard):
                raise InputError(f"{path}: document rows disagree with {index_path} (near row {pos:,})")
            pos += len(st)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: corrupt document table ({e})") from e


def check_shards(directory: str, meta: dict[str, Any], deep: bool = True) -> dict[str, int]:
    """Check a token-shard version on local disk against its manifest `meta`.

    Checks file sizes against headers, token and document counts, the document index
    (increasing, ending at the token count), ids below the vocabulary size, separators
    exactly at the document boundaries the index gives (and nowhere else), the document
    table if there is one, and the totals. With `deep`, checks each shard's files against
    their sha256: in a published version (the store's ``manifest.json`` in `directory`)
    against that manifest's file list, through `check_version_file` (hashed once per
    process while unchanged, so after ``ArtifactStore.local_dir`` this costs no second
    hash), elsewhere against the sha256 `meta` records, in the same pass as the scan.

    Raises:
        StoreError: a file of a published version that does not match its manifest.
        InputError: naming the first file and problem found (content, counts, and the
            hashes `meta` records for a directory that is not a published version).
    """
    if not isinstance(meta, dict) or meta.get("format") != TOKENS_FORMAT:
        raise InputError(f"{directory}: not a token-shard manifest (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    try:
        vocab_size = int(meta["vocab_size"])
        expected_dtype = token_dtype(vocab_size)
        sep = meta.get("separator") or None
        shards = list(meta["shards"])
        totals_meta = dict(meta["totals"])
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{directory}: malformed token-shard manifest ({type(e).__name__}: {e})") from e
    if meta.get("dtype") not in (expected_dtype.name, expected_dtype.str):
        raise InputError(f"{directory}: manifest dtype {meta.get('dtype')!r}, but a vocabulary of {vocab_size} needs {expected_dtype.name}")
    sep_id = None
    if sep is not None:
        sep_id = int(sep["id"])
        if not 0 <= sep_id < vocab_size or sep.get("placement") not in ("append", "prepend"):
            raise InputError(f"{directory}: bad separator {sep!r} for a vocabulary of {vocab_size}")
    files = version_files(directory) if deep else None
    totals = {"n_tokens": 0, "n_docs": 0}
    for i, shard in enumerate(shards):
        name = str(shard.get("name", ""))
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise InputError(f"{directory}: bad shard name {name!r}")
        path = os.path.join(directory, f"{name}.npy")
        index_path = os.path.join(directory, f"{name}.idx.npy")
        if files is not None:  # a published version: its manifest's hashes, before any use
            for fname in [f"{name}.npy", f"{name}.idx.npy"] + ([str(shard["doc_table"])] if shard.get("doc_table") else []):
                check_version_file(directory, fname, files)
            listed = files[f"{name}.npy"][1]
            if shard.get("sha256") and shard["sha256"] != listed:
                raise StoreError(f"{path}: the manifest's shard list says sha256 {shard['sha256']}, its file list {listed}: corrupt manifest")
        n_tokens, dtype, offset = _checked_npy(path, (np.dtype("<u2"), np.dtype("<u4")), "tokens")
        if dtype != expected_dtype:
            raise InputError(f"{path}: dtype {dtype} but the manifest says {meta['dtype']}")
        if n_tokens != shard["n_tokens"]:
            raise InputError(f"{path}: {n_tokens:,} tokens, manifest says {shard['n_tokens']:,}")
        if n_tokens > MAX_SHARD_TOKENS:
            raise InputError(f"{path}: {n_tokens:,} tokens, more than {MAX_SHARD_TOKENS:,} in one shard")
        index = open_index(index_path, verify=False)  # checked above; mapped, read a chunk at a time (never copied whole)
        if len(index) != shard["n_docs"]:
            raise InputError(f"{index_path}: {len(index):,} document ends, manifest says {shard['n_docs']:,}")
        if len(index) and (int(index[-1]) != n_tokens or not _strictly_increasing_from_one(index)):
            raise InputError(f"{index_path}: document ends are not strictly increasing from >0 up to the token count {n_tokens:,}")
        if not len(index) and n_tokens:
            raise InputError(f"{index_path}: no documents but {n_tokens:,} tokens")
        if "val_start" in shard:  # the recorded split: at a document boundary, its document count right
            vs, vd = shard.get("val_start"), shard.get("val_docs")
            at = _search(index, vs, side="right") if isinstance(vs, int) and vs >= 0 else -1
            if not (isinstance(vs, int) and 0 <= vs <= n_tokens and (vs == 0 or (at > 0 and index[at - 1] == vs)) and vd == len(index) - at):
                raise InputError(f"{directory}: shard {name}'s split (val_start {vs!r}, val_docs {vd!r}) is not a document boundary of {index_path}")
        # One sequential read: ids in range, separators where the index says and nowhere else, hash.
        hasher = hashlib.sha256() if deep and files is None and shard.get("sha256") else None
        n_sep = 0
        for start, chunk in _read_chunks(path, dtype, offset, 0, n_tokens, hasher):
            top = int(chunk.max())
            if top >= vocab_size:
                raise InputError(f"{path}: token id {top} is outside the vocabulary (size {vocab_size})")
            if sep_id is not None:
                n_sep += int(np.count_nonzero(chunk == sep_id))
            if sep is not None and len(index):
                separators = _separator_positions(index, sep["placement"], start, start + len(chunk))
                if np.any(chunk[separators - start] != sep_id):
                    raise InputError(f"{path}: a document boundary lacks the separator {sep.get('token')!r} (id {sep_id})")
        if sep_id is not None and n_sep != len(index):
            raise InputError(f"{path}: the separator id {sep_id} occurs {n_sep:,} times for {len(index):,} documents")
        if hasher is not None and hasher.hexdigest() != shard["sha256"]:
            raise InputError(f"{path}: sha256 does not match the manifest: corrupt or altered")
        if shard.get("doc_table"):
            _check_doc_table(os.path.join(directory, shard["doc_table"]), index, i, index_path)
        if deep and files is None:
            checks = []
            if shard.get("index_sha256"):
                checks.append((index_path, shard["index_sha256"]))
            if shard.get("doc_table") and shard.get("doc_table_sha256"):
                checks.append((os.path.join(directory, shard["doc_table"]), shard["doc_table_sha256"]))
            for p, digest in checks:
                if digest is not None and hash_file(p)[1] != digest:
                    raise InputError(f"{p}: sha256 does not match the manifest: corrupt or altered")
        totals["n_tokens"] += n_tokens
        totals["n_docs"] += len(index)
    for key, value in totals.items():
        if totals_meta.get(key) != value:
            raise InputError(f"{directory}: totals say {key}={totals_meta.get(key)}, shards hold {value}")
    return totals


# --------------------------------------------------------------------------- the split


def split_points(directory: str, meta: Mapping[str, Any], val_fraction: float | None = None, verify: bool = True) -> list[int]:
    """Each shard's ``val_start``: tokens before it are training, from it on validation.

    The split the manifest records (decided at encoding, `EncodeConfig.val_fraction`); a
    `val_fraction` given is checked against it, never used instead of it, so the trainer
    and every export hold out the same documents. A manifest that records no split (one
    written before the split was recorded, or by hand) gets the same rule, `val_start`,
    applied to each shard's document index with `val_fraction` (None: 0.1).

    Raises:
        InputError: a `val_fraction` outside [0, 1) or other than the recorded one, or a
            manifest whose split is malformed.
    """
    if val_fraction is not None and not (isinstance(val_fraction, (int, float)) and 0.0 <= val_fraction < 1.0):
        raise InputError(f"val_fraction={val_fraction}: must be in [0, 1)")
    recorded = meta.get("split")
    if recorded is not None:
        try:
            fraction = float(recorded["val_fraction"])
            points = [int(s["val_start"]) for s in meta["shards"]]
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"{directory}: malformed split in the manifest ({type(e).__name__}: {e})") from e
        if val_fraction is not None and abs(val_fraction - fraction) > 1e-12:
            raise InputError(
                f"val_fraction={val_fraction}, but these tokens were split at encoding with val_fraction={fraction:g} and every reader "
                f"uses that split: leave the fraction out, or encode again with --val-fraction {val_fraction:g}"
            )
        return points
    fraction = DEFAULT_VAL_FRACTION if val_fraction is None else float(val_fraction)
    points = []
    for shard in meta["shards"]:
        n = int(shard["n_tokens"])
        ends = open_index(os.path.join(directory, f"{shard['name']}.idx.npy"), verify) if n and fraction else np.zeros(0, np.int64)
        points.append(val_start(ends, n, fraction))
    return points


# --------------------------------------------------------------------------- exports


@contextlib.contextmanager
def _atomic_out(path: str):
    """A file written for the user (outside the store): temp name, fsync, rename, with
    the mode `open` would give it (0o666 & ~umask), not mkstemp's 0o600."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
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


Placement = Literal["append", "prepend"]


def _separator_move(meta: Mapping[str, Any], separator_placement: Placement | None) -> tuple[int | None, Placement | None]:
    """(separator id, placement to write) when the export asks for a placement other than
    the shards': each split holds whole documents, each with one separator, so moving every
    separator to the other side of its document is moving one token from one end of the
    split to the other. (None, None) when there is nothing to move."""
    if separator_placement is None:
        return None, None
    if separator_placement not in ("append", "prepend"):
        raise InputError(f"separator_placement={separator_placement!r}: choose append or prepend")
    sep = meta.get("separator")
    if not sep:
        raise InputError(f"separator_placement={separator_placement!r}, but these shards were encoded without a separator: encode them with one (separator)")
    if sep.get("placement") == separator_placement:
        return None, None
    return int(sep["id"]), separator_placement


def _export(
    directory: str,
    meta: dict[str, Any],
    paths: tuple[str, str],
    val_fraction: float | None,
    dtype: np.dtype,
    header,
    verify: bool,
    separator_placement: Placement | None = None,
) -> dict[str, int]:
    sep_id, move_to = _separator_move(meta, separator_placement)
    files = version_files(directory) if verify else None
    for shard in meta["shards"]:
        name = str(shard.get("name", ""))
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise InputError(f"{directory}: bad shard name {name!r}")
        if files is not None:  # every shard before any output: a corrupt one fails fast
            check_version_file(directory, f"{name}.npy", files)
    points = split_points(directory, meta, val_fraction, verify)
    # (shard path, start, stop) pieces of each split, in order
    splits: tuple[list[list[Any]], list[list[Any]]] = ([], [])
    layouts = []
    for i, shard in enumerate(meta["shards"]):
        path = os.path.join(directory, f"{shard['name']}.npy")
        n, file_dtype, offset = _checked_npy(path, (np.dtype("<u2"), np.dtype("<u4")), "tokens")
        if n != int(shard["n_tokens"]):
            raise InputError(f"{path}: {n:,} tokens, manifest says {shard['n_tokens']:,}")
        layouts.append((file_dtype, offset))
        split = points[i]
        for pieces, a, b in ((splits[0], 0, split), (splits[1], split, n)):
            if b > a:
                pieces.append([i, path, a, b])
    lead, trail = ([False, False], [False, False])
    if sep_id is not None:
        for k, pieces in enumerate(splits):
            if not pieces:
                continue
            # append -> prepend: the split's last token (a separator) goes first; the reverse for prepend -> append
            i, path, a, b = piece = pieces[-1] if move_to == "prepend" else pieces[0]
            at = b - 1 if move_to == "prepend" else a
            token = next(_read_chunks(path, layouts[i][0], layouts[i][1], at, at + 1))[1][0]
            if int(token) != sep_id:
                raise InputError(f"{path}: token {at:,} is {int(token)}, not the separator {sep_id} the manifest places there")
            if move_to == "prepend":
                piece[3] -= 1
                lead[k] = True
            else:
                piece[2] += 1
                trail[k] = True
    counts = {"train": int(sum(p[3] - p[2] for p in splits[0])) + lead[0] + trail[0], "val": int(sum(p[3] - p[2] for p in splits[1])) + lead[1] + trail[1]}
    sep_bytes = np.array([sep_id or 0], dtype=dtype).tobytes()
    with _atomic_out(paths[0]) as train, _atomic_out(paths[1]) as val:
        for k, (out, pieces) in enumerate(((train, splits[0]), (val, splits[1]))):
            if header is not None:
                out.write(header(counts["train" if k == 0 else "val"]))
            if lead[k]:
                out.write(sep_bytes)
            for i, path, a, b in pieces:
                for _, chunk in _read_chunks(path, layouts[i][0], layouts[i][1], a, b):
                    out.write(chunk.astype(dtype, copy=False).tobytes())
            if trail[k]:
                out.write(sep_bytes)
    return counts


NANOGPT_META = "meta.pkl"
NANOGPT_VOCAB_MULTIPLE = 64


def nanogpt_meta(meta: Mapping[str, Any], separator_placement: Placement | None = None, token_bytes: Sequence[bytes | None] | None = None) -> dict[str, Any]:
    """The dict `export_nanogpt` pickles as ``meta.pkl``, plain ints and strings: nanoGPT's
    ``train.py`` reads ``vocab_size`` from it and sizes the model's embedding and output
    table by it, so it is the vocabulary rounded up to a multiple of `NANOGPT_VOCAB_MULTIPLE`
    (GPT-2's 50,257 ids -> 50,304, as nanoGPT pads its own default: the output matmul's width
    suits the GPU's tiles; the padded ids never occur in the data). ``unpadded_vocab_size``
    is the tokenizer's id count.

    With `token_bytes` (each id's bytes, None for an unused id) it also holds ``itos`` (id ->
    the token's text, invalid UTF-8 as U+FFFD) and ``stoi`` (each character that is a token of
    its own -> the lowest such id): nanoGPT's ``sample.py`` decodes with
    ``"".join(itos[i] for i in ids)`` and encodes a prompt character by character with
    ``stoi`` whenever a ``meta.pkl`` is present, so without them it stops with a KeyError.
    A prompt character that is no token of its own still does (most of ASCII and common
    letters are)."""
    n_ids = int(meta["vocab_size"])
    padded = -(-n_ids // NANOGPT_VOCAB_MULTIPLE) * NANOGPT_VOCAB_MULTIPLE
    out: dict[str, Any] = {"vocab_size": padded, "unpadded_vocab_size": n_ids, "dtype": "uint16"}
    if token_bytes is not None:
        itos = {i: b.decode("utf-8", "replace") for i, b in enumerate(token_bytes) if b is not None}
        out["itos"] = itos
        out["stoi"] = {text: i for i, text in sorted(itos.items(), reverse=True) if len(text) == 1 and text != "\ufffd"}
    sep = meta.get("separator")
    if sep:
        out.update(separator=str(sep["token"]), separator_id=int(sep["id"]), placement=str(separator_placement or sep["placement"]))
    tokenizer = (meta.get("tokenizer") or {}).get("version")
    if tokenizer:
        out["tokenizer"] = str(tokenizer)
    return out


def export_nanogpt(
    directory: str,
    meta: dict[str, Any],
    out_dir: str,
    val_fraction: float | None = None,
    *,
    separator_placement: Placement | None = None,
    verify: bool = True,
    token_bytes: Sequence[bytes | None] | None = None,
) -> dict[str, int]:
    """Write nanoGPT's ``train.bin`` / ``val.bin`` (raw uint16, no header, read with
    ``np.memmap(path, dtype=np.uint16, mode="r")``) and the ``meta.pkl`` its ``train.py``
    takes ``vocab_size`` from (`nanogpt_meta`; nanoGPT's format, the one pickle written
    here, never read here). With `token_bytes` (the tokenizer's bytes per id, as the CLI
    gives) it also carries the ``stoi``/``itos`` that nanoGPT's ``sample.py`` reads.

    ``val.bin`` holds the validation documents of the split the manifest records
    (`split_points`: each shard's last documents, the ones the trainer holds out), in
    shard order, ``train.bin`` the rest; no document straddles the two files. A
    `val_fraction` given is checked against the recorded one.
    `separator_placement` (``append``, nanoGPT's, or ``prepend``) moves each separator to that side of its
    document when the shards were encoded the other way; None keeps the shards' order.
    Files are written to temp names and renamed into place, with the mode a plain ``open``
    gives (0o666 & ~umask). In a published version every shard read is first checked
    against the version's manifest (as `open_tokens`; `verify=False` skips the hash).
    Returns token counts.

    Raises:
        StoreError: a shard that does not match its version's manifest (before any output).
        InputError: a vocabulary that needs uint32, a placement for shards without a
            separator, a `val_fraction` other than the recorded split's, or a shard that
            disagrees with `meta`.
    """
    if token_dtype(int(meta["vocab_size"])) != np.dtype("<u2"):
        raise InputError(f"nanoGPT's .bin format is uint16; this vocabulary ({meta['vocab_size']} ids) needs {meta['dtype']}")
    os.makedirs(out_dir, exist_ok=True)
    paths = (os.path.join(out_dir, "train.bin"), os.path.join(out_dir, "val.bin"))
    counts = _export(directory, meta, paths, val_fraction, np.dtype("<u2"), None, verify, separator_placement)
    with _atomic_out(os.path.join(out_dir, NANOGPT_META)) as f:
        pickle.dump(nanogpt_meta(meta, separator_placement, token_bytes), f, protocol=4)
    return counts


LLMC_MAGIC = 20240520
LLMC_VERSION = 1


def _llmc_header(n: int) -> bytes:
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, n
    return header.tobytes()


def export_llmc(
    directory: str,
    meta: dict[str, Any],
    out_dir: str,
    val_fraction: float | None = None,
    prefix: str = "tokens",
    *,
    separator_placement: Placement | None = None,
    verify: bool = True,
) -> dict[str, int]:
    """Write llm.c's ``<prefix>_train.bin`` / ``<prefix>_val.bin``: a 256 x int32 header
    (magic 20240520, version 1, token count) then uint16 tokens. llm.c's own data scripts
    put the separator before each document: ``separator_placement="prepend"`` gives that from shards
    encoded with ``append`` (None keeps the shards' order). Split, file modes and
    verification as `export_nanogpt`."""
    if token_dtype(int(meta["vocab_size"])) != np.dtype("<u2"):
        raise InputError(f"llm.c's .bin format is uint16; this vocabulary ({meta['vocab_size']} ids) needs {meta['dtype']}")
    if int(meta["totals"]["n_tokens"]) >= 1 << 31:
        raise InputError("llm.c's header counts tokens in an int32: too many tokens for one file")
    if not prefix or "/" in prefix or "\\" in prefix or prefix.startswith("."):
        raise InputError(f"prefix={prefix!r}: a plain file name prefix")
    os.makedirs(out_dir, exist_ok=True)
    paths = (os.path.join(out_dir, f"{prefix}_train.bin"), os.path.join(out_dir, f"{prefix}_val.bin"))
    return _export(directory, meta, paths, val_fraction, np.dtype("<u2"), _llmc_header, verify, separator_placement)
