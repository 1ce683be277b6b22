"""Stages: download the sources into a `raw` version, split it into corpus shards.

Both run the library's own functions in `pipeline_lib.corpus`, which publish by themselves
(their code is the corpus stages' code version, so it stays where it is).
"""

from __future__ import annotations

from typing import Any

from pipeline_lib import corpus as corpus_lib
from pipeline_lib.corpus import CORPUS_KIND, RAW_KIND, CorpusConfig
from pipeline_lib.stages.spec import Context, Stage, corpus_shards  # noqa: F401  (re-exported)
from pipeline_lib.store import VersionRef

# The report's corpus: paragraphs, and more shards than the pipeline's, for a held-out part
# per language (the defaults of `tokenmill report` and report_flow).
REPORT_CORPUS = CorpusConfig(n_shards=10, documents="paragraph")

CODE_MODULES = ("pipeline_lib.corpus",)


def _fingerprint(config: CorpusConfig) -> Any:
    assert config.sources is not None  # __post_init__ fills in the default
    fingerprint = corpus_lib.source_fingerprint(config.sources, **config.storage_options)
    # A copied and a referenced raw version of the same sources are different versions.
    return fingerprint if config.source_mode == "copy" else {"reference": fingerprint}


def _download(ctx: Context) -> VersionRef:
    return corpus_lib.download_corpus(ctx.store, ctx.config)


def _shard_params(config: CorpusConfig) -> dict[str, Any]:
    return config.shard_params()


def _shard(ctx: Context) -> VersionRef:
    return corpus_lib.shard_corpus(ctx.store, ctx.inputs["raw"], ctx.config)


# Content-addressed: the raw version's id hashes the bytes it fetched.
DOWNLOAD = Stage(
    name="download_corpus",
    kind=RAW_KIND,
    inputs=(),
    config=CorpusConfig,
    code=CODE_MODULES,
    run=_download,
    params=None,
    fingerprint=_fingerprint,
    publishes=True,
)

SHARD = Stage(
    name="shard_corpus",
    kind=CORPUS_KIND,
    inputs=("raw",),
    config=CorpusConfig,
    code=corpus_lib.SHARD_CODE,
    run=_shard,
    params=_shard_params,
    publishes=True,
)
