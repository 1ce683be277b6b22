"""The tiktoken-signature list paths built in the core (`encode_ordinary`, `encode`,
`encode_ordinary_batch`, `encode_batch`): the same ids as the NumPy paths, which the
tiktoken suites check against tiktoken, on the inputs where the list builder branches."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.tokenizer import Encoding, get_encoding

TEXTS = [
    "",
    "hello world",
    "héllo wörld, 日本語のテキスト 🙂",
    "lone surrogate \ud800 in the middle",
    "x" * 5000,  # long enough that the core releases the GIL
    "naïve " * 2000,
    " " * 10_000,
]


@pytest.fixture(scope="module", params=["cl100k_base", "o200k_base"])
def enc(request):
    return get_encoding(request.param)


def numpy_ids(enc, text: str) -> list[int]:
    return enc.encode_to_numpy(text, disallowed_special=()).tolist()


@pytest.mark.parametrize("text", TEXTS)
def test_list_paths_equal_the_numpy_path(enc, text):
    expected = numpy_ids(enc, text)
    assert enc.encode_ordinary(text) == expected
    assert enc.encode(text) == expected
    assert enc.encode_ordinary_batch([text, text[:7]], num_threads=2) == [expected, numpy_ids(enc, text[:7])]
    assert enc.encode_batch([text], num_threads=1) == [expected]


def test_the_lists_hold_plain_ints_above_the_small_int_cache(enc):
    ids = enc.encode_ordinary("Tokenization of a sentence with rare words: anthropomorphization")
    assert all(type(i) is int for i in ids) and max(ids) > 256
    again = enc.encode_ordinary("Tokenization of a sentence with rare words: anthropomorphization")
    assert again == ids
    ids.append(-1)  # the caller owns its list: a later call is not affected
    assert enc.encode_ordinary("Tokenization of a sentence with rare words: anthropomorphization") == again


def test_the_shared_ints_are_not_leaked_or_freed(enc):
    token = enc.encode_ordinary(" anthropomorphization")[0]
    one = enc.encode_ordinary(" anthropomorphization")[0]
    before = sys.getrefcount(one)
    lists = [enc.encode_ordinary(" anthropomorphization") for _ in range(1000)]
    assert sys.getrefcount(one) >= before + 1000
    del lists
    assert sys.getrefcount(one) == before
    assert one == token


def test_batch_accepts_a_tuple_and_refuses_other_items(enc):
    assert enc.encode_ordinary_batch(("a b", "c"), num_threads=1) == [numpy_ids(enc, "a b"), numpy_ids(enc, "c")]
    with pytest.raises(TypeError):
        enc.encode_ordinary_batch(["ok", 3], num_threads=1)  # type: ignore[list-item]


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(), max_size=5))
def test_any_batch_equals_the_numpy_path(texts):
    enc = get_encoding("cl100k_base")
    assert enc.encode_ordinary_batch(texts, num_threads=2) == [numpy_ids(enc, t) for t in texts]
    flat, offsets = enc.encode_ordinary_batch_to_numpy(texts, num_threads=1)
    assert np.array_equal(flat, np.array([i for t in texts for i in numpy_ids(enc, t)], dtype=np.uint32))


@pytest.mark.parametrize("num_threads", [2, 3])
def test_threaded_batch_of_many_chunks_equals_the_numpy_path(enc, shakespeare_text, num_threads):
    """Over a megabyte of documents: several chunks, and lists long enough in all to be filled on
    the threads."""
    docs = [d for d in shakespeare_text.split("\n\n") if d] + ["héllo 日本語 🙂", "", " " * 9000]
    lists = enc.encode_ordinary_batch(docs, num_threads=num_threads)
    flat, offsets = enc.encode_ordinary_batch_to_numpy(docs, num_threads=1)
    assert len(lists) == len(docs)
    assert [len(x) for x in lists] == np.diff(offsets).tolist()
    assert [i for x in lists for i in x] == flat.tolist()


def fresh(enc) -> Encoding:
    """An encoder of its own (no int objects made by earlier tests' calls)."""
    return Encoding(name=enc.name, pat_str=enc.pattern_str, mergeable_ranks=enc._mergeable_ranks, special_tokens={})


@pytest.mark.parametrize("num_threads", [2, 3])
def test_lists_filled_on_threads_hold_one_reference_per_item(enc, shakespeare_text, num_threads):
    """The threads write the items and add each int's references at the end, summed over the
    threads: with a miscount the ints would be freed while a list still holds them, or leak."""
    ours = fresh(enc)
    docs = [d for d in shakespeare_text.split("\n\n") if d]
    probe = ours.encode_ordinary_batch([docs[0]], num_threads=1)[0][0]
    before = sys.getrefcount(probe)
    lists = ours.encode_ordinary_batch(docs, num_threads=num_threads)
    held = sum(x.count(probe) for x in lists)
    assert held > 100
    assert sys.getrefcount(probe) == before + held
    ours._encoder.text_threads = num_threads  # one long text: one list, filled on the text threads
    whole = ours.encode_ordinary(shakespeare_text)
    assert whole == enc.encode_to_numpy(shakespeare_text).tolist()
    assert sys.getrefcount(probe) == before + held + whole.count(probe)
    del lists, whole
    assert sys.getrefcount(probe) == before


@pytest.mark.parametrize("num_threads", [1, 2])
def test_a_batch_leaves_the_garbage_collector_as_it_found_it(enc, shakespeare_text, num_threads):
    docs = [d for d in shakespeare_text.split("\n\n") if d][:3000]
    assert gc.isenabled()
    assert len(enc.encode_ordinary_batch(docs, num_threads=num_threads)) == len(docs)
    assert gc.isenabled()
    gc.disable()
    try:
        enc.encode_ordinary_batch(docs, num_threads=num_threads)
        assert not gc.isenabled()
    finally:
        gc.enable()
