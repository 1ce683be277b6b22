"""Prefect tasks: count pieces per corpus shard (mapped), then reduce the counts."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from pipeline_lib import stages
from pipeline_lib.counting import COUNTS_KIND, CountConfig
from tasks.common import checked_key, progress, ref_dict, staging_kept, store_of, to_ref


def _count_key(context, parameters: dict[str, Any]) -> str:
    corpus, cfg = to_ref(parameters["corpus"]), parameters["config"]
    version = stages.counts_version(corpus, cfg)
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    unit = f"shard_{parameters['shard']:06d}"
    present = store.usable(COUNTS_KIND, version) or store.stage(COUNTS_KIND, version).done(unit) is not None
    return checked_key(store, f"count-{version}-{unit}", present)


@task(name="count_words", cache_key_fn=_count_key, persist_result=True, result_serializer="json")
def count_words(store_url: str, corpus: dict[str, str], shard: int, config: CountConfig, storage_options: dict | None = None) -> dict[str, Any]:
    record = stages.count_shard(store_of(store_url, storage_options), to_ref(corpus), shard, config)
    get_run_logger().info("shard %d: %s distinct pieces", shard, f"{record.get('n_pieces', 0):,}")
    progress("count_words (shards)", advance=1, total=len(stages.corpus_shards(store_of(store_url, storage_options), to_ref(corpus))))
    return record


def _reduce_key(context, parameters: dict[str, Any]) -> str:
    corpus, cfg = to_ref(parameters["corpus"]), parameters["config"]
    version = stages.counts_version(corpus, cfg)
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    return checked_key(store, f"reduce-{version}", store.usable(COUNTS_KIND, version))


@task(name="reduce_counts", cache_key_fn=_reduce_key, persist_result=True, result_serializer="json")
def reduce_counts(store_url: str, corpus: dict[str, str], config: CountConfig, shard_records: list[dict] | None = None, storage_options: dict | None = None) -> dict[str, str]:
    store = store_of(store_url, storage_options)
    with staging_kept(store, COUNTS_KIND, stages.counts_version(to_ref(corpus), config), shard_records):
        ref = stages.reduce_counts(store, to_ref(corpus), config)
    meta = store.manifest(ref.kind, ref.version)["meta"]
    get_run_logger().info("counts: %s distinct pieces, %s occurrences (%s pattern)", f"{meta['n_pieces']:,}", f"{meta['n_occurrences']:,}", meta["pattern"])
    create_table_artifact(
        key="word-counts",
        table=[
            {"shard": r["shard"], "docs": r["n_docs"], "bytes": r["n_bytes"], "pieces": r["n_occurrences"], "distinct pieces": r["n_pieces"]}
            for r in meta["shards"]
        ] + [{"shard": "all", "docs": sum(r["n_docs"] for r in meta["shards"]), "bytes": sum(r["n_bytes"] for r in meta["shards"]), "pieces": meta["n_occurrences"], "distinct pieces": meta["n_pieces"]}],
        description=f"Counts {ref.version}: pre-tokenized pieces per corpus shard ({meta['pattern']} pattern)",
    )
    return ref_dict(ref)
