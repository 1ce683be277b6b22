"""The units of the corpus stage: groups of whole sources, and ranges of one large source.

Consecutive sources are grouped up to ``source_group_bytes`` (`corpus.source_groups`). A
source larger than that is split, when its format allows it, into ranges of about that
size, each sharded by a unit of its own, so one 10 GB file does not shard on one core:

* newline-delimited text (``.txt`` by lines or paragraphs, ``.jsonl``): byte ranges with
  the classic split rule. A range of nominal bytes ``[a, b)`` holds the documents from the
  first document boundary at or after ``a`` to the first one at or after ``b``: a boundary
  is the start of a line (line mode, JSONL) or the start of a line after a blank line
  (paragraph mode), the file's start and end included. Neighbouring ranges meet at the same
  boundary, so every document is read once, whole, by the range in which it starts;
* Parquet: the same nominal byte ranges, each reading the row groups whose middle byte it
  holds (Spark's rule), from the file's footer, read by the unit itself.

Compressed sources (no random access) and whole-file documents stay one unit. A source no
larger than ``source_group_bytes`` is sharded as before, so a small corpus keeps its shards
and version. The units are a function of the raw version's manifest (the sources' names and
sizes: planning reads no source) and the config: the same input and params give the same
units and shard names (`corpus.group_shard_name`, by unit), and each unit is done, and
Cached, on its own.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

import pyarrow as pa

from pipeline_lib.corpus_config import CorpusConfig, _split_name
from pipeline_lib.corpus_documents import _document_too_big, _parquet_file
from pipeline_lib.corpus_plan import source_groups
from pipeline_lib.corpus_streams import _InPlace, _RawSources
from pipeline_lib.fsio import InputError
from pipeline_lib.store import ArtifactStore, VersionRef

_LINE_FORMATS = (".jsonl", ".ndjson", ".json")
_READ = 1 << 16  # bytes per read while looking for a boundary
_WHITESPACE = b" \t\n\r\x0b\x0c"  # bytes.strip()'s, the paragraph scanner's blank bytes


@dataclass(frozen=True)
class SourceUnit:
    """One unit of the corpus stage: the raw version's `sources` it reads (all of each, or,
    for a split source, the `span` of it: nominal byte offsets)."""

    sources: range
    n_bytes: int  # source bytes (a range's nominal share): what `n_shards` is shared by
    split: bool = False  # a range of one source: nominal bytes `span`
    span: tuple[int, int] = (0, 0)


def splittable(name: str, config: CorpusConfig) -> bool:
    """Whether a source of this name can be read in ranges (not compressed: no random access;
    not whole-file documents)."""
    fmt, comp = _split_name(name)
    return not comp and (fmt == ".parquet" or fmt in _LINE_FORMATS or config.documents != "file")


def byte_spans(size: int, group_bytes: int) -> list[tuple[int, int]]:
    """``ceil(size / group_bytes)`` nominal byte ranges of about equal size covering ``[0, size)``.

    >>> byte_spans(10, 4)
    [(0, 3), (3, 6), (6, 10)]
    """
    n = max(1, -(-size // group_bytes))
    cuts = [size * k // n for k in range(n + 1)]
    return list(zip(cuts, cuts[1:]))


def row_groups_in(meta: Any, span: tuple[int, int]) -> list[int]:
    """The row groups of a Parquet file (its footer's `meta`) whose middle byte lies in `span`."""
    picked = []
    for j in range(meta.num_row_groups):
        group = meta.row_group(j)
        chunks = [group.column(c) for c in range(group.num_columns)]
        if not chunks:
            continue
        start = min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in chunks)
        middle = start + sum(c.total_compressed_size for c in chunks) // 2
        if span[0] <= middle < span[1]:
            picked.append(j)
    return picked


def plan_units(records: Sequence[Mapping[str, Any]], config: CorpusConfig) -> list[SourceUnit]:
    """The units of a raw version whose sources are `records` (name and size each)."""
    sizes = [int(r["size"]) for r in records]
    group_bytes = config.source_group_bytes
    units: list[SourceUnit] = []
    for group in source_groups(sizes, group_bytes):
        i = group.start
        if len(group) == 1 and group_bytes and sizes[i] > group_bytes and splittable(records[i]["name"], config):
            units += [SourceUnit(group, b - a, True, (a, b)) for a, b in byte_spans(sizes[i], group_bytes)]
        else:
            units.append(SourceUnit(group, sum(sizes[group.start : group.stop])))
    return units


