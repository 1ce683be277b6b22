"""The corpus stage mapped over source groups: grouping, a many-file corpus against the same
bytes in one file, per-group byte balance, and a SIGKILL inside one group's unit.

Run as a script (``python tests/test_parallel_shards.py STORE SOURCES_JSON KILL_GROUP``)
it is the killed worker: it shards the groups in the order 0, 1, ..., KILL_GROUP last, and
SIGKILLs itself at the first write once KILL_GROUP has started (decided by progress).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

N_FILES = 40


def _worker_main(store_url: str, sources: list[str], kill_group: int) -> None:
    from pipeline_lib import stages
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.store import ArtifactStore

    store = ArtifactStore(store_url)
    cfg = CorpusConfig(sources=tuple(sources), n_shards=4, source_group_bytes=0)
    raw = stages.download_corpus(store, cfg)
    n_groups = stages.spec.unit_count(stages.SHARD, store, {"raw": raw}, cfg)
    root = os.path.realpath(store_url)
    armed = [False]

    def hook(event: str, args: tuple) -> None:
        if not armed[0] or event not in ("open", "os.rename"):
            return
        path = args[0]
        if event == "open" and not (isinstance(args[1], str) and any(c in args[1] for c in "wax+")):
            flags = args[2]
            if not (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
                return
        if isinstance(path, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(path)).startswith(root):
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    for group in [g for g in range(n_groups) if g != kill_group] + [kill_group]:
        armed[0] = group == kill_group
        stages.shard_sources(store, raw, group, cfg)
    print("not killed")


if __name__ == "__main__":
    _worker_main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
    sys.exit(0)


import pytest  # noqa: E402

from pipeline_lib import stages  # noqa: E402
from pipeline_lib.corpus import CorpusConfig, group_shard_counts, source_groups  # noqa: E402
from pipeline_lib.errors import InputError  # noqa: E402
from pipeline_lib.store import ArtifactStore  # noqa: E402


# --------------------------------------------------------------------------- grouping
def test_source_groups_are_consecutive_and_within_the_budget():
    assert source_groups([10, 10, 10, 50, 5], 25) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert source_groups([10, 10, 10], 0) == [range(0, 1), range(1, 2), range(2, 3)]
    assert source_groups([10, 10, 10], 1 << 30) == [range(0, 3)]
    assert source_groups([], 10) == []


def test_shards_are_shared_by_bytes_with_one_per_group_at_least():
    assert group_shard_counts([100], 7) == [7]
    assert group_shard_counts([30, 10], 4) == [3, 1]
    assert group_shard_counts([10, 10, 10], 2) == [1, 1, 1]  # fewer shards than groups: one each
    counts = group_shard_counts([5, 7, 11, 13, 17], 20)
    assert sum(counts) == 20 and counts == sorted(counts)


def test_source_group_bytes_is_checked_and_part_of_the_corpus_version():
    with pytest.raises(InputError, match="source_group_bytes=-1"):
        CorpusConfig(source_group_bytes=-1)
    assert CorpusConfig(source_group_bytes=0).shard_params() != CorpusConfig().shard_params()


# --------------------------------------------------------------------------- many files
@pytest.fixture
def many_files(tmp_path, shakespeare_text) -> tuple[list[str], str]:
    """40 small files of whole lines, and one file holding the same bytes in the same order."""
    lines = shakespeare_text[:120_000].splitlines(keepends=True)
    step = -(-len(lines) // N_FILES)
    parts = ["".join(lines[i : i + step]) for i in range(0, len(lines), step)]
    files = []
    for i, part in enumerate(parts):
        path = tmp_path / "many" / f"part{i:03d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(part, encoding="utf-8")
        files.append(str(path))
    whole = tmp_path / "whole.txt"
    whole.write_text("".join(parts), encoding="utf-8")
    return files, str(whole)


def test_many_groups_write_their_own_shards_with_a_balance_each(tmp_path, many_files):
    files, _ = many_files
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = CorpusConfig(sources=tuple(files), n_shards=80, source_group_bytes=9_000)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    meta = store.manifest(corpus.kind, corpus.version)["meta"]
    groups = meta["groups"]
    assert 1 < len(groups) < len(files)
    assert [s for g in groups for s in g["sources"]] == [s["name"] for s in meta["sources"]]
    assert sum(g["balance"]["n_shards"] for g in groups) == len(meta["shards"]) >= len(groups)
    assert sum(g["n_bytes"] for g in groups) == meta["n_bytes"]
    names = [s["name"] for s in meta["shards"]]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(g["balance"]["max_over_mean"] < 2 for g in groups)
    # deterministic: a second store gives the same version and the same files
    store2 = ArtifactStore(str(tmp_path / "store2"))
    again = stages.shard_corpus(store2, stages.download_corpus(store2, cfg), cfg)
    assert again.version == corpus.version
    assert store2.manifest(again.kind, again.version)["files"] == store.manifest(corpus.kind, corpus.version)["files"]


def _published_tokenizer_and_tokens(store_url: str, summary: dict) -> tuple[dict, int]:
    store = ArtifactStore(store_url)
    tok, tokens = summary["refs"]["tokenizer"], summary["refs"]["tokens"]
    # tokenmill.json names the counts version it was learnt from: compare the vocabulary itself
    files = {
        n: i["sha256"] for n, i in store.manifest(tok["kind"], tok["version"])["files"].items() if n != "tokenmill.json"
    }
    return files, store.manifest(tokens["kind"], tokens["version"])["meta"]["totals"]["n_tokens"]


@pytest.mark.usefixtures("prefect_harness")
def test_forty_files_through_the_flow_give_the_tokenizer_of_one_file(tmp_path, many_files):
    """One task per source (40 groups, 2 workers) against one file of the same bytes: the
    shard layout differs (per-group shards), the counts do not, so the tokenizer files are
    identical and the token count equal."""
    from prefect_server import task_runs

    from flows.pipeline import tokenmill_pipeline

    files, whole = many_files
    results = {}
    for label, sources, group_bytes in (("many", files, 0), ("one", [whole], 0)):
        store = str(tmp_path / f"store-{label}")
        state = tokenmill_pipeline(
            corpus={"sources": sources, "n_shards": 4, "source_group_bytes": group_bytes},
            tokenizer={"vocab_size": 320},
            store=store,
            train_model=False,
            return_state=True,
        )
        assert state.is_completed(), state
        names = [r.name for r in task_runs(state.state_details.flow_run_id)]
        results[label] = (_published_tokenizer_and_tokens(store, state.result()), names)
    many_names = [n for n in results["many"][1] if n.startswith("shard_sources[")]
    assert len(many_names) == N_FILES, many_names
    assert len([n for n in results["one"][1] if n.startswith("shard_sources[")]) == 1
    assert results["many"][0] == results["one"][0]
    # 40 shards: the counts tree's merges ran as tasks of their own (20 + 10 + 5 + 2 + 1 pairs;
    # a table going up alone is no task), the last pair merged by the publish
    merges = [n for n in results["many"][1] if n.startswith("merge_counts[")]
    assert len(merges) == 38, sorted(merges)


# --------------------------------------------------------------------------- a killed unit
def test_a_killed_group_is_the_only_one_redone(tmp_path, many_files, monkeypatch):
    from pipeline_lib import corpus as corpus_lib

    files = many_files[0][:6]
    url = str(tmp_path / "store")
    kill_group = 3
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), url, json.dumps(files), str(kill_group)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr[-2000:])

    store = ArtifactStore(url)
    cfg = CorpusConfig(sources=tuple(files), n_shards=4, source_group_bytes=0)
    raw = stages.download_corpus(store, cfg)
    staging = store.stage(stages.SHARD.kind, stages.SHARD.version({"raw": raw}, cfg))
    done = [g for g in range(len(files)) if staging.done(stages.spec.unit_name(g)) is not None]
    assert done == [g for g in range(len(files)) if g != kill_group]

    ran: list[int] = []
    real = corpus_lib.shard_group

    def counted(store_, staging_, raw_, config, group):
        ran.append(group)
        return real(store_, staging_, raw_, config, group)

    monkeypatch.setattr(corpus_lib, "shard_group", counted)
    corpus = stages.shard_corpus(store, raw, cfg)
    assert ran == [kill_group]

    # the same corpus, byte for byte, as an uninterrupted run
    monkeypatch.setattr(corpus_lib, "shard_group", real)
    clean = ArtifactStore(str(tmp_path / "clean"))
    reference = stages.shard_corpus(clean, stages.download_corpus(clean, cfg), cfg)
    assert reference.version == corpus.version
    mine, theirs = store.manifest(corpus.kind, corpus.version), clean.manifest(reference.kind, reference.version)
    assert mine["files"] == theirs["files"] and mine["meta"] == theirs["meta"]


def test_reference_mode_copies_nothing_and_shards_as_copy_mode(tmp_path, many_files):
    files = many_files[0][:5]
    copy_store, ref_store = ArtifactStore(str(tmp_path / "copy")), ArtifactStore(str(tmp_path / "ref"))
    cfg = CorpusConfig(sources=tuple(files), n_shards=3, source_group_bytes=0)
    copied = stages.shard_corpus(copy_store, stages.download_corpus(copy_store, cfg), cfg)
    ref_cfg = CorpusConfig(sources=tuple(files), n_shards=3, source_group_bytes=0, source_mode="reference")
    raw = stages.download_corpus(ref_store, ref_cfg)
    assert ref_store.manifest(raw.kind, raw.version)["files"] == {}
    referenced = stages.shard_corpus(ref_store, raw, ref_cfg)
    files_copy = copy_store.manifest(copied.kind, copied.version)["files"]
    assert ref_store.manifest(referenced.kind, referenced.version)["files"] == files_copy
    assert len(files_copy) == len(files)  # one shard per group at least: 5 groups, 3 shards asked


def test_a_unit_reads_and_checks_only_its_own_sources(tmp_path, many_files):
    """A sharding unit hash-checks the raw sources it reads, not the whole raw version (at a
    terabyte every worker would hash the terabyte): a source altered in the store fails the
    unit that reads it, naming it, and no other."""
    from pipeline_lib.store import StoreError

    files, _ = many_files
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = CorpusConfig(sources=tuple(files[:4]), n_shards=4, source_group_bytes=0)
    raw = stages.download_corpus(store, cfg)
    name = store.manifest(raw.kind, raw.version)["meta"]["sources"][2]["name"]
    path = store.file_path(raw.kind, raw.version, f"sources/{name}")
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:  # same size, other bytes
        first = f.read(1)
        f.seek(0)
        f.write(b"#" if first != b"#" else b"$")
    for group in (0, 1, 3):
        assert stages.shard_sources(store, raw, group, cfg)["shards"]
    with pytest.raises(StoreError, match=name):
        stages.shard_sources(store, raw, 2, cfg)
