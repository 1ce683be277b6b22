"""The tokenizer report: prefix-consistent truncation, fertility, the published report version."""

from __future__ import annotations

import json

from pipeline_lib import ArtifactStore, Tokenizer
from pipeline_lib.corpus import CorpusConfig, download_corpus, shard_corpus
from pipeline_lib.report import compression_curve, fertility, tokenizer_report, truncate, udhr_sections


def test_truncated_tokenizer_equals_training_at_that_size(shakespeare_text):
    text = shakespeare_text[:200_000]
    big = Tokenizer.train([text], 1500, special_tokens=())
    small = Tokenizer.train([text], 700, special_tokens=())
    cut = truncate(big, 700)
    assert cut.mergeable_ranks == small.mergeable_ranks
    sample = shakespeare_text[-3000:]
    assert cut.encode(sample) == small.encode(sample)


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
    assert 1.8 < at[491] < 2.1  # 235 merges: about the seeds' 1.93 with a char-level BPE
    assert store.read_bytes(ref.kind, ref.version, "compression.png")[:4] == b"\x89PNG"
    assert tokenizer_report(store, corpus, "gpt2", [256, 300, 491, 1024]) == ref  # published once
