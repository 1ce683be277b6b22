"""One long text on several threads (`encode_ordinary`, `encode`, `encode_to_numpy` of 512 KiB
or more): the core cuts it at safe points, the threads encode the segments, and the ids are
the whole text's, in one list whose ints are shared with the encoder's table."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.errors import InputError
from pipeline_lib.tokenizer import Encoding, Tokenizer, get_encoding
from pipeline_lib.tokenizer.core import THREADS_ENV, safe_cuts, text_threads

ENCODINGS = {"gpt2": "gpt2", "cl100k": "cl100k_base", "o200k": "o200k_base"}
THREADED = 1 << 19  # the core's kThreadedTextBytes
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHABET = st.sampled_from(
    ["\n", "\r", "\r\n", " ", "\t", "\u00a0", "a", "B", "é", "日", "7", ".", "'s", "🙂", "/", "}", "\n\n"]
)


def core_cuts(enc, data: bytes) -> list[int]:
    cuts, at = [], 0
    while (at := enc._encoder.safe_cut(data, at)) < len(data):
        cuts.append(at)
    return cuts


@settings(max_examples=300, deadline=None)
@given(text=st.lists(ALPHABET, max_size=40).map("".join), pattern=st.sampled_from(sorted(ENCODINGS)))
def test_the_core_cuts_where_the_file_command_does(text, pattern):
    data = text.encode()
    assert core_cuts(get_encoding(ENCODINGS[pattern]), data) == safe_cuts(data, pattern)


def test_a_text_without_a_split_pattern_is_never_cut():
    whole = Tokenizer(get_encoding("gpt2")._mergeable_ranks, "none")
    assert whole._encoder.safe_cut(b"ab\ncd\nef", 0) == len(b"ab\ncd\nef")


def own_encoding(name: str, threads: int) -> Encoding:
    """A fresh encoder (its own caches) on `threads` text threads."""
    base = get_encoding(name)
    enc = Encoding(
        name=f"{name}-{threads}",
        pat_str=base._pat_str,
        mergeable_ranks=base._mergeable_ranks,
        special_tokens=base._special_tokens,
    )
    enc._encoder.text_threads = threads
    return enc


@pytest.fixture(scope="module")
def long_texts(shakespeare_text, multilingual_text) -> dict[str, str]:
    lines = (shakespeare_text[:200_000] + multilingual_text[:200_000]).replace("\n", "\r\n", 500)
    texts = {
        "lines": (lines * (2 * THREADED // len(lines.encode()) + 1)),
        "one line": ("word " * 30 + "日本語 ") * (THREADED // 150),
        "code": "def f(x):\n    return x  # 1\n" * (THREADED // 20),
        # o200k's "}\n//" is one piece: cut there, two threads gave other ids than one
        "c code": "int f(void) {\n  return 1;\n}\n// the next one\n/* a note */\n" * (THREADED // 50),
        # a blank line between paragraphs, no single newline: cut only where a pattern allows it
        "paragraphs": "A paragraph of a few words, ending here.\n\n" * (THREADED // 40),
    }
    assert all(len(t.encode()) > THREADED for t in texts.values())
    return texts


@pytest.mark.parametrize("name", sorted(ENCODINGS.values()))
def test_a_long_text_on_threads_has_the_whole_texts_ids(name, long_texts):
    one, two, three = own_encoding(name, 1), own_encoding(name, 2), own_encoding(name, 3)
    for kind, text in long_texts.items():
        data = text.encode()
        cuts = len(core_cuts(one, data))
        uncut = kind == "one line" or (kind == "paragraphs" and name == "gpt2")
        assert cuts == 0 if uncut else cuts > 100, kind
        expected = one.encode_ordinary(text)
        assert expected == one.encode_to_numpy(text).tolist()
        for enc in (two, three):
            assert enc.encode_ordinary(text) == expected, kind
            assert enc.encode(text + "<|endoftext|>", allowed_special="all")[:-1] == expected, kind
            assert enc.encode_to_numpy(text).tolist() == expected, kind
        assert two.encode_ordinary(text) == expected  # again, with the threads' caches warm


def test_the_lists_ints_move_with_their_references(long_texts):
    """The segments' lists are spliced into one: each int is held once per place in the result."""
    enc = own_encoding("cl100k_base", 2)
    text = long_texts["lines"]
    shared = enc.encode_ordinary(" the")[0]  # the encoder's own int object for that id
    before = sys.getrefcount(shared)
    ids = enc.encode_ordinary(text)
    held = sum(1 for i in ids if i is shared)
    assert held == ids.count(shared) > 1000
    assert sys.getrefcount(shared) == before + held
    del ids
    assert sys.getrefcount(shared) == before


def test_the_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "3")
    assert text_threads() == 3
    monkeypatch.setenv(THREADS_ENV, "1")
    assert own_encoding("gpt2", 1)._encoder.text_threads == 1
    assert Tokenizer(get_encoding("gpt2")._mergeable_ranks, "gpt2")._encoder.text_threads == 1
    monkeypatch.delenv(THREADS_ENV)
    assert 1 <= text_threads() <= 8
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(InputError, match=THREADS_ENV):
            text_threads()


def test_the_command_names_a_bad_thread_count_in_one_line(tmp_path):
    """A fresh process: the variable is read when an encoding is made."""
    text, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    text.write_text("hello world")
    args = ["tokenizer", "encode", "--tokenizer", "cl100k_base", "--input", str(text), "--output", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", f"from flows.cli import main; raise SystemExit(main({args!r}))"],
        env={**os.environ, THREADS_ENV: "many"},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    err = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(err) == 1 and err[0].startswith("tokenmill: error:"), done.stderr
    assert THREADS_ENV in err[0] and "bug" not in err[0] and not out.exists()
