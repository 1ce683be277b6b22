"""Hostile input to the tokenizer: runaway custom regexes, huge ranks files, special tokens
deep in big files. Each ends in one clear error naming the flag to change, or costs time
linear in the input (tests/growth_check.py: the growth of CPU time between two sizes, never seconds)."""

from __future__ import annotations

import base64
import contextlib
import os
import threading
import time

import numpy as np
import pytest
from growth_check import FACTOR, LIMIT, growth
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.cli import main
from pipeline_lib import Tokenizer
from pipeline_lib.patterns import PatternTimeoutError
from pipeline_lib.tokenizer.load import RanksFile, _parse_ranks_lines, find_special_in_file, parse_tiktoken_ranks

BYTE_RANKS = {bytes([i]): i for i in range(256)}

# Each backtracks exponentially in the `regex` module on the text beside it.
CATASTROPHIC = [
    (r"(a|aa)+$", "a" * 60 + "b"),
    (r"(a|a)+$", "a" * 60 + "b"),
    (r"(?:a|aa|aaa)+$", "a" * 60 + "b"),
    (r"(\w|\w\w)+$", "a" * 60 + "!"),
]


@pytest.mark.parametrize(("pattern", "text"), CATASTROPHIC)
def test_a_runaway_custom_regex_ends_in_an_error_naming_the_pattern_flag(pattern, text):
    tok = Tokenizer(BYTE_RANKS, pattern, {})
    with pytest.raises(PatternTimeoutError, match=r"^--pattern .*catastrophic backtracking"):
        tok.encode(text)


def test_a_runaway_custom_regex_in_training_and_the_word_unit_ends_in_the_error():
    with pytest.raises(PatternTimeoutError, match="--pattern"):
        Tokenizer.train(["a" * 60 + "b"], 260, pattern=r"(a|aa)+$", special_tokens=())
    with pytest.raises(PatternTimeoutError, match="--pattern"):
        Tokenizer.train(["a" * 60 + "b"], 260, pattern=r"(a|aa)+$", special_tokens=(), unit="word")


def test_a_runaway_custom_regex_through_the_cli_is_one_line_and_status_2(tmp_path, capsys):
    saved = str(tmp_path / "tok")
    Tokenizer(BYTE_RANKS, r"(a|aa)+$", {}).save(saved)
    assert main(["tokenizer", "encode", "--tokenizer", saved, "--text", "a" * 60 + "b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pattern" in err[0] and "Traceback" not in err[0], err


def test_a_sound_custom_regex_stays_linear_and_within_its_budget(multilingual_text):
    tok = Tokenizer(BYTE_RANKS, r"\w+|[^\w\s]+|\s+", {})
    text = multilingual_text * 2
    assert tok.decode(tok.encode(text)) == text
    twice = growth(lambda: tok.encode(text), lambda: tok.encode(text * 2), "a custom regex, 2x the text", limit=3.0)
    assert twice <= 3.0


def _ranks_file(n: int) -> bytes:
    """A well-formed ranks file of n tokens: the 256 bytes, then 4-byte tokens."""
    tokens = [bytes([i]) for i in range(256)] + [b"t" + i.to_bytes(3, "big") for i in range(n - 256)]
    return b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(tokens))


def test_loading_a_ranks_file_is_linear():
    """A ranks file as `get_encoding` and `Tokenizer.load` load it (the encoder built from the
    file's bytes), by tests/growth_check.py's measure, on the process's CPU time: the build runs
    on three threads. (Through a `{token: id}` dict the ratio is also CPython's dict leaving the
    caches: 15-17x for 8x the tokens, a dict copy alone included.) 100,000 tokens against 800,000:
    both builds' tables are past the core's caches (from 25,000, whose tables the caches held,
    the ratio was 13-18x on a loaded 2-core machine, against 7-15x from 100,000 with 5 repeats
    and 10-13x with 9, beside two busy loops)."""
    small, big = _ranks_file(100_000), _ranks_file(100_000 * FACTOR)

    def load(data: bytes) -> Tokenizer:
        tok = Tokenizer(RanksFile(data, "ranks"), "cl100k", {})
        assert tok._ranks is None  # the encoder made from the file, no dict
        return tok

    assert load(small).vocab_size == 100_000 and load(big).encode("t") == [ord("t")]
    assert (
        growth(lambda: load(small), lambda: load(big), "load a ranks file", repeats=9, clock=time.process_time) <= LIMIT
    )


def test_the_fast_ranks_parser_agrees_with_the_line_parser_and_names_bad_lines():
    data = _ranks_file(5000).replace(b"\n", b"\r\n", 7) + b"\n  \n"
    assert parse_tiktoken_ranks(data, "r") == _parse_ranks_lines(data, "r")
    lines = _ranks_file(3000).splitlines(keepends=True)
    for bad, message in [
        (b"AAAA 12 13\n", "r:2001: expected 'base64-token rank'"),
        (b"A=== 12\n", "r:2001: cannot parse"),
        (b"QUJD +12\n", "r:2001: cannot parse"),
        (b"QUJD 99999999\n", "r:2001: rank 99999999 is outside"),
        (lines[10], "r:2001: token .* appears twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_tiktoken_ranks(b"".join(lines[:2000] + [bad] + lines[2000:]), "r")


_RANK_LINE_PARTS = st.sampled_from(
    [b"QUJD", b"YQ==", b"YWE=", b"YR==", b"A===", b"YQ=", b"QU JD", b"====", b"Q!==", b"4oCc", b"/+8=", b"AAAA"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"", b" ", b"\t", b" \t"]),
            _RANK_LINE_PARTS,
            st.sampled_from([b" ", b"\t", b"  ", b"", b"\v"]),
            st.sampled_from([b"0", b"7", b"007", b"4194303", b"4194304", b"99999999999999999999", b"+1", b"-1", b""]),
            st.sampled_from([b"", b" ", b"\t "]),
            st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b" \n", b"\n\r", b"x\n"]),
        ),
        max_size=8,
    ),
    st.booleans(),
)
def test_the_cores_ranks_parser_accepts_what_the_python_parser_accepts(lines, drop_last_newline):
    """The core's parse (the one every load takes) and the Python one give the same ranks, or
    both refuse (None): then the line parser names the bad line."""
    from pipeline_lib.tokenizer import native
    from pipeline_lib.tokenizer.load import _parse_ranks_blocks

    data = b"".join(b"".join(parts) for parts in lines)
    if drop_last_newline:
        data = data.rstrip(b"\n")
    assert native._CORE.parse_ranks(data) == _parse_ranks_blocks(data), data


