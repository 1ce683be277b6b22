"""The tokenizer report: prefix-consistent truncation, fertility, the published report version."""

from __future__ import annotations

import json

import pytest

from pipeline_lib import ArtifactStore, Tokenizer
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.report import (
    char_level_curve,
    compression_curve,
    fertility,
    stop_reason,
    tokenizer_report,
    truncate,
    udhr_sections,
)
from pipeline_lib.stages import download_corpus, shard_corpus
from pipeline_lib.tokenizer import count_documents


def test_truncated_tokenizer_equals_training_at_that_size(shakespeare_text):
    text = shakespeare_text[:200_000]
    big = Tokenizer.train([text], 1500, special_tokens=())
    small = Tokenizer.train([text], 700, special_tokens=())
    cut = truncate(big, 700)
    assert cut.mergeable_ranks == small.mergeable_ranks
    sample = shakespeare_text[-3000:]
    assert cut.encode(sample) == small.encode(sample)


def test_truncating_a_character_level_tokenizer_equals_training_at_that_size(shakespeare_text):
    text = shakespeare_text[:100_000]
    big = Tokenizer.train([text], 600, unit="char", pattern="none", special_tokens=())
    small = Tokenizer.train([text], 200, unit="char", pattern="none", special_tokens=())
    cut = truncate(big, 200)
    assert (
        cut.mergeable_ranks == small.mergeable_ranks
        and cut.special_tokens == small.special_tokens
        and cut.vocab_size == 200
    )
    assert cut.merge_counts == small.merge_counts
    assert cut.encode(shakespeare_text[-3000:]) == small.encode(shakespeare_text[-3000:])


def test_a_size_the_corpus_cannot_reach_is_said_with_the_reason():
    text = "the cat sat on the mat. " * 50
    pieces, counts = count_documents([text.encode()], "gpt2", workers=1).to_arrays()
    with pytest.warns(UserWarning, match="the corpus gave only 12 merges"):
        tok = Tokenizer.train(dict(zip(pieces, counts.tolist())), 5000, pattern="gpt2", special_tokens=())
    assert tok.vocab_size < 5000
    reason = stop_reason(tok, pieces)
    assert (
        f"each of the corpus's {len(pieces)} distinct pieces is one token" in reason
        and (f"after {len(tok.merges)} merges") in reason
    )
    rows = {r["vocab_size"]: r for r in compression_curve(tok, text, [256, 260, 5000], reason)}
    assert rows[260]["reached"] == 260 and rows[260]["tokens"] == len(truncate(tok, 260).encode(text))
    assert rows[5000]["reached"] == tok.vocab_size and rows[5000]["tokens"] is None and rows[5000]["note"] == reason
    char = char_level_curve([text.encode()], text, [10, 300, 5000])
    assert char["base_vocab"] == len(set(text))
    below, at300, above = char["compression"]
    assert below["tokens"] is None and "alone are" in below["note"]
    assert above["tokens"] is None and above["reached"] < 5000 and "no pair is left" in above["note"]
    assert at300["tokens"] is None and at300["reached"] == above["reached"]  # the whole text became one token first


def test_compression_grows_with_vocabulary(shakespeare_text):
    tok = Tokenizer.train([shakespeare_text[:300_000]], 2048, special_tokens=())
    rows = compression_curve(tok, shakespeare_text[-50_000:], [256, 512, 1024, 2048])
    cpt = [r["chars_per_token"] for r in rows]
    assert cpt[0] == 1.0 and cpt[1] == 1.0  # character level, then bytes (ASCII text)
    assert cpt[1] < cpt[2] < cpt[3] < cpt[4]


def test_udhr_sections_and_fertility(multilingual_text, shakespeare_text):
    sections = udhr_sections(multilingual_text)
    assert len(sections) == 39
    assert sections["eng English"].startswith("Universal Declaration of Human Rights")
    tok = Tokenizer.train([shakespeare_text], 2048, special_tokens=())
    rows = fertility(tok, sections)
    by_name = {r["text"]: r for r in rows}
    # An English-trained vocabulary fits English best: fewer tokens per character than Japanese.
    assert by_name["eng English"]["tokens_per_char"] < by_name["jpn Japanese"]["tokens_per_char"]
    assert rows[0]["text"] == "eng English"


def test_report_version(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = CorpusConfig(documents="paragraph", n_shards=4)
    corpus = shard_corpus(store, download_corpus(store, cfg), cfg)
    ref = tokenizer_report(store, corpus, "gpt2", [256, 300, 491, 1024])
    report = json.loads(store.read_bytes(ref.kind, ref.version, "report.json"))
    at = {r["vocab_size"]: r["chars_per_token"] for r in report["compression"]}
    assert 1.8 < at[491] < 2.1  # 235 merges: about the char-level tutorial's 1.93 (65 characters + 235 merges)
    # Character level, measured in this run on the same shards: the characters of the training shards.
    from pipeline_lib.corpus import iter_shard_batches

    shards = store.manifest(corpus.kind, corpus.version)["meta"]["shards"]
    root = store.local_dir(corpus.kind, corpus.version)
    train_chars = {
        c for s in shards[:-1] for batch in iter_shard_batches(f"{root}/{s['file']}") for d in batch for c in d.decode()
    }
    char = report["char_level"]
    assert char["base_vocab"] == len(train_chars) == 65
    char_at = {r["vocab_size"]: r for r in char["compression"]}
    assert 1.8 < char_at[300]["chars_per_token"] < 2.05  # 234 merges and <unk>
    assert char_at[1024]["chars_per_token"] > at[1024]  # no split: merges cross spaces
    md = store.read_bytes(ref.kind, ref.version, "report.md").decode()
    assert "| 300 |" in md and f"{char_at[300]['chars_per_token']:.3f} |" in md
    assert store.read_bytes(ref.kind, ref.version, "compression.png")[:4] == b"\x89PNG"
    assert tokenizer_report(store, corpus, "gpt2", [256, 300, 491, 1024]) == ref  # published once
