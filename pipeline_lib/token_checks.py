"""`check_shards`: the one integrity checker of a directory of token shards against its
manifest ``meta`` (files, headers, counts, document index, separators, split, document table).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.errors import StoreError
from pipeline_lib.fsio import InputError, hash_file
from pipeline_lib.token_files import _search, check_version_file
from pipeline_lib.token_reads import (
    DOC_TABLE_SCHEMA,
    MAX_SHARD_TOKENS,
    TOKENS_FORMAT,
    _checked_npy,
    _read_chunks,
    open_index,
    token_dtype,
    version_files,
)

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
            if (
                len(ends) != len(st)
                or not np.array_equal(st + ln, ends)
                or not np.array_equal(st, starts)
                or np.any(sh != shard)
            ):
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
    expected = _checked_meta(directory, meta)
    files = version_files(directory) if deep else None
    totals = {"n_tokens": 0, "n_docs": 0}
    for i, shard in enumerate(expected.shards):
        name = str(shard.get("name", ""))
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise InputError(f"{directory}: bad shard name {name!r}")
        path = os.path.join(directory, f"{name}.npy")
        index_path = os.path.join(directory, f"{name}.idx.npy")
        if files is not None:  # a published version: its manifest's hashes, before any use
            _check_listed_files(directory, name, shard, files)
        n_tokens, dtype, offset = _checked_npy(path, (np.dtype("<u2"), np.dtype("<u4")), "tokens")
        if dtype != expected.dtype:
            raise InputError(f"{path}: dtype {dtype} but the manifest says {meta['dtype']}")
        if n_tokens != shard["n_tokens"]:
            raise InputError(f"{path}: {n_tokens:,} tokens, manifest says {shard['n_tokens']:,}")
        if n_tokens > MAX_SHARD_TOKENS:
            raise InputError(f"{path}: {n_tokens:,} tokens, more than {MAX_SHARD_TOKENS:,} in one shard")
        index = _checked_index(directory, name, index_path, shard, n_tokens)
        hasher = hashlib.sha256() if deep and files is None and shard.get("sha256") else None
        _scan_tokens(path, dtype, offset, n_tokens, index, expected, hasher)
        if hasher is not None and hasher.hexdigest() != shard["sha256"]:
            raise InputError(f"{path}: sha256 does not match the manifest: corrupt or altered")
        if shard.get("doc_table"):
            _check_doc_table(os.path.join(directory, shard["doc_table"]), index, i, index_path)
        if deep and files is None:
            _check_recorded_hashes(directory, shard, index_path)
        totals["n_tokens"] += n_tokens
        totals["n_docs"] += len(index)
    for key, value in totals.items():
        if expected.totals.get(key) != value:
            raise InputError(f"{directory}: totals say {key}={expected.totals.get(key)}, shards hold {value}")
    return totals


class _Expected(NamedTuple):
    """What a token-shard manifest says the shards hold, checked for sense."""

    vocab_size: int
    dtype: np.dtype
    sep: dict[str, Any] | None  # the document separator: id, token, placement
    sep_id: int | None
    shards: list[dict[str, Any]]
    totals: dict[str, Any]


def _checked_meta(directory: str, meta: dict[str, Any]) -> _Expected:
    if not isinstance(meta, dict) or meta.get("format") != TOKENS_FORMAT:
        raise InputError(
            f"{directory}: not a token-shard manifest (format "
            f"{meta.get('format') if isinstance(meta, dict) else None!r})"
        )
    try:
        vocab_size = int(meta["vocab_size"])
        expected_dtype = token_dtype(vocab_size)
        sep = meta.get("separator") or None
        shards = list(meta["shards"])
        totals_meta = dict(meta["totals"])
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{directory}: malformed token-shard manifest ({type(e).__name__}: {e})") from e
    if meta.get("dtype") not in (expected_dtype.name, expected_dtype.str):
        raise InputError(
            f"{directory}: manifest dtype {meta.get('dtype')!r}, but a vocabulary of {vocab_size} needs "
            f"{expected_dtype.name}"
        )
    sep_id = None
    if sep is not None:
        sep_id = int(sep["id"])
        if not 0 <= sep_id < vocab_size or sep.get("placement") not in ("append", "prepend"):
            raise InputError(f"{directory}: bad separator {sep!r} for a vocabulary of {vocab_size}")
    return _Expected(vocab_size, expected_dtype, sep, sep_id, shards, totals_meta)


def _check_listed_files(directory: str, name: str, shard: dict[str, Any], files: dict[str, Any]) -> None:
    """The shard's files against the published version's file list; its shard entry agrees."""
    for fname in [f"{name}.npy", f"{name}.idx.npy"] + ([str(shard["doc_table"])] if shard.get("doc_table") else []):
        check_version_file(directory, fname, files)
    listed = files[f"{name}.npy"][1]
    if shard.get("sha256") and shard["sha256"] != listed:
        path = os.path.join(directory, f"{name}.npy")
        raise StoreError(
            f"{path}: the manifest's shard list says sha256 {shard['sha256']}, its file list {listed}: corrupt manifest"
        )


def _checked_index(directory: str, name: str, index_path: str, shard: dict[str, Any], n_tokens: int) -> np.ndarray:
    """The shard's document index, mapped: its count, its order, and the recorded split."""
    # hashed by check_shards; mapped, read a chunk at a time (never copied whole)
    index = open_index(index_path, verify=False)
    if len(index) != shard["n_docs"]:
        raise InputError(f"{index_path}: {len(index):,} document ends, manifest says {shard['n_docs']:,}")
    if len(index) and (int(index[-1]) != n_tokens or not _strictly_increasing_from_one(index)):
        raise InputError(
            f"{index_path}: document ends are not strictly increasing from >0 up to the token count {n_tokens:,}"
        )
    if not len(index) and n_tokens:
        raise InputError(f"{index_path}: no documents but {n_tokens:,} tokens")
    if "val_start" in shard:  # the recorded split: at a document boundary, its document count right
        vs, vd = shard.get("val_start"), shard.get("val_docs")
        at = _search(index, vs, side="right") if isinstance(vs, int) and vs >= 0 else -1
        if not (
            isinstance(vs, int)
            and 0 <= vs <= n_tokens
            and (vs == 0 or (at > 0 and index[at - 1] == vs))
            and vd == len(index) - at
        ):
            raise InputError(
                f"{directory}: shard {name}'s split (val_start {vs!r}, val_docs {vd!r}) is not a "
                f"document boundary of {index_path}"
            )
    return index


def _scan_tokens(
    path: str, dtype: np.dtype, offset: int, n_tokens: int, index: np.ndarray, expected: _Expected, hasher: Any
) -> None:
    """One sequential read of the shard: ids in range, separators where the index says and
    nowhere else, and the hash into `hasher` (if any)."""
    vocab_size, sep, sep_id = expected.vocab_size, expected.sep, expected.sep_id
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


def _check_recorded_hashes(directory: str, shard: dict[str, Any], index_path: str) -> None:
    """The index and the document table against the sha256 the shard entry records."""
    checks = []
    if shard.get("index_sha256"):
        checks.append((index_path, shard["index_sha256"]))
    if shard.get("doc_table") and shard.get("doc_table_sha256"):
        checks.append((os.path.join(directory, shard["doc_table"]), shard["doc_table_sha256"]))
    for p, digest in checks:
        if digest is not None and hash_file(p)[1] != digest:
            raise InputError(f"{p}: sha256 does not match the manifest: corrupt or altered")