def test_the_cores_ranks_parser_reads_the_published_files():
    from pipeline_lib.tokenizer import native
    from pipeline_lib.tokenizer.load import _parse_ranks_blocks

    data = _ranks_file(70_000).replace(b"\n", b"\r\n", 300)
    parsed = native._CORE.parse_ranks(data)
    assert parsed is not None and parsed == _parse_ranks_blocks(data) and len(parsed) == 70_000
    assert native._CORE.parse_ranks(data + b"dA== 5\n") is None  # "t" again: a token twice
    assert native._CORE.parse_ranks(data.replace(b" 3\r\n", b" 3 \r\n", 1)) == parsed
    assert native._CORE.parse_ranks(memoryview(data)) == parsed  # any bytes-like object


def test_ids_from_a_loaded_ranks_file_decode():
    tok = Tokenizer(parse_tiktoken_ranks(_ranks_file(1000), "r"), "cl100k", {"<|endoftext|>": 1000})
    assert tok.token_str(1000) == "<|endoftext|>" and tok.token_str(65) == "A"
    ids = np.array(tok.encode("hello", allowed_special="all"))
    assert tok.decode(ids) == "hello"


@pytest.fixture
def eot_tokenizer(tmp_path) -> str:
    saved = str(tmp_path / "eot_tok")
    Tokenizer(BYTE_RANKS, "cl100k", {"<|endoftext|>": 256, "<|pad|>": 257}).save(saved)
    return saved


def test_encode_refuses_a_special_token_before_reading_the_whole_file(tmp_path, eot_tokenizer, capsys):
    """The file is a pipe fed by a thread: a command that read it all would take every byte
    the writer offers; a refusal after the first block leaves the writer on a broken pipe."""
    fifo = str(tmp_path / "big.txt")
    os.mkfifo(fifo)
    offered, written = 256 << 20, [0]

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError), open(fifo, "wb") as f:
            f.write(b"code with <|endoftext|> in a string\n")
            chunk = b"x = 1\n" * (1 << 16)
            while written[0] < offered:
                f.write(chunk)
                written[0] += len(chunk)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    assert (
        main(
            [
                "tokenizer",
                "encode",
                "--tokenizer",
                eot_tokenizer,
                "--input",
                fifo,
                "--output",
                str(tmp_path / "ids.npy"),
            ]
        )
        == 2
    )
    writer.join(timeout=60)
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "'<|endoftext|>' (at byte 10)" in err[0]
        and "--special-as-text" in err[0]
        and "--allow-special" in err[0]
    ), err
    assert written[0] < 64 << 20  # the scan's block and the pipe's buffer, not the 256 MB offered


def test_special_as_text_encodes_special_token_text_as_ordinary_text(tmp_path, eot_tokenizer, capsys):
    tok = Tokenizer.load(eot_tokenizer)
    text = "a <|endoftext|> b <|pad|> c"
    path = tmp_path / "in.txt"
    path.write_text(text)
    out = tmp_path / "ids.npy"
    assert (
        main(
            [
                "tokenizer",
                "encode",
                "--tokenizer",
                eot_tokenizer,
                "--input",
                str(path),
                "--special-as-text",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert np.load(out).tolist() == tok.encode_ordinary(text)
    capsys.readouterr()
    args = [
        "tokenizer",
        "encode",
        "--tokenizer",
        eot_tokenizer,
        "--text",
        text,
        "--special-as-text",
        "--allow-special",
        "<|pad|>",
    ]
    assert main(args) == 0
    printed = [int(i) for i in capsys.readouterr().out.split()]
    assert printed == tok.encode(text, allowed_special={"<|pad|>"}, disallowed_special=())
    assert 257 in printed and 256 not in printed
    assert main(["tokenizer", "encode", "--tokenizer", eot_tokenizer, "--text", text]) == 2
    assert "--special-as-text" in capsys.readouterr().err


def test_the_special_token_scan_finds_a_token_across_a_block_boundary(tmp_path):
    path = tmp_path / "t.txt"
    for at in range(90, 101):
        path.write_bytes(b"y" * at + b"<|endoftext|>" + b"z" * 50)
        assert find_special_in_file(str(path), ["<|endoftext|>", "<|e"], block_bytes=100) == ("<|endoftext|>", at)
    assert find_special_in_file(str(path), ["<|pad|>"], block_bytes=7) is None
