"""Stages: download the sources into a `raw` version, split it into corpus shards.

The work is `pipeline_lib.corpus`'s (fetching, hashing, reading, sharding); these specs
hand its staged files to the engine, which versions, claims and publishes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from pipeline_lib import corpus as corpus_lib
from pipeline_lib.corpus import CORPUS_KIND, RAW_KIND, CorpusConfig
from pipeline_lib.stages import spec
from pipeline_lib.stages.spec import Context, Identified, Output, Stage, corpus_shards  # noqa: F401  (re-exported)
from pipeline_lib.store import ArtifactStore, VersionRef

# The report's corpus: paragraphs, and more shards than the pipeline's, for a held-out part
# per language (the defaults of `tokenmill report` and report_flow).
REPORT_CORPUS = CorpusConfig(n_shards=10, documents="paragraph")


def _fingerprint(config: CorpusConfig) -> Any:
    assert config.sources is not None  # __post_init__ fills in the default
    fingerprint = corpus_lib.source_fingerprint(config.sources, **config.storage_options)
    # A copied and a referenced raw version of the same sources are different versions.
    return fingerprint if config.source_mode == "copy" else {"reference": fingerprint}


@contextlib.contextmanager
def _identify_raw(ctx: Context) -> Iterator[Identified]:
    if ctx.config.source_mode == "reference":
        params, meta = corpus_lib.reference_sources(ctx.config)
        yield Identified(params, {"meta": meta})
    else:
        with corpus_lib.fetch_sources(ctx.store, ctx.config) as (params, fetched):
            yield Identified(params, {"fetched": fetched})


def _download(ctx: Context) -> Output:
    assert ctx.staging is not None  # the engine publishes this stage
    if "meta" in ctx.found:  # referenced in place: no files
        return Output(files={}, meta=ctx.found["meta"])
    files, meta = corpus_lib.stage_sources(ctx.staging, ctx.found["fetched"], ctx.config)
    return Output(files=files, meta=meta)


def _shard_params(config: CorpusConfig) -> dict[str, Any]:
    return config.shard_params()


def _shard(ctx: Context) -> Output:
    assert ctx.staging is not None  # the engine publishes this stage
    files, meta = corpus_lib.write_shards(ctx.store, ctx.staging, ctx.inputs["raw"], ctx.config)
    return Output(files=files, meta=meta)


# Content-addressed: the raw version's id hashes the bytes it fetched.
DOWNLOAD = Stage(
    name="download_corpus",
    kind=RAW_KIND,
    inputs=(),
    config=CorpusConfig,
    output_version=1,
    run=_download,
    params=None,
    identify=_identify_raw,
    fingerprint=_fingerprint,
)

SHARD = Stage(
    name="shard_corpus",
    kind=CORPUS_KIND,
    inputs=("raw",),
    config=CorpusConfig,
    output_version=1,
    run=_shard,
    params=_shard_params,
)


def download_corpus(store: ArtifactStore, config: CorpusConfig) -> VersionRef:
    """Copy the sources into the store as a `raw` version, content-addressed by their
    sha256 (or, with ``source_mode="reference"``, record them to be read in place)."""
    return spec.produce(DOWNLOAD, store, {}, config)


def shard_corpus(store: ArtifactStore, raw: VersionRef, config: CorpusConfig) -> VersionRef:
    """Split a `raw` version into Parquet corpus shards (`pipeline_lib.corpus.write_shards`)."""
    return spec.produce(SHARD, store, {"raw": raw}, config)
