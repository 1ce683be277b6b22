"""`Tokenizer`: byte-level BPE with tiktoken semantics, trained here or loaded from files.

The vocabulary is a table of *mergeable ranks* (token bytes -> id), a split pattern and
special tokens, as in tiktoken. Encoding and training run in the compiled core
(`pipeline_lib._tokcore`) when it is built, else in `bpe_reference` (set
``TOKENMILL_PURE_PYTHON=1`` to force the reference); both give the same ids.

Policies:

* Any `str` encodes. Lone surrogates (which UTF-8 cannot carry) become U+FFFD, as tiktoken
  does; surrogate pairs are joined. Any `bytes` encodes with `encode_bytes`, losslessly.
* Special tokens found in the text are refused unless allowed (tiktoken's rule), see
  `encode`.
* `decode` replaces invalid UTF-8 with U+FFFD by default (a token boundary can split a
  character); `decode_bytes` is exact. Ids must be integers (Python ints or a NumPy
  integer array); floats, strings and bools are refused, never cast.
* Limits, checked on every vocabulary however it arrives (files, constructor): ids are
  ints in ``[0, MAX_VOCAB_SIZE)``, tokens (special ones as UTF-8) are at most
  ``MAX_TOKEN_BYTES`` long, a ranks file is at most ``MAX_VOCAB_FILE_BYTES``. Training
  never makes a longer token (``max_token_bytes``), so whatever it learns saves and loads.
* Long native calls stop on Ctrl-C / SIGTERM and at interpreter exit (`pipeline_lib.cancel`).

Files: `save` writes ``vocab.tiktoken`` (``base64(token) rank`` per line, tiktoken's
format) and ``tokenmill.json`` (pattern, special tokens, vocabulary size and the sha256 of
the ranks file, checked on `load`). No pickle anywhere.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import regex

from pipeline_lib import bpe_reference as ref
from pipeline_lib import cancel
from pipeline_lib.fsio import InputError, filesystem, read_bytes, write_bytes_atomic
from pipeline_lib.patterns import PATTERNS, pattern_string

FORMAT = "tokenmill.tokenizer/1"
RANKS_FILE = "vocab.tiktoken"
META_FILE = "tokenmill.json"
MAX_VOCAB_FILE_BYTES = 64 << 20
MAX_META_FILE_BYTES = 1 << 20
# Every id (ordinary or special) is below MAX_VOCAB_SIZE: 4,194,304 ids, 20x o200k's. The
# decoder's tables are per id, so this bounds what a file can make us allocate.
MAX_VOCAB_SIZE = 1 << 22
# Longest token: 1 MiB, far beyond any natural token (GPT-2/cl100k/o200k: 128 bytes or
# less) and the default max_token_bytes of training. The compiled core checks both too.
MAX_TOKEN_BYTES = 1 << 20
ENDOFTEXT = "<|endoftext|>"


def _native_core():
    if os.environ.get("TOKENMILL_PURE_PYTHON"):
        return None
    try:
        from pipeline_lib import _tokcore
    except ImportError:
        return None
    return _tokcore if hasattr(_tokcore, "Encoder") else None


_CORE = _native_core()
if _CORE is not None:
    cancel.watch(_CORE)


def backend() -> Literal["native", "python"]:
    """Which implementation encodes and trains: the compiled core or the reference."""
    return "native" if _CORE is not None else "python"


def backend_info() -> dict[str, str | None]:
    """What trains and encodes here, for manifests.

    Returns ``{"backend": "native" | "python", "core_source_hash": ...}``: the sha256 of
    the C++ sources the compiled core was built from (``_tokcore.CORE_SOURCE_HASH``), or
    None when the pure-Python reference runs.

    >>> backend_info()["backend"] in ("native", "python")
    True
    """
    if _CORE is None:
        return {"backend": "python", "core_source_hash": None}
    return {"backend": "native", "core_source_hash": _CORE.CORE_SOURCE_HASH}


def _check_id(value: Any, what: str) -> int:
    """`value` as an id: an int (a NumPy integer too, never a bool or a float) in [0, MAX_VOCAB_SIZE)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{what}: ids must be integers, got {value!r} ({type(value).__name__})")
    if not 0 <= value < MAX_VOCAB_SIZE:
        raise InputError(f"{what}: id {value} is outside [0, {MAX_VOCAB_SIZE}) (MAX_VOCAB_SIZE)")
    return int(value)


