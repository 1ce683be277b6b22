"""Stages: download the sources into a `raw` version, split it into corpus shards.

The work is `pipeline_lib.corpus`'s (fetching, hashing, reading, sharding); these specs
hand its staged files to the engine, which versions, claims and publishes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline_lib import corpus as corpus_lib
from pipeline_lib import source_ranges
from pipeline_lib.corpus import CORPUS_KIND, RAW_KIND, CorpusConfig
from pipeline_lib.stages import spec
from pipeline_lib.stages.spec import Context, Identified, Output, Stage, Units, corpus_shards  # noqa: F401  (re-exported)
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


def _shard_group(ctx: Context) -> dict[str, Any]:
    assert ctx.staging is not None and ctx.index is not None  # set for a unit of work
    # "shard": the unit's index, as every unit record has it (the engine's done-record name).
    return {"shard": ctx.index} | corpus_lib.shard_group(
        ctx.store, ctx.staging, ctx.inputs["raw"], ctx.config, ctx.index
    )


def _group_count(store: ArtifactStore, inputs: Mapping[str, VersionRef], config: CorpusConfig) -> int:
    return len(corpus_lib.corpus_groups(store, inputs["raw"], config))


def _group_bytes(store: ArtifactStore, inputs: Mapping[str, VersionRef], config: CorpusConfig) -> list[int]:
    return [unit.n_bytes for unit in source_ranges.corpus_units(store, inputs["raw"], config)]


def _group_labels(store: ArtifactStore, inputs: Mapping[str, VersionRef], config: CorpusConfig) -> list[str]:
    return source_ranges.unit_labels(store, inputs["raw"], config)


def _publish_shards(ctx: Context) -> Output:
    assert ctx.staging is not None  # the engine publishes this stage
    files, meta = corpus_lib.publish_shards(ctx.inputs["raw"], ctx.records, ctx.config, ctx.staging.version)
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

# Mapped: one unit per source group (`CorpusConfig.source_group_bytes`) or range of a large
# source (`pipeline_lib.source_ranges`), each writing its own shards; the publish lists them in order.
SHARD = Stage(
    name="shard_corpus",
    kind=CORPUS_KIND,
    inputs=("raw",),
    config=CorpusConfig,
    output_version=1,
    run=_publish_shards,
    params=_shard_params,
    units=Units(name="shard_sources", run=_shard_group, count=_group_count, sizes=_group_bytes, labels=_group_labels),
)


def download_corpus(store: ArtifactStore, config: CorpusConfig) -> VersionRef:
    """Copy the sources into the store as a `raw` version, content-addressed by their
    sha256 (or, with ``source_mode="reference"``, record them to be read in place)."""
    return spec.produce(DOWNLOAD, store, {}, config)


def shard_sources(store: ArtifactStore, raw: VersionRef, group: int, config: CorpusConfig) -> dict[str, Any]:
    """Shard one source group into the corpus version's staging area (skips a finished group)."""
    return spec.run_unit(SHARD, store, {"raw": raw}, config, group)


def shard_corpus(store: ArtifactStore, raw: VersionRef, config: CorpusConfig) -> VersionRef:
    """Split a `raw` version into Parquet corpus shards: every source group not done yet
    (`pipeline_lib.corpus.shard_group`, one after the other here; the flow maps them),
    then the publish."""
    for group in range(spec.unit_count(SHARD, store, {"raw": raw}, config)):
        shard_sources(store, raw, group, config)
    return spec.produce(SHARD, store, {"raw": raw}, config)
