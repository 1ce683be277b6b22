"""The core's fast paths against its plain ones (see docs/performance.md).

* runs of ASCII letters are scanned 8 bytes at a time: the split must equal the regex reference
  wherever a run starts, ends, or meets a byte of any class, at every offset from the 8-byte step;
* hash-map entries compare keys by their head word (all of a key of <= 8 bytes, the first 8 of a
  longer one): counts must equal `collections.Counter` on keys that share heads, lengths and
  tails, through the table's growth;
* the encoder's per-thread cache of recent single-token pieces: ids must equal those of each
  piece encoded alone (`encode_piece`, which uses no cache) and tiktoken's;
* ASCII pieces of cl100k and o200k are found from one 16-byte load (`pretok::ascii_piece_end`):
  the split must equal the regex reference and the general path (`ascii_first=False`) for runs
  of every class that end at every position of the 16 bytes, before every kind of byte; and the
  encoder's table of ASCII pieces must give tiktoken's ids with the real vocabularies;
* ASCII pieces of cl100k and o200k are found 64 bytes at a time (`pretok::window_starts`): the
  split must equal the regex reference and the general path for every kind of piece at every
  offset of the window, next to non-ASCII bytes, and on long random texts.
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib import _tokcore as tokcore
from pipeline_lib import bpe_reference as ref
from pipeline_lib.patterns import PATTERNS
from pipeline_lib.tokenizer import get_encoding

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


# Runs of each class the 16-byte scanner handles, and what may stand after them: other classes,
# the edges of the ASCII ranges, an apostrophe (contractions), \r \n / (piece tails), and
# non-ASCII letters, marks, digits, punctuation and spaces (which decline to the general path).
RUN_UNITS = ["a", "Z", "xY", "Ab", "7", ".", "-", ")", "'", "/", " ", "\t", "\n", "\r\n", "\x00", "\x7f"]
AFTER = [
    "",
    "a",
    "Q",
    " ",
    "  ",
    "\n",
    "\r",
    "/",
    "'",
    "'s",
    "'LL",
    "7",
    ".",
    "é",
    "e\u0301",
    "²",
    "٣",
    "…",
    "\u00a0",
    "\u3000",
    "\u0085",
    "中",
]
FAST_PATTERNS = ["cl100k", "o200k", "gpt2"]  # GPT-2 has windows, not the 16-byte scanner


def test_ascii_pieces_end_at_every_position_of_the_window():
    for name in FAST_PATTERNS:
        pid = tokcore.PATTERN_IDS[name]
        for lead in ("", " ", "(", "\n", "x "):
            for unit in RUN_UNITS:
                for count in range(0, 18):
                    for after in AFTER:
                        # a tail of 20 bytes keeps the text going past the 16 bytes the scanner reads
                        data = (lead + unit * count + after + " tail of twenty bytes").encode()
                        expect = ref.split_bytes(data, name)
                        assert tokcore.split(data, pid) == expect, (name, data)
                        assert tokcore.split(data, pid, ascii_first=False) == expect, (name, data)


ASCII_HEAVY = st.lists(
    st.sampled_from(
        [
            "the",
            " cat",
            "Hello",
            "HTML",
            "iPhone",
            " ",
            "  ",
            "\n",
            "\n\n",
            "\r\n",
            "\t",
            ",",
            ".",
            "...",
            "'s",
            "'ll",
            "'",
            "(",
            ")",
            "/",
            "//",
            "1",
            "123",
            "2024",
            "_",
            "-",
            "é",
            "ß",
            "中",
            "\u00a0",
            "½",
            "\u0301",
            "x" * 15,
            "Y" * 17,
        ]
    ),
    max_size=80,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(ASCII_HEAVY)
def test_ascii_first_split_random(text):
    data = text.encode()
    for name in FAST_PATTERNS:
        expect = ref.split_bytes(data, name)
        assert tokcore.split(data, tokcore.PATTERN_IDS[name]) == expect
        assert tokcore.split(data, tokcore.PATTERN_IDS[name], ascii_first=False) == expect


@pytest.fixture(scope="module")
def real_encodings():
    pairs = []
    for name in ("cl100k_base", "o200k_base"):
        ours = get_encoding(name)
        theirs = tiktoken.Encoding(
            name=name, pat_str=ours.pattern_str, mergeable_ranks=ours._mergeable_ranks, special_tokens={}
        )
        pairs.append((ours, theirs))
    return pairs


@settings(max_examples=200, deadline=None)
@given(st.lists(ASCII_HEAVY, min_size=1, max_size=8))
def test_ascii_pieces_table_gives_tiktoken_ids(real_encodings, texts):
    # The same words again and again (the table's hits) in one text and across texts, and the
    # texts in one batch (the table shared by the documents of a thread).
    for ours, theirs in real_encodings:
        for text in texts + ["".join(texts) * 3]:
            assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)
        assert ours.encode_ordinary_batch(texts, num_threads=1) == [theirs.encode_ordinary(t) for t in texts]


def test_ascii_pieces_of_many_ids_and_single_tokens_again_and_again(real_encodings):
    """ASCII pieces that are one token and pieces of more ids than a word-table entry holds (those
    go to the piece cache), each seen many times."""
    rng = random.Random(5)
    many_ids = ["".join(rng.choice("qxzjvkwfp") for _ in range(rng.randint(8, 15))) for _ in range(300)]
    for ours, theirs in real_encodings:
        assert any(len(theirs.encode_ordinary(w)) > 3 for w in many_ids)
        words = [w.decode() for w in ours._mergeable_ranks if 1 < len(w) <= 15 and w.isascii() and w.isalpha()][:3000]
        text = " ".join(rng.choice(many_ids + words) for _ in range(20_000))
        assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)
        assert ours.encode_ordinary_batch([text[:5000], text], num_threads=1) == [
            theirs.encode_ordinary(text[:5000]),
            theirs.encode_ordinary(text),
        ]


# Pieces whose starts the 64-byte window derives from more than one byte: contractions (o200k's
# after letters, not after another contraction), capitals after small letters, \r \n and / taken
# after punctuation, whitespace runs with \r \n inside and a space of another script at their end,
# digit runs cut every three digits, a letter run after one and after two punctuation bytes.
WINDOW_CASES = [
    "x'LL'LLY",
    "don't 'sound 's x'Sound it'sOK",
    "camelCase iPhone HTMLParser aBC",
    "/\n/\r x",
    "a!\n/\n//x !\n//!",
    ".\n  \n x",
    "\n  \u00a0\n z",
    "x\n\n  y\n \n\tz",
    "\r\n\r\n  ",
    " 1234567 12 123456789012",
    "!!word !word  'x ''s",
    "\t!word\x0bword \x0c's",
    "x.\n'd \n\n_",
    "end   \u2003 \u00e9'LL",
    # GPT-2: a joined space before letters, digits and punctuation, case-sensitive contractions
    # (not after a joined space, not inside a punctuation run), digit runs not cut
    "it's 'sam 'S x 's !'s ''s \"'ll'\" 're're",
    " 12345678901234 x1 !! (x) 'd'm't",
    "a \n b\t\tc \n\n d  \t e  ",
]
FILLER = "ab cd, ef. "


def test_window_pieces_at_every_offset():
    for name in FAST_PATTERNS:
        pid = tokcore.PATTERN_IDS[name]
        for case in WINDOW_CASES:
            for offset in range(72):
                text = (FILLER * 8)[:offset] + case + FILLER * 12
                data = text.encode()
                expect = ref.split_bytes(data, name)
                assert tokcore.split(data, pid) == expect, (name, data)
                assert tokcore.split(data, pid, ascii_first=False) == expect, (name, data)


@settings(max_examples=150, deadline=None)
@given(st.lists(ASCII_HEAVY, min_size=3, max_size=12).map("".join))
def test_window_split_random(text):
    data = text.encode()
    for name in FAST_PATTERNS:
        assert tokcore.split(data, tokcore.PATTERN_IDS[name]) == ref.split_bytes(data, name)


def test_windows_without_avx2_give_the_same_pieces_and_ids():
    """TOKENMILL_NO_AVX2 makes the windows classify bytes 16 at a time: the same pieces, counts
    and ids as this process's windows (two 32-byte loads where the CPU has AVX2)."""
    script = (
        "import sys, numpy as np\n"
        "from pipeline_lib import _tokcore as t\n"
        "from pipeline_lib.tokenizer import get_encoding\n"
        "data = sys.stdin.buffer.read()\n"
        "for name in ('cl100k', 'o200k', 'gpt2'):\n"
        "    sys.stdout.buffer.write(b'\\0'.join(t.split(data, t.PATTERN_IDS[name])) + b'\\1')\n"
        "    ids = get_encoding(name if name == 'gpt2' else name + '_base').encode_ordinary(data.decode())\n"
        "    sys.stdout.buffer.write(np.asarray(ids, np.uint32).tobytes())\n"
    )
    rng = random.Random(3)
    units = [
        "the",
        " cat",
        "HTML",
        "iPhone",
        "'s",
        "'LL",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        ",",
        "...",
        "/",
        "123",
        "2024",
        "é",
        "中",
    ]
    text = "".join(rng.choice(units) for _ in range(40_000))
    here = subprocess.run([sys.executable, "-c", script], input=text.encode(), capture_output=True, check=True)
    without = subprocess.run(
        [sys.executable, "-c", script],
        input=text.encode(),
        capture_output=True,
        check=True,
        env={**os.environ, "TOKENMILL_NO_AVX2": "1"},
    )
    assert len(here.stdout) > 100_000
    assert here.stdout == without.stdout


