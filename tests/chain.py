"""The chain through the stages with no Prefect, as `tokenmill run --no-lm` makes it: a
published tokens version for tests that need one (exports, splits, verified reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline_lib import stages
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.store import ArtifactStore, VersionRef
from pipeline_lib.token_shards import EncodeConfig


def publish_tokens_version(
    root: Path, text: str, vocab_size: int, n_shards: int = 2
) -> tuple[ArtifactStore, VersionRef, Any]:
    """`text` as a corpus of `n_shards` shards under `root`, counted, a tokenizer of
    `vocab_size` learned, encoded and published: (store, tokens ref, tokenizer ref)."""
    store = ArtifactStore(str(root / "store"))
    src = root / "c.txt"
    src.write_text(text)
    cfg = CorpusConfig(sources=(str(src),), n_shards=n_shards)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    cc = stages.CountConfig()
    for i in range(n_shards):
        stages.count_shard(store, corpus, i, cc)
    tok = stages.learn_tokenizer(
        store, stages.reduce_counts(store, corpus, cc), stages.TokenizerConfig(vocab_size=vocab_size)
    )
    ec = EncodeConfig()
    for i in range(n_shards):
        stages.encode_shard(store, corpus, tok, i, ec)
    return store, stages.publish_tokens(store, corpus, tok, ec), tok
