"""Word-frequency counting: pre-tokenize each corpus shard, count pieces, reduce to one table.

A counts table is Parquet with two columns, ``piece`` (binary: the piece's UTF-8 bytes,
or raw bytes) and ``count`` (int64), sorted by piece: the same corpus always gives the
same file, whatever the number of shards or workers.

Memory. Counting holds one table per shard being counted, and the reduce holds the sum of
all of them. `CountConfig.count_memory` bounds each such table, estimated from what it
holds (`table_bytes`): ``TABLE_BYTES_PER_PIECE`` per distinct piece plus twice the pieces'
bytes (the native hash table's entry, slot and key, then the sorted Python list and Arrow
copy that export it). In ``exact`` mode a table that would outgrow the budget stops the run
with an error naming the flags to change; in ``pruned`` mode pieces seen fewer than
`count_min` times in a shard are dropped before the reduce (as production trainers do), and
a table still over the budget is pruned at the smallest higher threshold that makes it fit
(mid-shard if need be). Every prune is recorded: threshold, pieces and occurrences dropped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import AfterValidator

from pipeline_lib.config import STRICT, doc
from pipeline_lib.corpus import DocBatch, iter_shard_buffers
from pipeline_lib.fsio import InputError
from pipeline_lib.patterns import check_pattern
from pipeline_lib.tokenizer import PieceCounts

COUNTS_KIND = "counts"
COUNTS_FILE = "counts.parquet"
COUNTS_SCHEMA = pa.schema([("piece", pa.binary()), ("count", pa.int64())])


MEMORY_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20, "mb": 10**6}
MEMORY_UNITS |= {"g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}
# Per distinct piece, besides its bytes (CPython 3.11; checked by benchmarks/bench_count_memory.py):
# native table entry 32 + hash slots 16-32 + sorted order 4 + counts 8 while exporting;
# the Python list of bytes 8 + bytes object header 33 (allocated in 16-byte steps) + Arrow
# offsets 4 + counts 8 when written.
TABLE_BYTES_PER_PIECE = 128


def parse_memory(text: str | int) -> int:
    """Bytes of a memory size: ``1073741824``, ``512MiB``, ``2GiB``, ``2G`` (binary) or ``2GB`` (decimal).

    >>> parse_memory("2GiB"), parse_memory("1.5M"), parse_memory("64KB")
    (2147483648, 1572864, 64000)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in MEMORY_UNITS:
        raise InputError(f"count_memory={text!r}: give a size such as 2GiB, 512MiB or a number of bytes")
    size = int(float(match.group(1)) * MEMORY_UNITS[unit])
    if size < 1:
        raise InputError(f"count_memory={text!r}: must be at least one byte")
    return size


def table_bytes(n_pieces: int, piece_bytes: int) -> int:
    """Estimated peak memory of a counts table of `n_pieces` distinct pieces holding
    `piece_bytes` bytes in all, from counting to writing it (the formula of the module docstring)."""
    return n_pieces * TABLE_BYTES_PER_PIECE + 2 * piece_bytes


