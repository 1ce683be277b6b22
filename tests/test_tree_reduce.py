"""The counts tree: per-shard tables merged in pairs (then pairs of those ...), each merge a
unit of its own under --count-memory, and the same table as one reduce in exact mode."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pipeline_lib import counting, stages
from pipeline_lib.counting import (
    CountConfig,
    read_counts,
    reduce_counts,
    table_bytes,
    tree_levels,
    tree_reduce,
    write_counts,
)
from pipeline_lib.stages import counts as stage_counts
from pipeline_lib.store import ArtifactStore


def _tables(directory, n: int, seed: int = 7) -> list[str]:
    """`n` small counts tables with overlapping pieces (a Zipf-ish vocabulary)."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}".encode() for i in range(5000)]
    paths = []
    for t in range(n):
        ids = np.unique(np.minimum(rng.zipf(1.3, 300), len(vocab)) - 1)
        pieces = sorted(vocab[i] for i in ids)
        path = os.path.join(directory, f"t{t:04d}.parquet")
        write_counts(path, pieces, rng.integers(1, 50, len(pieces)))
        paths.append(path)
    return paths


def test_tree_levels_halve_until_two_tables_are_left():
    assert [len(level) for level in tree_levels(256)] == [128, 64, 32, 16, 8, 4, 2]
    assert tree_levels(9) == [[[0, 1], [2, 3], [4, 5], [6, 7], [8]], [[0, 1], [2, 3], [4]], [[0, 1], [2]]]
    with pytest.raises(ValueError, match="fan_in=1"):
        tree_levels(4, fan_in=1)


def test_256_tables_merged_by_the_tree_on_2_workers_equal_one_reduce(tmp_path):
    paths = _tables(tmp_path, 256)
    config = CountConfig()
    one_pieces, one_counts, _ = reduce_counts(paths, config)
    work = tmp_path / "tree"
    work.mkdir()
    with ThreadPoolExecutor(2) as pool:
        pieces, counts, record = tree_reduce(paths, str(work), config, map_merges=pool.map)
    assert pieces == one_pieces and counts.tolist() == one_counts.tolist()
    assert record == {}  # exact mode: nothing pruned
    assert len(os.listdir(work)) == 128 + 64 + 32 + 16 + 8 + 4 + 2  # every merge wrote its table


def test_pruned_tree_merges_stay_under_the_budget(tmp_path):
    paths = _tables(tmp_path, 64)
    _, one_counts, _ = reduce_counts(paths, CountConfig())
    full = table_bytes(len(one_counts), sum(map(len, reduce_counts(paths, CountConfig())[0])))
    budget = full // 3
    config = CountConfig(count_mode="pruned", count_min=1, count_memory=str(budget))
    work = tmp_path / "tree"
    work.mkdir()
    pieces, counts, record = tree_reduce(paths, str(work), config)
    assert record["pieces_dropped"] > 0 and record["threshold"] > 1
    assert table_bytes(len(pieces), sum(map(len, pieces))) <= budget
    for name in os.listdir(work):  # every merged table was held under the budget
        p, _ = read_counts(str(work / name))
        assert table_bytes(len(p), sum(map(len, p))) <= budget
    assert int(counts.sum()) + record["occurrences_dropped"] == int(one_counts.sum())


def test_counts_of_nine_shards_through_the_tree_equal_one_shard(tmp_path, shakespeare_text):
    source = tmp_path / "corpus.txt"
    source.write_text(shakespeare_text[:60_000], encoding="utf-8")
    files = {}
    for n_shards in (1, 9):
        store = ArtifactStore(str(tmp_path / f"store{n_shards}"))
        cfg = stages.CorpusConfig(sources=(str(source),), n_shards=n_shards)
        corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
        for i in range(n_shards):
            stages.count_shard(store, corpus, i, CountConfig())
        if n_shards == 9:  # a merge done ahead (as the flow's tasks do) is not redone by the publish
            first = stage_counts.merge_counts(store, corpus, CountConfig(), 1, 0)
            assert stage_counts.merge_counts(store, corpus, CountConfig(), 1, 0) == first
        counts = stages.reduce_counts(store, corpus, CountConfig())
        manifest = store.manifest(counts.kind, counts.version)
        files[n_shards] = manifest["files"]
        assert manifest["meta"]["reduce_tree"]["merges_per_level"] == ([] if n_shards == 1 else [5, 3, 2])
    assert files[1] == files[9]
    assert counting.TREE_FAN_IN == 2
