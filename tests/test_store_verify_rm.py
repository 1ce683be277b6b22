"""`tokenmill verify --all` (the whole-store check after a crash or a copy) and
`tokenmill rm` (deleting an unwanted version, and what derives from it only on request)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from s3_server import s3_options, s3_url  # noqa: F401  (session fixture: a local S3 server)

from pipeline_lib.store import ArtifactStore, InputError, version_id


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=300)


def _publish(store: ArtifactStore, kind: str, data: bytes, parents: dict[str, str] | None = None) -> str:
    version = version_id(kind, parents or {}, {"data": data.decode()}, "test")
    staging = store.stage(kind, version)
    store.publish(staging, files={"a.txt": staging.put_bytes("a.txt", data)}, parents=parents or {})
    return f"{kind}/{version}"


def _chain(store: ArtifactStore) -> tuple[str, str, str, str]:
    """raw <- corpus <- model, and an unrelated raw."""
    raw = _publish(store, "raw", b"raw text")
    corpus = _publish(store, "corpus", b"corpus", {"raw": raw})
    # (no shards: a "tokens" kind would fail its shard checks)
    tokens = _publish(store, "model", b"model", {"corpus": corpus})
    other = _publish(store, "raw", b"other raw")
    return raw, corpus, tokens, other


def test_verify_all_reports_every_fault_and_foreign_entry(tmp_path):
    root = tmp_path / "S"
    store = ArtifactStore(str(root))
    raw, corpus, tokens, other = _chain(store)
    p = _cli("verify", "--all", "--store", str(root))
    assert p.returncode == 0, p.stderr
    assert all(f"{key}: 1 files OK" in p.stdout for key in (raw, corpus, tokens, other))
    # a same-size flip in one version, a missing file in another, a folder of the user's
    flipped = root / corpus / "a.txt"
    os.chmod(flipped, 0o644)
    flipped.write_bytes(b"CORPUS")
    os.chmod(root / other, 0o755)
    os.unlink(root / other / "a.txt")
    (root / "notes").mkdir()
    (root / "notes" / "mine.txt").write_bytes(b"x")
    p = _cli("verify", "--all", "--store", str(root))
    assert p.returncode == 1
    assert f"{corpus}: FAULT:" in p.stdout and "sha256 mismatch" in p.stdout
    assert f"{other}: FAULT:" in p.stdout and "missing" in p.stdout
    assert f"{raw}: 1 files OK" in p.stdout and f"{tokens}: 1 files OK" in p.stdout
    assert f"foreign (not written by the store, kept): {root}/notes" in p.stdout
    assert "Traceback" not in p.stderr and p.stderr.strip().splitlines()[-1].startswith("tokenmill: error:")


def test_verify_needs_a_version_or_all(tmp_path):
    p = _cli("verify", "--store", str(tmp_path / "S"))
    assert p.returncode == 2 and "--all" in p.stderr and "Traceback" not in p.stderr


def test_rm_refuses_while_others_depend_then_removes_with_dependents(tmp_path):
    root = tmp_path / "S"
    store = ArtifactStore(str(root))
    raw, corpus, tokens, other = _chain(store)
    p = _cli("rm", raw, "--store", str(root))
    assert p.returncode == 2 and "--with-dependents" in p.stderr and corpus in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert len(store.list()) == 4
    p = _cli("rm", raw, "--with-dependents", "--dry-run", "--store", str(root))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["would", "remove", tokens, "would", "remove", corpus, "would", "remove", raw]
    assert len(store.list()) == 4
    p = _cli("rm", raw, "--with-dependents", "--store", str(root))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"removed {tokens}", f"removed {corpus}", f"removed {raw}"]
    assert [f"{m['kind']}/{m['version']}" for m in store.list()] == [other]
    for key in (raw, corpus, tokens):
        assert not (root / key).exists()
    store.verify(*other.split("/"))
    assert store.foreign_entries() == []
    p = _cli("rm", other, "--store", str(root))  # nothing depends on it
    assert p.returncode == 0 and p.stdout.strip() == f"removed {other}"
    assert store.list() == []


def test_rm_with_unused_parents_keeps_what_others_still_use(tmp_path):
    root = tmp_path / "S"
    store = ArtifactStore(str(root))
    raw, corpus, model, other = _chain(store)
    second = _publish(store, "model", b"second model", {"corpus": corpus})  # corpus stays in use by it
    p = _cli("rm", model, "--with-unused-parents", "--store", str(root))
    assert p.returncode == 0 and p.stdout.splitlines() == [f"removed {model}"], p.stdout + p.stderr
    p = _cli("rm", second, "--with-unused-parents", "--dry-run", "--store", str(root))
    assert p.stdout.splitlines() == [f"would remove {second}", f"would remove {corpus}", f"would remove {raw}"]
    assert store.remove_version(*second.split("/"), with_unused_parents=True) == [second, corpus, raw]
    assert [f"{m['kind']}/{m['version']}" for m in store.list()] == [other]


def test_rm_on_an_object_store(request):
    store = ArtifactStore(s3_url(), **request.getfixturevalue("s3_options"))
    raw, corpus, tokens, other = _chain(store)
    with pytest.raises(InputError, match="--with-dependents"):
        store.remove_version(*raw.split("/"))
    assert store.remove_version(*corpus.split("/"), with_dependents=True) == [tokens, corpus]
    assert sorted(f"{m['kind']}/{m['version']}" for m in store.list()) == sorted([raw, other])
    assert store.fs.find(store.version_path(*corpus.split("/"))) == []


@pytest.mark.parametrize(
    "url,expected",
    [
        ("s3://", "no bucket"),
        ("s3:///prefix", "no bucket"),
        ("gs://", "no bucket"),
        ("simplecache::s3://bucket/tm", "chained URLs"),
        ("dir::/tmp", "chained URLs"),
        ("nosuchfs://x/y", "unknown protocol"),
        ("memory://tm", "vanishes"),
    ],
)
def test_store_urls_are_checked_before_any_work(tmp_path, url, expected):
    p = subprocess.run(
        [sys.executable, "-m", "flows.cli", "versions", "--store", url],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenmill: error: --store") and expected in lines[0], p.stderr
    assert os.listdir(tmp_path) == []  # nothing written anywhere (dir::/tmp once wrote a marker into ./tmp)
    if url != "memory://tm":
        with pytest.raises(InputError, match=expected):
            ArtifactStore(url)
    else:
        assert ArtifactStore(url).url == url  # in-process (tests, notebooks) it is fine


def test_versions_of_a_bogus_kind_lists_the_valid_ones(tmp_path):
    store = ArtifactStore(str(tmp_path / "S"))
    _chain(store)
    p = _cli("versions", "--kind", "bogus", "--store", str(tmp_path / "S"))
    assert p.returncode == 2
    line = p.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("tokenmill: error: --kind bogus")
        and "raw" in line
        and "corpus" in line
        and "tokens" in line
        and "model" in line
    ), p.stderr
    p = _cli("versions", "--kind", "raw", "--store", str(tmp_path / "S"))
    assert p.returncode == 0 and p.stdout.count("raw ") == 2
