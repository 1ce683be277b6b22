"""Stage: count pre-tokenized pieces per corpus shard (mapped), then sum them into `counts`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline_lib import counting
from pipeline_lib.counting import COUNTS_FILE, COUNTS_KIND, CountConfig
from pipeline_lib.errors import InputError
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
    record = {
        "shard": ctx.index,
        "n_pieces": len(pieces),
        "n_occurrences": int(counts.sum()),
        "n_docs": info["n_docs"],
        "n_bytes": info["n_bytes"],
    }
    return record | ({"pruned": pruned} if pruned else {})


def _table_names(n_shards: int) -> list[list[str]]:
    """The tables of each level of the counts tree: the shards' parts, then each level's
    merged tables (`tree/l<level>_<k>.parquet`; a table left over alone keeps its name)."""
    names = [[f"parts/{spec.unit_name(i)}.parquet" for i in range(n_shards)]]
    for level, merges in enumerate(counting.tree_levels(n_shards), start=1):
        names.append(
            [names[-1][m[0]] if len(m) == 1 else f"tree/l{level:02d}_{k:06d}.parquet" for k, m in enumerate(merges)]
        )
    return names


def tree_merges(store: ArtifactStore, corpus: VersionRef) -> list[int]:
    """How many merges each level of the counts tree of `corpus` has (levels 1, 2, ...)."""
    return [len(m) for m in counting.tree_levels(spec.corpus_shard_count(store, {"corpus": corpus}))]


def merge_counts(store: ArtifactStore, corpus: VersionRef, config: CountConfig, level: int, k: int) -> dict[str, Any]:
    """Merge `k` of `level` (1, 2, ...) of the counts tree: its tables of the level below
    summed into one table in the counts version's staging area, under
    ``config.count_memory``; skipped when done (its completion record, written last) or
    when the version is published. Returns the completion record (with the pruning)."""
    version = counts_version(corpus, config)
    unit = f"merge_l{level:02d}_{k:06d}"
    if store.usable(COUNTS_KIND, version):
        return {"merge": unit, "cached": True}
    staging = store.stage(COUNTS_KIND, version)
    done = staging.done(unit)
    if done is not None:
        return done
    with store.claim(COUNTS_KIND, f"{version}.{unit}"):
        done = staging.done(unit)  # finished by the run we waited for?
        if done is not None:
            return done
        n_shards = spec.corpus_shard_count(store, {"corpus": corpus})
        levels, names = counting.tree_levels(n_shards), _table_names(n_shards)
        if not 1 <= level <= len(levels) or not 0 <= k < len(levels[level - 1]):
            raise InputError(
                f"counts/{version}: the counts tree of {n_shards} shards has no merge {k} at level {level}"
            )
        inputs = [names[level - 1][i] for i in levels[level - 1][k]]
        record: dict[str, Any] = {"merge": unit, "tables": len(inputs)}
        if len(inputs) > 1:
            with tempfile.TemporaryDirectory(prefix="counts-", dir=store.scratch_dir(COUNTS_KIND)) as tmpdir:
                local = staging.local_dir(inputs, tmpdir)
                pieces, counts, pruned = counting.reduce_counts(
                    [os.path.join(local, *n.split("/")) for n in inputs], config
                )
                with staging.open_write(names[level][k]) as tmp:
                    counting.write_counts(tmp, pieces, counts)
            record |= {"n_pieces": len(pieces)} | ({"pruned": pruned} if pruned else {})
        staging.mark_done(unit, record)
        return record


def _reduce(ctx: Context) -> Output:
    staging = ctx.staging
    assert staging is not None  # the engine publishes this stage
    corpus = ctx.inputs["corpus"]
    # The tree's merges not done yet (the flow runs them as tasks first), then the last one.
    reduce: dict[str, int] = {}
    for level, n_merges in enumerate(tree_merges(ctx.store, corpus), start=1):
        for k in range(n_merges):
            reduce = counting.merge_record(
                reduce, merge_counts(ctx.store, corpus, ctx.config, level, k).get("pruned", {})
            )
    names = _table_names(len(ctx.records))[-1]
    with tempfile.TemporaryDirectory(prefix="counts-", dir=ctx.store.scratch_dir(COUNTS_KIND)) as tmpdir:
        parts_dir = staging.local_dir(names, tmpdir)  # in place on local disk, else downloaded
        pieces, counts, pruned = counting.reduce_counts(
            [os.path.join(parts_dir, *n.split("/")) for n in names], ctx.config
        )
    reduce = counting.merge_record(reduce, pruned)
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
        "reduce_tree": {"fan_in": counting.TREE_FAN_IN, "merges_per_level": tree_merges(ctx.store, corpus)},
    }
    if ctx.config.pruned:
        meta["pruned"] = _pruned_summary(ctx.config, ctx.records, reduce)
    return Output(files={COUNTS_FILE: staging.written[COUNTS_FILE]}, meta=meta)


def _pruned_summary(
    config: counting.CountConfig, shards: Sequence[dict[str, Any]], reduce: dict[str, int]
) -> dict[str, Any]:
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
