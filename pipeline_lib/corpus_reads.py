"""Reading published corpus shards (Parquet ``text`` and ``source`` columns): documents as
bytes (`iter_shard_batches`) or as one buffer and offsets per batch, uncopied
(`iter_shard_buffers`, `DocBatch`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.fsio import InputError


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
