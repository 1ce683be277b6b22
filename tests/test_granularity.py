"""Task granularity: shards grouped into tasks by a byte budget, each group resumable per shard.

`group_units` is checked as a partition (hypothesis); the flow is run with a byte budget
that groups 8 shards into 3 tasks: the task runs name their shard ranges, the artifacts
are byte-identical to the library's, shard by shard, without Prefect, and a task that fails in the middle of its group
is redone, on the next run, from the shard where it stopped. (The floor of 64 tasks is
lowered to 2 for these runs, so that 8 shards can be grouped.)
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import task_runs  # noqa: E402

from pipeline_lib.corpus import MIN_TASKS, CorpusConfig  # noqa: E402
from pipeline_lib.errors import ConfigError, InputError  # noqa: E402
from pipeline_lib.stages import spec  # noqa: E402
from pipeline_lib.stages.spec import group_units  # noqa: E402

SHARDS = 8


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 1 << 30), min_size=0, max_size=400), st.integers(0, 1 << 34))
def test_groups_partition_the_shards_in_order(sizes, task_bytes):
    groups = group_units(sizes, task_bytes)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    assert all(len(g) >= 1 and g.step == 1 for g in groups)
    total = sum(sizes)
    expected = len(sizes) if task_bytes == 0 else min(len(sizes), max(MIN_TASKS, -(-total // task_bytes)))
    assert len(groups) == expected


def test_many_small_shards_make_few_tasks_of_about_the_budget():
    sizes = [1 << 20] * 10_000  # 10,000 shards of 1 MiB, 64 MiB per task
    groups = group_units(sizes, 64 << 20)
    assert len(groups) == 157
    assert {len(g) for g in groups} <= {63, 64, 65}
    assert len(group_units([1 << 10] * 1000, 64 << 20)) == MIN_TASKS  # a small corpus keeps MIN_TASKS tasks
    assert len(group_units([1 << 10] * 10, 64 << 20)) == 10  # and fewer shards than that, one task each


def test_a_big_shard_does_not_starve_the_groups_after_it():
    sizes = [1000] + [10] * 199  # the budget asks for 100 groups: the first shard alone, then ~2 each
    groups = group_units(sizes, 30)
    assert len(groups) == 100 and groups[0] == range(0, 1)
    assert max(len(g) for g in groups[1:]) <= 3


def test_task_bytes_is_checked_and_not_part_of_the_corpus_version():
    with pytest.raises(InputError, match="task_bytes=-1"):
        CorpusConfig(task_bytes=-1)
    with pytest.raises(InputError, match="task_bytes=-1"):
        group_units([1], -1)
    assert CorpusConfig(task_bytes=1).shard_params() == CorpusConfig(task_bytes=0).shard_params()
    from pipeline_lib.config import validate

    with pytest.raises(ConfigError, match="corpus.task_bytes"):
        validate(CorpusConfig, {"task_bytes": "many"}, "corpus")


# --------------------------------------------------------------------------- through the flow
@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, shakespeare_text) -> str:
    path = tmp_path_factory.mktemp("corpus") / "granular.txt"
    path.write_text(shakespeare_text[:60_000], encoding="utf-8")
    return str(path)


@pytest.fixture
def small_floor(monkeypatch):
    """Grouping's floor lowered from 64 tasks to 2, so that 8 shards can be grouped."""
    monkeypatch.setattr(spec, "MIN_TASKS", 2)


def _run(corpus_file: str, store: str, task_bytes: int):
    from flows.pipeline import tokenmill_pipeline

    corpus = {"sources": [corpus_file], "n_shards": SHARDS, "task_bytes": task_bytes}
    return tokenmill_pipeline(
        corpus=corpus, tokenizer={"vocab_size": 300}, store=store, train_model=False, return_state=True
    )


