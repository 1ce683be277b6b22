"""Prefect tasks: count pieces per corpus shard (mapped), then reduce the counts."""

from __future__ import annotations

from prefect.artifacts import create_table_artifact

from pipeline_lib import stages
from tasks.factory import artifact_key, stage_tasks


def _counted(record, logger) -> None:
    logger.info("shard %d: %s distinct pieces", record["shard"], f"{record.get('n_pieces', 0):,}")


def _reduced(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info("counts: %s distinct pieces, %s occurrences (%s pattern)", f"{meta['n_pieces']:,}", f"{meta['n_occurrences']:,}", meta["pattern"])
    create_table_artifact(
        key=artifact_key("word-counts", store, ref),
        table=[
            {"shard": r["shard"], "docs": r["n_docs"], "bytes": r["n_bytes"], "pieces": r["n_occurrences"], "distinct pieces": r["n_pieces"]}
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
        ],
        description=f"Counts {ref.version}: pre-tokenized pieces per corpus shard ({meta['pattern']} pattern)",
    )


COUNTS = stage_tasks(stages.COUNTS, after=_reduced, unit_after=_counted)
count_words, reduce_counts = COUNTS.unit_task, COUNTS.task