_PLANS: dict[tuple[str, str, int, str], list[SourceUnit]] = {}


def corpus_units(store: ArtifactStore, raw: VersionRef, config: CorpusConfig) -> list[SourceUnit]:
    """The units of the corpus stage for a raw version."""
    key = (store.url, raw.key, config.source_group_bytes, config.documents)
    if key not in _PLANS:
        if len(_PLANS) > 64:
            _PLANS.clear()
        _PLANS[key] = plan_units(store.manifest(raw.kind, raw.version)["meta"]["sources"], config)
    return _PLANS[key]


def unit_labels(store: ArtifactStore, raw: VersionRef, config: CorpusConfig) -> list[str]:
    """What each unit reads, for its task run's name: its file(s), and the range of a split one."""
    records = store.manifest(raw.kind, raw.version)["meta"]["sources"]
    labels = []
    for unit in corpus_units(store, raw, config):
        names = [_short(r.get("url") or r["name"]) for r in records[unit.sources.start : unit.sources.stop]]
        if unit.split:
            labels.append(f"{names[0]} bytes {unit.span[0]:,}-{unit.span[1]:,}")
        else:
            labels.append(names[0] if len(names) == 1 else f"{names[0]}..{names[-1]} ({len(names)} files)")
    return labels


def _short(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def unit_sources(src: _RawSources, unit: SourceUnit, config: CorpusConfig) -> _RawSources:
    """The sources of `unit` as the sharder reads them: a split source's one source narrowed to
    the unit's range (`SourceRange`), the rest as they are."""
    if not unit.split:
        return src
    (path, name), record, label = src.sources[0], src.records[0], src.labels[0]
    part = SourceRange(path, record, unit, config, label)
    # The label names the range and keeps the file's extensions (the format is read from it).
    return replace(src, sources=[(part, name)], labels=[f"{part.describe()} of {label}"])


class _Window(io.RawIOBase):
    """`length` bytes of a file from where it stands (closing it when closed)."""

    def __init__(self, inner: BinaryIO, length: int):
        self.inner, self.left = inner, length

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.left)
        if n <= 0:
            return 0
        data = self.inner.read(n)
        b[: len(data)] = data
        self.left -= len(data)
        return len(data)

    def close(self) -> None:
        self.inner.close()
        super().close()


class SourceRange(_InPlace):
    """A range of one source (a local copy or a referenced source), read as the sharder reads
    a referenced source: through `open`. A byte range is resolved to document boundaries
    when made (reading a little past each nominal offset); `record["size"]` is then its length.
    A Parquet range is its `row_groups`."""

    def __init__(
        self, source: str | _InPlace, record: Mapping[str, Any], unit: SourceUnit, config: CorpusConfig, label: str
    ):
        super().__init__(
            str(record.get("url") or record["name"]),
            record,
            source.storage_options if isinstance(source, _InPlace) else {},
        )
        self.source, self.unit, self.label = source, unit, label
        self.source_record = record
        self.row_groups: list[int] | None = None
        self.offset, self.stop = 0, int(record["size"])
        if _split_name(label)[0] == ".parquet":
            try:
                self.row_groups = row_groups_in(_parquet_file(source).metadata, unit.span)
            except (pa.ArrowInvalid, OSError) as e:
                raise InputError(f"{label}: not a readable Parquet file ({e})") from e
        else:
            if self.stop > config.max_source_bytes:  # the cap is the file's, as when it is read whole
                raise InputError(
                    f"{label}: {self.stop:,} bytes, more than the {config.max_source_bytes:,}-byte cap; "
                    "raise --max-source-bytes to allow it"
                )
            paragraph = _split_name(label)[0] not in _LINE_FORMATS and config.documents == "paragraph"
            with self._open_source() as f:
                a, b = unit.span
                self.offset = first_boundary(f, a, self.stop, paragraph, config.max_document_bytes, label)
                self.stop = first_boundary(f, b, self.stop, paragraph, config.max_document_bytes, label)
        self.record = {**record, "size": self.stop - self.offset}

    def describe(self) -> str:
        if self.row_groups is not None:
            return f"row groups {self.row_groups[0]}-{self.row_groups[-1]}" if self.row_groups else "no row groups"
        return f"bytes {self.offset:,}-{self.stop:,}"

    def _open_source(self) -> BinaryIO:
        if isinstance(self.source, _InPlace):
            return self.source.open(seekable=True)  # checks the referenced source is unchanged
        try:
            return open(self.source, "rb")
        except FileNotFoundError:
            raise InputError(f"{self.label}: missing ({self.source})") from None

    def open(self, seekable: bool = False) -> BinaryIO:
        f = self._open_source()
        if seekable:
            return f  # Parquet: the reader picks its `row_groups`
        f.seek(self.offset)
        return io.BufferedReader(_Window(f, self.stop - self.offset), buffer_size=1 << 20)  # type: ignore[return-value]

    def check_unchanged(self, read: int | None = None) -> None:
        if isinstance(self.source, _InPlace):
            self.source.check_unchanged()

    def finish(self) -> str:
        """The source's recorded sha256, after checking a referenced source is unchanged (size and
        ETag / modification time: a range does not hash the whole file)."""
        self.check_unchanged()
        return self.source_record.get("sha256")  # type: ignore[return-value]

    def range_record(self) -> dict[str, Any]:
        """What the corpus manifest says of the range."""
        if self.row_groups is not None:
            return {"range": {"bytes": list(self.unit.span), "row_groups": self.row_groups}}
        return {"range": {"bytes": [self.offset, self.stop]}}


