"""Counting pieces (on threads) and learning merges: what `Tokenizer.train` runs.

Native when the compiled core is built (`native._CORE`), else the pure-Python reference;
both give the same counts and the same merges. The compiled core splits the named patterns
and ``none`` itself; a custom regex, and the word unit's words, are split in Python and
counted there.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from pipeline_lib import bpe_reference as ref
from pipeline_lib import cancel
from pipeline_lib.errors import InputError
from pipeline_lib.lazy import LazyModule
from pipeline_lib.patterns import NO_SPLIT, check_pattern, is_custom
from pipeline_lib.tokenizer import native as compiled
from pipeline_lib.tokenizer.limits import ENDOFTEXT, MAX_TOKEN_BYTES, MAX_VOCAB_SIZE, UNK, check_unit

if TYPE_CHECKING:
    import numpy as np

    from pipeline_lib.tokenizer.core import Tokenizer
else:
    np = LazyModule(globals(), "np", "numpy")  # for training and counting: loading a tokenizer needs none


def native_pattern_id(pattern: str) -> int | None:
    """The compiled core's id of a named pattern or ``none``; None for a custom regex."""
    native = compiled._CORE
    if native is None or is_custom(pattern):
        return None
    return native.NO_SPLIT if pattern == NO_SPLIT else native.PATTERN_IDS[pattern]


class PieceTable(NamedTuple):
    """A piece -> count table as two columns, pieces sorted (what `counting.read_counts` and
    `PieceCounts.to_arrays` give): trains without a dict of the table."""

    pieces: list[bytes]
    counts: np.ndarray


class PieceCounts:
    """A piece -> count table, filled from documents; native when the core is built and
    splits the pattern (a custom regex is split in Python)."""

    def __init__(self, pattern: str = "cl100k"):
        self.pattern = check_pattern(pattern)
        pattern_id = native_pattern_id(pattern)
        self._native = (
            compiled._CORE.PieceCounter(pattern_id) if compiled._CORE is not None and pattern_id is not None else None
        )
        self._counts: dict[bytes, int] = {}
        self._total = 0

    @property
    def native(self) -> bool:
        return self._native is not None

    def add_documents(self, docs: Sequence[bytes]) -> None:
        if self._native is not None:
            self._native.add_batch(list(docs))
        else:
            counts = ref.count_pieces(docs, self.pattern)
            for piece, n in counts.items():
                self._counts[piece] = self._counts.get(piece, 0) + n
                self._total += n

    def add_buffer(self, data: Any, offsets: np.ndarray) -> None:
        """`add_documents` for documents packed in one buffer: document k is
        ``data[offsets[k]:offsets[k + 1]]`` (no object per document on the native path)."""
        if self._native is not None:
            self._native.add_buffer(data, offsets)
        else:
            view = memoryview(data).cast("B")
            self.add_documents([bytes(view[offsets[k] : offsets[k + 1]]) for k in range(len(offsets) - 1)])

    def add_counts(self, pieces: Sequence[bytes], counts: np.ndarray) -> None:
        if self._native is not None:
            self._native.add_counts(list(pieces), np.asarray(counts, dtype=np.int64))
        else:
            for piece, n in zip(pieces, np.asarray(counts).tolist()):
                self._counts[piece] = self._counts.get(piece, 0) + n
                self._total += n

    def to_arrays(self) -> tuple[list[bytes], np.ndarray]:
        """Pieces sorted by their bytes, and their counts: deterministic whatever the order of adds."""
        if self._native is not None:
            return self._native.to_arrays()
        pieces = sorted(self._counts)
        return pieces, np.array([self._counts[p] for p in pieces], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._native) if self._native is not None else len(self._counts)

    @property
    def total(self) -> int:
        """Sum of all counts (occurrences counted)."""
        return self._native.total if self._native is not None else self._total


def count_documents(docs: Iterable[bytes], pattern: str, workers: int = 0, batch_bytes: int = 4 << 20) -> PieceCounts:
    """Count pieces over byte documents on `workers` threads (the native counter releases the
    GIL; a custom regex is split and counted on the calling thread).

    Each thread fills its own counter from batches of about `batch_bytes`; the counters are
    summed at the end, so the result does not depend on the number of threads.
    """
    workers = workers or os.cpu_count() or 1
    if workers == 1 or native_pattern_id(pattern) is None:
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


