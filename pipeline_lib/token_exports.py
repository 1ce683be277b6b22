"""Exports of token shards to the flat ``.bin`` files other trainers read: nanoGPT
(``train.bin`` / ``val.bin`` and its ``meta.pkl``) and llm.c (a 256-int32 header, then tokens),
with the separator on either side of each document and the version's train/validation split.
"""

from __future__ import annotations

import contextlib
import os
import pickle  # nanoGPT's meta.pkl, written only (export_nanogpt)
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from pipeline_lib.fsio import InputError, atomic_user_file
from pipeline_lib.token_files import check_version_file
from pipeline_lib.token_reads import _checked_npy, _read_chunks, split_points, token_dtype, version_files


@contextlib.contextmanager
def _atomic_out(path: str):
    """A file written for the user (`fsio.atomic_user_file`), its directory made if missing."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_user_file(path) as f:
        yield f


Placement = Literal["append", "prepend"]


def _separator_move(
    meta: Mapping[str, Any], separator_placement: Placement | None
) -> tuple[int | None, Placement | None]:
    """(separator id, placement to write) when the export asks for a placement other than
    the shards': each split holds whole documents, each with one separator, so moving every
    separator to the other side of its document is moving one token from one end of the
    split to the other. (None, None) when there is nothing to move."""
    if separator_placement is None:
        return None, None
    if separator_placement not in ("append", "prepend"):
        raise InputError(f"separator_placement={separator_placement!r}: choose append or prepend")
    sep = meta.get("separator")
    if not sep:
        raise InputError(
            f"separator_placement={separator_placement!r}, but these shards were encoded without a "
            "separator: encode them with one (separator)"
        )
    if sep.get("placement") == separator_placement:
        return None, None
    return int(sep["id"]), separator_placement


def _export(
    directory: str,
    meta: dict[str, Any],
    paths: tuple[str, str],
    val_fraction: float | None,
    dtype: np.dtype,
    header,
    verify: bool,
    separator_placement: Placement | None = None,
) -> dict[str, int]:
    sep_id, move_to = _separator_move(meta, separator_placement)
    files = version_files(directory) if verify else None
    for shard in meta["shards"]:
        name = str(shard.get("name", ""))
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise InputError(f"{directory}: bad shard name {name!r}")
        if files is not None:  # every shard before any output: a corrupt one fails fast
            check_version_file(directory, f"{name}.npy", files)
    points = split_points(directory, meta, val_fraction, verify)
    # (shard path, start, stop) pieces of each split, in order
    splits: tuple[list[list[Any]], list[list[Any]]] = ([], [])
    layouts = []
    for i, shard in enumerate(meta["shards"]):
        path = os.path.join(directory, f"{shard['name']}.npy")
        n, file_dtype, offset = _checked_npy(path, (np.dtype("<u2"), np.dtype("<u4")), "tokens")
        if n != int(shard["n_tokens"]):
            raise InputError(f"{path}: {n:,} tokens, manifest says {shard['n_tokens']:,}")
        layouts.append((file_dtype, offset))
        split = points[i]
        for pieces, a, b in ((splits[0], 0, split), (splits[1], split, n)):
            if b > a:
                pieces.append([i, path, a, b])
    lead, trail = ([False, False], [False, False])
    if sep_id is not None:
        for k, pieces in enumerate(splits):
            if not pieces:
                continue
            # append -> prepend: the split's last token (a separator) goes first; the reverse for prepend -> append
            i, path, a, b = piece = pieces[-1] if move_to == "prepend" else pieces[0]
            at = b - 1 if move_to == "prepend" else a
            token = next(_read_chunks(path, layouts[i][0], layouts[i][1], at, at + 1))[1][0]
            if int(token) != sep_id:
                raise InputError(
                    f"{path}: token {at:,} is {int(token)}, not the separator {sep_id} the manifest places there"
                )
            if move_to == "prepend":
                piece[3] -= 1
                lead[k] = True
            else:
                piece[2] += 1
                trail[k] = True
    counts = {
        "train": int(sum(p[3] - p[2] for p in splits[0])) + lead[0] + trail[0],
        "val": int(sum(p[3] - p[2] for p in splits[1])) + lead[1] + trail[1],
    }
    sep_bytes = np.array([sep_id or 0], dtype=dtype).tobytes()
    with _atomic_out(paths[0]) as train, _atomic_out(paths[1]) as val:
        for k, (out, pieces) in enumerate(((train, splits[0]), (val, splits[1]))):
            if header is not None:
                out.write(header(counts["train" if k == 0 else "val"]))
            if lead[k]:
                out.write(sep_bytes)
            for i, path, a, b in pieces:
                for _, chunk in _read_chunks(path, layouts[i][0], layouts[i][1], a, b):
                    out.write(chunk.astype(dtype, copy=False).tobytes())
            if trail[k]:
                out.write(sep_bytes)
    return counts


NANOGPT_META = "meta.pkl"
NANOGPT_VOCAB_MULTIPLE = 64


def nanogpt_meta(
    meta: Mapping[str, Any],
    separator_placement: Placement | None = None,
    token_bytes: Sequence[bytes | None] | None = None,
) -> dict[str, Any]:
    """The dict `export_nanogpt` pickles as ``meta.pkl``, plain ints and strings: nanoGPT's
    ``train.py`` reads ``vocab_size`` from it and sizes the model's embedding and output
    table by it, so it is the vocabulary rounded up to a multiple of `NANOGPT_VOCAB_MULTIPLE`
    (GPT-2's 50,257 ids -> 50,304, as nanoGPT pads its own default: the output matmul's width
    suits the GPU's tiles; the padded ids never occur in the data). ``unpadded_vocab_size``
    is the tokenizer's id count.

    With `token_bytes` (each id's bytes, None for an unused id) it also holds ``itos`` (id ->
    the token's text, invalid UTF-8 as U+FFFD) and ``stoi`` (each character that is a token of
    its own -> the lowest such id): nanoGPT's ``sample.py`` decodes with
    ``"".join(itos[i] for i in ids)`` and encodes a prompt character by character with
    ``stoi`` whenever a ``meta.pkl`` is present, so without them it stops with a KeyError.
    A prompt character that is no token of its own still does (most of ASCII and common
    letters are)."""
    n_ids = int(meta["vocab_size"])
    padded = -(-n_ids // NANOGPT_VOCAB_MULTIPLE) * NANOGPT_VOCAB_MULTIPLE
    out: dict[str, Any] = {"vocab_size": padded, "unpadded_vocab_size": n_ids, "dtype": "uint16"}
    if token_bytes is not None:
        itos = {i: b.decode("utf-8", "replace") for i, b in enumerate(token_bytes) if b is not None}
        out["itos"] = itos
        out["stoi"] = {text: i for i, text in sorted(itos.items(), reverse=True) if len(text) == 1 and text != "\ufffd"}
    sep = meta.get("separator")
    if sep:
        out.update(
            separator=str(sep["token"]),
            separator_id=int(sep["id"]),
            placement=str(separator_placement or sep["placement"]),
        )
    tokenizer = (meta.get("tokenizer") or {}).get("version")
    if tokenizer:
        out["tokenizer"] = str(tokenizer)
    return out


def export_nanogpt(
    directory: str,
    meta: dict[str, Any],
    out_dir: str,
    val_fraction: float | None = None,
    *,
    separator_placement: Placement | None = None,
    verify: bool = True,
    token_bytes: Sequence[bytes | None] | None = None,
) -> dict[str, int]:
    """Write nanoGPT's ``train.bin`` / ``val.bin`` (raw uint16, no header, read with
    ``np.memmap(path, dtype=np.uint16, mode="r")``) and the ``meta.pkl`` its ``train.py``
    takes ``vocab_size`` from (`nanogpt_meta`; nanoGPT's format, the one pickle written
    here, never read here). With `token_bytes` (the tokenizer's bytes per id, as the CLI
    gives) it also carries the ``stoi``/``itos`` that nanoGPT's ``sample.py`` reads.

    ``val.bin`` holds the validation documents of the split the manifest records
    (`split_points`: each shard's last documents, the ones the trainer holds out), in
    shard order, ``train.bin`` the rest; no document straddles the two files. A
    `val_fraction` given is checked against the recorded one.
    `separator_placement` (``append``, nanoGPT's, or ``prepend``) moves each separator to that side of its
    document when the shards were encoded the other way; None keeps the shards' order.
    Files are written to temp names and renamed into place, with the mode a plain ``open``
    gives (0o666 & ~umask). In a published version every shard read is first checked
    against the version's manifest (as `open_tokens`; `verify=False` skips the hash).
    Returns token counts.

    Raises:
        StoreError: a shard that does not match its version's manifest (before any output).
        InputError: a vocabulary that needs uint32, a placement for shards without a
            separator, a `val_fraction` other than the recorded split's, or a shard that
            disagrees with `meta`.
    """
    if token_dtype(int(meta["vocab_size"])) != np.dtype("<u2"):
        raise InputError(
            f"nanoGPT's .bin format is uint16; this vocabulary ({meta['vocab_size']} ids) needs {meta['dtype']}"
        )
    os.makedirs(out_dir, exist_ok=True)
    paths = (os.path.join(out_dir, "train.bin"), os.path.join(out_dir, "val.bin"))
    counts = _export(directory, meta, paths, val_fraction, np.dtype("<u2"), None, verify, separator_placement)
    with _atomic_out(os.path.join(out_dir, NANOGPT_META)) as f:
        pickle.dump(nanogpt_meta(meta, separator_placement, token_bytes), f, protocol=4)
    return counts


LLMC_MAGIC = 20240520
LLMC_VERSION = 1


def _llmc_header(n: int) -> bytes:
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, n
    return header.tobytes()


def export_llmc(
    directory: str,
    meta: dict[str, Any],
    out_dir: str,
    val_fraction: float | None = None,
    prefix: str = "tokens",
    *,
    separator_placement: Placement | None = None,
    verify: bool = True,
) -> dict[str, int]:
    """Write llm.c's ``<prefix>_train.bin`` / ``<prefix>_val.bin``: a 256 x int32 header
    (magic 20240520, version 1, token count) then uint16 tokens. llm.c's own data scripts
    put the separator before each document: ``separator_placement="prepend"`` gives that from shards
    encoded with ``append`` (None keeps the shards' order). Split, file modes and
    verification as `export_nanogpt`."""
    if token_dtype(int(meta["vocab_size"])) != np.dtype("<u2"):
        raise InputError(
            f"llm.c's .bin format is uint16; this vocabulary ({meta['vocab_size']} ids) needs {meta['dtype']}"
        )
    if int(meta["totals"]["n_tokens"]) >= 1 << 31:
        raise InputError("llm.c's header counts tokens in an int32: too many tokens for one file")
    if not prefix or "/" in prefix or "\\" in prefix or prefix.startswith("."):
        raise InputError(f"prefix={prefix!r}: a plain file name prefix")
    os.makedirs(out_dir, exist_ok=True)
    paths = (os.path.join(out_dir, f"{prefix}_train.bin"), os.path.join(out_dir, f"{prefix}_val.bin"))
    return _export(directory, meta, paths, val_fraction, np.dtype("<u2"), _llmc_header, verify, separator_placement)
