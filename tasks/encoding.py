"""Prefect tasks: encode each corpus shard into token arrays (mapped), then publish them."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from pipeline_lib import stages
from pipeline_lib.token_shards import TOKENS_KIND, EncodeConfig
from tasks.common import checked_key, progress, ref_dict, staging_kept, store_of, to_ref


def _encode_key(context, parameters: dict[str, Any]) -> str:
    corpus, tok, cfg = to_ref(parameters["corpus"]), to_ref(parameters["tokenizer"]), parameters["config"]
    version = stages.tokens_version(corpus, tok, cfg)
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    unit = f"shard_{parameters['shard']:06d}"
    present = store.usable(TOKENS_KIND, version) or store.stage(TOKENS_KIND, version).done(unit) is not None
    return checked_key(store, f"encode-{version}-{unit}", present)


@task(name="encode_shard", cache_key_fn=_encode_key, persist_result=True, result_serializer="json")
def encode_shard(store_url: str, corpus: dict[str, str], tokenizer: dict[str, str], shard: int, config: EncodeConfig, storage_options: dict | None = None) -> dict[str, Any]:
    record = stages.encode_shard(store_of(store_url, storage_options), to_ref(corpus), to_ref(tokenizer), shard, config)
    if "n_tokens" in record:
        get_run_logger().info("shard %d: %s tokens for %s bytes", shard, f"{record['n_tokens']:,}", f"{record['n_bytes']:,}")
    progress("encode_shard (shards)", advance=1, total=len(stages.corpus_shards(store_of(store_url, storage_options), to_ref(corpus))))
    return record


def _manifest_key(context, parameters: dict[str, Any]) -> str:
    corpus, tok, cfg = to_ref(parameters["corpus"]), to_ref(parameters["tokenizer"]), parameters["config"]
    version = stages.tokens_version(corpus, tok, cfg)
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    return checked_key(store, f"tokens-{version}", store.usable(TOKENS_KIND, version))


@task(name="write_token_manifest", cache_key_fn=_manifest_key, persist_result=True, result_serializer="json")
def write_token_manifest(store_url: str, corpus: dict[str, str], tokenizer: dict[str, str], config: EncodeConfig, shard_records: list[dict] | None = None, storage_options: dict | None = None) -> dict[str, str]:
    store = store_of(store_url, storage_options)
    with staging_kept(store, TOKENS_KIND, stages.tokens_version(to_ref(corpus), to_ref(tokenizer), config), shard_records):
        ref = stages.publish_tokens(store, to_ref(corpus), to_ref(tokenizer), config)
    meta = store.manifest(ref.kind, ref.version)["meta"]
    summary = stages.compression_summary(meta)
    get_run_logger().info(
        "tokens: %s in %d shards (%s), %.3f bytes/token -> %s",
        f"{meta['totals']['n_tokens']:,}", len(meta["shards"]), meta["dtype"], summary["bytes_per_token"], ref.uri,
    )
    create_table_artifact(
        key="token-shards",
        table=stages.shard_table(meta),
        description=f"Token shards {ref.version}: per-shard documents, bytes, tokens and compression",
    )
    return ref_dict(ref)
