"""The parts of the token shard format that a reader needs, on numpy and the standard
library alone: the train/validation split rule and the checks of a published version's
files against its manifest. `pipeline_lib.token_shards` (which writes shards, with pyarrow)
re-exports them; the LM trainer imports them from here so that it runs where only torch,
numpy and safetensors are installed.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from pipeline_lib.errors import StoreError
from pipeline_lib.fsio import check_local_file
from pipeline_lib.store import MANIFEST, MANIFEST_FORMAT

DEFAULT_VAL_FRACTION = 0.1  # for token directories whose manifest records no split


def _search(index: np.ndarray, value: int, side: Literal["left", "right"] = "left") -> int:
    """`np.searchsorted` of a non-negative int in a document index, as the index's own dtype:
    a Python int against a uint64 array would make NumPy cast the whole (mapped) index to
    float64 first."""
    index = np.asarray(index)  # a view of a mapped array, not a copy
    return int(np.searchsorted(index, np.asarray(value, dtype=index.dtype), side=side))


def val_start(doc_ends: np.ndarray, n_tokens: int, val_fraction: float) -> int:
    """Where a shard's validation tokens start: the document boundary nearest
    ``(1 - val_fraction) * n_tokens`` (n_tokens, no validation, for val_fraction 0).

    The one split rule: decided at encoding and recorded per shard in the manifest
    (``val_start``, ``val_docs``); readers of a manifest that records none apply it to the
    document index with their own fraction (`split_points`)."""
    if val_fraction == 0 or n_tokens == 0:
        return n_tokens
    # The boundaries are sorted: the nearest is one of the two around the target (a binary
    # search over the memory-mapped index; a copy of it would grow with the shard).
    target = (1.0 - val_fraction) * n_tokens
    i = _search(doc_ends, math.ceil(target))  # the first end >= target (ends are integers)
    candidates = [0] + [int(doc_ends[j]) for j in (i - 1, i) if 0 <= j < len(doc_ends)]
    return min(candidates, key=lambda b: abs(b - target))  # the first, the smaller, on a tie


SPLIT_RULE = "per shard: its last whole documents nearest val_fraction of its tokens are validation"


def split_record(val_fraction: float) -> dict[str, Any]:
    """The manifest's ``split``: how each shard's ``val_start`` / ``val_docs`` were decided."""
    return {"val_fraction": float(val_fraction), "rule": SPLIT_RULE}


REENCODE_HINT = "rerun `tokenmill run`: it sets the damaged version aside and encodes it again"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def published_files(manifest: Any, where: str) -> dict[str, tuple[int, str]] | None:
    """``{file name: (size, sha256)}`` from a parsed ``manifest.json`` when it is the
    store's (``format`` ``tokenmill.manifest/1``: a published version), else None (a
    manifest of another shape, e.g. the one `lm.testing.write_token_dir` writes).

    Raises:
        StoreError: a store manifest whose file list is missing or malformed.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise StoreError(f"{where}: corrupt manifest (no file list)")
    out: dict[str, tuple[int, str]] = {}
    for name, info in files.items():
        if not (
            isinstance(info, dict)
            and type(info.get("size")) is int
            and info["size"] >= 0
            and isinstance(info.get("sha256"), str)
            and _SHA256_HEX.fullmatch(info["sha256"])
        ):
            raise StoreError(f"{where}: corrupt manifest: bad entry for {name!r}")
        out[name] = (info["size"], info["sha256"])
    return out


def check_version_file(directory: str, name: str, files: Mapping[str, tuple[int, str]]) -> str:
    """Check the file `name` of the version at `directory` against its entry in the
    version's file list (`version_files`), hashing it once per process while it is
    unchanged (`fsio.check_local_file`); return its path.

    Raises:
        StoreError: naming the file: not listed, missing, another size or another sha256.
    """
    path = os.path.join(directory, name)
    entry = files.get(name)  # exact names only: "../x" is never listed
    if entry is None:
        raise StoreError(f"{path}: not in its version's {MANIFEST}: not a file of this published version")
    try:
        check_local_file(path, entry[0], entry[1], label=path)
    except StoreError as e:
        raise StoreError(f"{e}; {REENCODE_HINT}") from e
    return path