def _check_token_length(n: int, what: str) -> None:
    if n > MAX_TOKEN_BYTES:
        raise InputError(f"{what}: a token of {n} bytes is longer than MAX_TOKEN_BYTES ({MAX_TOKEN_BYTES})")


def _check_special(tok: Any, i: Any, where: str = "") -> int:
    """The id of special token `tok`, checked; `where` prefixes messages (a file name)."""
    what = f"{where}special_tokens[{str(tok)[:40]!r}]"
    if not isinstance(tok, str) or not tok:
        raise InputError(f"{what}: a special token must be a non-empty string, got {tok!r}")
    try:
        n = len(tok.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InputError(f"{what}: not encodable as UTF-8 ({e.reason})") from None
    _check_token_length(n, what)
    return _check_id(i, what)


def _id_list(ids: Iterable[int] | np.ndarray) -> list[int]:
    """Ids as a list of Python ints: an integer array converts at once, anything else
    must hold ints (NumPy integers included); floats, strings and bools raise TypeError."""
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got an array of {ids.dtype}")
        if ids.ndim != 1:
            raise ValueError(f"token ids must be one-dimensional, got shape {ids.shape}")
        return ids.tolist()
    out = list(ids)
    if all(type(i) is int for i in out):
        return out
    for k, i in enumerate(out):
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"token ids must be integers: ids[{k}] is {i!r} ({type(i).__name__})")
    return [int(i) for i in out]


class PieceCounts:
    """A piece -> count table, filled from documents; native when the core is built."""

    def __init__(self, pattern: str = "cl100k"):
        pattern_string(pattern)
        self.pattern = pattern
        self._native = _CORE.PieceCounter(_CORE.PATTERN_IDS[pattern]) if _CORE else None
        self._counts: dict[bytes, int] = {}

    def add_documents(self, docs: Sequence[bytes]) -> None:
        if self._native is not None:
            self._native.add_batch(list(docs))
        else:
            counts = ref.count_pieces(docs, self.pattern)
            for piece, n in counts.items():
                self._counts[piece] = self._counts.get(piece, 0) + n

    def add_counts(self, pieces: Sequence[bytes], counts: np.ndarray) -> None:
        if self._native is not None:
            self._native.add_counts(list(pieces), np.asarray(counts, dtype=np.int64))
        else:
            for piece, n in zip(pieces, counts.tolist()):
                self._counts[piece] = self._counts.get(piece, 0) + n

    def to_arrays(self) -> tuple[list[bytes], np.ndarray]:
        """Pieces sorted by their bytes, and their counts: deterministic whatever the order of adds."""
        if self._native is not None:
            return self._native.to_arrays()
        pieces = sorted(self._counts)
        return pieces, np.array([self._counts[p] for p in pieces], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._native) if self._native is not None else len(self._counts)