def first_boundary(f: BinaryIO, offset: int, size: int, paragraph: bool, cap: int, label: str) -> int:
    """The first document boundary at or after `offset` of a seekable file of `size` bytes: a
    line start (after a blank line in `paragraph` mode), or the file's end."""
    if offset <= 0:
        return 0
    if offset >= size:
        return size
    start = _line_start(f, offset, size, cap, label)
    if not paragraph or start >= size or _blank_before(f, start):
        return start
    # the first line start after a blank line, from `start` on
    f.seek(start)
    pos, blank = start, True  # the line being read holds only whitespace so far
    while chunk := f.read(_READ):
        at = 0
        while (nl := chunk.find(b"\n", at)) >= 0:
            if blank and not chunk[at:nl].strip(_WHITESPACE):
                return pos + nl + 1
            blank, at = True, nl + 1
        blank = blank and not chunk[at:].strip(_WHITESPACE)
        pos += len(chunk)
        if pos - offset > cap:
            raise _document_too_big(label, f" (near byte {offset:,})", cap)
    return size


def _line_start(f: BinaryIO, offset: int, size: int, cap: int, label: str) -> int:
    """The first line start at or after `offset` (> 0): just after the first '\\n' at or after ``offset - 1``."""
    f.seek(offset - 1)
    pos = offset - 1
    while chunk := f.read(_READ):
        nl = chunk.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(chunk)
        if pos - offset > cap:
            raise _document_too_big(label, f" (near byte {offset:,})", cap)
    return size


def _blank_before(f: BinaryIO, start: int) -> bool:
    """Whether the line ending just before line start `start` (> 0) holds only whitespace."""
    end = start - 1  # its '\n', not looked at
    while end > 0:
        lo = max(0, end - _READ)
        f.seek(lo)
        rest = f.read(end - lo).rstrip(_WHITESPACE.replace(b"\n", b""))
        if rest:
            return rest.endswith(b"\n")
        end = lo
    return True


def merge_ranges(per_source: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The corpus manifest's per-source records with a split source's ranges (consecutive
    records of one name with a ``range``) added up into one record, its ``ranges`` counted."""
    out: list[dict[str, Any]] = []
    for record in per_source:
        last = out[-1] if out else None
        if "range" in record and last is not None and "ranges" in last and last["name"] == record["name"]:
            for key in ("n_docs", "n_bytes", "replaced_documents", "skipped_documents"):
                last[key] += record[key]
            last["ranges"] += 1
        elif "range" in record:
            out.append({k: v for k, v in record.items() if k != "range"} | {"ranges": 1})
        else:
            out.append(record)
    return out
