"""`Tokenizer`: encoding and decoding with tiktoken's `Encoding` API. No I/O here.

The vocabulary is a table of *mergeable ranks* (token bytes -> id), a split pattern and
special tokens, as in tiktoken. Encoding runs in the compiled core
(`pipeline_lib._tokcore`) when it is built, else in `bpe_reference` (set
``TOKENMILL_PURE_PYTHON=1`` to force the reference); both give the same ids.

Training, files and exports live beside this module (`train`, `load`, `export`); the
`Tokenizer` methods for them (`train`, `save`, `load`, `to_hf_json`, ...) call into them.
"""

from __future__ import annotations

import bisect
import errno
import functools
import io
import mmap
import os
import re
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pipeline_lib import bpe_reference as ref
from pipeline_lib.errors import InputError
from pipeline_lib.formats import npy_header
from pipeline_lib.lazy import LazyModule, is_integer, is_ndarray
from pipeline_lib.patterns import NO_SPLIT, PATTERNS, check_pattern, is_custom, pattern_string
from pipeline_lib.tokenizer import native
from pipeline_lib.tokenizer.limits import (  # noqa: F401  (re-exported: the package's names, as before)
    ENDOFTEXT,
    MAX_TOKEN_BYTES,
    MAX_VOCAB_SIZE,
    UNIT_DESCRIPTIONS,
    UNITS,
    UNK,
    UnknownTokenError,
    check_id,
    check_special,
    check_token_length,
    check_unit,
)
from pipeline_lib.tokenizer.load import RanksFile
from pipeline_lib.tokenizer.native import backend, backend_info  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    import numpy as np
    import regex

    from pipeline_lib.tokenizer.train import PieceTable
else:  # `get_encoding`, `encode`, `decode` and lists need neither
    np = LazyModule(globals(), "np", "numpy")
    regex = LazyModule(globals(), "regex", "regex")

# tiktoken runs its threads in Rust; ours are the native core's. Same default count.
DEFAULT_THREADS = 8
THREADS_ENV = "TOKENMILL_NUM_THREADS"


