"""Word-frequency counting: pre-tokenize each corpus shard, count pieces, reduce to one table.

A counts table is Parquet with two columns, ``piece`` (binary: the piece's UTF-8 bytes,
or raw bytes) and ``count`` (int64), sorted by piece: the same corpus always gives the
same file, whatever the number of shards or workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.config import STRICT, doc
from pipeline_lib.corpus import iter_shard_batches
from pipeline_lib.fsio import InputError
from pipeline_lib.patterns import PATTERNS
from pipeline_lib.tokenizer import PieceCounts, count_documents

COUNTS_KIND = "counts"
COUNTS_FILE = "counts.parquet"
COUNTS_SCHEMA = pa.schema([("piece", pa.binary()), ("count", pa.int64())])
CODE_MODULES = ("pipeline_lib.counting", "pipeline_lib.corpus", "pipeline_lib.bpe_reference", "pipeline_lib.patterns")


@dataclass(frozen=True)
class CountConfig:
    __pydantic_config__ = STRICT

    pattern: Annotated[Literal["gpt2", "cl100k", "o200k"], doc("pre-tokenization split pattern")] = "cl100k"

    def __post_init__(self):
        if self.pattern not in PATTERNS:
            raise InputError(f"unknown pattern {self.pattern!r}; choose one of {sorted(PATTERNS)}")

    def params(self) -> dict:
        return asdict(self)


def count_shard(shard_path: str, pattern: str) -> tuple[list[bytes], np.ndarray]:
    """Piece counts of one Parquet text shard, sorted by piece (on one thread: the shards
    are what runs in parallel)."""
    docs = (doc for batch in iter_shard_batches(shard_path) for doc in batch)
    return count_documents(docs, pattern, workers=1).to_arrays()


def write_counts(path: str, pieces: Sequence[bytes], counts: np.ndarray) -> None:
    """Write a counts table; the same pieces and counts always give the same bytes."""
    counts = np.asarray(counts, dtype=np.int64)
    if len(pieces) != len(counts):
        raise InputError(f"{path}: {len(pieces)} pieces but {len(counts)} counts")
    table = pa.table({"piece": pa.array(pieces, pa.binary()), "count": pa.array(counts, pa.int64())}, schema=COUNTS_SCHEMA)
    pq.write_table(table, path, compression="zstd", row_group_size=1 << 20, write_statistics=False, use_dictionary=False)


def read_counts(path: str) -> tuple[list[bytes], np.ndarray]:
    """Read and check a counts table: binary pieces, positive int64 counts, no nulls."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a readable counts file ({e})") from e
    if table.schema.names != ["piece", "count"]:
        raise InputError(f"{path}: expected columns ['piece', 'count'], found {table.schema.names}")
    piece_t, count_t = table.schema.field("piece").type, table.schema.field("count").type
    if not (pa.types.is_binary(piece_t) or pa.types.is_large_binary(piece_t)) or not pa.types.is_int64(count_t):
        raise InputError(f"{path}: expected piece: binary and count: int64, found {piece_t} and {count_t}")
    if table.column("piece").null_count or table.column("count").null_count:
        raise InputError(f"{path}: null pieces or counts")
    counts = table.column("count").to_numpy()
    if len(counts) and int(counts.min()) <= 0:
        raise InputError(f"{path}: counts must be positive (found {int(counts.min())})")
    return table.column("piece").to_pylist(), counts


def reduce_counts(paths: Iterable[str], pattern: str) -> tuple[list[bytes], np.ndarray]:
    """Sum several counts tables into one, sorted by piece."""
    total = PieceCounts(pattern)
    for path in paths:
        pieces, counts = read_counts(path)
        total.add_counts(pieces, counts)
    return total.to_arrays()
