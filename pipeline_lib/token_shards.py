"""Token shards: the encoded corpus, one flat `.npy` per shard, loadable in two lines.

Per shard ``shard_000000``:

* ``shard_000000.npy``: 1-D little-endian ``<u2`` when the vocabulary has at most 65,536
  ids, else ``<u4`` — ``np.load(path, mmap_mode="r", allow_pickle=False)``;
* ``shard_000000.idx.npy``: uint64 cumulative document *end* offsets;

and the version's manifest ``meta`` carries the dtype, vocabulary size, separator token
(id and placement), tokenizer version and per-shard counts and hashes. `check_shards` is
the one integrity checker, used by tests and by the flow.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipeline_lib.fsio import InputError
from pipeline_lib.tokenizer import Tokenizer

TOKENS_KIND = "tokens"
TOKENS_FORMAT = "tokenmill.tokens/1"
CODE_MODULES = ("pipeline_lib.token_shards", "pipeline_lib.tokenizer", "pipeline_lib.bpe_reference", "pipeline_lib.corpus")
_HEADER_LEN = 128  # fixed .npy header size, so the shape can be filled in after streaming


@dataclass(frozen=True)
class EncodeConfig:
    separator: str | None = "<|endoftext|>"  # document separator (a special token), or None
    placement: str = "append"  # "append" (nanoGPT, datatrove) | "prepend" (llm.c, nanochat)
    workers: int = 0  # native encoding threads per shard (0 = all cores)

    def __post_init__(self):
        if self.placement not in ("append", "prepend"):
            raise InputError(f"placement={self.placement!r}: choose append or prepend")

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        del p["workers"]  # does not change the output
        return p


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32 (the payload nanoGPT / llm.c / datatrove load)."""
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
        data = np.ascontiguousarray(arr, dtype=self.dtype).tobytes()
        self.f.write(data)
        self.n += len(arr)

    def close(self) -> None:
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


def encode_documents(
    tokenizer: Tokenizer,
    batches: Iterable[Sequence[bytes]],
    tokens_path: str,
    index_path: str,
    config: EncodeConfig,
    name: str,
) -> ShardStats:
    """Encode documents (batches of UTF-8 bytes) into a token `.npy` and its document index."""
    sep = None
    if config.separator is not None:
        if config.separator not in tokenizer.special_tokens:
            raise InputError(f"separator {config.separator!r} is not a special token of {tokenizer!r}")
        sep = tokenizer.special_tokens[config.separator]
    dtype = token_dtype(tokenizer.vocab_size)
    writer = NpyStreamWriter(tokens_path, dtype)
    ends: list[np.ndarray] = []
    n_docs = n_bytes = 0
    try:
        for docs in batches:
            flat, offsets = tokenizer.encode_ordinary_batch(docs, config.workers)
            lengths = np.diff(offsets).astype(np.int64)
            if sep is not None:
                # Interleave one separator per document, before or after its tokens.
                out = np.empty(len(flat) + len(docs), dtype=dtype)
                starts = offsets[:-1].astype(np.int64) + np.arange(len(docs))
                sep_pos = starts if config.placement == "prepend" else starts + lengths
                mask = np.ones(len(out), dtype=bool)
                mask[sep_pos] = False
                out[sep_pos] = sep
                out[mask] = flat
                lengths = lengths + 1
            else:
                out = flat.astype(dtype, copy=False)
            base = writer.n
            writer.write(out)
            ends.append(base + np.cumsum(lengths, dtype=np.uint64))
            n_docs += len(docs)
            n_bytes += sum(len(d) for d in docs)
    finally:
        writer.close()
    index = np.concatenate(ends).astype(np.uint64) if ends else np.zeros(0, dtype=np.uint64)
    np.save(index_path, index, allow_pickle=False)
    return ShardStats(name=name, n_tokens=writer.n, n_docs=n_docs, n_bytes=n_bytes)


