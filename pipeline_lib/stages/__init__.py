"""The pipeline's stages: one `Stage` spec per module, one engine (`spec`) that runs them.
No Prefect here.

Each stage reads its inputs by `VersionRef`, writes one versioned output and returns its
ref. A stage whose output version already exists returns at once; mapped stages (one
unit per shard) write into the output's staging area with a completion marker per shard,
so a killed run resumes with the shards it had not finished.

    download_corpus -> shard_corpus -> count_words* -> reduce_counts -> learn_merges
        -> encode_shard* -> write_token_manifest -> train_lm

    corpus.py     DOWNLOAD, SHARD      download_corpus, shard_corpus (pipeline_lib.corpus does the work)
    counts.py     COUNTS               count_shard per shard, reduce_counts
    tokenizer.py  TOKENIZER            learn_tokenizer
    tokens.py     TOKENS               encode_shard per shard, publish_tokens
    lm.py         LM                   train_lm (imported on its own: it pulls in torch)

The functions below (count_shard, reduce_counts, learn_tokenizer, ...) are the library's
API for these stages; each is one call into the engine with its stage's spec.
"""

from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.counting import CountConfig
from pipeline_lib.stages.corpus import (
    DOWNLOAD,
    REPORT_CORPUS,
    SHARD,
    corpus_shards,
    download_corpus,
    shard_corpus,
    shard_sources,
)
from pipeline_lib.stages.counts import COUNTS, count_shard, counts_version, reduce_counts
from pipeline_lib.stages.spec import Context, Identified, Output, Stage, Units, produce, run_unit
from pipeline_lib.stages.tokenizer import (
    TOKENIZER,
    TOKENIZER_KIND,
    TokenizerConfig,
    learn_tokenizer,
    load_tokenizer,
    tokenizer_files,
    tokenizer_version,
)
from pipeline_lib.stages.tokens import (
    TOKENS,
    compression_summary,
    encode_shard,
    publish_tokens,
    shard_table,
    tokens_version,
)
from pipeline_lib.token_shards import EncodeConfig

__all__ = [
    "COUNTS",
    "DOWNLOAD",
    "REPORT_CORPUS",
    "SHARD",
    "TOKENIZER",
    "TOKENIZER_KIND",
    "TOKENS",
    "Context",
    "CorpusConfig",
    "CountConfig",
    "EncodeConfig",
    "Identified",
    "Output",
    "Stage",
    "TokenizerConfig",
    "Units",
    "compression_summary",
    "corpus_shards",
    "count_shard",
    "counts_version",
    "download_corpus",
    "encode_shard",
    "learn_tokenizer",
    "load_tokenizer",
    "produce",
    "publish_tokens",
    "reduce_counts",
    "run_unit",
    "shard_corpus",
    "shard_sources",
    "shard_table",
    "tokenizer_files",
    "tokenizer_version",
    "tokens_version",
]
