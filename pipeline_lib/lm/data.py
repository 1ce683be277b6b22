"""Token shards on local disk: validation, train/val split by document, random windows.

A token directory (written by the tokenize stage) holds::

    manifest.json                {"kind": "tokens", "version": ..., "meta": {"format":
                                  "tokenmill.tokens/1", "dtype": "uint16", "vocab_size": ...,
                                  "separator": {...} | null, "shards": [...], "totals": {...}}}
    shard_000000.npy             flat 1-D <u2 (vocab <= 65536) or <u4 token ids
    shard_000000.idx.npy         <u8 cumulative document end offsets (last = n_tokens)

Shards are memory-mapped, never read whole. Every file is checked before it is trusted
(header dtype/shape, file size = header + n * itemsize, index monotone and ending at
n_tokens); any problem raises `ShardError` naming the file.

When the directory is a published store version (its manifest.json is the store's, with a
``files`` list of every file's size and sha256), every file used is also checked against
that list by default, hashed once per process while unchanged (`fsio.check_local_file`):
a second `TokenShards` of the same version costs a stat per file. ``verify=False`` opts
out, for callers that verified the version already. A directory whose manifest.json has
no such list (your own files, `lm.testing.write_token_dir`) gets the size checks only,
unless ``verify_hashes=True`` asks to hash its shards against the sha256 its meta records.

Split: the one the manifest records, decided when the tokens were written (each shard's
``val_start``: its tail from the document boundary nearest (1 - val_fraction) of its
tokens is validation, the head training), so the trainer and every export
(`token_shards.export_nanogpt`, `export_llmc`) hold out the same documents. A manifest
that records none gets the same rule (`token_shards.val_start`) with the caller's
fraction (default 0.1). Windows of
block_size + 1 tokens are drawn uniformly from inside one region, so they cross document
boundaries only through the separator tokens that are in the stream, never a shard or
train/val boundary.

The sampler's only state is its numpy Generator; `state()` / `set_state()` give it as
JSON, which together with the step number is the data position of a checkpoint.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline_lib.errors import ShardError, StoreError  # ShardError re-exported
from pipeline_lib.fsio import check_local_file
from pipeline_lib.store import MAX_MANIFEST_BYTES
from pipeline_lib.token_files import DEFAULT_VAL_FRACTION, check_version_file, published_files, val_start

TOKENS_FORMAT = "tokenmill.tokens/1"
_DTYPES: dict[str, np.dtype[np.unsignedinteger[Any]]] = {
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "<u2": np.dtype("<u2"),
    "<u4": np.dtype("<u4"),
}
_IDX_DTYPE = np.dtype("<u8")


@dataclass(frozen=True)
class ShardInfo:
    name: str
    path: Path  # <name>.npy
    idx_path: Path  # <name>.idx.npy
    n_tokens: int
    n_docs: int
    n_bytes: int | None
    sha256: str | None


@dataclass(frozen=True)
class Region:
    """Tokens [start, stop) of shard number `shard`."""

    shard: int
    start: int
    stop: int

    @property
    def n_tokens(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Split:
    train: list[Region]
    val: list[Region]
    messages: list[str] = field(default_factory=list)  # human-readable warnings

    @property
    def n_train_tokens(self) -> int:
        return sum(r.n_tokens for r in self.train)

    @property
    def n_val_tokens(self) -> int:
        return sum(r.n_tokens for r in self.val)


def _read_npy_header(path: Path, dtype: np.dtype, length: int | None) -> tuple[int, int]:
    """Check a .npy header; return (data offset, n elements). Raises ShardError naming path."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, file_dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, file_dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ShardError(f"{path}: unsupported .npy version {version}")
            offset = f.tell()
    except FileNotFoundError:
        raise ShardError(f"{path}: file not found") from None
    except ShardError:
        raise
    except Exception as e:  # bad magic, garbled header, short file
        raise ShardError(f"{path}: not a valid .npy file ({e})") from e
    if file_dtype != dtype:
        raise ShardError(f"{path}: dtype {file_dtype.str} but expected {dtype.str}")
    if len(shape) != 1:
        raise ShardError(f"{path}: expected a 1-D array, got shape {shape}")
    n = int(shape[0])
    if length is not None and n != length:
        raise ShardError(f"{path}: holds {n} elements but the manifest says {length}")
    expected = offset + n * dtype.itemsize
    actual = os.path.getsize(path)
    if actual != expected:
        raise ShardError(
            f"{path}: file is {actual} bytes but header + {n} x {dtype.itemsize} bytes = {expected} "
            f"({'truncated' if actual < expected else 'trailing garbage'})"
        )
    return offset, n


