"""The store's identity and self-healing: gc and writes only in a tokenmill store, read-only
published files, quarantine of corrupt versions, claims, work areas."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from pipeline_lib.store import MANIFEST, QUARANTINE_DIR, STORE_MARKER, ArtifactStore, StoreError

HOUR = 3600


def _old(path, age_s: float = 10 * HOUR) -> None:
    """Backdate everything under `path` (gc spares what changed recently)."""
    stamp = time.time() - age_s
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (stamp, stamp), follow_symlinks=False)
    os.utime(path, (stamp, stamp))


def _tree(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _publish(store: ArtifactStore, kind: str = "notes", version: str = "v1", data: bytes = b"hello") -> None:
    staging = store.stage(kind, version)
    store.publish(staging, files={"a.txt": staging.put_bytes("a.txt", data)})


def _home_like(root) -> None:
    """A folder that looks like somebody's home: second-level folders without manifests."""
    for rel in ("Documents/taxes/2025.pdf", "photos/2024/img.jpg", "projects/repo/README.md"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"precious")
    _old(root)


def test_gc_refuses_a_folder_that_is_not_a_store(tmp_path):
    home = tmp_path / "home"
    _home_like(home)
    before = _tree(home)
    store = ArtifactStore(str(home))
    with pytest.raises(StoreError, match="not a tokenmill store"):
        store.gc()
    with pytest.raises(StoreError, match="not a tokenmill store"):
        store.gc(dry_run=True, min_age_s=HOUR)
    assert _tree(home) == before