def text_threads() -> int:
    """The threads one long text (512 KiB or more) is encoded on: ``TOKENMILL_NUM_THREADS``,
    else the machine's cores up to `DEFAULT_THREADS`."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return min(os.cpu_count() or 1, DEFAULT_THREADS)
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"{THREADS_ENV}={value!r}: expected a number of threads (1 or more); unset it for all cores")
    return int(value)


def _id_list(ids: Iterable[int] | np.ndarray) -> list[int]:
    """Ids as a list of Python ints: an integer array converts at once, anything else
    must hold ints (NumPy integers included); floats, strings and bools raise TypeError."""
    if is_ndarray(ids):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got an array of {ids.dtype}")
        if ids.ndim != 1:
            raise ValueError(f"token ids must be one-dimensional, got shape {ids.shape}")
        return ids.tolist()
    out = list(ids)
    if all(type(i) is int for i in out):
        return out
    for k, i in enumerate(out):
        if not is_integer(i):
            raise TypeError(f"token ids must be integers: ids[{k}] is {i!r} ({type(i).__name__})")
    return [int(i) for i in out]


def _one_id(token: Any) -> int:
    if not is_integer(token):
        raise TypeError(f"a token id must be an integer, got {token!r} ({type(token).__name__})")
    return int(token)


@functools.lru_cache(maxsize=128)
def _special_regex(tokens: frozenset[str]) -> regex.Pattern:
    """One regex matching any of `tokens`; the longest first where two start at one place."""
    return regex.compile("|".join(regex.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t))))


@functools.lru_cache(maxsize=128)
def _common_prefix(tokens: frozenset[str]) -> str:
    """The prefix every one of `tokens` starts with ("<|" for tiktoken's): a text without it
    holds none of them, which one substring search tells faster than the regex."""
    return os.path.commonprefix(sorted(tokens))


def _disallowed_error(token: str, offset: int) -> ValueError:
    return ValueError(
        f"the text contains the special token {token!r} (at offset {offset}), which this call does not allow."
        f" To encode it as its special id, pass allowed_special={{{token!r}}} (or allowed_special='all');"
        f" to encode it as plain text, pass disallowed_special=() or leave it out of disallowed_special."
    )


SpecialSet = Literal["all"] | Collection[str]
# `encode`'s default allowed_special: told apart by identity on its fast path.
_NONE_ALLOWED: frozenset[str] = frozenset()
_SETS = (set, frozenset)


class EncodedFile(NamedTuple):
    """What `Tokenizer.encode_file` wrote and read."""

    ids: int
    bytes: int
    characters: int


class Tokenizer:
    """A BPE tokenizer: mergeable ranks + split pattern + special tokens, over a unit.

    The unit (``byte``, ``char`` or ``word``, see `pipeline_lib.bpe_reference`) is what a
    piece starts as before merging; ``byte`` is tiktoken's and the default. Every unit
    encodes and decodes with the same methods; ``word`` is lossy (`lossy`).

    Its methods are tiktoken's `Encoding` API (same names, arguments, results and
    policies), plus array paths (`encode_to_numpy`, `encode_ordinary_batch_to_numpy`),
    training and files. It is built as ``Tokenizer(ranks, pattern, special_tokens)`` or with
    tiktoken's constructor, ``Tokenizer(name, pat_str=..., mergeable_ranks=...,
    special_tokens=..., explicit_n_vocab=None)`` (the name positional or a keyword), for the
    split patterns the core implements (gpt2/r50k/p50k, cl100k, o200k).

    Policies:

    * Any `str` encodes. Lone surrogates (which UTF-8 cannot carry) become U+FFFD, as
      tiktoken does; surrogate pairs are joined. Any `bytes` encodes with `encode_bytes`,
      losslessly, with tiktoken's ids.
    * Special tokens found in the text are refused unless allowed (tiktoken's rule), see
      `encode`. Names in ``allowed_special`` that are not special tokens here are ignored.
    * `decode` replaces invalid UTF-8 with U+FFFD by default (a token boundary can split a
      character); `decode_bytes` is exact. Ids must be integers (Python ints or a NumPy
      integer array); floats, strings and bools are refused (TypeError), never cast. An id
      not in the vocabulary raises `UnknownTokenError` (a KeyError, as in tiktoken).
    * Limits, checked on every vocabulary however it arrives (files, constructor): ids are
      ints in ``[0, MAX_VOCAB_SIZE)``, tokens (special ones as UTF-8) are at most
      ``MAX_TOKEN_BYTES`` long. Two special tokens may share an id (tiktoken's
      ``o200k_harmony`` does); the first one decodes it.
    * Long native calls stop on Ctrl-C / SIGTERM and at interpreter exit (`pipeline_lib.cancel`).
    * Pickles and deep-copies by value (ranks, pattern, special tokens, merges); the
      native encoder is rebuilt on the other side.

    >>> tok = Tokenizer.train(["hello hello world"], vocab_size=260, pattern="gpt2", special_tokens=())
    >>> tok.decode(tok.encode("hello world"))
    'hello world'
    """

    def __init__(
        self,
        ranks_or_name: Mapping[bytes, int] | RanksFile | str | None = None,
        /,
        pattern: str = "cl100k",
        special_tokens: Mapping[str, int] | None = None,
        *,
        mergeable_ranks: Mapping[bytes, int] | RanksFile | None = None,
        merges: Sequence[tuple[int, int, int]] | None = None,
        merge_counts: Sequence[int] | None = None,
        name: str | None = None,
        pat_str: str | None = None,
        explicit_n_vocab: int | None = None,
        unit: str = "byte",
        unknown: str | None = None,
        lowercase: bool = False,
    ):
        # The first argument is the ranks (``Tokenizer(ranks, "gpt2", specials)``) or, as in
        # tiktoken's ``Encoding(name, *, pat_str, mergeable_ranks, special_tokens)``, the name.
        if isinstance(ranks_or_name, str):
            if name is not None:
                raise TypeError("Tokenizer() got the name twice: as its first argument and as name=")
            name = ranks_or_name
        elif ranks_or_name is not None:
            if mergeable_ranks is not None:
                raise TypeError("Tokenizer() got the ranks twice: as its first argument and as mergeable_ranks=")
            mergeable_ranks = ranks_or_name
        if mergeable_ranks is None:
            raise TypeError("Tokenizer() needs mergeable_ranks (token bytes -> id), as tiktoken's Encoding does")
        if name is None:
            name = "tokenmill"
        if pat_str is not None:
            pattern = _pattern_name(pat_str)
        self.pattern = check_pattern(pattern)
        self.pattern_str = pattern_string(pattern)
        self.name = name
        self.unit = check_unit(unit)
        self.unknown = unknown if unit != "byte" else None
        self.lowercase = bool(lowercase)
        self.special_tokens: dict[str, int] = dict(special_tokens or {})
        self.merges: list[tuple[int, int, int]] | None = (
            [(a, b, x) for a, b, x in merges] if merges is not None else None
        )
        self.merge_counts = [int(c) for c in merge_counts] if merge_counts is not None else None
        if self.merge_counts is not None and (self.merges is None or len(self.merge_counts) != len(self.merges)):
            raise InputError(f"merge_counts has {len(self.merge_counts)} entries for {len(self.merges or [])} merges")
        self._ranks_file: RanksFile | None = None
        self._ranks: dict[bytes, int] | None = None
        # One id -> bytes table for the byte and char units (a few million entries at the file
        # cap); the word unit also keeps its raw bytes, whose end-of-word symbol decodes as a space.
        self._bytes_by_id: dict[int, bytes] | None = None
        self._raw_bytes: dict[int, bytes] | None = None
        encoder = self._encoder_from_file(mergeable_ranks) if isinstance(mergeable_ranks, RanksFile) else None
        if encoder is not None:  # the tables by token are made on first use (`mergeable_ranks`)
            assert isinstance(mergeable_ranks, RanksFile)
            self._ranks_file = mergeable_ranks
            self._check_specials(encoder.has_id)
            n_ordinary, largest_ordinary = encoder.token_count, encoder.vocab_size - 1
        else:
            self.mergeable_ranks = (
                mergeable_ranks.parse() if isinstance(mergeable_ranks, RanksFile) else dict(mergeable_ranks)
            )
            self._bytes_by_id = self._validate()
            if self.unit == "word":  # the tutorials' decoders: </w> -> a space
                self._raw_bytes = self._bytes_by_id
                self._bytes_by_id = {i: b.replace(ref.END_OF_WORD, b" ") for i, b in self._raw_bytes.items()}
            self._add_special_bytes(self._bytes_by_id)
            n_ordinary, largest_ordinary = len(self.mergeable_ranks), max(self.mergeable_ranks.values(), default=-1)
        self.max_token_value = max(largest_ordinary, *self.special_tokens.values(), 0)
        self.vocab_size = self.max_token_value + 1
        if explicit_n_vocab:
            if n_ordinary + len(self.special_tokens) != explicit_n_vocab or self.vocab_size != explicit_n_vocab:
                raise InputError(
                    f"explicit_n_vocab={explicit_n_vocab}, but the vocabulary has {n_ordinary} ordinary and"
                    f" {len(self.special_tokens)} special tokens, the largest id {self.max_token_value}"
                )
        self._special_names = frozenset(self.special_tokens)
        # What `encode` looks for before anything else: None, no special tokens (no text holds
        # one); else the prefix all of them share ("<|" for tiktoken's), which a text holding
        # any of them must contain ("" when they share none: every text must be searched).
        self._special_prefix = _common_prefix(self._special_names) if self._special_names else None
        self._special_ids = frozenset(self.special_tokens.values())
        self._unknown_id = self.special_tokens[UNK] if self.unknown == "unk" else None
        # Custom regexes and the word unit's words are split in Python; the core then encodes
        # each piece as a whole (NO_SPLIT).
        self._split_in_python = self.unit == "word" or is_custom(self.pattern)
        self._core, self._encoder = native._CORE, encoder
        if native._CORE is not None and encoder is None:
            split = self._split_in_python or self.pattern == NO_SPLIT
            pattern_id = native._CORE.NO_SPLIT if split else native._CORE.PATTERN_IDS[self.pattern]
            self._encoder = native._CORE.Encoder(
                list(self.mergeable_ranks),
                list(self.mergeable_ranks.values()),
                pattern_id,
                self.unit != "byte",
                self._unknown_id,
            )
            self._encoder.text_threads = text_threads()
        # text -> list (or array) of ids in one native call, where the core splits the text itself
        splitting = self._encoder if not self._split_in_python else None
        self._encode_list = splitting.encode_ordinary_list if splitting is not None else None
        self._encode_array = splitting.encode_ordinary if splitting is not None else None

    def _validate(self) -> dict[int, bytes]:
        """Checks the vocabulary; returns its tokens by id."""
        ranks = self.mergeable_ranks
        # Whole-vocabulary checks at C speed first; the slow loops only name the culprit.
        if ranks and set(map(type, ranks)) != {bytes}:
            bad = next(t for t in ranks if type(t) is not bytes)
            raise InputError(f"mergeable_ranks: tokens must be bytes, got {bad!r} ({type(bad).__name__})")
        if ranks and set(map(type, ranks.values())) != {int}:
            self.mergeable_ranks = ranks = {t: check_id(i, f"mergeable_ranks[{t!r}]") for t, i in ranks.items()}
        if ranks and not (0 <= min(ranks.values()) and max(ranks.values()) < MAX_VOCAB_SIZE):
            t, i = next((t, i) for t, i in ranks.items() if not 0 <= i < MAX_VOCAB_SIZE)
            check_id(i, f"mergeable_ranks[{t!r}]")
        longest = max(map(len, ranks), default=0)
        if longest > MAX_TOKEN_BYTES:
            check_token_length(longest, "mergeable_ranks")
        if self.unit != "byte" and self.unknown not in ("unk", "bytes"):
            raise InputError(
                f"unknown={self.unknown!r}: a {self.unit}-level vocabulary needs 'unk' or 'bytes' (byte "
                "fallback) for unseen characters"
            )
        if self.unknown == "unk" and UNK not in self.special_tokens:
            raise InputError(f"unknown='unk' needs the special token {UNK!r}, which this vocabulary lacks")
        if self.lowercase and self.unit != "word":
            raise InputError(f"lowercase is for the word unit only, not unit={self.unit!r}")
        missing = [b for b in range(256) if bytes([b]) not in ranks] if self.unknown != "unk" else []
        if missing:
            what = "not byte-level, cannot be lossless" if self.unit == "byte" else "byte fallback needs every byte"
            raise InputError(f"vocabulary lacks single-byte tokens for bytes {missing[:8]}...: {what}")
        by_id = dict(zip(ranks.values(), ranks))  # the decoder's table, and the check for ids used twice
        if len(by_id) != len(ranks):
            raise InputError("vocabulary has two tokens with the same id")
        self._check_specials(by_id.__contains__)
        return by_id

    def _check_specials(self, is_ordinary_id: Callable[[int], bool]) -> None:
        specials = {}
        for tok, i in self.special_tokens.items():
            i = specials[tok] = check_special(tok, i)
            if is_ordinary_id(i):
                raise InputError(f"special token {tok!r} has id {i}, which an ordinary token already uses")
        self.special_tokens = specials

    def _add_special_bytes(self, by_id: dict[int, bytes]) -> None:
        for tok, i in self.special_tokens.items():
            by_id.setdefault(i, tok.encode("utf-8"))  # a shared id decodes to its first name

    def _encoder_from_file(self, ranks: RanksFile) -> Any:
        """The core's encoder built from the file's bytes, or None: no core, a vocabulary this
        path does not take, or a file the core refuses (the general path then names the fault)."""
        if native._CORE is None or self.unit != "byte" or is_custom(self.pattern) or self.pattern == NO_SPLIT:
            return None
        try:
            encoder = native._CORE.Encoder.from_ranks_file(ranks.data, native._CORE.PATTERN_IDS[self.pattern])
        except ValueError:
            return None
        if encoder is not None:
            encoder.text_threads = text_threads()
        return encoder

    # The tables by token, made on first use when the ranks came as a file.
    @property
    def mergeable_ranks(self) -> dict[bytes, int]:
        """Token bytes -> id of the ordinary tokens."""
        if self._ranks is None:
            assert self._ranks_file is not None
            self._ranks = self._ranks_file.parse()
        return self._ranks

    @mergeable_ranks.setter
    def mergeable_ranks(self, ranks: dict[bytes, int]) -> None:
        self._ranks = ranks

    @property
    def _token_bytes(self) -> dict[int, bytes]:
        if self._bytes_by_id is None:
            ranks = self.mergeable_ranks
            by_id = dict(zip(ranks.values(), ranks))
            self._add_special_bytes(by_id)
            self._bytes_by_id = by_id
        return self._bytes_by_id

    # tiktoken's private attributes, which its README uses to extend an encoding
    @property
    def _pat_str(self) -> str:
        return self.pattern_str

    @property
    def _mergeable_ranks(self) -> dict[bytes, int]:
        return self.mergeable_ranks

    @property
    def _special_tokens(self) -> dict[str, int]:
        return self.special_tokens

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        return {
            "mergeable_ranks": self.mergeable_ranks,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            "merges": self.merges,
            "merge_counts": self.merge_counts,
            "name": self.name,
            "unit": self.unit,
            "unknown": self.unknown,
            "lowercase": self.lowercase,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, **state)  # rebuilds the native encoder, which does not pickle

    # ------------------------------------------------------------------ training and files
    @classmethod
    def train(
        cls,
        counts_or_texts: PieceTable | Mapping[bytes, int] | Iterable[str | bytes],
        vocab_size: int,
        pattern: str | None = None,
        special_tokens: Sequence[str] | Mapping[str, int] = (ENDOFTEXT,),
        min_frequency: int = 1,
        progress: Callable[[int, int], None] | None = None,
        workers: int = 0,
        max_token_bytes: int = MAX_TOKEN_BYTES,
        *,
        unit: str = "byte",
        unknown: str = "unk",
        lowercase: bool = False,
        ties: str = "bytes",
        n_merges: int | None = None,
        on_plan: Callable[[Any], None] | None = None,
    ) -> Tokenizer:
        """Learn a vocabulary of `vocab_size` ids: `unit` ``byte``, ``char`` or ``word``,
        `pattern` a name, ``none`` or a regex (None: ``cl100k``, ``none`` for words); see
        `pipeline_lib.tokenizer.train.train_tokenizer` (`ties`, `n_merges`, `on_plan` too)."""
        from pipeline_lib.tokenizer.train import train_tokenizer

        return train_tokenizer(
            cls,
            counts_or_texts,
            vocab_size,
            pattern,
            special_tokens,
            min_frequency,
            progress,
            workers,
            max_token_bytes,
            unit,
            unknown,
            lowercase,
            ties,
            n_merges,
            on_plan,
        )

    @property
    def lossy(self) -> bool:
        """Whether decode(encode(text)) may differ from text by design (the word unit)."""
        return self.unit == "word"

    def require_byte_level(self, what: str) -> None:
        """Raise InputError unless this is byte-level BPE with a named split pattern: what
        `what` (an export format) can carry."""
        if self.unit != "byte" or self.pattern not in PATTERNS:
            kind = f"{self.unit}-level" if self.unit != "byte" else f"pattern={self.pattern!r}"
            raise InputError(
                f"{what} cannot carry this tokenizer ({kind}): it holds byte-level BPE with the gpt2, cl100k or o200k "
                "split;"
                " train with --unit byte and one of those patterns to export it, or use the tokenizer's own files "
                "(save / Tokenizer.load)"
            )

    def ranks_text(self) -> bytes:
        """The ``vocab.tiktoken`` file (see `pipeline_lib.tokenizer.load.ranks_text`)."""
        from pipeline_lib.tokenizer.load import ranks_text

        return ranks_text(self)

    def metadata(self) -> dict[str, Any]:
        """The ``tokenmill.json`` content (see `pipeline_lib.tokenizer.load.metadata`)."""
        from pipeline_lib.tokenizer.load import metadata

        return metadata(self)

    def save(self, url: str, **storage_options: Any) -> None:
        """Write ``vocab.tiktoken`` and ``tokenmill.json`` into the directory `url` (any fsspec URL)."""
        from pipeline_lib.tokenizer.load import save

        save(self, url, **storage_options)

    @classmethod
    def load(cls, url: str, **storage_options: Any) -> Tokenizer:
        """Load a tokenizer saved by `save`, checking the ranks file's sha256 (InputError if not)."""
        from pipeline_lib.tokenizer.load import load

        return load(cls, url, **storage_options)

    @classmethod
    def from_tiktoken(
        cls,
        path_or_url: str,
        pattern: str = "cl100k",
        special_tokens: Mapping[str, int] | None = None,
        **storage_options: Any,
    ) -> Tokenizer:
        """Load a ``.tiktoken`` ranks file (optionally ``.gz``), e.g. cl100k_base or o200k_base."""
        from pipeline_lib.tokenizer.load import from_tiktoken

        return from_tiktoken(cls, path_or_url, pattern, special_tokens, **storage_options)

    @classmethod
    def from_gpt2(cls, encoder_json: str, vocab_bpe: str, pattern: str = "gpt2", **storage_options: Any) -> Tokenizer:
        """Load GPT-2's ``encoder.json`` + ``vocab.bpe`` (ids equal to tiktoken's ``gpt2``), or
        the ``vocab.json`` + ``merges.txt`` of `to_gpt2` with the `pattern` it was trained with."""
        from pipeline_lib.tokenizer.load import from_gpt2

        return from_gpt2(cls, encoder_json, vocab_bpe, pattern, **storage_options)

    @classmethod
    def from_hf_json(cls, url: str, **storage_options: Any) -> Tokenizer:
        """Load a HF ``tokenizer.json`` of byte-level BPE (GPT-2, Llama 3, Qwen 2 style), ids
        equal to HF's; anything else is refused (see `pipeline_lib.tokenizer.load.from_hf_json`)."""
        from pipeline_lib.tokenizer.load import from_hf_json

        return from_hf_json(cls, url, **storage_options)

    def to_hf_json(self, path: str) -> None:
        """Write a HF ``tokenizer.json`` that `tokenizers.Tokenizer.from_file` loads, with our ids."""
        from pipeline_lib.tokenizer.export import to_hf_json

        to_hf_json(self, path)

    def to_transformers(self, directory: str, model_max_length: int | None = None, **kwargs: Any) -> None:
        """Write a directory ``transformers.AutoTokenizer.from_pretrained`` loads, with our ids
        (see `pipeline_lib.tokenizer.export.to_transformers`)."""
        from pipeline_lib.tokenizer.export import to_transformers

        to_transformers(self, directory, model_max_length, **kwargs)

    def to_gpt2(self, directory: str, **storage_options: Any) -> None:
        """Write GPT-2's ``vocab.json`` + ``merges.txt`` into `directory`; `from_gpt2` loads them back."""
        from pipeline_lib.tokenizer.export import to_gpt2

        to_gpt2(self, directory, **storage_options)

    def to_tiktoken(self):
        """A `tiktoken.Encoding` with the same ranks, pattern and special tokens."""
        from pipeline_lib.tokenizer.export import to_tiktoken

        return to_tiktoken(self)

    # ------------------------------------------------------------------ the native paths
    def _pieces(self, data: bytes) -> list[bytes]:
        """The pieces split in Python (custom regex; the word unit's words, each ending in </w>)."""
        if self.unit == "word":
            return [w + ref.END_OF_WORD for w in ref.unit_pieces(data, "word", self.pattern, self.lowercase)]
        return ref.split_bytes(data, self.pattern)

    def _ordinary_array(self, data: bytes) -> np.ndarray:
        """uint32 ids of bytes, no special tokens; invalid UTF-8 bytes split as characters of their own."""
        if self._encoder is None:
            ids = ref.encode_ordinary(
                data, self.mergeable_ranks, self.pattern, self.unit, self._unknown_id, self.lowercase
            )
            return np.array(ids, dtype=np.uint32)
        if self._split_in_python:
            return self._encoder.encode_ordinary_batch(self._pieces(data), 1)[0]
        return self._encoder.encode_ordinary(data)

    def _ordinary_batch(self, docs: list[bytes], num_threads: int) -> tuple[np.ndarray, np.ndarray]:
        if self._encoder is not None and self._split_in_python:
            per_doc = [self._pieces(d) for d in docs]
            flat, piece_offsets = self._encoder.encode_ordinary_batch([p for ps in per_doc for p in ps], num_threads)
            ends = np.zeros(len(docs) + 1, dtype=np.int64)
            np.cumsum([len(ps) for ps in per_doc], out=ends[1:])
            return flat, piece_offsets[ends]
        if self._encoder is not None:
            return self._encoder.encode_ordinary_batch(docs, num_threads)
        arrays = [self._ordinary_array(d) for d in docs]
        offsets = np.zeros(len(arrays) + 1, dtype=np.uint64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
        return flat.astype(np.uint32, copy=False), offsets

    def _bpe_piece(self, piece: bytes) -> list[int]:
        if self._encoder is not None:
            return self._encoder.encode_piece(piece).tolist()
        if self.unit != "byte":
            return ref.bpe_chars(piece, self.mergeable_ranks, self._unknown_id)
        return ref.bpe_piece(piece, self.mergeable_ranks)

    def _split(self, data: bytes) -> list[bytes]:
        if self._core is not None and self.pattern in PATTERNS:
            return self._core.split(data, self._core.PATTERN_IDS[self.pattern])
        return ref.split_bytes(data, self.pattern)

    # ------------------------------------------------------------------ special tokens
    def _allowed(
        self, text_or_texts: str | Sequence[str], allowed_special: SpecialSet, disallowed_special: SpecialSet
    ) -> frozenset[str]:
        """The special tokens to encode as such; raises if a text holds a disallowed one."""
        if (
            isinstance(text_or_texts, str)
            and disallowed_special == "all"
            and isinstance(allowed_special, (frozenset, set))
            and not allowed_special
        ):
            # encode(text) with the defaults: no set arithmetic, often no regex search
            prefix = _common_prefix(self._special_names) if self._special_names else None
            if prefix is None or (prefix and prefix not in text_or_texts):
                return frozenset()
        if allowed_special == "all":
            allowed = self._special_names
        elif isinstance(allowed_special, str):
            raise TypeError(f"allowed_special must be 'all' or a collection of strings, got {allowed_special!r}")
        else:
            allowed = frozenset(allowed_special) & self._special_names
        if disallowed_special == "all":
            disallowed = self._special_names - allowed if allowed else self._special_names  # the cached regex's key
        elif isinstance(disallowed_special, str):
            raise TypeError(f"disallowed_special must be 'all' or a collection of strings, got {disallowed_special!r}")
        else:
            disallowed = frozenset(disallowed_special)
        if disallowed:
            pattern, prefix = _special_regex(disallowed), _common_prefix(disallowed)
            for text in [text_or_texts] if isinstance(text_or_texts, str) else text_or_texts:
                if prefix and prefix not in text:
                    continue
                if found := pattern.search(text):
                    raise _disallowed_error(found.group(), found.start())
        return allowed

    @staticmethod
    def _plain_policy(allowed_special: SpecialSet, disallowed_special: SpecialSet) -> bool:
        """Whether a text without the special tokens' common prefix encodes as ordinary text
        under these policies with nothing to work out: those that cannot raise (every special
        disallowed or none, the allowed ones "all" or a set). The encoder's calls look for the
        prefix in the bytes they read (`unless`), where Python's `in` was a pass of its own over
        the text: a quarter of `encode_to_numpy`'s time on English."""
        return (disallowed_special == "all" or disallowed_special == ()) and (
            allowed_special is _NONE_ALLOWED or type(allowed_special) in _SETS or allowed_special == "all"
        )

    def _parts(self, text: str, allowed: frozenset[str]) -> list[str | int]:
        """`text` cut around the allowed special tokens: ordinary strings and special ids."""
        parts: list[str | int] = []
        start = 0
        for m in _special_regex(allowed).finditer(text):
            parts.append(text[start : m.start()])
            parts.append(self.special_tokens[m.group()])
            start = m.end()
        parts.append(text[start:])
        return parts

    # ------------------------------------------------------------------ encoding (tiktoken's API)
    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text, treating special-token strings as plain text.

        The same as ``encode(text, disallowed_special=())``.
        """
        encode_list = self._encode_list
        if encode_list is not None:
            try:
                return encode_list(text)
            except UnicodeEncodeError:  # lone surrogates: replaced below, as tiktoken does
                pass
        return self._ordinary_array(ref.utf8(text)).tolist()

    def encode(
        self, text: str, *, allowed_special: SpecialSet = _NONE_ALLOWED, disallowed_special: SpecialSet = "all"
    ) -> list[int]:
        """Encode text into a list of ids.

        Special tokens are refused by default: text that contains one raises, because text
        from users must not inject control tokens. Pass ``allowed_special={"<|endoftext|>"}``
        (or ``"all"``) to encode them as special ids, or ``disallowed_special=()`` to encode
        them as ordinary text. ``disallowed_special`` may also name any other strings to
        refuse.

        Raises:
            ValueError: the text contains a disallowed special token.
        """
        # _plain_policy, written out: the method's call cost a sentence's `encode` 60 ns of 700
        if (
            type(text) is str
            and (disallowed_special == "all" or disallowed_special == ())
            and (allowed_special is _NONE_ALLOWED or type(allowed_special) in _SETS or allowed_special == "all")
        ):
            prefix = self._special_prefix
            encode_list = self._encode_list
            if encode_list is not None:
                try:
                    ids = encode_list(text, prefix)  # None: the text holds the prefix
                except UnicodeEncodeError:  # lone surrogates: encode_ordinary replaces them
                    ids = None if prefix is not None and prefix in text else self.encode_ordinary(text)
                if ids is not None:
                    return ids
            elif prefix is None or prefix not in text:
                return self.encode_ordinary(text)
        allowed = self._allowed(text, allowed_special, disallowed_special)
        if not allowed:
            return self.encode_ordinary(text)
        out: list[int] = []
        for part in self._parts(text, allowed):
            if isinstance(part, int):
                out.append(part)
            elif part:
                out += self.encode_ordinary(part)
        return out

    def encode_with_unstable(
        self, text: str, *, allowed_special: SpecialSet = frozenset(), disallowed_special: SpecialSet = "all"
    ) -> tuple[list[int], list[list[int]]]:
        """tiktoken's ``encode_with_unstable``: the stable tokens of `text` and every token
        sequence that may follow them when more text is appended (for completion).

        The last regex piece (widened over tokens made only of spaces, tabs and newlines,
        which a later split may regroup) is unstable; the completions are the tokens that
        start with its bytes, the re-encodings of its bytes joined to each token that starts
        with one of its suffixes (cut once they cover the unstable bytes), and, when it ends
        in whitespace, its bytes encoded with that last character apart. Completions are
        lists in no set order, as tiktoken's. Byte-level vocabularies only.

        Raises:
            ValueError: the text contains a disallowed special token (as `encode`).
        """
        if self.unit != "byte":
            raise InputError(f"encode_with_unstable is for byte-level vocabularies, not unit={self.unit!r}")
        allowed = self._allowed(text, allowed_special, disallowed_special)
        tokens = self.encode(text, allowed_special=allowed, disallowed_special=())
        last_text = self._parts(text, allowed)[-1] if allowed else text  # _parts ends with a str
        pieces = self._split(ref.utf8(str(last_text))) if last_text else []
        if not pieces:  # empty, or ending in a special token: nothing unstable
            return tokens, []
        n_last, size = 0, 0
        while size < len(pieces[-1]):
            n_last += 1
            size += len(self._token_bytes[tokens[-n_last]])

        def all_space(i: int) -> bool:
            return i not in self._special_ids and all(c in b" \n\t" for c in self._token_bytes[i])

        if all_space(tokens[-n_last]):
            while n_last < len(tokens) and all_space(tokens[-n_last - 1]):
                n_last += 1
        unstable = b"".join(self._token_bytes[i] for i in tokens[len(tokens) - n_last :])
        del tokens[len(tokens) - n_last :]
        completions: set[tuple[int, ...]] = {(self.mergeable_ranks[t],) for t in self._tokens_starting_with(unstable)}
        for cut in range(1, len(unstable)):
            prefix = unstable[:cut]
            for token in self._tokens_starting_with(unstable[cut:]):
                joined = prefix + token
                try:
                    encoded = self.encode_ordinary(joined.decode("utf-8"))
                except UnicodeDecodeError:
                    encoded = self._bpe_piece(joined)
                seq, covered = [], 0
                for i in encoded:
                    seq.append(i)
                    covered += len(self._token_bytes[i])
                    if covered >= len(unstable):
                        break
                completions.add(tuple(seq))
        if len(unstable) > 1:
            last_char = _last_utf8_char(unstable)
            if (
                last_char
                and len(unstable) > len(last_char)
                and regex.fullmatch(r"\p{White_Space}", last_char.decode("utf-8"))
            ):
                completions.add(tuple(self._bpe_piece(unstable[: -len(last_char)]) + self._bpe_piece(last_char)))
        return tokens, [list(c) for c in completions]

    @functools.cached_property
    def _sorted_token_bytes(self) -> list[bytes]:
        return sorted(self.mergeable_ranks)

    def _tokens_starting_with(self, prefix: bytes) -> list[bytes]:
        """The ordinary tokens that start with `prefix`, in byte order."""
        tokens = self._sorted_token_bytes
        out = []
        for k in range(bisect.bisect_left(tokens, prefix), len(tokens)):
            if not tokens[k].startswith(prefix):
                break
            out.append(tokens[k])
        return out

    def encode_to_numpy(
        self, text: str, *, allowed_special: SpecialSet = frozenset(), disallowed_special: SpecialSet = "all"
    ) -> np.ndarray:
        """`encode`, as a uint32 array (no list of Python ints is made)."""
        encode_array = self._encode_array
        if encode_array is not None and type(text) is str and self._plain_policy(allowed_special, disallowed_special):
            try:
                ids = encode_array(text, self._special_prefix)  # None: the text holds the prefix
            except UnicodeEncodeError:  # lone surrogates: replaced below, as tiktoken does
                ids = None
            if ids is not None:
                return ids
        allowed = self._allowed(text, allowed_special, disallowed_special)
        if not allowed:
            if encode_array is not None and type(text) is str:
                try:  # the core reads the str's UTF-8 in place
                    return encode_array(text)
                except UnicodeEncodeError:  # lone surrogates: replaced below, as tiktoken does
                    pass
            return self._ordinary_array(ref.utf8(text))
        arrays = [
            np.array([part], dtype=np.uint32) if isinstance(part, int) else self._ordinary_array(ref.utf8(part))
            for part in self._parts(text, allowed)
        ]
        return np.concatenate(arrays)

    def encode_batch(
        self,
        text: Sequence[str],
        *,
        num_threads: int = DEFAULT_THREADS,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
    ) -> list[list[int]]:
        """`encode` for many texts, on `num_threads` native threads; raises as `encode`."""
        if (
            self._encoder is not None
            and not self._split_in_python
            and self._plain_policy(allowed_special, disallowed_special)
        ):
            try:  # None: a text holds the special tokens' prefix
                lists = self._encoder.encode_ordinary_batch_lists(text, num_threads, self._special_prefix)
            except UnicodeEncodeError:  # lone surrogates: replaced below, as tiktoken does
                lists = None
            if lists is not None:
                return lists
        allowed = self._allowed(text, allowed_special, disallowed_special)
        if not allowed:
            return self.encode_ordinary_batch(text, num_threads=num_threads)
        parts = [self._parts(t, allowed) for t in text]
        segments = [ref.utf8(p) for ps in parts for p in ps if isinstance(p, str)]
        flat, offsets = self._ordinary_batch(segments, num_threads)
        ids, ends = flat.tolist(), offsets.tolist()
        out: list[list[int]] = []
        k = 0
        for ps in parts:
            doc: list[int] = []
            for p in ps:
                if isinstance(p, int):
                    doc.append(p)
                else:
                    doc += ids[ends[k] : ends[k + 1]]
                    k += 1
            out.append(doc)
        return out

    def encode_ordinary_batch(self, text: Sequence[str], *, num_threads: int = DEFAULT_THREADS) -> list[list[int]]:
        """`encode_ordinary` for many texts, on `num_threads` native threads."""
        if self._encoder is not None and not self._split_in_python:
            try:
                return self._encoder.encode_ordinary_batch_lists(text, num_threads)
            except UnicodeEncodeError:  # lone surrogates: replaced below, as tiktoken does
                pass
        flat, offsets = self._ordinary_batch([ref.utf8(t) for t in text], num_threads)
        ids, ends = flat.tolist(), offsets.tolist()
        return [ids[a:b] for a, b in zip(ends, ends[1:])]

    def encode_ordinary_batch_to_numpy(
        self, docs: Sequence[bytes | str], num_threads: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents into one flat uint32 id array plus cumulative end offsets (uint64, len+1).

        The encoding stage's path: `num_threads` native threads (0 = all cores), no
        special tokens, no Python ints. Documents may be bytes; bytes that are not valid
        UTF-8 split as characters of their own (as counting and training split them), so
        on such bytes the ids can differ from `encode_bytes`, which follows tiktoken.
        """
        if self._encoder is not None and not self._split_in_python:
            try:  # str documents go to the core as they are (ASCII read in place, no serial pass)
                return self._encoder.encode_ordinary_texts(docs, num_threads)
            except UnicodeEncodeError:  # lone surrogates: replaced below, as tiktoken does
                pass
        return self._ordinary_batch([ref.utf8(d) if isinstance(d, str) else d for d in docs], num_threads)

    def encode_ordinary_buffer_to_numpy(
        self, data: bytes | bytearray | memoryview, offsets: np.ndarray, num_threads: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """`encode_ordinary_batch_to_numpy` of documents given as one buffer and their offsets
        (document k is ``data[offsets[k]:offsets[k + 1]]``, e.g. an Arrow string column's
        buffers): no bytes object per document on the native path.

        Raises:
            ValueError: offsets that are not non-decreasing indices into `data`.
        """
        if self._encoder is not None and not self._split_in_python:
            return self._encoder.encode_ordinary_buffer(data, offsets, num_threads)
        view, bounds = memoryview(data).cast("B"), np.asarray(offsets, dtype=np.int64).tolist()
        if not bounds or bounds[0] < 0 or bounds[-1] > len(view) or any(a > b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"offsets must be len(documents) + 1 non-decreasing indices into data ({len(view)} bytes)")
        return self._ordinary_batch([bytes(view[a:b]) for a, b in zip(bounds, bounds[1:])], num_threads)

    def streams_files(self) -> bool:
        """Whether `encode_file` can cut a file into blocks (a built-in split pattern
        encoded by the core); otherwise it encodes the file as one text."""
        return self._encoder is not None and not self._split_in_python and self.pattern in PATTERNS

    def encode_file_to_npy(self, path: str, out_path: str, **options: Any) -> int:
        """`encode_file`'s number of ids (the options are its own)."""
        return self.encode_file(path, out_path, **options).ids

    def encode_file(
        self,
        path: str,
        out_path: str,
        *,
        allowed_special: SpecialSet = frozenset(),
        num_threads: int = 0,
        round_bytes: int = 16 << 20,
    ) -> EncodedFile:
        """Encode the text file `path` into the uint32 .npy `out_path`; returns the number of ids
        written and of the bytes and characters read (a byte that is not UTF-8 counts as one).

        The ids equal ``encode_to_numpy(text, allowed_special=..., disallowed_special=())`` of
        the file read with ``errors="surrogateescape"`` (bytes that are not UTF-8 become U+FFFD).
        Special tokens that are not allowed are encoded as text: refuse them before calling.
        Where `streams_files`, the file is read `round_bytes` at a time, cut at safe points
        (`safe_cuts`), the blocks encoded on `num_threads` threads (0 = all cores) and their
        ids appended to the file as they come, a page at a time and past the page cache where
        the file system allows (`_IdPages`), so memory stays flat with the file's size (a
        stretch with no safe point, e.g. one long line, is held whole). The .npy header's
        length is written last, and the file takes `out_path`'s name only once whole (a failure
        leaves what was there).
        """
        from concurrent.futures import Future, ThreadPoolExecutor  # for this call alone, as fsspec

        from pipeline_lib.fsio import atomic_user_file

        allowed = self._special_names if allowed_special == "all" else frozenset(allowed_special) & self._special_names
        if not self.streams_files() or any("\n" in t for t in allowed):
            with open(path, "rb") as f:
                raw = f.read()
            _, n_chars = _utf8_chars(raw)
            text = str(raw, "utf-8", "surrogateescape")
            n_bytes = len(raw)
            del raw
            ids = self.encode_to_numpy(text, allowed_special=allowed, disallowed_special=())
            with atomic_user_file(out_path) as out:
                out.write(npy_header("<u4", len(ids)))
                ids.astype("<u4", copy=False).tofile(out)
            return EncodedFile(len(ids), n_bytes, n_chars)
        cut_pattern = _SAFE_CUTS[self.pattern]
        threads = num_threads if num_threads > 0 else (os.cpu_count() or 1)
        n_ids = n_bytes = n_chars = 0
        # Three stages overlap: the next block is read, cut and checked for UTF-8 (its characters
        # counted), and the last block's ids are written to the disk on two helper threads while
        # the core encodes the current block; the reads, the check, the writes and the core
        # release the GIL. At most three blocks are held.
        with (
            open(path, "rb") as f,
            atomic_user_file(out_path) as out,
            ThreadPoolExecutor(1, thread_name_prefix="tokenmill-read") as reader,
            ThreadPoolExecutor(1, thread_name_prefix="tokenmill-write") as writer,
        ):
            id_file = _IdPages(out.fileno())
            blocks = _safe_blocks(f, round_bytes, cut_pattern)
            next_block = reader.submit(_next_checked_block, blocks)
            written: Future[None] | None = None
            # The ids of a block go to one of two buffers taken in turn, as the blocks' bytes do:
            # a block's ids are written to the file while the next block's are made.
            id_buffers: list[mmap.mmap | None] = [None, None]
            turn = 0
            while (block := next_block.result()) is not None:
                next_block = reader.submit(_next_checked_block, blocks)
                data, is_utf8, chars = block
                id_buffers[turn] = buffer = _id_buffer(id_buffers[turn], len(data))
                ids = self._encode_block(data, is_utf8, threads, allowed, id_file.place(buffer))
                pages, at = id_file.pages(buffer, ids)
                turn ^= 1
                if written is not None:
                    written.result()
                written = writer.submit(id_file.write, pages, at)
                n_ids, n_bytes, n_chars = n_ids + len(ids), n_bytes + len(data), n_chars + chars
            if written is not None:
                written.result()
            id_file.finish(n_ids)
        return EncodedFile(n_ids, n_bytes, n_chars)

    def _encode_block(
        self,
        data: bytes | memoryview,
        is_utf8: bool,
        threads: int,
        allowed: frozenset[str],
        place: memoryview | None = None,
    ) -> Any:
        """The ids of `data` (whole lines, cut at a safe point): the core's memoryview of uint32,
        of `place` where it has room for them (an array where special tokens are allowed)."""
        text = None
        if not is_utf8:  # as the whole-text path: each invalid byte becomes U+FFFD
            text = str(data, "utf-8", "surrogateescape")
            data = ref.utf8(text)
        if allowed:
            ids = self.encode_to_numpy(
                str(data, "utf-8") if text is None else text, allowed_special=allowed, disallowed_special=()
            )
        else:
            del text
            # One document: the core cuts it at the same safe points into pieces of a chunk
            # (<= 256 KiB) that its threads take as each finishes its last. Cut here into 1 MB
            # pieces with a regex, a stretch of 10 MB with no safe point took `re` 0.27 s to scan.
            assert self._encoder is not None  # streams_files()
            ids = self._encoder.encode_ordinary_buffer_ids(data, [0, len(data)], threads, place)
        return ids

    def encode_bytes(self, data: bytes) -> list[int]:
        """Encode any bytes, valid UTF-8 or not, losslessly: tiktoken's ``_encode_bytes`` ids.

        Valid UTF-8 encodes as `encode_ordinary`. Otherwise (as tiktoken does) the valid
        prefix is encoded, its last piece (widened over trailing whitespace tokens) is
        joined to everything from the first invalid byte on, and that tail is one BPE
        piece, with no regex split.
        """
        data = bytes(data)
        if self.unit != "byte":  # invalid bytes: byte fallback, or <unk>
            return self._ordinary_array(data).tolist()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            return self._encode_invalid_utf8(data, e.start)
        return self._ordinary_array(data).tolist()

    _encode_bytes = encode_bytes  # tiktoken's (private) name

    def _encode_invalid_utf8(self, data: bytes, valid: int) -> list[int]:
        prefix = data[:valid]
        tokens = self._ordinary_array(prefix).tolist()
        n_last = 0  # tokens of the prefix's last regex piece
        if tokens:
            size, last = 0, len(self._split(prefix)[-1])
            while size < last:
                n_last += 1
                size += len(self._token_bytes[tokens[-n_last]])

            def all_space(i: int) -> bool:
                return all(c in b" \n\t" for c in self._token_bytes[i])

            if all_space(tokens[-n_last]):
                while n_last < len(tokens) and all_space(tokens[-n_last - 1]):
                    n_last += 1
        tail = b"".join(self._token_bytes[i] for i in tokens[len(tokens) - n_last :]) + data[valid:]
        del tokens[len(tokens) - n_last :]
        rank = self.mergeable_ranks.get(tail)
        tokens += [rank] if rank is not None else self._bpe_piece(tail)
        return tokens

    def encode_single_token(self, text_or_bytes: str | bytes) -> int:
        """The id of text or bytes that is exactly one token, special tokens included.

        Raises:
            UnknownTokenError (a KeyError): not a single token of this vocabulary.
        """
        data = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else bytes(text_or_bytes)
        rank = self.mergeable_ranks.get(data)
        if rank is not None:
            return rank
        try:
            return self.special_tokens[data.decode("utf-8")]
        except (UnicodeDecodeError, KeyError):
            raise UnknownTokenError(f"{text_or_bytes!r} is not a single token of this vocabulary") from None

    def _encode_single_piece(self, text_or_bytes: str | bytes) -> list[int]:
        """BPE of text or bytes as one piece: no regex split, no special tokens (tiktoken's private helper)."""
        data = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else bytes(text_or_bytes)
        return self._bpe_piece(data)

    # ------------------------------------------------------------------ decoding
    def decode_bytes(self, tokens: Iterable[int] | np.ndarray) -> bytes:
        """The exact bytes of a sequence of ids (special tokens as their UTF-8 text).

        Raises:
            TypeError: an id that is not an integer (a float, a string, a bool).
            UnknownTokenError (a KeyError and a ValueError): an id not in the vocabulary.
        """
        try:
            return b"".join(map(self._token_bytes.__getitem__, _id_list(tokens)))
        except KeyError as e:
            raise UnknownTokenError(
                f"token id {e.args[0]} is not in this vocabulary (size {self.vocab_size})"
            ) from None

    def decode(self, tokens: Iterable[int] | np.ndarray, errors: str = "replace") -> str:
        """Decode ids to text; invalid UTF-8 follows `errors` (default: U+FFFD). Raises as `decode_bytes`."""
        return self.decode_bytes(tokens).decode("utf-8", errors)

    def decode_single_token_bytes(self, token: int) -> bytes:
        """The bytes of one id, special tokens included. Raises as `decode_bytes`."""
        try:
            return self._token_bytes[_one_id(token)]
        except KeyError:
            raise UnknownTokenError(f"token id {token} is not in this vocabulary (size {self.vocab_size})") from None

    def decode_tokens_bytes(self, tokens: Iterable[int] | np.ndarray) -> list[bytes]:
        """The bytes of each id, one item per id."""
        return [self.decode_single_token_bytes(t) for t in _id_list(tokens)]

    def decode_with_offsets(self, tokens: Iterable[int] | np.ndarray) -> tuple[str, list[int]]:
        """The text and, per token, the index of the first character holding its bytes.

        A token that starts inside a character (its first byte a UTF-8 continuation byte)
        gets that character's index. Raises UnicodeDecodeError when the tokens do not
        decode to valid UTF-8, as tiktoken does.
        """
        token_bytes = self.decode_tokens_bytes(tokens)
        offsets, n_chars = [], 0
        for b in token_bytes:
            offsets.append(max(0, n_chars - (0x80 <= b[0] < 0xC0)))
            n_chars += sum(1 for c in b if not 0x80 <= c < 0xC0)
        return b"".join(token_bytes).decode("utf-8", "strict"), offsets

    def decode_batch(
        self, batch: Sequence[Sequence[int]], *, errors: str = "replace", num_threads: int = DEFAULT_THREADS
    ) -> list[str]:
        """`decode` of each id sequence. `num_threads` is taken for tiktoken's signature;
        decoding is a dictionary lookup per id and runs on the calling thread."""
        return [self.decode(ids, errors) for ids in batch]

    def decode_bytes_batch(self, batch: Sequence[Sequence[int]], *, num_threads: int = DEFAULT_THREADS) -> list[bytes]:
        """`decode_bytes` of each id sequence (on the calling thread, as `decode_batch`)."""
        return [self.decode_bytes(ids) for ids in batch]

    # ------------------------------------------------------------------ the vocabulary
    def token_byte_values(self) -> list[bytes]:
        """The bytes of every ordinary token, sorted (tiktoken's order)."""
        return sorted(self.mergeable_ranks)

    @property
    def eot_token(self) -> int:
        """The id of ``<|endoftext|>`` (KeyError if this vocabulary has none)."""
        return self.special_tokens[ENDOFTEXT]

    @functools.cached_property
    def special_tokens_set(self) -> set[str]:
        return set(self.special_tokens)

    def is_special_token(self, token: int) -> bool:
        return _one_id(token) in self._special_ids

    @property
    def n_vocab(self) -> int:
        """The largest id + 1 (what tiktoken calls n_vocab; also `vocab_size`)."""
        return self.vocab_size

    def token_bytes(self, i: int) -> bytes:
        return self._token_bytes[i]

    def token_str(self, i: int) -> str:
        """Id `i` as a person reads it: its text (invalid UTF-8 as U+FFFD), ``</w>`` shown as such
        in word-level vocabularies, special tokens by name."""
        raw = (
            self._raw_bytes.get(i)
            if self._raw_bytes is not None
            else (None if i in self._special_ids else self._token_bytes.get(i))
        )
        if raw is None:
            return self.decode_single_token_bytes(i).decode("utf-8", "replace")  # a special token, or UnknownTokenError
        if self.unit == "word":
            raw = raw.replace(ref.END_OF_WORD, ref.END_OF_WORD_TEXT.encode())
        return raw.decode("utf-8", "replace")

    def token_byte_lengths(self) -> np.ndarray:
        """Byte length of every id (0 for unused ids and special tokens): for bits per byte."""
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i in self.mergeable_ranks.values():
            lengths[i] = len(self._token_bytes[i])
        return lengths

    def __repr__(self) -> str:
        names = sorted(self.special_tokens, key=self.special_tokens.__getitem__)
        special = names if len(names) <= 8 else [*names[:4], f"... {len(names)} in all"]
        unit = f", unit={self.unit!r}" if self.unit != "byte" else ""
        return (
            f"Tokenizer(name={self.name!r}{unit}, pattern={self.pattern!r}, vocab_size={self.vocab_size}, "
            f"special={special})"
        )


# Safe cuts for the built-in split patterns: after a "\n" that a printable ASCII character
# other than space follows. No piece holds a newline and the non-space character after it (but
# o200k's punctuation pieces, " ?[^\s\p{L}\p{N}]+[\r\n/]*", which take the newlines and
# slashes after them: "}\n//" is one piece, so not before a "/"); a run of whitespace that ends
# with a newline is one piece ("\s*[\r\n]", "\s*[\r\n]+"), whether or not the text goes on
# ("\s++$" at its end). GPT-2's pattern ends such a run at its last newline only if the text
# goes on ("\s+(?!\S)" gives "\n", "\n" before a letter, "\n\n" at the end): there a printable
# character must precede the newline as well. So the text encodes as its two sides do
# (tests/test_encode_file.py checks it on any text; the core's `safe_cut` cuts the same).
_SAFE_CUTS = {
    "gpt2": re.compile(rb"[\x21-\x7e]\n(?=[\x21-\x7e])"),
    "cl100k": re.compile(rb"\n(?=[\x21-\x7e])"),
    "o200k": re.compile(rb"\n(?=[\x21-\x2e\x30-\x7e])"),
}


def safe_cuts(data: bytes, pattern: str) -> list[int]:
    """Every offset at which `data` may be cut and its halves encoded apart with `pattern`."""
    return [m.end() for m in _SAFE_CUTS[pattern].finditer(data)]


def _safe_blocks(f: io.BufferedIOBase, round_bytes: int, cut: re.Pattern) -> Iterator[memoryview]:
    """The file `f` in blocks of about `round_bytes` or more, each ending at a safe cut (a
    stretch with no safe point, e.g. one long line, grows its block until one comes).

    The blocks are views of two buffers taken in turn and filled with `readinto`: a block stays
    as it is while the next one is read, and the one after overwrites it (the caller encodes a
    block while the next is read). A new bytes object per read, then its join with the tail
    carried over and its cut, put three fresh copies of every block in memory: their page faults
    were a quarter of the command's CPU time. Each buffer holds a block and the tail carried
    into it, and is an anonymous mapping, whose pages are the kernel's zero pages until first
    read into: a `bytearray` of that size wrote every byte first, and one sized for the block
    alone was made again for its first tail (a third of the page faults of 139 MB, 96 MB set to
    zero)."""
    buffers: list[mmap.mmap | None] = [None, None]  # the second made for the second block
    turn, carry = 0, b""
    while True:
        buf = buffers[turn] = buffers[turn] or _fresh_buffer(2 * round_bytes)
        filled = 0
        while True:
            need = filled + len(carry) + round_bytes
            if len(buf) < need:  # a new buffer, never a resize: the other block may be in use
                grown = _fresh_buffer(max(need, 2 * len(buf)))
                grown[:filled] = buf[:filled]
                buf = buffers[turn] = grown
            buf[filled : filled + len(carry)] = carry
            filled, carry = filled + len(carry), b""
            with memoryview(buf) as free:
                got = f.readinto(free[filled : filled + round_bytes])
            if not got:  # the end of the file: the rest is the last block
                if filled:
                    yield memoryview(buf)[:filled]
                return
            # the bytes before hold no cut (but the last newline, which had no byte after it)
            end = _last_safe_cut(buf, cut, filled + got, after=filled - 1)
            filled += got
            if end > 0:
                break
        carry = buf[end:filled]
        yield memoryview(buf)[:end]
        turn ^= 1


def _id_buffer(buffer: mmap.mmap | None, n_bytes: int) -> mmap.mmap | None:
    """`buffer`, or a new one where it cannot hold the ids of `n_bytes` bytes (one at most a
    byte), with room for twice as many (the blocks' lengths vary: a buffer made again for a
    longer block was its pages faulted in again); None past 1 GiB (a block that long, a line
    with no safe point, has its ids in a buffer of their size)."""
    need = 4 * n_bytes + _PAGE  # and the bytes of the ids' first page written before
    if buffer is not None and len(buffer) >= need:
        return buffer
    if need > _MAX_ID_BUFFER:
        return None
    return _fresh_buffer(min(max(2 * need, 2 * len(buffer or b"")), _MAX_ID_BUFFER))


_MAX_ID_BUFFER = 1 << 30


def _fresh_buffer(size: int) -> mmap.mmap:
    """`size` writable bytes, zero, whose pages are given on first use."""
    return mmap.mmap(-1, max(size, 1))


def _next_checked_block(blocks: Iterator[memoryview]) -> tuple[memoryview, bool, int] | None:
    """The next block, whether it is valid UTF-8 and its characters (`_utf8_chars`), or None
    at the end."""
    block = next(blocks, None)
    return None if block is None else (block, *_utf8_chars(block))


_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))


def _utf8_chars(data: bytes | bytearray | memoryview) -> tuple[bool, int]:
    """Whether `data` is valid UTF-8, and its characters: the bytes that do not continue one
    (10xxxxxx), so that a byte that is not UTF-8 counts as one."""
    if native._CORE is not None and (n := native._CORE.utf8_chars(data)) >= 0:
        return True, n
    valid = native._CORE is None and _is_utf8(data)
    return valid, len(bytes(data).translate(None, _CONTINUATION_BYTES))


def _little_endian_u4(ids: Any) -> memoryview:
    """A block's ids (the core's memoryview of uint32, or an array) as the .npy's '<u4' bytes."""
    if isinstance(ids, memoryview) and sys.byteorder == "little":
        return ids
    return np.asarray(ids, dtype=np.uint32).astype("<u4", copy=False).data


# O_DIRECT's alignment of a write's offset, length and buffer, on the file systems that take it.
_PAGE = 4096


class _IdPages:
    """The .npy the file command writes, a page at a time. A block's ids are placed in their
    buffer at the offset they will have in their page of the file, after the bytes of that page
    not written yet (the header's, at first), so that the buffer's whole pages go to the file as
    they are, from the writer thread, and the rest is carried to the next block. The file takes
    them with O_DIRECT where its file system does: through the page cache, the kernel's copy of
    940 MB of ids was 7.5% of the command's CPU time on two cores. Otherwise each block is
    written through the page cache and flushed to the disk, so that the file's fsync, once it is
    whole, has only its last block left to wait for (it waited ~0.15 s for 134 MB of ids)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.direct = _set_direct(fd, True)
        self._written = 0  # the file's whole pages written, in bytes
        self._tail = npy_header("<u4", 0)  # the bytes after them

    def place(self, buffer: mmap.mmap | None) -> memoryview | None:
        """Where in `buffer` the next block's ids are to go (the pages' bytes are little-endian)."""
        if buffer is None or sys.byteorder != "little":
            return None
        buffer[: len(self._tail)] = self._tail
        return memoryview(buffer)[len(self._tail) :]

    def pages(self, buffer: mmap.mmap | None, ids: Any) -> tuple[memoryview, int]:
        """The whole pages that the block's ids (placed in `buffer` or not) complete, and their
        offset in the file; the bytes after them are kept for the next block's."""
        start, placed = len(self._tail), getattr(ids, "obj", None) is buffer
        if buffer is not None and placed:
            held = buffer
        else:  # not placed: copied
            data = _little_endian_u4(ids).cast("B")
            held = _fresh_buffer(start + len(data))
            held[:start] = self._tail
            held[start : start + len(data)] = data
        end = start + 4 * len(ids)
        whole = end - end % _PAGE
        self._tail = held[whole:end]
        at, self._written = self._written, self._written + whole
        return memoryview(held)[:whole], at

    def write(self, pages: memoryview, at: int) -> None:
        """Writes `pages` at `at` (on the writer thread)."""
        if not pages:
            return
        try:
            _pwrite_all(self._fd, pages, at)
        except OSError as e:
            if not (self.direct and e.errno == errno.EINVAL):
                raise
            self.direct = _set_direct(self._fd, False)  # the file system took the flag, not the write
            _pwrite_all(self._fd, pages, at)
        if not self.direct:
            _fdatasync(self._fd)

    def finish(self, n_ids: int) -> None:
        """Writes the last bytes, then the header with the number of ids."""
        self.direct = self.direct and _set_direct(self._fd, False)
        _pwrite_all(self._fd, memoryview(self._tail), self._written)
        _pwrite_all(self._fd, memoryview(npy_header("<u4", n_ids)), 0)


