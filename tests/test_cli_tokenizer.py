"""`tokenmill tokenizer decode`, parameters refused before any work, and --help in words."""

from __future__ import annotations

import argparse
import io
import json
import re

import numpy as np
import pytest

from flows.cli import _config_classes, build_parser, main
from pipeline_lib import Tokenizer

TEXT = "Hello world, naïve café! 你好 <|endoftext|> end"


@pytest.fixture(scope="module")
def saved(tmp_path_factory, multilingual_text) -> str:
    path = str(tmp_path_factory.mktemp("tok") / "tok")
    Tokenizer.train([multilingual_text[:50_000]], vocab_size=400, pattern="cl100k").save(path)
    return path


def test_decode_ids_from_npy_json_text_and_stdin(saved, tmp_path, capsys, monkeypatch):
    tok = Tokenizer.load(saved)
    ids_npy = tmp_path / "ids.npy"
    assert (
        main(
            [
                "tokenizer",
                "encode",
                "--tokenizer",
                saved,
                "--text",
                TEXT,
                "--allow-special",
                "all",
                "--output",
                str(ids_npy),
            ]
        )
        == 0
    )
    ids = np.load(ids_npy).tolist()
    assert ids == tok.encode(TEXT, allowed_special="all")
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)) + "\n")
    capsys.readouterr()
    for source in (
        ["--input", str(ids_npy)],
        ["--input", str(tmp_path / "ids.json")],
        ["--input", str(tmp_path / "ids.txt")],
        ["--ids", ",".join(map(str, ids))],
    ):
        assert main(["tokenizer", "decode", "--tokenizer", saved, *source]) == 0
        assert capsys.readouterr().out == TEXT + "\n", source
    monkeypatch.setattr("sys.stdin", io.StringIO(" ".join(map(str, ids))))
    assert (
        main(["tokenizer", "decode", "--tokenizer", saved, "--input", "-", "--output", str(tmp_path / "out.txt")]) == 0
    )
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == TEXT


@pytest.mark.parametrize(
    ("source", "content", "message"),
    [
        ("ids.txt", "1 2 x3", "'x3' is not a token id"),
        ("ids.json", '{"a": 1}', "expected a JSON list of integer ids"),
        ("ids.json", "[1, 2.5]", "expected a JSON list of integer ids"),
        ("ids.txt", "1 99999", "token id 99999 is not in this vocabulary"),
        ("missing.txt", None, "no such file"),
    ],
)
def test_decode_bad_ids_are_one_line_naming_the_input(saved, tmp_path, capsys, source, content, message):
    path = tmp_path / source
    if content is not None:
        path.write_text(content)
    assert main(["tokenizer", "decode", "--tokenizer", saved, "--input", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--input {path}" in err[0] and message in err[0], err


def test_decode_refuses_a_float_array(saved, tmp_path, capsys):
    np.save(tmp_path / "f.npy", np.array([1.0, 2.0]))
    assert main(["tokenizer", "decode", "--tokenizer", saved, "--input", str(tmp_path / "f.npy")]) == 2
    assert "one-dimensional integer array" in capsys.readouterr().err


def test_an_out_of_range_vocab_size_is_refused_before_any_stage(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n" * 100)
    store = tmp_path / "store"
    for command in (["run", "--no-lm"], ["tokenizer", "train"]):
        assert main([*command, "--corpus", str(corpus), "--store", str(store), "--vocab-size", "10000000"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1 and err[0].startswith("tokenmill: error: --vocab-size 10000000:") and "4,194,304" in err[0]
        ), err
        assert not store.exists()  # no stage ran: nothing was written


def test_help_groups_are_titled_in_words():
    parser = build_parser()
    titles = [g.title for sub in _subparsers(parser) for g in sub._action_groups]
    names = {cls.__name__ for cls in _config_classes().values()}
    assert not [t for t in titles if t and any(re.search(rf"\b{n}\b", t) for n in names)], titles
    assert "tokenizer options (the vocabulary to learn)" in titles


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _subparsers(sub)
    return out


def test_decode_is_listed_in_the_tokenizer_help(capsys):
    with pytest.raises(SystemExit):
        main(["tokenizer", "--help"])
    assert "decode" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["sweep", "report", "compare"])
def test_out_of_range_vocab_sizes_are_refused_before_any_stage(tmp_path, capsys, command):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n" * 100)
    store = tmp_path / "store"
    args = [command, "--vocab-sizes", "512,9000000", "--corpus", str(corpus)] + (
        ["--store", str(store)] if command != "compare" else []
    )
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--vocab-sizes" in err[0] and "MAX_VOCAB_SIZE" in err[0], err
    assert not store.exists()


@pytest.mark.parametrize("flags", [["--no-special-token"], ["--separator", "<|sep|>"]])
def test_a_separator_the_tokenizer_will_not_have_is_refused_before_any_stage(tmp_path, capsys, flags):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n" * 100)
    store = tmp_path / "store"
    assert main(["run", "--no-lm", "--corpus", str(corpus), "--store", str(store), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--separator" in err[0] and "--special-token" in err[0], err
    assert not store.exists()
