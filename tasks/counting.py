"""Prefect tasks: count pieces per corpus shard (mapped), then reduce the counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from prefect import get_run_logger, task, unmapped
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from pipeline_lib import counting, stages
from pipeline_lib.counting import COUNTS_KIND, CountConfig
from pipeline_lib.stages import counts as stage_counts
from pipeline_lib.store import VersionRef
from tasks.common import store_of, to_ref
from tasks.factory import artifact_key, stage_tasks


def _counted(record, logger) -> None:
    pruned = record.get("pruned")
    dropped = f" (pruned below {pruned['threshold']}: {pruned['pieces_dropped']:,} pieces dropped)" if pruned else ""
    logger.info("shard %d: %s distinct pieces%s", record["shard"], f"{record.get('n_pieces', 0):,}", dropped)


def _reduced(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info(
        "counts: %s distinct pieces, %s occurrences (%s pattern)",
        f"{meta['n_pieces']:,}",
        f"{meta['n_occurrences']:,}",
        meta["pattern"],
    )
    pruned = meta.get("pruned")
    if pruned:
        total = meta["n_occurrences"] + pruned["occurrences_dropped"]
        logger.info(
            "pruned mode (--count-min %d): %s pieces and %s occurrences dropped (%.3f%% of them), %d shard(s) over "
            "--count-memory",
            pruned["count_min"],
            f"{pruned['pieces_dropped']:,}",
            f"{pruned['occurrences_dropped']:,}",
            100 * pruned["occurrences_dropped"] / max(1, total),
            pruned["shards_over_budget"],
        )
    create_table_artifact(
        key=artifact_key("word-counts", store, ref),
        table=[
            {
                "shard": r["shard"],
                "docs": r["n_docs"],
                "bytes": r["n_bytes"],
                "pieces": r["n_occurrences"],
                "distinct pieces": r["n_pieces"],
            }
            | ({"pieces dropped": r["pruned"]["pieces_dropped"]} if pruned else {})
            for r in meta["shards"]
        ]
        + [
            {
                "shard": "all",
                "docs": sum(r["n_docs"] for r in meta["shards"]),
                "bytes": sum(r["n_bytes"] for r in meta["shards"]),
                "pieces": meta["n_occurrences"],
                "distinct pieces": meta["n_pieces"],
            }
            | ({"pieces dropped": pruned["pieces_dropped"]} if pruned else {})
        ],
        description=f"Counts {ref.version}: pre-tokenized pieces per corpus shard ({meta['pattern']} pattern)"
        + (
            f"; pruned mode: pieces seen fewer than {pruned['count_min']} times in a shard dropped "
            f"({pruned['pieces_dropped']:,} pieces, {pruned['occurrences_dropped']:,} occurrences)"
            if pruned
            else ""
        ),
    )


@task(
    name="merge_counts",
    cache_policy=NO_CACHE,
    tags=["tokenmill", "stage:merge_counts"],
    task_run_name="merge_counts[level={level}, merge={k}]",
)
def merge_counts(
    store_url: str, corpus: VersionRef, config: CountConfig, level: int, k: int, storage_options: dict | None = None
) -> dict:
    """One merge of the counts tree (skipped when done: the merges resume one by one)."""
    record = stage_counts.merge_counts(store_of(store_url, storage_options), to_ref(corpus), config, level, k)
    if record.get("pruned"):
        get_run_logger().info("%s: pruned below %d", record["merge"], record["pruned"]["threshold"])
    return record


def _merge_tree(
    store_url: str, parents: Mapping[str, VersionRef], config: CountConfig, storage_options: dict | None
) -> None:
    """The counts tree's merges, a level at a time, mapped on the flow's task runner (the
    publish does the last merge); none when the counts are published already, and no task
    for a table that goes up a level alone."""
    store, corpus = store_of(store_url, storage_options), to_ref(parents["corpus"])
    if store.usable(COUNTS_KIND, stage_counts.counts_version(corpus, config)):
        return
    for level, merges in enumerate(counting.tree_levels(len(stages.corpus_shards(store, corpus))), start=1):
        ks = [k for k, tables in enumerate(merges) if len(tables) > 1]
        merge_counts.map(
            store_url, unmapped(parents["corpus"]), unmapped(config), level, ks, unmapped(storage_options)
        ).result()


COUNTS = dataclasses.replace(
    stage_tasks(stages.COUNTS, after=_reduced, unit_after=_counted), before_publish=_merge_tree
)
count_words, reduce_counts = COUNTS.unit_task, COUNTS.task
