"""The corpus stages' configuration (`CorpusConfig`), their limits and defaults, and what a
source's name says about its format and compression (`_split_name`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

from pipeline_lib.config import STRICT, doc
from pipeline_lib.fsio import InputError

RAW_KIND = "raw"
CORPUS_KIND = "corpus"
DEFAULT_CORPUS = os.path.join(os.path.dirname(__file__), "data", "tinyshakespeare.txt")
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
_FORMATS = (".txt", ".text", ".md", ".jsonl", ".ndjson", ".json", ".parquet")


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


@dataclass(frozen=True)
class CorpusConfig:
    """How to read and shard a corpus."""

    __pydantic_config__ = STRICT

    sources: Annotated[
        tuple[str, ...] | None,
        doc(
            "corpus file URLs, globs or directories (.txt, .jsonl, .parquet, plain or "
            "compressed); none: the bundled tiny Shakespeare"
        ),
    ] = (DEFAULT_CORPUS,)
    # "line" is the default everywhere (the CLI and tokenmill_pipeline used to say
    # "paragraph"): every text has lines, not every text has blank lines between documents,
    # and a file without them would become one document (one shard, one huge encode call).
    # Corpora with paragraphs may gain ~3 % compression with --documents paragraph.
    documents: Annotated[Literal["line", "paragraph", "file"], doc("what a document is in a text file")] = "line"
    text_field: Annotated[str, doc("JSONL field / Parquet column holding the text")] = "text"
    errors: Annotated[Literal["replace", "skip-document", "fail"], doc("invalid UTF-8 policy")] = "replace"
    n_shards: Annotated[
        int, doc("corpus shards of about equal bytes, split at document boundaries, processed in parallel")
    ] = 2
    shard_bytes: Annotated[
        int,
        doc(
            "target bytes per shard instead of a count (0: n_shards shards); the count "
            "becomes ceil(corpus bytes / shard_bytes)"
        ),
    ] = 0
    max_source_bytes: Annotated[int, doc("cap on one source's decompressed size in bytes (bomb guard)")] = 64 << 30
    max_document_bytes: Annotated[
        int,
        doc(
            "cap on one document's bytes (a line, a paragraph, a whole file, a JSONL line, a Parquet value): "
            "memory stays a few times this"
        ),
    ] = MAX_DOCUMENT_BYTES
    source_mode: Annotated[
        Literal["copy", "reference"],
        doc(
            "copy: sources are copied into the store first; reference: sources on durable storage (s3, gs, https with "
            "an ETag) "
            "are read in place, the raw version records their URL, size and ETag, and a changed source is refused"
        ),
    ] = "copy"
    task_bytes: Annotated[
        int,
        doc(
            "corpus bytes per task of the per-shard stages (count, encode): consecutive shards are grouped into tasks "
            "of about this size, "
            f"never fewer than {MIN_TASKS} tasks (one per shard below that); 0: one task per shard"
        ),
    ] = DEFAULT_TASK_BYTES
    source_group_bytes: Annotated[
        int,
        doc(
            "source bytes per sharding task: consecutive sources are grouped up to this size; a larger source is "
            "split at document "
            "boundaries into ranges of about this size (text and JSONL by bytes, Parquet by row groups; a compressed "
            "one stays whole), "
            "each group sharded by a task of its own; 0: one task per source"
        ),
    ] = DEFAULT_SOURCE_GROUP_BYTES
    # fsspec options; given by the flow, not a stage parameter
    storage_options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        given: Any = (DEFAULT_CORPUS,) if self.sources is None else self.sources
        if isinstance(given, (str, os.PathLike)):
            given = (given,)
        try:
            sources = tuple(os.fspath(s) for s in given)
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
            raise InputError(
                f"text_field={self.text_field!r}: give the JSONL field / Parquet column with the text (--text-field)"
            )
        if not isinstance(self.n_shards, int) or not 1 <= self.n_shards <= MAX_SHARDS:
            raise InputError(f"n_shards={self.n_shards}: must be between 1 and {MAX_SHARDS}")
        if not isinstance(self.max_source_bytes, int) or self.max_source_bytes <= 0:
            raise InputError("max_source_bytes must be a positive number of bytes")
        if not isinstance(self.max_document_bytes, int) or self.max_document_bytes <= 0:
            raise InputError("max_document_bytes must be a positive number of bytes (--max-document-bytes)")
        if not isinstance(self.shard_bytes, int) or self.shard_bytes < 0:
            raise InputError(f"shard_bytes={self.shard_bytes}: give a positive number of bytes, or 0 to use n_shards")
        if not isinstance(self.source_group_bytes, int) or self.source_group_bytes < 0:
            raise InputError(
                f"source_group_bytes={self.source_group_bytes}: give a positive number of bytes, or 0 "
                "for one sharding task per source"
            )
        if not isinstance(self.task_bytes, int) or self.task_bytes < 0:
            raise InputError(
                f"task_bytes={self.task_bytes}: give a positive number of bytes, or 0 for one task per shard"
            )

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
        del (
            p["sources"],
            p["storage_options"],
            p["max_source_bytes"],
            p["max_document_bytes"],
            p["task_bytes"],
            p["source_mode"],
        )
        if self.source_group_bytes:
            # A source above `source_group_bytes` is sharded in ranges (`pipeline_lib.source_ranges`);
            # before, it was one unit with other shard names, under the same parameters. Naming
            # the rule keeps an id from meaning two layouts (the same bytes under the same id).
            p["large_sources"] = "ranges"
        return p


def _split_name(name: str) -> tuple[str, str]:
    """(format extension, compression extension) of a file name."""
    lower = name.lower()
    comp = next((c for c in _COMPRESSIONS if lower.endswith(c)), "")
    base = lower[: len(lower) - len(comp)] if comp else lower
    fmt = next((f for f in _FORMATS if base.endswith(f)), ".txt")
    return fmt, comp