def _set_direct(fd: int, on: bool) -> bool:
    """Turns O_DIRECT on or off for `fd`; whether it is now on (never where the system or the
    file system has none)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    import fcntl  # Unix; where there is an O_DIRECT

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag if on else flags & ~flag)
    except OSError:
        return False
    return on


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    if not hasattr(os, "pwrite"):  # Windows: one writer at a time, so a seek then writes
        os.lseek(fd, at, os.SEEK_SET)
        while data:
            data = data[os.write(fd, data) :]
        return
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


def _last_safe_cut(data: bytes | bytearray | mmap.mmap, cut: re.Pattern, limit: int, after: int) -> int:
    """The last safe cut in `data[:limit]` with its newline at `after` or later, or -1; scans
    back from the end a line at a time."""
    end = limit
    while True:
        nl = data.rfind(b"\n", max(0, after), end)
        if nl < 0:
            return -1
        for start in (nl, nl - 1):  # "\nx", or "x\ny" (GPT-2's pattern)
            if start >= 0 and (m := cut.match(data, start, min(nl + 2, limit))) is not None and m.end() == nl + 1:
                return nl + 1
        end = nl


def _is_utf8(data: bytes | bytearray | memoryview, window: int = 1 << 20) -> bool:
    """Whether `data` (any bytes-like object) is valid UTF-8: the core's check where it is built,
    else decoded a line-ended window at a time (a block's str can take 4 bytes per character,
    its windows' only a few MB)."""
    if native._CORE is not None:
        return bool(native._CORE.utf8_chars(data) >= 0)
    data = bytes(data)
    if data.isascii():
        return True
    view, start = memoryview(data), 0
    while start < len(data):
        end = data.find(b"\n", start + window)
        end = len(data) if end < 0 else end + 1
        try:
            str(view[start:end], "utf-8")
        except UnicodeDecodeError:
            return False
        start = end
    return True


def _last_utf8_char(data: bytes) -> bytes | None:
    """The bytes of the character `data` ends with, or None if it ends in invalid UTF-8."""
    for n in range(1, min(4, len(data)) + 1):
        try:
            data[-n:].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return data[-n:]
    return None


def _pattern_name(pat_str: str) -> str:
    for name, s in PATTERNS.items():
        if s == pat_str:
            return name
    raise InputError(
        f"pat_str {pat_str[:60]!r}... is not one of the split patterns the core implements"
        f" ({', '.join(sorted(PATTERNS))}: tiktoken's r50k/p50k, cl100k and o200k patterns)"
    )
