"""A non-ASCII str converted to UTF-8 by the core (utf8_units.h), from the str's own code units of
1, 2 or 4 bytes: a batch's documents by the threads that encode them, one text by the call that
encodes it. The same ids as the conversion CPython makes, surrogates refused as CPython refuses
them, and the str left as it was (CPython's conversion keeps the UTF-8 in the str, which
sys.getsizeof shows)."""

from __future__ import annotations

import gc
import sys
import threading
import time

import numpy as np
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.tokenizer import Encoding, get_encoding


def reference(name: str) -> tiktoken.Encoding:
    """tiktoken's encoder of the same vocabulary (no download: the ranks are ours)."""
    ours = get_encoding(name)
    return tiktoken.Encoding(
        name=f"units_{name}", pat_str=ours.pattern_str, mergeable_ranks=ours._mergeable_ranks, special_tokens={}
    )


def fresh(s: str) -> str:
    """An equal str that has never been converted to UTF-8 (a new object)."""
    return (s + "!")[:-1]


# Code points of every storage kind: Latin-1 (1 byte a unit), the BMP (2), astral (4).
LATIN1 = st.text(st.characters(min_codepoint=0, max_codepoint=0xFF), max_size=60)
BMP = st.text(st.characters(min_codepoint=0, max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=60)
ANY = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(LATIN1, BMP, ANY), min_size=1, max_size=40))
def test_the_threads_conversion_gives_cpythons_ids(texts):
    enc = get_encoding("o200k_base")
    docs = [fresh(t) for t in texts]
    sizes = [sys.getsizeof(d) for d in docs]
    got, offsets = enc.encode_ordinary_batch_to_numpy(docs, num_threads=2)
    lists = enc.encode_ordinary_batch([fresh(t) for t in texts], num_threads=2)
    assert [sys.getsizeof(d) for d in docs] == sizes  # converted by the threads, not kept
    want = [enc.encode_ordinary(t) for t in texts]
    assert np.array_equal(got, np.array([i for w in want for i in w], dtype=np.uint32))
    assert np.diff(offsets).tolist() == [len(w) for w in want]
    assert lists == want


def test_a_large_batch_of_every_kind_of_str(multilingual_text):
    """Enough text for many chunks on several threads, the three kinds mixed in each chunk."""
    enc = get_encoding("cl100k_base")
    ref = reference("cl100k_base")
    paragraphs = [p for p in multilingual_text.split("\n") if p]
    texts = [p + [" café", " Straße €", " 😀 emoji", ""][k % 4] for k, p in enumerate(paragraphs)] * 3
    want = ref.encode_ordinary_batch(texts)
    for threads in (2, 3, 8):
        docs = [fresh(t) for t in texts]
        sizes = [sys.getsizeof(d) for d in docs]
        got, offsets = enc.encode_ordinary_batch_to_numpy(docs, num_threads=threads)
        assert [sys.getsizeof(d) for d in docs] == sizes
        assert np.array_equal(got, np.array([i for w in want for i in w], dtype=np.uint32)), threads
        assert np.diff(offsets).tolist() == [len(w) for w in want]
        assert enc.encode_ordinary_batch([fresh(t) for t in texts], num_threads=threads) == want


def test_a_str_that_keeps_its_utf8_and_a_long_str_cut_between_its_units(multilingual_text):
    """A str whose UTF-8 is kept is read from it; a long one is cut at safe points between its
    code units into pieces for the threads, which make their UTF-8 (the str keeps none)."""
    enc = get_encoding("cl100k_base")
    kept = fresh(multilingual_text[:5000])
    kept.encode("utf-8")  # does not keep it; tiktoken's reading of a str does:
    reference("cl100k_base").encode_ordinary(kept)
    long_doc = fresh(multilingual_text * 2)  # many chunks long on 2 threads
    assert len(long_doc) > 1 << 16
    size = sys.getsizeof(long_doc)
    docs = [kept, long_doc, fresh(multilingual_text[:300])]
    got, offsets = enc.encode_ordinary_batch_to_numpy(docs, num_threads=2)
    assert sys.getsizeof(long_doc) == size
    want = [enc.encode_ordinary(d) for d in docs]
    assert np.array_equal(got, np.array([i for w in want for i in w], dtype=np.uint32))


def test_a_surrogate_is_replaced_as_tiktoken_replaces_it():
    """A lone surrogate cannot be UTF-8: the threads stop, and the str goes the way CPython's
    refusal sends it (replaced by U+FFFD, as tiktoken does)."""
    enc = get_encoding("cl100k_base")
    ref = reference("cl100k_base")
    texts = ["héllo wörld " * 50, "bad \ud800 here ✓", "astral 😀 \udfff", "fine ✓ " * 100] * 40
    want = ref.encode_ordinary_batch(texts)
    assert enc.encode_ordinary_batch([fresh(t) for t in texts], num_threads=2) == want
    got, _ = enc.encode_ordinary_batch_to_numpy([fresh(t) for t in texts], num_threads=2)
    assert got.tolist() == [i for w in want for i in w]


