"""Prefect tasks: download the corpus into the store, then shard it."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from prefect import get_run_logger, task

from pipeline_lib import corpus as corpus_lib
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.fsio import InputError
from pipeline_lib.store import version_id
from pipeline_lib.version import code_version
from tasks.common import checked_key, ref_dict, retry_if_transient, store_of, to_ref


def _download_key(context, parameters: dict[str, Any]) -> str:
    cfg: CorpusConfig = parameters["config"]
    try:
        fingerprint = corpus_lib.source_fingerprint(cfg.sources, **cfg.storage_options)
    except InputError:
        return f"download-unreachable-{uuid.uuid4().hex}"  # the task itself reports the problem
    key = hashlib.sha256(json.dumps([fingerprint, code_version("pipeline_lib.corpus")], sort_keys=True).encode()).hexdigest()[:20]
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    present = any(m["meta"].get("fingerprint") == fingerprint for m in store.list(corpus_lib.RAW_KIND))
    return checked_key(store, f"download-{key}", present)


# Retries are for a flaky source (a dropped connection, a timeout), not a bad one.
@task(name="download_corpus", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_if_transient, cache_key_fn=_download_key, persist_result=True, result_serializer="json")
def download_corpus(store_url: str, config: CorpusConfig, storage_options: dict | None = None) -> dict[str, str]:
    logger = get_run_logger()
    store = store_of(store_url, storage_options)
    ref = corpus_lib.download_corpus(store, config)
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info("corpus: %d source(s), %s bytes -> %s", len(meta["sources"]), f"{meta['n_bytes']:,}", ref.uri)
    return ref_dict(ref)


def _shard_key(context, parameters: dict[str, Any]) -> str:
    raw = to_ref(parameters["raw"])
    cfg: CorpusConfig = parameters["config"]
    version = version_id(corpus_lib.CORPUS_KIND, {"raw": raw.key}, cfg.shard_params(), code_version("pipeline_lib.corpus"))
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    return checked_key(store, f"shard-{version}", store.usable(corpus_lib.CORPUS_KIND, version))


@task(name="shard_corpus", cache_key_fn=_shard_key, persist_result=True, result_serializer="json")
def shard_corpus(store_url: str, raw: dict[str, str], config: CorpusConfig, storage_options: dict | None = None) -> dict[str, str]:
    logger = get_run_logger()
    store = store_of(store_url, storage_options)
    ref = corpus_lib.shard_corpus(store, to_ref(raw), config)
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info(
        "sharded %s documents (%s bytes) into %d shards; %d replaced, %d skipped for invalid UTF-8",
        f"{meta['n_docs']:,}", f"{meta['n_bytes']:,}", len(meta["shards"]), meta["replaced_documents"], meta["skipped_documents"],
    )
    return ref_dict(ref)