def _shard_sizes(corpus_file: str, store: str) -> list[int]:
    """Shard the corpus into `store` with the library (the flow then reuses it): shard bytes."""
    from pipeline_lib import ArtifactStore, stages

    config = CorpusConfig(sources=(corpus_file,), n_shards=SHARDS)
    store_ = ArtifactStore(store)
    corpus = stages.shard_corpus(store_, stages.download_corpus(store_, config), config)
    return [s["n_bytes"] for s in stages.corpus_shards(store_, corpus)]


def _library_chain(corpus_file: str, store_url: str) -> None:
    """The chain without Prefect, one shard at a time: what the grouped flow must reproduce."""
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.counting import CountConfig
    from pipeline_lib.token_shards import EncodeConfig

    store = ArtifactStore(store_url)
    config = CorpusConfig(sources=(corpus_file,), n_shards=SHARDS)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, config), config)
    for i in range(SHARDS):
        stages.count_shard(store, corpus, i, CountConfig())
    tokenizer = stages.learn_tokenizer(
        store, stages.reduce_counts(store, corpus, CountConfig()), stages.TokenizerConfig(vocab_size=300)
    )
    for i in range(SHARDS):
        stages.encode_shard(store, corpus, tokenizer, i, EncodeConfig())
    stages.publish_tokens(store, corpus, tokenizer, EncodeConfig())


@pytest.mark.usefixtures("prefect_harness", "small_floor")
def test_grouped_tasks_give_the_same_artifacts_and_name_their_shards(corpus_file, tmp_path):
    one_each, grouped = str(tmp_path / "one-each"), str(tmp_path / "grouped")
    _library_chain(corpus_file, one_each)
    budget = -(-sum(_shard_sizes(corpus_file, grouped)) // 3)  # three tasks
    state = _run(corpus_file, grouped, budget)
    assert state.is_completed(), state
    names = sorted(r.name for r in task_runs(state.state_details.flow_run_id))
    counts = [n for n in names if n.startswith("count_words[")]
    assert len(counts) == 3 and all(
        n.startswith("count_words[shards=") and n.endswith(f"/{SHARDS}]") for n in counts
    ), names
    assert len([n for n in names if n.startswith("encode_shard[")]) == 3, names
    assert _published(one_each) == _published(grouped)


def _published(store_url: str) -> dict[str, dict]:
    """``{kind/version: {file: (size, sha256)}}`` of every version in a store."""
    from pipeline_lib import ArtifactStore

    return {
        f"{m['kind']}/{m['version']}": {n: (i["size"], i["sha256"]) for n, i in m["files"].items()}
        for m in ArtifactStore(store_url).list()
    }


@pytest.mark.usefixtures("prefect_harness", "small_floor")
def test_a_group_that_fails_midway_resumes_from_the_shard_it_stopped_at(corpus_file, tmp_path, monkeypatch):
    from pipeline_lib import counting

    store = str(tmp_path / "store")
    sizes = _shard_sizes(corpus_file, store)
    budget = -(-sum(sizes) // 2)  # two tasks
    first_group = spec.group_units(sizes, budget)[0]
    assert len(first_group) >= 3, first_group
    failing = f"shard_{first_group[2]:06d}.parquet"  # the group's third shard fails, once
    counted: list[str] = []
    real = counting.count_shard

    def flaky(path, pattern):
        name = os.path.basename(path)
        counted.append(name)
        if name == failing and counted.count(name) == 1:
            raise RuntimeError("the worker died")
        return real(path, pattern)

    monkeypatch.setattr(counting, "count_shard", flaky)
    state = _run(corpus_file, store, budget)
    assert state.is_failed(), state
    first = list(counted)
    assert f"shard_{first_group[3]:06d}.parquet" not in first if len(first_group) > 3 else True
    again = _run(corpus_file, store, budget)
    assert again.is_completed(), again
    redone = counted[len(first) :]
    # The failed shard and the ones after it in its group, nothing the group had finished.
    assert redone == [f"shard_{i:06d}.parquet" for i in first_group[2:]], (first, redone)
    assert sorted(set(counted)) == [f"shard_{i:06d}.parquet" for i in range(SHARDS)]