def test_pieces_of_other_scripts_in_the_words_table_give_tiktoken_ids(real_encodings):
    """Pieces of 2..15 bytes that are not ASCII (words of other scripts, marks, emoji; one token,
    several ids, more ids than a word-table entry holds) are keyed in the words table like ASCII
    ones: each seen many times, in one text, at its very end (fewer than 8 bytes after a piece's
    start: not keyed) and in a batch."""
    rng = random.Random(11)
    letters = "абвгдежзиклмнопрстуфхцчшщыэюяαβγδεζηθικλμνξοπρστυφχψωçéèêëîïôûüñßøåæ한국어문장日本語中文字"
    invented = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 7))) for _ in range(400)]
    for ours, theirs in real_encodings:
        assert any(len(theirs.encode_ordinary(" " + w)) > 3 for w in invented)
        vocab = []
        for token in ours._mergeable_ranks:
            if 2 <= len(token) <= 15 and not token.isascii():
                try:
                    vocab.append(token.decode())
                except UnicodeDecodeError:
                    continue
        words = rng.sample(vocab, 3000)
        text = "".join(rng.choice(["", " "]) + rng.choice(invented + words) for _ in range(20_000))
        for tail in ("", " " + invented[0], invented[1], "é", " 日本"):
            assert ours.encode_ordinary(text + tail) == theirs.encode_ordinary(text + tail)
        parts = [text[:3000], text[3000:9000], text]
        assert ours.encode_ordinary_batch(parts, num_threads=1) == [theirs.encode_ordinary(p) for p in parts]
