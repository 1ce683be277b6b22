"""Prefect tasks: download the corpus into the store, then shard it."""

from __future__ import annotations

from pipeline_lib import corpus as corpus_lib
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


def _group_sharded(record, logger) -> None:
    shards = [s for s in record.get("shards", []) if isinstance(s, dict)]
    if not shards:  # a group already published (cached), or one without documents
        return
    balance = corpus_lib.shard_balance(shards)
    names = [s["name"] for s in record["sources"]]
    span = record["sources"][0].get("range") if len(names) == 1 else None  # a range of a large source
    logger.info(
        "source group %d (%s%s): %d source(s), %s bytes -> %d shards; %s",
        record["group"],
        names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}",
        f", {span}" if span else "",
        len(record["sources"]),
        f"{record['stats']['bytes']:,}",
        len(shards),
        corpus_lib.format_balance(balance),
    )


# Retries are for a flaky source (a dropped connection, a timeout), not a bad one.
DOWNLOAD = stage_tasks(stages.DOWNLOAD, after=_downloaded, retries=2)
SHARD = stage_tasks(stages.SHARD, after=_sharded, unit_after=_group_sharded)
download_corpus, shard_corpus, shard_sources = DOWNLOAD.task, SHARD.task, SHARD.unit_task