def symbol_arrays(pieces: Sequence[bytes], unit: str) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """``(alphabet, symbols, offsets)`` of char or word pieces, as `bpe_reference.alphabet_of`
    and `initial_symbols` define them: the alphabet sorted by bytes, piece k's symbol ids
    ``symbols[offsets[k]:offsets[k + 1]]`` (word pieces end with ``</w>``)."""
    texts = [p.decode("utf-8", "surrogateescape") for p in pieces]
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    # One code point per character (invalid bytes are U+DC80..U+DCFF after surrogateescape).
    points = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    # The characters present, in code point order, and each one's index among them: linear
    # (np.unique would sort all the points).
    present = np.zeros(0x110000, dtype=bool)
    present[points] = True
    unique = np.flatnonzero(present)
    inverse = (np.cumsum(present, dtype=np.int32) - 1)[points]
    alphabet = [chr(c).encode("utf-8", "surrogateescape") for c in unique.tolist()]
    if unit == "word":
        alphabet.append(ref.END_OF_WORD)
    order = sorted(range(len(alphabet)), key=alphabet.__getitem__)
    rank = np.empty(len(alphabet), dtype=np.int32)
    rank[order] = np.arange(len(alphabet), dtype=np.int32)
    symbols = rank[inverse] if len(inverse) else np.zeros(0, dtype=np.int32)
    if unit == "word":
        ends = np.cumsum(lengths)
        symbols = np.insert(symbols, ends, rank[len(alphabet) - 1])
        lengths = lengths + 1
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return [alphabet[i] for i in order], symbols.astype(np.int32, copy=False), offsets


