"""Stage: count pre-tokenized pieces per corpus shard (mapped), then sum them into `counts`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline_lib import counting
from pipeline_lib.counting import COUNTS_FILE, COUNTS_KIND, CountConfig
from pipeline_lib.stages import spec
from pipeline_lib.stages.corpus import corpus_shards
from pipeline_lib.stages.spec import Context, Output, Stage, Units
from pipeline_lib.store import ArtifactStore, VersionRef


def _count_shard(ctx: Context) -> dict[str, Any]:
    corpus = ctx.inputs["corpus"]
    assert ctx.staging is not None and ctx.index is not None  # set for a unit of work
    info = corpus_shards(ctx.store, corpus)[ctx.index]
    path = ctx.store.local_file(corpus.kind, corpus.version, info["file"])
    pieces, counts, pruned = counting.count_shard(path, ctx.config)
    with ctx.staging.open_write(f"parts/{ctx.unit}.parquet") as tmp:
        counting.write_counts(tmp, pieces, counts)
    record = {"shard": ctx.index, "n_pieces": len(pieces), "n_occurrences": int(counts.sum()), "n_docs": info["n_docs"], "n_bytes": info["n_bytes"]}
    return record | ({"pruned": pruned} if pruned else {})


def _reduce(ctx: Context) -> Output:
    staging = ctx.staging
    assert staging is not None  # the engine publishes this stage
    names = [f"parts/{spec.unit_name(i)}.parquet" for i in range(len(ctx.records))]
    with tempfile.TemporaryDirectory(prefix="counts-", dir=ctx.store.scratch_dir(COUNTS_KIND)) as tmpdir:
        parts_dir = staging.local_dir(names, tmpdir)  # in place on local disk, else downloaded
        pieces, counts, pruned = counting.reduce_counts([os.path.join(parts_dir, *n.split("/")) for n in names], ctx.config)
    with staging.open_write(COUNTS_FILE) as tmp:
        counting.write_counts(tmp, pieces, counts)
    top = np.argsort(-counts, kind="stable")[:20].tolist()  # ties in piece order
    meta = {
        "pattern": ctx.config.pattern,
        "n_pieces": len(pieces),
        "n_occurrences": int(counts.sum()),
        "shards": list(ctx.records),
        "top_pieces": [[pieces[i].decode("utf-8", "replace"), int(counts[i])] for i in top],
        "count_mode": ctx.config.count_mode,
        "count_memory": ctx.config.memory_bytes,
    }
    if ctx.config.pruned:
        meta["pruned"] = _pruned_summary(ctx.config, ctx.records, pruned)
    return Output(files={COUNTS_FILE: staging.written[COUNTS_FILE]}, meta=meta)


def _pruned_summary(config: counting.CountConfig, shards: Sequence[dict[str, Any]], reduce: dict[str, int]) -> dict[str, Any]:
    """What pruned mode dropped: per shard (threshold used, pieces and occurrences dropped),
    in the reduce, and in all."""
    per_shard = [r["pruned"] for r in shards]
    return {
        "count_min": config.count_min,
        "shard_thresholds": sorted({p["threshold"] for p in per_shard}),
        "shards_over_budget": sum(p["threshold"] > config.count_min or p["prunings"] > 0 for p in per_shard),
        "reduce": reduce,
        "pieces_dropped": sum(p["pieces_dropped"] for p in per_shard) + reduce["pieces_dropped"],
        "occurrences_dropped": sum(p["occurrences_dropped"] for p in per_shard) + reduce["occurrences_dropped"],
    }


COUNTS = Stage(
    name="reduce_counts",
    kind=COUNTS_KIND,
    inputs=("corpus",),
    config=CountConfig,
    output_version=1,
    run=_reduce,
    units=Units(name="count_words", run=_count_shard),
)


def counts_version(corpus: VersionRef, config: CountConfig) -> str:
    version = COUNTS.version({"corpus": corpus}, config)
    assert version is not None  # a stage with params: never content-addressed
    return version


def count_shard(store: ArtifactStore, corpus: VersionRef, shard: int, config: CountConfig) -> dict[str, Any]:
    """Count one corpus shard into the counts version's staging area (skips a finished shard)."""
    return spec.run_unit(COUNTS, store, {"corpus": corpus}, config, shard)


def reduce_counts(store: ArtifactStore, corpus: VersionRef, config: CountConfig) -> VersionRef:
    """Sum the per-shard counts into ``counts.parquet`` and publish the counts version."""
    return spec.produce(COUNTS, store, {"corpus": corpus}, config)
