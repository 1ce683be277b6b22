"""Prefect tasks: count pieces per corpus shard (mapped), then reduce the counts."""

from __future__ import annotations

from prefect.artifacts import create_table_artifact

from pipeline_lib import stages
from tasks.factory import artifact_key, stage_tasks


def _counted(record, logger) -> None:
    pruned = record.get("pruned")
    dropped = f" (pruned below {pruned['threshold']}: {pruned['pieces_dropped']:,} pieces dropped)" if pruned else ""
    logger.info("shard %d: %s distinct pieces%s", record["shard"], f"{record.get('n_pieces', 0):,}", dropped)


def _reduced(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info("counts: %s distinct pieces, %s occurrences (%s pattern)", f"{meta['n_pieces']:,}", f"{meta['n_occurrences']:,}", meta["pattern"])
    pruned = meta.get("pruned")
    if pruned:
        total = meta["n_occurrences"] + pruned["occurrences_dropped"]
        logger.info(
            "pruned mode (--count-min %d): %s pieces and %s occurrences dropped (%.3f%% of them), %d shard(s) over --count-memory",
            pruned["count_min"],
            f"{pruned['pieces_dropped']:,}",
            f"{pruned['occurrences_dropped']:,}",
            100 * pruned["occurrences_dropped"] / max(1, total),
            pruned["shards_over_budget"],
        )
    create_table_artifact(
        key=artifact_key("word-counts", store, ref),
        table=[
            {"shard": r["shard"], "docs": r["n_docs"], "bytes": r["n_bytes"], "pieces": r["n_occurrences"], "distinct pieces": r["n_pieces"]}
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


COUNTS = stage_tasks(stages.COUNTS, after=_reduced, unit_after=_counted)
count_words, reduce_counts = COUNTS.unit_task, COUNTS.task
