"""The special tokens' common prefix looked for by the encoder's calls (`unless`): `encode` and
`encode_to_numpy` with the default policies hand the prefix ("<|") to the core, which returns None
instead of ids when the text holds it (32 or 16 bytes a step, `contains.h`), and Python then looks
for the tokens themselves. The answer must be Python's `in` at every offset of the steps, in
bytes, in a str's UTF-8 and in a long str's code units of each size (read in place by the text
threads), with and without AVX2; and the user's calls must raise or encode as tiktoken does
whatever the text's length."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tiktoken
from growth_check import FACTOR, LIMIT, growth
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.tokenizer import Encoding, get_encoding

THREADED = 1 << 19  # the core's kThreadedTextBytes: a longer str goes to the text threads as units
PIECES = ["<", "|", "<|", "|<", "a", " ", "\n", "é", "日", "🙂", "<|endoftext|>", "<<", "||"]
NEEDLES = ["<|", "<", "|>", "<|e", "<|endoftext|>", "", "é<", "日🙂", "🙂"]


@pytest.fixture(scope="module")
def encoder():
    return get_encoding("cl100k_base")._encoder


def answers(encoder, text: str | bytes, needle: str) -> tuple[bool, bool]:
    """(array call returned None, list call returned None)."""
    array, listed = encoder.encode_ordinary(text, unless=needle), encoder.encode_ordinary_list(text, unless=needle)
    return array is None, listed is None


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.sampled_from(PIECES), max_size=80), needle=st.sampled_from(NEEDLES))
def test_the_core_finds_the_prefix_where_python_does(encoder, parts, needle):
    text = "".join(parts)
    held = needle in text
    assert answers(encoder, text, needle) == (held, held)
    assert answers(encoder, text.encode(), needle) == (held, held)
    if not held:  # and without it, the ids are the call's without `unless`
        assert encoder.encode_ordinary_list(text, unless=needle) == encoder.encode_ordinary_list(text)


@pytest.mark.parametrize("needle", ["<|", "<|endoftext|>", "|"])
def test_the_prefix_is_found_at_every_offset_of_the_steps(encoder, needle):
    for n in (len(needle), 15, 16, 17, 31, 32, 33, 34, 63, 64, 65, 100):
        for at in range(n - len(needle) + 1):
            text = "a" * at + needle + "b" * (n - at - len(needle))
            assert answers(encoder, text, needle) == (True, True), (n, at)
            # the needle's first bytes alone, or cut by the end of the text, are not it
            cut = text[: at + len(needle) - 1]
            assert answers(encoder, cut, needle) == (False, False), (n, at)
            if len(needle) > 1:
                broken = "a" * at + needle[0] + "x" + needle[1:] + "b" * (n - at - len(needle))
                assert answers(encoder, broken, needle) == (False, False), (n, at)


def test_the_same_answers_without_avx2():
    """TOKENMILL_NO_AVX2: the 16-byte steps answer as the 32-byte ones (this test's own checks
    run in a process without AVX2, at every offset of both steps)."""
    script = (
        "from pipeline_lib.tokenizer import get_encoding\n"
        "enc = get_encoding('cl100k_base')._encoder\n"
        "for needle in ('<|', '<|endoftext|>'):\n"
        "    for n in range(len(needle), 80):\n"
        "        for at in range(n - len(needle) + 1):\n"
        "            text = 'a' * at + needle + 'b' * (n - at - len(needle))\n"
        "            assert enc.encode_ordinary(text, unless=needle) is None, (n, at)\n"
        "            cut = text[: at + len(needle) - 1]\n"
        "            assert enc.encode_ordinary(cut, unless=needle) is not None, (n, at)\n"
        "print('checked')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "TOKENMILL_NO_AVX2": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "checked"


def threaded_encoding() -> Encoding:
    """cl100k with its own encoder on two text threads: a long non-ASCII str is read as units."""
    base = get_encoding("cl100k_base")
    enc = Encoding(
        name="cl100k-threads",
        pat_str=base._pat_str,
        mergeable_ranks=base._mergeable_ranks,
        special_tokens=base._special_tokens,
    )
    enc._encoder.text_threads = 2
    return enc


@pytest.mark.parametrize("letter", ["é", "日", "🙂"], ids=["1-byte units", "2-byte units", "4-byte units"])
def test_a_long_str_read_as_units_is_searched_in_them(letter):
    encoder = threaded_encoding()._encoder
    body = (letter + " word ") * (THREADED // 6)
    for needle in ("<|", "é<|", letter + "<", "\U0010ffff<"):
        for text in (body + needle, needle + body, body[:1000] + needle + body[1000:]):
            # fresh strs each time: a str whose UTF-8 was made once is read as UTF-8 after
            held = encoder.encode_ordinary("".join([text[:10], text[10:]]), unless=needle) is None
            assert held == (needle in text), (letter, needle)
            listed = encoder.encode_ordinary_list("".join([text[:10], text[10:]]), unless=needle) is None
            assert listed == (needle in text), (letter, needle)
    assert encoder.encode_ordinary_list("".join([body[:10], body[10:]]), unless="<|") == encoder.encode_ordinary_list(
        body
    )


@pytest.mark.parametrize("size", [100, 5000, THREADED + 1000])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_encode_raises_or_encodes_as_tiktoken_at_any_length(size, where):
    ours = threaded_encoding()
    theirs = tiktoken.Encoding(  # tiktoken's own encoder, on the same files as ours
        name="cl100k_base",
        pat_str=ours._pat_str,
        mergeable_ranks=ours._mergeable_ranks,
        special_tokens=ours._special_tokens,
    )
    body = ("Plain words, é and 日本語. " * (size // 20 + 1))[:size]
    for inserted, raises in (("<|endoftext|>", True), ("<|not a token|>", False), ("<|", False)):
        at = {"start": 0, "middle": size // 2, "end": size}[where]
        text = "".join([body[:at], inserted, body[at:]])
        for call in ("encode", "encode_to_numpy"):
            if raises:
                with pytest.raises(ValueError, match="special token"):
                    getattr(ours, call)(text)
                continue
            got = getattr(ours, call)(text)
            assert list(got) == theirs.encode(text), (call, inserted, where)
        assert list(ours.encode(text, allowed_special="all")) == theirs.encode(text, allowed_special="all")
        assert list(ours.encode_to_numpy(text, disallowed_special=())) == theirs.encode(text, disallowed_special=())


def test_a_batch_is_searched_for_the_prefix_in_every_text(encoder):
    """`encode_batch` with the default policies hands the prefix to the core's batch call: None
    when any text holds it (ASCII, UTF-8 kept by its str, a str's units left to the threads,
    bytes), the lists otherwise."""
    texts = ["plain", "naïve café", "日本語のテキスト", "🙂 emoji", b"bytes too"]
    for threads in (1, 2):
        lists = encoder.encode_ordinary_batch_lists(texts, threads, unless="<|")
        assert lists == encoder.encode_ordinary_batch_lists(texts, threads)
        for k in range(len(texts)):
            for where in ("<|" + "x", "x" + "<|"):
                held = list(texts)
                held[k] = "".join([where, "日本" if k == 2 else ""]) if k != 4 else where.encode()
                # a fresh str, its UTF-8 not yet made: left to the threads as units
                assert encoder.encode_ordinary_batch_lists(held, threads, unless="<|") is None, (k, where)


def test_encode_batch_raises_or_encodes_as_tiktoken():
    ours = threaded_encoding()
    theirs = tiktoken.Encoding(
        name="cl100k_base",
        pat_str=ours._pat_str,
        mergeable_ranks=ours._mergeable_ranks,
        special_tokens=ours._special_tokens,
    )
    texts = ["plain words", "日本語 and é", "x" * 5000]
    assert ours.encode_batch(texts, num_threads=2) == theirs.encode_batch(texts, num_threads=2)
    for inserted in ("<|not a token|>", "<|"):
        held = [*texts, "text " + inserted]
        assert ours.encode_batch(held, num_threads=2) == theirs.encode_batch(held, num_threads=2)
    with pytest.raises(ValueError, match="special token"):
        ours.encode_batch([*texts, "end <|endoftext|>"], num_threads=2)
    held = [*texts, "end <|endoftext|>"]
    for kwargs in ({"allowed_special": "all"}, {"disallowed_special": ()}):
        assert ours.encode_batch(held, num_threads=2, **kwargs) == theirs.encode_batch(held, num_threads=2, **kwargs)


def test_texts_dense_with_the_needle_s_first_characters_are_searched_in_linear_time(encoder):
    """Pathological texts for the search, the needle at their very end: every other byte starts
    it ("<|<|..." against "<|endoftext|>": the first two bytes match at every other place, the
    rest is compared there), and a str of 2-byte units full of "<" read by the text threads: 8x
    the text, at most 16x the time (growth_check)."""
    needle = "<|endoftext|>"
    small, big = b"<|" * 2_000_000 + needle.encode(), b"<|" * (2_000_000 * FACTOR) + needle.encode()
    assert encoder.encode_ordinary(big, unless=needle) is None
    ratio = growth(
        lambda: encoder.encode_ordinary(small, unless=needle),
        lambda: encoder.encode_ordinary(big, unless=needle),
        "bytes dense with the needle's first bytes",
    )
    assert ratio <= LIMIT
    threaded = threaded_encoding()._encoder

    def units(n: int) -> str:  # a fresh str of 2-byte units (its UTF-8 not made)
        return "".join(["日", "<" * n, "<|"])

    assert threaded.encode_ordinary_list(units(2 * THREADED * FACTOR), unless="<|") is None
    ratio = growth(
        lambda: threaded.encode_ordinary_list(units(2 * THREADED), unless="<|"),
        lambda: threaded.encode_ordinary_list(units(2 * THREADED * FACTOR), unless="<|"),
        "2-byte units dense with the needle's first character",
    )
    assert ratio <= LIMIT
