"""Counting pieces (on threads) and learning merges: what `Tokenizer.train` runs.

Native when the compiled core is built (`core._CORE`), else the pure-Python reference;
both give the same counts and the same merges.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from pipeline_lib import bpe_reference as ref
from pipeline_lib import cancel
from pipeline_lib.errors import InputError
from pipeline_lib.patterns import pattern_string
from pipeline_lib.tokenizer import core
from pipeline_lib.tokenizer.core import MAX_TOKEN_BYTES, MAX_VOCAB_SIZE

if TYPE_CHECKING:
    from pipeline_lib.tokenizer.core import Tokenizer


class PieceCounts:
    """A piece -> count table, filled from documents; native when the core is built."""

    def __init__(self, pattern: str = "cl100k"):
        pattern_string(pattern)
        self.pattern = pattern
        native = core._CORE
        self._native = native.PieceCounter(native.PATTERN_IDS[pattern]) if native else None
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
    if core._CORE is None or workers == 1:
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


def _learn_merges(pieces: list[bytes], counts: np.ndarray, n_merges: int, min_frequency: int, progress, max_token_bytes: int) -> list[tuple[int, int, int]]:
    native = core._CORE
    if native is not None:
        rows = native.learn_merges(pieces, np.asarray(counts, dtype=np.int64), n_merges, min_frequency, progress, max_token_bytes)
        return [tuple(r) for r in np.asarray(rows).tolist()]
    return ref.learn_merges(dict(zip(pieces, counts.tolist())), n_merges, min_frequency, progress, max_token_bytes)


def train_tokenizer(
    cls: type[Tokenizer],
    counts_or_texts: Mapping[bytes, int] | Iterable[str | bytes],
    vocab_size: int,
    pattern: str = "cl100k",
    special_tokens: Sequence[str] | Mapping[str, int] = (core.ENDOFTEXT,),
    min_frequency: int = 1,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 0,
    max_token_bytes: int = MAX_TOKEN_BYTES,
) -> Tokenizer:
    """Learn a vocabulary of `vocab_size` ids (256 bytes + merges + special tokens).

    `counts_or_texts` is a piece -> count table (what the counting stage writes) or
    documents to count here, on `workers` threads (0 = all cores). When the corpus cannot
    give that many merges, training stops early with a warning and the vocabulary is
    smaller. A pair whose merged token would be longer than `max_token_bytes` is never
    merged (the default, 1 MiB, only matters for pathological pieces such as a megabyte of
    one repeated character).

    Raises:
        InputError: `vocab_size` too small for the bytes and the special tokens, or too
            large, or `max_token_bytes` outside [2, MAX_TOKEN_BYTES].
    """
    n_special = len(special_tokens)
    if vocab_size < 256 + n_special:
        raise InputError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs 256 byte tokens plus {n_special} special token(s), so at least {256 + n_special}"
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
            f"the corpus gave only {len(merges)} merges of the {n_merges} asked for (vocab_size={vocab_size}); the vocabulary has {len(ranks) + n_special} ids",
            stacklevel=3,
        )
    if isinstance(special_tokens, Mapping):
        specials = dict(special_tokens)
    else:
        specials = {tok: len(ranks) + i for i, tok in enumerate(special_tokens)}
    return cls(ranks, pattern, specials, merges=merges)
