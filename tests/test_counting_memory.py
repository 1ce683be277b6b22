"""Counting under a memory budget (--count-memory): exact mode fails clearly, pruned mode drops rare pieces."""

from __future__ import annotations

import logging
import random
import re
import string

import numpy as np
import pytest

from pipeline_lib import ArtifactStore, Tokenizer, stages
from pipeline_lib.corpus import CorpusConfig, iter_shard_batches
from pipeline_lib.counting import CountConfig, count_shard, parse_memory, read_counts, table_bytes
from pipeline_lib.errors import InputError
from pipeline_lib.tokenizer import count_documents

FREQUENT = (
    "the of and to in a is that for it as was with be by on not he I this are or his from at which but have an they"
).split()


@pytest.fixture(scope="module")
def rare_corpus(tmp_path_factory) -> str:
    """6,000 lines of frequent words, each with one word seen nowhere else (6,000 pieces of count 1)."""
    rng = random.Random(13)
    lines = [
        " ".join(rng.choices(FREQUENT, k=6) + ["zq" + "".join(rng.choices(string.ascii_lowercase, k=8))])
        for _ in range(6000)
    ]
    path = tmp_path_factory.mktemp("rare") / "rare.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def sharded(rare_corpus, tmp_path_factory):
    """The corpus in two shards (the shards' files and the store's corpus version)."""
    store = ArtifactStore(str(tmp_path_factory.mktemp("store")))
    config = CorpusConfig(sources=(rare_corpus,), n_shards=2)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, config), config)
    paths = [store.local_file(corpus.kind, corpus.version, s["file"]) for s in stages.corpus_shards(store, corpus)]
    return store, corpus, paths


def _exact_counts(paths: list[str]) -> dict[bytes, int]:
    counts = count_documents((d for p in paths for batch in iter_shard_batches(p) for d in batch), "cl100k", workers=1)
    pieces, values = counts.to_arrays()
    return dict(zip(pieces, values.tolist()))


def test_memory_sizes_parse_and_bad_ones_are_refused():
    assert parse_memory("2GiB") == 2 << 30 and parse_memory("512MiB") == 512 << 20 and parse_memory("2G") == 2 << 30
    assert parse_memory("1500") == 1500 and parse_memory("2GB") == 2 * 10**9 and parse_memory(" 64 KiB ") == 64 << 10
    for bad in ("lots", "2XB", "-1", "0", ""):
        with pytest.raises(InputError, match="count_memory"):
            CountConfig(count_memory=bad)
    with pytest.raises(InputError, match="count_min"):
        CountConfig(count_mode="pruned", count_min=0)


def test_exact_mode_keeps_the_version_ids_and_pruned_mode_names_its_params():
    assert CountConfig().params() == {"pattern": "cl100k"}
    # exact: same counts or a failure
    assert CountConfig(count_memory="64KiB", count_min=5).params() == {"pattern": "cl100k"}
    assert CountConfig(count_mode="pruned", count_memory="1GiB", count_min=5).params() == {
        "pattern": "cl100k",
        "count_mode": "pruned",
        "count_min": 5,
        "count_memory": 1 << 30,
    }


def test_exact_with_a_budget_that_fits_gives_the_exact_counts(sharded):
    store, corpus, paths = sharded
    config = CountConfig(count_memory="64MiB")
    for i in range(len(paths)):
        stages.count_shard(store, corpus, i, config)
    ref = stages.reduce_counts(store, corpus, config)
    pieces, counts = read_counts(store.local_file(ref.kind, ref.version, "counts.parquet"))
    assert dict(zip(pieces, counts.tolist())) == _exact_counts(paths)
    assert ref.version == stages.counts_version(corpus, CountConfig())  # the budget is no part of the id
    meta = store.manifest(ref.kind, ref.version)["meta"]
    assert meta["count_mode"] == "exact" and "pruned" not in meta and all("pruned" not in r for r in meta["shards"])


def test_exact_over_the_budget_fails_early_naming_the_flags(sharded):
    _, _, paths = sharded
    with pytest.raises(
        InputError, match=r"over --count-memory 64KiB; raise --count-memory, or use --count-mode pruned"
    ):
        count_shard(paths[0], CountConfig(count_memory="64KiB"))