@settings(max_examples=80, deadline=None)
@given(st.one_of(LATIN1, BMP, ANY), st.integers(min_value=0, max_value=90))
def test_one_text_converted_by_the_call_gives_cpythons_ids(text, ascii_before):
    """One text (encode_ordinary, encode_to_numpy, encode), its non-ASCII code points anywhere
    among runs of ASCII (the conversion copies ASCII 16 bytes of units at a time): tiktoken's ids,
    and the str keeps no UTF-8. Short texts are made on the stack, a longer one in a buffer."""
    enc = get_encoding("cl100k_base")
    ref = reference("cl100k_base")
    for body in (text, text * 300):
        whole = "x" * ascii_before + body + " tail"
        want = ref.encode_ordinary(whole)
        doc = fresh(whole)
        size = sys.getsizeof(doc)
        assert enc.encode_ordinary(doc) == want
        assert enc.encode_to_numpy(doc).tolist() == want
        assert enc.encode(doc) == want
        assert sys.getsizeof(doc) == size


def test_one_text_with_a_surrogate_or_kept_utf8_is_read_as_before():
    """A str that holds a surrogate goes CPython's way (tiktoken's replacement); a str that keeps
    its UTF-8 is read from it."""
    enc = get_encoding("o200k_base")
    ref = reference("o200k_base")
    for text in ("bad \ud800 here ✓", "astral 😀 \udfff " * 400):
        assert enc.encode_ordinary(fresh(text)) == ref.encode_ordinary(text)
        assert enc.encode_to_numpy(fresh(text)).tolist() == ref.encode_ordinary(text)
    kept = fresh("Всеобщая декларация прав человека 世界人权宣言 " * 40)
    want = ref.encode_ordinary(kept)  # tiktoken's reading keeps the UTF-8 in the str
    size = sys.getsizeof(kept)
    assert enc.encode_ordinary(kept) == want
    assert enc.encode_to_numpy(kept).tolist() == want
    assert sys.getsizeof(kept) == size


def text_threads_encoding(name: str, threads: int):
    """A fresh encoder (its own caches) whose long texts go to `threads` text threads."""
    base = get_encoding(name)
    enc = Encoding(
        name=f"units-{threads}", pat_str=base.pattern_str, mergeable_ranks=base._mergeable_ranks, special_tokens={}
    )
    enc._encoder.text_threads = threads
    return enc


def test_a_long_str_is_cut_and_converted_on_the_text_threads(multilingual_text, shakespeare_text):
    """One long str of each kind (Latin-1, BMP, astral), cut at safe points between its code
    units: the ids of the whole text on one thread, and the str left without UTF-8."""
    lines = (shakespeare_text[:150_000] + multilingual_text[:150_000]).replace("\n", "\r\n", 300)
    latin1 = "".join(c if ord(c) < 256 else "é" for c in lines)
    bmp = "".join(c for c in lines if ord(c) <= 0xFFFF)
    texts = {"latin-1": latin1 * 3, "bmp": bmp * 3, "astral": bmp.replace(" the ", " 😀 ") * 3}
    one = text_threads_encoding("o200k_base", 1)
    for kind, text in texts.items():
        assert len(text) > 1 << 19
        expected = one.encode_ordinary(fresh(text))
        for threads in (2, 3):
            enc = text_threads_encoding("o200k_base", threads)
            doc = fresh(text)
            size = sys.getsizeof(doc)
            assert enc.encode_ordinary(doc) == expected, (kind, threads)
            assert enc.encode_to_numpy(doc).tolist() == expected, (kind, threads)
            assert sys.getsizeof(doc) == size, kind  # the threads made its UTF-8, the str kept none


def test_a_surrogate_in_a_long_str_is_replaced_as_tiktoken_replaces_it(multilingual_text):
    text = (multilingual_text[:100_000] + "\n") * 4 + "tail \ud83d here\n" + multilingual_text[:50_000]
    enc = text_threads_encoding("cl100k_base", 2)
    want = reference("cl100k_base").encode_ordinary(text)
    assert enc.encode_ordinary(fresh(text)) == want
    assert enc.encode_to_numpy(fresh(text)).tolist() == want


def test_a_list_emptied_while_the_threads_read_it(multilingual_text, shakespeare_text):
    """The caller's list is read in place: a Python thread that empties it during the call (the
    GIL released) drops its references, and the call still holds its own to every document."""
    enc = get_encoding("o200k_base")
    paragraphs = [p for p in (multilingual_text + shakespeare_text).split("\n") if p] * 4
    want = enc.encode_ordinary_batch_to_numpy(paragraphs, num_threads=1)[0]
    for threads in (2, 3):
        docs = [fresh(p) for p in paragraphs]  # the list holds the only reference to each
        emptied = threading.Event()

        def empty_it(docs: list[str] = docs, emptied: threading.Event = emptied) -> None:
            time.sleep(0.005)
            docs.clear()
            gc.collect()
            [fresh(p) * 2 for p in paragraphs[:2000]]  # reuse freed memory
            emptied.set()

        other = threading.Thread(target=empty_it)
        other.start()
        got = enc.encode_ordinary_batch_to_numpy(docs, num_threads=threads)[0]
        other.join()
        assert emptied.is_set() and np.array_equal(got, want), threads
