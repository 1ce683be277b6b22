"""The textbook byte-level BPE, in plain Python: split, count, learn merges, encode.

This module is the readable specification of the tokenizer. The compiled core
(`pipeline_lib._tokcore`) implements the same functions fast; the tests hold the two
equal, merge for merge and id for id. Nothing here does I/O.

Conventions shared with the compiled core:

* Text is worked on as UTF-8 bytes. Bytes that are not valid UTF-8 are each treated as
  one character that is neither a letter, a number nor a space (Python's
  ``surrogateescape`` error handler gives exactly that view), so any byte string splits
  and round-trips.
* Training counts adjacent pairs inside each piece, weighted by the piece's count.
  The pair merged next is the most frequent; ties go to the pair whose
  ``(left bytes, right bytes)`` is lexicographically smallest. If the merged bytes are
  already a token (the same bytes reached by another split), the pair is merged into that
  token and no new id is spent. With ``max_token_bytes``, a pair whose merged bytes would
  be longer is never a candidate.
* Encoding is rank-based, as in tiktoken: a whole piece found in the vocabulary is one
  token; otherwise the adjacent pair whose concatenation has the lowest rank is merged
  first (leftmost on ties), until no adjacent pair is a token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from pipeline_lib.patterns import compiled

ProgressFn = Callable[[int, int], None]


def split_bytes(data: bytes, pattern: str) -> list[bytes]:
    """Split UTF-8 bytes (valid or not) into pre-tokenization pieces with a named pattern.

    >>> split_bytes(b"Hello world!!", "gpt2")
    [b'Hello', b' world', b'!!']
    """
    text = data.decode("utf-8", "surrogateescape")
    return [p.encode("utf-8", "surrogateescape") for p in compiled(pattern).findall(text)]


def utf8(text: str) -> bytes:
    """UTF-8 of a str; lone surrogates become U+FFFD (tiktoken's policy), pairs are joined."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def count_pieces(texts: Iterable[bytes | str], pattern: str) -> Counter[bytes]:
    """Count pre-tokenization pieces over documents: the input of `learn_merges`."""
    counts: Counter[bytes] = Counter()
    for text in texts:
        counts.update(split_bytes(utf8(text) if isinstance(text, str) else text, pattern))
    return counts


def _pair_stats(words: list[list[int]], freqs: list[int]) -> Counter[tuple[int, int]]:
    stats: Counter[tuple[int, int]] = Counter()
    for word, freq in zip(words, freqs):
        for pair in zip(word, word[1:]):
            stats[pair] += freq
    return stats


def _merge_word(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def learn_merges(
    counts: Mapping[bytes, int],
    n_merges: int,
    min_frequency: int = 1,
    progress: ProgressFn | None = None,
    max_token_bytes: int | None = None,
) -> list[tuple[int, int, int]]:
    """Learn up to `n_merges` merges from a piece -> count table.

    Returns a list of ``(left_id, right_id, merged_id)`` in the order learned; ids 0-255 are
    the bytes. Stops early when no pair is left (pairs that would make a token longer than
    `max_token_bytes` do not count) or the best pair occurs fewer than `min_frequency`
    times. Recounts every pair at every step: quadratic, and meant to be.

    >>> learn_merges({b"aaabdaaabac": 1}, 3)
    [(97, 97, 256), (97, 98, 257), (256, 257, 258)]
    """
    words = [list(piece) for piece in counts]
    freqs = list(counts.values())
    vocab = {i: bytes([i]) for i in range(256)}
    id_of = {b: i for i, b in vocab.items()}
    merges: list[tuple[int, int, int]] = []
    while len(merges) < n_merges:
        stats = _pair_stats(words, freqs)
        if max_token_bytes is not None:
            stats = Counter({p: c for p, c in stats.items() if len(vocab[p[0]]) + len(vocab[p[1]]) <= max_token_bytes})
        if not stats:
            break
        pair = min(stats, key=lambda p: (-stats[p], vocab[p[0]], vocab[p[1]]))
        if stats[pair] < min_frequency:
            break
        merged = vocab[pair[0]] + vocab[pair[1]]
        new_id = id_of.get(merged)
        if new_id is None:
            new_id = len(vocab)
            vocab[new_id] = merged
            id_of[merged] = new_id
        merges.append((pair[0], pair[1], new_id))
        words = [_merge_word(w, pair, new_id) for w in words]
        if progress is not None:
            progress(len(merges), n_merges)
    return merges


def ranks_from_merges(merges: Iterable[tuple[int, int, int]]) -> dict[bytes, int]:
    """The tiktoken-style vocabulary (token bytes -> id) that a merge list defines."""
    vocab = {bytes([i]): i for i in range(256)}
    by_id = {i: b for b, i in vocab.items()}
    for left, right, new_id in merges:
        merged = by_id[left] + by_id[right]
        by_id[new_id] = merged
        vocab[merged] = new_id
    return vocab


def bpe_piece(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Encode one piece by lowest-rank-first merging (tiktoken's rule)."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best_rank, best_i = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_i = rank, i
        if best_rank is None:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return [ranks[p] for p in parts]


def encode_ordinary(data: bytes, ranks: Mapping[bytes, int], pattern: str) -> list[int]:
    """Encode bytes with no special-token handling."""
    ids: list[int] = []
    for piece in split_bytes(data, pattern):
        ids.extend(bpe_piece(piece, ranks))
    return ids


def decode_bytes(ids: Iterable[int], token_bytes: Mapping[int, bytes]) -> bytes:
    return b"".join(token_bytes[i] for i in ids)