def learn_merges(
    pieces: list[bytes],
    counts: np.ndarray,
    n_merges: int,
    min_frequency: int = 1,
    progress=None,
    max_token_bytes: int | None = None,
    symbols: tuple[list[bytes], np.ndarray, np.ndarray] | None = None,
    ties: str = "bytes",
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """``(merges, merge_counts)`` from byte pieces, or from `symbols` (`symbol_arrays` of
    char or word pieces): native when the core is built, else `bpe_reference.learn_symbol_merges`.
    `ties` as there; with ``first-seen`` the pieces' order is the text's."""
    native = compiled._CORE
    counts = np.asarray(counts, dtype=np.int64)
    if symbols is None:
        if native is not None:
            rows, merge_counts = native.learn_merges(
                pieces, counts, n_merges, min_frequency, progress, max_token_bytes, with_counts=True, ties=ties
            )
            return [tuple(r) for r in rows.tolist()], merge_counts.tolist()
        table = {tuple(p): c for p, c in zip(pieces, counts.tolist())}
        return ref.learn_symbol_merges(ref.BYTES, table, n_merges, min_frequency, progress, max_token_bytes, ties)
    alphabet, flat, offsets = symbols
    if not alphabet:
        return [], []  # no text, no alphabet
    if native is not None:
        rows, merge_counts = native.learn_symbol_merges(
            alphabet, flat, offsets, counts, n_merges, min_frequency, progress, max_token_bytes, ties=ties
        )
        return [tuple(r) for r in rows.tolist()], merge_counts.tolist()
    ends = offsets.tolist()
    table = {tuple(flat[a:b].tolist()): c for a, b, c in zip(ends, ends[1:], counts.tolist())}
    return ref.learn_symbol_merges(alphabet, table, n_merges, min_frequency, progress, max_token_bytes, ties)


class TrainingPlan(NamedTuple):
    """What training is about to do, as the tutorials print it before merging."""

    alphabet: int
    special: int
    merges: int
    vocab_size: int

    def line(self) -> str:
        return (
            f"initial alphabet {self.alphabet}, special {self.special}, merges to learn {self.merges}, target "
            f"{self.vocab_size}"
        )


def train_tokenizer(
    cls: type[Tokenizer],
    counts_or_texts: PieceTable | Mapping[bytes, int] | Iterable[str | bytes],
    vocab_size: int,
    pattern: str | None = None,
    special_tokens: Sequence[str] | Mapping[str, int] = (ENDOFTEXT,),
    min_frequency: int = 1,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 0,
    max_token_bytes: int = MAX_TOKEN_BYTES,
    unit: str = "byte",
    unknown: str = "unk",
    lowercase: bool = False,
    ties: str = "bytes",
    n_merges: int | None = None,
    on_plan: Callable[[TrainingPlan], None] | None = None,
) -> Tokenizer:
    """Learn a vocabulary of `vocab_size` ids: the unit's alphabet + merges + special tokens.

    `unit` is ``byte`` (256 bytes), ``char`` (the corpus's characters) or ``word`` (the
    corpus's characters and ``</w>``, over words; lossy), see `pipeline_lib.bpe_reference`.
    `pattern` is a name, ``none`` or a regex (`pipeline_lib.patterns`); None: ``cl100k``, or
    ``none`` (words at whitespace) for the word unit. For ``char`` and ``word``, `unknown`
    says what a character unseen at training becomes: ``unk`` (the special token ``<unk>``,
    added after `special_tokens` and counted in `vocab_size`) or ``bytes`` (byte fallback: the
    single bytes that are not characters of the corpus get ids after the merges, so any text
    encodes). `lowercase` (word unit only) lowercases the words.

    `ties` says which of equally frequent pairs merges first: ``bytes`` (the smallest (left,
    right) bytes) or ``first-seen`` (the pair met first in the text, the tutorials' rule; it
    needs the text's order: documents, or a mapping in the order its pieces were met, not a
    `PieceTable`). `n_merges`, when given, is the number of merges to learn and `vocab_size`
    is then what follows from it (alphabet + merges + special tokens). `on_plan` is called
    with the `TrainingPlan` before merging.

    `counts_or_texts` is a piece -> count table, or a `PieceTable` (what the counting stage
    writes; the word unit takes its words from the pieces, `bpe_reference.word_counts`) or
    documents to count here, on `workers` threads (0 = all cores). When the corpus cannot give
    that many merges, training stops early with a warning and the vocabulary is smaller. A pair
    whose merged token would be longer than `max_token_bytes` is never merged (the default, 1
    MiB, only matters for pathological pieces such as a megabyte of one repeated character).

    Raises:
        InputError: an unknown unit, pattern or unknown policy; `vocab_size` too small for
            the alphabet and the special tokens, or too large; `max_token_bytes` outside
            [2, MAX_TOKEN_BYTES].
    """
    unit, pattern, unknown_policy = _checked_options(unit, pattern, unknown, lowercase, ties, n_merges)
    first_seen = ties == "first-seen"
    specials = _special_tokens(special_tokens, unknown_policy)
    vocab_size = _checked_sizes(unit, vocab_size, n_merges, len(specials), max_token_bytes)
    pieces, counts = _training_pieces(counts_or_texts, unit, pattern, lowercase, first_seen, workers)
    symbols = symbol_arrays(pieces, unit) if unit != "byte" else None
    alphabet = symbols[0] if symbols is not None else ref.BYTES
    plan = _training_plan(unit, alphabet, unknown_policy, len(specials), vocab_size, n_merges)
    if on_plan is not None:
        on_plan(plan)
    merges, merge_counts = learn_merges(
        pieces, counts, plan.merges, min_frequency, progress, max_token_bytes, symbols, ties
    )
    ranks = ref.ranks_from_merges(merges, alphabet)
    if unknown_policy == "bytes":
        for b in ref.BYTES:
            ranks.setdefault(b, len(ranks))
    if len(merges) < plan.merges:
        warnings.warn(
            f"the corpus gave only {len(merges)} merges of the {plan.merges} asked for "
            f"(vocab_size={plan.vocab_size}); the vocabulary has {len(ranks) + plan.special} ids",
            stacklevel=3,
        )
    return cls(
        ranks,
        pattern,
        _numbered(specials, len(ranks)),
        merges=merges,
        merge_counts=merge_counts,
        unit=unit,
        unknown=unknown_policy,
        lowercase=lowercase,
    )


def _checked_options(
    unit: str, pattern: str | None, unknown: str, lowercase: bool, ties: str, n_merges: int | None
) -> tuple[str, str, str | None]:
    """``(unit, pattern, unknown)`` checked, the pattern's default filled in and `unknown`
    None for the byte unit (every byte is in its alphabet); `train_tokenizer` says which
    values are allowed."""
    unit = check_unit(unit)
    if ties not in ref.TIES:
        raise InputError(
            f"ties={ties!r}: choose 'bytes' (smallest bytes first) or 'first-seen' (the pair met first in the text)"
        )
    if n_merges is not None and n_merges < 0:
        raise InputError(f"n_merges={n_merges}: give 0 or more merges to learn")
    pattern = check_pattern(pattern if pattern is not None else (NO_SPLIT if unit == "word" else "cl100k"))
    if unit != "byte" and unknown not in ("unk", "bytes"):
        raise InputError(
            f"unknown={unknown!r}: choose 'unk' (an <unk> id) or 'bytes' (byte fallback) for characters "
            "unseen at training"
        )
    if lowercase and unit != "word":
        raise InputError(f"lowercase=True is for the word unit only (unit={unit!r} is lossless and keeps case)")
    return unit, pattern, None if unit == "byte" else unknown


def _special_tokens(special_tokens: Sequence[str] | Mapping[str, int], unknown: str | None) -> dict[str, int]:
    """token -> id of the special tokens, -1 for an id given after the merges; ``<unk>`` added
    last for the ``unk`` policy."""
    specials = dict(special_tokens) if isinstance(special_tokens, Mapping) else {t: -1 for t in special_tokens}
    if unknown == "unk" and UNK not in specials:
        specials[UNK] = -1
    return specials


def _checked_sizes(unit: str, vocab_size: int, n_merges: int | None, n_special: int, max_token_bytes: int) -> int:
    """The `vocab_size` to train to, checked as far as it can be before the alphabet is known:
    MAX_VOCAB_SIZE when `n_merges` decides it (`_training_plan` checks it then)."""
    if n_merges is not None:
        vocab_size = MAX_VOCAB_SIZE
    if unit == "byte" and vocab_size < 256 + n_special:
        raise InputError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs 256 byte tokens plus {n_special} special "
            f"token(s), so at least {256 + n_special}"
        )
    if vocab_size > MAX_VOCAB_SIZE:
        raise InputError(f"vocab_size={vocab_size} is larger than MAX_VOCAB_SIZE ({MAX_VOCAB_SIZE})")
    if not 2 <= max_token_bytes <= MAX_TOKEN_BYTES:
        raise InputError(f"max_token_bytes={max_token_bytes} must be in [2, {MAX_TOKEN_BYTES}] (MAX_TOKEN_BYTES)")
    return vocab_size