def count_documents(docs: Iterable[bytes], pattern: str, workers: int = 0, batch_bytes: int = 4 << 20) -> PieceCounts:
    """Count pieces over byte documents on `workers` threads (the native counter releases the GIL).

    Each thread fills its own counter from batches of about `batch_bytes`; the counters are
    summed at the end, so the result does not depend on the number of threads.
    """
    workers = workers or os.cpu_count() or 1
    if _CORE is None or workers == 1:
        total = PieceCounts(pattern)
        batch: list[bytes] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) >= 4096:
                total.add_documents(batch)
                batch = []
        total.add_documents(batch)
        return total
    import threading
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()
    counters: list[PieceCounts] = []
    lock = threading.Lock()

    def work(batch: list[bytes]) -> None:
        counter = getattr(local, "counter", None)
        if counter is None:
            counter = local.counter = PieceCounts(pattern)
            with lock:
                counters.append(counter)
        counter.add_documents(batch)

    with ThreadPoolExecutor(workers) as pool:
        pending, batch, size = [], [], 0
        try:
            for doc in docs:
                batch.append(doc)
                size += len(doc)
                if size >= batch_bytes:
                    pending.append(pool.submit(work, batch))
                    batch, size = [], 0
                    if len(pending) > 2 * workers:  # bound memory: wait for the oldest batch
                        pending.pop(0).result()
            if batch:
                pending.append(pool.submit(work, batch))
            for f in pending:
                f.result()
        except BaseException as e:
            for f in pending:
                f.cancel()
            # Leaving the `with` joins the workers: on Ctrl-C / SystemExit stop their native
            # calls now (every native call in the process) rather than wait for their batches.
            if not isinstance(e, Exception):
                cancel.cancel_native_calls()
            raise
    if not counters:
        return PieceCounts(pattern)
    total = counters[0]
    for other in counters[1:]:
        total.add_counts(*other.to_arrays())
    return total


def _learn_merges(
    pieces: list[bytes], counts: np.ndarray, n_merges: int, min_frequency: int, progress, max_token_bytes: int
) -> list[tuple[int, int, int]]:
    if _CORE is not None:
        rows = _CORE.learn_merges(pieces, np.asarray(counts, dtype=np.int64), n_merges, min_frequency, progress, max_token_bytes)
        return [tuple(r) for r in np.asarray(rows).tolist()]
    return ref.learn_merges(dict(zip(pieces, counts.tolist())), n_merges, min_frequency, progress, max_token_bytes)