def test_cli_gc_on_a_folder_that_is_not_a_store(tmp_path):
    home = tmp_path / "home"
    _home_like(home)
    before = _tree(home)
    p = subprocess.run(
        [sys.executable, "-m", "flows.cli", "gc", "--store", str(home)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode != 0
    assert "Traceback" not in p.stderr + p.stdout
    assert p.stderr.strip().splitlines()[-1].startswith("tokenmill: error:") and "not a tokenmill store" in p.stderr
    assert _tree(home) == before


def test_writes_refuse_a_folder_that_is_not_a_store(tmp_path):
    home = tmp_path / "home"
    _home_like(home)
    before = _tree(home)
    store = ArtifactStore(str(home))
    with pytest.raises(StoreError, match="not empty and is not a tokenmill store"):
        store.stage("notes", "v1")
    for write in (lambda: store.scratch_dir("notes"), lambda: store.work_dir("notes", "v1")):
        with pytest.raises(StoreError, match="not a tokenmill store"):
            write()
    assert _tree(home) == before


def test_a_store_is_marked_at_its_first_write_and_not_before(tmp_path):
    root = tmp_path / "new" / "store"
    store = ArtifactStore(str(root))
    assert store.list() == [] and not root.exists()  # reading creates nothing
    _publish(store)
    marker = json.loads((root / STORE_MARKER).read_bytes())
    assert marker["format"] == "tokenmill.store/1"
    assert ArtifactStore(str(root)).is_store()
    empty = tmp_path / "empty"
    empty.mkdir()
    _publish(ArtifactStore(str(empty)))  # an existing empty directory becomes a store too
    assert (empty / STORE_MARKER).is_file()


def test_a_marker_of_another_format_is_refused(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (root / STORE_MARKER).write_text(json.dumps({"format": "tokenmill.store/99"}))
    with pytest.raises(StoreError, match="upgrade tokenmill"):
        ArtifactStore(str(root)).stage("notes", "v1")
    (root / STORE_MARKER).write_text("{garbage")
    with pytest.raises(StoreError, match="corrupt store marker"):
        ArtifactStore(str(root)).gc()


def test_gc_deletes_only_what_the_layout_names(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    _publish(store)
    staging = store.stage("notes", "half")
    staging.put_bytes("a.txt", b"partial")
    work = store.work_dir("notes", "half")
    open(os.path.join(work, "ckpt"), "wb").close()
    orphan = tmp_path / "store" / "notes" / "orphan"
    orphan.mkdir()
    (orphan / "x").write_bytes(b"x")
    store.quarantine("notes", "v1", "test")
    _publish(store)  # republished after the quarantine
    _old(tmp_path / "store")
    removed = store.gc(min_age_s=HOUR)
    names = sorted(os.path.basename(p) for p in removed)
    assert names == sorted(["half", "half.work", ".tmp"])
    assert store.foreign_entries() == [str(orphan)]  # a manifest-less folder the store did not write stays
    left = _tree(tmp_path / "store")
    assert STORE_MARKER in left and any(QUARANTINE_DIR in p for p in left)
    assert store.verify("notes", "v1")


def test_published_files_are_read_only(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    _publish(store)
    base = store.version_path("notes", "v1")
    for name in ("a.txt", MANIFEST):
        assert stat.S_IMODE(os.stat(os.path.join(base, name)).st_mode) == 0o444


@pytest.mark.parametrize("damage", ["manifest", "file"])
def test_a_corrupt_version_is_quarantined_and_recomputed(tmp_path, damage, caplog):
    store = ArtifactStore(str(tmp_path / "store"))
    _publish(store)
    base = store.version_path("notes", "v1")
    target = os.path.join(base, MANIFEST if damage == "manifest" else "a.txt")
    raw = bytearray(open(target, "rb").read())
    raw[len(raw) // 2] ^= 0x20  # same size, one bit
    os.chmod(target, 0o644)
    with open(target, "wb") as f:
        f.write(raw)
    assert store.exists("notes", "v1")
    with caplog.at_level("WARNING", logger="tokenmill.store"):
        assert not store.usable("notes", "v1")
    assert "quarantined notes/v1" in caplog.text
    assert not store.exists("notes", "v1")
    (moved,) = os.listdir(tmp_path / "store" / "notes" / QUARANTINE_DIR)
    assert moved.startswith("v1-") and sorted(os.listdir(tmp_path / "store" / "notes" / QUARANTINE_DIR / moved)) == [
        "a.txt",
        MANIFEST,
    ]
    _publish(store)  # the rerun recomputes the same bytes
    assert store.usable("notes", "v1") and store.read_bytes("notes", "v1", "a.txt") == b"hello"


def test_a_rerun_heals_a_flipped_corpus_shard(tmp_path):
    from pipeline_lib import stages as corpus_lib

    src = tmp_path / "c.txt"
    src.write_text("".join(f"line {i} of the corpus\n" for i in range(2000)))
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = corpus_lib.CorpusConfig(sources=(str(src),), n_shards=2)
    raw = corpus_lib.download_corpus(store, cfg)
    ref = corpus_lib.shard_corpus(store, raw, cfg)
    shard = store.manifest(ref.kind, ref.version)["meta"]["shards"][0]["file"]
    path = store.file_path(ref.kind, ref.version, shard)
    data = bytearray(open(path, "rb").read())
    data[-100] ^= 1
    os.chmod(path, 0o644)
    open(path, "wb").write(data)
    with pytest.raises(StoreError, match="sha256 mismatch"):
        store.local_file(ref.kind, ref.version, shard)
    again = corpus_lib.shard_corpus(store, raw, cfg)
    assert again.version == ref.version
    store.verify(ref.kind, ref.version)


def test_claim_makes_concurrent_producers_take_turns(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    store.ensure_store()
    inside, overlaps, produced = [], [], []
    lock = threading.Lock()

    def producer() -> None:
        with store.claim("notes", "v1"):
            with lock:
                inside.append(1)
                overlaps.append(len(inside))
            if not store.exists("notes", "v1"):
                time.sleep(0.3)
                _publish(store)
                produced.append(1)
            with lock:
                inside.pop()

    threads = [threading.Thread(target=producer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert max(overlaps) == 1 and len(produced) == 1
    assert not any(name.endswith(".claim") for name in os.listdir(tmp_path / "store" / "notes" / ".staging"))


def test_work_dirs_are_per_store_and_version(tmp_path):
    a, b = ArtifactStore(str(tmp_path / "a")), ArtifactStore(str(tmp_path / "b"))
    wa, wb = a.work_dir("model", "v1"), b.work_dir("model", "v1")
    assert wa != wb and wa.startswith(str(tmp_path / "a")) and wb.startswith(str(tmp_path / "b"))
    assert a.work_dir("model", "v2") != wa
    a.drop_work_dir("model", "v1")
    assert not os.path.exists(wa)


def test_remote_work_areas_are_local_per_store_and_collected(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    a, b = ArtifactStore("memory://safety-a"), ArtifactStore("memory://safety-b")
    wa, wb = a.work_dir("model", "v1"), b.work_dir("model", "v1")
    assert wa != wb and wa.startswith(str(tmp_path / "tmp"))
    _old(wa)
    assert wa in a.gc(min_age_s=HOUR) and not os.path.exists(wa) and os.path.exists(wb)


def test_gc_min_age_spares_a_fresh_remote_work_dir(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    store = ArtifactStore(f"memory://safety-fresh-{tmp_path.name}")
    work = store.work_dir("model", "v1")
    assert work not in store.gc(min_age_s=HOUR) and os.path.exists(work)  # work in progress
    _old(work)
    assert work in store.gc(min_age_s=HOUR) and not os.path.exists(work)


@pytest.mark.parametrize("backend", ["file", "memory"])
def test_concurrent_runs_of_a_stage_do_each_unit_once(tmp_path, monkeypatch, backend):
    """Two runs of the same mapped stage and the same publishing stage on one store: each
    shard is counted once and the merges are learned once (claims: flock / lease object)."""
    from pipeline_lib import counting, stages
    from pipeline_lib import stages as corpus_lib
    from pipeline_lib.tokenizer import Tokenizer

    src = tmp_path / "c.txt"
    src.write_text("".join(f"line {i} of a corpus with some words\n" for i in range(3000)))
    url = str(tmp_path / "store") if backend == "file" else f"memory://claims-{tmp_path.name}"
    store = ArtifactStore(url)
    cfg = corpus_lib.CorpusConfig(sources=(str(src),), n_shards=2)
    corpus = corpus_lib.shard_corpus(store, corpus_lib.download_corpus(store, cfg), cfg)
    calls: dict[str, int] = {"count": 0, "train": 0}
    real_count, real_train = counting.count_shard, Tokenizer.train.__func__

    def slow_count(*a, **kw):
        calls["count"] += 1
        time.sleep(0.3)
        return real_count(*a, **kw)

    def slow_train(cls, *a, **kw):
        calls["train"] += 1
        time.sleep(0.3)
        return real_train(cls, *a, **kw)

    monkeypatch.setattr(counting, "count_shard", slow_count)
    monkeypatch.setattr(Tokenizer, "train", classmethod(slow_train))
    count_cfg = counting.CountConfig(pattern="gpt2")
    results, errors = [], []

    def run() -> None:
        try:
            for shard in range(2):
                stages.count_shard(ArtifactStore(url), corpus, shard, count_cfg)
            counts = stages.reduce_counts(ArtifactStore(url), corpus, count_cfg)
            results.append(stages.learn_tokenizer(ArtifactStore(url), counts, stages.TokenizerConfig(vocab_size=300)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert calls == {"count": 2, "train": 1}
