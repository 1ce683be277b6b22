"""Prefect tasks: encode each corpus shard into token arrays (mapped), then publish them."""

from __future__ import annotations

from prefect.artifacts import create_table_artifact

from pipeline_lib import stages
from tasks.factory import artifact_key, stage_tasks


def _encoded(record, logger) -> None:
    if "n_tokens" in record:
        logger.info(
            "shard %d: %s tokens for %s bytes", record["shard"], f"{record['n_tokens']:,}", f"{record['n_bytes']:,}"
        )


def _published(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    summary = stages.compression_summary(meta)
    logger.info(
        "tokens: %s in %d shards (%s), %.3f bytes/token -> %s",
        f"{meta['totals']['n_tokens']:,}",
        len(meta["shards"]),
        meta["dtype"],
        summary["bytes_per_token"],
        ref.uri,
    )
    create_table_artifact(
        key=artifact_key("token-shards", store, ref),
        table=stages.shard_table(meta),
        description=f"Token shards {ref.version}: per-shard documents, bytes, tokens and compression",
    )


TOKENS = stage_tasks(stages.TOKENS, after=_published, unit_after=_encoded)
encode_shard, write_token_manifest = TOKENS.unit_task, TOKENS.task
