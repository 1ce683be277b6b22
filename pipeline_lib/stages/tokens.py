"""Stage: encode each corpus shard into token arrays (mapped), then check and publish them."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import asdict
from typing import Any

from pipeline_lib import token_shards
from pipeline_lib.stages import spec
from pipeline_lib.stages.corpus import corpus_shards
from pipeline_lib.stages.spec import Context, Output, Stage, Units
from pipeline_lib.stages.tokenizer import load_tokenizer
from pipeline_lib.store import ArtifactStore, FileInfo, VersionRef
from pipeline_lib.token_shards import TOKENS_KIND, EncodeConfig


def _encode_shard(ctx: Context) -> dict[str, Any]:
    corpus, config, unit, staging = ctx.inputs["corpus"], ctx.config, ctx.unit, ctx.staging
    assert unit is not None and staging is not None and ctx.index is not None  # set for a unit of work
    tok = load_tokenizer(ctx.store, ctx.inputs["tokenizer"])
    info = corpus_shards(ctx.store, corpus)[ctx.index]
    src = ctx.store.local_file(corpus.kind, corpus.version, info["file"])
    names = [f"{unit}.npy", f"{unit}.idx.npy"] + ([f"{unit}.docs.parquet"] if config.doc_table else [])
    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(staging.open_write(n)) for n in names]
        stats = token_shards.encode_shard_file(
            tok, src, tmps[0], tmps[1], config, unit, ctx.index, tmps[2] if config.doc_table else None
        )
    infos = {n: staging.written[n] for n in names}
    return {
        **asdict(stats),
        "shard": ctx.index,
        "sha256": infos[names[0]].sha256,
        "files": {n: asdict(fi) for n, fi in infos.items()},
    }


def _publish(ctx: Context) -> Output:
    corpus, tokenizer, store = ctx.inputs["corpus"], ctx.inputs["tokenizer"], ctx.store
    tmeta = store.manifest(tokenizer.kind, tokenizer.version)["meta"]
    files = {name: FileInfo(**fi) for r in ctx.records for name, fi in r["files"].items()}
    meta = token_shards.build_meta(
        ctx.records,
        tmeta,
        tokenizer.key,
        ctx.config,
        code_version=ctx.code_version,
        corpus_key=corpus.key,
        corpus_meta=store.manifest(corpus.kind, corpus.version)["meta"],
    )
    assert ctx.staging is not None  # the engine publishes this stage
    with tempfile.TemporaryDirectory(prefix="tokens-", dir=store.scratch_dir(TOKENS_KIND)) as tmpdir:
        token_shards.check_shards(ctx.staging.local_dir(files, tmpdir), meta, deep=False)
    return Output(files=files, meta=meta)


TOKENS = Stage(
    name="write_token_manifest",
    kind=TOKENS_KIND,
    inputs=("corpus", "tokenizer"),
    config=EncodeConfig,
    output_version=1,
    run=_publish,
    units=Units(name="encode_shard", run=_encode_shard),
)


def tokens_version(corpus: VersionRef, tokenizer: VersionRef, config: EncodeConfig) -> str:
    version = TOKENS.version({"corpus": corpus, "tokenizer": tokenizer}, config)
    assert version is not None  # a stage with params: never content-addressed
    return version


def encode_shard(
    store: ArtifactStore, corpus: VersionRef, tokenizer: VersionRef, shard: int, config: EncodeConfig
) -> dict[str, Any]:
    """Encode one corpus shard into the tokens version's staging area (skips a finished shard)."""
    return spec.run_unit(TOKENS, store, {"corpus": corpus, "tokenizer": tokenizer}, config, shard)


def publish_tokens(store: ArtifactStore, corpus: VersionRef, tokenizer: VersionRef, config: EncodeConfig) -> VersionRef:
    """Check every encoded shard and publish the tokens version with its manifest."""
    return spec.produce(TOKENS, store, {"corpus": corpus, "tokenizer": tokenizer}, config)


def compression_summary(tokens_meta: dict[str, Any]) -> dict[str, float]:
    totals = tokens_meta["totals"]
    n_sep = totals["n_docs"] if tokens_meta.get("separator") else 0
    n_text_tokens = max(1, totals["n_tokens"] - n_sep)
    return {
        "bytes_per_token": totals["n_bytes"] / n_text_tokens,
        "tokens": totals["n_tokens"],
        "bytes": totals["n_bytes"],
        "docs": totals["n_docs"],
    }


def shard_table(tokens_meta: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for s in tokens_meta["shards"]:
        n_text = s["n_tokens"] - (s["n_docs"] if tokens_meta.get("separator") else 0)
        rows.append(
            {
                "shard": s["name"],
                "docs": s["n_docs"],
                "bytes": s["n_bytes"],
                "tokens": s["n_tokens"],
                "bytes/token": round(s["n_bytes"] / max(1, n_text), 3),
            }
        )
    return rows