class Tokenizer:
    """A byte-level BPE tokenizer: mergeable ranks + split pattern + special tokens.

    >>> tok = Tokenizer.train(["hello hello world"], vocab_size=260, pattern="gpt2", special_tokens=())
    >>> tok.decode(tok.encode("hello world"))
    'hello world'
    """

    def __init__(
        self,
        mergeable_ranks: Mapping[bytes, int],
        pattern: str = "cl100k",
        special_tokens: Mapping[str, int] | None = None,
        *,
        merges: Sequence[tuple[int, int, int]] | None = None,
        name: str = "tokenmill",
    ):
        self.pattern = pattern
        self.pattern_str = pattern_string(pattern)
        self.name = name
        self.mergeable_ranks: dict[bytes, int] = dict(mergeable_ranks)
        self.special_tokens: dict[str, int] = dict(special_tokens or {})
        self.merges = list(merges) if merges is not None else None
        self._validate()
        self._token_bytes: dict[int, bytes] = {i: b for b, i in self.mergeable_ranks.items()}
        for tok, i in self.special_tokens.items():
            self._token_bytes[i] = tok.encode("utf-8")
        self.vocab_size = max(self._token_bytes) + 1
        self._special_re = (
            regex.compile("|".join(regex.escape(t) for t in sorted(self.special_tokens, key=len, reverse=True)))
            if self.special_tokens
            else None
        )
        self._encoder = None
        if _CORE is not None:
            tokens = list(self.mergeable_ranks)
            ranks = np.fromiter(self.mergeable_ranks.values(), dtype=np.uint32, count=len(tokens))
            self._encoder = _CORE.Encoder(tokens, ranks, _CORE.PATTERN_IDS[pattern])

    def _validate(self) -> None:
        ranks = self.mergeable_ranks
        # Whole-vocabulary checks at C speed first; the slow loops only name the culprit.
        if ranks and set(map(type, ranks)) != {bytes}:
            bad = next(t for t in ranks if type(t) is not bytes)
            raise InputError(f"mergeable_ranks: tokens must be bytes, got {bad!r} ({type(bad).__name__})")
        if ranks and set(map(type, ranks.values())) != {int}:
            self.mergeable_ranks = ranks = {t: _check_id(i, f"mergeable_ranks[{t!r}]") for t, i in ranks.items()}
        ids = list(ranks.values())
        if ids and not (0 <= min(ids) and max(ids) < MAX_VOCAB_SIZE):
            t, i = next((t, i) for t, i in ranks.items() if not 0 <= i < MAX_VOCAB_SIZE)
            _check_id(i, f"mergeable_ranks[{t!r}]")
        longest = max(map(len, ranks), default=0)
        if longest > MAX_TOKEN_BYTES:
            _check_token_length(longest, "mergeable_ranks")
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise InputError(f"vocabulary lacks single-byte tokens for bytes {missing[:8]}...: not byte-level, cannot be lossless")
        id_set = set(ids)
        if len(id_set) != len(ids):
            raise InputError("vocabulary has two tokens with the same id")
        specials = {}
        for tok, i in self.special_tokens.items():
            i = specials[tok] = _check_special(tok, i)
            if i in id_set:
                raise InputError(f"special token {tok!r} has id {i}, which an ordinary token already uses")
        self.special_tokens = specials
        if len(set(specials.values())) != len(specials):
            raise InputError("two special tokens share an id")

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        counts_or_texts: Mapping[bytes, int] | Iterable[str | bytes],
        vocab_size: int,
        pattern: str = "cl100k",
        special_tokens: Sequence[str] | Mapping[str, int] = (ENDOFTEXT,),
        min_frequency: int = 1,
        progress: Callable[[int, int], None] | None = None,
        workers: int = 0,
        max_token_bytes: int = MAX_TOKEN_BYTES,
    ) -> Tokenizer:
        """Learn a vocabulary of `vocab_size` ids (256 bytes + merges + special tokens).

        `counts_or_texts` is a piece -> count table (what the counting stage writes) or
        documents to count here, on `workers` threads (0 = all cores). When the corpus cannot give that many merges, training
        stops early with a warning and the vocabulary is smaller. A pair whose merged token
        would be longer than `max_token_bytes` is never merged (the default, 1 MiB, only
        matters for pathological pieces such as a megabyte of one repeated character).

        Raises:
            InputError: `vocab_size` too small for the bytes and the special tokens, or too
                large, or `max_token_bytes` outside [2, MAX_TOKEN_BYTES].
        """
        n_special = len(special_tokens)
        if vocab_size < 256 + n_special:
            raise InputError(
                f"vocab_size={vocab_size} is too small: byte-level BPE needs 256 byte tokens"
                f" plus {n_special} special token(s), so at least {256 + n_special}"
            )
        if vocab_size > MAX_VOCAB_SIZE:
            raise InputError(f"vocab_size={vocab_size} is larger than MAX_VOCAB_SIZE ({MAX_VOCAB_SIZE})")
        if not 2 <= max_token_bytes <= MAX_TOKEN_BYTES:
            raise InputError(f"max_token_bytes={max_token_bytes} must be in [2, {MAX_TOKEN_BYTES}] (MAX_TOKEN_BYTES)")
        if isinstance(counts_or_texts, Mapping):
            items = sorted(counts_or_texts.items())
            pieces = [p for p, _ in items]
            counts = np.array([c for _, c in items], dtype=np.int64)
        else:
            docs = (ref.utf8(t) if isinstance(t, str) else t for t in counts_or_texts)
            pieces, counts = count_documents(docs, pattern, workers).to_arrays()
        n_merges = vocab_size - 256 - n_special
        merges = _learn_merges(pieces, counts, n_merges, min_frequency, progress, max_token_bytes)
        ranks = ref.ranks_from_merges(merges)
        if len(merges) < n_merges:
            warnings.warn(
                f"the corpus gave only {len(merges)} merges of the {n_merges} asked for"
                f" (vocab_size={vocab_size}); the vocabulary has {len(ranks) + n_special} ids",
                stacklevel=2,
            )
        if isinstance(special_tokens, Mapping):
            specials = dict(special_tokens)
        else:
            specials = {tok: len(ranks) + i for i, tok in enumerate(special_tokens)}
        return cls(ranks, pattern, specials, merges=merges)

    # ------------------------------------------------------------------ encoding
    def encode_ordinary(self, text: str) -> np.ndarray:
        """Encode text, treating special-token strings as plain text."""
        return self.encode_bytes(ref.utf8(text))

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """Encode any bytes (valid UTF-8 or not) losslessly, without special tokens."""
        if self._encoder is not None:
            return self._encoder.encode_ordinary(data)
        return np.array(ref.encode_ordinary(data, self.mergeable_ranks, self.pattern), dtype=np.uint32)

    def encode(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | Collection[str] = frozenset(),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> np.ndarray:
        """Encode text into a uint32 array of ids.

        Special tokens are refused by default: text that contains one raises, because text
        from users must not inject control tokens. Pass ``allowed_special={"<|endoftext|>"}``
        (or ``"all"``) to encode them as special ids, or ``disallowed_special=()`` to encode
        them as ordinary text.

        Raises:
            ValueError: the text contains a disallowed special token.
        """
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise InputError(f"unknown special token(s) {sorted(unknown)}; this tokenizer has {sorted(self.special_tokens)}")
        disallowed = set(self.special_tokens) - allowed if disallowed_special == "all" else set(disallowed_special)
        if disallowed:
            found = regex.search("|".join(regex.escape(t) for t in disallowed), text)
            if found:
                raise ValueError(
                    f"text contains the special token {found.group()!r} at offset {found.start()}."
                    f" Pass allowed_special={{{found.group()!r}}} to encode it as a special token,"
                    " or disallowed_special=() to encode it as plain text."
                )
        if not allowed:
            return self.encode_ordinary(text)
        allowed_re = regex.compile("|".join(regex.escape(t) for t in sorted(allowed, key=len, reverse=True)))
        parts: list[np.ndarray] = []
        start = 0
        for m in allowed_re.finditer(text):
            parts.append(self.encode_ordinary(text[start : m.start()]))
            parts.append(np.array([self.special_tokens[m.group()]], dtype=np.uint32))
            start = m.end()
        parts.append(self.encode_ordinary(text[start:]))
        return np.concatenate(parts)

    def encode_batch(self, texts: Sequence[str], workers: int = 0, **special: Any) -> list[np.ndarray]:
        """Encode many texts; ordinary texts run on `workers` native threads (0 = all cores)."""
        if special or self._encoder is None:
            return [self.encode(t, **special) if special else self.encode_ordinary(t) for t in texts]
        flat, offsets = self.encode_ordinary_batch([ref.utf8(t) for t in texts], workers)
        return np.split(flat, offsets[1:-1].astype(np.int64))

    def encode_ordinary_batch(self, docs: Sequence[bytes], workers: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Encode byte documents into one flat id array plus cumulative end offsets (len+1)."""
        if self._encoder is not None:
            return self._encoder.encode_ordinary_batch(list(docs), workers)
        arrays = [self.encode_bytes(d) for d in docs]
        offsets = np.zeros(len(arrays) + 1, dtype=np.uint64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
        return flat.astype(np.uint32, copy=False), offsets

    # ------------------------------------------------------------------ decoding
    def decode_bytes(self, ids: Iterable[int] | np.ndarray) -> bytes:
        """The exact bytes of a sequence of ids (special tokens as their UTF-8 text).

        Raises:
            TypeError: an id that is not an integer (a float, a string, a bool).
            InputError: an id that is not in the vocabulary.
        """
        try:
            return b"".join(map(self._token_bytes.__getitem__, _id_list(ids)))
        except KeyError as e:
            raise InputError(f"token id {e.args[0]} is not in this vocabulary (size {self.vocab_size})") from None

    def decode(self, ids: Iterable[int] | np.ndarray, errors: str = "replace") -> str:
        """Decode ids to text; invalid UTF-8 follows `errors` (default: U+FFFD). Raises as `decode_bytes`."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def token_bytes(self, i: int) -> bytes:
        return self._token_bytes[i]

    def token_byte_lengths(self) -> np.ndarray:
        """Byte length of every id (0 for unused ids and special tokens): for bits per byte."""
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for b, i in self.mergeable_ranks.items():
            lengths[i] = len(b)
        return lengths

    # ------------------------------------------------------------------ files
    def ranks_text(self) -> bytes:
        """The ``vocab.tiktoken`` file. Raises InputError if `load` would refuse it (too big)."""
        lines = [
            base64.b64encode(b) + b" " + str(i).encode()
            for b, i in sorted(self.mergeable_ranks.items(), key=lambda kv: kv[1])
        ]
        text = b"\n".join(lines) + b"\n"
        if len(text) > MAX_VOCAB_FILE_BYTES:
            raise InputError(
                f"the ranks file of this vocabulary would be {len(text)} bytes, above the"
                f" {MAX_VOCAB_FILE_BYTES} (MAX_VOCAB_FILE_BYTES) that loading accepts; train with a smaller"
                " max_token_bytes or vocab_size"
            )
        return text

    def metadata(self) -> dict[str, Any]:
        ranks = self.ranks_text()
        return {
            "format": FORMAT,
            "name": self.name,
            "pattern": self.pattern,
            "pattern_str": self.pattern_str,
            "special_tokens": self.special_tokens,
            "vocab_size": self.vocab_size,
            "n_ranks": len(self.mergeable_ranks),
            "ranks_file": RANKS_FILE,
            "ranks_sha256": hashlib.sha256(ranks).hexdigest(),
        }

    def save(self, url: str, **storage_options: Any) -> None:
        """Write ``vocab.tiktoken`` and ``tokenmill.json`` into the directory `url`."""
        fs, root = filesystem(url, **storage_options)
        fs.makedirs(root, exist_ok=True)
        write_bytes_atomic(fs, f"{root}/{RANKS_FILE}", self.ranks_text())
        meta = json.dumps(self.metadata(), indent=2, ensure_ascii=False).encode()
        write_bytes_atomic(fs, f"{root}/{META_FILE}", meta)

    @classmethod
    def load(cls, url: str, **storage_options: Any) -> Tokenizer:
        """Load a tokenizer saved by `save`, checking the ranks file's sha256.

        Raises:
            InputError: a missing, corrupt or tampered file, named in the message.
        """
        meta_url = f"{url.rstrip('/')}/{META_FILE}"
        raw = read_bytes(meta_url, MAX_META_FILE_BYTES, **storage_options)
        try:
            meta = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{meta_url}: not valid JSON ({e})") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise InputError(f"{meta_url}: not a tokenmill tokenizer file (format {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r})")
        for key in ("pattern", "special_tokens", "ranks_sha256"):
            if key not in meta:
                raise InputError(f"{meta_url}: missing field {key!r}")
        if meta["pattern"] not in PATTERNS:
            raise InputError(f"{meta_url}: unknown pattern {meta['pattern']!r}")
        ranks_url = f"{url.rstrip('/')}/{RANKS_FILE}"
        data = read_bytes(ranks_url, MAX_VOCAB_FILE_BYTES, **storage_options)
        digest = hashlib.sha256(data).hexdigest()
        if digest != meta["ranks_sha256"]:
            raise InputError(f"{ranks_url}: sha256 {digest[:12]}… does not match {meta_url} ({meta['ranks_sha256'][:12]}…): the file is corrupt or was changed")
        specials = meta["special_tokens"]
        if not isinstance(specials, dict):
            raise InputError(f"{meta_url}: special_tokens must map strings to integer ids")
        for tok, i in specials.items():
            _check_special(tok, i, f"{meta_url}: ")
        return cls(parse_tiktoken_ranks(data, ranks_url), meta["pattern"], specials, name=meta.get("name", "tokenmill"))

    @classmethod
    def from_tiktoken(
        cls,
        path_or_url: str,
        pattern: str = "cl100k",
        special_tokens: Mapping[str, int] | None = None,
        **storage_options: Any,
    ) -> Tokenizer:
        """Load a ``.tiktoken`` ranks file (optionally ``.gz``), e.g. cl100k_base or o200k_base."""
        data = read_bytes(path_or_url, MAX_VOCAB_FILE_BYTES, **storage_options)
        name = os.path.basename(path_or_url).split(".")[0]
        return cls(parse_tiktoken_ranks(data, path_or_url), pattern, special_tokens, name=name)

    @classmethod
    def from_gpt2(cls, encoder_json: str, vocab_bpe: str, **storage_options: Any) -> Tokenizer:
        """Load GPT-2's ``encoder.json`` + ``vocab.bpe``: ids equal to tiktoken's ``gpt2``."""
        from pipeline_lib.formats import gpt2_ranks

        enc = read_bytes(encoder_json, MAX_VOCAB_FILE_BYTES, **storage_options)
        bpe = read_bytes(vocab_bpe, MAX_VOCAB_FILE_BYTES, **storage_options)
        ranks = gpt2_ranks(enc, bpe, encoder_json, vocab_bpe)
        return cls(ranks, "gpt2", {ENDOFTEXT: 50256}, name="gpt2")

    def to_hf_json(self, path: str) -> None:
        """Write a HF ``tokenizer.json`` that `tokenizers.Tokenizer.from_file` loads, with our ids."""
        from pipeline_lib.formats import hf_tokenizer_json

        fs, p = filesystem(path)
        write_bytes_atomic(fs, p, json.dumps(hf_tokenizer_json(self), ensure_ascii=False).encode())

    def to_tiktoken(self):
        """A `tiktoken.Encoding` with the same ranks, pattern and special tokens."""
        import tiktoken

        return tiktoken.Encoding(
            name=self.name,
            pat_str=self.pattern_str,
            mergeable_ranks=self.mergeable_ranks,
            special_tokens=self.special_tokens,
        )

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, pattern={self.pattern!r}, vocab_size={self.vocab_size}, special={sorted(self.special_tokens)})"


def parse_tiktoken_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """Parse ``base64(token) rank`` lines, naming the file and line of any error.

    Ranks are decimal digits below MAX_VOCAB_SIZE; tokens at most MAX_TOKEN_BYTES long.
    """
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InputError(f"{source}:{lineno}: expected 'base64-token rank', got {line[:60]!r}")
        if not parts[1].isdigit():  # ASCII digits only: no sign, no '_', no exponent
            raise InputError(f"{source}:{lineno}: cannot parse {line[:60]!r} (the rank must be a non-negative integer)")
        try:
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except (binascii.Error, ValueError) as e:
            raise InputError(f"{source}:{lineno}: cannot parse {line[:60]!r} ({e})") from e
        if rank >= MAX_VOCAB_SIZE:
            raise InputError(f"{source}:{lineno}: rank {rank} is outside [0, {MAX_VOCAB_SIZE}) (MAX_VOCAB_SIZE)")
        if len(token) > MAX_TOKEN_BYTES:
            _check_token_length(len(token), f"{source}:{lineno}")
        if token in ranks:
            raise InputError(f"{source}:{lineno}: token {token!r} appears twice")
        ranks[token] = rank
    if not ranks:
        raise InputError(f"{source}: no tokens in the file")
    return ranks
