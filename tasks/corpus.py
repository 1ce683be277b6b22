"""Prefect tasks: download the corpus into the store, then shard it."""

from __future__ import annotations

from pipeline_lib import stages
from tasks.factory import stage_tasks


def _downloaded(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info("corpus: %d source(s), %s bytes -> %s", len(meta["sources"]), f"{meta['n_bytes']:,}", ref.uri)


def _sharded(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info(
        "sharded %s documents (%s bytes) into %d shards; %d replaced, %d skipped for invalid UTF-8",
        f"{meta['n_docs']:,}",
        f"{meta['n_bytes']:,}",
        len(meta["shards"]),
        meta["replaced_documents"],
        meta["skipped_documents"],
    )


# Retries are for a flaky source (a dropped connection, a timeout), not a bad one.
DOWNLOAD = stage_tasks(stages.DOWNLOAD, after=_downloaded, retries=2)
SHARD = stage_tasks(stages.SHARD, after=_sharded)
download_corpus, shard_corpus = DOWNLOAD.task, SHARD.task
