"""Growth: 8x the input must cost at most 16x the CPU time (linear or n log n, never quadratic).

Each test times two sizes FACTOR apart, alternating them, and asserts the ratio of their
fastest runs, never a limit in seconds. What the ratio can be:

* linear work: 8 in operations; in time up to about 2x more, because the big size's
  working set leaves the caches (the encoder keeps 16 bytes of scratch per byte of a long
  piece: 3 MB at the small size, 24 MB at the big one) and its fresh buffers cost page
  faults that the small size's recycled ones do not. That per-byte cost step is why the old
  check (4x the input, at most 5x the time) failed on clean machines at 5.2-5.8x: the core
  executes about as many instructions per byte at both sizes (counted by cachegrind: 8.1x
  for 'x', 9.0x for 'a'; see CONTRIBUTING.md), but they do not cost the same time.
* n log n: about 9; quadratic: 64, four times over the limit (a quadratic step that is only a
  sixth of the small size's work still crosses it). `test_the_check_flags_a_quadratic_encoder`
  runs this check on a real quadratic encoder and asserts that it fails.

Timing is this thread's CPU time (`time.thread_time`), which other processes on a busy
machine do not inflate; all the work runs on the calling thread. Each size takes the fastest
of its runs: interference (other processes evicting the caches, interrupts) only ever adds
time. Each function runs once before it is timed. The sizes keep every buffer under the
32 MB above which glibc maps each allocation afresh (a step in cost per byte of its own).

Inputs are pathological on purpose: one repeated character (one huge piece, tokens as long as
the cap allows, or no merge at all), and a vocabulary with one 1 MiB token (building the pair
map used to hash every prefix of it).
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
import warnings

import pytest
from growth_check import FACTOR, LIMIT, growth

from pipeline_lib import Tokenizer
from pipeline_lib import bpe_reference as ref


def _train_on(text: str, vocab_size: int) -> Tokenizer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the corpus gives far fewer merges than asked for
        return Tokenizer.train([text], vocab_size, pattern="gpt2", workers=1)


def test_train_on_one_repeated_character():
    assert max(_train_on("a" * (1 << 20), 4096).token_byte_lengths()) == 1 << 20  # tokens as long as the piece
    r = growth(
        lambda: _train_on("a" * (1 << 20), 4096),
        lambda: _train_on("a" * (FACTOR << 20), 4096),
        "Tokenizer.train, 1 MB -> 8 MB of 'a'",
    )
    assert r <= LIMIT


def _ranks_file(path, token_len: int) -> str:
    lines = [base64.b64encode(bytes([i])) + b" %d" % i for i in range(256)]
    lines.append(base64.b64encode(b"ab" * (token_len // 2)) + b" 256")
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def test_load_a_vocabulary_with_a_huge_token(tmp_path):
    small_file = _ranks_file(tmp_path / "small.tiktoken", (1 << 20) // FACTOR)
    big_file = _ranks_file(tmp_path / "big.tiktoken", 1 << 20)
    assert max(Tokenizer.from_tiktoken(big_file, pattern="gpt2").token_byte_lengths()) == 1 << 20
    r = growth(
        lambda: Tokenizer.from_tiktoken(small_file, pattern="gpt2"),
        lambda: Tokenizer.from_tiktoken(big_file, pattern="gpt2"),
        "from_tiktoken, 128 KiB -> 1 MiB token",
    )
    assert r <= LIMIT


@pytest.fixture(scope="module")
def tok(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:300_000]], vocab_size=1024, pattern="cl100k")


@pytest.fixture(scope="module")
def tok_a() -> Tokenizer:
    """Tokens 'a' * 2**k up to 64 KiB: a long run of 'a' merges all the way up."""
    return _train_on("a" * (1 << 16), 300)


SMALL_RUN = 192 << 10  # bytes; the big run is FACTOR times longer (1.5 MiB)


@pytest.mark.parametrize("char", ["x", " ", "7", "é", "!", "a", "apetixmbqfujyncrgvkzodshwl", "x's", "\n \t", "12345 "])
def test_encode_one_long_run(tok, tok_a, char):
    """One piece (letters, spaces, punctuation) or millions of short ones (digits); with
    Shakespeare's vocabulary no pair of them merges; with `tok_a`, 'a' merges ~n times. The last
    three repeat what the 64-byte window loops over (contractions, whitespace after a newline
    voided by the next one, digit runs cut in threes)."""
    t = tok_a if char == "a" else tok
    width = len(char.encode())
    small_text, big_text = char * (SMALL_RUN // width), char * (FACTOR * SMALL_RUN // width)
    assert t.decode(t.encode_ordinary(small_text)) == small_text
    r = growth(
        lambda: t.encode_ordinary(small_text),
        lambda: t.encode_ordinary(big_text),
        f"encode, 192 KiB -> 1.5 MiB of {char!r}",
    )
    assert r <= LIMIT


def test_the_check_flags_a_quadratic_encoder(tok_a):
    """The check above fails a quadratic implementation: the reference's merge loop (tiktoken's
    shape: find the lowest-ranked pair by scanning the whole piece, merge it, scan again) on a
    piece that merges ~n times. The core used it for every piece once; it keeps it for pieces
    of at most 64 bytes."""
    ranks = tok_a.mergeable_ranks
    small, big = b"a" * 127, b"a" * (128 * FACTOR - 1)  # not tokens themselves: 2**k - 1 bytes
    assert ref.bpe_piece(big, ranks) == tok_a.encode_ordinary(big.decode())
    r = growth(
        lambda: ref.bpe_piece(small, ranks),
        lambda: ref.bpe_piece(big, ranks),
        "reference bpe_piece, 127 -> 1023 bytes of 'a'",
        repeats=3,
    )
    assert r > LIMIT, "the growth check no longer tells a quadratic algorithm from a linear one"


@pytest.mark.slow
def test_cli_tokenizer_train_on_one_repeated_character(tmp_path):
    """Through Prefect (~10-20 s of start-up per run, so the ratio is near 1 unless a stage blows up)."""

    def run(n: int, k: int) -> None:
        corpus = tmp_path / f"a{n}.txt"
        if not corpus.exists():
            corpus.write_bytes(b"a" * n)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.cli",
                "tokenizer",
                "train",
                "--corpus",
                str(corpus),
                "--vocab-size",
                "4096",
                "--store",
                str(tmp_path / f"store{n}_{k}"),
            ],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]

    counter = iter(range(100))
    r = growth(
        lambda: run(1 << 20, next(counter)),
        lambda: run(FACTOR << 20, next(counter)),
        "tokenmill tokenizer train, 1 MB -> 8 MB of 'a'",
        repeats=3,
        clock=time.perf_counter,
    )  # the work is in a child process
    assert r <= LIMIT