def test_pruned_drops_rare_pieces_records_them_and_learns_the_same_merges(sharded):
    store, corpus, paths = sharded
    config = CountConfig(count_mode="pruned", count_memory="64KiB", count_min=2)
    for i in range(len(paths)):
        stages.count_shard(store, corpus, i, config)
    ref = stages.reduce_counts(store, corpus, config)
    assert ref.version != stages.counts_version(corpus, CountConfig())
    pieces, counts = read_counts(store.local_file(ref.kind, ref.version, "counts.parquet"))
    exact = _exact_counts(paths)
    # Every shard's table went over 64 KiB while counting (3,000 rare words) and was pruned as it went.
    meta = store.manifest(ref.kind, ref.version)["meta"]
    for record in meta["shards"]:
        assert record["pruned"]["threshold"] == 2 and record["pruned"]["prunings"] >= 1
        assert record["pruned"]["pieces_dropped"] >= 2900 and record["pruned"]["occurrences_dropped"] >= 2900
    summary = meta["pruned"]
    assert summary["count_min"] == 2 and summary["shard_thresholds"] == [2] and summary["reduce"]["threshold"] == 2
    assert (
        summary["pieces_dropped"]
        == sum(r["pruned"]["pieces_dropped"] for r in meta["shards"]) + summary["reduce"]["pieces_dropped"]
    )
    # What is left: the frequent pieces, with their exact counts; the rare words are gone.
    kept = dict(zip(pieces, counts.tolist()))
    assert kept == {p: c for p, c in exact.items() if not p.lstrip().startswith(b"zq")}
    assert summary["occurrences_dropped"] == sum(exact.values()) - sum(kept.values())
    # Merges learned from the pruned counts are those of the frequent pieces alone.
    tok = stages.load_tokenizer(store, stages.learn_tokenizer(store, ref, stages.TokenizerConfig(vocab_size=320)))
    assert tok.merges == Tokenizer.train(kept, 320).merges


def test_pruned_raises_the_threshold_until_the_table_fits(sharded):
    _, _, paths = sharded
    budget = "6KiB"  # less than the frequent pieces' table
    pieces, counts, record = count_shard(paths[0], CountConfig(count_mode="pruned", count_memory=budget, count_min=2))
    assert record["threshold"] > 2 and int(counts.min()) >= record["threshold"]
    assert table_bytes(len(pieces), sum(map(len, pieces))) <= parse_memory(budget)
    assert len(pieces) > 0  # the most frequent words stay


@pytest.mark.usefixtures("prefect_harness")
def test_cli_exact_over_the_budget_is_one_clear_error(rare_corpus, tmp_path, capsys):
    from flows.cli import main

    argv = [
        "tokenizer",
        "train",
        "--corpus",
        rare_corpus,
        "--store",
        str(tmp_path / "s"),
        "--vocab-size",
        "300",
        "--workers",
        "1",
    ]
    assert main([*argv, "--count-memory", "lots"]) == 2
    assert "--count-memory lots" in capsys.readouterr().err
    assert main([*argv, "--count-memory", "64KiB"]) == 2
    err = capsys.readouterr().err
    # Prefect's log lines go there too
    (line,) = [line for line in err.splitlines() if line.startswith("tokenmill: error: ")]
    assert "over --count-memory 64KiB" in line and "--count-mode pruned" in line and "Traceback" not in err
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    run_logs = [logging.getLogger(f"prefect.{name}") for name in ("task_runs", "flow_runs")]
    levels = [logger.level for logger in run_logs]
    for logger in run_logs:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)  # the suite runs Prefect at WARNING
    try:
        assert main([*argv, "--count-memory", "64KiB", "--count-mode", "pruned"]) == 0
    finally:
        for logger, level in zip(run_logs, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)
    err = "\n".join(logged)  # the counting tasks say what pruning dropped
    assert re.search(r"shard 0: [\d,]+ distinct pieces \(pruned below \d+: [\d,]+ pieces dropped\)", err), err[-3000:]
    assert re.search(r"pruned mode \(--count-min \d+\): [\d,]+ pieces and [\d,]+ occurrences dropped", err), err[-3000:]


def test_estimate_follows_the_table(sharded):
    """The estimate is table_bytes of the pieces held, within the mean-length estimate of their bytes."""
    from pipeline_lib.counting import BoundedCounts

    _, _, paths = sharded
    table = BoundedCounts(CountConfig(), "shard")
    for batch in iter_shard_batches(paths[0]):
        table.add_documents(batch)
    pieces, _ = table.counts.to_arrays()
    exact = table_bytes(len(pieces), sum(map(len, pieces)))
    assert 0.8 * exact <= table.estimate() <= 1.2 * exact
    assert np.isclose(table_bytes(10, 100), 10 * 128 + 200)
