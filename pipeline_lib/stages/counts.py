"""Stage: count pre-tokenized pieces per corpus shard (mapped), then sum them into `counts`."""

from __future__ import annotations

import os
import tempfile
from typing import Any

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
    pieces, counts = counting.count_shard(path, ctx.config.pattern)
    with ctx.staging.open_write(f"parts/{ctx.unit}.parquet") as tmp:
        counting.write_counts(tmp, pieces, counts)
    return {"shard": ctx.index, "n_pieces": len(pieces), "n_occurrences": int(counts.sum()), "n_docs": info["n_docs"], "n_bytes": info["n_bytes"]}


def _reduce(ctx: Context) -> Output:
    staging = ctx.staging
    assert staging is not None  # the engine publishes this stage
    names = [f"parts/{spec.unit_name(i)}.parquet" for i in range(len(ctx.records))]
    with tempfile.TemporaryDirectory(prefix="counts-", dir=ctx.store.scratch_dir(COUNTS_KIND)) as tmpdir:
        parts_dir = staging.local_dir(names, tmpdir)  # in place on local disk, else downloaded
        pieces, counts = counting.reduce_counts([os.path.join(parts_dir, *n.split("/")) for n in names], ctx.config.pattern)
    with staging.open_write(COUNTS_FILE) as tmp:
        counting.write_counts(tmp, pieces, counts)
    meta = {
        "pattern": ctx.config.pattern,
        "n_pieces": len(pieces),
        "n_occurrences": int(counts.sum()),
        "shards": list(ctx.records),
        "top_pieces": [[p.decode("utf-8", "replace"), int(c)] for p, c in sorted(zip(pieces, counts.tolist()), key=lambda x: -x[1])[:20]],
    }
    return Output(files={COUNTS_FILE: staging.written[COUNTS_FILE]}, meta=meta)


COUNTS = Stage(
    name="reduce_counts",
    kind=COUNTS_KIND,
    inputs=("corpus",),
    config=CountConfig,
    code=counting.CODE_MODULES,
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