@dataclass(frozen=True)
class CountConfig:
    __pydantic_config__ = STRICT

    pattern: Annotated[
        str,
        AfterValidator(check_pattern),
        doc(
            "pre-tokenization split: gpt2, cl100k, o200k, none (no split: merges may cross spaces) or a regex (text "
            "between matches is kept as pieces)"
        ),
    ] = "cl100k"
    count_mode: Annotated[
        Literal["exact", "pruned"],
        doc(
            "exact: every piece is kept, and a table outgrowing --count-memory stops the run with an error; "
            "pruned: pieces seen fewer than --count-min times in a shard are dropped before the reduce, and the "
            "threshold is raised "
            "for a table still over --count-memory (recorded in the counts manifest)"
        ),
    ] = "exact"
    count_memory: Annotated[
        str,
        doc(
            f"memory budget of one counts table (a shard's, or the reduce's sum), e.g. 2GiB, 512MiB or bytes; "
            f"estimated as {TABLE_BYTES_PER_PIECE} bytes per distinct piece + twice the pieces' bytes"
        ),
    ] = "4GiB"
    count_min: Annotated[int, doc("pruned mode: the fewest occurrences in a shard a piece needs to be kept")] = 2

    def __post_init__(self):
        check_pattern(self.pattern)
        if self.count_mode not in ("exact", "pruned"):
            raise InputError(f"count_mode={self.count_mode!r}: choose exact or pruned")
        if isinstance(self.count_memory, int) and not isinstance(self.count_memory, bool):
            object.__setattr__(self, "count_memory", str(self.count_memory))
        parse_memory(self.count_memory)
        if not isinstance(self.count_min, int) or isinstance(self.count_min, bool) or self.count_min < 1:
            raise InputError(f"count_min={self.count_min!r}: give a count of at least 1")

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.count_memory)

    @property
    def pruned(self) -> bool:
        return self.count_mode == "pruned"

    def params(self) -> dict:
        """The version id's parameters. Exact mode gives the same counts under any budget (or
        fails), so its versions keep the ids they had before budgets existed; pruned mode's
        output depends on the threshold and on the budget (which may raise it)."""
        if not self.pruned:
            return {"pattern": self.pattern}
        return {
            "pattern": self.pattern,
            "count_mode": "pruned",
            "count_min": self.count_min,
            "count_memory": self.memory_bytes,
        }


def _over_budget(what: str, n_pieces: int, estimate: int, config: CountConfig) -> InputError:
    return InputError(
        f"counting {what}: {n_pieces:,} distinct pieces need about {estimate / (1 << 20):,.1f} MiB, over "
        f"--count-memory {config.count_memory}; "
        f"raise --count-memory, or use --count-mode pruned (drops pieces seen fewer than --count-min times per shard)"
    )