class TokenShards:
    """A validated, memory-mapped token directory.

    Args:
        data_dir: a token directory (manifest.json + shard files), e.g. a published tokens
            version, ``ArtifactStore.local_dir("tokens", version)``.
        verify: check every file used against the store manifest's size and sha256 when
            the directory is a published version (default). False skips the hashing (size
            checks stay), for callers that verified the version already.
        verify_hashes: also hash the shards of a directory that is not a published
            version against the sha256 its meta records. False adds nothing (it does not
            turn `verify` off).

    Raises:
        ShardError: naming the file: missing, malformed, inconsistent, or (in a published
            version) not matching the manifest's size or sha256.

    >>> ds = TokenShards("artifacts/tokens/<version>")  # doctest: +SKIP
    >>> ds.tokens(0)[:10], ds.split(0.1, window=257).train  # doctest: +SKIP
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, verify: bool = True, verify_hashes: bool = False) -> None:
        self.data_dir = Path(data_dir)
        mpath = self.data_dir / "manifest.json"
        try:
            with open(mpath, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
            if len(raw) > MAX_MANIFEST_BYTES:
                raise ShardError(f"{mpath}: larger than {MAX_MANIFEST_BYTES:,} bytes: refusing to parse it")
            manifest = json.loads(raw)
        except FileNotFoundError:
            raise ShardError(f"{mpath}: file not found (is {self.data_dir} a token directory?)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ShardError(f"{mpath}: not valid JSON ({e})") from e
        self.manifest: dict[str, Any] = manifest
        try:
            # {name: (size, sha256)} of a published version; None for a directory of one's own.
            files = published_files(manifest, str(mpath))
        except StoreError as e:
            raise ShardError(str(e)) from e
        self.published = files is not None
        try:
            meta = manifest["meta"]
            fmt = meta.get("format")
            if fmt != TOKENS_FORMAT:
                raise ShardError(f"{mpath}: meta.format is {fmt!r}, expected {TOKENS_FORMAT!r}")
            if manifest.get("kind", "tokens") != "tokens":
                raise ShardError(f"{mpath}: kind is {manifest.get('kind')!r}, expected 'tokens'")
            dtype_name = meta["dtype"]
            if dtype_name not in _DTYPES:
                raise ShardError(f"{mpath}: meta.dtype {dtype_name!r} is not one of {sorted(_DTYPES)}")
            self.dtype = _DTYPES[dtype_name]
            self.vocab_size = int(meta["vocab_size"])
            if self.vocab_size < 2 or self.vocab_size - 1 > np.iinfo(self.dtype).max:
                raise ShardError(f"{mpath}: vocab_size {self.vocab_size} does not fit dtype {dtype_name}")
            split_meta = meta.get("split")
            # the val_fraction of the split the manifest records (None: it records none)
            self.recorded_val_fraction: float | None = None if split_meta is None else float(split_meta["val_fraction"])
            sep = meta.get("separator")
            self.separator_id: int | None = None if sep is None else int(sep["id"])
            self.separator_token: str | None = None if sep is None else sep.get("token")
            if self.separator_id is not None and not 0 <= self.separator_id < self.vocab_size:
                raise ShardError(f"{mpath}: separator id {self.separator_id} outside vocab {self.vocab_size}")
            shards_meta = meta["shards"]
            if not shards_meta:
                raise ShardError(f"{mpath}: meta.shards is empty")
            self.shards: list[ShardInfo] = []
            for s in shards_meta:
                name = str(s["name"])
                if "/" in name or "\\" in name or name.startswith("."):
                    raise ShardError(f"{mpath}: bad shard name {name!r}")
                nb = s.get("n_bytes")
                self.shards.append(
                    ShardInfo(
                        name=name,
                        path=self.data_dir / f"{name}.npy",
                        idx_path=self.data_dir / f"{name}.idx.npy",
                        n_tokens=int(s["n_tokens"]),
                        n_docs=int(s["n_docs"]),
                        n_bytes=None if nb is None else int(nb),
                        sha256=s.get("sha256"),
                    )
                )
        except ShardError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ShardError(f"{mpath}: malformed manifest ({type(e).__name__}: {e})") from e
        self.version: str | None = manifest.get("version")

        self._tokens: list[np.ndarray] = []
        self._doc_ends: list[np.ndarray] = []
        for info in self.shards:
            _, n = _read_npy_header(info.path, self.dtype, info.n_tokens)
            _read_npy_header(info.idx_path, _IDX_DTYPE, info.n_docs)
            try:
                if files is not None and (verify or verify_hashes):
                    for p in (info.path, info.idx_path):
                        check_version_file(str(self.data_dir), p.name, files)
                    if info.sha256 and info.sha256 != files[info.path.name][1]:
                        raise StoreError(
                            f"{mpath}: shard {info.name}'s sha256 in meta differs from the file list's: "
                            "corrupt manifest"
                        )
                elif verify_hashes and info.sha256:
                    check_local_file(str(info.path), os.path.getsize(info.path), info.sha256, label=str(info.path))
            except StoreError as e:
                raise ShardError(str(e)) from e
            if n == 0:
                tokens = np.zeros(0, dtype=self.dtype)  # an empty file cannot be mapped
            else:
                try:
                    tokens = np.load(info.path, mmap_mode="r", allow_pickle=False)
                except Exception as e:
                    raise ShardError(f"{info.path}: cannot memory-map ({e})") from e
            try:  # mapped too: an index grows with the documents (8 bytes each)
                ends = (
                    np.load(info.idx_path, mmap_mode="r", allow_pickle=False)
                    if info.n_docs
                    else np.zeros(0, _IDX_DTYPE)
                )
            except Exception as e:
                raise ShardError(f"{info.idx_path}: cannot read ({e})") from e
            if len(ends) and np.any(ends[1:] < ends[:-1]):
                raise ShardError(f"{info.idx_path}: document end offsets are not non-decreasing")
            last = int(ends[-1]) if len(ends) else 0
            if last != n:
                raise ShardError(f"{info.idx_path}: last document end is {last} but the shard holds {n} tokens")
            self._tokens.append(tokens)
            self._doc_ends.append(ends)

    # -- accessors -----------------------------------------------------------------------

    def tokens(self, i: int) -> np.ndarray:
        return self._tokens[i]

    def doc_ends(self, i: int) -> np.ndarray:
        return self._doc_ends[i]

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.shards)

    @property
    def n_bytes(self) -> int | None:
        totals = self.manifest["meta"].get("totals") or {}
        if totals.get("n_bytes") is not None:
            return int(totals["n_bytes"])
        sizes = [s.n_bytes for s in self.shards if s.n_bytes is not None]
        if len(sizes) == len(self.shards):
            return sum(sizes)
        return None

    @property
    def bytes_per_token(self) -> float | None:
        """Average UTF-8 bytes per token over the whole directory (separators count as 0)."""
        nb, nt = self.n_bytes, self.n_tokens
        return nb / nt if nb is not None and nt > 0 else None

    @property
    def bytes_per_text_token(self) -> float | None:
        """Average UTF-8 bytes per token that is not a separator (the tokens bytes are of)."""
        nb = self.n_bytes
        n_text = self.n_tokens - (sum(s.n_docs for s in self.shards) if self.separator_id is not None else 0)
        return nb / n_text if nb is not None and n_text > 0 else None

    # -- split ---------------------------------------------------------------------------

    def val_starts(self, val_fraction: float | None = None) -> list[int]:
        """Each shard's first validation token: the manifest's recorded split (a
        `val_fraction` given must equal its fraction), else the split rule applied with
        `val_fraction` (None: 0.1). Raises ShardError naming the manifest."""
        mpath = self.data_dir / "manifest.json"
        recorded = self.recorded_val_fraction
        if recorded is None:
            fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
            return [val_start(self._doc_ends[i], info.n_tokens, fraction) for i, info in enumerate(self.shards)]
        if val_fraction is not None and abs(val_fraction - recorded) > 1e-12:
            raise ShardError(
                f"{mpath}: val_fraction {val_fraction:g} asked, but these tokens were split at encoding with "
                "val_fraction "
                f"{recorded:g}, the split every reader uses: leave val_fraction unset, or encode again with "
                f"--val-fraction {val_fraction:g}"
            )
        starts = []
        for i, (info, s) in enumerate(zip(self.shards, self.manifest["meta"]["shards"])):
            b = s.get("val_start")
            ends = self._doc_ends[i]
            at_boundary = isinstance(b, int) and 0 <= b <= info.n_tokens and (b == 0 or bool(np.any(ends == b)))
            if not at_boundary:
                raise ShardError(
                    f"{mpath}: shard {info.name}'s val_start {b!r} is not a document boundary of {info.idx_path.name}"
                )
            starts.append(int(b))
        return starts

    def split(self, val_fraction: float | None, window: int) -> Split:
        """Train and validation regions: per shard, tokens before `val_starts` and from it.

        `window` (block_size + 1) is used only to warn about regions too short to sample.
        """
        train: list[Region] = []
        val: list[Region] = []
        starts = self.val_starts(val_fraction)
        if val_fraction is None:
            val_fraction = DEFAULT_VAL_FRACTION if self.recorded_val_fraction is None else self.recorded_val_fraction
        for i, info in enumerate(self.shards):
            n = info.n_tokens
            if n == 0:
                continue
            b = starts[i]
            if b > 0:
                train.append(Region(i, 0, b))
            if b < n:
                val.append(Region(i, b, n))
        messages: list[str] = []
        usable_val = [r for r in val if r.n_tokens >= window]
        if val_fraction > 0 and not val:
            messages.append(
                f"val split is EMPTY: in every shard of {self.data_dir} the document boundary nearest "
                f"{1 - val_fraction:.0%} of its tokens is the shard's end (too few documents per shard). "
                "Val loss and bits/byte will not be computed; use shards with more documents, "
                "or val_fraction=0 to silence this."
            )
        elif val and not usable_val:
            messages.append(
                f"val split is UNUSABLE: its {sum(r.n_tokens for r in val)} tokens lie in regions shorter "
                f"than one window of {window} tokens (block_size + 1). Val loss and bits/byte will not "
                "be computed; use a larger val_fraction or a smaller block_size."
            )
        return Split(train=train, val=usable_val, messages=messages)


class WindowSampler:
    """Uniform random windows of `window` tokens from a list of regions, seeded and resumable."""

    def __init__(
        self,
        shards: TokenShards,
        regions: list[Region],
        window: int,
        batch_size: int,
        seed: int | list[int],
    ) -> None:
        self.shards = shards
        self.window = window
        self.batch_size = batch_size
        self.regions = [r for r in regions if r.n_tokens >= window]
        if not self.regions:
            raise ShardError(
                f"{shards.data_dir}: no region holds a full window of {window} tokens (block_size + 1); "
                f"regions: {[r.n_tokens for r in regions]}"
            )
        counts = np.array([r.n_tokens - window + 1 for r in self.regions], dtype=np.int64)
        self._cum = np.cumsum(counts)  # window starts, cumulative over regions
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))

    @property
    def n_windows(self) -> int:
        return int(self._cum[-1])

    def next_batch(self, rows: slice | None = None) -> np.ndarray:
        """(batch_size, window) int64 token ids; with `rows`, only those rows of it.

        Every caller draws the whole batch from the generator and reads only its rows: the
        ranks of a DDP run share one seed and each takes its slice, so an optimizer step
        sees the same windows under any world size (and a resume may change it)."""
        picks = self.rng.integers(0, self.n_windows, size=self.batch_size)
        if rows is not None:
            picks = picks[rows]
        which = np.searchsorted(self._cum, picks, side="right")
        out = np.empty((len(picks), self.window), dtype=np.int64)
        vocab = self.shards.vocab_size
        for row, (p, w) in enumerate(zip(picks, which)):
            r = self.regions[w]
            offset = int(p - (self._cum[w - 1] if w > 0 else 0))
            start = r.start + offset
            out[row] = self.shards.tokens(r.shard)[start : start + self.window]
            if out[row].max() >= vocab:
                bad = int(out[row].max())
                raise ShardError(
                    f"{self.shards.shards[r.shard].path}: token id {bad} near offset {start} is >= vocab_size {vocab}"
                )
        return out

    def state(self) -> dict[str, Any]:
        """JSON-able generator state (PCG64's 128-bit ints are plain Python ints)."""
        return dict(self.rng.bit_generator.state)  # a dict at runtime; the stubs say Mapping

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("bit_generator") != "PCG64":
            raise ValueError(f"sampler state is for {state.get('bit_generator')!r}, expected 'PCG64'")
        self.rng.bit_generator.state = state
