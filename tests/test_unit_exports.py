"""Char- and word-level tokenizers (and byte-level ones with no split or a custom regex) out to
HF ``tokenizers`` and transformers with our ids, and clear refusals from the formats that hold
byte-level BPE only (GPT-2's files, tiktoken)."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.fsio import InputError
from pipeline_lib.tokenizer import Tokenizer
from pipeline_lib.tokenizer.export import hf_json, tiktoken_ranks_file

EOT = "<|endoftext|>"
# Characters tiny Shakespeare lacks: <unk>, or byte fallback over one, two, three and four bytes.
UNSEEN = "héllo wörld — 日本語 ☃ 😀 x\u00a0y\x1cz\t"

# (unit, pattern, unknown, lowercase, vocab_size): each unit, both unknown policies, the three kinds of
# pattern; byte-level with a named pattern is test_exports.py's
VARIANTS = [
    ("char", "none", "unk", False, 301),
    ("char", "none", "bytes", False, 600),
    ("char", "gpt2", "unk", False, 400),
    ("char", r"\w+", "bytes", False, 500),
    ("word", "none", "unk", False, 300),
    ("word", "none", "bytes", True, 700),
    ("byte", "none", None, False, 400),
    ("byte", r"\w+", None, False, 400),
]


@pytest.fixture(scope="module")
def corpus(shakespeare_text) -> str:
    return shakespeare_text[:200_000]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: "-".join(map(str, v)))
def exported(request, corpus):
    """A trained tokenizer of one variant and its HF tokenizer loaded from our JSON."""
    import tokenizers

    unit, pattern, unknown, lowercase, vocab_size = request.param
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # word units on 200 kB reach fewer ids than asked: fine here
        tok = Tokenizer.train([corpus], vocab_size, pattern=pattern, unit=unit, unknown=unknown, lowercase=lowercase)
    return tok, tokenizers.Tokenizer.from_str(json.dumps(hf_json(tok)))


def assert_same(tok: Tokenizer, hf, text: str) -> None:
    ours = tok.encode(text, allowed_special="all")
    assert hf.encode(text, add_special_tokens=False).ids == ours, text
    assert hf.decode(ours, skip_special_tokens=False) == tok.decode(ours), text


def test_hf_gives_our_ids_on_the_corpus_and_unseen_characters(exported, corpus):
    import tokenizers

    tok, hf = exported
    assert hf.get_vocab_size() == tok.vocab_size
    for name, i in tok.special_tokens.items():
        assert hf.token_to_id(name) == i
    assert_same(tok, hf, corpus[:50_000])
    assert_same(tok, hf, f"{UNSEEN} To be{EOT}or not")
    # a vocabulary loaded without its merge list exports the same way
    ranks_only = Tokenizer(
        tok.mergeable_ranks,
        tok.pattern,
        tok.special_tokens,
        unit=tok.unit,
        unknown=tok.unknown,
        lowercase=tok.lowercase,
    )
    assert tokenizers.Tokenizer.from_str(json.dumps(hf_json(ranks_only))).encode(corpus[:20_000]).ids == tok.encode(
        corpus[:20_000]
    )
    ids = tok.encode(UNSEEN)
    if tok.unknown == "unk":  # byte-level: None
        assert tok.special_tokens["<unk>"] in ids
    else:
        assert tok.decode(ids) == (" ".join(UNSEEN.lower().split()) + " " if tok.unit == "word" else UNSEEN)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_hf_gives_our_ids_on_text_from_the_training_alphabet(exported, corpus, data):
    tok, hf = exported
    alphabet = sorted(set(corpus[:20_000]))
    text = data.draw(
        st.text(st.sampled_from(alphabet), max_size=80) | st.text(st.sampled_from([*alphabet, *UNSEEN]), max_size=40)
    )
    assert_same(tok, hf, text)


def test_transformers_loads_char_and_word_exports(tmp_path, corpus):
    from transformers import AutoTokenizer

    text = f"First Citizen: Before we proceed any further, hear me speak.{EOT}日本"
    for unit in ("char", "word"):
        tok = Tokenizer.train([corpus], 300, unit=unit, pattern="none")
        tok.to_transformers(str(tmp_path / unit), 512)
        auto = AutoTokenizer.from_pretrained(str(tmp_path / unit))
        ours = tok.encode(text, allowed_special="all")
        assert auto(text)["input_ids"] == ours and auto.encode(text) == ours
        assert auto.unk_token == "<unk>" and auto.unk_token_id == tok.special_tokens["<unk>"]
        assert auto.eos_token_id == tok.eot_token
        assert auto.decode(ours) == tok.decode(ours)


def test_byte_level_formats_refuse_char_and_word(tmp_path, corpus):
    for unit in ("char", "word"):
        tok = Tokenizer.train([corpus[:20_000]], 100, unit=unit, pattern="none")
        refusal = f"cannot carry a {unit}-level tokenizer.*--format hf or --format transformers"
        with pytest.raises(InputError, match=refusal):
            tok.to_gpt2(str(tmp_path / "x"))
        with pytest.raises(InputError, match=refusal):
            tok.to_tiktoken()
        with pytest.raises(InputError, match=refusal):
            tiktoken_ranks_file(tok)
    words = Tokenizer.train([corpus[:20_000]], 100, unit="word", pattern="gpt2")
    for export in (words.to_hf_json, words.to_transformers):
        with pytest.raises(InputError, match="splits words with --pattern 'gpt2'.*--pattern none"):
            export(str(tmp_path / "y"))
    not_utf8 = Tokenizer.train([b"a\xffa\xff"], 5, unit="char", pattern="none", special_tokens=())
    assert b"a\xff" in not_utf8.mergeable_ranks
    with pytest.raises(InputError, match=r"token b'a\\xff' .* not UTF-8"):
        not_utf8.to_hf_json(str(tmp_path / "z"))


def test_cli_exports_char_and_word_and_refuses_byte_level_formats(tmp_path, corpus, capsys):
    from transformers import AutoTokenizer

    from flows.cli import main

    text = "Speak, speak. 日本"
    for unit in ("char", "word"):
        tok = Tokenizer.train([corpus], 120, unit=unit, pattern="none")
        saved = str(tmp_path / unit)
        tok.save(saved)
        export = ["tokenizer", "export", "--tokenizer", saved, "--out"]
        assert main([*export, str(tmp_path / f"{unit}.json"), "--format", "hf"]) == 0
        assert main([*export, str(tmp_path / f"{unit}-tf"), "--format", "transformers"]) == 0
        hf = json.loads((tmp_path / f"{unit}.json").read_text())
        assert hf == hf_json(tok) and len(hf["model"]["vocab"]) == 120
        assert AutoTokenizer.from_pretrained(str(tmp_path / f"{unit}-tf")).encode(text) == tok.encode(text)
        capsys.readouterr()
        assert main([*export, str(tmp_path / "gpt2"), "--format", "gpt2"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"tokenmill: error: GPT-2's vocab.json + merges.txt cannot carry a {unit}-level tokenizer: it holds "
            "byte-level BPE only;"
            " export this one with --format hf or --format transformers (to_hf_json / to_transformers)"
        ]