# --------------------------------------------------------------------------- reading
def open_tokens(path: str) -> np.ndarray:
    """Memory-map a token `.npy`, after checking that its size agrees with its header."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as e:
        raise InputError(f"{path}: not a valid .npy file ({e})") from e
    if len(shape) != 1 or dtype not in (np.dtype("<u2"), np.dtype("<u4")) or fortran:
        raise InputError(f"{path}: expected a 1-D <u2 or <u4 array, found shape {shape} dtype {dtype}")
    expected = offset + shape[0] * dtype.itemsize
    actual = os.path.getsize(path)
    if actual != expected:
        raise InputError(f"{path}: header says {shape[0]:,} tokens ({expected:,} bytes) but the file has {actual:,} bytes: truncated or corrupt")
    return np.load(path, mmap_mode="r", allow_pickle=False)


def check_shards(directory: str, meta: dict[str, Any], deep: bool = True) -> dict[str, int]:
    """Check a token-shard version on local disk against its manifest `meta`.

    Checks file sizes against headers, token and document counts, index monotonicity,
    ids below the vocabulary size and separators where the manifest says they are.
    With `deep`, re-hashes each shard against its recorded sha256.

    Raises:
        InputError: naming the first shard and problem found.
    """
    if meta.get("format") != TOKENS_FORMAT:
        raise InputError(f"{directory}: not a token-shard manifest (format {meta.get('format')!r})")
    vocab_size = int(meta["vocab_size"])
    sep = meta.get("separator") or None
    totals = {"n_tokens": 0, "n_docs": 0}
    for shard in meta["shards"]:
        path = os.path.join(directory, f"{shard['name']}.npy")
        tokens = open_tokens(path)
        if str(tokens.dtype) != meta["dtype"] and tokens.dtype.name != meta["dtype"]:
            raise InputError(f"{path}: dtype {tokens.dtype} but the manifest says {meta['dtype']}")
        if len(tokens) != shard["n_tokens"]:
            raise InputError(f"{path}: {len(tokens):,} tokens, manifest says {shard['n_tokens']:,}")
        index_path = os.path.join(directory, f"{shard['name']}.idx.npy")
        try:
            index = np.load(index_path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise InputError(f"{index_path}: unreadable document index ({e})") from e
        if index.dtype != np.uint64 or index.ndim != 1 or len(index) != shard["n_docs"]:
            raise InputError(f"{index_path}: expected {shard['n_docs']} uint64 document ends")
        if len(index) and (index[-1] != len(tokens) or np.any(np.diff(index.astype(np.int64)) <= 0)):
            raise InputError(f"{index_path}: document ends are not increasing up to the token count")
        for start in range(0, len(tokens), 1 << 24):
            chunk = tokens[start : start + (1 << 24)]
            if len(chunk) and int(chunk.max()) >= vocab_size:
                raise InputError(f"{path}: token id {int(chunk.max())} is outside the vocabulary (size {vocab_size})")
        if sep is not None and len(index):
            ends = index.astype(np.int64)
            pos = ends - 1 if sep["placement"] == "append" else np.concatenate([[0], ends[:-1]])
            if np.any(tokens[pos] != sep["id"]):
                raise InputError(f"{path}: a document boundary lacks the separator {sep['token']!r}")
        if deep:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(8 << 20):
                    h.update(chunk)
            if h.hexdigest() != shard["sha256"]:
                raise InputError(f"{path}: sha256 does not match the manifest: corrupt or altered")
        totals["n_tokens"] += len(tokens)
        totals["n_docs"] += len(index)
    for key, value in totals.items():
        if meta["totals"][key] != value:
            raise InputError(f"{directory}: totals say {key}={meta['totals'][key]}, shards hold {value}")
    return totals


def export_nanogpt(directory: str, meta: dict[str, Any], out_dir: str, val_fraction: float = 0.1) -> dict[str, int]:
    """Write nanoGPT's ``train.bin`` / ``val.bin`` (raw uint16) from token shards.

    The last `val_fraction` of the documents (in shard order) go to ``val.bin``.
    """
    if meta["dtype"] not in ("uint16", "<u2"):
        raise InputError(f"nanoGPT's .bin format is uint16; this vocabulary ({meta['vocab_size']} ids) needs {meta['dtype']}")
    os.makedirs(out_dir, exist_ok=True)
    total = meta["totals"]["n_tokens"]
    cut = int(total * (1 - val_fraction))
    written = {"train": 0, "val": 0}
    with open(os.path.join(out_dir, "train.bin"), "wb") as train, open(os.path.join(out_dir, "val.bin"), "wb") as val:
        seen = 0
        for shard in meta["shards"]:
            tokens = open_tokens(os.path.join(directory, f"{shard['name']}.npy"))
            index = np.load(os.path.join(directory, f"{shard['name']}.idx.npy"), allow_pickle=False).astype(np.int64)
            # Split at the first document end past the cut, so no document straddles the files.
            local_cut = len(tokens)
            if seen + len(tokens) > cut:
                after = index[index >= cut - seen]
                local_cut = int(after[0]) if len(after) else len(tokens)
                local_cut = max(0, min(local_cut, len(tokens))) if seen < cut else 0
            train.write(np.asarray(tokens[:local_cut]).tobytes())
            val.write(np.asarray(tokens[local_cut:]).tobytes())
            written["train"] += local_cut
            written["val"] += len(tokens) - local_cut
            seen += len(tokens)
    return written