class BoundedCounts:
    """A `PieceCounts` held under `config.count_memory`: checked after every batch added; in
    exact mode going over raises, in pruned mode the table is pruned at `threshold`, raised
    until the table takes at most half the budget (the other half is room to go on counting).

    `threshold` starts at `config.count_min` (1 in exact mode: nothing dropped); `dropped`
    counts the pieces and occurrences pruned; `prunings` the prunes made while counting.
    """

    def __init__(self, config: CountConfig, what: str, threshold: int | None = None):
        self.config, self.what = config, what
        self.budget = config.memory_bytes
        self.threshold = (threshold or config.count_min) if config.pruned else 1
        self.counts = PieceCounts(config.pattern)
        self.pieces_dropped = self.occurrences_dropped = self.prunings = 0
        # Pieces added (occurrences, or a table's rows) and their bytes: the mean piece length.
        self._items_seen = self._bytes_seen = 0

    def add_documents(self, docs: list[bytes]) -> None:
        before = self.counts.total
        self.counts.add_documents(docs)
        self._added(before, sum(map(len, docs)))

    def add_batch(self, batch: DocBatch) -> None:
        """`add_documents` for a `DocBatch`: the native counter reads its buffer, no object per document."""
        before = self.counts.total
        self.counts.add_buffer(batch.data, batch.offsets)
        self._added(before, batch.n_bytes)

    def _added(self, total_before: int, n_bytes: int) -> None:
        """Account for documents of `n_bytes` just counted, and hold the budget."""
        self._items_seen += self.counts.total - total_before
        self._bytes_seen += n_bytes
        self._check()

    def add_counts(self, pieces: list[bytes], counts: np.ndarray) -> None:
        self.counts.add_counts(pieces, counts)
        self._items_seen += len(pieces)
        self._bytes_seen += sum(map(len, pieces))
        self._check()

    def estimate(self) -> int:
        """`table_bytes` of the table now, its pieces' bytes estimated from the mean length of
        what was added (the native table does not tell its key bytes)."""
        n = len(self.counts)
        return table_bytes(n, n * self._bytes_seen // max(1, self._items_seen))

    def _check(self) -> None:
        estimate = self.estimate()
        if estimate <= self.budget:
            return
        if not self.config.pruned:
            raise _over_budget(self.what, len(self.counts), estimate, self.config)
        pieces, counts = self.counts.to_arrays()
        pieces, counts = self._prune(pieces, counts, self.budget // 2)
        self.counts = PieceCounts(self.config.pattern)
        self.counts.add_counts(pieces, counts)
        self._items_seen, self._bytes_seen = len(pieces), sum(map(len, pieces))
        self.prunings += 1

    def _prune(self, pieces: list[bytes], counts: np.ndarray, target: int) -> tuple[list[bytes], np.ndarray]:
        """Drop the pieces below the threshold, raised first (if need be) to the smallest count
        that leaves a table of at most `target` bytes."""
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        if table_bytes(len(pieces), int(lengths.sum())) > target:
            order = np.argsort(-counts, kind="stable")
            fitting = int(np.searchsorted(np.cumsum(TABLE_BYTES_PER_PIECE + 2 * lengths[order]), target, side="right"))
            if fitting < len(pieces):  # drop the first piece that does not fit, and every piece as rare
                self.threshold = max(self.threshold, int(counts[order[fitting]]) + 1)
        keep = counts >= self.threshold
        self.pieces_dropped += len(pieces) - int(keep.sum())
        self.occurrences_dropped += int(counts[~keep].sum())
        if keep.all():
            return pieces, counts
        index = np.flatnonzero(keep)
        return [pieces[i] for i in index.tolist()], counts[index]

    def to_arrays(self) -> tuple[list[bytes], np.ndarray]:
        """The table sorted by piece: in pruned mode without the pieces below the threshold
        (raised if the table is over the budget); in exact mode checked against the
        budget with its exact piece bytes."""
        pieces, counts = self.counts.to_arrays()
        if self.config.pruned:
            return self._prune(pieces, counts, self.budget)
        estimate = table_bytes(len(pieces), sum(map(len, pieces)))
        if estimate > self.budget:
            raise _over_budget(self.what, len(pieces), estimate, self.config)
        return pieces, counts

    def record(self) -> dict[str, int]:
        """What was pruned (empty in exact mode)."""
        if not self.config.pruned:
            return {}
        return {
            "threshold": self.threshold,
            "pieces_dropped": self.pieces_dropped,
            "occurrences_dropped": self.occurrences_dropped,
            "prunings": self.prunings,
        }


def count_shard(shard_path: str, config: CountConfig | str) -> tuple[list[bytes], np.ndarray, dict[str, int]]:
    """Piece counts of one Parquet text shard, sorted by piece, and what pruning dropped (on one
    thread: the shards are what runs in parallel), read a `DocBatch` at a time. Held under
    ``config.count_memory``; a pattern name instead of a config counts exactly under the
    default budget.

    Raises:
        InputError: exact mode, and the shard's table would outgrow the budget.
    """
    config = CountConfig(pattern=config) if isinstance(config, str) else config
    table = BoundedCounts(config, f"the corpus shard {os.path.basename(shard_path)}")
    for batch in iter_shard_buffers(shard_path):
        table.add_batch(batch)
    pieces, counts = table.to_arrays()
    return pieces, counts, table.record()


def write_counts(path: str, pieces: Sequence[bytes], counts: np.ndarray) -> None:
    """Write a counts table; the same pieces and counts always give the same bytes."""
    counts = np.asarray(counts, dtype=np.int64)
    if len(pieces) != len(counts):
        raise InputError(f"{path}: {len(pieces)} pieces but {len(counts)} counts")
    table = pa.table(
        {"piece": pa.array(pieces, pa.binary()), "count": pa.array(counts, pa.int64())}, schema=COUNTS_SCHEMA
    )
    pq.write_table(
        table, path, compression="zstd", row_group_size=1 << 20, write_statistics=False, use_dictionary=False
    )


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


def reduce_counts(paths: Iterable[str], config: CountConfig) -> tuple[list[bytes], np.ndarray, dict[str, int]]:
    """Sum several counts tables into one, sorted by piece, under ``config.count_memory``;
    and what pruning the sum dropped (pruned mode: a piece's summed count below the reduce's
    threshold, which starts at `count_min` and rises only if the sum outgrows the budget).

    Raises:
        InputError: exact mode, and the sum would outgrow the budget.
    """
    total = BoundedCounts(config, "the sum of the shards' counts")
    for path in paths:
        total.add_counts(*read_counts(path))
    pieces, counts = total.to_arrays()
    return pieces, counts, total.record()


# --------------------------------------------------------------------------- tree reduce
TREE_FAN_IN = 2


def tree_levels(n_tables: int, fan_in: int = TREE_FAN_IN) -> list[list[list[int]]]:
    """The merges of a tree reduce of `n_tables` tables, level by level, until at most
    `fan_in` tables are left (the last merge, which writes the result, is not listed): each
    merge lists the tables of the level below it sums (consecutive, `fan_in` at a time; a
    table left over alone goes up unmerged, as a one-table "merge" that is not run).

    >>> tree_levels(5)
    [[[0, 1], [2, 3], [4]], [[0, 1], [2]]]
    >>> tree_levels(2), tree_levels(1)
    ([], [])
    """
    if fan_in < 2:
        raise InputError(f"fan_in={fan_in}: a tree merges at least 2 tables at a time")
    levels: list[list[list[int]]] = []
    n = n_tables
    while n > fan_in:
        merges = [list(range(i, min(i + fan_in, n))) for i in range(0, n, fan_in)]
        levels.append(merges)
        n = len(merges)
    return levels


def merge_record(record: dict[str, int], other: dict[str, int]) -> dict[str, int]:
    """Two pruning records (`BoundedCounts.record`) as one: drops and prunes summed, the highest threshold."""
    if not record:
        return dict(other)
    if not other:
        return dict(record)
    return {
        "threshold": max(record["threshold"], other["threshold"]),
        "pieces_dropped": record["pieces_dropped"] + other["pieces_dropped"],
        "occurrences_dropped": record["occurrences_dropped"] + other["occurrences_dropped"],
        "prunings": record["prunings"] + other["prunings"],
    }


def tree_reduce(
    paths: Sequence[str],
    workdir: str,
    config: CountConfig,
    fan_in: int = TREE_FAN_IN,
    map_merges: Callable[[Callable[[int], dict[str, int]], range], Iterable[dict[str, int]]] = map,
) -> tuple[list[bytes], np.ndarray, dict[str, int]]:
    """`reduce_counts` as a tree: the tables summed `fan_in` at a time into tables in
    `workdir`, level by level (`tree_levels`; `map_merges(fn, range)` runs a level's merges,
    e.g. a thread pool's map), then the last merge. Each merge holds one table under
    ``config.count_memory``, never the sum of all of them. In exact mode the result is
    the one reduce's (a sum is a sum); in pruned mode a merge over the budget prunes its
    own sum. Returns the table and the pruning of all merges together."""
    current = list(paths)
    record: dict[str, int] = {}
    for level, merges in enumerate(tree_levels(len(current), fan_in), start=1):

        def merge(
            k: int, level: int = level, merges: list[list[int]] = merges, inputs: list[str] = current
        ) -> dict[str, int]:
            if len(merges[k]) == 1:
                return {}
            pieces, counts, pruned = reduce_counts([inputs[i] for i in merges[k]], config)
            write_counts(os.path.join(workdir, f"l{level:02d}_{k:06d}.parquet"), pieces, counts)
            return pruned

        for pruned in map_merges(merge, range(len(merges))):
            record = merge_record(record, pruned)
        current = [
            current[m[0]] if len(m) == 1 else os.path.join(workdir, f"l{level:02d}_{k:06d}.parquet")
            for k, m in enumerate(merges)
        ]
    pieces, counts, pruned = reduce_counts(current, config)
    return pieces, counts, merge_record(record, pruned)
