"""Reading token shards: the format's names and limits, reads checked against the version's
manifest, memory-mapped shards and indexes, the document table, and the train/validation split.

See `pipeline_lib.token_shards` for the format.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.errors import StoreError
from pipeline_lib.fsio import InputError
from pipeline_lib.store import MANIFEST, MAX_MANIFEST_BYTES
from pipeline_lib.token_files import DEFAULT_VAL_FRACTION, check_version_file, published_files, val_start

TOKENS_KIND = "tokens"
TOKENS_FORMAT = "tokenmill.tokens/1"
MAX_SHARD_TOKENS = (1 << 31) - 1  # int32-indexable loaders (and the DESIGN's limit)
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


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32 (the payload nanoGPT / llm.c / datatrove load)."""
    if vocab_size < 1 or vocab_size > 1 << 32:
        raise InputError(f"vocab_size={vocab_size}: must be between 1 and 2**32")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


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
        raise StoreError(
            f"{path}: corrupt manifest ({e}); pass verify=False to read the files beside it unchecked"
        ) from e
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
        raise InputError(
            f"{path}: expected a 1-D {' or '.join(d.str for d in dtypes)} array of {what}, found shape "
            f"{shape} dtype {dtype}"
        )
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


# --------------------------------------------------------------------------- the split


def split_points(
    directory: str, meta: Mapping[str, Any], val_fraction: float | None = None, verify: bool = True
) -> list[int]:
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
                f"val_fraction={val_fraction}, but these tokens were split at encoding with val_fraction={fraction:g} "
                "and every reader "
                f"uses that split: leave the fraction out, or encode again with --val-fraction {val_fraction:g}"
            )
        return points
    fraction = DEFAULT_VAL_FRACTION if val_fraction is None else float(val_fraction)
    points = []
    for shard in meta["shards"]:
        n = int(shard["n_tokens"])
        ends = (
            open_index(os.path.join(directory, f"{shard['name']}.idx.npy"), verify)
            if n and fraction
            else np.zeros(0, np.int64)
        )
        points.append(val_start(ends, n, fraction))
    return points
