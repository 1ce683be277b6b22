"""Helpers to write small token directories (tests, benchmarks, smoke runs).

Writes exactly the tokenize stage's format (see `pipeline_lib.lm.data`), e.g. raw UTF-8
bytes as token ids 0..255 with a separator id 256: a vocabulary of 257 that needs no
tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline_lib.lm.data import TOKENS_FORMAT
from pipeline_lib.token_files import split_record, val_start

BYTE_SEPARATOR_ID = 256
BYTE_VOCAB_SIZE = 257


TEST_DEVICE_ENV = "TOKENMILL_TEST_DEVICE"  # the device the LM tests run on: cpu (default), cuda, cuda:N


def test_device() -> str:
    """The LM tests' device, from TOKENMILL_TEST_DEVICE (default cpu)."""
    return os.environ.get(TEST_DEVICE_ENV, "cpu")


test_device.__test__ = False  # type: ignore[attr-defined]  # not a test, whatever its name


def _shard_name(i: int) -> str:
    try:  # the pipeline's naming rule, where the corpus stage's dependencies are installed
        from pipeline_lib.corpus import shard_name
    except ImportError:  # a torch-only install (the GPU check): the same rule
        return f"shard_{i:06d}"
    return shard_name(i)


def write_token_dir(
    out_dir: str | os.PathLike[str],
    shards: Sequence[Sequence[np.ndarray]],
    vocab_size: int,
    separator_id: int | None,
    n_bytes: Sequence[int] | None = None,
    version: str = "test",
    val_fraction: float | None = None,
) -> Path:
    """shards: per shard, a list of documents (1-D int arrays, separator NOT included).

    With a separator each document is followed by it (placement "append"); the index
    holds cumulative document end offsets including the separator. With `val_fraction`
    the manifest records the train/val split as the encoder does (``split``, and each
    shard's ``val_start`` / ``val_docs``); without, it records none.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")
    metas: list[dict[str, Any]] = []
    for i, docs in enumerate(shards):
        name = _shard_name(i)
        parts, ends, total = [], [], 0
        for doc in docs:
            doc = np.asarray(doc, dtype=np.int64)
            if separator_id is not None:
                doc = np.concatenate([doc, [separator_id]])
            parts.append(doc)
            total += len(doc)
            ends.append(total)
        toks = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
        np.save(out / f"{name}.npy", toks, allow_pickle=False)
        np.save(out / f"{name}.idx.npy", np.asarray(ends, dtype="<u8"), allow_pickle=False)
        digest = hashlib.sha256((out / f"{name}.npy").read_bytes()).hexdigest()
        nb = int(n_bytes[i]) if n_bytes is not None else int(sum(len(d) for d in docs))
        metas.append({"name": name, "n_tokens": int(total), "n_docs": len(ends), "n_bytes": nb, "sha256": digest})
        if val_fraction is not None:
            start = val_start(np.asarray(ends, dtype=np.int64), total, val_fraction)
            metas[-1].update(val_start=start, val_docs=len(ends) - int(np.searchsorted(ends, start, side="right")))
    manifest = {
        "kind": "tokens",
        "version": version,
        "files": {m["name"]: {"tokens": f"{m['name']}.npy", "index": f"{m['name']}.idx.npy"} for m in metas},
        "meta": {
            "format": TOKENS_FORMAT,
            "dtype": "uint16" if dtype.itemsize == 2 else "uint32",
            "vocab_size": vocab_size,
            "separator": None
            if separator_id is None
            else {"token": "<|endoftext|>", "id": separator_id, "placement": "append"},
            "shards": metas,
            "totals": {
                "n_tokens": sum(m["n_tokens"] for m in metas),
                "n_docs": sum(m["n_docs"] for m in metas),
                "n_bytes": sum(m["n_bytes"] for m in metas),
            },
            **({"split": split_record(val_fraction)} if val_fraction is not None else {}),
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def byte_docs(text: bytes, sep: bytes = b"\n\n") -> list[np.ndarray]:
    """Split text into documents at `sep` (kept at the end of each doc) as byte-id arrays."""
    pieces = text.split(sep)
    docs = [p + sep for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    return [np.frombuffer(d, dtype=np.uint8).astype(np.int64) for d in docs if d]


def write_byte_token_dir(
    out_dir: str | os.PathLike[str], text: bytes, n_shards: int = 2, val_fraction: float | None = None
) -> Path:
    """Raw bytes as tokens (vocab 257, separator 256), documents split at blank lines,
    dealt into n_shards contiguous shards (`val_fraction`: as `write_token_dir`)."""
    docs = byte_docs(text)
    per = -(-len(docs) // n_shards)
    shards = [docs[i * per : (i + 1) * per] for i in range(n_shards)]
    return write_token_dir(out_dir, shards, BYTE_VOCAB_SIZE, BYTE_SEPARATOR_ID, val_fraction=val_fraction)


def byte_token_lengths() -> np.ndarray:
    """token_byte_lengths for the byte vocabulary: 1 per byte, 0 for the separator."""
    lens = np.ones(BYTE_VOCAB_SIZE, dtype=np.int64)
    lens[BYTE_SEPARATOR_ID] = 0
    return lens
