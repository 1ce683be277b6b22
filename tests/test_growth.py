"""Growth: 4x the input must cost at most 5x the time (linear or n log n, never quadratic).

Each test times two sizes, alternating them, and asserts the ratio of their medians, never a
limit in seconds. The in-process tests count this thread's CPU time (`time.thread_time`),
which other processes on a busy machine do not inflate; all their work runs on the calling
thread. The sizes are big enough for the work to dominate fixed costs; a quadratic step
would show as ~16x. Inputs are pathological on
purpose: one repeated character (one huge piece, tokens as long as the cap allows), and a
vocabulary with one 1 MiB token (building the pair map used to hash every prefix of it).

Linear work is not linear in time across the 32 MB above which glibc serves every
allocation with fresh pages (its largest mmap threshold; below it, memory freed by the
previous call is reused): a buffer past that size costs page faults a smaller one does not,
which alone made 4M -> 16M characters of encoding look 5-6x. So each function runs once
before it is timed, and the encoding sizes keep the encoder's buffers under 32 MB (16 bytes
of scratch per byte of the piece).
"""

from __future__ import annotations

import base64
import os
import statistics
import subprocess
import sys
import time
import warnings

import pytest

from pipeline_lib import Tokenizer

RATIO = 5.0


def growth(small_fn, big_fn, what: str, repeats: int = 3, clock=time.thread_time) -> float:
    """Median time of big_fn over median time of small_fn, the two run alternately."""
    small_fn(), big_fn()
    small, big = [], []
    for _ in range(repeats):
        for fn, times in ((small_fn, small), (big_fn, big)):
            t0 = clock()
            fn()
            times.append(clock() - t0)
    s, b = statistics.median(small), statistics.median(big)
    print(f"{what}: {s:.3f} s -> {b:.3f} s, x{b / s:.2f}")
    return b / s


def test_train_on_one_repeated_character():
    def train(n: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the corpus gives far fewer merges than asked for
            return Tokenizer.train(["a" * n], 4096, pattern="gpt2", workers=1)

    assert max(train(1 << 20).token_byte_lengths()) == 1 << 20  # tokens as long as the piece
    assert growth(lambda: train(2 << 20), lambda: train(8 << 20), "Tokenizer.train, 2 MB -> 8 MB of 'a'", 5) <= RATIO


def _ranks_file(path, token_len: int) -> str:
    lines = [base64.b64encode(bytes([i])) + b" %d" % i for i in range(256)]
    lines.append(base64.b64encode(b"ab" * (token_len // 2)) + b" 256")
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def test_load_a_vocabulary_with_a_huge_token(tmp_path):
    small_file = _ranks_file(tmp_path / "small.tiktoken", 256 << 10)
    big_file = _ranks_file(tmp_path / "big.tiktoken", 1 << 20)
    assert max(Tokenizer.from_tiktoken(big_file, pattern="gpt2").token_byte_lengths()) == 1 << 20
    r = growth(
        lambda: Tokenizer.from_tiktoken(small_file, pattern="gpt2"),
        lambda: Tokenizer.from_tiktoken(big_file, pattern="gpt2"),
        "from_tiktoken, 256 KiB -> 1 MiB token",
        5,
    )
    assert r <= RATIO


@pytest.fixture(scope="module")
def tok(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:300_000]], vocab_size=1024, pattern="cl100k")


@pytest.mark.parametrize("char", ["x", " ", "7", "é", "!"])
def test_encode_one_long_run(tok, char):
    """One piece (letters, spaces, punctuation) or millions of short ones (digits)."""
    width = len(char.encode())
    small_text, big_text = char * ((384 << 10) // width), char * ((1536 << 10) // width)  # 384 KiB, 1.5 MiB
    assert tok.decode(tok.encode_ordinary(small_text)) == small_text
    r = growth(lambda: tok.encode_ordinary(small_text), lambda: tok.encode_ordinary(big_text), f"encode, 384 KiB -> 1.5 MiB of {char!r}", 5)
    assert r <= RATIO


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
        lambda: run(2 << 20, next(counter)), lambda: run(8 << 20, next(counter)), "tokenmill tokenizer train, 2 MB -> 8 MB of 'a'", clock=time.perf_counter
    )  # the work is in a child process
    assert r <= RATIO