def _training_pieces(
    counts_or_texts: PieceTable | Mapping[bytes, int] | Iterable[str | bytes],
    unit: str,
    pattern: str,
    lowercase: bool,
    first_seen: bool,
    workers: int,
) -> tuple[list[bytes], np.ndarray]:
    """``(pieces, counts)`` to learn merges from: a `PieceTable` checked, a mapping sorted (in
    the order met for `first_seen`), documents counted; for the word unit, the words."""
    if isinstance(counts_or_texts, PieceTable) and first_seen:
        raise InputError(
            "ties='first-seen' needs the text's order: give documents or a piece -> count mapping in the "
            "order met, not a sorted PieceTable"
        )
    if isinstance(counts_or_texts, PieceTable):
        pieces, counts = counts_or_texts.pieces, np.asarray(counts_or_texts.counts, dtype=np.int64)
        if len(pieces) != len(counts) or any(a >= b for a, b in zip(pieces, itertools.islice(pieces, 1, None))):
            raise InputError(
                f"a PieceTable needs as many counts as pieces ({len(pieces)} pieces, {len(counts)} "
                "counts) and its pieces sorted, each once"
            )
    elif isinstance(counts_or_texts, Mapping):
        items = list(counts_or_texts.items()) if first_seen else sorted(counts_or_texts.items())
        pieces = [p for p, _ in items]
        counts = np.array([c for _, c in items], dtype=np.int64)
    else:
        docs = (ref.utf8(t) if isinstance(t, str) else t for t in counts_or_texts)
        if first_seen:  # counted in Python, in the order met (the native counter sorts)
            in_order = ref.count_pieces(docs, pattern)
            pieces, counts = list(in_order), np.array(list(in_order.values()), dtype=np.int64)
        else:
            pieces, counts = count_documents(docs, pattern, workers).to_arrays()
    if unit == "word":
        words = list(ref.word_counts(dict(zip(pieces, counts.tolist())), pattern, lowercase).items())
        if not first_seen:
            words.sort()
        pieces, counts = [w for w, _ in words], np.array([c for _, c in words], dtype=np.int64)
    return pieces, counts


def _training_plan(
    unit: str, alphabet: Sequence[bytes], unknown: str | None, n_special: int, vocab_size: int, n_merges: int | None
) -> TrainingPlan:
    """The merges to learn and the vocabulary size, one from the other: the alphabet, the
    byte-fallback tokens and the special tokens come first."""
    n_fallback = 256 - sum(1 for a in alphabet if len(a) == 1) if unknown == "bytes" else 0
    minimum = len(alphabet) + n_fallback + n_special
    if unit != "byte" and vocab_size < minimum:
        what = "characters" if unit == "char" else "characters and </w>"
        fallback = f" + {n_fallback} byte-fallback tokens" if n_fallback else ""
        raise InputError(
            f"vocab_size={vocab_size} is too small: {unit}-level BPE on this corpus needs its {len(alphabet)} "
            f"{what}{fallback}"
            f" + {n_special} special token(s), so at least {minimum}"
        )
    if n_merges is None:
        n_merges = vocab_size - minimum
    else:
        vocab_size = minimum + n_merges
        if vocab_size > MAX_VOCAB_SIZE:
            raise InputError(f"n_merges={n_merges} gives {vocab_size} ids, more than MAX_VOCAB_SIZE ({MAX_VOCAB_SIZE})")
    return TrainingPlan(len(alphabet) + n_fallback, n_special, n_merges, vocab_size)


def _numbered(specials: Mapping[str, int], first_id: int) -> dict[str, int]:
    """`specials` with each token still at -1 given the next id from `first_id` on, in order."""
    ids = itertools.count(first_id)
    return {tok: next(ids) if i == -1 else i for tok, i in specials.items()}
