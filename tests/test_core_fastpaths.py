"""The core's fast paths against its plain ones (see docs/performance.md).

* runs of ASCII letters are scanned 8 bytes at a time: the split must equal the regex reference
  wherever a run starts, ends, or meets a byte of any class, at every offset from the 8-byte step;
* hash-map entries compare keys by their head word (all of a key of <= 8 bytes, the first 8 of a
  longer one): counts must equal `collections.Counter` on keys that share heads, lengths and
  tails, through the table's growth;
* the encoder's per-thread cache of recent single-token pieces: ids must equal those of each
  piece encoded alone (`encode_piece`, which uses no cache) and tiktoken's.
"""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib import _tokcore as tokcore
from pipeline_lib import bpe_reference as ref
from pipeline_lib.patterns import PATTERNS

NAMES = list(PATTERNS)
# Bytes around the ASCII letters' edges ('@' 'A' 'Z' '[' '`' 'a' 'z' '{', DEL), the other
# classes (space, digit, newline, apostrophe), a 2-byte letter, a 3-byte symbol, invalid bytes.
STOPS = [
    b"@",
    b"A",
    b"Z",
    b"[",
    b"`",
    b"a",
    b"z",
    b"{",
    b"\x7f",
    b" ",
    b"7",
    b"\n",
    b"'",
    "é".encode(),
    "€".encode(),
    b"\xff",
    b"\xc3",
]


def test_letter_runs_at_every_offset():
    for name in NAMES:
        pid = tokcore.PATTERN_IDS[name]
        for lead in range(9):
            for run in range(20):
                for stop in STOPS:
                    data = b" " * lead + b"xY" * (run // 2) + b"q" * (run % 2) + stop + b"tail"
                    assert tokcore.split(data, pid) == ref.split_bytes(data, name), (name, data)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([b"a", b"Q", b"z", b" ", b"e\xcc\x81", "ß".encode(), b"1", b".", b"\xff"]), max_size=60)
)
def test_letter_runs_random(parts):
    data = b"".join(parts)
    for name in NAMES:
        assert tokcore.split(data, tokcore.PATTERN_IDS[name]) == ref.split_bytes(data, name)


def counts_of(docs: list[bytes], name: str) -> dict[bytes, int]:
    pc = tokcore.PieceCounter(tokcore.PATTERN_IDS[name])
    pc.add_batch(docs)
    pieces, counts = pc.to_arrays()
    return dict(zip(pieces, counts.tolist()))


def test_counts_of_keys_sharing_heads_through_growth():
    # Words of 1..40 letters from a 2-letter alphabet: many share their first and last 8 bytes
    # and their lengths; 20,000 distinct ones grow the table from its initial 4,096 slots.
    rng = random.Random(5)
    words = [" " + "".join(rng.choice("ab") for _ in range(rng.randint(1, 40))) for _ in range(40_000)]
    docs = ["".join(words[i : i + 500]).encode() for i in range(0, len(words), 500)]
    expect = collections.Counter(p for d in docs for p in ref.split_bytes(d, "cl100k"))
    assert len(expect) > 20_000
    assert counts_of(docs, "cl100k") == dict(expect)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet="ab ", max_size=30).map(str.encode), max_size=40))
def test_counts_random(docs):
    assert counts_of(docs, "gpt2") == dict(collections.Counter(p for d in docs for p in ref.split_bytes(d, "gpt2")))


@pytest.fixture(scope="module")
def small_vocab():
    """Ranks of 600 merges learned on words that share heads, with a native and a tiktoken encoder."""
    rng = random.Random(7)
    text = " ".join("".join(rng.choice("abc") for _ in range(rng.randint(1, 12))) for _ in range(20_000)).encode()
    pc = tokcore.PieceCounter(tokcore.PATTERN_IDS["cl100k"])
    pc.add(text)
    ranks = ref.ranks_from_merges(map(tuple, tokcore.learn_merges(*pc.to_arrays(), 600).tolist()))
    enc = tokcore.Encoder(
        list(ranks), np.fromiter(ranks.values(), np.uint32, len(ranks)), tokcore.PATTERN_IDS["cl100k"]
    )
    tk = tiktoken.Encoding(name="fastpaths", pat_str=PATTERNS["cl100k"], mergeable_ranks=ranks, special_tokens={})
    return text, enc, tk


def test_recent_pieces_cache(small_vocab):
    text, enc, tk = small_vocab
    # The same words many times (hits), words that are one token and words that are not,
    # one document and many (one thread, several).
    docs = [text[i : i + 3000] for i in range(0, len(text), 3000)] * 3
    alone = [
        np.concatenate([enc.encode_piece(p) for p in ref.split_bytes(d, "cl100k")] or [np.zeros(0, np.uint32)])
        for d in docs
    ]
    for threads in (1, 2):
        ids, offsets = enc.encode_ordinary_batch(docs, threads)
        for k, d in enumerate(docs):
            got = ids[offsets[k] : offsets[k + 1]]
            assert np.array_equal(got, alone[k])
            assert got.tolist() == tk.encode_ordinary(d.decode())
    assert enc.encode_ordinary(text).tolist() == tk.encode_ordinary(text.decode())
