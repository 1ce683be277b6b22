"""Exact document dedup: corpus shards in, the same shards without repeated documents out.

A document is dropped when the sha256 of its text (the hash the encoding stage's document
table records, `token_shards.sha256_documents`) was seen before, in shard order then
document order: the first occurrence stays, so the output is the same for the same input
whatever the machine. The output is a corpus-shaped version (Parquet shards with the
corpus's ``text`` and ``source`` columns, and the corpus manifest's meta), so counting and
encoding read it as they read a corpus; a shard left without documents is not written.

Memory: one 32-byte digest (plus a set entry) per distinct document of the whole corpus.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline_lib.config import STRICT, doc
from pipeline_lib.corpus import SHARD_SCHEMA, DocBatch, iter_shard_buffers, shard_name
from pipeline_lib.errors import InputError
from pipeline_lib.store import FileInfo, Staging
from pipeline_lib.token_shards import sha256_documents

DEDUP_KIND = "dedup"
DIGEST_BYTES = 32


@dataclass(frozen=True)
class DedupConfig:
    """Exact document dedup between sharding and counting (off by default)."""

    __pydantic_config__ = STRICT
    __cli_flags__ = {"mode": "--dedup"}  # the CLI's flag for a field, where it is not --<field>

    mode: Annotated[
        Literal["off", "exact"],
        doc(
            "drop documents whose text repeats one seen before (exact: same sha256 of the text, the first one kept); "
            "off: keep every document"
        ),
    ] = "off"

    def __post_init__(self):
        if self.mode not in ("off", "exact"):
            raise InputError(f"mode={self.mode!r}: choose off or exact (--dedup)")

    def params(self) -> dict[str, Any]:
        return {"mode": self.mode}

    def enabled(self) -> bool:
        return self.mode != "off"


@dataclass
class Seen:
    """The digests of the documents kept so far, and the running counts."""

    digests: set[bytes]
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


def new_documents(batch: DocBatch, seen: Seen) -> np.ndarray:
    """A boolean mask over `batch`: True for each document whose text was not seen before
    (in `seen` or earlier in the batch); adds those documents' digests to `seen`."""
    digests = sha256_documents(batch)
    keep = np.zeros(len(batch), dtype=bool)
    for i in range(len(batch)):
        digest = digests[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES]
        if digest not in seen.digests:
            seen.digests.add(digest)
            keep[i] = True
    return keep


def _kept_rows(batch: DocBatch, keep: np.ndarray) -> pa.RecordBatch:
    text = pa.Array.from_buffers(
        pa.large_string(), len(batch), [None, pa.py_buffer(batch.offsets), pa.py_buffer(batch.data)]
    )
    assert batch.sources is not None  # read with_source=True
    return pa.record_batch([text, batch.sources], schema=SHARD_SCHEMA).filter(pa.array(keep))


def dedup_shard(path: str, seen: Seen) -> Iterator[pa.RecordBatch]:
    """The documents of the corpus shard at `path` not seen before, in order, as record
    batches of the corpus's shard schema; counts them into `seen`."""
    for batch in iter_shard_buffers(path, with_source=True):
        keep = new_documents(batch, seen)
        lengths = batch.lengths()
        seen.docs_in += len(batch)
        seen.docs_out += int(keep.sum())
        seen.bytes_in += int(lengths.sum())
        seen.bytes_out += int(lengths[keep].sum())
        if keep.any():
            yield _kept_rows(batch, keep)


def write_deduped(
    staging: Staging, shard_paths: Sequence[str], corpus_meta: Mapping[str, Any]
) -> tuple[dict[str, FileInfo], dict[str, Any]]:
    """Every corpus shard (local paths, in shard order) deduplicated into `staging`: the
    output's files and its manifest meta (the corpus meta's fields, recounted, plus the
    dedup's counts under ``"dedup"``)."""
    seen = Seen(set())
    files: dict[str, FileInfo] = {}
    shards: list[dict[str, Any]] = []
    n_chars = 0
    for path in shard_paths:
        before_docs, before_bytes = seen.docs_out, seen.bytes_out
        batches = list(dedup_shard(path, seen))
        n_docs = seen.docs_out - before_docs
        if n_docs == 0:
            continue
        name = shard_name(len(shards))
        file = f"{name}.parquet"
        with staging.open_write(file) as tmp:
            table = pa.Table.from_batches(batches, schema=SHARD_SCHEMA)
            pq.write_table(
                table,
                tmp,
                compression="zstd",
                use_dictionary=["source"],
                write_statistics=False,
                row_group_size=max(1, table.num_rows),
            )
        n_chars += int(pc.sum(pc.utf8_length(table.column("text"))).as_py() or 0)
        files[file] = staging.written[file]
        shards.append({"name": name, "file": file, "n_docs": n_docs, "n_bytes": seen.bytes_out - before_bytes})
    if not shards:
        raise InputError("dedup: the corpus has no documents to keep")
    counts = {
        "mode": "exact",
        "documents_in": seen.docs_in,
        "documents_out": seen.docs_out,
        "documents_removed": seen.docs_in - seen.docs_out,
        "bytes_in": seen.bytes_in,
        "bytes_out": seen.bytes_out,
        "bytes_removed": seen.bytes_in - seen.bytes_out,
    }
    meta = {
        "shards": shards,
        "n_docs": seen.docs_out,
        "n_bytes": seen.bytes_out,
        "n_chars": n_chars,
        "sources": list(corpus_meta.get("sources", [])),
        "dedup": counts,
    }
    return files, meta


def summary(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a run shows of a dedup output: documents and bytes in, out and removed."""
    return dict(meta["dedup"])
