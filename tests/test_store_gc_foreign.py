"""gc deletes only what the store can prove it wrote, and never a live claim.

Everything the user keeps beside the store's artifacts (folders at the root, under a kind,
inside a version), a `.staging` that is a link to somewhere else, and an export written
into the store survive `gc` byte for byte, however old; the store's own leftovers go.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from s3_server import s3_options, s3_url  # noqa: F401  (session fixture: a local S3 server)

from pipeline_lib.store import STAGING_DIR, ArtifactStore, version_id

HOUR = 3600


def _old(path, age_s: float = 3 * HOUR) -> None:
    """Backdate everything under `path`, links themselves included (not their targets)."""
    stamp = time.time() - age_s
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (stamp, stamp), follow_symlinks=False)
    os.utime(path, (stamp, stamp))


def _hashes(root) -> dict[str, str]:
    """sha256 of every file under `root`, following no links."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            full = os.path.join(dirpath, f)
            if not os.path.islink(full):
                with open(full, "rb") as fh:
                    out[os.path.relpath(full, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _write(path, data: bytes = b"precious user data") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _publish(store: ArtifactStore, kind: str, data: bytes = b"hello") -> str:
    version = version_id(kind, {}, {"data": data.decode()}, "test")
    staging = store.stage(kind, version)
    store.publish(staging, files={"a.txt": staging.put_bytes("a.txt", data)})
    return version


@pytest.fixture
def store_with_user_files(tmp_path):
    """A store with published versions, its own leftovers, and the user's files in every
    place the attack put them; returns (store, the user's paths, what lies outside)."""
    root = tmp_path / "S"
    outside = tmp_path / "elsewhere"
    _write(outside / "important.txt")
    _write(outside / "deep" / "more.txt")
    store = ArtifactStore(str(root))
    tokens_v = _publish(store, "tokens")
    _publish(store, "corpus")
    # the store's own leftovers: a staging area, a work dir, a temp dir
    half = store.stage("tokens", version_id("tokens", {}, {"half": 1}, "test"))
    half.put_bytes("a.txt", b"partial")
    store.work_dir("tokens", "half")
    user = {
        "root": root / "notes" / "2019" / "letter.txt",
        "under a kind": root / "tokens" / "my-export" / "train.bin",
        "under a version": root / "tokens" / tokens_v / "mine" / "notes.txt",
        "a file at the root": root / "README.txt",
        "a dotfolder under a kind": root / "tokens" / ".mine" / "x.txt",
        "a manifest-less folder named like a version": root / "tokens" / ("0" * 20) / "y.bin",
        "an export in the store": root / "exports" / "nanogpt" / "train.bin",
    }
    for path in user.values():
        _write(path)
    shutil.rmtree(root / "corpus" / STAGING_DIR)
    os.symlink(outside, root / "corpus" / STAGING_DIR, target_is_directory=True)  # a linked .staging
    # a link inside the store's own staging root
    os.symlink(outside, root / "tokens" / STAGING_DIR / "0123456789abcdef0123", target_is_directory=True)
    # a link named like a version
    os.symlink(outside, root / "tokens" / "fedcba9876543210fedc", target_is_directory=True)
    _old(root)
    _old(outside)
    return store, user, outside


@pytest.mark.parametrize("min_age_s", [0, HOUR])
def test_gc_keeps_everything_the_store_did_not_write(store_with_user_files, min_age_s):
    store, user, outside = store_with_user_files
    root = store.root
    before, before_outside = _hashes(root), _hashes(outside)
    listed = store.gc(dry_run=True, min_age_s=min_age_s)
    removed = store.gc(min_age_s=min_age_s)
    assert sorted(removed) == sorted(listed)
    names = sorted(os.path.basename(p) for p in removed)
    assert names == sorted([".tmp", "half.work", version_id("tokens", {}, {"half": 1}, "test")])  # the store's own
    after = _hashes(root)
    for label, path in user.items():
        rel = os.path.relpath(path, root)
        assert after.get(rel) == before[rel], f"gc touched the user's file {label}"
    assert _hashes(outside) == before_outside  # nothing followed through a link
    assert {k: v for k, v in before.items() if ".staging" not in k} == {
        k: v for k, v in after.items() if ".staging" not in k
    }
    for m in store.list():
        store.verify(m["kind"], m["version"])


def test_foreign_entries_are_listed(store_with_user_files):
    store, user, _ = store_with_user_files
    foreign = store.foreign_entries()
    root = store.root
    expected = {
        f"{root}/notes",
        f"{root}/README.txt",
        f"{root}/exports",
        f"{root}/tokens/my-export",
        f"{root}/tokens/.mine",
        f"{root}/tokens/{'0' * 20}",
        f"{root}/corpus/{STAGING_DIR}",
        f"{root}/tokens/{STAGING_DIR}/0123456789abcdef0123",
        f"{root}/tokens/fedcba9876543210fedc",
        str(user["under a version"]),
    }
    assert set(foreign) == expected


def test_cli_gc_lists_foreign_entries_and_keeps_them(store_with_user_files):
    store, user, _ = store_with_user_files
    before = _hashes(store.root)
    p = subprocess.run(
        [sys.executable, "-m", "flows.cli", "gc", "--store", store.root, "--min-age", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert f"kept (not written by the store): {store.root}/notes" in p.stdout
    after = _hashes(store.root)
    for path in user.values():
        rel = os.path.relpath(path, store.root)
        assert after[rel] == before[rel]


def test_export_into_the_store_is_refused(tmp_path):
    store = ArtifactStore(str(tmp_path / "S"))
    _publish(store, "tokens")
    for command in (
        ["export-nanogpt"],
        ["export-llmc"],
        ["tokenizer", "export", "--format", "hf"],
        ["tokenizer", "train"],
    ):
        out = tmp_path / "S" / "exports" / command[-1]
        p = subprocess.run(
            [sys.executable, "-m", "flows.cli", *command, "--store", str(tmp_path / "S"), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert (
            len(lines) == 1
            and lines[0].startswith("tokenmill: error:")
            and "--out" in lines[0]
            and ("inside the store") in lines[0]
        )
        assert not out.exists()


def _hold_claim(
    store: ArtifactStore, kind: str, version: str, ready: threading.Event, release: threading.Event
) -> threading.Thread:
    def hold() -> None:
        with store.claim(kind, version, poll_s=0.05, ttl_s=30):
            staging = store.stage(kind, version)
            staging.put_bytes("a.txt", b"in progress")
            store.work_dir(kind, version)
            ready.set()
            release.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert ready.wait(60)
    return thread


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_gc_never_removes_a_live_claim_whatever_the_age(tmp_path, backend, request):
    if backend == "file":
        store = ArtifactStore(str(tmp_path / "S"))
    else:
        store = ArtifactStore(s3_url(), **request.getfixturevalue("s3_options"))
    version = version_id("tokens", {}, {"live": 1}, "test")
    ready, release = threading.Event(), threading.Event()
    thread = _hold_claim(store, "tokens", version, ready, release)
    try:
        if backend == "file":
            _old(tmp_path / "S")
        removed = store.gc(min_age_s=0)
        assert removed == [] or all(version not in p for p in removed), removed
        claim = f"{store.root}/tokens/{STAGING_DIR}/{version}.claim"
        store._invalidate(claim)
        assert store.fs.exists(claim)
        assert store.stage("tokens", version).exists("a.txt")  # its staging area too
        assert any(p.endswith(".claim") for p in store.survey().held)
    finally:
        release.set()
        thread.join(60)
    store.stage("tokens", version).put_bytes("b.txt", b"left behind")  # an abandoned staging area
    assert any(version in p for p in store.gc(min_age_s=0))  # released: now it is a leftover


@pytest.mark.parametrize("backend", ["memory", "s3"])
def test_object_store_gc_takes_only_its_own(backend, request, monkeypatch):
    """On an object store: the user's objects at the root, under a kind and named like a
    version stay; a publish killed between its copies and its manifest (a prefix carrying
    the publishing marker) and a staging area go."""
    import uuid

    from pipeline_lib import store_object

    if backend == "memory":
        store = ArtifactStore(f"memory://gc-foreign-{uuid.uuid4().hex}")
    else:
        store = ArtifactStore(s3_url(), **request.getfixturevalue("s3_options"))
    kept = _publish(store, "tokens")
    user = [
        f"{store.root}/notes/2019/letter.txt",
        f"{store.root}/tokens/my-export/train.bin",
        f"{store.root}/tokens/{'0' * 20}/y.bin",
    ]
    for path in user:
        store.fs.pipe_file(path, b"precious user data")
    killed = version_id("tokens", {}, {"killed": 1}, "test")
    staging = store.stage("tokens", killed)
    info = staging.put_bytes("a.txt", b"copied, no manifest yet")

    def killed_before_the_manifest(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store_object, "write_bytes_create_only", killed_before_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        store.publish(staging, files={"a.txt": info})
    monkeypatch.undo()
    assert not store.exists("tokens", killed) and store.fs.exists(f"{store.version_path('tokens', killed)}/a.txt")
    removed = store.gc(min_age_s=0)
    assert sorted(p.rsplit("/", 1)[-1] for p in removed) == [killed, killed]  # the version prefix and its staging area
    for path in user:
        store._invalidate(path)
        assert store.fs.cat_file(path) == b"precious user data"
    foreign = store.foreign_entries()
    assert (
        f"{store.root}/notes" in foreign
        and f"{store.root}/tokens/my-export" in foreign
        and f"{store.root}/tokens/{'0' * 20}" in foreign
    )
    store.verify("tokens", kept)
