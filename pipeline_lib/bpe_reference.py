r"""The textbook BPE, in plain Python: split, count, learn merges, encode, for every unit.

This module is the readable specification of the tokenizer. The compiled core
(`pipeline_lib._tokcore`) implements the same functions fast; the tests hold the two
equal, merge for merge and id for id. Nothing here does I/O.

Units: what a piece starts as before any merge (one counting -> merges -> encode machinery
for all of them; only the initial alphabet and segmentation differ).

* ``byte``: the 256 bytes (GPT-2, tiktoken, minbpe). Lossless on any text.
* ``char``: the Unicode characters of the training corpus (the first BPE tutorials):
  vocabulary = those characters + merges (+ special tokens). A character unseen at training
  becomes ``<unk>``, or with byte fallback its UTF-8 bytes as single-byte tokens.
* ``word``: Sennrich-style word BPE: pieces are words (the pattern's pieces split at
  whitespace, lowercased if asked; a custom regex keeps only what it matches, so ``\w+``
  drops punctuation), each ending in the end-of-word symbol ``</w>``, stored as the byte
  ``0xFF`` (never part of UTF-8 text, so it cannot collide with text) and decoded as a
  space. Lossy by nature: whitespace (and case, text a regex does not match) is not kept.

Conventions shared with the compiled core:

* Text is worked on as UTF-8 bytes. Bytes that are not valid UTF-8 are each treated as
  one character that is neither a letter, a number nor a space (Python's
  ``surrogateescape`` error handler gives exactly that view), so any byte string splits
  and round-trips.
* Training counts adjacent pairs inside each piece, weighted by the piece's count.
  The pair merged next is the most frequent; ties go to the pair whose
  ``(left bytes, right bytes)`` is lexicographically smallest (for every unit; ``</w>``,
  byte 0xFF, sorts after every character). This differs from the tutorials' Python
  (``max(pairs, key=pairs.get)``: the first pair met in the text wins a tie), so on ties
  the two may learn equal-count merges in another order. With ``ties="first-seen"`` the
  tutorials' rule is followed instead: of the pairs with the top count, the one whose first
  occurrence comes first (pieces in the order given, a dict's insertion order; then left
  to right inside a piece). If the merged bytes are already
  a token (the same bytes reached by another split), the pair is merged into that token
  and no new id is spent. With ``max_token_bytes``, a pair whose merged bytes would be
  longer is never a candidate. Each merge records the pair's count when it was merged.
* Encoding is rank-based, as in tiktoken: a whole piece found in the vocabulary is one
  token; otherwise, from the unit's initial segmentation, the adjacent pair whose
  concatenation has the lowest rank is merged first (leftmost on ties), until no adjacent
  pair is a token. This equals applying the merges in the order learned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

from pipeline_lib.patterns import NO_SPLIT, PATTERNS, compiled, custom_finditer, custom_fullmatch, is_custom

ProgressFn = Callable[[int, int], None]
Ties = Literal["bytes", "first-seen"]
TIES: tuple[str, ...] = ("bytes", "first-seen")
Unit = Literal["byte", "char", "word"]
UNITS: tuple[str, ...] = ("byte", "char", "word")
END_OF_WORD = b"\xff"
END_OF_WORD_TEXT = "</w>"
BYTES = [bytes([i]) for i in range(256)]


def split_text(text: str, pattern: str) -> list[str]:
    """Pieces of a text: a name's matches, the whole text for ``none``, or a custom regex's
    matches with the text between them as pieces of their own (so nothing is lost)."""
    if pattern == NO_SPLIT:
        return [text] if text else []
    if pattern in PATTERNS:
        return compiled(pattern).findall(text)
    pieces, at = [], 0
    for m in custom_finditer(pattern, text):
        if m.start() > at:
            pieces.append(text[at : m.start()])
        if m.end() > m.start():
            pieces.append(m.group())
        at = max(at, m.end())
    if at < len(text):
        pieces.append(text[at:])
    return pieces


def split_bytes(data: bytes, pattern: str) -> list[bytes]:
    r"""Split UTF-8 bytes (valid or not) into pre-tokenization pieces.

    >>> split_bytes(b"Hello world!!", "gpt2")
    [b'Hello', b' world', b'!!']
    >>> split_bytes(b"a-b", r"\w+")
    [b'a', b'-', b'b']
    """
    text = data.decode("utf-8", "surrogateescape")
    return [p.encode("utf-8", "surrogateescape") for p in split_text(text, pattern)]


def word_sources(pieces: Iterable[str], pattern: str) -> list[str]:
    r"""The pieces the word unit takes words from: all of them for a name or ``none``; for a
    custom regex only those it matches whole, so the text between matches is dropped
    (``\w+`` keeps words, not punctuation)."""
    if not is_custom(pattern):
        return list(pieces)
    return [p for p in pieces if custom_fullmatch(pattern, p)]


def split_words(text: str, pattern: str, lowercase: bool = False) -> list[str]:
    r"""The words of the word unit: the pattern's pieces (`word_sources`) split at whitespace,
    each lowercased if asked. Whitespace is what is lost, and with a custom regex the text
    it does not match.

    >>> split_words("The cat, the rat.", r"\w+", lowercase=True)
    ['the', 'cat', 'the', 'rat']
    >>> split_words("low  lower\nnewest", "none")
    ['low', 'lower', 'newest']
    """
    words = [w for piece in word_sources(split_text(text, pattern), pattern) for w in piece.split()]
    return [w.lower() for w in words] if lowercase else words


def utf8(text: str) -> bytes:
    """UTF-8 of a str; lone surrogates become U+FFFD (tiktoken's policy), pairs are joined."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def unit_pieces(data: bytes, unit: str, pattern: str, lowercase: bool = False) -> list[bytes]:
    """The pieces a unit counts and encodes: split bytes (``byte``, ``char``), or words as
    UTF-8 without their end-of-word symbol (``word``, on the text decoded with U+FFFD for
    invalid bytes)."""
    if unit == "word":
        return [utf8(w) for w in split_words(data.decode("utf-8", "replace"), pattern, lowercase)]
    return split_bytes(data, pattern)


def count_pieces(texts: Iterable[bytes | str], pattern: str) -> Counter[bytes]:
    """Count pre-tokenization pieces over documents: the input of `learn_merges`."""
    counts: Counter[bytes] = Counter()
    for text in texts:
        counts.update(split_bytes(utf8(text) if isinstance(text, str) else text, pattern))
    return counts


def word_counts(counts: Mapping[bytes, int], pattern: str, lowercase: bool = False) -> Counter[bytes]:
    """The word unit's words -> count from the pattern's piece -> count table: `split_words`
    applied to the pieces.

    >>> word_counts({b" The": 2, b" the": 1, b"  ": 4}, "gpt2", lowercase=True)
    Counter({b'the': 3})
    """
    words: Counter[bytes] = Counter()
    for piece, n in counts.items():
        for source in word_sources([piece.decode("utf-8", "replace")], pattern):
            for word in source.split():
                words[utf8(word.lower() if lowercase else word)] += n
    return words


def characters(piece: bytes) -> list[bytes]:
    """The characters of UTF-8 bytes, each as its bytes; an invalid byte is a character of its own.

    >>> characters("né".encode())
    [b'n', b'\xc3\xa9']
    """
    return [c.encode("utf-8", "surrogateescape") for c in piece.decode("utf-8", "surrogateescape")]


def initial_symbols(piece: bytes, unit: str) -> list[bytes]:
    """A piece's segmentation before any merge: bytes, characters, or characters + ``</w>``."""
    if unit == "byte":
        return [piece[i : i + 1] for i in range(len(piece))]
    if unit == "word":
        return [*characters(piece), END_OF_WORD]
    return characters(piece)


def alphabet_of(counts: Mapping[bytes, int], unit: str) -> list[bytes]:
    """The initial symbols of a unit, sorted by bytes: their index is their id.

    The 256 bytes for ``byte``; the characters of the pieces for ``char``; those and
    ``</w>`` for ``word``.
    """
    if unit == "byte":
        return list(BYTES)
    symbols = {c for piece in counts for c in characters(piece)}
    if unit == "word":
        symbols.add(END_OF_WORD)
    return sorted(symbols)


def _pair_stats(words: list[list[int]], freqs: list[int]) -> Counter[tuple[int, int]]:
    # Filled in text order: a pair's place in the Counter is its first occurrence.
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


def learn_symbol_merges(
    alphabet: Sequence[bytes],
    counts: Mapping[tuple[int, ...], int],
    n_merges: int,
    min_frequency: int = 1,
    progress: ProgressFn | None = None,
    max_token_bytes: int | None = None,
    ties: str = "bytes",
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Learn up to `n_merges` merges from pieces of symbols (ids into `alphabet`, the bytes
    of each symbol) -> count.

    Returns ``(merges, merge_counts)``: ``(left_id, right_id, merged_id)`` in the order
    learned, new ids after the alphabet's, and each merged pair's count when it was merged.
    Stops early when no pair is left (pairs that would make a token longer than
    `max_token_bytes` do not count) or the best pair occurs fewer than `min_frequency`
    times. Recounts every pair at every step: quadratic, and meant to be. `ties`: ``bytes``
    (equal counts: smallest (left, right) bytes) or ``first-seen`` (the pair met first).

    >>> learn_symbol_merges([b"a", b"b"], {(0, 0, 1): 2, (0, 0): 1}, 2)
    ([(0, 0, 2), (2, 1, 3)], [3, 2])
    >>> learn_symbol_merges([b"a", b"b"], {(1, 0, 0, 1): 1}, 1, ties="first-seen")
    ([(1, 0, 2)], [1])
    """
    if ties not in TIES:
        raise ValueError(f"ties={ties!r}: choose 'bytes' or 'first-seen'")
    words = [list(piece) for piece in counts]
    freqs = list(counts.values())
    vocab = dict(enumerate(alphabet))
    id_of = {b: i for i, b in vocab.items()}
    merges: list[tuple[int, int, int]] = []
    merge_counts: list[int] = []
    while len(merges) < n_merges:
        stats = _pair_stats(words, freqs)
        if max_token_bytes is not None:
            stats = Counter({p: c for p, c in stats.items() if len(vocab[p[0]]) + len(vocab[p[1]]) <= max_token_bytes})
        if not stats:
            break
        if ties == "first-seen":
            pair = max(stats, key=stats.__getitem__)  # the first of the largest, in text order
        else:
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
        merge_counts.append(stats[pair])
        words = [_merge_word(w, pair, new_id) for w in words]
        if progress is not None:
            progress(len(merges), n_merges)
    return merges, merge_counts


def learn_merges(
    counts: Mapping[bytes, int],
    n_merges: int,
    min_frequency: int = 1,
    progress: ProgressFn | None = None,
    max_token_bytes: int | None = None,
    ties: str = "bytes",
) -> list[tuple[int, int, int]]:
    """Byte-level `learn_symbol_merges` from a piece -> count table; ids 0-255 are the bytes.

    >>> learn_merges({b"aaabdaaabac": 1}, 3)
    [(97, 97, 256), (97, 98, 257), (256, 257, 258)]
    """
    return learn_symbol_merges(
        BYTES, {tuple(p): c for p, c in counts.items()}, n_merges, min_frequency, progress, max_token_bytes, ties
    )[0]


def learn_unit_merges(
    counts: Mapping[bytes, int],
    unit: str,
    n_merges: int,
    min_frequency: int = 1,
    progress: ProgressFn | None = None,
    max_token_bytes: int | None = None,
    ties: str = "bytes",
) -> tuple[list[bytes], list[tuple[int, int, int]], list[int]]:
    """``(alphabet, merges, merge_counts)`` of a unit from its piece -> count table.

    >>> alphabet, merges, n = learn_unit_merges({b"low": 5, b"lower": 2}, "word", 2)
    >>> [alphabet[i] for i in merges[0][:2]], n
    ([b'l', b'o'], [7, 7])
    """
    alphabet = alphabet_of(counts, unit)
    id_of = {b: i for i, b in enumerate(alphabet)}
    symbols: dict[tuple[int, ...], int] = {}
    for piece, c in counts.items():
        key = tuple(id_of[s] for s in initial_symbols(piece, unit))
        symbols[key] = symbols.get(key, 0) + c
    merges, merge_counts = learn_symbol_merges(
        alphabet, symbols, n_merges, min_frequency, progress, max_token_bytes, ties
    )
    return alphabet, merges, merge_counts


def ranks_from_merges(merges: Iterable[tuple[int, int, int]], alphabet: Sequence[bytes] = BYTES) -> dict[bytes, int]:
    """The tiktoken-style vocabulary (token bytes -> id) that an alphabet and a merge list define."""
    vocab = {b: i for i, b in enumerate(alphabet)}
    by_id = {i: b for b, i in vocab.items()}
    for left, right, new_id in merges:
        merged = by_id[left] + by_id[right]
        by_id[new_id] = merged
        vocab[merged] = new_id
    return vocab


def lowest_rank_pair(
    parts: list[bytes | None], ranks: Mapping[bytes, int], below: int | None = None
) -> tuple[int, int] | None:
    """(rank, index) of the adjacent pair whose concatenation has the lowest rank (only ranks
    under `below`, when given), the leftmost on a tie; None when no pair merges (a None part
    merges with nothing)."""
    best_rank, best_i = below, -1
    for i in range(len(parts) - 1):
        left, right = parts[i], parts[i + 1]
        rank = None if left is None or right is None else ranks.get(left + right)
        if rank is not None and (best_rank is None or rank < best_rank):
            best_rank, best_i = rank, i
    return None if best_i < 0 else (best_rank, best_i)  # type: ignore[return-value]


def merge_parts(parts: list[bytes | None], ranks: Mapping[bytes, int], below: int | None = None) -> list[bytes | None]:
    """Merge adjacent parts in place, lowest rank of their concatenation first (tiktoken's
    rule), using only ranks under `below` when given; the parts left."""
    while len(parts) > 1 and (best := lowest_rank_pair(parts, ranks, below)) is not None:
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]  # type: ignore[operator]
    return parts


def bpe_parts(parts: list[bytes | None], ranks: Mapping[bytes, int], unknown: int | None = None) -> list[int]:
    """Merge adjacent parts, lowest rank of their concatenation first (tiktoken's rule);
    a None part is the unknown token (`unknown`), which merges with nothing."""
    return [unknown if p is None else ranks[p] for p in merge_parts(parts, ranks)]  # type: ignore[misc]


def bpe_piece(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Encode one piece from its bytes by lowest-rank-first merging (tiktoken's rule)."""
    if piece in ranks:
        return [ranks[piece]]
    return bpe_parts([piece[i : i + 1] for i in range(len(piece))], ranks)


def bpe_chars(piece: bytes, ranks: Mapping[bytes, int], unknown: int | None) -> list[int]:
    """Encode one piece from its characters (the ``char`` and ``word`` units).

    A character that is not a token becomes the `unknown` id, or, when `unknown` is None
    (byte fallback), its bytes as single-byte tokens.
    """
    if piece in ranks:
        return [ranks[piece]]
    parts: list[bytes | None] = []
    for c in characters(piece):
        if c in ranks:
            parts.append(c)
        elif unknown is not None:
            parts.append(None)
        else:
            parts.extend(c[i : i + 1] for i in range(len(c)))
    return bpe_parts(parts, ranks, unknown)


def encode_ordinary(
    data: bytes,
    ranks: Mapping[bytes, int],
    pattern: str,
    unit: str = "byte",
    unknown: int | None = None,
    lowercase: bool = False,
) -> list[int]:
    """Encode bytes with no special-token handling."""
    ids: list[int] = []
    if unit == "byte":
        for piece in split_bytes(data, pattern):
            ids.extend(bpe_piece(piece, ranks))
    elif unit == "char":
        for piece in split_bytes(data, pattern):
            ids.extend(bpe_chars(piece, ranks, unknown))
    else:
        for word in unit_pieces(data, "word", pattern, lowercase):
            ids.extend(bpe_chars(word + END_OF_WORD, ranks, unknown))
    return ids


def decode_bytes(ids: Iterable[int], token_bytes: Mapping[int, bytes]) -> bytes:
    return b"".join(token_bytes[i] for i in ids)
